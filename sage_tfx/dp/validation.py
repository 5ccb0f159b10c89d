"""SLAed DP validators of Sage (§3.3, List. 2) and the baselines of the paper's Tab. 2.

A validator turns a test set into one of three decisions (§3.3, Fig. 2):

``ACCEPT``
    With probability ≥ 1 − η the model meets its quality target on new data from the same
    distribution (Proposition 3.1).
``REJECT``
    With probability ≥ 1 − η the model does *not* meet it.
``RETRY``
    Not enough evidence either way: privacy-adaptive training should retry with more data or a
    larger ε. (``TIMEOUT`` is decided by the caller, never by a validator.)

All Sage validators follow the paper's three steps (§3.3, "SLAed DP Validation"): (1) a DP
version of the test quantity (a Laplace count and a Laplace sum of clipped per-example values,
ε/2 each); (2) a *correction for DP impact*, the worst case of that noise at a given confidence;
(3) a concentration inequality (Bernstein's, List. 2 lines 23-25) applied to the corrected
quantities.

Assumptions stated once for every validator here:

* The test examples are i.i.d. draws from the distribution the target refers to, and independent
  of the model (a held-out set never used in training).
* Adjacency is add/remove one test example: the count has sensitivity 1 and the sum of values
  clipped to ``[0, B]`` has sensitivity ``B`` (List. 2 lines 12 and 15-16). ``validate`` is then
  ``(epsilon, 0)``-DP; ``dp_event(epsilon)`` is exactly what it consumes.
* Noise is OpenDP's continuous Laplace (:mod:`sage_tfx.dp.noise`), safe from Mironov's
  floating-point attack (CCS'12), at a scale raised by at most a few ulps so that OpenDP's map
  meets ε/2 per release (continuous Laplace on the count too, so the DP-noise corrections
  below, which use its tails, hold as written). ``noise=SeededNoise(seed)`` (experiments and tests
  only) makes a run reproducible.
* Per-example values are clipped to their range and non-finite values count as the worst value;
  no exception ever depends on the data, since an exception would itself release information.

This module is pure numpy (plus dp_accounting for events); it imports no TensorFlow.
"""
from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, ClassVar

import dp_accounting
import numpy as np
from numpy.typing import ArrayLike

from sage_tfx.dp.mechanisms import LaplaceMechanism, noise_source
from sage_tfx.dp.noise import NoiseSource
from sage_tfx.dp.sla_bounds import sage_loss_lower_bound, sage_loss_upper_bound
from sage_tfx.ledger.accounting import check_epsilon, check_positive

__all__ = [
    "Outcome",
    "ValidationResult",
    "LossValidator",
    "AccuracyValidator",
    "SumStatisticValidator",
    "MeanMetricValidator",
]

SAGE_SLA = "Sage SLA"
UC_DP_SLA = "UC DP SLA"
NP_SLA = "NP SLA"
NO_SLA = "No SLA"

LOSS = "loss"
ACCURACY = "accuracy"
_METRICS = (LOSS, ACCURACY)


class Outcome(str, enum.Enum):
    """Decision of an SLAed validator (§3.3, Fig. 2)."""

    ACCEPT = "ACCEPT"
    REJECT = "REJECT"
    RETRY = "RETRY"
    TIMEOUT = "TIMEOUT"


@dataclasses.dataclass(frozen=True)
class ValidationResult:
    """What a validator computed: its decision and the DP quantities behind it.

    Every number here is DP (a post-processing of the noisy count and sum), except for the
    ``NP SLA`` baseline, which is non-private by definition (its ``epsilon`` is ``inf``).

    Attributes:
      outcome: ACCEPT, REJECT or RETRY.
      metric_name: what was validated ("loss", "mse", "accuracy", "absolute_error", ...).
      target: the quality target, in the metric's own units.
      dp_estimate: the uncorrected DP metric (e.g. DP loss sum / DP count).
      upper_bound: high-probability upper bound on the metric (``inf`` when none).
      lower_bound: high-probability lower bound on the metric (``-inf`` when none).
      n_test_dp: the DP (noisy, uncorrected) number of examples.
      epsilon: the ε the validation consumed.
      delta: the δ the validation consumed (0: Laplace mechanisms only).
      eta: the configured failure probability η = 1 − confidence.
      details: named intermediate DP quantities (corrections, noise scales, per-test η, SLA name).
    """

    outcome: Outcome
    metric_name: str
    target: float
    dp_estimate: float
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
    def from_dict(cls, data: dict[str, Any]) -> "ValidationResult":
        """The result :meth:`to_dict` wrote (e.g. a release recorded in the ledger).

        Raises:
          ValueError: missing or unknown fields, or an unknown outcome.
        """
        return result_from_dict(cls, data, Outcome)


