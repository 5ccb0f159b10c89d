"""BlockExampleGen: reads the blocks of a SageGrant into a standard ``Examples`` artifact.

The gate is the only path from block storage into a pipeline (Sage §3.2): this ExampleGen has no
``input_base``; the files it reads come from the grant, re-checked against the ledger at run
time. Example::

    gate = SageGate(ledger_url=LEDGER, stream="taxi", window_last=3, epsilon=0.5, delta=1e-6)
    with tfx.dsl.Cond(gate.outputs["grant"].future()[0].custom_property("granted") == 1):
        example_gen = BlockExampleGen(grant=gate.outputs["grant"], ledger_url=LEDGER)
        statistics_gen = tfx.components.StatisticsGen(
            examples=example_gen.outputs["examples"])

Without the ``Cond``, a denial makes BlockExampleGen fail with ``MissingGrantError`` (no block is
read). The output is the standard ExampleGen layout (``Split-train/data_tfrecord-*.gz``, ...,
``split_names``, payload format tf.Example), default splits train:eval = 2:1 by a deterministic
hash of each record, plus custom properties ``grant_id``, ``stream``, ``run_id``, ``block_ids``
(JSON list) and ``num_blocks``.
"""
from __future__ import annotations

from typing import Optional

from tfx import types
from tfx.components.example_gen import utils as example_gen_utils
from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.proto import example_gen_pb2
from tfx.types import standard_artifacts

from sage_tfx.components.block_example_gen import executor
from sage_tfx.components.block_example_gen import spec
from sage_tfx.components.gate.executor import check_ledger_url


def default_output_config() -> example_gen_pb2.Output:
    """train:eval = 2:1 by hash buckets (ExampleGen's default)."""
    return example_gen_pb2.Output(split_config=example_gen_pb2.SplitConfig(splits=[
        example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=2),
        example_gen_pb2.SplitConfig.Split(name="eval", hash_buckets=1),
    ]))


class BlockExampleGen(base_beam_component.BaseBeamComponent):
    """Reads exactly the granted blocks into Examples (train/eval splits by default).

    Component ``inputs`` contains:
      - ``grant``: Channel of type ``SageGrant`` (from ``SageGate``).
    Component ``outputs`` contains:
      - ``examples``: Channel of type ``standard_artifacts.Examples``.
    """

    SPEC_CLASS = spec.BlockExampleGenSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, grant: types.BaseChannel, *, ledger_url: Optional[str] = None,
                 output_config: Optional[example_gen_pb2.Output] = None):
        """Constructs a BlockExampleGen.

        Args:
          grant: the ``grant`` output of a SageGate.
          ledger_url: the ledger to verify the grant against. Default: the ledger named in the
            grant artifact; passing it pins the ledger this component trusts.
          output_config: ``example_gen_pb2.Output`` with ``split_config.splits`` (hash buckets per
            split, optionally ``partition_feature_name``). Default: train:eval = 2:1.

        Raises:
          ValueError: malformed ledger_url, or an output_config without named splits and
            positive hash buckets.
        """
        if ledger_url is not None and type(ledger_url).__name__ != "RuntimeParameter":
            check_ledger_url(ledger_url)
        output_config = output_config or default_output_config()
        if isinstance(output_config, example_gen_pb2.Output):
            if not output_config.split_config.splits:
                raise ValueError(
                    "BlockExampleGen needs output_config.split_config.splits, e.g. train:eval = "
                    "2:1 (hash_buckets 2 and 1); use one split with hash_buckets=1 for no split")
            try:
                example_gen_utils.generate_output_split_names(
                    example_gen_pb2.Input(splits=[example_gen_pb2.Input.Split(
                        name=executor.INPUT_SPLIT_NAME, pattern="*")]), output_config)
            except RuntimeError as e:
                raise ValueError(f"invalid output_config: {e}") from e
        super().__init__(spec=spec.BlockExampleGenSpec(
            ledger_url=ledger_url,
            output_config=output_config,
            output_data_format=example_gen_pb2.FORMAT_TF_EXAMPLE,
            output_file_format=example_gen_pb2.FORMAT_TFRECORDS_GZIP,
            grant=grant,
            examples=types.Channel(type=standard_artifacts.Examples),
        ))
