"""DnDExporter: the average of a live Draw-and-Discard server (127.0.0.1) as a serving SavedModel."""
import json

import numpy as np
import pytest

from test_server import serving

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


def test_exporter_pulls_the_average_of_a_live_server(tmp_path):
    import httpx
    import tensorflow as tf
    from sage_tfx.components.dnd_exporter.exporter import export_from_server
    from sage_tfx.components.dnd_trainer.protocol import FeatureSpec
    from sage_tfx.components.dp_validator.executor import ServingModel
    from sage_tfx.dnd import ClientConfig, GLMSpec
    from sage_tfx.dnd.server import build_service, create_app
    from sage_tfx.errors import InvalidRequestError
    from sage_tfx.ledger import BlockSpec, open_ledger

    url = f"sqlite:///{tmp_path}/ledger.db"
    with open_ledger(url) as led:
        led.create_stream("clients", epsilon_g=100.0, delta_g=1e-6, granularity="day")
        led.add_blocks("clients", [BlockSpec("b0", "/b/0")])
    spec = GLMSpec("logistic", 2)
    service = build_service(ledger_url=url, stream="clients", run_id="r1", spec=spec,
                            config=ClientConfig(gamma=0.1, l1_norm_clip=1.0, epsilon=2.0), k=4,
                            passes=1, window_last=1)
    features = [FeatureSpec("a", 0.0, 2.0), FeatureSpec("b", -1.0, 1.0, "int")]
    with serving(create_app(service)) as base:
        with httpx.Client(base_url=base) as c:   # one honest-looking update
            drawn = c.post("/v1/draw", params={"client_id": "c1", "blocks": "b0"}).json()
            c.post(f"/v1/discard/{drawn['ticket']}", json={"weights": drawn["weights"]})
        served = export_from_server(base, str(tmp_path / "m"), features)
        # the same through the component's executor, into a Model artifact
        from tfx.types import standard_artifacts
        from sage_tfx.components.dnd_exporter.component import DnDExporter, Executor
        component = DnDExporter(server_url=base, features=features)
        artifact = standard_artifacts.Model()
        artifact.uri = str(tmp_path / "artifact")
        (tmp_path / "artifact").mkdir()
        Executor().Do({}, {"model": [artifact]}, component.exec_properties)
        assert artifact.get_string_custom_property("dnd_run_id") == "r1"
        assert (tmp_path / "artifact" / "Format-Serving" / "saved_model.pb").exists()
        assert json.load(open(tmp_path / "artifact" / "privacy_report.json"))["spec"]["k"] == 4
        with pytest.raises(InvalidRequestError):
            export_from_server(base, str(tmp_path / "bad"), features[:1])
    assert served["run_id"] == "r1" and served["k"] == 4
    avg = service.average()
    model = ServingModel(str(tmp_path / "m"), signature_name="serving_default", prediction_key=None)
    rows = [{"a": 0.5, "b": 1}, {"a": 3.0, "b": -1}]
    p = model.predict(tf.constant([_example(r).SerializeToString() for r in rows]))
    x01 = np.array([[0.25, 1.0], [1.0, 0.0]])
    np.testing.assert_allclose(p, spec.predict(avg, x01), rtol=1e-5, atol=1e-6)
    assert json.load(open(tmp_path / "m" / "dnd_server.json"))["spec"]["dim"] == 3
