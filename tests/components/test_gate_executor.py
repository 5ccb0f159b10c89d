"""SageGate executor: Do() against a real SQLite ledger (granted, denied, replayed)."""
import json
import os

import pytest

from blockdata import DAY_BLOCKS, STREAM

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tfx_modules():
    from sage_tfx.components import artifacts
    from sage_tfx.components.gate import executor, spec
    return artifacts, executor, spec


def _run_gate(tfx_modules, tmp_path, name, exec_properties, context=None):
    artifacts, executor, spec = tfx_modules
    grant = artifacts.SageGrant()
    grant.uri = str(tmp_path / name)
    executor.Executor(context).Do({}, {spec.GRANT_KEY: [grant]}, exec_properties)
    return grant


def _props(spec, url, **kw):
    props = {spec.LEDGER_URL_KEY: url, spec.STREAM_KEY: STREAM, spec.CONTEXT_KEY: "default"}
    props.update({getattr(spec, k.upper() + "_KEY"): v for k, v in kw.items()})
    return props


def _charges(url):
    from sage_tfx.ledger import open_ledger
    with open_ledger(url) as ledger:
        return {b.block_id: (b.epsilon_spent, b.charges) for b in ledger.blocks(STREAM)}


def test_granted_window_writes_grant_file_marker_and_properties(tfx_modules, tmp_path,
                                                                 block_ledger):
    artifacts, executor, spec = tfx_modules
    url, locations = block_ledger
    art = _run_gate(tfx_modules, tmp_path, "g", _props(spec, url, run_id="run-1", window_last=2,
                                                        epsilon=0.25, delta=1e-6))
    files = sorted(os.listdir(art.uri))
    assert files == [artifacts.GRANTED_FILE_NAME, artifacts.GRANT_FILE_NAME]
    assert art.get_int_custom_property(artifacts.GRANTED_KEY) == 1
    grant = artifacts.read_grant(art)
    assert grant.block_ids == DAY_BLOCKS[-2:]
    assert grant.locations == tuple(locations[b] for b in DAY_BLOCKS[-2:])
    assert (art.grant_id, art.run_id, art.stream, art.num_blocks) == (grant.grant_id, "run-1",
                                                                      STREAM, 2)
    assert art.epsilon == 0.25 and art.delta == 1e-6 and art.ledger_url == url
    assert art.reason == ""
    assert _charges(url) == {"2024-01-01": (0.0, 0), "2024-01-02": (0.0, 0),
                             "2024-01-03": (0.25, 1), "2024-01-04": (0.25, 1)}


def test_explicit_blocks_are_granted_in_request_order(tfx_modules, tmp_path, block_ledger):
    artifacts, executor, spec = tfx_modules
    url, _ = block_ledger
    art = _run_gate(tfx_modules, tmp_path, "g", _props(
        spec, url, run_id="r", blocks=json.dumps(["2024-01-03", "2024-01-01"]), epsilon=0.5))
    assert artifacts.read_grant(art).block_ids == ("2024-01-03", "2024-01-01")
    assert _charges(url)["2024-01-02"] == (0.0, 0)


def test_denial_is_an_outcome_not_a_crash(tfx_modules, tmp_path, block_ledger):
    from sage_tfx.errors import MissingGrantError
    from sage_tfx.ledger import open_ledger
    artifacts, executor, spec = tfx_modules
    url, _ = block_ledger
    before = _charges(url)
    art = _run_gate(tfx_modules, tmp_path, "d", _props(spec, url, run_id="greedy",
                                                        window_last=2, epsilon=1.5))
    assert os.listdir(art.uri) == [artifacts.DENIED_FILE_NAME]
    with open(os.path.join(art.uri, artifacts.DENIED_FILE_NAME)) as f:
        reason = f.read()
    assert "only 0 block(s) have budget left" in reason
    assert art.get_int_custom_property(artifacts.GRANTED_KEY) == 0
    assert art.reason == reason and art.grant_id == "" and art.run_id == "greedy"
    assert _charges(url) == before
    with pytest.raises(MissingGrantError, match="denied run 'greedy'.*budget left"):
        artifacts.read_grant(art)
    with open_ledger(url) as ledger:
        assert ledger.audit_log(STREAM)[-1].kind == "deny"


def test_same_run_id_replays_the_grant_without_charging_twice(tfx_modules, tmp_path,
                                                              block_ledger):
    artifacts, executor, spec = tfx_modules
    url, _ = block_ledger
    props = _props(spec, url, run_id="retry-me", window_last=3, epsilon=0.3)
    first = _run_gate(tfx_modules, tmp_path, "a", props)
    second = _run_gate(tfx_modules, tmp_path, "b", props)
    assert first.grant_id == second.grant_id
    assert artifacts.read_grant(first) == artifacts.read_grant(second)
    assert first.get_int_custom_property(executor.REPLAYED_KEY) == 0
    assert second.get_int_custom_property(executor.REPLAYED_KEY) == 1
    assert [c for _, c in _charges(url).values()] == [0, 1, 1, 1]


