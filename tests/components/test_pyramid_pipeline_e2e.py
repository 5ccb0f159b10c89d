"""Pyramid pipeline end to end under LocalDagRunner on tiny blocks: charge once, train."""
import os

import numpy as np
import pytest

from blockdata import make_example, write_block_file
from sage_tfx.streams.blocks import block_location

pytestmark = pytest.mark.slow


def test_pyramid_pipeline_trains_on_count_features(tmp_path):
    from tfx import v1 as tfx
    from sage_tfx.ledger import open_ledger
    from sage_tfx.pipelines.pyramid_pipeline import create_pipeline
    from sage_tfx.pyramid import CountSpec, pyramid_run_id

    url = f"sqlite:///{tmp_path}/ledger.db"
    rng = np.random.default_rng(0)
    with open_ledger(url) as led:
        led.create_stream("obs", epsilon_g=2.0, delta_g=0.0)
        for b in ("w0a", "w0b", "hot"):
            loc = block_location(str(tmp_path / "blocks"), "obs", b)
            u = rng.integers(0, 10, 80)
            write_block_file(loc, [make_example({"user": f"u{a}", "y": int(a < 3)}) for a in u])
            led.add_block("obs", b, location=loc, records=80)
    spec = CountSpec(groups=("user",), label="y", width=64, epsilon=1.0)
    store = str(tmp_path / "store")
    tfx.orchestration.LocalDagRunner().run(create_pipeline(
        "pyramid-e2e", str(tmp_path / "root"), str(tmp_path / "mlmd.db"), url, "obs", spec,
        store_dir=store, count_window=0, count_blocks=["w0a", "w0b"], hot_blocks=["hot"],
        hot_epsilon=0.5, train_steps=5, eval_steps=1))
    with open_ledger(url) as led:
        spent = {b.block_id: b.epsilon_spent for b in led.blocks("obs")}
        runs = {g.run_id for g in led.grants("obs")}
    assert spent == {"w0a": 1.0, "w0b": 1.0, "hot": 0.5}
    assert pyramid_run_id("obs", spec, 0) in runs
    models = [d for d, _, fs in os.walk(tmp_path / "root") if "saved_model.pb" in fs]
    assert models
