"""DnDTrainer: the charge it accepts, its clients, the protocol, and its executor on tiny data."""
import json
import os
import random

import numpy as np
import pytest

from sage_tfx.components.dnd_trainer import protocol as P
from sage_tfx.dnd.budget import RunBudget, UpdateRefused
from sage_tfx.errors import InvalidRequestError, MissingGrantError
from sage_tfx.ledger import Grant, GrantedBlock, accounting

SETTINGS = P.RunSettings("logistic", 2, k=5, gamma=0.5, l1_norm_clip=1.0, epsilon=8.0, passes=2,
                         n_c=3)
FEATURES = [P.FeatureSpec("x0", 0.0, 10.0, "float"), P.FeatureSpec("x1", 0.0, 10.0, "int")]


def _grant(epsilon=None, event=None, blocks=("b1",)):
    return Grant("g1", "r1", "s", "default", "rdp" if event is not None else "basic", epsilon,
                 None if event is not None else 0.0, event,
                 tuple(GrantedBlock(b, None) for b in blocks), "released", "")


def _data(n_units=60, per_unit=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 10, size=(n_units * per_unit, 2)).round()
    y = (x[:, 0] > x[:, 1]).astype(float)
    units = [f"u{i // per_unit}" for i in range(len(x))]
    return x, y, units


def test_the_charge_must_equal_what_the_run_spends():
    need = 2 * 8.0   # passes x epsilon per update (model unit)
    assert P.dnd_train_part(SETTINGS).epsilon == need
    assert P.check_train_cost(need, 0.0, None, SETTINGS, "g") == {"epsilon": need, "delta": 0.0}
    for eps, dlt in ((need + 1, 0.0), (need - 1, 0.0), (need, 1e-6), (8.0, 0.0), (None, None)):
        with pytest.raises(MissingGrantError):
            P.check_train_cost(eps, dlt, None, SETTINGS, "g")
    event = P.dnd_train_part(SETTINGS, rdp=True).event
    assert P.check_train_cost(None, None, event, SETTINGS,
                              "g")["event"] == accounting.event_to_dict(event)
    one_pass = P.dnd_train_part(P.RunSettings(**{**SETTINGS.__dict__, "passes": 1}), rdp=True).event
    with pytest.raises(MissingGrantError):
        P.check_train_cost(None, None, one_pass, SETTINGS, "g")
    # the feature unit is charged d x epsilon per update (d = 3 weights)
    feat = P.RunSettings(**{**SETTINGS.__dict__, "unit": "feature"})
    assert P.dnd_train_part(feat).epsilon == pytest.approx(2 * 3 * 8.0)


def test_settings_and_features_refuse_bad_input():
    for bad in (dict(family="multinomial"), dict(k=0), dict(passes=0), dict(n_c=0),
                dict(epsilon=0.0), dict(epsilon=None), dict(gamma=-1.0), dict(unit="row")):
        with pytest.raises(ValueError):
            P.RunSettings(**{**SETTINGS.__dict__, **bad})
    for bad in ('[]', '[{"key": "a", "lower": 1, "upper": 1}]', '[{"key": "a"}]',
                '[{"key": "a", "lower": 0, "upper": 1, "dtype": "str"}]',
                '[{"key": "a", "lower": 0, "upper": 1}, {"key": "a", "lower": 0, "upper": 1}]'):
        with pytest.raises(InvalidRequestError):
            P.features_from_json(bad)
    assert P.features_from_json(P.features_to_json(FEATURES)) == FEATURES


def test_clients_never_mix_units_and_hold_at_most_n_c():
    units = ["a"] * 7 + ["b"] * 2 + ["c"] * 3
    random.Random(1).shuffle(units)
    clients = P.make_clients(units, 3, random.Random(0))
    assert sorted(clients) == ["a", "b", "c"]
    assert [len(clients[u]) for u in "abc"] == [3, 1, 1]
    for u, groups in clients.items():
        rows = np.concatenate(groups)
        assert sorted(rows.tolist()) == [i for i, v in enumerate(units) if v == u]
        assert all(1 <= len(g) <= 3 for g in groups)


