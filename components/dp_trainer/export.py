"""The DP Trainer's export: written by the executor, checked file by file before it is released.

The published Model is a function of four things only: the DP-trained weights, the checked
architecture (``architecture.py``), the DP Transform's graph (itself a released DP output) and
the public constants the pipeline declared (``output_scale`` / ``output_offset``, checked
finite). :func:`save_serving_model` writes a SavedModel whose ``serving_default`` signature
takes serialized *raw* tf.Examples (input ``examples``), applies the transform graph
(``TransformFeaturesLayer``, the TFX penguin / taxi pattern), calls the model on the features it
reads and returns ``{"predictions": float32 [batch, k]}`` (× scale + offset); with a transform
graph a ``transform_features`` signature returns the transformed features, as TFX's taxi module
exports. No optimizer state is saved.

:func:`check_export` then refuses the directory unless it holds nothing else:

* files: ``saved_model.pb``, ``keras_metadata.pb``, ``fingerprint.pb``, ``variables/`` and
  ``assets/`` — each asset byte-identical to one of the transform graph's assets;
* every tensor of the checkpoint is a trained weight (equal to the loop's), a non-trainable
  weight equal to its fresh (data-independent) initial value, or a value of the transform
  graph's own checkpoint;
* every constant of more than :data:`MAX_FREE_CONSTANT` elements in the graph is one the
  transform graph holds (a shadow model held as a constant would be caught here).
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from sage_tfx.components.dp_trainer.guarantee import UnverifiedTrainingError

PREDICTIONS_KEY = "predictions"
SERVING_INPUT_NAME = "examples"
MAX_FREE_CONSTANT = 64   # = architecture.MAX_NUMERIC_LIST: settings, not data
ALLOWED_FILES = frozenset({"saved_model.pb", "keras_metadata.pb", "fingerprint.pb"})


def check_output_constants(output_scale: Any, output_offset: Any) -> tuple[float, float]:
    """The declared output constants, as floats (scale finite and ≠ 0, offset finite).

    Raises:
      ValueError: anything else.
    """
    out = []
    for name, value in (("output_scale", output_scale), ("output_offset", output_offset)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not np.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
        out.append(float(value))
    if out[0] == 0.0:
        raise ValueError("output_scale must not be 0")
    return out[0], out[1]


def raw_serving_spec(transform_output: Optional[str], schema_spec: Optional[Mapping[str, Any]],
                     drop: Iterable[str]) -> dict:
    """The raw features a serving request carries: the transform's raw spec (else the
    schema's) without the label features ``drop``."""
    if transform_output:
        import tensorflow_transform as tft
        spec = dict(tft.TFTransformOutput(transform_output).raw_feature_spec())
    else:
        spec = dict(schema_spec or {})
    for key in drop:
        spec.pop(key, None)
    return spec


def save_serving_model(model: Any, out_dir: str, *, inputs: Mapping[str, str],
                       raw_spec: Mapping[str, Any], transform_output: Optional[str],
                       output_scale: float = 1.0, output_offset: float = 0.0) -> str:
    """Writes ``model`` with its serving signatures to ``out_dir`` (module doc)."""
    from sage_tfx.components.dp_trainer.loop import ExampleParser
    scale, offset = check_output_constants(output_scale, output_offset)
    if transform_output:
        import tensorflow_transform as tft
        tft_output = tft.TFTransformOutput(transform_output)
        model.tft_layer = tft_output.transform_features_layer()
        feature_spec = tft_output.transformed_feature_spec()
    else:
        feature_spec = dict(raw_spec)
    parser = ExampleParser(feature_spec, inputs, None)
    raw_spec = dict(raw_spec)

    def transformed(serialized):
        parsed = tf.io.parse_example(serialized, raw_spec)
        return model.tft_layer(parsed) if transform_output else parsed

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name=SERVING_INPUT_NAME)])
    def serve(serialized):
        features = parser.features(transformed(serialized))
        out = tf.cast(model(features, training=False), tf.float32)
        out = tf.reshape(out, [tf.shape(serialized)[0], -1])
        if scale != 1.0 or offset != 0.0:
            out = out * scale + offset
        return {PREDICTIONS_KEY: out}

    signatures = {"serving_default": serve.get_concrete_function()}
    if transform_output:
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string,
                                                    name=SERVING_INPUT_NAME)])
        def transform_features(serialized):
            return transformed(serialized)
        signatures["transform_features"] = transform_features.get_concrete_function()
    model.save(out_dir, save_format="tf", signatures=signatures, include_optimizer=False)
    return out_dir


