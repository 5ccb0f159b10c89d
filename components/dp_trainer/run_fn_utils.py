"""Helpers for DPTrainer ``run_fn`` authors: the plan's train part, DP-SGD noise, data, export.

The run_fn contract (see ``sage_tfx.components.dp_trainer.component``)::

    from sage_tfx.components.dp_trainer import run_fn_utils as dp

    def run_fn(fn_args):
        columns = dp.columns_from_config(FEATURES)
        data = dp.read_split(fn_args, "train", columns, label_key="y")
        noise_multiplier, run = dp.dpsgd_noise_for(fn_args, data.num_examples, batch_size=256,
                                                   epochs=5, l2_norm_clip=1.0)
        model, trained_steps = dp.train_dpsgd_keras(data.features, data.labels, run,
                                                    layers=..., loss=...)
        dp.export_serving_model(fn_args, model, columns, kinds=data.kinds, label_key="y")
        dp.report_guarantee(fn_args, run, trained_steps=trained_steps)

* The train part comes from ``fn_args.custom_config`` (put there by the executor):
  :func:`train_part`. Spend it with :func:`dpsgd_noise_for` (DP-SGD) or pass its (ε, δ) to
  ``sage_tfx.dp.adassp`` / ``logistic`` (basic parts only).
* Data: :func:`read_split` reads a split's gzip TFRecords of tf.Example into numpy (types are
  inferred by tfx_bsl, absent values become the column's default), and :func:`featurize_tf` does
  the same featurization in TensorFlow for the serving graph, so training and serving agree.
* Export: :func:`export_serving_model` writes a SavedModel to ``fn_args.serving_model_dir`` whose
  ``serving_default`` signature takes serialized *raw* tf.Examples (input ``examples``) and
  returns ``{"predictions": [batch, 1]}``; with a transform graph it runs the TFT layer first (the
  penguin pattern), so stock Pusher / TF Serving / DPModelValidator work unchanged.
* The run_fn must end with :func:`report_guarantee`; the executor verifies the report
  independently and fails the run if it is missing or does not fit the plan.

Nothing here evaluates on the eval split: non-DP eval metrics of the granted data would leak.
Validation is the DP validator's job.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
from tfx.dsl.io import fileio

from sage_tfx.ledger import accounting
from sage_tfx.dp import dpsgd
from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.components.dp_trainer import guarantee as guarantee_lib
# The data helpers live in ``data``; re-exported so a run_fn needs this one module.
from sage_tfx.components.dp_trainer.data import (BYTES, FLOAT, INT, Column, ColumnsSpec,  # noqa: F401
                                                 SplitData, columns_from_config, count_records,
                                                 data_files, featurize, featurize_tf, read_columns,
                                                 read_split, serialized_records)
from sage_tfx.errors import InvalidPrivacyParameterError, MissingGrantError

PREDICTIONS_KEY = "predictions"
SERVING_INPUT_NAME = "examples"


# ---------------------------------------------------------------------------------------------
# The plan's train part, as handed over by the executor.


def _config(fn_args: Any) -> dict:
    config = getattr(fn_args, "custom_config", None) or {}
    if guarantee_lib.TRAIN_PART_CONFIG_KEY not in config:
        raise MissingGrantError(
            "fn_args.custom_config carries no privacy plan part: this run_fn must run under "
            "sage_tfx.components.dp_trainer.DPTrainer (with a SageGrant), not the stock Trainer")
    return config


def train_part(fn_args: Any) -> plan_lib.PlanPart:
    """The plan's ``train`` part this run may spend ((ε, δ) basic, or a DpEvent rdp).

    Raises:
      MissingGrantError: not run by DPTrainer.
    """
    return plan_lib.PlanPart.from_dict(_config(fn_args)[guarantee_lib.TRAIN_PART_CONFIG_KEY])


def grant_id(fn_args: Any) -> str:
    """The id of the grant that charged the train part."""
    return str(_config(fn_args)[guarantee_lib.GRANT_ID_CONFIG_KEY])


def report_delta(fn_args: Any) -> Optional[float]:
    """rdp parts: the δ at which the run's ε is reported (None for basic parts)."""
    value = _config(fn_args).get(guarantee_lib.REPORT_DELTA_CONFIG_KEY)
    return None if value is None else float(value)


def num_train_records(fn_args: Any) -> Optional[int]:
    """Records the executor counted in the train split(s)."""
    value = _config(fn_args).get(guarantee_lib.NUM_TRAIN_RECORDS_CONFIG_KEY)
    return None if value is None else int(value)


