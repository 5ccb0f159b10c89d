"""DPModelValidator: spec, executor Do() on a tiny Keras SavedModel, and stock Pusher downstream.

The models are saved the way the TFX Trainer saves them (``<model uri>/Format-Serving``, a
``serving_default`` signature on serialized tf.Examples); the eval data is a generated Examples
artifact in ExampleGen's layout; grants come from a real SQLite ledger with a privacy plan.
"""
import json
import math
import os

import numpy as np
import pytest

from trainerdata import examples_artifact as _examples
from trainerdata import grant as _grant

pytestmark = pytest.mark.slow

N_EVAL = 2000
NOISE_SD = 0.1  # labels y = 2x + 1 + N(0, 0.1²): the good model's expected squared error is 0.01


# ---------------------------------------------------------------------------------------------
# Test data: eval examples, SavedModels, grants.


@pytest.fixture(scope="module")
def mods():
    from sage_tfx.components import artifacts, plan_io
    from sage_tfx.components.dp_validator import component, executor, spec
    return component, executor, spec, artifacts, plan_io


@pytest.fixture(scope="module")
def eval_data():
    """x ~ U(0, 1), regression label y, binary label cls = [x > 0.5]; as float32 arrays."""
    rng = np.random.default_rng(2024)
    x = rng.uniform(0.0, 1.0, N_EVAL).astype(np.float32)
    y = (2.0 * x + 1.0 + rng.normal(0.0, NOISE_SD, N_EVAL)).astype(np.float32)
    cls = (x > 0.5).astype(np.int64)
    return x, y, cls


def _serialize(x, y, cls):
    import tensorflow as tf
    out = []
    for xi, yi, ci in zip(x, y, cls):
        ex = tf.train.Example()
        ex.features.feature["x"].float_list.value.append(float(xi))
        ex.features.feature["y"].float_list.value.append(float(yi))
        ex.features.feature["cls"].int64_list.value.append(int(ci))
        out.append(ex.SerializeToString())
    return out


@pytest.fixture(scope="module")
def examples_dir(tmp_path_factory, eval_data):
    """An ExampleGen-layout directory: Split-train (a few records) and Split-eval (N_EVAL)."""
    import tensorflow as tf
    root = tmp_path_factory.mktemp("examples")
    x, y, cls = eval_data
    for split, records in (("train", _serialize(x[:10], y[:10], cls[:10])),
                           ("eval", _serialize(x, y, cls))):
        os.makedirs(root / f"Split-{split}")
        path = str(root / f"Split-{split}" / "data_tfrecord-00000-of-00001.gz")
        with tf.io.TFRecordWriter(path, options="GZIP") as w:
            for r in records:
                w.write(r)
    return str(root)


