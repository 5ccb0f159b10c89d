"""Black-box privacy audits: empirical lower bounds on ε from adjacent inputs (numpy only).

A mechanism M claims (ε, δ)-DP. For adjacent inputs a, b and any output event E,
``P[M(a) ∈ E] ≤ e^ε · P[M(b) ∈ E] + δ``. Running M many times on a and on b and bounding both
probabilities with Clopper–Pearson intervals gives, with confidence ``1 − alpha``,

    ε ≥ ln((p̲_a − δ) / p̄_b)

(p̲_a the lower bound on P[M(a) ∈ E], p̄_b the upper bound on P[M(b) ∈ E]). A *correct* mechanism
keeps this below its claimed ε except with probability ≤ alpha; a broken one (a sensitivity
halved, noise drawn at the wrong scale, a floating-point leak) pushes it above. This is the
StatDP / DP-Sniper recipe (Ding et al. 2018; Bichsel et al. 2021): :func:`audit_mechanism` picks
the event (a threshold on a scalar statistic of the output, in either direction) on one half of
the runs and certifies it on the other half, so choosing the event costs no confidence.

:func:`textbook_laplace_reachable` is the floating-point attack of Mironov (CCS 2012) against
numpy's Laplace sampler: it decides whether a double ``y`` is an output ``x + Laplace(scale)`` of
numpy's textbook sampler at input ``x`` by inverting the sampler and checking the neighbouring
grid points of its uniform draw exactly. Outputs at one input are mostly unreachable from an
adjacent input, whatever ε is claimed.

Privacy audits give lower bounds only: passing one is evidence, not a proof. This module imports
no TensorFlow.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import numpy as np
from scipy import stats

from sage_tfx.errors import InvalidPrivacyParameterError

__all__ = ["AuditResult", "audit_mechanism", "clopper_pearson", "epsilon_lower_bound",
           "textbook_laplace_reachable"]

_TWO53 = 9007199254740992.0


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """Exact two-sided ``1 − alpha`` confidence interval of a binomial proportion.

    Raises:
      ValueError: trials < 1, successes outside [0, trials], alpha outside (0, 1).
    """
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, trials >= 1; got {successes}/{trials}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    lo = 0.0 if successes == 0 else float(stats.beta.ppf(alpha / 2, successes,
                                                         trials - successes + 1))
    hi = 1.0 if successes == trials else float(stats.beta.ppf(1 - alpha / 2, successes + 1,
                                                              trials - successes))
    return lo, hi


def epsilon_lower_bound(hits_a: int, runs_a: int, hits_b: int, runs_b: int, *,
                        delta: float = 0.0, alpha: float = 0.05) -> float:
    """ε lower bound ``ln((p̲_a − δ) / p̄_b)`` holding with confidence ``1 − alpha`` (≥ 0).

    Each proportion gets a Clopper–Pearson interval at ``alpha / 2`` (one side of each is used),
    so the bound holds with probability ≥ 1 − alpha.
    """
    if not 0.0 <= delta < 1.0:
        raise InvalidPrivacyParameterError(f"delta must lie in [0, 1), got {delta!r}")
    p_a, _ = clopper_pearson(hits_a, runs_a, alpha)
    _, p_b = clopper_pearson(hits_b, runs_b, alpha)
    if p_a - delta <= 0.0:
        return 0.0
    return max(0.0, math.log((p_a - delta) / p_b))


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """One black-box audit of a mechanism on one pair of adjacent inputs.

    Attributes:
      claimed_epsilon: the ε the mechanism (its DpEvent) claims.
      epsilon_lower_bound: certified lower bound on the true ε (confidence 1 − alpha).
      event: the certified event, e.g. ``"stat(a) >= 3.2"``.
      hits_a, hits_b, runs: the event's counts on the certification half.
      alpha: the confidence parameter.
    """

    claimed_epsilon: float
    epsilon_lower_bound: float
    event: str
    hits_a: int
    hits_b: int
    runs: int
    alpha: float

    @property
    def passed(self) -> bool:
        """True iff the empirical lower bound stays at or below the claimed ε."""
        return self.epsilon_lower_bound <= self.claimed_epsilon

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "passed": self.passed}


def _threshold_events(sel_a: np.ndarray, sel_b: np.ndarray, num_thresholds: int,
                      min_fraction: float, alpha: float) -> tuple[bool, str, float]:
    """The (direction, side, threshold) with the largest ε lower bound on the selection half
    (a confidence bound, not the plug-in ratio, so that rare tail events with noisy counts are
    not preferred); ``side`` says which of a / b the event favours."""
    pooled = np.concatenate([sel_a, sel_b])
    thresholds = np.unique(np.quantile(pooled, np.linspace(0.01, 0.99, num_thresholds)))
    n_a, n_b = sel_a.size, sel_b.size
    best = (-math.inf, True, "a", float(thresholds[0]))
    floor = min_fraction * min(n_a, n_b)
    for t in thresholds:
        for upper in (True, False):
            k_a = int(np.sum(sel_a >= t) if upper else np.sum(sel_a <= t))
            k_b = int(np.sum(sel_b >= t) if upper else np.sum(sel_b <= t))
            for side, k_x, n_x, k_y, n_y in (("a", k_a, n_a, k_b, n_b), ("b", k_b, n_b, k_a, n_a)):
                if k_x < floor:
                    continue
                loss = epsilon_lower_bound(k_x, n_x, k_y, n_y, alpha=alpha)
                if loss > best[0]:
                    best = (loss, upper, side, float(t))
    return best[1], best[2], best[3]


def audit_mechanism(release: Callable[[Any, int], np.ndarray], input_a: Any, input_b: Any, *,
                    claimed_epsilon: float, runs: int, delta: float = 0.0, alpha: float = 0.05,
                    statistic: Optional[Callable[[np.ndarray], np.ndarray]] = None,
                    num_thresholds: int = 40, min_fraction: float = 0.01) -> AuditResult:
    """Black-box ε audit of ``release`` on adjacent inputs (StatDP / DP-Sniper style).

    Args:
      release: ``release(x, n)`` → n independent outputs of the mechanism on input x (shape
        ``(n,)`` or ``(n, ...)``).
      input_a, input_b: adjacent inputs.
      claimed_epsilon: the ε the mechanism claims (reported next to the bound).
      runs: outputs drawn per input; half select the event, half certify it.
      delta: the claimed δ (the bound subtracts it).
      alpha: 1 − confidence of the lower bound.
      statistic: maps the ``(n, ...)`` outputs to n scalars (default: the first coordinate).
      num_thresholds: candidate thresholds (quantiles of the pooled selection outputs).
      min_fraction: an event must hold on at least this fraction of the selection runs of the
        input it favours (tiny events estimate the loss too noisily to be worth certifying).

    Returns:
      The :class:`AuditResult` (``passed`` iff the bound is ≤ the claimed ε).
    """
    if runs < 4:
        raise ValueError(f"runs must be >= 4, got {runs!r}")

    def scalars(x: Any) -> np.ndarray:
        out = np.asarray(release(x, runs))
        if statistic is not None:
            return np.asarray(statistic(out), dtype=np.float64).reshape(runs)
        return out.reshape(runs, -1)[:, 0].astype(np.float64)

    out_a, out_b = scalars(input_a), scalars(input_b)
    half = runs // 2
    upper, side, t = _threshold_events(out_a[:half], out_b[:half], num_thresholds, min_fraction,
                                       alpha)
    cert_a, cert_b = out_a[half:], out_b[half:]
    hit_a = int(np.sum(cert_a >= t) if upper else np.sum(cert_a <= t))
    hit_b = int(np.sum(cert_b >= t) if upper else np.sum(cert_b <= t))
    if side == "b":
        hit_a, hit_b = hit_b, hit_a
    bound = epsilon_lower_bound(hit_a, cert_a.size, hit_b, cert_b.size, delta=delta, alpha=alpha)
    event = f"stat({side}) {'>=' if upper else '<='} {t:.6g}"
    return AuditResult(float(claimed_epsilon), bound, event, hit_a, hit_b, int(cert_a.size),
                       float(alpha))


def _numpy_laplace(u: float, loc: float, scale: float) -> float:
    """numpy ``Generator.laplace(loc, scale)`` for the uniform draw ``u`` (its C code, in doubles)."""
    if u >= 0.5:
        return loc - scale * math.log(2.0 - u - u)
    return loc + scale * math.log(u + u)


def textbook_laplace_reachable(y: float, x: float, scale: float, width: int = 8) -> bool:
    """Whether ``y`` is an output ``x + Laplace(scale)`` of numpy's textbook sampler.

    numpy draws ``u = k / 2**53`` and returns ``x ± scale·log(2u)`` (in doubles); ``x + draw`` is
    the same double (``fl(x + fl(d)) = fl(x + d)`` here is how the old mechanisms added noise).
    Inverts the sampler for ``k`` and checks ``k ± width`` exactly: Mironov's test of the set of
    reachable outputs.
    """
    d = (y - x) / scale
    u = math.exp(d) / 2.0 if d <= 0 else (2.0 - math.exp(-d)) / 2.0
    k0 = int(round(u * _TWO53))
    for k in range(max(1, k0 - width), min(int(_TWO53) - 1, k0 + width) + 1):
        if _numpy_laplace(k * (1.0 / _TWO53), x, scale) == y:
            return True
    return False
