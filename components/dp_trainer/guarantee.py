"""What a DP training run guarantees: the record of what the executor ran, and its verification.

Sage §3.1 / List. 1: the trainer spends exactly the ``train`` part of the run's privacy plan,
which the gate charged to the granted blocks. The DPTrainer executor trains the user's
architecture itself (``loop.py``, or AdaSSP) and records what actually ran — the noisy updates
counted inside the training step, the noise multiplier they added, the sampling probability and
maximum batch size the batches were built with, the number of examples — as a
:class:`TrainingRecord`. :func:`verify_record` re-derives the privacy cost from that record
alone, with dp_accounting, and accepts the model only if it fits the part:

* ``basic`` part (ε, δ): the truncation δ of what ran (``sage_tfx.dp.poisson_batching``,
  recomputed from n, q, T and B) plus the δ at which the event's ε is computed must fit the
  part's δ, and that ε — by the accountant σ was calibrated with (``pld`` by default,
  pessimistic: an upper bound; ``rdp`` on request) — must be ≤ the part's ε. The ledger charged
  the part's (ε, δ) — a pair, never RDP orders.
* ``rdp`` part (a DpEvent): the event that ran must equal the part's event exactly, and its
  batches are never truncated (a DpEvent cannot carry truncation's δ; oversized steps are
  spilled into chunks: exactly Poisson). ε is then reported at a δ the executor chooses (the
  part's ``delta`` param, else the stream's δ_g).

DP-SGD accounting (``sage_tfx.dp.dpsgd``): Poisson sampling with ``q = batch_size / n`` accounted
and run (``batching.py``: every example joins every step independently with probability q; the
noisy clipped-gradient sum is divided by the expected batch size q·n); add-or-remove-one
adjacency; one example per microbatch. In ``rdp`` mode the plan fixes q, σ and the number of
steps T up front; the trainer runs exactly T steps sampling with that q (``batch_size`` =
``round(q · n)`` is only the nominal size it records).

This module imports no TensorFlow or TFX: it is plain accounting on values.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import dp_accounting
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.ledger import accounting
from sage_tfx.dp import dpsgd, poisson_batching
from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.errors import InvalidPrivacyParameterError

# Algorithms the DPTrainer executor runs (Sage Tab. 1: NN / LG by DP-SGD, LR by AdaSSP).
DPSGD = "dpsgd"
ADASSP = "adassp"
ALGORITHMS = (DPSGD, ADASSP)

# The sampling scheme recorded on the model (what the accounting assumed, what training ran).
DPSGD_SAMPLING = "poisson (each example independently with probability q per step)"
FULL_BATCH_SAMPLING = "none (one pass over the whole dataset)"

# The verified record of a training run, in the Model artifact.
GUARANTEE_FILE_NAME = "dp_guarantee.json"
# A membership-inference audit file DPModelValidator shows if a Model holds one (not DP).
MEMBERSHIP_FILE_NAME = "membership_inference.json"

# How the Model's guarantee was verified (custom property ``dp_verification``): from what the
# executor observed its own training run. DPModelValidator blesses no DPTrainer model without it.
VERIFICATION_PROPERTY = "dp_verification"
OBSERVED = "observed"


class GuaranteeMismatchError(InvalidPrivacyParameterError):
    """A training run does not fit the plan's train part."""


