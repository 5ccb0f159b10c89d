"""The optimal (ε, δ) of p composed ε-bounded-range votes (Gumbel noisy-max), and its PLD.

A mechanism is ε-bounded range (ε-BR; Durfee & Rogers 2019) when, for every pair of neighbouring
inputs, its privacy loss L(y) = log(P(y)/Q(y)) lies in an interval [t − ε, t] of length ε, with
t ∈ [0, ε] depending on the pair. The exponential mechanism with utility sensitivity Δ and weights
exp(u/β) is (2Δ/β)-BR; the Gumbel vote of k partitions (β = k/λ, each count moves by at most k,
in either direction) is 2λ-BR.

**Worst case** (Dong, Durfee & Rogers 2020, "Optimal differential privacy composition for
exponential mechanisms", §3–5). For one pair, an ε-BR mechanism is dominated by the generalised
randomised response RR(t): two outcomes with privacy losses t and t − ε, the loss t having
probability a(t) = (e^ε − e^t)/(e^ε − 1) under P (so that E_P[e^−L] = 1). For the *non-adaptive*
composition of p ε-BR mechanisms the optimal δ(ε_g) is sup over one t of δ_t(ε_g), the δ of
RR(t) composed p times (the worst t's are all equal; the tests re-check this for p ≤ 3 by
enumerating heterogeneous (t_1, …, t_p)). Adaptively chosen mechanisms can lose more (DDR §6):
DP bagging's votes are non-adaptive — the public points, their order and the teachers are fixed
before the first vote is drawn, and no vote depends on an earlier answer. Swapping P and Q maps
RR(t) to RR(ε − t), so the family covers the add and the remove direction.

**The sup over t is a max over p candidates** (DDR's closed form; derivation kept here so it can
be checked). With i the number of low outcomes, L_i = p·t − i·ε and
δ_t(ε_g) = max_ℓ D_ℓ(t), D_ℓ(t) = Σ_{i≤ℓ} C(p, i)·P_i·(1 − e^{ε_g − L_i})
= Bin(p, x).cdf(ℓ) − e^{ε_g}·Bin(p, y).cdf(ℓ), where x = 1 − a(t) and y = x·e^{ε−t} are the
low outcome's P and Q probabilities (any subset of the terms is at most the sum of the positive
ones, and the set {i : L_i > ε_g} is such a prefix). dD_ℓ/dt has the sign of
e^{ε_g + (ℓ+1)ε − p·t} − e^t, so D_ℓ rises then falls, with its maximum on [0, ε] at
t_ℓ = clip((ε_g + (ℓ+1)·ε)/(p + 1), 0, ε). Hence sup_t δ_t(ε_g) = max_ℓ D_ℓ(t_ℓ): exactly the
maximum over the finite grid {t_ℓ} — no t between grid points can be worse. D_ℓ(t_ℓ) is evaluated
for all ℓ at once with binomial CDFs (scipy), O(p).

**dp_accounting.** At the maximising t the p-fold composition of RR(t) is also built as a
privacy-loss distribution with ``PrivacyLossDistribution.create_from_rounded_probability``
(pessimistic) and ``self_compose``; the losses t − j·ε are written ε·(u − j) with u = t/ε, so the
per-query PLD {0: a, −1: 1 − a} at ``value_discretization_interval = ε`` needs no rounding, its
composition is shifted by ⌊p·u⌋ grid steps (composing with a one-point PLD) and the remaining
fraction f·ε < ε is subtracted from ε_g. The δ returned is the larger of the closed form and that
PLD's δ, so a floating-point slip in either errs upwards.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["rr_high_mass", "rr_pld", "candidates", "delta", "epsilon"]


def rr_high_mass(eps_br: float, t):
    """a(t): P-probability of RR(t)'s loss t (its other outcome has loss t − ε)."""
    return np.clip((np.expm1(eps_br) - np.expm1(t)) / np.expm1(eps_br), 0.0, 1.0)


