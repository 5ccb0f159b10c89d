"""Bounds of SLAed DP validation (Sage §3.3, List. 2): DP-noise corrections and Bernstein bounds.

Vectorized (scalars or arrays) so the validators of :mod:`sage_tfx.dp.validation` and the
evaluation harnesses (thousands of simulated runs) compute the same numbers. Step (2) of a Sage
validator, the *correction for DP impact*, is :func:`laplace_upper_tail` (one Laplace release) or
:func:`laplace_sum_upper_tail` (a sum of per-block releases); step (3) is Bernstein's inequality
(:func:`bernstein_upper_bound`, :func:`bernstein_lower_bound`); :func:`sage_loss_upper_bound` and
friends chain them as List. 2 does. Pure numpy/SciPy; no TensorFlow.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numpy.typing import ArrayLike


def laplace_upper_tail(scale: ArrayLike, eta: ArrayLike) -> np.ndarray:
    """The t with P[Z > t] = η for Z ~ Laplace(0, scale), η < 1/2 (§3.3: t = scale·ln(1/(2η))).

    Args:
      scale: Laplace scale b (> 0).
      eta: one-sided tail probability in (0, 1/2).

    Returns:
      ``scale * log(1 / (2 * eta))``; e.g. List. 2 lines 13-14 and 17-18 use η/3, i.e.
      ``(2/ε)·log(3/(2η))`` for the count and ``(2B/ε)·log(3/(2η))`` for the loss sum.
    """
    return np.asarray(scale, dtype=np.float64) * np.log(1.0 / (2.0 * np.asarray(eta, np.float64)))


@functools.lru_cache(maxsize=4096)
def _unit_laplace_sum_tail(k: int, eta: float) -> float:
    """The t with P[S > t] = η for S the sum of k i.i.d. Laplace(0, 1) variables (k ≥ 2).

    S = G₁ − G₂ with G₁, G₂ i.i.d. Gamma(k, 1), so P[S > t] = ∫ f_Γ(g)·P[G₁ > t + g] dg
    (numerical quadrature over the range where Gamma(k) has its mass). The tail decreases in t; the
    root is bracketed and the returned t is the bracket's upper end, so P[S > t] ≤ η up to the
    quadrature error (relative 1e-10).
    """
    from scipy import integrate, optimize, stats  # pylint: disable=import-outside-toplevel

    gamma = stats.gamma(k)
    # Gamma(k, 1) has mean and variance k; outside k ± (12√k + 40) its mass is below 1e-25, so
    # the finite range keeps quadrature on the peak without losing anything that matters.
    lo, hi_g = max(0.0, k - 12.0 * math.sqrt(k) - 40.0), k + 12.0 * math.sqrt(k) + 40.0

    def tail(t: float) -> float:
        value, _ = integrate.quad(lambda g: gamma.pdf(g) * gamma.sf(t + g), lo, hi_g,
                                  epsabs=0.0, epsrel=1e-10, limit=400)
        return value

    hi = math.sqrt(2.0 * k) * 2.0 + math.log(1.0 / eta) * 2.0
    while tail(hi) > eta:
        hi *= 2.0
    root, result = optimize.brentq(lambda t: tail(t) - eta, 0.0, hi, xtol=1e-10, rtol=1e-12,
                                   full_output=True)
    if not result.converged:  # pragma: no cover - brentq on a bracketed monotone function
        raise ArithmeticError(f"no Laplace-sum quantile for k={k}, eta={eta}")
    return float(root) + 2e-10 + 4e-12 * abs(root)


def laplace_sum_upper_tail(scale: ArrayLike, blocks: ArrayLike, eta: float) -> np.ndarray:
    """The t with P[S > t] ≤ η for S the sum of ``blocks`` i.i.d. Laplace(0, scale) draws.

    What a DP statistic released *per block* and then summed must be corrected by (query-level
    accounting, Sage §3.2 and Fig. 7): each of k blocks adds its own Laplace noise. k = 1 is
    exactly :func:`laplace_upper_tail`; k ≥ 2 uses the exact distribution of the sum (a
    difference of two Gamma(k) variables), so the correction is as tight as the noise allows.

    Args:
      scale: Laplace scale b of each block's draw (> 0).
      blocks: number of blocks k (integer ≥ 1; scalar or array broadcasting with ``scale``).
      eta: one-sided tail probability in (0, 1/2).

    Returns:
      The quantile, ``scale`` times that of the unit-scale sum.
    """
    eta = float(eta)
    if not 0.0 < eta < 0.5:
        raise ValueError(f"eta must lie in (0, 1/2), got {eta!r}")
    k = np.asarray(blocks)
    if k.size and (not np.all(np.equal(np.mod(k, 1), 0)) or np.any(k < 1)):
        raise ValueError(f"blocks must be integers >= 1, got {blocks!r}")
    k = k.astype(np.int64)
    unit = np.vectorize(lambda kk: math.log(1.0 / (2.0 * eta)) if kk == 1
                        else _unit_laplace_sum_tail(int(kk), eta), otypes=[np.float64])(k)
    return np.asarray(scale, dtype=np.float64) * unit


def bernstein_upper_bound(loss: ArrayLike, n: ArrayLike, eta: ArrayLike,
                          loss_bound: float) -> np.ndarray:
    """Bernstein upper bound on the expected loss (List. 2 lines 23-25, with B in the last term).

    For i.i.d. losses in ``[0, B]`` with mean μ and empirical mean ``loss`` over ``n`` examples,
    with probability ≥ 1 − η::

        μ ≤ loss + sqrt(2·B·loss·ln(1/η)/n) + 4·B·ln(1/η)/n

    Derivation: Bernstein gives μ ≤ X̄ + sqrt(2σ²L/n) + 2BL/(3n) with L = ln(1/η); the variance
    of a [0, B] variable is σ² ≤ Bμ. Solving the quadratic in sqrt(μ) and bounding the square
    roots gives μ ≤ X̄ + sqrt(2BLX̄/n) + (8/3 + 2/√3)·BL/n, and 8/3 + 2/√3 ≈ 3.82 ≤ 4.
    List. 2 line 25 prints the last term as ``4*log(1/eta)/n``: that is this bound for B = 1
    (the paper's configuration, List. 1 line 30). For B > 1 the printed term has the wrong units
    and is too small, so the factor B is kept here; for B = 1 the two are identical.

    The bound increases with ``loss`` and decreases with ``n``, which is what lets List. 2 plug
    in an upper bound on the loss and a lower bound on n.

    Args:
      loss: empirical (or corrected DP) mean loss; negative values are treated as 0.
      n: number of examples; ``n ≤ 0`` gives ``inf``.
      eta: failure probability in (0, 1).
      loss_bound: B, the loss range ``[0, B]``.

    Returns:
      The upper bound (float array; ``inf`` where n ≤ 0).
    """
    loss = np.maximum(np.asarray(loss, dtype=np.float64), 0.0)
    n = np.asarray(n, dtype=np.float64)
    log_term = np.log(1.0 / np.asarray(eta, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = (loss + np.sqrt(2.0 * loss_bound * loss * log_term / n)
                 + 4.0 * loss_bound * log_term / n)
    return np.where(n > 0, bound, np.inf)


def bernstein_lower_bound(loss: ArrayLike, n: ArrayLike, eta: ArrayLike,
                          loss_bound: float) -> np.ndarray:
    """Bernstein lower bound on the expected loss (the mirror of List. 2 lines 23-25).

    With probability ≥ 1 − η, μ ≥ X̄ − sqrt(2σ²L/n) − 2BL/(3n) with σ² ≤ Bμ and L = ln(1/η).
    With a = sqrt(2BL/n) and c = X̄ − 2BL/(3n) this reads μ + a·sqrt(μ) ≥ c, whose exact
    solution is μ ≥ ((sqrt(a² + 4c) − a)/2)² when c > 0 (and μ ≥ 0 otherwise). The bound
    increases with both ``loss`` and ``n``.

    Args:
      loss: empirical (or corrected DP) mean loss.
      n: number of examples; ``n ≤ 0`` gives 0.
      eta: failure probability in (0, 1).
      loss_bound: B, the loss range ``[0, B]``.

    Returns:
      The lower bound (float array, ≥ 0).
    """
    loss = np.asarray(loss, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    log_term = np.log(1.0 / np.asarray(eta, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        a_sq = 2.0 * loss_bound * log_term / n
        c = loss - 2.0 * loss_bound * log_term / (3.0 * n)
        root = (np.sqrt(a_sq + 4.0 * np.maximum(c, 0.0)) - np.sqrt(a_sq)) / 2.0
        bound = np.where(c > 0, root * root, 0.0)
    return np.where(n > 0, bound, 0.0)


def sage_loss_upper_bound(dp_loss_sum: ArrayLike, n_test_dp: ArrayLike, *, epsilon: float,
                          eta: float, loss_bound: float,
                          blocks: ArrayLike = 1) -> dict[str, np.ndarray]:
    """Sage's DP upper bound on the expected loss: List. 2 lines 11-25, the ACCEPT test.

    With the count noise Laplace(2/ε) and the loss-sum noise Laplace(2B/ε) (lines 12 and 16):

    * lines 13-14: ``n_test_dp_min = n_test_dp − (2/ε)·ln(3/(2η))`` ≤ n w.p. ≥ 1 − η/3;
    * lines 17-18: ``corrected = dp_loss_sum + (2B/ε)·ln(3/(2η))`` ≥ the true sum w.p. ≥ 1 − η/3;
    * lines 19-21: ``bernstein_upper_bound(corrected / n_test_dp_min, n_test_dp_min, η/3, B)``.

    On the intersection of the first two events corrected / n_min ≥ the empirical mean, and the
    Bernstein bound is monotone (see ``bernstein_upper_bound``), so by the union bound the result
    is ≥ the expected loss w.p. ≥ 1 − η (Proposition 3.1).

    Args:
      dp_loss_sum: the DP sum of clipped losses.
      n_test_dp: the DP count.
      epsilon: the ε of the whole (count + sum) release.
      eta: the ACCEPT test's failure probability (validate() passes (1 − conf)/2, line 3).
      loss_bound: B.
      blocks: 1 for Sage's combined release. k > 1 when the count and the sum were released per
        block (query-level accounting, Fig. 7) and added up: each carries k independent Laplace
        draws, and both corrections become :func:`laplace_sum_upper_tail` of k draws.

    Returns:
      dict with ``upper_bound``, ``n_test_dp_min`` and ``corrected_dp_loss_sum``.
    """
    if np.all(np.asarray(blocks) == 1):
        count_correction = laplace_upper_tail(2.0 / epsilon, eta / 3.0)
        sum_correction = laplace_upper_tail(2.0 * loss_bound / epsilon, eta / 3.0)
    else:
        count_correction = laplace_sum_upper_tail(2.0 / np.asarray(epsilon, np.float64), blocks,
                                                  eta / 3.0)
        sum_correction = laplace_sum_upper_tail(
            2.0 * loss_bound / np.asarray(epsilon, np.float64), blocks, eta / 3.0)
    n_min = np.asarray(n_test_dp, dtype=np.float64) - count_correction
    corrected = np.asarray(dp_loss_sum, dtype=np.float64) + sum_correction
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(n_min > 0, corrected / n_min, np.inf)
    upper = bernstein_upper_bound(mean, n_min, eta / 3.0, loss_bound)
    return {"upper_bound": upper, "n_test_dp_min": n_min, "corrected_dp_loss_sum": corrected}


def sage_loss_lower_bound(dp_loss_sum: ArrayLike, n_test_dp: ArrayLike, *, epsilon: float,
                          eta: float, loss_bound: float) -> dict[str, np.ndarray]:
    """Sage's DP lower bound on the expected loss: the REJECT test (mirror of List. 2).

    The paper defers REJECT to its technical report [31]; this is the direct mirror of the ACCEPT
    test, with the failure probability η split in three:

    * count, two-sided (η/3): |Laplace(2/ε)| ≤ t_n = (2/ε)·ln(3/η), so
      ``n_test_dp_min = n_test_dp − t_n`` ≤ n ≤ ``n_test_dp_max = n_test_dp + t_n``;
    * loss sum, one-sided (η/3): ``corrected = dp_loss_sum − (2B/ε)·ln(3/(2η))`` ≤ the true sum;
    * Bernstein lower bound (η/3) at mean ``max(corrected, 0) / n_test_dp_max`` (≤ the empirical
      mean on the events above) and sample size ``n_test_dp_min`` (≤ n).

    ``bernstein_lower_bound`` increases with the mean and with n, so plugging in values that are
    below the true ones keeps it below the expected loss: the result is ≤ μ w.p. ≥ 1 − η. Both
    sides of the count are needed because the mean wants a large n and the deviation a small one.

    Args:
      dp_loss_sum: the DP sum of clipped losses.
      n_test_dp: the DP count.
      epsilon: the ε of the whole (count + sum) release.
      eta: the REJECT test's failure probability (validate() passes (1 − conf)/2, line 5).
      loss_bound: B.

    Returns:
      dict with ``lower_bound``, ``n_test_dp_min``, ``n_test_dp_max`` and
      ``corrected_dp_loss_sum``.
    """
    count_correction = (2.0 / epsilon) * np.log(3.0 / eta)
    sum_correction = laplace_upper_tail(2.0 * loss_bound / epsilon, eta / 3.0)
    n_test_dp = np.asarray(n_test_dp, dtype=np.float64)
    n_min = n_test_dp - count_correction
    n_max = n_test_dp + count_correction
    corrected = np.asarray(dp_loss_sum, dtype=np.float64) - sum_correction
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(n_max > 0, np.maximum(corrected, 0.0) / n_max, 0.0)
    lower = bernstein_lower_bound(mean, n_min, eta / 3.0, loss_bound)
    return {"lower_bound": lower, "n_test_dp_min": n_min, "n_test_dp_max": n_max,
            "corrected_dp_loss_sum": corrected}


def uc_dp_loss_upper_bound(dp_loss_sum: ArrayLike, n_test_dp: ArrayLike, *, eta: float,
                           loss_bound: float) -> np.ndarray:
    """Tab. 2 "UC DP SLA": List. 2 without the correction for DP impact (lines 13-14, 17-18).

    Bernstein (η/3, as in line 21) on the *uncorrected* DP mean and DP count. Not a valid bound:
    the DP noise can push it below the expected loss far more often than η.
    """
    n_test_dp = np.asarray(n_test_dp, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(n_test_dp > 0, np.asarray(dp_loss_sum, np.float64) / n_test_dp, np.inf)
    return bernstein_upper_bound(mean, n_test_dp, eta / 3.0, loss_bound)


def np_loss_upper_bound(loss_sum: ArrayLike, n: ArrayLike, *, eta: float,
                        loss_bound: float) -> np.ndarray:
    """Tab. 2 "NP SLA": Bernstein at η on the exact (non-private) mean loss. Not DP."""
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(n > 0, np.asarray(loss_sum, np.float64) / n, np.inf)
    return bernstein_upper_bound(mean, n, eta, loss_bound)
