"""The HTTP service and subscriber callbacks, with real uvicorn servers on 127.0.0.1."""
import socket
import threading
import time

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from sage_tfx.ptk.service import create_app, main

from ptk_data import HS, HS_CONFIG, window


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, app):
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)


def receiver(fail_first: int):
    """A subscriber that answers 500 to its first ``fail_first`` notifications."""
    app = FastAPI()
    app.state.got, app.state.failures = [], 0

    @app.post("/cb")
    async def cb(request: Request):
        body = await request.json()
        if body.get("probe"):
            return {"ok": True}
        if app.state.failures < fail_first:
            app.state.failures += 1
            return JSONResponse({"error": "try later"}, status_code=500)
        app.state.got.append(body)
        return {"ok": True}
    return app


def test_http_api_end_to_end_with_retried_callbacks(make_store, tmp_path):
    store = make_store()
    store.notifier.backoff = 0.01
    recv = receiver(fail_first=2)
    app = create_app(store, retry_seconds=0.2)
    with Server(app) as base, Server(recv) as rbase:
        c = httpx.Client(base_url=base, timeout=30,
                         headers={"Authorization": f"Bearer {app.state.auth.open_token}"})
        w0 = window(10000, 0)
        r = c.post("/windows", json={"columns": {k: v.tolist() for k, v in w0.items()},
                                     "user_key": "user"})
        assert r.status_code == 200, r.text
        body = {"ptk_type": HS, "tau": 0.2, "config": HS_CONFIG}
        r = c.post("/ptks", json=body)
        assert r.status_code == 201, r.text
        pid = r.json()["ptk_id"]
        # bad input: 4xx and nothing registered; unknown: 404
        assert c.post("/ptks", json=dict(body, tau=0)).status_code == 422
        assert c.post("/ptks", json=dict(body, train_dp_fn="x.y:z")).status_code == 422
        assert c.post("/ptks", json={"tau": 0.2}).status_code == 422
        assert c.post("/ptks", json=dict(body, ptk_type="no_such_type")).status_code == 400
        assert c.delete("/ptks/ptk-nope").status_code == 404
        assert c.post(f"/ptks/{pid}/subscriptions",
                      json={"endpoint": f"http://127.0.0.1:{free_port()}/cb"}).status_code == 400
        assert len(store.lake.ptks()) == 1
        # REJECT is a 409 with the reason
        r = c.post("/ptks", json=dict(body, menu=[{"epsilon": 1.0, "n": 10**7}]))
        assert r.status_code == 409 and "N_max" in r.json()["reject"]
        assert c.post(f"/ptks/{pid}/subscriptions",
                      json={"endpoint": f"{rbase}/cb"}).status_code == 201
        w1 = window(10000, 1)
        r = c.post("/windows", json={"columns": {k: v.tolist() for k, v in w1.items()},
                                     "user_key": "user"})
        assert r.status_code == 200
        # the first delivery round used up its 3 attempts against 2 failures and succeeded
        deadline = time.time() + 20
        while not recv.state.got and time.time() < deadline:
            time.sleep(0.05)
        assert recv.state.failures == 2
        (note,) = recv.state.got
        assert note["ptk_id"] == pid and note["version"] == 1 and note["window"] == 1
        # an explicit notify re-sends the same version: at-least-once, de-dup by version
        c.post(f"/ptks/{pid}/notify")
        got = c.get(f"/ptks/{pid}").json()
        assert got["version"] == 1 and got["newest_contributing_window"] == 1
        assert c.get(f"/ptks/{pid}/lineage").json()["grant_id"] == note["grant_id"]
        plan = c.get("/plan").json()
        assert plan["K"] == 1 and plan["partitions"][0]["members"][0]["ptk_id"] == pid
        assert c.delete(f"/ptks/{pid}").status_code == 200
        assert c.get(f"/ptks/{pid}/lineage").status_code == 200  # versions stay in the lake


def test_failed_endpoint_stays_pending_then_is_redelivered(make_store):
    store = make_store()
    store.notifier.backoff = 0.01
    recv = receiver(fail_first=5)
    with Server(recv) as rbase:
        store.advance_window(window(10000, 0), user_key="user")
        pid = store.register_ptk(HS, config=HS_CONFIG, tau=0.2)
        store.subscribe_to_ptk(pid, f"{rbase}/cb")
        out = store.advance_window(window(10000, 1), user_key="user")
        assert [d.status for d in out.delivered] == ["pending"]  # 3 attempts failed
        assert store.lake.outbox()[0].status == "pending"
        done = store.notifier.deliver()  # two more failures, then success
        assert [d.status for d in done] == ["delivered"]
        assert len(recv.state.got) == 1 and recv.state.got[0]["version"] == 1


def test_plan_command_prints_the_plan(make_store, capsys):
    store = make_store()
    store.advance_window(window(10000, 0), user_key="user")
    pid = store.register_ptk(HS, config=HS_CONFIG, tau=0.2,
                             menu=[(0.5, 1234)])
    assert main(["plan", "--ledger", store.url]) == 0
    out = capsys.readouterr().out
    assert "K = 1" in out and "1,234" in out and pid in out


def test_sage_tfx_ptk_plan_is_the_same_command(make_store, capsys):
    """``sage-tfx ptk plan`` passes its arguments to the store's own command line."""
    from sage_tfx import cli
    store = make_store()
    store.advance_window(window(10000, 0), user_key="user")
    pid = store.register_ptk(HS, config=HS_CONFIG, tau=0.2,
                             menu=[(0.5, 1234)])
    assert cli.main(["ptk", "plan", "--ledger", store.url]) == 0
    out = capsys.readouterr().out
    assert "K = 1" in out and pid in out


def test_serve_binds_loopback_and_prints_the_token_file(tmp_path):
    """``sage-tfx ptk serve`` on an open-mode ledger: 127.0.0.1 by default, a 0600 token file
    whose path it prints, and every endpoint closed without that token."""
    import os
    import stat
    import subprocess
    import sys

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sage_tfx.cli", "ptk", "serve", "--ledger",
         f"sqlite:///{tmp_path}/ledger.db", "--data-root", str(tmp_path / "data"), "--port",
         str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}" in line and "open mode" in line, line
        token_file = tmp_path / "data" / ".ptk-service-token"
        assert str(token_file) in line
        assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
        token = token_file.read_text().strip()
        assert token not in line
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                assert httpx.get(f"{base}/health").status_code == 401
                break
            except httpx.HTTPError:
                assert time.time() < deadline, "the service did not start"
                time.sleep(0.1)
        assert httpx.get(f"{base}/ptk-types").status_code == 401
        assert httpx.get(f"{base}/health", headers={
            "Authorization": f"Bearer {token}"}).json() == {"ok": True}
        r = httpx.get(f"{base}/ptk-types", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and HS in r.json()["types"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()
