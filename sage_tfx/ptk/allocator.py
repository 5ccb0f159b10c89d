"""The double-resource allocator (PTK paper §5.3, Fig. 4), solved with ``scipy.optimize.milp``.

Variables x_ijk = 1 iff PTK i takes menu option j in partition k, and N_k ≥ 0 (the size of
partition k). Minimise Σ_k N_k subject to N_k ≥ Σ_j n_ij x_ijk for all i, k (the linearised
``max_i``), Σ_ij ε_ij x_ijk ≤ ℰ and Σ_ij δ_ij x_ijk ≤ Δ for every k (privacy: sequential
composition inside a partition, parallel across disjoint partitions), Σ_jk x_ijk = 1 for every i
(assignment) and Σ_k N_k ≤ N_max. K runs 1, 2, … (at most the number of PTKs or ``k_max``) until
the program is feasible; past that the allocation is a REJECT with the reason.

After every solve the partition sums are re-checked on exact decimals of the menu values (the
values the ledger will be charged); a float solution that over-spends by rounding is re-solved
with the right-hand side tightened, never accepted.

Note on the paper: the first feasible K is not always the K of least total samples (a second
partition can let PTKs take larger ε and need far fewer samples). We follow the paper and stop
at the first feasible K; :func:`allocate` with ``k_min``/``k_max`` lets a caller compare.
"""
from __future__ import annotations

import dataclasses
import time
from decimal import Decimal
from typing import Optional

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from sage_tfx.errors import InvalidRequestError


def dec(x: float) -> Decimal:
    return Decimal(repr(float(x)))


@dataclasses.dataclass(frozen=True)
class Option:
    epsilon: float
    delta: float
    n: int


@dataclasses.dataclass(frozen=True)
class Assignment:
    ptk_id: str
    epsilon: float
    delta: float
    n: int


@dataclasses.dataclass(frozen=True)
class Partition:
    index: int
    size: int
    members: tuple[Assignment, ...]

    @property
    def epsilon_sum(self) -> Decimal:
        return sum((dec(a.epsilon) for a in self.members), Decimal(0))

    @property
    def delta_sum(self) -> Decimal:
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
    optimal: bool = True  # False: HiGHS hit the time limit; the plan is feasible, not proven best

    @property
    def feasible(self) -> bool:
        return bool(self.partitions) or not self.reason

    @property
    def K(self) -> int:  # noqa: N802 - the paper's name
        return len(self.partitions)

    @property
    def total(self) -> int:
        return sum(p.size for p in self.partitions)

    def assignment(self, ptk_id: str) -> tuple[int, Assignment]:
        for p in self.partitions:
            for a in p.members:
                if a.ptk_id == ptk_id:
                    return p.index, a
        raise KeyError(ptk_id)

    def to_dict(self) -> dict:
        return {
            "feasible": self.feasible, "reason": self.reason, "K": self.K, "total": self.total,
            "epsilon_g": self.epsilon_g, "delta_g": self.delta_g, "n_max": self.n_max,
            "solve_seconds": self.solve_seconds, "tried_k": list(self.tried_k),
            "optimal": self.optimal,
            "partitions": [{"index": p.index, "size": p.size,
                            "epsilon_sum": str(p.epsilon_sum), "delta_sum": str(p.delta_sum),
                            "members": [dataclasses.asdict(a) for a in p.members]}
                           for p in self.partitions]}

    def render(self) -> str:
        if not self.feasible:
            return f"REJECT: {self.reason}"
        lines = [f"K = {self.K}, total samples N = {self.total:,} (N_max {self.n_max:,}), "
                 f"solved in {self.solve_seconds:.3f} s"
                 + ("" if self.optimal else " (time limit: feasible, not proven optimal)")]
        for p in self.partitions:
            lines.append(f"  partition {p.index}: N_k = {p.size:,}, sum eps = {p.epsilon_sum} "
                         f"<= {dec(self.epsilon_g)}, sum delta = {p.delta_sum}")
            for a in p.members:
                lines.append(f"    {a.ptk_id:<24} eps = {a.epsilon:<8g} n = {a.n:,}")
        return "\n".join(lines)


