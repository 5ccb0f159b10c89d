"""The Draw-and-Discard HTTP service (FastAPI on uvicorn): ``sage-tfx dnd serve``.

Every endpoint authenticates: callers send ``Authorization: Bearer <token>``, a token the
ledger issued to a principal (:mod:`sage_tfx.ledger.access`; on a ledger without principals the
server makes its own token and writes it to a 0600 file, :class:`sage_tfx.services.Authenticator`).
Weights travel as JSON, as raw little-endian float64 (``application/octet-stream``: exactly
8·dim bytes), or in the compact framed encoding ``application/x-sage-dnd-update``
(:mod:`sage_tfx.dnd.wire`: a 28-byte header with the ticket, dtype and count, then float32 or
float64 weights); a draw answers in the first of these the client accepts.

* ``GET  /v1/spec`` (any role) — the model, the clients' Alg. 1 parameters, the noise scale and
  ε per update, k, the run's id and passes, the ticket ttl.
* ``POST /v1/draw[?blocks=b1,b2]`` (role ``client``) — admits one update of the calling principal
  (403 with the reason when the grant does not cover it or its passes are used or held by
  unexpired draws; 429 with ``Retry-After`` past the server's per-client rate limit,
  ``--rate-limit R --rate-window S``; 409 once the run is released) and returns a drawn instance:
  binary body (raw or framed, float64) with
  the ticket in ``X-DnD-Ticket``, or ``{"ticket", "weights"}``. Passes are the principal's: no
  self-declared client id is accepted.
* ``POST /v1/discard/{ticket}`` (role ``client``, the principal that drew it) — the updated
  model (raw or framed binary, or ``{"weights": [...]}``: exactly ``dim`` finite numbers, no
  booleans);
  answers ``{"accepted": true|false}``, nothing about slots. 404 for an unknown, used, expired or
  another principal's ticket; 422 for a bad body, or (``{"refused": reason}``) for an update
  whose step from its drawn instance exceeds the unit's norm bound
  (:class:`~sage_tfx.dnd.spam.NormBound`, checked before the spam check; ``--no-norm-bound``
  turns it off) — in both cases nothing changes and the ticket stays usable.
* ``GET  /v1/average`` (``pipeline``) — the prediction model: the run's recorded release once it
  is released (``final``), else the live mean of the k instances.
* ``POST /v1/release`` (``pipeline``) — closes the run and records the average against the grant,
  once (:meth:`~sage_tfx.dnd.service.DnDService.release`).
* ``GET  /v1/stats`` (``pipeline`` or ``auditor``) — counters of the run (and this process's
  spam-check rejections by the statistic that failed).
* ``GET  /openapi.json`` (any role) — the OpenAPI schema (typed request and response bodies).

``admin`` may call everything. Bodies larger than the model needs are refused with 413 before
they are read (:class:`sage_tfx.services.BodyLimit`). At start-up the server charges the run to
the ledger before it accepts any update (a restart with the same run id replays the grant and
resumes the stored run); if the ledger denies, it still serves ``/v1/spec`` but refuses every
draw with the ledger's reason. Every ``--refresh-seconds`` it re-reads the ledger's audit log and
stops the clients of blocks retired since the grant, and deletes expired tickets. Binds
127.0.0.1 by default; ``--workers N`` runs N processes on one run; uvicorn runs on uvloop and
httptools (:func:`fast_server_options`).
"""

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import sys
from typing import Annotated, Optional, Sequence

import numpy as np

from sage_tfx import services
from sage_tfx.dnd.budget import RunBudget, UpdateRefused, request_run
from sage_tfx.dnd.client import ClientConfig, check_update_matches_ledger_epsilon
from sage_tfx.dnd.glm import GLMSpec
from sage_tfx.dnd.groupcommit import StoreUnavailableError
from sage_tfx.dnd.runstore import RunStore, check_ticket_ttl, decode, encode
from sage_tfx.dnd.service import (DEFAULT_TICKET_TTL, DnDService, RateLimit, RateLimitedError,
                                  RunReleasedError, UnknownTicketError, UpdateOutOfBoundsError)
from sage_tfx.dnd.wire import UPDATE_TYPE, WireFormatError, decode_update, encode_update
from sage_tfx.errors import InvalidRequestError, PermissionDeniedError, SageError
from sage_tfx.ledger import access, flags

__all__ = ["create_app", "build_service", "main", "encode", "decode", "BINARY", "TICKET_HEADER",
           "UPDATE_TYPE", "encode_update", "fast_server_options"]

