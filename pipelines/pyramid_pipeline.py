"""Pyramid on TFX: seal a DP count window, snapshot it, count-featurize the hot window, train.

    SageGate(count window, run id = pyramid_run_id, ε = spec.epsilon) -> PyramidCountTable
        -> PyramidSnapshot ─┐
    SageGate(hot window)    -> BlockExampleGen -> PyramidTransform -> Trainer -> Pusher (stock)

PyramidTransform writes the snapshot's featurizer as a TF graph (``transform_graph``) and the
hot window's Examples featurized by it; the stock Trainer trains on those features and exports
one SavedModel holding the featurizer and the model (``pyramid_module.py``), which the stock
Pusher copies to ``serving_dir``: it serves raw tf.Examples, no snapshot beside it. The count
spec must use ``hash_family="tf_siphash"`` (a hash the graph computes too).

The count window's gate charges exactly the tables' ε under the idempotent run id of (stream,
count spec, window); PyramidCountTable seals with that grant, charges nothing more, and records
the window's tables against it, so a re-run (a retried node, another ``store_dir``) publishes
those same tables and draws no new noise. The hot
window's raw rows are what Pyramid trains on; they are not protected by DP in Pyramid's threat
model (§II.B), and the ledger still records their read (its own gate and cost, ``hot_epsilon``).

Run locally::

    tfx.orchestration.LocalDagRunner().run(create_pipeline(...))
"""
from __future__ import annotations

from typing import Optional, Sequence

from tfx import v1 as tfx

from sage_tfx.components.block_example_gen.component import BlockExampleGen
from sage_tfx.components.gate.component import SageGate
from sage_tfx.components.pyramid_counts.component import PyramidCountTable
from sage_tfx.components.pyramid_snapshot.component import PyramidSnapshot
from sage_tfx.components.pyramid_transform.component import PyramidTransform
from sage_tfx.dp.counts import HASH_TF_SIPHASH
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import accounting
from sage_tfx.pyramid import CountSpec, pyramid_run_id
from sage_tfx.pyramid.windows import window_event

# The trainer's run_fn by import path (installed with sage-tfx, in the image too): no module file
# for TFX to package into a wheel under the pipeline root when the pipeline is compiled.
RUN_FN = "sage_tfx.pipelines.pyramid_module.run_fn"


def feature_names(spec: CountSpec) -> list[str]:
    """The count features PyramidTransform writes (Featurization.feature_names order)."""
    names = []
    for g in spec.groups:
        name = spec.group_name(g)
        names += [f"{name}__p{l}" for l in range(1, spec.n_labels)] + [f"{name}__logn"]
    return names


def create_pipeline(pipeline_name: str, pipeline_root: str, metadata_path: str, ledger_url: str,
                    stream: str, spec: CountSpec, *, store_dir: str, count_window: int,
                    count_blocks: Sequence[str], hot_blocks: Sequence[str], hot_epsilon: float,
                    retention: int = 12, train_steps: int = 50, eval_steps: int = 5,
                    serving_dir: Optional[str] = None, rdp: bool = False,
                    beam_pipeline_args: Optional[Sequence[str]] = None) -> tfx.dsl.Pipeline:
    if spec.hash_family != HASH_TF_SIPHASH:
        raise InvalidRequestError(f"the Pyramid pipeline featurizes in the TF graph: the count "
                                  f"spec needs hash_family={HASH_TF_SIPHASH!r}")
    # The count window's cost: (ε, 0) on a basic stream; on an rdp stream (rdp=True) the
    # composed Laplace event of its tables, which the sealing component runs and verifies.
    cost = ({"event_json": accounting.event_to_json(window_event(spec))} if rdp
            else {"epsilon": spec.epsilon, "delta": spec.delta})
    count_gate = SageGate(ledger_url=ledger_url, stream=stream, blocks=list(count_blocks),
                          run_id=pyramid_run_id(stream, spec, count_window), **cost
                          ).with_id("SageGate.counts")
    counts = PyramidCountTable(grant=count_gate.outputs["grant"], ledger_url=ledger_url,
                               store_dir=store_dir, spec=spec, window=count_window,
                               retention=retention)
    snapshot = PyramidSnapshot(window_table=counts.outputs["window_table"], store_dir=store_dir,
                               spec=spec, retention=retention)
    # The hot rows are raw (not protected by DP in Pyramid's threat model); the gate records
    # their read at hot_epsilon, as a Laplace event on an rdp stream.
    hot_cost = ({"event_json": accounting.event_to_json(accounting.laplace_event(hot_epsilon))}
                if rdp else {"epsilon": hot_epsilon})
    hot_gate = SageGate(ledger_url=ledger_url, stream=stream, blocks=list(hot_blocks),
                        **hot_cost).with_id("SageGate.hot")
    example_gen = BlockExampleGen(grant=hot_gate.outputs["grant"], ledger_url=ledger_url)
    transform = PyramidTransform(examples=example_gen.outputs["examples"],
                                 featurization=snapshot.outputs["featurization"])
    trainer = tfx.components.Trainer(
        run_fn=RUN_FN, examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        train_args=tfx.proto.TrainArgs(num_steps=train_steps),
        eval_args=tfx.proto.EvalArgs(num_steps=eval_steps),
        custom_config={"feature_names": feature_names(spec), "label": spec.label})
    components = [count_gate, counts, snapshot, hot_gate, example_gen, transform, trainer]
    if serving_dir is not None:
        components.append(tfx.components.Pusher(
            model=trainer.outputs["model"], push_destination=tfx.proto.PushDestination(
                filesystem=tfx.proto.PushDestination.Filesystem(base_directory=serving_dir))))
    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name, pipeline_root=pipeline_root,
        components=components,
        enable_cache=False,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            metadata_path),
        beam_pipeline_args=list(beam_pipeline_args or ["--direct_num_workers=1"]))