def result_to_dict(result: Any) -> dict[str, Any]:
    """A result dataclass with an enum ``outcome`` as a JSON-ready dict."""
    out = dataclasses.asdict(result)
    out["outcome"] = result.outcome.value
    return out


def result_from_dict(cls: type, data: Any, outcome_type: type) -> Any:
    """The ``cls`` instance :func:`result_to_dict` wrote (every field but ``details`` needed).

    Raises:
      ValueError: missing or unknown fields, or an unknown outcome.
    """
    names = {f.name for f in dataclasses.fields(cls)}
    if not isinstance(data, dict) or not set(data) <= names or \
            not names - {"details"} <= set(data):
        raise ValueError(
            f"not a {cls.__name__}: {sorted(data) if isinstance(data, dict) else data!r}")
    return cls(**{**data, "outcome": outcome_type(data["outcome"])})


# ---------------------------------------------------------------------------------------------
# Argument checks. Privacy parameters go through sage_tfx.ledger.accounting (one home for ε checks).


def _check_number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return out


def _check_eta(eta: Any) -> float:
    value = _check_number(eta, "eta")
    if not 0.0 < value < 1.0:
        raise ValueError(f"eta (1 - confidence) must lie in (0, 1), got {eta!r}")
    return value


def _check_noise(noise: Any) -> NoiseSource:
    if isinstance(noise, np.random.Generator):
        raise TypeError("noise must be a sage_tfx.dp.noise source, not a numpy Generator: pass "
                        "SeededNoise(rng=...) in experiments, nothing (OpenDP) elsewhere")
    return noise_source(noise)


