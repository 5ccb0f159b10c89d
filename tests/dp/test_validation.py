"""Tests of the SLAed DP validators (sage_tfx/dp/validation.py, sla_bounds.py, sla_baselines.py).

Fast (seconds) and TensorFlow-free. Monte Carlo checks are vectorized with numpy: they call the
same public bound functions the validators use (a separate test checks that ``validate`` reports
exactly those bounds).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld
from scipy import stats

from sage_tfx.dp import validation as v
from sage_tfx.dp import sla_baselines
from sage_tfx.dp import sla_bounds
from sage_tfx.ledger.accounting import event_from_json, event_to_json
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.dp.noise import SeededNoise


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _beta_losses(rng: np.random.Generator, mean: float, size, concentration: float = 2.0):
    """Losses in [0, 1] with a known expected value ``mean``."""
    return rng.beta(concentration * mean, concentration * (1.0 - mean), size=size)


# ---------------------------------------------------------------------------------------------
# The module contract.


def test_module_imports_no_tensorflow():
    code = ("import sys, sage_tfx.dp.validation; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tfx')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_outcome_values():
    assert [o.value for o in v.Outcome] == ["ACCEPT", "REJECT", "RETRY", "TIMEOUT"]
    assert v.Outcome("ACCEPT") is v.Outcome.ACCEPT


def test_result_is_frozen_and_json_ready():
    result = v.LossValidator(target=0.2, loss_bound=1.0, eta=0.05).validate(
        _beta_losses(_rng(), 0.1, 2000), epsilon=1.0, noise=SeededNoise(rng=_rng(1)))
    with pytest.raises(AttributeError):
        result.outcome = v.Outcome.REJECT  # type: ignore[misc]
    data = json.loads(json.dumps(result.to_dict()))
    assert data["outcome"] == result.outcome.value
    assert data["epsilon"] == 1.0 and data["delta"] == 0.0 and data["eta"] == 0.05


def test_result_reports_only_dp_quantities():
    losses = _beta_losses(_rng(), 0.1, 3000)
    result = v.LossValidator(target=0.2, loss_bound=1.0, eta=0.05).validate(
        losses, epsilon=0.5, noise=SeededNoise(rng=_rng(1)))
    assert result.n_test_dp != losses.size
    assert result.details["dp_loss_sum"] != losses.sum()
    assert result.dp_estimate == pytest.approx(
        result.details["dp_loss_sum"] / result.n_test_dp, rel=1e-12)
    assert "loss_sum" not in result.details  # only the NP baseline reports the raw sum


# ---------------------------------------------------------------------------------------------
# List. 2, line by line.


def test_bernstein_matches_list2_for_b_equal_1():
    loss, n, eta = np.array([0.0, 0.05, 0.3, 0.9]), np.array([10, 100, 1000, 50]), 0.01
    paper = loss + np.sqrt(2 * 1.0 * loss * np.log(1 / eta) / n) + 4 * np.log(1 / eta) / n
    np.testing.assert_allclose(sla_bounds.bernstein_upper_bound(loss, n, eta, 1.0),
                               paper, rtol=1e-15)


def test_bernstein_keeps_b_in_last_term():
    """List. 2 line 25 without B under-covers for B > 1; the implemented bound does not."""
    rng, n, p, big_b, eta = _rng(3), 200, 0.01, 100.0, 0.05
    mu = big_b * p  # losses in {0, B}
    means = big_b * rng.binomial(n, p, size=200_000) / n
    log_term = np.log(1 / eta)
    printed = means + np.sqrt(2 * big_b * means * log_term / n) + 4 * log_term / n
    assert np.mean(printed < mu) > 0.1  # e.g. every all-zero test set (P ≈ 0.13)
    assert np.mean(sla_bounds.bernstein_upper_bound(means, n, eta, big_b) < mu) <= eta


@pytest.mark.parametrize("n,mu", [(30, 0.02), (100, 0.3), (1000, 0.1), (5000, 0.5)])
def test_bernstein_bounds_cover_the_mean(n, mu):
    eta = 0.05
    means = _rng(n).binomial(n, mu, size=100_000) / n  # 0/1 losses: the largest variance
    assert np.mean(sla_bounds.bernstein_upper_bound(means, n, eta, 1.0) < mu) <= eta
    assert np.mean(sla_bounds.bernstein_lower_bound(means, n, eta, 1.0) > mu) <= eta


def test_bernstein_bounds_monotone_and_ordered():
    loss = np.linspace(0, 1, 11)[:, None]
    n = np.array([1, 10, 100, 1000])[None, :]
    upper = sla_bounds.bernstein_upper_bound(loss, n, 0.05, 1.0)
    lower = sla_bounds.bernstein_lower_bound(loss, n, 0.05, 1.0)
    assert np.all(np.diff(upper, axis=0) > 0) and np.all(np.diff(upper, axis=1) < 0)
    assert np.all(np.diff(lower, axis=0) >= 0) and np.all(np.diff(lower, axis=1) >= 0)
    assert np.all(lower <= loss) and np.all(loss <= upper)
    assert sla_bounds.bernstein_upper_bound(0.1, 0, 0.05, 1.0) == np.inf
    assert sla_bounds.bernstein_lower_bound(0.1, -3, 0.05, 1.0) == 0.0


def test_laplace_correction_is_the_list2_expression():
    eps, eta, big_b = 0.3, 0.05, 2.5
    # List. 2 lines 13-14 and 17-18 (η is the test's, the tail is η/3).
    assert sla_bounds.laplace_upper_tail(2 / eps,
                                         eta / 3) == pytest.approx(
                                             2 * math.log(3 / (2 * eta)) / eps)
    assert sla_bounds.laplace_upper_tail(2 * big_b / eps, eta / 3) == pytest.approx(
        2 * big_b * math.log(3 / (2 * eta)) / eps)


@pytest.mark.parametrize("eta", [0.3, 0.05])
def test_laplace_corrections_fail_exactly_eta_over_3(eta):
    """Each DP correction fails with probability exactly η/3 (empirically, ±5 std errors)."""
    rng, trials, eps, big_b, n, true_sum = _rng(7), 400_000, 0.2, 3.0, 1000, 400.0
    n_dp = n + rng.laplace(0, 2 / eps, trials)
    sum_dp = true_sum + rng.laplace(0, 2 * big_b / eps, trials)
    up = sla_bounds.sage_loss_upper_bound(sum_dp, n_dp, epsilon=eps, eta=eta, loss_bound=big_b)
    low = sla_bounds.sage_loss_lower_bound(sum_dp, n_dp, epsilon=eps, eta=eta, loss_bound=big_b)
    tol = 5 * math.sqrt((eta / 3) * (1 - eta / 3) / trials)
    assert np.mean(up["n_test_dp_min"] > n) == pytest.approx(eta / 3, abs=tol)
    assert np.mean(up["corrected_dp_loss_sum"] < true_sum) == pytest.approx(eta / 3, abs=tol)
    count_fails = (low["n_test_dp_min"] > n) | (low["n_test_dp_max"] < n)  # two-sided
    assert np.mean(count_fails) == pytest.approx(eta / 3, abs=tol)
    assert np.mean(low["corrected_dp_loss_sum"] > true_sum) == pytest.approx(eta / 3, abs=tol)


def test_noise_scales_of_dp_count_and_loss_sum():
    """Empirical noise of validate()'s count and loss sum is Laplace(2/ε) and Laplace(2B/ε)."""
    eps, big_b = 0.5, 4.0
    losses = big_b * _beta_losses(_rng(), 0.3, 500)
    validator = v.LossValidator(target=1.0, loss_bound=big_b, eta=0.05)
    rng = _rng(11)
    results = [
        validator.validate(losses, epsilon=eps, noise=SeededNoise(rng=rng)) for _ in range(2000)]
    count_noise = np.array([r.n_test_dp for r in results]) - losses.size
    sum_noise = np.array([r.details["dp_loss_sum"] for r in results]) - losses.sum()
    for noise, scale in ((count_noise, 2 / eps), (sum_noise, 2 * big_b / eps)):
        assert np.std(noise) == pytest.approx(math.sqrt(2) * scale, rel=0.08)
        assert np.mean(np.abs(noise)) == pytest.approx(scale, rel=0.06)
        assert stats.kstest(noise, stats.laplace(scale=scale).cdf).pvalue > 1e-3
    assert results[0].details["count_noise_scale"] == 2 / eps
    assert results[0].details["sum_noise_scale"] == 2 * big_b / eps


