"""End to end under LocalDagRunner: SageGate → BlockExampleGen → DPStatisticsGen → stock SchemaGen
→ stock ExampleValidator on tiny encrypted blocks, then a replay of the same grant."""
import os

import numpy as np
import pytest

from blockdata import make_example, write_encrypted_day_blocks

pytestmark = pytest.mark.slow

STREAM = "events"
DAYS = ("2024-03-01", "2024-03-02", "2024-03-03")
PER_BLOCK = 1200
CITIES = ("paris", "lyon", "nice")


def _ledger(tmp_path):
    from sage_tfx.ledger import open_ledger
    url = f"sqlite:///{tmp_path}/ledger.db"
    rng = np.random.default_rng(3)

    def rows(day):
        return [make_example({"x": float(rng.uniform(0, 10)), "k": int(rng.integers(0, 5)),
                              "city": str(rng.choice(CITIES))}) for _ in range(PER_BLOCK)]

    specs = write_encrypted_day_blocks(str(tmp_path / "blocks"), STREAM, DAYS, rows)
    with open_ledger(url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=10.0, delta_g=1e-5, granularity="day")
        ledger.add_blocks(STREAM, specs)
    return url


def _store(metadata_path):
    from ml_metadata.metadata_store import metadata_store
    from tfx.orchestration import metadata
    return metadata_store.MetadataStore(metadata.sqlite_metadata_connection_config(metadata_path))


def test_stock_schema_gen_and_example_validator_run_on_dp_statistics(tmp_path):
    from tfx import v1 as tfx
    from tfx.utils import io_utils
    from sage_tfx.dp.feature_statistics import CategoricalFeature, NumericFeature
    from sage_tfx.ledger import open_ledger, releases
    from sage_tfx.pipelines.dp_data_validation_pipeline import create_pipeline

    url = _ledger(tmp_path)
    metadata_path = str(tmp_path / "mlmd.db")
    features = [NumericFeature("x", 0.0, 10.0), NumericFeature("k", 0.0, 5.0, dtype="int",
                                                               num_bins=5),
                CategoricalFeature("city")]

    def run():
        tfx.orchestration.LocalDagRunner().run(create_pipeline(
            pipeline_name="dp-data-validation", pipeline_root=str(tmp_path / "root"),
            metadata_path=metadata_path, ledger_url=url, stream=STREAM, window_last=3,
            features=features, epsilon=3.0, delta=1e-6, run_id="validation-1"))

    run()
    store = _store(metadata_path)
    [stats] = store.get_artifacts_by_type("ExampleStatistics")
    assert stats.custom_properties["replayed"].int_value == 0
    assert stats.custom_properties["tfx_version"].string_value  # what stock readers check
    [schema] = store.get_artifacts_by_type("Schema")
    parsed = io_utils.SchemaReader().read(os.path.join(schema.uri, "schema.pbtxt"))
    by_name = {f.name: f for f in parsed.feature}
    assert sorted(by_name) == ["city", "k", "x"]
    assert all(f.presence.min_fraction == 1.0 for f in parsed.feature)
    assert {d.name: sorted(d.value) for d in parsed.string_domain} == {"city": sorted(CITIES)}
    [anomalies] = store.get_artifacts_by_type("ExampleAnomalies")
    blessed = anomalies.custom_properties["blessed"].struct_value
    assert dict(blessed) == {"train": 1.0, "eval": 1.0}  # no anomaly in either split
    with open_ledger(url) as ledger:
        [grant] = ledger.grants(STREAM)
        names = [r.name for r in ledger.releases(grant.grant_id)]
        assert "statistics/statistics" in names
        assert all(b.epsilon_spent == 3.0 and b.delta_spent == 1e-6
                   for b in ledger.blocks(STREAM))
    digest = releases.tree_digest(stats.uri)

    # The same run id replays the grant: nothing is charged, the statistics are the recorded
    # bytes (no noise drawn), and the stock components read the same schema.
    run()
    store = _store(metadata_path)
    replay = max(store.get_artifacts_by_type("ExampleStatistics"), key=lambda a: a.id)
    assert replay.custom_properties["replayed"].int_value == 1
    assert releases.tree_digest(replay.uri) == digest
    with open_ledger(url) as ledger:
        assert len(ledger.grants(STREAM)) == 1
        assert all(b.charges == 1 for b in ledger.blocks(STREAM))
