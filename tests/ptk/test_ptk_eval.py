"""The reproduction library on tiny configs (the full runs are benchmarks/ptk/ scripts)."""
from decimal import Decimal

from sage_tfx.ptk.eval import allocbench, tab3


def test_tab3_tiny_run_profiles_and_allocates_within_budget():
    result = tab3.run(n_max=64, limit=2, menu=(0.5,))
    assert [r.name for r in result["rows"]] == [p["name"] for p in
                                                tab3.workload(tab3.flights_columns())[:2]]
    plan = result["plan"]
    accepted = {a.ptk_id for p in plan.partitions for a in p.members}
    assert accepted | set(result["rejected"]) == {r.name for r in result["rows"]}
    assert all(p.epsilon_sum <= Decimal(1) for p in plan.partitions)
    # every allocated n is a profiled menu entry that reached tau
    for p in plan.partitions:
        for a in p.members:
            row = next(r for r in result["rows"] if r.name == a.ptk_id)
            assert (a.epsilon, a.n) in {(e.epsilon, e.n) for e in row.entries}
    assert "paper: K = 1" in tab3.markdown(result)


def test_allocbench_small():
    (r,) = allocbench.solve_times((13,), k_max=8)
    assert r["feasible"] and 1 <= r["K"] <= 8
    menus = allocbench.synthetic_menus(5, seed=1)
    for opts in menus.values():
        ns = [o.n for o in opts]
        assert ns == sorted(ns, reverse=True)  # more budget, fewer samples
        assert all(n & (n - 1) == 0 for n in ns)  # powers of two, as Fig. 3 doubles n


def test_register_to_notified_latency_run(tmp_path):
    rows = allocbench.register_to_notified(str(tmp_path), ptks=2, window_records=14000)
    assert [r["trained"] for r in rows] == [1, 2]
    assert all(0 < r["notified_s"] < 30 for r in rows)
