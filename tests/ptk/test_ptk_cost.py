"""``sage_tfx.ptk.cost``: the DpEvent a PTK's training declares, stored in its lineage and
charged as its (ε, δ)."""
import dp_accounting
import pytest

from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError
from sage_tfx.ptk import UnknownPTKTypeError, cost
from sage_tfx.ptk.allocator import dec

from ptk_data import CV, CV_CONFIG, HS, HS_CONFIG, register_hist, test_registry, window


def test_cost_is_the_event_of_the_trained_version_and_its_charge(make_store):
    store = make_store()
    store.advance_window(window(10000, 0), user_key="user")
    pid = register_hist(store)
    (t,) = store.advance_window(window(10000, 1), user_key="user").trained
    lin = store.lineage(pid)
    event = cost(HS, epsilon=lin.epsilon, config=HS_CONFIG, registry=test_registry())
    assert lin.event == repr(event)
    grant = store.ledger.grant(lin.grant_id)
    assert grant.event is None and dec(grant.epsilon) == dec(lin.epsilon)   # one member
    # dp_accounting's ε of the declared event (pure Laplace halves, δ → 0) is the charged ε
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(event)
    assert acc.get_epsilon(1e-12) == pytest.approx(grant.epsilon, rel=1e-3)


def test_gaussian_kernel_cost_spends_at_most_its_charge():
    event = cost(CV, epsilon=0.5, config=CV_CONFIG)
    assert isinstance(event, dp_accounting.GaussianDpEvent)
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(event)
    eps = acc.get_epsilon(CV_CONFIG["delta"])
    assert 0.45 < eps <= 0.5 + 1e-6          # calibrated to (0.5, δ), not far below it


def test_bad_configs_are_refused():
    with pytest.raises(UnknownPTKTypeError):
        cost("no_such_type", epsilon=0.5)
    with pytest.raises(InvalidRequestError):
        cost(HS, epsilon=0.5, config={"key": "city"})        # the kernel refuses the config
    with pytest.raises(InvalidPrivacyParameterError):
        cost(HS, epsilon=-1.0, config=HS_CONFIG)
    with pytest.raises(InvalidRequestError, match="dict"):
        cost(HS, epsilon=0.5, config=[("key", "city")])
    with pytest.raises(InvalidRequestError, match="PTK type"):
        cost(3, epsilon=0.5)
