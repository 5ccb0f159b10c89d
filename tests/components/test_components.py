"""Component specs of SageGate and BlockExampleGen: channels, exec properties, argument checks.

Nothing runs here; the tests are slow-marked only because importing TFX takes ~30 s.
"""
import json

import pytest

pytestmark = pytest.mark.slow

URL = "sqlite:////tmp/ledger.db"


@pytest.fixture(scope="module")
def gate_mod():
    from sage_tfx.components.gate import component, executor, spec
    return component, executor, spec


def test_package_exports_lazily():
    import sage_tfx.components as c
    from sage_tfx.components.artifacts import SageGrant
    from sage_tfx.components.block_example_gen.component import BlockExampleGen
    from sage_tfx.components.gate.component import SageGate
    assert (c.SageGate, c.BlockExampleGen, c.SageGrant) == (SageGate, BlockExampleGen, SageGrant)
    assert {"SageGate", "BlockExampleGen", "SageGrant", "DPModelValidator", "DPTrainer",
            "DPTransform", "PTKTrainer", "PTKFeaturizer", "PTKState"} <= set(c.__all__)
    for name in c.__all__:  # every lazy name resolves to a component or artifact class
        assert isinstance(getattr(c, name), type), name
    with pytest.raises(AttributeError):
        c.NoSuchComponent  # noqa: B018


def test_sage_grant_type():
    import sage_tfx
    from sage_tfx.components import artifacts
    from sage_tfx.components.artifacts import SageGrant
    assert SageGrant.TYPE_NAME == "sage_tfx.SageGrant"
    # KFP v2 IR carries no declared properties of a custom type: everything is a custom property,
    # and a pod finds the class by importing the type name.
    assert not SageGrant.PROPERTIES
    assert sage_tfx.SageGrant is SageGrant
    g = SageGrant()
    for key in artifacts.GRANT_PROPERTY_KEYS:
        assert hasattr(SageGrant, key), key
    g.stream, g.num_blocks, g.epsilon = "flights", 3, 0.5
    assert g.get_string_custom_property("stream") == "flights"
    assert (g.num_blocks, g.epsilon, g.delta, g.reason) == (3, 0.5, 0.0, "")


def test_gate_window_spec(gate_mod):
    from tfx.dsl.placeholder import placeholder as ph
    from sage_tfx.components.artifacts import SageGrant
    component, _, spec = gate_mod
    gate = component.SageGate(ledger_url=URL, stream="flights", window_last=30,
                              window_min_blocks=20, epsilon=1, delta=1e-7)
    assert gate.outputs[spec.GRANT_KEY].type is SageGrant
    assert gate.inputs == {}
    p = gate.exec_properties
    assert (p[spec.LEDGER_URL_KEY], p[spec.STREAM_KEY], p[spec.CONTEXT_KEY]) == (
        URL, "flights", "default")
    assert (p[spec.WINDOW_LAST_KEY], p[spec.WINDOW_MIN_BLOCKS_KEY]) == (30, 20)
    assert p[spec.EPSILON_KEY] == 1.0 and isinstance(p[spec.EPSILON_KEY], float)
    assert p[spec.DELTA_KEY] == 1e-7
    assert p.get(spec.BLOCKS_KEY) is None and p.get(spec.RUN_ID_KEY) is None
    assert isinstance(p[spec.PIPELINE_RUN_ID_KEY], ph.Placeholder)
    for orchestrator, run_id in (("kubeflow", "{{$.pipeline_job_uuid}}"),
                                 ("airflow", "{{ dag.dag_id }}.{{ run_id }}")):
        g = component.SageGate(ledger_url=URL, stream="flights", window_last=3, epsilon=1,
                               orchestrator=orchestrator)
        assert g.exec_properties[spec.PIPELINE_RUN_ID_KEY] == run_id
    with pytest.raises(ValueError, match="orchestrator"):
        component.SageGate(ledger_url=URL, stream="flights", window_last=3, epsilon=1,
                           orchestrator="argo")


def test_gate_blocks_rdp_spec(gate_mod):
    from dp_accounting import dp_event
    from sage_tfx.ledger.accounting import event_to_json
    component, _, spec = gate_mod
    event_json = event_to_json(dp_event.GaussianDpEvent(2.0))
    gate = component.SageGate(ledger_url=URL, stream="s", blocks=("b1", "b2"),
                              event_json=event_json, context="analysts", run_id="nightly-1")
    p = gate.exec_properties
    assert json.loads(p[spec.BLOCKS_KEY]) == ["b1", "b2"]
    assert p[spec.EVENT_JSON_KEY] == event_json and p.get(spec.EPSILON_KEY) is None
    assert (p[spec.CONTEXT_KEY], p[spec.RUN_ID_KEY]) == ("analysts", "nightly-1")


