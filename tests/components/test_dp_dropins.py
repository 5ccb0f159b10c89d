"""Slow tests of the DP drop-ins (vocabulary, z-score, bucketize, var), the shares of analyzers
called without ε, and the ``tft`` mirror on the TFX taxi ``preprocessing_fn``.

tf.Transform runs on Beam's in-process runner. Seeded noise reproduces a release exactly where a
test compares with the numpy reference; the δ test uses OpenDP's own noise.
"""
import csv
import os
import tempfile
import types
from collections import Counter

import numpy as np
import pytest

from sage_tfx.dp import audit, partition_selection as ps
from sage_tfx.dp.moments import MeanVarQuery
from sage_tfx.dp.histograms import QuantilesQuery
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidPrivacyParameterError

pytestmark = pytest.mark.slow

ALPHA = 1e-4
TFX_EXAMPLES = "tfx/examples/chicago_taxi_pipeline"


@pytest.fixture(scope="module")
def env():
    import tensorflow as tf
    import tensorflow_transform as stock_tft
    import tensorflow_transform.beam as tft_beam

    from sage_tfx.components.dp_transform import (analyzers, audit as taudit, budget, tft,
                                                  tracing, vocabulary)
    import tfx
    root = os.path.join(os.path.dirname(tfx.__file__), "examples", "chicago_taxi_pipeline")
    return types.SimpleNamespace(tf=tf, stock=stock_tft, tft_beam=tft_beam, A=analyzers,
                                 audit=taudit, budget=budget, tft=tft, tracing=tracing,
                                 vocabulary=vocabulary, taxi_root=root)


def analyze(env, fn, rows, feature_spec, *, epsilon, delta=0.0, public=(), compat=False):
    """Plans the shares, then runs AnalyzeAndTransformDataset; returns (rows, output dir, fn)."""
    plan = env.tracing.plan_shares(fn, feature_spec, epsilon, delta, public_features=public,
                                   force_tf_compat_v1=compat)
    dp_fn = env.budget.DPPreprocessingFn(
        env.audit.AuditedPreprocessingFn(fn, public_features=public), epsilon, delta=delta,
        allocation=plan.allocation)
    out = tempfile.mkdtemp()
    metadata = env.stock.DatasetMetadata.from_feature_spec(feature_spec)
    with env.tft_beam.Context(temp_dir=tempfile.mkdtemp(), force_tf_compat_v1=compat):
        (data, _), transform_fn = (rows, metadata) | env.tft_beam.AnalyzeAndTransformDataset(dp_fn)
        _ = transform_fn | env.tft_beam.WriteTransformFn(out)
    return data, out, dp_fn


def assets(out):
    root = os.path.join(out, "transform_fn", "assets")
    return {name: open(os.path.join(root, name), "rb").read().splitlines()
            for name in os.listdir(root)}


# --- vocabulary -------------------------------------------------------------------------------

TOKENS = {"a": 120, "b": 90, "c": 60, "d": 30, "e": 2}


def token_rows():
    return [{"k": k} for k, n in TOKENS.items() for _ in range(n)]


@pytest.mark.parametrize("compat", [False, True], ids=["tf2", "tf_compat_v1"])
def test_vocabulary_is_the_seeded_partition_selection_in_noisy_frequency_order(env, compat):
    tf = env.tf
    spec = {"k": tf.io.FixedLenFeature([], tf.string)}

    def fn(inputs):
        ids = env.A.dp_compute_and_apply_vocabulary(
            inputs["k"], epsilon=1.0, delta=1e-6, top_k=3, num_oov_buckets=2,
            vocab_filename="k_vocab", noise=SeededNoise(11))
        return {"id": ids}

    data, out, dp_fn = analyze(env, fn, token_rows(), spec, epsilon=1.0, delta=1e-6,
                               compat=compat)
    noisy = ps.PartitionSelection(1.0, 1e-6).release(
        {k.encode(): n for k, n in TOKENS.items()}, SeededNoise(11))
    expected = [k for k, _ in ps.order_and_filter(noisy, top_k=3)]
    assert "e".encode() not in noisy  # held by 2 records: below the threshold (~14.1)
    assert assets(out)["k_vocab"] == expected
    output = env.stock.TFTransformOutput(out)
    assert output.vocabulary_by_name("k_vocab") == expected
    ids = Counter(r["id"] for r in data)
    for token, n in TOKENS.items():
        if token.encode() in expected:
            assert ids[expected.index(token.encode())] == n
    assert all(0 <= i < 5 for i in ids)  # 3 tokens + 2 OOV buckets
    spend, = dp_fn.budget.spends
    assert (spend.epsilon, spend.delta) == (1.0, 1e-6)


