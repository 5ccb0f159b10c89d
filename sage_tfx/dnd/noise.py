"""Float-safe Gaussian noise for whole vectors, ~1,000× faster per weight than OpenDP's calls.

OpenDP's samplers (:mod:`sage_tfx.dp.noise`) are exact but cost 20–110 µs per coordinate; a
50,000-weight model update took seconds. :func:`gaussian_vector` releases the same kind of output
(input rounded onto a power-of-two grid plus discrete Gaussian noise on that grid, as OpenDP does)
with the discrete Gaussian drawn **exactly** by inversion of its cumulative distribution: a
cumulative distribution table (CDT, the sampler of lattice cryptography: Peikert 2010; FrodoKEM,
Bos et al. CCS 2016) answers almost every draw, vectorised with numpy, and the rare draw the table
cannot decide is finished with exact arithmetic.

The mechanism, for values x ∈ ℝᵈ, L2 sensitivity Δ and noise std σ:

* grid g = 2^⌊log₂(σ/s*)⌋ with s* = max(1024, 64·(σ/Δ)·√d): the discrete noise has std s = σ/g ≥ s*;
* q = round(x / g) (exact: g is a power of two), an integer vector whose L2 sensitivity is at most
  Δ_ℤ = Δ/g + √d (each coordinate's rounding moves it by ≤ 1/2 on either side);
* z ~ 𝒩_ℤ(0, s²) per coordinate, P(z) = e^{−z²/2s²} / Σ_{k∈ℤ} e^{−k²/2s²} for every integer z
  (the discrete Gaussian, Canonne, Kamath & Steinke 2020, "CKS");
* output g·(q + z): every output is a grid point, exactly representable, reachable from every input
  alike, so the low bits carry nothing (Mironov, CCS 2012).

σ is raised so that the noise multiplier against the *rounded* sensitivity is the one asked for,
s = m·Δ_ℤ (:func:`sampler_grid`; by construction g√d ≤ Δ/64, so σ grows by at most 1.6 %).

**The draw is exact.** z is the inverse CDF of u ~ U[0, 1): the z with F(z − 1) ≤ u < F(z),
F(z) = P(Z ≤ z). u's first 128 bits U come from ``os.urandom``. The table holds, for |z| ≤ τ
(P(|Z| > τ) < 2⁻⁹⁶), F(z) rounded to 128 bits, each within ``E`` units of 2⁻¹²⁸ of the true
value: proved bounds, computed in integer fixed point at 192 bits (:func:`_cdf_bounds`: every
product and quotient rounded outward, every error term carried). A draw whose U lies more than E
from both neighbouring entries is decided by the table (U fixes z for every continuation of u's
bits). Otherwise — a tie on the high word, u within E·2⁻¹²⁸ of a boundary, or u in a tail beyond
the table, together about 2⁻⁶² × (table entries) per coordinate — :func:`_invert` reads 64 more
bits of u at a time and brackets F with more bits until one z is certain. Every z has its exact
probability; no tail is cut and nothing is redrawn.

**Privacy.** (rdp streams) For integers μ, ν, D_α(𝒩_ℤ(μ, s²) ‖ 𝒩_ℤ(ν, s²)) ≤ α(μ − ν)²/(2s²) at
every order α > 1 (CKS Prop. 5: the shifted theta sum Σ_x e^{−(x−c)²/2s²} is largest at c = 0);
the d coordinates are independent, so the Rényi divergences add, and for adjacent inputs
‖q − q'‖₂ ≤ Δ_ℤ = s/m gives D_α ≤ α/(2m²): exactly the RDP that dp_accounting gives
``GaussianDpEvent(m)``. That event is therefore a proved charge for this sampler at every order
of the ledger's grid (scaling by g and rounding are post-processing and preprocessing of the
input). A table sampler with cut tails has bounded support, so *its* Rényi divergence between
adjacent inputs is infinite at every order; this one has the full support of 𝒩_ℤ.
(basic streams) The discrete Gaussian's (ε, δ) curve is the continuous one's with ε moved by at
most τ_d (CKS Thm. 15; a term of order d·e^{−2π²s²}, far below 10⁻¹⁰⁰ at s ≥ 1024); a caller
calibrates the Gaussian at ε − :data:`SAMPLER_EPSILON` (which covers τ_d) and δ·(1 −
:data:`SAMPLER_DELTA_SHARE`). The exact sampler spends no δ of its own (:func:`sampler_delta` is
0); the δ share is kept so that m, and the events stored in ledgers, stay what they were.
Randomness: 128 bits per coordinate from ``os.urandom`` (the OS CSPRNG), 64 more per extension.

Seeded experiments (:class:`~sage_tfx.dp.noise.SeededNoise`) keep numpy's continuous normals.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import math
import os
from fractions import Fraction

import numpy as np

from sage_tfx.errors import InvalidPrivacyParameterError

SAMPLER_EPSILON = 1e-5  # covers the discrete Gaussian's ε term against the continuous one
SAMPLER_DELTA_SHARE = 1e-3  # share of δ the callers leave beside the Gaussian (unused: exact)
MAX_DIM = 10 ** 6
MIN_DISCRETE_STD = 1024.0
GRID_FRACTION = 64.0  # g·√d ≤ Δ / GRID_FRACTION
_BITS = 128  # bits of u per coordinate in the table look-up
_WORK_BITS = 192  # fixed-point bits of the table's bounds (64 guard bits below the 128)
_TABLE_TAIL_BITS = 96  # the table reaches τ with P(|Z| > τ) < 2^-96


@dataclasses.dataclass(frozen=True)
class Grid:
    """The discretisation of one (σ, Δ, d): grid step, the discrete noise's std in grid units."""

    step: float  # g, a power of two
    discrete_std: float  # s = σ / g
    sigma: float  # σ the sampler adds (≥ the requested one)


