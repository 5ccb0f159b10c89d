"""Load benchmark of the Draw-and-Discard HTTP service (bounded, 127.0.0.1 only).

Starts ``python -m sage_tfx.dnd.server`` in its own process on a fresh SQLite ledger with
principals (the run is charged before the first update; clients authenticate with bearer
tokens; instances, passes and tickets live in the ledger's database), then drives it with the
asyncio simulator in this process and prints updates/s and latency quantiles, for the paper's
387-weight and 50,000-weight models. ``--workers`` runs that many server processes on the run.
``in_process`` measures the service logic with its database but without HTTP.

    .venv/bin/python benchmarks/dnd/bench_server.py --updates 4000 --concurrency 32
"""
import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np

from sage_tfx.dnd.client import ClientConfig
from sage_tfx.dnd.simulator import simulate
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.ledger import BlockSpec, open_ledger
from sage_tfx.reporting import write_csv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ledger(url: str, clients: int) -> dict:
    """A stream of 16 hash-bucket blocks and principals: the server's and the clients' tokens."""
    with open_ledger(url) as led:
        led.create_stream("clients", epsilon_g=1e6, delta_g=1e-6,
                          granularity="hash:client_id:16:bench")
        led.add_blocks("clients", [BlockSpec(f"bucket-{i:02d}", f"/b/{i}") for i in range(16)])
        admin = led.add_principal("root", ["admin"])
    with open_ledger(url, token=admin) as led:
        server = led.add_principal("dnd-server", ["pipeline", "auditor"])
        led.bind("dnd-server", "clients", "default")
        return {"server": server,
                "clients": [led.add_principal(f"client-{i}", ["client"]) for i in range(clients)]}


def run_one(features: int, updates: int, concurrency: int, k: int, timeout: float,
            workers: int = 1) -> dict:
    tmp = tempfile.mkdtemp(prefix="dnd-bench-")
    url = f"sqlite:///{tmp}/ledger.db"
    tokens = _ledger(url, max(concurrency, updates // 500, 2))
    port = _free_port()
    cfg = ClientConfig(gamma=0.001, l1_norm_clip=1.0, epsilon=1.0)
    cmd = [sys.executable, "-m", "sage_tfx.dnd.server", "--ledger", url, "--stream", "clients",
           "--run-id", f"bench-{features}", "--window-last", "16",
           "--bucket-scheme", "hash:client_id:16:bench", "--features", str(features),
           "--k", str(k), "--gamma", "0.001", "--epsilon", "1.0", "--passes", "100000",
           "--port", str(port), "--workers", str(workers)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "SAGE_LEDGER_TOKEN": tokens["server"]})
    base = f"http://127.0.0.1:{port}"
    auth = {"authorization": f"Bearer {tokens['server']}"}
    try:
        for _ in range(1200):
            try:
                if httpx.get(f"{base}/v1/spec", headers=auth, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        noise = SeededNoise(0)  # clients' noise: a benchmark of the server, not a release
        # Pre-drawn noise bank so the single client process measures the server, not numpy.
        bank = noise.laplace(np.zeros((64, features + 1)), cfg.noise_scale)
        counter = iter(range(10 ** 9))
        res = asyncio.run(simulate(
            base, updates=updates, concurrency=concurrency, tokens=tokens["clients"],
            make_update=lambda w: w + bank[next(counter) % 64], timeout=timeout))
        stats = httpx.get(f"{base}/v1/stats", headers=auth).json()
        seq = sequential_http(base, min(updates, 500), cfg.noise_scale, tokens["clients"][0])
        print(f"{features + 1} weights, {workers} worker(s), one sequential client: {seq}",
              flush=True)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
    return {"weights": features + 1, "k": k, "workers": workers, "concurrency": concurrency,
            "updates": res.updates, "seconds": round(res.seconds, 2),
            "updates_per_s": round(res.updates_per_second, 1),
            "p50_ms": round(1000 * res.latency_quantile(0.5), 2),
            "p99_ms": round(1000 * res.latency_quantile(0.99), 2),
            "accepted": res.accepted, "rejected_spam": stats["rejected_spam"],
            "transport_errors": res.errors}


def sequential_http(base: str, updates: int, noise_scale: float, token: str) -> dict:
    """One synchronous keep-alive client, one update at a time: the per-request cost of the
    HTTP stack without the asyncio client's own overhead."""
    noise = SeededNoise(1)
    lat = []
    with httpx.Client(base_url=base, headers={"authorization": f"Bearer {token}"}) as c:
        for i in range(updates):
            t0 = time.perf_counter()
            r = c.post("/v1/draw", headers={"accept": "application/octet-stream"})
            w = np.frombuffer(r.content, "<f8")
            c.post(f"/v1/discard/{r.headers['X-DnD-Ticket']}",
                   content=noise.laplace(w, noise_scale).astype("<f8").tobytes(),
                   headers={"content-type": "application/octet-stream"})
            lat.append(time.perf_counter() - t0)
    secs = float(np.sum(lat))
    return {"updates": updates, "seconds": round(secs, 2),
            "updates_per_s": round(updates / secs, 1),
            "p50_ms": round(1000 * float(np.quantile(lat, 0.5)), 2),
            "p99_ms": round(1000 * float(np.quantile(lat, 0.99)), 2)}


def in_process(features: int, updates: int, k: int) -> dict:
    """The service logic alone (ticket, budget, draw, spam check, the database), no HTTP."""
    from sage_tfx.dnd.glm import GLMSpec
    from sage_tfx.dnd.server import build_service
    tmp = tempfile.mkdtemp(prefix="dnd-bench-")
    url = f"sqlite:///{tmp}/ledger.db"
    cfg = ClientConfig(gamma=0.001, l1_norm_clip=1.0, epsilon=1.0)
    spec = GLMSpec("logistic", features)
    with open_ledger(url) as led:
        led.create_stream("c", epsilon_g=1e6, delta_g=1e-6)
        led.add_blocks("c", [BlockSpec("b0", "/b0")])
    service = build_service(ledger_url=url, stream="c", run_id="r", spec=spec, config=cfg, k=k,
                            passes=updates)
    bank = SeededNoise(0).laplace(np.zeros((64, spec.dim)), cfg.noise_scale)
    lat = []
    start = time.perf_counter()
    for i in range(updates):
        t0 = time.perf_counter()
        tid, w = service.draw("client", ["b0"])
        service.discard("client", tid, w + bank[i % 64])
        lat.append(time.perf_counter() - t0)
    secs = time.perf_counter() - start
    stats = service.stats()
    return {"weights": spec.dim, "k": k, "workers": 1, "concurrency": "in-process",
            "updates": updates, "seconds": round(secs, 2),
            "updates_per_s": round(updates / secs, 1),
            "p50_ms": round(1000 * float(np.quantile(lat, 0.5)), 2),
            "p99_ms": round(1000 * float(np.quantile(lat, 0.99)), 2),
            "accepted": stats["accepted"], "rejected_spam": stats["rejected_spam"],
            "transport_errors": 0}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--updates", type=int, default=4000)
    p.add_argument("--large-updates", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--out", default="benchmarks/results/dnd/server_load.csv")
    a = p.parse_args()
    rows = [in_process(386, a.updates, a.k), in_process(49_999, a.large_updates, a.k)]
    for r in rows:
        print(r, flush=True)
    rows += [run_one(386, a.updates, a.concurrency, a.k, a.timeout, a.workers),
             run_one(49_999, a.large_updates, a.concurrency, a.k, a.timeout, a.workers)]
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    write_csv(a.out, rows)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
