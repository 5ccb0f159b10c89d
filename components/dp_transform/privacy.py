"""The DP Transform's share of a privacy plan: the ε its analyzers may spend, and the check.

Sage List. 1 / §3.1: the gate charges a run's whole :class:`~sage_tfx.adaptive.plan.PrivacyPlan`
once; ``DPTransform`` spends exactly the plan's ``transform`` part with the DP analyzers of
:mod:`sage_tfx.components.dp_transform.analyzers`, which are pure ε-DP Laplace releases.

* ``basic`` plans: the part is ``(epsilon, delta)``; the analyzers share ``epsilon`` (basic
  composition) and spend ``delta`` exactly: only DP partition selection (the DP vocabularies)
  spends δ, so a part with δ > 0 needs one, and one without δ can pay for none (an unspent δ
  would be budget the ledger charged for nothing).
* ``rdp`` plans: the part is a dp_accounting ``DpEvent`` that must be a composition
  (``ComposedDpEvent`` / ``SelfComposedDpEvent``, any nesting) of ``LaplaceDpEvent`` s, and the
  run must produce *the same Laplace mechanisms*: the multiset of Laplace noise multipliers of
  ``DPBudget.dp_event()`` must equal the plan's. (Composition is commutative and associative, so
  equal multisets have identical RDP curves — identical cost — whatever the nesting; equal
  ``event_to_json`` texts are the special case of identical nesting.) This exact check is the
  authority; the ε handed to the analyzers only calibrates them: the part's ``epsilon`` param if
  present (the ε the event was traced with), else Σ 1/noise_multiplier rounded to 12 significant
  digits (float sums of the shares rarely give back the typed ε exactly, and the split of an ε
  one ulp off yields other multipliers). :func:`transform_plan_part` builds the part from the
  ``preprocessing_fn`` itself (:func:`trace_dp_event`), with the param.

This module imports TensorFlow only inside :func:`trace_dp_event`.
"""
from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any, Callable, Mapping, Optional

import dp_accounting

from sage_tfx.ledger import accounting
from sage_tfx.errors import AccountingModeError, InvalidPrivacyParameterError
from sage_tfx.adaptive.plan import PlanPart

# rdp transform parts: the ε the part's event was traced with (PlanPart params key).
EPSILON_PARAM = "epsilon"
# A declared ε may differ from Σ 1/noise_multiplier only by float rounding of the split.
_RDP_EPSILON_RELATIVE_TOLERANCE = 1e-9


@dataclasses.dataclass(frozen=True)
class TransformBudget:
    """What the DP Transform may spend: ε for the analyzers and, for rdp plans, the exact event.

    Attributes:
      epsilon: ε handed to ``DPPreprocessingFn`` (and bound to a ``preprocessing_fn`` that takes
        ``epsilon``).
      mode: ``basic`` or ``rdp``.
      event: rdp mode: the plan part's DpEvent the run must reproduce; None in basic mode.
      delta: basic mode: the part's δ, which the DP vocabularies spend (0 without one).
    """

    epsilon: float
    mode: str
    event: Optional[dp_accounting.DpEvent] = None
    delta: float = 0.0

    @property
    def event_json(self) -> Optional[str]:
        return accounting.event_to_json(self.event) if self.event is not None else None


def laplace_noise_multipliers(event: dp_accounting.DpEvent) -> list[float]:
    """The noise multipliers of the Laplace mechanisms an event composes (NoOp events add none).

    Raises:
      AccountingModeError: the event holds anything but Laplace / NoOp events and compositions
        of them (the DP analyzers release nothing else).
    """
    if isinstance(event, dp_accounting.LaplaceDpEvent):
        return [float(event.noise_multiplier)]
    if isinstance(event, dp_accounting.NoOpDpEvent):
        return []
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return [m for e in event.events for m in laplace_noise_multipliers(e)]
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        if isinstance(event.count, bool) or not isinstance(event.count, int) or event.count < 0:
            raise InvalidPrivacyParameterError(
                f"SelfComposedDpEvent count must be an int >= 0, got {event.count!r}")
        return laplace_noise_multipliers(event.event) * event.count
    raise AccountingModeError(
        f"the transform part of an rdp plan must compose LaplaceDpEvents only (the DP analyzers "
        f"are Laplace releases), but it holds a {type(event).__name__}: "
        f"{accounting.event_to_json(event)}")


