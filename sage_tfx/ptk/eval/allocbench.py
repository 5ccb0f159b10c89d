"""Allocator and end-to-end latency benchmark (PTK paper §6.5's "seconds for up to 50 PTKs").

* :func:`synthetic_menus` — ``count`` PTKs with the menu shape the profiler produces: for
  ε_j in (0.01, 0.05, 0.1, 0.2, 0.5), n_ij = n0_i · (0.5 / ε_j)^a_i rounded up to a power of two
  (Fig. 3 doubles n), n0_i log-uniform in [16, 4096], a_i uniform in [0.5, 1.5];
* :func:`solve_times` — Fig. 4 solve time (all K ≤ ``k_max`` in one budget) per workload size;
* :func:`hard_menus` / :func:`hard_run` — 200 PTKs needing K = 3–5, beside the paper's plan;
* :func:`register_to_notified` — a real store and a real HTTP subscriber on 127.0.0.1: time from
  ``register_ptk`` (DP profiling on the open window, allocation) through the next window's
  training to the subscriber receiving the new version.
"""
from __future__ import annotations

import math
import time
from typing import Optional

import numpy as np
from fastapi import FastAPI, Request

from sage_tfx.ptk import allocator

EPS = (0.01, 0.05, 0.1, 0.2, 0.5)


def synthetic_menus(count: int, seed: int = 0) -> dict:
    """``count`` synthetic menus whose n shrinks with ε like a power law."""
    rng = np.random.default_rng(seed)
    menus = {}
    for i in range(count):
        n0 = math.exp(rng.uniform(math.log(16), math.log(4096)))
        a = rng.uniform(0.5, 1.5)
        menus[f"ptk{i:03d}"] = [
            allocator.Option(e, 0.0, 2 ** math.ceil(math.log2(n0 * (0.5 / e) ** a)))
            for e in EPS]
    return menus


HARD_LOW = (0, 0, 0, 0, 1, 2)  # index of a PTK's smallest budget in HARD_EPS, drawn uniformly
HARD_EPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


def hard_menus(count: int, seed: int = 0) -> dict:
    """Harder menus: as :func:`synthetic_menus` on the grid (0.01, 0.02, 0.05, 0.1, 0.2, 0.5),
    but a third of the PTKs reach τ only from ε = 0.02 or 0.05 on (their smaller budgets are
    not in the menu), so 200 PTKs need K = 3–5 partitions before any can take a larger ε."""
    rng = np.random.default_rng(seed)
    menus = {}
    for i in range(count):
        n0 = math.exp(rng.uniform(math.log(16), math.log(4096)))
        a = rng.uniform(0.5, 1.5)
        low = int(rng.choice(HARD_LOW))
        menus[f"ptk{i:03d}"] = [
            allocator.Option(e, 0.0, 2 ** math.ceil(math.log2(n0 * (0.5 / e) ** a)))
            for e in HARD_EPS[low:]]
    return menus


def solve_times(sizes=(13, 50, 200), *, k_max: int = 8, time_limit: float = 25.0,
                seed: int = 0) -> list[dict]:
    """Allocator solve times for ``sizes`` PTKs of synthetic menus."""
    out = []
    for n in sizes:
        menus = synthetic_menus(n, seed)
        t0 = time.perf_counter()
        plan = allocator.allocate(menus, epsilon_g=1.0, n_max=10**9, k_max=k_max,
                                  time_limit=time_limit)
        out.append({"ptks": n, "seconds": time.perf_counter() - t0, "K": plan.K,
                    "optimal": plan.optimal, "gap": plan.gap,
                    "first_feasible": plan.first_feasible,
                    "total": plan.total, "feasible": plan.feasible, "tried_k": plan.tried_k,
                    "max_partition_eps": max((str(p.epsilon_sum) for p in plan.partitions),
                                             default=None)})
    return out


