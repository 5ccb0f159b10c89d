"""Float-safe Laplace noise for whole vectors (the L1 units), vectorised with numpy.

OpenDP's float Laplace (:mod:`sage_tfx.dp.noise`, the reference) is exact but costs ~100 µs per
coordinate. :func:`laplace_vector` releases the same kind of output — the input rounded onto a
power-of-two grid plus a discrete Laplace (two-sided geometric) on that grid, as OpenDP does — with
every coordinate's noise drawn from a fixed 32 bytes of ``os.urandom`` by an exact decomposition
and a 64-bit cumulative table, like :mod:`sage_tfx.dnd.noise`'s Gaussian.

The mechanism, for values x ∈ ℝᵈ, L1 sensitivity Δ and the ε to deliver:

* grid g = 2^⌊log₂ min(Δ/(64·d), Δ·ln2/(1024·ε))⌋ (so d·g ≤ Δ/64 and the period below is ≥ 1024);
* q = rint(x / g) (exact: g is a power of two); adjacent inputs give ‖q − q'‖₁ ≤ Δ/g + d (each
  coordinate's rounding adds at most 1);
* the period T = ⌈(Δ/g + d)·ln 2 / (ε − SAMPLER_EPSILON)⌉ (an integer ≤ :data:`MAX_PERIOD` = 2²⁴)
  and p = 2^(−1/T): the discrete Laplace 𝓛_ℤ(p) with P(z) = (1 − p)/(1 + p)·p^|z| (scale
  t = T/ln 2 grid steps), drawn as z = G₁ − G₂ of two independent geometrics
  P(G = m) = (1 − p)pᵐ (exact: the difference of two i.i.d. geometrics is two-sided geometric);
* each geometric as G = T·A + R (exact, as p^T = 1/2): A ~ Geometric(1/2) is the number of trailing
  zero bits of a uniform 64-bit word (a zero word continues with a fresh one: memoryless, exact;
  probability 2⁻⁶⁴), and R ∈ [0, T) with P(R = r) ∝ pʳ is drawn by inversion of a cumulative table
  of 64-bit counts (a word at or past the table's total is redrawn: exact conditioning on the
  table's distribution);
* output g·(q + z): every output is a grid point reachable from every input (Mironov, CCS 2012).

**Privacy (the bound, proved).** For the exact 𝓛_ℤ(p), P(z)/P(z') = p^(|z|−|z'|) ≤ 2^(|z−z'|/T), so
the d coordinates together lose at most ‖q − q'‖₁·ln2/T ≤ (Δ/g + d)·ln2/T ≤ ε − SAMPLER_EPSILON.
The table stores each P(R = r) as a count c_r = ⌊2^(−r/T)·K⌋ from float64 (relative error
≤ 2⁻⁴⁵: exp2 and two roundings) with one common K = (1 − 2⁻⁴⁰)·2⁶⁴/fsum(2^(−r/T)), so Σc < 2⁶⁴; as
P(R = r) ≥ 1 − p ≥ 0.69/T (for T ≥ 78; the grid makes T ≥ 1024) and T ≤ 2²⁴, every count is
≥ 2³⁹·⁴, so the truncation's relative error
is ≤ 2⁻³⁹·⁴ and the drawn P̂(r) = c_r/Σc equals P(r)·ρ_r·κ with one common κ and
ρ_r ∈ [1 − η, 1 + η], η = 2⁻³⁹. Then
every geometric has P̂_G(m) = P_G(m)·ρ·κ with ρ in the same range (A is exact), and
P̂(z) = Σ_m P̂_G(m + z)·P̂_G(m) ∈ P(z)·κ²·[(1 − η)², (1 + η)²], so a coordinate's privacy loss
exceeds the exact one by at most 2·ln((1 + η)/(1 − η)) ≤ 4.01·η, and the vector's by
d·4.01·2⁻³⁹ ≤ 7.3·10⁻⁶ < SAMPLER_EPSILON for d ≤ :data:`MAX_DIM` = 10⁶. No output has probability
zero for one input and not for another (the noise's support is all of ℤ), so there is no δ: the
release is ε-DP, **pure**, for the ε passed in (:func:`sampler_epsilon` returns the bound). An
ε-DP mechanism satisfies (α, min(ε, αε²/2))-RDP for every α, which is exactly the RDP curve
dp_accounting gives ``LaplaceDpEvent(1/ε)``: the sampler is covered on basic and rdp streams alike.

Δ bounds the L1 distance of the float vectors passed in. Randomness: 32 bytes per coordinate
(2⁻⁶⁴-rare continuations and ≈ 2⁻⁴⁰-rare redraws aside). Noise std: g·√(2p)/(1 − p), at most
1.6 % + 0.1 % above √2·Δ/ε (:func:`noise_std`).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os

import numpy as np

from sage_tfx.dnd.noise import _positive  # the same parameter check as the Gaussian sampler
from sage_tfx.errors import InvalidPrivacyParameterError

SAMPLER_EPSILON = 1e-5  # ≥ d·4.01·2⁻³⁹ for d ≤ MAX_DIM: the table's relative error in the loss
MAX_DIM = 10 ** 6
MAX_PERIOD = 1 << 24  # T: table entries (≤ 128 MiB); keeps every count ≥ 2³⁹·⁴
MIN_PERIOD = 1024  # the grid is fine enough that T ≥ this (noise ≤ 0.1 % above its target)
GRID_FRACTION = 64.0  # d·g ≤ Δ / GRID_FRACTION
_LN2 = math.log(2.0)
_GUARD = 1.0 + 1e-12  # covers float rounding in the ε bound's own arithmetic
_HEADROOM = 1.0 - 2.0 ** -40  # total < 2⁶⁴ whatever float64 rounding adds (fsum: ≤ 2⁻⁵³)


@dataclasses.dataclass(frozen=True)
class LaplaceGrid:
    """The discretisation of one (Δ, ε, d): grid step g, period T (p = 2^(−1/T))."""

    step: float
    period: int
    epsilon: float  # the proved bound (:func:`sampler_epsilon`)

    @property
    def p(self) -> float:
        """The grid's geometric ratio p = 2^(−1/T)."""
        return 2.0 ** (-1.0 / self.period)

    @property
    def std(self) -> float:
        """The noise std per coordinate: g·√(2p)/(1 − p)."""
        p = self.p
        return self.step * math.sqrt(2.0 * p) / -math.expm1(-_LN2 / self.period)


