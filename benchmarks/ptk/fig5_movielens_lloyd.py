"""PTK paper Fig. 5(e)/(f)-style transfer on MovieLens (dslabs/movielens): a DP Lloyd PTK of user
rating profiles (user-level DP) and a DP per-user historical statistic trained on action-like
genres, consumed by a ridge rating model on the other genres; no-PTK / DP PTK (ε ∈ {0.1, 1}) /
non-private PTK, several seeds.

    .venv/bin/python benchmarks/ptk/fig5_movielens_lloyd.py [--seeds 5]
        [--out benchmarks/results/ptk]

Writes ``fig5_movielens.csv``, ``fig5_movielens_gains.csv`` and ``fig5_movielens.png``.
"""
from __future__ import annotations

import argparse
import time

from sage_tfx.ptk.eval import fig5_movielens, fig5_taxi


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/ptk")
    ap.add_argument("--fractions", default="0.02,0.05,0.1,0.25,0.5,1.0")
    ap.add_argument("--kernels", default="lloyd,lloyd_no_data,histstats")
    args = ap.parse_args(argv)
    t0 = time.time()
    rows = fig5_movielens.run(fractions=[float(f) for f in args.fractions.split(",")],
                              seeds=tuple(range(args.seeds)), kernels=args.kernels.split(","))
    fig5_taxi.write_outputs(rows, args.out, "fig5_movielens", "MovieLens (rating, MSE)")
    print(f"done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
