"""Poisson-sampled DP-SGD batches built record by record, with a maximum batch size.

The mechanism DP-SGD is accounted for (``PoissonSampledDpEvent(q, Gaussian(σ))`` composed T
times) samples every example independently into every step with probability q. Building those
batches at scale — in Beam, without holding the data in one process — follows Chua et al.,
"Scalable DP-SGD: Shuffling vs. Poisson Subsampling" (NeurIPS 2024, §4): each example
independently draws the steps it joins (:func:`assign_steps`), examples are grouped by step, and
a step's batch is capped at a maximum size B so that memory is O(B) per step in flight.

What happens to a step whose batch exceeds B (its size is Binomial(n, q), so this is rare when B
is a few standard deviations above q·n) is the ``oversize`` policy:

* :data:`TRUNCATE` (Chua et al.): the step keeps a uniformly random B of its examples. This is
  no longer exactly the Poisson mechanism; :func:`truncation_delta` bounds the difference and
  the trainer spends that bound inside the plan part's δ. The argument: couple the truncated
  and the untruncated mechanism on the same randomness; they differ only on the event E that
  some step of the run samples more than B examples, and P[E] ≤ T·P[Binomial(m, q) > B] for a
  dataset of m records (a union bound over the steps). If the untruncated run is (ε, δ)-DP,
  then for neighbours D, D' and any output set S
  ``P[M_B(D) ∈ S] ≤ P[M(D) ∈ S] + P[E_D] ≤ e^ε P[M(D') ∈ S] + δ + P[E_D]
  ≤ e^ε P[M_B(D') ∈ S] + δ + P[E_D] + e^ε P[E_D']``,
  so the truncated run is (ε, δ + (1 + e^ε)·T·P[Binomial(n + 1, q) > B])-DP for datasets of at
  most n + 1 records (add-or-remove-one neighbours of the n-record training set).
* :data:`SPILL`: the step keeps all its examples and the trainer processes them in chunks of at
  most B, summing the clipped gradients of its chunks before the step's one noise draw. This is
  exactly the Poisson mechanism (nothing to account beyond the event), at the price of an
  unbounded (but rarely more than B) number of examples in one step. Used for rdp plan parts,
  whose charged DpEvent cannot carry an extra δ.

This module imports no TensorFlow or Beam: the Beam job (``components/dp_trainer/batching.py``)
and the tests call it.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from sage_tfx.errors import InvalidPrivacyParameterError

TRUNCATE = "truncate"
SPILL = "spill"
OVERSIZE_POLICIES = (TRUNCATE, SPILL)

# Maximum batch sizes are multiples of this (a few distinct shapes for the training step).
MAX_BATCH_MULTIPLE = 8
# The default share of a basic train part's δ that truncation may take (the rest is DP-SGD's).
DEFAULT_TRUNCATION_SHARE = 0.01


def check_oversize(policy: object) -> str:
    """Returns ``policy`` if it is one of :data:`OVERSIZE_POLICIES`.

    Raises:
      InvalidPrivacyParameterError: any other value.
    """
    if policy not in OVERSIZE_POLICIES:
        raise InvalidPrivacyParameterError(
            f"oversize must be one of {OVERSIZE_POLICIES}, got {policy!r}")
    return str(policy)


def _check(n: int, q: float, steps: int) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InvalidPrivacyParameterError(f"num_examples must be an int >= 1, got {n!r}")
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0.0 < q <= 1.0:
        raise InvalidPrivacyParameterError(f"sampling probability must lie in (0, 1], got {q!r}")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise InvalidPrivacyParameterError(f"steps must be an int >= 1, got {steps!r}")


def _check_max_batch(max_batch: object) -> int:
    if isinstance(max_batch, bool) or not isinstance(max_batch, (int, np.integer)) \
            or max_batch < 1:
        raise InvalidPrivacyParameterError(
            f"max_batch_size must be an int >= 1, got {max_batch!r}")
    return int(max_batch)


def step_overflow_probability(n: int, q: float, max_batch: int) -> float:
    """P[Binomial(n, q) > max_batch]: one step's chance to sample more than B of n examples."""
    from scipy.stats import binom
    _check(n, q, 1)
    return float(binom.sf(_check_max_batch(max_batch), int(n), float(q)))


