"""DPTrainer: the verification of what ran (fast), and the executor on real tf.Transform output.

The executor runs (slow) use a real SQLite ledger grant with a privacy plan, a transform graph
released under that grant, transformed Examples in ExampleGen's layout, and module files written
here (``trainerdata.py``). ε is recomputed with dp_accounting directly, independently of
``sage_tfx.dp.dpsgd``. The refusals of modules written to defeat the checks are in
``test_dp_trainer_cheats.py``; the architecture allow-lists in ``test_dp_trainer_architecture.py``.
"""
import dataclasses
import json
import math
import os

import dp_accounting
import numpy as np
import pytest
from scipy.stats import binom

from sage_tfx.ledger import accounting
from sage_tfx.components.dp_trainer import guarantee as g
from sage_tfx.errors import MissingGrantError, ReleaseConflictError
from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
from trainerdata import (LABEL_SCALE, N_EVAL, N_TRAIN, WIDE_AND_DEEP, custom,  # noqa: F401
                         dpsgd_event, example, examples_artifact, flights, grant_artifact,
                         labeled, mods, pld_eps, published, rdp_eps, serve, train, write_module)

# ---------------------------------------------------------------------------------------------
# Fast: what ran and its verification (no TensorFlow).


def _ran(sigma=1.5, q=0.05, steps=40, n=1000, **kw):
    """The record of a DP-SGD run: σ, Poisson q and the steps that ran, on n rows."""
    fields = dict(algorithm="dpsgd", noise_multiplier=sigma, num_examples=n, accountant="rdp",
                  l2_norm_clip=1.0, sampling_probability=q, steps=steps,
                  batch_size=round(q * n), epochs=(steps or 0) * q, max_batch_size=n + 8,
                  oversize="spill", truncated_steps=0)
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
    eps = eps_of(40 / 800, run.noise_multiplier, 60, run.dpsgd_delta)
    assert run.dpsgd_delta + run.truncation_delta <= 1e-5
    assert eps <= 1.0 and eps == pytest.approx(1.0, abs=1e-3)
    assert run.epsilon == pytest.approx(eps, rel=1e-9)
    assert run.oversize == "truncate" and run.truncation_delta <= 0.01 * 1e-5
    verified = g.verify_record(
        _ran(run.noise_multiplier, 40 / 800, 60, 800, accountant=run.accountant,
             max_batch_size=run.max_batch_size, oversize=run.oversize), part,
        grant_id="g", num_train_records=800)
    assert verified.accountant == run.accountant and verified.epsilon == run.epsilon
    assert verified.truncation_delta == run.truncation_delta
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


def test_truncation_is_accounted_inside_the_parts_delta():
    """Basic part, truncated batches: the executor's planned B has a truncation δ that an
    independent computation ((1 + e^ε)·T·P[Bin(n+1, q) > B]) confirms, at most 1 % of δ, and
    the event's ε is computed at the δ left; a B too small for the part is refused."""
    part = PlanPart("train", 1.0, 1e-6)
    run = g.dpsgd_run_for_part(part, num_examples=5000, batch_size=100, epochs=2,
                               l2_norm_clip=1.0)
    q, steps, b = 100 / 5000, run.steps, run.max_batch_size
    independent = (1 + math.e) * steps * binom.sf(b, 5001, q)
    assert run.truncation_delta == pytest.approx(independent, rel=1e-9)
    assert run.truncation_delta <= 0.01 * 1e-6 < (1 + math.e) * steps * binom.sf(b - 8, 5001, q)
    assert b % 8 == 0 and b > 100
    assert run.dpsgd_delta + run.truncation_delta <= 1e-6
    assert run.epsilon == pytest.approx(pld_eps(q, run.noise_multiplier, steps, run.dpsgd_delta),
                                        rel=1e-9)
    ran = _ran(run.noise_multiplier, q, steps, 5000, accountant="pld", max_batch_size=b,
               oversize="truncate", truncated_steps=0)
    verified = g.verify_record(ran, part, grant_id="g")
    assert verified.delta <= 1e-6 and verified.epsilon <= 1.0
    assert verified.model_properties()["dp_truncation_delta"] == run.truncation_delta
    # The same σ with batches truncated at a smaller B: more δ to truncation, less to the event,
    # so the event's ε at the δ left exceeds the part.
    with pytest.raises(g.GuaranteeMismatchError, match="allows epsilon=1.0"):
        g.verify_record(dataclasses.replace(ran, max_batch_size=b - 8), part, grant_id="g")
    with pytest.raises(ValueError, match="raise max_batch_size"):
        g.dpsgd_run_for_part(part, num_examples=5000, batch_size=100, epochs=2,
                             l2_norm_clip=1.0, max_batch_size=104)
    spill = g.dpsgd_run_for_part(part, num_examples=5000, batch_size=100, epochs=2,
                                 l2_norm_clip=1.0, oversize="spill")
    assert spill.truncation_delta == 0.0 and spill.dpsgd_delta == 1e-6
    assert spill.noise_multiplier < run.noise_multiplier   # all of δ for the event