BINARY = "application/octet-stream"
TICKET_HEADER = "X-DnD-Ticket"
KEEP_ALIVE_SECONDS = 75  # clients keep their connection between a draw and its discard
# Model weights must keep their squares and sums over k instances finite (the spam check's
# moments): anything beyond is bad input, not a model.
MAX_ABS_WEIGHT = 1e100
MAX_BLOCKS_QUERY = 4096
SERVE_ENV = "SAGE_DND_SERVE_ARGS"  # the worker processes' arguments (--workers N)
WORKER_HEALTHCHECK_SECONDS = 120

CLIENT_ROLES = (access.CLIENT,)
MODEL_ROLES = (access.PIPELINE,)
STATS_ROLES = (access.PIPELINE, access.AUDITOR)
ANY_ROLE = (access.CLIENT, access.PIPELINE, access.AUDITOR)


def max_body_bytes(dim: int) -> int:
    """The largest request body the server reads: a JSON update of ``dim`` weights written as
    long floats (≤ 26 characters each with separators), with room to spare; binary is 8·dim."""
    return 16 * 1024 + 40 * dim


def _error(description: str) -> dict:
    return services.error_response(description, ("error", "refused"))


_AUTH_ERRORS = {**services.AUTH_ERRORS, 413: _error("request body larger than the model needs")}


