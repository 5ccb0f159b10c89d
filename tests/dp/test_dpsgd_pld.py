"""PLD accounting of DP-SGD, the default (sage_tfx.dp.dpsgd): ε checked against dp_accounting's
privacy-loss distributions built directly (not through the accountant the module uses), σ
calibrated to a target never above it, and RDP still giving its numbers on request."""
import dp_accounting
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from sage_tfx.dp import dpsgd

# The demo's train part (pipelines/sage_demo.py, flights_dp_module defaults): ε = 0.6 at
# δ = 1e-8, batch 256, 2 epochs, over about 8,000 training rows: 63 steps at q = 0.032.
DEMO = dict(epsilon=0.6, delta=1e-8, batch_size=256, num_examples=8000, epochs=2)


def direct_pld_epsilon(sigma, q, steps, delta, *, pessimistic=True, interval=1e-4):
    """ε of the Poisson-sampled Gaussian run from a PLD built directly (add or remove one)."""
    pld = pld_lib.from_gaussian_mechanism(
        sigma, sampling_prob=q, pessimistic_estimate=pessimistic, use_connect_dots=pessimistic,
        value_discretization_interval=interval)
    return pld.self_compose(steps).get_epsilon_for_delta(delta)


def test_default_accountant_is_pld():
    assert dpsgd.DEFAULT_ACCOUNTANT == dpsgd.PLD == "pld"
    assert isinstance(dpsgd.make_accountant(), dp_accounting.pld.PLDAccountant)
    event = dpsgd.dpsgd_event(1.3, 256, 15000, 3)
    assert dpsgd.dpsgd_epsilon(event, 1e-6) == dpsgd.dpsgd_epsilon(event, 1e-6, "pld")
    g = dpsgd.dpsgd_guarantee(1.3, 256, 15000, 3, 1e-6, l2_norm_clip=1.0)
    assert g.accountant == "pld" and g.epsilon == dpsgd.dpsgd_epsilon(event, 1e-6, "pld")


@pytest.mark.parametrize("sigma,batch,n,epochs,delta", [
    (2.65, 256, 8000, 2, 1e-8),   # the demo's train part
    (2.0, 128, 4000, 1, 1e-5),
])
def test_pld_epsilon_is_the_pessimistic_pld_an_upper_bound(sigma, batch, n, epochs, delta):
    event = dpsgd.dpsgd_event(sigma, batch, n, epochs)
    q, steps = batch / n, event.count
    eps = dpsgd.dpsgd_epsilon(event, delta)
    # The same number as a pessimistic PLD built directly on the module's grid ...
    assert eps == pytest.approx(direct_pld_epsilon(sigma, q, steps, delta), rel=1e-9)
    # ... which bounds the true ε from above: a 5× finer pessimistic grid is no larger, and the
    # optimistic PLD (a lower estimate of the true ε) lies below; the slack is tiny.
    finer = direct_pld_epsilon(sigma, q, steps, delta, interval=2e-5)
    optimistic = direct_pld_epsilon(sigma, q, steps, delta, pessimistic=False)
    assert optimistic <= finer <= eps <= finer + 1e-3
    # And it is tighter than RDP's bound.
    assert eps < dpsgd.dpsgd_epsilon(event, delta, "rdp")


def test_demo_train_part_pld_charges_less_at_rdp_sigma_and_needs_less_noise():
    rdp_sigma = dpsgd.calibrate_noise_multiplier(**DEMO, accountant="rdp")
    assert rdp_sigma == pytest.approx(2.648, abs=1e-3)  # today's RDP calibration, unchanged
    steps = dpsgd.dpsgd_steps(256, 8000, 2)
    at_rdp_sigma = direct_pld_epsilon(rdp_sigma, 256 / 8000, steps, 1e-8)
    assert at_rdp_sigma < 0.57  # PLD's ε of the RDP-calibrated run: 0.556 < 0.6

    tol = 1e-4
    sigma = dpsgd.calibrate_noise_multiplier(**DEMO, tol=tol)  # PLD, the default
    achieved = direct_pld_epsilon(sigma, 256 / 8000, steps, 1e-8)
    assert achieved <= 0.6  # never above the target ...
    assert achieved == pytest.approx(0.6, abs=2e-3)  # ... and not wasted
    assert direct_pld_epsilon(sigma - 2 * tol, 256 / 8000, steps, 1e-8) > 0.6
    assert sigma < 0.96 * rdp_sigma  # ~6 % less noise for the same charge


@pytest.mark.parametrize("epsilon", [0.2, 1.0])
def test_pld_calibration_never_overshoots_the_target(epsilon):
    """The calibrated σ meets the target by the independent PLD, within 2·tol of the least σ."""
    delta, batch, n, epochs, tol = 1e-5, 64, 2000, 2, 1e-3
    sigma = dpsgd.calibrate_noise_multiplier(epsilon, delta, batch, n, epochs, tol=tol)
    steps = dpsgd.dpsgd_steps(batch, n, epochs)
    assert direct_pld_epsilon(sigma, batch / n, steps, delta) <= epsilon
    assert direct_pld_epsilon(sigma - 2 * tol, batch / n, steps, delta) > epsilon


@pytest.mark.parametrize("coarse", [0.02, 5e-5])
def test_pld_calibration_decides_on_the_real_grid_whatever_the_coarse_start(monkeypatch, coarse):
    """The coarse-grid σ only starts the search: a far-off start (grid 0.02) or a start on a
    finer grid than the real one still ends at the real grid's least σ meeting the target."""
    monkeypatch.setattr(dpsgd, "_COARSE_PLD_INTERVAL", coarse)
    delta, batch, n, epochs, tol = 1e-5, 128, 4000, 1, 1e-3
    sigma = dpsgd.calibrate_noise_multiplier(0.5, delta, batch, n, epochs, tol=tol)
    steps = dpsgd.dpsgd_steps(batch, n, epochs)
    assert direct_pld_epsilon(sigma, batch / n, steps, delta) <= 0.5
    assert direct_pld_epsilon(sigma - 2 * tol, batch / n, steps, delta) > 0.5
