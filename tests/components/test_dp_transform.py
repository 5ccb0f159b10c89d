"""DPTransform executor: Do() on generated Examples with a real SQLite ledger grant and plan.

Two full Transform runs (basic and rdp plans) are shared by module-scoped fixtures; every
refusal fails in tf.Transform's first trace, before data is read, and is checked to leave no
transform graph behind.
"""
import json
import os
import textwrap
import types

import numpy as np
import pytest

from blockdata import make_example, read_examples
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.dp.noise import SeededNoise

pytestmark = pytest.mark.slow

N_TRAIN, N_EVAL = 120, 30
KEYS = ("a", "b", "c")            # "c" never occurs in the data: released anyway (public domain)
LOWER, UPPER = 0.0, 10.0
TRANSFORM_EPSILON = 0.5
STREAM, RDP_STREAM = "events", "events_rdp"
BLOCKS = ("2024-01-01", "2024-01-02", "2024-01-03")

# A module file like a user writes: DP analyzers on the private features x and k, and a stock
# analyzer (exact z-score) on p, which is declared public.
DP_MODULE = """
import tensorflow as tf
import tensorflow_transform as tft
from sage_tfx.dp import mechanisms
from sage_tfx.components.dp_transform import analyzers as dp
from sage_tfx.dp.noise import SeededNoise

def preprocessing_fn(inputs, epsilon):
    mean_share, group_share = mechanisms.split_budget(epsilon, 0.0, [1, 1])
    x_mean = dp.dp_mean(inputs["x"], 0.0, 10.0, mean_share.epsilon, noise=SeededNoise(7),
                         name="x_mean")
    x_by_k = dp.dp_group_by_mean(inputs["k"], inputs["x"], ["a", "b", "c"], 0.0, 10.0,
                                 group_share.epsilon, noise=SeededNoise(8),
                                 name="x_by_k")
    return {
        "x_centered": inputs["x"] - x_mean,
        "x_by_k": x_by_k,
        "p_z": tft.scale_to_z_score(inputs["p"]),
        "label": inputs["label"],
    }
"""

# Bodies of preprocessing_fn(inputs, epsilon) that must be refused (each spends the whole ε on a
# DP mean first, so only the named problem is wrong).
_DP_PREFIX = 'x_mean = dp.dp_mean(inputs["x"], 0.0, 10.0, epsilon, name="x_mean")\n'
REFUSED = {
    "exact_mean_of_undeclared_feature": (
        'return {"x_mean": x_mean + 0.0 * inputs["x"], "p_mean": inputs["p"] - '
        'tft.mean(inputs["p"])}',
        [], "'mean/mean_and_var'", "public_features=['p']"),
    "public_masked_by_private": (
        'kept = tf.boolean_mask(inputs["p"], inputs["x"] > 5.0)\n'
        'return {"y": inputs["p"] - tft.mean(kept) + x_mean}',
        ["p"], "reads feature(s) ['x']", "public_features=['x']"),
    "public_conditioned_on_private": (
        'q = tf.cond(tf.reduce_max(inputs["x"]) > 5.0, lambda: inputs["p"], lambda: 2.0 * '
        'inputs["p"])\n'
        'return {"y": inputs["p"] - tft.mean(q) + x_mean}',
        ["p"], "reads feature(s) ['x']", "public_features=['x']"),
    "vocabulary_of_private": (
        'return {"k_id": tft.compute_and_apply_vocabulary(inputs["k"]), "m": x_mean + 0.0 * '
        'inputs["x"]}',
        ["p"], "compute_and_apply_vocabulary/vocabulary", "dp_compute_and_apply_vocabulary"),
    "scale_to_0_1_of_private": (
        'return {"x01": tft.scale_to_0_1(inputs["x"]) + x_mean}',
        [], "scale_to_0_1", "dp_scale_to_0_1"),
    "own_ptransform_analyzer": (
        'import apache_beam as beam\n'
        'class Leak(beam.PTransform):\n'
        '    def expand(self, pcoll):\n'
        '        return pcoll | beam.Map(lambda b: b[0].sum()) | beam.CombineGlobally(sum) | '
        'beam.Map(lambda s: [np.float32(s)])\n'
        '(total,) = tft.experimental.ptransform_analyzer([inputs["x"]], Leak(), [tf.float32], '
        '[[]])\n'
        'return {"t": inputs["x"] - total + x_mean}',
        ["p"], "reads feature(s) ['x']", "public_features=['x']"),
}


