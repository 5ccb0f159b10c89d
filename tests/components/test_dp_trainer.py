"""DPTrainer: verification of what ran (fast), spec, and executor Do() on generated flights
Examples (helpers and data in ``trainerdata.py``; the privacy loop's refusals in
``test_dp_trainer_privacy_loop.py``).

Executor runs use a real SQLite ledger grant with a privacy plan (``plan_io.write_plan``), Examples
in ExampleGen's layout (``Split-train`` / ``Split-eval`` gzip TFRecords), the module file
``sage_tfx.pipelines.flights_dp_module`` and tiny data (a few hundred rows, a few dozen steps).
ε is recomputed here with dp_accounting directly, independently of ``sage_tfx.dp.dpsgd``.
"""
import dataclasses
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
from trainerdata import (DPSGD_CONFIG, MODULE, N_EVAL, N_TRAIN, dpsgd_event,  # noqa: F401
                         example, examples_artifact, flights, grant_artifact, labeled, mods,
                         pld_eps, rdp_eps, serve, train, custom)

# ---------------------------------------------------------------------------------------------
# Fast: what ran, its verification, and the (optional) report (no TensorFlow).


def _ran(sigma=1.5, q=0.05, steps=40, n=1000, **kw):
    """The record of a DP-SGD run: σ, Poisson q and the steps that ran, on n rows."""
    fields = dict(algorithm="dpsgd", noise_multiplier=sigma, num_examples=n, accountant="rdp",
                  l2_norm_clip=1.0, sampling_probability=q, steps=steps,
                  batch_size=round(q * n), epochs=(steps or 0) * q)
    fields.update(kw)
    return g.TrainingRecord(**fields)


def test_basic_dpsgd_run_is_accounted_from_what_ran():
    part = PlanPart("train", 3.0, 1e-5)
    verified = g.verify_record(_ran(), part, grant_id="g1", num_train_records=1000)
    expected = rdp_eps(50 / 1000, 1.5, 40, 1e-5)
    assert verified.epsilon == pytest.approx(expected, rel=1e-12)
    assert verified.epsilon <= 3.0
    props = verified.model_properties()
    assert props["dp_epsilon"] == verified.epsilon and props["dp_delta"] == 1e-5
    assert (props["dp_batch_size"], props["dp_steps"], props["dp_num_examples"]) == (50, 40, 1000)
    assert props["dp_sampling_probability"] == 0.05 and props["dp_noise_multiplier"] == 1.5
    assert props["dp_sampling"] == g.DPSGD_SAMPLING and props["dp_accounting"] == "rdp"
    assert props["grant_id"] == "g1" and props["dp_algorithm"] == "dpsgd"
    assert props["dp_verification"] == "observed"


@pytest.mark.parametrize("change, message", [
    ({"noise_multiplier": 0.6}, "allows epsilon=3.0"),        # too little noise: overspends
    ({"steps": 400}, "allows epsilon=3.0"),                   # ten times the steps: overspends
    ({"sampling_probability": 0.5}, "allows epsilon=3.0"),    # larger batches: overspends
    ({"num_examples": 1001}, "only 1000"),                    # n above the train records
    ({"algorithm": "sgd"}, "algorithm"),
    ({"accountant": "moments"}, "accountant"),
    ({"steps": None}, "whole steps"),
])
def test_runs_that_do_not_fit_the_basic_part_are_refused(change, message):
    with pytest.raises(g.GuaranteeMismatchError, match=message):
        g.verify_record(_ran(**change), PlanPart("train", 3.0, 1e-5), grant_id="g",
                        num_train_records=1000)


