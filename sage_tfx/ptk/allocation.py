"""The allocator's plan types: a menu option, a PTK's assignment, a partition, an allocation.

Kept apart from the solver (:mod:`sage_tfx.ptk.allocator`, which re-exports them) so each module
stays small. Sums over a partition are exact decimals of the menu values, the values the ledger
is charged.
"""
from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Optional

from sage_tfx.ledger.accounting import in_ledger_context


def dec(x: float) -> Decimal:
    """``x`` as the exact decimal of its shortest repr (how menu values are summed and charged)."""
    return Decimal(repr(float(x)))


@dataclasses.dataclass(frozen=True)
class Option:
    """One menu entry of a PTK: with (ε, δ) it needs ``n`` samples."""

    epsilon: float
    delta: float
    n: int


@dataclasses.dataclass(frozen=True)
class Assignment:
    """The menu entry a PTK was given: its (ε, δ) and sample count ``n``."""

    ptk_id: str
    epsilon: float
    delta: float
    n: int


@dataclasses.dataclass(frozen=True)
class Partition:
    """Partition ``index`` of ``size`` samples and the PTKs that share its budget."""

    index: int
    size: int
    members: tuple[Assignment, ...]

    @property
    @in_ledger_context
    def epsilon_sum(self) -> Decimal:
        """Σ ε of the members (sequential composition inside the partition), exact (the
        ledger's decimal context, whatever the caller's)."""
        return sum((dec(a.epsilon) for a in self.members), Decimal(0))

    @property
    @in_ledger_context
    def delta_sum(self) -> Decimal:
        """Σ δ of the members, exact (the ledger's decimal context)."""
        return sum((dec(a.delta) for a in self.members), Decimal(0))


@dataclasses.dataclass(frozen=True)
class Allocation:
    """A plan: K partitions, or a REJECT (``partitions == ()``) with the reason."""

    partitions: tuple[Partition, ...]
    epsilon_g: float
    delta_g: float
    n_max: int
    solve_seconds: float
    tried_k: tuple[int, ...]
    reason: str = ""
    optimal: bool = True  # False: the time budget ran out; the plan is feasible, ``gap`` says how
    gap: float = 0.0      # far from the best it can be: (total - lower_bound) / total, proven
    lower_bound: int = 0  # proven lower bound on the total over every K <= k_max
    first_feasible: Optional[tuple] = None  # (K, total) of the greedy warm start
    k_max: Optional[int] = None  # the configured bound on K (None: the number of PTKs)
    proof: str = ""  # what proved ``lower_bound``: "merged model", "exact model", "floor"

    @property
    def feasible(self) -> bool:
        """False for a REJECT (no partitions and a reason)."""
        return bool(self.partitions) or not self.reason

    @property
    def K(self) -> int:  # noqa: N802 - the paper's name
        """The number of non-empty partitions."""
        return len(self.partitions)

    @property
    def total(self) -> int:
        """Σ N_k: the samples the plan needs."""
        return sum(p.size for p in self.partitions)

    def assignment(self, ptk_id: str) -> tuple[int, Assignment]:
        """``(partition index, assignment)`` of ``ptk_id``; KeyError if it is not planned."""
        for p in self.partitions:
            for a in p.members:
                if a.ptk_id == ptk_id:
                    return p.index, a
        raise KeyError(ptk_id)

    def to_dict(self) -> dict:
        """The JSON form (the service's ``GET /plan`` and the stored plan)."""
        return {
            "feasible": self.feasible, "reason": self.reason, "K": self.K, "total": self.total,
            "epsilon_g": self.epsilon_g, "delta_g": self.delta_g, "n_max": self.n_max,
            "solve_seconds": self.solve_seconds, "tried_k": list(self.tried_k),
            "optimal": self.optimal, "gap": self.gap, "lower_bound": self.lower_bound,
            "first_feasible": list(self.first_feasible) if self.first_feasible else None,
            "k_max": self.k_max, "proof": self.proof,
            "partitions": [{"index": p.index, "size": p.size,
                            "epsilon_sum": str(p.epsilon_sum), "delta_sum": str(p.delta_sum),
                            "members": [dataclasses.asdict(a) for a in p.members]}
                           for p in self.partitions]}

    @classmethod
    def from_dict(cls, d: dict) -> "Allocation":
        """The plan :meth:`to_dict` wrote (a stored plan; keys added later are optional)."""
        parts = tuple(Partition(p["index"], p["size"], tuple(Assignment(**m)
                                                            for m in p["members"]))
                      for p in d.get("partitions", ()))
        ff = d.get("first_feasible")
        return cls(parts, d["epsilon_g"], d["delta_g"], d["n_max"], d.get("solve_seconds", 0.0),
                   tuple(d.get("tried_k", ())), d.get("reason", ""),
                   optimal=d.get("optimal", False), gap=d.get("gap", 0.0),
                   lower_bound=d.get("lower_bound", 0),
                   first_feasible=tuple(ff) if ff else None, k_max=d.get("k_max"),
                   proof=d.get("proof", ""))

    def render(self) -> str:
        """A human-readable plan (``sage-tfx ptk plan``)."""
        if not self.feasible:
            return f"REJECT: {self.reason}"
        lines = [f"K = {self.K}, total samples N = {self.total:,} (N_max {self.n_max:,}), "
                 f"solved in {self.solve_seconds:.3f} s"
                 + ((f" (optimal, proven by the {self.proof})" if self.proof else " (optimal)")
                    if self.optimal else
                    f" (time limit: proven gap {self.gap:.2%}, lower bound "
                    f"{self.lower_bound:,})")]
        if self.first_feasible:
            lines.append(f"  warm start (the paper's first feasible K, packed greedily): "
                         f"K = {self.first_feasible[0]}, {self.first_feasible[1]:,} samples")
        for p in self.partitions:
            lines.append(f"  partition {p.index}: N_k = {p.size:,}, sum eps = {p.epsilon_sum} "
                         f"<= {dec(self.epsilon_g)}, sum delta = {p.delta_sum}")
            for a in p.members:
                lines.append(f"    {a.ptk_id:<24} eps = {a.epsilon:<8g} n = {a.n:,}")
        return "\n".join(lines)
