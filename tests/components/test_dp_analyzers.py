"""Slow tests of the DP tf.Transform analyzers (components/dp_transform/analyzers.py).

They run tensorflow_transform on Beam's in-process runner and check that (a) each analyzer
releases the exact statistic plus exactly the noise the same seeded source gives (so the noise scale
is the one tested in test_mechanisms.py), (b) the noise is drawn once, in Beam, and baked into the
transform graph as a constant (same value for every batch; the exact statistic is not in the
graph), (c) group-by releases every key of the public domain, and (d) the budget is enforced.

TensorFlow is imported inside fixtures so that ``pytest -m "not slow"`` does not pay for it.
"""
import functools
import os
import pickle
import tempfile
import types

import numpy as np
import pytest

from sage_tfx.dp import mechanisms as m
from sage_tfx.dp import histograms
from sage_tfx.dp import queries
from sage_tfx.errors import InvalidPrivacyParameterError, MissingGrantError
from sage_tfx.dp.noise import SeededNoise

pytestmark = pytest.mark.slow

N = 240
KEY_DOMAIN = ["a", "b", "c"]       # "c" never occurs; "d" occurs but is outside the domain
INT_DOMAIN = [0, 1, 2, 3, 4]       # 4 never occurs
LOWER, UPPER = 0.0, 10.0
BIN_EDGES = [0.0, 2.5, 5.0, 7.5, 10.0]
COUNT_SEEDS = [101, 102, 103, 104, 105]


def make_rows(n: int = N, offset: int = 0) -> list[dict]:
    rows = []
    for i in range(offset, offset + n):
        rows.append({
            "x": float((i * 7) % 13) - 1.5,       # in [-1.5, 10.5]: some values get clipped
            "k": "abd"[i % 3],
            "h": i % 4,
        })
    return rows


@pytest.fixture(scope="module")
def env():
    import apache_beam as beam
    import tensorflow as tf
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam

    from sage_tfx.components.dp_transform import analyzers
    metadata = tft.DatasetMetadata.from_feature_spec({
        "x": tf.io.FixedLenFeature([], tf.float32),
        "k": tf.io.FixedLenFeature([], tf.string),
        "h": tf.io.FixedLenFeature([], tf.int64),
    })
    return types.SimpleNamespace(beam=beam, tf=tf, tft=tft, tft_beam=tft_beam, A=analyzers,
                                 metadata=metadata)


def columns(rows):
    return (np.array([r["x"] for r in rows]), np.array([r["k"] for r in rows]),
            np.array([r["h"] for r in rows]))


# The module file a Sage user would write: preprocessing_fn(inputs, epsilon) (List. 1), with the
# grant split across the DP analyzers.
N_ANALYZERS = 9 + len(COUNT_SEEDS)


def sage_preprocessing_fn(inputs, epsilon, env):
    tf, A = env.tf, env.A
    shares = [s.epsilon for s in m.split_budget(epsilon, 0.0, [1] * N_ANALYZERS)]
    x, k, h = inputs["x"], inputs["k"], inputs["h"]
    batch = tf.shape(x)[0]

    def per_instance(stat):
        stat = tf.reshape(stat, [1, -1])
        return tf.tile(stat, [batch, 1])

    out = {
        "sum": per_instance(A.dp_sum(x, LOWER, UPPER, shares[0], noise=SeededNoise(1))),
        "mean": per_instance(A.dp_mean(x, LOWER, UPPER, shares[1], noise=SeededNoise(2))),
        "group_count": per_instance(
            A.dp_group_by_count(k, KEY_DOMAIN, shares[2], noise=SeededNoise(3))),
        "group_sum": per_instance(A.dp_group_by_sum(h, x, INT_DOMAIN, LOWER, UPPER, shares[3],
                                                    noise=SeededNoise(4))),
        "group_mean_per_key": per_instance(A.dp_group_by_mean_per_key(
            k, x, KEY_DOMAIN, LOWER, UPPER, shares[4], noise=SeededNoise(5))),
        "hour_mean": A.dp_group_by_mean(h, x, INT_DOMAIN, LOWER, UPPER, shares[5],
                                        noise=SeededNoise(6)),
        "histogram": per_instance(A.dp_histogram(x, BIN_EDGES, shares[6], noise=SeededNoise(7))),
        "x_01": A.dp_scale_to_0_1(x, LOWER, UPPER, shares[7], num_bins=20, noise=SeededNoise(8)),
        "quantiles": per_instance(A.dp_quantiles(x, [0.25, 0.5, 0.75], LOWER, UPPER, shares[8],
                                                 num_bins=20, noise=SeededNoise(9))),
    }
    for i, seed in enumerate(COUNT_SEEDS):
        out[f"count_{seed}"] = per_instance(A.dp_count(x, shares[9 + i], noise=SeededNoise(seed)))
    return out


