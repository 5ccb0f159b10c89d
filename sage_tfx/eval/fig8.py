"""Fig. 8: the workload of :mod:`sage_tfx.eval.workload` run by each strategy over the real ledger.

Every charge goes through a real :class:`sage_tfx.ledger.Ledger` (SQLite in a temporary directory
unless a URL is given) as a reservation that is *released only after it was charged*
(``request(release=False)`` then ``release``), and the run only sees the data of the released grant.

Strategies (§5.4; §3.2 "Limitations of existing composition theory" for the two baselines):

``query-composition``
    Query-level accounting against the *whole stream*: one (ε_g, δ_g) budget (a single ledger
    block) for ever; every iteration charges it. Pipelines run Sage's conserve search over all the
    data arrived so far; the pool is first come first served.
``streaming-composition``
    Streaming DP: every new block is given whole to exactly one waiting pipeline (round robin in
    arrival order) and is consumed by the one run that uses it, at (ε_g, δ_g). A pipeline runs
    once it holds ``w`` fresh blocks (``min_blocks``, doubled after each RETRY).
``block-aggressive``
    Block composition, even allocation (:class:`~sage_tfx.adaptive.Allocator`), each iteration
    spending all the pipeline's allocation on its window.
``block-conserve``
    Block composition, even allocation, Sage's privacy-adaptive conserve search (§3.3).
``block-conserve-rdp``
    Ours: as ``block-conserve`` (same search, same allocator) on an ``rdp`` stream (per-block RDP
    filter, see ``sage_tfx.ledger.accounting``): a level-ε iteration charges its Gaussian DpEvent.
``block-conserve-adaptive`` / ``block-conserve-adaptive-rdp``
    The conserve search with our two options (``SearchConfig.lower_epsilon`` and
    ``use_all_data``): a pipeline whose ε no longer fits the per-block allocations may trade ε
    for data at the same doubled budget, and every iteration uses all the data its allocation
    affords (§7). Run on basic and rdp streams so the accounting change is measured against the
    best basic-mode search we have, not only against the literal §3.3 one.
``block-aggressive-rdp``
    Block/Aggressive on an rdp stream (not in Fig. 8; for completeness).

Timing: an iteration takes no simulated time (training is much shorter than the hour between
blocks); ``iterations_per_step`` bounds how many a pipeline may run per step. Within a step:
time-outs, then arrivals, then the new block (divided among the waiting), then runs in arrival
order (repeated while budget freed by an ACCEPT lets others progress).

Release time of a pipeline = step of its ACCEPT - step of its arrival. Averages are taken over
pipelines arriving in the steady-state window ``[warmup, steps - cooldown)``; a pipeline of that
window not released by the horizon is *censored*: counted as ``steps - arrival`` (a lower bound
on its true release time), and the number censored is reported next to the average.

This module imports no TensorFlow.
"""
from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile
import time
from decimal import Decimal
from typing import Callable, Optional, Sequence

import numpy as np

from sage_tfx.adaptive import (AGGRESSIVE, CONSERVE, AdaptiveSearch, Allocator, IterationRecord,
                               SearchConfig)
from sage_tfx.dp.validation import Outcome
from sage_tfx.errors import InvalidRequestError
from sage_tfx.eval.workload import (PipelineSpec, SampleComplexity, WorkloadConfig,
                                    gaussian_event_for,
                                     generate_pipelines)
from sage_tfx.ledger import BlockSpec, Ledger, accounting, open_ledger

__all__ = [
    "QUERY", "STREAMING", "BLOCK_AGGRESSIVE", "BLOCK_CONSERVE", "BLOCK_CONSERVE_RDP",
    "BLOCK_AGGRESSIVE_RDP", "BLOCK_CONSERVE_ADAPTIVE", "BLOCK_CONSERVE_ADAPTIVE_RDP",
    "STRATEGIES", "FIG8_STRATEGIES", "PipelineResult", "SimulationResult", "simulate",
    "verify_ledger",
]

QUERY = "query-composition"
STREAMING = "streaming-composition"
BLOCK_AGGRESSIVE = "block-aggressive"
BLOCK_CONSERVE = "block-conserve"
BLOCK_CONSERVE_RDP = "block-conserve-rdp"
BLOCK_AGGRESSIVE_RDP = "block-aggressive-rdp"
BLOCK_CONSERVE_ADAPTIVE = "block-conserve-adaptive"
BLOCK_CONSERVE_ADAPTIVE_RDP = "block-conserve-adaptive-rdp"
STRATEGIES = (QUERY, STREAMING, BLOCK_AGGRESSIVE, BLOCK_CONSERVE, BLOCK_CONSERVE_RDP,
              BLOCK_CONSERVE_ADAPTIVE, BLOCK_CONSERVE_ADAPTIVE_RDP, BLOCK_AGGRESSIVE_RDP)