def test_rdp_parts_never_truncate():
    part = PlanPart("train", event=dpsgd_event(0.05, 1.2, 30))
    with pytest.raises(g.GuaranteeMismatchError, match="spill"):
        g.dpsgd_run_for_part(part, num_examples=333, batch_size=10, epochs=1,
                             l2_norm_clip=1.0, report_delta=1e-6, oversize="truncate")
    with pytest.raises(g.GuaranteeMismatchError, match="must not be truncated"):
        g.verify_record(_ran(1.2, 0.05, 30, 333, oversize="truncate"), part, grant_id="g",
                        report_delta=1e-6)


# ---------------------------------------------------------------------------------------------
# Slow: the executor on real tf.Transform output.

pytest_slow = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(mods, tmp_path_factory, flights):
    """A functional wide-and-deep model (dict inputs, an Embedding of a DP vocabulary id)
    trained once under a basic train part: (Model artifact, grant, transform graph, tmp)."""
    graph, examples, _ = flights
    tmp = tmp_path_factory.mktemp("trained")
    plan = PrivacyPlan.of(PlanPart("transform", 0.5), PlanPart("train", 2.0, 1e-5))
    grant, released = grant_artifact(mods, tmp, plan, transform_graph=graph)
    module = write_module(tmp, WIDE_AND_DEEP)
    model = train(mods, tmp, grant=grant, examples=examples_artifact(examples, grant.grant_id),
                  module_file=module, transform_graph=released)
    return model, grant, released, tmp, module


@pytest_slow
def test_a_functional_model_with_an_embedding_trains_and_serves_raw_examples(trained, flights):
    """The served model is the trained architecture behind the transform graph: raw
    tf.Examples (without the label) in, the model's output on the transformed features × the
    declared output scale out."""
    import tensorflow as tf
    import tensorflow_transform as tft
    from trainerdata import raw_spec
    model, _, released, _, _ = trained
    _, _, rows = flights
    raw = [example({k: v for k, v in f.items() if k != "arr_delay"}) for f in rows["eval"]]
    served = serve(model.uri, raw)
    assert served.shape == (N_EVAL, 1) and np.all(np.isfinite(served))
    keras = tf.keras.models.load_model(os.path.join(model.uri, "Format-Serving"))
    spec = raw_spec()
    spec.pop("arr_delay")
    transformed = tft.TFTransformOutput(released.uri).transform_features_layer()(
        tf.io.parse_example(tf.constant(raw), spec))
    direct = keras({k: transformed[k] for k in ("distance_scaled", "dep_delay_h",
                                                "carrier_id")}).numpy() * LABEL_SCALE
    np.testing.assert_allclose(served, direct, rtol=1e-5, atol=1e-3)
    # The embedding (a fast-clipping layer) was trained: its rows moved from their init range.
    [emb] = [w for w in keras.trainable_weights if "embeddings" in w.name]
    assert np.max(np.abs(emb.numpy())) > 0.05
    # The export holds the SavedModel, the transform's vocabulary asset, nothing else.
    files = published(model.uri)
    assert {"dp_guarantee.json", "dp_model_properties.json", "sage_release.json",
            "Format-Serving/saved_model.pb"} <= set(files)
    assets = [f for f in files if "/assets/" in f]
    assert assets and all(os.path.basename(a) in os.listdir(
        os.path.join(released.uri, "transform_fn", "assets")) for a in assets)