def analyze_and_transform(env, preprocessing_fn, rows, force_tf_compat_v1=False):
    with env.tft_beam.Context(temp_dir=tempfile.mkdtemp(), force_tf_compat_v1=force_tf_compat_v1):
        (transformed, _), _ = ((rows, env.metadata)
                               | env.tft_beam.AnalyzeAndTransformDataset(preprocessing_fn))
    return transformed


@pytest.fixture(scope="module", params=[False, True], ids=["tf2", "tf_compat_v1"])
def run(request, env):
    rows = make_rows()
    fn = env.A.DPPreprocessingFn(functools.partial(sage_preprocessing_fn, epsilon=7.0, env=env),
                                 epsilon=7.0)
    transformed = analyze_and_transform(env, fn, rows, force_tf_compat_v1=request.param)
    return types.SimpleNamespace(rows=rows, transformed=transformed, fn=fn)


def released(run, name):
    """The released constant (checking every instance got the same one)."""
    values = np.array([np.asarray(t[name]) for t in run.transformed])
    np.testing.assert_array_equal(values, np.broadcast_to(values[0], values.shape))
    return values[0]


def reference(query, *cols, seed):
    """What the numpy core releases for the same data and seed."""
    return np.asarray(query.run(*cols, noise=SeededNoise(seed)).value, dtype=np.float32)


# --- (a) exact statistic + the seeded noise ---------------------------------------------------


def test_each_analyzer_matches_seeded_numpy_release(run):
    x, k, h = columns(run.rows)
    shares = [s.epsilon for s in m.split_budget(7.0, 0.0, [1] * N_ANALYZERS)]
    expected = {
        "sum": reference(queries.SumQuery(LOWER, UPPER, shares[0]), x, seed=1),
        "mean": reference(queries.MeanQuery(LOWER, UPPER, shares[1]), x, seed=2),
        "group_count": reference(
            queries.GroupByCountQuery(tuple(KEY_DOMAIN), shares[2]), k, seed=3),
        "group_sum": reference(queries.GroupBySumQuery(tuple(INT_DOMAIN), LOWER, UPPER, shares[3]),
                               h, x, seed=4),
        "group_mean_per_key": reference(
            queries.GroupByMeanQuery(tuple(KEY_DOMAIN), LOWER, UPPER, shares[4]), k, x, seed=5),
        "histogram": reference(histograms.HistogramQuery(tuple(BIN_EDGES), shares[6]), x, seed=7),
        "quantiles": reference(
            histograms.QuantilesQuery((0.25, 0.5, 0.75), LOWER, UPPER, shares[8], 20),
                               x, seed=9),
    }
    for seed, share in zip(COUNT_SEEDS, shares[9:]):
        expected[f"count_{seed}"] = reference(queries.CountQuery(share), x, seed=seed)
    for name, value in expected.items():
        np.testing.assert_allclose(np.ravel(released(run, name)), np.ravel(value), rtol=1e-6,
                                   atol=1e-5, err_msg=name)


def test_noise_has_the_mechanism_scale(run):
    """Noise = release − exact statistic equals the Laplace draw of the right scale."""
    x, _, _ = columns(run.rows)
    shares = [s.epsilon for s in m.split_budget(7.0, 0.0, [1] * N_ANALYZERS)]
    noises = []
    for seed, share in zip(COUNT_SEEDS, shares[9:]):
        noise = float(np.ravel(released(run, f"count_{seed}"))[0]) - N
        assert noise == pytest.approx(np.random.default_rng(seed).laplace(0.0, 1.0 / share),
                                      abs=1e-4)
        noises.append(noise)
    assert len(set(noises)) == len(noises)  # independent seeds, distinct draws
    exact_sum = np.clip(x, LOWER, UPPER).sum()
    sum_noise = float(np.ravel(released(run, "sum"))[0]) - exact_sum
    scale = max(abs(LOWER), abs(UPPER)) / shares[0]
    assert sum_noise == pytest.approx(np.random.default_rng(1).laplace(0.0, scale), rel=1e-4,
                                      abs=1e-2)
    assert sum_noise != 0.0


