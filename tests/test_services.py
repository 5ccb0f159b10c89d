"""The HTTP services' shared guard: bearer tokens against the ledger, body limits, errors."""
import os
import stat

from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient

from sage_tfx import services
from sage_tfx.ledger import open_ledger


def _app(auth, max_body=64):
    app = FastAPI()
    services.install_error_handlers(app)
    app.add_middleware(services.BodyLimit, max_bytes=max_body)
    hits = []

    @app.post("/echo")
    def echo(body: dict, who=Depends(auth.require("client"))):
        hits.append(who.name)
        return {"who": who.name, "n": len(body)}

    return app, hits


def test_open_mode_serves_with_its_own_token(tmp_path):
    url = f"sqlite:///{tmp_path}/l.db"
    (tmp_path / "tok").write_text("stale")
    os.chmod(tmp_path / "tok", 0o644)  # a readable file left there: replaced, not reused
    auth = services.Authenticator(url, open_token_file=str(tmp_path / "tok"))
    token = (tmp_path / "tok").read_text().strip()
    assert stat.S_IMODE(os.stat(tmp_path / "tok").st_mode) == 0o600 and token == auth.open_token
    app, hits = _app(auth)
    c = TestClient(app)
    assert c.post("/echo", json={"a": 1}).status_code == 401
    assert c.post("/echo", json={"a": 1},
                  headers={"Authorization": "Bearer nope"}).status_code == 401
    r = c.post("/echo", json={"a": 1}, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200 and r.json() == {"who": "local", "n": 1}
    assert hits == ["local"]


def test_principals_roles_and_body_limit(tmp_path):
    url = f"sqlite:///{tmp_path}/l.db"
    led = open_ledger(url)
    root = led.add_principal("root", ["admin"])
    client = led.add_principal("c1", ["client"])
    aud = led.add_principal("aud", ["auditor"])
    auth = services.Authenticator(url, token=root, cache_seconds=0)
    app, hits = _app(auth)
    c = TestClient(app)
    h = lambda t: {"Authorization": f"Bearer {t}"}  # noqa: E731
    assert c.post("/echo", json={"a": 1}, headers=h(client)).json()["who"] == "c1"
    assert c.post("/echo", json={"a": 1}, headers=h(aud)).status_code == 403
    assert c.post("/echo", json={"a": "x" * 100}, headers=h(client)).status_code == 413
    r = c.post("/echo", content=b"{" + b" " * 100 + b"}", headers={
        **h(client), "content-type": "application/json", "transfer-encoding": "chunked"})
    assert r.status_code == 413
    open_ledger(url, token=root).disable_principal("c1")
    assert c.post("/echo", json={"a": 1}, headers=h(client)).status_code == 401
    assert hits == ["c1"]


def test_a_chunked_body_past_the_limit_is_a_413_whatever_the_framework_makes_of_it(tmp_path):
    """uvicorn on 127.0.0.1, a typed body FastAPI parses itself: it turns the interrupted read
    into a 400 ("error parsing the body"); the limit answers 413 first, in both framings."""
    from live_http import post_chunked, serving
    auth = services.Authenticator(f"sqlite:///{tmp_path}/l.db",
                                  open_token_file=str(tmp_path / "tok"))
    app, hits = _app(auth)
    h = {"Authorization": f"Bearer {auth.open_token}", "Content-Type": "application/json"}
    with serving(app) as base:
        assert post_chunked(base, "/echo", b"{" + b" " * 100 + b"}", h) == 413
        assert post_chunked(base, "/echo", b"{" + b" " * 2 ** 20 + b"}", h, chunk=7) == 413
        import httpx
        assert httpx.post(f"{base}/echo", content=b"{" + b" " * 100 + b"}",
                          headers=h).status_code == 413   # Content-Length
        assert post_chunked(base, "/echo", b'{"a": 1}', h) == 200
    assert hits == ["local"]


def test_a_json_body_is_read_only_after_authentication(tmp_path):
    """services.json_body: 401 without a valid token and 403 in the wrong role whatever the
    body is (FastAPI's own body parameter answers 422 before any dependency runs); then 422 /
    415 / 413 for the body; the OpenAPI schema documents it as a body parameter."""
    from pydantic import BaseModel, ConfigDict

    from live_http import post_chunked, serving

    class Thing(BaseModel):
        model_config = ConfigDict(extra="forbid")
        n: int

    url = f"sqlite:///{tmp_path}/l.db"
    led = open_ledger(url)
    root = led.add_principal("root", ["admin"])
    client, aud = led.add_principal("c1", ["client"]), led.add_principal("aud", ["auditor"])
    auth = services.Authenticator(url, token=root, cache_seconds=0)
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    services.install_error_handlers(app)
    services.serve_schema(app, auth)
    app.add_middleware(services.BodyLimit, max_bytes=64)
    got = []

    @app.post("/thing", dependencies=[Depends(auth.require("client"))])
    def thing(body: Thing = Depends(services.json_body(Thing))):
        got.append(body.n)
        return {"n": body.n}

    def h(token=None, kind="application/json"):
        return {"Content-Type": kind, **({"Authorization": f"Bearer {token}"} if token else {})}

    c = TestClient(app)
    for body in (b'{"n": ', b'{"x": 1}', b"[]", b""):
        assert c.post("/thing", content=body, headers=h()).status_code == 401, body
        assert c.post("/thing", content=body, headers=h("sage_nope")).status_code == 401, body
        assert c.post("/thing", content=body, headers=h(aud)).status_code == 403, body
        assert c.post("/thing", content=body, headers=h(client)).status_code == 422, body
    assert c.post("/thing", content=b'{"n": 1}', headers=h(client, "text/plain")).status_code \
        == 415
    assert c.post("/thing", content=b'{"n": 2}', headers=h(client)).json() == {"n": 2}
    with serving(app) as base:
        big = b'{"n": 3' + b" " * 1000 + b"}"
        assert post_chunked(base, "/thing", big, h()) == 401   # not read: refused first
        assert post_chunked(base, "/thing", big, h(client)) == 413
    assert got == [2]
    doc = c.get("/openapi.json", headers=h(client)).json()
    body = doc["paths"]["/thing"]["post"]["requestBody"]
    assert body["required"] and body["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Thing"}
    assert doc["components"]["schemas"]["Thing"]["required"] == ["n"]