@pytest_slow
def test_the_guarantee_is_what_ran(trained, flights):
    """ε recomputed with dp_accounting from the recorded σ, q and steps (at the δ left by the
    truncation bound) is the recorded ε, at most the part's; the steps are the accounted ones."""
    model, grant, _, _, _ = trained
    _, _, rows = flights
    props = custom(model)
    n = labeled(rows["train"])
    assert n < N_TRAIN and props["dp_num_examples"] == n
    assert props["dp_batch_size"] == 40 and props["dp_steps"] == math.ceil(2 * n / 40)
    assert props["dp_algorithm"] == "dpsgd" and props["dp_mode"] == "basic"
    assert props["dp_accounting"] == "pld" and props["dp_oversize"] == "truncate"
    assert props["grant_id"] == grant.grant_id and props["dp_verification"] == "observed"
    q = 40 / n
    assert props["dp_sampling_probability"] == q
    b = props["dp_max_batch_size"]
    trunc = (1 + math.exp(2.0)) * props["dp_steps"] * binom.sf(b, n + 1, q)
    assert props["dp_truncation_delta"] == pytest.approx(trunc, rel=1e-9)
    eps = pld_eps(q, props["dp_noise_multiplier"], props["dp_steps"], 1e-5 - trunc)
    assert props["dp_epsilon"] == pytest.approx(eps, rel=1e-6)
    assert props["dp_epsilon"] <= 2.0 and props["dp_epsilon"] == pytest.approx(2.0, abs=1e-3)
    assert props["dp_delta"] <= 1e-5
    with open(os.path.join(model.uri, g.GUARANTEE_FILE_NAME)) as f:
        record = json.load(f)
    assert record["ran"]["steps"] == props["dp_steps"]
    assert record["ran"]["noise_multiplier"] == props["dp_noise_multiplier"]
    assert record["training"]["architecture_sha256"] and record["output_scale"] == LABEL_SCALE
    assert json.loads(props["dp_event_json"]) == accounting.event_to_dict(
        dpsgd_event(q, props["dp_noise_multiplier"], props["dp_steps"]))


@pytest_slow
def test_a_retried_trainer_publishes_the_recorded_model(mods, trained, flights):
    """Release once: a re-execution under the same grant gets the first model byte for byte
    without training; another request under the grant is refused and publishes nothing."""
    from sage_tfx.ledger import open_ledger, releases
    model, grant, released, tmp, module = trained
    _, examples, _ = flights
    again = train(mods, tmp, grant=grant, examples=examples_artifact(examples),
                  module_file=module, transform_graph=released, name="model-retry")
    assert custom(again)["replayed"] == 1 and custom(model)["replayed"] == 0
    assert releases.tree_digest(again.uri) == releases.tree_digest(model.uri)
    for key in ("dp_epsilon", "dp_steps", "grant_id", "dp_verification", "release_digest"):
        assert custom(again)[key] == custom(model)[key]
    with pytest.raises(ReleaseConflictError, match="train/model"):
        train(mods, tmp, grant=grant, examples=examples_artifact(examples), module_file=module,
              transform_graph=released, name="model-other", config={"lr": 0.5})
    assert published(tmp / "model-other") == []
    with open_ledger(grant.ledger_url) as ledger:
        names = sorted(r.name for r in ledger.releases(grant.grant_id))
        assert names == ["part/train", "train/model", "transform/transform_graph"]
        assert ledger.check_consistency("flights") == []


@pytest_slow
def test_a_graph_the_grant_did_not_release_is_refused(mods, trained, flights, tmp_path):
    """The served model embeds the transform graph: a graph of exact statistics (the stock
    Transform's) or one changed after its release is refused before anything is trained."""
    from tfx.types import standard_artifacts
    graph, examples, _ = flights
    module = trained[4]
    stock = standard_artifacts.TransformGraph()
    stock.uri = graph   # the same tree, but not released under any grant of this ledger
    plan = PrivacyPlan.of(PlanPart("transform", 0.5), PlanPart("train", 2.0, 1e-5))
    other, _ = grant_artifact(mods, tmp_path, plan)
    with pytest.raises(MissingGrantError, match="not released under grant"):
        train(mods, tmp_path, grant=other, examples=examples_artifact(examples),
              module_file=module, transform_graph=stock)
    # A released graph with a file added after its release (e.g. by a module's own process).
    grant2, released2 = grant_artifact(mods, tmp_path, plan, name="g2", transform_graph=graph)
    with open(os.path.join(released2.uri, "transform_fn", "assets", "extra.txt"), "w") as f:
        f.write("train rows\n")
    with pytest.raises(MissingGrantError, match="changed after release"):
        train(mods, tmp_path, grant=grant2, examples=examples_artifact(examples),
              module_file=module, transform_graph=released2)
    assert published(tmp_path / "model") == []


