"""The privacy-adaptive search of one pipeline (Sage §3.3) over :mod:`~sage_tfx.adaptive.allocator`.

The iteration policy of one pipeline (§3.3, "To conserve privacy budget ..."). ``conserve``
(Block/Conserve, Sage's strategy): start at (ε0, δ0) on ``min_blocks`` blocks; on RETRY double
ε if the pipeline's allocation on a window of the same size allows it, otherwise wait for new
blocks and double the window; stop on ACCEPT, REJECT or timeout. Because each retry doubles one
resource, the failed iterations together cost at most the final one, and the final ε is at
most twice the smallest that would have been accepted on that window, so the search spends at
most 4x the budget of the best model (§3.3). ``aggressive`` (Block/Aggressive, §5.4): every
iteration spends *all* of the pipeline's allocation on its window (the largest ε it affords),
and a retry again needs one resource doubled.

Read literally, the conserve search never lowers ε: once a pipeline's ε exceeds what new
blocks bring it (its 1/k share shrinks as more pipelines wait), it waits for ever while still
receiving shares it cannot use. ``SearchConfig.lower_epsilon`` (ours) lets it trade ε for data
at the same doubled budget; ``SearchConfig.use_all_data`` runs every iteration on all the
blocks its allocation affords (§7: "we use as much data as is available ... with the lowest
privacy budget"). Both default to off (the §3.3 text).

The window of an iteration is counted in blocks (the paper's "number of samples" when blocks have
equal size, as in the simulator).

This module imports no TensorFlow.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.adaptive.allocator import UNITS_PER_BLOCK, AllocationError, Allocator, IterationPlan
from sage_tfx.dp.validation import Outcome
from sage_tfx.errors import AccountingModeError, InvalidRequestError
from sage_tfx.ledger import Grant, accounting

__all__ = ["CONSERVE", "AGGRESSIVE", "SEARCH_POLICIES", "SearchConfig", "IterationRecord",
           "AdaptiveSearch", "conserve_waste_bound"]

CONSERVE = "conserve"
AGGRESSIVE = "aggressive"
SEARCH_POLICIES = (CONSERVE, AGGRESSIVE)
FINAL_OUTCOMES = (Outcome.ACCEPT, Outcome.REJECT, Outcome.TIMEOUT)

_TOL = 1e-12


# --- value objects ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """How one pipeline searches for an ACCEPTable (window, ε) (§3.3).

    Attributes:
      epsilon0: ε of the first iteration (conserve) and the smallest ε ever tried (aggressive).
      delta: δ charged per iteration on a basic stream (ignored on rdp streams, where the
        pipeline's ``event_for`` carries the whole cost).
      min_blocks: the window of the first iteration, in blocks.
      max_epsilon: largest ε level an iteration may use (default: the stream's ε_g).
      policy: ``conserve`` (Block/Conserve) or ``aggressive`` (Block/Aggressive).
      timeout: give up (TIMEOUT) once ``now - arrived_at >= timeout`` (None: never).
      growth: factor by which ε or the window grows on RETRY (the paper doubles: 2).
      lower_epsilon: conserve only (ours, not in the paper): when neither (gε, w) nor (ε, gw) is
        affordable, also accept (ε/g^j, g^(j+1)·w) for j ≥ 1 (ε ≥ ε0): the iteration's budget
        ε × window still grows g-fold, so §3.3's bound holds, but a pipeline whose ε level no
        longer fits the (shrinking) per-block allocations is not starved for ever.
      use_all_data: conserve only (§7: "we use as much data as is available ... with the lowest
        privacy budget"): an iteration runs on *every* block whose allocation affords its ε
        instead of exactly the window size (which then is a minimum).
    """

    epsilon0: float
    delta: float = 0.0
    min_blocks: int = 1
    max_epsilon: Optional[float] = None
    policy: str = CONSERVE
    timeout: Optional[float] = None
    growth: int = 2
    lower_epsilon: bool = False
    use_all_data: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon0", accounting.check_epsilon(self.epsilon0, "epsilon0"))
        object.__setattr__(self, "delta", accounting.check_delta(self.delta, "delta"))
        if isinstance(self.min_blocks, bool) or not isinstance(self.min_blocks, int) \
                or self.min_blocks < 1:
            raise InvalidRequestError(f"min_blocks must be an integer ≥ 1, got {self.min_blocks!r}")
        if self.max_epsilon is not None:
            accounting.check_epsilon(self.max_epsilon, "max_epsilon")
            if self.max_epsilon < self.epsilon0:
                raise InvalidRequestError(
                    f"max_epsilon {self.max_epsilon} is below epsilon0 {self.epsilon0}")
        if self.policy not in SEARCH_POLICIES:
            raise InvalidRequestError(
                f"policy must be one of {SEARCH_POLICIES}, got {self.policy!r}")
        if self.timeout is not None and not (isinstance(self.timeout, (int, float))
                                             and math.isfinite(self.timeout) and self.timeout > 0):
            raise InvalidRequestError(f"timeout must be a finite number > 0, got {self.timeout!r}")
        if isinstance(self.growth, bool) or not isinstance(self.growth, int) or self.growth < 2:
            raise InvalidRequestError(f"growth must be an integer ≥ 2, got {self.growth!r}")


@dataclasses.dataclass(frozen=True)
class IterationRecord:
    """What one charged iteration was and how it ended (for reports and audits).

    ``charged_at`` / ``finished_at`` are in the caller's clock (simulation steps, or seconds).
    """

    pipeline_id: str
    iteration: int
    run_id: str
    window: int
    blocks: tuple[str, ...]
    epsilon: float
    delta: Optional[float]
    event: Optional[str]
    cost: float
    grant_id: str
    charged_at: float
    finished_at: float
    outcome: Outcome

    def to_dict(self) -> dict:
        """A JSON-able dict of the record (outcome as its value, blocks as a list)."""
        out = dataclasses.asdict(self)
        out["outcome"] = self.outcome.value
        out["blocks"] = list(self.blocks)
        return out


def conserve_waste_bound(records: Sequence[IterationRecord]) -> float:
    """Total budget a search charged divided by its final iteration's budget (§3.3's bound: ≤ 2).

    Budgets are per-block costs times window sizes (block-budget units), so data growth and ε
    growth are counted alike. Combined with "the final ε is at most twice the best one", a
    conserve search spends at most 4x the budget of the best model.

    Raises:
      InvalidRequestError: no iterations.
    """
    if not records:
        raise InvalidRequestError("no iterations")
    total = math.fsum(r.cost * r.window for r in records)
    return total / (records[-1].cost * records[-1].window)


# --- the per-pipeline search ------------------------------------------------------------------


class AdaptiveSearch:
    """Privacy-adaptive training of one pipeline (§3.3): proposes, charges and records iterations.

    Typical loop (a TFX component or the simulator)::

        search = AdaptiveSearch(allocator, "p1", SearchConfig(epsilon0=1/64, delta=1e-8))
        while not search.done:
            started = search.start(now=t, release=False)      # charged before anything is read
            if started is None:
                wait for new blocks; search.check_timeout(t); continue
            plan, grant = started
            grant = ledger.release(grant.grant_id)            # the gate hands out locations
            outcome = run_pipeline(grant.locations, plan.epsilon, plan.delta or plan.event)
            search.report(outcome, now=t)
    """

    def __init__(self, allocator: Allocator, pipeline_id: str, config: SearchConfig, *,
                 event_for: Optional[Callable[[float], dp_event_lib.DpEvent]] = None,
                 arrived_at: float = 0.0):
        """Admits the pipeline to the allocator.

        Args:
          allocator: the stream's allocator.
          pipeline_id: unique id (a valid ledger run-id prefix).
          config: the search parameters.
          event_for: rdp streams: maps an ε level to the DpEvent the pipeline runs at that level
            (e.g. a Gaussian / DP-SGD event calibrated to (ε, δ)); must be None on basic streams.
          arrived_at: the pipeline's arrival time (for timeouts and reports).
        Raises:
          AccountingModeError: ``event_for`` missing on an rdp stream or given on a basic one.
          AllocationError: the pipeline id is already waiting.
        """
        if (allocator.mode == accounting.RDP) != (event_for is not None):
            raise AccountingModeError(
                "an rdp stream needs event_for(epsilon) -> DpEvent; a basic stream charges "
                "(epsilon, delta) and takes no event_for")
        self._allocator = allocator
        self.pipeline_id = pipeline_id
        self.config = config
        self._event_for = event_for
        self._events: dict[float, dp_event_lib.DpEvent] = {}
        self._unit_cache: dict[float, int] = {}
        self.max_epsilon = config.max_epsilon if config.max_epsilon is not None \
            else allocator.epsilon_g
        self.arrived_at = float(arrived_at)
        self.finished_at: Optional[float] = None
        self.outcome: Optional[Outcome] = None
        self._records: list[IterationRecord] = []
        self._pending: Optional[tuple[IterationPlan, Grant, float]] = None
        allocator.admit(pipeline_id)

    # -- state --

    @property
    def done(self) -> bool:
        """True once the search reached ACCEPT or gave up."""
        return self.outcome is not None

    @property
    def records(self) -> tuple[IterationRecord, ...]:
        """The iterations run so far, oldest first."""
        return tuple(self._records)

    @property
    def pending(self) -> Optional[IterationPlan]:
        """The charged iteration awaiting :meth:`report`, if any."""
        return None if self._pending is None else self._pending[0]

    @property
    def epsilon(self) -> Optional[float]:
        """ε level of the last iteration (None before the first)."""
        return self._records[-1].epsilon if self._records else None

    @property
    def window(self) -> Optional[int]:
        """Window (blocks) of the last iteration (None before the first)."""
        return self._records[-1].window if self._records else None

    def budget_spent(self) -> float:
        """Block-budget units charged so far (Σ cost × window)."""
        return math.fsum(r.cost * r.window for r in self._records)

    # -- planning --

    def _event(self, epsilon: float) -> dp_event_lib.DpEvent:
        if epsilon not in self._events:
            self._events[epsilon] = self._event_for(epsilon)  # type: ignore[misc]
        return self._events[epsilon]

    def _units(self, epsilon: float) -> int:
        if epsilon not in self._unit_cache:
            a = self._allocator
            if a.mode == accounting.RDP:
                self._unit_cache[epsilon] = a.cost_units(event=self._event(epsilon))
            else:
                self._unit_cache[epsilon] = a.cost_units(epsilon=epsilon, delta=self.config.delta)
        return self._unit_cache[epsilon]

    @staticmethod
    def _newest(avail: np.ndarray, units: int, window: int) -> Optional[np.ndarray]:
        """The ``window`` newest blocks with at least ``units`` allocated, oldest first."""
        fit = np.flatnonzero(avail >= units)
        if len(fit) < window:
            return None
        return fit[len(fit) - window:]

    def _plan(self, positions: Iterable[int], epsilon: float) -> IterationPlan:
        a = self._allocator
        ids = a.block_ids()
        k = len(self._records)
        rdp = a.mode == accounting.RDP
        event = self._event(epsilon) if rdp else None
        return IterationPlan(self.pipeline_id, k, f"{self.pipeline_id}.it{k}",
                    tuple(ids[int(p)] for p in positions), epsilon,
                    None if rdp else self.config.delta, event,
                    self._units(epsilon) / UNITS_PER_BLOCK)

    def _max_level(self, units: int) -> Optional[float]:
        """Largest ε in [ε0, max_epsilon] whose cost fits ``units`` (aggressive), or None."""
        lo = self.config.epsilon0
        if self._units(lo) > units:
            return None
        hi = self.max_epsilon
        if self._units(hi) <= units:
            return hi
        if self._allocator.mode == accounting.BASIC:
            # Cost is max(ε/ε_g, δ/δ_g) and the δ part fits (ε0 fits): invert the ε part directly,
            # rounding down to 1e-9 so the exact decimal the ledger sums stays within the units.
            eps = math.floor(units / UNITS_PER_BLOCK * self._allocator.epsilon_g * 1e9) / 1e9
            while eps > lo and self._units(eps) > units:
                eps = math.floor(eps * 1e9 - 1) / 1e9
            return max(eps, lo)
        # rdp: the largest level on a grid of 2^(1/16) steps above ε0 (few distinct levels, so
        # event_for and the RDP curves are computed once per level); bisection keeps the
        # feasible end.
        lo_j, hi_j = 0, math.ceil(16 * math.log2(hi / lo))
        while hi_j - lo_j > 1:
            mid = (lo_j + hi_j) // 2
            if self._units(self._grid_level(mid)) <= units:
                lo_j = mid
            else:
                hi_j = mid
        return self._grid_level(lo_j)

    def _grid_level(self, j: int) -> float:
        return min(float(f"{self.config.epsilon0 * 2.0 ** (j / 16):.12g}"), self.max_epsilon)

    def propose(self) -> Optional[IterationPlan]:
        """The next iteration to run now, or None to wait (no ledger write).

        Conserve: first (ε0, min_blocks); after a RETRY at (ε, w), (2ε, w) if the allocation on
        w blocks covers it, else (ε, 2w) once 2w blocks with allocation exist (then, with
        ``lower_epsilon``, (ε/2^j, 2^(j+1)·w)). The window is the newest blocks whose allocation
        covers the cost (all of them with ``use_all_data``). Aggressive: the same windows, on
        the blocks with the largest allocations, each run at the largest ε they all afford.

        Raises:
          AllocationError: an iteration is pending (report it first).
        """
        if self._pending is not None:
            raise AllocationError(f"pipeline {self.pipeline_id!r} has a pending iteration")
        if self.done:
            return None
        avail = self._allocator.available_units(self.pipeline_id)
        held = int(np.count_nonzero(avail))
        if not held:
            return None
        g = self.config.growth
        if self.config.policy == CONSERVE:
            if not self._records:
                candidates = [(self.config.epsilon0, self.config.min_blocks)]
            else:
                eps, w = self.epsilon, self.window
                candidates = []
                if eps * g <= self.max_epsilon * (1 + _TOL):
                    candidates.append((min(eps * g, self.max_epsilon), w))
                candidates.append((eps, w * g))
                if self.config.lower_epsilon:
                    low, wide = eps / g, w * g * g
                    while low >= self.config.epsilon0 * (1 - _TOL) and wide <= held:
                        candidates.append((low, wide))
                        low, wide = low / g, wide * g
            for eps, w in candidates:
                units = self._units(eps)
                if self.config.use_all_data:
                    fit = np.flatnonzero(avail >= units)
                    positions = fit if len(fit) >= w else None
                else:
                    positions = self._newest(avail, units, w)
                if positions is not None:
                    return self._plan(positions, eps)
            return None
        # Aggressive.
        if not self._records:
            windows = [(self.config.min_blocks, 0.0)]
        else:
            eps, w = self.epsilon, self.window
            # Same window with at least g·ε, or a g-times larger window at any ε ≥ ε0.
            windows = [(w, eps * g), (w * g, 0.0)]
        nonzero = np.flatnonzero(avail)
        ranked = nonzero[np.lexsort((nonzero, avail[nonzero]))]  # by units, then newest, ascending
        for w, min_eps in windows:
            if len(ranked) < w:
                continue
            best = ranked[len(ranked) - w:]  # the w largest allocations
            eps = self._max_level(int(avail[best].min()))
            if eps is None or eps < min_eps * (1 - _TOL):
                continue
            return self._plan(np.sort(best), eps)
        return None

    # -- running --

    def start(self, *, now: float, release: bool = True) -> Optional[tuple[IterationPlan, Grant]]:
        """Proposes the next iteration and charges it through the ledger (charge before release).

        Args:
          now: the caller's clock.
          release: release the data in the charging transaction (default); with False the grant
            is a reservation and the caller releases it with ``ledger.release(grant_id)``.
        Returns:
          (plan, grant), or None if there is nothing to run now (wait for blocks) or the ledger
          denied the charge.
        """
        if self.check_timeout(now):
            return None
        plan = self.propose()
        if plan is None:
            return None
        decision = self._allocator.charge(self.pipeline_id, plan, release=release)
        if not decision.granted:
            return None
        self._pending = (plan, decision.grant, float(now))  # type: ignore[arg-type]
        return plan, decision.grant  # type: ignore[return-value]

    def report(self, outcome: Outcome, *, now: float) -> IterationRecord:
        """Records the pending iteration's outcome; ACCEPT/REJECT/TIMEOUT end the search.

        Raises:
          AllocationError: nothing is pending. InvalidRequestError: not an Outcome.
        """
        if self._pending is None:
            raise AllocationError(f"pipeline {self.pipeline_id!r} has no pending iteration")
        outcome = Outcome(outcome)
        plan, grant, charged_at = self._pending
        self._pending = None
        record = IterationRecord(
            plan.pipeline_id, plan.iteration, plan.run_id, plan.window, plan.blocks, plan.epsilon,
            plan.delta, accounting.event_to_json(plan.event) if plan.event is not None else None,
            plan.cost, grant.grant_id, charged_at, float(now), outcome)
        self._records.append(record)
        if outcome in FINAL_OUTCOMES:
            self._finish(outcome, now)
        return record

    def _finish(self, outcome: Outcome, now: float) -> None:
        self.outcome = outcome
        self.finished_at = float(now)
        self._allocator.finish(self.pipeline_id)

    def check_timeout(self, now: float) -> bool:
        """Ends the search with TIMEOUT if its time is up and nothing is pending; True if so."""
        t = self.config.timeout
        if (not self.done and self._pending is None and t is not None
                and now - self.arrived_at >= t):
            self._finish(Outcome.TIMEOUT, now)
        return self.outcome == Outcome.TIMEOUT

    def abort(self, *, now: float, outcome: Outcome = Outcome.TIMEOUT) -> None:
        """Stops the search; an unreleased pending reservation is cancelled and refunded."""
        if self.done:
            return
        if self._pending is not None:
            plan, grant, _ = self._pending
            self._pending = None
            current = self._allocator.ledger.grant(grant.grant_id)
            if current.status == "reserved":
                self._allocator.ledger.cancel(grant.grant_id)
                self._allocator.refund(self.pipeline_id, plan)
        self._finish(Outcome(outcome), now)
