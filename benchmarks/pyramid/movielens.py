"""Pyramid Figs. 4-6(a) on MovieLens (dslabs 100k, label rating >= 4), a smaller grid, several
seeds.

    .venv/bin/python benchmarks/pyramid/movielens.py [--seeds 3]

Writes benchmarks/results/pyramid/movielens.csv and prints mean ± std tables. Protocol:
sage_tfx/pyramid/eval/experiments.py with 12 equal-count time windows standing in for months.
"""
import argparse
import os
import time


from sage_tfx.pyramid.eval import experiments as E
from sage_tfx.pyramid.eval import movielens as M
from sage_tfx.pyramid.eval.flights import time_split

OUT = os.path.join(os.path.dirname(__file__), "..", "results", "pyramid")
CONFIGS = [(E.NO_NOISE_EPSILON, "none", "count_median"), (1.0, "none", "count_median"),
           (1.0, "exact", "count_median"), (1.0, "dp", "count_median"),
           (0.33, "none", "count_median"), (0.33, "dp", "count_median")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    t0 = time.time()
    train, test = time_split(M.load_movielens())
    df = E.run_workload(train, test, M.FEATURES, M.PAIRS, fractions=(0.01, 0.05, 0.2),
                        configs=CONFIGS, seeds=list(range(a.seeds)),
                        log=lambda r: print(r, f"{time.time() - t0:.0f}s", flush=True))
    df.to_csv(os.path.join(OUT, "movielens.csv"), index=False)
    print(E.mean_std_table(df, ["model", "epsilon", "weights"], ["fraction"]).to_markdown())
    print(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
