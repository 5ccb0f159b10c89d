"""Sage's per-block budget allocator (§3.3, §5.4) for privacy-adaptive training.

Divides each block's budget among the pipelines waiting on the stream (§3.3, "Every time a
new block is created, its budget is divided evenly across the ML pipelines currently
waiting"; §5.4, shared by Block/Conserve and Block/Aggressive). When a pipeline finishes
(ACCEPT, REJECT or timeout) its unused allocation is divided evenly among the pipelines still
waiting. Allocations are the allocator's *bookkeeping* only: the ledger stays the only writer
of budget state, every run is charged through :meth:`Ledger.request` before any data is
released, and the allocator never hands out more than the ledger has left.
Policy ``fcfs`` keeps no per-pipeline shares: any waiting pipeline may use any budget left,
first come first served.

Budget units. The allocator counts budget in integer units, ``UNITS_PER_BLOCK`` per block, so
splitting and refunding never drift. A charge's cost is the fraction of one block's budget it
uses, rounded *up* to a unit:

* ``basic`` streams: ``max(ε/ε_g, δ/δ_g)`` on the exact decimals the ledger sums
  (``accounting.exact``), so a plan the allocator admits is always admitted by the ledger.
* ``rdp`` streams: ``R(α_ref)/cap(α_ref)`` at one reference order ``α_ref`` of the stream's RDP
  filter (plus a 1e-9 relative margin for the ledger's float sums). If every charge on a block
  fits at ``α_ref``, the filter admits each of them (it needs *some* order within its cap), so the
  allocator's promise is sound for any DpEvent. The default ``α_ref`` maximizes ``cap(α)/α`` over
  the grid: for Gaussian events (RDP linear in α) that is exactly the order at which the block
  admits the most, so nothing is lost for Gaussian / DP-SGD-like workloads; for other event shapes
  the ledger may admit more than the allocator promises (never less).

The per-pipeline search that spends the allocations is :mod:`sage_tfx.adaptive.search`.
This module imports no TensorFlow (numpy holds the allocation table).
"""
from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Iterable, Optional

import numpy as np
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.errors import AccountingModeError, InvalidRequestError, RetiredBlockError, SageError
from sage_tfx.ledger import DEFAULT_CONTEXT, Decision, Ledger, accounting

__all__ = ["UNITS_PER_BLOCK", "EVEN", "FCFS", "ALLOCATION_POLICIES", "AllocationError", "Allocator",
           "IterationPlan"]

UNITS_PER_BLOCK = 10 ** 12
EVEN = "even"
FCFS = "fcfs"
ALLOCATION_POLICIES = (EVEN, FCFS)

_RDP_MARGIN = 1e-9  # relative slack on rdp costs: the ledger sums RDP curves in floats


class AllocationError(SageError, ValueError):
    """A plan the allocator cannot honour (unknown pipeline, cost above its allocation, ...)."""


@dataclasses.dataclass(frozen=True)
class IterationPlan:
    """One iteration a pipeline wants to run: the blocks and the privacy cost to charge on each.

    Attributes:
      pipeline_id: the pipeline.
      iteration: 0-based iteration number.
      run_id: the ledger run id the charge is made under (unique per pipeline iteration).
      blocks: block ids of the window, oldest first.
      epsilon: the iteration's ε level (basic: the ε charged; rdp: the level ``event_for`` maps).
      delta: δ charged on a basic stream, None on rdp.
      event: the DpEvent charged on an rdp stream, None on basic.
      cost: fraction of one block's budget charged to each block of the window (allocator units,
        rounded up).
    """

    pipeline_id: str
    iteration: int
    run_id: str
    blocks: tuple[str, ...]
    epsilon: float
    delta: Optional[float]
    event: Optional[dp_event_lib.DpEvent]
    cost: float

    @property
    def window(self) -> int:
        """Number of blocks in the iteration's window."""
        return len(self.blocks)


def _exact(value: float) -> Fraction:
    """The exact decimal the ledger sums for a float (``accounting.exact``), as a Fraction."""
    return Fraction(accounting.exact(value))


