"""Fig. 4 allocator: optimum against brute force, exact-decimal partition sums, K and REJECT."""
import itertools
from decimal import Decimal

import numpy as np
import pytest

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ptk.allocator import Option, allocate


def brute_force(menus, K, E, n_max, D=0.0):
    """Fig. 4's optimum with exactly the partitions 0..K-1 available (some may stay empty), by
    enumeration (tiny instances only); None if infeasible."""
    ids = sorted(menus)
    best = None
    choices = [[(j, k) for j in range(len(menus[i])) for k in range(K)] for i in ids]
    for combo in itertools.product(*choices):
        sums, dsums, sizes = [Decimal(0)] * K, [Decimal(0)] * K, [0] * K
        for i, (j, k) in zip(ids, combo):
            o = menus[i][j]
            sums[k] += Decimal(repr(o.epsilon))
            dsums[k] += Decimal(repr(o.delta))
            sizes[k] = max(sizes[k], o.n)
        if all(s <= Decimal(repr(E)) for s in sums) and sum(sizes) <= n_max \
                and all(d <= Decimal(repr(D)) for d in dsums):
            best = sum(sizes) if best is None else min(best, sum(sizes))
    return best


def random_menus(rng, ptks=4, with_delta=False):
    eps = [0.1, 0.2, 0.3, 0.5]
    return {f"p{i}": [Option(e, float(rng.choice([0.0, 2e-7, 5e-7])) if with_delta else 0.0,
                             int(rng.integers(50, 5000) / e))
                      for e in sorted(rng.choice(eps, size=int(rng.integers(1, 4)),
                                                 replace=False))]
            for i in range(ptks)}


@pytest.mark.parametrize("seed", range(8))
def test_all_k_optimum_matches_brute_force_over_k(seed):
    rng = np.random.default_rng(seed)
    with_delta = seed % 2 == 1
    menus = random_menus(rng, with_delta=with_delta)
    D = 1e-6 if with_delta else 0.0
    plan = allocate(menus, epsilon_g=0.6, delta_g=D, n_max=10**9)
    per_k = [brute_force(menus, K, 0.6, 10**9, D) for K in range(1, 5)]
    feasible = [t for t in per_k if t is not None]
    assert plan.feasible and plan.optimal and plan.gap == 0.0
    assert plan.total == min(feasible) == plan.lower_bound
    first = feasible[0]  # the paper's plan: the optimum at the first feasible K
    assert plan.total <= first
    for p in plan.partitions:
        assert p.epsilon_sum <= Decimal("0.6") and p.delta_sum <= Decimal(repr(D))
        assert p.size == max(a.n for a in p.members)
    assert sorted(a.ptk_id for p in plan.partitions for a in p.members) == sorted(menus)
    for pid, opts in menus.items():
        _k, a = plan.assignment(pid)
        assert Option(a.epsilon, a.delta, a.n) in opts


def test_more_partitions_than_the_first_feasible_k_can_need_fewer_samples():
    # K = 1 fits only with both PTKs on eps = 0.5 (100,000 samples); two partitions let both
    # take eps = 1 (1,000 + 1,000)
    menus = {p: [Option(0.5, 0.0, 100_000), Option(1.0, 0.0, 1_000)] for p in ("a", "b")}
    assert brute_force(menus, 1, 1.0, 10**9) == 100_000
    plan = allocate(menus, epsilon_g=1.0, n_max=10**9)
    assert plan.K == 2 and plan.total == 2_000 and plan.optimal
    assert plan.first_feasible == (1, 100_000)
    assert allocate(menus, epsilon_g=1.0, n_max=10**9, k_max=1).total == 100_000


