"""Fig. 7 through the store: flat vs tree PyramidStore over many windows on MovieLens.

    .venv/bin/python benchmarks/pyramid/tree_store.py [--windows 256] [--seeds 0,1]
        [--offsets 0,100] [--mechanisms laplace,gaussian] [--schemes flat,tree]
        [--width 16384] [--out benchmarks/results/pyramid/tree_store.csv]

The protocol of ``many_windows.py``'s Fig. 7 (5 % hot window of MovieLens, the history before
it cut into W equal-count windows, ε = 1 per window, Laplace and Gaussian δ = 1e-6), but every
window goes through :class:`~sage_tfx.pyramid.PyramidStore` (open, observe — encrypted at rest —,
seal, retention W): flat (one noisy table per window) or ``aggregation="tree"`` with
``levels = log2 W`` (nodes released when complete, partial sums encrypted, the live range read
from the complete nodes of its dyadic cover). Windows are numbered from ``offset``: offset 0 is
the aligned best case (one node), another offset the unaligned range a retention horizon
usually is. Offline stores (no ledger, seeded noise); the mechanisms are the ones that run.

Per run it prints and writes: nodes read, the summed ``user`` table's predicted per-cell noise
std (the store's variance) and the empirical one (noisy − exact cells), the relative L2 error
of the summed ``user`` cells, the log loss of a count LR and GBT normalised by the raw-LR
baseline, and the time the W seals took.
"""
import argparse
import math
import os
import tempfile
import time

import numpy as np
import pandas as pd

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.pyramid import PyramidStore
from sage_tfx.pyramid.eval import experiments as E
from sage_tfx.pyramid.eval import movielens as M
from sage_tfx.pyramid.eval.flights import time_split
from sage_tfx.pyramid.featurize import CountSpec
from sage_tfx.pyramid.tree import exact_tables
from sage_tfx.pyramid.treestore import cover_nodes

OUT = os.path.join(os.path.dirname(__file__), "..", "results", "pyramid", "tree_store.csv")


def spec_for(mechanism, scheme, W, width=2 ** 14):
    tree = dict(aggregation="tree", levels=max(0, math.ceil(math.log2(W)))) \
        if scheme == "tree" else {}
    return CountSpec(groups=tuple(M.FEATURES) + tuple(M.PAIRS), label="y", width=width,
                     epsilon=1.0, mechanism=mechanism,
                     delta=1e-6 if mechanism == "gaussian" else 0.0, **tree)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", type=int, default=256)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--offsets", default="0,100")
    ap.add_argument("--mechanisms", default="laplace,gaussian")
    ap.add_argument("--schemes", default="flat,tree")
    ap.add_argument("--width", type=int, default=2 ** 14)
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args()
    t0 = time.time()
    log = lambda *r: print(*r, f"[{time.time() - t0:.0f}s]", flush=True)   # noqa: E731
    train, test = time_split(M.load_movielens())
    hot = E.hot_window(train, 0.05)
    base = E.raw_lr_loss(train, test, M.FEATURES)
    history = train[(train["month"] > 1) & (train["month"] < int(hot["month"].iloc[0]))]
    history = history.reset_index(drop=True)
    W = a.windows
    part = (np.arange(len(history)) * W) // len(history)
    cols = list(M.FEATURES) + ["y"]
    exact = exact_tables(history[cols], spec_for("laplace", "flat", W, a.width))["user"]
    exact = exact.astype(float)
    log(f"baseline {base:.4f}; {len(history)} history rows in {W} windows; hot {len(hot)}")
    rows = []
    for offset in [int(x) for x in a.offsets.split(",")]:
        for mech in a.mechanisms.split(","):
            for scheme in a.schemes.split(","):
                spec = spec_for(mech, scheme, W, a.width)
                for seed in [int(s) for s in a.seeds.split(",")]:
                    with tempfile.TemporaryDirectory() as d:
                        store = PyramidStore(spec, d, retention=W, noise=SeededNoise(seed))
                        t1 = time.time()
                        for w in range(W):
                            store.open_window(offset + w)
                            store.observe(history.loc[part == w, cols])
                            store.seal()
                        seal_s = time.time() - t1
                        feat = store.featurization()
                        nodes = len(cover_nodes(store, store._read())) if scheme == "tree" \
                            else W
                    err = feat.cells["user"] - exact
                    losses = E.count_losses(feat, hot, test, ("lr", "gbt"))
                    row = dict(windows=W, width=a.width, offset=offset, mechanism=mech,
                               scheme=scheme, seed=seed, nodes=nodes,
                               cell_std=math.sqrt(feat.noise_var["user"]),
                               empirical_std=float(err.std()),
                               rel_l2=float(np.linalg.norm(err) / np.linalg.norm(exact)),
                               loss_lr=losses["lr"] / base, loss_gbt=losses["gbt"] / base,
                               seal_seconds=seal_s)
                    rows.append(row)
                    log({k: (round(v, 4) if isinstance(v, float) else v)
                         for k, v in row.items()})
                    pd.DataFrame(rows).to_csv(a.out, index=False)
    df = pd.DataFrame(rows)
    print(df.groupby(["offset", "mechanism", "scheme"])[
        ["nodes", "cell_std", "empirical_std", "rel_l2", "loss_lr", "loss_gbt", "seal_seconds"]]
        .mean().round(4).to_markdown())
    log("done")


if __name__ == "__main__":
    main()
