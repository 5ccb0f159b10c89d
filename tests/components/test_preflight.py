"""Check before charge (components/preflight.py): what a DP component would refuse from its
configuration is refused when the pipeline is built, and by the gate's executor before it
charges — the ledger is checked unchanged after every refusal.
"""
import json
import types

import pytest

from blockdata import STREAM

from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
from sage_tfx.components import preflight

SCHEMA = """
feature { name: "x" type: FLOAT presence { min_fraction: 1.0 } }
feature { name: "k" type: BYTES presence { min_fraction: 1.0 } }
"""
GOOD_MODULE = """
from sage_tfx.components.dp_transform import tft

def preprocessing_fn(inputs):
    return {"x": tft.scale_to_z_score(inputs["x"], lower=0.0, upper=10.0),
            "k": tft.compute_and_apply_vocabulary(inputs["k"], top_k=10)}
"""
STOCK_MODULE = """
import tensorflow_transform as tft

def preprocessing_fn(inputs):
    return {"x": tft.scale_to_z_score(inputs["x"]),
            "k": tft.compute_and_apply_vocabulary(inputs["k"])}
"""
PLAN = PrivacyPlan.of(PlanPart("transform", 0.5, 1e-6), PlanPart("train", 0.3, 1e-6))


def _facts(*components):
    return {"version": preflight.FACTS_VERSION,
            "components": [{"type": t, "id": i, "parts": p, "exec_properties": {}}
                           for t, i, p in components]}


# --- fast: plan parts against components -----------------------------------------------------

def test_every_consumer_must_find_its_part():
    facts = _facts(("DPTransform", "DPTransform", ["transform"]), ("DPTrainer", "t", ["train"]))
    preflight.check_parts(facts, PLAN)
    with pytest.raises(preflight.PreflightError, match="spends plan part 'transform', which the "
                                                       "plan does not have"):
        preflight.check_parts(facts, PrivacyPlan.of(PlanPart("train", 0.3, 1e-6)))


def test_no_two_components_may_spend_one_part():
    facts = _facts(("DPTrainer", "a", ["train"]), ("DnDTrainer", "b", ["train"]))
    with pytest.raises(preflight.PreflightError, match="'train' is spent by 2 components"):
        preflight.check_parts(facts, PLAN)


def test_registry_knows_the_dp_components_and_calls_a_per_component_check():
    assert preflight.registered("DPTransform").parts == ("transform",)
    for name in ("DPTrainer", "DnDTrainer", "DPBaggingTrainer"):
        assert preflight.registered(name).parts == ("train",)
    assert preflight.registered("DPModelValidator").parts == ("validate",)
    assert preflight.registered("DPTrainer").check == (
        "sage_tfx.components.dp_trainer.preflight:check")
    seen = []

    def check(props):
        seen.append(props)
        if props.get("bad"):
            raise preflight.InvalidRequestError("no model builder")

    preflight.register(preflight.Entry("ProbeTrainer", ("train",), check=check))
    try:
        facts = _facts(("ProbeTrainer", "p", ["train"]))
        facts["components"][0]["exec_properties"] = {"module_file": "m.py"}
        preflight.check_components(facts, PLAN)
        assert seen == [{"module_file": "m.py"}]
        facts["components"][0]["exec_properties"]["bad"] = 1
        with pytest.raises(preflight.PreflightError, match="ProbeTrainer 'p' would refuse this "
                                                           "run.*no model builder"):
            preflight.check_components(facts, PLAN)
    finally:
        preflight._REGISTRY.pop("ProbeTrainer")  # pylint: disable=protected-access


