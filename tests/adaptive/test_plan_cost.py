"""``sage_tfx.adaptive.cost``: the DpEvent a Sage pipeline's gate charges for its privacy plan."""
import dp_accounting
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from sage_tfx.adaptive import PlanPart, PrivacyPlan, cost
from sage_tfx.adaptive.plan import check_grant_matches
from sage_tfx.dp.dpsgd import dpsgd_event
from sage_tfx.errors import AccountingModeError, InvalidRequestError, MissingGrantError
from sage_tfx.ledger import BlockSpec, accounting, open_ledger

DELTA_G = 1e-6


def _plan(noise_multiplier):
    train = dpsgd_event(noise_multiplier, 64, 6400, 2)
    return PrivacyPlan.of(PlanPart("transform", event=accounting.laplace_event(0.2)),
                          PlanPart("train", event=train),
                          PlanPart("validate", event=accounting.laplace_event(0.1)))


def test_cost_is_what_the_ledger_charges_and_what_the_components_accept(sqlite_url):
    plan = _plan(1.1)
    event = cost(plan)
    assert isinstance(event, dp_accounting.ComposedDpEvent) and len(event.events) == 3
    with open_ledger(sqlite_url) as led:
        led.create_stream("s", epsilon_g=10.0, delta_g=DELTA_G, mode=accounting.RDP)
        led.add_blocks("s", [BlockSpec(f"b{i}", f"/b/{i}") for i in range(3)])
        # the gate's request for an rdp plan: the plan's event (components/gate, plan_cost)
        grant = led.request("s", run_id="r", blocks=["b0", "b1"], **plan.cost()).grant
        assert accounting.event_to_json(grant.event) == accounting.event_to_json(event)
        check_grant_matches(plan, grant)                     # what each DP component checks
        with pytest.raises(MissingGrantError):               # a different plan is refused
            check_grant_matches(_plan(1.2), grant)
        acc = rdp_lib.RdpAccountant(list(led.stream("s").orders))
        acc.compose(event)
        spent = {b.block_id: b.epsilon_spent for b in led.blocks("s")}
        assert spent["b0"] == spent["b1"] == pytest.approx(acc.get_epsilon(DELTA_G), rel=1e-9)
        assert spent["b2"] == 0.0 and spent["b0"] > 0.3


def test_one_part_is_its_own_event_and_bad_configs_are_refused():
    one = PrivacyPlan.of(PlanPart("train", event=accounting.laplace_event(0.5)))
    assert cost(one) == accounting.laplace_event(0.5)
    with pytest.raises(AccountingModeError, match="no DpEvent"):
        cost(PrivacyPlan.of(PlanPart("train", epsilon=0.5, delta=1e-7)))
    with pytest.raises(InvalidRequestError, match="PrivacyPlan"):
        cost({"train": 0.5})
