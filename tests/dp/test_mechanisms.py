"""Fast tests of sage_tfx.dp.mechanisms: noise scales, analytic Gaussian, budgets, DP statistics.

Statistical tolerances: each empirical check uses a fixed seed (deterministic) and a tolerance of
5 standard errors of the estimator, so a random seed would fail with probability < 1e-6.
"""
import math
from decimal import Decimal

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_mechanism
from dp_accounting.rdp import rdp_privacy_accountant

from sage_tfx.dp import mechanisms as m
from sage_tfx.dp import histograms
from sage_tfx.dp import queries
from sage_tfx.ledger.accounting import exact
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.dp.noise import SeededNoise

N_DRAWS = 200_000
Z = 5.0  # standard errors of tolerance


def pld_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(event)
    return accountant.get_epsilon(delta)


# --- noise scales -----------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon,sensitivity", [(1.0, 1.0), (0.1, 1.0), (2.0, 5.0)])
def test_laplace_std_matches_formula(epsilon, sensitivity):
    mech = m.LaplaceMechanism(epsilon, sensitivity)
    assert mech.scale == pytest.approx(sensitivity / epsilon)
    noise = mech.add_noise(np.zeros(N_DRAWS), SeededNoise(0))
    # Laplace: kurtosis 6, so Var(s²) = (μ4 − σ⁴)/n = 5σ⁴/n and SE(s)/σ ≈ sqrt(5/n)/2.
    rel_se = math.sqrt(5.0 / N_DRAWS) / 2.0
    assert np.std(noise) == pytest.approx(math.sqrt(2.0) * mech.scale, rel=Z * rel_se)
    assert mech.std == pytest.approx(math.sqrt(2.0) * mech.scale)
    assert abs(np.mean(noise)) < Z * mech.std / math.sqrt(N_DRAWS)
    # E|X| = scale for Laplace(0, scale); SD(|X|) = scale.
    assert np.mean(np.abs(noise)) == pytest.approx(mech.scale, rel=Z / math.sqrt(N_DRAWS))


@pytest.mark.parametrize("epsilon,delta,sensitivity", [(1.0, 1e-5, 1.0), (0.5, 1e-6, 3.0)])
def test_gaussian_std_matches_sigma(epsilon, delta, sensitivity):
    mech = m.GaussianMechanism(epsilon, delta, sensitivity)
    noise = mech.add_noise(np.zeros(N_DRAWS), SeededNoise(1))
    rel_se = 1.0 / math.sqrt(2.0 * N_DRAWS)  # SE(s)/σ for a normal sample
    assert np.std(noise) == pytest.approx(mech.sigma, rel=Z * rel_se)
    assert abs(np.mean(noise)) < Z * mech.sigma / math.sqrt(N_DRAWS)


def test_add_noise_keeps_shape_and_scalars():
    mech = m.LaplaceMechanism(1.0)
    assert isinstance(mech.add_noise(3.0, SeededNoise(0)), float)
    assert mech.add_noise(np.zeros((2, 3)), SeededNoise(0)).shape == (2, 3)
    assert mech.add_noise(10.0, SeededNoise(7)) == 10.0 + np.random.default_rng(7).laplace(0.0, 1.0)
    assert mech.add_noise(0.0) != mech.add_noise(0.0)  # OpenDP by default
    with pytest.raises(TypeError, match="noise source"):
        mech.add_noise(0.0, np.random.default_rng(0))  # a bare generator is not a noise source


def _count_noise(seed, shape, epsilon):
    """The Laplace draws SeededNoise(seed) adds to a sensitivity-1 count at ε."""
    return SeededNoise(seed).laplace(np.zeros(shape), m.secure_laplace_scale(epsilon, 1.0))


