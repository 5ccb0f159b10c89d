"""Tests of sage_tfx.dp.dpsgd: DP-SGD events, ε, noise calibration (fast, no TensorFlow)."""
import dataclasses
import math
import subprocess
import sys

import dp_accounting
import pytest

from sage_tfx.dp import dpsgd
from sage_tfx.errors import InvalidPrivacyParameterError

# Golden numbers measured independently before the project (shared/reference/README.md):
# Poisson q = 256/60000, sigma = 1.1, 14,062 steps, delta = 1e-5.
GOLDEN_EVENT = dp_accounting.SelfComposedDpEvent(
    dp_accounting.PoissonSampledDpEvent(256 / 60000, dp_accounting.GaussianDpEvent(1.1)), 14062)


def test_golden_rdp_epsilon():
    assert dpsgd.dpsgd_epsilon(GOLDEN_EVENT, 1e-5, "rdp") == pytest.approx(2.597, abs=1e-3)


def test_golden_pld_epsilon():
    assert dpsgd.dpsgd_epsilon(GOLDEN_EVENT, 1e-5, "pld") == pytest.approx(2.382, abs=1e-3)


def test_dpsgd_event_structure():
    event = dpsgd.dpsgd_event(1.1, 256, 60000, 60)
    assert isinstance(event, dp_accounting.SelfComposedDpEvent)
    assert event.count == 14063  # ceil(60 * 60000 / 256) = ceil(14062.5)
    assert event.event.sampling_probability == 256 / 60000
    assert event.event.event == dp_accounting.GaussianDpEvent(1.1)
    # One more step than the golden run: slightly more ε, same to 3 decimals (RDP, on request).
    eps = dpsgd.dpsgd_epsilon(event, 1e-5, "rdp")
    assert dpsgd.dpsgd_epsilon(GOLDEN_EVENT, 1e-5, "rdp") < eps == pytest.approx(2.597, abs=1e-3)


def test_pld_is_tighter_than_rdp_and_below_unamplified_bound():
    eps_rdp = dpsgd.dpsgd_epsilon(GOLDEN_EVENT, 1e-5, "rdp")
    eps_pld = dpsgd.dpsgd_epsilon(GOLDEN_EVENT, 1e-5, "pld")
    assert eps_pld < eps_rdp
    # Independent (loose) bound: the same steps without subsampling amplification.
    unamplified = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.1), 14062)
    assert eps_rdp < dpsgd.dpsgd_epsilon(unamplified, 1e-5, "rdp")


@pytest.mark.parametrize("batch_size,num_examples,epochs,steps", [
    (256, 15000, 3, 176),    # ceil(175.78)
    (250, 15000, 3, 180),    # exact
    (10, 1000, 0.1, 10),     # 0.1 read as one tenth, not 0.1000000000000000055...
    (1000, 1000, 2, 2),      # full batch
    (1, 1, 1, 1),
])
def test_steps(batch_size, num_examples, epochs, steps):
    assert dpsgd.dpsgd_steps(batch_size, num_examples, epochs) == steps
    assert dpsgd.dpsgd_event(1.0, batch_size, num_examples, epochs).count == steps


@pytest.mark.parametrize("epsilon,delta", [(0.5, 1e-6), (1.0, 1e-6), (3.0, 1e-5)])
def test_calibration_round_trip_rdp(epsilon, delta):
    tol = 1e-5
    sigma = dpsgd.calibrate_noise_multiplier(epsilon, delta, 256, 15000, 3, "rdp", tol=tol)
    at = lambda s: dpsgd.dpsgd_epsilon(dpsgd.dpsgd_event(s, 256, 15000, 3), delta, "rdp")
    assert at(sigma) <= epsilon
    assert at(sigma) == pytest.approx(epsilon, rel=1e-3)
    assert at(sigma - 3 * tol) > epsilon


def test_calibration_round_trip_pld():
    epsilon, delta, tol = 0.3, 1e-5, 1e-4
    sigma = dpsgd.calibrate_noise_multiplier(epsilon, delta, 100, 1000, 1, "pld", tol=tol)
    at = lambda s: dpsgd.dpsgd_epsilon(dpsgd.dpsgd_event(s, 100, 1000, 1), delta, "pld")
    assert at(sigma) <= epsilon
    assert at(sigma - 3 * tol) > epsilon
    # PLD is tighter, so it needs less noise than RDP for the same target.
    assert sigma < dpsgd.calibrate_noise_multiplier(epsilon, delta, 100, 1000, 1, "rdp")


def test_calibration_unreachable_targets():
    with pytest.raises(InvalidPrivacyParameterError, match="too small"):
        dpsgd.calibrate_noise_multiplier(1e-6, 1e-6, 1000, 1000, 1)
    with pytest.raises(InvalidPrivacyParameterError, match="no meaningful privacy"):
        dpsgd.calibrate_noise_multiplier(1e6, 0.5, 1, 1, 1)  # σ = 1e-3 already gives ε ≈ 5.5e5


_BAD_EPSILONS = [0, -1.0, math.nan, math.inf, True, "1", None]
_BAD_DELTAS = [0, 1, 1.5, -1e-6, math.nan, True, "1e-6"]
_GOOD = dict(epsilon=1.0, delta=1e-6, batch_size=10, num_examples=100, epochs=1)
_BAD_SAMPLING = [
    dict(batch_size=0), dict(batch_size=1.5), dict(batch_size=True), dict(batch_size=101),
    dict(num_examples=0), dict(num_examples=100.0), dict(epochs=0), dict(epochs=-1),
    dict(epochs=math.nan), dict(epochs=math.inf), dict(epochs="1"),
]


