"""Gate -> BlockExampleGen -> StatisticsGen: the smallest pipeline that reads blocks through Sage.

The gate charges the run's (ε, δ) to a window of blocks in the ledger (Sage §3.2) before any data
is read; BlockExampleGen then reads exactly the granted blocks. By default the data-reading part
runs under ``tfx.dsl.Cond`` on the grant, so a denial (budget exhausted) ends the run cleanly
with a DENIED SageGrant and nothing read.

Run locally::

    from tfx import v1 as tfx
    from sage_tfx.pipelines.gate_stats_pipeline import create_pipeline
    tfx.orchestration.LocalDagRunner().run(create_pipeline(
        pipeline_name="taxi-stats", pipeline_root="/tmp/root", metadata_path="/tmp/mlmd.db",
        ledger_url="sqlite:////tmp/ledger.db", stream="taxi", window_last=3,
        epsilon=0.5, delta=1e-6))
"""
from __future__ import annotations

from typing import Optional, Sequence

from tfx import v1 as tfx
from tfx.proto import example_gen_pb2

from sage_tfx.components.block_example_gen.component import BlockExampleGen
from sage_tfx.components.gate.component import SageGate
from sage_tfx.ledger import DEFAULT_CONTEXT


def create_pipeline(pipeline_name: str, pipeline_root: str, metadata_path: str,
                    ledger_url: str, stream: str, window_last: int, epsilon: float,
                    delta: float = 0.0, *, window_min_blocks: Optional[int] = None,
                    context: str = DEFAULT_CONTEXT, run_id: Optional[str] = None,
                    output_config: Optional[example_gen_pb2.Output] = None,
                    skip_if_denied: bool = True,
                    beam_pipeline_args: Optional[Sequence[str]] = None,
                    enable_cache: bool = False) -> tfx.dsl.Pipeline:
    """Builds SageGate -> BlockExampleGen -> StatisticsGen on a window of blocks.

    Args:
      pipeline_name, pipeline_root: the TFX pipeline's name and output root.
      metadata_path: the SQLite ML Metadata database.
      ledger_url: the block ledger (``sqlite:////abs/ledger.db`` or ``postgresql://...``).
      stream: the stream to read.
      window_last: read the ``window_last`` most recent blocks with budget left.
      epsilon, delta: basic-mode cost charged to every granted block.
      window_min_blocks: accept fewer blocks (at least this many) than ``window_last``.
      context: the ledger context to charge.
      run_id: ledger run id; default derived from the pipeline run (see SageGate).
      output_config: BlockExampleGen splits (default train:eval = 2:1).
      skip_if_denied: run BlockExampleGen and StatisticsGen under ``tfx.dsl.Cond`` on
        ``granted == 1``; if False a denial makes BlockExampleGen fail with MissingGrantError.
      beam_pipeline_args: Beam flags of the Beam components.
      enable_cache: TFX caching. The gate sees the pipeline run id, so it is never served from
        the cache; a grant reused downstream costs no privacy (post-processing).

    Returns:
      The pipeline.
    """
    gate = SageGate(ledger_url=ledger_url, stream=stream, window_last=window_last,
                    window_min_blocks=window_min_blocks, epsilon=epsilon, delta=delta,
                    context=context, run_id=run_id)

    def readers():
        example_gen = BlockExampleGen(grant=gate.outputs["grant"], ledger_url=ledger_url,
                                      output_config=output_config)
        statistics_gen = tfx.components.StatisticsGen(examples=example_gen.outputs["examples"])
        return [example_gen, statistics_gen]

    if skip_if_denied:
        with tfx.dsl.Cond(gate.outputs["grant"].future()[0].custom_property("granted") == 1):
            downstream = readers()
    else:
        downstream = readers()
    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name,
        pipeline_root=pipeline_root,
        components=[gate, *downstream],
        enable_cache=enable_cache,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            metadata_path),
        beam_pipeline_args=list(beam_pipeline_args or []),
    )


def run_local(*, pipeline_root: str, ledger_url: str, stream: str, window_last: int,
              epsilon: float, delta: float = 0.0, pipeline_name: str = "sage-gate-stats",
              **kwargs) -> dict:
    """Runs the pipeline once with LocalDagRunner; returns a summary of what it read.

    Returns:
      ``{"granted": bool, "blocks": [...], "train_examples": n, "eval_examples": n}`` (counts
      from the ExampleStatistics artifact), or ``{"granted": False, "reason": ...}``.
    """
    import os

    from ml_metadata.metadata_store import metadata_store
    from tensorflow_metadata.proto.v0 import statistics_pb2
    from tfx.orchestration import metadata

    metadata_path = os.path.join(pipeline_root, "metadata.db")
    tfx.orchestration.LocalDagRunner().run(create_pipeline(
        pipeline_name=pipeline_name, pipeline_root=pipeline_root, metadata_path=metadata_path,
        ledger_url=ledger_url, stream=stream, window_last=window_last, epsilon=epsilon,
        delta=delta, **kwargs))
    store = metadata_store.MetadataStore(metadata.sqlite_metadata_connection_config(metadata_path))
    grant = store.get_artifacts_by_type("sage_tfx.SageGrant")[-1]
    if grant.custom_properties["granted"].int_value != 1:
        return {"granted": False, "reason": grant.custom_properties["reason"].string_value}
    stats = store.get_artifacts_by_type("ExampleStatistics")[-1]
    examples = store.get_artifacts_by_type("Examples")[-1]
    counts = {}
    for split in ("train", "eval"):
        s = statistics_pb2.DatasetFeatureStatisticsList()
        with open(os.path.join(stats.uri, f"Split-{split}", "FeatureStats.pb"), "rb") as f:
            s.ParseFromString(f.read())
        counts[f"{split}_examples"] = s.datasets[0].num_examples
    import json
    return {"granted": True,
            "blocks": json.loads(examples.custom_properties["block_ids"].string_value), **counts}
