"""The PTK store over HTTP (FastAPI + uvicorn): ``sage-tfx ptk serve``.

Routes (JSON bodies typed in :mod:`sage_tfx.ptk.api`): ``POST /ptks`` register a PTK of a
registered type (201 with the id, 409 with the REJECT reason), ``DELETE /ptks/{id}``,
``PUT /ptks/{id}/config``, ``PUT /ptks/{id}/tau``, ``POST /ptks/{id}/subscriptions`` (the
endpoint must answer a probe), ``POST /ptks/{id}/notify``, ``GET /ptks/{id}`` (newest state, or
``?version=``), ``GET /ptks/{id}/lineage``, ``GET /plan``, ``GET /ptk-types``, ``POST /windows``
(the next window's columns; trains and notifies), ``GET /health``.

Every route authenticates (``Authorization: Bearer <token>``,
:class:`sage_tfx.services.Authenticator`): changing the store (register, deregister, config,
target, windows) needs an admin, or a pipeline principal bound to the store's stream; reading
PTKs, subscribing and notifying need a pipeline principal; the plan and lineage also admit an
auditor; ``/health`` (``{"ok": true}``, nothing else) admits any principal (a liveness probe
sends a token too, or probes the TCP port). On a ledger in open mode the service makes its
own token (a 0600 file; ``serve`` prints where).

Bad input is a 4xx with nothing changed: 422 for a body that does not fit its model, 400 for a
value the store refuses, 404 for an unknown PTK, 413 past the body limit (1 MiB; windows 32 MiB
by default; a chunked body too), 415 for a body that is not JSON, 401 / 403 for a missing or
insufficient credential. Authentication comes first: bodies are read only after it
(:func:`sage_tfx.services.json_body`), so a caller without a valid token gets 401 whatever it
sends. The OpenAPI schema documents every body and these answers. Calls are serialised on one
lock (the store holds one database connection). A background thread re-delivers pending
notifications every ``retry_seconds`` (at-least-once; receivers de-duplicate on the version).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import threading
from typing import Annotated, Optional

import numpy as np
from fastapi import Depends, FastAPI, Path, Query
from fastapi.responses import JSONResponse

from sage_tfx import services
from sage_tfx.errors import LeaseTimeoutError
from sage_tfx.ledger import DEFAULT_CONTEXT, access, flags
from sage_tfx.ptk import api
from sage_tfx.ptk.abstraction import UnknownPTKError
from sage_tfx.ptk.registry import TypeRegistry, parse_type_specs, registry_from
from sage_tfx.ptk.results import plain
from sage_tfx.ptk.store import PTK_ID_PATTERN, PTKStore, Reject, StoreConfig

MAX_WINDOW_BODY = 32 * 1024 * 1024
_ERRORS = {  # what each error answer means here (services.AUTH_ERRORS: 401, 403, 413)
    400: "a value the store refuses (nothing changed)",
    404: "no such PTK (or version)",
    409: "REJECT: the workload does not fit (the reason in 'reject'; nothing changed)",
    422: "a body, path or query that does not fit its schema (nothing changed)",
    503: "the window lease stayed held by another process: retry after Retry-After"}

TOKEN_FILE = ".ptk-service-token"
PTKIdPath = Annotated[str, Path(pattern=PTK_ID_PATTERN, max_length=64)]
VersionQuery = Annotated[Optional[int], Query(ge=1, le=2 ** 31)]


class _BodyLimits:
    """ASGI middleware: ``services.BodyLimit`` with a larger limit for ``POST /windows``."""

    def __init__(self, app, max_bytes: int, window_bytes: int):
        self.default = services.BodyLimit(app, max_bytes)
        self.windows = services.BodyLimit(app, window_bytes)

    async def __call__(self, scope, receive, send):
        big = scope["type"] == "http" and scope.get("path") == "/windows"
        return await (self.windows if big else self.default)(scope, receive, send)


def errors(*codes: int) -> dict:
    """The OpenAPI ``responses`` of a route: the authentication errors and ``codes``."""
    return {**services.AUTH_ERRORS, **{c: services.error_response(
        _ERRORS[c], ("reject",) if c == 409 else ("error",)) for c in codes}}


def create_app(store: PTKStore, *, auth: Optional[services.Authenticator] = None,
               retry_seconds: float = 1.0, max_body: int = services.DEFAULT_MAX_BODY,
               max_window_body: int = MAX_WINDOW_BODY) -> FastAPI:
    """The API of ``store``; ``auth`` defaults to the ledger's principals (open mode: a token
    written to ``<data root>/.ptk-service-token``)."""
    owned = auth is None
    if owned:
        os.makedirs(store.windows.data_root, exist_ok=True)
        auth = services.Authenticator(
            store.url, open_token_file=os.path.join(store.windows.data_root, TOKEN_FILE))
    lock = threading.Lock()
    stop = threading.Event()

    def retry_loop():
        while not stop.wait(retry_seconds):
            with lock:
                if store.lake.pending():
                    store.notifier.deliver()

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        t = threading.Thread(target=retry_loop, daemon=True)
        t.start()
        yield
        stop.set()
        t.join(timeout=5)
        if owned:
            auth.close()

    # No open /docs, /redoc or /openapi.json: the schema is served to principals only.
    app = FastAPI(title="Sage PTK store", lifespan=lifespan, openapi_url=None, docs_url=None,
                  redoc_url=None)
    services.serve_schema(app, auth)
    app.state.auth = auth
    services.install_error_handlers(app)

    async def not_found(_request, exc):
        return JSONResponse({"error": str(exc)}, status_code=404)

    async def busy(_request, exc):
        return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": "5"})

    app.add_exception_handler(UnknownPTKError, not_found)
    app.add_exception_handler(LeaseTimeoutError, busy)
    app.add_middleware(_BodyLimits, max_bytes=max_body, window_bytes=max_window_body)

    reader = auth.require(access.PIPELINE)
    auditor = auth.require(access.PIPELINE, access.AUDITOR)
    admin_or_pipeline = auth.require(access.ADMIN, access.PIPELINE)

    def manager(p: access.Principal = Depends(admin_or_pipeline)) -> access.Principal:
        """An admin, or a pipeline principal bound to the store's stream (its budget)."""
        with lock:  # the store's ledger connection is used by one thread at a time
            store.ledger.authorize(access.CHARGE, stream=store.cfg.stream,
                                   context=DEFAULT_CONTEXT, principal=p)
        return p

    def call(fn, *args, ok_status=200, **kw):
        with lock:
            out = fn(*args, **kw)
        if isinstance(out, Reject):
            return JSONResponse({"reject": out.reason}, status_code=409)
        return JSONResponse(plain(out), status_code=ok_status)

    @app.get("/health", dependencies=[Depends(auth.require(*access.ROLES))],
             responses=errors())
    def health():
        return {"ok": True}

    @app.get("/ptk-types", dependencies=[Depends(reader)], responses=errors())
    def ptk_types():
        return {"types": store.registry.names()}

    @app.post("/ptks", status_code=201, dependencies=[Depends(manager)],
              responses=errors(400, 409, 422))
    def register(body: api.RegisterRequest = Depends(services.json_body(api.RegisterRequest))):
        def reg():
            out = store.register_ptk(body.ptk_type, body.train_frequency, config=body.config,
                                     tau=body.tau, name=body.name, ptk_id=body.ptk_id,
                                     menu=None if body.menu is None else
                                     [(m.epsilon, m.n) for m in body.menu])
            return out if isinstance(out, Reject) else {"ptk_id": out}
        return call(reg, ok_status=201)

    @app.delete("/ptks/{ptk_id}", dependencies=[Depends(manager)], responses=errors(404, 409))
    def deregister(ptk_id: PTKIdPath):
        return call(store.deregister_ptk, ptk_id)

    @app.put("/ptks/{ptk_id}/config", dependencies=[Depends(manager)],
             responses=errors(400, 404, 409, 422))
    def update_config(ptk_id: PTKIdPath,
                      body: api.ConfigUpdate = Depends(services.json_body(api.ConfigUpdate))):
        return call(store.update_ptk_config, ptk_id, body.config)

    @app.put("/ptks/{ptk_id}/tau", dependencies=[Depends(manager)],
             responses=errors(400, 404, 409, 422))
    def update_tau(ptk_id: PTKIdPath,
                   body: api.TauUpdate = Depends(services.json_body(api.TauUpdate))):
        return call(store.update_ptk_performance_target, ptk_id, body.tau)

    @app.post("/ptks/{ptk_id}/subscriptions", status_code=201, dependencies=[Depends(reader)],
              responses=errors(400, 404, 422))
    def subscribe(ptk_id: PTKIdPath,
                  body: api.Subscription = Depends(services.json_body(api.Subscription))):
        call(store.subscribe_to_ptk, ptk_id, body.endpoint)
        return JSONResponse({"ptk_id": ptk_id, "endpoint": body.endpoint}, status_code=201)

    @app.post("/ptks/{ptk_id}/notify", dependencies=[Depends(reader)], responses=errors(404))
    def notify(ptk_id: PTKIdPath):
        return call(store.notify_new_ptk_state, ptk_id)

    @app.get("/ptks/{ptk_id}", dependencies=[Depends(reader)], responses=errors(404))
    def get(ptk_id: PTKIdPath, version: VersionQuery = None):
        def fetch():
            p = store.get_ptk(ptk_id, version)
            return {"id": p.id, "version": p.version, "model_state": p.model_state,
                    "config": p.config, "tau": p.tau,
                    "oldest_contributing_window": p.oldest_contributing_window,
                    "newest_contributing_window": p.newest_contributing_window}
        return call(fetch)

    @app.get("/ptks/{ptk_id}/lineage", dependencies=[Depends(auditor)],
             responses=errors(404))
    def lineage(ptk_id: PTKIdPath, version: VersionQuery = None):
        return call(store.lineage, ptk_id, version)

    @app.get("/plan", dependencies=[Depends(auditor)], responses=errors())
    def plan():
        return call(lambda: store.plan() or {"K": 0, "partitions": []})

    @app.post("/windows", dependencies=[Depends(manager)], responses=errors(400, 422, 503))
    def advance(body: api.Window = Depends(services.json_body(api.Window))):
        return call(store.advance_window, {k: np.asarray(v) for k, v in body.columns.items()},
                    user_key=body.user_key, window_index=body.window_index)

    return app


