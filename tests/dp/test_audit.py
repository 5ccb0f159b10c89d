"""Black-box audits of every numpy DP release, and Mironov's floating-point attack.

Each audit certifies a lower bound on ε with confidence 1 − ALPHA on fresh (OpenDP, unseeded)
noise, so a correct mechanism fails it with probability ≤ ALPHA = 1e-4; the same audit catches
the mechanism with its sensitivity halved (true ε = 2 × claimed).
"""
import math

import numpy as np
import pytest
from scipy import stats

from sage_tfx.dp import audit, histograms, mechanisms as m, noise, queries, validation
from sage_tfx.dp.noise import SeededNoise

ALPHA = 1e-4
RUNS = 10_000


def test_clopper_pearson_is_scipys_exact_interval():
    for k, n in ((0, 50), (7, 50), (50, 50), (312, 1000)):
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.9, method="exact")
        assert audit.clopper_pearson(k, n, 0.1) == pytest.approx((ci.low, ci.high), abs=1e-9)
    assert audit.epsilon_lower_bound(500, 1000, 500, 1000) == 0.0
    # P_a = 0.5 vs P_b = 0.05 with 1e5 runs: ε ≥ ln(10) minus a small margin
    assert 2.2 < audit.epsilon_lower_bound(50_000, 100_000, 5_000, 100_000,
                                           alpha=1e-3) < math.log(10)


def _count_release(sensitivity):
    """A count's Laplace mechanism calibrated for ε = 1 at ``sensitivity``."""
    return lambda x, n: m.LaplaceMechanism(1.0, sensitivity).add_noise(np.full(n, x))


def test_count_noise_passes_and_halved_sensitivity_is_caught():
    good = audit.audit_mechanism(_count_release(1.0), 100, 101, claimed_epsilon=1.0, runs=RUNS,
                                 alpha=ALPHA)
    assert good.passed, good
    broken = audit.audit_mechanism(_count_release(0.5), 100, 101, claimed_epsilon=1.0, runs=RUNS,
                                   alpha=ALPHA)
    assert not broken.passed and broken.epsilon_lower_bound > 1.3, broken


def test_sum_laplace_passes_and_halved_sensitivity_is_caught():
    query = queries.SumQuery(0.0, 5.0, 0.5)   # adjacent: one more record of value 5

    def release(total, n, mech=query.mechanism):
        return mech.add_noise(np.full(n, total))

    good = audit.audit_mechanism(release, 40.0, 45.0, claimed_epsilon=0.5, runs=RUNS, alpha=ALPHA)
    assert good.passed, good
    halved = m.LaplaceMechanism(0.5, 2.5)
    broken = audit.audit_mechanism(lambda t, n: release(t, n, halved), 40.0, 45.0,
                                   claimed_epsilon=0.5, runs=RUNS, alpha=ALPHA)
    assert not broken.passed, broken


def test_gaussian_mechanism_passes_and_halved_sensitivity_is_caught():
    def release(x, n, sens=1.0):
        return m.GaussianMechanism(1.0, 1e-5, sens).add_noise(np.full(n, x))

    good = audit.audit_mechanism(release, 0.0, 1.0, claimed_epsilon=1.0, delta=1e-5, runs=RUNS,
                                 alpha=ALPHA)
    assert good.passed, good
    broken = audit.audit_mechanism(lambda x, n: release(x, n, 0.25), 0.0, 1.0,
                                   claimed_epsilon=1.0, delta=1e-5, runs=RUNS, alpha=ALPHA)
    assert not broken.passed, broken