def test_dp_events():
    lap = m.LaplaceMechanism(0.5, 4.0)
    assert lap.dp_event() == dp_accounting.LaplaceDpEvent(noise_multiplier=lap.scale / 4.0)
    assert lap.dp_event().noise_multiplier == pytest.approx(2.0)
    gauss = m.GaussianMechanism(1.0, 1e-5, 2.0)
    assert gauss.dp_event() == dp_accounting.GaussianDpEvent(noise_multiplier=gauss.sigma / 2.0)
    # The Laplace event accounts to its epsilon (dp_accounting PLD, δ≈0).
    assert pld_epsilon(lap.dp_event(), 1e-12) == pytest.approx(0.5, rel=1e-6)


def test_mechanisms_are_frozen():
    mech = m.LaplaceMechanism(1.0)
    with pytest.raises(Exception):
        mech.epsilon = 2.0  # type: ignore[misc]


# --- analytic Gaussian ------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon,delta", [
    (0.01, 1e-3), (0.1, 1e-5), (1.0, 1e-5), (1.0, 1e-9), (5.0, 1e-6), (10.0, 1e-3)])
def test_analytic_gaussian_against_dp_accounting(epsilon, delta):
    sigma = m.analytic_gaussian_sigma(epsilon, delta)
    # dp_accounting's exact privacy profile of the Gaussian mechanism at this sigma: δ(ε) ≤ δ,
    # and tight (the calibration is the smallest sigma).
    exact_delta = privacy_loss_mechanism.GaussianPrivacyLoss(sigma).get_delta_for_epsilon(epsilon)
    assert exact_delta <= delta * (1 + 1e-9)
    assert exact_delta >= delta * (1 - 1e-6)
    assert m.gaussian_delta(sigma * 0.999, epsilon) > delta  # minimal
    # dp_accounting's own calibration (binary search over the same profile).
    reference = privacy_loss_mechanism.GaussianPrivacyLoss.from_privacy_guarantee(
        pld_common.DifferentialPrivacyParameters(epsilon, delta)).standard_deviation
    assert sigma == pytest.approx(reference, rel=1e-6)
    # The accountants' epsilon of the GaussianDpEvent: PLD (tight) ≈ ε; RDP is an upper bound.
    event = m.GaussianMechanism(epsilon, delta).dp_event()
    assert pld_epsilon(event, delta) == pytest.approx(epsilon, rel=1e-6)
    rdp = rdp_privacy_accountant.RdpAccountant()
    rdp.compose(event)
    assert rdp.get_epsilon(delta) >= epsilon * (1 - 1e-9)


def test_analytic_gaussian_beats_classical_and_scales_with_sensitivity():
    for epsilon in (0.1, 0.5, 0.9):
        classical = math.sqrt(2 * math.log(1.25 / 1e-5)) / epsilon
        assert m.analytic_gaussian_sigma(epsilon, 1e-5) < classical
    assert m.analytic_gaussian_sigma(1.0, 1e-5, 3.0) == pytest.approx(
        3.0 * m.analytic_gaussian_sigma(1.0, 1e-5), rel=1e-9)


# --- bad arguments ----------------------------------------------------------------------------

BAD_EPSILONS = [float("nan"), -1.0, 0.0, 0, float("inf"), -float("inf"), "1", None, True]


@pytest.mark.parametrize("epsilon", BAD_EPSILONS)
def test_bad_epsilon_rejected(epsilon):
    with pytest.raises(InvalidPrivacyParameterError):
        m.LaplaceMechanism(epsilon)
    with pytest.raises(InvalidPrivacyParameterError):
        m.GaussianMechanism(epsilon, 1e-5)
    with pytest.raises(InvalidPrivacyParameterError):
        queries.dp_count([1, 2], epsilon)
    with pytest.raises(InvalidPrivacyParameterError):
        m.split_budget(epsilon, 0.0, [1])


@pytest.mark.parametrize("delta", [0, 0.0])
def test_gaussian_requires_positive_delta(delta):
    with pytest.raises(InvalidPrivacyParameterError, match="Gaussian requires delta > 0"):
        m.GaussianMechanism(1.0, delta)


