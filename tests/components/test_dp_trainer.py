"""DPTrainer: report verification (fast), spec, and executor Do() on generated flights Examples.

Executor runs use a real SQLite ledger grant with a privacy plan (``plan_io.write_plan``), Examples
in ExampleGen's layout (``Split-train`` / ``Split-eval`` gzip TFRecords), the module file
``sage_tfx.pipelines.flights_dp_module`` and tiny data (a few hundred rows, a few dozen steps).
ε is recomputed here with dp_accounting directly, independently of ``sage_tfx.dp.dpsgd``.
"""
import json
import math
import os

import dp_accounting
import numpy as np
import pytest

from sage_tfx.ledger import accounting
from sage_tfx.components.dp_trainer import guarantee as g
from sage_tfx.errors import MissingGrantError
from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan

STREAM = "flights"
N_TRAIN, N_EVAL = 360, 60
MODULE = "sage_tfx.pipelines.flights_dp_module"


def _rdp_eps(q, sigma, steps, delta):
    """ε of a Poisson-sampled Gaussian DP-SGD run by dp_accounting's RDP accountant, directly."""
    acct = dp_accounting.rdp.RdpAccountant()
    acct.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps))
    return acct.get_epsilon(delta)


def _dpsgd_event(q, sigma, steps):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps)


# ---------------------------------------------------------------------------------------------
# Fast: the report and its verification (no TensorFlow).


