"""DPStatisticsGen: executor Do() on generated Examples, stock SchemaGen / ExampleValidator on its
output (their own executors, unchanged), release once, refusals, and the component spec.

Grants come from a real SQLite ledger with a privacy plan (trainerdata.grant_artifact).
"""
import json
import os

import numpy as np
import pytest

from trainerdata import grant as _grant

pytestmark = pytest.mark.slow

N_TRAIN, N_EVAL = 3000, 1500


@pytest.fixture(scope="module")
def mods():
    from sage_tfx.components import artifacts, plan_io
    from sage_tfx.components.dp_statistics_gen import component, executor, privacy, spec
    return component, executor, spec, artifacts, plan_io, privacy


def _features(vocabulary=True):
    """The declared features; ``city`` has no domain: its values come from partition
    selection."""
    from sage_tfx.dp.feature_statistics import CategoricalFeature, NumericFeature
    return (NumericFeature("x", 0.0, 10.0, num_bins=10),
            NumericFeature("k", 0.0, 8.0, dtype="int", num_bins=8),
            NumericFeature("tags", -1.0, 1.0, max_values=3),
            CategoricalFeature("color", domain=("red", "green", "blue", "violet")),
            *([CategoricalFeature("city")] if vocabulary else ()))


CITIES = ("paris", "lyon", "nice")  # each in ~1/3 of the rows; plus one row of "rare-town"


def _rows(rng, n, *, colors=("red", "green", "blue"), p_tags=0.6):
    """x ~ U(0, 10) always present; k ∈ {0..5} (int) always present; tags: 1-3 values in 60 %
    of the rows; color from ``colors``."""
    rows = []
    for _ in range(n):
        row = {"x": float(rng.uniform(0, 10)), "k": int(rng.integers(0, 6)),
               "color": str(rng.choice(colors)), "city": str(rng.choice(CITIES))}
        if rng.uniform() < p_tags:
            row["tags"] = [float(v) for v in rng.uniform(-1, 1, int(rng.integers(1, 4)))]
        rows.append(row)
    rows[0]["city"] = "rare-town"
    return rows


def _example(row):
    import tensorflow as tf
    ex = tf.train.Example()
    for name, value in row.items():
        f = ex.features.feature[name]
        values = value if isinstance(value, list) else [value]
        if isinstance(values[0], str):
            f.bytes_list.value.extend(v.encode() for v in values)
        elif isinstance(values[0], int):
            f.int64_list.value.extend(values)
        else:
            f.float_list.value.extend(values)
    return ex.SerializeToString()


def _write_examples(root, splits):
    import tensorflow as tf
    for split, rows in splits.items():
        os.makedirs(os.path.join(root, f"Split-{split}"))
        path = os.path.join(root, f"Split-{split}", "data_tfrecord-00000-of-00001.gz")
        with tf.io.TFRecordWriter(path, options="GZIP") as w:
            for row in rows:
                w.write(_example(row))
    return root


def _examples(uri, grant_id, splits=("train", "eval")):
    from tfx.types import artifact_utils, standard_artifacts
    ex = standard_artifacts.Examples()
    ex.uri = uri
    ex.split_names = artifact_utils.encode_split_names(list(splits))
    if grant_id is not None:
        ex.set_string_custom_property("grant_id", grant_id)
    return ex


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(11)
    splits = {"train": _rows(rng, N_TRAIN), "eval": _rows(rng, N_EVAL)}
    root = _write_examples(str(tmp_path_factory.mktemp("examples")), splits)
    return root, splits


def _plan(mods, epsilon=2.0, delta=1e-6, **kw):
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    privacy = mods[5]
    return PrivacyPlan.of(privacy.statistics_part(_features(), epsilon, delta, **kw),
                          PlanPart("train", 0.5))


def _props(spec, features=None, **kw):
    from sage_tfx.dp.feature_statistics import StatisticsConfig
    props = {spec.FEATURES_JSON_KEY: StatisticsConfig(tuple(features or _features())).to_json()}
    props.update(kw)
    return props