def test_gaussian_hockey_stick_audit_catches_halved_sensitivity():
    """The (ε, δ) audit of the Gaussian mechanism at δ = 1e-5: 4,000 runs per input certify
    ε > 1 for the halved sensitivity (true ε ≈ 2.4), which the threshold audit above cannot at
    10,000; the correct mechanism stays below ε = 1."""
    def release(x, n, sens=1.0):
        return m.GaussianMechanism(1.0, 1e-5, sens).add_noise(np.full(n, x))

    kw = dict(claimed_epsilon=1.0, delta=1e-5, runs=4000, alpha=ALPHA)
    good = audit.gaussian_shift_audit(release, 0.0, 1.0, **kw)
    assert good.passed and good.normality_pvalue > ALPHA, good
    assert good.mu_lower_bound <= 1.0 / m.GaussianMechanism(1.0, 1e-5, 1.0).sigma
    broken = audit.gaussian_shift_audit(lambda x, n: release(x, n, 0.5), 0.0, 1.0, **kw)
    assert not broken.passed and broken.epsilon_lower_bound > 1.3, broken


def test_gaussian_hockey_stick_bound_is_below_the_exact_epsilon():
    """With many runs the bound approaches, and never exceeds, the exact ε (dp_accounting) of
    the Gaussian mechanism being sampled (seeded numpy noise: a check of the estimator)."""
    sigma = 2.0
    rng = np.random.default_rng(0)

    def release(x, n):
        return x + sigma * rng.standard_normal(n)

    exact = audit.gaussian_shift_audit(release, 0.0, 1.0, claimed_epsilon=1.0, delta=1e-5,
                                       runs=200_000, alpha=ALPHA)
    from dp_accounting.pld import privacy_loss_distribution as pld
    true_eps = pld.from_gaussian_mechanism(sigma).get_epsilon_for_delta(1e-5)
    assert 0.9 * true_eps < exact.epsilon_lower_bound <= true_eps
    with pytest.raises(ValueError):
        audit.gaussian_shift_audit(release, 0.0, 1.0, claimed_epsilon=1.0, delta=1e-5, runs=5)


@pytest.mark.slow
def test_mean_passes_and_halved_sensitivity_is_caught():
    """Sage List. 1 mean (noisy centred sum / noisy count, ε/2 each), vectorised through the
    very function ``MeanQuery.release`` runs. Adjacent inputs: one record of value 10
    (centred sum 5, count 1) vs that plus one record of value 0 (sum 0, count 2): the sum falls
    while the count rises, so both channels move the ratio the same way and a threshold on
    the released mean sees both halves of ε (~8 s: 80,000 OpenDP Laplace means)."""
    def release(epsilon):
        return lambda t, n: queries._noisy_means(  # pylint: disable=protected-access
            np.full(n, t[0]), np.full(n, t[1]), 0.0, 10.0, epsilon, None)

    a, b = np.array([5.0, 1.0]), np.array([0.0, 2.0])
    kw = dict(claimed_epsilon=1.0, runs=20_000, alpha=ALPHA)
    good = audit.audit_mechanism(release(1.0), a, b, **kw)
    assert good.passed, good
    broken = audit.audit_mechanism(release(2.0), a, b, **kw)   # both sensitivities halved
    assert not broken.passed and broken.epsilon_lower_bound > 1.15, broken


def _looped(fn):
    return lambda x, n: np.array([fn(x) for _ in range(n)])


@pytest.mark.parametrize("name,query,a,b", [
    ("histogram", histograms.HistogramQuery((0.0, 1.0, 2.0), 1.0), np.array([5.0, 3.0]),
     np.array([6.0, 3.0])),
    ("group_count", queries.GroupByCountQuery(("x", "y"), 1.0), np.array([5.0, 3.0]),
     np.array([5.0, 4.0])),
])
def test_query_releases_pass(name, query, a, b):
    """The releases the DP Transform analyzers run (``Query.release``), end to end."""
    claimed = query.epsilon
    stat = (lambda out: out[:, -1]) if name == "group_count" else None
    result = audit.audit_mechanism(_looped(lambda t: query.release(t)), a, b,
                                   claimed_epsilon=claimed, runs=1000, alpha=ALPHA, statistic=stat)
    assert result.passed, (name, result)


def test_validator_release_passes():
    """The validator's DP count spends ε/2 of its ε: audited against 0.5."""
    validator = validation.LossValidator(target=0.1, loss_bound=1.0, eta=0.05)
    base = np.full(200, 0.5)
    runs = _looped(lambda v: validator.validate(v, epsilon=1.0).n_test_dp)
    result = audit.audit_mechanism(runs, base, np.append(base, 1.0), claimed_epsilon=0.5,
                                   runs=1000, alpha=ALPHA)
    assert result.passed, result