# --- the check --------------------------------------------------------------------------------


def _digest(array: Any) -> tuple:
    a = np.asarray(array)
    return a.dtype.str, a.shape, hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def checkpoint_values(saved_model_dir: str) -> dict:
    """{checkpoint key: value} of a SavedModel's variables (empty if it has none)."""
    prefix = os.path.join(saved_model_dir, "variables", "variables")
    if not tf.io.gfile.exists(prefix + ".index"):
        return {}
    reader = tf.train.load_checkpoint(prefix)
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
            if k != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def graph_constants(saved_model_dir: str) -> list:
    """Every ``Const`` tensor of a SavedModel's graphs and functions, as numpy arrays."""
    from tensorflow.core.protobuf import saved_model_pb2
    saved = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    out = []
    for meta in saved.meta_graphs:
        nodes = list(meta.graph_def.node)
        for fn in meta.graph_def.library.function:
            nodes.extend(fn.node_def)
        for node in nodes:
            if node.op == "Const" and "value" in node.attr:
                try:
                    out.append(tf.make_ndarray(node.attr["value"].tensor))
                except (TypeError, ValueError):  # a dtype numpy cannot hold: bytes of the proto
                    out.append(np.frombuffer(node.attr["value"].tensor.SerializeToString(),
                                             np.uint8))
    return out


def _files(root: str) -> list:
    out = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            out.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(out)


def _transform_saved_model(transform_output: str) -> str:
    return os.path.join(transform_output, "transform_fn")


def check_export(export_dir: str, *, trained: Sequence[Any], fresh: Sequence[Any],
                 transform_output: Optional[str]) -> None:
    """Refuses an export that carries anything but the DP model and the transform graph.

    Args:
      export_dir: The SavedModel directory written by :func:`save_serving_model`.
      trained: The trained weights (the loop's trainable variables' values).
      fresh: The values the model's non-trainable weights had when it was built.
      transform_output: The transform graph directory, or None.

    Raises:
      UnverifiedTrainingError: an unexpected file, asset, variable or constant (what and where).
    """
    tft_dir = _transform_saved_model(transform_output) if transform_output else None
    tft_assets = {}
    if tft_dir and os.path.isdir(os.path.join(tft_dir, "assets")):
        for name in _files(os.path.join(tft_dir, "assets")):
            with open(os.path.join(tft_dir, "assets", name), "rb") as f:
                tft_assets[hashlib.sha256(f.read()).hexdigest()] = name
    for rel in _files(export_dir):
        top = rel.split(os.sep)[0]
        if rel in ALLOWED_FILES or top == "variables":
            continue
        if top == "assets":
            with open(os.path.join(export_dir, rel), "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() in tft_assets:
                    continue
            raise UnverifiedTrainingError(
                f"the export holds the asset {rel!r}, which is not one of the DP transform "
                "graph's: a model's assets come from the transform graph only")
        raise UnverifiedTrainingError(f"the export holds the file {rel!r}: a published model "
                                      "holds the SavedModel files and the transform's assets "
                                      "only")
    allowed = {_digest(v) for v in list(trained) + list(fresh)}
    tft_values = checkpoint_values(tft_dir) if tft_dir else {}
    allowed |= {_digest(v) for v in tft_values.values()}
    exported = checkpoint_values(export_dir)
    for key, value in exported.items():
        if _digest(value) not in allowed:
            raise UnverifiedTrainingError(
                f"the export's variable {key!r} {np.shape(value)} is neither a DP-trained "
                "weight, a freshly initialised non-trainable weight, nor the transform "
                "graph's: refusing to publish it")
    exported_digests = {_digest(v) for v in exported.values()}
    missing = [i for i, v in enumerate(trained) if _digest(v) not in exported_digests]
    if missing:
        raise UnverifiedTrainingError(
            f"the export lacks {len(missing)} of the {len(trained)} trained weights: it is not "
            "the model DP training produced")
    tft_consts = ({_digest(c) for c in graph_constants(tft_dir)} if tft_dir else set())
    for const in graph_constants(export_dir):
        if np.size(const) > MAX_FREE_CONSTANT and _digest(const) not in tft_consts:
            raise UnverifiedTrainingError(
                f"the export's graph holds a constant of shape {np.shape(const)} that is not "
                "the transform graph's: weights held as constants are not DP-trained")