def _run(mods, tmp_path, *, grant, examples, name="statistics", **props):
    from tfx.types import standard_artifacts
    _, executor, spec, _, _, _ = mods
    stats = standard_artifacts.ExampleStatistics()
    stats.uri = str(tmp_path / name)
    executor.Executor().Do({spec.EXAMPLES_KEY: [examples], spec.GRANT_INPUT_KEY: [grant]},
                           {spec.STATISTICS_KEY: [stats]}, _props(spec, **props))
    return stats


def _load(stats, split):
    from tfx.components.statistics_gen import stats_artifact_utils
    return stats_artifact_utils.load_statistics(stats, split).proto()


def _feature(dataset, name):
    [f] = [f for f in dataset.features if f.path.step == [name]]
    return f


def _schema_gen(stats, uri):
    from tfx.components.schema_gen import executor as schema_executor
    from tfx.types import standard_artifacts, standard_component_specs as keys
    from tfx.utils import io_utils
    schema = standard_artifacts.Schema()
    schema.uri = uri
    schema_executor.Executor().Do({keys.STATISTICS_KEY: [stats]}, {keys.SCHEMA_KEY: [schema]},
                                  {keys.EXCLUDE_SPLITS_KEY: json.dumps(["eval"]),
                                   keys.INFER_FEATURE_SHAPE_KEY: True})
    return schema, io_utils.SchemaReader().read(os.path.join(uri, "schema.pbtxt"))


def _example_validator(stats, schema, uri):
    from tfx.components.example_validator import executor as validator_executor
    from tfx.types import standard_artifacts, standard_component_specs as keys
    anomalies = standard_artifacts.ExampleAnomalies()
    anomalies.uri = uri
    validator_executor.Executor().Do(
        {keys.STATISTICS_KEY: [stats], keys.SCHEMA_KEY: [schema]},
        {keys.ANOMALIES_KEY: [anomalies]}, {keys.EXCLUDE_SPLITS_KEY: json.dumps(["train"])})
    from tensorflow_metadata.proto.v0 import anomalies_pb2
    with open(os.path.join(uri, "Split-eval", "SchemaDiff.pb"), "rb") as f:
        return anomalies_pb2.Anomalies.FromString(f.read())


# ---------------------------------------------------------------------------------------------


def test_statistics_are_dp_and_stock_schema_gen_and_example_validator_run_on_them(
        mods, tmp_path, data):
    from tensorflow_metadata.proto.v0 import statistics_pb2
    _, _, spec, _, _, _ = mods
    root, splits = data
    grant = _grant(mods, tmp_path, _plan(mods))
    stats = _run(mods, tmp_path, grant=grant, examples=_examples(root, grant.grant_id))

    assert sorted(os.listdir(stats.uri)) == ["Split-eval", "Split-train", spec.DP_FILE_NAME,
                                             "sage_release.json"]
    assert stats.get_int_custom_property("replayed") == 0
    assert stats.get_float_custom_property("epsilon") == 2.0
    assert stats.get_string_custom_property("release_name") == "statistics/statistics"
    [train] = _load(stats, "train").datasets
    # Noisy, and close: ε = 2 over 14 queries is ε ≈ 0.14 per query (count noise scale ≈ 7).
    assert train.num_examples != N_TRAIN and abs(train.num_examples - N_TRAIN) < 150
    x = _feature(train, "x")
    assert x.type == statistics_pb2.FeatureNameStatistics.FLOAT
    common = x.num_stats.common_stats
    assert common.num_missing == 0 and common.num_non_missing == train.num_examples
    assert (common.min_num_values, common.max_num_values) == (1, 1)
    assert abs(x.num_stats.mean - 5.0) < 0.3 and abs(x.num_stats.median - 5.0) < 0.5
    assert abs(x.num_stats.std_dev - 10 / np.sqrt(12)) < 0.5
    assert [h.type for h in x.num_stats.histograms] == [
        statistics_pb2.Histogram.STANDARD, statistics_pb2.Histogram.QUANTILES]
    k = _feature(train, "k")
    assert k.type == statistics_pb2.FeatureNameStatistics.INT
    assert k.num_stats.max == pytest.approx(6.0)  # the right edge of bin [5, 6)
    assert abs(k.num_stats.num_zeros - N_TRAIN / 6) < 150
    tags = _feature(train, "tags").num_stats.common_stats
    assert (tags.min_num_values, tags.max_num_values) == (1, 3)
    assert abs(tags.num_missing - 0.4 * N_TRAIN) < 200
    color = _feature(train, "color")
    assert color.type == statistics_pb2.FeatureNameStatistics.STRING
    assert sorted(b.label for b in color.string_stats.rank_histogram.buckets) == [
        "blue", "green", "red"]  # "violet" (declared, never seen) is not listed
    assert color.string_stats.unique == 3
    city = _feature(train, "city").string_stats  # partition selection: the rare value is hidden
    assert sorted(v.value for v in city.top_values) == sorted(CITIES)
    assert all(abs(v.frequency - N_TRAIN / 3) < 150 for v in city.top_values)
    with open(os.path.join(stats.uri, spec.DP_FILE_NAME)) as f:
        budget = json.load(f)["budget_per_split"]
    assert [v["feature"] for v in budget["vocabularies"]] == ["city"]
    assert budget["vocabularies"][0]["delta"] == 1e-6

    schema_artifact, schema = _schema_gen(stats, str(tmp_path / "schema"))
    by_name = {f.name: f for f in schema.feature}
    assert by_name["x"].presence.min_fraction == 1.0 and by_name["x"].shape.dim[0].size == 1
    assert by_name["color"].presence.min_fraction == 1.0
    assert not by_name["tags"].presence.min_fraction  # optional: missing in 40 % of rows
    domains = {d.name: sorted(d.value) for d in schema.string_domain}
    assert domains == {"color": ["blue", "green", "red"], "city": sorted(CITIES)}

    anomalies = _example_validator(stats, schema_artifact, str(tmp_path / "anomalies"))
    assert not anomalies.anomaly_info, anomalies  # eval is drawn like train