def dpsgd_noise_for(fn_args: Any, num_examples: int, batch_size: int, epochs: float, *,
                    l2_norm_clip: float, accountant: str = dpsgd.RDP
                    ) -> tuple[float, guarantee_lib.DPSGDRun]:
    """The DP-SGD noise multiplier that spends the plan's train part, with the full run settings.

    * basic part: σ calibrated from the REAL ``num_examples``, ``batch_size`` and ``epochs``
      (``sage_tfx.dp.dpsgd.calibrate_noise_multiplier``, ``accountant``).
    * rdp part: the event fixes σ, the sampling probability q and the steps T;
      ``batch_size`` / ``epochs`` / ``accountant`` are ignored, the batch size is
      ``round(q · num_examples)`` (reported; training samples each example with q itself) and
      exactly T steps must run. Events of any other shape are refused.

    Args:
      fn_args: The run_fn's FnArgs.
      num_examples: The number of examples the model will train on.
      batch_size: Examples per step (basic parts).
      epochs: Passes over the data (basic parts; may be fractional).
      l2_norm_clip: Per-example gradient clipping norm.
      accountant: ``"rdp"`` or ``"pld"`` (basic parts).

    Returns:
      ``(noise_multiplier, run)``; train with ``run.batch_size`` for exactly ``run.steps`` steps
      (:func:`train_dpsgd_keras` does) and report ``run``.

    Raises:
      GuaranteeMismatchError, InvalidPrivacyParameterError: a part the run cannot spend.
    """
    records = num_train_records(fn_args)
    if records is not None and num_examples > records:
        raise InvalidPrivacyParameterError(
            f"num_examples={num_examples} exceeds the {records} records of the train split")
    run = guarantee_lib.dpsgd_run_for_part(
        train_part(fn_args), num_examples=num_examples, batch_size=batch_size, epochs=epochs,
        l2_norm_clip=l2_norm_clip, accountant=accountant, report_delta=report_delta(fn_args))
    return run.noise_multiplier, run


def basic_budget(fn_args: Any, algorithm: str) -> tuple[float, float]:
    """(ε, δ) of a basic train part, for the numpy algorithms (AdaSSP, logistic regression).

    Raises:
      InvalidPrivacyParameterError: an rdp part — ``sage_tfx.dp.adassp`` / ``logistic``
        calibrate σ from (ε, δ) and cannot run with a given σ, so they cannot spend an rdp event
        exactly; or a part with δ = 0 (both need δ > 0).
    """
    part = train_part(fn_args)
    if part.mode != accounting.BASIC:
        raise InvalidPrivacyParameterError(
            f"{algorithm} can only spend a basic (epsilon, delta) train part; this plan's train "
            f"part is the DpEvent {part.event}. Use DP-SGD for rdp streams.")
    if not part.delta:
        raise InvalidPrivacyParameterError(
            f"the plan's train part has delta={part.delta!r}; {algorithm} uses Gaussian noise "
            "and needs delta > 0")
    return float(part.epsilon), float(part.delta)


def report_guarantee(fn_args: Any, guarantee: Any, *, algorithm: Optional[str] = None,
                     trained_steps: Optional[int] = None, num_examples: Optional[int] = None,
                     **extra: Any) -> dict:
    """Reports the DP guarantee the run_fn actually used; the last call of every run_fn.

    Writes ``dp_guarantee.json`` into the Model artifact. The executor re-derives ε from the
    reported parameters with dp_accounting and fails the component unless it fits the plan's
    train part (see ``guarantee.verify_report``).

    Args:
      fn_args: The run_fn's FnArgs.
      guarantee: A ``DPSGDRun`` (from :func:`dpsgd_noise_for`), a ``sage_tfx.dp.dpsgd.DPGuarantee``,
        an ``AdaSSPResult`` or a ``DPLogisticResult``.
      algorithm: Overrides the inferred algorithm name.
      trained_steps: DP-SGD: the optimizer steps that actually ran (required for DP-SGD).
      num_examples: Examples trained on, if the guarantee does not carry it (AdaSSP).
      **extra: JSON-able facts to keep in the report.

    Returns:
      The report written.
    """
    report = guarantee_lib.report_from(guarantee, algorithm=algorithm,
                                       trained_steps=trained_steps,
                                       num_examples=num_examples, **extra)
    path = _config(fn_args)[guarantee_lib.GUARANTEE_PATH_CONFIG_KEY]
    with fileio.open(path, "w") as f:
        f.write(json.dumps(report, sort_keys=True, indent=1))
    return report


def per_example_losses(model: Any, loss: Any, features: Any, labels: Any) -> np.ndarray:
    """``loss`` (a ``tf.keras.losses.Loss``) of every example, unreduced, as float64."""
    x = np.asarray(features, dtype=np.float32)
    y = np.asarray(labels, dtype=np.float32)
    if y.ndim == 1:
        y = y[:, None]
    unreduced = type(loss).from_config({**loss.get_config(), "reduction": "none"})
    return np.asarray(unreduced(y, model.predict(x, verbose=0, batch_size=1024)),
                      dtype=np.float64).reshape(len(x))


