"""The null distribution of the spam check's statistics (:mod:`sage_tfx.dnd.spam`): per-weight
tails of honest noise, the bases an honest update may be built on, the per-check count limit and
the calibrated thresholds.

An honest update is u = B_j − γ·clip(G) + noise with j uniform (Laplace(b), or N(0, σ²) for the
gaussian unit); ignoring the small gradient step, every weight's exceedance probability is a
closed-form Laplace or normal tail, so the null is exact: a mixture over j of Poisson-binomial
counts, bounded by binomials (Hoeffding 1956), a product form for the max and a Student-t
prediction band (CLT over the d weights) for the mean, widened by the largest honest gradient
step. The tails of one base share their exponentials across the number of noises
(:func:`_band_tails`), and the max threshold is found in log scale from the previous calibration's
(:func:`smallest_level`): a recalibration costs a few tail evaluations, not a bracketing search.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np
from scipy import optimize, special

NOISES = ("laplace", "gaussian")


# P(X > a) = e^(−r)·poly(r), r = a/b ≥ 0, for X the sum of 1, 2 or 3 Laplace(0, b) noises.
_POLY = {1: lambda r: 0.5, 2: lambda r: 0.25 * (2.0 + r),
         3: lambda r: (8.0 + 5.0 * r + r * r) / 16.0}


def _two_sided_tail(lo: np.ndarray, hi: np.ndarray, b: float, terms: int = 1,
                    noise: str = "laplace") -> np.ndarray:
    """P(X < lo) + P(X > hi), elementwise (lo < hi), for X the sum of ``terms`` (1, 2 or 3)
    independent noises of scale ``b``. Laplace(0, b): with r = a/b ≥ 0, P(X > a) is e^(−r)/2,
    e^(−r)(2 + r)/4 and e^(−r)(8 + 5r + r²)/16 (integrating the densities of the sums).
    Gaussian N(0, b²): the sum is N(0, terms·b²), P(X > a) = Φ(−a / (b√terms))."""
    if noise == "gaussian":
        sd = b * math.sqrt(terms)
        return np.clip(special.ndtr(-hi / sd) + special.ndtr(lo / sd), 0.0, 1.0)
    poly = _POLY[terms]

    def upper(a):  # P(X > a)
        r = np.abs(a) / b
        tail = np.exp(-r) * poly(r)
        return np.where(a >= 0, tail, 1.0 - tail)
    return np.clip(upper(hi) + upper(-lo), 0.0, 1.0)


def noise_variance(noise_scale: float, noise: str) -> float:
    """Variance of one noise draw: 2b² (Laplace) or σ² (Gaussian)."""
    return (2.0 if noise == "laplace" else 1.0) * noise_scale ** 2


CALIBRATION_WEIGHTS = 2048  # weights sampled for the max-|z| calibration of large models
COUNT_WEIGHTS = 1024  # weights sampled for the per-check count limit of large models
# Below this many weights mean |u − B_j| of an honest update is too variable to spot copies:
# at d ≥ 50, "< b/2" is ≥ 3.5 standard deviations below its mean b.
COPY_CHECK_MIN_WEIGHTS = 50


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Calibrated thresholds: reject if count > ``max_count``, max|z| > ``max_z`` or
    |mean z| outside the null's two-sided ``mean_z`` band."""

    max_count: int
    max_z: float
    expected_count: float  # unused by the decision: kept for reports (the count limit)
    mean_z_low: float
    mean_z_high: float


def _components(offset: np.ndarray, sd: np.ndarray, stale_fraction: float,
                in_flight_fraction: float = 0.0):
    """The bases an honest update may have been built on, as (offset, sd, noises, weight).

    Without concurrent clients: a current instance plus one noise (1 − f), or, for instances
    replaced since the last calibration, a child of a calibrated one (two noises, f). With a
    share g of the instances replaced while updates were in flight, a part g in five equal parts:
    a child or grandchild of a current instance (two or three noises), or an instance replaced
    since it was drawn, seen against the other k − 1 (leave-one-out: offset·k/(k−1), spread
    √(((k−1)s² − offset²·k/(k−1))/(k−2))), with one to three noises. Only the current instances
    are used: no discarded model is kept.
    """
    k = offset.shape[0]
    f, g = float(stale_fraction), float(in_flight_fraction)
    out = [(offset, sd, 1, (1.0 - f) * (1.0 - g)), (offset, sd, 2, f * (1.0 - g))]
    if g > 0:
        loo_off = offset * (k / (k - 1))
        loo_var = ((k - 1) * sd ** 2 - offset ** 2 * (k / (k - 1))) / max(k - 2, 1)
        loo_sd = np.sqrt(np.maximum(loo_var, 1e-300))
        out += [(offset, sd, n, g / 5) for n in (2, 3)]
        out += [(loo_off, loo_sd, n, g / 5) for n in (1, 2, 3)]
    return [c for c in out if c[3] > 0]


