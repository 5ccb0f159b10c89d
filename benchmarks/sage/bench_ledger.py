"""Ledger throughput and latency: grants/s and p50/p99 grant latency.

For SQLite (WAL; an acknowledged grant's WAL is fsynced, ``durability=power``) and PostgreSQL
(synchronous_commit=on, fsync=on). Every request asks for 30 blocks with a small ε, so nothing
runs out. The default run registers 100,000 blocks in bulk (blocks/s), then measures steady load
of 1 and 16 writer processes for 8 s each (grants/s over the wall clock, p50/p99 latency) on
three workloads: ``random`` 30-block explicit ranges, ``disjoint`` ranges (one slice per
writer) and ``window`` (``Window(last=30)``: all writers on the same newest blocks). Each line
shows the load average: the machine may be shared.

    .venv/bin/python benchmarks/sage/bench_ledger.py [--backends sqlite,postgres]
        [--blocks 100000] [--writers 1,16] [--workloads random,disjoint,window] [--duration 8]
    .venv/bin/python benchmarks/sage/bench_ledger.py --million    # 1M blocks: latency, memory
    .venv/bin/python benchmarks/sage/bench_ledger.py --cpu 2000   # one in-process writer
    .venv/bin/python benchmarks/sage/bench_ledger.py --cpu 1500 --profile 15  # ... under cProfile
    .venv/bin/python benchmarks/sage/bench_ledger.py --requests-mode [--quick]  # perf_report's

The measurement functions (:func:`run_case`, :func:`run_ledger_benchmark`) are reused by
``benchmarks/sage/perf_report.py``.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import os
import resource
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

import numpy as np

from sage_tfx.ledger import BlockSpec, open_ledger, pgserver
from sage_tfx.ledger.loadgen import WriterPlan, run_writer, run_writers, setup_stream

BACKENDS = ("sqlite", "postgres")
BLOCKS_PER_REQUEST = 30
SQLITE_OPTIONS = ""  # e.g. "?durability=process" (set by --sqlite-durability)


def run_case(url: str, stream: str, num_blocks: int, writers: int, total_requests: int) -> dict:
    """Runs ``writers`` processes issuing ``total_requests`` requests in all; returns the numbers.

    Returns:
      A dict with ``grants``, ``denied``, ``grants_per_s`` (grants over the slowest writer's busy
      time: the sum of its request latencies, so process start-up is excluded),
      ``grants_per_s_wall`` (grants over the wall time of the whole case, start-up included),
      ``wall_s``, ``p50_ms`` and ``p99_ms`` (grant latency over all requests).

    Raises:
      ValueError: fewer requests than writers, or a stream too short for one request.
      RuntimeError: a writer process died.
    """
    if writers < 1 or total_requests < writers:
        raise ValueError(f"need ≥ 1 writer and ≥ 1 request per writer, got {writers} writers "
                         f"and {total_requests} requests")
    if num_blocks < BLOCKS_PER_REQUEST:
        raise ValueError(f"a stream needs ≥ {BLOCKS_PER_REQUEST} blocks, got {num_blocks}")
    per_writer = max(1, total_requests // writers)
    plans = [WriterPlan(url, stream, w, requests=per_writer, num_blocks=num_blocks,
                        blocks_per_request=BLOCKS_PER_REQUEST, epsilon=1e-6, seed=writers)
             for w in range(writers)]
    t0 = time.perf_counter()
    results = run_writers(plans, timeout=1800)
    wall = time.perf_counter() - t0
    if any(r is None for r in results):
        raise RuntimeError("a writer died")
    lat = np.array([x for r in results for x in r.latencies]) * 1000
    granted = sum(len(r.granted) for r in results)
    # Throughput over the busy period: process start-up is excluded by timing the writers' own
    # request loops (their latencies sum) per writer and taking the slowest writer.
    busy = max(sum(r.latencies) for r in results)
    return {"requests": per_writer * writers, "grants": granted,
            "denied": sum(r.denied for r in results),
            "grants_per_s": granted / busy, "grants_per_s_wall": granted / wall, "wall_s": wall,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99))}


def cpu_per_grant(url: str, stream: str, num_blocks: int, requests: int) -> dict:
    """CPU and wall milliseconds per grant of one writer run in this process (no fork).

    With SQLite the ledger runs inside the client, so process CPU is all the CPU a grant costs
    (waiting for the WAL fsync is not CPU); with PostgreSQL it is the client's share only.
    """
    plan = WriterPlan(url, stream, writer=0, requests=requests, num_blocks=num_blocks,
                      blocks_per_request=BLOCKS_PER_REQUEST, epsilon=1e-6, seed=12_345)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = run_writer(plan)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    n = len(result.latencies)
    return {"cpu_ms_per_grant": 1000 * cpu / n, "wall_ms_per_grant": 1000 * wall / n}


def format_row(row: dict) -> str:
    """One progress line for a measured case."""
    return (f"[{row['backend']}] blocks={row['blocks']:>6} writers={row['writers']:>2} "
            f"grants/s={row['grants_per_s']:8.0f} p50={row['p50_ms']:6.2f}ms "
            f"p99={row['p99_ms']:6.2f}ms ({row['grants']} grants)")


def run_ledger_benchmark(*, backends: Sequence[str] = BACKENDS,
                         blocks: Sequence[int] = (1_000, 100_000),
                         writers: Sequence[int] = (1, 16), requests: int = 4000,
                         cpu_requests: int = 500,
                         progress: Optional[Callable[[str], None]] = print) -> list[dict]:
    """Measures every (backend, stream size, writer count) on fresh ledgers.

    SQLite ledgers live in a temporary directory; PostgreSQL ones on a throw-away local server
    (:func:`sage_tfx.ledger.pgserver.local_postgres`), one database per stream size.

    Args:
      backends: Any of ``"sqlite"``, ``"postgres"``.
      blocks: Stream sizes; one stream of each size per backend, shared by the writer counts.
      writers: Writer process counts.
      requests: Requests per case, split evenly between the writers.
      cpu_requests: Requests of the extra in-process writer per stream that measures
        :func:`cpu_per_grant` (at most ``requests``; 0 skips it).
      progress: Called with one line per step; None for silence.

    Returns:
      One dict per case: ``backend``, ``blocks``, ``writers``, :func:`run_case`'s numbers and,
      unless skipped, the stream's :func:`cpu_per_grant` numbers.

    Raises:
      ValueError: an unknown backend.
      RuntimeError: PostgreSQL is not installed or did not start; a writer died.
    """
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        raise ValueError(f"unknown backends {unknown}; choose from {list(BACKENDS)}")
    say = progress or (lambda _: None)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        pg_url = (stack.enter_context(pgserver.local_postgres()) if "postgres" in backends
                  else None)
        for backend in backends:
            for num_blocks in blocks:
                if backend == "sqlite":
                    url = f"sqlite:///{tmp}/bench-{num_blocks}.db"
                else:
                    url = pgserver.create_database(pg_url, f"bench{num_blocks}")
                t0 = time.perf_counter()
                setup_stream(url, "s", num_blocks)
                say(f"[{backend}] {num_blocks} blocks registered in "
                    f"{time.perf_counter() - t0:.1f}s")
                stream_rows = []
                for n_writers in writers:
                    r = run_case(url, "s", num_blocks, n_writers, requests)
                    row = {"backend": backend, "blocks": num_blocks, "writers": n_writers, **r}
                    stream_rows.append(row)
                    say(format_row(row))
                if cpu_requests > 0:
                    cpu = cpu_per_grant(url, "s", num_blocks, min(cpu_requests, requests))
                    say(f"[{backend}] blocks={num_blocks:>6} one writer in this process: "
                        f"{cpu['cpu_ms_per_grant']:.2f} ms CPU, {cpu['wall_ms_per_grant']:.2f} "
                        "ms wall per grant")
                    stream_rows = [{**row, **cpu} for row in stream_rows]
                rows += stream_rows
    return rows


def load() -> str:
    """The machine's 1-minute load average (other jobs share the CPUs)."""
    return f"load {os.getloadavg()[0]:.2f}"


