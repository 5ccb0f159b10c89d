"""Pyramid over many windows on MovieLens: Fig. 7 (tree vs flat), Fig. 6(a) (noise weighting vs
even split) and Fig. 6(c) (count-median vs count-min), Laplace and Gaussian tables.

    .venv/bin/python benchmarks/pyramid/many_windows.py [--seeds 3] [--windows 4,16,64,256]

Writes benchmarks/results/pyramid/many_windows_fig{6,7}.csv (--only 6 / 7 for one figure) and
prints the tables of REPORT.md.

Fig. 7 protocol: the 5 % hot window of MovieLens (dslabs 100k, label rating >= 4) trains a count
LR and a count GBT; the history before it (time windows 2-11 of the workload, window 1 set aside)
is cut into W equal-count windows, each with its own noise at ε = 1 (k = 1), and the count
tables are the sum over all W windows — flat (one noisy table per window, W noisy terms) or
through the dyadic tree (:mod:`sage_tfx.pyramid.tree`: each window in log2(W)+1 nodes, the range
from ≤ 2 log2 W complete nodes). The per-cell noise std of the summed tables is printed beside
the loss. Seeded numpy noise (offline experiment); the mechanisms are the ones that run.
"""
import argparse
import math
import os
import time

import numpy as np
import pandas as pd

from sage_tfx.dp.counts import COUNT_MEDIAN, COUNT_MIN
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.pyramid.eval import experiments as E
from sage_tfx.pyramid.eval import movielens as M
from sage_tfx.pyramid.eval.flights import time_split
from sage_tfx.pyramid.featurize import CountSpec
from sage_tfx.pyramid.tree import DyadicTree, exact_tables

OUT = os.path.join(os.path.dirname(__file__), "..", "results", "pyramid")
FRACTION = 0.05


def spec_for(eps, mechanism, kind=COUNT_MEDIAN, width=2 ** 14):
    return CountSpec(groups=tuple(M.FEATURES) + tuple(M.PAIRS), label="y", kind=kind,
                     width=width, epsilon=eps, mechanism=mechanism,
                     delta=1e-6 if mechanism == "gaussian" else 0.0)


def fig7(train, test, hot, base, windows, seeds, log):
    history = train[(train["month"] > 1) & (train["month"] < int(hot["month"].iloc[0]))]
    history = history.reset_index(drop=True)
    rows = []
    for W in windows:
        part = (np.arange(len(history)) * W) // len(history)
        exact = None
        for mech in ("laplace", "gaussian"):
            spec = spec_for(1.0, mech)
            if exact is None:
                exact = [exact_tables(history[part == w], spec) for w in range(W)]
            for scheme, horizon in (("flat", 1), ("tree", W)):
                for seed in seeds:
                    t0 = time.time()
                    tree = DyadicTree(spec, horizon, SeededNoise(seed))
                    for w in range(W):
                        tree.add_window(w, exact[w])
                    feat = tree.featurization(0, W - 1)
                    _, var, nodes = tree.range_tables(0, W - 1)
                    losses = E.count_losses(feat, hot, test, ("lr", "gbt"))
                    for model, loss in losses.items():
                        rows.append(dict(fig="7", windows=W, mechanism=mech, scheme=scheme,
                                         seed=seed, model=f"count {model}", loss=loss,
                                         normalized=loss / base, nodes=nodes,
                                         cell_std=math.sqrt(var[spec.group_name(("user",))])))
                        log(rows[-1], f"{time.time() - t0:.1f}s")
    return rows


def fig6(train, test, hot, base, seeds, log, epsilons=(0.33, 1.0)):
    months = E.history_months(train, hot)
    rows = []
    lap = (("none", COUNT_MEDIAN), ("exact", COUNT_MEDIAN), ("dp", COUNT_MEDIAN),
           ("none", COUNT_MIN), ("dp", COUNT_MIN))
    gau = (("none", COUNT_MEDIAN), ("dp", COUNT_MEDIAN), ("none", COUNT_MIN))
    configs = [(eps, w, kind, mech) for mech, cfg in (("laplace", lap), ("gaussian", gau))
               for eps in epsilons for w, kind in cfg]
    for eps, wmode, kind, mech in configs:
        for seed in seeds:
            spec = spec_for(eps, mech, kind)
            weights = E.weights_for(train, spec, wmode, eps, seed)
            feat = E.build_featurization(train, months, spec, weights, seed)
            for model, loss in E.count_losses(feat, hot, test, ("lr", "gbt")).items():
                rows.append(dict(fig="6", epsilon=eps, weights=wmode, sketch=kind,
                                 mechanism=mech, seed=seed, model=f"count {model}", loss=loss,
                                 normalized=loss / base))
                log(rows[-1])
    return rows