def _as_values(values: ArrayLike, bound: float, name: str) -> np.ndarray:
    """Per-example values as a clipped 1-D float array (List. 2 line 15: clip to [0, B])."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array of per-example values, got shape "
                         f"{array.shape}")
    # NaN / +inf count as the worst value; the clip then bounds the sensitivity by B.
    array = np.nan_to_num(array, nan=bound, posinf=bound, neginf=0.0)
    return np.clip(array, 0.0, bound)


def _dp_count_and_sum(values: np.ndarray, bound: float, epsilon: float,
                      noise: NoiseSource) -> tuple[float, float]:
    """(ε/2)-DP count + (ε/2)-DP sum of values in [0, bound] (List. 2 lines 12 and 15-16)."""
    half = epsilon / 2.0
    n_dp = float(LaplaceMechanism(half, 1.0).add_noise(float(values.size), noise))
    sum_dp = float(LaplaceMechanism(half, bound).add_noise(float(values.sum()), noise))
    return n_dp, sum_dp


def _count_and_sum_event(epsilon: float) -> dp_accounting.DpEvent:
    """Laplace(2/ε) on a sensitivity-1 count composed with Laplace(2B/ε) on a sensitivity-B sum.

    ``noise_multiplier`` is scale / sensitivity = 2/ε for both, whatever B is: ε/2 + ε/2 = ε.
    """
    epsilon = check_epsilon(epsilon)
    return dp_accounting.ComposedDpEvent([
        dp_accounting.LaplaceDpEvent(noise_multiplier=2.0 / epsilon),
        dp_accounting.LaplaceDpEvent(noise_multiplier=2.0 / epsilon),
    ])


# ---------------------------------------------------------------------------------------------
# Validators of bounded-mean metrics: loss (lower is better) and accuracy (higher is better).


class MeanMetricValidator:
    """Shared engine: a metric that is the mean of per-example values in [0, B].

    Everything is computed in *loss space* (values in [0, B], lower is better). Accuracy is the
    loss ``1 − correct`` with B = 1 and target ``1 − accuracy``; bounds are mapped back on report.
    """

    sla: ClassVar[str] = SAGE_SLA

    def __init__(self, *, target: float, eta: float, loss_bound: float = 1.0,
                 metric: str = LOSS, metric_name: str | None = None) -> None:
        if metric not in _METRICS:
            raise ValueError(f"metric must be one of {_METRICS}, got {metric!r}")
        self._metric = metric
        self._eta = _check_eta(eta)
        self._loss_bound = check_positive(loss_bound, "loss_bound")
        target = _check_number(target, "target")
        if metric == ACCURACY:
            if self._loss_bound != 1.0:
                raise ValueError(f"accuracy is a 0/1 metric: loss_bound must be 1, got "
                                 f"{loss_bound!r}")
            if not 0.0 <= target <= 1.0:
                raise ValueError(f"target accuracy must lie in [0, 1], got {target!r}")
        elif target < 0:
            raise ValueError(f"target loss must be ≥ 0 (losses lie in [0, B]), got {target!r}")
        self._target = target
        self._metric_name = metric_name if metric_name is not None else metric

    @property
    def target(self) -> float:
        """The quality target in the metric's own units."""
        return self._target

    @property
    def eta(self) -> float:
        """η = 1 − confidence."""
        return self._eta

    @property
    def loss_bound(self) -> float:
        """B: per-example values are clipped to [0, B]."""
        return self._loss_bound

    def dp_event(self, epsilon: float) -> dp_accounting.DpEvent:
        """The DpEvent ``validate(..., epsilon=epsilon)`` consumes (Laplace count + Laplace sum).

        Raises:
          InvalidPrivacyParameterError: ε not finite and > 0.
        """
        return _count_and_sum_event(epsilon)

    def validate(self, values: ArrayLike, *, epsilon: float,
                 noise: NoiseSource | None = None) -> ValidationResult:
        """Validates per-example values of the test set at privacy ``epsilon``.

        Args:
          values: per-example losses (metric "loss") or per-example correctness in {0, 1}
            (metric "accuracy"), one per test example.
          epsilon: the ε granted for validation (it is consumed in full, never clamped).
          noise: the noise source; None (always, in components and pipelines) is OpenDP.

        Returns:
          The ValidationResult.

        Raises:
          InvalidPrivacyParameterError: ε not finite and > 0.
          TypeError: noise is not a noise source.
          ValueError: values is not 1-D.
        """
        epsilon = check_epsilon(epsilon)
        noise = _check_noise(noise)
        losses = self._losses(values)
        n_dp, sum_dp = _dp_count_and_sum(losses, self._loss_bound, epsilon, noise)
        return self._decide(n_dp, sum_dp, epsilon)

    def _losses(self, values: ArrayLike) -> np.ndarray:
        if self._metric == ACCURACY:
            # Correctness is clipped to [0, 1] first so a NaN counts as a wrong prediction.
            correct = np.asarray(values, dtype=np.float64)
            if correct.ndim != 1:
                raise ValueError(f"correct must be a 1-D array of per-example values, got "
                                 f"shape {correct.shape}")
            correct = np.clip(np.nan_to_num(correct, nan=0.0, posinf=1.0, neginf=0.0), 0.0, 1.0)
            return 1.0 - correct
        return _as_values(values, self._loss_bound, "losses")

    def _bounds(self, n_dp: float, sum_dp: float, epsilon: float) -> tuple[float, float, dict]:
        """(upper, lower) bounds on the expected loss, plus details. Overridden per SLA."""
        raise NotImplementedError

    def _decide(self, n_dp: float, sum_dp: float, epsilon: float) -> ValidationResult:
        upper, lower, details = self._bounds(n_dp, sum_dp, epsilon)
        estimate = sum_dp / n_dp if n_dp > 0 else math.inf
        if self._metric == ACCURACY:
            # Decide in accuracy units so that the comparison is the one the user configured.
            acc_lower, acc_upper = 1.0 - upper, 1.0 - lower
            if acc_lower >= self._target:
                outcome = Outcome.ACCEPT
            elif acc_upper < self._target:
                outcome = Outcome.REJECT
            else:
                outcome = Outcome.RETRY
            estimate, upper, lower = 1.0 - estimate, acc_upper, acc_lower
        else:
            if upper <= self._target:
                outcome = Outcome.ACCEPT
            elif lower > self._target:
                outcome = Outcome.REJECT
            else:
                outcome = Outcome.RETRY
        details = {"sla": self.sla, "loss_bound": self._loss_bound,
                   "count_noise_scale": 2.0 / epsilon if math.isfinite(epsilon) else 0.0,
                   "sum_noise_scale": (2.0 * self._loss_bound / epsilon
                                       if math.isfinite(epsilon) else 0.0),
                   "adjacency": "add/remove one test example", **details}
        return ValidationResult(
            outcome=outcome, metric_name=self._metric_name, target=self._target,
            dp_estimate=float(estimate), upper_bound=float(upper), lower_bound=float(lower),
            n_test_dp=float(n_dp), epsilon=float(epsilon), delta=0.0, eta=self._eta,
            details=details)