@pytest.mark.parametrize("delta", [-1e-5, 1.0, 1.5, float("nan"), float("inf"), None, "0.1"])
def test_bad_delta_rejected(delta):
    with pytest.raises(InvalidPrivacyParameterError):
        m.GaussianMechanism(1.0, delta)
    with pytest.raises(InvalidPrivacyParameterError):
        m.analytic_gaussian_sigma(1.0, delta)


@pytest.mark.parametrize("sensitivity", [0.0, -1.0, float("nan"), float("inf"), None])
def test_bad_sensitivity_rejected(sensitivity):
    with pytest.raises(InvalidPrivacyParameterError):
        m.LaplaceMechanism(1.0, sensitivity)
    with pytest.raises(InvalidPrivacyParameterError):
        m.GaussianMechanism(1.0, 1e-5, sensitivity)


@pytest.mark.parametrize("lower,upper", [
    (1.0, 1.0), (2.0, 1.0), (float("nan"), 1.0), (0.0, float("inf")), (None, 1.0), (0, "1")])
def test_bad_bounds_rejected(lower, upper):
    with pytest.raises(InvalidPrivacyParameterError):
        queries.dp_sum([1.0], lower, upper, 1.0)
    with pytest.raises(InvalidPrivacyParameterError):
        queries.dp_mean([1.0], lower, upper, 1.0)
    with pytest.raises(InvalidPrivacyParameterError):
        histograms.dp_min_max([1.0], lower, upper, 1.0)


@pytest.mark.parametrize("edges", [[0.0], [1.0, 0.0], [0.0, 0.0, 1.0], [0.0, float("nan")],
                                   [0.0, float("inf")], [[0.0, 1.0]]])
def test_bad_bin_edges_rejected(edges):
    with pytest.raises(InvalidPrivacyParameterError):
        histograms.dp_histogram([0.5], edges, 1.0)


@pytest.mark.parametrize("domain", [[], [1, 1], ["a", b"a"], [1, "a"], [1.5], [True, False]])
def test_bad_key_domain_rejected(domain):
    with pytest.raises(InvalidPrivacyParameterError):
        queries.dp_group_by_count([1], domain, 1.0)


def test_mismatched_key_kinds_rejected():
    with pytest.raises(ValueError):
        queries.dp_group_by_count(["a"], [1, 2], 1.0)
    with pytest.raises(ValueError):
        queries.dp_group_by_count([1], ["a"], 1.0)
    with pytest.raises(ValueError):
        queries.dp_group_by_sum([1, 2], [1.0], [1, 2], 0.0, 1.0, 1.0)


# --- budget splitting -------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon,delta,weights", [
    (1.0, 1e-6, [1, 1, 1]), (0.3, 0.0, [1, 2, 3, 4, 5, 6, 7]), (1.0, 1e-5, [0.1, 0.2, 0.7]),
    (2.5, 3e-7, [3]), (0.7, 1e-9, [1e-3, 1.0])])
def test_split_budget_is_exact(epsilon, delta, weights):
    shares = m.split_budget(epsilon, delta, weights)
    assert len(shares) == len(weights)
    eps_sum = sum((exact(s.epsilon) for s in shares), Decimal(0))
    delta_sum = sum((exact(s.delta) for s in shares), Decimal(0))
    # Never more than the total; equal up to (at most) one ulp of the last share.
    assert eps_sum <= exact(epsilon)
    assert exact(epsilon) - eps_sum <= Decimal(math.ulp(shares[-1].epsilon))
    assert delta_sum <= exact(delta)
    if delta:
        assert exact(delta) - delta_sum <= Decimal(math.ulp(shares[-1].delta))
    else:
        assert all(s.delta == 0.0 for s in shares)
    total_w = sum(weights)
    for share, w in zip(shares, weights):
        assert share.epsilon == pytest.approx(epsilon * w / total_w, rel=1e-12)
        assert share.epsilon > 0