def test_time_budget_goes_to_the_solver_and_the_gap_is_proven(monkeypatch):
    from sage_tfx.ptk import allocator
    from sage_tfx.ptk.eval.allocbench import hard_menus
    given = []
    real = allocator.milp

    def spy(*args, options, **kw):
        given.append(options["time_limit"])
        return real(*args, options=options, **kw)

    monkeypatch.setattr(allocator, "milp", spy)
    menus = hard_menus(60, seed=3)
    plan = allocate(menus, epsilon_g=1.0, n_max=10**9, k_max=6, time_limit=0.05)
    assert given and all(0 < t <= 0.05 for t in given)
    assert plan.feasible  # the warm start at least
    assert 0 <= plan.lower_bound <= plan.total
    assert plan.gap == pytest.approx((plan.total - plan.lower_bound) / plan.total)
    assert plan.optimal == (plan.gap == 0.0)
    if not plan.optimal:
        assert "proven gap" in plan.render()
    for p in plan.partitions:
        assert p.epsilon_sum <= Decimal(1)
    given.clear()
    full = allocate(menus, epsilon_g=1.0, n_max=10**9, k_max=6, time_limit=120)
    assert all(0 < t <= 120 for t in given)
    # a bound proven under either budget holds for every plan
    assert max(plan.lower_bound, full.lower_bound) <= min(plan.total, full.total)
    assert full.total <= full.first_feasible[1]
    with pytest.raises(InvalidRequestError):
        allocate(menus, epsilon_g=1.0, n_max=10**9, time_limit=0)


def test_exact_decimal_sums_allow_ten_tenths_and_refuse_more():
    menus = {f"p{i}": [Option(0.1, 0.0, 100 + i)] for i in range(10)}
    plan = allocate(menus, epsilon_g=1.0, n_max=10**6)
    assert plan.K == 1 and plan.partitions[0].epsilon_sum == Decimal("1.0")
    menus["p10"] = [Option(0.1, 0.0, 50)]
    plan = allocate(menus, epsilon_g=1.0, n_max=10**6)
    assert plan.K == 2
    assert all(p.epsilon_sum <= Decimal(1) for p in plan.partitions)
    # float sums that creep over the cap are caught: 3 x 0.35 is 1.05 exactly
    plan = allocate({f"q{i}": [Option(0.35, 0.0, 10)] for i in range(3)}, epsilon_g=1.0,
                    n_max=100)
    assert plan.K == 2 and plan.total == 20


def test_delta_is_a_second_knapsack():
    menus = {f"g{i}": [Option(0.1, 4e-7, 100)] for i in range(3)}
    plan = allocate(menus, epsilon_g=1.0, delta_g=1e-6, n_max=10**6)
    assert plan.K == 2
    assert all(p.delta_sum <= Decimal("1e-6") for p in plan.partitions)


def test_partition_size_is_the_largest_member_need():
    menus = {"small": [Option(0.5, 0.0, 10)], "big": [Option(0.5, 0.0, 1000)]}
    plan = allocate(menus, epsilon_g=1.0, n_max=10**6)
    assert plan.K == 1 and plan.total == 1000


def test_reject_past_n_max_with_reason():
    menus = {"a": [Option(1.0, 0.0, 600)], "b": [Option(1.0, 0.0, 600)]}
    assert allocate(menus, epsilon_g=1.0, n_max=1200).total == 1200
    plan = allocate(menus, epsilon_g=1.0, n_max=1199)
    assert not plan.feasible and "N_max = 1199" in plan.reason
    plan = allocate({"a": [Option(2.0, 0.0, 5)]}, epsilon_g=1.0, n_max=100)
    assert not plan.feasible and "'a'" in plan.reason
    with pytest.raises(InvalidRequestError):
        allocate({"a": [Option(0.1, 0.0, 0)]}, epsilon_g=1.0, n_max=100)
    with pytest.raises(InvalidRequestError):
        allocate({"a": [Option(0.1, 0.0, 5)]}, epsilon_g=1.0, n_max=0)


def test_k_max_bounds_the_search():
    menus = {f"p{i}": [Option(1.0, 0.0, 10)] for i in range(5)}
    assert allocate(menus, epsilon_g=1.0, n_max=10**6).K == 5
    plan = allocate(menus, epsilon_g=1.0, n_max=10**6, k_max=4)
    assert not plan.feasible and "K <= 4" in plan.reason


