"""Pyramid pipeline end to end under LocalDagRunner on tiny blocks: charge once, train, push a
model that serves raw tf.Examples with its featurizer in-graph."""
import os

import numpy as np
import pandas as pd
import pytest

from blockdata import make_example, write_block_file
from sage_tfx.streams.blocks import block_location

pytestmark = pytest.mark.slow


def test_pyramid_pipeline_trains_on_count_features(tmp_path):
    import tensorflow as tf
    from tfx import v1 as tfx
    from sage_tfx.ledger import open_ledger
    from sage_tfx.pipelines.pyramid_pipeline import create_pipeline
    from sage_tfx.pyramid import CountSpec, PyramidStore, pyramid_run_id

    url = f"sqlite:///{tmp_path}/ledger.db"
    rng = np.random.default_rng(0)
    with open_ledger(url) as led:
        led.create_stream("obs", epsilon_g=2.0, delta_g=0.0)
        for b in ("w0a", "w0b", "hot"):
            loc = block_location(str(tmp_path / "blocks"), "obs", b)
            u = rng.integers(0, 10, 80)
            write_block_file(loc, [make_example({"user": f"u{a}", "y": int(a < 3)}) for a in u])
            led.add_block("obs", b, location=loc, records=80)
    spec = CountSpec(groups=("user",), label="y", width=64, epsilon=1.0, hash_family="tf_siphash")
    with pytest.raises(ValueError, match="tf_siphash"):
        create_pipeline("p", str(tmp_path), str(tmp_path / "m.db"), url, "obs",
                        CountSpec(groups=("user",), label="y", width=64), store_dir="s",
                        count_window=0, count_blocks=["w0a"], hot_blocks=["hot"], hot_epsilon=0.5)
    store = str(tmp_path / "store")
    tfx.orchestration.LocalDagRunner().run(create_pipeline(
        "pyramid-e2e", str(tmp_path / "root"), str(tmp_path / "mlmd.db"), url, "obs", spec,
        store_dir=store, count_window=0, count_blocks=["w0a", "w0b"], hot_blocks=["hot"],
        hot_epsilon=0.5, train_steps=5, eval_steps=1, serving_dir=str(tmp_path / "serving")))
    with open_ledger(url) as led:
        spent = {b.block_id: b.epsilon_spent for b in led.blocks("obs")}
        runs = {g.run_id for g in led.grants("obs")}
    assert spent == {"w0a": 1.0, "w0b": 1.0, "hot": 0.5}
    assert pyramid_run_id("obs", spec, 0) in runs
    # The pushed model serves raw tf.Examples (featurizer in its graph) and predicts what the
    # in-process path (the snapshot's Python featurizer, then the model alone) predicts.
    pushed = [d for d, _, fs in os.walk(tmp_path / "serving") if "saved_model.pb" in fs]
    assert len(pushed) == 1
    users = [f"u{a}" for a in range(12)]                 # u10, u11: never counted -> prior
    raw = [make_example({"user": u, "y": 0}).SerializeToString() for u in users]
    served = tf.saved_model.load(pushed[0])
    p_graph = served.signatures["serving_default"](examples=tf.constant(raw))["probabilities"]
    feat = PyramidStore(spec, store, retention=12).featurization()
    x = feat.featurize(pd.DataFrame({"user": users}))
    p_py = served.signatures["predict_features"](features=tf.constant(x))["probabilities"]
    np.testing.assert_allclose(p_graph.numpy(), p_py.numpy(), rtol=0, atol=1e-6)
    assert np.ptp(p_graph.numpy()) > 0                   # not a constant model