def _bases(offset: np.ndarray, sd: np.ndarray, stale_fraction: float,
           in_flight_fraction: float = 0.0) -> list[tuple[np.ndarray, np.ndarray, dict]]:
    """:func:`_components` grouped by base: [(offset, sd, {noises: weight})], each distinct
    (offset, sd) pair once, so the tails of one base share their exponentials."""
    groups: list = []
    for off, s_, n, w in _components(offset, sd, stale_fraction, in_flight_fraction):
        for g_off, g_sd, terms in groups:
            if g_off is off and g_sd is s_:
                terms[n] = terms.get(n, 0.0) + w
                break
        else:
            groups.append((off, s_, {n: w}))
    return groups


def _band_tails(off: np.ndarray, sd: np.ndarray, m: float, a: float, b: float, terms,
                noise: str) -> dict:
    """{n: P(X_n outside [−m·sd − off + a, m·sd − off − a])} for each n in ``terms``, X_n the sum
    of n noises of scale ``b``: :func:`_two_sided_tail` for every n at once, the Laplace
    exponentials computed once (the same arithmetic, so the same values)."""
    hi = m * sd - off - a
    neg_lo = m * sd + off - a
    if noise == "gaussian":
        return {n: _two_sided_tail(-neg_lo, hi, b, n, noise) for n in terms}
    r_hi, r_lo = np.abs(hi) / b, np.abs(neg_lo) / b
    e_hi, e_lo = np.exp(-r_hi), np.exp(-r_lo)
    up_hi, up_lo = hi >= 0, neg_lo >= 0
    # The usual case (a band around every base's offset): each tail is e^(−r)·poly(r) ≤ 1/2,
    # so neither the sign switch nor the clip changes a value.
    inside = bool(up_hi.all() and up_lo.all())
    out = {}
    for n in terms:
        t_hi, t_lo = e_hi * _POLY[n](r_hi), e_lo * _POLY[n](r_lo)
        if inside:
            out[n] = t_hi + t_lo
        else:
            out[n] = np.clip(np.where(up_hi, t_hi, 1.0 - t_hi) + np.where(up_lo, t_lo, 1.0 - t_lo),
                             0.0, 1.0)
    return out


MAX_Z_XTOL = 0.01  # the max threshold's search tolerance (the threshold is never below the root)


def smallest_level(tail, alpha: float, start: float, *, hint: Optional[float] = None,
                   xtol: float = MAX_Z_XTOL) -> float:
    """The smallest m ≥ ``start`` with ``tail(m)`` ≤ ``alpha``, for ``tail`` decreasing in m:
    found in log scale (tails decay exponentially, so log tail is nearly linear) by brentq on a
    bracket around ``hint`` (else doubling from ``start``), and returned at most 2·xtol above
    the root, never below it (``tail`` of the result is ≤ ``alpha``)."""
    log_alpha = math.log(alpha)
    seen: dict = {}  # brentq evaluates the bracket's ends again

    def gap(t: float) -> float:
        if t not in seen:
            seen[t] = math.log(max(tail(t), 1e-300)) - log_alpha
        return seen[t]
    if hint is None or not hint > start:
        if gap(start) <= 0:
            return start
        lo, hi = start, 2.0 * start
        while gap(hi) > 0:
            lo, hi = hi, 2.0 * hi
    else:
        step = 0.02 * hint
        if gap(hint) <= 0:
            hi = hint
            while True:
                lo = max(start, hi - step)
                if gap(lo) > 0:
                    break
                if lo == start:
                    return start
                hi, step = lo, 2.0 * step
        else:
            lo, hi = hint, hint + step
            while gap(hi) > 0:
                lo, hi, step = hi, hi + step, 2.0 * step
    root = optimize.brentq(gap, lo, hi, xtol=xtol)
    return min(root + 2.0 * xtol, hi)


