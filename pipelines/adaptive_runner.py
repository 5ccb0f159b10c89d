"""Privacy-adaptive training of TFX pipelines on a growing stream (Sage §3.3, Block/Conserve).

A TFX DAG cannot loop, so this runner launches one pipeline run per iteration. Each step of the
stream one block arrives; it is registered in the ledger and its budget divided evenly among the
pipelines waiting on it (:class:`sage_tfx.adaptive.Allocator`). Every waiting pipeline's
:class:`sage_tfx.adaptive.AdaptiveSearch` proposes its next iteration — start at (ε0, δ0) on a
minimum window; on RETRY double ε if its allocation allows, else wait for blocks and double the
window; stop on ACCEPT, REJECT or timeout — and charges it through the ledger under the
iteration's run id *before* anything runs. The TFX run's SageGate then asks for the same blocks
with the same cost and run id, which the ledger answers with the same grant without charging
again (idempotent requests), so each iteration is charged exactly once and the DP stages spend
exactly the plan the gate stored.

The iteration itself is a callable (default: one LocalDagRunner run of
``pipelines/flights_dp_pipeline.py``), so the loop is testable without TFX.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional, Sequence

from sage_tfx.adaptive import AdaptiveSearch, Allocator, IterationRecord, SearchConfig
from sage_tfx.ledger import BlockSpec, Ledger
from sage_tfx.dp.validation import Outcome


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """A pipeline with a quality target, trained adaptively.

    Attributes:
      name: pipeline id (also the prefix of its ledger run ids).
      search: the §3.3 search parameters (ε0, δ0, minimum window, policy, timeout).
      arrive_at: the stream step at which the pipeline starts waiting.
      iteration_kwargs: extra arguments of the iteration callable (algorithm, target, ...).
      final_reject: stop the search on the validator's REJECT. Off by default: the validator's
        REJECT is evidence that *this* model misses the target (its DP lower bound is above
        it), not that the target is out of reach with more data or a larger ε (Sage §3.3's
        REJECT), so the search goes on as after a RETRY.
    """

    name: str
    search: SearchConfig
    arrive_at: int = 0
    iteration_kwargs: tuple = ()
    final_reject: bool = False

    def kwargs(self) -> dict:
        return dict(self.iteration_kwargs)


@dataclasses.dataclass(frozen=True)
class IterationLog:
    """One iteration as the runner saw it."""

    pipeline: str
    step: int
    record: IterationRecord
    seconds: float
    detail: dict


# run_iteration(pipeline_name=..., run_id=..., blocks=..., epsilon=..., delta=..., **kwargs)
# -> (Outcome, detail dict); detail["replayed"] = 1 when the iteration published releases
# already recorded against its grant (a re-run: no new noise was drawn).
IterationFn = Callable[..., tuple]


def run_adaptive(ledger: Ledger, stream: str, arrivals: Sequence[BlockSpec],
                 pipelines: Sequence[PipelineSpec], run_iteration: IterationFn, *,
                 progress: Callable[[str], None] = print,
                 on_step: Optional[Callable[[int], None]] = None) -> list[IterationLog]:
    """Streams ``arrivals`` into ``stream`` and trains every pipeline adaptively until done.

    Args:
      ledger: the ledger; ``stream`` must exist and be a basic-mode stream.
      stream: the stream.
      arrivals: blocks (already in block storage) arriving one per step, oldest first.
      pipelines: the pipelines and their arrival steps.
      run_iteration: runs one charged iteration; returns (Outcome, detail).
      progress: where to print one line per iteration.
      on_step: called with the step number at the end of every step (e.g. to anchor the audit).
    Returns:
      Every iteration, in the order run.
    """
    allocator = Allocator(ledger, stream)
    searches: dict[str, AdaptiveSearch] = {}
    logs: list[IterationLog] = []
    for step, block in enumerate(arrivals):
        for spec in pipelines:
            if spec.arrive_at == step:
                searches[spec.name] = AdaptiveSearch(allocator, spec.name, spec.search,
                                                     arrived_at=step)
                progress(f"step {step:>3}: pipeline {spec.name} arrives "
                         f"(ε0={spec.search.epsilon0}, window ≥ {spec.search.min_blocks} blocks)")
        ledger.add_blocks(stream, [block])
        allocator.add_blocks([block.block_id])
        for spec in pipelines:
            search = searches.get(spec.name)
            while search is not None and not search.done:
                started = search.start(now=step)
                if started is None:
                    break  # wait for more blocks (or budget)
                plan, grant = started
                t0 = time.time()
                outcome, detail = run_iteration(
                    pipeline_name=spec.name, run_id=plan.run_id, blocks=list(plan.blocks),
                    epsilon=plan.epsilon, delta=plan.delta, **spec.kwargs())
                outcome = Outcome(outcome)
                note = ""
                if outcome == Outcome.REJECT and not spec.final_reject:
                    outcome, note = Outcome.RETRY, " (validator: REJECT for this model)"
                    detail = {**detail, "validator_outcome": "REJECT"}
                if detail.get("replayed"):
                    note += " (replayed the grant's recorded release: no new noise)"
                record = search.report(outcome, now=step)
                logs.append(IterationLog(spec.name, step, record, time.time() - t0, detail))
                progress(f"step {step:>3}: {spec.name} iteration {record.iteration}: "
                         f"{record.window} blocks ({record.blocks[0]}..{record.blocks[-1]}), "
                         f"ε={record.epsilon:g} δ={record.delta:g} -> {record.outcome.value}"
                         f"{note}  [{time.time() - t0:.0f}s]")
        if on_step is not None:
            on_step(step)
        if searches and all(s.done for s in searches.values()) and \
                all(p.arrive_at <= step for p in pipelines):
            progress(f"step {step:>3}: every pipeline finished")
            break
    for name, search in searches.items():
        if not search.done:
            progress(f"{name}: still waiting at the end of the stream "
                     f"({len(search.records)} iteration(s))")
    return logs