def test_example_validator_flags_a_new_common_value_and_a_dropped_feature(mods, tmp_path, data):
    """Drift DP statistics can see: eval rows whose color is often 'violet' (in the declared
    domain, never in train) and whose x is gone."""
    root, splits = data
    rng = np.random.default_rng(5)
    drifted = _rows(rng, N_EVAL, colors=("red", "violet"))
    for row in drifted:
        del row["x"]
    root2 = _write_examples(str(tmp_path / "drifted"), {"train": splits["train"],
                                                         "eval": drifted})
    grant = _grant(mods, tmp_path, _plan(mods))
    stats = _run(mods, tmp_path, grant=grant, examples=_examples(root2, grant.grant_id))
    schema_artifact, _ = _schema_gen(stats, str(tmp_path / "schema"))
    anomalies = _example_validator(stats, schema_artifact, str(tmp_path / "anomalies"))
    assert set(anomalies.anomaly_info) == {"x", "color"}
    assert "violet" in anomalies.anomaly_info["color"].description


def test_replay_returns_the_recorded_statistics_byte_for_byte(mods, tmp_path, data):
    from sage_tfx.ledger import releases
    root, _ = data
    grant = _grant(mods, tmp_path, _plan(mods))
    examples = _examples(root, grant.grant_id)
    first = _run(mods, tmp_path, grant=grant, examples=examples, name="first")
    again = _run(mods, tmp_path, grant=grant, examples=examples, name="again")
    assert again.get_int_custom_property("replayed") == 1
    assert releases.tree_digest(first.uri) == releases.tree_digest(again.uri)
    assert again.split_names == first.split_names


def test_another_configuration_under_the_same_grant_is_refused(mods, tmp_path, data):
    from sage_tfx.dp.feature_statistics import NumericFeature
    from sage_tfx.errors import ReleaseConflictError
    root, _ = data
    grant = _grant(mods, tmp_path, _plan(mods))
    examples = _examples(root, grant.grant_id)
    _run(mods, tmp_path, grant=grant, examples=examples, name="first")
    with pytest.raises(ReleaseConflictError, match="refused to publish a second release"):
        _run(mods, tmp_path, grant=grant, examples=examples, name="second",
             features=(NumericFeature("x", 0.0, 20.0),))
    assert not os.path.exists(tmp_path / "second") or not os.listdir(tmp_path / "second")


