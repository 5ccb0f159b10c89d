"""DP comparison of a candidate model with a baseline on the same test set ("not worse").

TFX's Evaluator blesses a model only if it is not worse than the last blessed one
(``LatestBlessedModelResolver`` + a change threshold), on exact metrics. Here the comparison is
one DP release on the test examples: per example, the loss difference

    d_i = clip(ℓ_candidate(x_i), 0, B) − clip(ℓ_baseline(x_i), 0, B)   ∈ [−B, B]

(accuracy: the 0/1 error, B = 1), and a DP count ñ = n + Laplace(2/ε) and a DP sum
s̃ = Σ d_i + Laplace(2B/ε). Under add/remove-one-example adjacency the count has sensitivity 1 and
the sum B (|d_i| ≤ B), so the release is (ε, 0)-DP: ``dp_event(ε)`` is exactly its charge
(two Laplace events of noise multiplier 2/ε, as the SLA validator's).

Confidence bounds on μ = E[d] (test examples i.i.d., independent of both models). Each of three
events fails with probability η/3: the count noise (two-sided, |Z_n| ≤ t_n = (2/ε)·ln(3/η), so
n ∈ [n_min, n_max] = ñ ∓ t_n), the sum noise (one-sided, t_s = (2B/ε)·ln(3/(2η))) and the
sampling error (one-sided Hoeffding for values of range 2B: |S/n − μ| ≤ 2B·sqrt(ln(3/η)/(2n))).
With s⁺ = s̃ + t_s and s⁻ = s̃ − t_s:

    U = (s⁺/n_min if s⁺ ≥ 0 else s⁺/n_max) + 2B·sqrt(ln(3/η) / (2·n_min))
    L = (s⁻/n_max if s⁻ ≥ 0 else s⁻/n_min) − 2B·sqrt(ln(3/η) / (2·n_min))

P[μ > U] ≤ η and P[μ < L] ≤ η; both are clipped to [−B, B] (always true of μ), the whole range
when n_min ≤ 0 (no evidence). Decision, with a tolerance τ ≥ 0 in the metric's units:

* ``NOT_WORSE`` iff U ≤ τ (loss; accuracy: the candidate's accuracy is at least the baseline's
  minus τ): P[NOT_WORSE and the candidate is worse by more than τ] ≤ η;
* ``WORSE`` iff L > τ: P[WORSE and it is not] ≤ η;
* ``INCONCLUSIVE`` otherwise (more test data or a larger ε would decide).

Per-example values that cannot be computed (NaN) count against the candidate: its loss B (a
wrong prediction), the baseline's 0 (a right one), so the comparison never favours the
candidate for them. Hoeffding ignores the variance of d: for two nearly identical models the
bounds are wider than a variance-aware (Bernstein) bound would be.

This module is pure numpy (plus dp_accounting for events); it imports no TensorFlow.
"""
from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

import dp_accounting
import numpy as np
from numpy.typing import ArrayLike

from sage_tfx.dp.noise import NoiseSource
from sage_tfx.dp.validation import (ACCURACY, LOSS, _check_eta, _check_noise, _check_number,
                                    _count_and_sum_event, _dp_count_and_sum, result_from_dict,
                                    result_to_dict)
from sage_tfx.ledger.accounting import check_epsilon, check_positive

__all__ = ["ComparisonOutcome", "ComparisonResult", "LossDifferenceComparator"]


class ComparisonOutcome(str, enum.Enum):
    """Decision of a baseline comparison."""

    NOT_WORSE = "NOT_WORSE"
    WORSE = "WORSE"
    INCONCLUSIVE = "INCONCLUSIVE"


