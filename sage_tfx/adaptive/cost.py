"""What a Sage pipeline run costs, as the DpEvent its gate charges (docs/design.md, "One surface").

``cost(plan)`` is the event :class:`~sage_tfx.adaptive.plan.PrivacyPlan` composes from its parts
(DP Transform, DP Trainer, DP validation): exactly what ``SageGate`` charges on an ``rdp``
stream (``PrivacyPlan.cost()["event"]``). On a ``basic`` stream the gate charges the plan's exact
(ε, δ) sum instead (``PrivacyPlan.cost()``), which no DpEvent describes.

The grant: ``SageGate(plan=...)`` charges the plan before any block is released and hands its
grant artifact to each DP component, which runs only if
:func:`~sage_tfx.adaptive.plan.check_grant_matches` finds the plan's cost in it.
"""
from __future__ import annotations

from dp_accounting import dp_event as dp_event_lib

from sage_tfx.adaptive.plan import PrivacyPlan
from sage_tfx.errors import AccountingModeError, InvalidRequestError
from sage_tfx.ledger import accounting

__all__ = ["cost"]


def cost(config: PrivacyPlan) -> dp_event_lib.DpEvent:
    """The DpEvent the gate charges for one run of a pipeline with privacy plan ``config``.

    Args:
      config: the run's :class:`~sage_tfx.adaptive.plan.PrivacyPlan` (its parts' events).
    Returns:
      The plan's event (one part) or the ``ComposedDpEvent`` of its parts.
    Raises:
      InvalidRequestError: ``config`` is not a PrivacyPlan.
      AccountingModeError: a ``basic`` plan of (ε, δ) parts: it has no DpEvent.
    """
    if not isinstance(config, PrivacyPlan):
        raise InvalidRequestError(
            f"cost() of a Sage run takes a sage_tfx.adaptive.PrivacyPlan, got {config!r}")
    if config.mode != accounting.RDP:
        raise AccountingModeError(
            "this privacy plan is made of (epsilon, delta) parts (a basic stream's plan): the "
            f"gate charges {config.cost()}, which no DpEvent describes; build its parts with "
            "event=... for an rdp stream")
    return config.cost()["event"]