def _solve_k(ids, menus, K, eps_g, delta_g, n_max, time_limit, eps_rhs, delta_rhs):
    cols = [(i, j, k) for k in range(K) for i in range(len(ids)) for j in range(len(menus[i]))]
    nx = len(cols)
    nv = nx + K
    c = np.zeros(nv)
    c[nx:] = 1.0
    rows, lo, hi = [], [], []

    def add(row, lower, upper):
        rows.append(row)
        lo.append(lower)
        hi.append(upper)

    index = {col: v for v, col in enumerate(cols)}
    for k in range(K):
        for i in range(len(ids)):
            r = np.zeros(nv)
            for j, o in enumerate(menus[i]):
                r[index[(i, j, k)]] = o.n
            r[nx + k] = -1.0
            add(r, -np.inf, 0.0)
        r = np.zeros(nv)
        rd = np.zeros(nv)
        for i in range(len(ids)):
            for j, o in enumerate(menus[i]):
                r[index[(i, j, k)]] = o.epsilon / eps_g  # rows scaled to O(1) for HiGHS
                rd[index[(i, j, k)]] = o.delta / delta_g if delta_g > 0 else 0.0
        add(r, -np.inf, eps_rhs)
        if rd.any():
            add(rd, -np.inf, delta_rhs)
        if k + 1 < K:  # symmetry breaking: partitions by decreasing size
            r = np.zeros(nv)
            r[nx + k], r[nx + k + 1] = -1.0, 1.0
            add(r, -np.inf, 0.0)
    for i in range(len(ids)):
        r = np.zeros(nv)
        for k in range(K):
            for j in range(len(menus[i])):
                r[index[(i, j, k)]] = 1.0
        add(r, 1.0, 1.0)
    r = np.zeros(nv)
    r[nx:] = 1.0
    add(r, -np.inf, float(n_max))
    integrality = np.r_[np.ones(nx), np.zeros(K)]
    bounds = Bounds(np.zeros(nv), np.r_[np.ones(nx), np.full(K, float(n_max))])
    res = milp(c, constraints=LinearConstraint(np.array(rows), lo, hi), integrality=integrality,
               bounds=bounds, options={"time_limit": time_limit, "presolve": True})
    if res.x is None:
        return None, None
    chosen = [cols[v] for v in range(nx) if res.x[v] > 0.5]
    parts = []
    for k in range(K):
        members = tuple(Assignment(ids[i], menus[i][j].epsilon, menus[i][j].delta, menus[i][j].n)
                        for (i, j, kk) in chosen if kk == k)
        if members:
            parts.append(Partition(len(parts), max(a.n for a in members), members))
    return tuple(parts), res.status == 0


def allocate(menus: dict, *, epsilon_g: float, delta_g: float = 0.0, n_max: int,
             k_min: int = 1, k_max: Optional[int] = None, time_limit: float = 60.0) -> Allocation:
    """Fig. 4 with K = k_min, k_min + 1, … up to ``k_max`` (default: the number of PTKs).

    ``menus`` maps a PTK id to its profiled options (:class:`Option` with n reaching τ).
    Returns a feasible :class:`Allocation` or a REJECT with the reason (never raises for an
    infeasible workload; raises ``InvalidRequestError`` for malformed menus).
    """
    t0 = time.perf_counter()
    ids = sorted(menus)
    if not isinstance(n_max, int) or n_max < 1:
        raise InvalidRequestError(f"N_max must be a positive integer, got {n_max!r}")
    E, D = dec(epsilon_g), dec(delta_g)
    clean = []
    for pid in ids:
        opts = []
        for o in menus[pid]:
            if not (isinstance(o.n, int) and o.n > 0 and o.epsilon > 0 and o.delta >= 0):
                raise InvalidRequestError(f"bad option {o!r} for PTK {pid!r}")
            if dec(o.epsilon) <= E and dec(o.delta) <= D and o.n <= n_max:
                opts.append(o)
        if not opts:
            return Allocation((), epsilon_g, delta_g, n_max, time.perf_counter() - t0, (),
                              f"PTK {pid!r} reaches its target with no option within "
                              f"eps <= {E}, delta <= {D}, n <= N_max = {n_max}")
        clean.append(opts)
    if not ids:
        return Allocation((), epsilon_g, delta_g, n_max, time.perf_counter() - t0, ())
    k_max = len(ids) if k_max is None else min(k_max, len(ids))
    tried = []
    for K in range(k_min, k_max + 1):
        tried.append(K)
        eps_rhs = delta_rhs = 1.0
        for _attempt in range(3):
            parts, optimal = _solve_k(ids, clean, K, epsilon_g, delta_g, n_max, time_limit,
                                      eps_rhs, delta_rhs)
            if parts is None:
                break
            over = [p for p in parts if p.epsilon_sum > E or p.delta_sum > D]
            if not over:
                return Allocation(parts, epsilon_g, delta_g, n_max, time.perf_counter() - t0,
                                  tuple(tried), optimal=bool(optimal))
            # HiGHS accepts rows violated by up to its feasibility tolerance (1e-7): a partition
            # over the exact budget is re-solved with the (scaled) right-hand side tightened
            eps_rhs -= 1e-6
            delta_rhs -= 1e-6
    return Allocation((), epsilon_g, delta_g, n_max, time.perf_counter() - t0, tuple(tried),
                      f"no allocation with K <= {k_max} partitions keeps every partition's sum "
                      f"within eps <= {E} and the total within N_max = {n_max}")