class UnverifiedTrainingError(GuaranteeMismatchError):
    """A model whose DP training the executor did not run and observe, or whose export carries
    something else than the DP-trained model. Never published, never blessed."""


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
      epsilon: ε of ``event`` at ``dpsgd_delta`` by ``accountant``.
      delta: The whole δ: ``dpsgd_delta + truncation_delta``.
      accountant: ``"pld"`` or ``"rdp"`` (rdp parts: always ``"rdp"``).
      event: The accounted DpEvent (in rdp mode: the plan's event itself).
      max_batch_size: B, the most examples a step trains on (truncate) or per chunk (spill).
      oversize: ``truncate`` or ``spill`` (``sage_tfx.dp.poisson_batching``).
      truncation_delta: The δ truncation at B adds (0 for spill).
      dpsgd_delta: The δ at which the untruncated event's ε is computed.
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
    max_batch_size: int
    oversize: str
    truncation_delta: float
    dpsgd_delta: float


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
                       report_delta: Optional[float] = None, oversize: Optional[str] = None,
                       max_batch_size: Optional[int] = None,
                       truncation_share: Optional[float] = None) -> DPSGDRun:
    """The DP-SGD settings that spend ``part`` on ``num_examples`` training examples.

    * basic part: the run has ``ceil(epochs · n / batch_size)`` steps at q = batch_size / n. With
      ``oversize="truncate"`` (the default) a step keeps at most B examples; B is the smallest
      multiple of 8 whose truncation δ (``poisson_batching.truncation_delta``, at the part's ε) is
      at most ``truncation_share`` (default 1 %) of the part's δ, unless ``max_batch_size``
      fixes it; σ is then calibrated (``sage_tfx.dp.dpsgd.calibrate_noise_multiplier``, by
      ``accountant``: default ``"pld"``, the pessimistic PLD, an upper bound) to the part's ε at
      the δ left, so the two δ add up to at most the part's. ``oversize="spill"`` keeps every
      example (exactly Poisson: all of δ for the event; B is then only the chunk size).
    * rdp part: ``batch_size`` and ``epochs`` are ignored: the event fixes σ, q and the steps T;
      the nominal batch size is ``round(q · n)`` (training samples with q itself) and ε is
      reported at ``report_delta`` by the RDP accountant — the accountant the ledger composes the
      charged event with. Oversized steps always spill (truncation's δ cannot be charged in a
      DpEvent): ``oversize="truncate"`` is refused.

    Raises:
      GuaranteeMismatchError: an rdp part that is not a DP-SGD event, or that needs a batch of 0,
        or truncation asked for on an rdp part.
      InvalidPrivacyParameterError: bad sizes, clip, δ, shares, a B whose truncation δ leaves no
        δ for DP-SGD, or an unreachable ε.
    """
    l2_norm_clip = dpsgd.check_positive(l2_norm_clip, "l2_norm_clip")
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 1:
        raise InvalidPrivacyParameterError(
            f"num_examples must be an int ≥ 1, got {num_examples!r}")
    share = (poisson_batching.DEFAULT_TRUNCATION_SHARE if truncation_share is None
             else truncation_share)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1:
        raise InvalidPrivacyParameterError(
            f"truncation_share must lie in (0, 1), got {truncation_share!r}")
    if part.mode == accounting.BASIC:
        delta = float(part.delta or 0.0)
        if delta <= 0:
            raise InvalidPrivacyParameterError(
                f"the plan's train part has delta={part.delta!r}: DP-SGD (Gaussian noise) needs "
                "delta > 0; give the train part an (epsilon, delta) with delta > 0")
        oversize = poisson_batching.check_oversize(oversize or poisson_batching.TRUNCATE)
        steps = dpsgd.dpsgd_steps(batch_size, num_examples, epochs)
        q = batch_size / num_examples
        budget = delta * float(share)
        if max_batch_size is None:
            max_batch_size = poisson_batching.choose_max_batch(
                num_examples, q, steps, epsilon=float(part.epsilon), delta_budget=budget)
        truncation = (poisson_batching.truncation_delta(
            float(part.epsilon), num_examples, q, steps, max_batch_size)
            if oversize == poisson_batching.TRUNCATE else 0.0)
        dpsgd_delta = sgd_delta(delta, truncation)
        sigma = dpsgd.calibrate_noise_multiplier(part.epsilon, dpsgd_delta, batch_size,
                                                 num_examples, epochs, accountant)
        event = dpsgd.dpsgd_event(sigma, batch_size, num_examples, epochs)
        return DPSGDRun(
            mode=accounting.BASIC, noise_multiplier=sigma, l2_norm_clip=l2_norm_clip,
            batch_size=int(batch_size), num_examples=num_examples, steps=steps,
            epochs=float(epochs), sampling_probability=q,
            epsilon=dpsgd.dpsgd_epsilon(event, dpsgd_delta, accountant),
            delta=dpsgd_delta + truncation, accountant=dpsgd.check_accountant(accountant),
            event=event, max_batch_size=int(max_batch_size), oversize=oversize,
            truncation_delta=truncation, dpsgd_delta=dpsgd_delta)
    q, sigma, steps = parse_dpsgd_event(part.event)
    if report_delta is None:
        raise InvalidPrivacyParameterError("an rdp train part needs a delta to report epsilon at")
    if oversize not in (None, poisson_batching.SPILL):
        raise GuaranteeMismatchError(
            f"oversize={oversize!r} on an rdp train part: the charged DpEvent is the untruncated "
            "Poisson mechanism and cannot carry truncation's delta; rdp parts spill oversized "
            "steps into chunks (oversize='spill')")
    batch = fixed_batch_size(q, num_examples)
    if max_batch_size is None:
        max_batch_size = poisson_batching.choose_max_batch(
            num_examples, q, steps, epsilon=0.0, delta_budget=SPILL_CHUNK_OVERFLOW)
    return DPSGDRun(
        mode=accounting.RDP, noise_multiplier=sigma, l2_norm_clip=l2_norm_clip,
        batch_size=batch, num_examples=num_examples, steps=steps,
        epochs=steps * batch / num_examples, sampling_probability=q,
        epsilon=dpsgd.dpsgd_epsilon(part.event, report_delta, dpsgd.RDP),
        delta=float(report_delta), accountant=dpsgd.RDP, event=part.event,
        max_batch_size=int(max_batch_size), oversize=poisson_batching.SPILL,
        truncation_delta=0.0, dpsgd_delta=float(report_delta))


