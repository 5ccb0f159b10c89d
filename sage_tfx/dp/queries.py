"""DP statistics with additive exact aggregates: counts, sums, means and group-by aggregates.

The statistics are the ones a Sage training pipeline computes in its ``preprocessing_fn``
(Sage §3.1, List. 1: ``dp_group_by_mean``): counts, clipped sums and means, group-by aggregates over
a public key domain, histograms over public bins, and clipped min/max/quantiles. Each is a *query*
with an exact, additive aggregate (partial aggregates of disjoint batches sum to the aggregate of
their union) and a ``release`` that adds noise once to the total. The numpy functions
(``dp_count``, ``dp_mean``, ...) run a query on an in-memory array; the DP Transform analyzers
(``sage_tfx.components.dp_transform.analyzers``) run the *same* query objects inside Beam, so both
paths release identical values for the same data and noise source.

Privacy assumptions, stated once for every function here:

* Adjacency is add-or-remove-one-record (dp_accounting's ``ADD_OR_REMOVE_ONE``, the relation
  Sage's block composition uses). A record contributes one value (one key, one value) to a query.
* Sensitivities come from public clipping bounds, public key domains and public bin edges chosen
  *without looking at the data*. Values are clipped to ``[lower, upper]``; NaN values contribute
  nothing (they are treated as missing: a NaN in a released sum would reveal that the dataset
  contains a NaN).
* Group-by queries use parallel composition across keys (Sage §3.1: each record has exactly one
  key): the vector of per-key counts has L1 sensitivity 1, not ``len(key_domain)``.
* Noise comes from OpenDP's Laplace sampler (:mod:`sage_tfx.dp.noise`), safe from Mironov's
  floating-point attack, on counts too (see :mod:`sage_tfx.dp.mechanisms` for why not the
  discrete Laplace). ``noise=SeededNoise(seed)`` (experiments and
  tests only) makes a release reproducible.

This module imports no TensorFlow.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import dp_accounting
import numpy as np

from sage_tfx.dp.mechanisms import ArrayLike, LaplaceMechanism, Value, check_bounds
from sage_tfx.dp.noise import NoiseSource
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.ledger.accounting import check_epsilon


# --- DP statistics: queries with additive exact aggregates ------------------------------------


@dataclasses.dataclass(frozen=True)
class DPRelease:
    """A differentially private value and the privacy it consumed.

    Attributes:
      value: the released (noisy) statistic: a float or a float64 array.
      event: the dp_accounting DpEvent of the mechanisms that produced it.
      epsilon: the ε it is DP for (δ = 0: all statistics here use the Laplace mechanism).
    """

    value: Value
    event: dp_accounting.DpEvent
    epsilon: float


def record_values(x: ArrayLike) -> np.ndarray:
    """A 1-D float64 array of one value per record (NaN kept, dropped by each query)."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(f"expected one value per record (shape [n] or [n, 1]), got {arr.shape}")
    return arr


def _check_domain(key_domain: Sequence[Any]) -> tuple[Any, ...]:
    """Normalizes a public key domain: all ints, or all strings (as UTF-8 bytes); no duplicates."""
    domain = list(key_domain.tolist() if isinstance(key_domain, np.ndarray) else key_domain)
    if not domain:
        raise InvalidPrivacyParameterError("the public key domain is empty")
    if all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in domain):
        normalized: list[Any] = [int(k) for k in domain]
    elif all(isinstance(k, (str, bytes, np.str_, np.bytes_)) for k in domain):
        normalized = [k.encode("utf-8") if isinstance(k, str) else bytes(k) for k in domain]
    else:
        raise InvalidPrivacyParameterError(
            f"a key domain must be all ints or all strings, got {key_domain!r}")
    if len(set(normalized)) != len(normalized):
        raise InvalidPrivacyParameterError(f"the key domain has duplicate keys: {key_domain!r}")
    return tuple(normalized)