def _basic_report(sigma=1.5, batch=50, n=1000, epochs=2, delta=1e-5, **kw):
    report = {"algorithm": "dpsgd", "noise_multiplier": sigma, "batch_size": batch,
              "num_examples": n, "epochs": epochs, "l2_norm_clip": 1.0, "delta": delta,
              "accountant": "rdp", "trained_steps": epochs * (n // batch)}
    report.update(kw)
    return report


def test_basic_dpsgd_report_is_recomputed_independently():
    part = PlanPart("train", 3.0, 1e-5)
    verified = g.verify_report(_basic_report(), part, grant_id="g1", num_train_records=1000)
    expected = _rdp_eps(50 / 1000, 1.5, 40, 1e-5)
    assert verified.epsilon == pytest.approx(expected, rel=1e-12)
    assert verified.epsilon <= 3.0
    props = verified.model_properties()
    assert props["dp_epsilon"] == verified.epsilon and props["dp_delta"] == 1e-5
    assert (props["dp_batch_size"], props["dp_steps"], props["dp_num_examples"]) == (50, 40, 1000)
    assert props["dp_sampling"] == g.DPSGD_SAMPLING and props["dp_accounting"] == "rdp"
    assert props["grant_id"] == "g1" and props["dp_algorithm"] == "dpsgd"


@pytest.mark.parametrize("change, message", [
    ({"noise_multiplier": 0.6}, "allows epsilon=3.0"),        # too little noise: overspends
    ({"delta": 1e-6}, "delta"),                               # not the part's δ
    ({"num_examples": 1001}, "only 1000"),                    # n above the train records
    ({"epsilon": 0.01}, "reported epsilon=0.01"),             # ε that its parameters don't give
    ({"trained_steps": 41}, "41 steps but 40"),               # ran more steps than accounted
    ({"trained_steps": None}, "trained_steps"),
    ({"noise_multiplier": None}, "lacks 'noise_multiplier'"),
    ({"algorithm": "sgd"}, "algorithm"),
    ({"accountant": "moments"}, "accountant"),
    ({"mode": "rdp"}, "rdp part"),
])
def test_basic_report_mismatches_are_refused(change, message):
    with pytest.raises(g.GuaranteeMismatchError, match=message):
        g.verify_report(_basic_report(**change), PlanPart("train", 3.0, 1e-5), grant_id="g",
                        num_train_records=1000)


def test_dpsgd_run_for_basic_part_calibrates_to_the_real_n():
    part = PlanPart("train", 1.0, 1e-5)
    run = g.dpsgd_run_for_part(part, num_examples=800, batch_size=40, epochs=3,
                               l2_norm_clip=0.5)
    assert run.steps == 60 and run.sampling_probability == 40 / 800
    eps = _rdp_eps(40 / 800, run.noise_multiplier, 60, 1e-5)
    assert eps <= 1.0 and eps == pytest.approx(1.0, abs=1e-3)
    report = g.report_from(run, trained_steps=60)
    verified = g.verify_report(report, part, grant_id="g", num_train_records=800)
    assert verified.epsilon == pytest.approx(eps, rel=1e-12)


def test_dpsgd_run_for_rdp_part_takes_the_event_as_charged():
    event = _dpsgd_event(0.05, 1.2, 30)
    part = PlanPart("train", event=event)
    run = g.dpsgd_run_for_part(part, num_examples=333, batch_size=999, epochs=99,
                               l2_norm_clip=1.0, report_delta=1e-6)
    assert (run.noise_multiplier, run.steps, run.batch_size) == (1.2, 30, round(0.05 * 333))
    assert run.event == event and run.epsilon == pytest.approx(_rdp_eps(0.05, 1.2, 30, 1e-6))
    verified = g.verify_report(g.report_from(run, trained_steps=30), part, grant_id="g",
                               num_train_records=333, report_delta=1e-6)
    assert verified.event == event and verified.part_epsilon is None

    other = g.report_from(g.dpsgd_run_for_part(
        PlanPart("train", event=_dpsgd_event(0.05, 1.1, 30)), num_examples=333, batch_size=1,
        epochs=1, l2_norm_clip=1.0, report_delta=1e-6), trained_steps=30)
    with pytest.raises(g.GuaranteeMismatchError, match="spent exactly"):
        g.verify_report(other, part, grant_id="g", num_train_records=333, report_delta=1e-6)
    wrong_batch = dict(g.report_from(run, trained_steps=30), batch_size=20)
    with pytest.raises(g.GuaranteeMismatchError, match="batch_size=17"):
        g.verify_report(wrong_batch, part, grant_id="g", num_train_records=333,
                        report_delta=1e-6)


@pytest.mark.parametrize("event", [
    dp_accounting.GaussianDpEvent(1.0),
    dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(1.0), 3),
    dp_accounting.ComposedDpEvent([_dpsgd_event(0.1, 1.0, 5)]),
    dp_accounting.SelfComposedDpEvent(_dpsgd_event(0.1, 1.0, 5), 2),
])
def test_rdp_events_of_another_shape_are_refused(event):
    with pytest.raises(g.GuaranteeMismatchError, match="not a DP-SGD event"):
        g.dpsgd_run_for_part(PlanPart("train", event=event), num_examples=100, batch_size=10,
                             epochs=1, l2_norm_clip=1.0, report_delta=1e-6)


def test_rdp_event_needing_an_empty_batch_is_refused():
    with pytest.raises(g.GuaranteeMismatchError, match="empty batch"):
        g.dpsgd_run_for_part(PlanPart("train", event=_dpsgd_event(0.001, 1.0, 5)),
                             num_examples=100, batch_size=10, epochs=1, l2_norm_clip=1.0,
                             report_delta=1e-6)


def test_basic_part_without_delta_cannot_run_dpsgd():
    with pytest.raises(ValueError, match="needs delta > 0"):
        g.dpsgd_run_for_part(PlanPart("train", 1.0), num_examples=100, batch_size=10, epochs=1,
                             l2_norm_clip=1.0)


# ---------------------------------------------------------------------------------------------
# Slow: TFX / TensorFlow.


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


def _example(feats):
    import tensorflow as tf
    ex = tf.train.Example()
    for k, v in feats.items():
        if isinstance(v, int):
            ex.features.feature[k].int64_list.value.append(v)
        else:
            ex.features.feature[k].float_list.value.append(v)
    return ex.SerializeToString()


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
                    w.write(_example(f))
    return str(root), rows


def _examples(uri, grant_id=None):
    from tfx.types import artifact_utils, standard_artifacts
    ex = standard_artifacts.Examples()
    ex.uri = uri
    ex.split_names = artifact_utils.encode_split_names(["train", "eval"])
    if grant_id is not None:
        ex.set_string_custom_property("grant_id", grant_id)
    return ex


def _grant(mods, tmp_path, plan, *, mode="basic", name="grant", epsilon_g=10.0,
           write_plan=True):
    """A SageGrant artifact with a real ledger's decision on ``plan.cost()`` and the plan."""
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


def _train(mods, tmp_path, *, grant, examples, config=None, run_fn=f"{MODULE}.run_fn",
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


def _custom(model):
    out = {}
    for key in model.mlmd_artifact.custom_properties:
        value = model.get_custom_property(key)
        out[key] = value
    return out


def _serve(model_uri, records):
    import tensorflow as tf
    loaded = tf.saved_model.load(os.path.join(model_uri, "Format-Serving"))
    fn = loaded.signatures["serving_default"]
    return fn(examples=tf.constant(records))["predictions"].numpy()


def _labeled(rows):
    return sum(1 for f in rows if "arr_delay" in f)


DPSGD_CONFIG = {"algorithm": "dpsgd", "hidden_units": [8], "epochs": 2, "batch_size": 30,
                "l2_norm_clip": 1.0, "learning_rate": 0.1, "seed": 1}


@pytest.mark.slow
def test_dpsgd_basic_run_exports_serving_model_and_records_guarantee(mods, tmp_path, flights):
    from tfx.utils import path_utils
    uri, rows = flights
    plan = PrivacyPlan.of(PlanPart("train", 2.0, 1e-5), PlanPart("validate", 0.5))
    grant = _grant(mods, tmp_path, plan)
    model = _train(mods, tmp_path, grant=grant, examples=_examples(uri, grant.grant_id),
                   config={**DPSGD_CONFIG, "membership_audit": "eval"})

    props = _custom(model)
    n = _labeled(rows["train"])
    with open(os.path.join(model.uri, g.MEMBERSHIP_FILE_NAME)) as f:
        membership = json.load(f)  # the opt-in audit: train vs eval split, flagged as not DP
    assert membership["num_train"] == n and membership["num_heldout"] == _labeled(rows["eval"])
    assert 0.0 <= membership["auc"] <= 1.0 and not membership["differentially_private"]
    assert n < N_TRAIN  # records without a label are not trained on
    assert props["dp_num_examples"] == n and props["dp_batch_size"] == 30
    assert props["dp_epochs"] == 2.0 and props["dp_steps"] == math.ceil(2 * n / 30)
    assert props["dp_algorithm"] == "dpsgd" and props["dp_mode"] == "basic"
    assert props["dp_accounting"] == "rdp" and props["dp_delta"] == 1e-5
    assert props["dp_sampling"] == "poisson (each example independently with probability q per step)"
    assert props["dp_l2_norm_clip"] == 1.0 and props["grant_id"] == grant.grant_id
    # ε recomputed with dp_accounting from the recorded σ, q and steps: the recorded ε, ≤ part.
    eps = _rdp_eps(30 / n, props["dp_noise_multiplier"], props["dp_steps"], 1e-5)
    assert props["dp_epsilon"] == pytest.approx(eps, rel=1e-12)
    assert props["dp_epsilon"] <= 2.0 and props["dp_epsilon"] > 1.9  # calibrated, not wasted
    assert json.loads(props["dp_event_json"]) == accounting.event_to_dict(
        _dpsgd_event(30 / n, props["dp_noise_multiplier"], props["dp_steps"]))

    with open(os.path.join(model.uri, g.GUARANTEE_FILE_NAME)) as f:
        record = json.load(f)
    assert record["epsilon"] == props["dp_epsilon"]
    assert record["reported"]["trained_steps"] == props["dp_steps"]  # exactly the accounted steps
    assert record["train_part"]["epsilon"] == 2.0

    serving_dir = path_utils.serving_model_path(model.uri)
    assert serving_dir.endswith("Format-Serving")
    records = [_example(f) for f in rows["eval"]]
    raw = [_example({"distance": 500, "hour": 9})]  # no dep_delay, no label: defaults apply
    preds = _serve(model.uri, records + raw)
    assert preds.shape == (N_EVAL + 1, 1) and np.all(np.isfinite(preds))
    # Served = the training featurization of the same records through the exported Keras model,
    # which is a plain Sequential (no TF Privacy training code in the serving model).
    import tensorflow as tf
    from sage_tfx.pipelines import flights_dp_module as module
    dp = mods[5]
    keras_model = tf.keras.models.load_model(serving_dir)
    assert type(keras_model).__name__ == "Sequential"

    class Args:
        train_files = [os.path.join(uri, "Split-eval", "*")]

    data = dp.read_split(Args, "train", dp.columns_from_config(module.DEFAULT_FEATURES))
    direct = keras_model(data.features).numpy() * max(module.DEFAULT_LABEL_BOUNDS, key=abs)
    np.testing.assert_allclose(preds[:N_EVAL], direct, rtol=1e-5, atol=1e-4)


@pytest.mark.slow
def test_serving_featurization_equals_training_featurization(mods, flights):
    import tensorflow as tf
    dp = mods[5]
    uri, rows = flights
    columns = dp.columns_from_config({"distance": {"default": 0, "min": 0, "max": 5000},
                                      "hour": 12.0,
                                      "dep_delay": {"default": 3.0, "min": -60, "max": 300}})

    class Args:
        train_files = [os.path.join(uri, "Split-train", "*")]
        eval_files = [os.path.join(uri, "Split-eval", "*")]

    data = dp.read_split(Args, "train", columns, label_key="arr_delay")
    assert data.num_records == N_TRAIN and data.kinds == {
        "distance": "int", "hour": "int", "dep_delay": "float", "arr_delay": "float"}
    assert np.isnan(data.labels).sum() == N_TRAIN - _labeled(rows["train"])
    spec = {"distance": tf.io.VarLenFeature(tf.int64), "hour": tf.io.VarLenFeature(tf.int64),
            "dep_delay": tf.io.VarLenFeature(tf.float32)}
    parsed = tf.io.parse_example(tf.constant([_example(f) for f in rows["train"]]), spec)
    np.testing.assert_allclose(dp.featurize_tf(parsed, columns).numpy(), data.features,
                               rtol=1e-6, atol=1e-7)
    missing = data.features[[i for i, f in enumerate(rows["train"]) if "dep_delay" not in f]]
    assert [c.name for c in columns] == ["dep_delay", "distance", "hour"]  # sorted names
    assert np.allclose(missing[:, 0], (3.0 + 60) / 360)
    assert dp.count_records(Args.train_files) == N_TRAIN


@pytest.mark.slow
def test_dpsgd_rdp_part_trains_with_exactly_the_charged_event(mods, tmp_path, flights):
    uri, rows = flights
    event = _dpsgd_event(0.1, 1.3, 12)
    plan = PrivacyPlan.of(PlanPart("train", event=event, params=(("delta", 1e-6),)),
                          PlanPart("validate", event=dp_accounting.LaplaceDpEvent(10.0)))
    grant = _grant(mods, tmp_path, plan, mode="rdp")
    model = _train(mods, tmp_path, grant=grant, examples=_examples(uri),
                   config=dict(DPSGD_CONFIG, task="classification", hidden_units=[]))
    props = _custom(model)
    n = _labeled(rows["train"])
    assert props["dp_mode"] == "rdp" and props["dp_noise_multiplier"] == 1.3
    assert props["dp_steps"] == 12 and props["dp_batch_size"] == round(0.1 * n)
    assert props["dp_event_json"] == accounting.event_to_json(event)
    assert props["dp_delta"] == 1e-6 and props["dp_accounting"] == "rdp"
    assert props["dp_epsilon"] == pytest.approx(_rdp_eps(0.1, 1.3, 12, 1e-6), rel=1e-12)
    with open(os.path.join(model.uri, g.GUARANTEE_FILE_NAME)) as f:
        assert json.load(f)["reported"]["trained_steps"] == 12
    preds = _serve(model.uri, [_example(f) for f in rows["eval"]])
    assert np.all((preds >= 0) & (preds <= 1))  # P(delay > 15 min)


@pytest.mark.slow
def test_rdp_part_without_delta_param_reports_at_the_stream_delta(mods, tmp_path, flights):
    uri, _ = flights
    event = _dpsgd_event(0.2, 2.0, 3)
    grant = _grant(mods, tmp_path, PrivacyPlan.of(PlanPart("train", event=event)), mode="rdp")
    props = _custom(_train(mods, tmp_path, grant=grant, examples=_examples(uri),
                           config=DPSGD_CONFIG))
    assert props["dp_delta"] == 1e-5  # the stream's δ_g
    assert props["dp_epsilon"] == pytest.approx(_rdp_eps(0.2, 2.0, 3, 1e-5), rel=1e-12)


@pytest.mark.slow
def test_rdp_part_of_another_shape_is_refused(mods, tmp_path, flights):
    uri, _ = flights
    plan = PrivacyPlan.of(PlanPart("train", event=dp_accounting.GaussianDpEvent(3.0)))
    grant = _grant(mods, tmp_path, plan, mode="rdp")
    with pytest.raises(g.GuaranteeMismatchError, match="not a DP-SGD event"):
        _train(mods, tmp_path, grant=grant, examples=_examples(uri), config=DPSGD_CONFIG)


@pytest.mark.slow
def test_adassp_run(mods, tmp_path, flights):
    from sage_tfx.dp import adassp
    uri, rows = flights
    grant = _grant(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 1.0, 1e-6)))
    model = _train(mods, tmp_path, grant=grant, examples=_examples(uri),
                   config={"algorithm": "adassp", "seed": 3})
    props = _custom(model)
    assert props["dp_algorithm"] == "adassp" and props["dp_accounting"] == "pld"
    assert props["dp_num_examples"] == _labeled(rows["train"])
    assert props["dp_sampling"] == g.FULL_BATCH_SAMPLING
    assert "dp_batch_size" not in props and "dp_l2_norm_clip" not in props
    acct = dp_accounting.pld.PLDAccountant()
    acct.compose(adassp.adassp_event(props["dp_noise_multiplier"]))
    assert props["dp_epsilon"] == pytest.approx(acct.get_epsilon(1e-6), rel=1e-9)
    assert props["dp_epsilon"] <= 1.0
    preds = _serve(model.uri, [_example(f) for f in rows["eval"]])
    assert preds.shape == (N_EVAL, 1) and np.all(np.isfinite(preds))


