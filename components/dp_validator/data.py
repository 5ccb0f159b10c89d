"""DPModelValidator's data side: per-example values, the eval split's files and the serving model.

Per-example losses or correctness (numpy; NaN marks a value that cannot be computed and counts as
the worst one), the Examples files of the eval split, and a SavedModel's predictions on them.
"""
from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
from tfx import types
from tfx.components.util import examples_utils
from tfx.dsl.io import fileio
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils

from sage_tfx.components.dp_validator import spec

_GZIP_FILE_FORMAT = "tfrecords_gzip"  # ExampleGen's default output (examples_utils)


def per_example_values(metric: str, loss_fn: Optional[str], labels: np.ndarray,
                       predictions: np.ndarray) -> np.ndarray:
    """Per-example losses (metric ``loss``) or correctness in {0, 1} (metric ``accuracy``).

    * ``squared_error``: (p − y)²; ``absolute_error``: |p − y|;
    * ``log_loss``: −(y·ln p + (1 − y)·ln(1 − p)) with 0·ln 0 = 0, for a probability
      p ∈ [0, 1] and a label y ∈ [0, 1] (NaN outside);
    * ``accuracy``: 1 if (p > 0.5) equals (y == 1) for a label y ∈ {0, 1}, NaN for other labels.

    NaN (an unknown label, a NaN prediction) is the worst value for the validators: they clip it
    to B (a loss) or count it as wrong (accuracy).

    Args:
      metric: "loss" or "accuracy".
      loss_fn: one of ``spec.LOSS_FNS`` for metric "loss".
      labels: 1-D float labels (NaN where missing).
      predictions: 1-D float predictions.

    Returns:
      A 1-D float64 array, one value per example.
    """
    y = np.asarray(labels, dtype=np.float64)
    p = np.asarray(predictions, dtype=np.float64)
    if y.shape != p.shape or y.ndim != 1:
        raise ValueError(f"labels {y.shape} and predictions {p.shape} must be 1-D and aligned")
    with np.errstate(all="ignore"):
        if metric == spec.ACCURACY:
            valid = ((y == 0.0) | (y == 1.0)) & np.isfinite(p)
            correct = ((p > spec.ACCURACY_THRESHOLD) == (y == 1.0)).astype(np.float64)
            return np.where(valid, correct, np.nan)
        if loss_fn == spec.SQUARED_ERROR:
            return np.square(p - y)
        if loss_fn == spec.ABSOLUTE_ERROR:
            return np.abs(p - y)
        if loss_fn == spec.LOG_LOSS:
            valid = (y >= 0.0) & (y <= 1.0) & (p >= 0.0) & (p <= 1.0)
            pos = np.where(y > 0.0, y * np.log(np.where(valid, p, 1.0)), 0.0)
            neg = np.where(y < 1.0, (1.0 - y) * np.log(np.where(valid, 1.0 - p, 1.0)), 0.0)
            return np.where(valid, -(pos + neg), np.nan)
    raise ValueError(f"unknown metric {metric!r} / loss_fn {loss_fn!r}")


def label_values(serialized: Sequence[bytes], label_key: str) -> np.ndarray:
    """The label of each serialized tf.Example: its single int64 or float value, NaN otherwise."""
    from tensorflow.core.example import example_pb2
    out = np.full(len(serialized), np.nan, dtype=np.float64)
    example = example_pb2.Example()
    for i, record in enumerate(serialized):
        example.ParseFromString(record)
        feature = example.features.feature.get(label_key)
        if feature is None:
            continue
        kind = feature.WhichOneof("kind")
        if kind in ("float_list", "int64_list"):
            values = getattr(feature, kind).value
            if len(values) == 1:
                out[i] = float(values[0])
    return out


# ---------------------------------------------------------------------------------------------
# Reading the eval split and running the model.


