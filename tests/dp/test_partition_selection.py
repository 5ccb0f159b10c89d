"""DP partition selection (sage_tfx/dp/partition_selection.py): threshold, δ, ε, bounding.

The threshold is checked against an independent computation (scipy's Laplace tail solved for δ
with a root finder), the release probability of a key held by one record against δ on OpenDP's
own (unseeded) noise, and the noisy counts against a black-box ε audit that catches halved noise.
Every Monte-Carlo check certifies with confidence 1 − ALPHA; a correct mechanism fails it with
probability ≤ ALPHA.
"""
import collections
import math
import random

import numpy as np
import pytest
from scipy import optimize, stats

from sage_tfx.dp import audit, partition_selection as ps
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidPrivacyParameterError

ALPHA = 1e-4


def independent_threshold(epsilon, delta, m):
    """τ solving ``1 − (1 − P[1 + Lap(m/ε) ≥ τ])^m = δ`` with scipy's Laplace and brentq."""
    scale = m / epsilon

    def excess(tau):
        one = stats.laplace.sf(tau - 1.0, scale=scale)
        return (1.0 - (1.0 - one) ** m) - delta

    return optimize.brentq(excess, 1.0, 1.0 + 200 * scale, xtol=1e-12, rtol=1e-14)


@pytest.mark.parametrize("epsilon,delta,m", [
    (1.0, 1e-6, 1), (3.0, 1e-5, 1), (8.0, 1e-6, 1), (0.5, 1e-8, 3), (2.0, 1e-6, 10),
    (1.0, 0.05, 1), (0.1, 1e-9, 2)])
def test_threshold_equals_an_independent_computation(epsilon, delta, m):
    scale, tau = ps.threshold(epsilon, delta, m)
    assert scale == pytest.approx(m / epsilon, rel=1e-12) and scale >= m / epsilon
    expected = independent_threshold(epsilon, delta, m)
    # equal up to OpenDP's rounding of τ onto its noise grid (it maps conservatively); never below
    assert expected * (1 - 1e-12) <= tau <= expected * (1 + 1e-7)
    # OpenDP's map of what runs, and the closed form, both within (ε, δ)
    eps_map, delta_map = ps._opendp_map(scale, tau, m)  # pylint: disable=protected-access
    assert eps_map <= epsilon and delta_map <= delta
    assert ps.laplace_threshold_delta(scale, tau, m) <= delta * (1 + 1e-9)
    # a threshold one scale lower would overspend δ: the calibration is not loose either
    assert ps.laplace_threshold_delta(scale, tau - 0.01 * scale, m) > delta


class _Lowered(ps.PartitionSelection):
    """A broken selection: its threshold one noise scale too low (δ about e times too big)."""

    @property
    def threshold(self):
        return super().threshold - self.scale


def test_published_threshold_figures():
    """Google's LaplacePartitionSelection threshold, 1 − (m/ε)·ln(2(1 − (1 − δ)^{1/m})),
    written out by hand for two settings (ε = 1, δ = 1e-5, m = 1: 1 + ln(5e4) = 11.8197;
    ε = ln 3, δ = 1e-5, m = 2: the same with m/ε = 2/ln 3)."""
    assert ps.threshold(1.0, 1e-5)[1] == pytest.approx(1 + math.log(5e4), rel=1e-9)
    d1 = 1 - (1 - 1e-5) ** 0.5
    assert ps.threshold(math.log(3), 1e-5, 2)[1] == pytest.approx(
        1 - 2 / math.log(3) * math.log(2 * d1), rel=1e-9)


def _released_share(selection, keys_per_record, records):
    """Runs one OpenDP release over ``records`` one-record groups of ``keys_per_record`` keys
    (each key held by its record only) and returns the number of groups with a released key."""
    counts = {(r, j): 1 for r in range(records) for j in range(keys_per_record)}
    released = selection.release(counts)
    return len({r for r, _ in released})


@pytest.mark.parametrize("m", [1, 3])
def test_a_key_held_by_one_record_is_released_with_probability_at_most_delta(m):
    """δ = 0.05 so that 20,000 records measure it: the Clopper–Pearson lower bound on the share
    of records with a released key stays ≤ δ; the same check catches a threshold one noise scale
    too low."""
    delta, n = 0.05, 20_000
    selection = ps.PartitionSelection(1.0, delta, m)
    hits = _released_share(selection, m, n)
    low, high = audit.clopper_pearson(hits, n, ALPHA)
    assert low <= delta, (hits, n)
    assert high >= 0.8 * delta, "far below δ: the threshold is looser than calibrated"
    broken_hits = _released_share(_Lowered(1.0, delta, m), m, n)
    assert audit.clopper_pearson(broken_hits, n, ALPHA)[0] > delta, (broken_hits, n)


