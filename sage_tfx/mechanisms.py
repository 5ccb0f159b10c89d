"""DP mechanisms (Laplace, analytic Gaussian), budget splitting and numpy DP statistics.

The statistics are the ones a Sage training pipeline computes in its ``preprocessing_fn``
(Sage §3.1, List. 1: ``dp_group_by_mean``): counts, clipped sums and means, group-by aggregates over
a public key domain, histograms over public bins, and clipped min/max/quantiles. Each is a *query*
with an exact, additive aggregate (partial aggregates of disjoint batches sum to the aggregate of
their union) and a ``release`` that adds noise once to the total. The numpy functions
(``dp_count``, ``dp_mean``, ...) run a query on an in-memory array; the DP Transform analyzers
(``sage_tfx.components.dp_transform.analyzers``) run the *same* query objects inside Beam, so both
paths release identical values for the same data and random generator.

Privacy assumptions, stated once for every function here:

* Adjacency is add-or-remove-one-record (dp_accounting's ``ADD_OR_REMOVE_ONE``, the relation
  Sage's block composition uses). A record contributes one value (one key, one value) to a query.
* Sensitivities come from public clipping bounds, public key domains and public bin edges chosen
  *without looking at the data*. Values are clipped to ``[lower, upper]``; NaN values contribute
  nothing (they are treated as missing: a NaN in a released sum would reveal that the dataset
  contains a NaN).
* Group-by queries use parallel composition across keys (Sage §3.1: each record has exactly one
  key): the vector of per-key counts has L1 sensitivity 1, not ``len(key_domain)``.
* Noise is sampled with numpy's floating-point samplers, which are not protected against the
  floating-point attack of Mironov (CCS 2012); this matches TF Privacy and the paper's prototype.

This module imports no TensorFlow.
"""
from __future__ import annotations

import dataclasses
import math
from decimal import Decimal
from typing import Any, Sequence, Union

import dp_accounting
import numpy as np
from scipy import special

from sage_tfx.accounting import check_delta, check_epsilon, exact
from sage_tfx.errors import InvalidPrivacyParameterError

ArrayLike = Union[np.ndarray, Sequence[Any]]
Value = Union[float, np.ndarray]


# --- validation -------------------------------------------------------------------------------


def _check_positive(value: Any, name: str) -> float:
    """Returns ``value`` as a float if it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise InvalidPrivacyParameterError(f"{name} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out) or out <= 0:
        raise InvalidPrivacyParameterError(f"{name} must be finite and > 0, got {value!r}")
    return out


def check_bounds(lower: Any, upper: Any) -> tuple[float, float]:
    """Returns public clipping bounds as floats if they are finite and ``lower < upper``.

    Raises:
      InvalidPrivacyParameterError: NaN, infinite, non-numeric or ``lower >= upper``.
    """
    for name, value in (("lower", lower), ("upper", upper)):
        if isinstance(value, bool) or not isinstance(
                value, (int, float, np.floating, np.integer)) or not math.isfinite(float(value)):
            raise InvalidPrivacyParameterError(
                f"clipping bound {name} must be a finite number, got {value!r}")
    if not float(lower) < float(upper):
        raise InvalidPrivacyParameterError(
            f"clipping bounds need lower < upper, got lower={lower!r}, upper={upper!r}")
    return float(lower), float(upper)


def _plus_noise(value: ArrayLike | float, draw) -> Value:
    """``value`` plus ``draw(shape)``: a float for a scalar, else a float64 array."""
    exact_value = np.asarray(value, dtype=np.float64)
    noisy = exact_value + draw(exact_value.shape)
    return float(noisy) if noisy.ndim == 0 else noisy


def _rng(rng: np.random.Generator | None) -> np.random.Generator:
    """``rng`` or, if None, a generator seeded from OS entropy."""
    return np.random.default_rng() if rng is None else rng


# --- mechanisms -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LaplaceMechanism:
    """The Laplace mechanism: adds Laplace(0, l1_sensitivity / epsilon) noise; ε-DP.

    Attributes:
      epsilon: privacy parameter, finite and > 0.
      l1_sensitivity: max L1 change of the query between adjacent datasets, finite and > 0.
    """

    epsilon: float
    l1_sensitivity: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        object.__setattr__(self, "l1_sensitivity",
                           _check_positive(self.l1_sensitivity, "l1_sensitivity"))

    @property
    def scale(self) -> float:
        """Scale b of the Laplace noise (density exp(-|x|/b) / 2b)."""
        return self.l1_sensitivity / self.epsilon

    @property
    def noise_multiplier(self) -> float:
        """scale / l1_sensitivity, dp_accounting's parameter of the mechanism (= 1/ε)."""
        return self.scale / self.l1_sensitivity

    @property
    def std(self) -> float:
        """Standard deviation of the noise: sqrt(2) * scale."""
        return math.sqrt(2.0) * self.scale

    def add_noise(self, value: ArrayLike | float, rng: np.random.Generator | None = None) -> Value:
        """Returns ``value`` plus independent Laplace noise on every coordinate.

        Args:
          value: exact query answer (scalar or array).
          rng: numpy generator; None draws from OS entropy.

        Returns:
          A float for a scalar ``value``, else a float64 array of the same shape.
        """
        return _plus_noise(value, lambda shape: _rng(rng).laplace(0.0, self.scale, size=shape))

    def dp_event(self) -> dp_accounting.LaplaceDpEvent:
        """The dp_accounting event of one application of this mechanism."""
        return dp_accounting.LaplaceDpEvent(noise_multiplier=self.noise_multiplier)