def test_a_token_held_by_one_record_is_released_with_probability_at_most_delta(env):
    """Through the analyzer, on OpenDP noise: 4,000 distinct tokens, each in one record, at
    δ = 0.05; the vocabulary file is the release (noise drawn once: one Beam counter)."""
    tf = env.tf
    n = 4000
    spec = {"k": tf.io.FixedLenFeature([], tf.string)}
    rows = [{"k": f"t{i}"} for i in range(n)] + [{"k": "common"}] * 200

    def fn(inputs):
        path = env.A.dp_vocabulary(inputs["k"], epsilon=1.0, delta=0.05, vocab_filename="v")
        return {"k": inputs["k"], "v": env.stock.apply_vocabulary(inputs["k"], path)}

    _, out, _ = analyze(env, fn, rows, spec, epsilon=1.0, delta=0.05)
    vocab = assets(out)["v"]
    assert vocab[0] == b"common"
    hits = len(vocab) - 1
    low, high = audit.clopper_pearson(hits, n, ALPHA)
    assert low <= 0.05 <= high * 1.3, (hits, n)


def test_bounded_counts_take_at_most_m_tokens_per_record(env):
    values = np.array([b"x", b"y", b"z", b"x", b"", b"a\nb", b"y"], dtype=object)
    rows = np.array([0, 0, 0, 1, 1, 1, 2])
    counts = env.vocabulary._batch_counts((values, rows), 2, True, True)  # pylint: disable=W0212
    assert sum(counts.values()) == 2 + 1 + 1  # record 0 bounded to 2; '' and '\n' dropped
    assert counts[b"y"] >= 1 and b"" not in counts and b"a\nb" not in counts
    ints = env.vocabulary._batch_counts((np.array([5, 5, 7]), np.array([0, 1, 1])), 1, False,
                                        True)
    assert sum(ints.values()) == 2 and set(ints) <= {b"5", b"7"}


def test_vocabulary_refusals(env):
    tf = env.tf
    x = tf.constant(["a", "b"])
    with env.budget.dp_budget(1.0, delta=1e-6, require_full_spend=False):
        for bad, kind in (({"weights": x}, ValueError), ({"labels": x}, ValueError),
                          ({"file_format": "tfrecord_gzip"}, ValueError),
                          ({"top_k": 0}, ValueError), ({"epsilon": 0.5}, ValueError),
                          ({"epsilon": 0.5, "delta": 0.0}, InvalidPrivacyParameterError),
                          ({"epsilon": 0.5, "delta": 1e-6, "max_partitions_contributed": 0},
                           InvalidPrivacyParameterError)):
            with pytest.raises(kind):
                env.A.dp_vocabulary(x, **bad)
    with env.budget.dp_budget(1.0, require_full_spend=False):  # a budget without δ
        with pytest.raises(env.budget.DPBudgetExceededError, match="delta"):
            env.A.dp_vocabulary(x, epsilon=0.5, delta=1e-6)


# --- z-score, var, bucketize ------------------------------------------------------------------

