"""The double-resource allocator (PTK paper §5.3, Fig. 4), solved with ``scipy.optimize.milp``.

Variables x_ijk = 1 iff PTK i takes menu option j in partition k, and N_k ≥ 0 (the size of
partition k). Minimise Σ_k N_k subject to N_k ≥ Σ_j n_ij x_ijk for all i, k (the linearised
``max_i``), Σ_ij ε_ij x_ijk ≤ ℰ and Σ_ij δ_ij x_ijk ≤ Δ for every k (privacy: sequential
composition inside a partition, parallel across disjoint partitions), Σ_jk x_ijk = 1 for every i
(assignment) and Σ_k N_k ≤ N_max, with at most ``k_max`` partitions of which any may stay
empty (N_k = 0), so one model minimises the total over every K ≤ k_max.

The paper runs K = 1, 2, … until the program is feasible and stops there. That first feasible K
is not the K of least total samples (a further partition lets data-hungry PTKs take a larger ε
and need far fewer samples), so :func:`allocate` uses it only as the warm start: its plan is
the incumbent and its total the objective cutoff of the all-K model. One time budget covers
both; when it runs out the best plan found is returned with its proven gap to HiGHS's dual
bound. An infeasible workload is a REJECT with the reason.

After every solve the partition sums are re-checked on exact decimals of the menu values (the
values the ledger will be charged); a float solution that over-spends by rounding is re-solved
with the right-hand side tightened, never accepted.
"""
from __future__ import annotations

import dataclasses
import math
import time
from decimal import Decimal
from typing import Optional

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from sage_tfx.errors import InvalidRequestError


from sage_tfx.ptk.allocation import (  # noqa: F401 - re-exported: the plan types
    Allocation, Assignment, Option, Partition, dec)


@dataclasses.dataclass
class _Solve:
    parts: Optional[tuple]  # None: no feasible solution found
    status: int             # scipy.optimize.milp: 0 optimal, 1 limit reached, 2 infeasible
    bound: float            # HiGHS's proven lower bound on the objective (dual bound)


class _Rows:
    """Sparse constraint rows lower <= Σ a_v x_v <= upper, built row by row."""

    def __init__(self):
        self.data, self.ri, self.ci, self.lo, self.hi = [], [], [], [], []

    def add(self, entries, lower, upper):
        for v, a in entries:
            self.ri.append(len(self.lo))
            self.ci.append(v)
            self.data.append(a)
        self.lo.append(lower)
        self.hi.append(upper)

    def constraint(self, columns: int) -> LinearConstraint:
        # int32 indices: scipy 1.12's HiGHS wrapper refuses int64 ones
        a = sparse.csr_array((self.data, (np.asarray(self.ri, np.int32),
                                          np.asarray(self.ci, np.int32))),
                             shape=(len(self.lo), columns))
        return LinearConstraint(a, self.lo, self.hi)


def _pareto(opts: list) -> list:
    """The options no other one beats in both ε and δ (the best a PTK can take in a partition
    of a given size, among its options that fit it)."""
    return [o for o in opts if not any((p.epsilon, p.delta) != (o.epsilon, o.delta)
                                       and p.epsilon <= o.epsilon and p.delta <= o.delta
                                       for p in opts)]