def register_to_notified(root: str, *, ptks: int = 13, window_records: int = 20000,
                         seed: int = 0) -> list[dict]:
    """Registers ``ptks`` historical-statistics PTKs one after another on a real store (SQLite
    under ``root``); after each registration a window boundary trains everything and notifies
    a real HTTP subscriber. Returns per-PTK timings (register, window, first notification)."""
    import threading

    import uvicorn
    from sage_tfx.dp.noise import SeededNoise
    from sage_tfx.ptk.store import PTKStore, StoreConfig

    got: dict = {}
    app = FastAPI()

    @app.post("/cb")
    async def cb(request: Request):
        body = await request.json()
        if not body.get("probe"):
            got.setdefault((body["ptk_id"], body["version"]), time.perf_counter())
        return {"ok": True}

    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.01)
    rng = np.random.default_rng(seed)
    cfg = StoreConfig(stream="bench", n_max=10**7, train_buckets=32, profile_buckets=16,
                      profile_share=0.5, menu=(0.05, 0.1, 0.2, 0.5), profile_epsilon=0.1,
                      profile_n_max=128)
    store = PTKStore(f"sqlite:///{root}/ledger.db", f"{root}/data", cfg, noise=SeededNoise(seed))

    def window():
        keys = rng.choice(np.array(list("abcdefgh")), size=window_records)
        return {"user": np.arange(window_records).astype(str), "k": keys,
                "v": rng.normal(5, 2, size=window_records) + (keys == "a")}
    out = []
    try:
        store.advance_window(window(), user_key="user")
        for i in range(ptks):
            t0 = time.perf_counter()
            pid = store.register_ptk(
                "histstats", 1, tau=0.2,
                config={"key": "k", "domain": list("abcdefgh"), "value": "v", "lower": 0,
                        "upper": 10})
            t1 = time.perf_counter()
            if not isinstance(pid, str):
                out.append({"i": i, "reject": pid.reason})
                store.advance_window(window(), user_key="user")
                continue
            store.subscribe_to_ptk(pid, f"http://127.0.0.1:{port}/cb")
            t2 = time.perf_counter()
            res = store.advance_window(window(), user_key="user")
            t3 = time.perf_counter()
            version = next(t["version"] for t in res["trained"] if t.get("ptk_id") == pid)
            deadline = time.time() + 30
            while (pid, version) not in got and time.time() < deadline:
                time.sleep(0.001)
            out.append({"i": i, "ptk_id": pid, "register_s": t1 - t0, "subscribe_s": t2 - t1,
                        "window_s": t3 - t2, "trained": len(res["trained"]),
                        "notified_s": got.get((pid, version), float("nan")) - t0,
                        "K": store.plan()["K"]})
    finally:
        store.close()
        server.should_exit = True
        th.join(timeout=10)
    return out


def k_sweep(count: int, *, k_max: int = 8, time_limit: float = 25.0, seed: int = 0,
            menus: Optional[dict] = None) -> list[dict]:
    """Fig. 4 with at most K partitions, K = 1 … k_max: the paper stops at the first feasible
    K, which need not be the K of least total samples (a further partition lets PTKs take
    larger ε and fewer samples)."""
    menus = synthetic_menus(count, seed) if menus is None else menus
    out = []
    for K in range(1, k_max + 1):
        t0 = time.perf_counter()
        plan = allocator.allocate(menus, epsilon_g=1.0, n_max=10**9, k_max=K,
                                  time_limit=time_limit)
        out.append({"ptks": count, "K": K, "feasible": plan.feasible,
                    "total": plan.total if plan.feasible else None,
                    "partitions_used": plan.K, "optimal": plan.optimal, "gap": plan.gap,
                    "seconds": time.perf_counter() - t0})
    return out


def hard_run(count: int = 200, *, k_max: int = 8, time_limit: float = 25.0,
             seed: int = 0) -> dict:
    """One all-K allocation of :func:`hard_menus` beside the paper's plan (the optimum at the
    first feasible K, found as the all-K optimum with k_max = that K)."""
    menus = hard_menus(count, seed)
    t0, c0 = time.perf_counter(), time.process_time()
    plan = allocator.allocate(menus, epsilon_g=1.0, n_max=10**9, k_max=k_max,
                              time_limit=time_limit)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    paper = None
    for K in range(1, k_max + 1):
        p = allocator.allocate(menus, epsilon_g=1.0, n_max=10**9, k_max=K,
                               time_limit=time_limit)
        if p.feasible:
            paper = {"K": K, "total": p.total, "gap": p.gap, "optimal": p.optimal}
            break
    return {"ptks": count, "seed": seed, "seconds": secs, "cpu_seconds": cpu, "K": plan.K,
            "total": plan.total,
            "gap": plan.gap, "lower_bound": plan.lower_bound, "optimal": plan.optimal,
            "paper_K": paper and paper["K"], "paper_total": paper and paper["total"],
            "paper_optimal": paper and paper["optimal"], "paper_gap": paper and paper["gap"]}
