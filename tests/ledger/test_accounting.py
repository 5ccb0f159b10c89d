"""Privacy parameter validation, DpEvent serialization and the per-block RDP filter."""
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from sage_tfx.ledger import accounting
from sage_tfx.errors import InvalidPrivacyParameterError

ORDERS = accounting.DEFAULT_RDP_ORDERS


@pytest.mark.parametrize("eps", [0, -1, float("nan"), float("inf"), -float("inf"), "1", None, True])
def test_bad_epsilon(eps):
    with pytest.raises(InvalidPrivacyParameterError):
        accounting.check_epsilon(eps)


@pytest.mark.parametrize("delta", [-1e-9, 1, 1.5, float("nan"), float("inf"), "0.1", None])
def test_bad_delta(delta):
    with pytest.raises(InvalidPrivacyParameterError):
        accounting.check_delta(delta)


def test_delta_zero_allowed_only_where_asked():
    assert accounting.check_delta(0.0) == 0.0
    with pytest.raises(InvalidPrivacyParameterError):
        accounting.check_delta(0.0, allow_zero=False)


def test_exact_decimal_sum_does_not_round():
    # 0.1 + 0.2 in floats is 0.30000000000000004 > 0.3; the ledger sums what was typed.
    assert 0.1 + 0.2 > 0.3
    assert accounting.exact(0.1) + accounting.exact(0.2) == accounting.exact(0.3)


EVENTS = [
    dp_accounting.GaussianDpEvent(1.3),
    dp_accounting.LaplaceDpEvent(2.0),
    dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), 1000),
    dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(3.0),
                                   dp_accounting.LaplaceDpEvent(10.0)]),
]


@pytest.mark.parametrize("event", EVENTS)
def test_event_json_round_trip_keeps_meaning(event):
    text = accounting.event_to_json(event)
    back = accounting.event_from_json(text)
    assert back == event
    assert accounting.rdp_curve(back, ORDERS) == accounting.rdp_curve(event, ORDERS)


@pytest.mark.parametrize("event", [
    dp_accounting.GaussianDpEvent(0.0),
    dp_accounting.GaussianDpEvent(-1.0),
    dp_accounting.GaussianDpEvent(float("nan")),
    dp_accounting.LaplaceDpEvent(0.0),
    dp_accounting.PoissonSampledDpEvent(1.5, dp_accounting.GaussianDpEvent(1.0)),
    dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0), 0),
    dp_accounting.NonPrivateDpEvent(),
    dp_accounting.NoOpDpEvent(),
    dp_accounting.UnsupportedDpEvent(),
    dp_accounting.ComposedDpEvent([]),
    "GaussianDpEvent(1.0)",
    (1.0, 1e-6),
])
def test_unaccountable_events_rejected(event):
    with pytest.raises(InvalidPrivacyParameterError):
        accounting.check_event(event)


def test_forged_event_class_rejected():
    with pytest.raises(InvalidPrivacyParameterError):
        accounting.event_from_dict({"class": "Popen", "args": ["rm"]})


def test_rdp_curve_matches_dp_accounting():
    event = EVENTS[2]
    accountant = rdp_lib.RdpAccountant(list(ORDERS))
    accountant.compose(event)
    np.testing.assert_allclose(accounting.rdp_curve(event, ORDERS), accountant._rdp)


def test_caps_formula():
    caps = accounting.rdp_caps(1.0, 1e-6, ORDERS)
    for a, cap in zip(ORDERS, caps):
        assert cap == pytest.approx(1.0 - math.log(len(ORDERS) / 1e-6) / (a - 1))


def _admit_until_full(event, eps_g, delta_g):
    caps = accounting.rdp_caps(eps_g, delta_g, ORDERS)
    charge = accounting.rdp_curve(event, ORDERS)
    spent = [0.0] * len(ORDERS)
    n = 0
    while accounting.rdp_fits(spent, charge, caps):
        spent = [s + c for s, c in zip(spent, charge)]
        n += 1
    return n, spent


@pytest.mark.parametrize("event", EVENTS[:2] + [
    dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(1.0))])
@pytest.mark.parametrize("eps_g,delta_g", [(1.0, 1e-6), (3.0, 1e-9), (10.0, 1e-5)])
def test_filter_against_dp_accounting(event, eps_g, delta_g):
    """Whatever the filter admits, dp_accounting's own get_epsilon(δ_g) keeps within ε_g.

    And the filter is not vacuous: it admits at least as many charges as dp_accounting allows
    at δ_g/|Λ| with the simple conversion on the same grid (the union-bound price).
    """
    n, spent = _admit_until_full(event, eps_g, delta_g)
    if n:
        accountant = rdp_lib.RdpAccountant(list(ORDERS))
        accountant.compose(event, n)
        assert accountant.get_epsilon(delta_g) <= eps_g
    # One more charge would be refused by the filter: at every order the cap is exceeded.
    caps = accounting.rdp_caps(eps_g, delta_g, ORDERS)
    over = [s + c for s, c in zip(spent, accounting.rdp_curve(event, ORDERS))]
    assert all(o > cap for o, cap in zip(over, caps))
    # Independent count: largest k with min_α k·R(α) + ln(|Λ|/δ_g)/(α−1) ≤ ε_g.
    curve = np.array(accounting.rdp_curve(event, ORDERS))
    alphas = np.array(ORDERS)
    k = 0
    while np.min((k + 1) * curve + math.log(len(ORDERS) / delta_g) / (alphas - 1)) <= eps_g:
        k += 1
    assert n == k


def test_filter_admits_several_charges_where_expected():
    # Keeps the parametrized check above from being vacuous.
    assert _admit_until_full(dp_accounting.GaussianDpEvent(1.3), 10.0, 1e-5)[0] >= 2
    assert _admit_until_full(EVENTS[2], 10.0, 1e-5)[0] >= 2
    assert _admit_until_full(dp_accounting.LaplaceDpEvent(20.0), 1.0, 1e-6)[0] >= 10


def test_filter_beats_basic_composition_for_gaussians():
    """Why rdp mode exists: many small Gaussian charges fit where Σε composition runs out."""
    sigma, eps_g, delta_g = 50.0, 1.0, 1e-6
    n_rdp, _ = _admit_until_full(dp_accounting.GaussianDpEvent(sigma), eps_g, delta_g)
    # Basic composition: each Gaussian charged as its own (ε, δ) at δ = δ_g / n is the best case.
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(dp_accounting.GaussianDpEvent(sigma))
    n_basic = 0
    while True:
        k = n_basic + 1
        if k * pld.get_epsilon(delta_g / k) > eps_g:
            break
        n_basic = k
    assert n_rdp > 2 * n_basic


def test_rdp_epsilon_uses_dp_accounting_conversion():
    event = EVENTS[2]
    curve = accounting.rdp_curve(event, ORDERS)
    accountant = rdp_lib.RdpAccountant(list(ORDERS))
    accountant.compose(event)
    assert accounting.rdp_epsilon(curve, ORDERS,
                                  1e-6) == pytest.approx(accountant.get_epsilon(1e-6))
    assert accounting.rdp_epsilon([0.0] * len(ORDERS), ORDERS, 1e-6) == 0.0


@pytest.mark.parametrize("orders", [[], [1.0, 2.0], [3.0, 2.0], [2.0, 2.0], [2.0, float("inf")]])
def test_bad_orders(orders):
    with pytest.raises(InvalidPrivacyParameterError):
        accounting.check_orders(orders)
