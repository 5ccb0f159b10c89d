"""Shared data and helpers of the DPTrainer tests: flights-like Examples transformed by a real
tf.Transform graph (released under a real SQLite ledger grant with a privacy plan, as DPTransform
releases it), module files written by the tests, and the executor's Do() on them.

ε is recomputed here with dp_accounting directly, independently of ``sage_tfx.dp.dpsgd``.
"""
import os
import shutil
import textwrap

import dp_accounting
import numpy as np
import pytest

from blockdata import make_example

N_TRAIN, N_EVAL = 400, 80
STREAM = "flights"
CARRIERS = ("AA", "UA", "DL", "B6", "EV")
LABEL = "arr_delay_scaled"
LABEL_SCALE = 300.0
TRANSFORM_RELEASE = "transform/transform_graph"


def rdp_eps(q, sigma, steps, delta):
    """ε of a Poisson-sampled Gaussian DP-SGD run by dp_accounting's RDP accountant, directly."""
    acct = dp_accounting.rdp.RdpAccountant()
    acct.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps))
    return acct.get_epsilon(delta)


def pld_eps(q, sigma, steps, delta):
    """ε of the same run by a pessimistic privacy-loss distribution built directly (dp_accounting's
    PLD module, not its accountant; add or remove one; grid 1e-4): what basic parts charge."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    pld = pld_lib.from_gaussian_mechanism(sigma, sampling_prob=q, pessimistic_estimate=True,
                                          value_discretization_interval=1e-4)
    return pld.self_compose(steps).get_epsilon_for_delta(delta)


def dpsgd_event(q, sigma, steps):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)


def _flight(rng, i):
    """One flights-like record: arr_delay absent for some (cancelled flights)."""
    feats = {"distance": int(rng.integers(100, 3000)), "hour": int(rng.integers(5, 23)),
             "carrier": CARRIERS[int(rng.integers(len(CARRIERS)))]}
    dep = float(rng.normal(10, 30))
    feats["dep_delay"] = dep
    if i % 13:
        feats["arr_delay"] = float(dep - 5 + rng.normal(0, 8) + 10 * (feats["carrier"] == "EV"))
    return feats


def example(feats):
    """A serialized tf.train.Example of {name: int | float | str}."""
    return make_example(feats).SerializeToString()


def raw_spec():
    import tensorflow as tf
    return {"distance": tf.io.VarLenFeature(tf.int64), "hour": tf.io.VarLenFeature(tf.int64),
            "dep_delay": tf.io.VarLenFeature(tf.float32),
            "arr_delay": tf.io.VarLenFeature(tf.float32),
            "carrier": tf.io.VarLenFeature(tf.string)}


def _preprocessing_fn(inputs):
    """Transformed features: two floats, a vocabulary id and the scaled label (NaN if absent)."""
    import tensorflow as tf
    import tensorflow_transform as tft

    def dense(name, default):
        x = inputs[name]
        return tf.reshape(tf.sparse.to_dense(
            tf.sparse.reset_shape(x, tf.stack([x.dense_shape[0], 1])), default_value=default),
            [-1])

    arr = dense("arr_delay", float("nan"))
    return {"distance_scaled": tf.cast(dense("distance", 0), tf.float32) / 5000.0,
            "dep_delay_h": dense("dep_delay", 0.0) / 60.0,
            # a vocabulary (an asset of the graph) whose ids an Embedding reads
            "carrier_id": tft.compute_and_apply_vocabulary(dense("carrier", ""),
                                                           num_oov_buckets=1),
            LABEL: tf.where(tf.math.is_nan(arr), arr,
                            tf.clip_by_value(arr, -60.0, 300.0) / LABEL_SCALE)}


@pytest.fixture(scope="module")
def flights(tmp_path_factory):
    """(transform graph dir, transformed Examples dir in ExampleGen's layout, raw rows)."""
    import tensorflow as tf
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam
    from tensorflow_transform.tf_metadata import metadata_io, schema_utils
    rng = np.random.default_rng(7)
    root = tmp_path_factory.mktemp("flights")
    rows = {"train": [_flight(rng, i) for i in range(N_TRAIN)],
            "eval": [_flight(rng, i) for i in range(N_EVAL)]}
    spec = raw_spec()
    schema = schema_utils.schema_from_feature_spec(spec)
    graph = str(root / "transform_graph")
    instances = [{k: [f[k]] if k in f else [] for k in spec} for f in rows["train"]]
    with tft_beam.Context(temp_dir=str(root / "tmp"), force_tf_compat_v1=False):
        transform_fn = ((instances, tft.DatasetMetadata(schema))
                        | tft_beam.AnalyzeDataset(_preprocessing_fn))
        _ = transform_fn | tft_beam.WriteTransformFn(graph)
    metadata_io.write_metadata(tft.DatasetMetadata(schema),
                               os.path.join(graph, tft.TFTransformOutput.RAW_METADATA_DIR))
    layer = tft.TFTransformOutput(graph).transform_features_layer()
    examples = root / "examples"
    for split, feats in rows.items():
        os.makedirs(examples / f"Split-{split}")
        out = layer(tf.io.parse_example(tf.constant([example(f) for f in feats]), spec))
        half = len(feats) // 2
        for k, (lo, hi) in enumerate(((0, half), (half, len(feats)))):
            path = str(examples / f"Split-{split}" / f"data_tfrecord-0000{k}-of-00002.gz")
            with tf.io.TFRecordWriter(path, options="GZIP") as w:
                for i in range(lo, hi):
                    w.write(example({k2: (int(v[i]) if v.dtype == tf.int64 else float(v[i]))
                                     for k2, v in out.items()}))
    return graph, str(examples), rows


def labeled(rows):
    return sum(1 for f in rows if "arr_delay" in f)


@pytest.fixture(scope="module")
def mods():
    from sage_tfx.components import artifacts, plan_io
    from sage_tfx.components.dp_trainer import component, executor, spec
    return component, executor, spec, artifacts, plan_io


def examples_artifact(uri, grant_id=None):
    from tfx.types import artifact_utils, standard_artifacts
    ex = standard_artifacts.Examples()
    ex.uri = uri
    ex.split_names = artifact_utils.encode_split_names(["train", "eval"])
    if grant_id is not None:
        ex.set_string_custom_property("grant_id", grant_id)
    return ex


def grant_artifact(mods, tmp_path, plan, *, mode="basic", name="grant", epsilon_g=10.0,
                   write_plan=True, transform_graph=None):
    """A SageGrant artifact with a real ledger's decision on ``plan.cost()`` and the plan; with
    ``transform_graph`` (a directory) that graph released under the grant as DPTransform
    releases its output. Returns (grant artifact, released TransformGraph artifact or None)."""
    from tfx.types import standard_artifacts
    from sage_tfx.ledger import BlockSpec, open_ledger, releases
    artifacts, plan_io = mods[3], mods[4]
    url = f"sqlite:///{tmp_path}/{name}.db"
    released = None
    with open_ledger(url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=epsilon_g, delta_g=1e-5, mode=mode)
        ledger.add_blocks(STREAM, [BlockSpec("2013-01-01", f"{tmp_path}/blocks/b1")])
        decision = ledger.request(STREAM, run_id="run-1", blocks=["2013-01-01"], **plan.cost())
        if decision.granted and transform_graph is not None:
            released = standard_artifacts.TransformGraph()
            released.uri = str(tmp_path / f"{name}_transform_graph")

            def copy(staging):
                shutil.rmtree(staging)
                shutil.copytree(transform_graph, staging)
            releases.release_tree_once(ledger, decision.grant.grant_id, TRANSFORM_RELEASE,
                                       released.uri, copy)
    art = artifacts.SageGrant()
    art.uri = str(tmp_path / name)
    if decision.granted:
        artifacts.write_grant(art, decision.grant, stream=STREAM, run_id="run-1",
                              context="default", ledger_url=url)
        if write_plan:
            plan_io.write_plan(art, plan)
    else:
        artifacts.write_grant(art, None, stream=STREAM, run_id="run-1", context="default",
                              ledger_url=url, reason=decision.reason)
    return art, released


def grant(mods, tmp_path, plan, **kwargs):
    """The SageGrant artifact of :func:`grant_artifact` alone."""
    return grant_artifact(mods, tmp_path, plan, **kwargs)[0]


MODULE_HEADER = '''
import numpy as np
import tensorflow as tf
from sage_tfx.components.dp_trainer import AdaSSPSpec, DPSGDSpec


def inputs():
    return {"distance_scaled": tf.keras.Input(shape=(), name="distance_scaled"),
            "dep_delay_h": tf.keras.Input(shape=(), name="dep_delay_h"),
            "carrier_id": tf.keras.Input(shape=(), name="carrier_id", dtype=tf.int64)}


def wide_and_deep(inp):
    """Embedding of the vocabulary id beside the two floats, then a small network."""
    emb = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(8, 3)(inp["carrier_id"]))
    x = tf.keras.layers.Concatenate()(
        [tf.stack([inp["distance_scaled"], inp["dep_delay_h"]], axis=1), emb])
    x = tf.keras.layers.Dense(8, activation="relu")(x)
    return tf.keras.layers.Dense(1)(x)
'''


def write_module(tmp_path, body, name="module.py"):
    """A trainer module file: the header above, then ``body`` (dedented)."""
    path = tmp_path / name
    path.write_text(MODULE_HEADER + "\n" + textwrap.dedent(body))
    return str(path)


WIDE_AND_DEEP = '''
def model_fn(fn_args):
    inp = inputs()
    model = tf.keras.Model(inp, wide_and_deep(inp))
    model.compile(loss="mse", optimizer=tf.keras.optimizers.SGD(0.1))
    return DPSGDSpec(model=model, label_key="arr_delay_scaled", raw_label_keys=["arr_delay"],
                     batch_size=40, epochs=2, l2_norm_clip=1.0, seed=3)
'''


def train(mods, tmp_path, *, grant, examples, module_file=None, model_fn=None, config=None,
          name="model", transform_graph=None, output_scale=LABEL_SCALE, output_offset=0.0):
    """The DPTrainer executor's Do() on the artifacts; returns the Model artifact."""
    from tfx.proto import trainer_pb2
    from tfx.types import standard_artifacts
    from tfx.utils import json_utils, proto_utils
    _, executor, spec = mods[:3]
    model = standard_artifacts.Model()
    model.uri = str(tmp_path / name)
    model_run = standard_artifacts.ModelRun()
    model_run.uri = str(tmp_path / f"{name}_run")
    props = {spec.TRAIN_ARGS_KEY: proto_utils.proto_to_json(trainer_pb2.TrainArgs()),
             spec.EVAL_ARGS_KEY: proto_utils.proto_to_json(trainer_pb2.EvalArgs()),
             spec.CUSTOM_CONFIG_KEY: json_utils.dumps(config or {}),
             spec.OUTPUT_SCALE_KEY: output_scale, spec.OUTPUT_OFFSET_KEY: output_offset}
    if module_file:
        props[spec.MODULE_FILE_KEY] = module_file
    if model_fn:
        props[spec.MODEL_FN_KEY] = model_fn
    inputs = {spec.EXAMPLES_KEY: [examples]}
    if grant is not None:
        inputs[spec.GRANT_INPUT_KEY] = [grant]
    if transform_graph is not None:
        inputs[spec.TRANSFORM_GRAPH_KEY] = [transform_graph]
    executor.Executor().Do(inputs, {spec.MODEL_KEY: [model], spec.MODEL_RUN_KEY: [model_run]},
                           props)
    return model


def custom(model):
    return {key: model.get_custom_property(key) for key in model.mlmd_artifact.custom_properties}


def serve(model_uri, records):
    import tensorflow as tf
    loaded = tf.saved_model.load(os.path.join(model_uri, "Format-Serving"))
    fn = loaded.signatures["serving_default"]
    return fn(examples=tf.constant(records))["predictions"].numpy()


def published(model_uri):
    """Files under a Model's uri (none: nothing was published)."""
    if not os.path.exists(model_uri):
        return []
    return sorted(os.path.relpath(os.path.join(d, f), model_uri)
                  for d, _, fs in os.walk(model_uri) for f in fs)
