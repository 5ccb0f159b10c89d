"""The HTTP service on 127.0.0.1: callers authenticate, the ledger's decision gates every draw,
passes are the authenticated principal's, payloads round-trip, concurrent draw/discard never
tears or loses an instance, nothing reveals a slot, and the run's model is released once."""
import asyncio

import httpx
import numpy as np
import pytest
from dndtest import STREAM, bearer, make_ledger, serving

from sage_tfx import services
from sage_tfx.dnd import ClientConfig, GLMSpec
from sage_tfx.dnd.server import BINARY, TICKET_HEADER, build_service, create_app, encode
from sage_tfx.dnd.service import RELEASE_NAME
from sage_tfx.dnd.simulator import simulate, weights_hash
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.ledger import BlockSpec, open_ledger
from sage_tfx.streams import HashBucketScheme

SPEC = GLMSpec("logistic", 386)  # the paper's 387-weight phishing model
CFG = ClientConfig(gamma=0.001, l1_norm_clip=1.0, epsilon=1.0)
SCHEME = HashBucketScheme("client_id", 4, "dnd")


def _service(p, run_id="r1", passes=2, k=20, **kw):
    return build_service(ledger_url=p.url, stream=STREAM, run_id=run_id, spec=SPEC, config=CFG,
                         k=k, passes=passes, window_last=4, block_scheme=SCHEME, token=p.server,
                         **kw)


def _app(p, service, **kw):
    return create_app(service, services.Authenticator(p.url, token=p.server, cache_seconds=0), **kw)


def _honest(w, seed=1):
    return SeededNoise(seed).laplace(np.asarray(w), CFG.noise_scale)


def test_draw_discard_average_over_http_binary_and_json(principals):
    p = principals
    service = _service(p)
    alice = bearer(p.client("alice"))
    with serving(_app(p, service)) as base, httpx.Client(base_url=base) as c:
        spec = c.get("/v1/spec", headers=alice).json()
        assert spec["dim"] == 387 and spec["update_epsilon"] == 1.0 and spec["passes"] == 2
        r = c.post("/v1/draw", headers={"accept": BINARY, **alice})
        assert r.status_code == 200 and len(r.content) == 8 * 387
        assert set(r.headers) >= {TICKET_HEADER.lower()}
        assert not any("slot" in h.lower() or "instance" in h.lower() for h in r.headers)
        ticket = r.headers[TICKET_HEADER]
        w = np.frombuffer(r.content, "<f8")
        ok = c.post(f"/v1/discard/{ticket}", content=encode(_honest(w)),
                    headers={"content-type": BINARY, **alice}).json()
        assert ok == {"accepted": True}
        again = c.post(f"/v1/discard/{ticket}", content=encode(w),
                       headers={"content-type": BINARY, **alice})
        assert again.status_code == 404  # one update per ticket
        j = c.post("/v1/draw", headers=alice).json()
        assert set(j) == {"ticket", "weights"} and len(j["weights"]) == 387
        bad = c.post(f"/v1/discard/{j['ticket']}", json={"weights": [0.0] * 3}, headers=alice)
        assert bad.status_code == 422
        # The drawn model sent back unchanged is a copy (no noise): rejected, not an error.
        assert c.post(f"/v1/discard/{j['ticket']}", json={"weights": j["weights"]},
                      headers=alice).json() == {"accepted": False}
        refused = c.post("/v1/draw", headers=alice)  # passes = 2 used
        assert refused.status_code == 403 and "used its 2" in refused.json()["refused"]
        model = bearer(p.pipeline)
        r = c.get("/v1/average", headers={"accept": BINARY, **model})
        avg = np.frombuffer(r.content, "<f8")
        assert r.headers["x-dnd-final"] == "false"
        stored = np.stack([v for _, _, v in service.store.instances(service.grant_id, 387)])
        assert np.allclose(avg, stored.mean(axis=0))
        stats = c.get("/v1/stats", headers=model).json()
        assert stats["draws"] == 2 and stats["refused"] == 1 and stats["updates"] == 2
        assert stats["accepted"] == 1 and stats["rejected_spam"] == 1
        assert stats["rejected_by"]["copy"] == 1 and sum(stats["rejected_by"].values()) == 1
        # Spam: a tripled model is beyond the norm bound: refused (422) with the bound's reason,
        # before the spam check, and nothing is counted.
        bob = bearer(p.client("bob"))
        r = c.post("/v1/draw", headers={"accept": BINARY, **bob})
        spam = c.post(f"/v1/discard/{r.headers[TICKET_HEADER]}",
                      content=encode(3 * np.frombuffer(r.content, "<f8") + 5),
                      headers={"content-type": BINARY, **bob})
        assert spam.status_code == 422 and "L1 from the drawn instance" in spam.json()["refused"]
        stats = c.get("/v1/stats", headers=model).json()
        assert stats["updates"] == 2 and stats["out_of_bounds"] == 1
    assert service.store.problems(service.grant_id) == []