def gaussian_delta(sigma: float, epsilon: float, l2_sensitivity: float = 1.0) -> float:
    """Exact δ(ε) of the Gaussian mechanism with noise std ``sigma`` (Balle & Wang 2018, Thm. 8).

    δ(ε) = Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ), computed in log space to keep precision.

    Args:
      sigma: standard deviation of the Gaussian noise, > 0.
      epsilon: ε ≥ 0 at which to evaluate the privacy profile.
      l2_sensitivity: Δ, the L2 sensitivity of the query.

    Returns:
      The smallest δ such that the mechanism is (ε, δ)-DP.
    """
    a = l2_sensitivity / (2.0 * sigma) - epsilon * sigma / l2_sensitivity
    b = -l2_sensitivity / (2.0 * sigma) - epsilon * sigma / l2_sensitivity
    log_first = float(special.log_ndtr(a))
    log_ratio = epsilon + float(special.log_ndtr(b)) - log_first
    return max(0.0, math.exp(log_first) * -math.expm1(min(log_ratio, 0.0)))


def analytic_gaussian_sigma(epsilon: float, delta: float, l2_sensitivity: float = 1.0) -> float:
    """Smallest noise std σ for which the Gaussian mechanism is (ε, δ)-DP (analytic Gaussian).

    Balle & Wang, "Improving the Gaussian Mechanism for Differential Privacy", ICML 2018: the
    privacy profile :func:`gaussian_delta` is decreasing in σ, so σ is found by bisection. Unlike
    the classical σ = Δ·sqrt(2 ln(1.25/δ))/ε it is valid for every ε > 0 and is never larger.
    The returned σ always satisfies ``gaussian_delta(σ, ε, Δ) <= δ`` (bisection keeps the
    upper end), and is within a relative 1e-12 of the exact solution.

    Raises:
      InvalidPrivacyParameterError: ε not finite > 0, δ ∉ (0, 1), or Δ not finite > 0.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=False)
    sensitivity = _check_positive(l2_sensitivity, "l2_sensitivity")

    def profile(sigma: float) -> float:
        return gaussian_delta(sigma, epsilon, sensitivity)

    hi = sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon
    while profile(hi) > delta:
        hi *= 2.0
    lo = hi / 2.0
    while profile(lo) <= delta:
        hi, lo = lo, lo / 2.0
    # Invariant: profile(lo) > delta >= profile(hi).
    for _ in range(200):
        if hi - lo <= 1e-13 * hi:
            break
        mid = 0.5 * (lo + hi)
        if profile(mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


@dataclasses.dataclass(frozen=True)
class GaussianMechanism:
    """The analytic Gaussian mechanism: adds N(0, sigma²) noise; (ε, δ)-DP.

    ``sigma`` is calibrated with :func:`analytic_gaussian_sigma` (Balle & Wang 2018).

    Attributes:
      epsilon: privacy parameter, finite and > 0.
      delta: privacy parameter in (0, 1): the Gaussian mechanism requires delta > 0.
      l2_sensitivity: max L2 change of the query between adjacent datasets, finite and > 0.
      sigma: standard deviation of the noise (derived, not an argument).
    """

    epsilon: float
    delta: float
    l2_sensitivity: float = 1.0
    sigma: float = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        if isinstance(self.delta, (int, float)) and not isinstance(self.delta, bool) \
                and self.delta == 0:
            raise InvalidPrivacyParameterError("Gaussian requires delta > 0, got delta=0")
        object.__setattr__(self, "delta", check_delta(self.delta, allow_zero=False))
        object.__setattr__(self, "l2_sensitivity",
                           _check_positive(self.l2_sensitivity, "l2_sensitivity"))
        object.__setattr__(self, "sigma",
                           analytic_gaussian_sigma(self.epsilon, self.delta, self.l2_sensitivity))

    @property
    def noise_multiplier(self) -> float:
        """sigma / l2_sensitivity, dp_accounting's and TF Privacy's parameter of the mechanism."""
        return self.sigma / self.l2_sensitivity

    def add_noise(self, value: ArrayLike | float, rng: np.random.Generator | None = None) -> Value:
        """Returns ``value`` plus independent N(0, sigma²) noise on every coordinate.

        Args:
          value: exact query answer (scalar or array).
          rng: numpy generator; None draws from OS entropy.

        Returns:
          A float for a scalar ``value``, else a float64 array of the same shape.
        """
        return _plus_noise(value, lambda shape: _rng(rng).normal(0.0, self.sigma, size=shape))

    def dp_event(self) -> dp_accounting.GaussianDpEvent:
        """The dp_accounting event of one application of this mechanism."""
        return dp_accounting.GaussianDpEvent(noise_multiplier=self.noise_multiplier)


# --- budget splitting -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BudgetShare:
    """One part of an (ε, δ) budget handed to one DP computation."""

    epsilon: float
    delta: float = 0.0


def _split_exactly(total: float, weights: Sequence[float]) -> list[float]:
    """Shares of ``total`` ∝ ``weights`` whose decimal sum (accounting.exact) is ≤ ``total``."""
    if total == 0.0:
        return [0.0] * len(weights)
    weight_sum = math.fsum(weights)
    shares = [total * (w / weight_sum) for w in weights[:-1]]
    remainder: Decimal = exact(total) - sum((exact(s) for s in shares), Decimal(0))
    last = float(remainder)
    while last > 0 and exact(last) > remainder:
        last = math.nextafter(last, 0.0)
    if last <= 0:  # cannot happen for positive weights, but never hand out more than the total
        raise InvalidPrivacyParameterError(f"cannot split {total!r} by weights {weights!r}")
    return shares + [last]


def split_budget(epsilon: float, delta: float, weights: Sequence[float]) -> tuple[BudgetShare, ...]:
    """Splits an (ε, δ) budget into shares proportional to ``weights`` (basic composition).

    Exactness: shares are the floats nearest to ``ε·wᵢ/Σw`` except the last, which is the
    remainder. Summed the way the ledger sums (``sage_tfx.accounting.exact``: each float read as
    its shortest repr), the shares add up to exactly ``ε`` (and ``δ``), unless the remainder is not
    the shortest repr of any float, in which case the last share is the largest float below it
    (a shortfall under one ulp). The shares never add up to more than the total, and nothing is
    rounded down beyond that float rounding. The same holds for ``δ``; ``δ = 0`` gives zero shares.

    Args:
      epsilon: total ε, finite and > 0.
      delta: total δ in [0, 1).
      weights: positive finite relative sizes, one per share.

    Returns:
      One ``BudgetShare`` per weight, in order.

    Raises:
      InvalidPrivacyParameterError: bad ε, δ or weights (empty, NaN, ≤ 0, infinite).
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta)
    if len(weights) == 0:
        raise InvalidPrivacyParameterError("split_budget needs at least one weight")
    checked = [_check_positive(w, "weight") for w in weights]
    return tuple(BudgetShare(e, d) for e, d in zip(_split_exactly(epsilon, checked),
                                                    _split_exactly(delta, checked)))


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