@pytest.mark.slow
def test_replace_one_logistic_model_is_refused(mods, tmp_path, flights):
    """Output-perturbation logistic regression is DP for replace-one adjacency only; the
    ledger's charges compose under add/remove-one, so the trainer must not record it as covered."""
    uri, rows = flights
    grant = _grant(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 1.0, 1e-6)))
    with pytest.raises(g.GuaranteeMismatchError, match="replace_one"):
        _train(mods, tmp_path, grant=grant, examples=_examples(uri),
               config={"algorithm": "logistic", "seed": 3, "accountant": "rdp"})


@pytest.mark.slow
def test_numpy_algorithms_refuse_rdp_parts(mods, tmp_path, flights):
    uri, _ = flights
    plan = PrivacyPlan.of(PlanPart("train", event=dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(5.0), 3)))
    grant = _grant(mods, tmp_path, plan, mode="rdp")
    with pytest.raises(ValueError, match="only spend a basic"):
        _train(mods, tmp_path, grant=grant, examples=_examples(uri),
               config={"algorithm": "adassp"})


@pytest.mark.slow
@pytest.mark.parametrize("case", ["no_grant", "denied", "no_train_part", "no_plan",
                                  "other_grant_examples"])
def test_missing_grant_refuses_before_training(mods, tmp_path, flights, case):
    uri, _ = flights
    plan = PrivacyPlan.of(PlanPart("validate", 0.5))
    grant = None
    examples = _examples(uri)
    if case == "denied":
        grant = _grant(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 20.0, 1e-6)))
    elif case == "no_train_part":
        grant = _grant(mods, tmp_path, plan)
    elif case == "no_plan":
        grant = _grant(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 1.0, 1e-6)),
                       write_plan=False)
    elif case == "other_grant_examples":
        grant = _grant(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 1.0, 1e-6)))
        examples = _examples(uri, grant_id="some-other-grant")
    match = {"no_grant": "exactly one SageGrant", "denied": "denied",
             "no_train_part": "no 'train' part", "no_plan": "no privacy plan",
             "other_grant_examples": "some-other-grant"}[case]
    with pytest.raises(MissingGrantError, match=match):
        _train(mods, tmp_path, grant=grant, examples=examples, config=DPSGD_CONFIG)
    assert not os.path.exists(tmp_path / "model" / "Format-Serving")


