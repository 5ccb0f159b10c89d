"""Privacy plans: per-stage parts, the composed cost the gate charges, and grant matching."""
import dp_accounting
import pytest

from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.errors import AccountingModeError, InvalidRequestError, MissingGrantError
from sage_tfx.ledger import BlockSpec, open_ledger
from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan


def test_basic_plan_cost_is_the_exact_sum(tmp_path):
    plan = PrivacyPlan.of(PlanPart("transform", 0.1), PlanPart("train", 0.2, 1e-7),
                          PlanPart("validate", 0.3))
    assert plan.cost() == {"epsilon": 0.6, "delta": 1e-7}
    led = open_ledger(f"sqlite:///{tmp_path}/l.db")
    led.create_stream("s", epsilon_g=0.6, delta_g=1e-6)
    led.add_blocks("s", [BlockSpec("a", "/a")])
    grant = led.request("s", run_id="r", blocks=["a"], **plan.cost()).grant
    plan_lib.check_grant_matches(plan, grant)  # and it fits a 0.6 cap exactly
    other = PrivacyPlan.of(PlanPart("train", 0.6, 1e-7))
    plan_lib.check_grant_matches(other, grant)  # same total
    with pytest.raises(MissingGrantError, match="refusing"):
        plan_lib.check_grant_matches(PrivacyPlan.of(PlanPart("train", 0.5)), grant)


def test_rdp_plan_cost_is_the_composed_event(tmp_path):
    train = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.2)), 500)
    plan = PrivacyPlan.of(PlanPart("transform", event=dp_accounting.LaplaceDpEvent(20.0)),
                          PlanPart("train", event=train, params=(("batch_size", 64),)))
    cost = plan.cost()["event"]
    assert cost == dp_accounting.ComposedDpEvent([dp_accounting.LaplaceDpEvent(20.0), train])
    led = open_ledger(f"sqlite:///{tmp_path}/l.db")
    led.create_stream("s", epsilon_g=10.0, delta_g=1e-6, mode="rdp")
    led.add_blocks("s", [BlockSpec("a", "/a")])
    grant = led.request("s", run_id="r", blocks=["a"], **plan.cost()).grant
    plan_lib.check_grant_matches(plan, grant)
    back = PrivacyPlan.from_json(plan.to_json())
    assert back == plan and back.part("train").param("batch_size") == 64
    with pytest.raises(MissingGrantError, match="no 'validate' part"):
        plan.part("validate")


def test_unreleased_grant_is_refused(tmp_path):
    plan = PrivacyPlan.of(PlanPart("train", 0.5))
    led = open_ledger(f"sqlite:///{tmp_path}/l.db")
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    led.add_blocks("s", [BlockSpec("a", "/a")])
    grant = led.request("s", run_id="r", blocks=["a"], release=False, **plan.cost()).grant
    with pytest.raises(MissingGrantError, match="reserved"):
        plan_lib.check_grant_matches(plan, grant)


@pytest.mark.parametrize("parts,error", [
    ((), InvalidRequestError),
    ((PlanPart("a", 0.1), PlanPart("a", 0.2)), InvalidRequestError),
    ((PlanPart("a", 0.1), PlanPart("b", event=dp_accounting.LaplaceDpEvent(1.0))),
     AccountingModeError),
])
def test_bad_plans(parts, error):
    with pytest.raises(error):
        PrivacyPlan(parts)


@pytest.mark.parametrize("kwargs", [
    dict(epsilon=-1.0), dict(epsilon=float("nan")), dict(epsilon=0.1, delta=1.0), dict(),
    dict(epsilon=0.1, event=dp_accounting.LaplaceDpEvent(1.0)),
    dict(event=dp_accounting.GaussianDpEvent(0.0)),
])
def test_bad_parts(kwargs):
    with pytest.raises(ValueError):
        PlanPart("train", **kwargs)