@functools.lru_cache(maxsize=256)
def laplace_grid(l1_sensitivity: float, epsilon: float, dim: int) -> LaplaceGrid:
    """The grid and period that make :func:`laplace_vector` ε-DP against L1 sensitivity Δ.

    Raises:
      InvalidPrivacyParameterError: Δ or ε not finite and > 0, ε ≤ SAMPLER_EPSILON, or a table
        beyond MAX_PERIOD entries (ε too small for this many weights).
      ValueError: dim not an integer in [1, MAX_DIM].
    """
    delta = _positive(l1_sensitivity, "l1_sensitivity")
    eps = _positive(epsilon, "epsilon")
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_DIM:
        raise ValueError(f"dim must be an integer in [1, {MAX_DIM}], got {dim!r}")
    eps_m = eps - SAMPLER_EPSILON
    if eps_m <= 0:
        raise InvalidPrivacyParameterError(
            f"epsilon must exceed the sampler's {SAMPLER_EPSILON}, got {epsilon!r}")
    step = 2.0 ** math.floor(math.log2(min(delta / (GRID_FRACTION * dim),
                                           delta * _LN2 / (MIN_PERIOD * eps))))
    shift = delta / step + dim  # ‖q − q'‖₁ bound in grid steps (Δ/g exact: g a power of two)
    period = math.ceil(shift * _LN2 * _GUARD / eps_m)
    if period > MAX_PERIOD:
        raise InvalidPrivacyParameterError(
            f"epsilon={epsilon!r} at {dim} weights needs a Laplace table of {period} entries "
            f"(more than {MAX_PERIOD}): use a larger epsilon or fewer weights")
    bound = shift * _LN2 / period * _GUARD + SAMPLER_EPSILON
    if bound > eps:  # pragma: no cover - the ceiling above rules it out
        raise RuntimeError("Laplace sampler calibration failed")
    return LaplaceGrid(step, period, bound)


def sampler_epsilon(l1_sensitivity: float, epsilon: float, dim: int) -> float:
    """The proved ε of :func:`laplace_vector` (≤ ``epsilon``): (Δ/g + d)·ln2/T + SAMPLER_EPSILON."""
    return laplace_grid(l1_sensitivity, epsilon, dim).epsilon


def noise_std(l1_sensitivity: float, epsilon: float, dim: int) -> float:
    """Per-coordinate std of :func:`laplace_vector`'s noise (the nominal is √2·Δ/ε)."""
    return laplace_grid(l1_sensitivity, epsilon, dim).std


def max_scale_ratio(epsilon: float) -> float:
    """Upper bound of (the sampler's scale t·g) / (Δ/ε) for any Δ and d (for spam-check nulls):
    T ≤ (Δ/g + d)·ln2·G/(ε − SAMPLER_EPSILON) + 1 with d·g ≤ Δ/64 and g/ln2 ≤ Δ/(1024·ε).
    The ratio falls with ε, so the per-weight ε of the feature unit bounds it too."""
    eps = _positive(epsilon, "epsilon")
    if eps <= SAMPLER_EPSILON:
        raise InvalidPrivacyParameterError(
            f"epsilon must exceed the sampler's {SAMPLER_EPSILON}, got {epsilon!r}")
    return ((1.0 + 1.0 / GRID_FRACTION) * _GUARD * eps / (eps - SAMPLER_EPSILON)
            + 1.0 / MIN_PERIOD) * (1.0 + 1e-9)