def test_adassp_run_is_accounted_as_three_gaussian_releases():
    part = PlanPart("train", 1.0, 1e-6)
    ran = g.TrainingRecord(algorithm="adassp", noise_multiplier=8.0, num_examples=500,
                           accountant="pld")
    verified = g.verify_record(ran, part, grant_id="g", num_train_records=500)
    acct = dp_accounting.pld.PLDAccountant()
    acct.compose(dp_accounting.GaussianDpEvent(8.0), 3)
    assert verified.epsilon == pytest.approx(acct.get_epsilon(1e-6), rel=1e-9)
    assert verified.sampling == g.FULL_BATCH_SAMPLING and verified.steps is None
    with pytest.raises(g.GuaranteeMismatchError, match="allows epsilon=1.0"):
        g.verify_record(dataclasses.replace(ran, noise_multiplier=2.0), part, grant_id="g")
    with pytest.raises(g.GuaranteeMismatchError, match="needs delta > 0"):
        g.verify_record(ran, PlanPart("train", 1.0), grant_id="g")


def test_pld_record_is_verified_with_the_pld():
    verified = g.verify_record(_ran(accountant="pld"), PlanPart("train", 3.0, 1e-5),
                               grant_id="g1", num_train_records=1000)
    assert verified.accountant == "pld"
    assert verified.epsilon == pytest.approx(pld_eps(0.05, 1.5, 40, 1e-5), rel=1e-9)
    assert verified.epsilon < rdp_eps(0.05, 1.5, 40, 1e-5)
    assert verified.model_properties()["dp_accounting"] == "pld"


@pytest.mark.parametrize("accountant, eps_of", [(None, pld_eps), ("pld", pld_eps),
                                                ("rdp", rdp_eps)])
def test_dpsgd_run_for_basic_part_calibrates_to_the_real_n(accountant, eps_of):
    """σ calibrated to the part by the accountant asked for (PLD by default); verified from
    what ran with the same accountant, to the same ε; never above the part."""
    part = PlanPart("train", 1.0, 1e-5)
    kw = {} if accountant is None else {"accountant": accountant}
    run = g.dpsgd_run_for_part(part, num_examples=800, batch_size=40, epochs=3,
                               l2_norm_clip=0.5, **kw)
    assert run.steps == 60 and run.sampling_probability == 40 / 800
    assert run.accountant == (accountant or "pld")
    eps = eps_of(40 / 800, run.noise_multiplier, 60, 1e-5)
    assert eps <= 1.0 and eps == pytest.approx(1.0, abs=1e-3)
    assert run.epsilon == pytest.approx(eps, rel=1e-9)
    verified = g.verify_record(
        _ran(run.noise_multiplier, 40 / 800, 60, 800, accountant=run.accountant), part,
        grant_id="g", num_train_records=800)
    assert verified.accountant == run.accountant and verified.epsilon == run.epsilon
    # The charge is the part's (ε, δ); what ran is within it by the accountant that calibrated.
    assert verified.part_epsilon == 1.0 and verified.epsilon <= verified.part_epsilon


def test_rdp_part_is_charged_as_its_event_and_reported_by_rdp_whatever_the_accountant():
    """An rdp stream charges the DpEvent (the ledger keeps its RDP curve): asking for PLD changes
    neither the run nor the ε reported, which is the ledger's RDP view of that event."""
    event = dpsgd_event(0.05, 1.2, 30)
    part = PlanPart("train", event=event)
    run = g.dpsgd_run_for_part(part, num_examples=333, batch_size=10, epochs=1,
                               l2_norm_clip=1.0, accountant="pld", report_delta=1e-6)
    assert run.accountant == "rdp" and run.event == event
    assert run.epsilon == pytest.approx(rdp_eps(0.05, 1.2, 30, 1e-6), rel=1e-12)
    verified = g.verify_record(_ran(1.2, 0.05, 30, 333, accountant="pld"), part, grant_id="g",
                               num_train_records=333, report_delta=1e-6)
    assert verified.accountant == "rdp" and verified.epsilon == run.epsilon
    assert verified.model_properties()["dp_accounting"] == "rdp"


