"""The Draw-and-Discard HTTP service (FastAPI on uvicorn): ``python -m sage_tfx.dnd.server``.

Endpoints (weights are little-endian float64; send/accept ``application/octet-stream`` for binary
payloads, JSON otherwise):

* ``GET  /v1/spec`` — the model (family, features, classes), the clients' Alg. 1 parameters, the
  noise scale and ε per update, the run's id and passes.
* ``POST /v1/draw?client_id=…[&blocks=b1,b2]`` — admits one update (403 with the reason when the
  ledger's grant does not cover the client) and returns a drawn instance: binary body with the
  ticket in the ``X-DnD-Ticket`` header, or ``{"ticket": …, "weights": […]}``.
* ``POST /v1/discard/{ticket}`` — the updated model (binary body or ``{"weights": […]}``);
  answers ``{"accepted": true|false}``, nothing about slots.
* ``GET  /v1/average`` — the prediction model (mean of the k instances).
* ``GET  /v1/stats`` — counters (draws, accepted, rejected by the spam check, refused).

At start-up the server charges the run to the ledger (:func:`~sage_tfx.dnd.budget.request_run`)
before it accepts any update; if the ledger denies, it still serves ``/v1/spec`` and ``/v1/average``
but refuses every draw with the ledger's reason. Every ``--refresh-seconds`` it re-reads the
ledger and stops the clients of blocks retired since the grant. Binds 127.0.0.1 by default.
"""

import argparse
import asyncio
import contextlib
import json
import sys
from typing import Optional, Sequence

import numpy as np

from sage_tfx.dnd.budget import RunBudget, UpdateRefused, request_run
from sage_tfx.dnd.client import ClientConfig, check_update_matches_ledger_epsilon
from sage_tfx.dnd.glm import GLMSpec
from sage_tfx.dnd.service import DnDService, UnknownTicketError
from sage_tfx.dnd.spam import SpamCheck
from sage_tfx.dnd.state import DnDState, initial_instances

BINARY = "application/octet-stream"
TICKET_HEADER = "X-DnD-Ticket"
KEEP_ALIVE_SECONDS = 75  # clients keep their connection between a draw and its discard


def encode(weights: np.ndarray) -> bytes:
    return np.ascontiguousarray(weights, dtype="<f8").tobytes()


def decode(body: bytes, dim: int) -> np.ndarray:
    if len(body) != 8 * dim:
        raise ValueError(f"expected {8 * dim} bytes ({dim} float64 weights), got {len(body)}")
    return np.frombuffer(body, dtype="<f8").astype(np.float64)


