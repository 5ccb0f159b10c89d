"""Tracing a DP ``preprocessing_fn`` without data: its shares, its spends, its audit.

DPTransform's executor and the pipeline's preflight (``components/preflight.py``, before the
gate charges) both run :func:`plan_shares`:

1. a **planning trace** (tf.Transform's own ``get_analyze_input_columns``: the function is traced
   against the schema's type specs, no data is read) under a planning budget: every analyzer is
   audited (a stock analyzer over a feature not declared public is refused here, with the
   complete list), explicit ε / δ are checked against the budget, and the analyzers called
   without ε are counted;
2. the **allocation** of what the explicit spends leave among them (``budget.allocate``);
3. a **verification trace** under the real budget with that allocation: every analyzer gets its
   share, the whole (ε, δ) must be spent exactly, and an rdp part's Laplace mechanisms must be
   the planned ones.

The result (:class:`TracePlan`) holds the allocation the run uses, the spends and their composed
DpEvent.
"""
from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any, Callable, Iterable, Mapping, Optional

import dp_accounting

from sage_tfx.components.dp_transform import audit
from sage_tfx.components.dp_transform import budget as budget_lib
from sage_tfx.ledger.accounting import exact


@dataclasses.dataclass(frozen=True)
class TracePlan:
    """What a ``preprocessing_fn`` spends under (ε, δ), from two traces without data.

    Attributes:
      allocation: the shares of the analyzers called without an explicit ε.
      spends: every DP analyzer's spend, in trace order.
      event: their composed DpEvent (``NoOpDpEvent`` if none).
      analyzer_uses: the audit's classification of every analyzer (DP or public).
    """

    allocation: budget_lib.Allocation
    spends: tuple[budget_lib.DPSpend, ...]
    event: dp_accounting.DpEvent
    analyzer_uses: tuple[audit.AnalyzerUse, ...]

    @property
    def epsilon_spent(self) -> float:
        return float(sum((exact(s.epsilon) for s in self.spends), Decimal(0)))

    @property
    def delta_spent(self) -> float:
        return float(sum((exact(s.delta) for s in self.spends), Decimal(0)))


def type_specs(feature_spec: Mapping[str, Any]) -> dict:
    """tf.Transform's input type specs of a feature spec."""
    from tensorflow_transform import impl_helper
    return impl_helper.get_type_specs_from_feature_specs(dict(feature_spec))


def feature_spec_from_schema_file(path: str) -> dict:
    """The feature spec of a schema (``schema.pbtxt``) as tf.Transform reads it."""
    from tensorflow_transform.tf_metadata import schema_utils
    from tfx.utils import io_utils

    schema = io_utils.SchemaReader().read(path)
    return dict(schema_utils.schema_as_feature_spec(schema).feature_spec)


def _trace(fn: Callable[..., Any], specs: dict, force_tf_compat_v1: bool) -> None:
    import tensorflow_transform as tft
    tft.get_analyze_input_columns(fn, specs, force_tf_compat_v1=force_tf_compat_v1)


def plan_shares(preprocessing_fn: Callable[..., Mapping[str, Any]],
                feature_spec: Mapping[str, Any], epsilon: float, delta: float = 0.0, *,
                public_features: Iterable[str] = (), planned_event_json: Optional[str] = None,
                force_tf_compat_v1: bool = False, audit_analyzers: bool = True) -> TracePlan:
    """Plans and checks what ``preprocessing_fn`` spends of (ε, δ) (module doc), without data.

    Args:
      preprocessing_fn: the user's function (``epsilon`` / ``delta`` bound if it takes them).
      feature_spec: ``{name: tf.io.FixedLenFeature | VarLenFeature | ...}`` of its inputs.
      epsilon, delta: the plan's transform part.
      public_features: features stock analyzers may read.
      planned_event_json: an rdp part's DpEvent, which the spends must reproduce.
      force_tf_compat_v1: trace in TF1 graph mode.
      audit_analyzers: False measures the spends only (``privacy.trace_dp_event``); DPTransform
        and the preflight always audit.

    Raises:
      audit.NonDPAnalyzerError: a stock analyzer over a feature not declared public.
      InvalidPrivacyParameterError: over- or under-spent ε or δ (``DPBudgetExceededError``
        included), other mechanisms than an rdp part's, bad analyzer arguments.
    """
    public = tuple(public_features)
    bound = audit.bind_epsilon(preprocessing_fn, epsilon, delta)
    specs = type_specs(feature_spec)
    planning = budget_lib.DPPreprocessingFn(
        audit.AuditedPreprocessingFn(bound, public_features=public) if audit_analyzers
        else bound, epsilon, delta=delta, planning=True)
    _trace(planning, specs, force_tf_compat_v1)
    pbudget = planning.budget
    requests = pbudget.requests
    explicit = pbudget.explicit_spends()
    explicit_eps = sum((exact(s.epsilon) for s in explicit), Decimal(0))
    explicit_delta = sum((exact(s.delta) for s in explicit), Decimal(0))
    allocation = budget_lib.allocate(requests, epsilon, delta, explicit_eps, explicit_delta)

    audited = audit.AuditedPreprocessingFn(bound, public_features=public,
                                           planned_event_json=planned_event_json)
    run = budget_lib.DPPreprocessingFn(audited if audit_analyzers else bound, epsilon,
                                       delta=delta, allocation=allocation)
    _trace(run, specs, force_tf_compat_v1)
    return TracePlan(allocation, run.budget.spends, run.budget.dp_event(),
                     audited.analyzer_uses)