def test_passes_are_the_authenticated_principals(principals):
    """Alice cannot spend Bob's passes: a self-declared client id is refused, and another
    principal's ticket is unknown to her."""
    p = principals
    service = _service(p, passes=1)
    alice, bob = bearer(p.client("alice")), bearer(p.client("bob"))
    with serving(_app(p, service)) as base, httpx.Client(base_url=base) as c:
        r = c.post("/v1/draw", params={"client_id": "bob"}, headers=alice)
        assert r.status_code == 400 and "principal" in r.json()["error"]
        tb = c.post("/v1/draw", headers=bob).json()
        stolen = c.post(f"/v1/discard/{tb['ticket']}",
                        json={"weights": _honest(tb["weights"]).tolist()},
                        headers=alice)
        assert stolen.status_code == 404
        assert c.post(f"/v1/discard/{tb['ticket']}",
                      json={"weights": _honest(tb["weights"]).tolist()},
                      headers=bob).json() == {"accepted": True}
        assert c.post("/v1/draw", headers=bob).status_code == 403     # bob's one pass is used
        assert c.post("/v1/draw", headers=alice).status_code == 200   # alice's is hers
    assert service.store.passes(service.grant_id) == {"alice": (0, 1), "bob": (1, 1)}


def test_unauthenticated_and_wrong_role_calls_change_nothing(principals):
    p = principals
    service = _service(p)
    alice = bearer(p.client("alice"))
    with serving(_app(p, service)) as base, httpx.Client(base_url=base) as c:
        t = c.post("/v1/draw", headers=alice).json()
        state = lambda: (service.store.instance_versions(service.grant_id),  # noqa: E731
                         service.store.passes(service.grant_id),
                         service.store.outstanding(service.grant_id),
                         service.store.run(service.grant_id))
        before = state()
        body = {"weights": _honest(t["weights"]).tolist()}
        for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic x"},
                        bearer(p.auditor)):
            expect = 403 if headers == bearer(p.auditor) else 401
            assert c.post("/v1/draw", headers=headers).status_code == expect
            assert c.post(f"/v1/discard/{t['ticket']}", json=body,
                          headers=headers).status_code == expect
            assert c.post("/v1/release", headers=headers).status_code == expect
            assert c.get("/v1/average", headers=headers).status_code == expect
            assert c.get("/v1/spec", headers=headers).status_code == (200 if expect == 403 else 401)
        # clients may not read or release the model; model readers may not draw
        assert c.get("/v1/average", headers=alice).status_code == 403
        assert c.post("/v1/release", headers=alice).status_code == 403
        assert c.get("/v1/stats", headers=alice).status_code == 403
        assert c.post("/v1/draw", headers=bearer(p.pipeline)).status_code == 403
        # another team's pipeline (not bound to the run's stream) neither reads nor closes it
        with open_ledger(p.url, token=p.admin) as led:
            outsider = bearer(led.add_principal("other-team", ["pipeline"]))
        assert c.get("/v1/average", headers=outsider).status_code == 403
        assert c.post("/v1/release", headers=outsider).status_code == 403
        assert state() == before
        # a disabled client is refused at once (cache_seconds=0)
        with open_ledger(p.url, token=p.admin) as led:
            led.disable_principal("alice")
        assert c.post(f"/v1/discard/{t['ticket']}", json=body, headers=alice).status_code == 401
        assert state() == before


