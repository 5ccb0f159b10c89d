"""DPTrainer: TFX's Trainer for the user's own Keras model, spending exactly the plan's ``train``
part (Sage §3.1).

Like ``tfx.components.Trainer`` (a module file, ``train_args`` / ``eval_args``, a transform
graph and a schema), plus a required ``grant`` from SageGate whose privacy plan has a ``train``
part. The module keeps its model builder and replaces ``run_fn`` by ``model_fn`` (see
``sage_tfx.components.dp_trainer.model_fn``)::

    # taxi_utils.py: the TFX taxi module, with run_fn replaced by
    def model_fn(fn_args):
        return DPSGDSpec(model=_build_keras_model([100, 70, 50, 25]), label_key="tips_xf",
                         raw_label_keys=["tips"], batch_size=256, epochs=4, l2_norm_clip=1.0)

    trainer = DPTrainer(module_file=MODULE, examples=transform.outputs["transformed_examples"],
                        transform_graph=transform.outputs["transform_graph"],
                        grant=gate.outputs["grant"])

The executor takes the module's architecture and nothing else: ``model_fn`` runs in a process
of its own and returns JSON; the executor checks it against stock-Keras allow-lists, rebuilds the
model with fresh weights, builds Poisson batches in Beam, trains with DP-SGD (the plan part's
σ, q, T, B), writes the serving SavedModel itself (raw tf.Examples → the DP transform graph → the
model) and checks every file, variable and constant of it before it is released. The Model's
custom properties record the verified guarantee (``dp_epsilon``, ``dp_delta``, ``dp_accounting``,
``dp_noise_multiplier``, ``dp_steps``, ``dp_sampling_probability``, ``dp_max_batch_size``,
``dp_oversize``, ``dp_truncation_delta``, ``dp_verification = "observed"``, ...) and
``dp_guarantee.json`` the whole record.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Union

from tfx import types
from tfx.components.util import udf_utils
from tfx.dsl.components.base import base_component, executor_spec
from tfx.orchestration import data_types
from tfx.proto import trainer_pb2
from tfx.types import standard_artifacts
from tfx.utils import json_utils

from sage_tfx.components.dp_trainer import executor
from sage_tfx.components.dp_trainer import preflight
from sage_tfx.components.dp_trainer import spec


def _dynamic(value: Any) -> bool:
    return isinstance(value, data_types.RuntimeParameter) or (
        type(value).__name__ in ("Placeholder", "RuntimeParameter"))


class DPTrainer(base_component.BaseComponent):
    """Trains the module's Keras model under the plan's train part; outputs a DP Model.

    Component ``inputs`` contains:
      - ``examples``: Channel of type ``Examples`` (the DP Transform's transformed examples, or
        raw examples whose schema gives dense features).
      - ``transform_graph``: optional Channel of type ``TransformGraph`` (released by DPTransform
        under the same grant; the serving model applies it).
      - ``schema``: optional Channel of type ``Schema``.
      - ``grant``: Channel of type ``SageGrant`` (from SageGate, with a privacy plan).
    Component ``outputs`` contains:
      - ``model``: Channel of type ``Model`` (``Format-Serving`` SavedModel, ``dp_guarantee.json``
        and the ``dp_*`` custom properties).
      - ``model_run``: Channel of type ``ModelRun`` (empty: training metrics of private batches
        are not DP).
    """

    SPEC_CLASS = spec.DPTrainerSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, *, examples: types.BaseChannel, grant: types.BaseChannel,
                 transform_graph: Optional[types.BaseChannel] = None,
                 schema: Optional[types.BaseChannel] = None,
                 module_file: Optional[Union[str, data_types.RuntimeParameter]] = None,
                 model_fn: Optional[Union[str, data_types.RuntimeParameter]] = None,
                 train_args: Optional[trainer_pb2.TrainArgs] = None,
                 eval_args: Optional[trainer_pb2.EvalArgs] = None,
                 custom_config: Optional[Dict[str, Any]] = None,
                 output_scale: float = 1.0, output_offset: float = 0.0,
                 run_fn: Optional[str] = None):
        """Constructs a DPTrainer.

        Args:
          examples: training examples (``train_args.splits``, default ``train``).
          grant: the ``grant`` output of a SageGate whose plan has a ``train`` part.
          transform_graph: the DP Transform's graph; then ``examples`` must be its
            ``transformed_examples`` and the serving model applies the graph to raw examples.
          schema: the raw data schema (feature types without a transform graph).
          module_file: a Python file defining ``model_fn(fn_args)`` (exclusive with model_fn).
          model_fn: dotted path of a model_fn, e.g.
            ``sage_tfx.pipelines.flights_dp_module.model_fn``.
          train_args: ``trainer_pb2.TrainArgs`` with ``splits``; ``num_steps`` must stay unset:
            the DP-SGD steps follow from the plan.
          eval_args: ``trainer_pb2.EvalArgs`` (unused: evaluating on private data is the DP
            validator's job).
          custom_config: a JSON-able dict handed to model_fn.
          output_scale, output_offset: public constants of the serving output
            (``predictions = model output × scale + offset``, e.g. to undo a label scaling the
            transform applied); declared here, in the pipeline, never by the module.
          run_fn: refused: a DPTrainer module has ``model_fn``, not ``run_fn``.

        Raises:
          ValueError: both or neither of module_file / model_fn, a run_fn, train_args.num_steps
            set, a module without model_fn, output constants that are not finite.
        """
        if run_fn:
            preflight.check({preflight.RUN_FN_KEY: run_fn})
        if [bool(module_file), bool(model_fn)].count(True) != 1:
            raise ValueError("Exactly one of 'module_file' or 'model_fn' must be supplied.")
        train_args = train_args or trainer_pb2.TrainArgs()
        if isinstance(train_args, trainer_pb2.TrainArgs) and train_args.num_steps:
            raise ValueError(
                "DPTrainer: leave train_args.num_steps unset; the number of DP-SGD steps follows "
                "from the privacy plan (epochs and batch size, or the charged DpEvent)")
        if not (_dynamic(module_file) or _dynamic(model_fn)):
            preflight.check({spec.MODULE_FILE_KEY: module_file, spec.MODEL_FN_KEY: model_fn,
                             spec.OUTPUT_SCALE_KEY: output_scale,
                             spec.OUTPUT_OFFSET_KEY: output_offset})
        if not _dynamic(custom_config):
            custom_config = executor.check_custom_config(custom_config) or None
        super().__init__(spec=spec.DPTrainerSpec(
            examples=examples,
            transform_graph=transform_graph,
            schema=schema,
            grant=grant,
            train_args=train_args,
            eval_args=eval_args or trainer_pb2.EvalArgs(),
            module_file=module_file,
            model_fn=model_fn,
            custom_config=(custom_config if _dynamic(custom_config)
                           else json_utils.dumps(custom_config)),
            output_scale=float(output_scale),
            output_offset=float(output_offset),
            model=types.Channel(type=standard_artifacts.Model),
            model_run=types.Channel(type=standard_artifacts.ModelRun),
        ))
        if udf_utils.should_package_user_modules():
            # As the stock Trainer: the module file is packaged and found again by module_path.
            udf_utils.add_user_module_dependency(self, spec.MODULE_FILE_KEY, spec.MODULE_PATH_KEY)
