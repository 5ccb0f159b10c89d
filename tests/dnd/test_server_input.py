"""Bad input to the D&D service is a 4xx that changes nothing: JSON integers beyond float64,
booleans, non-finite numbers, wrong sizes, bodies over the limit (413 before reading), and a
bounded schemathesis fuzz of every endpoint, authenticated, that finds no 5xx."""
import asyncio
import json

import numpy as np
import pytest
from dndtest import TINY_CFG, TINY_SPEC, bearer, tiny_served
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from sage_tfx.dnd.server import BINARY, encode, max_body_bytes
from sage_tfx.dp.noise import SeededNoise

SPEC, CFG = TINY_SPEC, TINY_CFG  # 3 weights: the fuzz can generate valid updates


@pytest.fixture
def served(principals):
    return tiny_served(principals)


def _state(service):
    st, gid = service.store, service.grant_id
    return (st.instances(gid, SPEC.dim), st.passes(gid), st.outstanding(gid), st.run(gid))


def _drawn(served):
    """A client, the app, a live ticket and the run's state before anything else happens."""
    p, service, app = served
    c = TestClient(app)
    alice = bearer(p.client("alice"))
    t = c.post("/v1/draw", headers=alice).json()
    return c, alice, t, _state(service)


def _same(a, b):
    return all(np.array_equal(x[2], y[2]) and x[:2] == y[:2] for x, y in zip(a[0], b[0])) \
        and a[1:] == b[1:]


BIG_INT = "1" + "0" * 400          # a JSON integer beyond float64 (was a 500)
BAD_JSON_BODIES = {
    "integer beyond float64": '{"weights": [%s, 0.5, 0.5]}' % BIG_INT,
    "float literal beyond float64": '{"weights": [1e400, 0.5, 0.5]}',
    "boolean weight": '{"weights": [true, 0.5, 0.5]}',
    "NaN": '{"weights": [NaN, 0.5, 0.5]}',
    "Infinity": '{"weights": [Infinity, 0.5, 0.5]}',
    "string weight": '{"weights": ["0.5", 0.5, 0.5]}',
    "null weight": '{"weights": [null, 0.5, 0.5]}',
    "nested list": '{"weights": [[0.5], 0.5, 0.5]}',
    "too few": '{"weights": [0.5, 0.5]}',
    "too many": '{"weights": [0.5, 0.5, 0.5, 0.5]}',
    "beyond 1e100": '{"weights": [1e101, 0.5, 0.5]}',
    "extra field": '{"weights": [0.5, 0.5, 0.5], "client_id": "bob"}',
    "no weights": '{}',
    "a list": '[0.5, 0.5, 0.5]',
    "not JSON": '{"weights": [0.5, 0.5,',
    "empty": '',
}


@pytest.mark.parametrize("name", list(BAD_JSON_BODIES))
def test_bad_json_updates_are_422_and_change_nothing(served, name):
    service = served[1]
    c, alice, t, before = _drawn(served)
    r = c.post(f"/v1/discard/{t['ticket']}", content=BAD_JSON_BODIES[name].encode(),
               headers={"content-type": "application/json", **alice})
    assert r.status_code == 422, r.text
    assert BIG_INT not in r.text and len(r.text) < 4096   # the input is never echoed back
    assert _same(_state(service), before)
    # the ticket is still good for one honest update
    honest = SeededNoise(0).laplace(np.asarray(t["weights"]), CFG.noise_scale).tolist()
    assert c.post(f"/v1/discard/{t['ticket']}", json={"weights": honest},
                  headers=alice).status_code == 200


@pytest.mark.parametrize("body", [b"", b"\x00" * 23, b"\x00" * 25,
                                  encode(np.array([np.nan, 0.0, 0.0])),
                                  encode(np.array([np.inf, 0.0, 0.0])),
                                  encode(np.array([1e300, 0.0, 0.0]))])
def test_bad_binary_updates_are_422_and_change_nothing(served, body):
    service = served[1]
    c, alice, t, before = _drawn(served)
    r = c.post(f"/v1/discard/{t['ticket']}", content=body,
               headers={"content-type": BINARY, **alice})
    assert r.status_code == 422 and _same(_state(service), before)


def test_other_bad_requests_are_4xx_and_change_nothing(served):
    service = served[1]
    c, alice, t, before = _drawn(served)
    body = json.dumps({"weights": [0.5, 0.5, 0.5]})
    cases = [
        ("post", f"/v1/discard/{t['ticket']}", dict(content=body, headers={
            "content-type": "text/plain", **alice}), 415),
        ("post", "/v1/discard/not-a-ticket", dict(json={"weights": [0.5] * 3}, headers=alice), 422),
        ("post", "/v1/discard/" + "0" * 32, dict(json={"weights": [0.5] * 3}, headers=alice), 404),
        ("post", "/v1/draw", dict(params={"blocks": "b" * 5000}, headers=alice), 422),
        ("post", "/v1/draw", dict(params={"client_id": "bob"}, headers=alice), 400),
        ("post", f"/v1/discard/{t['ticket']}", dict(content=b"x" * (max_body_bytes(3) + 1),
                                                     headers={"content-type": BINARY, **alice}),
         413),
    ]
    for method, path, kw, status in cases:
        r = getattr(c, method)(path, **kw)
        assert r.status_code == status, (path, r.status_code, r.text)
    assert _same(_state(service), before)


