"""Fig. 5(c) on the Chicago taxi CSV shipped in the tfx wheel: DP historical statistics,
Analyze-Gauss and DP Lloyd PTKs for trip-duration prediction (the paper's §6.4 Taxi scenario:
"9 historical aggregate features related to the average speed of trips, clusters of all pickup
locations and drop off locations, and PCA over the pick up and drop off location").

Protocol (rows from :func:`sage_tfx.ptk.eval.fig5.run_fig5`): trips sorted by start time; the
earliest ``source_share`` (default 60 %) are the source stream the PTKs are trained on (the
retained history), the rest is the target task, split 70 / 30 into train and test at random
(seeded). Label: log(1 + trip_seconds); metric: MSE of it (the squared RMSLE of the Kaggle task).
Downstream model: scikit-learn's HistGradientBoostingRegressor (the paper used XGBoost).
Base features: trip miles, start hour / weekday / month, pickup and dropoff coordinates, payment
type — the PTK variants get the PTK features appended.

PTKs (every bound and domain declared from public facts: Chicago's 77 community areas, the 24
hours, the city's coordinates):

* ``histstats`` — a bundle of three DP historical statistics of the trip speed (mph, clipped to
  [0, 60]) per pickup area, per dropoff area and per start hour; ε split evenly (basic
  composition over the same records, :class:`Bundle`);
* ``covariance`` — Analyze-Gauss PCA (k = 2) of the pickup and dropoff coordinates;
* ``lloyd`` — DP Lloyd, 6 clusters of (pickup, dropoff) coordinates, 5 iterations;
* ``lloyd_no_data`` — ablation: the same featurizer with the public initial centroids, untrained.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import numpy as np

from sage_tfx.ptk.abstraction import batches_of, concat
from sage_tfx.ptk.kernels import covariance, histstats, lloyd

AREAS = [str(i) for i in range(1, 78)]
HOURS = [str(h) for h in range(24)]
COORDS = ["pickup_latitude", "pickup_longitude", "dropoff_latitude", "dropoff_longitude"]
LAT, LON = (41.60, 42.10), (-87.95, -87.50)
SPEED = {"value": "speed", "lower": 0.0, "upper": 60.0}


class Bundle:
    """Several (kernel module, config) PTKs trained on the same records as one PTK for the
    harness: ``train_dp`` gives each part ε / len(parts) (basic composition: the bundle is
    ε-DP), ``featurize`` concatenates the parts' features, ``erm`` is each part's non-private
    twin (``erm``, or ``train_nonprivate`` for DP Lloyd, which has no exact ERM)."""

    def __init__(self, name: str, parts: Sequence[tuple]):
        self.__name__ = name
        self.parts = list(parts)

    def train_dp(self, batches, epsilon, prev_state, prev_config, *, config=None, noise=None):
        """Trains each part at an equal share of ``epsilon``."""
        cols = concat(batches)
        share = float(epsilon) / len(self.parts)
        return [m.train_dp(batches_of(cols), share, None, None, config=c, noise=noise)
                for m, c in self.parts]

    def erm(self, batches, *, config=None):
        """The non-private state of each part."""
        cols = concat(batches)
        return [m.erm(batches_of(cols), config=c) if hasattr(m, "erm")
                else m.train_nonprivate(batches_of(cols), config=c) for m, c in self.parts]

    def featurize(self, batch, state, config=None) -> dict:
        """The features of every part, merged."""
        out: dict = {}
        for (m, c), s in zip(self.parts, state):
            out.update(m.featurize(batch, s, c))
        return out


class NoDataCentroids(Bundle):
    """Ablation of a DP Lloyd PTK: its featurizer with the public seeded initial centroids, never
    trained (reads no data, spends nothing) — how much of a Lloyd gain is the shape of the
    distance features rather than knowledge from the source."""

    def __init__(self, name: str, config: dict):
        super().__init__(name, [(lloyd, config)])

    def _start(self) -> list:
        c = lloyd.check_config(self.parts[0][1])
        cent = c["lower"] + np.random.default_rng(c["seed"]).uniform(
            size=(c["k"], len(c["columns"]))) * (c["upper"] - c["lower"])
        return [{"columns": c["columns"], "centroids": cent.tolist(), "counts": [0.0] * c["k"]}]

    def train_dp(self, batches, epsilon, prev_state, prev_config, *, config=None, noise=None):
        """The data-independent start state (spends nothing)."""
        return self._start()

    def erm(self, batches, *, config=None):
        """The data-independent start state."""
        return self._start()


def ptk_kernels() -> dict:
    """name -> (kernel for the harness, its config)."""
    hs = Bundle("histstats", [
        (histstats, dict(SPEED, key="pickup_area", domain=AREAS, name="pu_speed")),
        (histstats, dict(SPEED, key="dropoff_area", domain=AREAS, name="do_speed")),
        (histstats, dict(SPEED, key="hour_key", domain=HOURS, name="hour_speed"))])
    cv = {"columns": COORDS, "center": [41.88, -87.63, 41.88, -87.63], "scale": [0.15] * 4,
          "k": 2, "delta": 1e-6, "name": "loc_pc"}
    km = {"columns": COORDS, "lower": [LAT[0], LON[0]] * 2, "upper": [LAT[1], LON[1]] * 2,
          "k": 6, "iterations": 5, "seed": 0, "name": "loc_km"}
    return {"histstats": (hs, None), "covariance": (Bundle("covariance", [(covariance, cv)]), None),
            "lloyd": (Bundle("lloyd", [(lloyd, km)]), None),
            "lloyd_no_data": (NoDataCentroids("lloyd_no_data", km), None)}


@dataclasses.dataclass
class TaxiSplit:
    """The taxi task's source data and the target's train and test sets."""

    source: dict
    target_train: dict
    target_test: dict


def load_taxi(source_share: float = 0.6, seed: int = 0) -> TaxiSplit:
    """The Chicago taxi CSV as source / target-train / target-test column dicts."""
    import pandas as pd
    from sage_tfx.streams import chicago_taxi_csv_path
    d = pd.read_csv(chicago_taxi_csv_path())
    d = d[(d["trip_seconds"] >= 60) & (d["trip_seconds"] <= 3 * 3600) & (d["trip_miles"] > 0)
          & (d["trip_miles"] < 100)].sort_values("trip_start_timestamp").reset_index(drop=True)

    def area(col):
        return np.array(["NA" if not np.isfinite(v) else str(int(v)) for v in d[col]])
    cols = {"pickup_area": area("pickup_community_area"),
            "dropoff_area": area("dropoff_community_area"),
            "hour_key": d["trip_start_hour"].astype(int).astype(str).to_numpy(),
            "speed": (d["trip_miles"] / (d["trip_seconds"] / 3600.0)).to_numpy(float),
            "y": np.log1p(d["trip_seconds"].to_numpy(float)),
            "trip_miles": d["trip_miles"].to_numpy(float),
            "hour": d["trip_start_hour"].to_numpy(float),
            "weekday": d["trip_start_day"].to_numpy(float),
            "month": d["trip_start_month"].to_numpy(float),
            "cash": (d["payment_type"] == "Cash").to_numpy(float),
            "card": (d["payment_type"] == "Credit Card").to_numpy(float)}
    for c in COORDS:
        cols[c] = d[c].to_numpy(float)
    n = len(d)
    cut = int(n * source_share)
    rng = np.random.default_rng(seed)
    rest = np.arange(cut, n)
    test = rng.random(len(rest)) < 0.3
    take = lambda idx: {k: v[idx] for k, v in cols.items()}  # noqa: E731
    return TaxiSplit(take(np.arange(cut)), take(rest[~test]), take(rest[test]))


BASE = ["trip_miles", "hour", "weekday", "month", "cash", "card"] + COORDS


def base_features(cols) -> np.ndarray:
    """The base feature matrix of ``cols``."""
    return np.column_stack([np.asarray(cols[c], dtype=float) for c in BASE])


def model_factory(seed: int, max_iter: int = 100):
    """The downstream model of the taxi task: gradient-boosted trees."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    return HistGradientBoostingRegressor(max_iter=max_iter, learning_rate=0.1, random_state=seed)


