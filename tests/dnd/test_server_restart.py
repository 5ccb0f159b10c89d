"""The D&D row of the replay matrix, with real server processes (uvicorn on 127.0.0.1):

* a server killed with SIGKILL and restarted with the same run id resumes exactly: the same
  grant, the same instances, the same pass counts (a client limited to one pass is refused its
  second update), an outstanding ticket still good;
* the run's model is released once: a retry, a restarted server and two processes releasing at
  once all return the recorded bytes, against one charge;
* two server processes on one database (SQLite and PostgreSQL), and ``--workers 2``, serve one
  run with no lost or torn instance;
* a 512 MB body is refused without being read (the server's memory does not grow).
"""
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from dndtest import STREAM, bearer, make_ledger

from sage_tfx.dnd.client import ClientConfig
from sage_tfx.dnd.runstore import RunStore
from sage_tfx.dnd.simulator import simulate, weights_hash
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.ledger import open_ledger

CFG = ClientConfig(gamma=0.001, l1_norm_clip=1.0, epsilon=1.0)
FEATURES = 386
START_SECONDS = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server_process(p, *, passes=1, run_id="r1", extra=(), probe_token=None):
    """``sage-tfx dnd serve`` in its own process group; killed with SIGKILL on exit."""
    port = _free_port()
    cmd = [sys.executable, "-m", "sage_tfx.dnd.server", "--ledger", p.url, "--stream", STREAM,
           "--run-id", run_id, "--window-last", "4", "--bucket-scheme", "hash:client_id:4:dnd",
           "--features", str(FEATURES), "--k", "20", "--gamma", "0.001", "--epsilon", "1.0",
           "--passes", str(passes), "--port", str(port), "--refresh-seconds", "0", *extra]
    env = {**os.environ, "SAGE_LEDGER_TOKEN": p.server}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    token = probe_token or p.pipeline
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited: {proc.stderr.read()}")
            try:
                if httpx.get(f"{base}/v1/spec", headers=bearer(token),
                             timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        yield proc, base
    finally:
        kill_9(proc)


def kill_9(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)   # the group this test started (uvicorn workers too)
        proc.wait(30)


def _honest(w, seed):
    return SeededNoise(seed).laplace(np.asarray(w), CFG.noise_scale)


def _stored(url, grant_id):
    store = RunStore(url)
    try:
        return [(s, v, w.tobytes()) for s, v, w in store.instances(grant_id, FEATURES + 1)], \
            store.passes(grant_id), store.problems(grant_id)
    finally:
        store.close()


def _one_charge_one_release(url, admin, grant_id):
    with open_ledger(url, token=admin) as led:
        assert [b.charges for b in led.blocks(STREAM)] == [1, 1, 1, 1]
        assert [r.name for r in led.releases(grant_id)] == ["dnd/average"]
        assert led.check_consistency(STREAM) == []


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _huge_body(base, ticket, token, declared=512 * 1024 * 1024) -> int:
    """POSTs a body declared as 512 MB (the first MiB sent); returns the status code."""
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall((f"POST /v1/discard/{ticket} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   f"Authorization: Bearer {token}\r\nContent-Type: application/octet-stream\r\n"
                   f"Content-Length: {declared}\r\n\r\n").encode())
        with contextlib.suppress(OSError):
            s.sendall(b"\0" * (1 << 20))
        head = s.recv(4096).decode("latin-1")
    return int(head.split()[1])


def test_kill_9_restart_resumes_passes_instances_tickets_and_the_release(sqlite_url):
    p = make_ledger(sqlite_url)
    alice, bob = bearer(p.client("alice")), bearer(p.client("bob"))
    model = bearer(p.pipeline)
    with server_process(p) as (proc, base), httpx.Client(base_url=base, timeout=30) as c:
        t = c.post("/v1/draw", headers=alice).json()
        assert c.post(f"/v1/discard/{t['ticket']}",
                      json={"weights": _honest(t["weights"], 1).tolist()},
                      headers=alice).json() == {"accepted": True}
        held = c.post("/v1/draw", headers=bob).json()          # out when the server dies
        rss = _rss_kb(proc.pid)
        assert _huge_body(base, held["ticket"], p.client("bob")) == 413
        assert _rss_kb(proc.pid) - rss < 50 * 1024               # nothing of the body was kept
        average = c.get("/v1/average",
                        headers={"accept": "application/octet-stream", **model}).content
        kill_9(proc)
    [gid] = _grant_ids(p)
    before = _stored(p.url, gid)
    assert before[1] == {"alice": (1, 1), "bob": (0, 1)} and before[2] == []
    with server_process(p) as (proc, base), httpx.Client(base_url=base, timeout=30) as c:
        second = c.post("/v1/draw", headers=alice)
        assert second.status_code == 403 and "used its 1" in second.json()["refused"]
        assert _stored(p.url, gid)[0] == before[0]               # instances identical
        assert c.get("/v1/average", headers={"accept": "application/octet-stream",
                                             **model}).content == average
        # bob's draw from before the kill is still his, good for one update
        assert c.post(f"/v1/discard/{held['ticket']}",
                      json={"weights": _honest(held["weights"], 2).tolist()},
                      headers=bob).status_code == 200
        release = c.post("/v1/release", headers={"accept": "application/octet-stream", **model})
        assert release.status_code == 200 and release.headers["x-dnd-final"] == "true"
        assert c.post("/v1/release", headers={"accept": "application/octet-stream",
                                              **model}).content == release.content   # a retry
        kill_9(proc)
    with server_process(p) as (proc, base), httpx.Client(base_url=base, timeout=30) as c:
        again = c.get("/v1/average", headers={"accept": "application/octet-stream", **model})
        assert again.content == release.content and again.headers["x-dnd-final"] == "true"
        assert c.post("/v1/draw", headers=bob).status_code == 409
    after = _stored(p.url, gid)
    assert after[1] == {"alice": (1, 1), "bob": (1, 1)} and after[2] == []
    assert _grant_ids(p) == {gid}                                 # the grant was replayed
    _one_charge_one_release(p.url, p.admin, gid)


def _grant_ids(p) -> set:
    store = RunStore(p.url)
    try:
        return {r.grant_id for r in store.runs()}
    finally:
        store.close()


async def _load(bases, tokens, updates):
    """``updates`` honest updates spread over the servers, each client on one server."""
    noise = SeededNoise(0)
    share = [tokens[i::len(bases)] for i in range(len(bases))]
    return await asyncio.gather(*(simulate(
        b, updates=updates // len(bases), concurrency=6, tokens=t, timeout=120,
        make_update=lambda w: noise.laplace(w, CFG.noise_scale)) for b, t in zip(bases, share)))


def _check_no_lost_or_torn_instance(p, results, gid):
    store = RunStore(p.url)
    try:
        accepted = set().union(*(r.accepted_hashes for r in results))
        n_accepted = sum(r.accepted for r in results)
        log = store.versions(gid)
        assert [v for v, _, _ in log] == list(range(1, n_accepted + 1))
        assert sorted(d for _, _, d in log) == sorted(accepted) and len(accepted) == n_accepted
        assert store.run(gid).accepted == n_accepted
        assert sum(u for u, _ in store.passes(gid).values()) == sum(r.updates for r in results)
        slots = {weights_hash(w) for _, v, w in store.instances(gid, FEATURES + 1) if v > 0}
        assert slots <= accepted
        assert store.problems(gid) == []
    finally:
        store.close()


def test_two_server_processes_on_one_database_serve_one_run(ledger_url):
    p = make_ledger(ledger_url, clients=[f"c{i}" for i in range(12)])
    tokens = list(p.clients.values())
    with server_process(p, passes=1000) as (_, base1), \
            server_process(p, passes=1000) as (_, base2):
        results = asyncio.run(_load([base1, base2], tokens, 120))
        assert all(r.errors == 0 and r.updates == 60 for r in results)
        [gid] = _grant_ids(p)
        _check_no_lost_or_torn_instance(p, results, gid)
        model = {"accept": "application/octet-stream", **bearer(p.pipeline)}

        async def release_both():
            async with httpx.AsyncClient(timeout=60) as c:
                return await asyncio.gather(c.post(f"{base1}/v1/release", headers=model),
                                            c.post(f"{base2}/v1/release", headers=model))
        r1, r2 = asyncio.run(release_both())
        assert r1.status_code == r2.status_code == 200 and r1.content == r2.content
    _one_charge_one_release(p.url, p.admin, gid)


def test_uvicorn_workers_serve_one_run(sqlite_url):
    p = make_ledger(sqlite_url, clients=[f"c{i}" for i in range(8)])
    with server_process(p, passes=1000, extra=("--workers", "2")) as (proc, base):
        results = asyncio.run(_load([base], list(p.clients.values()), 80))
        assert results[0].errors == 0 and results[0].updates == 80
        [gid] = _grant_ids(p)
        _check_no_lost_or_torn_instance(p, results, gid)
        children = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True,
                                  text=True).stdout.split()
        assert len(children) >= 3   # uvicorn's manager and its two workers