def bulk_add(url: str, stream: str, num_blocks: int, chunk: int = 100_000) -> float:
    """Registers ``num_blocks`` blocks in ``chunk``-block add_blocks calls; returns blocks/s."""
    led = open_ledger(url)
    try:
        led.create_stream(stream, epsilon_g=1.0, delta_g=1e-6)
        t0 = time.perf_counter()
        for start in range(0, num_blocks, chunk):
            led.add_blocks(stream, [BlockSpec(f"b{i:07d}", f"/blocks/{stream}/b{i:07d}")
                                    for i in range(start, min(num_blocks, start + chunk))])
        return num_blocks / (time.perf_counter() - t0)
    finally:
        led.close()


def steady_case(url: str, stream: str, num_blocks: int, writers: int, workload: str,
                duration: float, seed: int = 0) -> dict:
    """``writers`` processes issue requests for ``duration`` s of steady load, started together.

    Returns grants/s over the wall-clock of the steady load (``grants / duration``), p50/p99
    latency, denials and the largest writer's peak memory.
    """
    start_at = time.time() + 1.0 + 0.05 * writers  # after every process has forked
    plans = [WriterPlan(url, stream, w, requests=10 ** 9, num_blocks=num_blocks,
                        blocks_per_request=BLOCKS_PER_REQUEST, epsilon=1e-6, seed=seed,
                        workload=workload, writers=writers, start_at=start_at, duration=duration)
             for w in range(writers)]
    results = run_writers(plans, timeout=duration + 600)
    if any(r is None for r in results):
        raise RuntimeError("a writer died")
    lat = np.array([x for r in results for x in r.latencies]) * 1000
    granted = sum(len(r.granted) for r in results)
    return {"workload": workload, "writers": writers, "grants": granted,
            "denied": sum(r.denied for r in results), "grants_per_s": granted / duration,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "writer_maxrss_mb": max(r.maxrss_kb for r in results) / 1024}