def test_every_unit_sends_exactly_passes_updates_and_the_budget_refuses_more():
    x, y, units = _data()
    x01 = P.bounds_of(FEATURES).normalize(x)
    budget = RunBudget(_grant(16.0), SETTINGS.client, 3, 2)
    result = P.run_protocol(SETTINGS, x01, y, units, budget, rng=random.Random(3))
    assert result.updates == 2 * 60 and result.units == 60 and budget.used == 120
    assert result.accepted + result.rejected_spam == result.updates
    # a budget paid for one pass stops the second pass
    with pytest.raises(UpdateRefused):
        P.run_protocol(SETTINGS, x01, y, units, RunBudget(_grant(16.0), SETTINGS.client, 3, 1),
                       rng=random.Random(3))


def test_the_average_learns_a_separable_rule():
    x, y, units = _data(n_units=300, per_unit=4, seed=1)
    s = P.RunSettings("logistic", 2, k=5, gamma=1.0, l1_norm_clip=1.0, epsilon=20.0,
                      passes=3, n_c=4)
    budget = RunBudget(_grant(60.0), s.client, 3, 3)
    result = P.run_protocol(s, P.bounds_of(FEATURES).normalize(x), y, units, budget)
    xt, yt, _ = _data(n_units=100, seed=2)
    acc = s.spec.accuracy(result.weights, P.bounds_of(FEATURES).normalize(xt), yt)
    assert acc > 0.8, acc
    assert result.weights[1] > 0 > result.weights[2]


GAUSS = P.RunSettings("logistic", 2, k=5, gamma=0.5, l1_norm_clip=1.0, epsilon=8.0, passes=2,
                      n_c=3, unit="gaussian", delta=1e-7, l2_norm_clip=1.0)


def _spy_gaussian(monkeypatch):
    """Records (m, Δ₂, the δ left to the sampler) of every Gaussian vector the clients draw."""
    from sage_tfx.dnd import noise as vector_noise
    calls, real = [], vector_noise.gaussian_vector

    def spy(values, m, l2, *, max_extra_delta):
        calls.append((m, l2, max_extra_delta))
        return real(values, m, l2, max_extra_delta=max_extra_delta)
    monkeypatch.setattr(vector_noise, "gaussian_vector", spy)
    return calls


def test_gaussian_unit_charge_is_the_event_of_what_runs(monkeypatch):
    from dp_accounting import dp_event as E
    from dp_accounting.pld import pld_privacy_accountant
    from sage_tfx.dnd import noise as vector_noise
    calls = _spy_gaussian(monkeypatch)
    x, y, units = _data(n_units=20)
    part = P.dnd_train_part(GAUSS)
    assert (part.epsilon, part.delta) == (16.0, 2e-7)
    event = P.dnd_train_part(GAUSS, rdp=True).event
    budget = RunBudget(_grant(event=event), GAUSS.client, 3, 2)
    P.run_protocol(GAUSS, P.bounds_of(FEATURES).normalize(x), y, units, budget,
                   rng=random.Random(5))
    assert len(calls) == 2 * 20 and len(set(calls)) == 1
    m, l2, extra = calls[0]
    assert l2 == 2 * GAUSS.gamma * GAUSS.l2_norm_clip and extra <= 1e-7 * 1e-3
    # rdp streams: the charge is exactly passes x GaussianDpEvent(m) of the m that ran
    assert accounting.event_to_json(event) == accounting.event_to_json(
        E.SelfComposedDpEvent(E.GaussianDpEvent(m), 2))
    # basic streams: (ε, δ) per update covers one GaussianDpEvent(m) by PLD plus the sampler
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(E.GaussianDpEvent(m))
    assert acc.get_epsilon(1e-7 * (1 - 1e-3)) + vector_noise.SAMPLER_EPSILON <= 8.0
    assert vector_noise.sampler_delta(m, l2, 3) <= extra
    assert P.check_train_cost(16.0, 2e-7, None, GAUSS, "g") == {"epsilon": 16.0, "delta": 2e-7}
    laplace = P.dnd_train_part(P.RunSettings(**{**SETTINGS.__dict__}), rdp=True).event
    for eps, dlt, ev in ((16.0, 0.0, None), (16.0, 1e-7, None), (16.0, 3e-7, None),
                         (8.0, 2e-7, None), (None, None, laplace),
                         (None, None, E.GaussianDpEvent(m))):
        with pytest.raises(MissingGrantError):
            P.check_train_cost(eps, dlt, ev, GAUSS, "g")