def count_limit(offset: np.ndarray, sd: np.ndarray, d: int, noise_scale: float, *, z: float,
                alpha: float, tail_shift: float = 0.0, stale_fraction: float = 0.0,
                in_flight_fraction: float = 0.0, noise: str = "laplace") -> int:
    """Largest honest count of weights with |z| > ``z`` at level ``alpha``, for instances whose
    offsets from the mean and spreads are ``offset`` (k, m) and ``sd`` (m,), m weights sampled
    out of ``d`` (all of them when m = d).

    Per base the count is Poisson-binomial with rates q_i, bounded by the binomial at their mean
    (Hoeffding 1956); the bases are :func:`_components`. A Student-t prediction bound over the
    bases' mean rates covers a base from the same population that is none of them; the larger
    limit is used.
    """
    k = offset.shape[0]
    a = float(tail_shift)
    rates, weights = [], []
    for off, s_, terms in _bases(offset, sd, stale_fraction, in_flight_fraction):
        tails = _band_tails(off, s_, z, a, noise_scale, terms, noise)
        for n, w in terms.items():
            rates.append(tails[n].mean(axis=1))
            weights.append(np.full(k, w / k))
    q, wt = np.concatenate(rates), np.concatenate(weights)

    def count_tail(c: int) -> float:
        return float(np.sum(wt * special.bdtrc(c, d, q)))
    mean_q = float(np.sum(wt * q))
    var_q = float(np.sum(wt * (q - mean_q) ** 2)) * k / (k - 1)
    spread = d * d * var_q * (1.0 + 1.0 / k) + d * float(np.sum(wt * q * (1 - q)))
    t_limit = min(d, int(math.ceil(d * mean_q
                                   + float(
                                       special.stdtrit(k - 1, 1.0 - alpha)) * math.sqrt(spread))))
    if count_tail(t_limit) <= alpha:
        return t_limit  # the mixture's own limit is no larger
    lo, hi = t_limit, d
    while lo < hi:  # smallest c with P(count > c) <= alpha
        mid = (lo + hi) // 2
        if count_tail(mid) <= alpha:
            hi = mid
        else:
            lo = mid + 1
    return lo


MAX_EXACT_WEIGHTS = CALIBRATION_WEIGHTS // 4  # the heaviest weights of the max tail, exactly