@pytest.mark.parametrize("kwargs,match", [
    (dict(blocks=["a"], window_last=3, epsilon=0.1), "exactly one of blocks"),
    (dict(epsilon=0.1), "exactly one of blocks"),
    (dict(window_last=0, epsilon=0.1), "Window.last"),
    (dict(window_last=2, window_min_blocks=3, epsilon=0.1), "min_blocks"),
    (dict(blocks=["a"], window_min_blocks=1, epsilon=0.1), "needs window_last"),
    (dict(blocks=[], epsilon=0.1), "empty"),
    (dict(blocks="2024-01-01", epsilon=0.1), "list of block ids"),
    (dict(blocks=["a", "a"], epsilon=0.1), "twice"),
    (dict(window_last=3), "privacy cost"),
    (dict(window_last=3, delta=1e-6), "delta was given without epsilon"),
    (dict(window_last=3, epsilon=-0.1), "epsilon must be finite and > 0"),
    (dict(window_last=3, epsilon=0.0), "epsilon must be finite and > 0"),
    (dict(window_last=3, epsilon=float("nan")), "epsilon must be finite"),
    (dict(window_last=3, epsilon=float("inf")), "epsilon must be finite"),
    (dict(window_last=3, epsilon=0.1, delta=1.0), r"delta must lie in \[0, 1\)"),
    (dict(window_last=3, epsilon=0.1, delta=-1e-9), "delta must lie in"),
    (dict(window_last=3, epsilon="0.1"), "epsilon must be a number"),
    (dict(window_last=3, epsilon=0.1, event_json='{"class": "LaplaceDpEvent", '
          '"noise_multiplier": 1.0}'), "not both"),
    (dict(window_last=3, event_json="not json"), "not a serialized DpEvent"),
    (dict(window_last=3, event_json='{"class": "NoOpDpEvent"}'), "cannot be charged"),
    (dict(window_last=3, epsilon=0.1, stream="bad/stream"), "stream must be"),
    (dict(window_last=3, epsilon=0.1, context=""), "context must be"),
    (dict(window_last=3, epsilon=0.1, run_id="has space"), "run_id must be"),
    (dict(window_last=3, epsilon=0.1, ledger_url="/tmp/ledger.db"), "ledger_url must be"),
])
def test_gate_rejects_bad_arguments(gate_mod, kwargs, match):
    component, _, _ = gate_mod
    args = dict(ledger_url=URL, stream="s")
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        component.SageGate(**args)


def test_privacy_errors_are_invalid_privacy_parameter_errors(gate_mod):
    from sage_tfx.errors import InvalidPrivacyParameterError
    component, _, _ = gate_mod
    with pytest.raises(InvalidPrivacyParameterError):
        component.SageGate(ledger_url=URL, stream="s", window_last=1, epsilon=-1.0)


def test_derive_run_id_is_a_valid_bounded_ledger_name(gate_mod):
    _, executor, _ = gate_mod
    assert executor.derive_run_id("p", "SageGate", "2024-05-01T10:00:00.5") == (
        "p.SageGate.2024-05-01T10:00:00.5")
    odd = executor.derive_run_id("_my pipeline/ü", "gate", "run 1")
    assert odd.startswith("r_my-pipeline--.gate.run-1-") and len(odd) == 27 + 16
    executor.check_name("run id", odd)
    # Names that one text could stand for twice get the exact pair's hash: never shared.
    assert executor.derive_run_id("a.b", "c", "r") != executor.derive_run_id("a", "b.c", "r")
    assert executor.derive_run_id("my pipe", "g",
                                  "r") != executor.derive_run_id("my-pipe", "g", "r")
    long_a = executor.derive_run_id("p" * 200, "SageGate", "run-a")
    long_b = executor.derive_run_id("p" * 200, "SageGate", "run-b")
    assert len(long_a) == 128 and long_a != long_b
    executor.check_name("run id", long_a)


def test_block_example_gen_spec():
    from tfx.proto import example_gen_pb2
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils
    from sage_tfx.components.block_example_gen import component, spec
    from sage_tfx.components.gate.component import SageGate
    gate = SageGate(ledger_url=URL, stream="s", window_last=2, epsilon=0.1)
    eg = component.BlockExampleGen(grant=gate.outputs["grant"], ledger_url=URL)
    assert eg.inputs[spec.GRANT_INPUT_KEY] is gate.outputs["grant"]
    assert eg.outputs[spec.EXAMPLES_KEY].type is standard_artifacts.Examples
    p = eg.exec_properties
    config = proto_utils.json_to_proto(p[spec.OUTPUT_CONFIG_KEY], example_gen_pb2.Output())
    assert [(s.name, s.hash_buckets) for s in config.split_config.splits] == [
        ("train", 2), ("eval", 1)]
    assert p[spec.OUTPUT_DATA_FORMAT_KEY] == example_gen_pb2.FORMAT_TF_EXAMPLE
    assert p[spec.OUTPUT_FILE_FORMAT_KEY] == example_gen_pb2.FORMAT_TFRECORDS_GZIP
    assert p[spec.LEDGER_URL_KEY] == URL


@pytest.mark.parametrize("config,match", [
    ("no_splits", "needs output_config.split_config.splits"),
    ("zero_buckets", "invalid output_config"),
    ("duplicate", "invalid output_config"),
])
def test_block_example_gen_rejects_bad_output_config(config, match):
    from tfx.proto import example_gen_pb2 as pb
    from sage_tfx.components.block_example_gen.component import BlockExampleGen
    from sage_tfx.components.gate.component import SageGate
    gate = SageGate(ledger_url=URL, stream="s", window_last=2, epsilon=0.1)
    split = pb.SplitConfig.Split
    output_config = {
        "no_splits": pb.Output(split_config=pb.SplitConfig(partition_feature_name="x")),
        "zero_buckets": pb.Output(split_config=pb.SplitConfig(splits=[split(name="train")])),
        "duplicate": pb.Output(split_config=pb.SplitConfig(splits=[
            split(name="train", hash_buckets=1), split(name="train", hash_buckets=1)])),
    }[config]
    with pytest.raises(ValueError, match=match):
        BlockExampleGen(grant=gate.outputs["grant"], output_config=output_config)


def test_block_example_gen_rejects_bad_ledger_url():
    from sage_tfx.components.block_example_gen.component import BlockExampleGen
    from sage_tfx.components.gate.component import SageGate
    gate = SageGate(ledger_url=URL, stream="s", window_last=2, epsilon=0.1)
    with pytest.raises(ValueError, match="ledger_url must be"):
        BlockExampleGen(grant=gate.outputs["grant"], ledger_url="ledger.db")