def rr_pld(eps_br: float, t: float, queries: int):
    """(PLD, f): dp_accounting's PLD of RR(t) composed ``queries`` times, shifted down by f·ε_br
    (0 ≤ f < 1): δ(ε_g) = PLD.get_delta_for_epsilon(ε_g − f·ε_br)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    make = pld_lib.PrivacyLossDistribution.create_from_rounded_probability
    a = float(rr_high_mass(eps_br, t))
    one = make({k: m for k, m in ((0, a), (-1, 1.0 - a)) if m > 0}, 0.0, eps_br,
               pessimistic_estimate=True)
    composed = one.self_compose(int(queries)) if queries > 1 else one
    shift = queries * t / eps_br
    whole = math.floor(shift)
    if whole:
        composed = composed.compose(make({whole: 1.0}, 0.0, eps_br, pessimistic_estimate=True))
    return composed, (shift - whole) * eps_br


def candidates(eps_br: float, queries: int, eps_g: float, ell=None):
    """(t_ℓ, D_ℓ(t_ℓ)) for ℓ = 0 … p − 1 (or the given ``ell``): the grid on which
    sup_t δ_t(ε_g) is attained (with ℓ = p, whose D_p = 1 − e^{ε_g} does not depend on t)."""
    from scipy import special

    p = int(queries)
    ell = np.arange(p) if ell is None else np.asarray(ell)
    t = np.clip((eps_g + (ell + 1) * eps_br) / (p + 1), 0.0, eps_br)
    x = 1.0 - rr_high_mass(eps_br, t)                            # P(low outcome)
    y = np.clip(x * np.exp(eps_br - t), 0.0, 1.0)                # Q(low outcome)
    with np.errstate(invalid="ignore"):
        F = np.where(x >= 1.0, 0.0, np.where(x <= 0.0, 1.0, special.bdtr(ell, p, x)))
        G = np.where(y >= 1.0, 0.0, np.where(y <= 0.0, 1.0, special.bdtr(ell, p, y)))
    return t, F - math.exp(eps_g) * G


CHUNK = 1 << 20      # candidates per batch: memory stays bounded for p up to the 10^7 limit


def _closed(eps_br, queries, eps_g):
    best, best_t = -math.inf, eps_br
    for start in range(0, int(queries), CHUNK):
        t, d = candidates(eps_br, queries, eps_g, np.arange(start, min(start + CHUNK, queries)))
        i = int(np.argmax(d))
        if d[i] > best:
            best, best_t = float(d[i]), float(t[i])
    # ℓ = p (every term) is D_p = 1 − e^{ε_g} at any t: it matters for ε_g < 0 only
    return max(0.0, best, -math.expm1(eps_g)), best_t


def delta(eps_br: float, queries: int, eps_g: float) -> float:
    """The optimal δ at ε_g of ``queries`` non-adaptive ε_br-BR mechanisms (an upper bound by
    at most floating-point error: the larger of the closed form and the PLD at its argmax)."""
    if queries == 0:
        return 0.0
    d, t = _closed(eps_br, queries, eps_g)
    pld, frac = rr_pld(eps_br, t, queries)
    return max(d, float(pld.get_delta_for_epsilon(eps_g - frac)))


def epsilon(eps_br: float, queries: int, delta_target: float, *, rel_tol: float = 1e-6) -> float:
    """The smallest ε (to ``rel_tol``, rounded up) with :func:`delta` ≤ δ: an upper bound on the
    optimal ε at δ of ``queries`` non-adaptive ε_br-BR mechanisms. δ = 0 gives p·ε_br."""
    if queries == 0:
        return 0.0
    hi = queries * eps_br                  # no loss exceeds p·ε: δ(hi) = 0
    if delta_target <= 0:
        return hi
    lo = 0.0
    if _closed(eps_br, queries, lo)[0] <= delta_target:
        hi = lo
    while hi - lo > rel_tol * max(hi, 1e-12):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if _closed(eps_br, queries, mid)[0] <= delta_target else (mid, hi)
    while delta(eps_br, queries, hi) > delta_target:    # the PLD check, errs upwards
        hi += rel_tol * max(hi, 1e-12)
    return hi
