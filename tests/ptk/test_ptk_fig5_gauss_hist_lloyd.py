"""Fig. 5 evaluations of kernels 4-6 (Chicago taxi, MovieLens) on tiny configs; the full runs are
benchmarks/ptk/fig5_taxi.py and benchmarks/ptk/fig5_movielens_lloyd.py."""
import math

import pytest

from sage_tfx.ptk.abstraction import batches_of
from sage_tfx.ptk.eval import fig5, fig5_movielens, fig5_taxi

from test_ptk_fig5_scripts import script
from test_ptk_kernels import Recorder


def test_bundle_splits_epsilon_evenly_and_concatenates_features():
    split = fig5_taxi.load_taxi()
    hs, _ = fig5_taxi.ptk_kernels()["histstats"]
    rec = Recorder()
    state = hs.train_dp(batches_of(split.source), 0.3, None, None, noise=rec)
    # three statistics at eps/3 = 0.1 each: counts 2/0.1, speed sums (60 - 0)/0.1
    assert rec.calls == [("discrete_laplace", pytest.approx(20.0)),
                         ("laplace", pytest.approx(600.0))] * 3
    feats = hs.featurize(split.target_test, state)
    assert set(feats) == {f"{p}_{s}" for p in ("pu_speed", "do_speed", "hour_speed")
                          for s in ("count", "mean")}
    km, _ = fig5_taxi.ptk_kernels()["lloyd"]
    (np_state,) = km.erm(batches_of(split.source))  # DP Lloyd's non-private twin, not an ERM
    assert len(np_state["centroids"]) == 6
    # the ablation's centroids are the public start, whatever the data
    ab, _ = fig5_taxi.ptk_kernels()["lloyd_no_data"]
    assert ab.train_dp(batches_of(split.source), 1.0, None, None) == ab.erm([]) != [np_state]


def _rows_ok(rows, kernels, fractions, epsilons=(0.1, 1.0)):
    assert all(set(r) == set(fig5.FIELDS) for r in rows)
    assert {r["kernel"] for r in rows} == set(kernels)
    assert {r["variant"] for r in rows} == set(fig5.VARIANTS)
    assert {r["eps"] for r in rows if r["variant"] == "dp_ptk"} == set(epsilons)
    assert {r["fraction"] for r in rows} == set(fractions)
    assert all(math.isfinite(r["value"]) for r in rows)


def test_taxi_tiny_run(tmp_path):
    rows = fig5_taxi.run(fractions=(0.5, 1.0), seeds=(0,), kernels=("lloyd",),
                         model=lambda s: fig5_taxi.model_factory(s, 2), progress=lambda m: None)
    _rows_ok(rows, ("lloyd",), (0.5, 1.0))
    fig5_taxi.write_outputs(rows, str(tmp_path), "t", "taxi", progress=lambda m: None)
    assert (tmp_path / "t.png").stat().st_size > 1000
    gains = fig5_taxi.gains(rows)
    assert len(gains) == 2 * 3 and all(math.isfinite(g["gain_pct"]) for g in gains)


def test_movielens_tiny_run_and_the_user_statistic_transfers():
    rows = fig5_movielens.run(fractions=(1.0,), seeds=(0,), progress=lambda m: None)
    _rows_ok(rows, ("lloyd", "lloyd_no_data", "histstats"), (1.0,))
    g = {(x["kernel"], x["variant"], x["eps"] if x["variant"] == "dp_ptk" else None): x["gain_pct"]
         for x in fig5_taxi.gains(rows)}
    # a user's mean rating on action-like movies carries over to the other genres
    assert g[("histstats", "nonprivate_ptk", None)] > 2.0
    assert g[("histstats", "dp_ptk", 1.0)] > 1.0


def test_benchmark_scripts_tiny(tmp_path):
    assert script("fig5_movielens_lloyd").main(
        ["--seeds", "1", "--fractions", "0.5", "--kernels", "lloyd", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "fig5_movielens.csv").exists() and (tmp_path / "fig5_movielens.png").exists()
    assert script("fig5_taxi").main(
        ["--seeds", "1", "--fractions", "1.0", "--kernels", "covariance", "--max-iter", "3",
         "--out", str(tmp_path)]) == 0
    assert len((tmp_path / "fig5_taxi.csv").read_text().splitlines()) == 1 + 4