def eval_files(examples: types.Artifact, split: str,
               component: str = "DPModelValidator") -> List[str]:
    """The data files of one split of an Examples artifact (gzip TFRecords of tf.Example).

    Raises:
      ValueError: no such split, or a payload / file format other than gzip tf.Example records.
    """
    names = artifact_utils.decode_split_names(examples.split_names) if examples.split_names \
        else []
    if names and split not in names:
        raise ValueError(f"the Examples artifact {examples.uri} has no split {split!r} (splits: "
                         f"{names}); set eval_split")
    payload = examples_utils.get_payload_format(examples)
    if payload != example_gen_pb2.FORMAT_TF_EXAMPLE:
        raise ValueError(f"{component} reads tf.Example records, got payload format "
                         f"{example_gen_pb2.PayloadFormat.Name(payload)}")
    file_format = examples_utils.get_file_format(examples)
    if file_format != _GZIP_FILE_FORMAT:
        raise ValueError(f"{component} reads {_GZIP_FILE_FORMAT} files, got {file_format!r}")
    [pattern] = examples_utils.get_split_file_patterns([examples], split)
    if not names and not fileio.exists(os.path.dirname(pattern)):
        raise ValueError(f"the Examples artifact {examples.uri} has no split {split!r}")
    return sorted(fileio.glob(pattern))


class ServingModel:
    """A SavedModel's serving signature on serialized tf.Examples, and the output to validate."""

    def __init__(self, model_dir: str, *, signature_name: str,
                 prediction_key: Optional[str]) -> None:
        """Loads the model and checks its signature (shape only: no data is read).

        Raises:
          FileNotFoundError: no SavedModel in ``model_dir``.
          ValueError: no such signature, not one string input, no such (or an ambiguous)
            output, or an output that is not one value per example.
        """
        import tensorflow as tf
        if not fileio.exists(os.path.join(model_dir, "saved_model.pb")):
            raise FileNotFoundError(
                f"no SavedModel at {model_dir}: the model artifact must hold the serving model "
                "under Format-Serving, as the TFX Trainer writes it")
        self._model = tf.saved_model.load(model_dir)
        signatures = self._model.signatures
        if signature_name not in signatures:
            raise ValueError(f"the model has no signature {signature_name!r} (signatures: "
                             f"{sorted(signatures)})")
        self._fn = signatures[signature_name]
        _, inputs = self._fn.structured_input_signature
        if len(inputs) != 1 or next(iter(inputs.values())).dtype != tf.string:
            raise ValueError(
                f"signature {signature_name!r} must take one string tensor of serialized "
                f"tf.Examples (the TFX serving signature), got inputs "
                f"{ {k: str(v) for k, v in inputs.items()} }")
        self._input_name = next(iter(inputs))
        outputs = self._fn.structured_outputs
        if prediction_key is None:
            if len(outputs) != 1:
                raise ValueError(f"signature {signature_name!r} has outputs {sorted(outputs)}: "
                                 "set prediction_key to the one to validate")
            prediction_key = next(iter(outputs))
        elif prediction_key not in outputs:
            raise ValueError(f"signature {signature_name!r} has no output {prediction_key!r} "
                             f"(outputs: {sorted(outputs)})")
        shape = outputs[prediction_key].shape
        if shape.rank is not None and not (
                shape.rank == 1 or (shape.rank == 2 and shape[1] in (1, None))):
            raise ValueError(f"output {prediction_key!r} has shape {shape}: DPModelValidator "
                             "needs one prediction per example ([batch] or [batch, 1])")
        self.prediction_key = prediction_key

    def predict(self, serialized: Any) -> np.ndarray:
        """One float prediction per serialized tf.Example of a batch (a 1-D string tensor)."""
        out = self._fn(**{self._input_name: serialized})[self.prediction_key]
        values = np.asarray(out.numpy(), dtype=np.float64)
        n = int(serialized.shape[0])
        if values.size != n:
            raise ValueError(f"output {self.prediction_key!r} gave {values.shape} for a batch "
                             "of examples: DPModelValidator needs one prediction per example")
        return values.reshape(n)


def labels_and_predictions(files: Sequence[str], model: ServingModel, *, label_key: str,
                           batch_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """Runs the model on every record of ``files`` in batches; returns (labels, predictions)."""
    import tensorflow as tf
    labels, predictions = [], []
    if files:
        dataset = tf.data.TFRecordDataset(list(files), compression_type="GZIP").batch(batch_size)
        for batch in dataset:
            labels.append(label_values(batch.numpy().tolist(), label_key))
            predictions.append(model.predict(batch))
    if not labels:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(labels), np.concatenate(predictions)
