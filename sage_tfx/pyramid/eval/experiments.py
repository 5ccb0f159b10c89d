"""Pyramid §V experiments (Figs. 4–6) on a time-ordered categorical workload.

Protocol (our reading of §V.A and App. A.2, stated once here):

* The *hot window* is the most recent fraction ``f`` of the training data; models train on it.
* Count tables are built through :class:`~sage_tfx.pyramid.PyramidStore` (``ledger=None``,
  seeded noise: offline experiments) from the *complete months before the hot window's month*,
  one sealed window per month, so each month's table carries its own noise, as in deployment.
  Month 1 is set aside: it only serves to choose the noise weights (App. A.2 sets a window
  aside for weights), and is never counted.
* Test rows (the last 20 % by time) are featurized with the same tables.
* Loss is the average log loss, normalised by the baseline: a logistic regression on one-hot raw
  features trained on *all* training data (the "B:" model of Fig. 4).
"""
from __future__ import annotations

import tempfile
from typing import Optional, Sequence

import numpy as np
import pandas as pd
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from sage_tfx.dp.counts import COUNT_MEDIAN
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.pyramid.featurize import CountSpec
from sage_tfx.pyramid.weights import exact_noise_weights, select_noise_weights
from sage_tfx.pyramid.windows import PyramidStore

NO_NOISE_EPSILON = 1e9   # ε used for the noise-free runs: discrete Laplace of scale ~1e-8 is 0


def raw_lr_loss(train: pd.DataFrame, test: pd.DataFrame, features: Sequence[str],
                label: str = "y", C: float = 0.3) -> float:
    """Log loss of logistic regression on one-hot raw features (the baseline family)."""
    enc = OneHotEncoder(handle_unknown="ignore", min_frequency=1)
    x = enc.fit_transform(train[list(features)].astype(str))
    m = LogisticRegression(C=C, max_iter=300).fit(x, train[label])
    return float(log_loss(test[label], m.predict_proba(enc.transform(test[list(features)]
                                                                     .astype(str)))[:, 1],
                          labels=[0, 1]))


def count_model(name: str):
    """The count-feature model ``name``: ``lr`` or ``gbt`` (Table II's trees)."""
    if name == "lr":
        return make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=1000))
    if name == "gbt":   # Table II: 100 trees, 8 leaves, LR 0.1
        return HistGradientBoostingClassifier(max_iter=100, max_leaf_nodes=8, learning_rate=0.1,
                                              random_state=0)
    raise ValueError(f"unknown count model {name!r}")


def hot_window(train: pd.DataFrame, fraction: float) -> pd.DataFrame:
    """The last ``fraction`` of ``train`` (at least 50 rows): the hot window."""
    n = max(50, int(round(len(train) * fraction)))
    return train.iloc[len(train) - n:].reset_index(drop=True)


def history_months(train: pd.DataFrame, hot: pd.DataFrame, weight_month: int = 1) -> list[int]:
    """The months counted: after the weight month, before the hot window."""
    first_hot = int(hot["month"].iloc[0])
    return [m for m in sorted(train["month"].unique()) if weight_month < m < first_hot]


def weights_for(train: pd.DataFrame, spec: CountSpec, mode: str, epsilon: float,
                seed: int, quantile: float = 0.1, weight_month: int = 1) -> Optional[np.ndarray]:
    """Noise weights from the set-aside month: None (even split), "exact" or "dp" (ε-DP)."""
    if mode == "none":
        return None
    frame = train[train["month"] == weight_month]
    if mode == "exact":
        return exact_noise_weights(frame, spec, quantile=quantile)
    if mode == "dp":   # OpenDP's quantile (not seedable): DP weights vary from run to run
        # max_count: the window's record count, public ledger metadata of its blocks.
        return select_noise_weights(frame, spec, epsilon, quantile=quantile,
                                    max_count=len(frame))
    raise ValueError(f"unknown weight mode {mode!r}")


def build_featurization(train: pd.DataFrame, months: Sequence[int], spec: CountSpec,
                        weights, seed: int):
    """A featurization of ``months`` sealed one window each in a throw-away store."""
    with tempfile.TemporaryDirectory() as tmp:
        store = PyramidStore(spec, tmp, retention=max(1, len(months)), noise=SeededNoise(seed))
        for m in months:
            store.open_window(int(m))
            store.observe(train[train["month"] == m])
            store.seal(weights=weights)
        return store.featurization()