def create_app(service: DnDService, auth: services.Authenticator, *,
               refresh_seconds: float = 0.0):
    """The FastAPI application over ``service``; ``auth`` checks every caller's token.

    FastAPI and pydantic are imported here: the core never needs them.
    """
    from fastapi import Depends, FastAPI, Path, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response
    from pydantic import BaseModel, ConfigDict, Field, ValidationError
    from starlette.concurrency import run_in_threadpool

    dim = service.spec.dim
    weight = Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-MAX_ABS_WEIGHT,
                                    le=MAX_ABS_WEIGHT)]

    class Update(BaseModel):
        """A returned model: exactly ``dim`` finite numbers."""
        model_config = ConfigDict(extra="forbid")
        weights: Annotated[list[weight], Field(min_length=dim, max_length=dim)]

    class Drawn(BaseModel):
        ticket: str
        weights: list[float]

    class Decision(BaseModel):
        accepted: bool

    class Model(BaseModel):
        weights: list[float]
        final: bool
        version: int

    class Stats(BaseModel):
        draws: int
        updates: int
        accepted: int
        rejected_spam: int
        refused: int
        out_of_bounds: int
        outstanding_tickets: int
        version: int
        released: bool
        commits: int = Field(description="this process's transactions of draws and updates "
                                         "(group commit: many per transaction)")
        rejected_by: dict[str, int] = Field(
            default_factory=dict, description="this process's spam-check rejections by the "
                                              "statistic that failed (count, max, mean, copy, "
                                              "degenerate; one update may fail several)")

    class Spec(BaseModel):
        model: dict
        client: dict
        dim: int
        k: int
        passes: int
        ticket_ttl: float
        granted: bool
        noise_scale: Optional[float] = None  # the sampler's σ (gaussian) or Laplace b per weight
        noise_std: Optional[float] = None  # the std the sampler adds per weight
        update_epsilon: Optional[float] = None
        update_delta: Optional[float] = None
        update_event: Optional[dict] = None  # the dp_accounting event charged per update
        run_id: Optional[str] = None

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = None
        if refresh_seconds > 0 and service.budget is not None and service.ledger is not None:
            task = asyncio.create_task(_refresh_loop(service, refresh_seconds))
        yield
        if task is not None:
            task.cancel()

    # No unauthenticated route at all: the schema is served below, to any authenticated role.
    app = FastAPI(title="sage-tfx Draw-and-Discard", version="2", lifespan=lifespan,
                  openapi_url=None, docs_url=None, redoc_url=None)
    services.install_error_handlers(app)
    app.add_middleware(services.BodyLimit, max_bytes=max_body_bytes(dim))
    app.state.dnd = service
    client = Depends(auth.require(*CLIENT_ROLES))
    binary_weights = {"schema": {"type": "string", "format": "binary"}}

    def wants_binary(request: Request) -> bool:
        return BINARY in request.headers.get("accept", "")

    def wants_framed(request: Request) -> bool:
        return UPDATE_TYPE in request.headers.get("accept", "")

    def invalid(errors: list) -> RequestValidationError:
        return RequestValidationError(errors)

    def refused(exc: Exception, status: int = 403) -> JSONResponse:
        return JSONResponse({"refused": str(exc)}, status_code=status)

    def unavailable(exc: Exception) -> JSONResponse:  # the batch it was committed in failed
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": "1"})

    def model_response(request: Request, avg) -> Response:
        headers = {"X-DnD-Final": str(avg.final).lower(), "X-DnD-Version": str(avg.version)}
        if wants_binary(request):
            return Response(encode(avg.weights), media_type=BINARY, headers=headers)
        return JSONResponse({"weights": avg.weights.tolist(), "final": avg.final,
                             "version": avg.version}, headers=headers)

    services.serve_schema(app, auth)

    @app.get("/v1/spec", response_model=Spec, responses=_AUTH_ERRORS)
    def spec(_=Depends(auth.require(*ANY_ROLE))):
        return service.spec_dict()

    @app.post("/v1/draw", response_model=Drawn, responses={
        **_AUTH_ERRORS, 200: {"content": {BINARY: binary_weights, UPDATE_TYPE: binary_weights}},
        403: _error("refused: no grant, block not granted or stopped, no pass left"),
        409: _error("the run's model was released"),
        503: _error("the store could not commit it (nothing written): retry after Retry-After"),
        429: _error("the client's rate limit: retry after the Retry-After seconds")})
    def draw(request: Request, who=client,
             blocks: Optional[str] = Query(None, max_length=MAX_BLOCKS_QUERY,
                                           description="the client's blocks, comma separated "
                                                       "(only when the server has no block "
                                                       "scheme)")):
        if "client_id" in request.query_params:
            return JSONResponse({"error": "client_id is not accepted: the caller is the principal "
                                          "of its bearer token"}, status_code=400)
        try:
            tid, w = service.draw(who.name, [b for b in (blocks or "").split(",") if b])
        except RateLimitedError as exc:
            return JSONResponse({"refused": str(exc)}, status_code=429,
                                headers={"Retry-After": str(max(1, math.ceil(exc.retry_after)))})
        except UpdateRefused as exc:
            return refused(exc)
        except RunReleasedError as exc:
            return refused(exc, 409)
        except StoreUnavailableError as exc:
            return unavailable(exc)
        if wants_framed(request):
            return Response(encode_update(tid, w, "float64"), media_type=UPDATE_TYPE,
                            headers={TICKET_HEADER: tid})
        if wants_binary(request):
            return Response(encode(w), media_type=BINARY, headers={TICKET_HEADER: tid})
        return JSONResponse({"ticket": tid, "weights": w.tolist()})

    @app.post("/v1/discard/{ticket}", response_model=Decision, responses={
        **_AUTH_ERRORS, 403: _error("the client's block was stopped since its draw"),
        404: _error("unknown, used or expired ticket, or another principal's"),
        409: _error("the run's model was released"),
        503: _error("the store could not commit it (nothing written): retry after Retry-After"),
        422: _error("bad body, or the update's step exceeds the norm bound (nothing changed)"),
        415: _error(f"the body is neither JSON, {BINARY} nor {UPDATE_TYPE}")},
        openapi_extra={"requestBody": {"required": True, "content": {
            "application/json": {"schema": Update.model_json_schema()},
            BINARY: {"schema": {"type": "string", "format": "binary",
                                "minLength": 8 * dim, "maxLength": 8 * dim}},
            UPDATE_TYPE: {"schema": {"type": "string", "format": "binary",
                                     "minLength": 28 + 4 * dim, "maxLength": 28 + 8 * dim}}}}})
    async def discard(request: Request, who=client,
                      ticket: str = Path(..., pattern="^[0-9a-f]{32}$")):
        body = await request.body()
        kind = request.headers.get("content-type", "application/json").split(";")[0].strip()
        if kind not in (BINARY, UPDATE_TYPE, "application/json"):
            return JSONResponse({"error": f"send application/json, {BINARY} or {UPDATE_TYPE}, "
                                          f"not {kind!r}"}, status_code=415)
        # Parsing, the norm bound, the spam check and the database run off the event loop.
        return await run_in_threadpool(returned, who.name, ticket, kind, body)

    def parse(kind: str, body: bytes, ticket: str) -> np.ndarray:
        if kind == UPDATE_TYPE:
            try:
                return decode_update(body, dim=dim, ticket=ticket, limit=MAX_ABS_WEIGHT)
            except WireFormatError as exc:
                raise invalid([{"loc": ["body"], "type": "value_error", "msg": str(exc)}])
        if kind == BINARY:
            if len(body) != 8 * dim:
                raise invalid([{"loc": ["body"], "type": "value_error",
                                "msg": f"expected {8 * dim} bytes ({dim} float64 weights)"}])
            u = decode(body, dim)
            if not np.all(np.isfinite(u)) or np.any(np.abs(u) > MAX_ABS_WEIGHT):
                raise invalid([{"loc": ["body"], "type": "value_error",
                                "msg": f"weights must be finite and within ±{MAX_ABS_WEIGHT:g}"}])
            return u
        try:
            return np.asarray(Update.model_validate_json(body).weights, dtype=np.float64)
        except ValidationError as exc:
            raise invalid(exc.errors(include_url=False, include_context=False,
                                     include_input=False))

    def returned(principal: str, ticket: str, kind: str, body: bytes):
        u = parse(kind, body, ticket)
        try:
            accepted = service.discard(principal, ticket, u)
        except UnknownTicketError:
            return JSONResponse({"error": "unknown, used or expired ticket"}, status_code=404)
        except UpdateOutOfBoundsError as exc:
            return refused(exc, 422)
        except UpdateRefused as exc:
            return refused(exc)
        except RunReleasedError as exc:
            return refused(exc, 409)
        except StoreUnavailableError as exc:
            return unavailable(exc)
        return {"accepted": accepted}

    model_responses = {**_AUTH_ERRORS, 200: {"content": {BINARY: binary_weights}},
                       409: _error("the run was denied: there is no model")}

    def model_of(request: Request, produce) -> Response:
        try:
            return model_response(request, produce())
        except RunReleasedError as exc:
            return refused(exc, 409)

    model_role = auth.require(*MODEL_ROLES)

    def run_owner(p=Depends(model_role)):
        """A model reader of this run: a pipeline principal must be bound to the run's grant's
        (stream, context) — another team's pipeline neither reads nor closes the run."""
        grant = service.budget.grant if service.budget is not None else None
        if grant is not None:
            auth.authorize(p, access.CHARGE, stream=grant.stream, context=grant.context)
        return p

    @app.get("/v1/average", response_model=Model, responses=model_responses)
    def average(request: Request, _=Depends(run_owner)):
        return model_of(request, service.average)

    @app.post("/v1/release", response_model=Model, responses=model_responses)
    def release(request: Request, _=Depends(run_owner)):
        return model_of(request, service.release)

    @app.get("/v1/stats", response_model=Stats, responses=_AUTH_ERRORS)
    def stats(_=Depends(auth.require(*STATS_ROLES))):
        return service.stats()

    return app


