"""ptklib kernels: declared events against dp_accounting, noise scales, ERM exactness."""
import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ptk.abstraction import (PrivacyCharge, UnaccountableEventError, batches_of,
                                      check_charge)
from sage_tfx.ptk.registry import UnknownPTKTypeError, default_registry
from sage_tfx.ptk.kernels import covariance, histstats

from ptk_data import CV_CONFIG, HS, HS_CONFIG, test_registry, window


class Recorder:
    """A noise source that records every scale it is asked for (and adds no noise)."""

    def __init__(self):
        self.calls = []

    def laplace(self, v, scale):
        self.calls.append(("laplace", scale))
        return np.asarray(v, dtype=float)

    def discrete_laplace(self, v, scale):
        self.calls.append(("discrete_laplace", scale))
        return np.asarray(v)

    def gaussian(self, v, sigma):
        self.calls.append(("gaussian", sigma))
        return np.asarray(v, dtype=float)


def test_histstats_noise_scales_match_declared_event():
    rec = Recorder()
    histstats.train_dp(batches_of(window(500, 1)), 0.4, None, None, config=HS_CONFIG, noise=rec)
    # counts: sensitivity 1, eps/2 -> scale 2/eps; centred sums: sensitivity (hi-lo)/2, eps/2
    assert rec.calls == [("discrete_laplace", 2 / 0.4), ("laplace", 10.0 / 0.4)]
    ev = histstats.dp_event(0.4, HS_CONFIG).event
    # dp_accounting's Laplace events are sensitivity-1: eps = 1/noise_multiplier each
    assert sum(1 / e.noise_multiplier for e in ev.events) == pytest.approx(0.4)
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(ev)
    assert pld.get_epsilon(1e-9) == pytest.approx(0.4, abs=0.01)


def test_histstats_empirical_noise_std_matches_formula():
    data = window(400, 2)
    eps, draws = 0.5, []
    noise = SeededNoise(3)
    for _ in range(400):
        s = histstats.train_dp(batches_of(data), eps, None, None, config=HS_CONFIG, noise=noise)
        draws.append(s["counts"][0])
    true = float(np.sum(data["city"] == "a"))
    b = 2 / eps
    # discrete Laplace with scale b: variance 2 e^{-1/b} / (1 - e^{-1/b})^2 ≈ 2 b^2
    var = 2 * np.exp(-1 / b) / (1 - np.exp(-1 / b)) ** 2
    assert np.mean(draws) == pytest.approx(true, abs=4 * np.sqrt(var / 400))
    assert np.std(draws) == pytest.approx(np.sqrt(var), rel=0.15)


def test_histstats_erm_is_the_exact_minimiser():
    data = window(800, 4)
    erm = histstats.erm(batches_of(data), config=HS_CONFIG)
    best = histstats.eval(batches_of(data), erm, config=HS_CONFIG).mean()
    for shift in (-0.05, 0.05):
        moved = dict(erm, means=[m + shift for m in erm["means"]])
        assert histstats.eval(batches_of(data), moved, config=HS_CONFIG).mean() > best


def test_covariance_sigma_is_calibrated_by_dp_accounting_and_tight():
    from dp_accounting.pld import privacy_loss_mechanism as plm
    sigma = covariance.gaussian_sigma(0.5, 1e-7)
    def delta_at(s):
        return plm.GaussianPrivacyLoss(s, sensitivity=1.0).get_delta_for_epsilon(0.5)
    assert delta_at(sigma) <= 1e-7 < delta_at(sigma * 0.999)
    # the PLD accountant (a pessimistic discretisation) agrees to within 1 %
    a = dp_accounting.pld.PLDAccountant()
    a.compose(dp_event_lib.GaussianDpEvent(sigma))
    assert a.get_epsilon(1e-7) == pytest.approx(0.5, rel=0.01)
    # and the classical bound sqrt(2 ln(1.25/δ))/ε is looser (larger σ) for ε < 1
    assert sigma < np.sqrt(2 * np.log(1.25 / 1e-7)) / 0.5
    rec = Recorder()
    covariance.train_dp(batches_of(window(300, 5)), 0.5, None, None, config=CV_CONFIG, noise=rec)
    assert rec.calls == [("gaussian", sigma)]


def test_covariance_finds_the_dominant_direction_and_losses_are_bounded():
    data = window(3000, 6)
    s = covariance.train_dp(batches_of(data), 1.0, None, None, config=CV_CONFIG,
                            noise=SeededNoise(1))
    v = np.abs(np.asarray(s["components"])[:, 0])
    assert v[0] > 0.6 and v[1] > 0.6 and v[2] < 0.2
    losses = covariance.eval(batches_of(data), s, config=CV_CONFIG)
    assert losses.min() >= 0 and losses.max() <= 1
    erm = covariance.erm(batches_of(data), config=CV_CONFIG)
    assert covariance.eval(batches_of(data), erm, config=CV_CONFIG).mean() <= losses.mean() + 1e-12


def test_unregistered_types_and_bad_events_are_refused():
    reg = default_registry()
    for name in ("no_such_pkg.mod:fn", "sage_tfx.ptk.kernels.histstats:train_dp", "nope",
                 "not a name", "", None, 3):
        with pytest.raises(UnknownPTKTypeError):
            reg.get(name)
    with pytest.raises(UnaccountableEventError):
        check_charge(PrivacyCharge(dp_event_lib.UnsupportedDpEvent(), 1.0))
    with pytest.raises(UnaccountableEventError):  # declares eps 0.1 but spends 0.5
        check_charge(PrivacyCharge(dp_event_lib.LaplaceDpEvent(2.0), 0.1))
    with pytest.raises(UnaccountableEventError):  # Gaussian spends more than charged
        check_charge(PrivacyCharge(dp_event_lib.GaussianDpEvent(1.0), 0.5, 1e-6))
    with pytest.raises(InvalidRequestError):
        reg.get(HS).charge(0.1, {"key": "x"})


def test_eval_outside_unit_interval_is_an_error():
    t = test_registry().get("hist_bad_eval")
    with pytest.raises(InvalidRequestError, match=r"outside \[0, 1\]"):
        t.eval([{"v": np.array([2.0])}], None, config={})


def test_histstats_count_release_empirical_audit():
    """Neighbouring windows (one extra record of key 'a'): the released count of 'a' must have
    log P(k | D) / P(k | D') within eps/2 (its share); a mechanism with half the noise (eps)
    would fail this bound."""
    cfg = {"key": "k", "domain": ["a", "b"], "value": "v", "lower": 0.0, "upper": 1.0}
    d = {"k": np.array(["a"] * 5 + ["b"] * 5), "v": np.full(10, 0.5)}
    d2 = {k: np.append(v, ["a"] if k == "k" else [0.5]) for k, v in d.items()}
    noise, runs, eps = SeededNoise(7), 8000, 1.0
    draws = [np.array([histstats.train_dp([x], eps, None, None, config=cfg, noise=noise)
                       ["counts"][0] for _ in range(runs)]) for x in (d, d2)]
    worst = 0.0
    for k in range(3, 9):  # the well-populated bins around the true counts 5 and 6
        p, q = np.mean(draws[0] == k), np.mean(draws[1] == k)
        worst = max(worst, abs(np.log(p / q)))
    assert 0.3 < worst < 0.75  # true value eps/2 = 0.5; a broken scale 2/eps -> 1/eps gives 1.0
