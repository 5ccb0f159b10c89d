"""DPBaggingTrainer end to end: gate -> private blocks + declared-public CSV -> student SavedModel."""
import csv
import json
import os

import numpy as np
import pytest

from blockdata import make_example, write_block_file

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
                     (dict(mode="other"), InvalidRequestError)):
        with pytest.raises(err):
            DPBaggingTrainer(**ch, **{**ok, **bad})


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
        spent = {b.block_id: (b.epsilon_spent, b.delta_spent, b.charges) for b in ledger.blocks(STREAM)}
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
    served = ServingModel(os.path.join(model.uri, "Format-Serving"), signature_name="serving_default",
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
        d = ledger.request(EVENTS, run_id="bag-1", window=Window(last=2), epsilon=0.5 if granted else 5.0,
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
    return ({"examples": [private], "public_examples": [public], "grant": [grant]}, {"model": [model]})


@pytest.mark.parametrize("case", ["denied", "gated_public", "not_declared"])
def test_executor_refuses_before_reading_any_data(tmp_path, block_ledger, case):
    from sage_tfx.components.dp_bagging_trainer.executor import Executor
    from sage_tfx.errors import InvalidRequestError, MissingGrantError
    inputs, outputs = _executor_inputs(tmp_path, block_ledger, granted=case != "denied",
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