async def _refresh_loop(service: DnDService, seconds: float) -> None:
    from starlette.concurrency import run_in_threadpool

    def once():
        with service.ledger() as led:
            stopped = service.refresh(led)
        if stopped:
            logging.warning("dnd: clients of retired block(s) %s stopped", ", ".join(stopped))
        service.sweep()
    while True:
        await asyncio.sleep(seconds)
        try:
            await run_in_threadpool(once)
        except Exception as exc:  # the ledger is unreachable for now: keep serving, try again
            logging.warning("dnd: refresh failed (%s: %s); retrying in %g s",
                            type(exc).__name__, exc, seconds)


def build_service(*, ledger_url: str, stream: str, run_id: str, spec: GLMSpec,
                  config: ClientConfig, k: int = 20, passes: int = 1, window_last: int = 1,
                  context: str = "default", block_scheme=None, spam_check: bool = True,
                  b0: Optional[np.ndarray] = None, ticket_ttl: float = DEFAULT_TICKET_TTL,
                  token: Optional[str] = None, refresh: bool = False, norm_bound: bool = True,
                  rate: Optional[RateLimit] = None) -> DnDService:
    """Charges the run to the ledger (a restart replays its grant), then opens its stored state.

    ``block_scheme`` (e.g. a :class:`~sage_tfx.streams.HashBucketScheme` on the client id) maps
    principals to their blocks; without it clients name their blocks. ``token`` is the server's
    ledger credential (default: ``$SAGE_LEDGER_TOKEN``). With ``refresh`` the server reads the
    audit log to stop clients of retired blocks: its principal needs the auditor role too.
    ``norm_bound`` checks every update's step against the unit's bound; ``rate`` limits each
    principal's draws per window (counted in the ledger's database, shared by every process).
    """
    from sage_tfx.ledger import Window, open_ledger
    if not config.private:
        raise ValueError("a served run must add noise (epsilon is None)")
    # What the ledger will be charged per update must cover what the Laplace sampler's proved
    # bound or dp_accounting (Gaussian) says the clients' sampler delivers.
    check_update_matches_ledger_epsilon(config, spec.dim)
    check_ticket_ttl(ticket_ttl)

    def ledger():
        return open_ledger(ledger_url, token)
    with ledger() as led:
        if refresh:
            try:
                led.authorize(access.AUDIT)
            except PermissionDeniedError as exc:
                raise PermissionDeniedError(
                    f"{exc}. The server stops clients of retired blocks by reading the audit log: "
                    "give its principal the auditor role as well as pipeline, or serve with "
                    "--refresh-seconds 0") from None
        decision = request_run(led, stream, run_id=run_id, config=config, dim=spec.dim,
                               passes=passes, window=Window(last=window_last), context=context)
        if not decision.granted:
            return DnDService.denied(spec, config, decision.reason, k=k, passes=passes)
        budget = RunBudget(decision.grant, config, spec.dim, passes)
        if refresh:
            budget.refresh(led)
    block_of = None
    if block_scheme is not None:
        block_of = lambda client: [block_scheme.block_of(client).block_id]  # noqa: E731
    return DnDService.open(RunStore(ledger_url), budget, spec, config, k=k,
                           spam_check=spam_check, b0=b0, ticket_ttl=ticket_ttl,
                           block_of=block_of, ledger=ledger, norm_bound=norm_bound, rate=rate)