def _model(menus, K, eps_g, delta_g, n_max, eps_rhs, delta_rhs, cutoff):
    """Fig. 4 with at most K partitions as sparse milp arrays, in a level form whose LP
    relaxation is much tighter than the linearised max: y_kv = 1 iff partition k has size v
    (v among the menus' distinct n; Σ_v y_kv ≤ 1, none: k is empty) and z_ijkv = 1 iff PTK i
    takes option j (n_ij ≤ v) in it. Constraints: z_ijkv ≤ y_kv, Σ_ij ε_ij z_ijkv ≤ ℰ y_kv and
    Σ_ij δ_ij z_ijkv ≤ Δ y_kv (the budget per partition), Σ_jkv z_ijkv = 1 (each PTK in one
    partition), Σ_kv v y_kv ≤ N_max; objective Σ_kv v y_kv = Σ_k N_k. A Fig. 4 plan is one of
    these with v = N_k = the largest member n, and a solution here is a Fig. 4 plan with
    N_k ≤ v, so both have the same optimum."""
    levels = sorted({o.n for menu in menus for o in menu})
    use_delta = delta_g > 0 and any(o.delta for menu in menus for o in menu)
    cols = []  # (i, j, k, level index)
    for k in range(K):
        for li, v in enumerate(levels):
            for i, menu in enumerate(menus):
                fit = _pareto([o for o in menu if o.n <= v])
                cols += [(i, menu.index(o), k, li) for o in fit]
    nz = len(cols)
    ny = K * len(levels)
    nv = nz + ny
    yv = lambda k, li: nz + k * len(levels) + li  # noqa: E731
    rows = _Rows()
    add = rows.add
    groups: dict = {}
    by_ptk: dict = {}
    for v, (i, j, k, li) in enumerate(cols):
        groups.setdefault((k, li), []).append(v)
        by_ptk.setdefault(i, []).append(v)
        add([(v, 1.0), (yv(k, li), -1.0)], -np.inf, 0.0)  # z_ijkv <= y_kv
    for (k, li), vs in groups.items():  # budget per partition, rows scaled to O(1)
        add([(v, menus[cols[v][0]][cols[v][1]].epsilon / eps_g) for v in vs]
            + [(yv(k, li), -eps_rhs)], -np.inf, 0.0)
        if use_delta:
            add([(v, menus[cols[v][0]][cols[v][1]].delta / delta_g) for v in vs
                 if menus[cols[v][0]][cols[v][1]].delta] + [(yv(k, li), -delta_rhs)],
                -np.inf, 0.0)
    for k in range(K):
        add([(yv(k, li), 1.0) for li in range(len(levels))], -np.inf, 1.0)
        if k + 1 < K:  # symmetry breaking: partitions by decreasing size, empty ones last
            add([(yv(k, li), -float(v)) for li, v in enumerate(levels)]
                + [(yv(k + 1, li), float(v)) for li, v in enumerate(levels)], -np.inf, 0.0)
    for i in range(len(menus)):  # each PTK in exactly one partition with one option
        add([(v, 1.0) for v in by_ptk[i]], 1.0, 1.0)
    cost = np.array([float(v) for _k in range(K) for v in levels])
    add([(nz + t, cost[t]) for t in range(ny)], -np.inf, float(min(n_max, cutoff)))
    c = np.r_[np.zeros(nz), cost]
    bounds = Bounds(np.zeros(nv), np.ones(nv))
    return cols, c, rows.constraint(nv), np.ones(nv), bounds


def _solve(ids, menus, K, E, D, n_max, time_limit, cutoff=math.inf) -> _Solve:
    """One milp solve with at most K partitions and the objective at most ``cutoff``; a float
    solution over the exact-decimal budget is re-solved with the right-hand side tightened
    (HiGHS accepts rows violated by up to its feasibility tolerance, 1e-7), never accepted."""
    deadline = time.perf_counter() + time_limit
    eps_rhs = delta_rhs = 1.0
    out = _Solve(None, 1, 0.0)
    for _attempt in range(3):
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        cols, c, cons, integrality, bounds = _model(menus, K, float(E), float(D), n_max,
                                                    eps_rhs, delta_rhs, cutoff)
        res = milp(c, constraints=cons, integrality=integrality, bounds=bounds,
                   options={"time_limit": max(left, 0.01), "presolve": True, "mip_rel_gap": 0.0})
        bound = getattr(res, "mip_dual_bound", None)
        bound = 0.0 if bound is None or not math.isfinite(bound) else float(bound)
        if res.status == 2:
            return _Solve(None, 2, math.inf)
        if res.x is None:
            return _Solve(None, res.status, bound)
        chosen = [cols[v][:3] for v in range(len(cols)) if res.x[v] > 0.5]
        parts = []
        for k in range(K):
            members = tuple(Assignment(ids[i], menus[i][j].epsilon, menus[i][j].delta,
                                       menus[i][j].n) for (i, j, kk) in chosen if kk == k)
            if members:
                parts.append(Partition(len(parts), max(a.n for a in members), members))
        if all(p.epsilon_sum <= E and p.delta_sum <= D for p in parts):
            return _Solve(tuple(parts), res.status, bound)
        out = _Solve(None, 1, bound)
        eps_rhs -= 1e-6
        delta_rhs -= 1e-6
    return out


