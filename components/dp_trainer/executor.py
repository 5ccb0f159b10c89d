"""DPTrainer executor: trains the module's architecture with DP-SGD under the plan's train part
and writes the Model itself.

Sage §3.1 (List. 1): training is one DP stage of the pipeline; it may spend only the ``train``
part of the privacy plan the gate charged. The executor

1. reads the plan from the SageGrant (``plan_io.read_plan``: the grant must be released and the
   plan's cost must equal the charge) and its ``train`` part — no grant, a denial or a plan without
   a train part raise ``MissingGrantError`` before any data is touched; the configuration is
   checked (``preflight.check``) and the transform graph must be the one DPTransform released
   under this grant (its tree digest, recorded in the ledger);
2. runs the module's ``model_fn`` in a child process (``model_fn_runner``) and checks what it
   returned (``model_fn.parse_training_spec``, ``architecture.py``): a stock-Keras architecture,
   loss, optimizer and DP-SGD settings, or AdaSSP's bounds;
3. DP-SGD: counts the labelled examples and builds the Poisson batches in Beam
   (``batching.py``), plans the run for the part (``guarantee.dpsgd_run_for_part``: σ, q, T and
   the maximum batch size B with its truncation δ), rebuilds the model with fresh weights and
   trains it step by step (``loop.py``), counting the noisy updates inside the update itself.
   AdaSSP: the clipped moments XᵀX, Xᵀy summed in Beam, then the three Gaussian releases;
4. verifies what ran against the part with dp_accounting (``guarantee.verify_record``: T
   updates, every step id once, noise std σ·C, non-trainable weights untouched), writes the
   serving SavedModel (``export.py``) and refuses it unless it holds only the DP-trained weights,
   the transform graph and the declared output constants (``export.check_export``).

Released once (``release_io.release_artifact_once``, name :data:`RELEASE_NAME` =
``train/model``, the part claimed for DPTrainer): steps 2-4 write the Model directory (serving
model, verified record, the Model's properties) into a staging directory that is recorded
against the grant with the run's request (:func:`release_request`) before it becomes the Model
artifact's contents. A retried or re-run execution under the same grant gets the recorded Model
byte for byte without reading an example or training; another request under the grant — or
another trainer under the same train part — is refused (``ReleaseConflictError``). A failed
attempt records nothing but the part's claim and publishes nothing.
"""
from __future__ import annotations

import json
import math
import os
import uuid
from typing import Any, Dict, List, Optional

from absl import logging
from tfx import types
from tfx.components.trainer import executor as trainer_executor
from tfx.dsl.components.base import base_beam_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils

from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.components import artifacts, plan_io, release_io
from sage_tfx.components.block_example_gen.spec import GRANT_ID_PROPERTY as EXAMPLES_GRANT_ID
from sage_tfx.components.dp_trainer import guarantee as guarantee_lib
from sage_tfx.components.dp_trainer import model_fn as model_fn_lib
from sage_tfx.components.dp_trainer import preflight
from sage_tfx.components.dp_trainer import spec
from sage_tfx.errors import InvalidRequestError, MissingGrantError
from sage_tfx.ledger import accounting, open_ledger, releases

# Plan-part param naming the δ at which an rdp part's ε is reported.
REPORT_DELTA_PARAM = "delta"
COMPONENT = "DPTrainer"
# The DP Trainer's release: the Model directory (serving model, verified record, properties),
# once per grant, keyed by the plan part it spends ("train/model"); the part is claimed for
# DPTrainer, so no other trainer spends it again.
RELEASE_NAME = releases.part_release_name(plan_lib.TRAIN, "model")
PROPERTIES_FILE_NAME = "dp_model_properties.json"
SERVING_DIR = "Format-Serving"
# How model_fn's process was kept from the data ("landlock-abi<N>", or "none").
ISOLATION_PROPERTY = "dp_model_fn_isolation"   # tfx.utils.path_utils.serving_model_dir's layout
# The transform graph DPTransform releases under the grant (checked before it is served).
TRANSFORM_RELEASE = releases.part_release_name(plan_lib.TRANSFORM, "transform_graph")