def truncation_probability(n: int, q: float, steps: int, max_batch: int) -> float:
    """Upper bound on P[some step of a T-step run samples more than B of n + 1 examples]:
    ``min(1, T · P[Binomial(n + 1, q) > B])`` (union bound over the steps)."""
    _check(n, q, steps)
    return min(1.0, int(steps) * step_overflow_probability(int(n) + 1, q, max_batch))


def truncation_delta(epsilon: float, n: int, q: float, steps: int, max_batch: int) -> float:
    """The δ the :data:`TRUNCATE` policy adds to an (ε, δ) guarantee of the untruncated run:
    ``(1 + e^ε) · T · P[Binomial(n + 1, q) > B]`` (module doc), rounded up in floating point.

    Raises:
      InvalidPrivacyParameterError: bad sizes, or ε not finite and ≥ 0.
    """
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) \
            or not math.isfinite(epsilon) or epsilon < 0:
        raise InvalidPrivacyParameterError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    p = truncation_probability(n, q, steps, max_batch)
    if p == 0.0:
        return 0.0
    value = (1.0 + math.exp(epsilon)) * p
    return math.nextafter(value, math.inf)  # never below the bound


def choose_max_batch(n: int, q: float, steps: int, *, epsilon: float,
                     delta_budget: float) -> int:
    """The smallest B (a multiple of :data:`MAX_BATCH_MULTIPLE`, ≥ the expected batch q·n)
    whose :func:`truncation_delta` is at most ``delta_budget``.

    B depends only on n, q, T and the privacy parameters, never on which examples were sampled.

    Raises:
      InvalidPrivacyParameterError: bad sizes, or a budget that is not in (0, 1).
    """
    _check(n, q, steps)
    if isinstance(delta_budget, bool) or not isinstance(delta_budget, (int, float)) \
            or not 0.0 < delta_budget < 1.0:
        raise InvalidPrivacyParameterError(
            f"the truncation delta budget must lie in (0, 1), got {delta_budget!r}")
    m = MAX_BATCH_MULTIPLE
    lo_k = max(1, -(-math.ceil(q * n) // m))   # B = k·m, from the expected batch up
    hi_k = -(-(int(n) + 1) // m)               # B ≥ n + 1: no step can overflow (δ = 0)
    if lo_k >= hi_k:
        return hi_k * m
    # The truncation δ decreases in B: the smallest k whose B = k·m fits the budget.
    if truncation_delta(epsilon, n, q, steps, lo_k * m) <= delta_budget:
        return lo_k * m
    while hi_k - lo_k > 1:
        mid = (lo_k + hi_k) // 2
        if truncation_delta(epsilon, n, q, steps, mid * m) <= delta_budget:
            hi_k = mid
        else:
            lo_k = mid
    return hi_k * m


def assign_steps(rng: np.random.Generator, steps: int, q: float) -> np.ndarray:
    """The steps one example joins: each of the T steps independently with probability q.

    Drawn as the same distribution in O(joined) instead of O(T): the number of steps joined is
    Binomial(T, q), and given that number the steps are a uniformly random subset.
    """
    k = int(rng.binomial(int(steps), float(q)))
    if k == 0:
        return np.zeros(0, np.int64)
    return np.sort(rng.choice(int(steps), size=k, replace=False)).astype(np.int64)


def cap_batch(rng: np.random.Generator, examples: list, max_batch: int,
              policy: str) -> tuple[list, int]:
    """One step's examples under the oversize policy, and how many were dropped.

    :data:`TRUNCATE` keeps a uniformly random ``max_batch`` of them (the order is also shuffled
    otherwise); :data:`SPILL` keeps all (the trainer chunks them).
    """
    policy = check_oversize(policy)
    max_batch = _check_max_batch(max_batch)
    order = rng.permutation(len(examples))
    if policy == TRUNCATE and len(examples) > max_batch:
        order = order[:max_batch]
    kept = [examples[i] for i in order]
    return kept, len(examples) - len(kept)


def expected_batch_size(n: int, q: float) -> float:
    """q · n, the divisor of the noisy clipped-gradient sum (never the realised size)."""
    _check(n, q, 1)
    return float(q) * int(n)


def new_rng(seed: Optional[int] = None) -> np.random.Generator:
    """A generator seeded from OS entropy (``seed`` only in tests)."""
    return np.random.default_rng(seed)
