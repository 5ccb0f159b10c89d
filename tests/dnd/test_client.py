"""Alg. 1: the noise is what the formula says, the cost is what the unit really costs, and an
empirical audit bounds the update's ε (and catches a mechanism with half the noise)."""
import numpy as np
import pytest
from dp_accounting import dp_event as dp_event_lib
from dp_accounting.rdp import rdp_privacy_accountant

from sage_tfx.dnd import ClientConfig, GLMSpec, client_update
from sage_tfx.dnd.client import check_update_matches_ledger_epsilon, clip_gradient
from sage_tfx.dnd.budget import run_epsilon, run_event
from sage_tfx.dp.audit import clopper_pearson, epsilon_lower_bound
from sage_tfx.dp.noise import laplace_epsilon
from sage_tfx.errors import InvalidPrivacyParameterError


@pytest.mark.parametrize("unit", ["model", "feature"])
def test_noise_variance_matches_8_gamma2_c2_over_eps2(unit):
    """Per-weight variance of the noise of a real update = the sampler's, ≤ 3.6 % above
    8γ²C²/ε² (both units)."""
    spec = GLMSpec("logistic", 29_999)
    cfg = ClientConfig(gamma=0.05, l1_norm_clip=0.5, epsilon=0.8, unit=unit)
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(10, spec.n_features))
    y = rng.integers(0, 2, size=10).astype(float)
    w = rng.normal(size=spec.dim)
    exact = client_update(spec, w, x, y, ClientConfig(0.05, 0.5, None, unit))
    noisy = client_update(spec, w, x, y, cfg)
    resid = noisy - exact
    formula = 8 * 0.05 ** 2 * 0.5 ** 2 / 0.8 ** 2
    assert cfg.noise_variance == pytest.approx(formula)
    sampler = cfg.sampler_std(spec.dim) ** 2
    assert formula <= sampler <= formula * 1.036
    # Laplace kurtosis 6: the sample variance of n draws has relative sd sqrt(5/n) ≈ 1.3 %.
    assert np.var(resid) == pytest.approx(sampler, rel=0.05)
    assert abs(np.mean(resid)) < 5 * np.sqrt(formula / resid.size)


def test_model_unit_clips_in_l1_and_feature_unit_per_coordinate():
    g = np.array([3.0, -1.0, 0.0, 0.5])
    m = clip_gradient(g, ClientConfig(0.1, 1.5, 1.0, "model"))
    assert np.allclose(m, g * 1.5 / 4.5)  # ||g||₁ = 4.5 scaled to C = 1.5, direction kept
    small = np.array([0.2, -0.3])
    assert np.array_equal(clip_gradient(small, ClientConfig(0.1, 1.5, 1.0)), small)
    f = clip_gradient(g, ClientConfig(0.1, 1.0, 1.0, "feature"))
    assert np.allclose(f, [1.0, -1.0, 0.0, 0.5])


def test_feature_unit_is_charged_what_it_really_costs():
    """The paper's per-coordinate mode: ε per weight is d·ε for the model; the sampler's proved ε
    is at most that and OpenDP's map (the reference) agrees."""
    dim = 387
    paper = ClientConfig(gamma=0.001, l1_norm_clip=1.0, epsilon=np.log(32), unit="feature")
    assert paper.noise_scale == pytest.approx(2 * 0.001 / np.log(32))  # Alg. 1's L(0, 2γ/ε)
    assert paper.update_epsilon(dim) == pytest.approx(dim * np.log(32))
    assert dim * np.log(32) * (1 - 1e-3) <= check_update_matches_ledger_epsilon(paper, dim) \
        <= dim * np.log(32)
    assert laplace_epsilon(paper.noise_scale, paper.l1_sensitivity(dim)) == pytest.approx(
        dim * np.log(32))
    model = ClientConfig(gamma=0.001, l1_norm_clip=1.0, epsilon=np.log(32))
    assert np.log(32) * (1 - 1e-3) <= check_update_matches_ledger_epsilon(model, dim) \
        <= np.log(32)


