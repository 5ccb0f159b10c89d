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