FIG8_STRATEGIES = (QUERY, STREAMING, BLOCK_AGGRESSIVE, BLOCK_CONSERVE, BLOCK_CONSERVE_RDP,
                   BLOCK_CONSERVE_ADAPTIVE, BLOCK_CONSERVE_ADAPTIVE_RDP)
_LITERAL = {"lower_epsilon": False, "use_all_data": False}
_ADAPTIVE = {"lower_epsilon": True, "use_all_data": True}
# strategy -> (search policy, stream mode, SearchConfig options)
_BLOCK_STRATEGIES = {
    BLOCK_AGGRESSIVE: (AGGRESSIVE, accounting.BASIC, _LITERAL),
    BLOCK_CONSERVE: (CONSERVE, accounting.BASIC, _LITERAL),
    BLOCK_CONSERVE_RDP: (CONSERVE, accounting.RDP, _LITERAL),
    BLOCK_CONSERVE_ADAPTIVE: (CONSERVE, accounting.BASIC, _ADAPTIVE),
    BLOCK_CONSERVE_ADAPTIVE_RDP: (CONSERVE, accounting.RDP, _ADAPTIVE),
    BLOCK_AGGRESSIVE_RDP: (AGGRESSIVE, accounting.RDP, _LITERAL),
}


# --- results ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PipelineResult:
    """How one pipeline fared.

    Attributes:
      outcome: "ACCEPT", "TIMEOUT", or "WAITING" (not finished by the horizon).
      iterations: charged iterations.
      epsilon, window: level and window (blocks) of the last iteration (None if none ran).
      budget: block-budget units it charged (Σ cost per block × window; the RDP strategy counts
        units of the allocator's reference order).
    """

    pipeline_id: str
    arrival_step: int
    release_step: Optional[int]
    outcome: str
    iterations: int
    epsilon: Optional[float]
    window: Optional[int]
    budget: float
    complexity: SampleComplexity

    def release_time(self, horizon: int) -> int:
        """Steps from arrival to ACCEPT; censored at ``horizon`` if never released."""
        end = self.release_step if self.release_step is not None else horizon
        return end - self.arrival_step


@dataclasses.dataclass(frozen=True)
class SimulationResult:
    """One simulated run of one strategy; ``problems`` lists ledger invariant violations."""

    strategy: str
    config: WorkloadConfig
    pipelines: tuple[PipelineResult, ...]
    records: tuple[IterationRecord, ...]
    problems: tuple[str, ...]
    denials: int
    wall_seconds: float
    stream: str

    def measured(self) -> tuple[PipelineResult, ...]:
        """Pipelines arriving in the steady-state window [warmup, steps - cooldown)."""
        c = self.config
        return tuple(p for p in self.pipelines
                     if c.warmup <= p.arrival_step < c.steps - c.cooldown)

    def mean_release_time(self) -> float:
        """Average release time over :meth:`measured` (censored at the horizon; nan if empty)."""
        m = self.measured()
        if not m:
            return math.nan
        return float(np.mean([p.release_time(self.config.steps) for p in m]))

    def censored(self) -> int:
        """Measured pipelines not released by the horizon."""
        return sum(p.release_step is None for p in self.measured())

    def released_fraction(self) -> float:
        """Fraction of measured pipelines released within the simulation."""
        m = self.measured()
        return (len(m) - self.censored()) / len(m) if m else math.nan

    def budget_per_release(self) -> float:
        """Block-budget units charged per released model (all pipelines)."""
        released = sum(p.release_step is not None for p in self.pipelines)
        spent = math.fsum(p.budget for p in self.pipelines)
        return spent / released if released else math.inf

    def summary(self) -> dict:
        """A JSON-able summary of the simulation."""
        return {
            "strategy": self.strategy, "arrival_rate": self.config.arrival_rate,
            "seed": self.config.seed, "steps": self.config.steps,
            "pipelines": len(self.pipelines), "measured": len(self.measured()),
            "mean_release_time": self.mean_release_time(), "censored": self.censored(),
            "released_fraction": self.released_fraction(),
            "budget_per_release": self.budget_per_release(),
            "iterations": len(self.records), "denials": self.denials,
            "problems": len(self.problems), "wall_seconds": round(self.wall_seconds, 2),
        }


# --- ledger checks ----------------------------------------------------------------------------


