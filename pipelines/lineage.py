"""Privacy lineage from ML Metadata: which blocks trained this model, and at what privacy cost.

Every ledger decision of a pipeline run is a ``SageGrant`` artifact in ML Metadata whose custom
properties carry the grant id, run id, stream, granted block ids, accounting mode and the charged
(ε, δ) or DpEvent (``sage_tfx.components.artifacts``). Walking a model's lineage upstream (the
executions that produced it and their inputs) reaches the grants that paid for it::

    from sage_tfx.pipelines.lineage import open_store, privacy_lineage
    store = open_store("/pipelines/flights-dp/mlmd.db")
    model = store.get_artifacts_by_type("Model")[-1]
    for grant in privacy_lineage(store, model.id):
        print(grant.grant_id, grant.blocks, grant.epsilon, grant.delta, grant.event)

The answer comes from MLMD alone; ``Ledger.grants`` is the authority to cross-check it against.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, List, Optional

# TFX (through sage_tfx.components) is imported by the functions only: importing this module
# stays cheap.


@dataclasses.dataclass(frozen=True)
class GrantLineage:
    """One ledger grant found upstream of an artifact.

    Attributes:
      artifact_id: the SageGrant's MLMD artifact id.
      grant_id, run_id, stream, context, ledger_url, mode: the grant.
      blocks: the granted block ids, in ledger order.
      epsilon, delta: the charged cost (basic mode; None in rdp mode).
      event: the charged dp_accounting DpEvent (rdp mode; None in basic mode).
    """

    artifact_id: int
    grant_id: str
    run_id: str
    stream: str
    context: str
    ledger_url: str
    mode: str
    blocks: tuple
    epsilon: Optional[float]
    delta: Optional[float]
    event: Any


def open_store(metadata_path: str):
    """An ML Metadata store on a SQLite file (as LocalDagRunner and Airflow write it)."""
    from ml_metadata.metadata_store import metadata_store
    from tfx.orchestration import metadata

    return metadata_store.MetadataStore(
        metadata.sqlite_metadata_connection_config(metadata_path))


def _value(value) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _grant(artifact) -> GrantLineage:
    from sage_tfx.components import artifacts as sage_artifacts
    props = {k: _value(v) for k, v in artifact.custom_properties.items()}
    event = None
    if props.get(sage_artifacts.EVENT_JSON_KEY):
        from sage_tfx.ledger import accounting
        event = accounting.event_from_json(props[sage_artifacts.EVENT_JSON_KEY])
    return GrantLineage(
        artifact_id=artifact.id,
        grant_id=props.get(sage_artifacts.GRANT_ID_KEY, ""),
        run_id=props.get(sage_artifacts.RUN_ID_KEY, ""),
        stream=props.get(sage_artifacts.STREAM_KEY, ""),
        context=props.get(sage_artifacts.CONTEXT_KEY, ""),
        ledger_url=props.get(sage_artifacts.LEDGER_URL_KEY, ""),
        mode=props.get(sage_artifacts.MODE_KEY, ""),
        blocks=tuple(json.loads(props.get(sage_artifacts.BLOCK_IDS_KEY) or "[]")),
        epsilon=props.get(sage_artifacts.EPSILON_KEY),
        delta=props.get(sage_artifacts.DELTA_KEY),
        event=event)


def privacy_lineage(store, artifact_id: int) -> List[GrantLineage]:
    """The granted SageGrants upstream of an artifact (a Model, a PushedModel, Examples ...).

    Walks ML Metadata events upstream (artifact -> the execution that output it -> that
    execution's inputs -> ...) and returns every SageGrant reached that holds a grant
    (``granted`` == 1), in artifact id order.

    Raises:
      LookupError: no artifact with that id.
    """
    from ml_metadata import errors
    from ml_metadata.proto import metadata_store_pb2

    from sage_tfx.components import artifacts as sage_artifacts

    if not store.get_artifacts_by_id([artifact_id]):
        raise LookupError(f"no artifact {artifact_id} in ML Metadata")
    try:
        grant_type = store.get_artifact_type(sage_artifacts.SageGrant.TYPE_NAME)
    except errors.NotFoundError:
        return []  # no gate ever ran against this store
    seen_artifacts, seen_executions = {artifact_id}, set()
    frontier, grants = [artifact_id], {}
    outputs = (metadata_store_pb2.Event.OUTPUT, metadata_store_pb2.Event.DECLARED_OUTPUT)
    inputs = (metadata_store_pb2.Event.INPUT, metadata_store_pb2.Event.DECLARED_INPUT)
    while frontier:
        producers = {e.execution_id for e in store.get_events_by_artifact_ids(frontier)
                     if e.type in outputs} - seen_executions
        seen_executions |= producers
        upstream = {e.artifact_id for e in store.get_events_by_execution_ids(list(producers))
                    if e.type in inputs} - seen_artifacts
        seen_artifacts |= upstream
        frontier = sorted(upstream)
        for artifact in store.get_artifacts_by_id(frontier):
            if (artifact.type_id == grant_type.id and artifact.custom_properties[
                    sage_artifacts.GRANTED_KEY].int_value == sage_artifacts.GRANTED_VALUE):
                grants[artifact.id] = _grant(artifact)
    return [grants[k] for k in sorted(grants)]