def test_dpsgd_run_for_rdp_part_takes_the_event_as_charged():
    event = dpsgd_event(0.05, 1.2, 30)
    part = PlanPart("train", event=event)
    run = g.dpsgd_run_for_part(part, num_examples=333, batch_size=999, epochs=99,
                               l2_norm_clip=1.0, report_delta=1e-6)
    assert (run.noise_multiplier, run.steps, run.batch_size) == (1.2, 30, round(0.05 * 333))
    assert run.event == event and run.epsilon == pytest.approx(rdp_eps(0.05, 1.2, 30, 1e-6))
    verified = g.verify_record(_ran(1.2, 0.05, 30, 333), part, grant_id="g",
                               num_train_records=333, report_delta=1e-6)
    assert verified.event == event and verified.part_epsilon is None
    assert verified.epsilon == pytest.approx(rdp_eps(0.05, 1.2, 30, 1e-6), rel=1e-12)
    # Anything but the charged event — even less privacy loss — is not the part, spent exactly.
    for other in (_ran(1.1, 0.05, 30, 333), _ran(1.2, 0.05, 29, 333), _ran(1.2, 0.04, 30, 333)):
        with pytest.raises(g.GuaranteeMismatchError, match="spent exactly"):
            g.verify_record(other, part, grant_id="g", num_train_records=333,
                            report_delta=1e-6)


def test_a_report_must_state_what_ran():
    ran = _ran(1.2, 0.05, 30, 333)
    run = g.dpsgd_run_for_part(PlanPart("train", event=dpsgd_event(0.05, 1.2, 30)),
                               num_examples=333, batch_size=1, epochs=1, l2_norm_clip=1.0,
                               report_delta=1e-6)
    g.check_report(g.report_from(run, trained_steps=30), ran)  # agrees: accepted
    for lie, message in (({"trained_steps": 31}, "trained_steps=31"),
                         ({"noise_multiplier": 2.0}, "noise_multiplier=2.0"),
                         ({"num_examples": 300}, "num_examples=300"),
                         ({"algorithm": "adassp"}, "algorithm='adassp'")):
        with pytest.raises(g.GuaranteeMismatchError, match=message):
            g.check_report({**g.report_from(run), **lie}, ran)


@pytest.mark.parametrize("event", [
    dp_accounting.GaussianDpEvent(1.0),
    dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(1.0), 3),
    dp_accounting.ComposedDpEvent([dpsgd_event(0.1, 1.0, 5)]),
    dp_accounting.SelfComposedDpEvent(dpsgd_event(0.1, 1.0, 5), 2),
])
def test_rdp_events_of_another_shape_are_refused(event):
    with pytest.raises(g.GuaranteeMismatchError, match="not a DP-SGD event"):
        g.dpsgd_run_for_part(PlanPart("train", event=event), num_examples=100, batch_size=10,
                             epochs=1, l2_norm_clip=1.0, report_delta=1e-6)


def test_rdp_event_needing_an_empty_batch_is_refused():
    with pytest.raises(g.GuaranteeMismatchError, match="empty batch"):
        g.dpsgd_run_for_part(PlanPart("train", event=dpsgd_event(0.001, 1.0, 5)),
                             num_examples=100, batch_size=10, epochs=1, l2_norm_clip=1.0,
                             report_delta=1e-6)


def test_basic_part_without_delta_cannot_run_dpsgd():
    with pytest.raises(ValueError, match="needs delta > 0"):
        g.dpsgd_run_for_part(PlanPart("train", 1.0), num_examples=100, batch_size=10, epochs=1,
                             l2_norm_clip=1.0)


# ---------------------------------------------------------------------------------------------
# Slow: TFX / TensorFlow.


