"""Ledger throughput and latency: grants/s and p50/p99 grant latency.

For SQLite (WAL, synchronous=FULL: an acknowledged grant is on disk) and PostgreSQL
(synchronous_commit=on, fsync=on), with 1 and 16 writer processes, on streams of 1k and 100k
blocks. Every request asks for a contiguous window of 30 blocks at a random position with a
small ε, so requests overlap and nothing is denied.

    .venv/bin/python benchmarks/bench_ledger.py [--quick] [--csv out.csv]
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time

import numpy as np

from sage_tfx import pgserver
from sage_tfx.ledger_load import WriterPlan, run_writers, setup_stream


def run_case(url: str, stream: str, num_blocks: int, writers: int, total_requests: int) -> dict:
    per_writer = max(1, total_requests // writers)
    plans = [WriterPlan(url, stream, w, requests=per_writer, num_blocks=num_blocks,
                        blocks_per_request=30, epsilon=1e-6, seed=writers) for w in range(writers)]
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
    return {"grants": granted, "denied": sum(r.denied for r in results),
            "grants_per_s": granted / busy, "wall_s": wall,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (smoke run)")
    ap.add_argument("--csv", help="write the table as CSV here")
    ap.add_argument("--backends", default="sqlite,postgres")
    args = ap.parse_args()
    n_req = 400 if args.quick else 4000
    rows = []
    backends = args.backends.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        pg = pgserver.local_postgres() if "postgres" in backends else None
        pg_url = pg.__enter__() if pg else None
        try:
            for backend in backends:
                for num_blocks in (1_000, 100_000):
                    if backend == "sqlite":
                        url = f"sqlite:///{tmp}/bench-{num_blocks}.db"
                    else:
                        url = pgserver.create_database(pg_url, f"bench{num_blocks}")
                    t0 = time.perf_counter()
                    setup_stream(url, "s", num_blocks)
                    print(f"[{backend}] {num_blocks} blocks registered in "
                          f"{time.perf_counter() - t0:.1f}s", flush=True)
                    for writers in (1, 16):
                        r = run_case(url, "s", num_blocks, writers, n_req)
                        row = {"backend": backend, "blocks": num_blocks, "writers": writers, **r}
                        rows.append(row)
                        print(f"[{backend}] blocks={num_blocks:>6} writers={writers:>2} "
                              f"grants/s={r['grants_per_s']:8.0f} p50={r['p50_ms']:6.2f}ms "
                              f"p99={r['p99_ms']:6.2f}ms ({r['grants']} grants)", flush=True)
        finally:
            if pg:
                pg.__exit__(None, None, None)
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