def _rows(n, offset=0):
    return [{"x": float((i * 7) % 10) + 0.5, "p": float(i % 5), "k": "ab"[i % 2],
             "label": i % 2} for i in range(offset, offset + n)]


TRAIN_ROWS, EVAL_ROWS = _rows(N_TRAIN), _rows(N_EVAL, offset=N_TRAIN)


@pytest.fixture(scope="module")
def tfx_modules():
    import tensorflow as tf
    from tfx.types import artifact_utils, standard_artifacts

    from sage_tfx.components import artifacts, plan_io
    from sage_tfx.components.dp_transform import audit, executor, privacy, spec
    return types.SimpleNamespace(tf=tf, artifact_utils=artifact_utils,
                                 standard_artifacts=standard_artifacts, artifacts=artifacts,
                                 plan_io=plan_io, audit=audit, executor=executor,
                                 privacy=privacy, spec=spec)


def _feature_spec(tf):
    return {"x": tf.io.FixedLenFeature([], tf.float32), "p": tf.io.FixedLenFeature([], tf.float32),
            "k": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}


def make_ledger(root):
    """A SQLite ledger: stream ``events`` (basic, ε_g = 1) and ``events_rdp`` (rdp, ε_g = 10).

    DPTransform never reads blocks (its Examples are given), so block locations are only names.
    """
    import datetime
    from sage_tfx.ledger import BlockSpec, open_ledger
    url = f"sqlite:///{root}/ledger.db"

    def specs():
        out = []
        for day in BLOCKS:
            start = datetime.date.fromisoformat(day)
            out.append(BlockSpec(day, f"{root}/blocks/{day}", f"{start}T00:00:00+00:00",
                                 f"{start + datetime.timedelta(days=1)}T00:00:00+00:00", 10))
        return out

    with open_ledger(url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=1.0, delta_g=1e-5, granularity="day")
        ledger.add_blocks(STREAM, specs())
        ledger.create_stream(RDP_STREAM, epsilon_g=10.0, delta_g=1e-5, mode="rdp",
                             granularity="day")
        ledger.add_blocks(RDP_STREAM, specs())
    return url


@pytest.fixture
def ledger_url(tmp_path):
    return make_ledger(tmp_path)


def write_examples(m, root, grant_id):
    """An Examples artifact laid out like ExampleGen output (Split-*/ gzip TFRecords)."""
    from blockdata import write_block_file
    art = m.standard_artifacts.Examples()
    art.uri = str(root)
    for split, rows in (("train", TRAIN_ROWS), ("eval", EVAL_ROWS)):
        write_block_file(os.path.join(art.uri, f"Split-{split}"), [make_example(r) for r in rows],
                         "data_tfrecord-00000-of-00001.gz")
    art.split_names = m.artifact_utils.encode_split_names(["train", "eval"])
    if grant_id is not None:
        art.set_string_custom_property("grant_id", grant_id)
    return art


def write_schema(m, root):
    from tensorflow_transform.tf_metadata import schema_utils
    from google.protobuf import text_format
    art = m.standard_artifacts.Schema()
    art.uri = str(root)
    os.makedirs(art.uri, exist_ok=True)
    schema = schema_utils.schema_from_feature_spec(_feature_spec(m.tf))
    with open(os.path.join(art.uri, "schema.pbtxt"), "w") as f:
        f.write(text_format.MessageToString(schema))
    return art