def report_membership_inference(fn_args: Any, model: Any, loss: Any, train: tuple,
                                heldout: tuple) -> dict:
    """Writes the loss-threshold membership-inference audit into the Model artifact.

    ``membership_inference.json`` (next to ``dp_guarantee.json``): AUC and attacker advantage of
    ``sage_tfx.dp.audit.membership_inference`` on ``train`` vs ``heldout`` ((features, labels)
    each). The DPModelValidator shows it. NOT differentially private: computed from the private
    training rows, it is an audit for the data owner and is not charged to the ledger; a run_fn
    writes it only when its configuration asks for it.

    Returns:
      The report written.
    """
    from sage_tfx.dp import audit
    result = audit.membership_inference(per_example_losses(model, loss, *train),
                                        per_example_losses(model, loss, *heldout))
    report = result.to_dict()
    directory = os.path.dirname(_config(fn_args)[guarantee_lib.GUARANTEE_PATH_CONFIG_KEY])
    with fileio.open(os.path.join(directory, guarantee_lib.MEMBERSHIP_FILE_NAME), "w") as f:
        f.write(json.dumps(report, sort_keys=True, indent=1))
    return report


# ---------------------------------------------------------------------------------------------
# Training.


def train_dpsgd_keras(features: Any, labels: Any, run: guarantee_lib.DPSGDRun, *, layers: Any,
                      loss: Any, optimizer: Any = None, learning_rate: float = 0.01,
                      metrics: Optional[Sequence[Any]] = None, seed: Optional[int] = None
                      ) -> tuple[Any, int]:
    """Trains a ``PoissonDPSequential`` (fast clipping) for exactly ``run.steps`` DP-SGD steps.

    Poisson-sampled batches (every example independently with ``q = run.sampling_probability``,
    the accounted q), the
    clipped-gradient sum plus noise ``run.noise_multiplier · run.l2_norm_clip`` divided by the
    expected batch size (``sage_tfx.dp.keras_dpsgd.make_poisson_dp_model``): exactly the
    ``PoissonSampledDpEvent`` the run is charged. Keras prints nothing and no training metric is
    written anywhere: they are not DP.

    Args:
      features: (n, d) float array with n == ``run.num_examples``.
      labels: (n,) or (n, k) array.
      run: From :func:`dpsgd_noise_for`.
      layers, loss, optimizer, learning_rate, metrics: As in
        ``keras_dpsgd.make_dp_keras_model`` / ``compile_dp``.
      seed: Seeds the initial weights only; the noise and sampling always use OS entropy.

    Returns:
      ``(model, trained_steps)``, trained_steps == run.steps.
    """
    from sage_tfx.dp import keras_dpsgd
    x = np.asarray(features, dtype=np.float32)
    y = np.asarray(labels, dtype=np.float32)
    if y.ndim == 1:
        y = y[:, None]  # per-example loss of shape [batch], as fast clipping requires
    if x.ndim != 2 or x.shape[0] != run.num_examples or y.shape[0] != run.num_examples:
        raise ValueError(f"features {x.shape} / labels {y.shape} do not have the "
                         f"{run.num_examples} rows the DP-SGD run was accounted for")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("features or labels contain NaN or infinite values")
    if seed is not None:
        tf.keras.utils.set_random_seed(int(seed))
    q = run.sampling_probability  # the accounted q itself (rdp: the plan's, not batch / n)
    model = keras_dpsgd.make_poisson_dp_model(layers, input_shape=x.shape[1:],
                                              l2_norm_clip=run.l2_norm_clip,
                                              noise_multiplier=run.noise_multiplier,
                                              expected_batch_size=q * run.num_examples)
    keras_dpsgd.compile_dp(model, loss=loss, optimizer=optimizer, learning_rate=learning_rate,
                           metrics=metrics)
    batches = keras_dpsgd.poisson_batches(x, y, q, run.steps)
    model.fit(batches, epochs=1, verbose=0)
    trained = int(model.optimizer.iterations.numpy())
    if trained != run.steps:
        raise RuntimeError(f"DP-SGD ran {trained} steps but {run.steps} were accounted")
    return model, trained


# ---------------------------------------------------------------------------------------------
# Export.


def plain_keras_copy(model: Any) -> Any:
    """A plain ``tf.keras.Sequential`` with ``model``'s layers and weights (no DP training step).

    The exported model carries no TF Privacy code; predictions are identical (post-processing).
    """
    layers = [type(layer).from_config(layer.get_config()) for layer in model.layers]
    plain = tf.keras.Sequential([tf.keras.Input(shape=model.input_shape[1:]), *layers])
    plain.set_weights(model.get_weights())
    return plain