def verify_ledger(ledger: Ledger, stream: str,
                  records: Sequence[IterationRecord] = ()) -> list[str]:
    """Invariant violations of a simulated stream (empty: none).

    Checks: ``check_consistency`` (cached budgets == budgets derived from grants, no block above
    its cap, every grant audited); every block within its cap (basic: exact Σε ≤ ε_g and Σδ ≤ δ_g;
    rdp: some order within its RDP cap); the audit chain; and for every iteration record, its
    grant is released, names the same blocks, and its audit ``grant`` (charge) entry precedes
    its ``release`` entry (charge before release).
    """
    problems = list(ledger.check_consistency(stream))
    s = ledger.stream(stream)
    for b in ledger.blocks(stream):
        left = ledger.remaining(stream, b.block_id)
        if s.mode == accounting.BASIC:
            if Decimal(repr(left["epsilon"])) < 0 or Decimal(repr(left["delta"])) < 0:
                problems.append(f"{b.block_id}: over cap, left {left}")
        elif b.charges and not any(h >= 0 for h in left["headroom"].values()):
            problems.append(f"{b.block_id}: over the RDP cap at every order")
    report = ledger.verify_audit()
    if not report.ok:
        problems.append(f"audit chain: {report.message}")
    if records:
        charged: dict[str, int] = {}
        released: dict[str, int] = {}
        for e in ledger.audit_log(stream):
            if e.kind == "grant":
                charged[e.payload["grant_id"]] = e.seq
            elif e.kind == "release":
                released[e.payload["grant_id"]] = e.seq
        for r in records:
            g = ledger.grant(r.grant_id)
            if g.status != "released":
                problems.append(f"{r.run_id}: grant {r.grant_id} is {g.status}")
            if g.block_ids != tuple(r.blocks):
                problems.append(f"{r.run_id}: grant blocks differ from the iteration's window")
            c, rel = charged.get(r.grant_id), released.get(r.grant_id)
            if c is None or (rel is not None and rel < c):
                problems.append(f"{r.run_id}: released before it was charged")
    return problems


# --- simulation -------------------------------------------------------------------------------


def _scratch_dir() -> str:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix="sage-workload-", dir=base)


class _Clock:
    """Per-step bookkeeping shared by the strategy loops."""

    def __init__(self, config: WorkloadConfig, specs: Sequence[PipelineSpec]):
        self.config = config
        self.specs = {s.pipeline_id: s for s in specs}
        self._queue = list(specs)
        self._next = 0

    def arrivals(self, step: int) -> list[PipelineSpec]:
        out = []
        while self._next < len(self._queue) and self._queue[self._next].step == step:
            out.append(self._queue[self._next])
            self._next += 1
        return out


def _block_id(step: int) -> str:
    return f"b{step:06d}"


def _run_grant(ledger: Ledger, grant_id: str, block_samples: int) -> int:
    """Releases a charged reservation through the ledger; returns the samples the run reads."""
    released = ledger.release(grant_id)
    return len(released.locations) * block_samples


def _simulate_blocks(ledger: Ledger, stream: str, config: WorkloadConfig,
                     specs: Sequence[PipelineSpec], policy: str, mode: str, options: dict,
                     progress: Optional[Callable[[str], None]]):
    ledger.create_stream(stream, epsilon_g=config.epsilon_g, delta_g=config.delta_g, mode=mode,
                         granularity="simulated:step")
    allocator = Allocator(ledger, stream)
    search_config = SearchConfig(epsilon0=config.epsilon0, delta=config.pipeline_delta,
                                 min_blocks=config.min_blocks, max_epsilon=config.epsilon_g,
                                 policy=policy, timeout=config.timeout, **options)
    event_for = (gaussian_event_for(config.pipeline_delta, config.laplace_fraction)
                 if mode == accounting.RDP else None)
    clock = _Clock(config, specs)
    active: dict[str, AdaptiveSearch] = {}
    finished: list[AdaptiveSearch] = []
    limit = config.iterations_per_step
    for step in range(config.steps):
        for pid, search in list(active.items()):
            if search.check_timeout(step):
                finished.append(active.pop(pid))
        for spec in clock.arrivals(step):
            active[spec.pipeline_id] = AdaptiveSearch(allocator, spec.pipeline_id, search_config,
                                                      event_for=event_for, arrived_at=spec.step)
        bid = _block_id(step)
        ledger.add_blocks(stream, [BlockSpec(bid, f"sim://{stream}/{bid}",
                                             records=config.block_samples)])
        allocator.add_blocks([bid])
        ran: dict[str, int] = {}
        moved = True
        while moved:
            moved = False
            for pid, search in list(active.items()):
                while limit is None or ran.get(pid, 0) < limit:
                    started = search.start(now=step, release=False)
                    if started is None:
                        break
                    plan, grant = started
                    samples = _run_grant(ledger, grant.grant_id, config.block_samples)
                    ok = clock.specs[pid].complexity.accepts(samples, plan.epsilon)
                    search.report(Outcome.ACCEPT if ok else Outcome.RETRY, now=step)
                    ran[pid] = ran.get(pid, 0) + 1
                    moved = True
                    if search.done:
                        finished.append(active.pop(pid))
                        break
        if progress and step % 100 == 99:
            progress(f"step {step + 1}/{config.steps}: {len(active)} waiting, "
                     f"{len(finished)} finished")
    results = []
    for search in finished + list(active.values()):
        spec = clock.specs[search.pipeline_id]
        outcome = search.outcome.value if search.outcome is not None else "WAITING"
        results.append(PipelineResult(
            spec.pipeline_id, spec.step,
            int(search.finished_at) if search.outcome == Outcome.ACCEPT else None, outcome,
            len(search.records), search.epsilon, search.window, search.budget_spent(),
            spec.complexity))
    records = tuple(r for s in finished + list(active.values()) for r in s.records)
    return results, records, allocator.denials