def _context(pipeline_run_id, node_id="SageGate", pipeline="p"):
    from tfx.dsl.components.base import base_executor
    from tfx.proto.orchestration import pipeline_pb2
    node = pipeline_pb2.PipelineNode()
    node.node_info.id = node_id
    return base_executor.BaseExecutor.Context(
        pipeline_node=node, pipeline_info=pipeline_pb2.PipelineInfo(id=pipeline),
        pipeline_run_id=pipeline_run_id)


def test_default_run_id_comes_from_the_pipeline_run(tfx_modules, tmp_path, block_ledger):
    artifacts, executor, spec = tfx_modules
    url, _ = block_ledger
    props = _props(spec, url, window_last=1, epsilon=0.1)
    run1 = dict(props, pipeline_run_id="2024-05-01T10:00:00.000001")
    a = _run_gate(tfx_modules, tmp_path, "a", run1, _context(None))
    b = _run_gate(tfx_modules, tmp_path, "b", run1, _context(None))  # retry of the same run
    c = _run_gate(tfx_modules, tmp_path, "c", dict(props), _context("other run"))
    assert a.run_id == "p.SageGate.2024-05-01T10:00:00.000001"
    assert a.grant_id == b.grant_id
    assert c.run_id == "p.SageGate.other-run" and c.grant_id != a.grant_id
    assert _charges(url)["2024-01-04"] == (pytest.approx(0.2), 2)


def test_node_id_comes_from_the_context_else_from_the_baked_in_exec_properties(
        tfx_modules, tmp_path, block_ledger):
    """Kubeflow pods and Airflow tasks have no pipeline node in their context: the ids baked in
    by for_orchestrator name the gate. LocalDagRunner's context wins over them."""
    from sage_tfx.errors import InvalidRequestError
    _, _, spec = tfx_modules
    url, _ = block_ledger
    props = dict(_props(spec, url, window_last=1, epsilon=0.1), pipeline_run_id="job-1")
    baked = dict(props, node_id="GateB", pipeline_id="two-gates")
    pod = _run_gate(tfx_modules, tmp_path, "pod", baked)
    assert pod.run_id == "two-gates.GateB.job-1"
    local = _run_gate(tfx_modules, tmp_path, "local", baked, _context(None, "GateA", "p"))
    assert local.run_id == "p.GateA.job-1" and local.grant_id != pod.grant_id
    before = _charges(url)
    for missing in ("node_id", "pipeline_id"):  # neither source: refused, nothing charged
        with pytest.raises(InvalidRequestError, match="cannot derive its run id"):
            _run_gate(tfx_modules, tmp_path, f"no-{missing}",
                      {k: v for k, v in baked.items() if k != missing})
    assert _charges(url) == before


def test_no_run_id_at_all_is_a_clear_error(tfx_modules, tmp_path, block_ledger):
    from sage_tfx.errors import InvalidRequestError
    _, _, spec = tfx_modules
    url, _ = block_ledger
    with pytest.raises(InvalidRequestError, match="needs a run id"):
        _run_gate(tfx_modules, tmp_path, "x", _props(spec, url, window_last=1, epsilon=0.1))


def test_bad_configuration_raises_and_charges_nothing(tfx_modules, tmp_path, block_ledger):
    from sage_tfx.errors import AccountingModeError, UnknownBlockError, UnknownStreamError
    _, _, spec = tfx_modules
    url, _ = block_ledger
    before = _charges(url)
    with pytest.raises(UnknownStreamError):
        _run_gate(tfx_modules, tmp_path, "x", dict(
            _props(spec, url, run_id="r1", window_last=1, epsilon=0.1), stream="nope"))
    with pytest.raises(UnknownBlockError):
        _run_gate(tfx_modules, tmp_path, "y", _props(
            spec, url, run_id="r2", blocks='["2024-01-01", "1999-01-01"]', epsilon=0.1))
    with pytest.raises(AccountingModeError):
        from dp_accounting import dp_event
        from sage_tfx.ledger.accounting import event_to_json
        _run_gate(tfx_modules, tmp_path, "z", _props(
            spec, url, run_id="r3", window_last=1,
            event_json=event_to_json(dp_event.LaplaceDpEvent(1.0))))
    assert _charges(url) == before