def _values(x: ArrayLike) -> np.ndarray:
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

    def release(self, total: np.ndarray, rng: np.random.Generator | None = None) -> Value:
        """The DP value from the exact aggregate of the whole dataset (noise drawn here)."""
        raise NotImplementedError

    def dp_event(self) -> dp_accounting.DpEvent:
        """The dp_accounting event of one ``release``."""
        raise NotImplementedError

    def run(self, *columns: ArrayLike, rng: np.random.Generator | None = None) -> DPRelease:
        """Aggregates in-memory columns and releases the DP value with its event."""
        total = self.aggregate(*(np.asarray(c) for c in columns))
        return DPRelease(self.release(total, rng), self.dp_event(), self.epsilon)


@dataclasses.dataclass(frozen=True)
class CountQuery(Query):
    """Number of records, with Laplace(1/ε) noise (sensitivity 1)."""

    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))

    def zero(self) -> np.ndarray:
        return np.zeros(1)

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        return np.array([float(len(np.asarray(columns[0])))])

    def release(self, total: np.ndarray, rng: np.random.Generator | None = None) -> Value:
        return LaplaceMechanism(self.epsilon, 1.0).add_noise(total[0], rng)

    def dp_event(self) -> dp_accounting.DpEvent:
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
        return LaplaceMechanism(self.epsilon, max(abs(self.lower), abs(self.upper)))

    def zero(self) -> np.ndarray:
        return np.zeros(1)

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        x = _values(columns[0])
        x = x[~np.isnan(x)]
        return np.array([np.clip(x, self.lower, self.upper).sum()])

    def release(self, total: np.ndarray, rng: np.random.Generator | None = None) -> Value:
        return self.mechanism.add_noise(total[0], rng)

    def dp_event(self) -> dp_accounting.DpEvent:
        return self.mechanism.dp_event()