def _key_indices(keys: ArrayLike, domain: tuple[Any, ...]) -> np.ndarray:
    """Index of each key in ``domain``, or -1 for keys outside it (dropped by the queries)."""
    arr = np.asarray(keys)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(f"expected one key per record (shape [n] or [n, 1]), got {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if isinstance(domain[0], int):
        if arr.dtype.kind not in "iu":
            raise ValueError(f"the key domain holds ints but the keys are {arr.dtype}")
        lookup = {k: i for i, k in enumerate(domain)}
        uniques, inverse = np.unique(arr.astype(np.int64), return_inverse=True)
        mapped = np.array([lookup.get(int(u), -1) for u in uniques], dtype=np.int64)
        return mapped[inverse]
    if arr.dtype.kind not in "OSU":
        raise ValueError(f"the key domain holds strings but the keys are {arr.dtype}")
    lookup = {k: i for i, k in enumerate(domain)}
    normalized = np.array([k.encode("utf-8") if isinstance(k, str) else bytes(k)
                           for k in arr.tolist()], dtype=object)
    uniques, inverse = np.unique(normalized, return_inverse=True)
    mapped = np.array([lookup.get(u, -1) for u in uniques], dtype=np.int64)
    return mapped[inverse]


def _composed(events: Sequence[dp_accounting.DpEvent]) -> dp_accounting.DpEvent:
    return events[0] if len(events) == 1 else dp_accounting.ComposedDpEvent(list(events))


class Query:
    """A DP statistic: an exact additive aggregate plus a noisy release of the total.

    ``aggregate`` of the concatenation of batches equals the sum of their ``aggregate``s, so a
    distributed runner can compute exact partial aggregates anywhere and add noise once, after
    the global combine. Subclasses are frozen dataclasses (picklable for Beam).
    """

    epsilon: float

    def zero(self) -> np.ndarray:
        """The aggregate of an empty batch."""
        raise NotImplementedError

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        """Exact float64 aggregate of one batch (one array per input column)."""
        raise NotImplementedError

    def release(self, total: np.ndarray, noise: NoiseSource | None = None) -> Value:
        """The DP value from the exact aggregate of the whole dataset (noise drawn here)."""
        raise NotImplementedError

    def dp_event(self) -> dp_accounting.DpEvent:
        """The dp_accounting event of one ``release``."""
        raise NotImplementedError

    def run(self, *columns: ArrayLike, noise: NoiseSource | None = None) -> DPRelease:
        """Aggregates in-memory columns and releases the DP value with its event."""
        total = self.aggregate(*(np.asarray(c) for c in columns))
        return DPRelease(self.release(total, noise), self.dp_event(), self.epsilon)


@dataclasses.dataclass(frozen=True)
class CountQuery(Query):
    """Number of records, with Laplace(1/ε) noise (sensitivity 1)."""

    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))

    def zero(self) -> np.ndarray:
        """A zero count (the aggregation's identity)."""
        return np.zeros(1)

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        """The exact number of records."""
        return np.array([float(len(np.asarray(columns[0])))])

    def release(self, total: np.ndarray, noise: NoiseSource | None = None) -> Value:
        """The count with Laplace noise of sensitivity 1 at ``epsilon``."""
        return LaplaceMechanism(self.epsilon, 1.0).add_noise(total[0], noise)

    def dp_event(self) -> dp_accounting.DpEvent:
        """The Laplace DpEvent the release spends."""
        return LaplaceMechanism(self.epsilon, 1.0).dp_event()


@dataclasses.dataclass(frozen=True)
class SumQuery(Query):
    """Sum of values clipped to [lower, upper]; Laplace noise, sensitivity max(|lower|, |upper|)."""

    lower: float
    upper: float
    epsilon: float

    def __post_init__(self) -> None:
        lower, upper = check_bounds(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))

    @property
    def mechanism(self) -> LaplaceMechanism:
        """The Laplace mechanism of sensitivity max(|lower|, |upper|) at ``epsilon``."""
        return LaplaceMechanism(self.epsilon, max(abs(self.lower), abs(self.upper)))

    def zero(self) -> np.ndarray:
        """A zero sum (the aggregation's identity)."""
        return np.zeros(1)

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        """The exact sum of the values clipped to [lower, upper] (NaNs dropped)."""
        x = record_values(columns[0])
        x = x[~np.isnan(x)]
        return np.array([np.clip(x, self.lower, self.upper).sum()])

    def release(self, total: np.ndarray, noise: NoiseSource | None = None) -> Value:
        """The sum with the mechanism's Laplace noise."""
        return self.mechanism.add_noise(total[0], noise)

    def dp_event(self) -> dp_accounting.DpEvent:
        """The Laplace DpEvent the release spends."""
        return self.mechanism.dp_event()


def _noisy_means(centered_sums: np.ndarray, counts: np.ndarray, lower: float, upper: float,
                 epsilon: float, noise: NoiseSource | None) -> np.ndarray:
    """Sage List. 1 mean: noisy centered sum / noisy count, each with half of ε.

    Centering on the midpoint halves the sum's sensitivity to (upper − lower)/2 (List. 1 uses the
    full value range). A noisy count below 1 is read as 1 and the mean is clipped to
    [lower, upper]; both are post-processing, free of privacy cost.
    """
    half = epsilon / 2.0
    noisy_counts = LaplaceMechanism(half, 1.0).add_noise(counts, noise)
    noisy_sums = LaplaceMechanism(half, (upper - lower) / 2.0).add_noise(centered_sums, noise)
    midpoint = (lower + upper) / 2.0
    means = midpoint + np.asarray(noisy_sums) / np.maximum(np.asarray(noisy_counts), 1.0)
    return np.clip(means, lower, upper)