def _canonical(event: dp_accounting.DpEvent) -> list[str]:
    return sorted(repr(m) for m in laplace_noise_multipliers(event))


def events_match(spent: dp_accounting.DpEvent, planned: dp_accounting.DpEvent) -> bool:
    """Whether two Laplace compositions are the same mechanisms (equal noise-multiplier multisets).

    Raises:
      AccountingModeError: either event holds something other than Laplace compositions.
    """
    if accounting.event_to_json(spent) == accounting.event_to_json(planned):
        return True
    return _canonical(spent) == _canonical(planned)


def laplace_epsilon(event: dp_accounting.DpEvent) -> float:
    """Σ 1/noise_multiplier: the pure ε of a Laplace composition (basic composition).

    Summed exactly in decimals of the multipliers' shortest reprs, then rounded once to a float,
    so an event built from ``LaplaceMechanism(ε, ·)`` gives ε back (e.g. 1 / 20.0 + 1 / 20.0 = 0.1).

    Raises:
      AccountingModeError: not a Laplace composition.
      InvalidPrivacyParameterError: a non-positive multiplier, or no Laplace event at all.
    """
    multipliers = laplace_noise_multipliers(event)
    if not multipliers:
        raise InvalidPrivacyParameterError(
            "the transform part's event composes no Laplace mechanism: nothing to spend")
    total = Decimal(0)
    for m in multipliers:
        if not m > 0 or m == float("inf"):
            raise InvalidPrivacyParameterError(
                f"Laplace noise_multiplier must be finite and > 0, got {m!r}")
        total += Decimal(1) / accounting.exact(m)
    return accounting.check_epsilon(float(total), "transform epsilon")


def transform_budget(part: PlanPart) -> TransformBudget:
    """The DP Transform's budget from the plan's ``transform`` part.

    Raises:
      InvalidPrivacyParameterError: an unusable event (a basic part's δ is checked against what
        the analyzers spend, :func:`check_spent`).
      AccountingModeError: an rdp part that is not a composition of Laplace events.
    """
    if part.event is None:
        return TransformBudget(accounting.check_epsilon(part.epsilon), accounting.BASIC,
                               delta=accounting.check_delta(part.delta or 0.0))
    accounting.check_event(part.event)
    derived = laplace_epsilon(part.event)
    declared = part.param(EPSILON_PARAM)
    if declared is not None:
        epsilon = accounting.check_epsilon(declared, f"{part.name} param {EPSILON_PARAM}")
        if abs(epsilon - derived) > _RDP_EPSILON_RELATIVE_TOLERANCE * derived:
            raise InvalidPrivacyParameterError(
                f"the plan's {part.name!r} part declares epsilon={epsilon!r} but its Laplace "
                f"event spends epsilon={derived!r} (sum of 1/noise_multiplier): build the part "
                "with transform_plan_part(preprocessing_fn, feature_spec, epsilon, mode='rdp')")
    else:
        epsilon = float(f"{derived:.12g}")
    return TransformBudget(epsilon, accounting.RDP, part.event)


def transform_plan_part(preprocessing_fn: Callable[..., Mapping[str, Any]],
                        feature_spec: Mapping[str, Any], epsilon: float, *, mode: str,
                        name: str = "transform", delta: float = 0.0,
                        force_tf_compat_v1: bool = False) -> PlanPart:
    """The plan part that pays for running ``preprocessing_fn`` with ``epsilon`` in DPTransform.

    basic: ``PlanPart(name, epsilon, delta)`` (δ for DP vocabularies). rdp: ``PlanPart(name,
    event=<the Laplace composition the function's DP analyzers run>, params=(("epsilon",
    epsilon),))``, traced without data (no δ: partition selection has no RDP curve).

    Raises:
      InvalidPrivacyParameterError: bad ε or δ, δ in rdp mode, or the function over- /
        under-spends it.
      AccountingModeError: unknown mode.
    """
    epsilon = accounting.check_epsilon(epsilon)
    delta = accounting.check_delta(delta)
    if mode == accounting.BASIC:
        return PlanPart(name, epsilon, delta)
    if delta:
        raise InvalidPrivacyParameterError(
            "an rdp transform part is a composition of Laplace events and spends no delta: DP "
            "vocabularies (partition selection) need a basic stream")
    if mode != accounting.RDP:
        raise AccountingModeError(f"mode must be one of {accounting.MODES}, got {mode!r}")
    event = trace_dp_event(preprocessing_fn, feature_spec, epsilon,
                           force_tf_compat_v1=force_tf_compat_v1)
    return PlanPart(name, event=event, params=((EPSILON_PARAM, epsilon),))


