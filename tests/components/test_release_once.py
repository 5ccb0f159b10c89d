"""Release once in Sage's components: the replay matrix of DPTransform and DPModelValidator.

For each component, one grant and ``Do()`` run: first (draws the release), again in the same
process into a new output directory, again into the first output directory (a pod retried in
place), in a new process into another directory; then two processes at once on a fresh grant.
Every case must end with one charge and one release record per grant, byte-identical outputs
(digests of the output trees), ``replayed`` = 1 on every run but the one that drew, and
``check_consistency`` clean. The noise is OpenDP's (never seeded), so a run that drew again
would publish different bytes. A run asked something else under the same grant is refused and
publishes nothing.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import release_driver
from blockdata import make_example, write_block_file

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
STREAM = "events"
BLOCKS = ("2024-01-01", "2024-01-02")
TRANSFORM_NAME = "transform/transform_graph"
VALIDATION_NAME = "validate/validation"

# OpenDP noise (no seed): a second draw would change the graph's constant.
MODULE = """
from sage_tfx.components.dp_transform import analyzers as dp

def preprocessing_fn(inputs, epsilon):
    x_mean = dp.dp_mean(inputs["x"], 0.0, 10.0, epsilon, name="x_mean")
    return {"x_centered": inputs["x"] - x_mean, "y": inputs["y"]}
"""


def _spawn(spec):
    """Popen of the driver in a new Python process (a retried pod)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, os.path.join(HERE, "release_driver.py"),
                             json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def _result(proc, timeout=900):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    [line] = [l for l in out.splitlines() if l.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """gzip Examples (train/eval), a schema, a DP module and a serving model, shared read-only."""
    import tensorflow as tf
    from google.protobuf import text_format
    from tensorflow_transform.tf_metadata import schema_utils
    root = tmp_path_factory.mktemp("release_once")
    rng = np.random.default_rng(5)
    examples = root / "examples"
    for split, n in (("train", 200), ("eval", 400)):
        x = rng.uniform(0.0, 1.0, n)
        rows = [{"x": float(v), "y": float(2 * v + 1 + rng.normal(0, 0.1))} for v in x]
        write_block_file(str(examples / f"Split-{split}"), [make_example(r) for r in rows],
                         "data_tfrecord-00000-of-00001.gz")
    schema = root / "schema"
    os.makedirs(schema)
    spec = {"x": tf.io.FixedLenFeature([], tf.float32), "y": tf.io.FixedLenFeature([], tf.float32)}
    (schema / "schema.pbtxt").write_text(
        text_format.MessageToString(schema_utils.schema_from_feature_spec(spec)))
    module = root / "dp_module.py"
    module.write_text(textwrap.dedent(MODULE))
    model = root / "model"
    inputs = tf.keras.Input(shape=(1,), name="x")
    dense = tf.keras.layers.Dense(1)
    keras_model = tf.keras.Model(inputs, dense(inputs))
    dense.set_weights([np.array([[2.0]], np.float32), np.array([1.0], np.float32)])

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(serialized):
        x = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([1], tf.float32)})["x"]
        return keras_model(x)

    keras_model.save(str(model / "Format-Serving"), save_format="tf",
                     signatures={"serving_default": serve.get_concrete_function()})
    return dict(root=root, examples_uri=str(examples), schema_uri=str(schema),
                module_file=str(module), model_uri=str(model))


def _grant(tmp_path, plan):
    """(url, grant): a fresh ledger of two blocks and the released grant of ``plan``."""
    from sage_tfx.ledger import BlockSpec, open_ledger
    url = f"sqlite:///{tmp_path}/ledger.db"
    with open_ledger(url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=10.0, delta_g=1e-5)
        ledger.add_blocks(STREAM, [BlockSpec(b, f"{tmp_path}/blocks/{b}") for b in BLOCKS])
        decision = ledger.request(STREAM, run_id="run", blocks=list(BLOCKS), **plan.cost())
        assert decision.granted, decision.reason
        return url, decision.grant


def _spec(world, url, component, grant, plan, out, **extra):
    return {"component": component, "ledger_url": url, "grant": grant.to_json(),
            "plan": plan.to_json(), "examples_uri": world["examples_uri"],
            "schema_uri": world["schema_uri"], "module_file": world["module_file"],
            "model_uri": world["model_uri"], "out": str(out), **extra}


