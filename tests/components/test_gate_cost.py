"""The SageGate executor charges ``sage_tfx.adaptive.cost(plan)`` on an rdp stream (a real Do()
against a SQLite ledger)."""
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from sage_tfx.adaptive import PlanPart, PrivacyPlan, cost
from sage_tfx.dp.dpsgd import dpsgd_event
from sage_tfx.ledger import BlockSpec, accounting, open_ledger

pytestmark = pytest.mark.slow
DELTA_G = 1e-6


def test_the_gate_charges_the_cost_of_its_plan(tmp_path, sqlite_url):
    from sage_tfx.components import artifacts
    from sage_tfx.components.gate import executor, spec
    plan = PrivacyPlan.of(PlanPart("train", event=dpsgd_event(1.1, 64, 6400, 2)),
                          PlanPart("validate", event=accounting.laplace_event(0.1)))
    with open_ledger(sqlite_url) as led:
        led.create_stream("s", epsilon_g=10.0, delta_g=DELTA_G, mode=accounting.RDP)
        led.add_blocks("s", [BlockSpec(f"b{i}", str(tmp_path / f"b{i}")) for i in range(3)])
    plan_json, charge = executor.plan_cost(plan)
    art = artifacts.SageGrant()
    art.uri = str(tmp_path / "grant")
    executor.Executor(None).Do({}, {spec.GRANT_KEY: [art]}, {
        spec.LEDGER_URL_KEY: sqlite_url, spec.STREAM_KEY: "s", spec.CONTEXT_KEY: "default",
        spec.RUN_ID_KEY: "run-1", spec.WINDOW_LAST_KEY: 2,
        spec.EVENT_JSON_KEY: charge["event_json"], spec.PLAN_JSON_KEY: plan_json})
    want = accounting.event_to_json(cost(plan))
    assert accounting.event_to_json(artifacts.read_grant(art).event) == want
    with open_ledger(sqlite_url) as led:
        assert accounting.event_to_json(led.grant_for_run("s", "run-1").event) == want
        acc = rdp_lib.RdpAccountant(list(led.stream("s").orders))
        acc.compose(cost(plan))
        spent = {b.block_id: b.epsilon_spent for b in led.blocks("s")}
    assert spent["b1"] == spent["b2"] == pytest.approx(acc.get_epsilon(DELTA_G), rel=1e-9)
    assert spent["b0"] == 0.0


def test_the_pipelines_gates_charge_each_systems_cost():
    """What the DP bagging and D&D pipelines put in their gate on an rdp stream is cost()."""
    from sage_tfx import bagging, dnd
    from sage_tfx.components.dnd_trainer.protocol import RunSettings, dnd_train_part
    from sage_tfx.components.dp_bagging_trainer.executor import bagging_cost
    for votes in ("laplace", "gumbel"):
        config = bagging.BaggingConfig(k=2, n=5, lam=0.1, votes=votes)
        # rdp streams: p by the RDP bound on the ledger's orders (what the ledger composes)
        plan = bagging.plan_labels(config, epsilon=2.0, delta=1e-5, public_size=300,
                                   rdp_orders=accounting.DEFAULT_RDP_ORDERS)
        charged = bagging_cost(config, epsilon=2.0, delta=1e-5, public_size=300, rdp=True)
        assert charged["event_json"] == accounting.event_to_json(
            bagging.cost(config, queries=plan.queries))
        acc = rdp_lib.RdpAccountant(list(accounting.DEFAULT_RDP_ORDERS))
        acc.compose(bagging.cost(config, queries=plan.queries))
        assert acc.get_epsilon(1e-5) <= 2.0
        # basic streams: unchanged, ε(p) of the config's accountant
        basic = bagging.plan_labels(config, epsilon=2.0, delta=1e-5, public_size=300)
        assert bagging_cost(config, epsilon=2.0, delta=1e-5, public_size=300, rdp=False) == {
            "epsilon": basic.epsilon, "delta": basic.delta}
    settings = RunSettings("logistic", 20, k=5, gamma=0.01, l1_norm_clip=1.0, epsilon=0.5,
                           passes=3)
    part = dnd_train_part(settings, rdp=True)
    assert part.event == dnd.cost(settings.client, dim=settings.spec.dim, passes=3)