# A spilled run's chunk size B: P[some step needs a second chunk] about this (memory only).
SPILL_CHUNK_OVERFLOW = 1e-6


def sgd_delta(delta: float, truncation: float) -> float:
    """The δ left for the untruncated event: the largest float d with d + truncation ≤ delta.

    Raises:
      InvalidPrivacyParameterError: truncation leaves no δ (B too small for the part's δ).
    """
    if not truncation < delta:
        raise InvalidPrivacyParameterError(
            f"truncating batches at this max_batch_size costs delta {truncation:.3g}, all of the "
            f"train part's delta {delta:.3g}: raise max_batch_size (or leave it unset)")
    left = delta - truncation
    while left + truncation > delta:
        left = math.nextafter(left, 0.0)
    return left


# ---------------------------------------------------------------------------------------------
# What ran, and its verification.


@dataclasses.dataclass(frozen=True)
class TrainingRecord:
    """What one training run of the executor actually ran (``loop.DPSGDLoop`` or AdaSSP).

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
      max_batch_size: DP-SGD: B the batches were built with.
      oversize: DP-SGD: ``truncate`` or ``spill``.
      truncated_steps: DP-SGD: steps whose batch was truncated (observed in the Beam job).
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
    max_batch_size: Optional[int] = None
    oversize: Optional[str] = None
    truncated_steps: Optional[int] = None

    def truncation_delta(self, epsilon: float) -> float:
        """The δ truncation added to an ε-guarantee of the untruncated event (0 for spill)."""
        if self.algorithm != DPSGD or self.oversize != poisson_batching.TRUNCATE:
            return 0.0
        return poisson_batching.truncation_delta(epsilon, self.num_examples,
                                                 self.sampling_probability, self.steps,
                                                 self.max_batch_size)

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
    max_batch_size: Optional[int] = None
    oversize: Optional[str] = None
    truncation_delta: Optional[float] = None

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
            "dp_sampling_probability": self.sampling_probability,
            "dp_max_batch_size": self.max_batch_size, "dp_oversize": self.oversize,
            "dp_truncation_delta": self.truncation_delta, "dp_algorithm": self.algorithm,
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
    if record.algorithm == DPSGD and record.oversize not in poisson_batching.OVERSIZE_POLICIES:
        raise GuaranteeMismatchError(f"a DP-SGD record needs its oversize policy, got "
                                     f"{record.oversize!r}")
    truncation = 0.0
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
        # Truncation's δ, recomputed from what ran (at the part's ε: an upper bound), comes
        # out of the part's δ first; the untruncated event must then fit the part's ε.
        truncation = record.truncation_delta(float(part.epsilon))
        try:
            event_delta = sgd_delta(delta, truncation)
        except InvalidPrivacyParameterError as e:
            raise GuaranteeMismatchError(str(e)) from e
        epsilon = dpsgd.dpsgd_epsilon(event, event_delta, accountant)
        if not epsilon <= part.epsilon:
            raise GuaranteeMismatchError(
                f"the run spent epsilon={epsilon} ({accountant}, delta={event_delta} + "
                f"truncation {truncation}) but the plan's train part allows "
                f"epsilon={part.epsilon}")
        part_epsilon, part_delta = part.epsilon, delta
        delta = event_delta + truncation
    else:
        if record.algorithm == DPSGD and record.oversize != poisson_batching.SPILL:
            raise GuaranteeMismatchError(
                "an rdp train part's batches must not be truncated: the charged event is the "
                "untruncated Poisson mechanism")
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
                  "sampling_probability": record.sampling_probability,
                  "max_batch_size": record.max_batch_size, "oversize": record.oversize,
                  "truncation_delta": truncation}
    return VerifiedGuarantee(
        algorithm=record.algorithm, mode=part.mode, epsilon=float(epsilon), delta=delta,
        accountant=accountant,
        sampling=DPSGD_SAMPLING if record.algorithm == DPSGD else FULL_BATCH_SAMPLING,
        neighboring_relation=dpsgd.ADD_OR_REMOVE_ONE, num_examples=n,
        noise_multiplier=float(record.noise_multiplier), event=event, grant_id=grant_id,
        part_epsilon=part_epsilon, part_delta=part_delta, **fields)
