"""Load benchmark of the Draw-and-Discard HTTP service against a bare FastAPI app on the same
payloads, measured in the same run (bounded, 127.0.0.1 only).

For the paper's 387-weight and a 50,000-weight model it starts ``python -m
sage_tfx.dnd.server`` (a fresh SQLite ledger with principals: the run is charged before the
first update, clients authenticate with bearer tokens, instances, passes and tickets live in the
ledger's database, norm bound and spam check on) and ``benchmarks/dnd/bare_app.py`` (the same
endpoints, parsing and uvicorn, none of the work), each in its own process, and drives both with
the asyncio simulator (``concurrency`` clients split over ``--load-procs`` forked processes,
each on uvloop, so one Python process does not cap the bare app), per encoding (JSON,
raw float64, framed float32): bare, real, real, bare, so drifting machine load affects both
alike. It reports updates/s, latency quantiles, the ratio real/bare, the honest updates the
real server rejected (and by which statistic), each server's CPU per update (its processes'
user + system time over the updates), the load average, and then sends the crude attacks to the
real server (``--attack-trials`` each) and counts how many it catches (422 from the norm bound, or
rejected by the spam check; ``first_passed_trial``: the trial that got through first). Writes
``server_load.csv`` and ``server_attacks.csv``. With ``--floor`` the real server is replaced by
``bare_app.py --floor`` (token look-ups, single-use tickets and instances in SQLite, nothing
else): what any server with authenticated clients and its state in a database at least costs.

    .venv/bin/python benchmarks/dnd/bench_server.py --updates 3000 --large-updates 1000
    .venv/bin/python benchmarks/dnd/bench_server.py --floor --updates 2000 --large-updates 600 \
        --timeout 30 --encodings raw,framed32 --tag floor
    .venv/bin/python benchmarks/dnd/bench_server.py --in-process --updates 1200 --large-updates 600
    .venv/bin/python benchmarks/dnd/bench_server.py --in-process --durability power \
        --max-batch 128 --updates 600 --large-updates 300
"""
import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Sequence

import httpx
import numpy as np

from sage_tfx.dnd.client import ClientConfig
from sage_tfx.dnd.simulator import simulate
from sage_tfx.dnd.wire import UPDATE_TYPE, decode_update, encode_update
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.ledger import BlockSpec, open_ledger
from sage_tfx.reporting import write_csv

HERE = os.path.dirname(os.path.abspath(__file__))
CFG = ClientConfig(gamma=0.001, l1_norm_clip=1.0, epsilon=1.0)
ENCODINGS = ("json", "raw", "framed32")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ledger(url: str, clients: int) -> dict:
    """A stream of 16 hash-bucket blocks and principals: the server's and the clients' tokens."""
    with open_ledger(url) as led:
        led.create_stream("clients", epsilon_g=1e9, delta_g=1e-6,
                          granularity="hash:client_id:16:bench")
        led.add_blocks("clients", [BlockSpec(f"bucket-{i:02d}", f"/b/{i}") for i in range(16)])
        admin = led.add_principal("root", ["admin"])
    with open_ledger(url, token=admin) as led:
        server = led.add_principal("dnd-server", ["pipeline", "auditor"])
        led.bind("dnd-server", "clients", "default")
        return {"server": server,
                "clients": [led.add_principal(f"client-{i}", ["client"]) for i in range(clients)]}


def _start(cmd: list, env: dict, base: str, headers: dict) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **env})
    for _ in range(1200):
        try:
            if httpx.get(f"{base}/v1/spec", headers=headers, timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[1]} exited: {proc.stderr.read()[-2000:]}")
    raise RuntimeError(f"{cmd[1]} did not answer")


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, 15)
    proc.wait(30)