def check_custom_config(custom_config: Any) -> dict:
    """Returns the user's custom_config (a dict, maybe empty).

    Raises:
      InvalidRequestError: not a dict.
    """
    if custom_config is None:
        return {}
    if not isinstance(custom_config, dict):
        raise InvalidRequestError(
            f"custom_config must be a dict, got {type(custom_config).__name__}")
    return dict(custom_config)


def _single_grant(input_dict: Dict[str, List[types.Artifact]]) -> types.Artifact:
    grants = input_dict.get(spec.GRANT_INPUT_KEY) or []
    if len(grants) != 1:
        raise MissingGrantError(
            f"DPTrainer needs exactly one SageGrant in '{spec.GRANT_INPUT_KEY}' (from SageGate), "
            f"got {len(grants)}: no privacy budget was charged for training")
    return grants[0]


def _check_examples_grant(examples: List[types.Artifact], grant_id: str) -> None:
    """Examples that record a grant (BlockExampleGen's) must record this one."""
    for artifact in examples:
        if artifact.has_custom_property(EXAMPLES_GRANT_ID):
            recorded = artifact.get_string_custom_property(EXAMPLES_GRANT_ID)
            if recorded and recorded != grant_id:
                raise MissingGrantError(
                    f"the examples were read under grant {recorded}, but the plan to spend is "
                    f"grant {grant_id}'s: train on the blocks of the grant that charged training")


def report_delta_for(part: plan_lib.PlanPart, grant_artifact: types.Artifact,
                     stream: str) -> Optional[float]:
    """δ at which ε of an rdp train part is reported: the part's ``delta`` param, else δ_g.

    δ_g is the stream's global δ (the δ of the ledger's RDP filter), read from the ledger the
    grant artifact names. None for basic parts (their δ is the part's own).

    Raises:
      MissingGrantError: an rdp part without a delta param whose ledger cannot be read.
    """
    if part.mode != accounting.RDP:
        return None
    value = part.param(REPORT_DELTA_PARAM)
    if value is not None:
        return accounting.check_delta(value, f"train part param {REPORT_DELTA_PARAM}",
                                      allow_zero=False)
    url = grant_artifact.ledger_url
    if not url:
        raise MissingGrantError(
            "an rdp train part needs a delta to report epsilon at: give the plan part a "
            f"({REPORT_DELTA_PARAM!r}, delta) param, or a grant that names its ledger")
    with open_ledger(url) as ledger:
        return float(ledger.stream(stream).delta_g)


def check_transform_graph(ledger, grant_id: str, uri: str) -> str:
    """The transform graph must be the tree DPTransform released under this grant.

    The serving model embeds the graph: a graph of exact statistics (the stock Transform), or
    one changed after its release, would publish what the grant did not pay for.

    Returns:
      The graph's tree digest.

    Raises:
      MissingGrantError: no such release under the grant, or another tree.
    """
    rec = ledger.recorded_release(grant_id, TRANSFORM_RELEASE)
    if rec is None:
        raise MissingGrantError(
            f"the transform graph {uri} was not released under grant {grant_id} "
            f"({TRANSFORM_RELEASE!r}): DPTrainer serves only a DPTransform graph of its own grant")
    digest = release_io.tree_digest(uri)
    if digest != rec.digest:
        raise MissingGrantError(
            f"the transform graph {uri} is not the tree released under grant {grant_id} "
            f"(sha256 {digest[:16]}… vs recorded {rec.digest[:16]}…): it changed after release")
    return digest


def _write_json(path: str, value: Any) -> None:
    with fileio.open(path, "w") as f:
        f.write(json.dumps(value, sort_keys=True, indent=1))


