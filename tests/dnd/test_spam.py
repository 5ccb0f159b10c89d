"""The calibrated spam check: ≥ 99 % of honest updates (real client updates on real data) pass,
shifted and scaled models are caught; the paper's μ ± 3s rule rejects most honest updates."""
import random

import numpy as np
import pytest
from sklearn.datasets import load_digits

from sage_tfx.dnd import (ClientConfig, DnDState, GLMSpec, SpamCheck, client_update,
                          initial_instances, paper_rule)
from sage_tfx.dnd.spam import calibrate
from sage_tfx.dp.noise import SeededNoise


def _trained_state(spec, cfg, x, y, updates, seed=0):
    rng = np.random.default_rng(seed)
    state = DnDState(initial_instances(np.zeros(spec.dim), 20, cfg.noise_variance, rng),
                     rng=random.Random(seed))
    noise = SeededNoise(seed)
    for _ in range(updates):
        idx = rng.choice(len(y), 10, replace=False)
        t, w = state.draw()
        state.discard(t, client_update(spec, w, x[idx], y[idx], cfg, noise=noise))
    return state


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits(return_X_y=True)
    return x / 16.0, y


def _config(unit, epsilon, gamma=0.05):
    if unit == "gaussian":  # L2 clip 3: the gradients' own L2 norm at this scale (no clipping)
        return ClientConfig(gamma=gamma, epsilon=epsilon, unit=unit, delta=1e-6, l2_norm_clip=3.0)
    return ClientConfig(gamma=gamma, l1_norm_clip=1.0, epsilon=epsilon, unit=unit)


@pytest.mark.parametrize("unit,epsilon", [("model", 1.0), ("feature", float(np.log(32))),
                                          ("gaussian", 8.0), ("gaussian", 1.0)])
def test_honest_updates_pass_and_malicious_ones_are_caught(digits, unit, epsilon):
    x, y = digits
    spec = GLMSpec("multinomial", 64, 10)  # 650 weights
    cfg = _config(unit, epsilon)
    state = _trained_state(spec, cfg, x, y, 300)
    check = SpamCheck.for_config(cfg)
    rng = np.random.default_rng(7)
    noise = SeededNoise(7)
    inst = state.instances_view()

    def honest():
        idx = rng.choice(len(y), 10, replace=False)
        return client_update(spec, inst[rng.integers(20)], x[idx], y[idx], cfg, noise=noise)
    passed = np.mean([check(inst, honest()) for _ in range(1000)])
    assert passed >= 0.99
    assert np.mean([paper_rule(inst, honest()) for _ in range(200)]) < 0.5
    mu, sd = inst.mean(axis=0), inst.std(axis=0, ddof=1)
    # In the feature unit every weight may honestly move by γC (≈ 1.7 noise scales here), so the
    # max-|z| threshold is wider and a sparse push must be larger to be caught.
    push = 20 if unit == "feature" else 10
    attacks = {
        "shift every weight by 1 s": lambda u: u + sd,
        "scale the deviation by 3": lambda u: mu + 3 * (u - mu),
        "double the model": lambda u: 2 * u,
        f"push 10 weights by {push} s": lambda u: u + np.where(
            np.arange(u.size) < 10, push * sd, 0),
    }
    for name, attack in attacks.items():
        caught = np.mean([not check(inst, attack(honest())) for _ in range(100)])
        assert caught >= 0.95, name


def test_calibration_needs_a_spread_and_a_noise_scale():
    with pytest.raises(ValueError):
        calibrate(np.zeros((5, 3)), 1.0)
    with pytest.raises(ValueError):
        SpamCheck(0.0)
    with pytest.raises(ValueError):
        calibrate(np.random.default_rng(0).normal(size=(1, 3)), 1.0)


def test_live_state_passes_honest_training_updates(digits):
    """The check inside the state, thresholds recalibrated every 10 updates while the model
    trains: ≥ 99 % of honest updates accepted."""
    x, y = digits
    spec = GLMSpec("multinomial", 64, 10)
    cfg = ClientConfig(gamma=0.05, l1_norm_clip=1.0, epsilon=1.0)
    rng = np.random.default_rng(1)
    check = SpamCheck.for_config(cfg)
    state = DnDState(initial_instances(np.zeros(spec.dim), 20, cfg.noise_variance, rng),
                     spam_check=check, rng=random.Random(1))
    noise = SeededNoise(1)
    for _ in range(1500):
        idx = rng.choice(len(y), 10, replace=False)
        t, w = state.draw()
        state.discard(t, client_update(spec, w, x[idx], y[idx], cfg, noise=noise))
    assert state.accepted >= 0.99 * 1500, check.failures


def test_copies_of_instances_are_rejected_and_collapsed_instances_do_not_crash():
    """A client that returns the drawn model unchanged (no noise) would collapse the spread
    towards Lemma 1's worst case: the check rejects near-copies, and refuses (never raises) if
    the instances ever collapse."""
    cfg = ClientConfig(gamma=0.01, l1_norm_clip=1.0, epsilon=1.0)
    check = SpamCheck.for_config(cfg)
    state = DnDState(initial_instances(np.zeros(200), 10, cfg.noise_variance,
                                       np.random.default_rng(0)), spam_check=check)
    for _ in range(50):
        t, w = state.draw()
        assert not state.discard(t, w + 1e-3 * cfg.noise_scale)
    assert check.failures["copy"] == 50 and state.accepted == 0
    collapsed = DnDState(np.zeros((10, 200)), spam_check=SpamCheck.for_config(cfg))
    t, w = collapsed.draw()
    assert not collapsed.discard(t, w + 1.0)
    assert collapsed.spam_check.failures["degenerate"] == 1