def test_rdp_part_is_the_exact_event(mods, tmp_path, data):
    from sage_tfx.adaptive.plan import PrivacyPlan
    root, _ = data
    part = mods[5].statistics_part(_features(vocabulary=False), 2.0, rdp=True)
    grant = _grant(mods, tmp_path, PrivacyPlan.of(part), mode="rdp")
    stats = _run(mods, tmp_path, grant=grant, examples=_examples(root, grant.grant_id),
                 features=_features(vocabulary=False))
    assert stats.get_float_custom_property("epsilon") == 2.0
    with open(os.path.join(stats.uri, mods[2].DP_FILE_NAME)) as f:
        budget = json.load(f)["budget_per_split"]
    assert sum(q["epsilon"] for q in budget["queries"]) <= 2.0


@pytest.mark.parametrize("case,match", [
    ("no_part", "no 'statistics' part"),
    ("examples_of_another_grant", "record grant"),
    ("examples_without_grant", "record grant"),
    ("rdp_other_event", "not these statistics' dp_event"),
    ("vocabulary_without_delta", "delta > 0"),
])
def test_refusals_before_any_example_is_read(mods, tmp_path, case, match):
    import dp_accounting
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    from sage_tfx.errors import MissingGrantError
    mode, plan = "basic", _plan(mods)
    if case == "no_part":
        plan = PrivacyPlan.of(PlanPart("train", 0.5))
    if case == "rdp_other_event":
        mode = "rdp"
        plan = PrivacyPlan.of(PlanPart("statistics", event=dp_accounting.LaplaceDpEvent(1.0),
                                       params=(("epsilon", 1.0),)))
    if case == "vocabulary_without_delta":
        plan = PrivacyPlan.of(PlanPart("statistics", 2.0))
    grant = _grant(mods, tmp_path, plan, mode=mode)
    grant_id = {"examples_of_another_grant": "grant-other",
                "examples_without_grant": None}.get(case, grant.grant_id)
    # A directory without any data: the refusal must come before anything is read.
    examples = _examples(str(tmp_path / "nothing"), grant_id)
    features = _features(vocabulary=case == "vocabulary_without_delta")
    with pytest.raises(MissingGrantError, match=match):
        _run(mods, tmp_path, grant=grant, examples=examples, features=features)


def test_component_spec(mods):
    from tfx.types import channel_utils, standard_artifacts
    from sage_tfx.components.artifacts import SageGrant
    from sage_tfx.dp.feature_statistics import StatisticsConfig
    component, _, spec, _, _, _ = mods
    c = component.DPStatisticsGen(
        examples=channel_utils.as_channel([standard_artifacts.Examples()]),
        grant=channel_utils.as_channel([SageGrant()]), features=_features(),
        exclude_splits=["test"])
    assert c.outputs[spec.STATISTICS_KEY].type == standard_artifacts.ExampleStatistics
    props = c.exec_properties
    assert StatisticsConfig.from_json(props[spec.FEATURES_JSON_KEY]).features == _features()
    assert json.loads(props[spec.EXCLUDE_SPLITS_KEY]) == ["test"]
    assert props[spec.PLAN_PART_KEY] == "statistics"


@pytest.mark.parametrize("kwargs,match", [
    ({"failure_probability": 0.0}, "failure_probability"),
    ({"num_quantiles": 0}, "num_quantiles"),
    ({"plan_part": "bad part"}, "release name"),
    ({"exclude_splits": "eval"}, "exclude_splits"),
    ({"ledger_url": "mysql://x"}, "ledger_url"),
])
def test_component_rejects_bad_arguments(mods, kwargs, match):
    from tfx.types import channel_utils, standard_artifacts
    from sage_tfx.components.artifacts import SageGrant
    component = mods[0]
    with pytest.raises(ValueError, match=match):
        component.DPStatisticsGen(
            examples=channel_utils.as_channel([standard_artifacts.Examples()]),
            grant=channel_utils.as_channel([SageGrant()]), features=_features(), **kwargs)
