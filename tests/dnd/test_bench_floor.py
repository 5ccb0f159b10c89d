"""Tests of the floor app of ``benchmarks/dnd/bare_app.py --floor``: the load benchmark reports
it as the least a server with authenticated clients and single-use tickets in a database must
do, so it must do that much — refuse unknown tokens, refuse a replayed or another client's
ticket, and write each accepted update over one of its k instances in SQLite."""
from __future__ import annotations

import importlib.util
import pathlib
import sqlite3

import numpy as np
import pytest
from fastapi.testclient import TestClient

from sage_tfx.dnd.server import BINARY, encode

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "dnd" / "bare_app.py"
DIM = 5


@pytest.fixture
def floor(tmp_path):
    spec = importlib.util.spec_from_file_location("bare_app", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = str(tmp_path / "floor.db")
    module.Floor.add_tokens(path, ["alice-token", "bob-token"])
    return path, TestClient(module.create_bare_app(DIM, module.Floor(path, DIM, k=3)))


def _instances(path: str) -> list:
    with sqlite3.connect(path) as db:
        return [np.frombuffer(w) for (w,) in db.execute(
            "SELECT weights FROM instances ORDER BY slot")]


def _auth(token: str) -> dict:
    return {"authorization": f"Bearer {token}", "accept": BINARY}


def test_the_floor_authenticates_every_draw_and_update(floor):
    _, c = floor
    assert c.post("/v1/draw", headers=_auth("mallory-token")).status_code == 401
    assert c.post("/v1/draw").status_code == 401
    ticket = c.post("/v1/draw", headers=_auth("alice-token")).headers["x-dnd-ticket"]
    r = c.post(f"/v1/discard/{ticket}", content=encode(np.zeros(DIM)),
               headers={**_auth("mallory-token"), "content-type": BINARY})
    assert r.status_code == 401


def test_a_ticket_buys_one_update_written_to_the_database(floor):
    path, c = floor
    before = _instances(path)
    ticket = c.post("/v1/draw", headers=_auth("alice-token")).headers["x-dnd-ticket"]
    u = np.arange(1.0, DIM + 1.0)
    body, kind = encode(u), {"content-type": BINARY}
    # another client cannot spend alice's ticket, and nothing is written
    assert c.post(f"/v1/discard/{ticket}", content=body,
                  headers={**_auth("bob-token"), **kind}).status_code == 404
    assert all(np.array_equal(a, b) for a, b in zip(before, _instances(path)))
    r = c.post(f"/v1/discard/{ticket}", content=body, headers={**_auth("alice-token"), **kind})
    assert r.status_code == 200 and r.json() == {"accepted": True}
    after = _instances(path)
    assert sum(not np.array_equal(a, b) for a, b in zip(before, after)) == 1
    assert any(np.array_equal(w, u) for w in after)
    # the replay is refused
    assert c.post(f"/v1/discard/{ticket}", content=body,
                  headers={**_auth("alice-token"), **kind}).status_code == 404
    assert c.post("/v1/discard/" + "0" * 32, content=body,
                  headers={**_auth("alice-token"), **kind}).status_code == 404
