"""privacy_lineage on a hand-built ML Metadata graph: multi-hop walk, rdp DpEvents, denials."""
import json

import pytest

pytestmark = pytest.mark.slow  # sage_tfx.components imports TFX


def _store():
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2 as pb
    config = pb.ConnectionConfig()
    config.fake_database.SetInParent()
    return metadata_store.MetadataStore(config)


def test_lineage_walks_upstream_to_granted_grants_with_their_dp_events():
    from dp_accounting import dp_event
    from ml_metadata.proto import metadata_store_pb2 as pb

    from sage_tfx.ledger.accounting import event_to_json
    from sage_tfx.pipelines.lineage import privacy_lineage

    store = _store()
    grant_t = store.put_artifact_type(pb.ArtifactType(name="sage_tfx.SageGrant"))
    data_t = store.put_artifact_type(pb.ArtifactType(name="Examples"))
    model_t = store.put_artifact_type(pb.ArtifactType(name="Model"))
    exec_t = store.put_execution_type(pb.ExecutionType(name="step"))
    event = dp_event.ComposedDpEvent([dp_event.GaussianDpEvent(3.0),
                                      dp_event.LaplaceDpEvent(2.0)])

    def grant(granted, **props):
        a = pb.Artifact(type_id=grant_t, uri="/g")
        a.custom_properties["granted"].int_value = granted
        for k, v in props.items():
            a.custom_properties[k].string_value = v
        return a

    rdp, denied, unrelated = store.put_artifacts([
        grant(1, grant_id="g-rdp", run_id="r1", stream="s", mode="rdp",
              block_ids=json.dumps(["b1", "b2"]), event_json=event_to_json(event)),
        grant(0, run_id="r2", stream="s", reason="no budget"),
        grant(1, grant_id="g-other", mode="basic", block_ids="[]")])
    examples, model = store.put_artifacts([pb.Artifact(type_id=data_t, uri="/e"),
                                           pb.Artifact(type_id=model_t, uri="/m")])
    read, train = store.put_executions([pb.Execution(type_id=exec_t),
                                        pb.Execution(type_id=exec_t)])
    E = pb.Event
    store.put_events([
        E(artifact_id=rdp, execution_id=read, type=E.INPUT),
        E(artifact_id=denied, execution_id=read, type=E.INPUT),
        E(artifact_id=examples, execution_id=read, type=E.OUTPUT),
        E(artifact_id=examples, execution_id=train, type=E.INPUT),
        E(artifact_id=model, execution_id=train, type=E.OUTPUT)])

    [found] = privacy_lineage(store, model)  # two hops up; the denial paid for nothing
    assert (found.grant_id, found.run_id, found.mode, found.blocks) == (
        "g-rdp", "r1", "rdp", ("b1", "b2"))
    assert found.event == event and found.epsilon is None and found.delta is None
    assert privacy_lineage(store, examples) == [found]
    assert privacy_lineage(store, unrelated) == []
