"""What a DP training run guarantees: the record of what the executor ran, and its verification.

Sage §3.1 / List. 1: the trainer spends exactly the ``train`` part of the run's privacy plan,
which the gate charged to the granted blocks. The DPTrainer executor owns the privacy loop
(``private.PrivateTraining``): it trains the user's model with DP-SGD (or runs AdaSSP) itself
and records what actually ran — the noisy steps counted inside the training step, the noise
multiplier they added, the sampling probability the batches were drawn with, the number of
examples — as a :class:`TrainingRecord`. :func:`verify_record` re-derives the privacy cost from
that record alone, with dp_accounting, and accepts the model only if it fits the part:

* ``basic`` part (ε, δ): the ε of the event that ran, at the part's δ, by the accountant σ was
  calibrated with (``pld`` by default, pessimistic: an upper bound; ``rdp`` on request), must be
  ≤ the part's ε. The ledger charged the part's (ε, δ) — a pair, never RDP orders.
* ``rdp`` part (a DpEvent): the event that ran must equal the part's event exactly. ε is then
  reported at a δ the executor chooses (the part's ``delta`` param, else the stream's δ_g).

A run_fn's own report (:func:`report_from`, ``run_fn_utils.report_guarantee``) is optional and
never accounted: if present, it must agree with the record (:func:`check_report`).

DP-SGD accounting (``sage_tfx.dp.dpsgd``): Poisson sampling with ``q = batch_size / n`` accounted
and run (``sage_tfx.dp.keras_dpsgd.poisson_batches``: every example joins every step
independently with probability q; the noisy clipped-gradient sum is divided by the expected batch
size q·n); add-or-remove-one adjacency; one example per microbatch. In ``rdp`` mode the plan
fixes q, σ and the number of steps T up front; the trainer runs exactly T steps sampling with
that q (``batch_size`` = ``round(q · n)`` is only the nominal size it records).

This module imports no TensorFlow or TFX: it is plain accounting on values.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import dp_accounting
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.ledger import accounting
from sage_tfx.dp import dpsgd
from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.errors import InvalidPrivacyParameterError

# Algorithms the DPTrainer executor runs (Sage Tab. 1: NN / LG by DP-SGD, LR by AdaSSP).
DPSGD = "dpsgd"
ADASSP = "adassp"
ALGORITHMS = (DPSGD, ADASSP)

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

# How the Model's guarantee was verified (custom property ``dp_verification``): from what the
# executor observed its own training run. DPModelValidator blesses no DPTrainer model without it.
VERIFICATION_PROPERTY = "dp_verification"
OBSERVED = "observed"


class GuaranteeMismatchError(InvalidPrivacyParameterError):
    """A training run (or a run_fn's report) does not fit the plan's train part."""


class UnverifiedTrainingError(GuaranteeMismatchError):
    """A model whose DP training the executor did not run and observe: e.g. a run_fn that trained
    plain Keras, trained twice, or exported another model than the one trained. Never published,
    never blessed."""


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
      accountant: ``"pld"`` or ``"rdp"`` (rdp parts: always ``"rdp"``).
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
                       epochs: float, l2_norm_clip: float,
                       accountant: str = dpsgd.DEFAULT_ACCOUNTANT,
                       report_delta: Optional[float] = None) -> DPSGDRun:
    """The DP-SGD settings that spend ``part`` on ``num_examples`` training examples.

    * basic part: σ is calibrated (``sage_tfx.dp.dpsgd.calibrate_noise_multiplier``) so that
      ``batch_size`` / ``epochs`` over the real ``num_examples`` is (ε, δ)-DP for ``accountant``
      (default ``"pld"``, the pessimistic PLD: its ε is an upper bound; ``"rdp"`` on request);
      the run has ``ceil(epochs · n / batch_size)`` steps. The run records the accountant, and
      :func:`verify_record` recomputes ε from what ran with the same one.
    * rdp part: ``batch_size`` and ``epochs`` are ignored: the event fixes σ, q and the steps T;
      the nominal batch size is ``round(q · n)`` (training samples with q itself) and ε is
      reported at ``report_delta`` by the RDP accountant — the accountant the ledger composes the
      charged event with in rdp mode, so the reported ε is the ledger's view of this event.

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
    """The JSON-able report of a training run's DP guarantee, as a run_fn states it.

    Never accounted: the executor verifies what it ran (:func:`verify_record`) and only checks
    that a report agrees with it (:func:`check_report`).

    Args:
      guarantee: A :class:`DPSGDRun`, a ``sage_tfx.dp.dpsgd.DPGuarantee`` (DP-SGD, basic mode), an
        ``AdaSSPResult`` (``sage_tfx.dp.adassp``), or a dict with the report's keys.
      algorithm: Overrides the algorithm inferred from the type (``dpsgd`` / ``adassp``).
      trained_steps: DP-SGD: the steps the run_fn believes ran.
      num_examples: The number of training examples, for algorithms whose guarantee does not
        carry it (AdaSSP).
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
    elif isinstance(guarantee, dict):
        out = dict(guarantee)
    else:
        raise TypeError(
            "report a DPSGDRun, sage_tfx.dp.dpsgd.DPGuarantee, AdaSSPResult or a dict, got "
            f"{type(guarantee).__name__}")
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
# What ran, and its verification.


@dataclasses.dataclass(frozen=True)
class TrainingRecord:
    """What one training run of the executor actually ran (``private.PrivateTraining``).

    Attributes:
      algorithm: ``dpsgd`` or ``adassp``.
      noise_multiplier: σ that ran: DP-SGD, the noise std every step added divided by
        ``l2_norm_clip`` (both read from the training step); AdaSSP, the σ its three Gaussian
        releases drew with.
      num_examples: n, the rows trained on.
      accountant: ``rdp`` / ``pld``: the accountant the run was calibrated with (basic parts).
      l2_norm_clip: DP-SGD: the clipping norm C of the step.
      sampling_probability: DP-SGD: the q every batch was Poisson-sampled with.
      steps: DP-SGD: the noisy aggregations counted inside the training step.
      batch_size: DP-SGD: the nominal (expected) batch size.
      epochs: DP-SGD: ``steps · batch_size / n`` (rdp) or the epochs asked for (basic).
    """

    algorithm: str
    noise_multiplier: float
    num_examples: int
    accountant: str
    l2_norm_clip: Optional[float] = None
    sampling_probability: Optional[float] = None
    steps: Optional[int] = None
    batch_size: Optional[int] = None
    epochs: Optional[float] = None

    def event(self) -> dp_event_lib.DpEvent:
        """The dp_accounting event of what ran.

        Raises:
          GuaranteeMismatchError: an unknown algorithm, or a DP-SGD record without q / steps.
        """
        sigma = dpsgd.check_positive(self.noise_multiplier, "noise_multiplier")
        if self.algorithm == ADASSP:
            from sage_tfx.dp import adassp
            return adassp.adassp_event(sigma)
        if self.algorithm != DPSGD:
            raise GuaranteeMismatchError(
                f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        q, steps = self.sampling_probability, self.steps
        if q is None or not 0 < q <= 1 or isinstance(steps, bool) or not isinstance(steps, int):
            raise GuaranteeMismatchError(f"a DP-SGD record needs q in (0, 1] and whole steps, "
                                         f"got q={q!r}, steps={steps!r}")
        return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
            q, dp_accounting.GaussianDpEvent(sigma)), steps)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class VerifiedGuarantee:
    """A training run's DP guarantee, derived by the executor from what it ran.

    ``epsilon`` is the executor's own computation. Fields that do not apply to the algorithm are
    None.
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
        out["verification"] = OBSERVED
        return out

    def model_properties(self) -> dict:
        """Custom properties for the Model artifact (None values left out)."""
        props = {
            "dp_epsilon": self.epsilon, "dp_delta": self.delta,
            "dp_accounting": self.accountant, "dp_sampling": self.sampling,
            "dp_num_examples": self.num_examples, "dp_noise_multiplier": self.noise_multiplier,
            "dp_l2_norm_clip": self.l2_norm_clip, "dp_batch_size": self.batch_size,
            "dp_epochs": self.epochs, "dp_steps": self.steps,
            "dp_sampling_probability": self.sampling_probability, "dp_algorithm": self.algorithm,
            "dp_mode": self.mode, "dp_neighboring_relation": self.neighboring_relation,
            "dp_event_json": accounting.event_to_json(self.event), "grant_id": self.grant_id,
            VERIFICATION_PROPERTY: OBSERVED,
        }
        return {k: v for k, v in props.items() if v is not None}


def verify_record(record: TrainingRecord, part: plan_lib.PlanPart, *, grant_id: str,
                  num_train_records: Optional[int] = None,
                  report_delta: Optional[float] = None) -> VerifiedGuarantee:
    """Derives a run's DP guarantee from what ran and checks it against the plan's part.

    Args:
      record: What the executor's training ran.
      part: The plan's train part the run spent.
      grant_id: The grant that charged the part.
      num_train_records: Records in the train split(s); the examples trained on may not exceed
        it (fewer is allowed: a run_fn may drop rows without a label).
      report_delta: rdp parts: the δ at which ε is reported.

    Returns:
      The verified guarantee (ε computed here, with dp_accounting, from the record alone).

    Raises:
      GuaranteeMismatchError: what ran spends more than the part (or, in rdp mode, anything but
        exactly the part's event).
    """
    event = record.event()
    n = record.num_examples
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise GuaranteeMismatchError(f"the run trained on {n!r} examples")
    if num_train_records is not None and n > num_train_records:
        raise GuaranteeMismatchError(
            f"the run trained on {n} examples but the train split holds only "
            f"{num_train_records}")
    if part.mode == accounting.BASIC:
        delta = float(part.delta or 0.0)
        if delta <= 0:
            raise GuaranteeMismatchError(
                f"the plan's train part has delta={part.delta!r}: {record.algorithm} (Gaussian "
                "noise) needs delta > 0")
        try:
            accountant = dpsgd.check_accountant(record.accountant)
        except InvalidPrivacyParameterError as e:
            raise GuaranteeMismatchError(str(e)) from e
        epsilon = dpsgd.dpsgd_epsilon(event, delta, accountant)
        if not epsilon <= part.epsilon:
            raise GuaranteeMismatchError(
                f"the run spent epsilon={epsilon} ({accountant}, delta={delta}) but the plan's "
                f"train part allows epsilon={part.epsilon}")
        part_epsilon, part_delta = part.epsilon, delta
    else:
        if report_delta is None:
            raise GuaranteeMismatchError("an rdp train part needs a delta to report epsilon at")
        if accounting.event_to_json(event) != accounting.event_to_json(part.event):
            raise GuaranteeMismatchError(
                f"the run ran {event}, but the plan's train part is {part.event}: an rdp part "
                "must be spent exactly")
        accountant, delta, part_epsilon, part_delta = dpsgd.RDP, float(report_delta), None, None
        epsilon = dpsgd.dpsgd_epsilon(event, delta, accountant)
    fields: dict[str, Any] = {}
    if record.algorithm == DPSGD:
        fields = {"l2_norm_clip": record.l2_norm_clip, "batch_size": record.batch_size,
                  "epochs": record.epochs, "steps": record.steps,
                  "sampling_probability": record.sampling_probability}
    return VerifiedGuarantee(
        algorithm=record.algorithm, mode=part.mode, epsilon=float(epsilon), delta=delta,
        accountant=accountant,
        sampling=DPSGD_SAMPLING if record.algorithm == DPSGD else FULL_BATCH_SAMPLING,
        neighboring_relation=dpsgd.ADD_OR_REMOVE_ONE, num_examples=n,
        noise_multiplier=float(record.noise_multiplier), event=event, grant_id=grant_id,
        part_epsilon=part_epsilon, part_delta=part_delta, **fields)


# Report keys that state what ran, and the record field each must equal.
_REPORTED_FACTS = {"algorithm": "algorithm", "noise_multiplier": "noise_multiplier",
                   "num_examples": "num_examples", "l2_norm_clip": "l2_norm_clip",
                   "sampling_probability": "sampling_probability", "steps": "steps",
                   "trained_steps": "steps"}


def check_report(report: dict, record: TrainingRecord) -> None:
    """A run_fn's (optional) report must state what ran: every fact it gives equals the record.

    Raises:
      GuaranteeMismatchError: the report is not a JSON object, or it contradicts the record.
    """
    if not isinstance(report, dict):
        raise GuaranteeMismatchError(f"the DP report must be a JSON object, got {report!r}")
    for key, field in _REPORTED_FACTS.items():
        stated, ran = report.get(key), getattr(record, field)
        if stated is None or ran is None:
            continue
        same = (stated == ran if isinstance(ran, (str, int)) and not isinstance(ran, float)
                else isinstance(stated, (int, float)) and not isinstance(stated, bool)
                and accounting.exact(float(stated)) == accounting.exact(float(ran)))
        if not same:
            raise GuaranteeMismatchError(
                f"the run_fn reported {key}={stated!r} but the executor ran {field}={ran!r}")