def _undominated(opts: list) -> list:
    """Drops an option another one beats in ε, δ and n at once (never in an optimal plan's
    place: swapping it for the better one keeps every constraint and the objective)."""
    keep = []
    for o in sorted(set(opts), key=lambda o: (dec(o.epsilon), dec(o.delta), o.n)):
        if not any(dec(p.epsilon) <= dec(o.epsilon) and dec(p.delta) <= dec(o.delta)
                   and p.n <= o.n for p in keep):
            keep.append(o)
    return keep


def _pack(ids, by_size: dict, E, D, bins_max):
    """Packs ``by_size`` ({size: [(PTK index, Option)]}) into as few partitions as it can,
    checking exact decimals: the largest size first, each size's PTKs first-fit decreasing into
    any partition opened so far (a partition of a larger size takes a PTK's option for a
    smaller one unchanged) before a new one is opened. Returns the partitions' member lists,
    or None past ``bins_max``."""
    bins: list = []
    for size in sorted(by_size, reverse=True):
        for i, o in sorted(by_size[size], key=lambda t: (dec(t[1].epsilon), dec(t[1].delta)),
                           reverse=True):
            a = Assignment(ids[i], o.epsilon, o.delta, o.n)
            for b in bins:
                if b[0] + dec(o.epsilon) <= E and b[1] + dec(o.delta) <= D:
                    b[0] += dec(o.epsilon)
                    b[1] += dec(o.delta)
                    b[2].append(a)
                    break
            else:
                if len(bins) == bins_max:
                    return None
                bins.append([dec(o.epsilon), dec(o.delta), [a]])
    return [b[2] for b in bins]


def _plan(groups, k_max, n_max):
    parts = [m for g in groups for m in g]
    parts.sort(key=lambda m: -max(a.n for a in m))
    out = tuple(Partition(k, max(a.n for a in m), tuple(m)) for k, m in enumerate(parts))
    if len(out) > k_max or sum(p.size for p in out) > n_max:
        return None
    return out


def _shrink(members: list, menus: dict, E: Decimal, D: Decimal) -> list:
    """Spends a partition's unused budget where it lowers N_k: while the member with the
    largest n has an option with a smaller n that still fits the budget, it takes it."""
    members = list(members)
    while True:
        eps = sum((dec(a.epsilon) for a in members), Decimal(0))
        dl = sum((dec(a.delta) for a in members), Decimal(0))
        top = max(range(len(members)), key=lambda t: members[t].n)
        a = members[top]
        better = [o for o in menus[a.ptk_id] if o.n < a.n
                  and eps - dec(a.epsilon) + dec(o.epsilon) <= E
                  and dl - dec(a.delta) + dec(o.delta) <= D]
        if not better:
            return members
        o = min(better, key=lambda o: (o.n, dec(o.epsilon)))
        members[top] = Assignment(a.ptk_id, o.epsilon, o.delta, o.n)


def _warm_start(ids, menus, E, D, n_max, k_max):
    """The paper's K search done greedily: every PTK on its smallest-ε option, packed
    first-fit decreasing (the fewest partitions this finds), then each partition's unused
    budget spent on its largest member (:func:`_shrink`). A feasible plan whenever the packing
    fits k_max and N_max."""
    items = [(i, min(m, key=lambda o: (dec(o.epsilon), dec(o.delta), o.n)))
             for i, m in enumerate(menus)]
    groups = _pack(ids, {0: items}, E, D, k_max)
    if groups is None:
        return None
    by_id = dict(zip(ids, menus))
    return _plan([[_shrink(g, by_id, E, D) for g in groups]], k_max, n_max)


def _least(a: Assignment, menu: list, size: int) -> Assignment:
    """``a``'s option of least ε (then δ) among those with n ≤ ``size`` and no larger ε or δ."""
    fits = [o for o in menu if o.n <= size and dec(o.epsilon) <= dec(a.epsilon)
            and dec(o.delta) <= dec(a.delta)]
    o = min(fits, key=lambda o: (dec(o.epsilon), dec(o.delta), o.n), default=None)
    return a if o is None else Assignment(a.ptk_id, o.epsilon, o.delta, o.n)