def test_validate_reports_the_public_bounds_and_eta_split():
    eps, eta, big_b = 0.7, 0.1, 2.0
    validator = v.LossValidator(target=0.5, loss_bound=big_b, eta=eta)
    rng = _rng(5)
    for _ in range(50):
        result = validator.validate(big_b * _beta_losses(rng, 0.25, 300), epsilon=eps,
                                    noise=SeededNoise(rng=rng))
        s, n = result.details["dp_loss_sum"], result.n_test_dp
        # List. 2 line 3: ACCEPT (and REJECT) get (1 - conf)/2 = η/2.
        up = sla_bounds.sage_loss_upper_bound(s, n, epsilon=eps, eta=eta / 2, loss_bound=big_b)
        low = sla_bounds.sage_loss_lower_bound(s, n, epsilon=eps, eta=eta / 2, loss_bound=big_b)
        assert result.upper_bound == float(up["upper_bound"])
        assert result.lower_bound == float(low["lower_bound"])
        expected = (v.Outcome.ACCEPT if result.upper_bound <= 0.5 else
                    v.Outcome.REJECT if result.lower_bound > 0.5 else v.Outcome.RETRY)
        assert result.outcome is expected
        assert result.details["eta_accept"] == result.details["eta_reject"] == eta / 2


def test_upper_bound_never_below_lower_bound():
    rng, eps = _rng(2), 0.1
    n_dp = rng.uniform(-50, 5000, 100_000)
    s_dp = rng.uniform(-100, 3000, 100_000)
    up = sla_bounds.sage_loss_upper_bound(s_dp, n_dp, epsilon=eps, eta=0.025, loss_bound=1.0)
    low = sla_bounds.sage_loss_lower_bound(s_dp, n_dp, epsilon=eps, eta=0.025, loss_bound=1.0)
    assert np.all(up["upper_bound"] >= low["lower_bound"])  # ACCEPT and REJECT exclude each other