def test_rdp_stream_charges_a_dp_event(tfx_modules, tmp_path, block_ledger):
    from dp_accounting import dp_event
    from sage_tfx.ledger.accounting import event_to_json
    from sage_tfx.ledger import BlockSpec, open_ledger
    artifacts, _, spec = tfx_modules
    url, locations = block_ledger
    with open_ledger(url) as ledger:
        ledger.create_stream("rdp-stream", epsilon_g=1.0, delta_g=1e-5, mode="rdp")
        ledger.add_blocks("rdp-stream", [BlockSpec(b, loc) for b, loc in locations.items()])
    event = dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(noise_multiplier=20.0), 3)
    art = _run_gate(tfx_modules, tmp_path, "g", dict(
        _props(spec, url, run_id="dpsgd", window_last=4, event_json=event_to_json(event)),
        stream="rdp-stream"))
    grant = artifacts.read_grant(art)
    assert grant.mode == "rdp" and grant.event == event and grant.epsilon is None
    assert art.event_json == event_to_json(event)


def test_plan_is_charged_once_and_stored_beside_the_grant(tfx_modules, tmp_path, block_ledger):
    from sage_tfx.components import plan_io
    from sage_tfx.components.gate.component import SageGate
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    artifacts, executor, spec = tfx_modules
    url, _ = block_ledger
    plan = PrivacyPlan.of(PlanPart("transform", 0.1), PlanPart("train", 0.3, 1e-7),
                          PlanPart("validate", 0.2))
    plan_json, cost = executor.plan_cost(plan)
    art = _run_gate(tfx_modules, tmp_path, "g", _props(
        spec, url, run_id="planned", window_last=2, epsilon=cost["epsilon"], delta=cost["delta"],
        plan_json=plan_json))
    assert plan_io.read_plan(art) == plan
    assert art.epsilon == 0.6 and art.delta == 1e-7
    assert _charges(url)["2024-01-04"] == (0.6, 1)
    # An edited cost that disagrees with the plan is refused before anything is charged.
    with pytest.raises(ValueError, match="not the plan's cost"):
        _run_gate(tfx_modules, tmp_path, "g2", _props(
            spec, url, run_id="edited", window_last=2, epsilon=0.5, delta=1e-7,
            plan_json=plan_json))
    assert _charges(url)["2024-01-04"] == (0.6, 1)
    # The component derives the cost from the plan and refuses a second cost.
    gate = SageGate(ledger_url=url, stream=STREAM, window_last=2, plan=plan)
    assert gate.exec_properties[spec.EPSILON_KEY] == 0.6
    with pytest.raises(ValueError, match="not both"):
        SageGate(ledger_url=url, stream=STREAM, window_last=2, plan=plan, epsilon=0.6)


def test_min_records_met_releases_the_grant(tfx_modules, tmp_path, block_ledger):
    from blockdata import RECORDS_PER_BLOCK
    artifacts, executor, spec = tfx_modules
    url, locations = block_ledger
    art = _run_gate(tfx_modules, tmp_path, "m", _props(
        spec, url, run_id="enough", window_last=2, epsilon=0.25, min_records=2 * RECORDS_PER_BLOCK))
    grant = artifacts.read_grant(art)
    assert grant.status == "released" and grant.block_ids == DAY_BLOCKS[-2:]
    assert grant.locations == tuple(locations[b] for b in DAY_BLOCKS[-2:])
    assert _charges(url)["2024-01-04"] == (0.25, 1)


def test_min_records_unmet_denies_and_refunds(tfx_modules, tmp_path, block_ledger):
    """Too few records by the ledger's block sizes: the reservation is cancelled (refunded),
    the run denied with the reason, and a replay of the run id denies again without a charge."""
    from blockdata import RECORDS_PER_BLOCK
    from sage_tfx.ledger import open_ledger
    artifacts, executor, spec = tfx_modules
    url, _ = block_ledger
    before = _charges(url)
    props = _props(spec, url, run_id="too-small", window_last=2, epsilon=0.25,
                   min_records=2 * RECORDS_PER_BLOCK + 1)
    art = _run_gate(tfx_modules, tmp_path, "m", props)
    assert os.listdir(art.uri) == [artifacts.DENIED_FILE_NAME]
    assert f"hold {2 * RECORDS_PER_BLOCK} records" in art.reason
    assert _charges(url) == before
    again = _run_gate(tfx_modules, tmp_path, "m2", props)
    assert os.listdir(again.uri) == [artifacts.DENIED_FILE_NAME] and again.reason == art.reason
    assert _charges(url) == before
    with open_ledger(url) as ledger:
        [g] = [g for g in ledger.grants(STREAM) if g.run_id == "too-small"]
        assert g.status == "cancelled" and not ledger.check_consistency(STREAM)


@pytest.mark.parametrize("bad", [0, -3, 1.5, True])
def test_min_records_must_be_a_positive_integer(tfx_modules, bad):
    from sage_tfx.errors import InvalidRequestError
    _, executor, _ = tfx_modules
    with pytest.raises(InvalidRequestError, match="min_records"):
        executor.check_min_records(bad)