def real_server(features: int, k: int, clients: int, workers: int, durability: str = "power",
                extra: Sequence[str] = ()):
    tmp = tempfile.mkdtemp(prefix="dnd-bench-")
    url = f"sqlite:///{tmp}/ledger.db" + ("" if durability == "power" else "?durability=process")
    tokens = _ledger(url, clients)
    port = _free_port()
    cmd = [sys.executable, "-m", "sage_tfx.dnd.server", "--ledger", url, "--stream", "clients",
           "--run-id", f"bench-{features}", "--window-last", "16",
           "--bucket-scheme", "hash:client_id:16:bench", "--features", str(features),
           "--k", str(k), "--gamma", str(CFG.gamma), "--epsilon", str(CFG.epsilon),
           "--passes", "1000000", "--port", str(port), "--workers", str(workers), *extra]
    base = f"http://127.0.0.1:{port}"
    auth = {"authorization": f"Bearer {tokens['server']}"}
    proc = _start(cmd, {"SAGE_LEDGER_TOKEN": tokens["server"]}, base, auth)
    return proc, base, tokens, auth


def bare_server(dim: int, floor: str = ""):
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, os.path.join(HERE, "bare_app.py"), "--dim", str(dim),
           "--port", str(port)] + (["--floor", floor] if floor else [])
    return _start(cmd, {}, base, {}), base


def floor_server(dim: int, clients: int):
    """``bare_app.py --floor``: the bare app plus token lookups, single-use tickets and the
    instances in SQLite, in place of the real server (``--floor``)."""
    import secrets
    sys.path.insert(0, HERE)
    from bare_app import Floor
    path = os.path.join(tempfile.mkdtemp(prefix="dnd-floor-"), "floor.db")
    tokens = [secrets.token_urlsafe(32) for _ in range(clients)]
    Floor.add_tokens(path, tokens)
    proc, base = bare_server(dim, path)
    return proc, base, {"clients": tokens}, {}


def drive(base: str, tokens: list, bank: np.ndarray, updates: int, concurrency: int,
          encoding: str, timeout: float, procs: int = 1):
    """``updates`` updates by ``concurrency`` clients, split over ``procs`` load-generator
    processes (forked, each an asyncio loop on uvloop with its share of the clients and
    tokens) started together; one SimulationResult: the updates of all, the slowest's seconds."""
    if procs <= 1:
        return _drive_one(base, tokens, bank, updates, concurrency, encoding, timeout)
    import multiprocessing
    from sage_tfx.dnd.simulator import SimulationResult
    ctx = multiprocessing.get_context("fork")
    gate, out = ctx.Barrier(procs), ctx.Queue()

    def child(i: int) -> None:
        gate.wait()
        r = _drive_one(base, tokens[i::procs], bank, updates // procs + (i < updates % procs),
                       concurrency // procs + (i < concurrency % procs), encoding, timeout,
                       seed=i)
        out.put((r.updates, r.accepted, r.refused, r.errors, r.seconds, r.latencies))
    children = [ctx.Process(target=child, args=(i,)) for i in range(procs)]
    for c in children:
        c.start()
    parts = [out.get(timeout=timeout + 120) for _ in children]
    for c in children:
        c.join(30)
    return SimulationResult(sum(p[0] for p in parts), sum(p[1] for p in parts),
                            sum(p[2] for p in parts), sum(p[3] for p in parts),
                            max(p[4] for p in parts), [x for p in parts for x in p[5]], set())