def _save_model(model_uri, w, b, two_outputs):
    """A Keras model saved as the TFX Trainer does: serving signature on serialized tf.Example.

    ``two_outputs``: outputs {"prediction": w·x + b, "probability": sigmoid(20(x − 0.5))};
    otherwise the single output w·x + b (signature output ``output_0``).
    """
    import tensorflow as tf
    inputs = tf.keras.Input(shape=(1,), name="x")
    dense = tf.keras.layers.Dense(1, name="linear")
    model = tf.keras.Model(inputs, dense(inputs))
    dense.set_weights([np.array([[w]], np.float32), np.array([b], np.float32)])
    feature_spec = {"x": tf.io.FixedLenFeature([1], tf.float32)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve_tf_examples_fn(serialized):
        features = tf.io.parse_example(serialized, feature_spec)
        prediction = model(features["x"])
        if not two_outputs:
            return prediction
        return {"prediction": prediction,
                "probability": tf.sigmoid(20.0 * (features["x"] - 0.5))}

    model.save(os.path.join(model_uri, "Format-Serving"), save_format="tf",
               signatures={"serving_default": serve_tf_examples_fn.get_concrete_function()})
    return model_uri


@pytest.fixture(scope="module")
def good_model_uri(tmp_path_factory):
    return _save_model(str(tmp_path_factory.mktemp("good_model")), 2.0, 1.0, two_outputs=True)


@pytest.fixture(scope="module")
def bad_model_uri(tmp_path_factory):
    return _save_model(str(tmp_path_factory.mktemp("bad_model")), -2.0, 0.0, two_outputs=False)


def _model(uri):
    from tfx.types import standard_artifacts
    m = standard_artifacts.Model()
    m.uri = uri
    return m


def _plan(*parts):
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    return PrivacyPlan.of(*[PlanPart(*p) if isinstance(p, tuple) else p for p in parts])


def _props(spec, **kw):
    props = {spec.METRIC_KEY: "loss", spec.LOSS_FN_KEY: "squared_error", spec.TARGET_KEY: 0.1,
             spec.LOSS_BOUND_KEY: 1.0, spec.ETA_KEY: 0.05, spec.LABEL_KEY: "y",
             spec.PREDICTION_KEY: "prediction", spec.EVAL_SPLIT_KEY: "eval",
             spec.SIGNATURE_NAME_KEY: "serving_default", spec.BATCH_SIZE_KEY: 512}
    for name, value in kw.items():  # label_key -> spec.LABEL_KEY, eval_split -> EVAL_SPLIT_KEY
        key = name.upper() if name.endswith("_key") else name.upper() + "_KEY"
        props[getattr(spec, key)] = value
    return props


def _trained_under(model, grant):
    """The record a DPTrainer writes on its Model once it verified what its loop ran."""
    model.set_string_custom_property("grant_id", grant.grant_id)
    model.set_string_custom_property("dp_algorithm", "dpsgd")
    model.set_string_custom_property("dp_verification", "observed")
    return model


def _run(mods, tmp_path, *, grant, model, examples, name="blessing", trained=True, **kw):
    from tfx.types import standard_artifacts
    _, executor, spec, _, _ = mods
    if trained:
        _trained_under(model, grant)
    blessing = standard_artifacts.ModelBlessing()
    blessing.uri = str(tmp_path / name)
    executor.Executor().Do(
        {spec.EXAMPLES_KEY: [examples], spec.MODEL_KEY: [model], spec.GRANT_INPUT_KEY: [grant]},
        {spec.BLESSING_KEY: [blessing]}, _props(spec, **kw))
    return blessing


def _custom_properties(artifact):
    return set(artifact.mlmd_artifact.custom_properties)


def _validation_json(spec, blessing):
    with open(os.path.join(blessing.uri, spec.VALIDATION_FILE_NAME)) as f:
        return json.load(f)


def _raw_losses(eval_data, w=2.0, b=1.0):
    x, y, _ = eval_data
    pred = (np.float32(w) * x + np.float32(b)).astype(np.float64)
    return np.clip((pred - y.astype(np.float64)) ** 2, 0.0, 1.0)


# ---------------------------------------------------------------------------------------------
# Decisions.


def test_accept_blesses_with_dp_quantities_only(mods, tmp_path, eval_data, examples_dir,
                                                good_model_uri):
    _, _, spec, _, _ = mods
    grant = _grant(mods, tmp_path, _plan(("train", 0.5), ("validate", 1.0)))
    model = _model(good_model_uri)
    blessing = _run(mods, tmp_path, grant=grant, model=model, examples=_examples(examples_dir))

    assert sorted(os.listdir(blessing.uri)) == [spec.BLESSED_FILE_NAME, spec.VALIDATION_FILE_NAME]
    assert blessing.get_int_custom_property("blessed") == 1
    assert blessing.get_string_custom_property("outcome") == "ACCEPT"
    assert blessing.get_string_custom_property("metric_name") == "squared_error"
    assert blessing.get_float_custom_property("epsilon") == 1.0
    assert blessing.get_float_custom_property("eta") == 0.05
    assert blessing.get_float_custom_property("target") == 0.1
    assert blessing.get_float_custom_property("loss_bound") == 1.0
    assert blessing.get_string_custom_property("grant_id") == grant.grant_id
    assert blessing.get_string_custom_property("current_model") == good_model_uri
    upper = blessing.get_float_custom_property("upper_bound")
    lower = blessing.get_float_custom_property("lower_bound")
    assert lower <= 0.01 <= upper <= 0.1

    # Only DP quantities: the expected set of properties, none of them the raw loss or count.
    assert _custom_properties(blessing) == {
        "blessed", "outcome", "metric_name", "dp_estimate", "upper_bound", "lower_bound",
        "n_test_dp", "epsilon", "delta", "eta", "target", "loss_bound", "grant_id",
        "current_model", "current_model_id", "replayed", "release_name", "release_digest"}
    assert blessing.get_int_custom_property("replayed") == 0  # this run drew the release
    raw_mean = float(_raw_losses(eval_data).mean())
    assert blessing.get_float_custom_property("dp_estimate") != raw_mean
    assert blessing.get_float_custom_property("n_test_dp") != float(N_EVAL)
    result = _validation_json(spec, blessing)
    assert result["outcome"] == "ACCEPT" and result["epsilon"] == 1.0 and result["delta"] == 0.0
    assert result["upper_bound"] == upper and result["details"]["sla"] == "Sage SLA"
    assert "loss_sum" not in result["details"]  # the non-private baseline's key


def test_epsilon_is_exactly_the_plans_validate_part(mods, tmp_path, eval_data, examples_dir,
                                                    good_model_uri):
    """The DP count is n + Laplace(2/ε), the sum + Laplace(2B/ε) (OpenDP: never seeded)."""
    _, _, spec, _, _ = mods
    epsilon = 0.37
    grant = _grant(mods, tmp_path, _plan(("transform", 0.2), ("validate", epsilon, 1e-7)))
    blessing = _run(mods, tmp_path, grant=grant, model=_model(good_model_uri),
                    examples=_examples(examples_dir))
    result = _validation_json(spec, blessing)
    tail = math.log(1e6)  # P(|Laplace(b)| > b·ln(1e6)) = 1e-6
    count_noise = result["n_test_dp"] - N_EVAL
    sum_noise = result["details"]["dp_loss_sum"] - float(_raw_losses(eval_data).sum())
    assert 0 < abs(count_noise) < 2.0 / epsilon * tail  # noised, at the scale charged
    assert abs(sum_noise) < 2.0 * 1.0 / epsilon * tail
    assert blessing.get_float_custom_property("n_test_dp") == result["n_test_dp"]
    assert result["epsilon"] == epsilon and result["delta"] == 0.0
    assert result["details"]["count_noise_scale"] == 2.0 / epsilon


@pytest.mark.slow
def test_trainers_membership_audit_is_shown_next_to_the_decision(mods, tmp_path, examples_dir,
                                                                good_model_uri):
    """The DPTrainer's membership-inference audit (not DP) is carried into validation.json and
    the blessing's properties; the decision itself is unchanged by it."""
    import shutil
    from sage_tfx.components.dp_trainer.guarantee import MEMBERSHIP_FILE_NAME
    _, _, spec, _, _ = mods
    audited = str(tmp_path / "audited_model")
    shutil.copytree(good_model_uri, audited)
    report = {"auc": 0.51, "attacker_advantage": 0.04, "num_train": 10, "num_heldout": 10,
              "differentially_private": False}
    with open(os.path.join(audited, MEMBERSHIP_FILE_NAME), "w") as f:
        json.dump(report, f)
    grant = _grant(mods, tmp_path, _plan(("train", 0.5), ("validate", 1.0)))
    blessing = _run(mods, tmp_path, grant=grant, model=_model(audited),
                    examples=_examples(examples_dir))
    assert blessing.get_float_custom_property("membership_auc") == 0.51
    assert blessing.get_float_custom_property("membership_advantage") == 0.04
    assert _validation_json(spec, blessing)["membership_inference"] == report
    assert blessing.get_string_custom_property("outcome") == "ACCEPT"


@pytest.mark.parametrize("target,epsilon", [
    (0.012, 1.0),   # tight target: true loss 0.01 is within the DP + sampling error
    (0.1, 0.01),    # lenient target, but ε too small for the 2000 examples
])
def test_retry_is_not_blessed(mods, tmp_path, examples_dir, good_model_uri, target, epsilon):
    _, _, spec, _, _ = mods
    grant = _grant(mods, tmp_path, _plan(("validate", epsilon)))
    blessing = _run(mods, tmp_path, grant=grant, model=_model(good_model_uri),
                    examples=_examples(examples_dir), target=target)
    assert sorted(os.listdir(blessing.uri)) == [spec.NOT_BLESSED_FILE_NAME,
                                                spec.VALIDATION_FILE_NAME]
    assert blessing.get_int_custom_property("blessed") == 0
    assert blessing.get_string_custom_property("outcome") == "RETRY"
    assert blessing.get_float_custom_property("epsilon") == epsilon


def test_reject_a_model_clearly_worse_than_target(mods, tmp_path, examples_dir, bad_model_uri):
    """The bad model has one output, so prediction_key may be left unset."""
    _, _, spec, _, _ = mods
    grant = _grant(mods, tmp_path, _plan(("validate", 1.0)))
    blessing = _run(mods, tmp_path, grant=grant, model=_model(bad_model_uri),
                    examples=_examples(examples_dir), prediction_key=None)
    assert os.path.exists(os.path.join(blessing.uri, spec.NOT_BLESSED_FILE_NAME))
    assert not os.path.exists(os.path.join(blessing.uri, spec.BLESSED_FILE_NAME))
    assert blessing.get_int_custom_property("blessed") == 0
    assert blessing.get_string_custom_property("outcome") == "REJECT"
    assert blessing.get_float_custom_property("lower_bound") > 0.1


def test_accuracy_metric(mods, tmp_path, examples_dir, good_model_uri):
    _, _, spec, _, _ = mods
    grant = _grant(mods, tmp_path, _plan(("validate", 1.0)))
    blessing = _run(mods, tmp_path, grant=grant, model=_model(good_model_uri),
                    examples=_examples(examples_dir), metric="accuracy", loss_fn=None,
                    loss_bound=None, target=0.9, label_key="cls", prediction_key="probability")
    assert blessing.get_string_custom_property("outcome") == "ACCEPT"
    assert blessing.get_string_custom_property("metric_name") == "accuracy"
    assert blessing.get_float_custom_property("lower_bound") >= 0.9
    assert blessing.get_float_custom_property("loss_bound") == 1.0


def test_rdp_plan_with_the_validators_own_event(mods, tmp_path, examples_dir, good_model_uri):
    import dp_accounting
    from sage_tfx.adaptive.plan import PlanPart
    from sage_tfx.dp.validation import LossValidator
    _, _, spec, _, _ = mods
    epsilon = 0.5
    event = LossValidator(target=0.1, loss_bound=1.0, eta=0.05).dp_event(epsilon)
    plan = _plan(PlanPart("train", event=dp_accounting.GaussianDpEvent(5.0)),
                 PlanPart("validate", event=event))
    grant = _grant(mods, tmp_path, plan, mode="rdp")
    blessing = _run(mods, tmp_path, grant=grant, model=_model(good_model_uri),
                    examples=_examples(examples_dir, grant_id=grant.grant_id))
    assert blessing.get_float_custom_property("epsilon") == epsilon
    count_noise = _validation_json(spec, blessing)["n_test_dp"] - N_EVAL
    assert 0 < abs(count_noise) < 2.0 / epsilon * math.log(1e6)


def test_non_finite_bounds_are_left_out_and_the_blessing_fits_mlmd(mods, tmp_path, examples_dir,
                                                                   good_model_uri):
    """ε so small that the DP count is no evidence: upper bound inf (MLMD cannot store inf)."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2
    _, _, spec, _, _ = mods
    grant = _grant(mods, tmp_path, _plan(("validate", 1e-6)))
    blessing = _run(mods, tmp_path, grant=grant, model=_model(good_model_uri),
                    examples=_examples(examples_dir))
    assert blessing.get_string_custom_property("outcome") == "RETRY"
    assert math.isinf(_validation_json(spec, blessing)["upper_bound"])
    assert "upper_bound" not in _custom_properties(blessing)
    config = metadata_store_pb2.ConnectionConfig()
    config.fake_database.SetInParent()
    store = metadata_store.MetadataStore(config)
    blessing.type_id = store.put_artifact_type(blessing.artifact_type)
    [artifact_id] = store.put_artifacts([blessing.mlmd_artifact])
    [stored] = store.get_artifacts_by_id([artifact_id])
    assert stored.custom_properties["blessed"].int_value == 0


def test_data_never_raises_empty_split_and_missing_labels_still_decide(mods, tmp_path,
                                                                       examples_dir,
                                                                       good_model_uri):
    """An empty eval split, or labels absent from every example, give a decision, not an error
    (an exception that depends on the eval data would itself release information)."""
    _, _, spec, _, _ = mods
    grant = _grant(mods, tmp_path, _plan(("validate", 1.0)))
    empty = tmp_path / "empty_examples"
    os.makedirs(empty / "Split-eval")
    blessing = _run(mods, tmp_path, name="empty", grant=grant, model=_model(good_model_uri),
                    examples=_examples(str(empty)))
    assert blessing.get_string_custom_property("outcome") == "RETRY"
    assert os.path.exists(os.path.join(blessing.uri, spec.NOT_BLESSED_FILE_NAME))
    # Missing labels count as the worst loss B = 1: far above the target (a second validation:
    # a second grant).
    grant = _grant(mods, tmp_path, _plan(("validate", 1.0)), name="grant2")
    blessing = _run(mods, tmp_path, name="unlabeled", grant=grant, model=_model(good_model_uri),
                    examples=_examples(examples_dir), label_key="no_such_feature")
    assert blessing.get_string_custom_property("outcome") == "REJECT"
    assert blessing.get_float_custom_property("lower_bound") > 0.9


# ---------------------------------------------------------------------------------------------
# Refusals: no usable grant means no model run and no blessing.


def _assert_refused(mods, tmp_path, grant, match, examples=None, model=None, examples_dir=None):
    from sage_tfx.errors import MissingGrantError
    _, _, spec, _, _ = mods
    # A model that does not exist: a refusal must come before the model is loaded.
    model = model or _model(str(tmp_path / "no_model"))
    examples = examples or _examples(examples_dir or str(tmp_path / "no_examples"))
    from tfx.types import standard_artifacts
    blessing = standard_artifacts.ModelBlessing()
    blessing.uri = str(tmp_path / "refused")
    with pytest.raises(MissingGrantError, match=match):
        mods[1].Executor().Do(
            {spec.EXAMPLES_KEY: [examples], spec.MODEL_KEY: [model],
             spec.GRANT_INPUT_KEY: [grant]},
            {spec.BLESSING_KEY: [blessing]}, _props(spec))
    assert os.listdir(blessing.uri) == [spec.NOT_BLESSED_FILE_NAME]
    assert blessing.get_int_custom_property("blessed") == 0
    assert not blessing.has_custom_property("outcome")
    assert blessing.get_string_custom_property("reason")


def test_missing_grant_is_refused(mods, tmp_path):
    _, _, _, artifacts, _ = mods
    grant = artifacts.SageGrant()
    grant.uri = str(tmp_path / "empty_grant")
    os.makedirs(grant.uri)
    _assert_refused(mods, tmp_path, grant, "no grant in artifact")


def test_denied_grant_is_refused(mods, tmp_path):
    grant = _grant(mods, tmp_path, _plan(("validate", 5.0)), epsilon_g=1.0)
    _assert_refused(mods, tmp_path, grant, "denied")


def test_plan_without_validate_part_is_refused(mods, tmp_path):
    grant = _grant(mods, tmp_path, _plan(("train", 0.5)))
    _assert_refused(mods, tmp_path, grant, "no 'validate' part")


def test_grant_without_plan_is_refused(mods, tmp_path):
    grant = _grant(mods, tmp_path, _plan(("validate", 0.5)), write_plan=False)
    _assert_refused(mods, tmp_path, grant, "carries no privacy plan")


@pytest.mark.parametrize("event", ["laplace", "gaussian", "three_laplace"])
def test_rdp_validate_part_that_is_not_the_validators_event_is_refused(mods, tmp_path, event):
    import dp_accounting
    from sage_tfx.adaptive.plan import PlanPart
    events = {
        "laplace": dp_accounting.LaplaceDpEvent(2.0),
        "gaussian": dp_accounting.GaussianDpEvent(4.0),
        "three_laplace": dp_accounting.ComposedDpEvent([dp_accounting.LaplaceDpEvent(4.0)] * 3),
    }
    grant = _grant(mods, tmp_path, _plan(PlanPart("validate", event=events[event])), mode="rdp")
    _assert_refused(mods, tmp_path, grant, "not this validator's dp_event")


def test_examples_of_another_grant_are_refused(mods, tmp_path, examples_dir):
    grant = _grant(mods, tmp_path, _plan(("validate", 0.5)))
    _assert_refused(mods, tmp_path, grant, "were read under grant",
                    examples=_examples(examples_dir, grant_id="f" * 32))


@pytest.mark.parametrize("record", ["none", "other_grant", "reported_not_observed"])
def test_a_model_without_its_trainers_verified_record_is_never_blessed(
        mods, tmp_path, examples_dir, good_model_uri, record):
    """A good model (it would be ACCEPTed) that no Sage trainer recorded as trained and verified
    under this grant — the stock Trainer's, or a DPTrainer model verified from a run_fn's report
    instead of what ran — is refused with the reason, before the model or any example is read."""
    from tfx.types import standard_artifacts
    from sage_tfx.components.dp_trainer.guarantee import UnverifiedTrainingError
    _, executor, spec, _, _ = mods
    grant = _grant(mods, tmp_path, _plan(("validate", 1.0)))
    model = _model(good_model_uri)
    if record == "other_grant":
        model.set_string_custom_property("grant_id", "f" * 32)
    elif record == "reported_not_observed":
        _trained_under(model, grant).set_string_custom_property("dp_verification", "reported")
    blessing = standard_artifacts.ModelBlessing()
    blessing.uri = str(tmp_path / "refused")
    reason = ("not verified from the training the executor ran"
              if record == "reported_not_observed" else "records no DP training under grant")
    with pytest.raises(UnverifiedTrainingError, match=reason):
        executor.Executor().Do(
            {spec.EXAMPLES_KEY: [_examples(examples_dir)], spec.MODEL_KEY: [model],
             spec.GRANT_INPUT_KEY: [grant]},
            {spec.BLESSING_KEY: [blessing]}, _props(spec))
    assert os.listdir(blessing.uri) == [spec.NOT_BLESSED_FILE_NAME]
    assert blessing.get_int_custom_property("blessed") == 0
    assert reason in blessing.get_string_custom_property("reason")
    assert not blessing.has_custom_property("outcome")
    # The same model with the trainer's record of this grant is validated and blessed.
    accepted = _run(mods, tmp_path, name="accepted", grant=grant, model=_model(good_model_uri),
                    examples=_examples(examples_dir))
    assert accepted.get_int_custom_property("blessed") == 1


# ---------------------------------------------------------------------------------------------
# Configuration errors found at run time (model / data layout).


def test_ambiguous_output_wrong_split_and_signature(mods, tmp_path, examples_dir, good_model_uri):
    grant = _grant(mods, tmp_path, _plan(("validate", 0.5)))
    kw = dict(grant=grant, model=_model(good_model_uri), examples=_examples(examples_dir))
    with pytest.raises(ValueError, match=r"outputs \['prediction', 'probability'\]: set "
                                         "prediction_key"):
        _run(mods, tmp_path, name="b1", prediction_key=None, **kw)
    with pytest.raises(ValueError, match="no output 'logits'"):
        _run(mods, tmp_path, name="b2", prediction_key="logits", **kw)
    with pytest.raises(ValueError, match="no split 'test'"):
        _run(mods, tmp_path, name="b3", eval_split="test", **kw)
    with pytest.raises(ValueError, match="no signature 'predict'"):
        _run(mods, tmp_path, name="b4", signature_name="predict", **kw)


# ---------------------------------------------------------------------------------------------
# Stock Pusher downstream: it pushes ACCEPTed models only.


def _push(tmp_path, model, blessing, name):
    from tfx.components.pusher import executor as pusher_executor
    from tfx.proto import pusher_pb2
    from tfx.types import standard_artifacts
    from tfx.types import standard_component_specs as keys
    from tfx.utils import proto_utils
    pushed = standard_artifacts.PushedModel()
    pushed.uri = str(tmp_path / f"pushed_{name}")
    serving = tmp_path / f"serving_{name}"
    destination = pusher_pb2.PushDestination(
        filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=str(serving)))
    pusher_executor.Executor().Do(
        {keys.MODEL_KEY: [model], keys.MODEL_BLESSING_KEY: [blessing]},
        {keys.PUSHED_MODEL_KEY: [pushed]},
        {keys.PUSH_DESTINATION_KEY: proto_utils.proto_to_json(destination)})
    return pushed, serving


def test_stock_pusher_pushes_only_accepted_models(mods, tmp_path, examples_dir, good_model_uri):
    model = _model(good_model_uri)
    accepted = _run(mods, tmp_path, name="accepted", model=model, examples=_examples(examples_dir),
                    grant=_grant(mods, tmp_path, _plan(("validate", 1.0))))
    retried = _run(mods, tmp_path, name="retried", model=model, examples=_examples(examples_dir),
                   grant=_grant(mods, tmp_path, _plan(("validate", 1.0)), name="grant2"),
                   target=0.012)
    assert accepted.get_string_custom_property("outcome") == "ACCEPT"
    assert retried.get_string_custom_property("outcome") == "RETRY"

    pushed, serving = _push(tmp_path, model, accepted, "accepted")
    assert pushed.get_int_custom_property("pushed") == 1
    [version] = os.listdir(serving)
    assert os.path.exists(serving / version / "saved_model.pb")

    pushed, serving = _push(tmp_path, model, retried, "retried")
    assert pushed.get_int_custom_property("pushed") == 0
    assert not serving.exists()


# ---------------------------------------------------------------------------------------------
# Per-example values (numpy) and the component spec (nothing runs).


def test_per_example_values(mods):
    _, executor, _, _, _ = mods
    nan = np.nan
    y = np.array([1.0, 0.0, 1.0, 0.0, nan, 2.0])
    p = np.array([0.9, 0.9, 0.0, 0.0, 0.5, 0.5])
    np.testing.assert_allclose(executor.per_example_values("loss", "squared_error", y, p),
                               [0.01, 0.81, 1.0, 0.0, nan, 2.25])
    np.testing.assert_allclose(executor.per_example_values("loss", "absolute_error", y, p),
                               [0.1, 0.9, 1.0, 0.0, nan, 1.5])
    log = executor.per_example_values("loss", "log_loss", y, p)
    np.testing.assert_allclose(log[:2], [-math.log(0.9), -math.log(0.1)])
    assert log[2] == math.inf and log[3] == 0.0 and np.isnan(log[4:]).all()
    np.testing.assert_array_equal(
        executor.per_example_values("accuracy", None, y, np.array([0.9, 0.9, 0.5, 0.5, 1, 1])),
        [1.0, 0.0, 0.0, 1.0, nan, nan])


def test_label_values(mods):
    import tensorflow as tf
    _, executor, _, _, _ = mods
    records = []
    for kind, values in (("float_list", [1.5]), ("int64_list", [3]), ("bytes_list", [b"1"]),
                         ("float_list", [1.0, 2.0]), (None, None)):
        ex = tf.train.Example()
        if kind:
            getattr(ex.features.feature["label"], kind).value.extend(values)
        records.append(ex.SerializeToString())
    np.testing.assert_array_equal(executor.label_values(records, "label"),
                                  [1.5, 3.0, np.nan, np.nan, np.nan])


def _channels():
    from tfx import types
    from tfx.types import standard_artifacts
    from sage_tfx.components.artifacts import SageGrant
    return dict(examples=types.Channel(type=standard_artifacts.Examples),
                model=types.Channel(type=standard_artifacts.Model),
                grant=types.Channel(type=SageGrant))


def test_component_spec(mods):
    from tfx.types import standard_artifacts
    component, _, spec, _, _ = mods
    v = component.DPModelValidator(**_channels(), label_key="y", target=0.01, loss_bound=1)
    assert v.outputs[spec.BLESSING_KEY].type is standard_artifacts.ModelBlessing
    assert set(v.inputs) == {spec.EXAMPLES_KEY, spec.MODEL_KEY, spec.GRANT_INPUT_KEY}
    p = v.exec_properties
    assert (p[spec.METRIC_KEY], p[spec.LOSS_FN_KEY], p[spec.LOSS_BOUND_KEY]) == (
        "loss", "squared_error", 1.0)
    assert isinstance(p[spec.LOSS_BOUND_KEY], float) and p[spec.ETA_KEY] == 0.05
    assert (p[spec.EVAL_SPLIT_KEY], p[spec.SIGNATURE_NAME_KEY]) == ("eval", "serving_default")
    assert "seed" not in p and p.get(spec.PREDICTION_KEY) is None  # the noise is never seeded
    # The int property tfx.dsl.Cond reads, as with the Evaluator's blessing.
    from tfx.dsl.placeholder import placeholder as ph
    blessed = v.outputs[spec.BLESSING_KEY].future()[0].custom_property(spec.BLESSED_PROPERTY)
    assert isinstance(blessed == spec.BLESSED_VALUE, ph.Predicate)
    acc = component.DPModelValidator(**_channels(), label_key="c", metric="accuracy",
                                     target=0.9, eta=0.1, prediction_key="probability")
    p = acc.exec_properties
    assert (p[spec.METRIC_KEY], p.get(spec.LOSS_FN_KEY), p[spec.LOSS_BOUND_KEY]) == (
        "accuracy", None, 1.0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(metric="mse", target=0.1, loss_bound=1.0), "metric must be one of"),
    (dict(loss_fn="hinge", target=0.1, loss_bound=1.0), "loss_fn must be one of"),
    (dict(target=0.1), "needs loss_bound"),
    (dict(target=0.1, loss_bound=0.0), "loss_bound must be finite and > 0"),
    (dict(target=0.1, loss_bound=float("inf")), "loss_bound must be finite"),
    (dict(target=-0.1, loss_bound=1.0), "target loss must be"),
    (dict(target=0.1, loss_bound=1.0, eta=0.0), "eta"),
    (dict(target=0.1, loss_bound=1.0, eta=1.0), "eta"),
    (dict(metric="accuracy", target=1.5), "target accuracy"),
    (dict(metric="accuracy", target=0.9, loss_bound=2.0), "loss_bound must be 1"),
    (dict(metric="accuracy", target=0.9, loss_fn="log_loss"), "loss_fn applies to metric"),
    (dict(target=0.1, loss_bound=1.0, label_key=""), "label_key"),
    (dict(target=0.1, loss_bound=1.0, batch_size=0), "batch_size"),
    (dict(target=None, loss_bound=1.0), "target must be a number"),
])
def test_component_rejects_bad_arguments(mods, kwargs, match):
    component, _, _, _, _ = mods
    kwargs = dict(kwargs)
    kwargs.setdefault("label_key", "y")
    with pytest.raises(ValueError, match=match):
        component.DPModelValidator(**_channels(), **kwargs)