def _ledger_state(url, grant):
    from sage_tfx.ledger import open_ledger
    with open_ledger(url) as ledger:
        grants = [g for g in ledger.grants(STREAM) if g.run_id == grant.run_id]
        charges = {b.block_id: b.charges for b in ledger.blocks(STREAM)}
        names = [r.name for r in ledger.releases(grant.grant_id)]
        return grants, charges, names, ledger.check_consistency(STREAM)


CASES = {
    "transform": dict(plan=lambda: _plan(("transform", 0.5)), outputs=("graph", "transformed"),
                      name=TRANSFORM_NAME, claim="part/transform",
                      other=dict(public_features=["y"])),
    "validator": dict(plan=lambda: _plan(("validate", 1.0)), outputs=("blessing",),
                      name=VALIDATION_NAME, claim="part/validate", other=dict(target=0.2)),
}


def _plan(*parts):
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    return PrivacyPlan.of(*[PlanPart(*p) for p in parts])


@pytest.mark.parametrize("component", sorted(CASES))
def test_retries_restarts_and_other_directories_replay_one_release(world, tmp_path, component):
    from sage_tfx.errors import ReleaseConflictError
    case = CASES[component]
    plan = case["plan"]()
    url, grant = _grant(tmp_path, plan)
    spec = lambda out, **kw: _spec(world, url, component, grant, plan, tmp_path / out, **kw)  # noqa

    first = release_driver.run(spec("first"))
    assert set(first["replayed"]) == {0}
    runs = {"same process, new directory": release_driver.run(spec("second")),
            "same process, same directory": release_driver.run(spec("first")),
            "new process, another directory": _result(_spawn(spec("third")))}
    for how, result in runs.items():
        assert set(result["replayed"]) == {1}, how
        for output in case["outputs"]:
            assert result[output] == first[output], f"{how}: {output} differs"

    grants, charges, names, problems = _ledger_state(url, grant)
    assert len(grants) == 1 and charges == {b: 1 for b in BLOCKS}
    assert sorted(names) == sorted([case["claim"], case["name"]]) and problems == []

    # Another request under the same grant: refused, nothing published, nothing recorded.
    with pytest.raises(ReleaseConflictError, match="refused to publish a second release") as e:
        release_driver.run(spec("other", **case["other"]))
    assert grant.grant_id in str(e.value) and case["name"] in str(e.value)
    other = tmp_path / "other"
    published = [p for p in other.rglob("*") if p.is_file() and "grant" not in p.parts]
    assert published == [] or component == "validator" and {p.name for p in published} == {
        "NOT_BLESSED"}
    assert sorted(_ledger_state(url, grant)[2]) == sorted([case["claim"], case["name"]])


@pytest.mark.parametrize("component", sorted(CASES))
def test_two_processes_at_once_publish_one_release(world, tmp_path, component):
    case = CASES[component]
    plan = case["plan"]()
    url, grant = _grant(tmp_path, plan)
    procs = [_spawn(_spec(world, url, component, grant, plan, tmp_path / f"p{i}"))
             for i in range(2)]
    a, b = [_result(p) for p in procs]
    assert sorted(a["replayed"][:1] + b["replayed"][:1]) == [0, 1]  # one drew, one replayed
    for output in case["outputs"]:
        assert a[output] == b[output]
    grants, charges, names, problems = _ledger_state(url, grant)
    assert len(grants) == 1 and charges == {b: 1 for b in BLOCKS}
    assert sorted(names) == sorted([case["claim"], case["name"]]) and problems == []
    # What both published is exactly the recorded release (the loser's own draw is gone).
    from sage_tfx.ledger import open_ledger
    with open_ledger(url) as ledger:
        rec = ledger.recorded_release(grant.grant_id, case["name"])
    if component == "transform":
        from sage_tfx.ledger.releases import digest_bytes, tree_bytes
        assert digest_bytes(tree_bytes(a["graph_uri"])) == rec.digest
        assert not any(n.startswith(".sage-release-") for n in os.listdir(tmp_path / "p0"))
    else:
        record = json.loads(rec.value)
        with open(os.path.join(a["blessing_uri"], "validation.json")) as f:
            assert json.load(f) == record["release"]
        assert a["outcome"] == b["outcome"] == record["release"]["outcome"]