@pytest.mark.slow
def test_dpsgd_basic_run_exports_serving_model_and_records_guarantee(mods, tmp_path, flights):
    from tfx.utils import path_utils
    uri, rows = flights
    plan = PrivacyPlan.of(PlanPart("train", 2.0, 1e-5), PlanPart("validate", 0.5))
    grant = grant_artifact(mods, tmp_path, plan)
    model = train(mods, tmp_path, grant=grant, examples=examples_artifact(uri, grant.grant_id),
                  config={**DPSGD_CONFIG, "membership_audit": "eval"})

    props = custom(model)
    n = labeled(rows["train"])
    with open(os.path.join(model.uri, g.MEMBERSHIP_FILE_NAME)) as f:
        membership = json.load(f)  # the opt-in audit: train vs eval split, flagged as not DP
    assert membership["num_train"] == n and membership["num_heldout"] == labeled(rows["eval"])
    assert 0.0 <= membership["auc"] <= 1.0 and not membership["differentially_private"]
    assert n < N_TRAIN  # records without a label are not trained on
    assert props["dp_num_examples"] == n and props["dp_batch_size"] == 30
    assert props["dp_epochs"] == 2.0 and props["dp_steps"] == math.ceil(2 * n / 30)
    assert props["dp_algorithm"] == "dpsgd" and props["dp_mode"] == "basic"
    assert props["dp_accounting"] == "pld" and props["dp_delta"] == 1e-5  # PLD by default
    assert props["dp_sampling"] == ("poisson (each example independently "
                                    "with probability q per step)")
    assert props["dp_l2_norm_clip"] == 1.0 and props["grant_id"] == grant.grant_id
    # ε recomputed with dp_accounting from the recorded σ, q and steps: the recorded ε, ≤ part.
    eps = pld_eps(30 / n, props["dp_noise_multiplier"], props["dp_steps"], 1e-5)
    assert props["dp_epsilon"] == pytest.approx(eps, rel=1e-9)
    # Calibrated to the part, not wasted: the plan's train part ε, within σ's calibration tolerance.
    assert props["dp_epsilon"] <= 2.0 and props["dp_epsilon"] == pytest.approx(2.0, abs=1e-3)
    assert json.loads(props["dp_event_json"]) == accounting.event_to_dict(
        dpsgd_event(30 / n, props["dp_noise_multiplier"], props["dp_steps"]))

    with open(os.path.join(model.uri, g.GUARANTEE_FILE_NAME)) as f:
        record = json.load(f)
    assert record["epsilon"] == props["dp_epsilon"]
    # What ran, counted in the training step: exactly the accounted steps, q and σ.
    assert record["ran"]["steps"] == props["dp_steps"] and record["reported"] is None
    assert record["ran"]["sampling_probability"] == 30 / n == props["dp_sampling_probability"]
    assert record["ran"]["noise_multiplier"] == props["dp_noise_multiplier"]
    assert record["train_part"]["epsilon"] == 2.0

    serving_dir = path_utils.serving_model_path(model.uri)
    assert serving_dir.endswith("Format-Serving")
    records = [example(f) for f in rows["eval"]]
    raw = [example({"distance": 500, "hour": 9})]  # no dep_delay, no label: defaults apply
    preds = serve(model.uri, records + raw)
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
    assert np.isnan(data.labels).sum() == N_TRAIN - labeled(rows["train"])
    spec = {"distance": tf.io.VarLenFeature(tf.int64), "hour": tf.io.VarLenFeature(tf.int64),
            "dep_delay": tf.io.VarLenFeature(tf.float32)}
    parsed = tf.io.parse_example(tf.constant([example(f) for f in rows["train"]]), spec)
    np.testing.assert_allclose(dp.featurize_tf(parsed, columns).numpy(), data.features,
                               rtol=1e-6, atol=1e-7)
    missing = data.features[[i for i, f in enumerate(rows["train"]) if "dep_delay" not in f]]
    assert [c.name for c in columns] == ["dep_delay", "distance", "hour"]  # sorted names
    assert np.allclose(missing[:, 0], (3.0 + 60) / 360)
    assert dp.count_records(Args.train_files) == N_TRAIN