def run(*, fractions=(0.02, 0.05, 0.1, 0.25, 0.5, 1.0), epsilons=(0.1, 1.0), seeds=(0, 1, 2),
        kernels: Sequence[str] = ("histstats", "covariance", "lloyd", "lloyd_no_data"),
        progress: Callable[[str], None] = print, model=model_factory) -> list:
    """All rows of the taxi evaluation (the harness's row format)."""
    from sage_tfx.ptk.eval import fig5
    split = load_taxi()
    progress(f"chicago taxi: {len(split.source['y']):,} source trips, "
             f"{len(split.target_train['y']):,} target train / {len(split.target_test['y']):,} "
             "test")
    rows = []
    for name in kernels:
        kernel, cfg = ptk_kernels()[name]
        got = fig5.run_fig5("chicago_taxi", split.source, split.target_train, split.target_test,
                            label="y", kernel=kernel, kernel_config=cfg,
                            base_features=base_features, model_factory=model, metric="mse",
                            fractions=fractions, epsilons=epsilons, seeds=seeds,
                            kernel_name=name)
        progress(f"  {name}: {len(got)} rows")
        rows += got
    return rows


def gains(rows: Sequence[dict]) -> list:
    """Per (dataset, kernel, fraction): the relative gain of each PTK variant over no-PTK
    (positive = better; metric means over seeds)."""
    from sage_tfx.ptk.eval import fig5
    summ = fig5.summarize(rows)
    lower = fig5.LOWER_IS_BETTER
    base = {(r["dataset"], r["kernel"], r["fraction"]): r["mean"] for r in summ
            if r["variant"] == "no_ptk"}
    out = []
    for r in summ:
        if r["variant"] == "no_ptk":
            continue
        b = base[(r["dataset"], r["kernel"], r["fraction"])]
        sign = 1.0 if lower[r["metric"]] else -1.0
        out.append({"dataset": r["dataset"], "kernel": r["kernel"], "variant": r["variant"],
                    "eps": r["eps"], "fraction": r["fraction"], "no_ptk": b, "ptk": r["mean"],
                    "gain_pct": sign * 100.0 * (b - r["mean"]) / abs(b) if b else math.nan})
    return out