_SILENT_MODULE = '''
from sage_tfx.components.dp_trainer import run_fn_utils as dp

def run_fn(fn_args):
    columns = dp.columns_from_config(["distance", "hour"])
    data = dp.read_split(fn_args, "train", columns)
    model = dp.linear_keras_model([0.1, 0.2])
    dp.export_serving_model(fn_args, model, columns, kinds=data.kinds)
    {report}
'''


@pytest.mark.slow
@pytest.mark.parametrize("report, error", [
    ("pass", "did not report"),
    # Claims a σ that would overspend the 1.0 budget (as if it trained with too little noise).
    ("dp.report_guarantee(fn_args, dict(algorithm='dpsgd', noise_multiplier=0.5, batch_size=60,"
     " num_examples=data.num_examples, epochs=3, l2_norm_clip=1.0, delta=1e-6,"
     " accountant='rdp', trained_steps=18))", "allows epsilon=1.0"),
])
def test_run_fn_without_a_valid_report_fails_and_leaves_no_model(mods, tmp_path, flights,
                                                                  report, error):
    uri, _ = flights
    module = tmp_path / "silent_module.py"
    module.write_text(_SILENT_MODULE.format(report=report))
    grant = _grant(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 1.0, 1e-6)))
    with pytest.raises(g.GuaranteeMismatchError, match=error):
        _train(mods, tmp_path, grant=grant, examples=_examples(uri), module_file=str(module))
    assert not os.path.exists(tmp_path / "model" / "Format-Serving")


