"""DP mechanisms (Laplace, analytic Gaussian) and budget splitting.

The building blocks every DP statistic, validator and system of sage-tfx releases numbers with.
The statistics built on them are in :mod:`sage_tfx.dp.queries` (counts, sums, means, group-by
aggregates) and :mod:`sage_tfx.dp.histograms` (histograms, min/max, quantiles).

Privacy assumptions, stated once for every mechanism here:

* Sensitivities come from public clipping bounds, public key domains and public bin edges chosen
  *without looking at the data*.
* Noise comes from :mod:`sage_tfx.dp.noise`: OpenDP's Laplace / Gaussian samplers by default,
  which are not open to the floating-point attack of Mironov (CCS 2012). Counts get the same
  continuous Laplace: a discrete Laplace count has the same pure ε but a worse privacy-loss
  distribution (always ±ε), so ``LaplaceDpEvent`` would undercharge it under PLD accounting
  (dp_accounting has no discrete-Laplace event); the continuous sampler is exactly the event
  charged, for every accountant. The sampler's scale is the textbook calibration, raised by at most
  a few ulps where needed so that OpenDP's own privacy map of the sampler is ≤ the ε (ρ) of the
  DpEvent charged (:func:`secure_laplace_scale`, :func:`secure_gaussian_sigma`). Seeded numpy noise
  (``noise=SeededNoise(seed)``) is for experiments and tests only; it is never reachable from a
  component or pipeline.

This module imports no TensorFlow.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from decimal import Decimal
from typing import Any, Sequence, Union

import dp_accounting
import numpy as np
from scipy import special

from sage_tfx.dp import noise as noise_lib
from sage_tfx.dp.noise import SECURE, NoiseSource
from sage_tfx.ledger.accounting import check_delta, check_epsilon, check_positive, exact
from sage_tfx.errors import InvalidPrivacyParameterError

ArrayLike = Union[np.ndarray, Sequence[Any]]
Value = Union[float, np.ndarray]


# --- validation -------------------------------------------------------------------------------


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


def noise_source(noise: NoiseSource | None) -> NoiseSource:
    """``noise`` or, if None, OpenDP's samplers (:data:`sage_tfx.dp.noise.SECURE`).

    Raises:
      TypeError: anything but a noise source (e.g. a bare ``np.random.Generator``: wrap it in
        ``SeededNoise(rng=...)``, for experiments only).
    """
    if noise is None:
        return SECURE
    if not all(callable(getattr(noise, m, None)) for m in
               ("laplace", "gaussian", "discrete_laplace", "discrete_gaussian")):
        raise TypeError(f"noise must be a sage_tfx.dp.noise source (SECURE or SeededNoise), got "
                        f"{type(noise).__name__}")
    return noise


def _raise_until(scale: float, fits) -> float:
    """The smallest float ≥ ``scale`` (searched upwards ulp by ulp, then doubling) with ``fits``."""
    step = 1
    while not fits(scale):
        for _ in range(step):
            scale = math.nextafter(scale, math.inf)
        step *= 2
    return scale


@functools.lru_cache(maxsize=1024)
def secure_laplace_scale(epsilon: float, l1_sensitivity: float, *, integer: bool = False) -> float:
    """Scale of OpenDP's Laplace sampler (``integer``: discrete) whose map gives ≤ ``epsilon``.

    The textbook ``l1_sensitivity / epsilon``, raised by the few ulps OpenDP's map needs (it
    rounds its ε up), so the sampler that runs is ε-DP by OpenDP's own accounting, never more.
    """
    return _raise_until(
        l1_sensitivity / epsilon,
        lambda b: noise_lib.laplace_epsilon(b, l1_sensitivity, integer=integer) <= epsilon)


@functools.lru_cache(maxsize=1024)
def secure_gaussian_sigma(sigma: float, l2_sensitivity: float) -> float:
    """σ' ≥ ``sigma`` of OpenDP's Gaussian sampler whose zCDP ρ is ≤ that of N(0, σ²) at Δ.

    ρ = Δ²/(2σ²) is the zCDP of ``GaussianDpEvent(σ/Δ)``, the event charged; OpenDP's map rounds
    its ρ up, so σ is raised by the few ulps needed for the sampler to meet the charged ρ.
    """
    rho = l2_sensitivity ** 2 / (2.0 * sigma ** 2)
    return _raise_until(sigma, lambda s: noise_lib.gaussian_rho(s, l2_sensitivity) <= rho)


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
                           check_positive(self.l1_sensitivity, "l1_sensitivity"))

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

    @property
    def sampler_scale(self) -> float:
        """Scale OpenDP's continuous Laplace sampler runs with (:func:`secure_laplace_scale`)."""
        return secure_laplace_scale(self.epsilon, self.l1_sensitivity)

    def add_noise(self, value: ArrayLike | float, noise: NoiseSource | None = None) -> Value:
        """Returns ``value`` plus independent Laplace noise on every coordinate.

        Args:
          value: exact query answer (scalar or array).
          noise: noise source; None (always, in components and pipelines) is OpenDP.

        Returns:
          A float for a scalar ``value``, else a float64 array of the same shape.
        """
        return noise_source(noise).laplace(value, self.sampler_scale)

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
    sensitivity = check_positive(l2_sensitivity, "l2_sensitivity")

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
                           check_positive(self.l2_sensitivity, "l2_sensitivity"))
        object.__setattr__(self, "sigma",
                           analytic_gaussian_sigma(self.epsilon, self.delta, self.l2_sensitivity))

    @property
    def noise_multiplier(self) -> float:
        """sigma / l2_sensitivity, dp_accounting's and TF Privacy's parameter of the mechanism."""
        return self.sigma / self.l2_sensitivity

    @property
    def sampler_sigma(self) -> float:
        """σ OpenDP's Gaussian sampler runs with (:func:`secure_gaussian_sigma`, ≥ ``sigma``)."""
        return secure_gaussian_sigma(self.sigma, self.l2_sensitivity)

    def add_noise(self, value: ArrayLike | float, noise: NoiseSource | None = None) -> Value:
        """Returns ``value`` plus independent N(0, sigma²) noise on every coordinate.

        Args:
          value: exact query answer (scalar or array).
          noise: noise source; None (always, in components and pipelines) is OpenDP.

        Returns:
          A float for a scalar ``value``, else a float64 array of the same shape.
        """
        return noise_source(noise).gaussian(value, self.sampler_sigma)

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
    remainder. Summed the way the ledger sums (``sage_tfx.ledger.accounting.exact``: each float read
    as its shortest repr), the shares add up to exactly ``ε`` (and ``δ``), unless the remainder is
    not the shortest repr of any float, in which case the last share is the largest float below it
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
    checked = [check_positive(w, "weight") for w in weights]
    return tuple(BudgetShare(e, d) for e, d in zip(_split_exactly(epsilon, checked),
                                                    _split_exactly(delta, checked)))