def test_gaussian_settings_refuse_a_missing_or_misplaced_delta_or_clip():
    for bad in (dict(delta=None), dict(l2_norm_clip=None), dict(delta=0.0), dict(delta=1.5),
                dict(l2_norm_clip=-1.0)):
        with pytest.raises(ValueError):
            P.RunSettings(**{**GAUSS.__dict__, **bad})
    for bad in (dict(delta=1e-7), dict(l2_norm_clip=1.0)):   # not on the Laplace units
        with pytest.raises(ValueError):
            P.RunSettings(**{**SETTINGS.__dict__, **bad})


# ------------------------------------------------------------------------------------------
# The component and its executor (TFX / TensorFlow).


def _examples(tmp_path, x, y, units, grant_id):
    import tensorflow as tf
    from tfx.types import standard_artifacts
    from blockdata import make_example, write_block_file
    art = standard_artifacts.Examples()
    art.uri = str(tmp_path / "examples")
    art.split_names = '["train"]'
    rows = [make_example({"x0": float(a), "x1": int(b), "label": int(c), "user": u})
            for (a, b), c, u in zip(x, y, units)]
    write_block_file(os.path.join(art.uri, "Split-train"), rows, "data.gz")
    if grant_id:
        art.set_string_custom_property("grant_id", grant_id)
    del tf
    return art


def _props(settings=SETTINGS, **kw):
    extra = {k: getattr(settings, k) for k in ("delta", "l2_norm_clip")
             if getattr(settings, k) is not None}
    return {"family": settings.family, "k": settings.k, "gamma": settings.gamma,
            "l1_norm_clip": settings.l1_norm_clip, "epsilon": settings.epsilon,
            "unit": settings.unit, "passes": settings.passes, "n_c": settings.n_c,
            "client_key": "user", "features": P.features_to_json(FEATURES), "label_key": "label",
            "split": "train", "spam_check": 1, **extra, **kw}


def _inputs(tmp_path, epsilon=None, event=None, delta=0.0):
    from tfx.types import standard_artifacts
    from sage_tfx.components import artifacts
    from sage_tfx.ledger import BlockSpec, Window, open_ledger
    url = f"sqlite:///{tmp_path}/ledger.db"
    cost = dict(epsilon=epsilon, delta=delta) if event is None else dict(event=event)
    with open_ledger(url) as ledger:
        ledger.create_stream("s", epsilon_g=20.0, delta_g=1e-6, granularity="day",
                             mode="basic" if event is None else "rdp")
        ledger.add_blocks("s", [BlockSpec("b1", str(tmp_path / "b1"))])
        d = ledger.request("s", run_id="dnd-1", window=Window(last=1), **cost)
    grant = artifacts.SageGrant()
    grant.uri = str(tmp_path / "grant")
    artifacts.write_grant(grant, d.grant, stream="s", run_id="dnd-1", context="default",
                          ledger_url=url, reason="" if d.granted else d.reason)
    x, y, units = _data()
    examples = _examples(tmp_path, x, y, units, d.grant.grant_id if d.granted else "")
    model = standard_artifacts.Model()
    model.uri = str(tmp_path / "model")
    return {"examples": [examples], "grant": [grant]}, {"model": [model]}