@pytest.mark.slow
def test_component_spec(mods):
    from tfx.proto import trainer_pb2
    from tfx.types import standard_artifacts
    from sage_tfx.components.artifacts import SageGrant
    from tfx import types
    component, _, spec = mods[:3]
    examples = types.Channel(type=standard_artifacts.Examples)
    grant = types.Channel(type=SageGrant)
    trainer = component.DPTrainer(examples=examples, grant=grant, run_fn=f"{MODULE}.run_fn",
                                  custom_config={"epochs": 3})
    assert trainer.inputs[spec.GRANT_INPUT_KEY] is grant
    assert trainer.outputs[spec.MODEL_KEY].type is standard_artifacts.Model
    assert json.loads(trainer.exec_properties[spec.CUSTOM_CONFIG_KEY]) == {"epochs": 3}
    with pytest.raises(ValueError, match="Exactly one"):
        component.DPTrainer(examples=examples, grant=grant)
    with pytest.raises(ValueError, match="num_steps"):
        component.DPTrainer(examples=examples, grant=grant, run_fn="m.f",
                            train_args=trainer_pb2.TrainArgs(num_steps=100))
    with pytest.raises(ValueError, match="reserved"):
        component.DPTrainer(examples=examples, grant=grant, run_fn="m.f",
                            custom_config={"sage_train_part": {}})
    with pytest.raises(TypeError):
        component.DPTrainer(examples=examples, run_fn="m.f")  # grant is required


