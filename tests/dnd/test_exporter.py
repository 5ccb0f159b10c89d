"""DnDExporter: the average of a live Draw-and-Discard server (127.0.0.1) as a serving SavedModel.
"""
import json

import numpy as np
import pytest

from dndtest import bearer, make_ledger, serving

pytestmark = pytest.mark.slow


def _example(values):
    import tensorflow as tf
    ex = tf.train.Example()
    for k, v in values.items():
        if isinstance(v, int):
            ex.features.feature[k].int64_list.value.append(v)
        else:
            ex.features.feature[k].float_list.value.append(v)
    return ex


def test_exporter_pulls_the_released_model_of_a_live_server(tmp_path):
    import httpx
    import tensorflow as tf
    from sage_tfx import services
    from sage_tfx.components.dnd_exporter.exporter import export_from_server
    from sage_tfx.components.dnd_trainer.protocol import FeatureSpec
    from sage_tfx.components.dp_validator.executor import ServingModel
    from sage_tfx.dnd import ClientConfig, GLMSpec
    from sage_tfx.dnd.server import build_service, create_app
    from sage_tfx.errors import InvalidRequestError

    p = make_ledger(f"sqlite:///{tmp_path}/ledger.db", clients=["c1"], epsilon_g=100.0,
                    granularity="day", blocks=["b0"])
    spec = GLMSpec("logistic", 2)
    service = build_service(ledger_url=p.url, stream="clients", run_id="r1", spec=spec,
                            config=ClientConfig(gamma=0.1, l1_norm_clip=1.0, epsilon=2.0), k=4,
                            passes=1, window_last=1, token=p.server)
    features = [FeatureSpec("a", 0.0, 2.0), FeatureSpec("b", -1.0, 1.0, "int")]
    app = create_app(service, services.Authenticator(p.url, token=p.server))
    with serving(app) as base:
        with httpx.Client(base_url=base, headers=bearer(p.client("c1"))) as c:
            drawn = c.post("/v1/draw", params={"blocks": "b0"}).json()   # one update
            c.post(f"/v1/discard/{drawn['ticket']}", json={"weights": drawn["weights"]})
        with pytest.raises(InvalidRequestError, match="token"):
            export_from_server(base, str(tmp_path / "none"), features, token="")
        live = export_from_server(base, str(tmp_path / "live"), features, token=p.pipeline,
                                  release=False)
        assert live["final"] is False
        served = export_from_server(base, str(tmp_path / "m"), features, token=p.pipeline)
        assert served["final"] is True
        # the same through the component's executor, into a Model artifact, twice (a retry)
        from tfx.types import standard_artifacts
        from sage_tfx.components.dnd_exporter.component import DnDExporter, Executor
        (tmp_path / "tok").write_text(p.pipeline + "\n")
        component = DnDExporter(server_url=base, features=features,
                                token_file=str(tmp_path / "tok"))
        digests = []
        for attempt in ("a1", "a2"):
            artifact = standard_artifacts.Model()
            artifact.uri = str(tmp_path / attempt)
            (tmp_path / attempt).mkdir()
            Executor().Do({}, {"model": [artifact]}, component.exec_properties)
            assert artifact.get_string_custom_property("dnd_run_id") == "r1"
            assert artifact.get_int_custom_property("dnd_final") == 1
            digests.append(artifact.get_string_custom_property("dnd_model_sha256"))
            assert (tmp_path / attempt / "Format-Serving" / "saved_model.pb").exists()
            assert json.load(open(tmp_path / attempt / "privacy_report.json"))["spec"]["k"] == 4
        assert digests == [served["model_sha256"]] * 2
        with pytest.raises(InvalidRequestError):
            export_from_server(base, str(tmp_path / "bad"), features[:1], token=p.pipeline)
    assert served["run_id"] == "r1" and served["k"] == 4
    avg = service.average()
    assert avg.final
    model = ServingModel(str(tmp_path / "m"), signature_name="serving_default", prediction_key=None)
    rows = [{"a": 0.5, "b": 1}, {"a": 3.0, "b": -1}]
    p_ = model.predict(tf.constant([_example(r).SerializeToString() for r in rows]))
    x01 = np.array([[0.25, 1.0], [1.0, 0.0]])
    np.testing.assert_allclose(p_, spec.predict(avg.weights, x01), rtol=1e-5, atol=1e-6)
    assert json.load(open(tmp_path / "m" / "dnd_server.json"))["spec"]["dim"] == 3