@pytest.mark.slow
def test_component_spec_and_bad_input():
    from tfx import types
    from tfx.types import standard_artifacts
    from sage_tfx.components.artifacts import SageGrant
    from sage_tfx.components.dnd_trainer.component import DnDTrainer
    ch = dict(examples=types.Channel(type=standard_artifacts.Examples),
              grant=types.Channel(type=SageGrant))
    ok = dict(settings=SETTINGS, features=FEATURES, client_key="user", label_key="label")
    t = DnDTrainer(**ch, **ok)
    assert t.exec_properties["passes"] == 2 and t.exec_properties["n_c"] == 3
    assert json.loads(t.exec_properties["features"])[1] == {"key": "x1",
                                                            "lower": 0.0, "upper": 10.0,
                                                            "dtype": "int"}
    assert set(t.outputs) == {"model"} and set(t.inputs) == {"examples", "grant"}
    for bad in (dict(features=FEATURES[:1]), dict(client_key=""), dict(label_key=""),
                dict(settings="x")):
        with pytest.raises(InvalidRequestError):
            DnDTrainer(**ch, **{**ok, **bad})


@pytest.mark.slow
def test_executor_trains_and_exports_a_serving_model(tmp_path):
    import tensorflow as tf
    from blockdata import make_example
    from sage_tfx.components.dnd_trainer.executor import Executor
    from sage_tfx.components.dp_validator.executor import ServingModel
    inputs, outputs = _inputs(tmp_path, epsilon=16.0)
    Executor().Do(inputs, outputs, _props())
    uri = outputs["model"][0].uri
    report = json.load(open(os.path.join(uri, "privacy_report.json")))
    assert report["charged"] == {"epsilon": 16.0, "delta": 0.0}
    assert report["epsilon_per_update"] == 8.0 and report["passes"] == 2 and report[
        "unit"] == "model"
    assert report["updates"] == 120 and report["updates_accepted"] + report[
        "updates_rejected"] == 120
    assert report["noise_scale"] == pytest.approx(2 * 0.5 * 1.0 / 8.0)
    assert not {"instances", "slots", "draws", "weights"} & set(report)
    served = ServingModel(os.path.join(uri, "Format-Serving"), signature_name="serving_default",
                          prediction_key=None)
    rows = [{"x0": 9.0, "x1": 1}, {"x0": 1.0, "x1": 9}, {"x0": 40.0, "x1": -3}, {"x1": 2}]
    p = served.predict(tf.constant([make_example(r).SerializeToString() for r in rows]))
    w = np.asarray(
        json.load(open(os.path.join(uri, "Format-Serving", "dnd_model.json")))["weights"])
    # same as the numpy GLM on the public-bound map (clipped; missing x0 -> its midpoint 5)
    raw = np.array([[9.0, 1], [1.0, 9], [40.0, -3], [5.0, 2]])
    expect = SETTINGS.spec.predict(w, P.bounds_of(FEATURES).normalize(raw))
    np.testing.assert_allclose(p, expect, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("passes", [2, 1])
def test_executor_on_an_rdp_stream_needs_exactly_the_composed_event(tmp_path, passes):
    from sage_tfx.components.dnd_trainer.executor import Executor
    charged = P.RunSettings(**{**SETTINGS.__dict__, "passes": passes})
    inputs, outputs = _inputs(tmp_path, event=P.dnd_train_part(charged, rdp=True).event)
    if passes != SETTINGS.passes:     # the grant paid for one pass, the run would make two
        with pytest.raises(MissingGrantError):
            Executor().Do(inputs, outputs, _props())
        assert not os.path.exists(tmp_path / "model")
        return
    Executor().Do(inputs, outputs, _props())
    report = json.load(open(os.path.join(outputs["model"][0].uri, "privacy_report.json")))
    assert report["charged"]["event"]["count"] == 2
    assert report["updates"] == 120


@pytest.mark.slow
def test_executor_refuses_a_feature_stored_with_another_type(tmp_path):
    from sage_tfx.components.dnd_trainer.executor import Executor
    inputs, outputs = _inputs(tmp_path, epsilon=16.0)
    feats = [P.FeatureSpec("x0", 0.0, 10.0, "int"), FEATURES[1]]   # x0 is stored as float
    with pytest.raises(InvalidRequestError, match="x0"):
        Executor().Do(inputs, outputs, _props(features=P.features_to_json(feats)))
    assert not os.path.exists(tmp_path / "model")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["denied", "more_than_the_run", "less_than_the_run"])