def write_outputs(rows: Sequence[dict], out: str, stem: str, title: str,
                  progress: Callable[[str], None] = print) -> None:
    """``<stem>.csv`` (rows), ``<stem>_gains.csv`` (:func:`gains`), ``<stem>_headline.csv``
    (:func:`sage_tfx.ptk.eval.fig5.headline`) and ``<stem>.png`` in ``out``; prints the gains."""
    import os
    from sage_tfx.ptk.eval import fig5
    os.makedirs(out, exist_ok=True)
    fig5.write_csv(rows, os.path.join(out, f"{stem}.csv"))
    got = gains(rows)
    fig5.write_csv(got, os.path.join(out, f"{stem}_gains.csv"))
    fig5.write_csv(fig5.headline(rows), os.path.join(out, f"{stem}_headline.csv"))
    fig5.plot(rows, os.path.join(out, f"{stem}.png"), title)
    for g in got:
        eps = "" if g["variant"] != "dp_ptk" else f" eps={g['eps']:g}"
        progress(f"{g['kernel']:<11} {g['variant']:<15}{eps:<9} fraction {g['fraction']:<5g} "
                 f"no-PTK {g['no_ptk']:.4f}  PTK {g['ptk']:.4f}  gain {g['gain_pct']:+.2f} %")
    progress(f"wrote {os.path.join(out, stem)}.csv, _gains.csv, _headline.csv and .png")
