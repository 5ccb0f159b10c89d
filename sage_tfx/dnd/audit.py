"""Empirical privacy audit of a randomised mechanism: a Clopper–Pearson lower bound on ε.

Run the mechanism many times on two adjacent inputs, count how often a fixed test ("the output
lands in S") fires, and bound the two probabilities with exact binomial confidence intervals:
ε̂ = ln(p_lo(D) / p_hi(D')) is a lower bound on the true ε with confidence 1 − 2α (Jagielski et
al. 2020; Nasr et al. 2021). A mechanism that adds half the noise its claim needs shows ε̂ > ε.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np
from scipy import stats


def clopper_pearson(hits: int, n: int, alpha: float) -> tuple[float, float]:
    """The exact two-sided (1 − 2α) binomial interval of hits/n, as (lower, upper)."""
    lo = 0.0 if hits == 0 else float(stats.beta.ppf(alpha, hits, n - hits + 1))
    hi = 1.0 if hits == n else float(stats.beta.ppf(1 - alpha, hits + 1, n - hits))
    return lo, hi


@dataclasses.dataclass(frozen=True)
class AuditResult:
    epsilon_lower: float  # ε̂: with confidence 1 − 2α the mechanism is not better than this
    hits_d: int
    hits_d_prime: int
    samples: int


def audit_epsilon(mechanism_d: Callable[[], np.ndarray],
                  mechanism_d_prime: Callable[[], np.ndarray],
                  test: Callable[[np.ndarray], np.ndarray], *, samples: int,
                  alpha: float = 0.025) -> AuditResult:
    """ε̂ for the event ``test`` (vectorised over a batch of outputs, returns booleans).

    Args:
      mechanism_d, mechanism_d_prime: each returns a batch of ``samples`` outputs (rows) of the
        mechanism on D and on the adjacent D'.
      test: the distinguishing event S, as a vectorised predicate.
      samples: outputs per side.
      alpha: one-sided miss probability of each interval.
    """
    hits_d = int(np.count_nonzero(test(mechanism_d())))
    hits_dp = int(np.count_nonzero(test(mechanism_d_prime())))
    p_lo, _ = clopper_pearson(hits_d, samples, alpha)
    _, q_hi = clopper_pearson(hits_dp, samples, alpha)
    eps = math.log(p_lo / q_hi) if p_lo > 0 else 0.0
    return AuditResult(max(eps, 0.0), hits_d, hits_dp, samples)
