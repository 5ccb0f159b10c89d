"""Pyramid Figs. 4-6 on the Chicago taxi sample (label tips > 20 % of fare), several seeds.

    .venv/bin/python benchmarks/pyramid/taxi.py [--seeds 3]

Writes benchmarks/results/pyramid/taxi.csv and taxi.png and prints mean ± std tables. Protocol:
sage_tfx/pyramid/eval/experiments.py with 12 equal-count time windows standing in for months.
"""
import argparse
import os
import time

import pandas as pd

from sage_tfx.pyramid.eval import experiments as E
from sage_tfx.pyramid.eval import taxi as T
from sage_tfx.pyramid.eval.flights import time_split

OUT = os.path.join(os.path.dirname(__file__), "..", "results", "pyramid")
CONFIGS = [(E.NO_NOISE_EPSILON, "none", "count_median"), (1.0, "none", "count_median"),
           (1.0, "dp", "count_median"), (1.0, "none", "count_min"),
           (0.33, "none", "count_median"), (0.33, "dp", "count_median")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    t0 = time.time()
    train, test = time_split(T.load_taxi())
    df = E.run_workload(train, test, T.FEATURES, T.PAIRS, fractions=(0.02, 0.05, 0.2),
                        configs=CONFIGS, seeds=list(range(a.seeds)), width=2 ** 12,
                        log=lambda r: print(r, f"{time.time() - t0:.0f}s", flush=True))
    os.makedirs(OUT, exist_ok=True)
    df.to_csv(os.path.join(OUT, "taxi.csv"), index=False)
    t = E.mean_std_table(df, ["model", "epsilon", "weights", "sketch"], ["fraction"])
    print(t.to_markdown())
    plot(df, os.path.join(OUT, "taxi.png"))
    print(f"done in {time.time() - t0:.0f}s")


def plot(df: pd.DataFrame, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for i, model in enumerate(("count lr", "count gbt")):
        for (eps, w, k), g in df[df.model == model].groupby(["epsilon", "weights", "sketch"]):
            s = g.groupby("fraction")["normalized"].agg(["mean", "std"]).fillna(0)
            label = ("no noise" if eps > 1e6 else f"ε={eps:g}, {w}, {k.replace('count_', '')}")
            ax[i].errorbar(s.index * 100, (s["mean"] - 1) * 100, yerr=s["std"] * 100,
                           label=label, capsize=3, marker="o")
        raw = df[df.model == "raw lr"].set_index("fraction")["normalized"]
        ax[i].plot(raw.index * 100, (raw - 1) * 100, "k--", label="raw lr, same hot window")
        ax[i].set(xscale="log", xlabel="hot window (% of training data)", title=f"taxi: {model}")
    ax[0].set_ylabel("log loss vs raw LR on all data (%)")
    ax[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
