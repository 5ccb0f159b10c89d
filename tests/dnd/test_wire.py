"""The server's transport: uvloop and httptools, and the compact binary update encoding."""
import numpy as np
import pytest
from dndtest import TINY_CFG, TINY_SPEC, bearer, tiny_served
from fastapi.testclient import TestClient

from sage_tfx.dnd.server import fast_server_options, max_body_bytes
from sage_tfx.dnd.wire import HEADER, UPDATE_TYPE, WireFormatError, decode_update, encode_update


def test_the_server_runs_on_uvloop_and_httptools():
    import asyncio

    import uvicorn
    opts = fast_server_options()
    assert opts == {"loop": "uvloop", "http": "httptools"}  # both are pinned in the lock
    async def app(scope, receive, send):  # pragma: no cover - never called
        pass
    config = uvicorn.Config(app, host="127.0.0.1", **opts)
    config.load()  # resolves the protocol class
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    assert config.http_protocol_class is HttpToolsProtocol
    import uvloop
    loop = uvloop.new_event_loop()
    try:
        assert isinstance(loop, asyncio.AbstractEventLoop)
    finally:
        loop.close()


TICKET = "0123456789abcdef" * 2
OTHER = "f" * 32


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-7), ("float64", 0.0)])
def test_the_framed_encoding_round_trips(dtype, tol):
    w = np.random.default_rng(0).normal(0, 3, 387)
    body = encode_update(TICKET, w, dtype)
    assert len(body) == HEADER.size + (4 if dtype == "float32" else 8) * 387
    back = decode_update(body, dim=387, ticket=TICKET)
    assert back.dtype == np.float64 and np.allclose(back, w, rtol=tol, atol=0)
    assert np.array_equal(back, w) == (dtype == "float64")


def _patched(body: bytes, offset: int, raw: bytes) -> bytes:
    return body[:offset] + raw + body[offset + len(raw):]


def _bad_bodies(dim: int, ticket: str) -> dict:
    good = encode_update(ticket, np.zeros(dim), "float32")
    return {
        "empty": b"",
        "short header": good[:HEADER.size - 1],
        "bad magic": _patched(good, 0, b"JSON"),
        "bad version": _patched(good, 4, b"\x02"),
        "bad dtype": _patched(good, 5, b"\x02"),
        "dtype 16": _patched(good, 5, b"\x10"),
        "reserved set": _patched(good, 6, b"\x01"),
        "count beyond dim": _patched(good, 8, (dim + 1).to_bytes(4, "little")),
        "huge count": _patched(good, 8, b"\xff\xff\xff\xff"),
        "truncated": good[:-1],
        "padded": good + b"\x00",
        "float64 header, float32 data": _patched(good, 5, b"\x08"),
        "another ticket": encode_update(OTHER, np.zeros(dim), "float32"),
        "NaN": encode_update(ticket, np.r_[np.nan, np.zeros(dim - 1)], "float32"),
        "inf": encode_update(ticket, np.r_[np.inf, np.zeros(dim - 1)], "float64"),
        "float32 inf bits": _patched(good, HEADER.size, b"\x00\x00\x80\x7f"),
        "beyond the limit": encode_update(ticket, np.r_[1e101, np.zeros(dim - 1)], "float64"),
    }


@pytest.mark.parametrize("name", sorted(_bad_bodies(3, TICKET)))
def test_malformed_framed_bodies_are_refused(name):
    with pytest.raises(WireFormatError):
        decode_update(_bad_bodies(3, TICKET)[name], dim=3, ticket=TICKET)
    assert issubclass(WireFormatError, ValueError)


SPEC, CFG = TINY_SPEC, TINY_CFG


@pytest.fixture
def served(principals):
    return tiny_served(principals)


def _state(service):
    st, gid = service.store, service.grant_id
    rows = st.instances(gid, SPEC.dim)
    return ([(s, v, w.tobytes()) for s, v, w in rows], st.passes(gid), st.outstanding(gid),
            st.run(gid))


def test_framed_updates_over_http(served):
    """A framed draw and update (float32 and float64) go through; every malformed body is a
    422 that changes nothing, an oversized one 413, an unauthenticated one 401."""
    p, service, app = served
    c = TestClient(app)
    alice = bearer(p.client("alice"))
    for dtype in ("float32", "float64"):
        r = c.post("/v1/draw", headers={"accept": UPDATE_TYPE, **alice})
        assert r.status_code == 200 and r.headers["content-type"] == UPDATE_TYPE
        ticket = r.headers["x-dnd-ticket"]
        w = decode_update(r.content, dim=3, ticket=ticket)
        u = w + np.random.default_rng(1).laplace(0.0, CFG.noise_scale, 3)
        before = _state(service)
        for name, body in _bad_bodies(3, ticket).items():
            bad = c.post(f"/v1/discard/{ticket}", content=body,
                         headers={"content-type": UPDATE_TYPE, **alice})
            assert bad.status_code == 422, (name, bad.status_code, bad.text)
        too_big = c.post(f"/v1/discard/{ticket}", content=b"\x00" * (max_body_bytes(3) + 1),
                         headers={"content-type": UPDATE_TYPE, **alice})
        no_auth = c.post(f"/v1/discard/{ticket}", content=encode_update(ticket, u, dtype),
                         headers={"content-type": UPDATE_TYPE})
        assert (too_big.status_code, no_auth.status_code) == (413, 401)
        assert _state(service) == before
        ok = c.post(f"/v1/discard/{ticket}", content=encode_update(ticket, u, dtype),
                    headers={"content-type": UPDATE_TYPE, **alice})
        assert ok.status_code == 200 and set(ok.json()) == {"accepted"}
        assert service.store.outstanding(service.grant_id) == 0  # the ticket was used
    assert service.store.passes(service.grant_id)["alice"][0] == 2


@pytest.mark.parametrize("encoding", ["framed32", "json"])
def test_the_simulated_clients_send_either_encoding(served, encoding):
    import asyncio

    from dndtest import serving

    from sage_tfx.dnd.simulator import simulate
    p, service, app = served
    rng = np.random.default_rng(2)
    with serving(app) as base:
        res = asyncio.run(simulate(
            base, updates=30, concurrency=4, tokens=[p.client("alice"), p.client("bob")],
            make_update=lambda w: w + rng.laplace(0.0, CFG.noise_scale, w.size),
            timeout=60, encoding=encoding))
    assert (res.updates, res.errors) == (30, 0)
    assert service.stats()["updates"] == 30