@pytest.mark.slow
def test_dpsgd_rdp_part_trains_with_exactly_the_charged_event(mods, tmp_path, flights):
    uri, rows = flights
    event = dpsgd_event(0.1, 1.3, 12)
    plan = PrivacyPlan.of(PlanPart("train", event=event, params=(("delta", 1e-6),)),
                          PlanPart("validate", event=dp_accounting.LaplaceDpEvent(10.0)))
    grant = grant_artifact(mods, tmp_path, plan, mode="rdp")
    model = train(mods, tmp_path, grant=grant, examples=examples_artifact(uri),
                  config=dict(DPSGD_CONFIG, task="classification", hidden_units=[]))
    props = custom(model)
    n = labeled(rows["train"])
    assert props["dp_mode"] == "rdp" and props["dp_noise_multiplier"] == 1.3
    assert props["dp_steps"] == 12 and props["dp_batch_size"] == round(0.1 * n)
    assert props["dp_event_json"] == accounting.event_to_json(event)
    assert props["dp_delta"] == 1e-6 and props["dp_accounting"] == "rdp"
    assert props["dp_epsilon"] == pytest.approx(rdp_eps(0.1, 1.3, 12, 1e-6), rel=1e-12)
    with open(os.path.join(model.uri, g.GUARANTEE_FILE_NAME)) as f:
        ran = json.load(f)["ran"]
    # Exactly the steps, q and σ of the charged event ran; ε recomputed with dp_accounting from
    # what ran is the plan's train part charge.
    assert (ran["steps"], ran["sampling_probability"], ran["noise_multiplier"]) == (12, 0.1, 1.3)
    assert rdp_eps(ran["sampling_probability"], ran["noise_multiplier"], ran["steps"],
                   1e-6) == pytest.approx(rdp_eps(0.1, 1.3, 12, 1e-6), rel=1e-12)
    preds = serve(model.uri, [example(f) for f in rows["eval"]])
    assert np.all((preds >= 0) & (preds <= 1))  # P(delay > 15 min)


@pytest.mark.slow
def test_rdp_part_without_delta_param_reports_at_the_stream_delta(mods, tmp_path, flights):
    uri, _ = flights
    event = dpsgd_event(0.2, 2.0, 3)
    grant = grant_artifact(mods, tmp_path, PrivacyPlan.of(PlanPart("train", event=event)),
                           mode="rdp")
    props = custom(train(mods, tmp_path, grant=grant, examples=examples_artifact(uri),
                         config=DPSGD_CONFIG))
    assert props["dp_delta"] == 1e-5  # the stream's δ_g
    assert props["dp_epsilon"] == pytest.approx(rdp_eps(0.2, 2.0, 3, 1e-5), rel=1e-12)


@pytest.mark.slow
def test_rdp_part_of_another_shape_is_refused(mods, tmp_path, flights):
    uri, _ = flights
    plan = PrivacyPlan.of(PlanPart("train", event=dp_accounting.GaussianDpEvent(3.0)))
    grant = grant_artifact(mods, tmp_path, plan, mode="rdp")
    with pytest.raises(g.GuaranteeMismatchError, match="not a DP-SGD event"):
        train(mods, tmp_path, grant=grant, examples=examples_artifact(uri), config=DPSGD_CONFIG)


@pytest.mark.slow
def test_adassp_run(mods, tmp_path, flights):
    from sage_tfx.dp import adassp
    uri, rows = flights
    grant = grant_artifact(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 1.0, 1e-6)))
    model = train(mods, tmp_path, grant=grant, examples=examples_artifact(uri),
                  config={"algorithm": "adassp", "seed": 3})
    props = custom(model)
    assert props["dp_algorithm"] == "adassp" and props["dp_accounting"] == "pld"
    assert props["dp_num_examples"] == labeled(rows["train"])
    assert props["dp_sampling"] == g.FULL_BATCH_SAMPLING
    assert "dp_batch_size" not in props and "dp_l2_norm_clip" not in props
    acct = dp_accounting.pld.PLDAccountant()
    acct.compose(adassp.adassp_event(props["dp_noise_multiplier"]))
    assert props["dp_epsilon"] == pytest.approx(acct.get_epsilon(1e-6), rel=1e-9)
    assert props["dp_epsilon"] <= 1.0
    preds = serve(model.uri, [example(f) for f in rows["eval"]])
    assert preds.shape == (N_EVAL, 1) and np.all(np.isfinite(preds))