@pytest.mark.parametrize("seed", range(4))
def test_exact_level_model_alone_finds_the_optimum(seed, monkeypatch):
    """The fallback when the merged-size model's plan does not pack: the exact level model."""
    from sage_tfx.ptk import allocator
    monkeypatch.setattr(allocator, "_aggregate", lambda *a: (None, 1, 0.0))
    rng = np.random.default_rng(100 + seed)
    menus = random_menus(rng, with_delta=seed % 2 == 1)
    D = 1e-6 if seed % 2 else 0.0
    plan = allocate(menus, epsilon_g=0.6, delta_g=D, n_max=10**9)
    best = min(t for t in (brute_force(menus, K, 0.6, 10**9, D) for K in range(1, 5))
               if t is not None)
    assert plan.total == best and plan.optimal and plan.lower_bound == best
    assert all(p.epsilon_sum <= Decimal("0.6") for p in plan.partitions)


def _spy_milp(monkeypatch):
    from sage_tfx.ptk import allocator
    calls = []
    real = allocator.milp

    def spy(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(allocator, "milp", spy)
    return calls


def test_a_small_workload_is_proven_optimal_by_the_merged_model(monkeypatch):
    from sage_tfx.ptk.eval.allocbench import synthetic_menus
    calls = _spy_milp(monkeypatch)
    plan = allocate(synthetic_menus(13, seed=0), epsilon_g=1.0, n_max=10**9, k_max=8)
    # the proof: the merged model's dual bound equals the plan's total, one solve, no exact model
    assert plan.optimal and plan.gap == 0.0 and plan.lower_bound == plan.total
    assert plan.proof == "merged model" and len(calls) == 1


@pytest.mark.parametrize("seed", range(6))
def test_previous_plan_and_floor_keep_the_all_k_optimum(seed, monkeypatch):
    rng = np.random.default_rng(100 + seed)
    menus = random_menus(rng, ptks=4)
    old = {k: v for k, v in menus.items() if k != "p3"}
    prev = allocate(old, epsilon_g=0.6, n_max=10**9)
    assert prev.optimal and prev.total == min(
        t for t in (brute_force(old, K, 0.6, 10**9) for K in range(1, 4)) if t is not None)
    calls = _spy_milp(monkeypatch)
    plan = allocate(menus, epsilon_g=0.6, n_max=10**9, previous=prev, floor=prev.lower_bound)
    best = min(t for t in (brute_force(menus, K, 0.6, 10**9) for K in range(1, 5))
               if t is not None)
    assert plan.optimal and plan.total == best == plan.lower_bound
    assert (plan.proof == "floor") == (not calls)  # no solve exactly when the floor proves it
    for p in plan.partitions:
        assert p.epsilon_sum <= Decimal("0.6")
    # a dropped PTK: the previous plan is only an incumbent, the optimum is still found
    fewer = {k: v for k, v in old.items() if k != "p0"}
    plan = allocate(fewer, epsilon_g=0.6, n_max=10**9, previous=prev)
    assert plan.optimal and plan.total == min(
        t for t in (brute_force(fewer, K, 0.6, 10**9) for K in range(1, 4)) if t is not None)


def test_a_ptk_that_fits_the_unused_budget_is_proven_optimal_without_a_solve(monkeypatch):
    menus = {"a": [Option(0.3, 0.0, 100)], "b": [Option(0.3, 0.0, 50)]}
    prev = allocate(menus, epsilon_g=1.0, n_max=10**6)
    assert prev.optimal and prev.total == 100 and prev.K == 1
    calls = _spy_milp(monkeypatch)
    grown = dict(menus, c=[Option(0.2, 0.0, 80)])
    plan = allocate(grown, epsilon_g=1.0, n_max=10**6, previous=prev, floor=prev.lower_bound)
    assert not calls and plan.optimal and plan.proof == "floor" and plan.total == 100
    assert plan.to_dict()["proof"] == "floor"
    # one that does not fit: the solver runs and finds the optimum ({d, a} 200 + {b} 50)
    grown = dict(menus, d=[Option(0.6, 0.0, 200)])
    plan = allocate(grown, epsilon_g=1.0, n_max=10**6, previous=prev, floor=prev.lower_bound)
    assert calls and plan.optimal and plan.total == 250 == brute_force(grown, 3, 1.0, 10**6)
    with pytest.raises(InvalidRequestError):
        allocate(grown, epsilon_g=1.0, n_max=10**6, floor=-1)