# ---------------------------------------------------------------------------------------------
# With a transform graph: transformed examples in, raw tf.Examples served (penguin pattern).


def _preprocessing_fn(inputs):
    """No analyzers (nothing data-dependent): km, hours, the label (NaN if absent)."""
    import tensorflow as tf
    import tensorflow_transform as tft

    def dense(name, default):
        return tf.squeeze(tft.sparse_tensor_to_dense_with_shape(
            inputs[name], [None, 1], default_value=default), axis=1)

    return {"distance_km": tf.cast(dense("distance", 0), tf.float32) * 1.609,
            "dep_delay_h": dense("dep_delay", 0.0) / 60.0,
            "arr_delay": dense("arr_delay", float("nan"))}


@pytest.fixture(scope="module")
def transformed(tmp_path_factory, flights):
    """(TransformGraph uri, transformed Examples uri) as the TFX Transform would write them."""
    import tensorflow as tf
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam
    from tensorflow_transform.tf_metadata import metadata_io, schema_utils
    uri, rows = flights
    root = tmp_path_factory.mktemp("transform")
    raw_spec = {"distance": tf.io.VarLenFeature(tf.int64), "hour": tf.io.VarLenFeature(tf.int64),
                "dep_delay": tf.io.VarLenFeature(tf.float32),
                "arr_delay": tf.io.VarLenFeature(tf.float32)}
    schema = schema_utils.schema_from_feature_spec(raw_spec)
    graph = str(root / "transform_graph")
    instances = [{k: [v] for k, v in f.items()} for f in rows["train"][:20]]
    for inst in instances:
        for k in raw_spec:
            inst.setdefault(k, [])
    with tft_beam.Context(temp_dir=str(root / "tmp"), force_tf_compat_v1=False):
        transform_fn = ((instances, tft.DatasetMetadata(schema))
                        | tft_beam.AnalyzeDataset(_preprocessing_fn))
        _ = transform_fn | tft_beam.WriteTransformFn(graph)
    metadata_io.write_metadata(tft.DatasetMetadata(schema),
                               os.path.join(graph, tft.TFTransformOutput.RAW_METADATA_DIR))
    layer = tft.TFTransformOutput(graph).transform_features_layer()
    examples = root / "transformed_examples"
    for split, feats in rows.items():
        os.makedirs(examples / f"Split-{split}")
        out = layer(tf.io.parse_example(tf.constant([_example(f) for f in feats]), raw_spec))
        path = str(examples / f"Split-{split}" / "transformed_examples-00000-of-00001.gz")
        with tf.io.TFRecordWriter(path, options="GZIP") as w:
            for i in range(len(feats)):
                w.write(_example({k: float(v[i]) for k, v in out.items()}))
    return graph, str(examples)