def _noisy_means(centered_sums: np.ndarray, counts: np.ndarray, lower: float, upper: float,
                 epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Sage List. 1 mean: noisy centered sum / noisy count, each with half of ε.

    Centering on the midpoint halves the sum's sensitivity to (upper − lower)/2 (List. 1 uses the
    full value range). A noisy count below 1 is read as 1 and the mean is clipped to
    [lower, upper]; both are post-processing, free of privacy cost.
    """
    half = epsilon / 2.0
    noisy_counts = LaplaceMechanism(half, 1.0).add_noise(counts, rng)
    noisy_sums = LaplaceMechanism(half, (upper - lower) / 2.0).add_noise(centered_sums, rng)
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
        return np.zeros(2)

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        x = _values(columns[0])
        x = np.clip(x[~np.isnan(x)], self.lower, self.upper)
        midpoint = (self.lower + self.upper) / 2.0
        return np.array([(x - midpoint).sum(), float(x.size)])

    def release(self, total: np.ndarray, rng: np.random.Generator | None = None) -> Value:
        means = _noisy_means(total[:1], total[1:], self.lower, self.upper, self.epsilon, _rng(rng))
        return float(means[0])

    def dp_event(self) -> dp_accounting.DpEvent:
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
        return np.zeros(len(self.key_domain))

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        idx = _key_indices(columns[0], self.key_domain)
        return np.bincount(idx[idx >= 0], minlength=len(self.key_domain)).astype(np.float64)

    def release(self, total: np.ndarray, rng: np.random.Generator | None = None) -> Value:
        return LaplaceMechanism(self.epsilon, 1.0).add_noise(total, rng)

    def dp_event(self) -> dp_accounting.DpEvent:
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
        return LaplaceMechanism(self.epsilon, max(abs(self.lower), abs(self.upper)))

    def zero(self) -> np.ndarray:
        return np.zeros(len(self.key_domain))

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        idx = _key_indices(columns[0], self.key_domain)
        x = _values(columns[1])
        if x.shape != idx.shape:
            raise ValueError(f"{idx.size} keys but {x.size} values")
        keep = (idx >= 0) & ~np.isnan(x)
        return np.bincount(idx[keep], weights=np.clip(x[keep], self.lower, self.upper),
                           minlength=len(self.key_domain)).astype(np.float64)

    def release(self, total: np.ndarray, rng: np.random.Generator | None = None) -> Value:
        return self.mechanism.add_noise(total, rng)

    def dp_event(self) -> dp_accounting.DpEvent:
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
        return np.zeros(2 * len(self.key_domain))

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        idx = _key_indices(columns[0], self.key_domain)
        x = _values(columns[1])
        if x.shape != idx.shape:
            raise ValueError(f"{idx.size} keys but {x.size} values")
        keep = (idx >= 0) & ~np.isnan(x)
        midpoint = (self.lower + self.upper) / 2.0
        k = len(self.key_domain)
        sums = np.bincount(idx[keep], weights=np.clip(x[keep], self.lower, self.upper) - midpoint,
                           minlength=k)
        counts = np.bincount(idx[keep], minlength=k)
        return np.concatenate([sums, counts]).astype(np.float64)

    def release(self, total: np.ndarray, rng: np.random.Generator | None = None) -> Value:
        k = len(self.key_domain)
        return _noisy_means(total[:k], total[k:], self.lower, self.upper, self.epsilon, _rng(rng))

    def dp_event(self) -> dp_accounting.DpEvent:
        return _mean_event(self.epsilon, self.lower, self.upper)


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
    x = _values(x)
    x = x[~np.isnan(x)]
    idx = np.searchsorted(np.asarray(edges), x, side="right") - 1
    idx = np.clip(idx, 0, len(edges) - 2)
    return np.bincount(idx, minlength=len(edges) - 1).astype(np.float64)


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
        return np.zeros(len(self.bin_edges) - 1)

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        return _bin_counts(columns[0], self.bin_edges)

    def release(self, total: np.ndarray, rng: np.random.Generator | None = None) -> Value:
        return LaplaceMechanism(self.epsilon, 1.0).add_noise(total, rng)

    def dp_event(self) -> dp_accounting.DpEvent:
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
        beta = _check_positive(self.failure_probability, "failure_probability")
        if beta >= 1:
            raise InvalidPrivacyParameterError(
                f"failure_probability must lie in (0, 1), got {self.failure_probability!r}")
        object.__setattr__(self, "failure_probability", beta)

    @property
    def bin_edges(self) -> tuple[float, ...]:
        return tuple(float(e) for e in np.linspace(self.lower, self.upper, self.num_bins + 1))

    @property
    def threshold(self) -> float:
        """Noisy count a bin must exceed to count as non-empty."""
        scale = LaplaceMechanism(self.epsilon, 1.0).scale
        return scale * max(0.0, math.log(self.num_bins / (2.0 * self.failure_probability)))

    def zero(self) -> np.ndarray:
        return np.zeros(self.num_bins)

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        return _bin_counts(columns[0], self.bin_edges)

    def release(self, total: np.ndarray, rng: np.random.Generator | None = None) -> Value:
        noisy = np.asarray(LaplaceMechanism(self.epsilon, 1.0).add_noise(total, rng))
        occupied = np.flatnonzero(noisy > self.threshold)
        if occupied.size == 0:
            return np.array([self.lower, self.upper])
        edges = self.bin_edges
        return np.array([edges[occupied[0]], edges[occupied[-1] + 1]])

    def dp_event(self) -> dp_accounting.DpEvent:
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
        return tuple(float(e) for e in np.linspace(self.lower, self.upper, self.num_bins + 1))

    def zero(self) -> np.ndarray:
        return np.zeros(self.num_bins)

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        return _bin_counts(columns[0], self.bin_edges)

    def release(self, total: np.ndarray, rng: np.random.Generator | None = None) -> Value:
        noisy = np.asarray(LaplaceMechanism(self.epsilon, 1.0).add_noise(total, rng))
        counts = np.maximum(noisy, 0.0)
        qs = np.asarray(self.quantiles)
        mass = counts.sum()
        if mass <= 0:
            return self.lower + qs * (self.upper - self.lower)
        cumulative = np.cumsum(counts)
        targets = qs * mass
        bins = np.minimum(np.searchsorted(cumulative, targets, side="left"), self.num_bins - 1)
        before = cumulative[bins] - counts[bins]
        with np.errstate(divide="ignore", invalid="ignore"):
            fraction = np.where(counts[bins] > 0, (targets - before) / counts[bins], 0.0)
        edges = np.asarray(self.bin_edges)
        width = edges[1] - edges[0]
        return np.clip(edges[bins] + np.clip(fraction, 0.0, 1.0) * width, self.lower, self.upper)

    def dp_event(self) -> dp_accounting.DpEvent:
        return LaplaceMechanism(self.epsilon, 1.0).dp_event()


# --- numpy entry points -----------------------------------------------------------------------


def dp_count(x: ArrayLike, epsilon: float, *, rng: np.random.Generator | None = None) -> DPRelease:
    """DP number of records in ``x`` (Laplace, sensitivity 1).

    Returns:
      DPRelease with a float value.

    Raises:
      InvalidPrivacyParameterError: bad ε.
    """
    return CountQuery(epsilon).run(np.asarray(x), rng=rng)


def dp_sum(x: ArrayLike, lower: float, upper: float, epsilon: float, *,
           rng: np.random.Generator | None = None) -> DPRelease:
    """DP sum of ``x`` clipped to [lower, upper] (Laplace, sensitivity max(|lower|, |upper|)).

    Raises:
      InvalidPrivacyParameterError: bad ε or bounds.
    """
    return SumQuery(lower, upper, epsilon).run(x, rng=rng)


def dp_mean(x: ArrayLike, lower: float, upper: float, epsilon: float, *,
            rng: np.random.Generator | None = None) -> DPRelease:
    """DP mean of ``x`` clipped to [lower, upper]: sum and count noised separately (List. 1).

    Raises:
      InvalidPrivacyParameterError: bad ε or bounds.
    """
    return MeanQuery(lower, upper, epsilon).run(x, rng=rng)


def dp_group_by_count(keys: ArrayLike, key_domain: Sequence[Any], epsilon: float, *,
                      rng: np.random.Generator | None = None) -> DPRelease:
    """DP count per key of the public ``key_domain`` (keys outside it are dropped).

    Returns:
      DPRelease whose value is a float64 array aligned with ``key_domain`` (every key present).
    """
    return GroupByCountQuery(tuple(key_domain), epsilon).run(keys, rng=rng)


def dp_group_by_sum(keys: ArrayLike, values: ArrayLike, key_domain: Sequence[Any], lower: float,
                    upper: float, epsilon: float, *,
                    rng: np.random.Generator | None = None) -> DPRelease:
    """DP clipped sum per key of the public ``key_domain`` (keys outside it are dropped)."""
    return GroupBySumQuery(tuple(key_domain), lower, upper, epsilon).run(keys, values, rng=rng)


def dp_group_by_mean(keys: ArrayLike, values: ArrayLike, key_domain: Sequence[Any], lower: float,
                     upper: float, epsilon: float, *,
                     rng: np.random.Generator | None = None) -> DPRelease:
    """DP clipped mean per key of the public ``key_domain`` (Sage List. 1 ``dp_group_by_mean``).

    Returns:
      DPRelease whose value is a float64 array aligned with ``key_domain``.
    """
    return GroupByMeanQuery(tuple(key_domain), lower, upper, epsilon).run(keys, values, rng=rng)


def dp_histogram(x: ArrayLike, bin_edges: ArrayLike, epsilon: float, *,
                 rng: np.random.Generator | None = None) -> DPRelease:
    """DP counts per public bin (values outside the edges clipped into the outer bins)."""
    return HistogramQuery(check_bin_edges(bin_edges), epsilon).run(x, rng=rng)


def dp_min_max(x: ArrayLike, lower: float, upper: float, epsilon: float, *, num_bins: int = 100,
               failure_probability: float = 0.05,
               rng: np.random.Generator | None = None) -> DPRelease:
    """DP approximate (min, max) of ``x`` clipped to [lower, upper]; see :class:`MinMaxQuery`.

    Returns:
      DPRelease whose value is the float64 array [min, max].
    """
    return MinMaxQuery(lower, upper, epsilon, num_bins, failure_probability).run(x, rng=rng)


def dp_quantiles(x: ArrayLike, quantiles: Sequence[float], lower: float, upper: float,
                 epsilon: float, *, num_bins: int = 100,
                 rng: np.random.Generator | None = None) -> DPRelease:
    """DP quantiles of ``x`` clipped to [lower, upper]; see :class:`QuantilesQuery`.

    All quantiles come from one DP histogram, so asking for several costs ε once.
    """
    return QuantilesQuery(tuple(quantiles), lower, upper, epsilon, num_bins).run(x, rng=rng)