@pytest.mark.parametrize("epsilon", _BAD_EPSILONS)
def test_calibrate_rejects_bad_epsilon(epsilon):
    with pytest.raises(InvalidPrivacyParameterError):
        dpsgd.calibrate_noise_multiplier(**{**_GOOD, "epsilon": epsilon})


@pytest.mark.parametrize("delta", _BAD_DELTAS)
def test_calibrate_rejects_bad_delta(delta):
    with pytest.raises(InvalidPrivacyParameterError):
        dpsgd.calibrate_noise_multiplier(**{**_GOOD, "delta": delta})


@pytest.mark.parametrize("bad", _BAD_SAMPLING)
def test_calibrate_and_event_reject_bad_sampling(bad):
    with pytest.raises(InvalidPrivacyParameterError):
        dpsgd.calibrate_noise_multiplier(**{**_GOOD, **bad})
    args = {k: v for k, v in {**_GOOD, **bad}.items() if k not in ("epsilon", "delta")}
    with pytest.raises(InvalidPrivacyParameterError):
        dpsgd.dpsgd_event(1.0, **args)


@pytest.mark.parametrize("noise_multiplier", [0, -1.0, math.nan, math.inf, None, False])
def test_event_rejects_bad_noise_multiplier(noise_multiplier):
    with pytest.raises(InvalidPrivacyParameterError):
        dpsgd.dpsgd_event(noise_multiplier, 10, 100, 1)


@pytest.mark.parametrize("accountant", ["RDP", "moments", None])
def test_rejects_unknown_accountant(accountant):
    with pytest.raises(InvalidPrivacyParameterError):
        dpsgd.calibrate_noise_multiplier(accountant=accountant, **_GOOD)
    with pytest.raises(InvalidPrivacyParameterError):
        dpsgd.dpsgd_epsilon(GOLDEN_EVENT, 1e-5, accountant)


def test_epsilon_rejects_bad_event_and_delta():
    with pytest.raises(InvalidPrivacyParameterError):
        dpsgd.dpsgd_epsilon("not an event", 1e-5)
    with pytest.raises(InvalidPrivacyParameterError):
        dpsgd.dpsgd_epsilon(GOLDEN_EVENT, 0.0)
    tree = dp_accounting.SingleEpochTreeAggregationDpEvent(1.0, 10)
    with pytest.raises(InvalidPrivacyParameterError):
        dpsgd.dpsgd_epsilon(tree, 1e-5, "pld")


def test_errors_are_value_errors():
    with pytest.raises(ValueError):
        dpsgd.calibrate_noise_multiplier(**{**_GOOD, "epsilon": -1})


def test_guarantee_matches_independent_accounting():
    g = dpsgd.dpsgd_guarantee(1.3, 256, 15000, 3, 1e-6, l2_norm_clip=1.0, accountant="rdp")
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(256 / 15000, dp_accounting.GaussianDpEvent(1.3)), 176))
    assert g.epsilon == pytest.approx(accountant.get_epsilon(1e-6), rel=1e-12)
    assert (g.steps, g.num_examples, g.batch_size, g.accountant) == (176, 15000, 256, "rdp")
    assert "Poisson" in g.sampling and g.neighboring_relation == "add_or_remove_one"
    assert g.event == dpsgd.dpsgd_event(1.3, 256, 15000, 3)
    assert g.to_dict()["noise_multiplier"] == 1.3
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.epsilon = 0.0  # type: ignore[misc]
    with pytest.raises(InvalidPrivacyParameterError):
        dpsgd.dpsgd_guarantee(1.3, 256, 15000, 3, 1e-6, l2_norm_clip=0.0)


def test_core_modules_import_no_tensorflow():
    code = ("import sys, sage_tfx.dp.dpsgd, sage_tfx.dp, sage_tfx.dp.adassp, "
            "sage_tfx.dp.logistic, sage_tfx.dp.keras_dpsgd; "
            "bad = [m for m in ('tensorflow', 'tensorflow_privacy') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("accountant,tol", [("rdp", 0.1), ("rdp", 1e-3)])  # PLD: round trip above
@pytest.mark.parametrize("epsilon", [0.2, 1.0, 8.0])
def test_calibration_never_overshoots_the_target(accountant, tol, epsilon):
    """Opacus #346: a bisection that stops on the wrong side returns σ whose ε exceeds the
    target. Even with a coarse tolerance the returned σ meets it."""
    delta, batch, n, epochs = 1e-5, 64, 2000, 2
    sigma = dpsgd.calibrate_noise_multiplier(epsilon, delta, batch, n, epochs, accountant, tol=tol)
    achieved = dpsgd.dpsgd_epsilon(dpsgd.dpsgd_event(sigma, batch, n, epochs), delta, accountant)
    assert achieved <= epsilon
    assert dpsgd.dpsgd_epsilon(dpsgd.dpsgd_event(sigma - 2 * tol, batch, n, epochs), delta,
                               accountant) > epsilon  # and is within 2·tol of the smallest σ
