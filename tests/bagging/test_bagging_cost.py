"""``sage_tfx.bagging.cost``: the DpEvent of a run's labels, charged by an rdp grant."""
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from sage_tfx.bagging import (BaggingConfig, cost, fit_dp_bagging, labels_from_grant,
                              plan_labels)
from sage_tfx.errors import GrantTooSmallError, InvalidRequestError
from sage_tfx.ledger import BlockSpec, accounting, open_ledger

DELTA_G = 1e-5


def data(N=300, P=200, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, 3))
    y = (X @ np.array([1.5, -1.0, 0.5]) > 0).astype(int)
    return X, y, np.arange(N) // 2, rng.normal(size=(P, 3))


@pytest.mark.parametrize("votes", ["laplace", "gaussian"])
def test_cost_is_the_charged_event_a_run_spends(tmp_path, sqlite_url, votes):
    config = BaggingConfig(k=2, n=5, lam=0.1, votes=votes, accountant="rdp")
    X, y, units, X_public = data()
    plan = plan_labels(config, epsilon=2.0, delta=DELTA_G, public_size=len(X_public))
    event = cost(config, queries=plan.queries)
    assert event == plan.event
    with open_ledger(sqlite_url) as led:
        led.create_stream("s", epsilon_g=20.0, delta_g=DELTA_G, mode=accounting.RDP)
        led.add_blocks("s", [BlockSpec(b, str(tmp_path / b)) for b in ("b1", "b2")])
        grant = led.request("s", run_id="r", blocks=["b1", "b2"], event=event).grant
        res = fit_dp_bagging(X, y, units, X_public, config=config, salt=b"cost",
                             public_declared=True, ledger=led, grant_id=grant.grant_id)
        assert res.labelling.queries == plan.queries == len(res.labelling.labels)
        acc = rdp_lib.RdpAccountant(list(led.stream("s").orders))
        acc.compose(event)
        spent = [b.epsilon_spent for b in led.blocks("s")]
        assert spent == pytest.approx([acc.get_epsilon(DELTA_G)] * 2, rel=1e-9)
        assert 0 < spent[0] <= 2.0 + 1e-9
        # the grant decides the purchase: one label more is bought with the event of p + 1,
        # and a grant charged with another config's event (λ differs) buys nothing
        other = led.request("s", run_id="r2", blocks=["b1"],
                            event=cost(config, queries=plan.queries + 1)).grant
        more = fit_dp_bagging(X, y, units, X_public, config=config, salt=b"cost2",
                              public_declared=True, ledger=led, grant_id=other.grant_id)
        assert more.labelling.queries == plan.queries + 1
        wrong = BaggingConfig(k=2, n=5, lam=0.2, votes=votes, accountant="rdp")
        third = led.request("s", run_id="r3", blocks=["b2"],
                            event=cost(wrong, queries=plan.queries)).grant
        with pytest.raises(InvalidRequestError, match="not"):
            fit_dp_bagging(X, y, units, X_public, config=config, salt=b"cost3",
                           public_declared=True, ledger=led, grant_id=third.grant_id)
        assert led.releases(third.grant_id) == []


@pytest.mark.parametrize("votes", ["gumbel", "gaussian"])
def test_an_rdp_stream_plans_p_by_the_rdp_bound_it_charges(sqlite_url, tmp_path, votes):
    """On an rdp stream p is the largest p whose charged event's RDP ε (on the stream's order
    grid, as the ledger reports a block's spend) is ≤ the requested ε; the grant is admitted, the
    block reports at most ε spent and the run answers exactly the charged p. The config's own
    accountant (best: br / PLD) plans more votes whose RDP ε is above ε."""
    config = BaggingConfig(k=2, n=5, lam=0.1, votes=votes)      # accountant "best"
    eps, public = 2.0, 300
    plan = plan_labels(config, epsilon=eps, delta=DELTA_G, public_size=public,
                       rdp_orders=accounting.DEFAULT_RDP_ORDERS)
    best = plan_labels(config, epsilon=eps, delta=DELTA_G, public_size=public)
    assert plan.bound == "rdp" and plan.event == cost(config, queries=plan.queries)
    with open_ledger(sqlite_url) as led:
        led.create_stream("s", epsilon_g=20.0, delta_g=DELTA_G, mode=accounting.RDP)
        led.add_blocks("s", [BlockSpec("b1", str(tmp_path / "b1"))])
        decision = led.request("s", run_id="r", blocks=["b1"], event=plan.event)
        assert decision.granted
        (block,) = led.blocks("s")
        orders = list(led.stream("s").orders)

    def rdp_eps(p):   # independent: dp_accounting's RDP accountant on the stream's orders
        acc = rdp_lib.RdpAccountant(orders)
        acc.compose(cost(config, queries=p))
        return acc.get_epsilon(DELTA_G)

    assert block.epsilon_spent == pytest.approx(rdp_eps(plan.queries), rel=1e-9)
    assert rdp_eps(plan.queries) <= eps < rdp_eps(plan.queries + 1)    # the largest such p
    assert plan.epsilon == pytest.approx(rdp_eps(plan.queries), rel=1e-9)
    assert best.queries > plan.queries and rdp_eps(best.queries) > 1.05 * eps  # what it fixes
    run = labels_from_grant(config, epsilon=None, delta=None, event=decision.grant.event,
                            public_size=public, report_delta=DELTA_G)
    assert run.queries == plan.queries and run.event == plan.event   # spends what was charged
    capped = plan_labels(config, epsilon=eps, delta=DELTA_G, public_size=5,
                         rdp_orders=accounting.DEFAULT_RDP_ORDERS)
    assert capped.queries == 5                                    # never beyond the public set
    with pytest.raises(GrantTooSmallError, match="rdp stream"):
        plan_labels(config, epsilon=1e-3, delta=DELTA_G, public_size=public,
                    rdp_orders=accounting.DEFAULT_RDP_ORDERS)
    with pytest.raises(InvalidRequestError, match="delta = 0"):
        plan_labels(config, epsilon=eps, delta=0.0, public_size=public,
                    rdp_orders=accounting.DEFAULT_RDP_ORDERS)


def test_bad_configs_are_refused():
    config = BaggingConfig(k=2, n=5, lam=0.1)
    for queries in (0, -1, 2.0, True):
        with pytest.raises(InvalidRequestError, match="queries"):
            cost(config, queries=queries)
    paper = BaggingConfig(k=2, n=5, lam=0.1, mode="paper", accept_not_differentially_private=True)
    with pytest.raises(InvalidRequestError, match="paper mode"):
        cost(paper, queries=3)
    with pytest.raises(InvalidRequestError, match="BaggingConfig"):
        cost({"k": 2}, queries=3)
