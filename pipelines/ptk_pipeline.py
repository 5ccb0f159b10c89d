"""SageGate -> BlockExampleGen -> PTKTrainer -> PTKFeaturizer: one gated PTK training run.

The gate charges the PTK's allocation (ε_i, δ_i from the PTK store's plan) to a window of blocks;
PTKTrainer trains the registered PTK on exactly those blocks and writes the version (with its
lineage) to the PTK lake; PTKFeaturizer adds the pinned version's features to Examples.

    from sage_tfx.pipelines.ptk_pipeline import run_local
    run_local(pipeline_root="/tmp/ptk-root", ledger_url="sqlite:////tmp/ledger.db",
              stream="events", window_last=2, ptk_id="ptk-...", window_index=0)

``featurize_fn`` (optional) names the registered PTK type whose featurizer runs; by default the
PTK's own type.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

from tfx import v1 as tfx

from sage_tfx.components.block_example_gen.component import BlockExampleGen
from sage_tfx.components.gate.component import SageGate
from sage_tfx.components.gate.executor import check_ledger_url
from sage_tfx.components.ptk_featurizer.component import PTKFeaturizer
from sage_tfx.components.ptk_trainer.component import PTKTrainer
from sage_tfx.ptk.lake import Lake


def allocation(ledger_url: str, ptk_id: str) -> tuple[float, float]:
    """The PTK's (ε_i, δ_i) in the store's current plan."""
    lake = Lake(ledger_url)
    try:
        _, plan = lake.plan()
    finally:
        lake.close()
    for part in plan.partitions if plan else ():
        for m in part.members:
            if m.ptk_id == ptk_id:
                return m.epsilon, m.delta
    raise ValueError(f"{ptk_id!r} has no allocation in the PTK store's plan")


def create_pipeline(pipeline_name: str, pipeline_root: str, metadata_path: str,
                    ledger_url: str, stream: str, window_last: int, ptk_id: str,
                    window_index: int, featurize_fn: Optional[str] = None, *,
                    epsilon=None, delta=None,
                    beam_pipeline_args: Optional[Sequence[str]] = None) -> tfx.dsl.Pipeline:
    """Builds the pipeline.

    ``epsilon`` / ``delta``: the gate's charge, normally the PTK's allocation. Given (numbers or
    KFP runtime parameters), nothing is read at build time; left out, the allocation is read
    from the PTK store's current plan (a live ledger). PTKTrainer trains at the grant's ε and
    refuses a grant whose (ε, δ) is not what the PTK type spends at that ε.
    """
    check_ledger_url(ledger_url)  # no password into the pipeline, before the store is read
    if epsilon is None:
        if delta is not None:
            raise ValueError("give epsilon with delta (or neither: the PTK store's allocation)")
        epsilon, delta = allocation(ledger_url, ptk_id)
    gate = SageGate(ledger_url=ledger_url, stream=stream, window_last=window_last,
                    epsilon=epsilon, delta=delta)
    with tfx.dsl.Cond(gate.outputs["grant"].future()[0].custom_property("granted") == 1):
        example_gen = BlockExampleGen(grant=gate.outputs["grant"], ledger_url=ledger_url)
        trainer = PTKTrainer(examples=example_gen.outputs["examples"],
                             grant=gate.outputs["grant"], ledger_url=ledger_url, ptk_id=ptk_id,
                             window_index=window_index)
        featurizer = PTKFeaturizer(examples=example_gen.outputs["examples"],
                                   ptk_state=trainer.outputs["ptk_state"],
                                   ledger_url=ledger_url, featurize_fn=featurize_fn)
    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name, pipeline_root=pipeline_root,
        components=[gate, example_gen, trainer, featurizer], enable_cache=False,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            metadata_path),
        beam_pipeline_args=list(beam_pipeline_args or []))


def run_local(*, pipeline_root: str, pipeline_name: str = "sage-ptk", **kwargs) -> str:
    """Runs the pipeline once with LocalDagRunner; returns the ML Metadata path."""
    metadata_path = os.path.join(pipeline_root, "metadata.db")
    tfx.orchestration.LocalDagRunner().run(create_pipeline(
        pipeline_name=pipeline_name, pipeline_root=pipeline_root, metadata_path=metadata_path,
        **kwargs))
    return metadata_path