def test_noisy_counts_pass_an_epsilon_audit_that_catches_halved_noise():
    """Keys far above the threshold are always released; their noisy count is Laplace(m/ε).
    Adjacent datasets: a key held by 100 vs 101 records. 10,000 releases per input, one OpenDP
    call each over 10,000 such keys."""
    def release(selection):
        def draw(count, n):
            out = selection.release({i: count for i in range(n)})
            assert len(out) == n  # 100 ≫ τ: every key is released
            return np.array([out[i] for i in range(n)])
        return draw

    good = audit.audit_mechanism(release(ps.PartitionSelection(1.0, 1e-6)), 100.0, 101.0,
                                 claimed_epsilon=1.0, runs=10_000, alpha=ALPHA)
    assert good.passed, good
    halved = ps.PartitionSelection(2.0, 1e-6)  # half the noise, claimed as ε = 1
    broken = audit.audit_mechanism(release(halved), 100.0, 101.0, claimed_epsilon=1.0,
                                   runs=10_000, alpha=ALPHA)
    assert not broken.passed and broken.epsilon_lower_bound > 1.3, broken


def test_opendp_integer_threshold_map_understates_delta():
    """Why the float measurement: OpenDP 0.16.0's integer ``make_laplace_threshold`` releases a
    count-1 key iff 1 + Z ≥ τ, with probability P[Z ≥ τ − 1], yet maps it to δ = P[Z ≥ τ]. If
    this starts failing, OpenDP fixed its map and the integer sampler may be reconsidered."""
    import opendp.prelude as dp
    dp.enable_features("contrib")
    domain = dp.map_domain(dp.atom_domain(T=str), dp.atom_domain(T="i64"))
    metric = dp.l01inf_distance(dp.absolute_distance(T="i64"))
    meas = dp.m.make_laplace_threshold(domain, metric, scale=1.0, threshold=2)
    claimed = meas.map((1, 1, 1))[1]
    n = 20_000
    hits = len(meas({str(i): 1 for i in range(n)}))
    low, _ = audit.clopper_pearson(hits, n, ALPHA)
    assert low > 2 * claimed, (hits / n, claimed)


def test_seeded_release_thresholds_like_opendp():
    selection = ps.PartitionSelection(1.0, 1e-6)
    counts = {"big": 1000, "mid": 40, "small": 2, "zero": 0}
    out = selection.release(counts, SeededNoise(0))
    assert set(out) == {"big", "mid"}
    noisy = SeededNoise(0).laplace([1000.0, 40.0, 2.0, 0.0], selection.scale)
    assert out["big"] == pytest.approx(noisy[0]) and out["mid"] == pytest.approx(noisy[1])
    assert ps.select_partitions({}, 1.0, 1e-6) == {}
    assert set(ps.select_partitions({b"x": 500, 7: 400}, 1.0, 1e-6)) == {b"x", 7}


def test_contribution_bounding_is_a_uniform_sample_of_distinct_keys():
    assert ps.bound_contributions(["a", "b", "a", "c"], 5) == ["a", "b", "c"]
    rng = random.Random(0)
    picks = collections.Counter()
    for _ in range(6000):
        kept = ps.bound_contributions(["a", "b", "c", "d", "a"], 2, rng)
        assert len(kept) == 2 == len(set(kept))
        picks.update(kept)
    assert stats.chisquare(list(picks.values())).pvalue > ALPHA
    counts = ps.bounded_counts([["a", "a", "b"], ["a"], ["c", "d", "e"]], 2, rng)
    assert counts["a"] == 2 and counts["b"] == 1 and sum(counts.values()) == 5


def test_order_and_filter_is_tft_vocabulary_order():
    noisy = {"a": 5.0, "b": 3.0, "c": 3.0, "d": 1.0}
    assert ps.order_and_filter(noisy) == [("a", 5.0), ("c", 3.0), ("b", 3.0), ("d", 1.0)]
    assert ps.order_and_filter(noisy, top_k=2) == [("a", 5.0), ("c", 3.0)]
    assert ps.order_and_filter(noisy, frequency_threshold=3) == [("a", 5.0), ("c", 3.0),
                                                                 ("b", 3.0)]
    assert ps.recall(["a", "b"], {"a": 9, "b": 8, "c": 7, "d": 1}, 3) == pytest.approx(2 / 3)
    for bad in ({"top_k": 0}, {"top_k": 1.5}, {"frequency_threshold": -1}):
        with pytest.raises(ValueError):
            ps.order_and_filter(noisy, **bad)


@pytest.mark.parametrize("epsilon,delta,m", [
    (0.0, 1e-6, 1), (-1.0, 1e-6, 1), (math.inf, 1e-6, 1), (math.nan, 1e-6, 1),
    (1.0, 0.0, 1), (1.0, 1.0, 1), (1.0, -1e-6, 1), (1.0, math.nan, 1),
    (1.0, 1e-6, 0), (1.0, 1e-6, 1.5), (1.0, 1e-6, True), (1.0, 0.9, 1)])
def test_bad_parameters_are_refused(epsilon, delta, m):
    with pytest.raises(InvalidPrivacyParameterError):
        ps.PartitionSelection(epsilon, delta, m)
    with pytest.raises(InvalidPrivacyParameterError):
        ps.threshold(epsilon, delta, m)


def test_bad_counts_are_refused():
    selection = ps.PartitionSelection(1.0, 1e-6)
    for bad in ({"a": -1}, {"a": math.nan}, {"a": math.inf}):
        with pytest.raises(ValueError):
            selection.release(bad)
    with pytest.raises(TypeError):
        selection.release({"a": 3}, noise=np.random.default_rng(0))