def test_per_instance_outputs(run):
    x, _, h = columns(run.rows)
    means = reference(queries.GroupByMeanQuery(tuple(INT_DOMAIN), LOWER, UPPER,
                                         m.split_budget(7.0, 0.0, [1] * N_ANALYZERS)[5].epsilon),
                      h, x, seed=6)
    low, high = reference(histograms.MinMaxQuery(LOWER, UPPER, m.split_budget(
        7.0, 0.0, [1] * N_ANALYZERS)[7].epsilon, num_bins=20), x, seed=8)
    assert LOWER <= low < high <= UPPER
    for row, t in zip(run.rows, run.transformed):
        assert t["hour_mean"] == pytest.approx(means[row["h"]], rel=1e-6, abs=1e-6)
        scaled = (min(max(row["x"], low), high) - low) / (high - low)
        assert t["x_01"] == pytest.approx(scaled, abs=1e-6)
        assert 0.0 <= t["x_01"] <= 1.0


def test_budget_records_every_analyzer(run):
    spends = run.fn.budget.spends
    assert len(spends) == N_ANALYZERS
    assert [s.name for s in spends][:3] == ["dp_sum", "dp_mean", "dp_group_by_count"]
    assert [s.name for s in spends][-2:] == ["dp_count_3", "dp_count_4"]
    assert run.fn.budget.spent == pytest.approx(7.0, rel=1e-12)
    assert run.fn.budget.spent <= 7.0
    event = run.fn.budget.dp_event()
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant
    assert isinstance(event, dp_accounting.ComposedDpEvent)
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(event)
    assert accountant.get_epsilon(1e-12) == pytest.approx(7.0, rel=1e-5)


def test_os_randomness_by_default(env):
    rows = make_rows(50)

    def fn(inputs):
        x = inputs["x"]
        return {"c": tf_fill(env, x, env.A.dp_count(x, 1.0)),
                "d": tf_fill(env, x, env.A.dp_count(x, 1.0))}

    out = analyze_and_transform(env, env.A.DPPreprocessingFn(fn, 2.0), rows)
    assert out[0]["c"] != out[0]["d"]  # unseeded analyzers draw independent noise
    assert abs(out[0]["c"] - 50) < 60.0  # Laplace(1): P(|noise| > 60) = e^-60


def tf_fill(env, like, value):
    return env.tf.fill(env.tf.shape(like), value)


# --- (b) noise drawn once, in Beam, baked into the graph as a constant ------------------------


def _graph_float_constants(saved_model_dir):
    from tensorflow.core.protobuf import saved_model_pb2
    import tensorflow as tf
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    values = []
    for meta_graph in proto.meta_graphs:
        nodes = list(meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            nodes.extend(function.node_def)
        for node in nodes:
            if node.op == "Const" and node.attr["dtype"].type in (tf.float32.as_datatype_enum,
                                                                  tf.float64.as_datatype_enum):
                values.extend(np.ravel(tf.make_ndarray(node.attr["value"].tensor)).tolist())
    return np.array(values)


@pytest.mark.parametrize("force_tf_compat_v1", [False, True], ids=["tf2", "tf_compat_v1"])
def test_noise_drawn_once_and_constant_across_batches(env, tmp_path, force_tf_compat_v1):
    beam, tf, tft, A = env.beam, env.tf, env.tft, env.A
    rows = make_rows()

    def user_fn(inputs):
        x = inputs["x"]
        return {"sum": tf_fill(env, x, A.dp_sum(x, LOWER, UPPER, 0.5)),
                "counts": A.dp_group_by_count(inputs["k"], KEY_DOMAIN, 0.5)[0] + 0 * x}

    fn = A.DPPreprocessingFn(user_fn, 1.0)
    out_dir = str(tmp_path / "transform_fn")
    with env.tft_beam.Context(temp_dir=str(tmp_path / "tmp"),
                              force_tf_compat_v1=force_tf_compat_v1):
        pipeline = beam.Pipeline()
        raw = pipeline | beam.Create(rows)
        transform_fn = (raw, env.metadata) | env.tft_beam.AnalyzeDataset(fn)
        _ = transform_fn | env.tft_beam.WriteTransformFn(out_dir)
        result = pipeline.run()
        result.wait_until_finish()

    # Exactly one noise draw per analyzer in the whole Beam run.
    draws = result.metrics().query(beam.metrics.MetricsFilter()
                                   .with_namespace(A.METRICS_NAMESPACE)
                                   .with_name(A.NOISE_DRAWS_COUNTER))["counters"]
    assert sum(c.committed for c in draws) == 2

    # The saved transform applied to two different batches gives the same constant.
    output = tft.TFTransformOutput(out_dir)

    def features(batch_rows):
        return {
            "x": tf.constant([r["x"] for r in batch_rows], tf.float32),
            "k": tf.constant([r["k"] for r in batch_rows]),
            "h": tf.constant([r["h"] for r in batch_rows], tf.int64),
        }

    def apply(batch_rows):
        if not force_tf_compat_v1:
            got = output.transform_raw_features(features(batch_rows), drop_unused_features=True)
            return {name: np.asarray(value) for name, value in got.items()}
        with tf.compat.v1.Graph().as_default():  # a TF1 SavedModel is applied in a session
            got = output.transform_raw_features(features(batch_rows), drop_unused_features=True)
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.tables_initializer())
                return session.run(got)

    first, second = apply(rows[:5]), apply(make_rows(17, offset=1000))
    for name in ("sum", "counts"):
        assert len(set(first[name].tolist()) | set(second[name].tolist())) == 1, name
    noisy_sum = float(first["sum"][0])

    # Only the noisy value is in the graph, never the exact statistic.
    exact_sum = float(np.float32(np.clip(columns(rows)[0], LOWER, UPPER).sum()))
    assert noisy_sum != exact_sum
    constants = _graph_float_constants(output.transform_savedmodel_dir)
    assert np.any(np.isclose(constants, noisy_sum, rtol=0, atol=0))
    assert not np.any(np.isclose(constants, exact_sum, rtol=1e-7, atol=0))