def test_split_budget_exact_in_common_case():
    shares = m.split_budget(1.0, 1e-6, [1, 1, 1])
    assert sum((exact(s.epsilon) for s in shares), Decimal(0)) == Decimal("1.0")
    assert sum((exact(s.delta) for s in shares), Decimal(0)) == exact(1e-6)


@pytest.mark.parametrize("weights", [[], [0], [1, -1], [float("nan")], [float("inf")], ["a"]])
def test_split_budget_bad_weights(weights):
    with pytest.raises(InvalidPrivacyParameterError):
        m.split_budget(1.0, 0.0, weights)


# --- DP statistics ----------------------------------------------------------------------------

HUGE_EPSILON = 1e9  # noise ~1e-9: the release is the exact (clipped) statistic


def test_queries_are_additive_over_batches():
    rng = np.random.default_rng(3)
    x = rng.normal(0, 3, 1000)
    x[::97] = np.nan
    keys = rng.integers(0, 7, 1000)
    queries_and_columns = [
        (queries.CountQuery(1.0), (x,)),
        (queries.SumQuery(-2.0, 5.0, 1.0), (x,)),
        (queries.MeanQuery(-2.0, 5.0, 1.0), (x,)),
        (queries.GroupByCountQuery((1, 2, 3), 1.0), (keys,)),
        (queries.GroupBySumQuery((1, 2, 3), -1.0, 1.0, 1.0), (keys, x)),
        (queries.GroupByMeanQuery((1, 2, 3), -1.0, 1.0, 1.0), (keys, x)),
        (histograms.HistogramQuery((-3.0, 0.0, 1.0, 4.0), 1.0), (x,)),
        (histograms.MinMaxQuery(-5.0, 5.0, 1.0, 20), (x,)),
        (histograms.QuantilesQuery((0.5,), -5.0, 5.0, 1.0, 20), (x,)),
    ]
    for query, columns in queries_and_columns:
        whole = query.aggregate(*columns)
        parts = query.zero() + sum(query.aggregate(*(c[i:i + 123] for c in columns))
                                   for i in range(0, 1000, 123))
        np.testing.assert_allclose(parts, whole, rtol=1e-12, atol=1e-9, err_msg=repr(query))
        np.testing.assert_array_equal(query.aggregate(*(c[:0] for c in columns)), query.zero())


def test_release_is_exact_aggregate_plus_seeded_noise():
    x = np.arange(10.0)
    release = queries.dp_sum(x, 0.0, 4.0, 0.5, noise=SeededNoise(11))
    clipped = np.clip(x, 0.0, 4.0).sum()
    assert release.value == clipped + np.random.default_rng(11).laplace(0.0, 4.0 / 0.5)
    assert release.event == dp_accounting.LaplaceDpEvent(noise_multiplier=2.0)
    assert release.epsilon == 0.5


def test_dp_count():
    release = queries.dp_count(np.zeros((57, 3)), 1.0, noise=SeededNoise(0))
    assert release.value == 57 + _count_noise(0, (), 1.0)
    assert release.event == dp_accounting.LaplaceDpEvent(noise_multiplier=1.0)


def test_dp_sum_clips_and_ignores_nan():
    x = [-100.0, -1.0, 0.5, 2.0, 100.0, float("nan"), float("inf")]
    release = queries.dp_sum(x, -2.0, 3.0, HUGE_EPSILON)
    assert release.value == pytest.approx(-2.0 - 1.0 + 0.5 + 2.0 + 3.0 + 3.0, abs=1e-6)
    # sensitivity max(|lower|, |upper|) = 3 → noise multiplier scale/3 = 1/ε
    assert release.event.noise_multiplier == pytest.approx(1.0 / HUGE_EPSILON)
    assert queries.SumQuery(-2.0, 3.0, 0.5).mechanism.scale == pytest.approx(6.0)


