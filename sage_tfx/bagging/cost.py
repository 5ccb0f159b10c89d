"""What a DP bagging run costs, as the DpEvent of its labels (docs/design.md, "One surface").

``cost(config, queries=p)`` is :func:`~sage_tfx.bagging.votes.queries_event` of the config's vote
mechanism: ``p`` noisy votes composed, the event :func:`~sage_tfx.bagging.run.plan_labels` fixes
before any private row is read and an ``rdp`` grant must charge exactly
(:func:`~sage_tfx.bagging.run.labels_from_grant` refuses any other). ``plan_labels(config,
epsilon=, delta=, public_size=)`` gives ``p`` for a budget; on a ``basic`` stream the grant is
its ``(epsilon, delta)``; on an ``rdp`` stream ``plan_labels(..., rdp_orders=<the stream's
orders>)`` plans p by the RDP bound the ledger composes the event with (``bagging_cost(rdp=True)``
of ``DPBaggingTrainer``). Paper mode is not DP and has no event.

The grant: the caller charges the ledger (the ``SageGate`` of ``DPBaggingTrainer``'s pipeline, or
``ledger.request``), then ``fit_dp_bagging(..., ledger=, grant_id=)`` buys the labels the grant
pays for, released once; ``fit_dp_bagging(epsilon=, delta=)`` without a ledger is an experiment
that charges and records nothing.
"""
from __future__ import annotations

from dp_accounting import dp_event as dp_event_lib

from sage_tfx.bagging import votes as votes_lib
from sage_tfx.bagging.run import BaggingConfig
from sage_tfx.errors import InvalidRequestError

__all__ = ["cost"]


def cost(config: BaggingConfig, *, queries: int) -> dp_event_lib.DpEvent:
    """The DpEvent of ``queries`` labels bought by noisy teacher votes under ``config``.

    Args:
      config: the run's :class:`~sage_tfx.bagging.run.BaggingConfig` (k, λ, votes).
      queries: the number of public points labelled (``plan_labels(...).queries``).
    Raises:
      InvalidRequestError: ``config`` is not a BaggingConfig, is in paper mode (not DP: no
        event), or ``queries`` is not an integer >= 1.
    """
    if not isinstance(config, BaggingConfig):
        raise InvalidRequestError(f"cost() of a bagging run takes a BaggingConfig, got {config!r}")
    if config.mode != "fixed_queries":
        raise InvalidRequestError("paper mode has a data-dependent cost that no DpEvent "
                                  "describes (and is not differentially private)")
    if isinstance(queries, bool) or not isinstance(queries, int) or queries < 1:
        raise InvalidRequestError(f"queries must be an integer >= 1, got {queries!r}")
    mech = votes_lib.mechanism(config.votes, k=config.k, lam=config.lam)
    return votes_lib.queries_event(mech, queries)
