"""DP statistics over public bins: histograms, and min/max and quantiles read off a DP histogram.

Same contract as :mod:`sage_tfx.dp.queries` (exact additive aggregate, noise drawn once in
``release``); assumptions are those stated there. This module imports no TensorFlow.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import dp_accounting
import numpy as np

from sage_tfx.dp.mechanisms import (ArrayLike, LaplaceMechanism, Value, check_bounds,
                                    check_positive)
from sage_tfx.dp.noise import NoiseSource
from sage_tfx.dp.queries import DPRelease, Query, record_values
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.ledger.accounting import check_epsilon


def check_bin_edges(bin_edges: ArrayLike) -> tuple[float, ...]:
    """Returns public bin edges if there are ≥ 2, all finite and strictly increasing.

    Raises:
      InvalidPrivacyParameterError: otherwise.
    """
    edges = np.asarray(bin_edges, dtype=np.float64)
    if edges.ndim != 1 or edges.size < 2 or not np.all(np.isfinite(edges)) \
            or not np.all(np.diff(edges) > 0):
        raise InvalidPrivacyParameterError(
            f"bin edges must be ≥ 2 finite, strictly increasing numbers, got {bin_edges!r}")
    return tuple(float(e) for e in edges)


def _bin_counts(x: np.ndarray, edges: tuple[float, ...]) -> np.ndarray:
    """Counts per bin [e_i, e_{i+1}) (last bin closed), values clipped into the outer bins."""
    x = record_values(x)
    x = x[~np.isnan(x)]
    idx = np.searchsorted(np.asarray(edges), x, side="right") - 1
    idx = np.clip(idx, 0, len(edges) - 2)
    return np.bincount(idx, minlength=len(edges) - 1).astype(np.float64)


def occupied_range(noisy_counts: ArrayLike, bin_edges: Sequence[float],
                   threshold: float) -> np.ndarray:
    """[min, max] read off noisy bin counts (post-processing): the left edge of the first and the
    right edge of the last bin whose noisy count exceeds ``threshold``; (first edge, last edge) if
    none does."""
    edges = np.asarray(bin_edges, dtype=np.float64)
    occupied = np.flatnonzero(np.asarray(noisy_counts, dtype=np.float64) > threshold)
    if occupied.size == 0:
        return np.array([edges[0], edges[-1]])
    return np.array([edges[occupied[0]], edges[occupied[-1] + 1]])


def quantiles_from_counts(noisy_counts: ArrayLike, bin_edges: Sequence[float],
                          quantiles: Sequence[float]) -> np.ndarray:
    """Quantiles interpolated in a noisy cumulative histogram (post-processing).

    Negative noisy counts are set to 0 and the distribution is taken as uniform within a bin;
    with no positive count, the quantiles of a uniform distribution over the edges' range.
    Non-decreasing in the quantile, always within [first edge, last edge].
    """
    edges = np.asarray(bin_edges, dtype=np.float64)
    counts = np.maximum(np.asarray(noisy_counts, dtype=np.float64), 0.0)
    qs = np.asarray(quantiles, dtype=np.float64)
    lower, upper = edges[0], edges[-1]
    mass = counts.sum()
    if mass <= 0:
        return lower + qs * (upper - lower)
    cumulative = np.cumsum(counts)
    targets = qs * mass
    bins = np.minimum(np.searchsorted(cumulative, targets, side="left"), counts.size - 1)
    before = cumulative[bins] - counts[bins]
    with np.errstate(divide="ignore", invalid="ignore"):
        fraction = np.where(counts[bins] > 0, (targets - before) / counts[bins], 0.0)
    width = edges[bins + 1] - edges[bins]
    return np.clip(edges[bins] + np.clip(fraction, 0.0, 1.0) * width, lower, upper)


@dataclasses.dataclass(frozen=True)
class HistogramQuery(Query):
    """Counts per public bin [e_i, e_{i+1}) (last bin closed); Laplace noise, L1 sensitivity 1.

    Values outside [e_0, e_last] are clipped into the first/last bin (as ``dp_sum`` clips to its
    bounds); NaN values are dropped.
    """

    bin_edges: tuple[float, ...]
    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "bin_edges", check_bin_edges(self.bin_edges))
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))

    def zero(self) -> np.ndarray:
        """An empty histogram (the aggregation's identity)."""
        return np.zeros(len(self.bin_edges) - 1)

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        """Exact bin counts of ``columns[0]``."""
        return _bin_counts(columns[0], self.bin_edges)

    def release(self, total: np.ndarray, noise: NoiseSource | None = None) -> Value:
        """The counts with Laplace noise of sensitivity 1 at ``epsilon``."""
        return LaplaceMechanism(self.epsilon, 1.0).add_noise(total, noise)

    def dp_event(self) -> dp_accounting.DpEvent:
        """The Laplace DpEvent the release spends."""
        return LaplaceMechanism(self.epsilon, 1.0).dp_event()


def _check_num_bins(num_bins: Any) -> int:
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
        raise InvalidPrivacyParameterError(f"num_bins must be an int ≥ 1, got {num_bins!r}")
    return int(num_bins)


@dataclasses.dataclass(frozen=True)
class MinMaxQuery(Query):
    """Approximate min and max of values clipped to [lower, upper], from a DP histogram.

    The range is cut into ``num_bins`` equal bins and a DP histogram is released; min (max) is the
    left (right) edge of the first (last) bin whose noisy count exceeds the threshold
    ``scale · ln(num_bins / (2 β))``, above which an empty bin's noise rises with probability at
    most β = ``failure_probability`` over all bins (union bound on Laplace tails). If no bin
    passes, (lower, upper) is returned. The result is exact up to one bin width when every bin
    near the true extremes holds more than about the threshold many records; always
    ``lower <= min < max <= upper``.
    """

    lower: float
    upper: float
    epsilon: float
    num_bins: int = 100
    failure_probability: float = 0.05

    def __post_init__(self) -> None:
        lower, upper = check_bounds(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        object.__setattr__(self, "num_bins", _check_num_bins(self.num_bins))
        beta = check_positive(self.failure_probability, "failure_probability")
        if beta >= 1:
            raise InvalidPrivacyParameterError(
                f"failure_probability must lie in (0, 1), got {self.failure_probability!r}")
        object.__setattr__(self, "failure_probability", beta)

    @property
    def bin_edges(self) -> tuple[float, ...]:
        """The public bin edges, evenly spaced over [lower, upper]."""
        return tuple(float(e) for e in np.linspace(self.lower, self.upper, self.num_bins + 1))

    @property
    def threshold(self) -> float:
        """Noisy count a bin must exceed to count as non-empty."""
        scale = LaplaceMechanism(self.epsilon, 1.0).scale
        return scale * max(0.0, math.log(self.num_bins / (2.0 * self.failure_probability)))

    def zero(self) -> np.ndarray:
        """Empty bin counts (the aggregation's identity)."""
        return np.zeros(self.num_bins)

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        """Exact bin counts of ``columns[0]``."""
        return _bin_counts(columns[0], self.bin_edges)

    def release(self, total: np.ndarray, noise: NoiseSource | None = None) -> Value:
        """[min, max]: edges of the first and last bins whose noisy count passes the threshold."""
        noisy = np.asarray(LaplaceMechanism(self.epsilon, 1.0).add_noise(total, noise))
        return occupied_range(noisy, self.bin_edges, self.threshold)

    def dp_event(self) -> dp_accounting.DpEvent:
        """The Laplace DpEvent the release spends."""
        return LaplaceMechanism(self.epsilon, 1.0).dp_event()


@dataclasses.dataclass(frozen=True)
class QuantilesQuery(Query):
    """Quantiles of values clipped to [lower, upper], read off a DP histogram of ``num_bins`` bins.

    Negative noisy counts are set to 0, the cumulative distribution is interpolated linearly
    within a bin. With no positive noisy count the quantiles of a uniform distribution on
    [lower, upper] are returned. Results are non-decreasing in the quantile.
    """

    quantiles: tuple[float, ...]
    lower: float
    upper: float
    epsilon: float
    num_bins: int = 100

    def __post_init__(self) -> None:
        qs = np.asarray(self.quantiles, dtype=np.float64).reshape(-1)
        if qs.size == 0 or not np.all((qs >= 0) & (qs <= 1)):
            raise ValueError(f"quantiles must be numbers in [0, 1], got {self.quantiles!r}")
        object.__setattr__(self, "quantiles", tuple(float(q) for q in qs))
        lower, upper = check_bounds(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        object.__setattr__(self, "num_bins", _check_num_bins(self.num_bins))

    @property
    def bin_edges(self) -> tuple[float, ...]:
        """The public bin edges, evenly spaced over [lower, upper]."""
        return tuple(float(e) for e in np.linspace(self.lower, self.upper, self.num_bins + 1))

    def zero(self) -> np.ndarray:
        """Empty bin counts (the aggregation's identity)."""
        return np.zeros(self.num_bins)

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        """Exact bin counts of ``columns[0]``."""
        return _bin_counts(columns[0], self.bin_edges)

    def release(self, total: np.ndarray, noise: NoiseSource | None = None) -> Value:
        """The quantiles, interpolated in the noisy cumulative histogram."""
        noisy = np.asarray(LaplaceMechanism(self.epsilon, 1.0).add_noise(total, noise))
        return quantiles_from_counts(noisy, self.bin_edges, self.quantiles)

    def dp_event(self) -> dp_accounting.DpEvent:
        """The Laplace DpEvent the release spends."""
        return LaplaceMechanism(self.epsilon, 1.0).dp_event()


# --- numpy entry points -----------------------------------------------------------------------


def dp_histogram(x: ArrayLike, bin_edges: ArrayLike, epsilon: float, *,
                 noise: NoiseSource | None = None) -> DPRelease:
    """DP counts per public bin (values outside the edges clipped into the outer bins)."""
    return HistogramQuery(check_bin_edges(bin_edges), epsilon).run(x, noise=noise)


def dp_min_max(x: ArrayLike, lower: float, upper: float, epsilon: float, *, num_bins: int = 100,
               failure_probability: float = 0.05,
               noise: NoiseSource | None = None) -> DPRelease:
    """DP approximate (min, max) of ``x`` clipped to [lower, upper]; see :class:`MinMaxQuery`.

    Returns:
      DPRelease whose value is the float64 array [min, max].
    """
    return MinMaxQuery(lower, upper, epsilon, num_bins, failure_probability).run(x, noise=noise)


def dp_quantiles(x: ArrayLike, quantiles: Sequence[float], lower: float, upper: float,
                 epsilon: float, *, num_bins: int = 100,
                 noise: NoiseSource | None = None) -> DPRelease:
    """DP quantiles of ``x`` clipped to [lower, upper]; see :class:`QuantilesQuery`.

    All quantiles come from one DP histogram, so asking for several costs ε once.
    """
    return QuantilesQuery(tuple(quantiles), lower, upper, epsilon, num_bins).run(x, noise=noise)