def max_tail_weights(offset: np.ndarray, sd: np.ndarray, level: float, noise_scale: float, *,
                     noise: str, stale_fraction: float, in_flight_fraction: float,
                     tail_shift: float,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(columns, scale) estimating Σ_i g(i) over all d weights as Σ scale·g(column): every
    weight when d ≤ CALIBRATION_WEIGHTS; else the :data:`MAX_EXACT_WEIGHTS` weights most likely
    to fall outside the ±``level``·s band (by their expected exceedances under the null's
    mixture, among the 4× as many whose farthest instance reaches nearest to it, against the
    others too) with scale 1,
    and a uniform sample of the others, each scaled by (others)/(sampled) — unbiased whatever
    the split. A uniform sample alone misses the few weights the max depends on (at 50,000
    weights the top 100 carry ~95 % of the sum): its thresholds let through ~4× the intended
    share of honest updates (measured at 50,000 weights)."""
    d = sd.size
    if d <= CALIBRATION_WEIGHTS:
        return np.arange(d), np.ones(d)
    # Candidates: the weights whose farthest instance reaches nearest to the band, against all k
    # or (an instance replaced in flight, :func:`_components`) against the other k − 1; among
    # them the heaviest by their expected exceedances at the level under the null's mixture.
    k = offset.shape[0]
    far = np.abs(offset).max(axis=0)
    reach = far - level * sd
    if in_flight_fraction > 0:
        loo_var = ((k - 1) * sd ** 2 - far ** 2 * (k / (k - 1))) / max(k - 2, 1)
        reach = np.maximum(reach, far * (k / (k - 1))
                           - level * np.sqrt(np.maximum(loo_var, 1e-300)))
    candidates = np.argpartition(-reach, 4 * MAX_EXACT_WEIGHTS)[:4 * MAX_EXACT_WEIGHTS]
    load = np.zeros(candidates.size)
    for off, s_, terms in _bases(offset[:, candidates], sd[candidates], stale_fraction,
                                 in_flight_fraction):
        tails = _band_tails(off, s_, level, tail_shift, noise_scale, terms, noise)
        for n, weight in terms.items():
            load += weight * tails[n].sum(axis=0)
    heavy = candidates[np.argpartition(-load, MAX_EXACT_WEIGHTS)[:MAX_EXACT_WEIGHTS]]
    rest = np.setdiff1d(np.arange(d), heavy, assume_unique=True)
    sampled = rng.choice(rest, CALIBRATION_WEIGHTS - MAX_EXACT_WEIGHTS, replace=False)
    scale = np.concatenate([np.ones(heavy.size), np.full(sampled.size, rest.size / sampled.size)])
    return np.concatenate([heavy, sampled]), scale


def calibrate(instances: np.ndarray, noise_scale: float, *, z: float = 3.0,
              false_reject: float = 0.005, max_step: float = 0.0,
              tail_shift: float = 0.0, stale_fraction: float = 0.0,
              in_flight_fraction: float = 0.0, noise: str = "laplace",
              max_z_hint: Optional[float] = None,
              rng: Optional[np.random.Generator] = None) -> Thresholds:
    """Thresholds with P(reject an honest update) ≤ ``false_reject`` given these instances.

    ``max_step`` bounds the drift of the mean z by the honest gradient step; ``tail_shift`` bounds
    each weight's step, and the per-weight tails are taken at the worst such shift (see
    :class:`SpamCheck`). ``stale_fraction`` is the share of instances that may have been replaced
    since this calibration; a replacement is a child B_j + Laplace of a calibrated instance, so an
    update built on it carries two noises: the tails are a mixture of the one- and two-noise cases.
    ``noise`` is the honest clients' noise, ``"laplace"`` (scale b) or ``"gaussian"`` (std σ).
    ``max_z_hint`` (the previous calibration's max threshold) only speeds up the search for the
    max threshold; the threshold found is the same up to :data:`MAX_Z_XTOL`, never below.
    ``rng`` picks the sampled weights of a large model (default: a fresh generator).
    """
    if noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
    if not 0 <= stale_fraction <= 1:
        raise ValueError("stale_fraction must be in [0, 1]")
    if not 0 < false_reject < 1:
        raise ValueError("false_reject must be in (0, 1)")
    if not noise_scale > 0:
        raise ValueError("noise_scale must be > 0")
    inst = np.asarray(instances, dtype=np.float64)
    k, d = inst.shape
    if k < 2:
        raise ValueError("the spam check needs k >= 2 instances")
    mu = inst.mean(axis=0)
    sd = inst.std(axis=0, ddof=1)
    if np.any(sd <= 0):
        raise ValueError("instances with zero spread: initialise them with (k/2)σ² (Theorem 1)")
    alpha = false_reject / 3.0
    offset = inst - mu  # (k, d): B_j − μ
    # The count tail needs per-weight means over d: past CALIBRATION_WEIGHTS weights it is
    # estimated on a uniform random subset (a mean of many terms).
    rng = np.random.default_rng() if rng is None else rng
    if d > CALIBRATION_WEIGHTS:
        pick = rng.choice(d, CALIBRATION_WEIGHTS, replace=False)
        sub_sd, sub_off = sd[pick], offset[:, pick]
    else:
        sub_sd, sub_off = sd, offset
    # Count statistic: per j, exceedance probabilities q_{j,i}; binomial(d, mean q_j) tail.
    a = float(tail_shift)
    f = float(stale_fraction)
    lo = count_limit(sub_off, sub_sd, d, noise_scale, z=z, alpha=alpha, tail_shift=a,
                     stale_fraction=f, in_flight_fraction=in_flight_fraction, noise=noise)

    # Max statistic: P(max|z| > m) = Σ_bases weight · [1 − Π_i (1 − q_i(m))], a sum over d
    # weights of log(1 − q_i) dominated by a few: estimated on the heaviest weights exactly and a
    # uniform sample of the rest (:func:`max_tail_weights`).
    cols, col_scale = max_tail_weights(offset, sd, max_z_hint or 3.0 * z, noise_scale,
                                       noise=noise, stale_fraction=f,
                                       in_flight_fraction=in_flight_fraction, tail_shift=a,
                                       rng=rng)
    bases = _bases(offset[:, cols], sd[cols], f, in_flight_fraction)

    def max_tail(m: float) -> float:
        out = 0.0
        for off, s_, terms in bases:
            tails = _band_tails(off, s_, m, a, noise_scale, terms, noise)
            for n, weight in terms.items():
                with np.errstate(divide="ignore"):  # a weight certain to exceed: log(0) = -inf
                    # (not a matrix product: BLAS's spinning threads cost more CPU than
                    # the product itself)
                    log_keep = np.sum(np.log1p(-tails[n]) * col_scale, axis=1)
                out += weight * float(np.mean(-np.expm1(log_keep)))
        return out
    m = smallest_level(max_tail, alpha, z, hint=max_z_hint)

    # Mean z (catches a small shift of every weight): for an update built on instance j it is
    # m_j + noise, m_j = mean((B_j − μ)/s), noise ≈ N(0, v) by the CLT, v = Σ var/s² / d². The
    # drawn instance may have been replaced meanwhile (concurrent clients), so j is treated as a
    # new draw from the instances' population: a Student-t prediction band with k − 1 degrees of
    # freedom around the m_j, widened by the largest honest gradient step ``max_step``.
    mj = (offset / sd).mean(axis=1)
    v = float(np.sum(noise_variance(noise_scale, noise) / sd ** 2)) / d ** 2
    scale = math.sqrt(float(np.var(mj, ddof=1)) * (1.0 + 1.0 / k) + v)
    half = float(special.stdtrit(k - 1, 1.0 - alpha / 2.0)) * scale
    low, high = float(mj.mean()) - half, float(mj.mean()) + half
    return Thresholds(int(lo), float(m), float(lo), float(low - max_step),
                      float(high + max_step))