class _SageMeanValidator(MeanMetricValidator):
    """Sage SLA: the ACCEPT test of List. 2 and its mirrored REJECT test, each at η/2."""

    sla: ClassVar[str] = SAGE_SLA

    def _bounds(self, n_dp: float, sum_dp: float, epsilon: float) -> tuple[float, float, dict]:
        # List. 2 line 3 and 5: each test gets (1 - conf)/2. Both tests post-process the same
        # noisy count and sum, so validation costs ε once, not twice.
        eta_test = self._eta / 2.0
        accept = sage_loss_upper_bound(sum_dp, n_dp, epsilon=epsilon, eta=eta_test,
                                       loss_bound=self._loss_bound)
        reject = sage_loss_lower_bound(sum_dp, n_dp, epsilon=epsilon, eta=eta_test,
                                       loss_bound=self._loss_bound)
        details = {
            "eta_accept": eta_test,
            "eta_reject": eta_test,
            "dp_loss_sum": sum_dp,
            "accept_n_test_dp_min": float(accept["n_test_dp_min"]),
            "accept_corrected_dp_loss_sum": float(accept["corrected_dp_loss_sum"]),
            "reject_n_test_dp_min": float(reject["n_test_dp_min"]),
            "reject_n_test_dp_max": float(reject["n_test_dp_max"]),
            "reject_corrected_dp_loss_sum": float(reject["corrected_dp_loss_sum"]),
            "loss_upper_bound": float(accept["upper_bound"]),
            "loss_lower_bound": float(reject["lower_bound"]),
        }
        return float(accept["upper_bound"]), float(reject["lower_bound"]), details


class LossValidator(_SageMeanValidator):
    """Sage's SLAed loss validator (§3.3, List. 2): ACCEPT / REJECT / RETRY on a DP test loss.

    ``validate`` releases a DP count (Laplace(2/ε), line 12) and a DP sum of per-example losses
    clipped to [0, B] (Laplace(2B/ε), lines 15-16), then post-processes them twice:

    * ACCEPT (η/2): ``sage_loss_upper_bound`` ≤ target (lines 11-25). With probability ≥ 1 − η/2,
      ACCEPT implies expected loss ≤ target (Proposition 3.1 at η/2).
    * REJECT (η/2): ``sage_loss_lower_bound`` > target. With probability ≥ 1 − η/2, REJECT
      implies expected loss > target.
    * RETRY otherwise.

    Overall, with probability ≥ 1 − η the decision is not wrong. Validation is (ε, 0)-DP under
    add/remove-one adjacency of the test set; ``dp_event(epsilon)`` is that exact charge.

    Args:
      target: target expected loss τ_loss (≥ 0).
      loss_bound: B; losses are clipped to [0, B] (List. 2 line 15).
      eta: 1 − confidence (List. 1 line 30: confidence=0.95 → η = 0.05).
      metric_name: name to report (e.g. "mse").

    Raises:
      ValueError: η not in (0, 1), B not finite > 0, target not finite ≥ 0.
    """

    def __init__(self, *, target: float, loss_bound: float, eta: float,
                 metric_name: str = LOSS) -> None:
        super().__init__(target=target, eta=eta, loss_bound=loss_bound, metric=LOSS,
                         metric_name=metric_name)