@pytest.mark.parametrize("unit", ["model", "feature"])
def test_run_event_epsilon_equals_basic_cost_per_dp_accounting(unit):
    cfg = ClientConfig(gamma=0.01, l1_norm_clip=1.0, epsilon=0.3, unit=unit)
    dim, passes = 7, 4
    assert run_epsilon(cfg, dim,
                       passes) == pytest.approx(passes * 0.3 * (dim if unit == "feature" else 1))
    event = run_event(cfg, dim, passes)
    assert isinstance(event, dp_event_lib.SelfComposedDpEvent)
    # At a very high RDP order the Laplace curve reaches its pure-DP ε: the composed event's ε at
    # tiny δ is the basic cost plus the conversion term log(1/δ)/(α − 1).
    acc = rdp_privacy_accountant.RdpAccountant(orders=[1e4])
    acc.compose(event)
    basic = run_epsilon(cfg, dim, passes)
    eps = acc.get_epsilon(1e-100)
    assert basic - 1e-3 <= eps <= basic + np.log(1e100) / (1e4 - 1) + 1e-6


def test_bad_parameters_raise():
    with pytest.raises(InvalidPrivacyParameterError):
        ClientConfig(gamma=0.1, epsilon=0.0)
    with pytest.raises(ValueError):
        ClientConfig(gamma=-0.1)
    with pytest.raises(ValueError):
        ClientConfig(gamma=0.1, unit="weight")
    with pytest.raises(InvalidPrivacyParameterError):
        ClientConfig(gamma=0.1, epsilon=None).update_epsilon(3)
    spec = GLMSpec("logistic", 2)
    cfg = ClientConfig(gamma=0.1)
    with pytest.raises(ValueError, match="normalised"):
        client_update(spec, np.zeros(3), np.array([[2.0, 0.0]]), np.array([1.0]), cfg)
    with pytest.raises(ValueError, match="N_c"):
        client_update(spec, np.zeros(3), np.zeros((0, 2)), np.zeros(0), cfg)


def _audit(samples):
    """Adjacent clients whose clipped gradients are ±C on the intercept (the worst case)."""
    spec = GLMSpec("logistic", 2)
    cfg = ClientConfig(gamma=0.2, l1_norm_clip=0.5, epsilon=1.0)
    x = np.zeros((1, 2))  # only the intercept moves: gradient (ŷ − y)·e₀ = ±0.5 e₀ at w = 0
    w = np.zeros(3)

    def hits(y):
        out = np.array([client_update(spec, w, x, np.array([y]), cfg) for _ in range(samples)])
        return int(np.count_nonzero(out[:, 0] < -0.1))
    # D (y = 0) moves the intercept down by γ/2, D' (y = 1) up by γ/2: S = {B₀ < −γ/2}.
    # Clopper–Pearson at confidence 1 − α overall (α/2 on each side); S's ratio is exactly e^ε,
    # so a correct mechanism exceeds ε with probability ≤ α/2: α = 1e-3 keeps that a non-event.
    return epsilon_lower_bound(hits(0.0), samples, hits(1.0), samples, alpha=1e-3)


def test_empirical_audit_lower_bound_is_below_epsilon():
    eps_lower = _audit(3000)
    assert eps_lower <= 1.0
    assert eps_lower > 0.6  # the audit is tight enough to see most of ε = 1


def test_empirical_audit_catches_half_the_noise(monkeypatch):
    """A broken mechanism that uses sensitivity γC instead of 2γC (half the scale) is caught."""
    monkeypatch.setattr(ClientConfig, "sensitivity_per_weight",
                        property(lambda self: self.gamma * self.clip))
    assert _audit(3000) > 1.0


def test_clopper_pearson_covers():
    lo, hi = clopper_pearson(50, 100, 0.05)  # two-sided: 0.025 on each side
    assert lo < 0.5 < hi and 0.39 < lo < 0.41 and 0.59 < hi < 0.61
