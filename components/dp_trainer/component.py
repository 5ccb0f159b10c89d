"""DPTrainer: the stock TFX Trainer, spending exactly the privacy plan's ``train`` part (Sage §3.1).

Like ``tfx.components.Trainer`` (a module file with ``run_fn(fn_args)``, ``train_args`` /
``eval_args``, optional transform graph and schema), plus a required ``grant`` from SageGate whose
privacy plan has a ``train`` part. Example::

    plan = PrivacyPlan.of(PlanPart("train", 0.5, 1e-7), PlanPart("validate", 0.1))
    # The gate charges plan.cost(); the plan itself is stored in the grant (plan_io.write_plan).
    gate = SageGate(ledger_url=LEDGER, stream="flights", window_last=28, ...)
    example_gen = BlockExampleGen(grant=gate.outputs["grant"])
    trainer = DPTrainer(module_file=MODULE, examples=example_gen.outputs["examples"],
                        grant=gate.outputs["grant"],
                        custom_config={"algorithm": "dpsgd", "epochs": 5, "batch_size": 256})

The run_fn contract (helpers in ``sage_tfx.components.dp_trainer.run_fn_utils``): the run_fn
supplies the model and the data, the executor trains it (Opacus-style: it returns the private
version of the user's model)::

    def run_fn(fn_args):
        training = run_fn_utils.private_training(fn_args)
        data = run_fn_utils.read_split(fn_args, "train", columns, label_key="y")
        model = training.dpsgd(layers, data.features, data.labels, loss=..., batch_size=256,
                               epochs=5, l2_norm_clip=1.0)     # or training.adassp(x, y, ...)
        run_fn_utils.export_serving_model(fn_args, model, columns, kinds=data.kinds)

* ``training.dpsgd`` runs the plan's DP-SGD itself (basic (ε, δ) parts: σ calibrated from the
  real n, batch size and epochs; rdp parts: σ, q and the steps of the charged DpEvent), Poisson
  batches, one example per microbatch (TF Privacy names: ``l2_norm_clip``, ``noise_multiplier``;
  ``num_microbatches`` is always None); ``training.adassp`` runs AdaSSP at a basic part's (ε, δ);
* train only on ``fn_args.train_files``; write no non-DP statistics of the data (no eval
  metrics, no TensorBoard logs of the loss);
* export the model it returned, unchanged, to ``fn_args.serving_model_dir``
  (``export_serving_model``).

The executor verifies the charge from what its loop ran — the noisy steps counted in the training
step, the sampling probability and noise multiplier they used — with dp_accounting, and records on
the Model artifact the custom properties ``dp_epsilon``, ``dp_delta``, ``dp_accounting``
(rdp / pld), ``dp_sampling``, ``dp_num_examples``, ``dp_noise_multiplier``, ``dp_algorithm``
(dpsgd / adassp), ``dp_mode``, ``dp_neighboring_relation``, ``dp_event_json``, ``grant_id``,
``dp_verification`` (``observed``) and, for DP-SGD, ``dp_l2_norm_clip``, ``dp_batch_size``,
``dp_epochs``, ``dp_steps``, ``dp_sampling_probability``. The Model artifact's
``dp_guarantee.json`` holds the same, what ran and the plan part. A run_fn that trains by itself,
trains twice or exports another model than the one trained fails the component, and its model
is deleted.
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
from sage_tfx.components.dp_trainer import spec


def _dynamic(value: Any) -> bool:
    return isinstance(value, data_types.RuntimeParameter) or (
        type(value).__name__ in ("Placeholder", "RuntimeParameter"))


class DPTrainer(base_component.BaseComponent):
    """Trains a model with a user run_fn under the plan's train part; outputs a DP Model.

    Component ``inputs`` contains:
      - ``examples``: Channel of type ``Examples`` (raw, or the Transform's transformed ones).
      - ``transform_graph``: optional Channel of type ``TransformGraph``.
      - ``schema``: optional Channel of type ``Schema``.
      - ``grant``: Channel of type ``SageGrant`` (from SageGate, with a privacy plan).
    Component ``outputs`` contains:
      - ``model``: Channel of type ``Model`` (``Format-Serving`` SavedModel, ``dp_guarantee.json``
        and the ``dp_*`` custom properties).
      - ``model_run``: Channel of type ``ModelRun``.
    """

    SPEC_CLASS = spec.DPTrainerSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, *, examples: types.BaseChannel, grant: types.BaseChannel,
                 transform_graph: Optional[types.BaseChannel] = None,
                 schema: Optional[types.BaseChannel] = None,
                 module_file: Optional[Union[str, data_types.RuntimeParameter]] = None,
                 run_fn: Optional[Union[str, data_types.RuntimeParameter]] = None,
                 train_args: Optional[trainer_pb2.TrainArgs] = None,
                 eval_args: Optional[trainer_pb2.EvalArgs] = None,
                 custom_config: Optional[Dict[str, Any]] = None):
        """Constructs a DPTrainer.

        Args:
          examples: training (``train_args.splits``, default ``train``) and eval examples.
          grant: the ``grant`` output of a SageGate whose plan has a ``train`` part.
          transform_graph: the Transform's graph; then ``examples`` must be its
            ``transformed_examples`` and the serving model applies the graph to raw examples.
          schema: the raw data schema (feature types for the serving signature).
          module_file: a Python file with ``run_fn(fn_args)`` (exclusive with ``run_fn``).
          run_fn: dotted path of a run_fn, e.g.
            ``sage_tfx.pipelines.flights_dp_module.adassp_run_fn``.
          train_args: ``trainer_pb2.TrainArgs`` with ``splits``; ``num_steps`` must stay unset:
            the DP-SGD steps follow from the plan.
          eval_args: ``trainer_pb2.EvalArgs``.
          custom_config: a JSON-able dict for the run_fn (keys starting with ``sage_`` are
            reserved for the plan the executor adds).

        Raises:
          ValueError: both or neither of module_file / run_fn, train_args.num_steps set, or a
            reserved custom_config key.
        """
        if [bool(module_file), bool(run_fn)].count(True) != 1:
            raise ValueError("Exactly one of 'module_file' or 'run_fn' must be supplied.")
        train_args = train_args or trainer_pb2.TrainArgs()
        if isinstance(train_args, trainer_pb2.TrainArgs) and train_args.num_steps:
            raise ValueError(
                "DPTrainer: leave train_args.num_steps unset; the number of DP-SGD steps follows "
                "from the privacy plan (epochs and batch size, or the charged DpEvent)")
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
            run_fn=run_fn,
            custom_config=(custom_config if _dynamic(custom_config)
                           else json_utils.dumps(custom_config)),
            model=types.Channel(type=standard_artifacts.Model),
            model_run=types.Channel(type=standard_artifacts.ModelRun),
        ))
        if udf_utils.should_package_user_modules():
            # As the stock Trainer: the module file is packaged and found again by module_path.
            udf_utils.add_user_module_dependency(self, spec.MODULE_FILE_KEY, spec.MODULE_PATH_KEY)