@pytest_slow
def test_dpsgd_rdp_part_trains_with_exactly_the_charged_event(mods, tmp_path, flights):
    """An rdp part's event is run exactly — its q, σ and T — with oversized steps spilled (no
    truncation), and ε is reported by RDP at the part's δ."""
    graph, examples, rows = flights
    event = dpsgd_event(0.1, 1.3, 12)
    plan = PrivacyPlan.of(PlanPart("transform", event=dp_accounting.LaplaceDpEvent(2.0)),
                          PlanPart("train", event=event, params=(("delta", 1e-6),)))
    grant, released = grant_artifact(mods, tmp_path, plan, mode="rdp", transform_graph=graph)
    model = train(mods, tmp_path, grant=grant, examples=examples_artifact(examples),
                  module_file=write_module(tmp_path, WIDE_AND_DEEP), transform_graph=released)
    props = custom(model)
    n = labeled(rows["train"])
    assert props["dp_mode"] == "rdp" and props["dp_noise_multiplier"] == 1.3
    assert props["dp_steps"] == 12 and props["dp_batch_size"] == round(0.1 * n)
    assert props["dp_oversize"] == "spill" and props["dp_truncation_delta"] == 0.0
    assert props["dp_event_json"] == accounting.event_to_json(event)
    assert props["dp_delta"] == 1e-6 and props["dp_accounting"] == "rdp"
    assert props["dp_epsilon"] == pytest.approx(rdp_eps(0.1, 1.3, 12, 1e-6), rel=1e-12)


@pytest_slow
def test_adassp_trains_on_bounded_features(mods, tmp_path, flights):
    """AdaSSP's three releases from moments summed in Beam; the served model is the released
    linear model on the same clipped and scaled features (checked against the weights by hand),
    and at a large ε it finds the data's rule (the delay grows with the departure delay)."""
    import tensorflow as tf
    import tensorflow_transform as tft
    from sage_tfx.dp import adassp
    from trainerdata import raw_spec
    graph, examples, rows = flights
    plan = PrivacyPlan.of(PlanPart("transform", 0.5), PlanPart("train", 8.0, 1e-6))
    grant, released = grant_artifact(mods, tmp_path, plan, transform_graph=graph)
    module = write_module(tmp_path, '''
        def model_fn(fn_args):
            return AdaSSPSpec(features={"distance_scaled": (0.0, 1.0), "dep_delay_h": (-1.0, 2.0)},
                              label_key="arr_delay_scaled", label_bounds=(-0.2, 1.0),
                              raw_label_keys=["arr_delay"])
        ''')
    model = train(mods, tmp_path, grant=grant, examples=examples_artifact(examples),
                  module_file=module, transform_graph=released)
    props = custom(model)
    assert props["dp_algorithm"] == "adassp" and props["dp_accounting"] == "pld"
    assert props["dp_num_examples"] == labeled(rows["train"])
    assert props["dp_sampling"] == g.FULL_BATCH_SAMPLING and "dp_batch_size" not in props
    acct = dp_accounting.pld.PLDAccountant()
    acct.compose(adassp.adassp_event(props["dp_noise_multiplier"]))
    assert props["dp_epsilon"] == pytest.approx(acct.get_epsilon(1e-6), rel=1e-9)
    assert props["dp_epsilon"] <= 8.0
    raw = [example({k: v for k, v in f.items() if k != "arr_delay"}) for f in rows["eval"]]
    preds = serve(model.uri, raw)[:, 0]
    keras = tf.keras.models.load_model(os.path.join(model.uri, "Format-Serving"))
    kernel, bias = [w.numpy() for w in keras.trainable_weights]
    spec = raw_spec()
    spec.pop("arr_delay")
    t = tft.TFTransformOutput(released.uri).transform_features_layer()(
        tf.io.parse_example(tf.constant(raw), spec))
    # the features in name order (dep_delay_h, distance_scaled), clipped and scaled to [0, 1]
    x = np.stack([(np.clip(t["dep_delay_h"].numpy(), -1, 2) + 1) / 3,
                  np.clip(t["distance_scaled"].numpy(), 0, 1)], axis=1)
    # label bounds (-0.2, 1.0): trained on y / 1.0; served × the declared output scale 300
    np.testing.assert_allclose(preds, (x @ kernel[:, 0] + bias[0]) * LABEL_SCALE, rtol=1e-4,
                               atol=1e-2)
    dep = np.array([f["dep_delay"] for f in rows["eval"]])
    assert np.corrcoef(dep, preds)[0, 1] > 0.5


