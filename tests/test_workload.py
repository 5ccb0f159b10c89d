"""The multi-pipeline workload simulator (Sage §5.4, Fig. 8) on a real ledger, in seconds."""
import math
import os
import shutil
import tempfile
from decimal import Decimal

import numpy as np
import pytest

from sage_tfx import workload as wl
from sage_tfx.adaptive import AdaptiveSearch, Allocator, SearchConfig, conserve_waste_bound
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import BlockSpec, open_ledger
from sage_tfx.validation import Outcome

TINY = wl.WorkloadConfig(arrival_rate=0.6, steps=40, seed=3, warmup=5, cooldown=5)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every strategy on the same tiny workload, each on its own stream of one ledger."""
    # /dev/shm when available: the ledger fsyncs every grant, which is slow on some disks.
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    tmp = tempfile.mkdtemp(prefix="test-workload-", dir=shm) if shm else str(
        tmp_path_factory.mktemp("workload"))
    url = f"sqlite:///{tmp}/ledger.db"
    results = {s: wl.simulate(s, TINY, ledger_url=url) for s in wl.STRATEGIES}
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
    assert means[wl.QUERY] > means[wl.BLOCK_CONSERVE_RDP]
    released = {s: r.released_fraction() for s, r in results.items()}
    assert released[wl.QUERY] < released[wl.BLOCK_CONSERVE_RDP]


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
    from sage_tfx.mechanisms import gaussian_delta
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
        wl.simulate("block-magic", TINY)
