"""SageGrant artifact: on-disk layout, properties, and read_grant's refusals."""
import os

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def artifacts():
    from sage_tfx.components import artifacts
    return artifacts


def _grant(status="released"):
    from sage_tfx.ledger import Grant, GrantedBlock
    loc = "/blocks/s/2024-01-01" if status == "released" else None
    return Grant("a" * 32, "run-1", "s", "default", "basic", 0.5, 1e-6, None,
                 (GrantedBlock("2024-01-01", loc),), status, "2024-01-01T00:00:00+00:00")


def _artifact(artifacts, tmp_path, name="g"):
    art = artifacts.SageGrant()
    art.uri = str(tmp_path / name)
    return art


def test_grant_round_trip(artifacts, tmp_path):
    art = _artifact(artifacts, tmp_path)
    artifacts.write_grant(art, _grant(), stream="s", run_id="run-1", context="default",
                          ledger_url="sqlite:////l.db")
    assert sorted(os.listdir(art.uri)) == ["GRANTED", "grant.json"]
    assert artifacts.read_grant(art) == _grant()
    assert artifacts.is_granted(art) and artifacts.denial_reason(art) is None
    assert (art.grant_id, art.num_blocks, art.epsilon, art.delta) == ("a" * 32, 1, 0.5, 1e-6)


def test_rewriting_keeps_exactly_one_decision(artifacts, tmp_path):
    art = _artifact(artifacts, tmp_path)
    artifacts.write_grant(art, _grant(), stream="s", run_id="run-1", context="default",
                          ledger_url="sqlite:////l.db")
    artifacts.write_grant(art, None, stream="s", run_id="run-1", context="default",
                          ledger_url="sqlite:////l.db", reason="no budget")
    assert os.listdir(art.uri) == ["DENIED"]
    assert not artifacts.is_granted(art) and artifacts.denial_reason(art) == "no budget"
    assert art.grant_id == "" and art.block_ids == "" and art.reason == "no budget"


def test_grant_survives_a_kubeflow_v2_pod(artifacts, tmp_path):
    """Out of one pod as KFP v2 runtime metadata, into the next pod as a SageGrant again."""
    import json

    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2 as pb
    from tfx.orchestration.kubeflow.v2 import compiler_utils
    from tfx.orchestration.kubeflow.v2.container import kubeflow_v2_entrypoint_utils as kfp_utils

    art = _artifact(artifacts, tmp_path)
    artifacts.write_grant(art, _grant(), stream="s", run_id="run-1", context="default",
                          ledger_url="sqlite:////l.db")
    runtime = kfp_utils.to_runtime_artifact(art, {})
    runtime.type.CopyFrom(pb.ArtifactTypeSchema(
        instance_schema=compiler_utils.get_artifact_schema(artifacts.SageGrant)))
    wire = pb.RuntimeArtifact()
    json_format.Parse(json_format.MessageToJson(runtime), wire)
    [[rebuilt]] = kfp_utils.parse_raw_artifact_dict(
        {"grant": pb.ArtifactList(artifacts=[wire])}).values()
    assert type(rebuilt) is artifacts.SageGrant
    assert artifacts.is_granted(rebuilt) and artifacts.read_grant(rebuilt) == _grant()
    assert (rebuilt.grant_id, rebuilt.num_blocks, rebuilt.epsilon, rebuilt.delta, rebuilt.mode,
            json.loads(rebuilt.block_ids), rebuilt.ledger_url) == (
        "a" * 32, 1, 0.5, 1e-6, "basic", ["2024-01-01"], "sqlite:////l.db")


def test_write_grant_refuses_denial_without_reason_and_unreleased_grant(artifacts, tmp_path):
    art = _artifact(artifacts, tmp_path)
    with pytest.raises(ValueError, match="reason"):
        artifacts.write_grant(art, None, stream="s", run_id="r", context="default",
                              ledger_url="sqlite:////l.db")
    with pytest.raises(ValueError, match="reserved"):
        artifacts.write_grant(art, _grant("reserved"), stream="s", run_id="r",
                              context="default", ledger_url="sqlite:////l.db")


def test_read_grant_refuses_empty_wrong_type_and_inconsistent_artifacts(artifacts, tmp_path):
    from tfx.types import standard_artifacts
    from sage_tfx.errors import MissingGrantError
    empty = _artifact(artifacts, tmp_path, "empty")
    os.makedirs(empty.uri)
    with pytest.raises(MissingGrantError, match="no grant in artifact .*was SageGate run"):
        artifacts.read_grant(empty)
    other = standard_artifacts.Examples()
    other.uri = str(tmp_path / "ex")
    with pytest.raises(MissingGrantError, match="expected a sage_tfx.SageGrant"):
        artifacts.read_grant(other)
    flipped = _artifact(artifacts, tmp_path, "flipped")
    artifacts.write_grant(flipped, _grant(), stream="s", run_id="run-1", context="default",
                          ledger_url="sqlite:////l.db")
    flipped.set_int_custom_property("granted", 0)
    with pytest.raises(MissingGrantError, match="'granted' property is not 1"):
        artifacts.read_grant(flipped)