def write_granted(m, root, url, plan, *, stream=STREAM, run_id="run", blocks=BLOCKS[:2]):
    """Asks the ledger for the plan's cost, releases the grant, writes grant + plan artifacts."""
    from sage_tfx.ledger import open_ledger
    with open_ledger(url) as ledger:
        decision = ledger.request(stream, run_id=run_id, blocks=list(blocks), **plan.cost())
        assert decision.granted, decision.reason
        grant = ledger.release(decision.grant.grant_id)
    art = m.artifacts.SageGrant()
    art.uri = str(root)
    m.artifacts.write_grant(art, grant, stream=stream, run_id=run_id, context="default",
                            ledger_url=url)
    m.plan_io.write_plan(art, plan)
    return art, grant


def write_module(root, name, source):
    path = os.path.join(str(root), f"{name}.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(source))
    return path


class Run:
    """Inputs, outputs and exec properties of one DPTransform Do()."""

    def __init__(self, m, root, grant_art, grant_id, module_file, public_features=()):
        self.m = m
        self.graph = m.standard_artifacts.TransformGraph()
        self.graph.uri = str(root / "transform_graph")
        self.transformed = m.standard_artifacts.Examples()
        self.transformed.uri = str(root / "transformed_examples")
        os.makedirs(self.graph.uri, exist_ok=True)
        os.makedirs(self.transformed.uri, exist_ok=True)
        self.input_dict = {m.spec.EXAMPLES_KEY: [write_examples(m, root / "examples", grant_id)],
                           m.spec.SCHEMA_KEY: [write_schema(m, root / "schema")]}
        if grant_art is not None:
            self.input_dict[m.spec.GRANT_INPUT_KEY] = [grant_art]
        self.output_dict = {m.spec.TRANSFORM_GRAPH_KEY: [self.graph],
                            m.spec.TRANSFORMED_EXAMPLES_KEY: [self.transformed]}
        self.exec_properties = {m.spec.MODULE_FILE_KEY: module_file,
                                m.spec.PUBLIC_FEATURES_KEY: json.dumps(list(public_features))}

    def do(self):
        self.m.executor.Executor().Do(self.input_dict, self.output_dict, self.exec_properties)
        return self

    def assert_nothing_written(self):
        assert not os.path.exists(os.path.join(self.graph.uri, "transform_fn"))
        assert not os.path.exists(os.path.join(self.transformed.uri, "Split-train"))
        assert not self.graph.has_custom_property(self.m.spec.EPSILON_SPENT_PROPERTY)


def _transformed(run, split):
    return read_examples(os.path.join(run.transformed.uri, f"Split-{split}", "*.gz"))


def _values(examples, name):
    f = [e.features.feature[name] for e in examples]
    kind = f[0].WhichOneof("kind")
    return np.array([getattr(v, kind).value[0] for v in f])


# --- successful runs ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def basic_run(tfx_modules, tmp_path_factory):
    """DP_MODULE under a basic plan (transform ε = 0.5), p declared public."""
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    m = tfx_modules
    root = tmp_path_factory.mktemp("basic")
    url = make_ledger(root)
    plan = PrivacyPlan.of(PlanPart("transform", TRANSFORM_EPSILON), PlanPart("train", 0.25, 1e-6))
    grant_art, grant = write_granted(m, root / "grant", url, plan)
    run = Run(m, root, grant_art, grant.grant_id, write_module(root, "dp_module", DP_MODULE),
              public_features=["p"])
    return types.SimpleNamespace(run=run.do(), grant=grant, plan=plan, url=url, root=root)


def test_dp_run_writes_stock_outputs_with_noisy_constants(tfx_modules, basic_run):
    import tensorflow_transform as tft
    from sage_tfx.dp import mechanisms
    from sage_tfx.dp import queries
    run = basic_run.run
    # Stock Transform layout: a loadable transform graph and both splits materialized.
    output = tft.TFTransformOutput(run.graph.uri)
    assert set(output.transformed_feature_spec()) == {"x_centered", "x_by_k", "p_z", "label"}
    assert sorted(run.m.artifact_utils.decode_split_names(run.transformed.split_names)) == [
        "eval", "train"]  # stock Transform: every input split, in set order
    train, evals = _transformed(run, "train"), _transformed(run, "eval")
    assert (len(train), len(evals)) == (N_TRAIN, N_EVAL)

    # x_centered = x - (DP mean of train x): one noisy constant baked in for every record and split.
    x_train = np.array([r["x"] for r in TRAIN_ROWS])
    offsets = np.concatenate([
        np.array([r["x"] for r in rows]) - _values(ex, "x_centered")
        for rows, ex in ((TRAIN_ROWS, train), (EVAL_ROWS, evals))])
    np.testing.assert_allclose(offsets, offsets[0], atol=1e-5)
    share = mechanisms.split_budget(TRANSFORM_EPSILON, 0.0, [1, 1])
    expected = queries.dp_mean(x_train, LOWER, UPPER, share[0].epsilon,
                                  noise=SeededNoise(7)).value
    assert offsets[0] == pytest.approx(expected, abs=1e-4)       # the seeded Laplace release
    assert abs(offsets[0] - x_train.mean()) > 1e-3                # ... which is not the exact mean

    # The group-by mean is per key, noisy as well.
    by_k = dict(zip([r["k"] for r in TRAIN_ROWS], _values(train, "x_by_k")))
    exact_by_k = {k: x_train[[r["k"] == k for r in TRAIN_ROWS]].mean() for k in "ab"}
    assert all(abs(by_k[k] - exact_by_k[k]) > 1e-4 for k in "ab")

    # p is public: its exact z-score is allowed.
    p = np.array([r["p"] for r in TRAIN_ROWS])
    np.testing.assert_allclose(_values(train, "p_z"), (p - p.mean()) / p.std(), atol=1e-4)


def test_dp_run_records_spend_equal_to_plan_part(tfx_modules, basic_run):
    m, run = tfx_modules, basic_run.run
    g = run.graph
    assert g.get_string_custom_property(m.spec.GRANT_ID_PROPERTY) == basic_run.grant.grant_id
    assert g.get_string_custom_property(m.spec.PLAN_PART_PROPERTY) == "transform"
    assert g.get_string_custom_property(m.spec.ACCOUNTING_MODE_PROPERTY) == "basic"
    assert g.get_float_custom_property(m.spec.EPSILON_SPENT_PROPERTY) == TRANSFORM_EPSILON
    assert basic_run.plan.part("transform").epsilon == TRANSFORM_EPSILON
    spends = json.loads(g.get_string_custom_property(m.spec.SPENDS_PROPERTY))
    assert [s["name"] for s in spends] == ["x_mean", "x_by_k"]
    assert sum(s["epsilon"] for s in spends) == TRANSFORM_EPSILON
    public = json.loads(g.get_string_custom_property(m.spec.PUBLIC_ANALYZERS_PROPERTY))
    assert [(u["name"], u["features"]) for u in public] == [
        ("scale_to_z_score/mean_and_var", ["p"])]
    assert json.loads(g.get_string_custom_property(m.spec.PUBLIC_FEATURES_PROPERTY)) == ["p"]


@pytest.fixture(scope="module")
def rdp_run(tfx_modules, tmp_path_factory):
    """DP_MODULE under an rdp plan whose transform part is the event the module produces."""
    import dp_accounting
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    from tfx.utils import import_utils
    m = tfx_modules
    root = tmp_path_factory.mktemp("rdp")
    url = make_ledger(root)
    module = write_module(root, "dp_module_rdp", DP_MODULE)
    fn = import_utils.import_func_from_source(module, "preprocessing_fn")
    part = m.privacy.transform_plan_part(fn, _feature_spec(m.tf), TRANSFORM_EPSILON, mode="rdp")
    event = part.event
    plan = PrivacyPlan.of(part, PlanPart("train", event=dp_accounting.GaussianDpEvent(5.0)))
    grant_art, grant = write_granted(m, root / "grant", url, plan, stream=RDP_STREAM)
    run = Run(m, root, grant_art, grant.grant_id, module, public_features=["p"])
    return types.SimpleNamespace(run=run.do(), event=event, url=url, root=root, module=module,
                                 fn=fn)


def test_rdp_plan_part_is_the_composition_of_the_analyzers_laplace_events(tfx_modules, rdp_run):
    import dp_accounting
    from sage_tfx.ledger import accounting
    from sage_tfx.dp import mechanisms
    from sage_tfx.dp import queries
    m = tfx_modules
    share = mechanisms.split_budget(TRANSFORM_EPSILON, 0.0, [1, 1])
    expected = dp_accounting.ComposedDpEvent([
        queries.MeanQuery(LOWER, UPPER, share[0].epsilon).dp_event(),
        queries.GroupByMeanQuery(KEYS, LOWER, UPPER, share[1].epsilon).dp_event()])
    assert accounting.event_to_json(rdp_run.event) == accounting.event_to_json(expected)
    g = rdp_run.run.graph
    assert g.get_string_custom_property(m.spec.ACCOUNTING_MODE_PROPERTY) == "rdp"
    assert (g.get_string_custom_property(m.spec.DP_EVENT_PROPERTY)
            == accounting.event_to_json(expected))
    assert g.get_float_custom_property(m.spec.EPSILON_SPENT_PROPERTY) == TRANSFORM_EPSILON
    assert len(_transformed(rdp_run.run, "train")) == N_TRAIN


@pytest.mark.parametrize("epsilon,weights", [(0.5, [1, 1]), (0.58, [1, 0.5]), (0.96, [3, 0.5, 2]),
                                             (2.534821, [2])])
def test_rdp_budget_gives_the_analyzers_the_planned_mechanisms(tfx_modules, epsilon, weights):
    """The ε handed to an rdp preprocessing_fn reproduces the planned Laplace multipliers, with
    the part's epsilon param or without it (Σ 1/multiplier is often one ulp off the typed ε)."""
    import dp_accounting
    from sage_tfx.dp import mechanisms
    from sage_tfx.dp import queries
    from sage_tfx.adaptive.plan import PlanPart
    privacy = tfx_modules.privacy

    def event(e):
        shares = mechanisms.split_budget(e, 0.0, weights)
        return dp_accounting.ComposedDpEvent([
            (queries.MeanQuery(0, 10, s.epsilon) if i % 2 == 0
             else queries.CountQuery(s.epsilon)).dp_event() for i, s in enumerate(shares)])

    planned = event(epsilon)
    for part in (PlanPart("transform", event=planned),
                 PlanPart("transform", event=planned, params=(("epsilon", epsilon),))):
        budget = privacy.transform_budget(part)
        assert budget.epsilon == epsilon
        privacy.check_spent(budget, epsilon, event(budget.epsilon))
    with pytest.raises(InvalidPrivacyParameterError, match="declares epsilon"):
        privacy.transform_budget(PlanPart("transform", event=planned,
                                          params=(("epsilon", epsilon * 2),)))


# --- refusals: non-DP analyzers -------------------------------------------------------------------


@pytest.fixture
def granted(tfx_modules, tmp_path, ledger_url):
    """A basic grant whose plan's transform part is ε = 0.5."""
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    url = ledger_url
    plan = PrivacyPlan.of(PlanPart("transform", TRANSFORM_EPSILON), PlanPart("train", 0.25))
    art, grant = write_granted(tfx_modules, tmp_path / "grant", url, plan)
    return art, grant


def _module_with_body(root, name, body):
    source = ("import numpy as np\nimport tensorflow as tf\nimport tensorflow_transform as tft\n"
              "from sage_tfx.components.dp_transform import analyzers as dp\n\n"
              "def preprocessing_fn(inputs, epsilon):\n"
              + textwrap.indent(_DP_PREFIX + body, "    ") + "\n")
    return write_module(root, name, source)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_non_dp_analyzer_on_private_feature_is_refused(tfx_modules, tmp_path, granted, case):
    m = tfx_modules
    body, public, name_in_message, fix_in_message = REFUSED[case]
    art, grant = granted
    run = Run(m, tmp_path, art, grant.grant_id, _module_with_body(tmp_path, case, body),
              public_features=public)
    with pytest.raises(m.audit.NonDPAnalyzerError) as e:
        run.do()
    message = str(e.value)
    assert name_in_message in message and fix_in_message in message
    assert "not differentially private" in message
    run.assert_nothing_written()


def test_same_exact_analyzer_is_allowed_on_a_declared_public_feature(tfx_modules, tmp_path,
                                                                      granted):
    """The module refused for an exact tft.mean(p) is accepted once p is declared public."""
    m = tfx_modules
    body = REFUSED["exact_mean_of_undeclared_feature"][0]
    art, grant = granted
    module = _module_with_body(tmp_path, "allowed", body)
    refused = Run(m, tmp_path / "refused", art, grant.grant_id, module, public_features=[])
    with pytest.raises(m.audit.NonDPAnalyzerError, match=r"reads feature\(s\) \['p'\]"):
        refused.do()
    refused.assert_nothing_written()
    # Tracing alone is enough to show acceptance: run the audit exactly as the executor does.
    from sage_tfx.components.dp_transform import analyzers
    import tensorflow_transform as tft
    from tensorflow_transform import impl_helper
    from tfx.utils import import_utils
    user_fn = import_utils.import_func_from_source(module, "preprocessing_fn")
    audited = m.audit.AuditedPreprocessingFn(m.audit.bind_epsilon(user_fn, TRANSFORM_EPSILON),
                                             public_features=["p"])
    fn = analyzers.DPPreprocessingFn(audited, TRANSFORM_EPSILON)
    specs = impl_helper.get_type_specs_from_feature_specs(_feature_spec(m.tf))
    assert sorted(tft.get_analyze_input_columns(fn, specs)) == ["p", "x"]
    assert [(u.name, u.kind, u.features) for u in audited.analyzer_uses] == [
        ("x_mean", "dp", ()), ("mean/mean_and_var", "public", ("p",))]
    assert fn.budget.spent == TRANSFORM_EPSILON


def test_unknown_public_feature_is_rejected(tfx_modules, tmp_path, granted):
    art, grant = granted
    run = Run(tfx_modules, tmp_path, art, grant.grant_id,
              write_module(tmp_path, "m", DP_MODULE), public_features=["p", "no_such"])
    with pytest.raises(ValueError, match=r"public_features \['no_such'\]"):
        run.do()
    run.assert_nothing_written()


# --- refusals: no budget -------------------------------------------------------------------------


def test_no_grant_is_refused(tfx_modules, tmp_path):
    from sage_tfx.errors import MissingGrantError
    run = Run(tfx_modules, tmp_path, None, "g", write_module(tmp_path, "m", DP_MODULE))
    with pytest.raises(MissingGrantError, match="needs exactly one SageGrant"):
        run.do()
    run.assert_nothing_written()


def test_denied_grant_is_refused(tfx_modules, tmp_path, ledger_url):
    from sage_tfx.errors import MissingGrantError
    from sage_tfx.ledger import open_ledger
    m = tfx_modules
    url = ledger_url
    with open_ledger(url) as ledger:
        decision = ledger.request(STREAM, run_id="greedy", blocks=list(BLOCKS), epsilon=5.0)
    assert not decision.granted
    art = m.artifacts.SageGrant()
    art.uri = str(tmp_path / "denied")
    m.artifacts.write_grant(art, None, stream=STREAM, run_id="greedy", context="default",
                            ledger_url=url, reason=decision.reason)
    run = Run(m, tmp_path, art, None, write_module(tmp_path, "m", DP_MODULE))
    with pytest.raises(MissingGrantError, match="denied"):
        run.do()
    run.assert_nothing_written()


def test_plan_without_transform_part_is_refused(tfx_modules, tmp_path, ledger_url):
    from sage_tfx.errors import MissingGrantError
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    m = tfx_modules
    url = ledger_url
    art, grant = write_granted(m, tmp_path / "grant", url, PrivacyPlan.of(PlanPart("train", 0.5)))
    run = Run(m, tmp_path, art, grant.grant_id, write_module(tmp_path, "m", DP_MODULE))
    with pytest.raises(MissingGrantError, match="no 'transform' part"):
        run.do()
    run.assert_nothing_written()


def test_grant_without_plan_and_examples_of_another_grant_are_refused(tfx_modules, tmp_path,
                                                                       granted):
    from sage_tfx.errors import MissingGrantError
    m = tfx_modules
    art, grant = granted
    module = write_module(tmp_path, "m", DP_MODULE)
    run = Run(m, tmp_path / "other", art, "some-other-grant", module)
    with pytest.raises(MissingGrantError, match="not under grant"):
        run.do()
    run.assert_nothing_written()
    os.remove(os.path.join(art.uri, m.plan_io.PLAN_FILE_NAME))
    run = Run(m, tmp_path / "noplan", art, grant.grant_id, module)
    with pytest.raises(MissingGrantError, match="carries no privacy plan"):
        run.do()


def test_edited_plan_cannot_raise_the_budget(tfx_modules, tmp_path, granted):
    """A plan.json edited to give the transform more than the ledger charged is refused."""
    from sage_tfx.errors import MissingGrantError
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    m = tfx_modules
    art, grant = granted
    m.plan_io.write_plan(art, PrivacyPlan.of(PlanPart("transform", 1.0)))
    run = Run(m, tmp_path, art, grant.grant_id, write_module(tmp_path, "m", DP_MODULE),
              public_features=["p"])
    with pytest.raises(MissingGrantError, match="privacy plan costs"):
        run.do()
    run.assert_nothing_written()


# --- refusals: budget not spent exactly ----------------------------------------------------------


SPEND_CASES = {
    "underspent": ('return {"m": inputs["x"] - dp.dp_mean(inputs["x"], 0.0, 10.0, epsilon / 2)}',
                   "InvalidPrivacyParameterError", "spent epsilon=0.25 of its grant epsilon=0.5"),
    "overspent": ('a = dp.dp_mean(inputs["x"], 0.0, 10.0, epsilon, name="a")\n'
                  'b = dp.dp_count(inputs["x"], 0.01, name="b")\n'
                  'return {"m": inputs["x"] - a - b}',
                  "DPBudgetExceededError", "over by 0.01"),
    "nothing_spent": ('return {"m": inputs["x"] * 2.0}',
                      "InvalidPrivacyParameterError", "spent epsilon=0.0 of its grant"),
}


@pytest.mark.parametrize("case", sorted(SPEND_CASES))
def test_budget_must_be_spent_exactly(tfx_modules, tmp_path, granted, case):
    body, error_name, message = SPEND_CASES[case]
    art, grant = granted
    source = ("import tensorflow as tf\n"
              "from sage_tfx.components.dp_transform import analyzers as dp\n\n"
              "def preprocessing_fn(inputs, epsilon):\n" + textwrap.indent(body, "    ") + "\n")
    run = Run(tfx_modules, tmp_path, art, grant.grant_id, write_module(tmp_path, case, source))
    with pytest.raises(InvalidPrivacyParameterError, match=message) as e:
        run.do()
    assert type(e.value).__name__ == error_name
    run.assert_nothing_written()


def test_rdp_plan_with_other_mechanisms_is_refused(tfx_modules, tmp_path, rdp_run):
    """Same ε, different Laplace mechanisms (one release instead of the module's three)."""
    import dp_accounting
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    m = tfx_modules
    plan = PrivacyPlan.of(PlanPart("transform", event=dp_accounting.LaplaceDpEvent(2.0)))
    art, grant = write_granted(m, tmp_path / "grant", rdp_run.url, plan, stream=RDP_STREAM,
                               run_id="other-mechanisms")
    run = Run(m, tmp_path, art, grant.grant_id, rdp_run.module, public_features=["p"])
    with pytest.raises(InvalidPrivacyParameterError, match="other Laplace mechanisms"):
        run.do()
    run.assert_nothing_written()


def test_rdp_transform_part_must_be_laplace(tfx_modules, tmp_path, rdp_run):
    import dp_accounting
    from sage_tfx.errors import AccountingModeError
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    m = tfx_modules
    plan = PrivacyPlan.of(PlanPart("transform", event=dp_accounting.GaussianDpEvent(3.0)))
    art, grant = write_granted(m, tmp_path / "grant", rdp_run.url, plan, stream=RDP_STREAM,
                               run_id="gaussian")
    run = Run(m, tmp_path, art, grant.grant_id, rdp_run.module, public_features=["p"])
    with pytest.raises(AccountingModeError, match="compose LaplaceDpEvents only"):
        run.do()
    run.assert_nothing_written()


def test_basic_transform_part_with_unspent_delta_is_refused(tfx_modules, tmp_path, ledger_url):
    """Only DP partition selection spends δ: a part with δ and no DP vocabulary would leave
    charged δ unspent."""
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    m = tfx_modules
    url = ledger_url
    art, grant = write_granted(m, tmp_path / "grant", url,
                               PrivacyPlan.of(PlanPart("transform", 0.5, 1e-6)))
    run = Run(m, tmp_path, art, grant.grant_id, write_module(tmp_path, "m", DP_MODULE),
              public_features=["p"])
    with pytest.raises(InvalidPrivacyParameterError, match="spent delta=0.0 of its grant"):
        run.do()
    run.assert_nothing_written()


# --- component ------------------------------------------------------------------------------


def test_component_spec_is_a_transform_drop_in(tfx_modules):
    from tfx.types import channel_utils, standard_artifacts
    from sage_tfx.components.artifacts import SageGrant
    from sage_tfx.components.dp_transform import executor
    from sage_tfx.components.dp_transform.component import DPTransform
    spec = tfx_modules.spec
    examples = channel_utils.as_channel([standard_artifacts.Examples()])
    schema = channel_utils.as_channel([standard_artifacts.Schema()])
    grant = channel_utils.as_channel([SageGrant()])
    c = DPTransform(examples=examples, schema=schema, grant=grant, module_file="/m/dp.py",
                    public_features=["p", "q"])
    assert set(c.outputs) == {spec.TRANSFORM_GRAPH_KEY, spec.TRANSFORMED_EXAMPLES_KEY}
    graph_type = standard_artifacts.TransformGraph.TYPE_NAME
    assert c.outputs[spec.TRANSFORM_GRAPH_KEY].type_name == graph_type
    assert set(c.inputs) == {spec.EXAMPLES_KEY, spec.SCHEMA_KEY, spec.GRANT_INPUT_KEY}
    assert json.loads(c.exec_properties[spec.PUBLIC_FEATURES_KEY]) == ["p", "q"]
    assert c.executor_spec.executor_class is executor.Executor
    c = DPTransform(examples, schema, grant, preprocessing_fn="pkg.mod.fn", materialize=False)
    assert set(c.outputs) == {spec.TRANSFORM_GRAPH_KEY}
    assert json.loads(c.exec_properties[spec.PUBLIC_FEATURES_KEY]) == []
    with pytest.raises(ValueError, match="Exactly one of"):
        DPTransform(examples, schema, grant, module_file="/m.py", preprocessing_fn="a.b")
    with pytest.raises(ValueError, match="Exactly one of"):
        DPTransform(examples, schema, grant)
    with pytest.raises(ValueError, match="not a string"):
        DPTransform(examples, schema, grant, module_file="/m.py", public_features="p")
    with pytest.raises(ValueError, match="twice"):
        DPTransform(examples, schema, grant, module_file="/m.py", public_features=["p", "p"])