def test_abandoned_draws_expire_by_time(principals):
    """A client limited to one pass that abandons its draw is refused while the draw is out,
    and may draw again once it expires (after ``ticket_ttl`` seconds, not after 100k draws)."""
    p = principals
    service = _service(p, passes=1, ticket_ttl=1.0)
    alice = bearer(p.client("alice"))
    with serving(_app(p, service)) as base, httpx.Client(base_url=base) as c:
        old = c.post("/v1/draw", headers=alice).json()
        held = c.post("/v1/draw", headers=alice)
        assert held.status_code == 403 and "unexpired" in held.json()["refused"]
        assert c.get("/v1/stats", headers=bearer(p.pipeline)).json()["outstanding_tickets"] == 1
        asyncio.run(asyncio.sleep(1.3))
        assert c.get("/v1/stats", headers=bearer(p.pipeline)).json()["outstanding_tickets"] == 0
        expired = c.post(f"/v1/discard/{old['ticket']}",
                         json={"weights": _honest(old["weights"]).tolist()}, headers=alice)
        assert expired.status_code == 404
        fresh = c.post("/v1/draw", headers=alice).json()
        assert c.post(f"/v1/discard/{fresh['ticket']}",
                      json={"weights": _honest(fresh["weights"]).tolist()},
                      headers=alice).json() == {"accepted": True}
        assert c.post("/v1/draw", headers=alice).status_code == 403   # the one pass is used
    assert service.store.passes(service.grant_id) == {"alice": (1, 2)}


def test_a_ledger_denial_stops_every_client(sqlite_url):
    p = make_ledger(sqlite_url, epsilon_g=1.0, clients=[f"c{i}" for i in range(4)])
    assert _service(p, run_id="r1", passes=1).budget is not None  # spends 1.0: all of it
    service = _service(p, run_id="r2", passes=1)
    assert service.budget is None
    with serving(_app(p, service)) as base:
        res = asyncio.run(simulate(base, updates=20, concurrency=4, make_update=lambda w: w,
                                   tokens=list(p.clients.values())))
        assert httpx.get(f"{base}/v1/average", headers=bearer(p.pipeline)).status_code == 409
    assert res.updates == 0 and res.refused == 4  # each worker stopped at its first refusal


def test_retired_block_clients_are_stopped_by_the_refresh(sqlite_url):
    names = [f"u{i}" for i in range(40)]
    p = make_ledger(sqlite_url,
                    clients=[n for n in names if SCHEME.block_of(n).block_id == "bucket-2"][:1])
    [client] = p.clients
    service = _service(p, passes=5, refresh=True)
    token = bearer(p.client(client))
    with serving(_app(p, service, refresh_seconds=0.05)) as base, \
            httpx.Client(base_url=base) as c:
        t = c.post("/v1/draw", headers=token).json()
        with open_ledger(p.url, token=p.admin) as led:
            led.retire_block(STREAM, "bucket-2", "user asked to leave")
        for _ in range(200):
            r = c.post("/v1/draw", headers=token)
            if r.status_code == 403:
                break
            c.post(f"/v1/discard/{r.json()['ticket']}",
                   json={"weights": _honest(r.json()["weights"]).tolist()},
                   headers=token)
            asyncio.run(asyncio.sleep(0.05))
        assert r.status_code == 403 and "stopped" in r.json()["refused"]
        # an update drawn before the retirement is refused too, and changes nothing
        late = c.post(f"/v1/discard/{t['ticket']}",
                      json={"weights": _honest(t["weights"]).tolist()},
                      headers=token)
        assert late.status_code == 403


def test_a_server_that_cannot_read_the_audit_log_refuses_to_start_with_refresh(principals):
    from sage_tfx.errors import PermissionDeniedError
    p = principals
    with open_ledger(p.url, token=p.admin) as led:
        led.bind("model-reader", STREAM, "default")
    with pytest.raises(PermissionDeniedError, match="auditor role"):
        build_service(ledger_url=p.url, stream=STREAM, run_id="r1", spec=SPEC, config=CFG,
                      window_last=4, token=p.pipeline, refresh=True)