@pytest_slow
@pytest.mark.parametrize("case", ["no_grant", "denied", "no_train_part", "no_plan",
                                  "other_grant_examples"])
def test_missing_grant_refuses_before_training(mods, tmp_path, flights, case):
    graph, examples_uri, _ = flights
    grant = None
    examples = examples_artifact(examples_uri)
    train_plan = PrivacyPlan.of(PlanPart("train", 1.0, 1e-6))
    if case == "denied":
        grant, _ = grant_artifact(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 20.0, 1e-6)))
    elif case == "no_train_part":
        grant, _ = grant_artifact(mods, tmp_path, PrivacyPlan.of(PlanPart("validate", 0.5)))
    elif case == "no_plan":
        grant, _ = grant_artifact(mods, tmp_path, train_plan, write_plan=False)
    elif case == "other_grant_examples":
        grant, _ = grant_artifact(mods, tmp_path, train_plan)
        examples = examples_artifact(examples_uri, grant_id="some-other-grant")
    match = {"no_grant": "exactly one SageGrant", "denied": "denied",
             "no_train_part": "no 'train' part", "no_plan": "no privacy plan",
             "other_grant_examples": "some-other-grant"}[case]
    with pytest.raises(MissingGrantError, match=match):
        train(mods, tmp_path, grant=grant, examples=examples,
              module_file=write_module(tmp_path, WIDE_AND_DEEP))
    assert published(tmp_path / "model") == []


@pytest_slow
def test_component_spec(mods, tmp_path):
    from tfx import types
    from tfx.proto import trainer_pb2
    from tfx.types import standard_artifacts
    from sage_tfx.components.artifacts import SageGrant
    from sage_tfx.components.dp_trainer.preflight import TrainerConfigError
    component, _, spec = mods[:3]
    examples = types.Channel(type=standard_artifacts.Examples)
    grant = types.Channel(type=SageGrant)
    module = write_module(tmp_path, WIDE_AND_DEEP)
    trainer = component.DPTrainer(examples=examples, grant=grant, module_file=module,
                                  custom_config={"epochs": 3}, output_scale=300.0)
    assert trainer.inputs[spec.GRANT_INPUT_KEY] is grant
    assert trainer.outputs[spec.MODEL_KEY].type is standard_artifacts.Model
    assert json.loads(trainer.exec_properties[spec.CUSTOM_CONFIG_KEY]) == {"epochs": 3}
    assert trainer.exec_properties[spec.OUTPUT_SCALE_KEY] == 300.0
    with pytest.raises(ValueError, match="Exactly one"):
        component.DPTrainer(examples=examples, grant=grant)
    with pytest.raises(ValueError, match="num_steps"):
        component.DPTrainer(examples=examples, grant=grant, module_file=module,
                            train_args=trainer_pb2.TrainArgs(num_steps=100))
    for bad in (float("nan"), 0.0, float("inf")):
        with pytest.raises(TrainerConfigError, match="output_scale"):
            component.DPTrainer(examples=examples, grant=grant, module_file=module,
                                output_scale=bad)
    with pytest.raises(TypeError):
        component.DPTrainer(examples=examples, module_file=module)  # grant is required
    # A stock Trainer module (run_fn, no model_fn) is refused when the pipeline is built.
    stock = write_module(tmp_path, "def run_fn(fn_args):\n    pass\n", name="stock.py")
    with pytest.raises(TrainerConfigError, match="defines no model_fn.*run_fn"):
        component.DPTrainer(examples=examples, grant=grant, module_file=stock)
    with pytest.raises(TrainerConfigError, match="not run_fn"):
        component.DPTrainer(examples=examples, grant=grant, run_fn="m.run_fn")
    component.DPTrainer(examples=examples, grant=grant,
                        model_fn="sage_tfx.pipelines.flights_dp_module.model_fn")
    with pytest.raises(TrainerConfigError, match="defines no nope"):
        component.DPTrainer(examples=examples, grant=grant,
                            model_fn="sage_tfx.pipelines.flights_dp_module.nope")
