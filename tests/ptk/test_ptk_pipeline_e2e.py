"""End to end: SageGate -> BlockExampleGen -> PTKTrainer -> PTKFeaturizer under LocalDagRunner."""
import json
import os

import numpy as np
import pytest

from ptk_data import HS, HS_CONFIG

pytestmark = pytest.mark.slow
STREAM = "events"


def write_blocks(root, ledger_url):
    import tensorflow as tf

    from sage_tfx.ledger import BlockSpec, open_ledger
    rng = np.random.default_rng(0)
    specs = []
    for day in ("2024-01-01", "2024-01-02", "2024-01-03"):
        loc = os.path.join(root, STREAM, day)
        os.makedirs(loc)
        with tf.io.TFRecordWriter(os.path.join(loc, "part-00000-of-00001.tfrecord.gz"),
                                  options="GZIP") as w:
            for _ in range(150):
                ex = tf.train.Example()
                city = str(rng.choice(list("abcd")))
                ex.features.feature["city"].bytes_list.value.append(city.encode())
                ex.features.feature["delay"].float_list.value.append(
                    float("abcd".index(city) * 2 + 2 + rng.normal(0, 0.5)))
                w.write(ex.SerializeToString())
        specs.append(BlockSpec(day, location=loc, records=150))
    with open_ledger(ledger_url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=1.0, delta_g=1e-6, granularity="day")
        ledger.add_blocks(STREAM, specs)


def test_gated_ptk_training_and_pinned_featurization(tmp_path):
    from ml_metadata.metadata_store import metadata_store
    from tfx.orchestration import metadata

    from sage_tfx.ledger import open_ledger
    from sage_tfx.pipelines.ptk_pipeline import run_local
    from sage_tfx.ptk import PTKStore, StoreConfig

    url = f"sqlite:///{tmp_path}/ledger.db"
    write_blocks(str(tmp_path / "blocks"), url)
    store = PTKStore(url, str(tmp_path / "ptkdata"), StoreConfig(stream="ptk"))
    pid = store.register_ptk(HS, config=HS_CONFIG, tau=0.2,
                             menu=[(0.5, 200)])
    store.close()
    mlmd = run_local(pipeline_root=str(tmp_path / "root"), ledger_url=url, stream=STREAM,
                     window_last=2, ptk_id=pid, window_index=0,
                     featurize_fn=HS)
    with open_ledger(url) as ledger:
        (grant,) = ledger.grants(STREAM)
        spent = {b.block_id: b.epsilon_spent for b in ledger.blocks(STREAM)}
    assert grant.epsilon == 0.5 and spent == {"2024-01-01": 0.0, "2024-01-02": 0.5,
                                              "2024-01-03": 0.5}
    store = PTKStore(url, str(tmp_path / "ptkdata"), StoreConfig(stream="ptk"))
    lin = store.lineage(pid)
    store.close()
    assert lin.grant_id == grant.grant_id and lin.blocks == ("2024-01-02", "2024-01-03")
    assert lin.n_used == 300 and lin.epsilon == 0.5
    ms = metadata_store.MetadataStore(metadata.sqlite_metadata_connection_config(mlmd))
    (state,) = ms.get_artifacts_by_type("sage_tfx.PTKState")
    assert json.load(open(os.path.join(state.uri, "lineage.json")))["grant_id"] == grant.grant_id
    feats = [a for a in ms.get_artifacts_by_type("Examples")
             if "ptk_version" in a.custom_properties]
    (feat,) = feats
    assert feat.custom_properties["ptk_id"].string_value == pid
    assert feat.custom_properties["ptk_version"].int_value == 1
    assert feat.custom_properties["ptk_grant_id"].string_value == grant.grant_id
    import tensorflow as tf
    files = [os.path.join(dp, f) for dp, _, fs in os.walk(feat.uri) for f in fs
             if f.endswith(".gz")]
    ex = tf.train.Example.FromString(next(iter(
        tf.data.TFRecordDataset(files, compression_type="GZIP").as_numpy_iterator())))
    assert "city_delay_mean" in ex.features.feature and "city_delay_count" in ex.features.feature