def build_parser() -> argparse.ArgumentParser:
    """The ``sage-tfx dnd serve`` argument parser."""
    p = argparse.ArgumentParser(prog="sage-tfx dnd serve",
                                description="Serve a Draw-and-Discard run charged to a ledger.")
    flags.add_ledger_argument(
        p, required=True,
        help="ledger URL (sqlite:///… or postgresql://…, or env:NAME / file:PATH)")
    p.add_argument("--stream", required=True)
    p.add_argument("--run-id", required=True, help="the run; a restart with it resumes the run")
    p.add_argument("--window-last", type=int, default=1, help="granted window: last N blocks")
    p.add_argument("--context", default="default")
    p.add_argument("--bucket-scheme", help="hash:<column>:<buckets>:<salt>, principal -> block")
    p.add_argument("--family", default="logistic",
                   choices=("logistic", "linear", "poisson", "multinomial"))
    p.add_argument("--features", type=int, required=True)
    p.add_argument("--classes", type=int, default=1)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--gamma", type=float,
                   help="step size (gaussian unit: default from --planned-updates by the step "
                        "rule, sage_tfx.dnd.steprule)")
    p.add_argument("--l1-norm-clip", type=float, default=1.0)
    p.add_argument("--epsilon", type=float, required=True, help="epsilon per unit")
    p.add_argument("--unit", choices=("model", "feature", "gaussian"), default="model")
    p.add_argument("--delta", type=float, help="delta per update (gaussian unit)")
    p.add_argument("--l2-norm-clip", type=float,
                   help="L2 clip of the gradient (gaussian unit; default: the step rule's)")
    p.add_argument("--planned-updates", type=int,
                   help="updates the run is planned for (passes x clients): the gaussian "
                        "unit's step rule needs it when --gamma or --l2-norm-clip is not given")
    p.add_argument("--passes", type=int, default=1, help="updates per client in this run")
    p.add_argument("--no-spam-check", action="store_true")
    p.add_argument("--no-norm-bound", action="store_true",
                   help="do not refuse updates whose step exceeds the unit's norm bound")
    p.add_argument("--rate-limit", type=int,
                   help="draws per client per --rate-window (default: no limit)")
    p.add_argument("--rate-window", type=float, default=60.0,
                   help="seconds of a rate-limit window")
    p.add_argument("--ticket-ttl", type=float, default=DEFAULT_TICKET_TTL,
                   help="seconds before an unreturned draw expires and frees its pass")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8700)
    p.add_argument("--workers", type=int, default=1, help="server processes on this run")
    p.add_argument("--token-file", default=".sage-dnd-token",
                   help="where a ledger without principals gets the server's own token (0600)")
    p.add_argument("--refresh-seconds", type=float, default=30.0,
                   help="stop clients of retired blocks (needs the auditor role); 0: never")
    return p


