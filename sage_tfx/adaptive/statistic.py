"""One iteration of a DP statistic pipeline under privacy-adaptive training, released once.

Sage Tab. 1's statistics pipelines (e.g. the mean departure delay of ``pipelines/sage_demo.py``):
an iteration reads its granted blocks, releases a DP mean (Laplace count and sum) and validates
its absolute error with :class:`~sage_tfx.dp.validation.SumStatisticValidator` (§3.3). The
allocator charged the iteration's run id before anything ran (:mod:`~sage_tfx.adaptive.search`);
:func:`run_statistic_iteration` asks the ledger again with that run id, which returns the same
grant without a second charge, and releases the statistic through
:func:`sage_tfx.dp.granted.validate_once`: an iteration run twice (a retried job, a restarted
runner, another process) publishes the recorded statistic byte for byte, reads no block and
draws no noise.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

from sage_tfx.dp.granted import validate_once
from sage_tfx.dp.validation import SumStatisticValidator, ValidationResult
from sage_tfx.errors import MissingGrantError
from sage_tfx.ledger import DEFAULT_CONTEXT, RESERVED, Grant, Ledger

__all__ = ["StatisticIteration", "run_statistic_iteration"]


@dataclasses.dataclass(frozen=True)
class StatisticIteration:
    """What one statistic iteration published: the validation result (``dp_estimate`` is the
    DP statistic), the grant that paid for it, and whether it was a replay."""

    result: ValidationResult
    grant: Grant
    replayed: bool


def run_statistic_iteration(ledger: Ledger, stream: str, *, run_id: str, blocks: Sequence[str],
                            epsilon: float, delta: Optional[float],
                            validator: SumStatisticValidator,
                            read_values: Callable[[Sequence[str]], Any], name: str,
                            context: str = DEFAULT_CONTEXT,
                            request: Optional[dict] = None) -> StatisticIteration:
    """Releases a DP statistic of an iteration's blocks once and validates it.

    Args:
      ledger: the ledger; ``run_id`` was charged (by the allocator) for exactly these blocks and
        this cost, or is charged now.
      stream, run_id, blocks, epsilon, delta, context: the iteration's charge.
      validator: the statistic's validator (it spends ``epsilon`` on the count and the sum).
      read_values: ``read_values(block_locations)`` -> the per-record values (called only when
        the statistic is not recorded yet).
      name: the release name, e.g. ``"mean-delay/dp_mean"``.
      request: further request fields (e.g. the feature read and its shift).

    Returns:
      The StatisticIteration.

    Raises:
      MissingGrantError: the ledger denied the request.
      ReleaseConflictError: the grant released ``name`` for another request.
      InvalidRequestError: the run id was charged for other blocks or another cost.
    """
    decision = ledger.request(stream, run_id=run_id, blocks=list(blocks), epsilon=epsilon,
                              delta=delta, context=context)
    if not decision.granted:
        raise MissingGrantError(f"the ledger denied statistic iteration {run_id!r}: "
                                f"{decision.reason}")
    grant = decision.grant
    if grant.status == RESERVED:  # charged by the allocator as a reservation: released now
        grant = ledger.release(grant.grant_id)
    result, replayed = validate_once(
        ledger, grant.grant_id, name, validator, lambda: read_values(grant.locations),
        epsilon=epsilon,
        request={"stream": stream, "blocks": list(grant.block_ids), **(request or {})})
    return StatisticIteration(result, grant, replayed)