def _mean_event(epsilon: float, lower: float, upper: float) -> dp_accounting.DpEvent:
    half = epsilon / 2.0
    return dp_accounting.ComposedDpEvent([
        LaplaceMechanism(half, 1.0).dp_event(),
        LaplaceMechanism(half, (upper - lower) / 2.0).dp_event(),
    ])


@dataclasses.dataclass(frozen=True)
class MeanQuery(Query):
    """Mean of values clipped to [lower, upper]: noisy sum / noisy count (Sage List. 1)."""

    lower: float
    upper: float
    epsilon: float

    def __post_init__(self) -> None:
        lower, upper = check_bounds(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))

    def zero(self) -> np.ndarray:
        """A zero (centred sum, count) pair."""
        return np.zeros(2)

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        """The exact centred sum of the clipped values and their count."""
        x = record_values(columns[0])
        x = np.clip(x[~np.isnan(x)], self.lower, self.upper)
        midpoint = (self.lower + self.upper) / 2.0
        return np.array([(x - midpoint).sum(), float(x.size)])

    def release(self, total: np.ndarray, noise: NoiseSource | None = None) -> Value:
        """The noisy mean, in [lower, upper]."""
        means = _noisy_means(total[:1], total[1:], self.lower, self.upper, self.epsilon, noise)
        return float(means[0])

    def dp_event(self) -> dp_accounting.DpEvent:
        """The DpEvent of the noisy sum and count together."""
        return _mean_event(self.epsilon, self.lower, self.upper)


@dataclasses.dataclass(frozen=True)
class GroupByCountQuery(Query):
    """Records per key of a public key domain; vector Laplace noise of L1 sensitivity 1.

    Keys outside the domain are dropped (they are not counted anywhere); every key of the domain
    is released, including keys with no record, so the output reveals nothing through which keys
    appear.
    """

    key_domain: tuple[Any, ...]
    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_domain", _check_domain(self.key_domain))
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))

    def zero(self) -> np.ndarray:
        """Zero counts, one per key of the domain."""
        return np.zeros(len(self.key_domain))

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        """Exact counts per key of the public domain (keys outside it are dropped)."""
        idx = _key_indices(columns[0], self.key_domain)
        return np.bincount(idx[idx >= 0], minlength=len(self.key_domain)).astype(np.float64)

    def release(self, total: np.ndarray, noise: NoiseSource | None = None) -> Value:
        """The counts with Laplace noise of sensitivity 1 at ``epsilon``."""
        return LaplaceMechanism(self.epsilon, 1.0).add_noise(total, noise)

    def dp_event(self) -> dp_accounting.DpEvent:
        """The Laplace DpEvent the release spends."""
        return LaplaceMechanism(self.epsilon, 1.0).dp_event()


@dataclasses.dataclass(frozen=True)
class GroupBySumQuery(Query):
    """Clipped sum per key of a public key domain (keys outside it dropped; empty keys released)."""

    key_domain: tuple[Any, ...]
    lower: float
    upper: float
    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_domain", _check_domain(self.key_domain))
        lower, upper = check_bounds(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))

    @property
    def mechanism(self) -> LaplaceMechanism:
        """The Laplace mechanism of sensitivity max(|lower|, |upper|) at ``epsilon``."""
        return LaplaceMechanism(self.epsilon, max(abs(self.lower), abs(self.upper)))

    def zero(self) -> np.ndarray:
        """Zero sums, one per key of the domain."""
        return np.zeros(len(self.key_domain))

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        """Exact sums of the clipped values per key of the public domain."""
        idx = _key_indices(columns[0], self.key_domain)
        x = record_values(columns[1])
        if x.shape != idx.shape:
            raise ValueError(f"{idx.size} keys but {x.size} values")
        keep = (idx >= 0) & ~np.isnan(x)
        return np.bincount(idx[keep], weights=np.clip(x[keep], self.lower, self.upper),
                           minlength=len(self.key_domain)).astype(np.float64)

    def release(self, total: np.ndarray, noise: NoiseSource | None = None) -> Value:
        """The sums with the mechanism's Laplace noise."""
        return self.mechanism.add_noise(total, noise)

    def dp_event(self) -> dp_accounting.DpEvent:
        """The Laplace DpEvent the release spends."""
        return self.mechanism.dp_event()