def test_gate_facts_are_checked_for_version_and_changed_files(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("x = 1\n")
    facts = _facts(("DPTransform", "DPTransform", ["transform"]))
    facts["components"][0].update(module_file=str(module),
                                   module_file_sha256=preflight.file_digest(str(module)))
    facts["checked_plan_json"] = PLAN.to_json()
    preflight.check_before_charge(json.dumps(facts), PLAN)
    module.write_text("x = 2\n")
    with pytest.raises(preflight.PreflightError, match="files changed since the pipeline"):
        preflight.check_before_charge(json.dumps(facts), PLAN)
    with pytest.raises(preflight.PreflightError, match="version"):
        preflight.check_before_charge(json.dumps({"version": 0}), PLAN)
    preflight.check_before_charge(None, PLAN)  # a pipeline built without attach: a warning


# --- slow: a built pipeline and the gate's executor ------------------------------------------

@pytest.fixture(scope="module")
def tfx_env():
    from tfx import v1 as tfx

    from sage_tfx.components import artifacts
    from sage_tfx.components.block_example_gen.component import BlockExampleGen
    from sage_tfx.components.dp_transform.component import DPTransform
    from sage_tfx.components.gate import executor as gate_executor, spec as gate_spec
    from sage_tfx.components.gate.component import SageGate
    return types.SimpleNamespace(tfx=tfx, artifacts=artifacts, BlockExampleGen=BlockExampleGen,
                                 DPTransform=DPTransform, SageGate=SageGate,
                                 gate_executor=gate_executor, gate_spec=gate_spec)


def build(env, tmp_path, url, module_source, plan, public=()):
    tmp_path.mkdir(parents=True, exist_ok=True)
    module = tmp_path / "module.py"
    module.write_text(module_source)
    schema = tmp_path / "schema.pbtxt"
    schema.write_text(SCHEMA)
    gate = env.SageGate(ledger_url=url, stream=STREAM, window_last=2, plan=plan,
                        run_id="preflight-run")
    example_gen = env.BlockExampleGen(grant=gate.outputs["grant"], ledger_url=url)
    schema_gen = env.tfx.components.ImportSchemaGen(schema_file=str(schema))
    transform = env.DPTransform(examples=example_gen.outputs["examples"],
                                schema=schema_gen.outputs["schema"], grant=gate.outputs["grant"],
                                module_file=str(module), public_features=list(public))
    pipeline = env.tfx.dsl.Pipeline(pipeline_name="preflight", pipeline_root=str(tmp_path / "r"),
                                    components=[gate, example_gen, schema_gen, transform])
    return pipeline, gate, module


def ledger_state(url):
    from sage_tfx.ledger import open_ledger
    with open_ledger(url) as ledger:
        return ([(b.block_id, b.epsilon_spent, b.charges) for b in ledger.blocks(STREAM)],
                [g.grant_id for g in ledger.grants(STREAM)])


def run_gate(env, tmp_path, gate):
    props = {k: v for k, v in gate.exec_properties.items()
             if isinstance(v, (str, int, float)) and v is not None}
    grant = env.artifacts.SageGrant()
    grant.uri = str(tmp_path / "grant")
    env.gate_executor.Executor(None).Do({}, {env.gate_spec.GRANT_KEY: [grant]}, props)
    return grant


@pytest.mark.slow
def test_non_dp_analyzer_is_refused_when_the_pipeline_is_built(tfx_env, tmp_path, block_ledger):
    url, _ = block_ledger
    before = ledger_state(url)
    pipeline, _, _ = build(tfx_env, tmp_path, url, STOCK_MODULE, PLAN)
    with pytest.raises(preflight.PreflightError) as refused:
        preflight.attach(pipeline)
    message = str(refused.value)
    assert "refuses 2 non-DP" in message and "['x']" in message and "['k']" in message
    assert "public_features=['k', 'x']" in message
    assert ledger_state(url) == before


@pytest.mark.slow
def test_good_pipeline_is_checked_at_build_and_charged_by_the_gate(tfx_env, tmp_path,
                                                                   block_ledger):
    url, _ = block_ledger
    pipeline, gate, _ = build(tfx_env, tmp_path, url, GOOD_MODULE, PLAN)
    preflight.attach(pipeline)
    facts = json.loads(gate.exec_properties[tfx_env.gate_spec.PREFLIGHT_JSON_KEY])
    (transform,) = facts["components"]
    assert transform["type"] == "DPTransform" and transform["parts"] == ["transform"]
    assert transform["schema_producer"] == "ImportSchemaGen" and transform["schema_sha256"]
    assert facts["checked_plan_json"] == PLAN.to_json()
    grant = run_gate(tfx_env, tmp_path, gate)
    assert grant.get_int_custom_property(tfx_env.artifacts.GRANTED_KEY) == 1
    # mismatched plan parts at build: the transform part is missing
    pipeline, gate, _ = build(tfx_env, tmp_path / "b", url, GOOD_MODULE,
                              PrivacyPlan.of(PlanPart("train", 0.3, 1e-6)))
    with pytest.raises(preflight.PreflightError, match="spends plan part 'transform'"):
        preflight.attach(pipeline)


@pytest.mark.slow
def test_gate_refuses_before_charging(tfx_env, tmp_path, block_ledger):
    """The gate re-checks the facts baked at build: an edited module, a plan whose parts do
    not match, and (facts never checked at build: re-run in a subprocess) a non-DP analyzer
    or shares that do not fit are all refused with the ledger unchanged."""
    url, _ = block_ledger
    before = ledger_state(url)
    pipeline, gate, module = build(tfx_env, tmp_path, url, GOOD_MODULE, PLAN)
    preflight.attach(pipeline)
    module.write_text(STOCK_MODULE)
    with pytest.raises(preflight.PreflightError, match="files changed"):
        run_gate(tfx_env, tmp_path, gate)
    assert ledger_state(url) == before

    pipeline, gate, module = build(tfx_env, tmp_path / "s", url, STOCK_MODULE, PLAN)
    gate.exec_properties[tfx_env.gate_spec.PREFLIGHT_JSON_KEY] = json.dumps(
        preflight.pipeline_facts(pipeline, gate))  # not checked at build
    with pytest.raises(preflight.PreflightError, match="DPTransform 'DPTransform' would refuse"
                                                       r"(.|\n)*non-DP"):
        run_gate(tfx_env, tmp_path / "s", gate)
    assert ledger_state(url) == before

    # shares that do not fit the transform part (DP vocabularies and no δ): the same check, run
    # in this process (the gate's subprocess run costs a TensorFlow import, shown above)
    no_delta = PrivacyPlan.of(PlanPart("transform", 0.5), PlanPart("train", 0.3, 1e-6))
    pipeline, gate, _ = build(tfx_env, tmp_path / "d", url, GOOD_MODULE, no_delta)
    with pytest.raises(preflight.PreflightError, match="spends delta"):
        preflight.check_components(preflight.pipeline_facts(pipeline, gate), no_delta)
    assert ledger_state(url) == before
