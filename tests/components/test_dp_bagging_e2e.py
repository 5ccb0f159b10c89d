"""DPBaggingTrainer end to end: gate -> private blocks + declared-public CSV -> student SavedModel.
"""
import csv
import json
import os
import re

import numpy as np
import pytest

from blockdata import make_example, write_block_file
from racing import race

pytestmark = pytest.mark.slow

STREAM = "patients"
BLOCKS = ("b1", "b2", "b3")
K, N = 3, 4


def _write_data(tmp_path):
    from sage_tfx.ledger import BlockSpec
    from sage_tfx.streams.blocks import block_location
    rng = np.random.default_rng(0)
    specs = []
    for b, block in enumerate(BLOCKS):
        loc = block_location(str(tmp_path / "blocks"), STREAM, block)
        rows = []
        for u in range(20):                       # 20 users per block, 2 rows each
            for _ in range(2):
                x0, x1 = rng.normal(size=2)
                rows.append(make_example({"x0": float(x0), "x1": float(x1), "user": 100 * b + u,
                                          "label": int(x0 + 0.3 * x1 > 0)}))
        write_block_file(loc, rows)
        specs.append(BlockSpec(block, loc, records=len(rows)))
    pub = tmp_path / "public"
    pub.mkdir()
    with open(pub / "public.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["x0", "x1"])
        for x0, x1 in rng.normal(size=(200, 2)):
            w.writerow([f"{x0:.5f}", f"{x1:.5f}"])
    return specs, str(pub)


def test_component_refuses_bad_input():
    from tfx import types
    from tfx.types import standard_artifacts
    from sage_tfx.components.artifacts import SageGrant
    from sage_tfx.components.dp_bagging_trainer.component import DPBaggingTrainer
    from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError
    ch = dict(examples=types.Channel(type=standard_artifacts.Examples),
              public_examples=types.Channel(type=standard_artifacts.Examples),
              grant=types.Channel(type=SageGrant))
    ok = dict(k=2, n=3, lam=0.5, label_key="label", unit_key="user", feature_keys=["x0"],
              public_declared=True)
    DPBaggingTrainer(**ch, **ok)
    for bad, err in ((dict(k=0), InvalidRequestError), (dict(n=0), InvalidRequestError),
                     (dict(lam=0.0), InvalidPrivacyParameterError),
                     (dict(public_declared=False), InvalidRequestError),
                     (dict(feature_keys=[]), InvalidRequestError),
                     (dict(mode="other"), InvalidRequestError),
                     (dict(votes="cauchy"), InvalidRequestError),
                     (dict(accountant="moments"), InvalidPrivacyParameterError)):
        with pytest.raises(err):
            DPBaggingTrainer(**ch, **{**ok, **bad})
    DPBaggingTrainer(**ch, **ok, votes="gumbel")
    from sage_tfx.components.dp_bagging_trainer import spec
    from sage_tfx.components.dp_bagging_trainer.executor import config_from_exec_properties
    props = {spec.K_KEY: 2, spec.N_KEY: 3, spec.LAMBDA_KEY: 0.5, spec.MODE_KEY: "fixed_queries",
             spec.ACCOUNTANT_KEY: "best", spec.TEACHER_KEY: "logistic"}
    assert config_from_exec_properties(props).votes == "laplace"
    assert config_from_exec_properties({**props, spec.VOTES_KEY: "gaussian"}).votes == "gaussian"


def test_pipeline_charges_every_block_and_exports_a_serving_student(tmp_path):
    from tfx import v1 as tfx
    from sage_tfx.bagging import BaggingConfig, plan_labels
    from sage_tfx.components.dp_validator.executor import ServingModel
    from sage_tfx.ledger import open_ledger
    from sage_tfx.pipelines.dp_bagging_pipeline import create_pipeline

    specs, public_dir = _write_data(tmp_path)
    url = f"sqlite:///{tmp_path}/ledger.db"
    with open_ledger(url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=10.0, delta_g=1e-4, granularity="day")
        ledger.add_blocks(STREAM, specs)
    metadata = str(tmp_path / "mlmd.db")
    lam, eps, delta = 0.5, 4.0, 1e-5
    tfx.orchestration.LocalDagRunner().run(create_pipeline(
        "bagging-e2e", str(tmp_path / "root"), metadata, ledger_url=url, stream=STREAM,
        window_last=3, public_csv_dir=public_dir, public_size=200, epsilon=eps, delta=delta,
        k=K, n=N, lam=lam, label_key="label", unit_key="user", feature_keys=["x0", "x1"],
        cache_dir=str(tmp_path / "cache")))
    plan = plan_labels(BaggingConfig(k=K, n=N, lam=lam), epsilon=eps, delta=delta, public_size=200)
    with open_ledger(url) as ledger:
        spent = {
            b.block_id: (b.epsilon_spent, b.delta_spent, b.charges) for b in ledger.blocks(STREAM)}
        assert ledger.check_consistency(STREAM) == []
    assert spent == {b: (pytest.approx(plan.epsilon), delta, 1) for b in BLOCKS}   # every block
    from ml_metadata.metadata_store import metadata_store
    from tfx.orchestration import metadata as md
    store = metadata_store.MetadataStore(md.sqlite_metadata_connection_config(metadata))
    [model] = store.get_artifacts_by_type("Model")
    report = json.load(open(os.path.join(model.uri, "privacy_report.json")))
    assert report["queries"] == plan.queries and report["formally_dp"] is True
    assert report["epsilon"] == pytest.approx(plan.epsilon) and report["mode"] == "fixed_queries"
    assert sorted(report["per_block_charge"]) == list(BLOCKS)
    assert not {"counts", "votes", "noisy_counts", "teachers", "epsilon_hat_per_unit"} & set(report)
    assert model.custom_properties["bagging_queries"].int_value == plan.queries
    # the student serves like a Trainer model: DPModelValidator's loader accepts it
    import tensorflow as tf
    served = ServingModel(os.path.join(model.uri, "Format-Serving"),
                          signature_name="serving_default",
                          prediction_key=None)
    batch = tf.constant([make_example({"x0": 2.0, "x1": 0.0}).SerializeToString(),
                         make_example({"x0": -2.0, "x1": 0.0}).SerializeToString()])
    p = served.predict(batch)
    assert p.shape == (2,) and np.all((0 <= p) & (p <= 1))
    # the window's teachers are cached for the next purchase; the cursor moved past the labels
    assert len(os.listdir(tmp_path / "cache")) == 1


def _executor_inputs(tmp_path, block_ledger, granted=True, public_grant_id=None):
    from tfx.types import standard_artifacts
    from sage_tfx.components import artifacts
    from sage_tfx.ledger import Window, open_ledger
    from blockdata import STREAM as EVENTS
    url, _ = block_ledger
    with open_ledger(url) as ledger:
        d = ledger.request(EVENTS, run_id="bag-1", window=Window(last=2),
                           epsilon=0.5 if granted else 5.0,
                           delta=1e-6)
    grant = artifacts.SageGrant()
    grant.uri = str(tmp_path / "grant")
    artifacts.write_grant(grant, d.grant, stream=EVENTS, run_id="bag-1", context="default",
                          ledger_url=url, reason="" if d.granted else d.reason)
    private = standard_artifacts.Examples()
    private.uri = str(tmp_path / "private")
    if d.granted:
        private.set_string_custom_property("grant_id", d.grant.grant_id)
    public = standard_artifacts.Examples()
    public.uri = str(tmp_path / "public")
    if public_grant_id:
        public.set_string_custom_property("grant_id", public_grant_id)
    model = standard_artifacts.Model()
    model.uri = str(tmp_path / "model")
    return ({"examples": [private], "public_examples": [public], "grant": [grant]},
            {"model": [model]})


@pytest.mark.parametrize("case", ["denied", "gated_public", "not_declared"])
def test_executor_refuses_before_reading_any_data(tmp_path, block_ledger, case):
    from sage_tfx.components.dp_bagging_trainer.executor import Executor
    from sage_tfx.errors import InvalidRequestError, MissingGrantError
    inputs, outputs = _executor_inputs(
        tmp_path, block_ledger, granted=case != "denied",
        public_grant_id="other-grant" if case == "gated_public" else None)
    props = {"k": 2, "n": 3, "lam": 0.5, "mode": "fixed_queries", "accountant": "rdp",
             "teacher": "logistic", "label_key": "label", "unit_key": "user",
             "feature_keys": '["x"]', "public_declared": 0 if case == "not_declared" else 1,
             "split": "train", "public_split": "train"}
    err = MissingGrantError if case == "denied" else InvalidRequestError
    with pytest.raises(err):
        Executor().Do(inputs, outputs, props)
    assert not os.path.exists(tmp_path / "model")


def test_pipeline_gate_needs_n_records_before_charging(tmp_path):
    """The gate denies (and refunds) a window whose ledger block sizes hold fewer than n records:
    no partition could fill n chunks, and the trainer would only find out after the charge."""
    from sage_tfx.pipelines.dp_bagging_pipeline import create_pipeline
    pipeline = create_pipeline(
        "bagging-gate", str(tmp_path / "root"), str(tmp_path / "mlmd.db"),
        ledger_url=f"sqlite:///{tmp_path}/l.db", stream=STREAM, window_last=3,
        public_csv_dir=str(tmp_path), public_size=200, epsilon=4.0, delta=1e-5, k=K, n=N,
        lam=0.5, label_key="label", unit_key="user", feature_keys=["x0", "x1"])
    [gate] = [c for c in pipeline.components if c.id == "SageGate"]
    assert gate.exec_properties["min_records"] == N


# ---------------------------------------------------------------------------------------------
# Release once, paper mode's opt-in, and DPModelValidator's decision (executors run directly).

LAM, TRAIN_EPS, DELTA = 0.5, 4.0, 1e-5
PROPS = {"k": K, "n": N, "lam": LAM, "mode": "fixed_queries", "accountant": "rdp",
         "teacher": "logistic", "label_key": "label", "unit_key": "user",
         "feature_keys": '["x0", "x1"]', "public_declared": 1, "split": "train",
         "public_split": "train"}
PAPER_PROPS = {**PROPS, "mode": "paper", "accept_not_differentially_private": 1, "max_labels": 150}


def _write_split(root, split, records):
    import tensorflow as tf
    os.makedirs(root / f"Split-{split}", exist_ok=True)
    with tf.io.TFRecordWriter(str(root / f"Split-{split}" / "data_tfrecord-00000-of-00001.gz"),
                              options="GZIP") as w:
        for r in records:
            w.write(r)


@pytest.fixture
def world(tmp_path):
    """A ledger with the three blocks, the window's records as private Examples (train and eval
    splits, as BlockExampleGen writes them) and the public CSV as declared-public Examples.
    Plain strings only, so a child process can rebuild the executor's inputs."""
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    from sage_tfx.components.block_example_gen.executor import read_gzip_tfrecords
    from sage_tfx.ledger import open_ledger
    specs, public_dir = _write_data(tmp_path)
    url = f"sqlite:///{tmp_path}/ledger.db"
    with open_ledger(url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=50.0, delta_g=1e-3, granularity="day")
        ledger.add_blocks(STREAM, specs)
    records = [r for s in specs for path in sorted(os.listdir(s.location))
               for r in read_gzip_tfrecords(os.path.join(s.location, path))]
    _write_split(tmp_path / "private", "train", records)
    _write_split(tmp_path / "private", "eval", records)
    with open(os.path.join(public_dir, "public.csv")) as f:
        rows = list(csv.DictReader(f))
    _write_split(tmp_path / "public", "train", [make_example(
        {"x0": float(r["x0"]), "x1": float(r["x1"])}).SerializeToString() for r in rows])
    plan = PrivacyPlan.of(PlanPart("train", TRAIN_EPS, DELTA), PlanPart("validate", 1.0))
    return {"url": url, "root": str(tmp_path), "plan": plan.to_json(),
            "private": str(tmp_path / "private"), "public": str(tmp_path / "public")}


def _charge(world, run_id):
    from sage_tfx.adaptive.plan import PrivacyPlan
    from sage_tfx.ledger import Window, open_ledger
    with open_ledger(world["url"]) as ledger:
        d = ledger.request(STREAM, run_id=run_id, window=Window(last=3),
                           **PrivacyPlan.from_json(world["plan"]).cost())
    assert d.granted
    return d.grant.grant_id


def _inputs(world, run_id, name):
    """The trainer's inputs under the grant of ``run_id``, as a gate (re)playing it writes them."""
    from tfx.types import artifact_utils, standard_artifacts
    from sage_tfx.adaptive.plan import PrivacyPlan
    from sage_tfx.components import artifacts, plan_io
    from sage_tfx.ledger import open_ledger
    with open_ledger(world["url"]) as ledger:
        g = ledger.grant_for_run(STREAM, run_id)
    grant = artifacts.SageGrant()
    grant.uri = os.path.join(world["root"], f"grant-{name}")
    artifacts.write_grant(grant, g, stream=STREAM, run_id=run_id, context="default",
                          ledger_url=world["url"])
    plan_io.write_plan(grant, PrivacyPlan.from_json(world["plan"]))
    private, public = standard_artifacts.Examples(), standard_artifacts.Examples()
    private.uri, public.uri = world["private"], world["public"]
    private.split_names = artifact_utils.encode_split_names(["train", "eval"])
    public.split_names = artifact_utils.encode_split_names(["train"])
    private.set_string_custom_property("grant_id", g.grant_id)
    return {"examples": [private], "public_examples": [public], "grant": [grant]}


def _train(world, run_id, name, props=PROPS):
    """Runs DPBaggingTrainer's executor; returns its Model artifact."""
    from tfx.types import standard_artifacts
    from sage_tfx.components.dp_bagging_trainer.executor import Executor
    model = standard_artifacts.Model()
    model.uri = os.path.join(world["root"], f"model-{name}")
    Executor().Do(_inputs(world, run_id, name), {"model": [model]}, dict(props))
    return model


def _published(model):
    """What a trainer published: its directory tree (digest), report bytes and properties."""
    from sage_tfx.ledger.releases import tree_digest
    with open(os.path.join(model.uri, "privacy_report.json"), "rb") as f:
        report = f.read()
    props = {k: str(v) for k, v in model.mlmd_artifact.custom_properties.items()}
    return {"tree": tree_digest(model.uri), "report": report, "props": props}


def _train_in_child(world, run_id, name, barrier, out):
    try:
        from sage_tfx.components.dp_bagging_trainer.executor import Executor  # noqa: F401
        barrier.wait(timeout=600)
        out.put(_published(_train(world, run_id, name)))
    except Exception as e:  # surfaces in the parent's assertion
        out.put({"error": repr(e)})


def _children(world, run_id, names):
    return race(_train_in_child, [(world, run_id, n) for n in names], timeout=900)


def _one_charge_one_release(world, grant_ids):
    from sage_tfx.ledger import open_ledger
    with open_ledger(world["url"]) as ledger:
        for b in ledger.blocks(STREAM):
            assert b.charges == len(grant_ids)
        for g in grant_ids:
            # the plan's train part, claimed by the trainer, and its two releases
            assert sorted(r.name for r in ledger.releases(g)) == [
                "part/train", "train/labels", "train/model"]
        assert ledger.check_consistency(STREAM) == []


def test_executor_replays_its_release_in_process_elsewhere_and_in_a_new_process(world):
    g = _charge(world, "bag-1")
    first = _published(_train(world, "bag-1", "a"))
    again = _published(_train(world, "bag-1", "a"))          # a retried execution, same output
    elsewhere = _published(_train(world, "bag-1", "b"))      # another output directory
    [child] = _children(world, "bag-1", ["c"])               # a new process (a retried pod)
    assert again == first and elsewhere == first and child == first
    from sage_tfx.errors import ReleaseConflictError
    with pytest.raises(ReleaseConflictError, match="already bought labels"):   # other settings
        _train(world, "bag-1", "d", {**PROPS, "salt": "another"})
    assert not os.path.exists(os.path.join(world["root"], "model-d"))
    report = json.loads(first["report"])
    assert report["formally_dp"] is True and report["not_differentially_private"] is False
    assert report["public_start"] == 0 and report["grant_id"] == g
    assert first["props"]["not_differentially_private"].strip() == "int_value: 0"
    _one_charge_one_release(world, [g])


def test_two_concurrent_executors_under_one_grant_publish_one_release(world):
    g = _charge(world, "bag-2")
    a, b = _children(world, "bag-2", ["x", "y"])
    assert a == b
    assert _published(_train(world, "bag-2", "z")) == a      # and a later replay in this process
    _one_charge_one_release(world, [g])


def test_paper_mode_opt_in_is_on_the_model_and_the_validator_refuses_it(world, caplog):
    import logging
    from tfx.types import standard_artifacts
    from sage_tfx.components.dp_validator import executor as validator
    from sage_tfx.components.dp_validator import spec as vspec
    caplog.set_level(logging.INFO)
    g = _charge(world, "paper-1")
    paper = _train(world, "paper-1", "paper", PAPER_PROPS)
    assert paper.get_int_custom_property("not_differentially_private") == 1
    assert "bagging_queries" not in paper.mlmd_artifact.custom_properties   # data-dependent
    with open(os.path.join(paper.uri, "privacy_report.json")) as f:
        report = json.load(f)
    # every figure of the report is fixed by public inputs: nothing data-dependent, no epsilon-hat
    stopping = report.pop("stopping_rule")
    assert "not differentially private" in stopping
    assert report == {"accountant": None, "bound": None, "per_query_rho": None,
                      "vote_mechanism": "laplace", "delta": DELTA, "epsilon": TRAIN_EPS,
                      "event": None,
                      "formally_dp": False, "grant_id": g, "k": K, "lambda": LAM, "mode": "paper",
                      "n": N, "noise_scale": K / LAM, "not_differentially_private": True,
                      "per_block_charge": {b: {"delta": DELTA, "epsilon": TRAIN_EPS + 1.0}
                                           for b in BLOCKS},
                      "per_query_epsilon": 2 * LAM, "public_reserved": 150, "public_start": 0,
                      "queries": None, "stream": STREAM, "teacher": "logistic"}
    lines = [r.getMessage() for r in caplog.records if "DPBaggingTrainer" in r.getMessage()]
    assert lines and all("NOT differentially private" in line for line in lines)
    assert all(set(re.findall(r"\d+(?:\.\d+)?(?:e-?\d+)?", line.replace(g, ""))) <= {"4", "1e-05"}
               for line in lines)

    def validate(model, run_id, name):
        blessing = standard_artifacts.ModelBlessing()
        blessing.uri = os.path.join(world["root"], name)
        inputs = _inputs(world, run_id, name)
        validator.Executor().Do(
            {"examples": inputs["examples"], "model": [model], "grant": inputs["grant"]},
            {"blessing": [blessing]},
            {vspec.METRIC_KEY: "accuracy", vspec.TARGET_KEY: 0.5, vspec.ETA_KEY: 0.05,
             vspec.LABEL_KEY: "label", vspec.EVAL_SPLIT_KEY: "eval",
             vspec.SIGNATURE_NAME_KEY: "serving_default", vspec.BATCH_SIZE_KEY: 64})
        return blessing

    refused = validate(paper, "paper-1", "blessing-paper")
    assert os.listdir(refused.uri) == ["NOT_BLESSED"]
    assert refused.get_int_custom_property("blessed") == 0
    assert refused.get_int_custom_property("not_differentially_private") == 1
    assert "not differentially private" in refused.get_string_custom_property("reason")
    # a DP model of the same window (the 50 public points left) is validated as usual
    _charge(world, "fixed-1")
    dp = _train(world, "fixed-1", "fixed")
    assert dp.get_int_custom_property("not_differentially_private") == 0
    decided = validate(dp, "fixed-1", "blessing-fixed")
    assert decided.get_string_custom_property("outcome") in ("ACCEPT", "REJECT", "RETRY")
    assert "not_differentially_private" not in decided.mlmd_artifact.custom_properties


def test_paper_mode_without_the_opt_in_is_refused_before_any_charge(tmp_path):
    from tfx import types
    from tfx.types import standard_artifacts
    from sage_tfx.components.artifacts import SageGrant
    from sage_tfx.components.dp_bagging_trainer.component import DPBaggingTrainer
    from sage_tfx.components.dp_bagging_trainer.executor import config_from_exec_properties
    from sage_tfx.errors import InvalidRequestError
    from sage_tfx.pipelines.dp_bagging_pipeline import create_pipeline
    ch = dict(examples=types.Channel(type=standard_artifacts.Examples),
              public_examples=types.Channel(type=standard_artifacts.Examples),
              grant=types.Channel(type=SageGrant))
    ok = dict(k=2, n=3, lam=0.5, label_key="label", unit_key="user", feature_keys=["x0"],
              public_declared=True, mode="paper")
    with pytest.raises(InvalidRequestError, match="NOT differentially private"):
        DPBaggingTrainer(**ch, **ok)
    trainer = DPBaggingTrainer(**ch, **ok, accept_not_differentially_private=True, max_labels=50)
    assert trainer.exec_properties["accept_not_differentially_private"] == 1
    for bad_max in (0, True, 2.5):
        with pytest.raises(InvalidRequestError, match="max_labels"):
            DPBaggingTrainer(**ch, **ok, accept_not_differentially_private=True, max_labels=bad_max)
    with pytest.raises(InvalidRequestError, match="paper mode only"):
        DPBaggingTrainer(**ch, **{**ok, "mode": "fixed_queries"}, max_labels=50)
    for bad in ({**PAPER_PROPS, "accept_not_differentially_private": 0},
                {**PAPER_PROPS, "accept_not_differentially_private": 2},
                {**PROPS, "accept_not_differentially_private": 1}):
        with pytest.raises(InvalidRequestError):
            config_from_exec_properties(bad)
    kw = dict(ledger_url=f"sqlite:///{tmp_path}/l.db", stream=STREAM, window_last=3,
              public_csv_dir=str(tmp_path), public_size=200, epsilon=4.0, delta=1e-5, k=K, n=N,
              lam=0.5, label_key="label", unit_key="user", feature_keys=["x0", "x1"], mode="paper")
    with pytest.raises(InvalidRequestError, match="NOT differentially private"):
        create_pipeline("p", str(tmp_path / "root"), str(tmp_path / "m.db"), **kw)
    assert not os.path.exists(tmp_path / "l.db")           # nothing was opened or charged
    pipeline = create_pipeline("p", str(tmp_path / "root"), str(tmp_path / "m.db"), **kw,
                               accept_not_differentially_private=True)
    [gate] = [c for c in pipeline.components if c.id == "SageGate"]
    assert gate.exec_properties["epsilon"] == 4.0          # the whole grant is charged