def _drive_one(base: str, tokens: list, bank: np.ndarray, updates: int, concurrency: int,
               encoding: str, timeout: float, seed: int = 0):
    import uvloop
    rng = np.random.default_rng([seed, time.time_ns()])

    def noise() -> np.ndarray:
        # Each update's noise: a bank row, cyclically shifted, each weight's sign drawn at random
        # (Laplace marginals, independent across updates in every statistic: a repeated noise
        # vector would make an update a copy of one built on the same instance, and one sign for
        # the whole row would give only 2·64 sums of noise, so a row whose sum falls in the mean
        # statistic's tail would be rejected every time it is drawn).
        row = bank[rng.integers(len(bank))]
        bits = np.unpackbits(np.frombuffer(rng.bytes((row.size + 7) // 8), np.uint8))
        return np.roll(row, int(rng.integers(row.size))) * (1.0 - 2.0 * bits[:row.size])
    coro = simulate(base, updates=updates, concurrency=concurrency, tokens=tokens,
                    make_update=lambda w: w + noise(), timeout=timeout, encoding=encoding)
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        return asyncio.run(coro)
    finally:
        asyncio.set_event_loop_policy(None)


def _cpu_seconds(proc: subprocess.Popen) -> float:
    """User + system CPU seconds of a server process and its children (uvicorn workers)."""
    import psutil
    total = 0.0
    root = psutil.Process(proc.pid)
    for p in [root] + root.children(recursive=True):
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def _per_update(seconds: float, results) -> float:
    n = sum(r.updates for r in results)
    return round(1000 * seconds / n, 2) if n else 0.0


def _row(dim, app, encoding, concurrency, results, extra=None) -> dict:
    n = sum(r.updates for r in results)
    secs = sum(r.seconds for r in results)
    lat = [x for r in results for x in r.latencies]
    return {"weights": dim, "app": app, "encoding": encoding, "concurrency": concurrency,
            "updates": n, "seconds": round(secs, 2),
            "updates_per_s": round(n / secs, 1) if secs else 0.0,
            "p50_ms": round(1000 * float(np.quantile(lat, 0.5)), 2) if lat else "",
            "p99_ms": round(1000 * float(np.quantile(lat, 0.99)), 2) if lat else "",
            "transport_errors": sum(r.errors for r in results), **(extra or {})}


def crude_attacks(base: str, token: str, dim: int, trials: int) -> list:
    """Each crude attack ``trials`` times on a freshly drawn instance: caught = refused by the
    norm bound (422) or rejected by the spam check."""
    rng = np.random.default_rng(7)
    b = CFG.noise_scale

    def noise():
        return rng.laplace(0.0, b, dim)
    attacks = {
        "honest (for reference)": lambda w: w + noise(),
        "scaled x10": lambda w: 10 * (w + noise()),
        "scaled x1.5": lambda w: 1.5 * (w + noise()),
        "noise x10": lambda w: w + 10 * noise(),
        "push 10 weights by +100 b": lambda w: w + noise() + np.where(np.arange(dim) < 10,
                                                                      100 * b, 0.0),
        "copy of the drawn instance": lambda w: w.copy(),
        "zeros": lambda w: np.zeros(dim),
        "shift every weight by +b": lambda w: w + noise() + b,
    }
    rows = []
    with httpx.Client(base_url=base, headers={"authorization": f"Bearer {token}"},
                      timeout=60) as c:
        for name, attack in attacks.items():
            bound = spam = passed = 0
            first = None  # the trial that passed first: an accepted attack widens the spread
            for trial in range(trials):
                r = c.post("/v1/draw", headers={"accept": UPDATE_TYPE})
                r.raise_for_status()
                ticket = r.headers["x-dnd-ticket"]
                u = attack(decode_update(r.content, dim=dim, ticket=ticket))
                r = c.post(f"/v1/discard/{ticket}", content=encode_update(ticket, u, "float64"),
                           headers={"content-type": UPDATE_TYPE})
                if r.status_code == 422:
                    bound += 1
                    c.post(f"/v1/discard/{ticket}", json={"weights": (u * 0 + 1e99).tolist()})
                elif r.json()["accepted"]:
                    passed += 1
                    first = trial + 1 if first is None else first
                else:
                    spam += 1
            rows.append({"weights": dim, "attack": name, "trials": trials,
                         "refused_norm_bound": bound, "rejected_spam_check": spam,
                         "passed": passed, "first_passed_trial": first or "",
                         "caught_pct": round(100 * (bound + spam) / trials, 1)})
            print(rows[-1], flush=True)
    return rows


def in_process(features: int, updates: int, background: bool, k: int = 20,
               durability: str = "process", max_batch: int = 0) -> dict:
    """The service logic without HTTP, 16 threads of draw + 5 ms + discard: the spam check with
    background recalibration (the server's) or in line (the check before it), SQLite with
    ``durability``; ``max_batch`` > 0 caps the draws and updates per group commit (1: one
    transaction and fsync each, as before group commit)."""
    import concurrent.futures

    from sage_tfx.dnd import groupcommit
    from sage_tfx.dnd.glm import GLMSpec
    from sage_tfx.dnd.server import build_service
    from sage_tfx.dnd.spam import SpamCheck
    if max_batch:
        groupcommit.MAX_BATCH = max_batch
    url = f"sqlite:///{tempfile.mkdtemp(prefix='dnd-bench-')}/l.db?durability={durability}"
    spec = GLMSpec("logistic", features)
    with open_ledger(url) as led:
        led.create_stream("c", epsilon_g=1e9, delta_g=1e-6)
        led.add_blocks("c", [BlockSpec("b0", "/b0")])
    svc = build_service(ledger_url=url, stream="c", run_id="r", spec=spec, config=CFG, k=k,
                        passes=10 ** 6)
    if not background:
        svc.spam_check = SpamCheck.for_config(CFG)

    def one(i):
        t, w = svc.draw(f"c{i % 16}", ["b0"])
        time.sleep(0.005)  # the client's step
        noise = np.random.default_rng(i).laplace(0.0, CFG.noise_scale, w.size)
        return svc.discard(f"c{i % 16}", t, w + noise)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        accepted = sum(ex.map(one, range(updates)))
    secs = time.perf_counter() - t0
    row = {"weights": spec.dim, "check": "background" if background else "in line",
           "durability": durability, "max_batch": groupcommit.MAX_BATCH,
           "commits": svc.store.commits, "updates": updates, "seconds": round(secs, 2),
           "updates_per_s": round(updates / secs, 1), "honest_rejected": updates - accepted,
           "load_1min": round(os.getloadavg()[0], 1)}
    print(row, flush=True)
    return row


def one_size(features: int, updates: int, a) -> tuple:
    dim = features + 1
    clients = max(a.concurrency, 2)
    real, real_base, tokens, auth = (
        floor_server(features + 1, clients) if a.floor else
        real_server(features, a.k, clients, a.workers, a.durability, a.server_args.split()))
    bare, bare_base = bare_server(dim)
    bank = SeededNoise(0).laplace(np.zeros((64, dim)), CFG.noise_scale)  # a benchmark's noise
    rows = []
    try:
        for encoding in a.encodings.split(","):
            n = max(1, updates // (10 if encoding == "json" and dim > 10_000 else 1) // 2)
            runs = {"bare": [], "real": []}
            cpu = {"bare": 0.0, "real": 0.0}  # CPU seconds of the app's processes
            before = httpx.get(f"{real_base}/v1/stats", headers=auth).json()
            for app in ("bare", "real", "real", "bare"):
                base = real_base if app == "real" else bare_base
                c0 = _cpu_seconds(real if app == "real" else bare)
                res = drive(base, tokens["clients"], bank, n, a.concurrency, encoding,
                            a.timeout, a.load_procs)
                cpu[app] += _cpu_seconds(real if app == "real" else bare) - c0
                runs[app].append(res)
                print(f"{dim} weights, {encoding}, {app}: {res.updates} updates in "
                      f"{res.seconds:.2f} s = {res.updates_per_second:.1f}/s "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
            after = httpx.get(f"{real_base}/v1/stats", headers=auth).json()
            load = round(os.getloadavg()[0], 1)
            bare_row = _row(dim, "bare FastAPI", encoding, a.concurrency, runs["bare"],
                            {"load_1min": load, "load_procs": a.load_procs,
                             "server_cpu_ms_per_update": _per_update(cpu["bare"],
                                                                     runs["bare"])})
            done = after["updates"] - before["updates"]
            rejected = after["rejected_spam"] - before["rejected_spam"]
            label = "floor" if a.floor else "sage-tfx dnd serve"
            real_row = _row(dim, label, encoding, a.concurrency, runs["real"], {
                "load_1min": load, "load_procs": a.load_procs, "durability": a.durability,
                "server_cpu_ms_per_update": _per_update(cpu["real"], runs["real"]),
                "real_over_bare": round(sum(r.updates for r in runs["real"])
                                        / max(sum(r.seconds for r in runs["real"]), 1e-9)
                                        / max(bare_row["updates_per_s"], 1e-9), 3),
                "honest_rejected": rejected,
                "honest_rejected_pct": round(100 * rejected / max(done, 1), 2),
                "out_of_bounds": after["out_of_bounds"] - before["out_of_bounds"],
                # per process: with --workers > 1 each /v1/stats may come from another one
                "rejected_by": " ".join(
                    f"{k}:{v - before.get('rejected_by', {}).get(k, 0)}"
                    for k, v in after.get("rejected_by", {}).items()
                    if v - before.get("rejected_by", {}).get(k, 0)) if a.workers == 1 else "",
                # draws and updates written per group-commit transaction (one fsync each)
                "writes_per_commit": round((after["draws"] - before["draws"] + done)
                                           / max(after["commits"] - before["commits"], 1), 2)})
            rows += [bare_row, real_row]
            print(real_row, flush=True)
        attacks = (crude_attacks(real_base, tokens["clients"][0], dim, a.attack_trials)
                   if a.attack_trials > 0 and not a.floor else [])
    finally:
        _stop(real)
        _stop(bare)
    return rows, attacks


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--updates", type=int, default=3000, help="per app and encoding, 387 weights")
    p.add_argument("--large-updates", type=int, default=1000, help="the same, 50,000 weights "
                   "(JSON: a tenth)")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--load-procs", type=int, default=4,
                   help="load-generator processes sharing the concurrent clients")
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60, help="seconds per measured round")
    p.add_argument("--encodings", default=",".join(ENCODINGS))
    p.add_argument("--attack-trials", type=int, default=30)
    p.add_argument("--sizes", default="386,49999", help="features (weights = features + 1)")
    p.add_argument("--durability", choices=("power", "process"), default="power",
                   help="the SQLite ledger's durability (power: every commit fsynced)")
    p.add_argument("--max-batch", type=int, default=0, help="with --in-process: group commit "
                   "capped at this many writes against one transaction per write "
                   "(server_in_process_batch_<durability>.csv)")
    p.add_argument("--server-args", default="",
                   help="more options of the real server, e.g. '--no-spam-check --no-norm-bound' "
                        "(what the store, authentication and HTTP alone make)")
    p.add_argument("--floor", action="store_true",
                   help="measure bare_app.py --floor (tokens, tickets and instances in SQLite, "
                        "nothing else) in place of the real server")
    p.add_argument("--tag", default="", help="suffix of the CSV names (server_load_<tag>.csv)")
    p.add_argument("--out", default="benchmarks/results/dnd")
    p.add_argument("--in-process", action="store_true",
                   help="only the service logic, background vs in-line check (in_process.csv)")
    a = p.parse_args()
    if a.in_process and a.max_batch:  # group commit against one transaction per write
        rows = [in_process(f, n, True, durability=a.durability, max_batch=mb)
                for f, n in ((386, a.updates), (49_999, a.large_updates))
                for mb in (a.max_batch, 1)]
        write_csv(os.path.join(a.out, f"server_in_process_batch_{a.durability}.csv"), rows)
        return
    if a.in_process:
        rows = [in_process(f, n, bg) for f, n in ((386, a.updates), (49_999, a.large_updates))
                for bg in (True, False)]
        write_csv(os.path.join(a.out, "server_in_process.csv"), rows)
        return
    rows, attacks = [], []
    for features in (int(f) for f in a.sizes.split(",")):
        r, at = one_size(features, a.updates if features < 10_000 else a.large_updates, a)
        rows += r
        attacks += at
    os.makedirs(a.out, exist_ok=True)
    suffix = ("" if a.durability == "power" else f"_{a.durability}") + (f"_{a.tag}" if a.tag
                                                                        else "")
    write_csv(os.path.join(a.out, f"server_load{suffix}.csv"), rows)
    if attacks:
        write_csv(os.path.join(a.out, f"server_attacks{suffix}.csv"), attacks)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