def window_plan(url: str) -> str:
    """The query plan of a window read (shows the index, not a scan of the stream)."""
    led = open_ledger(url)
    try:
        sql = ("SELECT id FROM budgets WHERE stream = ? AND context = ? AND status = ? "
               "ORDER BY seq DESC LIMIT ?")
        if led.backend == "sqlite":
            rows = led._q("EXPLAIN QUERY PLAN " + sql, ("s", "default", "active", 38)).fetchall()
            return "; ".join(r[-1] for r in rows)
        rows = led._q("EXPLAIN " + sql, ("s", "default", "active", 38)).fetchall()
        return "; ".join(r[0].strip() for r in rows)
    finally:
        led.close()


def run_steady(backends: Sequence[str], num_blocks: int, writers: Sequence[int],
               workloads: Sequence[str], duration: float, say=print) -> list[dict]:
    """Bulk registration rate and steady-load throughput per (backend, workload, writers)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        pg_url = (stack.enter_context(pgserver.local_postgres()) if "postgres" in backends
                  else None)
        for backend in backends:
            url = (f"sqlite:///{tmp}/steady-{num_blocks}.db{SQLITE_OPTIONS}" if backend == "sqlite"
                   else pgserver.create_database(pg_url, f"steady{num_blocks}"))
            rate = bulk_add(url, "s", num_blocks)
            say(f"[{backend}] {num_blocks} blocks registered: {rate:,.0f} blocks/s ({load()})")
            say(f"[{backend}] window read plan: {window_plan(url)}")
            for case, (workload, n) in enumerate((w, n) for w in workloads for n in writers):
                if workload == "disjoint" and n == 1:
                    continue  # the same as random with one writer
                if True:  # each case its own run ids (seed)
                    r = {"backend": backend, "blocks": num_blocks, **steady_case(
                        url, "s", num_blocks, n, workload, duration, seed=case), "load": load()}
                    rows.append(r)
                    say(f"[{backend}] {workload:<8} writers={n:>2} "
                        f"grants/s={r['grants_per_s']:7.0f}"
                        f" p50={r['p50_ms']:6.2f}ms p99={r['p99_ms']:7.2f}ms denied={r['denied']}"
                        f" writer RSS={r['writer_maxrss_mb']:.0f} MB ({r['load']})")
    return rows


def run_million(backends: Sequence[str], num_blocks: int, duration: float, say=print) -> None:
    """A user-level stream of ``num_blocks`` blocks: registration, memory, grant latency."""
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        pg_url = (stack.enter_context(pgserver.local_postgres()) if "postgres" in backends
                  else None)
        for backend in backends:
            url = (f"sqlite:///{tmp}/million.db{SQLITE_OPTIONS}" if backend == "sqlite"
                   else pgserver.create_database(pg_url, "million"))
            rate = bulk_add(url, "s", num_blocks)
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            say(f"[{backend}] {num_blocks:,} blocks registered: {rate:,.0f} blocks/s; "
                f"registering process peak RSS {rss:.0f} MB ({load()})")
            say(f"[{backend}] window read plan: {window_plan(url)}")
            for case, workload in enumerate(("window", "random")):
                r = steady_case(url, "s", num_blocks, 1, workload, duration, seed=case)
                say(f"[{backend}] {num_blocks:,} blocks, {workload:<6} 1 writer: "
                    f"{r['grants_per_s']:.0f} grants/s, p50={r['p50_ms']:.2f}ms "
                    f"p99={r['p99_ms']:.2f}ms, writer peak RSS {r['writer_maxrss_mb']:.0f} MB "
                    f"({load()})")


def _proc_cpu(pid) -> float:
    """CPU seconds (user + system) a process used so far; 0 without a pid."""
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_cpu(backends: Sequence[str], num_blocks: int, requests: int, say=print,
            profile: int = 0) -> None:
    """One writer in this process, public API only (so it also runs against older versions):
    CPU and wall milliseconds per grant, explicit 30-block ranges and ``Window(last=30)``.
    With ``profile`` > 0, the requests run under cProfile and the top ``profile`` functions by
    own time are printed per case (the profiler inflates the CPU numbers)."""
    import cProfile
    import io
    import pstats
    import random

    from sage_tfx.ledger import Window
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        pg_url = (stack.enter_context(pgserver.local_postgres()) if "postgres" in backends
                  else None)
        for backend in backends:
            url = (f"sqlite:///{tmp}/cpu.db{SQLITE_OPTIONS}" if backend == "sqlite"
                   else pgserver.create_database(pg_url, "cpu"))
            t0 = time.perf_counter()
            setup_stream(url, "s", num_blocks)
            say(f"[{backend}] {num_blocks:,} blocks registered in {time.perf_counter() - t0:.1f}s "
                f"(10k-block add_blocks calls; {load()})")
            led = open_ledger(url)
            rng = random.Random(1)
            server = (led._q("SELECT pg_backend_pid()").fetchone()[0] if led.backend != "sqlite"
                      else None)
            for kind in ("blocks", "window"):
                lat = []
                srv0 = _proc_cpu(server)
                prof = cProfile.Profile() if profile else None
                if prof:
                    prof.enable()
                cpu0, wall0 = time.process_time(), time.perf_counter()
                for i in range(requests):
                    if kind == "window":
                        where: dict = {"window": Window(last=BLOCKS_PER_REQUEST)}
                    else:
                        first = rng.randrange(0, num_blocks - BLOCKS_PER_REQUEST)
                        where = {"blocks": [f"b{k:07d}" for k in
                                            range(first, first + BLOCKS_PER_REQUEST)]}
                    t = time.perf_counter()
                    assert led.request("s", run_id=f"cpu-{kind}-{i}", epsilon=1e-6, **where).granted
                    lat.append(time.perf_counter() - t)
                cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
                if prof:
                    prof.disable()
                    out = io.StringIO()
                    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(profile)
                    say(f"[{backend}] {kind} profile (own time over {requests} grants):\n"
                        + out.getvalue().split("\n\n", 1)[-1].rstrip())
                srv = f", server session {1000 * (_proc_cpu(server) - srv0) / requests:.3f} ms " \
                      "CPU/grant" if server else ""
                ms = np.array(lat) * 1000
                say(f"[{backend}] {kind:<6} 1 writer in-process: {1000 * cpu / requests:.3f} ms CPU"
                    f"/grant{srv}, {1000 * wall / requests:.3f} ms wall/grant "
                    f"({requests / wall:.0f}/s),"
                    f" p50={np.percentile(ms, 50):.2f}ms p99={np.percentile(ms, 99):.2f}ms "
                    f"({load()})")
            led.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--writers", default="1,16")
    ap.add_argument("--workloads", default="random,disjoint,window")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds of steady load per case")
    ap.add_argument("--million", action="store_true",
                    help="instead: a 1,000,000-block stream (latency, memory, index use)")
    ap.add_argument("--cpu", type=int, metavar="N",
                    help="instead: N requests of one in-process writer, CPU and wall per grant")
    ap.add_argument("--profile", type=int, default=0, metavar="K",
                    help="with --cpu: run the requests under cProfile, print the top K functions")
    ap.add_argument("--requests-mode", action="store_true",
                    help="instead: the fixed-request cases of perf_report (--quick: fewer)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sqlite-durability", choices=("power", "process"),
                    help="SQLite ledgers' durability option (default: power)")
    ap.add_argument("--csv", help="write the table as CSV here")
    args = ap.parse_args()
    if args.sqlite_durability:
        global SQLITE_OPTIONS
        SQLITE_OPTIONS = f"?durability={args.sqlite_durability}"
    backends = args.backends.split(",")
    if args.cpu:
        run_cpu(backends, args.blocks, args.cpu, profile=args.profile)
        return 0
    if args.million:
        run_million(backends, 1_000_000 if not args.quick else 100_000, args.duration)
        return 0
    if args.requests_mode:
        rows = run_ledger_benchmark(backends=backends, requests=400 if args.quick else 4000,
                                    progress=lambda line: print(line, flush=True))
    else:
        rows = run_steady(backends, args.blocks, [int(w) for w in args.writers.split(",")],
                          args.workloads.split(","), args.duration,
                          say=lambda line: print(line, flush=True))
    if args.csv and rows:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