@pytest.mark.slow
def test_numpy_algorithms_refuse_rdp_parts(mods, tmp_path, flights):
    uri, _ = flights
    plan = PrivacyPlan.of(PlanPart("train", event=dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(5.0), 3)))
    grant = grant_artifact(mods, tmp_path, plan, mode="rdp")
    with pytest.raises(ValueError, match="only spend a basic"):
        train(mods, tmp_path, grant=grant, examples=examples_artifact(uri),
              config={"algorithm": "adassp"})


@pytest.mark.slow
@pytest.mark.parametrize("case", ["no_grant", "denied", "no_train_part", "no_plan",
                                  "other_grant_examples"])
def test_missing_grant_refuses_before_training(mods, tmp_path, flights, case):
    uri, _ = flights
    plan = PrivacyPlan.of(PlanPart("validate", 0.5))
    grant = None
    examples = examples_artifact(uri)
    if case == "denied":
        grant = grant_artifact(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 20.0, 1e-6)))
    elif case == "no_train_part":
        grant = grant_artifact(mods, tmp_path, plan)
    elif case == "no_plan":
        grant = grant_artifact(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 1.0, 1e-6)),
                               write_plan=False)
    elif case == "other_grant_examples":
        grant = grant_artifact(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 1.0, 1e-6)))
        examples = examples_artifact(uri, grant_id="some-other-grant")
    match = {"no_grant": "exactly one SageGrant", "denied": "denied",
             "no_train_part": "no 'train' part", "no_plan": "no privacy plan",
             "other_grant_examples": "some-other-grant"}[case]
    with pytest.raises(MissingGrantError, match=match):
        train(mods, tmp_path, grant=grant, examples=examples, config=DPSGD_CONFIG)
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
        out = layer(tf.io.parse_example(tf.constant([example(f) for f in feats]), raw_spec))
        path = str(examples / f"Split-{split}" / "transformed_examples-00000-of-00001.gz")
        with tf.io.TFRecordWriter(path, options="GZIP") as w:
            for i in range(len(feats)):
                w.write(example({k: float(v[i]) for k, v in out.items()}))
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
    grant = grant_artifact(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 2.0, 1e-5)))
    model = train(mods, tmp_path, grant=grant, examples=examples_artifact(examples_uri),
                  transform_graph=graph, config=dict(DPSGD_CONFIG, features=features))
    assert custom(model)["dp_num_examples"] == labeled(rows["train"])

    raw = [example(f) for f in rows["eval"]]
    served = serve(model.uri, raw)
    # The same rows through the training path: transformed records -> featurize -> model.
    loaded = tf.saved_model.load(os.path.join(model.uri, "Format-Serving"))

    class Args:
        train_files = [os.path.join(examples_uri, "Split-eval", "*")]

    data = dp.read_split(Args, "train", dp.columns_from_config(features))
    direct = loaded(tf.constant(data.features)).numpy() * 300.0  # label_scale of the defaults
    np.testing.assert_allclose(served, direct, rtol=1e-5, atol=1e-4)
    # A request with only some raw features (no label, no dep_delay) is served too.
    assert np.isfinite(serve(model.uri, [example({"distance": 700})])).all()


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
    grant = grant_artifact(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 1.0, 1e-6)))
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
    assert props["dp_num_examples"] == labeled(rows["train"])
    assert np.isfinite(serve(model.uri, [example(f) for f in rows["eval"]])).all()
