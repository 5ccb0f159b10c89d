"""The gaussian unit's step rule: η = γC₂ = D/√((T/k)(1 + 4m²d)) and C₂ = 0.25 by default, what
the user sets kept, the charge untouched, and the premise (with the clip active only γC₂
matters) on a real client update. Full runs: benchmarks/dnd/steprule.py."""
import math
import types

import numpy as np
import pytest

from sage_tfx.dnd import ClientConfig, GLMSpec, client_update
from sage_tfx.dnd.server import _config_of
from sage_tfx.dnd.steprule import (L2_NORM_CLIP, STEP_DISTANCE, gaussian_config, gaussian_step,
                                   step_size)
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError


def test_step_size_is_the_formula_and_scales_as_it_says():
    m, d, k, t = 0.65, 650, 10, 10 ** 6
    eta = step_size(d, m, k, t)
    assert eta == pytest.approx(STEP_DISTANCE / math.sqrt(t / k * (1 + 4 * m * m * d)))
    assert 0.002 < eta < 0.003  # digits at ε = 8, δ = 1e-6, 10⁶ updates (the fitted point)
    assert step_size(4 * d, m, k, t) == pytest.approx(eta / 2, rel=1e-3)  # noise grows as √d
    assert step_size(d, m, k, 4 * t) == pytest.approx(eta / 2)  # longer lineages
    assert step_size(d, m, 4 * k, t) == pytest.approx(2 * eta)  # k lineages share T
    assert step_size(d, 2 * m, k, t) == pytest.approx(eta / 2, rel=1e-3)


def test_defaults_fill_only_what_the_user_left_out():
    m, d, k, t = 0.65, 7850, 10, 10 ** 6
    eta = step_size(d, m, k, t)
    s = gaussian_step(d, m, k, t)
    assert s.l2_norm_clip == L2_NORM_CLIP and s.eta == pytest.approx(eta)
    assert gaussian_step(d, m, k, t, l2_norm_clip=0.5).gamma == pytest.approx(eta / 0.5)
    assert gaussian_step(d, m, k, t, gamma=0.01) == type(s)(0.01, L2_NORM_CLIP)
    assert gaussian_step(d, m, k, t, gamma=0.01, l2_norm_clip=2.0) == type(s)(0.01, 2.0)


def test_the_rule_leaves_the_charge_alone():
    a = gaussian_config(epsilon=8.0, delta=1e-6, dim=650, k=10, updates=10 ** 6)
    b = ClientConfig(0.002, epsilon=8.0, unit="gaussian", delta=1e-6, l2_norm_clip=2.0)
    assert a.update_event(650) == b.update_event(650)
    assert (a.update_epsilon(650), a.update_delta(650)) == (8.0, 1e-6)
    assert a.gamma * a.l2_norm_clip == pytest.approx(step_size(650, a.noise_multiplier, 10,
                                                               10 ** 6))


@pytest.mark.parametrize("kwargs,error", [
    (dict(dim=0), ValueError), (dict(updates=0), ValueError), (dict(k=1.5), ValueError),
    (dict(noise_multiplier=float("nan")), InvalidPrivacyParameterError),
    (dict(noise_multiplier=-1.0), InvalidPrivacyParameterError)])
def test_bad_input_is_refused(kwargs, error):
    args = dict(dim=650, noise_multiplier=0.65, k=10, updates=1000) | kwargs
    with pytest.raises(error):
        step_size(**args)
    with pytest.raises(InvalidPrivacyParameterError):
        gaussian_step(650, 0.65, 10, 1000, l2_norm_clip=0.0)


def test_with_the_clip_active_only_gamma_times_clip_matters():
    """Two configurations of equal γC₂, both clipping this client's gradient: the same update,
    noise included (seeded noise at the config's σ = 2mγC₂)."""
    spec = GLMSpec("multinomial", 64, 10)
    rng = np.random.default_rng(0)
    x, y, w = rng.uniform(size=(10, 64)), rng.integers(0, 10, size=10), np.zeros(spec.dim)
    assert np.linalg.norm(spec.gradient(w, x, y)) > 0.5
    out = [client_update(spec, w, x, y, ClientConfig(g, epsilon=8.0, unit="gaussian", delta=1e-6,
                                                     l2_norm_clip=c), noise=SeededNoise(1))
           for g, c in ((0.01, 0.25), (0.005, 0.5))]
    assert np.allclose(out[0], out[1], rtol=0, atol=1e-15)


def test_serve_takes_the_rule_when_gamma_is_not_given():
    a = types.SimpleNamespace(unit="gaussian", gamma=None, l2_norm_clip=None, epsilon=8.0,
                              delta=1e-6, k=10, planned_updates=10 ** 6, l1_norm_clip=1.0)
    cfg = _config_of(a, 650)
    assert cfg.l2_norm_clip == L2_NORM_CLIP
    assert cfg.gamma * cfg.l2_norm_clip == pytest.approx(step_size(650, cfg.noise_multiplier,
                                                                   10, 10 ** 6))
    with pytest.raises(InvalidRequestError, match="planned-updates"):
        _config_of(types.SimpleNamespace(**(vars(a) | {"planned_updates": None})), 650)
    with pytest.raises(InvalidRequestError, match="gamma"):
        _config_of(types.SimpleNamespace(**(vars(a) | {"unit": "model", "delta": None})), 650)