def analytic(windows=(1, 10, 100, 1000, 10 ** 4, 10 ** 5)):
    """Per-cell noise std of the summed tables of W windows (user table, ε = 1 per window):
    flat (W noisy windows) vs tree (nodes at log2(W)+1 per window), from the plans alone (no
    data). The tree's nodes: the mean and the largest dyadic cover of [s, s+W-1] over 256 start
    offsets s (a retention range ending at the newest window is rarely aligned)."""
    from sage_tfx.pyramid.plan import plan_window
    from sage_tfx.pyramid.tree import dyadic_cover, tree_levels
    rows = []
    for mech in ("laplace", "gaussian"):
        spec = spec_for(1.0, mech)
        flat = plan_window(spec).variance(0)
        for W in windows:
            L = tree_levels(W)
            node = plan_window(spec, repeat=L + 1).variance(0)
            ns = [len(dyadic_cover(s, s + W - 1, L)) for s in range(256)]
            rows.append(dict(mechanism=mech, windows=W, flat_std=math.sqrt(W * flat),
                             tree_std=math.sqrt(np.mean(ns) * node),
                             tree_std_worst=math.sqrt(max(ns) * node),
                             nodes=f"{np.mean(ns):.1f} / {max(ns)}"))
    return pd.DataFrame(rows)


def pm(g):
    m, s = (g.mean() - 1) * 100, g.std(ddof=1) * 100
    return f"{m:+.1f} ± {s:.1f} %" if len(g) > 1 else f"{m:+.1f} %"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--windows", default="4,16,64,256")
    ap.add_argument("--only", choices=("6", "7", "analytic"), default=None)
    ap.add_argument("--eps", default="0.33,1", help="Fig. 6's ε values")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="seeds first..first+seeds-1; CSVs of first > 0 get a _s<first> suffix")
    a = ap.parse_args()
    if a.only == "analytic":
        print(analytic().pivot(index="windows", columns="mechanism").round(1).to_markdown())
        return
    t0 = time.time()
    log = lambda *r: print(*r, f"[{time.time() - t0:.0f}s]", flush=True)   # noqa: E731
    train, test = time_split(M.load_movielens())
    hot = E.hot_window(train, FRACTION)
    base = E.raw_lr_loss(train, test, M.FEATURES)
    seeds = list(range(a.first_seed, a.first_seed + a.seeds))
    sfx = f"_s{a.first_seed}" if a.first_seed else ""
    log(f"baseline raw LR on all {len(train)} rows: {base:.4f}; hot window {len(hot)} rows")
    if a.only != "6":
        rows = fig7(train, test, hot, base, [int(w) for w in a.windows.split(",")], seeds, log)
        f7 = pd.DataFrame(rows)
        f7.insert(0, "baseline", base)
        f7.to_csv(os.path.join(OUT, f"many_windows_fig7{sfx}.csv"), index=False)
        print(f7.groupby(["model", "mechanism", "scheme", "windows"])["normalized"].apply(pm)
              .unstack("windows").to_markdown())
        print(f7.groupby(["mechanism", "scheme", "windows"])[["cell_std", "nodes"]].first()
              .unstack("windows").to_markdown())
    if a.only != "7":
        f6 = pd.DataFrame(fig6(train, test, hot, base, seeds, log,
                               [float(e) for e in a.eps.split(",")]))
        f6.insert(0, "baseline", base)
        f6.to_csv(os.path.join(OUT, f"many_windows_fig6{sfx}.csv"), index=False)
        print(f6.groupby(["model", "mechanism", "sketch", "weights", "epsilon"])["normalized"]
              .apply(pm).unstack("epsilon").to_markdown())
    print(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