def serve(url: str, data_root: str, *, host: str = "127.0.0.1", port: int = 8765,
          config: StoreConfig = StoreConfig(), registry: Optional[TypeRegistry] = None,
          token_file: Optional[str] = None, max_window_body: int = MAX_WINDOW_BODY) -> None:
    """Serves the store on ``host:port`` (loopback by default); prints where the open-mode
    token is, or that callers need ledger-issued tokens."""
    import uvicorn
    store = PTKStore(url, data_root, config, registry=registry)
    os.makedirs(store.windows.data_root, exist_ok=True)
    auth = services.Authenticator(url, open_token_file=token_file or os.path.join(
        store.windows.data_root, TOKEN_FILE))
    if auth.open_token_file:
        print(f"PTK store on http://{host}:{port}: the ledger is in open mode; callers send "
              f"'Authorization: Bearer <token>' with the token in {auth.open_token_file}",
              flush=True)
    else:
        print(f"PTK store on http://{host}:{port}: callers send 'Authorization: Bearer "
              "<token>' with a token the ledger issued to them", flush=True)
    try:
        uvicorn.run(create_app(store, auth=auth, max_window_body=max_window_body), host=host,
                    port=port, log_level="warning")
    finally:
        auth.close()
        store.close()


def main(argv=None) -> int:
    """Runs the PTK service command (serve, plan or records); returns the exit code."""
    ap = argparse.ArgumentParser(prog="python -m sage_tfx.ptk.service",
                                 description="The Sage PTK store: serve the API, print the plan, "
                                             "or print the records a profiled registration needs")
    ap.add_argument("command", choices=("serve", "plan", "records"))
    flags.add_ledger_argument(ap, deprecated=("--url",),
                              help="ledger URL (sqlite:///... or postgresql://..., or env:NAME / "
                                   "file:/path); serve and plan")
    ap.add_argument("--tau", type=float, action="append", default=[],
                    help="records: the performance target(s) (default 0.05, 0.1, 0.2)")
    ap.add_argument("--data-root", default="ptk-data", help="where the open window's blocks live")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--stream", default="ptk")
    ap.add_argument("--epsilon-g", type=float, default=1.0)
    ap.add_argument("--n-max", type=int, default=1_000_000)
    ap.add_argument("--ptk-type", action="append", default=[], metavar="NAME=MODULE",
                    help="register the PTK type a module you trust defines (train_dp, eval, "
                         "dp_event); repeatable. Also $SAGE_PTK_TYPES. Built in: "
                         "counts, trees, hpf, covariance, histstats, lloyd")
    ap.add_argument("--token-file", help="where an open-mode ledger's service token is written "
                                         "(default: DATA_ROOT/.ptk-service-token)")
    ap.add_argument("--max-window-bytes", type=int, default=MAX_WINDOW_BODY)
    a = ap.parse_args(argv)
    cfg = StoreConfig(stream=a.stream, epsilon_g=a.epsilon_g, n_max=a.n_max)
    if a.command == "records":
        print(cfg.describe_profile_need(a.tau or (0.05, 0.1, 0.2)))
        return 0
    if not a.ledger:
        ap.error(f"{a.command} needs --ledger")
    if a.command == "serve":
        specs = parse_type_specs(",".join(a.ptk_type))
        serve(a.ledger, a.data_root, host=a.host, port=a.port, config=cfg,
              registry=registry_from(specs), token_file=a.token_file,
              max_window_body=a.max_window_bytes)
        return 0
    from sage_tfx.ptk.lake import Lake
    lake = Lake(a.ledger)
    try:
        seq, plan = lake.plan()
    finally:
        lake.close()
    if plan is None:
        print("no plan yet (no PTK registered)")
        return 0
    print(f"plan {seq}: " + plan.render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