# ---------------------------------------------------------------------------------------------
# Monte Carlo: violation rates (ACCEPT although the expected loss is above the target).


def _violation_rates(total_loss_sums: np.ndarray, n: int, eps: float, eta: float, target: float,
                     rng: np.random.Generator) -> dict[str, float]:
    """P[ACCEPT] of each Tab. 2 validator, given the exact loss sums of independent test sets."""
    trials = total_loss_sums.size
    n_dp = n + rng.laplace(0, 2 / eps, trials)
    s_dp = total_loss_sums + rng.laplace(0, 2 / eps, trials)
    accepts = {
        v.NO_SLA: np.where(n_dp > 0, s_dp / n_dp, np.inf) <= target,
        v.NP_SLA: sla_bounds.np_loss_upper_bound(total_loss_sums, n, eta=eta / 2,
                                                 loss_bound=1.0) <= target,
        v.UC_DP_SLA: sla_bounds.uc_dp_loss_upper_bound(s_dp, n_dp, eta=eta / 2,
                                                       loss_bound=1.0) <= target,
        v.SAGE_SLA: sla_bounds.sage_loss_upper_bound(s_dp, n_dp, epsilon=eps, eta=eta / 2,
                                            loss_bound=1.0)["upper_bound"] <= target,
    }
    return {name: float(np.mean(a)) for name, a in accepts.items()}


@pytest.mark.parametrize("eta", [0.01, 0.05])
def test_violation_rate_bernoulli_losses(eta):
    """0/1 losses (the worst variance for a mean) with E[loss] = 0.101 > target 0.1."""
    n, eps, mu, target = 1000, 0.05, 0.101, 0.1
    rng = _rng(int(eta * 1000))
    sums = rng.binomial(n, mu, size=100_000).astype(float)
    rates = _violation_rates(sums, n, eps, eta, target, rng)
    assert rates[v.SAGE_SLA] <= eta
    assert rates[v.NP_SLA] <= eta
    assert rates[v.UC_DP_SLA] > 2 * eta  # without the correction, noise breaks the SLA
    assert rates[v.NO_SLA] > 0.4


def test_violation_rate_beta_losses():
    """Continuous losses ~ Beta with known mean 0.101 > target 0.1, 4000 test sets of 500."""
    n, eps, eta, mu, target = 500, 0.05, 0.05, 0.101, 0.1
    rng = _rng(42)
    sums = _beta_losses(rng, mu, (4000, n)).sum(axis=1)
    rates = _violation_rates(sums, n, eps, eta, target, rng)
    assert rates[v.SAGE_SLA] <= eta
    assert rates[v.UC_DP_SLA] > eta
    assert rates[v.UC_DP_SLA] > 5 * rates[v.SAGE_SLA]
    assert rates[v.NO_SLA] > 0.4


