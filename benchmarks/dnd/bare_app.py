"""A bare FastAPI app with the D&D server's endpoints and payloads but none of its work (no
authentication, ledger, database, norm bound or spam check): the baseline of
``bench_server.py``. It parses each update exactly as the real server does (the same pydantic
model for JSON, ``numpy.frombuffer`` for raw float64, :func:`sage_tfx.dnd.wire.decode_update`
for the framed encoding) and runs on the same uvicorn (uvloop, httptools), 127.0.0.1 only.

    .venv/bin/python benchmarks/dnd/bare_app.py --dim 387 --port 8799
"""
import argparse
import secrets
from typing import Annotated

import numpy as np
import uvicorn
from fastapi import FastAPI, Path, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from sage_tfx.dnd.server import (BINARY, KEEP_ALIVE_SECONDS, MAX_ABS_WEIGHT, TICKET_HEADER,
                                 decode, encode, fast_server_options)
from sage_tfx.dnd.wire import UPDATE_TYPE, decode_update, encode_update


def create_bare_app(dim: int) -> FastAPI:
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

    @app.post("/v1/draw")
    def draw(request: Request):
        tid = secrets.token_hex(16)
        accept = request.headers.get("accept", "")
        if UPDATE_TYPE in accept:
            return Response(encode_update(tid, instance, "float64"), media_type=UPDATE_TYPE,
                            headers={TICKET_HEADER: tid})
        if BINARY in accept:
            return Response(encode(instance), media_type=BINARY, headers={TICKET_HEADER: tid})
        return JSONResponse({"ticket": tid, "weights": instance.tolist()})

    def parse(kind: str, body: bytes, ticket: str) -> dict:
        if kind == UPDATE_TYPE:
            u = decode_update(body, dim=dim, ticket=ticket, limit=MAX_ABS_WEIGHT)
        elif kind == BINARY:
            u = decode(body, dim)
        else:
            u = np.asarray(Update.model_validate_json(body).weights, dtype=np.float64)
        return {"accepted": bool(np.isfinite(u).all())}

    @app.post("/v1/discard/{ticket}")
    async def discard(request: Request, ticket: str = Path(..., pattern="^[0-9a-f]{32}$")):
        body = await request.body()
        kind = request.headers.get("content-type", "application/json").split(";")[0].strip()
        return await run_in_threadpool(parse, kind, body, ticket)

    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    uvicorn.run(create_bare_app(a.dim), host="127.0.0.1", port=a.port, log_level="warning",
                access_log=False, timeout_keep_alive=KEEP_ALIVE_SECONDS, **fast_server_options())


if __name__ == "__main__":
    main()