def _positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(value)) or float(value) <= 0:
        raise InvalidPrivacyParameterError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


@functools.lru_cache(maxsize=256)
def sampler_grid(noise_multiplier: float, l2_sensitivity: float, dim: int) -> Grid:
    """The grid and σ for noise multiplier m = σ/Δ against the rounded sensitivity Δ + g√d."""
    m = _positive(noise_multiplier, "noise_multiplier")
    delta = _positive(l2_sensitivity, "l2_sensitivity")
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_DIM:
        raise ValueError(f"dim must be an integer in [1, {MAX_DIM}], got {dim!r}")
    target = max(MIN_DISCRETE_STD, GRID_FRACTION * m * math.sqrt(dim))
    sigma = m * delta
    for _ in range(64):  # g grows with σ, σ with g: a fixed point within a step or two
        step = 2.0 ** math.floor(math.log2(sigma / target))
        need = m * (delta + step * math.sqrt(dim))
        if need <= sigma:
            return Grid(step, sigma / step, sigma)
        sigma = need
    raise RuntimeError("sampler grid did not converge")  # pragma: no cover


def sampler_delta(noise_multiplier: float, l2_sensitivity: float, dim: int) -> float:
    """Extra δ of the sampler beyond the Gaussian mechanism's: 0, the draw being exact (module
    docstring). The parameters are validated as :func:`sampler_grid` does."""
    sampler_grid(noise_multiplier, l2_sensitivity, dim)
    return 0.0


# --- exact bounds of the discrete Gaussian's CDF ------------------------------------------------

def _exp_neg(x: Fraction, bits: int) -> tuple[int, int]:
    """(L, E) with L ≤ 2^bits·e^{−x} ≤ L + E, for a rational 0 ≤ x ≤ 1.

    Alternating Taylor series in integers: each term t̃ₙ = ⌊t̃ₙ₋₁·x/n⌋ is below the true one by at
    most n units, and the series' remainder after the first zero term is below that term's error
    (the terms decrease for x ≤ 1)."""
    if not 0 <= x <= 1:
        raise ValueError("x must lie in [0, 1]")  # pragma: no cover - internal
    p, q = x.numerator, x.denominator
    term = total = 1 << bits
    n = err = 0
    while term:
        n += 1
        term = term * p // (q * n)
        total += -term if n % 2 else term
        err += n
    err += n  # the remainder
    return total - err, 2 * err