def test_executor_refuses_a_charge_that_is_not_the_run(tmp_path, case):
    from sage_tfx.components.dnd_trainer.executor import Executor
    eps = {"denied": 50.0, "more_than_the_run": 17.0, "less_than_the_run": 8.0}[case]
    inputs, outputs = _inputs(tmp_path, epsilon=eps)
    with pytest.raises(MissingGrantError):
        Executor().Do(inputs, outputs, _props())
    assert not os.path.exists(tmp_path / "model")


@pytest.mark.slow
def test_a_re_executed_trainer_returns_the_recorded_model_byte_for_byte(tmp_path, monkeypatch):
    """A retried pod or re-run receives the replayed grant: it must publish the model the grant
    already released (recorded in the ledger), never run the protocol (new noise) again."""
    from sage_tfx.components.dnd_trainer import spec
    from sage_tfx.components.dnd_trainer.executor import Executor
    from sage_tfx.ledger import open_ledger
    from sage_tfx.ledger.releases import tree_digest
    inputs, outputs = _inputs(tmp_path, epsilon=16.0)
    Executor().Do(inputs, outputs, _props())
    first = outputs["model"][0]
    assert first.get_int_custom_property(spec.REPLAYED_PROPERTY) == 0

    def no_second_run(*a, **k):
        raise AssertionError("the protocol ran again under a used grant")
    monkeypatch.setattr(P, "run_protocol", no_second_run)
    from tfx.types import standard_artifacts
    for where in ("retry", "elsewhere/model"):   # the same output dir, and another one
        again = standard_artifacts.Model()
        again.uri = str(tmp_path / where)
        Executor().Do(inputs, {"model": [again]}, _props())
        assert tree_digest(again.uri) == tree_digest(first.uri)
        assert again.get_int_custom_property(spec.REPLAYED_PROPERTY) == 1
        assert again.get_string_custom_property(spec.RELEASE_DIGEST_PROPERTY) == \
            first.get_string_custom_property(spec.RELEASE_DIGEST_PROPERTY)
        assert again.get_int_custom_property(spec.UPDATES_PROPERTY) == \
            first.get_int_custom_property(spec.UPDATES_PROPERTY)
    grant_id = first.get_string_custom_property(spec.GRANT_ID_PROPERTY)
    with open_ledger(f"sqlite:///{tmp_path}/ledger.db") as led:
        assert sorted(r.name for r in led.releases(grant_id)) == ["grant/model", "part/grant"]
        assert [b.charges for b in led.blocks("s")] == [1]
        assert led.check_consistency("s") == []


@pytest.mark.slow
def test_executor_gaussian_unit_charges_what_ran_and_a_replay_returns_the_same_model(
        tmp_path, monkeypatch):
    """The gaussian unit on an rdp stream: the ledger's charge is the composed GaussianDpEvent of
    the noise that ran; a re-execution releases the recorded model byte for byte."""
    from dp_accounting import dp_event as E
    from tfx.types import standard_artifacts
    from sage_tfx.components.dnd_trainer import spec
    from sage_tfx.components.dnd_trainer.executor import Executor
    from sage_tfx.ledger import open_ledger
    from sage_tfx.ledger.releases import tree_digest
    calls = _spy_gaussian(monkeypatch)
    inputs, outputs = _inputs(tmp_path, event=P.dnd_train_part(GAUSS, rdp=True).event)
    Executor().Do(inputs, outputs, _props(GAUSS))
    first = outputs["model"][0]
    [m] = {c[0] for c in calls}
    assert len(calls) == 2 * 60
    grant_id = first.get_string_custom_property(spec.GRANT_ID_PROPERTY)
    with open_ledger(f"sqlite:///{tmp_path}/ledger.db") as led:
        charged = led.grant(grant_id).event
        assert [b.charges for b in led.blocks("s")] == [1]
    assert accounting.event_to_json(charged) == accounting.event_to_json(
        E.SelfComposedDpEvent(E.GaussianDpEvent(m), 2))
    report = json.load(open(os.path.join(first.uri, "privacy_report.json")))
    assert report["unit"] == "gaussian" and report["delta_per_update"] == 1e-7
    assert report["l2_norm_clip"] == 1.0 and report["update_event"]["noise_multiplier"] == m
    assert report["noise_scale"] == pytest.approx(m * 2 * 0.5 * 1.0)
    calls.clear()
    again = standard_artifacts.Model()
    again.uri = str(tmp_path / "again")
    Executor().Do(inputs, {"model": [again]}, _props(GAUSS))
    assert calls == [] and again.get_int_custom_property(spec.REPLAYED_PROPERTY) == 1
    assert tree_digest(again.uri) == tree_digest(first.uri)
    # a basic-stream charge of another δ is refused before anything runs
    other = tmp_path / "other"
    other.mkdir()
    inputs, outputs = _inputs(other, epsilon=16.0, delta=1e-7)
    with pytest.raises(MissingGrantError, match="delta"):
        Executor().Do(inputs, outputs, _props(GAUSS))
    assert not os.path.exists(other / "model")