def check_spent(budget: TransformBudget, spent_epsilon: float,
                spent_event: dp_accounting.DpEvent, spent_delta: float = 0.0) -> None:
    """Raises unless the analyzers spent exactly the budget.

    basic: ``spent_epsilon`` equals ``budget.epsilon`` and ``spent_delta`` ``budget.delta`` (an
    under-spend within the float rounding of a split, relative 1e-9, is accepted; any over-spend
    is refused, in exact decimals). rdp: ``spent_event`` is the planned Laplace composition
    (:func:`events_match`).

    Raises:
      InvalidPrivacyParameterError: under- or over-spent, or other mechanisms than planned.
    """
    dlt, got_delta = accounting.exact(budget.delta), accounting.exact(spent_delta)
    if got_delta > dlt or float(got_delta) < budget.delta * (1.0 - 1e-9):
        raise InvalidPrivacyParameterError(
            f"the preprocessing_fn's DP analyzers spent delta={spent_delta!r}, but the plan's "
            f"transform part (charged by the ledger) is delta={budget.delta!r}: only DP "
            "partition selection (dp_vocabulary) spends delta, and the analyzers must spend "
            "exactly the transform part")
    eps = accounting.exact(budget.epsilon)
    got = accounting.exact(spent_epsilon)
    if got > eps or float(got) < budget.epsilon * (1.0 - 1e-9):
        raise InvalidPrivacyParameterError(
            f"the preprocessing_fn's DP analyzers spent epsilon={spent_epsilon!r}, but the plan's "
            f"transform part (charged by the ledger) is epsilon={budget.epsilon!r} "
            f"({'over' if got > eps else 'under'}-spent by {abs(got - eps)}): the analyzers must "
            "spend exactly the transform part")
    if budget.event is not None and not events_match(spent_event, budget.event):
        raise InvalidPrivacyParameterError(
            "the preprocessing_fn's DP analyzers ran other Laplace mechanisms than the plan's "
            f"transform part: spent {accounting.event_to_json(spent_event)}, planned "
            f"{accounting.event_to_json(budget.event)}. In rdp mode the transform part must be "
            "the composition of exactly the analyzers' events (use "
            "sage_tfx.components.dp_transform.privacy.trace_dp_event to compute it)")


def trace_dp_event(preprocessing_fn: Callable[..., Mapping[str, Any]],
                   feature_spec: Mapping[str, Any], epsilon: float, *,
                   force_tf_compat_v1: bool = False) -> dp_accounting.DpEvent:
    """The DpEvent a DP ``preprocessing_fn`` spends with budget ``epsilon``, without any data.

    Traces the function as DPTransform does (``tracing.plan_shares``: shares planned, then a
    full-spend trace); use the result as the ``transform`` part of an rdp plan:
    ``PlanPart("transform", event=trace_dp_event(...))``. A function with an ``epsilon``
    parameter gets ``epsilon`` bound, as in ``DPTransform``.

    Args:
      preprocessing_fn: the user's function.
      feature_spec: ``{name: tf.io.FixedLenFeature | VarLenFeature | ...}`` of its inputs.
      epsilon: the ε its analyzers share.
      force_tf_compat_v1: trace in TF1 graph mode.

    Raises:
      InvalidPrivacyParameterError: bad ε, over- or under-spend.
    """
    from sage_tfx.components.dp_transform import tracing

    epsilon = accounting.check_epsilon(epsilon)
    return tracing.plan_shares(preprocessing_fn, feature_spec, epsilon,
                               audit_analyzers=False,
                               force_tf_compat_v1=force_tf_compat_v1).event

