"""End to end: SageGate -> BlockExampleGen -> StatisticsGen under LocalDagRunner on taxi blocks."""
import os

import pytest

from blockdata import write_taxi_month_blocks

pytestmark = pytest.mark.slow

STREAM = "taxi"
MONTHS = ("2013-01", "2013-02", "2013-03", "2013-04", "2013-05")


def _artifacts(metadata_path, type_name):
    from ml_metadata.metadata_store import metadata_store
    from tfx.orchestration import metadata
    store = metadata_store.MetadataStore(
        metadata.sqlite_metadata_connection_config(metadata_path))
    return store.get_artifacts_by_type(type_name)


def _num_examples(stats_uri, split):
    from tensorflow_metadata.proto.v0 import statistics_pb2
    stats = statistics_pb2.DatasetFeatureStatisticsList()
    with open(os.path.join(stats_uri, f"Split-{split}", "FeatureStats.pb"), "rb") as f:
        stats.ParseFromString(f.read())
    return stats.datasets[0].num_examples


def test_pipeline_reads_and_charges_exactly_the_granted_window(tmp_path):
    from tfx import v1 as tfx
    from sage_tfx.ledger import open_ledger
    from sage_tfx.pipelines.gate_stats_pipeline import create_pipeline

    ledger_url = f"sqlite:///{tmp_path}/ledger.db"
    specs = write_taxi_month_blocks(str(tmp_path / "blocks"), STREAM, MONTHS)
    records = {s.block_id: s.records for s in specs}
    assert all(200 <= n <= 500 for n in records.values())
    with open_ledger(ledger_url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=1.0, delta_g=1e-5, granularity="month")
        ledger.add_blocks(STREAM, specs)

    metadata_path = str(tmp_path / "mlmd.db")

    def run():
        tfx.orchestration.LocalDagRunner().run(create_pipeline(
            pipeline_name="taxi-gate-stats", pipeline_root=str(tmp_path / "root"),
            metadata_path=metadata_path, ledger_url=ledger_url, stream=STREAM,
            window_last=3, epsilon=0.6, delta=1e-6))

    # Run 1: the three most recent months are charged and read.
    run()
    granted = MONTHS[-3:]
    [stats] = _artifacts(metadata_path, "ExampleStatistics")
    counted = _num_examples(stats.uri, "train") + _num_examples(stats.uri, "eval")
    assert counted == sum(records[m] for m in granted)
    [examples] = _artifacts(metadata_path, "Examples")
    assert examples.custom_properties["block_ids"].string_value == (
        '["2013-03", "2013-04", "2013-05"]')
    with open_ledger(ledger_url) as ledger:
        state = {b.block_id: (b.epsilon_spent, b.delta_spent, b.charges)
                 for b in ledger.blocks(STREAM)}
        [grant] = ledger.grants(STREAM)
        assert ledger.check_consistency(STREAM) == []
        assert ledger.verify_audit().ok
    assert grant.block_ids == granted
    assert grant.grant_id == examples.custom_properties["grant_id"].string_value
    assert grant.run_id.startswith("taxi-gate-stats.SageGate.")
    assert state == {**{m: (0.0, 0.0, 0) for m in MONTHS[:2]},
                     **{m: (0.6, 1e-6, 1) for m in granted}}

    # Run 2: only two months have 0.6 left, so the window of three is denied; the Cond skips the
    # readers, the run succeeds, and nothing more is charged or read.
    run()
    grants = _artifacts(metadata_path, "sage_tfx.SageGrant")
    assert sorted(g.custom_properties["granted"].int_value for g in grants) == [0, 1]
    denied = [g for g in grants if g.custom_properties["granted"].int_value == 0][0]
    assert os.listdir(denied.uri) == ["DENIED"]
    assert len(_artifacts(metadata_path, "ExampleStatistics")) == 1
    with open_ledger(ledger_url) as ledger:
        assert {b.block_id: (b.epsilon_spent, b.delta_spent, b.charges)
                for b in ledger.blocks(STREAM)} == state
        assert [e.kind for e in ledger.audit_log(STREAM)][-1] == "deny"