@functools.lru_cache(maxsize=8)
def remainder_table(period: int) -> tuple[np.ndarray, int]:
    """Cumulative 64-bit counts of R ∈ [0, T) with P(R = r) ∝ 2^(−r/T), and their total (< 2⁶⁴)."""
    if isinstance(period, bool) or not isinstance(period, int) or not 1 <= period <= MAX_PERIOD:
        raise ValueError(f"period must be an integer in [1, {MAX_PERIOD}], got {period!r}")
    w = np.exp2(-np.arange(period, dtype=np.float64) / period)
    counts = np.floor(w * (_HEADROOM * 2.0 ** 64 / math.fsum(w))).astype(np.uint64)
    cum = np.cumsum(counts, dtype=np.uint64)
    if period > 1 and not bool(np.all(cum[1:] > cum[:-1])):  # pragma: no cover - wrapped
        raise RuntimeError("Laplace table overflows 64 bits")
    return cum, int(cum[-1])


def _random_words(n: int) -> np.ndarray:
    """n uniform 64-bit words from the OS CSPRNG."""
    return np.frombuffer(os.urandom(8 * n), dtype=np.uint64)


def _trailing_zeros(w: np.ndarray) -> np.ndarray:
    """Trailing zero bits of nonzero uint64 words (the lowest set bit is a power of two, exact in
    float64)."""
    low = w & (~w + np.uint64(1))
    return np.log2(low.astype(np.float64)).astype(np.int64)


def _geometric(a_words: np.ndarray, r_words: np.ndarray, period: int) -> np.ndarray:
    """G = T·A + R from one word for A and one for R per draw (exact; rare extra words)."""
    cum, total = remainder_table(period)
    a = np.zeros(a_words.size, dtype=np.int64)
    todo, words = np.arange(a_words.size), a_words
    while todo.size:
        zero = words == 0
        ok = ~zero
        a[todo[ok]] += _trailing_zeros(words[ok])
        a[todo[zero]] += 64  # all 64 bits zero: A ≥ 64, memoryless: continue with a fresh word
        todo = todo[zero]
        words = _random_words(todo.size) if todo.size else words
    r = np.empty(r_words.size, dtype=np.int64)
    todo, words = np.arange(r_words.size), r_words
    while todo.size:
        order = np.argsort(words)   # sorted needles: numpy narrows each search from the last
        idx = np.empty(todo.size, dtype=np.int64)
        idx[order] = np.searchsorted(cum, words[order], side="right")
        ok = idx < period   # u ≥ total: outside the table's mass, redraw (exact conditioning)
        r[todo[ok]] = idx[ok]
        todo = todo[~ok]
        words = _random_words(todo.size) if todo.size else words
    return period * a + r


def discrete_laplace_noise(n: int, period: int) -> np.ndarray:
    """n draws of 𝓛_ℤ(p = 2^(−1/T)) (P(z) ∝ p^|z|) from 32 bytes of ``os.urandom`` each, int64."""
    raw = _random_words(4 * n)
    return _geometric(raw[:n], raw[n:2 * n], period) - _geometric(raw[2 * n:3 * n], raw[3 * n:],
                                                                  period)


def laplace_vector(values: np.ndarray, l1_sensitivity: float, epsilon: float) -> np.ndarray:
    """``values`` (a flat vector of d floats) released with Laplace noise: ε-DP (pure) against L1
    sensitivity Δ (:func:`sampler_epsilon` ≤ ε, proved in the module docstring).

    Raises:
      InvalidPrivacyParameterError: Δ or ε not finite and > 0, or too small an ε for d weights.
      ValueError: values not a finite 1-D vector of at most MAX_DIM, or too large for the grid.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
        raise ValueError("values must be a non-empty flat vector of finite floats")
    grid = laplace_grid(l1_sensitivity, epsilon, x.size)
    if float(np.max(np.abs(x))) >= 2.0 ** 50 * grid.step:
        raise ValueError("values too large for the noise grid (|x| / g >= 2^50)")
    q = np.rint(x / grid.step).astype(np.int64)  # x / g exact: g is a power of two
    z = discrete_laplace_noise(x.size, grid.period)
    return (q + z).astype(np.float64) * grid.step


__all__ = ["SAMPLER_EPSILON", "MAX_DIM", "MAX_PERIOD", "LaplaceGrid", "laplace_grid",
           "sampler_epsilon", "noise_std", "max_scale_ratio", "remainder_table",
           "discrete_laplace_noise", "laplace_vector"]