def count_losses(feat, hot: pd.DataFrame, test: pd.DataFrame, models: Sequence[str],
                 label: str = "y") -> dict:
    """Test log loss of each count model trained on the hot window's features."""
    xtr, xte = feat.featurize(hot), feat.featurize(test)
    out = {}
    for name in models:
        m = count_model(name).fit(xtr, hot[label])
        out[name] = float(log_loss(test[label], m.predict_proba(xte)[:, 1], labels=[0, 1]))
    return out


def make_spec(features, pairs, *, epsilon: float, kind: str = COUNT_MEDIAN,
              width: int = 2 ** 14) -> CountSpec:
    """A count spec over ``features`` and ``pairs``."""
    return CountSpec(groups=tuple(features) + tuple(pairs), label="y", kind=kind, width=width,
                     epsilon=epsilon)


def run_grid(train: pd.DataFrame, test: pd.DataFrame, features, pairs, *, base: float,
             fractions: Sequence[float], configs: Sequence[tuple], seeds: Sequence[int],
             models: Sequence[str] = ("lr", "gbt"), width: int = 2 ** 14, on_row=None
             ) -> list[dict]:
    """Normalised losses of count models over ``fractions × configs × seeds``.

    ``configs``: ``(epsilon, weights, kind)`` triples (``NO_NOISE_EPSILON`` for no noise).
    A seed draws the count noise (and, for ``"dp"``, OpenDP's weights, which are not seedable);
    noise-free configs run once (seed 0). Raw LR on the same hot window is one row per fraction.
    """
    rows = []

    def add(row):
        rows.append(row)
        if on_row is not None:
            on_row(row)

    for fraction in fractions:
        hot = hot_window(train, fraction)
        months = history_months(train, hot)
        loss = raw_lr_loss(hot, test, features)
        add(dict(fraction=fraction, n_hot=len(hot), epsilon=float("inf"), weights="-",
                 sketch="-", seed=0, model="raw lr", loss=loss, normalized=loss / base))
        for eps, weights, kind in configs:
            for seed in (seeds if eps < NO_NOISE_EPSILON else seeds[:1]):
                spec = make_spec(features, pairs, epsilon=eps, kind=kind, width=width)
                feat = build_featurization(train, months, spec,
                                           weights_for(train, spec, weights, eps, seed), seed)
                for model, loss in count_losses(feat, hot, test, models).items():
                    add(dict(fraction=fraction, n_hot=len(hot), epsilon=eps, weights=weights,
                             sketch=kind, seed=seed, model=f"count {model}", loss=loss,
                             normalized=loss / base))
    return rows


def mean_std_table(rows: pd.DataFrame, index, columns) -> pd.DataFrame:
    """``mean ± std`` (over seeds) of the normalised loss, as ``+x.x ± y.y %`` strings."""
    g = rows.groupby(list(index) + list(columns))["normalized"]
    stats = pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=1), "n": g.size()})

    def fmt(r):
        if r["n"] < 2 or not np.isfinite(r["std"]):
            return f"{(r['mean'] - 1) * 100:+.1f} %"
        return f"{(r['mean'] - 1) * 100:+.1f} ± {r['std'] * 100:.1f} %"
    return stats.apply(fmt, axis=1).unstack(list(columns))


def run_workload(train: pd.DataFrame, test: pd.DataFrame, features, pairs, *,
                 fractions: Sequence[float], configs: Sequence[tuple], seeds: Sequence[int],
                 width: int = 2 ** 14, log=print) -> pd.DataFrame:
    """:func:`run_grid` on one workload with its two reference losses: raw LR on all of
    ``train`` (``baseline``, the normaliser) and the constant train-label-rate predictor
    (``constant``), both as leading columns; progress goes to ``log``."""
    base = raw_lr_loss(train, test, features)
    const = log_loss(test.y, np.full(len(test), train.y.mean()))
    log(f"baseline raw LR on all {len(train)} rows: {base:.4f}; constant: {const:.4f} "
        f"({(const / base - 1) * 100:+.1f} %)")
    rows = run_grid(train, test, features, pairs, base=base, fractions=fractions,
                    configs=configs, seeds=seeds, width=width, on_row=log)
    df = pd.DataFrame(rows)
    df.insert(0, "baseline", base)
    df.insert(1, "constant", const)
    return df