# --- (c) group-by over a public key domain ----------------------------------------------------


def test_group_by_releases_every_domain_key(run):
    _, k, h = columns(run.rows)
    counts = np.ravel(released(run, "group_count"))
    assert counts.shape == (len(KEY_DOMAIN),)
    # "c" has no record but is released (pure noise: the seeded draw of its coordinate);
    # "d" is outside the domain and counted nowhere.
    share = m.split_budget(7.0, 0.0, [1] * N_ANALYZERS)[2].epsilon
    noise = np.random.default_rng(3).laplace(0.0, 1.0 / share, len(KEY_DOMAIN))
    exact_counts = np.array([np.sum(k == "a"), np.sum(k == "b"), 0.0])
    np.testing.assert_allclose(counts, exact_counts + noise, rtol=1e-6, atol=1e-4)
    assert np.sum(k == "d") > 0
    sums = np.ravel(released(run, "group_sum"))
    assert sums.shape == (len(INT_DOMAIN),)
    assert not np.any(h == 4)
    per_key_means = np.ravel(released(run, "group_mean_per_key"))
    assert per_key_means.shape == (len(KEY_DOMAIN),)
    assert np.all((per_key_means >= LOWER) & (per_key_means <= UPPER))


def test_group_by_mean_out_of_domain_default_and_sparse_inputs(env):
    tf, tft, A = env.tf, env.tft, env.A
    rows = make_rows(60)
    for i, row in enumerate(rows):  # a column with missing values reaches us as a SparseTensor
        row["v"] = [row["x"]] if i % 4 else []
    metadata = tft.DatasetMetadata.from_feature_spec({
        "x": tf.io.FixedLenFeature([], tf.float32),
        "k": tf.io.FixedLenFeature([], tf.string),
        "h": tf.io.FixedLenFeature([], tf.int64),
        "v": tf.io.VarLenFeature(tf.float32),
    })

    def fn(inputs):
        v = inputs["v"]
        return {"m": A.dp_group_by_mean(inputs["k"], inputs["x"], ["a", "b"], 0.0, 4.0, 1.0,
                                        noise=SeededNoise(0)),
                "v_count": tf_fill(env, inputs["x"], A.dp_count(v, 1.0, noise=SeededNoise(1))),
                "v_mean": tf_fill(env, inputs["x"],
                                  A.dp_mean(v, 0.0, 10.0, 1.0, noise=SeededNoise(2))),
                "v_01": A.dp_scale_to_0_1(v, 0.0, 10.0, 1.0, num_bins=5, noise=SeededNoise(3))}

    with env.tft_beam.Context(temp_dir=tempfile.mkdtemp()):
        (out, _), _ = ((rows, metadata)
                       | env.tft_beam.AnalyzeAndTransformDataset(A.DPPreprocessingFn(fn, 4.0)))
    for row, t in zip(rows, out):
        if row["k"] not in ("a", "b"):
            assert t["m"] == 2.0  # midpoint default for keys outside the domain
        assert len(t["v_01"]) == len(row["v"])  # sparse in, sparse out
    present = np.array([r["v"][0] for r in rows if r["v"]])
    assert out[0]["v_count"] == pytest.approx(
        reference(queries.CountQuery(1.0), present, seed=1), rel=1e-6)
    assert out[0]["v_mean"] == pytest.approx(
        reference(queries.MeanQuery(0.0, 10.0, 1.0), present, seed=2), rel=1e-6)


