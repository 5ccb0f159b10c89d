"""What one Pyramid window costs, as the DpEvent its seal charges (docs/design.md, "One
surface").

``cost(spec, weights=)`` is :func:`~sage_tfx.pyramid.plan.window_event`: the count tables of one
window at the noise ``weights`` (even split if None), which
:meth:`~sage_tfx.pyramid.windows.PyramidStore.seal` charges on an ``rdp`` stream and a pipeline's
gate must charge. On a ``basic`` stream the seal charges the spec's (``epsilon``, ``delta``).

The grant: ``PyramidStore(spec, state_dir, retention=, ledger=, stream=).seal()`` charges the
window itself; ``seal(grant=...)`` takes a released grant that already paid for it (e.g. from a
pipeline's ``SageGate``) and makes no second charge.
"""
from __future__ import annotations

from typing import Optional, Sequence

from dp_accounting import dp_event as dp_event_lib

from sage_tfx.errors import InvalidRequestError
from sage_tfx.pyramid.featurize import CountSpec
from sage_tfx.pyramid.plan import window_event

__all__ = ["cost"]


def cost(config: CountSpec, *, weights: Optional[Sequence[float]] = None
         ) -> dp_event_lib.DpEvent:
    """The DpEvent sealing one window of count tables under ``config`` charges (rdp stream).

    Args:
      config: the store's :class:`~sage_tfx.pyramid.featurize.CountSpec`.
      weights: noise weights, one per table (groups, then the label prior); None: even split.
    Raises:
      InvalidRequestError: ``config`` is not a CountSpec, or bad weights.
    """
    if not isinstance(config, CountSpec):
        raise InvalidRequestError(f"cost() of a Pyramid window takes a CountSpec, got {config!r}")
    return window_event(config, weights)
