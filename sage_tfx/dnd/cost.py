"""What a Draw-and-Discard run costs, as the DpEvent :func:`~sage_tfx.dnd.budget.request_run`
charges (docs/design.md, "One surface").

``cost(config, dim=, passes=)`` is :func:`~sage_tfx.dnd.budget.run_event`: each client's
``passes`` local-DP updates composed, charged to every block of the run on an ``rdp`` stream. On
a ``basic`` stream ``request_run`` charges ``run_epsilon`` / ``run_delta`` of the same run.

The grant: ``request_run(ledger, stream, run_id=, config=, dim=, passes=)`` charges the run before
the server accepts an update; the server then admits draws only through
``RunBudget(grant, config, dim, passes)``, which refuses a grant that does not pay for the run.
"""
from __future__ import annotations

from dp_accounting import dp_event as dp_event_lib

from sage_tfx.dnd.budget import run_event
from sage_tfx.dnd.client import ClientConfig
from sage_tfx.errors import InvalidRequestError

__all__ = ["cost"]


def cost(config: ClientConfig, *, dim: int, passes: int = 1) -> dp_event_lib.DpEvent:
    """The DpEvent ``request_run`` charges for a run of clients configured by ``config``.

    Args:
      config: the clients' :class:`~sage_tfx.dnd.client.ClientConfig` (unit, ε, δ, clip).
      dim: the number of model weights (the feature unit's cost grows with it).
      passes: updates each client may send.
    Raises:
      InvalidRequestError: ``config`` is not a ClientConfig, has no ε (a noise-free run costs
        nothing a ledger can charge), or ``dim`` / ``passes`` is not an integer >= 1.
    """
    if not isinstance(config, ClientConfig):
        raise InvalidRequestError(f"cost() of a D&D run takes a ClientConfig, got {config!r}")
    if config.epsilon is None:
        raise InvalidRequestError("a noise-free ClientConfig (epsilon=None) has no privacy cost")
    for name, value in (("dim", dim), ("passes", passes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequestError(f"{name} must be an integer >= 1, got {value!r}")
    return run_event(config, dim, passes)
