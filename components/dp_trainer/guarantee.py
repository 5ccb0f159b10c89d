"""What a DP training run guarantees: the run_fn's report, and its independent verification.

Sage §3.1 / List. 1: the trainer spends exactly the ``train`` part of the run's privacy plan,
which the gate charged to the granted blocks. The user's ``run_fn`` trains and *reports* the DP
parameters it used (:func:`report_from`); the DPTrainer executor then re-derives the privacy cost
from those parameters alone, with dp_accounting, and accepts the model only if it fits the part
(:func:`verify_report`):

* ``basic`` part (ε, δ): the reported δ must equal the part's δ, and the ε recomputed from the
  reported noise multiplier (and, for DP-SGD, batch size, number of examples and epochs) must be
  ≤ the part's ε.
* ``rdp`` part (a DpEvent): the reported event must equal the part's event exactly, and the
  reported hyper-parameters must be the ones the event describes. ε is then reported at a δ the
  executor chooses (the part's ``delta`` param, else the stream's δ_g).

DP-SGD accounting (``sage_tfx.dp.dpsgd``): Poisson sampling with ``q = batch_size / n`` accounted
and run (``sage_tfx.dp.keras_dpsgd.poisson_batches``: every example joins every step
independently with probability q; the noisy clipped-gradient sum is divided by the expected batch
size q·n); add-or-remove-one adjacency; one example per microbatch. In ``rdp`` mode the plan
fixes q, σ and the number of steps T up front; the trainer runs exactly T steps sampling with
that q (``batch_size`` = ``round(q · n)`` is only the nominal size it reports).

This module imports no TensorFlow or TFX: it is plain accounting on dicts.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import dp_accounting
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.ledger import accounting
from sage_tfx.dp import dpsgd
from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.errors import InvalidPrivacyParameterError

# Algorithms a DPTrainer run_fn may report (Sage Tab. 1: NN / LG by DP-SGD, LR by AdaSSP).
DPSGD = "dpsgd"
ADASSP = "adassp"
LOGISTIC = "logistic"
ALGORITHMS = (DPSGD, ADASSP, LOGISTIC)

# The sampling scheme recorded on the model (what the accounting assumed, what training ran).
DPSGD_SAMPLING = "poisson (each example independently with probability q per step)"
FULL_BATCH_SAMPLING = "none (one pass over the whole dataset)"

# The report the run_fn writes (then replaced by the verified record), in the Model artifact.
GUARANTEE_FILE_NAME = "dp_guarantee.json"

# Keys the executor adds to fn_args.custom_config; user custom_config keys must not use the prefix.
RESERVED_PREFIX = "sage_"
TRAIN_PART_CONFIG_KEY = "sage_train_part"        # PlanPart.to_dict() of the plan's "train" part
GRANT_ID_CONFIG_KEY = "sage_grant_id"            # the grant the run spends
GUARANTEE_PATH_CONFIG_KEY = "sage_guarantee_path"  # where report_guarantee writes
# The membership-inference audit a run_fn may add to the Model artifact (not DP: an audit).
MEMBERSHIP_FILE_NAME = "membership_inference.json"
NUM_TRAIN_RECORDS_CONFIG_KEY = "sage_num_train_records"  # records in the train split(s)
REPORT_DELTA_CONFIG_KEY = "sage_report_delta"    # rdp parts: δ at which ε is reported

# Relative tolerance between a reported ε and the executor's recomputation (same code, same
# inputs: they agree to the last bit; the slack only absorbs JSON round trips).
_EPSILON_RTOL = 1e-9


class GuaranteeMismatchError(InvalidPrivacyParameterError):
    """A run_fn's report does not fit the plan's train part, or is not self-consistent."""


# ---------------------------------------------------------------------------------------------
# DP-SGD settings for a plan part.


@dataclasses.dataclass(frozen=True)
class DPSGDRun:
    """The DP-SGD hyper-parameters that spend a plan's train part, and what they guarantee.

    Attributes:
      mode: ``"basic"`` (σ calibrated to the part's (ε, δ)) or ``"rdp"`` (σ, q, T from the event).
      noise_multiplier: σ, noise std / ``l2_norm_clip`` on the summed clipped gradients.
      l2_norm_clip: Per-example gradient clipping norm C.
      batch_size: Nominal examples per step (expected size under Poisson sampling; rdp:
        ``round(q · n)``).
      num_examples: n, the real number of training examples.
      steps: Exactly the number of DP-SGD steps to run (and accounted).
      epochs: ``steps · batch_size / n`` (rdp; may be fractional) or the requested epochs (basic).
      sampling_probability: The accounted q (``batch_size / n`` in basic mode; the event's q in
        rdp mode), the probability training samples each example with.
      epsilon: ε of ``event`` at ``delta`` by ``accountant``.
      delta: δ.
      accountant: ``"rdp"`` or ``"pld"``.
      event: The accounted DpEvent (in rdp mode: the plan's event itself).
    """

    mode: str
    noise_multiplier: float
    l2_norm_clip: float
    batch_size: int
    num_examples: int
    steps: int
    epochs: float
    sampling_probability: float
    epsilon: float
    delta: float
    accountant: str
    event: dp_event_lib.DpEvent


def parse_dpsgd_event(event: Any) -> tuple[float, float, int]:
    """(q, σ, T) of a DP-SGD event ``SelfComposed(PoissonSampled(q, Gaussian(σ)), T)``.

    A bare ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` is one step (T = 1).

    Raises:
      GuaranteeMismatchError: any other shape (the trainer cannot run it as DP-SGD).
    """
    steps = 1
    inner = event
    if isinstance(inner, dp_event_lib.SelfComposedDpEvent):
        steps, inner = inner.count, inner.event
    if not (isinstance(inner, dp_event_lib.PoissonSampledDpEvent)
            and isinstance(inner.event, dp_event_lib.GaussianDpEvent)):
        raise GuaranteeMismatchError(
            "the plan's train part is not a DP-SGD event: expected SelfComposedDpEvent("
            "PoissonSampledDpEvent(q, GaussianDpEvent(noise_multiplier)), steps), got "
            f"{event}")
    q = float(inner.sampling_probability)
    sigma = float(inner.event.noise_multiplier)
    if not 0 < q <= 1:
        raise GuaranteeMismatchError(f"DP-SGD sampling probability must lie in (0, 1], got {q}")
    if isinstance(steps, bool) or int(steps) != steps or steps < 1:
        raise GuaranteeMismatchError(f"DP-SGD steps must be a whole number ≥ 1, got {steps!r}")
    return q, dpsgd.check_positive(sigma, "noise_multiplier"), int(steps)


def fixed_batch_size(sampling_probability: float, num_examples: int) -> int:
    """``round(q · n)``: the nominal batch size of Poisson sampling with rate q (reported).

    Raises:
      GuaranteeMismatchError: the batch would be empty (q · n < 0.5).
    """
    batch = int(round(sampling_probability * num_examples))
    if batch < 1:
        raise GuaranteeMismatchError(
            f"sampling probability {sampling_probability} × {num_examples} training examples "
            "rounds to an empty batch: the plan's DP-SGD event was made for far more data")
    return min(batch, num_examples)


def dpsgd_run_for_part(part: plan_lib.PlanPart, *, num_examples: int, batch_size: int,
                       epochs: float, l2_norm_clip: float, accountant: str = dpsgd.RDP,
                       report_delta: Optional[float] = None) -> DPSGDRun:
    """The DP-SGD settings that spend ``part`` on ``num_examples`` training examples.

    * basic part: σ is calibrated (``sage_tfx.dp.dpsgd.calibrate_noise_multiplier``) so that
      ``batch_size`` / ``epochs`` over the real ``num_examples`` is (ε, δ)-DP for ``accountant``;
      the run has ``ceil(epochs · n / batch_size)`` steps.
    * rdp part: ``batch_size`` and ``epochs`` are ignored: the event fixes σ, q and the steps T;
      the nominal batch size is ``round(q · n)`` (training samples with q itself) and ε is
      reported at ``report_delta`` by the RDP accountant.

    Raises:
      GuaranteeMismatchError: an rdp part that is not a DP-SGD event, or that needs a batch of 0.
      InvalidPrivacyParameterError: bad sizes, clip, δ, or an unreachable ε.
    """
    l2_norm_clip = dpsgd.check_positive(l2_norm_clip, "l2_norm_clip")
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 1:
        raise InvalidPrivacyParameterError(
            f"num_examples must be an int ≥ 1, got {num_examples!r}")
    if part.mode == accounting.BASIC:
        delta = float(part.delta or 0.0)
        if delta <= 0:
            raise InvalidPrivacyParameterError(
                f"the plan's train part has delta={part.delta!r}: DP-SGD (Gaussian noise) needs "
                "delta > 0; give the train part an (epsilon, delta) with delta > 0")
        sigma = dpsgd.calibrate_noise_multiplier(part.epsilon, delta, batch_size, num_examples,
                                                 epochs, accountant)
        event = dpsgd.dpsgd_event(sigma, batch_size, num_examples, epochs)
        return DPSGDRun(
            mode=accounting.BASIC, noise_multiplier=sigma, l2_norm_clip=l2_norm_clip,
            batch_size=int(batch_size), num_examples=num_examples,
            steps=dpsgd.dpsgd_steps(batch_size, num_examples, epochs), epochs=float(epochs),
            sampling_probability=batch_size / num_examples,
            epsilon=dpsgd.dpsgd_epsilon(event, delta, accountant), delta=delta,
            accountant=dpsgd.check_accountant(accountant), event=event)
    q, sigma, steps = parse_dpsgd_event(part.event)
    if report_delta is None:
        raise InvalidPrivacyParameterError("an rdp train part needs a delta to report epsilon at")
    batch = fixed_batch_size(q, num_examples)
    return DPSGDRun(
        mode=accounting.RDP, noise_multiplier=sigma, l2_norm_clip=l2_norm_clip,
        batch_size=batch, num_examples=num_examples, steps=steps,
        epochs=steps * batch / num_examples, sampling_probability=q,
        epsilon=dpsgd.dpsgd_epsilon(part.event, report_delta, dpsgd.RDP),
        delta=float(report_delta), accountant=dpsgd.RDP, event=part.event)


# ---------------------------------------------------------------------------------------------
# The report a run_fn writes.


def report_from(guarantee: Any, *, algorithm: Optional[str] = None,
                trained_steps: Optional[int] = None, num_examples: Optional[int] = None,
                **extra: Any) -> dict:
    """The JSON-able report of a training run's DP guarantee.

    Args:
      guarantee: A :class:`DPSGDRun`, a ``sage_tfx.dp.dpsgd.DPGuarantee`` (DP-SGD, basic mode), an
        ``AdaSSPResult`` (``sage_tfx.dp.adassp``), a ``DPLogisticResult``
        (``sage_tfx.dp.logistic``), or a dict with the report's keys.
      algorithm: Overrides the algorithm inferred from the type (``dpsgd``/``adassp``/``logistic``).
      trained_steps: DP-SGD: the optimizer steps that actually ran (checked ≤ accounted steps).
      num_examples: The number of training examples, for algorithms whose guarantee does not
        carry it (AdaSSP); checked ≤ the records of the train split and recorded on the model.
      **extra: More JSON-able facts to keep in the report (e.g. hidden units, bounds).

    Raises:
      TypeError: an unknown guarantee type.
    """
    if isinstance(guarantee, DPSGDRun):
        out = {"algorithm": DPSGD, "mode": guarantee.mode,
               "noise_multiplier": guarantee.noise_multiplier,
               "l2_norm_clip": guarantee.l2_norm_clip, "batch_size": guarantee.batch_size,
               "num_examples": guarantee.num_examples, "steps": guarantee.steps,
               "epochs": guarantee.epochs,
               "sampling_probability": guarantee.sampling_probability,
               "epsilon": guarantee.epsilon, "delta": guarantee.delta,
               "accountant": guarantee.accountant,
               "event": accounting.event_to_dict(guarantee.event)}
    elif isinstance(guarantee, dpsgd.DPGuarantee):
        out = {"algorithm": DPSGD, "mode": accounting.BASIC,
               "noise_multiplier": guarantee.noise_multiplier,
               "l2_norm_clip": guarantee.l2_norm_clip, "batch_size": guarantee.batch_size,
               "num_examples": guarantee.num_examples, "steps": guarantee.steps,
               "epochs": guarantee.epochs, "epsilon": guarantee.epsilon,
               "delta": guarantee.delta, "accountant": guarantee.accountant,
               "event": accounting.event_to_dict(guarantee.event)}
    elif type(guarantee).__name__ == "AdaSSPResult":
        out = {"algorithm": ADASSP, "noise_multiplier": float(guarantee.noise_multiplier),
               "epsilon": float(guarantee.epsilon), "delta": float(guarantee.delta),
               "accountant": guarantee.accountant,
               "event": accounting.event_to_dict(guarantee.event),
               "x_bound": guarantee.x_bound, "y_bound": guarantee.y_bound,
               "neighboring_relation": guarantee.neighboring_relation}
    elif type(guarantee).__name__ == "DPLogisticResult":
        out = {"algorithm": LOGISTIC, "noise_multiplier": float(guarantee.noise_multiplier),
               "epsilon": float(guarantee.epsilon), "delta": float(guarantee.delta),
               "accountant": guarantee.accountant,
               "event": accounting.event_to_dict(guarantee.event),
               "num_examples": int(guarantee.num_examples), "x_bound": guarantee.x_bound,
               "l2_reg": guarantee.l2_reg, "sensitivity": guarantee.sensitivity,
               "neighboring_relation": guarantee.neighboring_relation}
    elif isinstance(guarantee, dict):
        out = dict(guarantee)
    else:
        raise TypeError(
            "report a DPSGDRun, sage_tfx.dp.dpsgd.DPGuarantee, AdaSSPResult, DPLogisticResult or a "
            f"dict, got {type(guarantee).__name__}")
    if algorithm is not None:
        out["algorithm"] = algorithm
    if trained_steps is not None:
        out["trained_steps"] = int(trained_steps)
    if num_examples is not None:
        if out.get("num_examples") not in (None, int(num_examples)):
            raise ValueError(f"num_examples={num_examples} contradicts the guarantee's "
                             f"{out['num_examples']}")
        out["num_examples"] = int(num_examples)
    if extra:
        out.setdefault("extra", {}).update(extra)
    return out


# ---------------------------------------------------------------------------------------------
# Verification.


@dataclasses.dataclass(frozen=True)
class VerifiedGuarantee:
    """A training run's DP guarantee, re-derived by the executor from the reported parameters.

    ``epsilon`` is the executor's own computation (never the run_fn's number). Fields that do not
    apply to the algorithm are None.
    """

    algorithm: str
    mode: str
    epsilon: float
    delta: float
    accountant: str
    sampling: str
    neighboring_relation: str
    num_examples: Optional[int]
    noise_multiplier: float
    event: dp_event_lib.DpEvent
    grant_id: str
    part_epsilon: Optional[float]
    part_delta: Optional[float]
    l2_norm_clip: Optional[float] = None
    batch_size: Optional[int] = None
    epochs: Optional[float] = None
    steps: Optional[int] = None
    sampling_probability: Optional[float] = None

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["event"] = accounting.event_to_dict(self.event)
        return out

    def model_properties(self) -> dict:
        """Custom properties for the Model artifact (None values left out)."""
        props = {
            "dp_epsilon": self.epsilon, "dp_delta": self.delta,
            "dp_accounting": self.accountant, "dp_sampling": self.sampling,
            "dp_num_examples": self.num_examples, "dp_noise_multiplier": self.noise_multiplier,
            "dp_l2_norm_clip": self.l2_norm_clip, "dp_batch_size": self.batch_size,
            "dp_epochs": self.epochs, "dp_steps": self.steps, "dp_algorithm": self.algorithm,
            "dp_mode": self.mode, "dp_neighboring_relation": self.neighboring_relation,
            "dp_event_json": accounting.event_to_json(self.event), "grant_id": self.grant_id,
        }
        return {k: v for k, v in props.items() if v is not None}


def _need(report: dict, key: str) -> Any:
    if report.get(key) is None:
        raise GuaranteeMismatchError(
            f"the run_fn's DP report lacks {key!r} (report keys: {sorted(report)}); report with "
            "sage_tfx.components.dp_trainer.report_guarantee(fn_args, guarantee)")
    return report[key]


def _count(report: dict, key: str) -> int:
    value = _need(report, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value \
            or value < 1:
        raise GuaranteeMismatchError(f"reported {key} must be a whole number ≥ 1, got {value!r}")
    return int(value)


def _same_float(a: Any, b: float) -> bool:
    return (isinstance(a, (int, float)) and not isinstance(a, bool)
            and accounting.exact(float(a)) == accounting.exact(float(b)))


def _reported_event(report: dict) -> Optional[dp_event_lib.DpEvent]:
    if report.get("event") is None:
        return None
    try:
        return accounting.event_from_dict(report["event"])
    except (ValueError, TypeError, KeyError) as e:
        raise GuaranteeMismatchError(f"the reported event is not a DpEvent: {e}") from e


def _check_reported_epsilon(report: dict, epsilon: float) -> None:
    reported = report.get("epsilon")
    if reported is not None and not math.isclose(float(reported), epsilon,
                                                 rel_tol=_EPSILON_RTOL, abs_tol=1e-12):
        raise GuaranteeMismatchError(
            f"the run_fn reported epsilon={reported} but its parameters give epsilon={epsilon}")


def _algorithm_event(algorithm: str, report: dict, num_examples: Optional[int]
                     ) -> tuple[dp_event_lib.DpEvent, float]:
    """The event the reported parameters describe (basic mode), and σ."""
    sigma = dpsgd.check_positive(_need(report, "noise_multiplier"), "noise_multiplier")
    if algorithm == DPSGD:
        return dpsgd.dpsgd_event(sigma, _count(report, "batch_size"), num_examples,
                                 float(_need(report, "epochs"))), sigma
    if algorithm == ADASSP:
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), 3), sigma
    return dp_accounting.GaussianDpEvent(sigma), sigma


def _event_sigma(algorithm: str, event: dp_event_lib.DpEvent) -> float:
    """σ of an rdp part's event for a numpy algorithm, or a mismatch if the shape is wrong."""
    if algorithm == ADASSP and isinstance(event, dp_event_lib.SelfComposedDpEvent) and (
            event.count == 3 and isinstance(event.event, dp_event_lib.GaussianDpEvent)):
        return float(event.event.noise_multiplier)
    if algorithm == LOGISTIC and isinstance(event, dp_event_lib.GaussianDpEvent):
        return float(event.noise_multiplier)
    shape = ("SelfComposedDpEvent(GaussianDpEvent(σ), 3)" if algorithm == ADASSP
             else "GaussianDpEvent(σ)")
    raise GuaranteeMismatchError(
        f"the plan's train part {event} is not a {algorithm} event ({shape})")


def verify_report(report: dict, part: plan_lib.PlanPart, *, grant_id: str,
                  num_train_records: Optional[int] = None,
                  report_delta: Optional[float] = None) -> VerifiedGuarantee:
    """Re-derives a run's DP guarantee from its report and checks it against the plan's part.

    Args:
      report: What the run_fn reported (:func:`report_from`).
      part: The plan's train part the run spent.
      grant_id: The grant that charged the part.
      num_train_records: Records in the train split(s); the reported number of training
        examples may not exceed it (fewer is allowed: a run_fn may drop rows without a label).
      report_delta: rdp parts: the δ at which ε is reported.

    Returns:
      The verified guarantee (ε recomputed here, with dp_accounting).

    Raises:
      GuaranteeMismatchError: the report is incomplete, inconsistent, or spends more than the
        part (or, in rdp mode, anything but exactly the part's event).
    """
    if not isinstance(report, dict):
        raise GuaranteeMismatchError(f"the DP report must be a JSON object, got {report!r}")
    algorithm = report.get("algorithm")
    if algorithm not in ALGORITHMS:
        raise GuaranteeMismatchError(
            f"reported algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    mode = part.mode
    if report.get("mode") not in (None, mode):
        raise GuaranteeMismatchError(
            f"the run_fn trained for a {report['mode']} part but the plan's train part is {mode}")

    num_examples = None
    if algorithm == DPSGD or report.get("num_examples") is not None:
        num_examples = _count(report, "num_examples")
        if num_train_records is not None and num_examples > num_train_records:
            raise GuaranteeMismatchError(
                f"the run_fn reported {num_examples} training examples but the train split holds "
                f"only {num_train_records}: the sampling probability would be understated")
    sampling = DPSGD_SAMPLING if algorithm == DPSGD else FULL_BATCH_SAMPLING
    neighboring = report.get("neighboring_relation") or dpsgd.ADD_OR_REMOVE_ONE
    if neighboring != dpsgd.ADD_OR_REMOVE_ONE:
        # The ledger composes charges under add/remove-one adjacency (as dp_accounting does); a
        # replace-one guarantee with a public n does not imply it, so the charge would not cover
        # the model. Train such models with DP-SGD (e.g. logistic regression as a 1-unit model).
        raise GuaranteeMismatchError(
            f"the run_fn's guarantee is for {neighboring!r} adjacency, but the ledger accounts "
            f"{dpsgd.ADD_OR_REMOVE_ONE!r}: its charge would not cover this model")
    reported_event = _reported_event(report)

    if mode == accounting.BASIC:
        part_delta = float(part.delta or 0.0)
        delta = _need(report, "delta")
        if not _same_float(delta, part_delta):
            raise GuaranteeMismatchError(
                f"the run_fn reported delta={delta} but the plan's train part has "
                f"delta={part_delta}")
        accountant = _need(report, "accountant")
        try:
            dpsgd.check_accountant(accountant)
        except InvalidPrivacyParameterError as e:
            raise GuaranteeMismatchError(str(e)) from e
        event, sigma = _algorithm_event(algorithm, report, num_examples)
        if reported_event is not None and (accounting.event_to_json(reported_event)
                                           != accounting.event_to_json(event)):
            raise GuaranteeMismatchError(
                f"the reported event {reported_event} is not the one its parameters describe "
                f"({event})")
        epsilon = dpsgd.dpsgd_epsilon(event, part_delta, accountant)
        _check_reported_epsilon(report, epsilon)
        if not epsilon <= part.epsilon:
            raise GuaranteeMismatchError(
                f"the run spent epsilon={epsilon} ({accountant}, delta={part_delta}) but the "
                f"plan's train part allows epsilon={part.epsilon}")
        part_epsilon = part.epsilon
    else:
        if report_delta is None:
            raise GuaranteeMismatchError("an rdp train part needs a delta to report epsilon at")
        if reported_event is None or (accounting.event_to_json(reported_event)
                                      != accounting.event_to_json(part.event)):
            raise GuaranteeMismatchError(
                f"the run_fn reported the event {reported_event}, but the plan's train part is "
                f"{part.event}: an rdp part must be spent exactly")
        event, accountant, part_delta, part_epsilon = part.event, dpsgd.RDP, None, None
        if algorithm == DPSGD:
            _, sigma, _ = parse_dpsgd_event(event)
        else:
            sigma = _event_sigma(algorithm, event)
        if not _same_float(_need(report, "noise_multiplier"), sigma):
            raise GuaranteeMismatchError(
                f"the run_fn reported noise_multiplier={report['noise_multiplier']} but the "
                f"plan's event has {sigma}")
        epsilon = dpsgd.dpsgd_epsilon(event, report_delta, accountant)
        delta = report_delta

    fields: dict[str, Any] = {}
    if algorithm == DPSGD:
        fields = _verify_dpsgd_steps(report, mode, event, num_examples)
    return VerifiedGuarantee(
        algorithm=algorithm, mode=mode, epsilon=float(epsilon), delta=float(delta),
        accountant=accountant, sampling=sampling, neighboring_relation=neighboring,
        num_examples=num_examples, noise_multiplier=float(sigma), event=event,
        grant_id=grant_id, part_epsilon=part_epsilon, part_delta=part_delta, **fields)


def _verify_dpsgd_steps(report: dict, mode: str, event: dp_event_lib.DpEvent,
                        num_examples: int) -> dict:
    """Batch size, steps and epochs of a DP-SGD report, checked against the accounted event."""
    l2_norm_clip = dpsgd.check_positive(_need(report, "l2_norm_clip"), "l2_norm_clip")
    batch_size = _count(report, "batch_size")
    q, _, steps = parse_dpsgd_event(event)
    if mode == accounting.RDP:
        expected = fixed_batch_size(q, num_examples)
        if batch_size != expected:
            raise GuaranteeMismatchError(
                f"the run_fn trained with batch_size={batch_size}, but the plan's sampling "
                f"probability {q} over {num_examples} examples means batch_size={expected}")
    epochs = report.get("epochs")
    epochs = float(epochs) if epochs is not None else steps * batch_size / num_examples
    reported_steps = report.get("steps")
    if reported_steps is not None and reported_steps != steps:
        raise GuaranteeMismatchError(
            f"the run_fn reported {reported_steps} steps but the accounted event has {steps}")
    trained = report.get("trained_steps")
    if trained is None:
        raise GuaranteeMismatchError(
            "a DP-SGD report needs trained_steps (the optimizer steps that ran), to check they "
            "do not exceed the accounted steps")
    if isinstance(trained, bool) or not isinstance(trained, int) or not 0 < trained <= steps:
        raise GuaranteeMismatchError(
            f"the model trained {trained!r} steps but {steps} were accounted")
    return {"l2_norm_clip": l2_norm_clip, "batch_size": batch_size, "epochs": epochs,
            "steps": steps, "sampling_probability": q}
