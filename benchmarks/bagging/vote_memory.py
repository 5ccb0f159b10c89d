"""Peak memory of DP bagging's teachers, votes and per-unit accountant at the paper's scale.

24,000 private × 8,000 public points, n = 250, k = 100 (n·k = 25,000 teachers), 29 features
(synthetic Gaussian data of the Heart Failure shape: the benchmark is about memory). Prints the
peak (tracemalloc) of each phase, the process's max RSS, and what one dense float64 [N, k, n]
array would take. Writes ``--out``/vote_memory.csv.

    .venv/bin/python benchmarks/bagging/vote_memory.py [--private 24000 --public 8000 --n 250 --k
    100]
"""
from __future__ import annotations

import argparse
import os
import sys

from sage_tfx.bagging.eval.memory import vote_memory_benchmark
from sage_tfx.reporting import write_csv


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--private", type=int, default=24_000)
    ap.add_argument("--public", type=int, default=8_000)
    ap.add_argument("--n", type=int, default=250)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--paper-queries", type=int, default=None,
                    help="public points the per-unit accountant walks over (default: all)")
    ap.add_argument("--out", default="benchmarks/results/bagging")
    args = ap.parse_args(argv)
    res = vote_memory_benchmark(private=args.private, public=args.public, n=args.n, k=args.k,
                                paper_queries=args.paper_queries)
    os.makedirs(args.out, exist_ok=True)
    write_csv(os.path.join(args.out, "vote_memory.csv"), [res])


if __name__ == "__main__":
    sys.exit(main())
