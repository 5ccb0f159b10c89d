"""The HTTP service on 127.0.0.1: the ledger's decision gates every draw, payloads round-trip,
concurrent draw/discard never tears or invents an instance, and nothing reveals a slot."""
import asyncio
import contextlib
import hashlib
import threading
import time

import httpx
import numpy as np
import pytest

from sage_tfx.dnd import ClientConfig, GLMSpec
from sage_tfx.dnd.server import BINARY, TICKET_HEADER, build_service, create_app, encode
from sage_tfx.dnd.simulator import simulate, weights_hash
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.ledger import BlockSpec, open_ledger
from sage_tfx.streams import HashBucketScheme

SPEC = GLMSpec("logistic", 386)  # the paper's 387-weight phishing model
CFG = ClientConfig(gamma=0.001, l1_norm_clip=1.0, epsilon=1.0)
SCHEME = HashBucketScheme("client_id", 4, "dnd")


@contextlib.contextmanager
def serving(app):
    import uvicorn
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           access_log=False, timeout_keep_alive=75))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def _ledger(url, epsilon_g=2000.0):
    with open_ledger(url) as led:
        led.create_stream("clients", epsilon_g=epsilon_g, delta_g=1e-6,
                          granularity="hash:client_id:4:dnd")
        led.add_blocks("clients", [BlockSpec(f"bucket-{i}", f"/b/{i}") for i in range(4)])


def _service(url, run_id="r1", passes=2, k=20, **kw):
    return build_service(ledger_url=url, stream="clients", run_id=run_id, spec=SPEC, config=CFG,
                         k=k, passes=passes, window_last=4, block_scheme=SCHEME, **kw)


def test_draw_discard_average_over_http_binary_and_json(sqlite_url):
    _ledger(sqlite_url)
    service = _service(sqlite_url)
    with serving(create_app(service)) as base, httpx.Client(base_url=base) as c:
        spec = c.get("/v1/spec").json()
        assert spec["dim"] == 387 and spec["update_epsilon"] == 1.0 and spec["passes"] == 2
        r = c.post("/v1/draw", params={"client_id": "alice"}, headers={"accept": BINARY})
        assert r.status_code == 200 and len(r.content) == 8 * 387
        assert set(r.headers) >= {TICKET_HEADER.lower()}
        assert not any("slot" in h.lower() or "instance" in h.lower() for h in r.headers)
        ticket = r.headers[TICKET_HEADER]
        w = np.frombuffer(r.content, "<f8")
        honest = SeededNoise(1).laplace(w, CFG.noise_scale)
        ok = c.post(f"/v1/discard/{ticket}", content=encode(honest),
                    headers={"content-type": BINARY}).json()
        assert ok == {"accepted": True}
        again = c.post(f"/v1/discard/{ticket}", content=encode(w), headers={"content-type": BINARY})
        assert again.status_code == 404  # one update per ticket
        j = c.post("/v1/draw", params={"client_id": "alice"}).json()
        assert set(j) == {"ticket", "weights"} and len(j["weights"]) == 387
        bad = c.post(f"/v1/discard/{j['ticket']}", json={"weights": [0.0] * 3})
        assert bad.status_code == 400
        # The drawn model sent back unchanged is a copy (no noise): rejected, not an error.
        assert c.post(f"/v1/discard/{j['ticket']}", json={"weights": j["weights"]}).json() == {
            "accepted": False}
        refused = c.post("/v1/draw", params={"client_id": "alice"})  # passes = 2 used
        assert refused.status_code == 403 and "used its 2" in refused.json()["refused"]
        avg = np.frombuffer(c.get("/v1/average", headers={"accept": BINARY}).content, "<f8")
        assert np.allclose(avg, service.state.average())
        stats = c.get("/v1/stats").json()
        assert stats["draws"] == 2 and stats["refused"] == 1
        # Spam: a doubled model is rejected, and the answer carries nothing but the decision.
        r = c.post("/v1/draw", params={"client_id": "bob"}, headers={"accept": BINARY})
        spam = c.post(f"/v1/discard/{r.headers[TICKET_HEADER]}",
                      content=encode(3 * np.frombuffer(r.content, "<f8") + 5),
                      headers={"content-type": BINARY})
        assert spam.json() == {"accepted": False}


def test_a_ledger_denial_stops_every_client(sqlite_url):
    _ledger(sqlite_url, epsilon_g=1.0)
    assert _service(sqlite_url, run_id="r1", passes=1).budget is not None  # spends 1.0: all of it
    service = _service(sqlite_url, run_id="r2", passes=1)
    assert service.budget is None
    with serving(create_app(service)) as base:
        res = asyncio.run(simulate(base, updates=20, concurrency=4, make_update=lambda w: w))
    assert res.updates == 0 and res.refused == 4  # each worker stopped at its first refusal
    assert service.state.accepted == 0


def test_retired_block_clients_are_stopped_by_the_refresh(sqlite_url):
    _ledger(sqlite_url)
    service = _service(sqlite_url, passes=5)
    client = next(f"u{i}" for i in range(100) if SCHEME.block_of(f"u{i}").block_id == "bucket-2")
    with serving(create_app(service, ledger_url=sqlite_url, refresh_seconds=0.05)) as base, \
            httpx.Client(base_url=base) as c:
        assert c.post("/v1/draw", params={"client_id": client}).status_code == 200
        with open_ledger(sqlite_url) as led:
            led.retire_block("clients", "bucket-2", "user asked to leave")
        for _ in range(100):
            r = c.post("/v1/draw", params={"client_id": client})
            if r.status_code == 403:
                break
            time.sleep(0.05)
        assert r.status_code == 403 and "stopped" in r.json()["refused"]


def test_concurrent_clients_never_tear_or_invent_an_instance(sqlite_url):
    """Hash every accepted update: after concurrent load each slot is an initial instance or
    an accepted update, byte for byte."""
    _ledger(sqlite_url)
    service = _service(sqlite_url, passes=1000, k=20)
    initial = {weights_hash(v) for v in service.state.instances_view()}
    noise = SeededNoise(0)
    with serving(create_app(service)) as base:
        res = asyncio.run(simulate(
            base, updates=400, concurrency=12, client_ids=[f"c{i}" for i in range(50)],
            make_update=lambda w: noise.laplace(w, CFG.noise_scale)))
    # Honest noise-only updates: the spam check passes nearly all, even with stale draws.
    assert res.errors == 0 and res.updates == 400 and res.accepted >= 0.95 * 400
    assert service.state.accepted == res.accepted
    slots = {weights_hash(v) for v in service.state.instances_view()}
    assert slots <= initial | res.accepted_hashes
    assert len(slots & res.accepted_hashes) >= 1


def test_the_simulator_refuses_non_local_hosts():
    with pytest.raises(ValueError, match="127.0.0.1"):
        asyncio.run(simulate("http://example.com:80", updates=1, make_update=lambda w: w))


def test_sage_tfx_dnd_needs_the_serve_subcommand(capsys):
    from sage_tfx import cli
    assert cli.main(["dnd"]) == 2
    assert "sage-tfx dnd serve" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # argparse of the server: --ledger etc. are required
        cli.main(["dnd", "serve", "--stream", "s"])
    assert e.value.code == 2
