"""A bare FastAPI app with the D&D server's endpoints and payloads but none of its work (no
authentication, ledger, database, norm bound or spam check): the baseline of
``bench_server.py``. It parses each update exactly as the real server does (the same pydantic
model for JSON, ``numpy.frombuffer`` for raw float64, :func:`sage_tfx.dnd.wire.decode_update`
for the framed encoding) and runs on the same uvicorn (uvloop, httptools), 127.0.0.1 only.

With ``--floor DB`` it is the *floor*: the least any D&D server with authenticated clients and
single-use tickets kept in a database must do on top — every request's bearer token looked up
by its SHA-256 in SQLite, every draw's ticket inserted and every update's ticket deleted (a
replayed or unknown ticket gets 404) with the returned model written over one of k instances,
each request one WAL transaction (``synchronous=NORMAL``: no fsync per commit, less than the real
server's default). No ledger, passes, rate limit, versions, norm bound or spam check.

    .venv/bin/python benchmarks/dnd/bare_app.py --dim 387 --port 8799
    .venv/bin/python benchmarks/dnd/bare_app.py --dim 387 --port 8799 --floor /tmp/floor.db
"""
import argparse
import secrets
import sqlite3
import threading
from typing import Annotated

import numpy as np
import uvicorn
from fastapi import FastAPI, HTTPException, Path, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from sage_tfx.dnd.server import (BINARY, KEEP_ALIVE_SECONDS, MAX_ABS_WEIGHT, TICKET_HEADER,
                                 decode, encode, fast_server_options)
from sage_tfx.dnd.runstore import ticket_digest
from sage_tfx.dnd.wire import UPDATE_TYPE, decode_update, encode_update
from sage_tfx.ledger.access import token_digest


_TOKENS = "CREATE TABLE IF NOT EXISTS tokens (sha256 TEXT PRIMARY KEY)"


class Floor:
    """Tokens, tickets and k instances in one SQLite database (see the module docstring)."""

    def __init__(self, path: str, dim: int, k: int = 20):
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        for ddl in (_TOKENS, "CREATE TABLE IF NOT EXISTS tickets (sha256 TEXT PRIMARY KEY, "
                    "principal TEXT NOT NULL)",
                    "CREATE TABLE IF NOT EXISTS instances (slot INTEGER PRIMARY KEY, "
                    "weights BLOB NOT NULL)"):
            self.db.execute(ddl)
        self.k, self.lock = k, threading.Lock()
        init = np.random.default_rng(0).normal(0.0, 0.01, (k, dim))
        self.db.executemany("INSERT OR REPLACE INTO instances VALUES (?, ?)",
                            [(j, init[j].tobytes()) for j in range(k)])

    @staticmethod
    def add_tokens(path: str, tokens: list) -> None:
        with sqlite3.connect(path) as db:
            db.execute(_TOKENS)
            db.executemany("INSERT OR IGNORE INTO tokens VALUES (?)",
                           [(token_digest(t),) for t in tokens])

    def principal(self, request: Request) -> str:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        digest = token_digest(token)
        with self.lock:
            found = self.db.execute("SELECT 1 FROM tokens WHERE sha256 = ?",
                                    (digest,)).fetchone()
        if scheme.lower() != "bearer" or found is None:
            raise HTTPException(401, "unknown token")
        return digest

    def draw(self, principal: str, ticket: str) -> None:
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            self.db.execute("INSERT INTO tickets VALUES (?, ?)",
                            (ticket_digest(ticket), principal))
            self.db.execute("COMMIT")

    def discard(self, principal: str, ticket: str, u: np.ndarray) -> None:
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            gone = self.db.execute("DELETE FROM tickets WHERE sha256 = ? AND principal = ?",
                                   (ticket_digest(ticket),
                                    principal)).rowcount
            if gone:
                self.db.execute("UPDATE instances SET weights = ? WHERE slot = ?",
                                (u.tobytes(), secrets.randbelow(self.k)))
            self.db.execute("COMMIT")
        if not gone:
            raise HTTPException(404, "unknown ticket")


def create_bare_app(dim: int, floor: Floor | None = None) -> FastAPI:
    weight = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-MAX_ABS_WEIGHT,
                                    le=MAX_ABS_WEIGHT)]

    class Update(BaseModel):
        model_config = ConfigDict(extra="forbid")
        weights: Annotated[list[weight], Field(min_length=dim, max_length=dim)]

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    instance = np.random.default_rng(0).normal(0.0, 0.01, dim)

    @app.get("/v1/spec")
    def spec():
        return {"dim": dim}

    @app.get("/v1/stats")
    def stats():
        return {"updates": 0, "rejected_spam": 0, "out_of_bounds": 0, "draws": 0, "commits": 0}

    @app.post("/v1/draw")
    def draw(request: Request):
        tid = secrets.token_hex(16)
        if floor is not None:
            floor.draw(floor.principal(request), tid)
        accept = request.headers.get("accept", "")
        if UPDATE_TYPE in accept:
            return Response(encode_update(tid, instance, "float64"), media_type=UPDATE_TYPE,
                            headers={TICKET_HEADER: tid})
        if BINARY in accept:
            return Response(encode(instance), media_type=BINARY, headers={TICKET_HEADER: tid})
        return JSONResponse({"ticket": tid, "weights": instance.tolist()})

    def parse(kind: str, body: bytes, ticket: str, principal: str | None) -> dict:
        if kind == UPDATE_TYPE:
            u = decode_update(body, dim=dim, ticket=ticket, limit=MAX_ABS_WEIGHT)
        elif kind == BINARY:
            u = decode(body, dim)
        else:
            u = np.asarray(Update.model_validate_json(body).weights, dtype=np.float64)
        if floor is not None:
            floor.discard(principal, ticket, u)
        return {"accepted": bool(np.isfinite(u).all())}

    @app.post("/v1/discard/{ticket}")
    async def discard(request: Request, ticket: str = Path(..., pattern="^[0-9a-f]{32}$")):
        body = await request.body()
        kind = request.headers.get("content-type", "application/json").split(";")[0].strip()
        principal = None if floor is None else floor.principal(request)
        return await run_in_threadpool(parse, kind, body, ticket, principal)

    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--floor", default="", help="a SQLite file: the floor app (tokens added by "
                   "Floor.add_tokens before it starts)")
    a = p.parse_args()
    floor = Floor(a.floor, a.dim) if a.floor else None
    uvicorn.run(create_bare_app(a.dim, floor), host="127.0.0.1", port=a.port, log_level="warning",
                access_log=False, timeout_keep_alive=KEEP_ALIVE_SECONDS, **fast_server_options())


if __name__ == "__main__":
    main()