def _simulate_query(ledger: Ledger, stream: str, config: WorkloadConfig,
                    specs: Sequence[PipelineSpec], progress):
    """Query composition: one budget for the whole stream, conserve search over all data."""
    ledger.create_stream(stream, epsilon_g=config.epsilon_g, delta_g=config.delta_g,
                         granularity="whole-stream")
    ledger.add_blocks(stream, [BlockSpec("stream", f"sim://{stream}/all")])
    left_e = accounting.exact(config.epsilon_g)
    left_d = accounting.exact(config.delta_g)
    delta = config.pipeline_delta
    clock = _Clock(config, specs)
    # pipeline -> [epsilon of last run, samples of last run, iterations, budget]
    state: dict[str, list] = {}
    results: list[PipelineResult] = []
    records: list[IterationRecord] = []
    limit = config.iterations_per_step

    def finish(pid, release_step, outcome):
        eps, samples, its, budget = state.pop(pid)
        spec = clock.specs[pid]
        results.append(PipelineResult(pid, spec.step, release_step, outcome, its, eps,
                                       None if eps is None else samples // config.block_samples,
                                       budget, spec.complexity))

    for step in range(config.steps):
        if config.timeout is not None:
            for pid in [p for p in state if step - clock.specs[p].step >= config.timeout]:
                finish(pid, None, "TIMEOUT")
        for spec in clock.arrivals(step):
            state[spec.pipeline_id] = [None, 0, 0, 0.0]
        data = (step + 1) * config.block_samples  # everything arrived so far
        for pid in list(state):
            ran = 0
            while limit is None or ran < limit:
                eps, used, its, budget = state[pid]
                if eps is None:
                    options = [(config.epsilon0, config.min_blocks * config.block_samples)]
                else:
                    options = [(eps * 2, used)] if eps * 2 <= config.epsilon_g else []
                    options.append((eps, 2 * used))
                choice = None
                for e, need in options:
                    if data >= need and accounting.exact(e) <= left_e \
                            and accounting.exact(delta) <= left_d:
                        choice = e
                        break
                if choice is None:
                    break
                run_id = f"{pid}.it{its}"
                d = ledger.request(stream, run_id=run_id, blocks=["stream"], epsilon=choice,
                                   delta=delta, release=False)
                if not d.granted:
                    break
                left_e -= accounting.exact(choice)
                left_d -= accounting.exact(delta)
                ledger.release(d.grant.grant_id)
                ok = clock.specs[pid].complexity.accepts(data, choice)
                outcome = Outcome.ACCEPT if ok else Outcome.RETRY
                records.append(IterationRecord(pid, its, run_id, 1, ("stream",), choice, delta,
                                               None, choice / config.epsilon_g, d.grant.grant_id,
                                               step, step, outcome))
                state[pid] = [choice, data, its + 1, budget + choice / config.epsilon_g]
                ran += 1
                if ok:
                    finish(pid, step, "ACCEPT")
                    break
        if progress and step % 100 == 99:
            progress(f"step {step + 1}/{config.steps}: {len(state)} waiting")
    for pid in list(state):
        finish(pid, None, "WAITING")
    return results, tuple(records), 0