def test_reject_violation_rate():
    """REJECT although E[loss] = 0.099 ≤ target 0.1 happens with probability ≤ η/2."""
    n, eps, eta, mu, target = 20_000, 0.05, 0.05, 0.099, 0.1
    rng = _rng(9)
    sums = rng.binomial(n, mu, size=100_000).astype(float)
    n_dp = n + rng.laplace(0, 2 / eps, sums.size)
    s_dp = sums + rng.laplace(0, 2 / eps, sums.size)
    lower = sla_bounds.sage_loss_lower_bound(s_dp, n_dp, epsilon=eps, eta=eta / 2, loss_bound=1.0)
    assert np.mean(lower["lower_bound"] > target) <= eta / 2


# ---------------------------------------------------------------------------------------------
# Decisions.


def test_loss_accept_when_well_below_target():
    validator = v.LossValidator(target=0.2, loss_bound=1.0, eta=0.05, metric_name="mse")
    result = validator.validate(_beta_losses(_rng(), 0.1, 20_000), epsilon=0.5,
                                noise=SeededNoise(rng=_rng(1)))
    assert result.outcome is v.Outcome.ACCEPT
    assert result.lower_bound <= 0.1 <= result.upper_bound <= 0.2
    assert result.metric_name == "mse" and result.epsilon == 0.5 and result.delta == 0.0


def test_loss_reject_when_well_above_target():
    result = v.LossValidator(target=0.1, loss_bound=1.0, eta=0.05).validate(
        _beta_losses(_rng(), 0.3, 20_000), epsilon=0.5, noise=SeededNoise(rng=_rng(1)))
    assert result.outcome is v.Outcome.REJECT
    assert 0.1 < result.lower_bound <= 0.3


def test_loss_retry_when_evidence_is_thin():
    result = v.LossValidator(target=0.1, loss_bound=1.0, eta=0.05).validate(
        _beta_losses(_rng(), 0.1, 200), epsilon=0.5, noise=SeededNoise(rng=_rng(1)))
    assert result.outcome is v.Outcome.RETRY


def test_loss_retry_when_the_dp_count_is_not_positive():
    result = v.LossValidator(target=0.5, loss_bound=1.0, eta=0.05).validate(
        np.array([]), epsilon=0.01, noise=SeededNoise(rng=_rng(1)))
    assert result.outcome is v.Outcome.RETRY


def test_loss_with_b_not_one_and_clipping():
    big_b = 10.0
    losses = big_b * _beta_losses(_rng(), 0.1, 20_000)
    losses[:10] = [np.nan, np.inf, 1e9, -5.0, -np.inf, 50.0, 20.0, np.nan, 11.0, 12.0]
    validator = v.LossValidator(target=2.0, loss_bound=big_b, eta=0.05)
    result = validator.validate(losses, epsilon=1.0, noise=SeededNoise(rng=_rng(1)))
    assert result.outcome is v.Outcome.ACCEPT
    # NaN / too-large losses count as B; a single record moves the DP sum by at most B.
    rng_a, rng_b = _rng(3), _rng(3)
    a = validator.validate(np.array([np.nan, 1.0]), epsilon=1.0, noise=SeededNoise(rng=rng_a))
    b = validator.validate(np.array([big_b, 1.0]), epsilon=1.0, noise=SeededNoise(rng=rng_b))
    assert a.details["dp_loss_sum"] == b.details["dp_loss_sum"]


def test_more_data_or_budget_moves_retry_to_accept():
    """Privacy-adaptive training (§3.3): doubling n or ε eventually ACCEPTs a good model."""
    validator = v.LossValidator(target=0.12, loss_bound=1.0, eta=0.05)
    rng = _rng(4)
    outcomes = [
        validator.validate(_beta_losses(rng, 0.08, n), epsilon=0.1,
                           noise=SeededNoise(rng=rng)).outcome
                for n in (500, 1000, 2000, 4000, 8000, 16_000, 32_000)]
    assert outcomes[0] is v.Outcome.RETRY and outcomes[-1] is v.Outcome.ACCEPT