# --- (d) the budget is enforced ---------------------------------------------------------------


def test_overspending_raises_in_transform(env):
    def greedy(inputs):
        x = inputs["x"]
        return {"a": tf_fill(env, x, env.A.dp_mean(x, 0.0, 1.0, 0.6)),
                "b": tf_fill(env, x, env.A.dp_mean(x, 0.0, 1.0, 0.6))}

    with pytest.raises(env.A.DPBudgetExceededError, match="requests epsilon=0.6"):
        analyze_and_transform(env, env.A.DPPreprocessingFn(greedy, 1.0), make_rows(20))


def _placeholder(env, dtype="float32"):
    return env.tf.compat.v1.placeholder(getattr(env.tf, dtype), [None])


def test_overspend_and_missing_budget_in_graph(env):
    A = env.A
    with env.tf.compat.v1.Graph().as_default():
        x = _placeholder(env)
        with pytest.raises(MissingGrantError):
            A.dp_count(x, 0.1)
        with pytest.raises(A.DPBudgetExceededError) as raised:
            with A.dp_budget(1.0) as budget:
                A.dp_count(x, 0.75)
                A.dp_sum(x, 0.0, 1.0, 0.25)
                A.dp_mean(x, 0.0, 1.0, 1e-9)
        assert isinstance(raised.value, InvalidPrivacyParameterError)
        assert "remains" in str(raised.value) and "over by" in str(raised.value)
        assert budget.spent == 1.0
        assert [s.name for s in budget.spends] == ["dp_count", "dp_sum"]


def test_underspend_and_bad_arguments_in_graph(env):
    A = env.A
    with env.tf.compat.v1.Graph().as_default():
        x = _placeholder(env)
        with pytest.raises(InvalidPrivacyParameterError, match="spent epsilon=0.5"):
            with A.dp_budget(1.0):
                A.dp_count(x, 0.5)
        with A.dp_budget(1.0, require_full_spend=False) as budget:
            A.dp_count(x, 0.5)
            # Invalid arguments raise before anything is spent.
            with pytest.raises(InvalidPrivacyParameterError):
                A.dp_sum(x, 1.0, 0.0, 0.1)
            with pytest.raises(InvalidPrivacyParameterError):
                A.dp_histogram(x, [1.0, 0.0], 0.1)
            with pytest.raises(InvalidPrivacyParameterError):
                A.dp_count(x, float("nan"))
            with pytest.raises(ValueError, match="one value per record"):
                A.dp_sum(env.tf.compat.v1.placeholder(env.tf.float32, [None, 2]), 0.0, 1.0, 0.1)
            with pytest.raises(TypeError):
                A.dp_group_by_count(x, ["a"], 0.1)
            with pytest.raises(TypeError):
                A.dp_count(x, 0.1, noise=np.random.default_rng(1))  # not a noise source
        assert budget.spent == 0.5
        with pytest.raises(InvalidPrivacyParameterError, match="nest"):
            with A.dp_budget(1.0):
                with A.dp_budget(1.0):
                    pass


def test_budget_traces_must_agree_and_pickle(env):
    A, tf = env.A, env.tf
    import dp_accounting
    budget = A.DPBudget(1.0)
    g1, g2 = tf.Graph(), tf.Graph()
    event = dp_accounting.LaplaceDpEvent(noise_multiplier=2.0)
    budget.spend("dp_count", 0.5, event, trace=g1)
    budget.spend("dp_count", 0.5, event, trace=g1)
    budget.spend("dp_count", 0.5, event, trace=g2)
    assert [s.name for s in budget._traces[0]] == ["dp_count", "dp_count_1"]
    with pytest.raises(InvalidPrivacyParameterError, match="differently in different traces"):
        _ = budget.spends
    budget.spend("dp_count", 0.5, event, trace=g2)
    assert len(budget.spends) == 2 and budget.spent == 1.0 and budget.remaining == 0.0
    copy = pickle.loads(pickle.dumps(budget))
    assert copy.spends == budget.spends