def _mironov_event(ys, scale):
    """Reachable from input 0 by numpy's sampler, and not from input 1."""
    return np.array([audit.textbook_laplace_reachable(y, 0.0, scale)
                     and not audit.textbook_laplace_reachable(y, 1.0, scale) for y in ys])


@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_mironov_attack_breaks_numpy_laplace_not_opendp(scale):
    """Adjacent inputs 0 and 1 (sensitivity 1), claimed ε = 1/scale. The set of outputs numpy's
    textbook sampler can reach differs between them; OpenDP's outputs are on one grid."""
    n, claimed = 2000, 1.0 / scale
    old = SeededNoise(0)
    old_0 = _mironov_event(old.laplace(np.zeros(n), scale), scale)
    old_1 = _mironov_event(old.laplace(np.ones(n), scale), scale)
    assert old_0.mean() > 0.5 and old_1.sum() == 0  # every output from 1 is reachable from 1
    old_bound = audit.epsilon_lower_bound(int(old_0.sum()), n, int(old_1.sum()), n, alpha=ALPHA)
    assert old_bound > 3.0 > claimed
    new = m.LaplaceMechanism(claimed, 1.0)
    new_0 = _mironov_event(new.add_noise(np.zeros(n)), scale)
    new_1 = _mironov_event(new.add_noise(np.ones(n)), scale)
    for a, b in ((new_0, new_1), (new_1, new_0)):
        bound = audit.epsilon_lower_bound(int(a.sum()), n, int(b.sum()), n, alpha=ALPHA)
        assert bound <= claimed, (scale, a.mean(), b.mean())


def test_opendp_low_bits_do_not_depend_on_the_input():
    """Low-bit pattern attack: the lowest 8 mantissa bits of the outputs, as a histogram, are
    distributed alike at adjacent inputs under OpenDP (chi-square), unlike numpy's."""
    def low_bits(y):
        mant, _ = np.frexp(y)
        return (np.abs(mant) * 2 ** 53).astype(np.int64) & 0x7

    n, scale = 20_000, 10.0
    mech = m.LaplaceMechanism(1.0 / scale, 1.0)
    new = [np.bincount(low_bits(mech.add_noise(np.full(n, x))), minlength=8) for x in (0.0, 1.0)]
    assert stats.chi2_contingency(np.array(new)).pvalue > ALPHA
    old = [np.bincount(low_bits(SeededNoise(x).laplace(np.full(n, x), scale)), minlength=8)
           for x in (0, 1)]
    assert stats.chi2_contingency(np.array(old)).pvalue < ALPHA


def test_charged_event_is_what_opendp_guarantees():
    """The sampler that runs is at least as private as the DpEvent charged, by OpenDP's map."""
    for eps, sens in ((1.0, 1.0), (3.0, 1.0), (0.7, 2.5), (1 / 3, 7.0)):
        mech = m.LaplaceMechanism(eps, sens)
        assert mech.dp_event().noise_multiplier == pytest.approx(1 / eps)
        assert noise.laplace_epsilon(mech.sampler_scale, sens) <= eps
        assert mech.sampler_scale == pytest.approx(sens / eps, rel=1e-12)  # calibration kept
        if sens == int(sens):
            scale = m.secure_laplace_scale(eps, sens, integer=True)
            assert noise.laplace_epsilon(scale, sens, integer=True) <= eps
    for eps, delta, sens in ((1.0, 1e-5, 1.0), (0.3, 1e-7, 4.0)):
        mech = m.GaussianMechanism(eps, delta, sens)
        rho_charged = 1.0 / (2.0 * mech.dp_event().noise_multiplier ** 2)
        assert noise.gaussian_rho(mech.sampler_sigma, sens) <= rho_charged
        assert mech.sampler_sigma == pytest.approx(mech.sigma, rel=1e-12)