def test_accuracy_accept_reject_retry():
    validator = v.AccuracyValidator(target=0.8, eta=0.05)
    rng = _rng(6)
    good = validator.validate(rng.random(20_000) < 0.9, epsilon=0.5, noise=SeededNoise(rng=rng))
    bad = validator.validate(rng.random(20_000) < 0.7, epsilon=0.5, noise=SeededNoise(rng=rng))
    thin = validator.validate(rng.random(100) < 0.85, epsilon=0.5, noise=SeededNoise(rng=rng))
    assert good.outcome is v.Outcome.ACCEPT and good.lower_bound >= 0.8
    assert bad.outcome is v.Outcome.REJECT and bad.upper_bound < 0.8
    assert thin.outcome is v.Outcome.RETRY
    assert good.lower_bound <= good.dp_estimate <= good.upper_bound
    assert good.metric_name == "accuracy" and good.details["loss_bound"] == 1.0


def test_accuracy_is_the_loss_validator_on_the_error():
    correct = _rng(1).random(5000) < 0.85
    acc = v.AccuracyValidator(target=0.8, eta=0.05).validate(correct, epsilon=0.3,
                                                             noise=SeededNoise(rng=_rng(2)))
    loss = v.LossValidator(target=0.2, loss_bound=1.0, eta=0.05).validate(
        1.0 - correct, epsilon=0.3, noise=SeededNoise(rng=_rng(2)))
    assert acc.dp_estimate == pytest.approx(1 - loss.dp_estimate)
    assert acc.lower_bound == pytest.approx(1 - loss.upper_bound)
    assert acc.upper_bound == pytest.approx(1 - loss.lower_bound)
    assert acc.outcome is loss.outcome


def test_accuracy_violation_rate():
    """ACCEPT although expected accuracy 0.799 < target 0.8 is rare for Sage, not for UC DP."""
    n, eps, eta, acc, target, trials = 2000, 0.05, 0.05, 0.799, 0.8, 100_000
    rng = _rng(8)
    errors = rng.binomial(n, 1 - acc, size=trials).astype(float)
    rates = _violation_rates(errors, n, eps, eta, 1 - target, rng)
    assert rates[v.SAGE_SLA] <= eta < rates[v.UC_DP_SLA]


# ---------------------------------------------------------------------------------------------
# Sum-based statistic (DP mean).


def test_sum_statistic_accept_and_retry():
    validator = v.SumStatisticValidator(target=0.02, value_bound=1.0, eta=0.05)
    rng = _rng(12)
    small = validator.validate(rng.random(500), epsilon=0.5, noise=SeededNoise(rng=rng))
    large = validator.validate(rng.random(100_000), epsilon=0.5, noise=SeededNoise(rng=rng))
    assert small.outcome is v.Outcome.RETRY
    assert large.outcome is v.Outcome.ACCEPT
    assert abs(large.dp_estimate - 0.5) <= large.upper_bound <= 0.02
    low, high = large.details["mean_interval"]
    assert low <= 0.5 <= high


def test_sum_statistic_error_bound_covers():
    """|DP mean − μ| > the error bound with probability ≤ η (union of the three η/3 events)."""
    eps, eta, n, mu, trials = 0.2, 0.05, 2000, 0.3, 100_000
    validator = v.SumStatisticValidator(target=0.05, value_bound=1.0, eta=eta)
    rng = _rng(13)
    sums = rng.binomial(n, mu, size=trials).astype(float)
    n_dp = n + rng.laplace(0, 2 / eps, trials)
    s_dp = sums + rng.laplace(0, 2 / eps, trials)
    err = validator.error_bound(n_dp, epsilon=eps)
    assert np.mean(np.abs(s_dp / n_dp - mu) > err) <= eta
    assert np.mean((err <= 0.05) & (np.abs(s_dp / n_dp - mu) > 0.05)) <= eta


def test_sum_statistic_validate_release_is_post_processing():
    validator = v.SumStatisticValidator(target=0.05, value_bound=2.0, eta=0.05)
    released = validator.validate(2 * _rng().random(5000), epsilon=1.0,
                                  noise=SeededNoise(rng=_rng(1)))
    again = validator.validate_release(dp_sum=released.details["dp_sum"],
                                       dp_count=released.n_test_dp, epsilon=1.0)
    assert again == released
    assert validator.validate_release(dp_sum=10.0, dp_count=-3.0, epsilon=1.0).outcome \
        is v.Outcome.RETRY