def _ceil_units(fraction: Fraction) -> int:
    return -((-fraction.numerator * UNITS_PER_BLOCK) // fraction.denominator)


class Allocator:
    """Sage's per-block budget allocator over one ledger stream and context (§3.3, §5.4).

    Not thread-safe; one allocator should be the only consumer of its (stream, context): it
    re-reads a block's remaining budget only when the ledger denies or refunds a request on it.
    """

    def __init__(self, ledger: Ledger, stream: str, *, context: str = DEFAULT_CONTEXT,
                 policy: str = EVEN, reference_order: Optional[float] = None):
        """Attaches to an existing stream; call :meth:`add_blocks` for the blocks to allocate.

        Args:
          ledger: the ledger (the only writer of budget state).
          stream: the stream's name.
          context: the budget list charged.
          policy: ``even`` (Sage) or ``fcfs`` (one shared pool, first come first served).
          reference_order: rdp streams: the order at which shares are accounted (default: the
            grid order maximizing cap(α)/α, see module docstring).
        Raises:
          UnknownStreamError, InvalidRequestError: unknown stream/context, bad policy or order.
        """
        if policy not in ALLOCATION_POLICIES:
            raise InvalidRequestError(
                f"policy must be one of {ALLOCATION_POLICIES}, got {policy!r}")
        self._ledger = ledger
        self._stream = ledger.stream(stream)
        if context not in self._stream.contexts:
            raise InvalidRequestError(
                f"context {context!r} is not configured for stream {stream!r}")
        self.context = context
        self.policy = policy
        self._order_index: Optional[int] = None
        if self._stream.mode == accounting.RDP:
            self._order_index = self._pick_order(reference_order)
        elif reference_order is not None:
            raise AccountingModeError("reference_order only applies to rdp streams")
        self._ids: list[str] = []
        self._pos: dict[str, int] = {}
        # Budget state in integer units. Row r of _alloc is one waiting pipeline's allocation per
        # block (column = block position, oldest first); _free is what nobody holds.
        self._alloc = np.zeros((8, 64), dtype=np.int64)
        self._free = np.zeros(64, dtype=np.int64)
        self._retired = np.zeros(64, dtype=bool)
        self._row: dict[str, int] = {}  # waiting pipeline -> row, in admission order
        self._spare_rows: list[int] = []
        self._rows_used = 0
        self._active: Optional[np.ndarray] = None  # rows of the waiting, oldest first (cache)
        self._cost_cache: dict = {}
        self.denials = 0

    def _pick_order(self, reference_order: Optional[float]) -> int:
        orders, caps = self._stream.orders, self._stream.caps
        if reference_order is not None:
            if float(reference_order) not in orders:
                raise InvalidRequestError(
                    f"reference_order {reference_order} is not on the stream's grid {orders}")
            i = orders.index(float(reference_order))
            if caps[i] <= 0:
                raise InvalidRequestError(
                    f"reference_order {reference_order} has cap {caps[i]:.3g} ≤ 0: nothing fits")
            return i
        usable = [i for i, c in enumerate(caps) if c > 0]
        if not usable:
            raise InvalidRequestError(f"stream {self._stream.name!r}: every RDP cap is ≤ 0")
        return max(usable, key=lambda i: caps[i] / orders[i])

    # -- introspection --

    @property
    def stream(self) -> str:
        """Name of the stream whose blocks are allocated."""
        return self._stream.name

    @property
    def mode(self) -> str:
        """The stream's accounting mode (``basic`` or ``rdp``)."""
        return self._stream.mode

    @property
    def epsilon_g(self) -> float:
        """The stream's global per-block budget ε_g."""
        return self._stream.epsilon_g

    @property
    def reference_order(self) -> Optional[float]:
        """The RDP order at which shares are accounted (None on basic streams)."""
        return None if self._order_index is None else self._stream.orders[self._order_index]

    @property
    def ledger(self) -> Ledger:
        """The ledger the allocator charges."""
        return self._ledger

    def waiting(self) -> tuple[str, ...]:
        """Pipelines currently waiting (admitted and not finished), oldest first."""
        return tuple(self._row)

    def block_ids(self) -> tuple[str, ...]:
        """Blocks the allocator knows, oldest first."""
        return tuple(self._ids)

    def _as_dict(self, units: np.ndarray) -> dict[str, float]:
        return {self._ids[p]: int(units[p]) / UNITS_PER_BLOCK for p in np.flatnonzero(units)}

    def allocation(self, pipeline_id: str) -> dict[str, float]:
        """Budget a pipeline may still use, per block, as a fraction of one block's budget.

        With ``fcfs`` this is the shared pool.
        """
        return self._as_dict(self._available(pipeline_id))

    def unallocated(self) -> dict[str, float]:
        """Budget not allocated to any pipeline, per block, as a fraction of a block's budget."""
        return self._as_dict(self._free[:len(self._ids)])

    def _totals(self) -> np.ndarray:
        n = len(self._ids)
        return self._free[:n] + self._alloc[:, :n].sum(axis=0)

    def block_total(self, block_id: str) -> float:
        """Everything the allocator may still hand out on a block (free + all allocations)."""
        return int(self._totals()[self._position(block_id)]) / UNITS_PER_BLOCK

    def problems(self) -> list[str]:
        """Blocks where the allocator would hand out more than the ledger has left (empty: none)."""
        out = []
        # rdp: the ledger's float sums of RDP curves put its headroom within a unit of the exact
        # value; the allocator's margin (cost_units) keeps it below, up to that unit.
        slack = 1 if self.mode == accounting.RDP else 0
        for p, total in enumerate(self._totals().tolist()):
            left = self._ledger_units(self._ids[p])
            if total > left + slack:
                out.append(f"{self._ids[p]}: allocator holds {total} units, ledger has {left} left")
        return out

    # -- costs --

    def cost_units(self, *, epsilon: Optional[float] = None, delta: Optional[float] = None,
                   event: Optional[dp_event_lib.DpEvent] = None) -> int:
        """Integer units of one block's budget a charge uses (rounded up; see module docstring).

        Returns ``UNITS_PER_BLOCK + 1`` for a charge that can never fit a fresh block.

        Raises:
          AccountingModeError, InvalidPrivacyParameterError: cost of the wrong form or invalid.
        """
        s = self._stream
        if s.mode == accounting.BASIC:
            if event is not None or epsilon is None:
                raise AccountingModeError(f"stream {s.name!r} is basic: give epsilon (and delta)")
            key = (epsilon, delta)
            if key not in self._cost_cache:
                eps = _exact(accounting.check_epsilon(epsilon)) / _exact(s.epsilon_g)
                dlt = accounting.check_delta(0.0 if delta is None else delta)
                if dlt > 0 and s.delta_g == 0:
                    frac = Fraction(2)  # never fits
                elif dlt > 0:
                    frac = max(eps, _exact(dlt) / _exact(s.delta_g))
                else:
                    frac = eps
                self._cost_cache[key] = min(_ceil_units(frac), UNITS_PER_BLOCK + 1)
            return self._cost_cache[key]
        if epsilon is not None or delta is not None or event is None:
            raise AccountingModeError(f"stream {s.name!r} is rdp: give a DpEvent")
        key = accounting.event_to_json(event)
        if key not in self._cost_cache:
            r = accounting.rdp_curve(event, s.orders)[self._order_index]
            cap = s.caps[self._order_index]
            units = (r / cap * (1.0 + _RDP_MARGIN) * UNITS_PER_BLOCK if math.isfinite(r)
                     else math.inf)
            self._cost_cache[key] = (UNITS_PER_BLOCK + 1 if units > UNITS_PER_BLOCK
                                     else max(1, math.ceil(units)))
        return self._cost_cache[key]

    def cost(self, **charge) -> float:
        """:meth:`cost_units` as a fraction of one block's budget."""
        return self.cost_units(**charge) / UNITS_PER_BLOCK

    # -- ledger view --

    def _position(self, block_id: str) -> int:
        if block_id not in self._pos:
            raise AllocationError(f"block {block_id!r} was never added to the allocator")
        return self._pos[block_id]

    def _ledger_units(self, block_id: str) -> int:
        """Units the ledger has left on a block (0 if retired), rounded down."""
        s = self._stream
        state = self._ledger.block(s.name, block_id, self.context)
        if not state.active:
            return 0
        if state.charges == 0:
            return UNITS_PER_BLOCK
        if s.mode == accounting.BASIC:
            left = self._ledger.remaining(s.name, block_id, self.context)
            frac = _exact(left["epsilon"]) / _exact(s.epsilon_g)
            if s.delta_g > 0:
                frac = min(frac, _exact(left["delta"]) / _exact(s.delta_g))
            # remaining() returns the exact decimal as a float; its shortest repr is that decimal
            # unless it has > 17 digits, far below a unit (1e-12). The ledger's own check stays
            # the backstop: a denial resynchronizes.
            return max(0, math.floor(frac * UNITS_PER_BLOCK))
        head = self._ledger.remaining(s.name, block_id, self.context)["headroom"]
        room = head[self.reference_order]
        cap = s.caps[self._order_index]
        # Costs carry the margin (cost_units), so the headroom is converted as is.
        return max(0, math.floor(room / cap * UNITS_PER_BLOCK))

    # -- allocation events --

    def _grow_blocks(self, n: int) -> None:
        cap = self._free.shape[0]
        if n > cap:
            extra = max(n, 2 * cap) - cap
            self._alloc = np.pad(self._alloc, ((0, 0), (0, extra)))
            self._free = np.pad(self._free, (0, extra))
            self._retired = np.pad(self._retired, (0, extra))

    def _new_row(self) -> int:
        if self._spare_rows:
            return self._spare_rows.pop()
        row = self._rows_used
        self._rows_used += 1
        if row >= self._alloc.shape[0]:
            self._alloc = np.pad(self._alloc, ((0, self._alloc.shape[0]), (0, 0)))
        return row

    def _active_rows(self) -> np.ndarray:
        if self._active is None:
            self._active = np.fromiter(self._row.values(), dtype=np.intp, count=len(self._row))
        return self._active

    def _split(self, cols: np.ndarray, units: np.ndarray) -> None:
        """Divides ``units[i]`` of block ``cols[i]`` evenly among the waiting (to the unit: the
        oldest pipelines get the remainder); to the free pool if nobody waits or under fcfs."""
        if len(cols) == 0:
            return
        rows = self._active_rows()
        if self.policy == FCFS or len(rows) == 0:
            self._free[cols] += units
            return
        share, rest = np.divmod(units, len(rows))
        extra = np.arange(len(rows))[:, None] < rest[None, :]
        self._alloc[np.ix_(rows, cols)] += share[None, :] + extra

    def add_blocks(self, block_ids: Iterable[str]) -> None:
        """Takes new ledger blocks under allocation and divides their budget among the waiting.

        Blocks must already be registered in the ledger, and be given oldest first.

        Raises:
          UnknownBlockError: a block is not in the ledger. AllocationError: added twice.
        """
        block_ids = list(block_ids)
        for block_id in block_ids:
            if block_id in self._pos:
                raise AllocationError(f"block {block_id!r} was already added")
        units = [self._ledger_units(b) for b in block_ids]
        first = len(self._ids)
        self._grow_blocks(first + len(block_ids))
        for k, block_id in enumerate(block_ids):
            self._pos[block_id] = first + k
            self._ids.append(block_id)
            if units[k] == 0:
                self._retired[first + k] = True
        self._split(np.arange(first, first + len(block_ids)), np.asarray(units, dtype=np.int64))

    def admit(self, pipeline_id: str) -> None:
        """Registers a waiting pipeline; budget nobody was waiting for is divided among the waiting.

        Raises:
          AllocationError: the pipeline is already waiting.
        """
        if pipeline_id in self._row:
            raise AllocationError(f"pipeline {pipeline_id!r} is already waiting")
        self._row[pipeline_id] = self._new_row()
        self._active = None
        if self.policy == EVEN:
            cols = np.flatnonzero(self._free[:len(self._ids)])
            if len(cols):
                units = self._free[cols].copy()
                self._free[cols] = 0
                self._split(cols, units)

    def finish(self, pipeline_id: str) -> dict[str, float]:
        """A pipeline stops waiting; its unused allocation is divided among the waiting (§3.3).

        Returns:
          The returned allocation per block (fraction of a block's budget).
        Raises:
          AllocationError: unknown pipeline.
        """
        if pipeline_id not in self._row:
            raise AllocationError(f"pipeline {pipeline_id!r} is not waiting")
        row = self._row.pop(pipeline_id)
        self._active = None
        n = len(self._ids)
        leftover = self._alloc[row, :n].copy()
        self._alloc[row, :] = 0
        self._spare_rows.append(row)
        returned = self._as_dict(leftover)
        leftover[self._retired[:n]] = 0
        cols = np.flatnonzero(leftover)
        self._split(cols, leftover[cols])
        return returned

    def _available(self, pipeline_id: str) -> np.ndarray:
        if pipeline_id not in self._row:
            raise AllocationError(f"pipeline {pipeline_id!r} is not waiting")
        n = len(self._ids)
        return self._free[:n] if self.policy == FCFS else self._alloc[self._row[pipeline_id], :n]

    def available_units(self, pipeline_id: str) -> np.ndarray:
        """Read-only units the pipeline may use per block position (positions index
        :meth:`block_ids`; with ``fcfs``, the shared pool)."""
        view = self._available(pipeline_id).view()
        view.flags.writeable = False
        return view

    # -- charging --

    def charge(self, pipeline_id: str, plan: IterationPlan, *, release: bool = True) -> Decision:
        """Charges a plan through the ledger (all blocks or none), then debits the allocation.

        Args:
          pipeline_id: the waiting pipeline whose allocation pays.
          plan: what to charge (blocks and cost).
          release: release the data in the charging transaction; with False the grant is a
            reservation and the caller releases it through the ledger (``ledger.release``).
        Returns:
          The ledger's Decision. A denial (the ledger had less than the allocator thought, e.g.
          someone else charged the stream) resynchronizes those blocks and debits nothing.
        Raises:
          AllocationError: the plan exceeds the pipeline's allocation or names unknown blocks.
        """
        avail = self._available(pipeline_id)
        units = self._plan_units(plan)
        positions = np.array([self._position(b) for b in plan.blocks], dtype=np.intp)
        short = [self._ids[p] for p in positions[avail[positions] < units]]
        if short:
            raise AllocationError(
                f"plan {plan.run_id} costs {units / UNITS_PER_BLOCK:.6g} of a block but pipeline "
                f"{pipeline_id!r} has less allocated on {', '.join(short[:5])}")
        kwargs = ({"event": plan.event} if self.mode == accounting.RDP
                  else {"epsilon": plan.epsilon, "delta": plan.delta})
        try:
            decision = self._ledger.request(self.stream, run_id=plan.run_id,
                                            blocks=list(plan.blocks), context=self.context,
                                            release=release, **kwargs)
        except RetiredBlockError as err:
            self._resync(positions)
            self.denials += 1
            return Decision(False, None, str(err))
        if not decision.granted:
            self._resync(positions)
            self.denials += 1
            return decision
        if not decision.replayed:
            avail[positions] -= units
        return decision

    def refund(self, pipeline_id: str, plan: IterationPlan) -> None:
        """Credits a cancelled reservation's cost back (to the pipeline if still waiting).

        Call after ``ledger.cancel`` succeeded for the plan's grant.
        """
        units = self._plan_units(plan)
        positions = np.array([self._position(b) for b in plan.blocks], dtype=np.intp)
        if self.policy == EVEN and pipeline_id in self._row:
            self._alloc[self._row[pipeline_id], positions] += units
        else:
            self._split(positions, np.full(len(positions), units, dtype=np.int64))
        self._resync(positions.tolist())

    def _plan_units(self, plan: IterationPlan) -> int:
        if self.mode == accounting.RDP:
            if plan.event is None:
                raise AccountingModeError(
                    f"stream {self.stream!r} is rdp: the plan needs a DpEvent")
            return self.cost_units(event=plan.event)
        return self.cost_units(epsilon=plan.epsilon, delta=plan.delta)

    def _resync(self, positions: Iterable[int]) -> None:
        """Caps the allocator's view of some blocks at what the ledger has left."""
        for p in sorted(set(int(x) for x in positions)):
            left = self._ledger_units(self._ids[p])
            if left == 0:
                self._retired[p] = True
            free = int(self._free[p])
            holders = np.flatnonzero(self._alloc[:, p])
            held = int(self._alloc[holders, p].sum())
            excess = free + held - left
            if excess <= 0:
                continue
            take = min(excess, free)
            self._free[p] -= take
            excess -= take
            if excess > 0:  # shrink every holder's share proportionally (Python ints: no overflow)
                for r in holders.tolist():
                    self._alloc[r, p] = int(self._alloc[r, p]) * (held - excess) // held