def _config_of(a, dim: int) -> ClientConfig:
    """The clients' configuration; the gaussian unit's γ / C₂ not given come from the step rule
    (``--planned-updates``), anything else needs ``--gamma``."""
    if a.unit == "gaussian" and (a.gamma is None or a.l2_norm_clip is None):
        if a.planned_updates is None:
            raise InvalidRequestError("the gaussian unit needs --gamma and --l2-norm-clip, or "
                                      "--planned-updates for the step rule")
        if a.delta is None:
            raise InvalidRequestError("the gaussian unit needs --delta")
        from sage_tfx.dnd.steprule import gaussian_config
        return gaussian_config(epsilon=a.epsilon, delta=a.delta, dim=dim, k=a.k,
                               updates=a.planned_updates, gamma=a.gamma,
                               l2_norm_clip=a.l2_norm_clip)
    if a.gamma is None:
        raise InvalidRequestError("--gamma is required (the step rule is the gaussian unit's)")
    return ClientConfig(a.gamma, a.l1_norm_clip, a.epsilon, a.unit, a.delta, a.l2_norm_clip)


def _service_of(a) -> DnDService:
    scheme = None
    if a.bucket_scheme:
        from sage_tfx.streams import scheme_from_spec
        scheme = scheme_from_spec(a.bucket_scheme)
    spec = GLMSpec(a.family, a.features, a.classes)
    return build_service(ledger_url=a.ledger, stream=a.stream, run_id=a.run_id, spec=spec,
                         config=_config_of(a, spec.dim),
                         k=a.k, passes=a.passes, window_last=a.window_last, context=a.context,
                         block_scheme=scheme, spam_check=not a.no_spam_check,
                         ticket_ttl=a.ticket_ttl, refresh=a.refresh_seconds > 0,
                         norm_bound=not a.no_norm_bound,
                         rate=(RateLimit(a.rate_limit, a.rate_window) if a.rate_limit is not None
                               else None))


def _app_of(a, service: DnDService):
    auth = services.Authenticator(a.ledger, open_token_file=a.token_file)
    return create_app(service, auth, refresh_seconds=a.refresh_seconds), auth


def worker_app():
    """The application of one ``--workers`` process (its arguments come in
    ``$SAGE_DND_SERVE_ARGS``)."""
    a = build_parser().parse_args(json.loads(os.environ[SERVE_ENV]))
    return _app_of(a, _service_of(a))[0]


def fast_server_options() -> dict:
    """uvicorn's uvloop event loop and httptools parser when installed (both are pinned), else
    its pure-Python defaults."""
    import importlib.util
    opts = {}
    if importlib.util.find_spec("uvloop") is not None:
        opts["loop"] = "uvloop"
    if importlib.util.find_spec("httptools") is not None:
        opts["http"] = "httptools"
    return opts


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs ``sage-tfx dnd serve`` with ``argv``; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    try:
        if a.workers < 1:
            raise InvalidRequestError("--workers must be >= 1")
        if a.workers > 1:
            from sage_tfx.ledger import open_ledger
            with open_ledger(a.ledger) as led:
                if led.open_mode:
                    raise InvalidRequestError(
                        "--workers > 1 needs a ledger with principals (each worker of an "
                        "open-mode ledger would make its own token); add an admin and client "
                        "principals first")
        service = _service_of(a)  # charges the run (or replays its grant) before any worker
    except (SageError, ValueError, PermissionError) as exc:
        print(f"sage-tfx dnd serve: error: {exc}", file=sys.stderr)
        return 2
    if service.budget is None:
        print(f"ledger denied run {a.run_id}: {service.refusal}; every draw will be refused",
              file=sys.stderr)
    else:
        print(f"run {a.run_id} granted on {len(service.budget.blocks)} block(s); serving "
              f"{service.spec.dim} weights x k={a.k} on {a.host}:{a.port}", file=sys.stderr)
    import uvicorn
    opts = dict(host=a.host, port=a.port, log_level="warning", access_log=False,
                timeout_keep_alive=KEEP_ALIVE_SECONDS, **fast_server_options())
    if a.workers == 1:
        app, auth = _app_of(a, service)
        if auth.open_token_file:
            print(f"the ledger has no principals: callers use the token in {auth.open_token_file}",
                  file=sys.stderr)
        uvicorn.run(app, **opts)
        return 0
    os.environ[SERVE_ENV] = json.dumps(argv)
    # A worker imports the core and opens the run before it answers the supervisor's pings:
    # seconds on a loaded machine, so the health check waits longer than uvicorn's 5 s.
    uvicorn.run("sage_tfx.dnd.server:worker_app", factory=True, workers=a.workers,
                timeout_worker_healthcheck=WORKER_HEALTHCHECK_SECONDS, **opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