# ---------------------------------------------------------------------------------------------
# Accounting: dp_event is exactly what validate consumes.


@pytest.mark.parametrize("epsilon", [0.01, 0.3, 1.0, 4.0])
@pytest.mark.parametrize("make", [
    lambda: v.LossValidator(target=0.1, loss_bound=7.0, eta=0.05),
    lambda: v.AccuracyValidator(target=0.9, eta=0.01),
    lambda: v.SumStatisticValidator(target=0.1, value_bound=3.0, eta=0.05),
    lambda: sla_baselines.UcDpSlaValidator(target=0.1, loss_bound=2.0, eta=0.05),
    lambda: sla_baselines.NoSlaValidator(target=0.1, loss_bound=2.0, eta=0.05),
])
def test_dp_event_epsilon_equals_validator_epsilon(make, epsilon):
    event = make().dp_event(epsilon)
    assert isinstance(event, dp_accounting.ComposedDpEvent)
    assert all(isinstance(e, dp_accounting.LaplaceDpEvent) for e in event.events)
    # Pure-DP composition of Laplace mechanisms: ε_i = sensitivity / scale = 1 / noise_multiplier.
    assert sum(1 / e.noise_multiplier for e in event.events) == pytest.approx(epsilon, rel=1e-12)
    accountant = pld.PLDAccountant()
    accountant.compose(event)
    assert accountant.get_epsilon(1e-12) == pytest.approx(epsilon, rel=1e-3)


def test_dp_event_roundtrips_and_np_sla_is_non_private():
    event = v.LossValidator(target=0.1, loss_bound=1.0, eta=0.05).dp_event(0.5)
    assert event_from_json(event_to_json(event)) == event  # what the ledger stores
    np_sla = sla_baselines.NpSlaValidator(target=0.1, loss_bound=1.0, eta=0.05)
    assert isinstance(np_sla.dp_event(0.5), dp_accounting.NonPrivateDpEvent)
    accountant = pld.PLDAccountant()
    accountant.compose(np_sla.dp_event())
    assert accountant.get_epsilon(1e-6) == math.inf
    result = np_sla.validate(_beta_losses(_rng(), 0.05, 20_000))
    assert result.epsilon == math.inf and result.details["non_private"] is True
    assert result.outcome is v.Outcome.ACCEPT


def test_epsilon_is_not_clamped():
    tiny = 1e-9
    result = v.LossValidator(target=0.1, loss_bound=1.0, eta=0.05).validate(
        np.zeros(10), epsilon=tiny, noise=SeededNoise(rng=_rng()))
    assert result.epsilon == tiny and result.details["count_noise_scale"] == 2 / tiny
    assert result.outcome is v.Outcome.RETRY


# ---------------------------------------------------------------------------------------------
# Tab. 2 baselines.


@pytest.mark.parametrize("metric,target", [("loss", 0.3), ("accuracy", 0.6)])
def test_tab2_validators(metric, target):
    validators = sla_baselines.tab2_validators(metric=metric, target=target, eta=0.05)
    assert tuple(validators) == sla_baselines.TAB2_SLAS == ("No SLA", "NP SLA",
                                                            "UC DP SLA", "Sage SLA")
    rng = _rng(21)
    values = (rng.random(50_000) < 0.8).astype(float) if metric == "accuracy" else \
        _beta_losses(rng, 0.2, 50_000)
    for name, validator in validators.items():
        result = validator.validate(values, epsilon=1.0, noise=SeededNoise(rng=_rng(1)))
        assert result.details["sla"] == name
        assert result.outcome is v.Outcome.ACCEPT, name
    thin = values[:50]
    for name in (v.NP_SLA, v.UC_DP_SLA, v.SAGE_SLA):
        assert validators[name].validate(thin, epsilon=1.0,
                                         noise=SeededNoise(rng=_rng(1))).outcome \
            is not v.Outcome.ACCEPT


def test_no_sla_uses_the_uncorrected_dp_metric():
    validator = sla_baselines.NoSlaValidator(target=0.1, loss_bound=1.0, eta=0.05)
    result = validator.validate(_beta_losses(_rng(), 0.09, 300), epsilon=1.0,
                                noise=SeededNoise(rng=_rng(1)))
    assert result.upper_bound == result.dp_estimate
    assert result.outcome is (v.Outcome.ACCEPT if result.dp_estimate <= 0.1 else v.Outcome.RETRY)