@dataclasses.dataclass(frozen=True)
class GroupByMeanQuery(Query):
    """Clipped mean per key of a public key domain, Sage List. 1 ``dp_group_by_mean``.

    Per key: noisy centered sum / noisy count, ε split in half between the count vector and the
    sum vector (each of L1 sensitivity 1 and (upper − lower)/2 by parallel composition). Keys
    outside the domain are dropped; keys without records are released too (their noisy mean is
    mostly noise around the midpoint, clipped to [lower, upper]).
    """

    key_domain: tuple[Any, ...]
    lower: float
    upper: float
    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_domain", _check_domain(self.key_domain))
        lower, upper = check_bounds(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))

    def zero(self) -> np.ndarray:
        """Zero (centred sum, count) pairs, one per key of the domain."""
        return np.zeros(2 * len(self.key_domain))

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        """Exact centred sums and counts per key of the public domain."""
        idx = _key_indices(columns[0], self.key_domain)
        x = record_values(columns[1])
        if x.shape != idx.shape:
            raise ValueError(f"{idx.size} keys but {x.size} values")
        keep = (idx >= 0) & ~np.isnan(x)
        midpoint = (self.lower + self.upper) / 2.0
        k = len(self.key_domain)
        sums = np.bincount(idx[keep], weights=np.clip(x[keep], self.lower, self.upper) - midpoint,
                           minlength=k)
        counts = np.bincount(idx[keep], minlength=k)
        return np.concatenate([sums, counts]).astype(np.float64)

    def release(self, total: np.ndarray, noise: NoiseSource | None = None) -> Value:
        """The noisy means per key, each in [lower, upper]."""
        k = len(self.key_domain)
        return _noisy_means(total[:k], total[k:], self.lower, self.upper, self.epsilon, noise)

    def dp_event(self) -> dp_accounting.DpEvent:
        """The DpEvent of the noisy sums and counts together."""
        return _mean_event(self.epsilon, self.lower, self.upper)


# --- numpy entry points -----------------------------------------------------------------------


def dp_count(x: ArrayLike, epsilon: float, *, noise: NoiseSource | None = None) -> DPRelease:
    """DP number of records in ``x`` (Laplace, sensitivity 1).

    Returns:
      DPRelease with a float value.

    Raises:
      InvalidPrivacyParameterError: bad ε.
    """
    return CountQuery(epsilon).run(np.asarray(x), noise=noise)


def dp_sum(x: ArrayLike, lower: float, upper: float, epsilon: float, *,
           noise: NoiseSource | None = None) -> DPRelease:
    """DP sum of ``x`` clipped to [lower, upper] (Laplace, sensitivity max(|lower|, |upper|)).

    Raises:
      InvalidPrivacyParameterError: bad ε or bounds.
    """
    return SumQuery(lower, upper, epsilon).run(x, noise=noise)


def dp_mean(x: ArrayLike, lower: float, upper: float, epsilon: float, *,
            noise: NoiseSource | None = None) -> DPRelease:
    """DP mean of ``x`` clipped to [lower, upper]: sum and count noised separately (List. 1).

    Raises:
      InvalidPrivacyParameterError: bad ε or bounds.
    """
    return MeanQuery(lower, upper, epsilon).run(x, noise=noise)


def dp_group_by_count(keys: ArrayLike, key_domain: Sequence[Any], epsilon: float, *,
                      noise: NoiseSource | None = None) -> DPRelease:
    """DP count per key of the public ``key_domain`` (keys outside it are dropped).

    Returns:
      DPRelease whose value is a float64 array aligned with ``key_domain`` (every key present).
    """
    return GroupByCountQuery(tuple(key_domain), epsilon).run(keys, noise=noise)


def dp_group_by_sum(keys: ArrayLike, values: ArrayLike, key_domain: Sequence[Any], lower: float,
                    upper: float, epsilon: float, *,
                    noise: NoiseSource | None = None) -> DPRelease:
    """DP clipped sum per key of the public ``key_domain`` (keys outside it are dropped)."""
    return GroupBySumQuery(tuple(key_domain), lower, upper, epsilon).run(keys, values, noise=noise)


def dp_group_by_mean(keys: ArrayLike, values: ArrayLike, key_domain: Sequence[Any], lower: float,
                     upper: float, epsilon: float, *,
                     noise: NoiseSource | None = None) -> DPRelease:
    """DP clipped mean per key of the public ``key_domain`` (Sage List. 1 ``dp_group_by_mean``).

    Returns:
      DPRelease whose value is a float64 array aligned with ``key_domain``.
    """
    return GroupByMeanQuery(tuple(key_domain), lower, upper, epsilon).run(keys, values, noise=noise)
