"""Pyramid Figs. 4-6(a) on MovieLens (dslabs 100k, label rating >= 4), a smaller grid.

    .venv/bin/python benchmarks/pyramid/movielens.py

Writes benchmarks/results/pyramid/movielens.csv. Protocol: sage_tfx/pyramid/eval/experiments.py
with 12 equal-count time windows standing in for months.
"""
import os
import time

import numpy as np
import pandas as pd
from sklearn.metrics import log_loss

from sage_tfx.pyramid.eval import experiments as E
from sage_tfx.pyramid.eval import movielens as M
from sage_tfx.pyramid.eval.flights import time_split

OUT = os.path.join(os.path.dirname(__file__), "..", "results", "pyramid")


def main():
    t0 = time.time()
    train, test = time_split(M.load_movielens())
    base = E.raw_lr_loss(train, test, M.FEATURES)
    const = log_loss(test.y, np.full(len(test), train.y.mean()))
    print(f"baseline raw LR on all {len(train)} rows: {base:.4f}; constant: {const:.4f}")
    rows = [dict(fig="ref", model="constant", fraction=1.0, epsilon=float("inf"), weights="-",
                 loss=const, normalized=const / base)]
    for fraction in (0.01, 0.05, 0.2):
        hot = E.hot_window(train, fraction)
        months = E.history_months(train, hot)
        loss = E.raw_lr_loss(hot, test, M.FEATURES)
        rows.append(dict(fig="4", model="raw lr", fraction=fraction, epsilon=float("inf"),
                         weights="-", loss=loss, normalized=loss / base))
        for eps, weights in ((E.NO_NOISE_EPSILON, "none"), (1.0, "none"), (1.0, "exact"),
                             (1.0, "dp"), (0.33, "none"), (0.33, "dp")):
            spec = E.make_spec(M.FEATURES, M.PAIRS, epsilon=eps)
            feat = E.build_featurization(train, months, spec,
                                         E.weights_for(train, spec, weights, eps, 0), 0)
            for model, loss in E.count_losses(feat, hot, test, ("lr", "gbt")).items():
                rows.append(dict(fig="4" if eps > 1e6 else "5/6a", model=f"count {model}",
                                 fraction=fraction, epsilon=eps, weights=weights, loss=loss,
                                 normalized=loss / base))
                print(rows[-1], f"{time.time() - t0:.0f}s", flush=True)
    pd.DataFrame(rows).to_csv(os.path.join(OUT, "movielens.csv"), index=False)


if __name__ == "__main__":
    main()
