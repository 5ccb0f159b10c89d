"""The paper's analytic claims (§III-D1, §IV), as functions the tests and the report check.

None of these is ever charged to the ledger. Adversaries II and III (Lemmas 1–3) are
*expectations over the server's coins* (and, for Lemma 3, a central-limit approximation): they
describe typical runs, not a worst-case guarantee. The ledger is charged the local-DP guarantee
against adversary I (:mod:`~sage_tfx.dnd.budget`).

**Lemma 3's constant.** The paper converts T accumulated Laplace(2γ/ε) noises (variance T·8γ²/ε²,
so σ_T = 2γ√(2T)/ε) into (ε_T, δ_T)-DP with Lemma 1 of Kenthapadi et al. (σ_T ≥
w·√(2(ln(1/2δ)+ε_T))/ε_T) and takes the ℓ₂ distance between adjacent updates as w = √2·γ. But
adjacent clipped averages a, a' ∈ [−1, 1] differ by up to 2 per weight, so w = 2γ — the same 2γ the
paper uses as the Laplace sensitivity. With w = 2γ the large-T result is ε_T ≈ ε·√(ln(1/2δ))/√T, not
ε·√(ln(1/2δ))/√(2T): the paper's bound is too small by √2 (at δ = 10⁻⁸, 4.2ε/√T instead of the
stated 3ε/√T). :func:`lemma3_epsilon` solves the quadratic exactly with w equal to the mechanism's
sensitivity (per weight for the feature unit, the L1 bound for the model unit, where ℓ₂ ≤ ℓ₁);
:func:`lemma3_epsilon_paper` keeps the paper's formula for comparison.
"""
from __future__ import annotations

import math
import random
from typing import Optional


def lemma1_expected_epsilon(epsilon: float, k: int) -> float:
    """Lemma 1: expected privacy loss against adversary II, (k − 1)/k · ε/2 (over server coins)."""
    return (k - 1) / k * epsilon / 2.0


def lemma2_fixation_probability(k: int) -> float:
    """Lemma 2: probability that an update eventually lives in all k instances, 1/k."""
    return 1.0 / k


def simulate_fixation(k: int, trials: int, rng: Optional[random.Random] = None) -> float:
    """Fraction of ``trials`` in which one marked update takes over all k instances under
    draw-and-discard (each instance carries the mark or not; a draw copies the drawn instance's
    mark into a uniformly replaced slot)."""
    rng = rng or random.Random()
    fixed = 0
    for _ in range(trials):
        marked = 1  # the update has just replaced one instance
        while 0 < marked < k:
            drawn_marked = rng.randrange(k) < marked
            replaced_marked = rng.randrange(k) < marked
            marked += int(drawn_marked) - int(replaced_marked)
        fixed += marked == k
    return fixed / trials


def lemma3_epsilon(epsilon: float, t: int, delta: float, *, w_over_b: Optional[float] = None
                   ) -> float:
    """ε_T against adversary III after T further noisy updates (Lemma 3, corrected constant).

    Solves σ_T·ε_T = w·√(2(ln(1/2δ) + ε_T)) exactly, with σ_T = √(2T)·b (the CLT variance of T
    Laplace(b) noises) and w = ε·b (the sensitivity; ``w_over_b`` overrides w/b). Reported only.
    """
    if t < 1 or not 0 < delta < 0.5:
        raise ValueError("need T >= 1 and 0 < delta < 1/2")
    r = (epsilon if w_over_b is None else w_over_b) / math.sqrt(2.0 * t)  # w / σ_T
    log_term = math.log(1.0 / (2.0 * delta))
    return r * r + math.sqrt(r ** 4 + 2.0 * r * r * log_term)


def lemma3_epsilon_paper(epsilon: float, t: int, delta: float) -> float:
    """Lemma 3 as stated: ε/√(2T)·√(ln(1/2δ)) (w = √2γ, large-T approximation)."""
    return epsilon / math.sqrt(2.0 * t) * math.sqrt(math.log(1.0 / (2.0 * delta)))


def adversary_table(epsilon: float, k: int, t: int, delta: float = 1e-8) -> dict:
    """The paper's §IV-A table with our Lemma 3: what each adversary faces (expectations for II
    and III). Adversary III combines Lemma 2 (the update survives with probability 1/k) with
    Lemma 3."""
    return {
        "I (channel listener, charged)": epsilon,
        "II (internal, expected)": lemma1_expected_epsilon(epsilon, k),
        "III (opportunistic, expected; paper)": lemma3_epsilon_paper(epsilon, t, delta) / k,
        "III (opportunistic, expected; corrected w)": lemma3_epsilon(epsilon, t, delta) / k,
    }
