"""The reproduction library on tiny configurations (the full runs are benchmarks/bagging/)."""
import numpy as np

from sage_tfx.bagging import PersonalisedMomentsAccountant, chunk_assignment, train_teachers
from sage_tfx.bagging.eval.grid import GridConfig, paper_answer_count, run_grid
from sage_tfx.bagging.eval.memory import vote_memory_benchmark
from sage_tfx.bagging.eval.report import aggregate, table1_markdown, table2_markdown


def _synthetic(rows=900, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(rows, 3))
    y = (X[:, 0] + rng.normal(size=rows) > 0).astype(np.int64)
    return X, y, np.arange(rows) // 3          # three rows per person


def test_trajectory_gives_the_same_count_as_the_sequential_loop():
    X, y, person = _synthetic()
    ch = chunk_assignment(np.unique(person).tolist(), k=4, n=6, salt=b"t")
    ens = train_teachers(X, y, ch[person], n=6)
    Xq = np.random.default_rng(1).normal(size=(400, 3))
    pred = ens.predict(Xq)
    run = PersonalisedMomentsAccountant(ch, n=6, lam=0.3, delta=1e-5)
    running = run.trajectory(pred, 2)
    for eps in (0.5, 2.0, 4.0):
        seq = PersonalisedMomentsAccountant(ch, n=6, lam=0.3, delta=1e-5)
        answered = sum(seq.answer(pred[s:s + 37], eps, 2, reproduce_alg1=True)
                       for s in range(0, 400, 37) if seq.epsilon_hat() < eps)
        assert paper_answer_count(running, epsilon=eps, delta=1e-5, lam=0.3,
                                  max_order=32) == answered


def test_tiny_grid_rows_and_tables():
    cfg = GridConfig(epsilons=(2.0,), ns=(10,), ks=(1, 3), seeds=(0,),
                     votes=("laplace", "gumbel"))
    rows = run_grid(cfg, data=_synthetic())
    methods = {r["method"] for r in rows}
    assert methods == {"NPB", "SAA", "SAA-fixed", "DPBag", "DPBag-", "DPBag-fixed"}
    for r in rows:
        assert 0 <= r["accuracy"] <= 1 and 0 <= r["auroc"] <= 1
    fixed = {
        r["k"]: r["labels"] for r in rows if r["method"].endswith("-fixed") and r[
            "accountant"] == "rdp"}
    assert fixed[1] == fixed[3]             # fixed_queries: p does not depend on the data or on k
    saa = [r for r in rows if r["method"] == "SAA"]
    dpbag_minus = [r for r in rows if r["method"] == "DPBag-"]
    assert sorted(r["labels"] for r in saa) == sorted(r["labels"] for r in dpbag_minus)
    votes = {(r["accountant"], r["k"], r["delta"]): r["labels"] for r in rows
             if r.get("accountant", "").endswith("-best")}
    assert {a for a, _, _ in votes} == {"laplace-best", "gumbel-best"}
    assert {d for _, _, d in votes} == {1e-5, 1e-3}
    for k in (1, 3):   # the vote rows at both δ: Gumbel (bounded range) buys more than Laplace
        assert votes[("gumbel-best", k, 1e-5)] > votes[("laplace-best", k, 1e-5)]
        assert votes[("gumbel-best", k, 1e-3)] > votes[("gumbel-best", k, 1e-5)]
    agg = aggregate(rows)
    assert "DPBag fixed Gumbel best δ=0.001" in table2_markdown(agg, [2.0])
    assert "DPBag paper acct" in table2_markdown(agg, [2.0])
    assert "NPB" in table1_markdown(agg, [2.0])


def test_vote_memory_benchmark_tiny():
    res = vote_memory_benchmark(private=600, public=200, n=10, k=5, d=4, log=lambda s: None)
    assert res["teachers"] == 50 and res["counts_dtype"] == "int32"
    assert res["votes_peak_mb"] < 50
