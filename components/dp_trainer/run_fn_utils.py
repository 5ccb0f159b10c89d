"""Helpers for DPTrainer ``run_fn`` authors: the executor's privacy loop, data, export.

The run_fn contract (see ``sage_tfx.components.dp_trainer.component``): the run_fn supplies the
model and the data, the executor trains it privately (``private.PrivateTraining``)::

    from sage_tfx.components.dp_trainer import run_fn_utils as dp

    def run_fn(fn_args):
        training = dp.private_training(fn_args)     # the executor's loop for this run
        columns = dp.columns_from_config(FEATURES)
        data = dp.read_split(fn_args, "train", columns, label_key="y")
        model = training.dpsgd(layers, data.features, data.labels, loss=..., batch_size=256,
                               epochs=5, l2_norm_clip=1.0)   # or training.adassp(...)
        dp.export_serving_model(fn_args, model, columns, kinds=data.kinds, label_key="y")

* The executor trains: :meth:`PrivateTraining.dpsgd` runs the plan's DP-SGD steps (Poisson
  sampling, σ and q from the plan's train part) and counts them inside the training step;
  :meth:`PrivateTraining.adassp` runs AdaSSP at the part's (ε, δ). The charge is verified from
  what ran, and the exported model must be the one trained. A run_fn that trains by itself is
  refused and its model not published; reporting (:func:`report_guarantee`) is optional and
  only checked against what ran.
* Data: :func:`read_split` reads a split's gzip TFRecords of tf.Example into numpy (types are
  inferred by tfx_bsl, absent values become the column's default), and :func:`featurize_tf` does
  the same featurization in TensorFlow for the serving graph, so training and serving agree.
* Export: :func:`export_serving_model` writes a SavedModel to ``fn_args.serving_model_dir`` whose
  ``serving_default`` signature takes serialized *raw* tf.Examples (input ``examples``) and
  returns ``{"predictions": [batch, 1]}``; with a transform graph it runs the TFT layer first (the
  penguin pattern), so stock Pusher / TF Serving / DPModelValidator work unchanged.

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

from sage_tfx.dp import dpsgd
from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.components.dp_trainer import guarantee as guarantee_lib
from sage_tfx.components.dp_trainer import private
# The data helpers live in ``data``; re-exported so a run_fn needs this one module.
from sage_tfx.components.dp_trainer.data import (BYTES, FLOAT, INT, Column, ColumnsSpec,  # noqa: F401
                                                 SplitData, columns_from_config, count_records,
                                                 data_files, featurize, featurize_tf, read_columns,
                                                 read_split, serialized_records)
from sage_tfx.errors import MissingGrantError

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


def private_training(fn_args: Any) -> private.PrivateTraining:
    """The executor's privacy loop of this run: train the model with it.

    Returns:
      The ``PrivateTraining`` whose ``dpsgd(layers, features, labels, ...)`` /
      ``adassp(features, labels, ...)`` train privately, spending the plan's train part.

    Raises:
      MissingGrantError: not run by DPTrainer.
    """
    _config(fn_args)
    return private.current()


def dpsgd_noise_for(fn_args: Any, num_examples: int, batch_size: int, epochs: float, *,
                    l2_norm_clip: float, accountant: str = dpsgd.DEFAULT_ACCOUNTANT
                    ) -> tuple[float, guarantee_lib.DPSGDRun]:
    """The DP-SGD noise multiplier that spends the plan's train part, with the full run settings.

    Planning only (``PrivateTraining.plan_dpsgd``): the executor's loop trains with exactly these
    settings (``private_training(fn_args).dpsgd(...)``).

    * basic part: σ calibrated from the REAL ``num_examples``, ``batch_size`` and ``epochs``
      (``sage_tfx.dp.dpsgd.calibrate_noise_multiplier``, ``accountant``).
    * rdp part: the event fixes σ, the sampling probability q and the steps T;
      ``batch_size`` / ``epochs`` / ``accountant`` are ignored, the batch size is
      ``round(q · num_examples)`` (nominal; training samples each example with q itself).
      Events of any other shape are refused.

    Args:
      fn_args: The run_fn's FnArgs.
      num_examples: The number of examples the model will train on.
      batch_size: Examples per step (basic parts).
      epochs: Passes over the data (basic parts; may be fractional).
      l2_norm_clip: Per-example gradient clipping norm.
      accountant: ``"pld"`` (default) or ``"rdp"`` (basic parts).

    Returns:
      ``(noise_multiplier, run)``.

    Raises:
      GuaranteeMismatchError, InvalidPrivacyParameterError: a part the run cannot spend.
    """
    run = private_training(fn_args).plan_dpsgd(
        num_examples, batch_size=batch_size, epochs=epochs, l2_norm_clip=l2_norm_clip,
        accountant=accountant)
    return run.noise_multiplier, run


def report_guarantee(fn_args: Any, guarantee: Any, *, algorithm: Optional[str] = None,
                     trained_steps: Optional[int] = None, num_examples: Optional[int] = None,
                     **extra: Any) -> dict:
    """Optionally states the DP guarantee the run_fn believes it used (kept beside the record).

    Never accounted: the executor verifies what its own loop ran. Every fact stated here
    (σ, steps, q, n, clip) must agree with it, or the run fails (``guarantee.check_report``).

    Args:
      fn_args: The run_fn's FnArgs.
      guarantee: A ``DPSGDRun`` (from :func:`dpsgd_noise_for`), a
        ``sage_tfx.dp.dpsgd.DPGuarantee`` or an ``AdaSSPResult``.
      algorithm: Overrides the inferred algorithm name.
      trained_steps: DP-SGD: the steps the run_fn believes ran.
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
    """``private_training(fn_args).dpsgd(...)`` with the batch size, epochs, clip and accountant
    of ``run`` (from :func:`dpsgd_noise_for`), for run_fns written before the executor owned
    the loop.

    Returns:
      ``(model, steps)``: the trained private model and the noisy steps its loop ran.
    """
    training = private.current()
    model = training.dpsgd(layers, features, labels, loss=loss, batch_size=run.batch_size,
                           epochs=run.epochs, l2_norm_clip=run.l2_norm_clip,
                           optimizer=optimizer, learning_rate=learning_rate,
                           accountant=run.accountant, metrics=metrics, seed=seed)
    return model, training.record().steps


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
    if isinstance(model, tf.keras.Sequential) and any(
            "tensorflow_privacy" in c.__module__ for c in type(model).__mro__):
        # A DPSequential (our PoissonDPSequential too) carries its training state: the noise
        # generator (whose key and counter would regenerate every noise draw), the optimizer,
        # non-DP training metrics. The plain copy carries the weights only.
        model = plain_keras_copy(model)
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