def create_app(service: DnDService, *, ledger_url: Optional[str] = None,
               refresh_seconds: float = 0.0):
    """The FastAPI application over ``service`` (imported lazily: the core never needs it)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = None
        if ledger_url and refresh_seconds > 0 and service.budget is not None:
            task = asyncio.create_task(_refresh_loop(service, ledger_url, refresh_seconds))
        yield
        if task is not None:
            task.cancel()

    app = FastAPI(title="sage-tfx Draw-and-Discard", lifespan=lifespan)
    app.state.dnd = service
    dim = service.spec.dim

    def wants_binary(request: Request) -> bool:
        return BINARY in request.headers.get("accept", "")

    async def read_weights(request: Request) -> np.ndarray:
        body = await request.body()
        if request.headers.get("content-type", "").startswith(BINARY):
            return decode(body, dim)
        return np.asarray(json.loads(body)["weights"], dtype=np.float64)

    @app.get("/v1/spec")
    async def spec():
        return service.spec_dict()

    @app.post("/v1/draw")
    async def draw(request: Request, client_id: str = "", blocks: str = ""):
        try:
            tid, w = service.draw(client_id, [b for b in blocks.split(",") if b])
        except UpdateRefused as exc:
            return JSONResponse({"refused": str(exc)}, status_code=403)
        if wants_binary(request):
            return Response(encode(w), media_type=BINARY, headers={TICKET_HEADER: tid})
        return JSONResponse({"ticket": tid, "weights": w.tolist()})

    @app.post("/v1/discard/{ticket}")
    async def discard(ticket: str, request: Request):
        try:
            u = await read_weights(request)
            accepted = service.discard(ticket, u)
        except UnknownTicketError:
            return JSONResponse({"error": "unknown, used or expired ticket"}, status_code=404)
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse({"error": f"bad update: {exc}"}, status_code=400)
        return {"accepted": accepted}

    @app.get("/v1/average")
    async def average(request: Request):
        w = service.average()
        if wants_binary(request):
            return Response(encode(w), media_type=BINARY)
        return {"weights": w.tolist()}

    @app.get("/v1/stats")
    async def stats():
        return service.stats()

    return app


async def _refresh_loop(service: DnDService, ledger_url: str, seconds: float) -> None:
    from sage_tfx.ledger import open_ledger
    while True:
        await asyncio.sleep(seconds)
        with open_ledger(ledger_url) as led:
            service.budget.refresh(led)


def build_service(*, ledger_url: str, stream: str, run_id: str, spec: GLMSpec,
                  config: ClientConfig, k: int = 20, passes: int = 1, window_last: int = 1,
                  context: str = "default", block_scheme=None, spam_check: bool = True,
                  b0: Optional[np.ndarray] = None) -> DnDService:
    """Charges the run to the ledger, then builds the k instances and the service.

    ``block_scheme`` (e.g. a :class:`~sage_tfx.streams.HashBucketScheme` on the client id) maps
    clients to their blocks; without it clients name their blocks.
    """
    from sage_tfx.ledger import Window, open_ledger
    if not config.private:
        raise ValueError("a served run must add noise (epsilon is None)")
    # What the ledger will be charged per update must be what OpenDP's privacy map says the
    # clients' sampler delivers at this scale and sensitivity.
    check_update_matches_ledger_epsilon(config, spec.dim)
    with open_ledger(ledger_url) as led:
        decision = request_run(led, stream, run_id=run_id, config=config, dim=spec.dim,
                               passes=passes, window=Window(last=window_last), context=context)
    budget = RunBudget(decision.grant, config, spec.dim, passes) if decision.granted else None
    b0 = np.zeros(spec.dim) if b0 is None else np.asarray(b0, dtype=np.float64)
    check = SpamCheck.for_config(config) if spam_check and k >= 2 else None
    state = DnDState(initial_instances(b0, k, config.noise_variance), spam_check=check)
    block_of = None
    if block_scheme is not None:
        block_of = lambda client: [block_scheme.block_of(client).block_id]  # noqa: E731
    return DnDService(spec, config, state, budget, refusal=decision.reason, block_of=block_of)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sage_tfx.dnd.server",
                                description="Serve a Draw-and-Discard run charged to a ledger.")
    p.add_argument("--ledger", required=True, help="ledger URL (sqlite:///… or postgresql://…)")
    p.add_argument("--stream", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--window-last", type=int, default=1, help="granted window: last N blocks")
    p.add_argument("--context", default="default")
    p.add_argument("--bucket-scheme", help="hash:<column>:<buckets>:<salt>, client id -> block")
    p.add_argument("--family", default="logistic",
                   choices=("logistic", "linear", "poisson", "multinomial"))
    p.add_argument("--features", type=int, required=True)
    p.add_argument("--classes", type=int, default=1)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--gamma", type=float, required=True)
    p.add_argument("--l1-norm-clip", type=float, default=1.0)
    p.add_argument("--epsilon", type=float, required=True, help="epsilon per unit")
    p.add_argument("--unit", choices=("model", "feature"), default="model")
    p.add_argument("--passes", type=int, default=1, help="updates per client in this run")
    p.add_argument("--no-spam-check", action="store_true")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8700)
    p.add_argument("--refresh-seconds", type=float, default=30.0)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = build_parser().parse_args(argv)
    scheme = None
    if a.bucket_scheme:
        from sage_tfx.streams import scheme_from_spec
        scheme = scheme_from_spec(a.bucket_scheme)
    spec = GLMSpec(a.family, a.features, a.classes)
    config = ClientConfig(a.gamma, a.l1_norm_clip, a.epsilon, a.unit)
    service = build_service(ledger_url=a.ledger, stream=a.stream, run_id=a.run_id, spec=spec,
                            config=config, k=a.k, passes=a.passes, window_last=a.window_last,
                            context=a.context, block_scheme=scheme,
                            spam_check=not a.no_spam_check)
    if service.budget is None:
        print(f"ledger denied run {a.run_id}: {service.refusal}; every draw will be refused",
              file=sys.stderr)
    else:
        print(f"run {a.run_id} granted on {len(service.budget.blocks)} block(s); serving "
              f"{spec.dim} weights x k={a.k} on {a.host}:{a.port}", file=sys.stderr)
    import uvicorn
    uvicorn.run(create_app(service, ledger_url=a.ledger, refresh_seconds=a.refresh_seconds),
                host=a.host, port=a.port, log_level="warning", access_log=False,
                timeout_keep_alive=KEEP_ALIVE_SECONDS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
