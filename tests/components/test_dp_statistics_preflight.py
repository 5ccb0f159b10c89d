"""Check before charge for DPStatisticsGen and DPModelValidator's baseline part: the registry
knows the parts they spend (from their configuration) and refuses, when the pipeline is built,
a plan the executor would refuse after the charge."""
import json

import pytest

pytestmark = pytest.mark.slow

LEDGER = "sqlite:////tmp/never-opened.db"  # building and checking a pipeline opens no ledger


def _pipeline(plan, features, **validator):
    from tfx import v1 as tfx
    from sage_tfx.components import (BlockExampleGen, DPModelValidator, DPStatisticsGen,
                                     SageGate, preflight)
    gate = SageGate(ledger_url=LEDGER, stream="events", window_last=3, plan=plan)
    example_gen = BlockExampleGen(grant=gate.outputs["grant"])
    stats = DPStatisticsGen(examples=example_gen.outputs["examples"],
                            grant=gate.outputs["grant"], features=features)
    components = [gate, example_gen, stats]
    if validator:
        components.append(DPModelValidator(
            examples=example_gen.outputs["examples"], grant=gate.outputs["grant"],
            model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model), label_key="y",
            target=0.1, loss_bound=1.0, **validator))
    pipeline = tfx.dsl.Pipeline(pipeline_name="preflight", pipeline_root="/tmp/preflight-root",
                                components=components)
    return preflight.attach(pipeline), gate


def _features():
    from sage_tfx.dp.feature_statistics import CategoricalFeature, NumericFeature
    return [NumericFeature("x", 0.0, 1.0), CategoricalFeature("city")]


def test_parts_come_from_the_configuration_and_the_facts_reach_the_gate():
    from tfx import v1 as tfx
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    from sage_tfx.components.dp_statistics_gen import statistics_part
    plan = PrivacyPlan.of(statistics_part(_features(), 1.0, 1e-6), PlanPart("validate", 0.5),
                          PlanPart("baseline", 0.5))
    baseline = tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model)
    _, gate = _pipeline(plan, _features(), baseline_model=baseline)
    facts = json.loads(gate.exec_properties["preflight_json"])
    parts = {c["type"]: c["parts"] for c in facts["components"]}
    assert parts["DPStatisticsGen"] == ["statistics"]
    assert parts["DPModelValidator"] == ["validate", "baseline"]


@pytest.mark.parametrize("case,match", [
    ("vocabulary_without_delta", "delta > 0"),
    ("no_statistics_part", "does not have"),
    ("validator_without_baseline_part", "'baseline'"),
])
def test_a_plan_the_components_would_refuse_is_refused_at_build(case, match):
    from tfx import v1 as tfx
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    from sage_tfx.components.preflight import PreflightError
    validator = {}
    if case == "vocabulary_without_delta":
        plan = PrivacyPlan.of(PlanPart("statistics", 1.0))
    elif case == "no_statistics_part":
        plan = PrivacyPlan.of(PlanPart("validate", 1.0))
    else:
        plan = PrivacyPlan.of(PlanPart("statistics", 1.0, 1e-6), PlanPart("validate", 1.0))
        validator = {"baseline_model": tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model)}
    with pytest.raises(PreflightError, match=match):
        _pipeline(plan, _features(), **validator)