def test_concurrent_clients_never_tear_or_lose_an_instance(sqlite_url):
    """Hash every accepted update: after concurrent load each slot is an initial instance or
    an accepted update, byte for byte, and every accepted update is in exactly one version."""
    p = make_ledger(sqlite_url, clients=[f"c{i}" for i in range(12)])
    service = _service(p, passes=1000, k=20)
    initial = {weights_hash(v) for _, _, v in service.store.instances(service.grant_id, 387)}
    noise = SeededNoise(0)
    with serving(_app(p, service)) as base:
        res = asyncio.run(simulate(
            base, updates=240, concurrency=12, tokens=list(p.clients.values()),
            make_update=lambda w: noise.laplace(w, CFG.noise_scale)))
    # Honest noise-only updates: the spam check passes nearly all, even with stale draws.
    assert res.errors == 0 and res.updates == 240 and res.accepted >= 0.95 * 240
    gid = service.grant_id
    assert service.store.run(gid).accepted == res.accepted
    slots = {weights_hash(v) for _, _, v in service.store.instances(gid, 387)}
    assert slots <= initial | res.accepted_hashes
    assert len(slots & res.accepted_hashes) >= 1
    assert sorted(d for _, _, d in service.store.versions(gid)) == sorted(res.accepted_hashes)
    assert service.store.problems(gid) == []


def test_the_model_is_released_once(principals):
    """POST /v1/release closes the run and records the average against the grant; every later
    call (another service on the same run: a restart) returns the recorded bytes."""
    p = principals
    service = _service(p)
    alice, model = bearer(p.client("alice")), bearer(p.pipeline)
    with serving(_app(p, service)) as base, httpx.Client(base_url=base) as c:
        t = c.post("/v1/draw", headers=alice).json()
        c.post(f"/v1/discard/{t['ticket']}", json={"weights": _honest(t["weights"]).tolist()},
               headers=alice)
        t2 = c.post("/v1/draw", headers=alice).json()       # still out when the run is released
        live = c.get("/v1/average", headers={"accept": BINARY, **model}).content
        first = c.post("/v1/release", headers={"accept": BINARY, **model})
        assert first.status_code == 200 and first.headers["x-dnd-final"] == "true"
        assert first.content == live   # nothing landed in between
        assert c.post(f"/v1/discard/{t2['ticket']}",
                      json={"weights": _honest(t2["weights"]).tolist()},
                      headers=alice).status_code == 409
        assert c.post("/v1/draw", headers=bearer(p.client("bob"))).status_code == 409
    again = _service(p)   # a restart: same grant, the recorded release
    with serving(_app(p, again)) as base, httpx.Client(base_url=base) as c:
        assert c.get("/v1/average", headers={"accept": BINARY, **model}).content == first.content
        assert c.post("/v1/release", headers={"accept": BINARY, **model}).content == first.content
        assert c.get("/v1/average", headers=model).json()["final"] is True
    with open_ledger(p.url, token=p.admin) as led:
        [rec] = led.releases(service.grant_id)
        assert rec.name == RELEASE_NAME and rec.value == first.content
        assert led.check_consistency(STREAM) == []


def test_the_simulator_refuses_non_local_hosts():
    with pytest.raises(ValueError, match="127.0.0.1"):
        asyncio.run(simulate("http://example.com:80", updates=1, tokens=["t"],
                             make_update=lambda w: w))


def test_serve_refuses_bad_options_before_charging(sqlite_url, capsys):
    from sage_tfx.dnd.server import main
    make_ledger(sqlite_url)
    args = ["--ledger", sqlite_url, "--stream", STREAM, "--run-id", "r1", "--window-last", "4",
            "--features", "2", "--gamma", "0.1", "--epsilon", "1", "--refresh-seconds", "0"]
    assert main(args + ["--ticket-ttl", "0"]) == 2
    assert "ticket ttl" in capsys.readouterr().err
    assert main(args) == 2   # the ledger has principals: the server needs its token
    assert "token" in capsys.readouterr().err
    open_url = sqlite_url.replace("ledger.db", "open.db")
    with open_ledger(open_url) as led:
        led.create_stream(STREAM, epsilon_g=10.0, delta_g=1e-6)
        led.add_blocks(STREAM, [BlockSpec("b0", "/b/0")])
    assert main([*args[:1], open_url, *args[2:], "--workers", "2"]) == 2
    assert "principals" in capsys.readouterr().err
    with open_ledger(open_url) as led:
        assert [b.charges for b in led.blocks(STREAM)] == [0]


def test_sage_tfx_dnd_needs_the_serve_subcommand(capsys):
    from sage_tfx import cli
    with pytest.raises(SystemExit) as e:  # argparse's usage error: exit 2, the action named
        cli.main(["dnd"])
    assert e.value.code == 2
    assert "sage-tfx dnd serve" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # argparse of the server: --ledger etc. are required
        cli.main(["dnd", "serve", "--stream", "s"])
    assert e.value.code == 2
