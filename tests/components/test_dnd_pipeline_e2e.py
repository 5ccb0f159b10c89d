"""Draw-and-Discard end to end: SageGate(plan) -> BlockExampleGen -> DnDTrainer -> DPModelValidator
-> Pusher."""
import json
import os

import pytest

pytestmark = pytest.mark.slow


def test_pipeline_charges_the_plan_once_blesses_and_pushes(tmp_path):
    import tensorflow as tf
    from tfx import v1 as tfx
    from blockdata import make_example
    from sage_tfx.components.dp_validator.executor import ServingModel
    from sage_tfx.ledger import open_ledger
    from sage_tfx.pipelines import dnd_pipeline as dp

    specs = dp.write_email_blocks(str(tmp_path / "blocks"), "email", n_blocks=3, rows=900)
    url = f"sqlite:///{tmp_path}/ledger.db"
    with open_ledger(url) as ledger:
        ledger.create_stream("email", epsilon_g=10.0, delta_g=1e-6, granularity="day")
        ledger.add_blocks("email", specs)
    settings = dp.email_settings(k=10, gamma=0.1, epsilon=4.0, passes=1)
    plan = dp.make_plan(settings, validate_epsilon=1.0)
    serving_dir = tmp_path / "serving"
    tfx.orchestration.LocalDagRunner().run(dp.create_pipeline(
        "dnd-email-e2e", str(tmp_path / "root"), str(tmp_path / "mlmd.db"), ledger_url=url,
        stream="email", window_last=3, settings=settings, validate_epsilon=1.0, target=0.6,
        serving_model_dir=str(serving_dir)))
    with open_ledger(url) as ledger:
        blocks = ledger.blocks("email")
        assert ledger.check_consistency("email") == []
    assert plan.cost() == {"epsilon": 5.0, "delta": 0.0}
    assert [(b.epsilon_spent, b.charges) for b in blocks] == [(pytest.approx(5.0), 1)] * 3

    from ml_metadata.metadata_store import metadata_store
    from tfx.orchestration import metadata as md
    store = metadata_store.MetadataStore(
        md.sqlite_metadata_connection_config(str(tmp_path / "mlmd.db")))
    [blessing] = store.get_artifacts_by_type("ModelBlessing")
    assert blessing.custom_properties["blessed"].int_value == 1
    [model] = store.get_artifacts_by_type("Model")
    report = json.load(open(os.path.join(model.uri, "privacy_report.json")))
    assert report["charged"] == {"epsilon": 4.0,
                                 "delta": 0.0} and report["epsilon_per_update"] == 4.0
    with open_ledger(url) as ledger:   # the trained model was recorded against the grant first
        names = [r.name for r in ledger.releases(report["grant_id"])]
    assert {"part/train", "train/model"} <= set(names)
    assert model.custom_properties["release_replayed"].int_value == 0
    [pushed] = [os.path.join(serving_dir, d) for d in os.listdir(serving_dir)]
    served = ServingModel(pushed, signature_name="serving_default", prediction_key=None)
    p = served.predict(
        tf.constant([make_example({"num_char": 3.0, "format": 1}).SerializeToString()]))
    assert p.shape == (1,) and 0.0 <= p[0] <= 1.0
