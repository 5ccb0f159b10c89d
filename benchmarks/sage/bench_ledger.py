"""Ledger throughput and latency: grants/s and p50/p99 grant latency.

For SQLite (WAL, synchronous=FULL: an acknowledged grant is on disk) and PostgreSQL
(synchronous_commit=on, fsync=on), with 1 and 16 writer processes, on streams of 1k and 100k
blocks. Every request asks for a contiguous window of 30 blocks at a random position with a
small ε, so requests overlap and nothing is denied.

    .venv/bin/python benchmarks/sage/bench_ledger.py [--quick] [--csv out.csv]
        [--backends sqlite,postgres]

The measurement functions (:func:`run_case`, :func:`run_ledger_benchmark`) are reused by
``benchmarks/sage/perf_report.py``.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence

import numpy as np

from sage_tfx.ledger import pgserver
from sage_tfx.ledger.loadgen import WriterPlan, run_writer, run_writers, setup_stream

BACKENDS = ("sqlite", "postgres")
BLOCKS_PER_REQUEST = 30


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (smoke run)")
    ap.add_argument("--csv", help="write the table as CSV here")
    ap.add_argument("--backends", default="sqlite,postgres")
    args = ap.parse_args()
    n_req = 400 if args.quick else 4000
    rows = run_ledger_benchmark(backends=args.backends.split(","), requests=n_req,
                                progress=lambda line: print(line, flush=True))
    print()
    print(f"{'backend':<9}{'blocks':>8}{'writers':>8}{'grants/s':>10}{'p50 ms':>9}{'p99 ms':>9}")
    for r in rows:
        print(f"{r['backend']:<9}{r['blocks']:>8}{r['writers']:>8}{r['grants_per_s']:>10.0f}"
              f"{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