def _extend(previous: "Allocation", ids, menus, E, D, n_max, k_max):
    """An incumbent from a previous plan: its members still registered keep their partition
    (when the menu still has their option; each moves to its least-ε option that fits the
    partition's size), every other PTK is inserted where it raises the total least
    (a partition with room for one of its options, or a new one), then each partition's unused
    budget is spent (:func:`_shrink`). None when a PTK fits nowhere."""
    by_id = dict(zip(ids, menus))
    groups, placed = [], set()
    for p in previous.partitions:
        keep = [a for a in p.members if a.ptk_id in by_id and a.ptk_id not in placed
                and Option(a.epsilon, a.delta, a.n) in by_id[a.ptk_id]]
        placed.update(a.ptk_id for a in keep)
        if keep:  # frees budget without growing the partition: each member on its least ε
            size = max(a.n for a in keep)  # (and δ) among its options that fit the size
            groups.append([_least(a, by_id[a.ptk_id], size) for a in keep])
    todo = [i for i in ids if i not in placed]
    for pid in sorted(todo, key=lambda i: -min(o.n for o in by_id[i])):
        best = None  # (added samples, eps, group index or None, option)
        for g, members in enumerate(groups + ([[]] if len(groups) < k_max else [])):
            eps, dl, size = _sums(members)
            for o in by_id[pid]:
                if eps + dec(o.epsilon) <= E and dl + dec(o.delta) <= D:
                    key = (max(o.n - size, 0), dec(o.epsilon), g)
                    if best is None or key < best[0]:
                        best = (key, o)
        if best is not None and best[0][0] > 0 and _insert_by_moving(groups, pid, by_id, E, D):
            continue  # in at no extra samples, one member moved to another partition
        if best is None:
            return None
        (_, _, g), o = best
        if g == len(groups):
            groups.append([])
        groups[g].append(Assignment(pid, o.epsilon, o.delta, o.n))
    return _plan([[_shrink(g, by_id, E, D) for g in groups]], k_max, n_max)


def _sums(members) -> tuple:
    """A partition's exact (Σ ε, Σ δ) and size (its largest n; 0 when empty)."""
    return (sum((dec(a.epsilon) for a in members), Decimal(0)),
            sum((dec(a.delta) for a in members), Decimal(0)),
            max((a.n for a in members), default=0))


def _insert_by_moving(groups: list, pid: str, by_id: dict, E: Decimal, D: Decimal) -> bool:
    """Puts ``pid`` into a partition on an option no larger than its size after moving one
    member to another partition where one of its options fits without growing it; changes
    ``groups`` and returns True when such a move exists (no partition grows)."""
    for g, members in enumerate(groups):
        eg, dg, size = _sums(members)
        for o in sorted(by_id[pid], key=lambda o: dec(o.epsilon)):
            if o.n > size:
                continue
            for t, m in enumerate(members):
                if eg - dec(m.epsilon) + dec(o.epsilon) > E or \
                        dg - dec(m.delta) + dec(o.delta) > D:
                    continue
                for h, other in enumerate(groups):
                    if h == g:
                        continue
                    eh, dh, size_h = _sums(other)
                    fit = [q for q in by_id[m.ptk_id] if q.n <= size_h
                           and eh + dec(q.epsilon) <= E and dh + dec(q.delta) <= D]
                    if fit:
                        q = min(fit, key=lambda q: (dec(q.epsilon), dec(q.delta)))
                        other.append(Assignment(m.ptk_id, q.epsilon, q.delta, q.n))
                        members[t] = Assignment(pid, o.epsilon, o.delta, o.n)
                        return True
    return False