def linear_keras_model(weights: Any, *, bias: float = 0.0,
                       activation: Optional[str] = None) -> Any:
    """A Keras ``x @ weights + bias`` (then ``activation``) model of a numpy linear model."""
    w = np.asarray(weights, dtype=np.float32).reshape(-1, 1)
    model = tf.keras.Sequential([tf.keras.Input(shape=(w.shape[0],)),
                                 tf.keras.layers.Dense(1, activation=activation)])
    model.layers[-1].set_weights([w, np.array([bias], dtype=np.float32)])
    return model


_TF_DTYPES = {INT: tf.int64, FLOAT: tf.float32, BYTES: tf.string}


def _schema_kinds(schema_path: Optional[str]) -> dict:
    if not schema_path:
        return {}
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx.utils import io_utils
    schema = io_utils.parse_pbtxt_file(schema_path, schema_pb2.Schema())
    names = {schema_pb2.INT: INT, schema_pb2.FLOAT: FLOAT, schema_pb2.BYTES: BYTES}
    return {f.name: names.get(f.type) for f in schema.feature}


def export_serving_model(fn_args: Any, model: Any, columns: Sequence[Column], *,
                         kinds: Optional[Mapping[str, Optional[str]]] = None,
                         label_key: Optional[str] = None,
                         output_scale: float = 1.0, output_offset: float = 0.0) -> str:
    """Saves ``model`` with a tf.Example ``serving_default`` signature to serving_model_dir.

    ``serving_default(examples: string [batch]) -> {"predictions": float32 [batch, 1]}``:
    parse the raw features, run the TFT layer if ``fn_args`` has a transform graph (penguin
    pattern: ``model.tft_layer = tf_transform_output.transform_features_layer()``), featurize the
    columns like training did (:func:`featurize_tf`), apply the model, then
    ``* output_scale + output_offset`` (to undo a label scaling).

    Args:
      fn_args: The run_fn's FnArgs (serving_model_dir, transform_graph_path, schema_path).
      model: A Keras model taking [batch, len(columns)] float32; a TF Privacy ``DPSequential``
        is exported as its :func:`plain_keras_copy`.
      columns: The model's input columns (transformed names with a transform graph).
      kinds: Raw feature kinds without a transform graph (``SplitData.kinds``); the schema's
        types win when ``fn_args`` has a schema; unknown kinds parse as float.
      label_key: Raw label feature, removed from the parsing spec (serving requests lack it).
      output_scale, output_offset: Affine map of the model output (public constants).

    Returns:
      The serving model directory.
    """
    if "tensorflow_privacy" in type(model).__module__ and isinstance(model, tf.keras.Sequential):
        model = plain_keras_copy(model)  # DPSequential's class is DPModelClass
    transform_path = getattr(fn_args, "transform_graph_path", None) or getattr(
        fn_args, "transform_output", None)
    if transform_path:
        import tensorflow_transform as tft
        tf_transform_output = tft.TFTransformOutput(transform_path)
        model.tft_layer = tf_transform_output.transform_features_layer()
        raw_spec = dict(tf_transform_output.raw_feature_spec())
        if label_key:
            raw_spec.pop(label_key, None)
    else:
        known = dict(kinds or {})
        known.update({k: v for k, v in _schema_kinds(getattr(fn_args, "schema_path", None))
                      .items() if v is not None})
        raw_spec = {}
        for c in columns:
            kind = known.get(c.name) or FLOAT
            if kind == BYTES:
                raise ValueError(f"feature {c.name!r} holds strings; transform it first")
            raw_spec[c.name] = tf.io.VarLenFeature(_TF_DTYPES[kind])
    scale = float(output_scale)
    offset = float(output_offset)
    columns = tuple(columns)

    @tf.function(input_signature=[tf.TensorSpec(shape=[None], dtype=tf.string,
                                                name=SERVING_INPUT_NAME)])
    def serve_tf_examples_fn(serialized):
        parsed = tf.io.parse_example(serialized, raw_spec)
        features = model.tft_layer(parsed) if transform_path else parsed
        x = featurize_tf(features, columns, batch=tf.shape(serialized)[0])
        out = tf.cast(model(x), tf.float32)
        out = tf.reshape(out, [-1, 1])
        if scale != 1.0 or offset != 0.0:
            out = out * scale + offset
        return {PREDICTIONS_KEY: out}

    signatures = {"serving_default": serve_tf_examples_fn.get_concrete_function()}
    model.save(fn_args.serving_model_dir, save_format="tf", signatures=signatures)
    return fn_args.serving_model_dir
