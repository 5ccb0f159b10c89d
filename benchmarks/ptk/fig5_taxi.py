"""PTK paper Fig. 5(c) on the Chicago taxi CSV: DP historical statistics, Analyze-Gauss and DP
Lloyd PTKs trained on the earliest 60 % of trips, a trip-duration model on growing fractions of the
rest; no-PTK / DP PTK (ε ∈ {0.1, 1}) / non-private PTK, several seeds.

    .venv/bin/python benchmarks/ptk/fig5_taxi.py [--seeds 3] [--out benchmarks/results/ptk]

Writes ``fig5_taxi.csv`` (one row per variant, ε, fraction, seed), ``fig5_taxi_gains.csv``
(relative gain over no-PTK, means over seeds) and ``fig5_taxi.png``.
"""
from __future__ import annotations

import argparse
import time

from sage_tfx.ptk.eval import fig5_taxi


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/ptk")
    ap.add_argument("--fractions", default="0.02,0.05,0.1,0.25,0.5,1.0")
    ap.add_argument("--kernels", default="histstats,covariance,lloyd,lloyd_no_data")
    ap.add_argument("--max-iter", type=int, default=100, help="boosting rounds of the model")
    args = ap.parse_args(argv)
    t0 = time.time()
    rows = fig5_taxi.run(fractions=[float(f) for f in args.fractions.split(",")],
                         seeds=tuple(range(args.seeds)), kernels=args.kernels.split(","),
                         model=lambda s: fig5_taxi.model_factory(s, args.max_iter))
    fig5_taxi.write_outputs(rows, args.out, "fig5_taxi", "Chicago taxi (duration, MSE of log)")
    print(f"done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