def _aggregate(ids, menus, k_max, E, D, n_max, time_limit, cutoff, floor=0):
    """The level model with partitions of equal size merged: Y_v ∈ {0 … k_max} partitions of
    size v, z_ijv = 1 iff PTK i takes option j (n_ij ≤ v) in one of them; Σ_ij ε_ij z_ijv ≤
    ℰ Y_v (and δ), Σ_jv z_ijv = 1, Σ_v Y_v ≤ k_max, Σ_v v Y_v ≤ N_max; minimise Σ_v v Y_v. It
    only drops the packing of a size's PTKs into its Y_v partitions, so its optimum (HiGHS's
    dual bound) is a lower bound on Fig. 4's; its solution packed first-fit decreasing is a
    Fig. 4 plan, optimal when the packing fits. Returns (plan or None, status, bound)."""
    levels = sorted({o.n for m in menus for o in m})
    use_delta = D > 0 and any(o.delta for m in menus for o in m)
    cols = [(i, menu.index(o), li) for li, v in enumerate(levels)
            for i, menu in enumerate(menus) for o in _pareto([o for o in menu if o.n <= v])]
    nz, ny = len(cols), len(levels)
    rows = _Rows()
    add = rows.add
    per_level: dict = {}
    per_ptk: dict = {}
    for v, (i, j, li) in enumerate(cols):
        per_level.setdefault(li, []).append(v)
        per_ptk.setdefault(i, []).append(v)
    for li, vs in per_level.items():
        add([(v, menus[cols[v][0]][cols[v][1]].epsilon / float(E)) for v in vs]
            + [(nz + li, -1.0)], -np.inf, 0.0)
        if use_delta:
            add([(v, menus[cols[v][0]][cols[v][1]].delta / float(D)) for v in vs]
                + [(nz + li, -1.0)], -np.inf, 0.0)
        for i in {cols[v][0] for v in vs}:  # a PTK of size v needs a partition of size v
            add([(v, 1.0) for v in vs if cols[v][0] == i] + [(nz + li, -1.0)], -np.inf, 0.0)
    for i in range(len(menus)):
        add([(v, 1.0) for v in per_ptk[i]], 1.0, 1.0)
    add([(nz + li, 1.0) for li in range(ny)], -np.inf, float(k_max))
    cost = np.array(levels, dtype=float)
    # floor <= Fig. 4's optimum, whose plan lies in this model: the bound stays valid, and a
    # solution at the floor ends the search at once
    add([(nz + li, cost[li]) for li in range(ny)], float(floor), float(min(n_max, cutoff)))
    res = milp(np.r_[np.zeros(nz), cost], constraints=rows.constraint(nz + ny),
               integrality=np.ones(nz + ny),
               bounds=Bounds(np.zeros(nz + ny), np.r_[np.ones(nz), np.full(ny, float(k_max))]),
               options={"time_limit": max(time_limit, 0.01), "presolve": True,
                        "mip_rel_gap": 0.0})
    bound = getattr(res, "mip_dual_bound", None)
    bound = 0.0 if bound is None or not math.isfinite(bound) else float(bound)
    if res.status == 2:
        return None, 2, math.inf
    if res.x is None:
        return None, res.status, bound
    if res.status == 0:
        bound = max(bound, float(res.fun))
    by_size: dict = {}
    for v, (i, j, li) in enumerate(cols):
        if res.x[v] > 0.5:
            by_size.setdefault(levels[li], []).append((i, menus[i][j]))
    groups = _pack(ids, by_size, E, D, k_max)
    return (None if groups is None else _plan([groups], k_max, n_max)), res.status, bound


