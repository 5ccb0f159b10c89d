"""Fig. 4 allocator: optimum against brute force, exact-decimal partition sums, K and REJECT."""
import itertools
from decimal import Decimal

import numpy as np
import pytest

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ptk.allocator import Option, allocate


def brute_force(menus, K, E, n_max):
    """The Fig. 4 optimum by enumeration (tiny instances only)."""
    ids = sorted(menus)
    best = None
    choices = [[(j, k) for j in range(len(menus[i])) for k in range(K)] for i in ids]
    for combo in itertools.product(*choices):
        sums, sizes = [Decimal(0)] * K, [0] * K
        for i, (j, k) in zip(ids, combo):
            o = menus[i][j]
            sums[k] += Decimal(repr(o.epsilon))
            sizes[k] = max(sizes[k], o.n)
        if all(s <= Decimal(repr(E)) for s in sums) and sum(sizes) <= n_max:
            best = sum(sizes) if best is None else min(best, sum(sizes))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    eps = [0.1, 0.2, 0.3, 0.5]
    menus = {f"p{i}": [Option(e, 0.0, int(rng.integers(50, 5000) / e)) for e in
                       sorted(rng.choice(eps, size=2, replace=False))] for i in range(4)}
    plan = allocate(menus, epsilon_g=0.6, n_max=10**9)
    for K in range(1, 5):
        bf = brute_force(menus, K, 0.6, 10**9)
        if bf is not None:
            assert plan.K == K  # the first feasible K, as in the paper
            assert plan.total == bf
            break
    for p in plan.partitions:
        assert p.epsilon_sum <= Decimal("0.6")
    assert sorted(a.ptk_id for p in plan.partitions for a in p.members) == sorted(menus)


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
    assert not plan.feasible and plan.tried_k == (1, 2, 3, 4)