@pytest.mark.slow
def test_transform_graph_run_serves_raw_examples(mods, tmp_path, flights, transformed):
    import tensorflow as tf
    from tfx.types import standard_artifacts
    dp = mods[5]
    _, rows = flights
    graph_uri, examples_uri = transformed
    graph = standard_artifacts.TransformGraph()
    graph.uri = graph_uri
    features = {"distance_km": {"min": 0, "max": 8000}, "dep_delay_h": {"min": -1, "max": 5}}
    grant = _grant(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 2.0, 1e-5)))
    model = _train(mods, tmp_path, grant=grant, examples=_examples(examples_uri),
                   transform_graph=graph, config=dict(DPSGD_CONFIG, features=features))
    assert _custom(model)["dp_num_examples"] == _labeled(rows["train"])

    raw = [_example(f) for f in rows["eval"]]
    served = _serve(model.uri, raw)
    # The same rows through the training path: transformed records -> featurize -> model.
    loaded = tf.saved_model.load(os.path.join(model.uri, "Format-Serving"))

    class Args:
        train_files = [os.path.join(examples_uri, "Split-eval", "*")]

    data = dp.read_split(Args, "train", dp.columns_from_config(features))
    direct = loaded(tf.constant(data.features)).numpy() * 300.0  # label_scale of the defaults
    np.testing.assert_allclose(served, direct, rtol=1e-5, atol=1e-4)
    # A request with only some raw features (no label, no dep_delay) is served too.
    assert np.isfinite(_serve(model.uri, [_example({"distance": 700})])).all()


# ---------------------------------------------------------------------------------------------
# Under LocalDagRunner: the orchestrator serializes exec properties, packages the module file and
# records the Model's custom properties in ML Metadata. The grant (with its plan) and the Examples
# are imported: SageGate does not write plans yet.


@pytest.mark.slow
def test_dp_trainer_under_local_dag_runner(mods, tmp_path, flights):
    import shutil
    from ml_metadata.metadata_store import metadata_store
    from tfx import v1 as tfx
    from tfx.orchestration import metadata
    from tfx.types import standard_artifacts
    from sage_tfx.components.artifacts import SageGrant
    from sage_tfx.components.dp_trainer.component import DPTrainer
    from sage_tfx.pipelines import flights_dp_module
    uri, rows = flights
    artifacts = mods[3]
    grant = _grant(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 1.0, 1e-6)))
    module_file = str(tmp_path / "flights_module.py")
    shutil.copy(flights_dp_module.__file__, module_file)

    examples = tfx.dsl.Importer(
        source_uri=uri, artifact_type=standard_artifacts.Examples,
        properties={"split_names": '["train", "eval"]'}).with_id("import_examples")
    grant_import = tfx.dsl.Importer(
        source_uri=grant.uri, artifact_type=SageGrant,
        custom_properties={**{k: getattr(grant, k) for k in ("grant_id", "stream", "run_id",
                                                             "context", "ledger_url")},
                           artifacts.GRANTED_KEY: 1}).with_id("import_grant")
    trainer = DPTrainer(examples=examples.outputs["result"], grant=grant_import.outputs["result"],
                        module_file=module_file,
                        custom_config={"algorithm": "adassp", "seed": 5})
    metadata_path = str(tmp_path / "mlmd.db")
    tfx.orchestration.LocalDagRunner().run(tfx.dsl.Pipeline(
        pipeline_name="dp-trainer", pipeline_root=str(tmp_path / "root"),
        components=[examples, grant_import, trainer],
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            metadata_path)))

    store = metadata_store.MetadataStore(metadata.sqlite_metadata_connection_config(metadata_path))
    [model] = store.get_artifacts_by_type("Model")
    props = {k: v.string_value or v.double_value or v.int_value
             for k, v in model.custom_properties.items()}
    assert props["dp_algorithm"] == "adassp" and props["grant_id"] == grant.grant_id
    assert props["dp_delta"] == 1e-6 and 0 < props["dp_epsilon"] <= 1.0
    assert props["dp_num_examples"] == _labeled(rows["train"])
    assert np.isfinite(_serve(model.uri, [_example(f) for f in rows["eval"]])).all()