# ---------------------------------------------------------------------------------------------
# Bad arguments.

_BAD_EPSILONS = [0, 0.0, -1.0, math.nan, math.inf, -math.inf, "1", None, True]


@pytest.mark.parametrize("epsilon", _BAD_EPSILONS)
@pytest.mark.parametrize("make", [
    lambda: v.LossValidator(target=0.1, loss_bound=1.0, eta=0.05),
    lambda: v.AccuracyValidator(target=0.9, eta=0.05),
    lambda: v.SumStatisticValidator(target=0.1, value_bound=1.0, eta=0.05),
    lambda: sla_baselines.UcDpSlaValidator(target=0.1, eta=0.05),
])
def test_bad_epsilon(make, epsilon):
    validator = make()
    with pytest.raises(InvalidPrivacyParameterError):
        validator.validate(np.ones(10), epsilon=epsilon, noise=SeededNoise(rng=_rng()))
    with pytest.raises(InvalidPrivacyParameterError):
        validator.dp_event(epsilon)


@pytest.mark.parametrize("eta", [0, 0.0, 1, 1.0, -0.05, 1.5, math.nan, math.inf, "0.05", None])
@pytest.mark.parametrize("make", [
    lambda eta: v.LossValidator(target=0.1, loss_bound=1.0, eta=eta),
    lambda eta: v.AccuracyValidator(target=0.9, eta=eta),
    lambda eta: v.SumStatisticValidator(target=0.1, value_bound=1.0, eta=eta),
    lambda eta: sla_baselines.NpSlaValidator(target=0.1, eta=eta),
])
def test_bad_eta(make, eta):
    with pytest.raises(ValueError):
        make(eta)


@pytest.mark.parametrize("bound", [0, 0.0, -1.0, math.nan, math.inf, None, "1"])
def test_bad_bound(bound):
    with pytest.raises(ValueError):
        v.LossValidator(target=0.1, loss_bound=bound, eta=0.05)
    with pytest.raises(ValueError):
        v.SumStatisticValidator(target=0.1, value_bound=bound, eta=0.05)


@pytest.mark.parametrize("make", [
    lambda: v.LossValidator(target=-0.1, loss_bound=1.0, eta=0.05),
    lambda: v.LossValidator(target=math.nan, loss_bound=1.0, eta=0.05),
    lambda: v.AccuracyValidator(target=1.5, eta=0.05),
    lambda: v.AccuracyValidator(target=-0.1, eta=0.05),
    lambda: v.SumStatisticValidator(target=0.0, value_bound=1.0, eta=0.05),
    lambda: sla_baselines.NoSlaValidator(target=0.9, eta=0.05, metric="accuracy", loss_bound=2.0),
    lambda: sla_baselines.NoSlaValidator(target=0.9, eta=0.05, metric="f1"),
    lambda: sla_baselines.tab2_validators(metric="accuracy", target=0.9, eta=0.05, loss_bound=2.0),
])
def test_bad_target_or_metric(make):
    with pytest.raises(ValueError):
        make()


def test_privacy_errors_are_value_errors():
    assert issubclass(InvalidPrivacyParameterError, ValueError)


@pytest.mark.parametrize("values", [np.ones((3, 2)), 1.0])
def test_values_must_be_one_dimensional(values):
    with pytest.raises(ValueError):
        v.LossValidator(target=0.1, loss_bound=1.0, eta=0.05).validate(
            values, epsilon=1.0, noise=SeededNoise(rng=_rng()))
    with pytest.raises(ValueError):
        v.AccuracyValidator(target=0.9, eta=0.05).validate(values, epsilon=1.0,
                                                           noise=SeededNoise(rng=_rng()))


@pytest.mark.parametrize("noise", [0, np.random.default_rng(0), np.random.RandomState(0)])
def test_noise_must_be_a_noise_source(noise):
    with pytest.raises(TypeError):
        v.LossValidator(target=0.1, loss_bound=1.0, eta=0.05).validate(
            np.ones(3), epsilon=1.0, noise=noise)


def test_validate_release_rejects_non_finite_release():
    validator = v.SumStatisticValidator(target=0.1, value_bound=1.0, eta=0.05)
    with pytest.raises(ValueError):
        validator.validate_release(dp_sum=math.nan, dp_count=10.0, epsilon=1.0)
    with pytest.raises(InvalidPrivacyParameterError):
        validator.validate_release(dp_sum=1.0, dp_count=10.0, epsilon=0.0)