def test_an_oversized_body_is_refused_before_it_is_read(served):
    """413 on the declared Content-Length: the body is never received (the 512 MB body that
    took the server from 206 MB to 1.23 GB)."""
    p, service, app = served
    t = TestClient(app).post("/v1/draw", headers=bearer(p.client("alice"))).json()
    sent = []

    async def receive():
        raise AssertionError("the body was read")

    async def send(message):
        sent.append(message)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": f"/v1/discard/{t['ticket']}", "raw_path": b"",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 2),
             "headers": [(b"content-type", BINARY.encode()), (b"content-length", b"536870912"),
                         (b"authorization", f"Bearer {p.client('alice')}".encode())]}
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 413


def test_authentication_comes_before_the_body_and_big_bodies_are_413_chunked_too(served):
    """uvicorn on 127.0.0.1 (the PTK store's fix, through the same services code): a bad body
    without a token is a 401, in the wrong role a 403; an oversized body is a 413 with a
    Content-Length and chunked alike; the ticket and the run are untouched."""
    import httpx

    from live_http import post_chunked, serving
    p, service, app = served
    c, alice, t, before = _drawn(served)
    path = f"/v1/discard/{t['ticket']}"
    kinds = ("application/json", BINARY, "application/x-sage-dnd-update")
    with serving(app) as base:
        h = httpx.Client(base_url=base, timeout=60)
        for kind in kinds:
            for body in (b'{"weights": [', b"\x00" * 5, b""):
                for token, status in ((None, 401), ("sage_nope", 401), (p.pipeline, 403),
                                      (p.client("alice"), 422)):
                    headers = {"content-type": kind, **(bearer(token) if token else {})}
                    r = h.post(path, content=body, headers=headers)
                    assert r.status_code == status, (kind, body, token, r.status_code)
            big = b"\x00" * (2 * max_body_bytes(SPEC.dim))
            assert post_chunked(base, path, big, {"content-type": kind}) == 401
            assert post_chunked(base, path, big, {"content-type": kind, **alice}) == 413
            assert h.post(path, content=big, headers={"content-type": kind, **alice}
                          ).status_code == 413
    assert _same(_state(service), before)


def test_the_openapi_schema_is_typed(served):
    p, _, app = served
    c = TestClient(app)
    assert c.get("/openapi.json").status_code == 401 and c.get("/docs").status_code == 404
    doc = c.get("/openapi.json", headers=bearer(p.auditor)).json()
    body = doc["paths"]["/v1/discard/{ticket}"]["post"]["requestBody"]["content"]
    weights = body["application/json"]["schema"]["properties"]["weights"]
    assert weights["minItems"] == weights["maxItems"] == 3
    assert weights["items"]["type"] == "number" and weights["items"]["maximum"] == 1e100
    assert body[BINARY]["schema"]["minLength"] == 24
    assert doc["components"]["securitySchemes"]["sageBearer"]["scheme"] == "bearer"
    for path, ops in doc["paths"].items():
        for op in ops.values():
            assert "401" in op["responses"], path   # every endpoint authenticates
            assert op.get("security") == [{"sageBearer": []}], path


ROLE_OF = {"/v1/draw": "client", "/v1/discard/{ticket}": "client", "/v1/spec": "client",
           "/v1/average": "pipeline", "/v1/release": "pipeline", "/v1/stats": "pipeline"}


def test_fuzzing_every_endpoint_finds_no_server_error(served):
    """schemathesis from the app's OpenAPI schema (data that fits it and data that does not),
    authenticated as the role each endpoint admits, a fixed number of examples per endpoint;
    half the discards carry a live ticket so their bodies reach the spam check and the
    database."""
    import schemathesis
    from schemathesis.checks import not_a_server_error
    from schemathesis.generation import GenerationMode
    p, service, app = served
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=bearer(p.auditor))
    client = TestClient(app)
    alice = p.client("alice")
    operations = [r.ok() for r in schema.get_all_operations()]
    assert {op.path for op in operations} == set(ROLE_OF)
    seen = {}
    for op in sorted(operations, key=lambda o: o.path == "/v1/release"):   # release last
        token = alice if ROLE_OF[op.path] == "client" else p.pipeline
        fixed = {"headers": bearer(token)}
        if "{ticket}" in op.path:
            fixed["path_parameters"] = {"ticket": "0" * 32}
        strategies = [op.as_strategy(GenerationMode.POSITIVE)]
        if op.body or op.query:   # data that does not fit: bodies and queries (auth is fixed)
            strategies.append(op.as_strategy(GenerationMode.NEGATIVE, **fixed))
        for strategy in strategies:

            @settings(max_examples=40, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(case=strategy)
            def run(case):
                codes = seen.setdefault(op.path, [])
                if "{ticket}" in op.path and len(codes) % 2 == 0:
                    case.path_parameters["ticket"] = client.post(
                        "/v1/draw", headers=bearer(alice)).json()["ticket"]
                # a generated Authorization header is replaced by the role's real token
                case.headers = {**{k: v for k, v in (case.headers or {}).items()
                                   if k.lower() != "authorization"}, **bearer(token)}
                response = case.call()
                codes.append(response.status_code)
                case.validate_response(response, checks=[not_a_server_error])
            run()
    assert all(s < 500 for codes in seen.values() for s in codes)
    assert 200 in seen["/v1/discard/{ticket}"] and 422 in seen["/v1/discard/{ticket}"]
    assert service.store.problems(service.grant_id) == []
