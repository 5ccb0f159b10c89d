"""SageGate -> BlockExampleGen (private window) + CsvExampleGen (declared public) ->
DPBaggingTrainer.

The gate charges the bagging run's cost, fixed from the grant size and public facts before any
private data is read (``bagging_cost``: ε(p) of p noisy-argmax queries on basic streams, the
composed event of the votes on rdp streams, p planned by its RDP ε); every block of the window
carries it. The trainer's ``model`` is a serving SavedModel (output ``probabilities``) with
``privacy_report.json``.

    from tfx import v1 as tfx
    from sage_tfx.pipelines.dp_bagging_pipeline import create_pipeline
    tfx.orchestration.LocalDagRunner().run(create_pipeline(
        pipeline_name="bagging", pipeline_root="/tmp/root", metadata_path="/tmp/mlmd.db",
        ledger_url="sqlite:////tmp/ledger.db", stream="patients", window_last=4,
        public_csv_dir="/data/public", public_size=5000, epsilon=3.0, delta=1e-5,
        k=50, n=100, label_key="label", unit_key="user", feature_keys=["age", "bmi"]))
"""
from __future__ import annotations

from typing import Optional, Sequence

from tfx import v1 as tfx
from tfx.proto import example_gen_pb2

from sage_tfx.bagging import BaggingConfig
from sage_tfx.components.block_example_gen.component import BlockExampleGen
from sage_tfx.components.dp_bagging_trainer.component import DPBaggingTrainer
from sage_tfx.components.dp_bagging_trainer.executor import bagging_cost
from sage_tfx.components.gate.component import SageGate


def create_pipeline(pipeline_name: str, pipeline_root: str, metadata_path: str, *,
                    ledger_url: str, stream: str, window_last: int, public_csv_dir: str,
                    public_size: int, epsilon: float, delta: float, k: int, n: int,
                    label_key: str, unit_key: str, feature_keys: Sequence[str],
                    lam: Optional[float] = None, mode: str = "fixed_queries",
                    accountant: str = "best", rdp_stream: bool = False,
                    cache_dir: Optional[str] = None, run_id: Optional[str] = None,
                    beam_pipeline_args: Optional[Sequence[str]] = None,
                    accept_not_differentially_private: bool = False,
                    votes: str = "laplace") -> tfx.dsl.Pipeline:
    """Builds the DP bagging pipeline (λ defaults to the paper's 2/n).

    ``mode="paper"`` is not differentially private and is refused here, before anything is
    charged, unless ``accept_not_differentially_private=True``.
    """
    lam = 2.0 / n if lam is None else lam
    config = BaggingConfig(k=k, n=n, lam=lam, mode=mode, accountant=accountant,
                           accept_not_differentially_private=accept_not_differentially_private,
                           votes=votes)
    cost = bagging_cost(config, epsilon=epsilon, delta=delta, public_size=public_size,
                        rdp=rdp_stream)
    # min_records=n: a window whose ledger block sizes hold fewer than n records cannot give every
    # partition n non-empty chunks (units <= records), so the gate denies it and refunds the
    # reservation before any data is read, instead of the trainer failing after the charge. A
    # window with >= n records but < n units is still only found by the trainer (after the
    # charge): the number of units is private, the number of records is ledger metadata.
    gate = SageGate(ledger_url=ledger_url, stream=stream, window_last=window_last, run_id=run_id,
                    min_records=n, **cost)
    with tfx.dsl.Cond(gate.outputs["grant"].future()[0].custom_property("granted") == 1):
        private = BlockExampleGen(grant=gate.outputs["grant"], ledger_url=ledger_url,
                                  output_config=example_gen_pb2.Output(
                                      split_config=example_gen_pb2.SplitConfig(
                                      splits=[
                                          example_gen_pb2.SplitConfig.Split(name="train",
                                                                            hash_buckets=1)])))
        public = tfx.components.CsvExampleGen(
            input_base=public_csv_dir,
            output_config=example_gen_pb2.Output(split_config=example_gen_pb2.SplitConfig(
                splits=[example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=1)]))
        ).with_id("PublicExampleGen")
        trainer = DPBaggingTrainer(examples=private.outputs["examples"],
                                   public_examples=public.outputs["examples"], public_declared=True,
                                   grant=gate.outputs["grant"], k=k, n=n, lam=lam, mode=mode,
                                   accountant=accountant, label_key=label_key, unit_key=unit_key,
                                   feature_keys=feature_keys, cache_dir=cache_dir,
                                   accept_not_differentially_private=accept_not_differentially_private,
                                   votes=votes)
    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name, pipeline_root=pipeline_root,
        components=[gate, private, public, trainer], enable_cache=False,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            metadata_path),
        beam_pipeline_args=list(beam_pipeline_args or ["--direct_num_workers=1"]))