def _simulate_streaming(ledger: Ledger, stream: str, config: WorkloadConfig,
                        specs: Sequence[PipelineSpec], progress):
    """Streaming composition: each block goes whole to one waiting pipeline and is used once."""
    ledger.create_stream(stream, epsilon_g=config.epsilon_g, delta_g=config.delta_g,
                         granularity="simulated:step")
    clock = _Clock(config, specs)
    # pipeline -> [held fresh blocks, window target, iterations, budget, last window]
    state: dict[str, list] = {}
    results: list[PipelineResult] = []
    records: list[IterationRecord] = []
    turn = 0

    def finish(pid, release_step, outcome):
        held, target, its, budget, last = state.pop(pid)
        spec = clock.specs[pid]
        results.append(PipelineResult(pid, spec.step, release_step, outcome, its,
                                      config.epsilon_g if its else None, last, budget,
                                      spec.complexity))

    for step in range(config.steps):
        if config.timeout is not None:
            for pid in [p for p in state if step - clock.specs[p].step >= config.timeout]:
                finish(pid, None, "TIMEOUT")
        for spec in clock.arrivals(step):
            state[spec.pipeline_id] = [[], config.min_blocks, 0, 0.0, None]
        bid = _block_id(step)
        ledger.add_blocks(stream, [BlockSpec(bid, f"sim://{stream}/{bid}",
                                             records=config.block_samples)])
        if not state:
            continue  # nobody waiting: the block's budget is never used
        order = list(state)
        pid = order[turn % len(order)]
        turn += 1
        st = state[pid]
        st[0].append(bid)
        if len(st[0]) < st[1]:
            continue
        run_id = f"{pid}.it{st[2]}"
        d = ledger.request(stream, run_id=run_id, blocks=list(st[0]), epsilon=config.epsilon_g,
                           delta=config.delta_g, release=False)
        if not d.granted:
            raise RuntimeError(f"streaming composition: fresh blocks denied: {d.reason}")
        samples = _run_grant(ledger, d.grant.grant_id, config.block_samples)
        ok = clock.specs[pid].complexity.accepts(samples, config.epsilon_g)
        outcome = Outcome.ACCEPT if ok else Outcome.RETRY
        records.append(IterationRecord(pid, st[2], run_id, len(st[0]), tuple(st[0]),
                                       config.epsilon_g, config.delta_g, None, 1.0,
                                       d.grant.grant_id, step, step, outcome))
        st[2] += 1
        st[3] += len(st[0])
        st[4] = len(st[0])
        st[0] = []
        if ok:
            finish(pid, step, "ACCEPT")
        else:
            st[1] *= 2
        if progress and step % 100 == 99:
            progress(f"step {step + 1}/{config.steps}: {len(state)} waiting")
    for pid in list(state):
        finish(pid, None, "WAITING")
    return results, tuple(records), 0


def simulate(strategy: str, config: WorkloadConfig, *, ledger_url: Optional[str] = None,
             stream: Optional[str] = None, verify: bool = True,
             progress: Optional[Callable[[str], None]] = None) -> SimulationResult:
    """Runs one strategy on one workload over a real ledger.

    Args:
      strategy: one of :data:`STRATEGIES`.
      config: the workload.
      ledger_url: ledger to use (kept afterwards); default: a fresh SQLite file in a temporary
        directory (``/dev/shm`` when available), deleted at the end.
      stream: stream name (default: the strategy name); must not exist yet.
      verify: run :func:`verify_ledger` at the end (``problems`` of the result).
      progress: callback for progress lines.
    Returns:
      The SimulationResult.
    Raises:
      InvalidRequestError: unknown strategy.
    """
    if strategy not in STRATEGIES:
        raise InvalidRequestError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    specs = generate_pipelines(config)
    scratch = None
    if ledger_url is None:
        scratch = _scratch_dir()
        ledger_url = f"sqlite:///{scratch}/ledger.db"
    stream = stream or strategy
    started = time.perf_counter()
    ledger = open_ledger(ledger_url)
    try:
        if strategy == QUERY:
            results, records, denials = _simulate_query(ledger, stream, config, specs, progress)
        elif strategy == STREAMING:
            results, records, denials = _simulate_streaming(ledger, stream, config, specs,
                                                            progress)
        else:
            policy, mode, options = _BLOCK_STRATEGIES[strategy]
            results, records, denials = _simulate_blocks(ledger, stream, config, specs, policy,
                                                         mode, options, progress)
        problems = tuple(verify_ledger(ledger, stream, records)) if verify else ()
    finally:
        ledger.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    results.sort(key=lambda p: p.pipeline_id)
    return SimulationResult(strategy, config, tuple(results), tuple(records), problems, denials,
                            time.perf_counter() - started, stream)