def set_model_properties(model: types.Artifact, properties: dict) -> None:
    """Records a verified guarantee's properties (``model_properties()``) on the Model."""
    for key, value in properties.items():
        if isinstance(value, bool):
            model.set_int_custom_property(key, int(value))
        elif isinstance(value, int):
            model.set_int_custom_property(key, value)
        elif isinstance(value, float):
            model.set_float_custom_property(key, value)
        else:
            model.set_string_custom_property(key, str(value))


def release_request(part: plan_lib.PlanPart, config: dict,
                    exec_properties: Dict[str, Any]) -> dict:
    """What a DPTrainer run was asked, recorded with its release: a replay must ask the same.

    The examples and the transform graph are the grant's (fixed by the grant); the rest is the
    train part, the user's custom_config, the module (its file's digest, or its import path),
    the declared output constants and the train args.
    """
    module_file = exec_properties.get(spec.MODULE_FILE_KEY)
    module = (release_io.file_digest(module_file)
              if module_file and os.path.isfile(module_file) else module_file)
    return {"train_part": part.to_dict(), "custom_config": config, "module": module,
            "module_path": exec_properties.get(spec.MODULE_PATH_KEY),
            "model_fn": exec_properties.get(spec.MODEL_FN_KEY),
            "output_scale": exec_properties.get(spec.OUTPUT_SCALE_KEY),
            "output_offset": exec_properties.get(spec.OUTPUT_OFFSET_KEY),
            "train_args": exec_properties.get(spec.TRAIN_ARGS_KEY)}


class Executor(trainer_executor.GenericExecutor, base_beam_executor.BaseBeamExecutor):
    """Trains the module's architecture with DP-SGD (or AdaSSP) and writes the DP Model."""

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        """Trains privately under the plan's train part; records and releases the Model once.

        Args:
          input_dict: ``examples``, optional ``transform_graph`` / ``schema``, ``grant``.
          output_dict: ``model``, ``model_run``.
          exec_properties: the Trainer's (train_args, eval_args, module_file / module_path),
            ``model_fn``, ``custom_config``, ``output_scale`` / ``output_offset``.

        Raises:
          MissingGrantError: no / denied / mismatched grant, no train part in the plan, or a
            transform graph the grant did not release.
          TrainerConfigError, ModelFnError, ArchitectureError: a configuration, module or
            model the trainer will not train.
          UnverifiedTrainingError, GuaranteeMismatchError: what ran does not fit the part, or
            the export holds something else than the DP model.
          ReleaseConflictError: the grant released another model, or another trainer spends
            the train part.
        """
        self._log_startup(input_dict, output_dict, exec_properties)
        grant_artifact = _single_grant(input_dict)
        plan = plan_io.read_plan(grant_artifact)
        grant = artifacts.read_grant(grant_artifact)
        part = plan.part(plan_lib.TRAIN)
        _check_examples_grant(input_dict.get(spec.EXAMPLES_KEY) or [], grant.grant_id)
        preflight.check(exec_properties)
        report_delta = report_delta_for(part, grant_artifact, grant.stream)

        fn_args = self._GetFnArgs(input_dict, output_dict, exec_properties)
        config = check_custom_config(fn_args.custom_config)
        model_artifact = artifact_utils.get_single_instance(output_dict[spec.MODEL_KEY])
        request = release_request(part, config, exec_properties)
        url = release_io.ledger_url_for(grant_artifact, None, component=COMPONENT)
        with open_ledger(url) as ledger:
            if fn_args.transform_graph_path:
                check_transform_graph(ledger, grant.grant_id, fn_args.transform_graph_path)

            def produce_into(staging: str) -> None:
                _Training(self, fn_args, exec_properties, part, grant.grant_id, config,
                          report_delta, ledger).run(staging)

            out = release_io.release_artifact_once(ledger, grant.grant_id, RELEASE_NAME,
                                                   model_artifact, produce_into,
                                                   request=request, component=COMPONENT,
                                                   part=part.name)
        with fileio.open(os.path.join(model_artifact.uri, PROPERTIES_FILE_NAME), "r") as f:
            properties = json.loads(f.read())
        set_model_properties(model_artifact, properties)
        logging.info("DPTrainer: model %s is (%.6g, %.3g)-DP (%s, grant %s)%s",
                     model_artifact.uri, properties["dp_epsilon"], properties.get("dp_delta", 0),
                     properties.get("dp_algorithm"), grant.grant_id,
                     " (the recorded release, replayed)" if out.replayed else "")