class AccuracyValidator(_SageMeanValidator):
    """Sage's SLAed accuracy validator (§3.3): the loss validator on the 0/1 loss (B = 1).

    ``validate(correct, ...)`` takes per-example correctness in {0, 1} and runs the loss
    validator on the error ``1 − correct`` with target ``1 − target``. Hence:

    * ACCEPT iff the DP lower bound on accuracy, 1 − (Sage upper bound on the error), is
      ≥ target: w.p. ≥ 1 − η/2 ACCEPT implies expected accuracy ≥ target;
    * REJECT iff the DP upper bound on accuracy, 1 − (Sage lower bound on the error), is
      < target: w.p. ≥ 1 − η/2 REJECT implies expected accuracy < target;
    * RETRY otherwise.

    Bernstein on the error is tight for accurate models (variance ≤ error rate). (ε, 0)-DP under
    add/remove-one adjacency.

    Args:
      target: target accuracy in [0, 1].
      eta: 1 − confidence.

    Raises:
      ValueError: η not in (0, 1) or target not in [0, 1].
    """

    def __init__(self, *, target: float, eta: float, metric_name: str = ACCURACY) -> None:
        super().__init__(target=target, eta=eta, loss_bound=1.0, metric=ACCURACY,
                         metric_name=metric_name)


# ---------------------------------------------------------------------------------------------
# Absolute error of a sum-based statistic (a DP mean).