def test_dp_mean_noises_sum_and_count_separately():
    x = np.array([1.0, 2.0, 3.0, 50.0, float("nan")])
    assert queries.dp_mean(x, 0.0, 10.0, HUGE_EPSILON).value == pytest.approx(16.0 / 4.0)
    release = queries.dp_mean(x, 0.0, 10.0, 1.0, noise=SeededNoise(5))
    seeded = SeededNoise(5)
    # count first (ε/2, sensitivity 1), then the centered sum (sensitivity 5)
    noisy_count = seeded.laplace(4.0, m.secure_laplace_scale(0.5, 1.0))
    noisy_sum = seeded.laplace(16.0 - 4 * 5.0, m.secure_laplace_scale(0.5, 5.0))
    expected = np.clip(5.0 + noisy_sum / max(noisy_count, 1.0), 0.0, 10.0)
    assert release.value == pytest.approx(expected, rel=1e-12)
    assert release.event == dp_accounting.ComposedDpEvent([
        dp_accounting.LaplaceDpEvent(noise_multiplier=2.0),
        dp_accounting.LaplaceDpEvent(noise_multiplier=2.0)])
    assert pld_epsilon(release.event, 1e-12) == pytest.approx(1.0, rel=1e-6)


def test_dp_mean_of_empty_data_stays_in_bounds():
    for seed in range(50):
        value = queries.dp_mean([], -1.0, 3.0, 0.1, noise=SeededNoise(seed)).value
        assert -1.0 <= value <= 3.0


def test_group_by_count_over_public_domain():
    keys = np.array(["b", "a", "b", "zzz", "b", "outside"])
    domain = ["a", "b", "c"]  # "c" has no record; "zzz", "outside" are not in the domain
    release = queries.dp_group_by_count(keys, domain, HUGE_EPSILON)
    np.testing.assert_allclose(release.value, [1.0, 3.0, 0.0], atol=1e-6)
    # Noise is a vector Laplace of L1 sensitivity 1 (parallel composition): scale 1/ε per key.
    seeded = queries.dp_group_by_count(keys, domain, 2.0, noise=SeededNoise(9)).value
    np.testing.assert_array_equal(seeded, np.array([1.0, 3.0, 0.0]) + _count_noise(9, 3, 2.0))
    assert release.event == dp_accounting.LaplaceDpEvent(noise_multiplier=1.0 / HUGE_EPSILON)


def test_group_by_count_noise_scale_per_key():
    domain = list(range(N_DRAWS))
    noise = queries.dp_group_by_count(np.array([], dtype=np.int64), domain, 4.0,
                                noise=SeededNoise(2)).value
    assert noise.shape == (N_DRAWS,)
    assert np.std(noise) == pytest.approx(math.sqrt(2.0) / 4.0,
                                          rel=Z * math.sqrt(5.0 / N_DRAWS) / 2.0)


def test_group_by_int_keys_and_bytes():
    assert np.allclose(queries.dp_group_by_count([3, 1, 3, 3, 9], [1, 3, 5], HUGE_EPSILON).value,
                       [1, 3, 0], atol=1e-6)
    assert np.allclose(queries.dp_group_by_count(np.array([b"x", b"y"], dtype=object), ["y", "q"],
                                           HUGE_EPSILON).value, [1, 0], atol=1e-6)
    assert np.allclose(queries.dp_group_by_count([[1], [1]], np.array([1, 2]), HUGE_EPSILON).value,
                       [2, 0], atol=1e-6)


def test_group_by_sum_and_mean():
    keys = [0, 1, 1, 2, 7, 1]
    values = [5.0, 1.0, 2.0, -9.0, 100.0, float("nan")]
    sums = queries.dp_group_by_sum(keys, values, [0, 1, 2, 3], -1.0, 4.0, HUGE_EPSILON).value
    np.testing.assert_allclose(sums, [4.0, 3.0, -1.0, 0.0], atol=1e-6)
    means = queries.dp_group_by_mean(keys, values, [0, 1, 2, 3], -1.0, 4.0, HUGE_EPSILON)
    # Key 3 has no record: its count is ~0, read as 1, so its mean is the midpoint.
    np.testing.assert_allclose(means.value, [4.0, 1.5, -1.0, 1.5], atol=1e-6)
    assert means.event == dp_accounting.ComposedDpEvent([
        dp_accounting.LaplaceDpEvent(noise_multiplier=2.0 / HUGE_EPSILON),
        dp_accounting.LaplaceDpEvent(noise_multiplier=2.0 / HUGE_EPSILON)])
    noisy = queries.dp_group_by_mean(keys, values, [0, 1, 2, 3], -1.0, 4.0, 0.01).value
    assert np.all((noisy >= -1.0) & (noisy <= 4.0))