def _feature_spec(fn_args: Any) -> dict:
    """{feature: tf.io spec} of the training examples: the transformed spec, else the schema's."""
    if fn_args.transform_graph_path:
        import tensorflow_transform as tft
        return dict(tft.TFTransformOutput(fn_args.transform_graph_path)
                    .transformed_feature_spec())
    if not fn_args.schema_path:
        raise InvalidRequestError("DPTrainer needs a transform_graph or a schema to parse the "
                                  "training examples")
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tensorflow_transform.tf_metadata import schema_utils
    from tfx.utils import io_utils
    schema = io_utils.parse_pbtxt_file(fn_args.schema_path, schema_pb2.Schema())
    return dict(schema_utils.schema_as_feature_spec(schema).feature_spec)


class _Training:
    """One DPTrainer run's training and export into a staging directory (module doc, 2-4)."""

    def __init__(self, executor: Executor, fn_args: Any, exec_properties: Dict[str, Any],
                 part: plan_lib.PlanPart, grant_id: str, config: dict,
                 report_delta: Optional[float], ledger: Any):
        self.executor, self.fn_args, self.props = executor, fn_args, exec_properties
        self.part, self.grant_id, self.config = part, grant_id, config
        self.report_delta, self.ledger = report_delta, ledger

    def run(self, staging: str) -> None:
        from sage_tfx.components.dp_trainer import adassp_io, export, model_fn_runner
        fn_args = self.fn_args
        args = model_fn_lib.ModelFnArgs(transform_output=fn_args.transform_graph_path,
                                        schema_path=fn_args.schema_path,
                                        custom_config=self.config)
        logging.info("DPTrainer: grant %s, train part %s", self.grant_id, self.part.to_dict())
        data_paths = [os.path.dirname(os.path.dirname(p)) for p in fn_args.train_files]
        data_paths += [os.path.dirname(os.path.dirname(p)) for p in fn_args.eval_files or []]
        data_paths += [fn_args.model_run_dir, os.path.dirname(staging)]
        raw, isolation = model_fn_runner.run_model_fn(self.props, args, data_paths=data_paths)
        if not isolation.get("landlock_abi"):
            logging.warning("DPTrainer: Landlock is not available on this host: model_fn ran "
                            "without filesystem isolation (its architecture's numbers are then "
                            "trusted not to encode the data it could read)")
        feature_spec = _feature_spec(fn_args)
        training = model_fn_lib.parse_training_spec(raw, features=feature_spec.keys())
        scale = float(self.props.get(spec.OUTPUT_SCALE_KEY, 1.0) or 1.0)
        offset = float(self.props.get(spec.OUTPUT_OFFSET_KEY, 0.0) or 0.0)
        work = _private_dir(fn_args.model_run_dir)
        try:
            if training.algorithm == model_fn_lib.DPSGD:
                model, ran, trained, fresh = self._dpsgd(training, feature_spec, work)
                inputs = training.architecture.inputs
                if training.label_bounds is not None:  # trained on the scaled label
                    scale = scale * adassp_io.label_scale(training.label_bounds)
            else:
                model, ran, trained, scale_y = self._adassp(training, work)
                fresh, inputs = [], {name: "float32" for name, _, _ in training.features}
                scale = scale * scale_y
        finally:
            if fileio.exists(work):
                fileio.rmtree(work)
        verified = guarantee_lib.verify_record(
            ran, self.part, grant_id=self.grant_id, report_delta=self.report_delta)
        if fn_args.transform_graph_path:  # unchanged while the module's process ran
            check_transform_graph(self.ledger, self.grant_id, fn_args.transform_graph_path)
        serving = os.path.join(staging, SERVING_DIR)
        drop = set(training.raw_label_keys) | {training.label_key}
        export.save_serving_model(
            model, serving, inputs=inputs,
            raw_spec=export.raw_serving_spec(fn_args.transform_graph_path, feature_spec, drop),
            transform_output=fn_args.transform_graph_path, output_scale=scale,
            output_offset=offset)
        export.check_export(serving, trained=trained, fresh=fresh,
                            transform_output=fn_args.transform_graph_path)
        record = verified.to_dict()
        record["ran"] = ran.to_dict()
        record["train_part"] = self.part.to_dict()
        record["training"] = training.to_dict()
        record["output_scale"], record["output_offset"] = scale, offset
        record["model_fn_isolation"] = isolation
        _write_json(os.path.join(staging, guarantee_lib.GUARANTEE_FILE_NAME), record)
        properties = verified.model_properties()
        properties[ISOLATION_PROPERTY] = (f"landlock-abi{isolation['landlock_abi']}"
                                          if isolation.get("landlock_abi") else "none")
        _write_json(os.path.join(staging, PROPERTIES_FILE_NAME), properties)

    def _beam(self, build) -> None:
        with self.executor._make_beam_pipeline() as pipeline:  # pylint: disable=protected-access
            build(pipeline)

    def _dpsgd(self, training: model_fn_lib.TrainingSpec, feature_spec: dict, work: str):
        import numpy as np

        from sage_tfx.components.dp_trainer import batching, loop, objectives
        files = list(self.fn_args.train_files)
        self._beam(lambda p: batching.count_examples(p, files, training.label_key, work))
        n = batching.read_count(work)
        if n == 0:
            raise InvalidRequestError(f"no training example has the label "
                                      f"{training.label_key!r}")
        run = guarantee_lib.dpsgd_run_for_part(
            self.part, num_examples=n, batch_size=min(training.batch_size, n),
            epochs=training.epochs, l2_norm_clip=training.l2_norm_clip,
            accountant=training.accountant, report_delta=self.report_delta,
            oversize=training.oversize, max_batch_size=training.max_batch_size,
            truncation_share=training.truncation_share)
        batches = os.path.join(work, "batches")
        self._beam(lambda p: batching.write_batches(
            p, files, batches, label_key=training.label_key,
            sampling_probability=run.sampling_probability, steps=run.steps,
            max_batch_size=run.max_batch_size, oversize=run.oversize))
        stats = batching.read_stats(batches)
        if training.seed is not None:  # the initial weights only: noise and sampling never
            import tensorflow as tf
            tf.keras.utils.set_random_seed(training.seed)
        model = training.architecture.build()
        fresh = [np.array(w.numpy()) for w in model.non_trainable_weights]
        dp_loop = loop.DPSGDLoop(
            model, loss=training.loss, optimizer=objectives.build_optimizer(training.optimizer),
            l2_norm_clip=run.l2_norm_clip, noise_multiplier=run.noise_multiplier,
            expected_batch_size=run.sampling_probability * n, max_batch_size=run.max_batch_size)
        logging.info("DPTrainer: DP-SGD, %d steps, q=%.6g, sigma=%.6g, C=%g, B=%d (%s), %s "
                     "clipping", run.steps, run.sampling_probability, run.noise_multiplier,
                     run.l2_norm_clip, run.max_batch_size, run.oversize,
                     "fast (ghost norms)" if dp_loop.fast else "per-example (vectorized)")
        parser = loop.ExampleParser(feature_spec, training.architecture.inputs,
                                    training.label_key, training.label_bounds)
        seen = dp_loop.train(batches, parser, run.steps, progress=loop.log_progress)
        updates, low, high = dp_loop.record.read()
        if seen != set(range(run.steps)) or updates != run.steps:
            raise guarantee_lib.UnverifiedTrainingError(
                f"DP-SGD ran {updates} noisy updates over {len(seen)} step ids, but the plan "
                f"accounts exactly {run.steps} steps")
        std = float(np.float32(run.l2_norm_clip * run.noise_multiplier))
        if not low == high == std:
            raise guarantee_lib.UnverifiedTrainingError(
                f"the DP-SGD updates added noise of std in [{low}, {high}], not "
                f"noise_multiplier × l2_norm_clip = {std}")
        for w, before in zip(model.non_trainable_weights, fresh):
            if not np.array_equal(w.numpy(), before):
                raise guarantee_lib.UnverifiedTrainingError(
                    f"the non-trainable weight {w.name} changed during training: only DP-SGD "
                    "updates may move a weight")
        ran = guarantee_lib.TrainingRecord(
            algorithm=guarantee_lib.DPSGD, noise_multiplier=run.noise_multiplier,
            num_examples=n, accountant=run.accountant, l2_norm_clip=run.l2_norm_clip,
            sampling_probability=run.sampling_probability, steps=updates,
            batch_size=run.batch_size, epochs=run.epochs, max_batch_size=run.max_batch_size,
            oversize=run.oversize, truncated_steps=int(stats["truncated_steps"]))
        trained = [np.array(v.numpy()) for v in model.trainable_variables]
        return model, ran, trained, fresh

    def _adassp(self, training: model_fn_lib.TrainingSpec, work: str):
        import numpy as np

        from sage_tfx.components.dp_trainer import adassp_io
        from sage_tfx.dp import adassp as adassp_lib
        part = self.part
        if part.mode != accounting.BASIC:
            raise guarantee_lib.GuaranteeMismatchError(
                f"AdaSSP can only spend a basic (epsilon, delta) train part; this plan's train "
                f"part is the DpEvent {part.event}. Use DP-SGD for rdp streams.")
        if not part.delta:
            raise guarantee_lib.GuaranteeMismatchError(
                f"the plan's train part has delta={part.delta!r}; AdaSSP uses Gaussian noise "
                "and needs delta > 0")
        files = list(self.fn_args.train_files)
        self._beam(lambda p: adassp_io.moments(p, files, training, work))
        xtx, xty, n = adassp_io.read_moments(work)
        if n == 0:
            raise InvalidRequestError(f"no training example has the label "
                                      f"{training.label_key!r}")
        d = len(training.features) + 1
        result = adassp_lib.adassp_from_moments(
            xtx, xty, epsilon=float(part.epsilon), delta=float(part.delta),
            x_bound=math.sqrt(d), y_bound=1.0,
            rho=adassp_lib.DEFAULT_RHO if training.rho is None else training.rho)
        model = adassp_io.linear_model(training.features, result.weights)
        ran = guarantee_lib.TrainingRecord(
            algorithm=guarantee_lib.ADASSP, noise_multiplier=float(result.noise_multiplier),
            num_examples=int(n), accountant=result.accountant)
        trained = [np.array(v.numpy()) for v in model.trainable_variables]
        return model, ran, trained, adassp_io.label_scale(training.label_bounds)


def _private_dir(model_run_dir: str) -> str:
    """A fresh directory (0700 when local) under the ModelRun for the batches of private data."""
    path = os.path.join(model_run_dir, f".dp-trainer-{uuid.uuid4().hex}")
    if "://" in path:
        fileio.makedirs(path)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkdir(path, 0o700)
    return path


__all__ = ["Executor", "RELEASE_NAME", "check_custom_config", "check_transform_graph",
           "release_request", "report_delta_for"]
