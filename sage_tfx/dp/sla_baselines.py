"""The baselines of Sage's Tab. 2: validators *without* Sage's guarantees, for comparison.

``No SLA`` (vanilla TFX validation on a DP metric), ``UC DP SLA`` (List. 2 without the correction
for DP impact) and ``NP SLA`` (Bernstein on the exact, non-DP loss). They run in evaluations
(:mod:`sage_tfx.eval.tab2`), never as a pipeline's gate to production: only
:class:`sage_tfx.dp.validation.LossValidator` / ``AccuracyValidator`` give an SLA. ACCEPT tests
only, like the paper's Tab. 2.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

import dp_accounting
from numpy.typing import ArrayLike

from sage_tfx.dp.sla_bounds import np_loss_upper_bound, uc_dp_loss_upper_bound
from sage_tfx.dp.validation import (ACCURACY, NO_SLA, NP_SLA, SAGE_SLA, UC_DP_SLA,
                                    AccuracyValidator,
                                    LossValidator, MeanMetricValidator, ValidationResult)

TAB2_SLAS: tuple[str, ...] = (NO_SLA, NP_SLA, UC_DP_SLA, SAGE_SLA)



class NoSlaValidator(MeanMetricValidator):
    """Tab. 2 "No SLA": vanilla TFX validation on a DP metric, no statistical rigor.

    ACCEPT iff the DP metric (DP sum / DP count, same Laplace release as Sage) meets the target;
    otherwise RETRY. ``eta`` is recorded only. (ε, 0)-DP.

    Args:
      target: the target (loss, or accuracy when ``metric="accuracy"``).
      eta: recorded for comparison, unused.
      loss_bound: B (must be 1 for accuracy).
      metric: "loss" or "accuracy".
    """

    sla: ClassVar[str] = NO_SLA

    def _bounds(self, n_dp: float, sum_dp: float, epsilon: float) -> tuple[float, float, dict]:
        estimate = sum_dp / n_dp if n_dp > 0 else math.inf
        # The point estimate is used as the "upper bound": no correction, no concentration.
        return estimate, -math.inf, {"dp_loss_sum": sum_dp}


class UcDpSlaValidator(MeanMetricValidator):
    """Tab. 2 "UC DP SLA": List. 2 without the correction for DP impact (lines 13-14, 17-18).

    ACCEPT iff ``uc_dp_loss_upper_bound`` (Bernstein at (η/2)/3 on the uncorrected DP mean and
    count) meets the target; otherwise RETRY. (ε, 0)-DP, but its ACCEPT is *not* reliable.

    Args: as NoSlaValidator.
    """

    sla: ClassVar[str] = UC_DP_SLA

    def _bounds(self, n_dp: float, sum_dp: float, epsilon: float) -> tuple[float, float, dict]:
        upper = float(uc_dp_loss_upper_bound(sum_dp, n_dp, eta=self._eta / 2.0,
                                             loss_bound=self._loss_bound))
        return upper, -math.inf, {"dp_loss_sum": sum_dp, "eta_accept": self._eta / 2.0}


class NpSlaValidator(MeanMetricValidator):
    """Tab. 2 "NP SLA": Bernstein at η/2 on the exact mean loss. NOT differentially private.

    The statistically rigorous non-DP reference: the same ACCEPT η/2 as Sage, all of it on the
    Bernstein inequality since there is no noise. Its result reports raw quantities
    (``epsilon`` is ``inf``); use it only in evaluations, never on protected data.
    ``dp_event`` is ``NonPrivateDpEvent`` so no accountant can mistake it for a free query.

    Args: as NoSlaValidator.
    """

    sla: ClassVar[str] = NP_SLA

    def dp_event(self, epsilon: float | None = None) -> dp_accounting.DpEvent:
        """``NonPrivateDpEvent``: this baseline reads the raw test set."""
        return dp_accounting.NonPrivateDpEvent()

    def validate(self, values: ArrayLike, *, epsilon: float | None = None,
                 noise: Any = None) -> ValidationResult:
        """Validates on the exact loss; ``epsilon`` and ``noise`` are ignored (no noise)."""
        losses = self._losses(values)
        return self._decide(float(losses.size), float(losses.sum()), math.inf)

    def _bounds(self, n_dp: float, sum_dp: float, epsilon: float) -> tuple[float, float, dict]:
        upper = float(np_loss_upper_bound(sum_dp, n_dp, eta=self._eta / 2.0,
                                          loss_bound=self._loss_bound))
        return upper, -math.inf, {"loss_sum": sum_dp, "eta_accept": self._eta / 2.0,
                                  "non_private": True}


def tab2_validators(*, metric: str, target: float, eta: float,
                    loss_bound: float = 1.0) -> dict[str, MeanMetricValidator]:
    """The four validators of the paper's Tab. 2, keyed by the paper's column names.

    Args:
      metric: "loss" or "accuracy".
      target: target loss, or target accuracy.
      eta: 1 − confidence.
      loss_bound: B (1 for accuracy).

    Returns:
      ``{"No SLA": ..., "NP SLA": ..., "UC DP SLA": ..., "Sage SLA": ...}``; all share
      ``validate(values, *, epsilon, noise)``.
    """
    kwargs = dict(target=target, eta=eta, loss_bound=loss_bound, metric=metric)
    sage: MeanMetricValidator
    if metric == ACCURACY:
        if loss_bound != 1.0:
            raise ValueError(f"accuracy is a 0/1 metric: loss_bound must be 1, got {loss_bound!r}")
        sage = AccuracyValidator(target=target, eta=eta)
    else:
        sage = LossValidator(target=target, loss_bound=loss_bound, eta=eta)
    return {NO_SLA: NoSlaValidator(**kwargs), NP_SLA: NpSlaValidator(**kwargs),
            UC_DP_SLA: UcDpSlaValidator(**kwargs), SAGE_SLA: sage}