@dataclasses.dataclass(frozen=True)
class ComparisonResult:
    """A baseline comparison: its decision and the DP quantities behind it.

    Differences are candidate − baseline in the metric's own units (a loss: lower is better, so
    "not worse" is ``upper_bound ≤ tolerance``; accuracy: higher is better, "not worse" is
    ``lower_bound ≥ −tolerance``).

    Attributes:
      outcome: NOT_WORSE, WORSE or INCONCLUSIVE.
      metric_name: what was compared.
      tolerance: τ ≥ 0, how much worse still counts as "not worse".
      dp_difference: the DP mean difference s̃ / ñ (NaN when ñ ≤ 0).
      upper_bound, lower_bound: the (1 − η) confidence bounds on the expected difference.
      n_test_dp: the DP (noisy) number of test examples.
      epsilon, delta: what the release consumed (δ = 0).
      eta: 1 − confidence of each bound.
      details: noise scales, sensitivities and the terms of the bounds.
    """

    outcome: ComparisonOutcome
    metric_name: str
    tolerance: float
    dp_difference: float
    upper_bound: float
    lower_bound: float
    n_test_dp: float
    epsilon: float
    delta: float
    eta: float
    details: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the outcome as its string value)."""
        return result_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ComparisonResult":
        """The result :meth:`to_dict` wrote (e.g. a release recorded in the ledger).

        Raises:
          ValueError: missing or unknown fields, or an unknown outcome.
        """
        return result_from_dict(cls, data, ComparisonOutcome)


class LossDifferenceComparator:
    """Compares a candidate with a baseline on the same test examples (module doc).

    Args:
      loss_bound: B: per-example losses are clipped to [0, B] (accuracy: 1).
      eta: 1 − confidence of each bound, in (0, 1).
      tolerance: τ ≥ 0 in the metric's units.
      metric: ``"loss"`` (values are per-example losses) or ``"accuracy"`` (values are 0/1
        correctness).
      metric_name: name to report.

    Raises:
      ValueError: B not finite > 0 (or not 1 for accuracy), η not in (0, 1), τ < 0 or not finite.
    """

    def __init__(self, *, loss_bound: float, eta: float, tolerance: float = 0.0,
                 metric: str = LOSS, metric_name: str | None = None) -> None:
        if metric not in (LOSS, ACCURACY):
            raise ValueError(f"metric must be {LOSS!r} or {ACCURACY!r}, got {metric!r}")
        self._metric = metric
        self._loss_bound = check_positive(loss_bound, "loss_bound")
        if metric == ACCURACY and self._loss_bound != 1.0:
            raise ValueError(f"accuracy is a 0/1 metric: loss_bound must be 1, got {loss_bound!r}")
        self._eta = _check_eta(eta)
        self._tolerance = _check_number(tolerance, "tolerance")
        if self._tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
        self._metric_name = metric_name if metric_name is not None else metric

    @property
    def loss_bound(self) -> float:
        """B: per-example losses are clipped to [0, B]."""
        return self._loss_bound

    @property
    def eta(self) -> float:
        """η = 1 − confidence of each bound."""
        return self._eta

    @property
    def tolerance(self) -> float:
        """τ: how much worse (metric units) still counts as not worse."""
        return self._tolerance

    def dp_event(self, epsilon: float) -> dp_accounting.DpEvent:
        """The DpEvent ``compare(..., epsilon=epsilon)`` consumes: Laplace count + Laplace sum.

        Raises:
          InvalidPrivacyParameterError: ε not finite and > 0.
        """
        return _count_and_sum_event(epsilon)

    def differences(self, candidate: ArrayLike, baseline: ArrayLike) -> np.ndarray:
        """Per-example d_i in [−B, B] (loss space; NaN against the candidate).

        Raises:
          ValueError: arrays that are not 1-D and aligned.
        """
        c = np.asarray(candidate, dtype=np.float64)
        b = np.asarray(baseline, dtype=np.float64)
        if c.ndim != 1 or c.shape != b.shape:
            raise ValueError(f"candidate {c.shape} and baseline {b.shape} values must be 1-D and "
                             "aligned (one per test example, the same examples)")
        bound = self._loss_bound
        if self._metric == ACCURACY:  # 0/1 error; NaN: the candidate wrong, the baseline right
            c = 1.0 - np.clip(np.nan_to_num(c, nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0)
            b = 1.0 - np.clip(np.nan_to_num(b, nan=1.0, posinf=1.0, neginf=0.0), 0.0, 1.0)
        else:
            c = np.clip(np.nan_to_num(c, nan=bound, posinf=bound, neginf=0.0), 0.0, bound)
            b = np.clip(np.nan_to_num(b, nan=0.0, posinf=bound, neginf=0.0), 0.0, bound)
        return c - b

    def compare(self, candidate: ArrayLike, baseline: ArrayLike, *, epsilon: float,
                noise: NoiseSource | None = None) -> ComparisonResult:
        """Releases the DP count and difference sum at ``epsilon`` and decides.

        Args:
          candidate, baseline: per-example losses (metric "loss") or correctness (metric
            "accuracy") of the two models on the same test examples, in the same order.
          epsilon: the ε of the release (consumed in full: ``dp_event(epsilon)``).
          noise: the noise source; None (always, in components and pipelines) is OpenDP.

        Raises:
          InvalidPrivacyParameterError: ε not finite and > 0.
          TypeError: noise is not a noise source.
          ValueError: values not 1-D and aligned.
        """
        epsilon = check_epsilon(epsilon)
        noise = _check_noise(noise)
        d = self.differences(candidate, baseline)
        n_dp, sum_dp = _dp_count_and_sum(d, self._loss_bound, epsilon, noise)
        return self.compare_release(dp_sum=sum_dp, dp_count=n_dp, epsilon=epsilon)

    def bounds(self, *, dp_sum: float, dp_count: float, epsilon: float) -> tuple[float, float,
                                                                               dict]:
        """(lower, upper) (1 − η) bounds on E[d] in loss space from a released count and sum,
        and the terms behind them (post-processing: no privacy cost)."""
        epsilon = check_epsilon(epsilon)
        bound, eta = self._loss_bound, self._eta
        count_scale, sum_scale = 2.0 / epsilon, 2.0 * bound / epsilon
        t_n = count_scale * math.log(3.0 / eta)
        t_s = sum_scale * math.log(3.0 / (2.0 * eta))
        n_min, n_max = dp_count - t_n, dp_count + t_n
        details = {"count_noise_scale": count_scale, "sum_noise_scale": sum_scale,
                   "count_sensitivity": 1.0, "sum_sensitivity": bound,
                   "count_tail": t_n, "sum_tail": t_s, "n_min": n_min, "n_max": n_max,
                   "eta_split": "eta/3 count (two-sided), eta/3 sum, eta/3 Hoeffding, per bound",
                   "adjacency": "add/remove one test example"}
        if n_min <= 0:
            details["hoeffding"] = math.inf
            return -bound, bound, details
        hoeffding = 2.0 * bound * math.sqrt(math.log(3.0 / eta) / (2.0 * n_min))
        s_up, s_lo = dp_sum + t_s, dp_sum - t_s
        upper = (s_up / n_min if s_up >= 0 else s_up / n_max) + hoeffding
        lower = (s_lo / n_max if s_lo >= 0 else s_lo / n_min) - hoeffding
        details["hoeffding"] = hoeffding
        return max(lower, -bound), min(upper, bound), details

    def compare_release(self, *, dp_sum: float, dp_count: float,
                        epsilon: float) -> ComparisonResult:
        """Decides from a released DP count and DP difference sum (no extra privacy cost).

        Raises:
          InvalidPrivacyParameterError: ε not finite and > 0.
          ValueError: dp_sum or dp_count not finite.
        """
        epsilon = check_epsilon(epsilon)
        dp_sum = _check_number(dp_sum, "dp_sum")
        dp_count = _check_number(dp_count, "dp_count")
        lower, upper, details = self.bounds(dp_sum=dp_sum, dp_count=dp_count, epsilon=epsilon)
        estimate = dp_sum / dp_count if dp_count > 0 else math.nan
        if upper <= self._tolerance:
            outcome = ComparisonOutcome.NOT_WORSE
        elif lower > self._tolerance:
            outcome = ComparisonOutcome.WORSE
        else:
            outcome = ComparisonOutcome.INCONCLUSIVE
        details["dp_sum"] = dp_sum
        details["loss_bound"] = self._loss_bound
        if self._metric == ACCURACY:  # report accuracy(candidate) − accuracy(baseline)
            estimate, lower, upper = -estimate, -upper, -lower
        return ComparisonResult(
            outcome=outcome, metric_name=self._metric_name, tolerance=self._tolerance,
            dp_difference=float(estimate), upper_bound=float(upper), lower_bound=float(lower),
            n_test_dp=float(dp_count), epsilon=epsilon, delta=0.0, eta=self._eta,
            details=details)