def allocate(menus: dict, *, epsilon_g: float, delta_g: float = 0.0, n_max: int,
             k_max: Optional[int] = None, time_limit: float = 25.0,
             previous: Optional[Allocation] = None, floor: int = 0) -> Allocation:
    """Fig. 4 minimised over every K ≤ ``k_max`` (default: the number of PTKs).

    ``menus`` maps a PTK id to its profiled options (:class:`Option` with n reaching τ).
    ``previous`` (optional) is an earlier plan: extended to these menus (:func:`_extend`) it is
    a second incumbent. ``floor`` is a lower bound on this workload's optimum the caller has
    proven — e.g. the previous plan's ``lower_bound`` when PTKs were only added and nothing
    else changed (a plan for more PTKs, its new members dropped, is a plan for fewer with no
    larger total, so adding PTKs never lowers the optimum). When the best incumbent reaches
    ``floor`` it is optimal and no model is solved (``proof == "floor"``): registering a PTK
    that fits the current plan's unused budget costs no solve.

    Three steps under one time budget of ``time_limit`` seconds (plus model building):

    1. warm start: the paper's search for the first feasible K, done greedily (every PTK on its
       smallest ε, packed first-fit decreasing), and ``previous`` extended — the better one is
       the incumbent and the objective cutoff; optimal at once when it reaches ``floor``;
    2. :func:`_aggregate`: the all-K model with the partitions of one size merged — its dual
       bound is a lower bound on the optimum, its solution packed is usually the optimum;
    3. if that packing does not fit: the exact all-K model (:func:`_model`, empty partitions
       allowed) with the rest of the budget, below the best total found.

    The plan returned is the best found; ``gap`` is its proven relative distance to the best
    lower bound (0.0: optimal). Returns a feasible :class:`Allocation` or a REJECT with the
    reason (never raises for an infeasible workload; raises ``InvalidRequestError`` for
    malformed menus or a non-positive time limit).
    """
    t0 = time.perf_counter()
    ids = sorted(menus)
    if not isinstance(n_max, int) or n_max < 1:
        raise InvalidRequestError(f"N_max must be a positive integer, got {n_max!r}")
    if not (isinstance(time_limit, (int, float)) and math.isfinite(time_limit)
            and time_limit > 0):
        raise InvalidRequestError(f"time_limit must be a positive number, got {time_limit!r}")
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
        clean.append(_undominated(opts))
    if not ids:
        return Allocation((), epsilon_g, delta_g, n_max, time.perf_counter() - t0, ())
    k_cfg = k_max
    k_max = len(ids) if k_max is None else min(k_max, len(ids))
    deadline = t0 + time_limit
    left = lambda: max(deadline - time.perf_counter(), 0.01)  # noqa: E731
    if not (isinstance(floor, int) and floor >= 0):
        raise InvalidRequestError(f"floor must be a non-negative integer, got {floor!r}")
    first = best = _warm_start(ids, clean, E, D, n_max, k_max)
    total = lambda parts: sum(p.size for p in parts)  # noqa: E731
    first_k = (len(first), total(first)) if first else None
    ext = _extend(previous, ids, clean, E, D, n_max, k_max) if previous is not None else None
    if ext is not None and (best is None or total(ext) < total(best)):
        best = ext
    done = lambda parts, bound, proof: Allocation(  # noqa: E731
        parts, epsilon_g, delta_g, n_max, time.perf_counter() - t0, tuple(range(1, k_max + 1)),
        optimal=total(parts) <= bound, gap=(total(parts) - min(bound, total(parts)))
        / total(parts), lower_bound=min(bound, total(parts)), first_feasible=first_k,
        k_max=k_cfg, proof=proof if total(parts) <= bound else "")
    if best is not None and total(best) <= floor:
        return done(best, floor, "floor")
    # the merged model gets the warm start's cutoff, as without ``previous``: a tighter one
    # made HiGHS no faster here, and sometimes slower
    cutoff = total(first) if first else (total(best) if best else math.inf)
    plan, status, bound = _aggregate(ids, clean, k_max, E, D, n_max, left(), cutoff, floor)
    proof = "merged model"
    if plan is not None and (best is None or total(plan) <= total(best)):
        best = plan
    infeasible = status == 2 and best is None  # the relaxation has no solution
    if status == 2 and best is not None:
        bound = cutoff  # nothing below the incumbent: it is optimal
    if not infeasible and (best is None or total(best) > math.ceil(bound - 1e-6)) \
            and deadline - time.perf_counter() > 0:
        exact = _solve(ids, clean, k_max, E, D, n_max, left(),
                       total(best) - 1 if best else math.inf)
        if exact.parts is not None:
            best = exact.parts
        if exact.status == 2:
            infeasible = best is None
            bound = total(best) if best else math.inf
            proof = "exact model"
        elif exact.status == 0 and exact.parts is not None:
            bound = total(exact.parts)
            proof = "exact model"
    secs = time.perf_counter() - t0
    if best is None:
        why = (f"no allocation with K <= {k_max} partitions keeps every partition's sum "
               f"within eps <= {E} and the total within N_max = {n_max}") if infeasible else (
               f"no allocation found within the time limit of {time_limit:g} s "
               f"(K <= {k_max}, N_max = {n_max})")
        return Allocation((), epsilon_g, delta_g, n_max, secs, (), why, k_max=k_cfg)
    if max(math.ceil(bound - 1e-6), floor) > math.ceil(bound - 1e-6):
        proof = "floor"
    return done(best, max(math.ceil(bound - 1e-6), floor), proof)
