"""Shared data and helpers of the DPTrainer tests: flights-like Examples in ExampleGen's layout,
a real SQLite ledger grant with a privacy plan, and the executor's Do() on them.

ε is recomputed here with dp_accounting directly, independently of ``sage_tfx.dp.dpsgd``.
"""
import os

import dp_accounting
import numpy as np
import pytest

from blockdata import make_example

N_TRAIN, N_EVAL = 360, 60
STREAM = "flights"
MODULE = "sage_tfx.pipelines.flights_dp_module"


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


@pytest.fixture(scope="module")
def mods():
    from sage_tfx.components import artifacts, plan_io
    from sage_tfx.components.dp_trainer import component, executor, run_fn_utils, spec
    return component, executor, spec, artifacts, plan_io, run_fn_utils


def _flight(rng, i):
    """One flights-like record: some dep_delay / arr_delay absent (cancelled flights)."""
    feats = {"distance": int(rng.integers(100, 3000)), "hour": int(rng.integers(5, 23))}
    if i % 17:
        dep = float(rng.normal(10, 30))
        feats["dep_delay"] = dep
        if i % 13:
            feats["arr_delay"] = float(dep - 5 + rng.normal(0, 8))
    return feats


def example(feats):
    """A serialized tf.train.Example of {name: int | float}."""
    return make_example(feats).SerializeToString()


@pytest.fixture(scope="module")
def flights(tmp_path_factory):
    """ExampleGen-layout Examples dir: Split-train (N_TRAIN records in 2 files), Split-eval."""
    import tensorflow as tf
    rng = np.random.default_rng(7)
    root = tmp_path_factory.mktemp("flights_examples")
    rows = {"train": [_flight(rng, i) for i in range(N_TRAIN)],
            "eval": [_flight(rng, i) for i in range(N_EVAL)]}
    for split, feats in rows.items():
        os.makedirs(root / f"Split-{split}")
        half = len(feats) // 2
        for k, chunk in enumerate((feats[:half], feats[half:])):
            path = str(root / f"Split-{split}" / f"data_tfrecord-0000{k}-of-00002.gz")
            with tf.io.TFRecordWriter(path, options="GZIP") as w:
                for f in chunk:
                    w.write(example(f))
    return str(root), rows


def examples_artifact(uri, grant_id=None):
    from tfx.types import artifact_utils, standard_artifacts
    ex = standard_artifacts.Examples()
    ex.uri = uri
    ex.split_names = artifact_utils.encode_split_names(["train", "eval"])
    if grant_id is not None:
        ex.set_string_custom_property("grant_id", grant_id)
    return ex


def grant_artifact(mods, tmp_path, plan, *, mode="basic", name="grant", epsilon_g=10.0,
                   write_plan=True):
    """A SageGrant artifact with a real ledger's decision on ``plan.cost()`` and the plan.

    ``mods`` is the test module's fixture: its items 3 and 4 are ``artifacts`` and ``plan_io``.
    """
    from sage_tfx.ledger import BlockSpec, open_ledger
    artifacts, plan_io = mods[3], mods[4]
    url = f"sqlite:///{tmp_path}/{name}.db"
    with open_ledger(url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=epsilon_g, delta_g=1e-5, mode=mode)
        ledger.add_blocks(STREAM, [BlockSpec("2013-01-01", f"{tmp_path}/blocks/b1")])
        decision = ledger.request(STREAM, run_id="run-1", blocks=["2013-01-01"], **plan.cost())
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
    return art


def train(mods, tmp_path, *, grant, examples, config=None, run_fn=f"{MODULE}.run_fn",
          module_file=None, name="model", transform_graph=None):
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
             spec.CUSTOM_CONFIG_KEY: json_utils.dumps(config or {})}
    if module_file:
        props[spec.MODULE_FILE_KEY] = module_file
    else:
        props[spec.RUN_FN_KEY] = run_fn
    inputs = {spec.EXAMPLES_KEY: [examples]}
    if grant is not None:
        inputs[spec.GRANT_INPUT_KEY] = [grant]
    if transform_graph is not None:
        inputs[spec.TRANSFORM_GRAPH_KEY] = [transform_graph]
    executor.Executor().Do(inputs, {spec.MODEL_KEY: [model], spec.MODEL_RUN_KEY: [model_run]},
                           props)
    return model


def custom(model):
    out = {}
    for key in model.mlmd_artifact.custom_properties:
        value = model.get_custom_property(key)
        out[key] = value
    return out


def serve(model_uri, records):
    import tensorflow as tf
    loaded = tf.saved_model.load(os.path.join(model_uri, "Format-Serving"))
    fn = loaded.signatures["serving_default"]
    return fn(examples=tf.constant(records))["predictions"].numpy()


def labeled(rows):
    return sum(1 for f in rows if "arr_delay" in f)


DPSGD_CONFIG = {"algorithm": "dpsgd", "hidden_units": [8], "epochs": 2, "batch_size": 30,
                "l2_norm_clip": 1.0, "learning_rate": 0.1, "seed": 1}