def _cdf_bounds(s: float, bits: int) -> tuple[list[int], list[int], int]:
    """Proved bounds of F(z) = P(Z ≤ z), Z ~ 𝒩_ℤ(0, s²), in units of 2^-bits.

    Returns (lo, hi, K): lo[i] ≤ 2^bits·F(i − K − 1) ≤ hi[i] for i = 0 … 2K + 1 (z from −K − 1
    to K), both non-decreasing in i. With ρ(k) = e^{−ak²}, a = 1/(2s²) (exact rational):
    T(j) = Σ_{k≥j} ρ(k), N = 1 + 2T(1), F(z) = T(−z)/N for z < 0 and 1 − T(z + 1)/N for z ≥ 0.
    ρ(k + 1) = ρ(k)·β(k), β(k) = e^{−a(2k+1)}, β(k + 1) = β(k)·e^{−2a}: every fixed-point product
    is rounded down and its error carried (+ the factors' errors + 2 units); the sum is cut where
    ρ's lower bound reaches its error, and the rest bounded by the geometric series of ratio β(K).
    """
    a = Fraction(1, 2) / Fraction(s) ** 2
    one = 1 << bits
    beta, e_beta = _exp_neg(a, bits)
    gam, e_gam = _exp_neg(2 * a, bits)
    rho, err = [one], [0]
    r, er, b, eb = one, 0, beta, e_beta
    while r > er:
        r, er = (r * b) >> bits, er + eb + 2
        b, eb = (b * gam) >> bits, eb + e_gam + 2
        rho.append(r)
        err.append(er)
    big_k = len(rho) - 1  # ρ(K) ≤ 2·err(K): the tail beyond K is below the precision carried
    ratio_hi = b + eb  # β(K + 1) ≥ every later ratio ρ(k + 1)/ρ(k)
    if ratio_hi >= one:
        raise RuntimeError("discrete Gaussian tail bound failed")  # pragma: no cover
    # Σ_{k>K} ρ(k) ≤ ρ(K)·β(K)/(1 − β(K)) ≤ (ρ̃(K) + e)·β̃/(one − β̃), rounded up
    rest = -(-(rho[-1] + err[-1]) * ratio_hi // (one - ratio_hi))
    t_lo, t_hi = [0] * (big_k + 2), [0] * (big_k + 2)  # T(j) for j = 0 … K + 1
    t_hi[big_k + 1] = rest
    for j in range(big_k, -1, -1):
        t_lo[j] = t_lo[j + 1] + rho[j]
        t_hi[j] = t_hi[j + 1] + rho[j] + err[j]
    n_lo, n_hi = one + 2 * t_lo[1], one + 2 * t_hi[1]
    # 1/N as fixed-point bounds (2^2bits / N, rounded down and up): products instead of quotients
    inv_lo, inv_hi = (one * one) // n_hi, -(-(one * one) // n_lo)
    mask = one - 1
    lo = [(t_lo[j] * inv_lo) >> bits for j in range(big_k + 1, 0, -1)]  # z = −K − 1 … −1
    hi = [((t_hi[j] * inv_hi) >> bits) + (((t_hi[j] * inv_hi) & mask) > 0)
          for j in range(big_k + 1, 0, -1)]
    for j in range(1, big_k + 2):  # z = j − 1 = 0 … K: F = 1 − T(z + 1)/N
        up = t_hi[j] * inv_hi
        lo.append(one - (up >> bits) - ((up & mask) > 0))
        hi.append(one - ((t_lo[j] * inv_lo) >> bits))
    return lo, hi, big_k


_slow_bounds = functools.lru_cache(maxsize=4)(_cdf_bounds)


def _tau(s: float) -> int:
    """The table's reach τ: P(|Z| > τ) < 2^-96 (a normal-tail bound, e^{−τ²/2s²} ≤ 2^-96)."""
    return int(math.ceil(s * math.sqrt(2.0 * _TABLE_TAIL_BITS * math.log(2.0))))


@functools.lru_cache(maxsize=16)
def _table(s: float) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The CDT of 𝒩_ℤ(0, s²): C(z) ≈ 2^128·F(z) for z = −τ − 1 … τ as (hi, lo) uint64 words,
    the error bound E (|2^128·F(z) − C(z)| ≤ E for every entry) and τ."""
    lo, hi, big_k = _cdf_bounds(s, _WORK_BITS)
    tau = _tau(s)
    if tau + 1 > big_k:
        raise RuntimeError("table reach beyond the bounds")  # pragma: no cover
    shift = _WORK_BITS - _BITS
    half = 1 << (shift - 1)
    cum, worst = [], 0
    for i in range(big_k - tau, big_k + tau + 2):  # z = −τ − 1 … τ
        c = (lo[i] + hi[i] + 2 * half) >> (shift + 1)  # the midpoint, rounded to 128 bits
        worst = max(worst, abs(hi[i] - (c << shift)), abs((c << shift) - lo[i]))
        cum.append(c)
    bound = -(-worst >> shift) + 1  # ⌈worst⌉ in 2^-128 units, and one more
    if cum[-1] >= 1 << _BITS or bound >= 1 << 62:
        raise RuntimeError("CDT table out of range")  # pragma: no cover - F(τ) < 1 − 2^-96
    words_hi = np.array([c >> 64 for c in cum], dtype=np.uint64)
    words_lo = np.array([c & ((1 << 64) - 1) for c in cum], dtype=np.uint64)
    return words_hi, words_lo, bound, tau


def _random_words(n: int) -> tuple[np.ndarray, np.ndarray]:
    raw = np.frombuffer(os.urandom(16 * n), dtype=np.uint64)
    return raw[:n], raw[n:]


def _more_bits() -> int:
    """64 further bits of a coordinate's u (the rare extension of :func:`_invert`)."""
    return int.from_bytes(os.urandom(8), "little")


def _invert(s: float, v: int, bits: int) -> int:
    """The exact inverse CDF at u = (v + r)·2^-bits, r ∈ [0, 1) the bits of u not read yet: more
    bits are read, 64 at a time, and F bracketed 64 bits finer than u, until one z is certain."""
    while True:
        lo, hi, big_k = _slow_bounds(float(s), bits + 64)
        u_lo, u_hi = v << 64, (v + 1) << 64
        i = bisect.bisect_left(lo, u_hi)  # the first z with F(z) ≥ every continuation of u
        if 1 <= i < len(lo) and hi[i - 1] <= u_lo:
            return i - big_k - 1
        v, bits = (v << 64) | _more_bits(), bits + 64


def _decide(s: float, hi: np.ndarray, lo: np.ndarray, bound: int, tau: int, u: int) -> int:
    """One draw the vectorised pass left open: the table's exact 128-bit answer if U is more than
    E from both entries around it, else :func:`_invert`."""
    def entry(j):
        return (int(hi[j]) << 64) | int(lo[j])
    a, b = 0, hi.size  # first index whose entry exceeds u
    while a < b:
        mid = (a + b) // 2
        if entry(mid) > u:
            b = mid
        else:
            a = mid + 1
    if 0 < a < hi.size and u - entry(a - 1) >= bound and entry(a) - u >= bound + 1:
        return a - tau - 1
    return _invert(s, u, _BITS)


def discrete_gaussian_noise(n: int, s: float) -> np.ndarray:
    """n exact draws of 𝒩_ℤ(0, s²) (inverse CDF: table look-up, exact completion; OS
    randomness), as int64. s ≥ 1."""
    if not s >= 1.0:
        raise ValueError(f"the discrete Gaussian sampler needs s >= 1, got {s!r}")
    hi, lo, bound, tau = _table(float(s))
    u_hi, u_lo = _random_words(n)
    # the first entry whose high word exceeds u's; the needles searched in sorted order (numpy
    # narrows each search from the previous one: cache friendly)
    order = np.argsort(u_hi)
    idx = np.empty(n, dtype=np.int64)
    idx[order] = np.searchsorted(hi, u_hi[order], side="right")
    inner = (idx > 0) & (idx < hi.size)
    prev = hi[np.maximum(idx - 1, 0)]
    nxt = hi[np.minimum(idx, hi.size - 1)]
    # decided by the high words alone: u is ≥ 2^64 > E above the entry before and below the one
    # after (so no tie, and no bound to check)
    safe = inner & (u_hi - prev >= 2) & (nxt - u_hi >= 2)
    out = idx.astype(np.int64) - (tau + 1)
    for i in np.nonzero(~safe)[0]:
        out[i] = _decide(s, hi, lo, bound, tau, (int(u_hi[i]) << 64) | int(u_lo[i]))
    return out


def gaussian_vector(values: np.ndarray, noise_multiplier: float, l2_sensitivity: float, *,
                    max_extra_delta: float = 0.0) -> np.ndarray:
    """``values`` (a flat vector of d floats) released with Gaussian noise of noise multiplier m
    against L2 sensitivity Δ: exact discrete Gaussian noise of std s = m·(Δ/g + √d) grid steps,
    so ``GaussianDpEvent(m)``'s RDP holds at every order, and (ε + SAMPLER_EPSILON, δ)-DP wherever
    the continuous Gaussian mechanism with σ = m·Δ is (ε, δ)-DP. Per-coordinate std:
    ``sampler_grid(m, Δ, d).sigma`` (:func:`noise_std`).

    Args:
      max_extra_delta: δ the caller left for the sampler (≥ :func:`sampler_delta`, i.e. ≥ 0).
    Raises:
      InvalidPrivacyParameterError: m or Δ not finite and > 0, or ``max_extra_delta`` negative
        or not a number.
      ValueError: values not a finite 1-D vector of at most MAX_DIM, or too large for the grid.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError("values must be a non-empty flat vector of finite floats")
    grid = sampler_grid(noise_multiplier, l2_sensitivity, x.size)
    extra = sampler_delta(noise_multiplier, l2_sensitivity, x.size)
    if isinstance(max_extra_delta, bool) or not isinstance(max_extra_delta, (int, float)) \
            or not extra <= max_extra_delta:
        raise InvalidPrivacyParameterError(
            f"max_extra_delta must be a number >= {extra}, got {max_extra_delta!r}")
    if float(np.max(np.abs(x))) >= 2.0 ** 50 * grid.step:
        raise ValueError("values too large for the noise grid (|x| / g >= 2^50)")
    scaled = x / grid.step  # exact: a power of two
    q = np.rint(scaled).astype(np.int64)
    z = discrete_gaussian_noise(x.size, grid.discrete_std)
    return (q + z).astype(np.float64) * grid.step


def noise_std(noise_multiplier: float, l2_sensitivity: float, dim: int) -> float:
    """The std of the noise :func:`gaussian_vector` adds per coordinate: g·s = σ (≥ m·Δ, ≤ 1.6 %
    more; 𝒩_ℤ(0, s²)'s variance is s² up to a relative e^{−2π²s²}, nothing in double precision)."""
    return sampler_grid(noise_multiplier, l2_sensitivity, dim).sigma


def table_size(noise_multiplier: float, l2_sensitivity: float, dim: int) -> int:
    """Entries of the sampler's table for these parameters (for reports)."""
    g = sampler_grid(noise_multiplier, l2_sensitivity, dim)
    return 2 * _tau(g.discrete_std) + 2


__all__ = ["SAMPLER_EPSILON", "SAMPLER_DELTA_SHARE", "MAX_DIM", "Grid", "sampler_grid",
           "sampler_delta", "gaussian_vector", "noise_std",
           "discrete_gaussian_noise", "table_size"]