# ---------------------------------------------------------------------------------------------
# Per-block releases (query-level accounting, Fig. 7): the correction for a sum of k Laplaces.


def test_laplace_sum_tail_k1_is_the_laplace_tail_and_k2_matches_closed_form():
    for eta in (0.05 / 6, 0.2):
        assert sla_bounds.laplace_sum_upper_tail(3.0, 1, eta) == pytest.approx(
            float(sla_bounds.laplace_upper_tail(3.0, eta)), rel=1e-15)
        # Sum of two unit Laplaces: P[S > t] = (2 + t)·exp(−t)/4.
        t = float(sla_bounds.laplace_sum_upper_tail(1.0, 2, eta))
        assert (2 + t) * math.exp(-t) / 4 == pytest.approx(eta, rel=1e-7)
        assert (2 + t) * math.exp(-t) / 4 <= eta  # rounded towards the safe side


@pytest.mark.parametrize("k", [3, 16, 300])
def test_laplace_sum_tail_fails_with_probability_eta(k):
    rng, trials, eta, scale = _rng(k), 60_000, 0.02, 2.5
    t = float(sla_bounds.laplace_sum_upper_tail(scale, k, eta))
    sums = np.zeros(trials)
    for _ in range(k):  # chunked to keep memory small for large k
        sums += rng.laplace(0.0, scale, trials)
    tol = 5 * math.sqrt(eta * (1 - eta) / trials)
    assert np.mean(sums > t) == pytest.approx(eta, abs=tol)
    # Tighter than the union bound k·scale·ln(k/(2η)) and larger than one draw's tail.
    assert scale * math.log(1 / (2 * eta)) < t < k * scale * math.log(k / (2 * eta))


def test_laplace_sum_tail_vectorized_and_rejects_bad_input():
    got = sla_bounds.laplace_sum_upper_tail(np.array([1.0, 2.0, 2.0]), np.array([1, 4, 4]), 0.01)
    assert got[1] == got[2] == pytest.approx(
        2 * float(sla_bounds.laplace_sum_upper_tail(1.0, 4, 0.01)))
    assert np.all(np.diff([float(sla_bounds.laplace_sum_upper_tail(1.0, k, 0.01))
                           for k in (1, 2, 4, 8, 64)]) > 0)
    for bad_k in (0, 2.5, -1):
        with pytest.raises(ValueError):
            sla_bounds.laplace_sum_upper_tail(1.0, bad_k, 0.01)
    for bad_eta in (0.0, 0.5, float("nan")):
        with pytest.raises(ValueError):
            sla_bounds.laplace_sum_upper_tail(1.0, 2, bad_eta)


def test_sage_bound_for_per_block_releases_needs_the_k_correction():
    """With k per-block releases the k-aware bound keeps its η/3 failure rates; the one-release
    correction applied to the same summed noise fails far more often."""
    rng, trials, eps, eta, k = _rng(21), 200_000, 0.5, 0.05, 16
    n, true_sum = 4000, 900.0
    n_dp = n + rng.laplace(0, 2 / eps, (trials, k)).sum(axis=1)
    sum_dp = true_sum + rng.laplace(0, 2 / eps, (trials, k)).sum(axis=1)
    tol = 5 * math.sqrt((eta / 3) * (1 - eta / 3) / trials)
    good = sla_bounds.sage_loss_upper_bound(sum_dp, n_dp, epsilon=eps, eta=eta,
                                            loss_bound=1.0, blocks=k)
    assert np.mean(good["n_test_dp_min"] > n) == pytest.approx(eta / 3, abs=tol)
    assert np.mean(good["corrected_dp_loss_sum"] < true_sum) == pytest.approx(eta / 3, abs=tol)
    naive = sla_bounds.sage_loss_upper_bound(sum_dp, n_dp, epsilon=eps, eta=eta, loss_bound=1.0)
    assert np.mean(naive["corrected_dp_loss_sum"] < true_sum) > 5 * eta / 3
    same = sla_bounds.sage_loss_upper_bound(sum_dp, n_dp, epsilon=eps, eta=eta,
                                            loss_bound=1.0, blocks=1)
    np.testing.assert_array_equal(same["upper_bound"], naive["upper_bound"])