def test_histogram_clips_into_outer_bins():
    x = [-10.0, 0.0, 0.5, 1.0, 2.0, 3.0, 99.0, float("nan")]
    release = histograms.dp_histogram(x, [0.0, 1.0, 2.0, 3.0], HUGE_EPSILON)
    np.testing.assert_allclose(release.value, [3.0, 1.0, 3.0], atol=1e-6)
    seeded = histograms.dp_histogram(x, [0.0, 1.0, 2.0, 3.0], 0.5, noise=SeededNoise(4)).value
    np.testing.assert_array_equal(seeded, np.array([3.0, 1.0, 3.0]) + _count_noise(4, 3, 0.5))


def test_min_max_from_dp_histogram():
    rng = np.random.default_rng(8)
    x = rng.uniform(2.0, 7.0, 20_000)
    release = histograms.dp_min_max(x, 0.0, 10.0, 1.0, num_bins=100, noise=SeededNoise(1))
    low, high = release.value
    assert low == pytest.approx(2.0, abs=0.1 + 1e-9)  # one bin width
    assert high == pytest.approx(7.0, abs=0.1 + 1e-9)
    assert release.event == dp_accounting.LaplaceDpEvent(noise_multiplier=1.0)
    # No data: no bin passes the threshold (w.p. ≥ 1 − β), the public range is returned.
    empty = histograms.dp_min_max([], 0.0, 10.0, 1.0, noise=SeededNoise(1)).value
    np.testing.assert_array_equal(empty, [0.0, 10.0])
    for seed in range(20):
        low, high = histograms.dp_min_max(x[:30], 0.0, 10.0, 0.1, noise=SeededNoise(seed)).value
        assert 0.0 <= low < high <= 10.0


def test_min_max_threshold():
    query = histograms.MinMaxQuery(0.0, 1.0, 2.0, num_bins=50, failure_probability=0.1)
    assert query.threshold == pytest.approx(0.5 * math.log(50 / 0.2))
    with pytest.raises(InvalidPrivacyParameterError):
        histograms.MinMaxQuery(0.0, 1.0, 2.0, failure_probability=1.0)
    with pytest.raises(InvalidPrivacyParameterError):
        histograms.MinMaxQuery(0.0, 1.0, 2.0, num_bins=0)


def test_quantiles_from_dp_histogram():
    rng = np.random.default_rng(6)
    x = rng.uniform(0.0, 10.0, 50_000)
    release = histograms.dp_quantiles(x, [0.1, 0.5, 0.9], 0.0, 10.0, 1.0, num_bins=100,
                             noise=SeededNoise(0))
    np.testing.assert_allclose(release.value, np.quantile(x, [0.1, 0.5, 0.9]), atol=0.1)
    assert np.all(np.diff(release.value) >= 0)
    empty = histograms.dp_quantiles([], [0.0, 0.5, 1.0], 0.0, 10.0, 1e-9, noise=SeededNoise(0))
    assert np.all((empty.value >= 0.0) & (empty.value <= 10.0))
    with pytest.raises(ValueError):
        histograms.dp_quantiles(x, [1.5], 0.0, 10.0, 1.0)


def test_wrong_record_shape_rejected():
    with pytest.raises(ValueError, match="one value per record"):
        queries.dp_sum(np.zeros((3, 2)), 0.0, 1.0, 1.0)