def test_z_score_and_bucketize_match_the_seeded_numpy_releases(env):
    tf = env.tf
    spec = {"x": tf.io.FixedLenFeature([], tf.float32)}
    xs = [float((i * 37) % 100) / 10.0 for i in range(400)]

    def fn(inputs):
        return {"z": env.A.dp_scale_to_z_score(inputs["x"], 0.0, 10.0, 0.5,
                                               noise=SeededNoise(5)),
                "b": env.A.dp_bucketize(inputs["x"], 4, 0.0, 10.0, 0.25, num_bins=20,
                                        noise=SeededNoise(6)),
                "v": tf.zeros_like(inputs["x"]) + env.A.dp_var(inputs["x"], 0.0, 10.0, 0.25,
                                                               noise=SeededNoise(7))}

    data, _, dp_fn = analyze(env, fn, [{"x": x} for x in xs], spec, epsilon=1.0)
    x = np.array(xs)
    q = MeanVarQuery(0.0, 10.0, 0.5)
    mean, var = q.release(q.aggregate(x), SeededNoise(5))
    assert [r["z"] for r in data] == pytest.approx(list((x - mean) / np.sqrt(var)), rel=1e-4)
    bq = QuantilesQuery((0.25, 0.5, 0.75), 0.0, 10.0, 0.25, 20)
    edges = np.asarray(bq.release(bq.aggregate(x), SeededNoise(6)), dtype=np.float32)
    assert [r["b"] for r in data] == list(np.searchsorted(edges, x.astype(np.float32),
                                                          side="right"))
    v = MeanVarQuery(0.0, 10.0, 0.25)
    assert data[0]["v"] == pytest.approx(v.release(v.aggregate(x), SeededNoise(7))[1], rel=1e-5)
    assert [s.name for s in dp_fn.budget.spends] == ["dp_scale_to_z_score", "dp_bucketize",
                                                     "dp_var"]


# --- shares -----------------------------------------------------------------------------------

def test_analyzers_without_epsilon_share_what_explicit_ones_leave(env):
    tf = env.tf
    spec = {"x": tf.io.FixedLenFeature([], tf.float32), "k": tf.io.FixedLenFeature([], tf.string)}

    def fn(inputs):
        return {"m": env.A.dp_mean(inputs["x"], 0.0, 1.0, 0.4) + tf.zeros_like(inputs["x"]),
                "z": env.tft.scale_to_z_score(inputs["x"], lower=0.0, upper=1.0, share=3),
                "b": env.tft.bucketize(inputs["x"], 3, lower=0.0, upper=1.0),
                "k": env.tft.compute_and_apply_vocabulary(inputs["k"]),
                "k2": env.tft.compute_and_apply_vocabulary(inputs["k"], share=2)}

    plan = env.tracing.plan_shares(fn, spec, 2.0, 3e-6)
    eps = {s.name: (s.epsilon, s.delta) for s in plan.spends}
    assert eps["dp_mean"] == (0.4, 0.0)
    left = 1.6 / 7  # weights 3, 1, 1, 2
    assert eps["scale_to_z_score"][0] == pytest.approx(3 * left)
    assert eps["bucketize"][0] == pytest.approx(left)
    assert eps["compute_and_apply_vocabulary"] == pytest.approx((left, 1e-6))
    assert eps["compute_and_apply_vocabulary_1"] == pytest.approx((2 * left, 2e-6))
    assert plan.epsilon_spent <= 2.0 and plan.epsilon_spent == pytest.approx(2.0, rel=1e-12)
    assert plan.delta_spent <= 3e-6 and plan.delta_spent == pytest.approx(3e-6, rel=1e-12)
    with pytest.raises(env.budget.DPBudgetExceededError, match="give the plan's transform part"):
        env.tracing.plan_shares(fn, spec, 2.0, 0.0)  # DP vocabularies need δ
    with pytest.raises(env.budget.DPBudgetExceededError):
        env.tracing.plan_shares(fn, spec, 0.4, 1e-6)  # the explicit ε leaves nothing
    with pytest.raises(InvalidPrivacyParameterError, match="spent delta"):
        env.tracing.plan_shares(lambda i: {"z": env.tft.scale_to_z_score(
            i["x"], lower=0.0, upper=1.0)}, spec, 1.0, 1e-6)  # δ charged, nobody spends it