class SumStatisticValidator:
    """SLAed validator of the absolute error of a DP mean (§3.3, statistics pipelines).

    The statistic is the DP mean of List. 1 lines 33-42 (one key): ``r = s̃ / ñ`` with
    ``ñ = n + Laplace(2/ε)`` and ``s̃ = Σ clip(x_i, 0, B) + Laplace(2B/ε)``, computed on n i.i.d.
    values with expected value μ. The target is an absolute error: ``|r − μ| ≤ target``.

    Error bound. Since ``r − μ = ((S − nμ) + Z_s − μ·Z_n) / ñ`` for ñ > 0, each term is bounded at
    η/3 (union bound, total η):

    * DP noise of the count (known scale b_n = 2/ε, two-sided): |Z_n| ≤ b_n·ln(3/η), hence
      μ·|Z_n| ≤ B·b_n·ln(3/η) and n ≤ n_max = ñ + b_n·ln(3/η);
    * DP noise of the sum (b_s = 2B/ε, two-sided): |Z_s| ≤ b_s·ln(3/η);
    * sampling error (two-sided Hoeffding for [0, B] values):
      |S − nμ| ≤ B·sqrt(n·ln(6/η)/2) ≤ B·sqrt(n_max·ln(6/η)/2).

    So w.p. ≥ 1 − η: |r − μ| ≤ err = (B·sqrt(n_max·ln(6/η)/2) + b_s·ln(3/η) + B·b_n·ln(3/η)) / ñ.
    ACCEPT iff err ≤ target (so ACCEPT implies |r − μ| ≤ target w.p. ≥ 1 − η), else RETRY.
    Never REJECT: err → 0 as n grows for any ε, so more data always reaches a target > 0 and
    there is no evidence to give up. Only the mean is implemented (not the variance).

    Assumptions: values are i.i.d. with support in [0, B] (shift them first otherwise; values
    outside are clipped, which biases μ); the released count and sum use exactly the noise
    scales above; add/remove-one adjacency.

    Args:
      target: target absolute error (> 0), in the units of the values.
      value_bound: B; values are clipped to [0, B].
      eta: 1 − confidence.

    Raises:
      ValueError: bad target, B or η.
    """

    sla: ClassVar[str] = SAGE_SLA

    def __init__(self, *, target: float, value_bound: float, eta: float,
                 metric_name: str = "absolute_error") -> None:
        self._target = check_positive(target, "target")
        self._value_bound = check_positive(value_bound, "value_bound")
        self._eta = _check_eta(eta)
        self._metric_name = metric_name

    @property
    def target(self) -> float:
        """The target absolute error."""
        return self._target

    @property
    def eta(self) -> float:
        """η = 1 − confidence."""
        return self._eta

    @property
    def value_bound(self) -> float:
        """B: values are clipped to [0, B]."""
        return self._value_bound

    def dp_event(self, epsilon: float) -> dp_accounting.DpEvent:
        """The DpEvent ``validate(..., epsilon=epsilon)`` consumes: the DP mean's release.

        ``validate_release`` consumes nothing more (post-processing of a released statistic).

        Raises:
          InvalidPrivacyParameterError: ε not finite and > 0.
        """
        return _count_and_sum_event(epsilon)

    def error_bound(self, n_dp: ArrayLike, *, epsilon: float) -> np.ndarray:
        """The w.p. ≥ 1 − η bound on |r − μ| given the DP count (``inf`` where ñ ≤ 0).

        Args:
          n_dp: the released DP count ñ (scalar or array).
          epsilon: the ε the mean was released with (count 2/ε, sum 2B/ε).

        Raises:
          InvalidPrivacyParameterError: ε not finite and > 0.
        """
        epsilon = check_epsilon(epsilon)
        bound, eta = self._value_bound, self._eta
        n_dp = np.asarray(n_dp, dtype=np.float64)
        count_tail = (2.0 / epsilon) * math.log(3.0 / eta)
        sum_tail = (2.0 * bound / epsilon) * math.log(3.0 / eta)
        n_max = np.maximum(n_dp + count_tail, 0.0)
        numerator = bound * np.sqrt(n_max * math.log(6.0 / eta) / 2.0) + sum_tail \
            + bound * count_tail
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(n_dp > 0, numerator / n_dp, np.inf)

    def validate(self, values: ArrayLike, *, epsilon: float,
                 noise: NoiseSource | None = None) -> ValidationResult:
        """Releases the DP mean of ``values`` at ``epsilon`` and validates its absolute error.

        Args:
          values: the per-example values the statistic is computed on.
          epsilon: the ε of the release (consumed in full: ``dp_event(epsilon)``).
          noise: the noise source; None (always, in components and pipelines) is OpenDP.

        Returns:
          The ValidationResult; ``dp_estimate`` is the released DP mean.

        Raises:
          InvalidPrivacyParameterError: ε not finite and > 0.
          TypeError: noise is not a noise source.
          ValueError: values is not 1-D.
        """
        epsilon = check_epsilon(epsilon)
        noise = _check_noise(noise)
        clipped = _as_values(values, self._value_bound, "values")
        n_dp, sum_dp = _dp_count_and_sum(clipped, self._value_bound, epsilon, noise)
        return self.validate_release(dp_sum=sum_dp, dp_count=n_dp, epsilon=epsilon)

    def validate_release(self, *, dp_sum: float, dp_count: float,
                         epsilon: float) -> ValidationResult:
        """Validates a DP mean already released as ``dp_sum / dp_count`` (no extra privacy cost).

        Args:
          dp_sum: the released DP sum s̃ (noise Laplace(2B/ε)).
          dp_count: the released DP count ñ (noise Laplace(2/ε)).
          epsilon: the ε the statistic was released with (List. 1 lines 37-41 split), not a
            new charge: the result's ``epsilon`` reports it for the record.

        Returns:
          The ValidationResult: ``dp_estimate`` is the DP mean r, ``upper_bound`` the bound err
          on |r − μ| (``lower_bound`` 0), ``details["mean_interval"]`` is (r − err, r + err).

        Raises:
          InvalidPrivacyParameterError: ε not finite and > 0.
          ValueError: dp_sum or dp_count not finite.
        """
        epsilon = check_epsilon(epsilon)
        dp_sum = _check_number(dp_sum, "dp_sum")
        dp_count = _check_number(dp_count, "dp_count")
        err = float(self.error_bound(dp_count, epsilon=epsilon))
        estimate = dp_sum / dp_count if dp_count > 0 else math.nan
        outcome = Outcome.ACCEPT if err <= self._target else Outcome.RETRY
        details = {
            "sla": self.sla, "value_bound": self._value_bound, "dp_sum": dp_sum,
            "count_noise_scale": 2.0 / epsilon,
            "sum_noise_scale": 2.0 * self._value_bound / epsilon,
            "absolute_error_bound": err, "adjacency": "add/remove one example",
            "released_statistic": "mean",
        }
        details["mean_interval"] = ((estimate - err, estimate + err) if math.isfinite(err)
                                    else (-math.inf, math.inf))
        return ValidationResult(
            outcome=outcome, metric_name=self._metric_name, target=self._target,
            dp_estimate=float(estimate), upper_bound=err, lower_bound=0.0,
            n_test_dp=float(dp_count), epsilon=epsilon, delta=0.0, eta=self._eta,
            details=details)