@pytest.mark.slow
def test_one_train_part_pays_for_one_trainer_whatever_its_kind(tmp_path):
    """A grant whose plan has one train part: the DnDTrainer that spent it published; a
    DPTrainer under the same part is refused before it reads a record, and so is a DnDTrainer
    under a part a DPTrainer claimed. One charge, one spender per plan part."""
    from tfx.proto import trainer_pb2
    from tfx.types import standard_artifacts
    from tfx.utils import json_utils, proto_utils
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    from sage_tfx.components import plan_io
    from sage_tfx.components.dnd_trainer.executor import Executor
    from sage_tfx.components.dp_trainer import executor as dp_executor
    from sage_tfx.components.dp_trainer import spec as dp_spec
    from sage_tfx.errors import ReleaseConflictError
    from sage_tfx.ledger import open_ledger, releases

    def planned(where):
        where.mkdir()
        inputs, outputs = _inputs(where, epsilon=16.0)
        plan_io.write_plan(inputs["grant"][0], PrivacyPlan.of(PlanPart("train", 16.0, 0.0)))
        return inputs, outputs

    inputs, outputs = planned(tmp_path / "a")
    Executor().Do(inputs, outputs, _props())
    module = tmp_path / "module.py"
    module.write_text("def model_fn(fn_args):\n    raise AssertionError('never called')\n")
    model = standard_artifacts.Model()
    model.uri = str(tmp_path / "dp_model")
    run = standard_artifacts.ModelRun()
    run.uri = str(tmp_path / "dp_run")
    splits = ["train"]
    props = {dp_spec.TRAIN_ARGS_KEY: proto_utils.proto_to_json(trainer_pb2.TrainArgs(
                 splits=splits)),
             dp_spec.EVAL_ARGS_KEY: proto_utils.proto_to_json(trainer_pb2.EvalArgs(
                 splits=splits)),
             dp_spec.CUSTOM_CONFIG_KEY: json_utils.dumps({}),
             dp_spec.MODULE_FILE_KEY: str(module)}
    with pytest.raises(ReleaseConflictError, match="'train' .* spent by DnDTrainer"):
        dp_executor.Executor().Do(inputs, {"model": [model], "model_run": [run]}, props)
    assert not os.path.exists(model.uri)
    grant = inputs["grant"][0]
    with open_ledger(grant.ledger_url) as led:
        assert sorted(r.name for r in led.releases(grant.grant_id)) == ["part/train",
                                                                          "train/model"]
    # the other way round: the part claimed by a DPTrainer, a DnDTrainer is refused
    inputs, outputs = planned(tmp_path / "b")
    grant = inputs["grant"][0]
    with open_ledger(grant.ledger_url) as led:
        releases.claim_part(led, grant.grant_id, "train", "DPTrainer")
    with pytest.raises(ReleaseConflictError, match="spent by DPTrainer"):
        Executor().Do(inputs, outputs, _props())
    assert not os.path.exists(outputs["model"][0].uri)