def test_mirror_without_bounds_is_the_stock_analyzer_and_is_audited(env):
    tf = env.tf
    spec = {"x": tf.io.FixedLenFeature([], tf.float32), "p": tf.io.FixedLenFeature([], tf.float32)}

    def fn(inputs):
        return {"x": env.tft.scale_to_z_score(inputs["x"], lower=0.0, upper=1.0),
                "p": env.tft.scale_to_z_score(inputs["p"]),  # stock: fine on a public feature
                "q": env.tft.apply_buckets(inputs["p"], [[0.5]])}  # tft's mapper

    plan = env.tracing.plan_shares(fn, spec, 1.0, public_features=["p"])
    assert [u.kind for u in plan.analyzer_uses] == ["dp", "public"]
    with pytest.raises(env.audit.NonDPAnalyzerError, match=r"reads feature\(s\) \['p'\]"):
        env.tracing.plan_shares(fn, spec, 1.0)
    assert env.tft.apply_buckets is env.stock.apply_buckets
    with pytest.raises(ValueError, match="both public bounds"):
        env.tracing.plan_shares(lambda i: {"x": env.tft.mean(i["x"], lower=0.0)}, spec, 1.0)


# --- the TFX taxi preprocessing_fn ------------------------------------------------------------

def taxi_rows(env, feature_spec, limit):
    tf = env.tf
    rows = []
    with open(os.path.join(env.taxi_root, "data", "simple", "data.csv")) as f:
        for i, r in enumerate(csv.DictReader(f)):
            if i == limit:
                break
            row = {}
            for name, feature in feature_spec.items():
                v = r[name]
                cast = (lambda s: s) if feature.dtype == tf.string else (
                    float if feature.dtype == tf.float32 else lambda s: int(float(s)))
                row[name] = [] if v == "" else [cast(v)]
            rows.append(row)
    return rows


def test_taxi_preprocessing_fn_converted_by_import_and_bounds(env):
    """The TFX wheel's taxi preprocessing_fn is refused as it is (9 stock analyzers, each named
    with its feature and its DP replacement); the converted module (pipelines/
    taxi_utils_dp.py: import and bounds) runs DP, spending ε and δ exactly."""
    import importlib
    original = importlib.import_module(
        "tfx.examples.chicago_taxi_pipeline.taxi_utils_native_keras")
    from sage_tfx.pipelines import taxi_utils_dp as converted
    schema = os.path.join(env.taxi_root, "data", "user_provided_schema", "schema.pbtxt")
    spec = env.tracing.feature_spec_from_schema_file(schema)
    with pytest.raises(env.audit.NonDPAnalyzerError) as refused:
        env.tracing.plan_shares(original.preprocessing_fn, spec, 2.0, 1e-6)
    message = str(refused.value)
    assert "refuses 9 non-DP" in message
    for feature in ("trip_miles", "fare", "trip_seconds", "payment_type", "company",
                    "pickup_latitude", "dropoff_longitude"):
        assert f"['{feature}']" in message
    assert "tft.bucketize(..., lower=, upper=)" in message and "public_features=[" in message

    plan = env.tracing.plan_shares(converted.preprocessing_fn, spec, 2.0, 1e-6)
    assert len(plan.spends) == 9
    assert [s.epsilon for s in plan.spends] == pytest.approx([2.0 / 9] * 9, rel=1e-12)
    assert plan.delta_spent == pytest.approx(1e-6) and plan.delta_spent <= 1e-6
    data, out, _ = analyze(env, converted.preprocessing_fn, taxi_rows(env, spec, 600), spec,
                           epsilon=2.0, delta=1e-6)
    vocab = assets(out)
    assert len(vocab) == 2 and any(b"Cash" in v for v in vocab.values())
    assert all(0 <= r["pickup_latitude_xf"] < 10 for r in data)
    assert all(0 <= r["company_xf"] < 1010 for r in data)
