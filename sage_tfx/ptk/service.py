"""The PTK store over HTTP (FastAPI + uvicorn): ``python -m sage_tfx.ptk.service``.

Routes (JSON): ``POST /ptks`` register (201 with the id, 409 with the REJECT reason),
``DELETE /ptks/{id}``, ``PUT /ptks/{id}/config``, ``PUT /ptks/{id}/tau``,
``POST /ptks/{id}/subscriptions`` (the endpoint must answer a probe), ``POST /ptks/{id}/notify``,
``GET /ptks/{id}`` (newest state, or ``?version=``), ``GET /ptks/{id}/lineage``, ``GET /plan``,
``POST /windows`` (the next window's columns; trains and notifies), ``GET /health``.
Bad input is a 400 with the error (nothing changed); an unknown PTK a 404. Calls are serialised
on one lock (the store holds one database connection). A background thread re-delivers pending
notifications every ``retry_seconds`` (at-least-once; receivers de-duplicate on the version).
"""
from __future__ import annotations

import argparse
import contextlib
import threading
from typing import Any, Optional

import numpy as np
from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse

from sage_tfx.ptk.abstraction import UnknownPTKError
from sage_tfx.ptk.store import PTKStore, Reject, StoreConfig


def _jsonable(x: Any) -> Any:
    if hasattr(x, "to_dict"):
        return x.to_dict()
    return x


def create_app(store: PTKStore, *, retry_seconds: float = 1.0) -> FastAPI:
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

    app = FastAPI(title="Sage PTK store", lifespan=lifespan)

    def call(fn, *args, ok_status=200, **kw):
        try:
            with lock:
                out = fn(*args, **kw)
        except UnknownPTKError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        except ValueError as exc:
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=400)
        if isinstance(out, Reject):
            return JSONResponse({"reject": out.reason}, status_code=409)
        return JSONResponse(_jsonable(out), status_code=ok_status)

    @app.get("/health")
    def health():
        return {"ok": True, "window": store.windows.current()}

    @app.post("/ptks")
    def register(body: dict = Body(...)):
        try:
            args = dict(train_dp_fn=body["train_dp_fn"], eval_fn=body["eval_fn"],
                        train_frequency=body.get("train_frequency", 1))
            kw = {k: body[k] for k in ("config", "name", "dp_event_fn", "erm_fn") if k in body}
            tau = body["tau"]
        except KeyError as exc:
            return JSONResponse({"error": f"missing field {exc}"}, status_code=400)
        menu = [tuple(m) for m in body["menu"]] if body.get("menu") is not None else None
        def reg():
            out = store.register_ptk(**args, tau=tau, menu=menu, **kw)
            return out if isinstance(out, Reject) else {"ptk_id": out}
        return call(reg, ok_status=201)

    @app.delete("/ptks/{ptk_id}")
    def deregister(ptk_id: str):
        return call(store.deregister_ptk, ptk_id)

    @app.put("/ptks/{ptk_id}/config")
    def update_config(ptk_id: str, body: dict = Body(...)):
        return call(store.update_ptk_config, ptk_id, body.get("config"))

    @app.put("/ptks/{ptk_id}/tau")
    def update_tau(ptk_id: str, body: dict = Body(...)):
        return call(store.update_ptk_performance_target, ptk_id, body.get("tau"))

    @app.post("/ptks/{ptk_id}/subscriptions")
    def subscribe(ptk_id: str, body: dict = Body(...)):
        resp = call(store.subscribe_to_ptk, ptk_id, body.get("endpoint"), ok_status=201)
        return resp if resp.status_code != 201 else JSONResponse(
            {"ptk_id": ptk_id, "endpoint": body.get("endpoint")}, status_code=201)

    @app.post("/ptks/{ptk_id}/notify")
    def notify(ptk_id: str):
        return call(store.notify_new_ptk_state, ptk_id)

    @app.get("/ptks/{ptk_id}")
    def get(ptk_id: str, version: Optional[int] = None):
        def fetch():
            p = store.get_ptk(ptk_id, version)
            return {"id": p.id, "version": p.version, "model_state": p.model_state,
                    "config": p.config, "tau": p.tau,
                    "oldest_contributing_window": p.oldest_contributing_window,
                    "newest_contributing_window": p.newest_contributing_window}
        return call(fetch)

    @app.get("/ptks/{ptk_id}/lineage")
    def lineage(ptk_id: str, version: Optional[int] = None):
        return call(store.lineage, ptk_id, version)

    @app.get("/plan")
    def plan():
        return call(lambda: store.plan() or {"K": 0, "partitions": []})

    @app.post("/windows")
    def advance(body: dict = Body(...)):
        cols = body.get("columns")
        if not isinstance(cols, dict):
            return JSONResponse({"error": "columns must be an object of arrays"}, status_code=400)
        return call(store.advance_window, {k: np.asarray(v) for k, v in cols.items()},
                    user_key=body.get("user_key"))

    return app


def serve(url: str, data_root: str, *, host: str = "127.0.0.1", port: int = 8765,
          config: StoreConfig = StoreConfig()) -> None:
    import uvicorn
    store = PTKStore(url, data_root, config)
    try:
        uvicorn.run(create_app(store), host=host, port=port, log_level="warning")
    finally:
        store.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sage_tfx.ptk.service",
                                 description="The Sage PTK store: serve the API, or print the plan")
    ap.add_argument("command", choices=("serve", "plan"))
    ap.add_argument("--url", required=True, help="ledger database URL (sqlite:///... or postgresql://...)")
    ap.add_argument("--data-root", default="ptk-data", help="where the open window's blocks live")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--stream", default="ptk")
    ap.add_argument("--epsilon-g", type=float, default=1.0)
    ap.add_argument("--n-max", type=int, default=1_000_000)
    a = ap.parse_args(argv)
    cfg = StoreConfig(stream=a.stream, epsilon_g=a.epsilon_g, n_max=a.n_max)
    if a.command == "serve":
        serve(a.url, a.data_root, host=a.host, port=a.port, config=cfg)
        return 0
    from sage_tfx.ptk.lake import Lake
    from sage_tfx.ptk.allocator import Allocation, Assignment, Partition
    lake = Lake(a.url)
    try:
        seq, plan = lake.plan()
    finally:
        lake.close()
    if plan is None:
        print("no plan yet (no PTK registered)")
        return 0
    parts = tuple(Partition(p["index"], p["size"], tuple(Assignment(**m) for m in p["members"]))
                  for p in plan["partitions"])
    print(f"plan {seq}: " + Allocation(parts, plan["epsilon_g"], plan["delta_g"], plan["n_max"],
                                       plan["solve_seconds"], tuple(plan["tried_k"])).render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
