"""What the DP Trainer takes from the user's module: an architecture, checked and rebuilt fresh.

The module's ``model_fn`` runs in a process of its own (``model_fn_runner``) and hands back JSON
only: the Keras model's configuration (``model.to_json()``), the loss and optimizer
configurations, and the training settings. This module checks that JSON against allow-lists of
stock Keras classes and rebuilds the model from it with fresh weights, in the executor's process,
which never imports the user's code. What the module's objects held — weights, constants in a
``Lambda``, a custom layer's code, non-trainable variables set from data, files — has no way in:

* layers are stock Keras classes (:data:`LAYERS`); ``Lambda`` (its bytecode), custom classes,
  layers that hold data-derived constants (``Normalization`` with a mean, ``StringLookup`` with a
  vocabulary, vocabulary feature columns, ``Constant`` initializers with arrays, embedding
  columns loading a checkpoint) and layers that break per-example clipping (``BatchNormalization``
  mixes the examples of a batch; dropout and other training-time noise would clip one forward
  pass and train another) are refused, each with the reason;
* TF-op layers (``tf.squeeze(x)`` in a functional model) call one of :data:`TF_OPS`; their
  recorded arguments, like every configuration value, are scalars, short strings and short
  numeric lists (:data:`MAX_NUMERIC_LIST`);
* nothing computes across the batch axis (a softmax, a reduction, a concatenation, a layer
  norm or an indexing along axis 0, ``tf.reshape``): per-example clipping bounds an example's
  influence only if each example's loss depends on its own row alone;
* initializers, regularizers (weights only: an activity regularizer is a data-dependent loss
  term), constraints and activations are stock Keras ones (losses, optimizers and schedules:
  ``objectives.py``);
* every layer but the inputs is renamed ``layer_<i>`` (names are free text the module chose);
  the inputs keep their names, which must be features of the examples.

What remains trusted is the architecture itself: layer kinds, sizes and the other
hyper-parameters (a handful of numbers) the module chose. The executor trains the rebuilt model
with DP-SGD and writes the export itself (``export.py``).

TensorFlow is imported inside functions only.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
from typing import Any, Iterable, Optional

from sage_tfx.components.dp_trainer.config_checks import (  # noqa: F401  (re-exported)
    MAX_NUMERIC_LIST, ArchitectureError, check_object, check_plain, check_scalar, fail, is_ref,
    numbers)


# Stock Keras layers the trainer rebuilds (class name -> why it is listed / what it needs).
LAYERS = frozenset({
    "InputLayer", "Dense", "EinsumDense", "Embedding", "LayerNormalization",
    "MultiHeadAttention", "Concatenate", "Add", "Subtract", "Multiply", "Average", "Maximum",
    "Minimum", "Dot", "Flatten", "Reshape", "Permute", "RepeatVector", "Activation", "ReLU",
    "LeakyReLU", "ELU", "Softmax", "PReLU", "DenseFeatures", "CategoryEncoding", "Hashing",
    "Rescaling", "Conv1D", "Conv2D", "MaxPooling1D", "MaxPooling2D", "AveragePooling1D",
    "AveragePooling2D", "GlobalAveragePooling1D", "GlobalAveragePooling2D",
    "GlobalMaxPooling1D", "GlobalMaxPooling2D", "ZeroPadding1D", "Cropping1D",
    "TFOpLambda", "SlicingOpLambda",
})
MODELS = frozenset({"Functional", "Sequential", "Model"})
# Refused, with the reason given to the user.
REFUSED_LAYERS = {
    "Lambda": "a Lambda layer carries Python bytecode (and any constant it closes over); write "
              "the computation with stock layers or tf ops",
    "BatchNormalization": "batch normalization mixes the examples of a batch, so per-example "
                          "gradients (and their clipping) are undefined; use LayerNormalization",
    "Dropout": "training-time noise layers make the clipping pass and the training pass see "
               "different networks, so the clip would not bound the gradient; DP-SGD's noise "
               "regularizes already",
    "SpatialDropout1D": "see Dropout", "SpatialDropout2D": "see Dropout",
    "GaussianDropout": "see Dropout", "GaussianNoise": "see Dropout",
    "AlphaDropout": "see Dropout",
    "Normalization": "its mean and variance are constants computed from data: z-score in the "
                     "DP Transform (dp_scale_to_z_score) instead",
    "Discretization": "its bin boundaries are constants computed from data: bucketize in the DP "
                      "Transform instead",
    "StringLookup": "its vocabulary is data: build it with the DP Transform's DP vocabulary",
    "IntegerLookup": "its vocabulary is data: build it with the DP Transform's DP vocabulary",
    "TextVectorization": "its vocabulary is data: build it with the DP Transform",
}
# tf functions a TF-op layer may call (``tf.<name>``): shape, arithmetic and activations.
TF_OPS = frozenset({
    "squeeze", "compat.v1.squeeze", "expand_dims", "reshape", "concat", "stack", "cast",
    "identity", "ones_like", "zeros_like", "one_hot", "clip_by_value", "where",
    "__operators__.add", "__operators__.getitem", "math.add", "math.subtract",
    "math.multiply", "math.truediv", "math.divide", "math.negative", "math.abs", "math.exp",
    "math.log", "math.log1p", "math.sqrt", "math.square", "math.sigmoid", "math.tanh",
    "math.maximum", "math.minimum", "math.reduce_sum", "math.reduce_mean", "math.reduce_max",
    "math.reduce_min", "nn.relu", "nn.sigmoid", "nn.softmax", "nn.tanh", "nn.l2_normalize",
})
INITIALIZERS = frozenset({
    "GlorotUniform", "GlorotNormal", "HeUniform", "HeNormal", "LecunUniform", "LecunNormal",
    "RandomNormal", "RandomUniform", "TruncatedNormal", "VarianceScaling", "Orthogonal", "Zeros",
    "Ones", "Identity", "Constant",
})
REGULARIZERS = frozenset({"L1", "L2", "L1L2", "OrthogonalRegularizer"})
CONSTRAINTS = frozenset({"MaxNorm", "MinMaxNorm", "NonNeg", "UnitNorm", "RadialConstraint"})
ACTIVATIONS = frozenset({
    "linear", "relu", "sigmoid", "tanh", "softmax", "elu", "selu", "softplus", "softsign",
    "swish", "silu", "gelu", "exponential", "hard_sigmoid", "relu6", "mish", "leaky_relu",
    "log_softmax",
})
FEATURE_COLUMNS = frozenset({
    "NumericColumn", "IdentityCategoricalColumn", "IndicatorColumn", "EmbeddingColumn",
    "HashedCategoricalColumn", "CrossedColumn", "BucketizedColumn", "WeightedCategoricalColumn",
})
REFUSED_FEATURE_COLUMNS = {
    "VocabularyListCategoricalColumn": "its vocabulary list is data: use the DP Transform's DP "
                                       "vocabulary and an identity column",
    "VocabularyFileCategoricalColumn": "it reads a vocabulary file into the model: use the DP "
                                       "Transform's DP vocabulary and an identity column",
}
MAX_LAYERS = 2000
_FEATURE_RE = re.compile(r"^[A-Za-z0-9_.\-/]{1,128}$")


def _check_activation(path: str, value: Any) -> None:
    if value is None:
        return
    name = value.get("config") if isinstance(value, dict) and value.get(
        "class_name") == "function" else value
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise fail(path, f"activation {name!r} is not a stock Keras activation "
                          f"(allowed: {sorted(ACTIVATIONS)})")


def _check_feature_columns(path: str, columns: Any, inputs: set) -> None:
    if not isinstance(columns, list):
        raise fail(path, "feature_columns must be a list")
    for i, col in enumerate(columns):
        _check_feature_column(f"{path}[{i}]", col, inputs)


def _check_feature_column(path: str, col: Any, inputs: set) -> None:
    if not isinstance(col, dict) or not isinstance(col.get("class_name"), str):
        raise fail(path, f"expected a serialized feature column, got {col!r}")
    name = col["class_name"]
    if name in REFUSED_FEATURE_COLUMNS:
        raise fail(path, f"{name}: {REFUSED_FEATURE_COLUMNS[name]}")
    if name not in FEATURE_COLUMNS:
        raise fail(path, f"feature column {name!r} is not allowed (allowed: "
                          f"{sorted(FEATURE_COLUMNS)})")
    config = dict(col.get("config") or {})
    if name == "NumericColumn" and config.get("normalizer_fn") is not None:
        raise fail(path, "a numeric column's normalizer_fn is code; normalize in the DP "
                          "Transform")
    if name == "EmbeddingColumn" and (config.get("ckpt_to_load_from")
                                      or config.get("tensor_name_in_ckpt")):
        raise fail(path, "an embedding column may not load weights from a checkpoint: every "
                          "weight of the published model comes from DP training")
    for key, value in config.items():
        sub = f"{path}.{key}"
        if key in ("categorical_column", "source_column"):
            _check_feature_column(sub, value, inputs)
        elif key in ("keys",):  # CrossedColumn: feature names or columns
            for j, k in enumerate(value or []):
                if isinstance(k, str):
                    _check_input_key(f"{sub}[{j}]", k, inputs)
                else:
                    _check_feature_column(f"{sub}[{j}]", k, inputs)
        elif key == "key" or key == "weight_feature_key":
            _check_input_key(sub, value, inputs)
        elif key == "initializer":
            check_object(sub, value, INITIALIZERS, "initializer")
        elif key == "dtype":
            check_scalar(sub, value)
        else:
            check_plain(sub, value)


def _check_input_key(path: str, key: Any, inputs: set) -> None:
    if not isinstance(key, str) or key not in inputs:
        raise fail(path, f"feature column key {key!r} is not one of the model's inputs "
                          f"{sorted(inputs)}")


def _check_kwargs(path: str, value: Any) -> None:
    """A TF-op layer's recorded call arguments: tensor references, scalars, short lists."""
    if is_ref(value):
        if len(value) == 4:
            _check_kwargs(f"{path}.kwargs", value[3])
        return
    if isinstance(value, dict):
        for k, v in value.items():
            check_scalar(f"{path}.{k}", k)
            _check_kwargs(f"{path}.{k}", v)
        return
    if isinstance(value, list):
        if numbers(value) > MAX_NUMERIC_LIST:
            raise fail(path, f"a call argument with more than {MAX_NUMERIC_LIST} numbers is a "
                              "constant array, not a setting")
        for i, v in enumerate(value):
            _check_kwargs(f"{path}[{i}]", v)
        return
    check_scalar(path, value)


def _check_layer_config(path: str, class_name: str, config: dict, inputs: set) -> None:
    for key, value in config.items():
        sub = f"{path}.{key}"
        if key == "activity_regularizer":
            if value is not None:
                raise fail(sub, "an activity regularizer is a loss term computed from the "
                                 "data, which DP-SGD would add unclipped")
        elif key.endswith("_initializer"):
            check_object(sub, value, INITIALIZERS, "initializer")
        elif key.endswith("_regularizer"):
            check_object(sub, value, REGULARIZERS, "regularizer")
        elif key.endswith("_constraint"):
            check_object(sub, value, CONSTRAINTS, "constraint")
        elif key in ("activation", "recurrent_activation"):
            _check_activation(sub, value)
        elif key == "feature_columns" and class_name == "DenseFeatures":
            _check_feature_columns(sub, value, inputs)
        elif key == "function" and class_name in ("TFOpLambda", "SlicingOpLambda"):
            if value not in TF_OPS:
                raise fail(sub, f"tf.{value} is not one of the tf functions a model may call "
                                 f"({sorted(TF_OPS)})")
        elif key == "layers" and class_name in MODELS:
            raise fail(sub, "nested model configuration in an unexpected place")
        else:
            check_plain(sub, value)


# Per-example clipping bounds an example's influence only if its loss depends on its own row:
# a layer or op computing across the batch axis (0) would let one example move every other
# example's gradient. The checks below resolve each axis argument against the input's rank
# (the layer's recorded build_config) and refuse axis 0, an all-axes reduction, or an op that
# moves the batch axis.
_AXIS_LAYERS = {"Concatenate": ("axis",), "Softmax": ("axis",), "LayerNormalization": ("axis",),
                "Dot": ("axes",), "MultiHeadAttention": ("attention_axes",)}
_AXIS_OPS = {"math.reduce_sum", "math.reduce_mean", "math.reduce_max", "math.reduce_min",
             "concat", "stack", "nn.softmax", "nn.l2_normalize", "one_hot", "squeeze",
             "compat.v1.squeeze", "expand_dims"}
_BATCH_MOVING_OPS = {"reshape"}   # use keras.layers.Reshape: its target shape excludes the batch


def _ranks(layer: dict) -> list:
    """The ranks of a layer's inputs, from its recorded build_config (empty if unknown)."""
    shape = (layer.get("build_config") or {}).get("input_shape")

    def rank(s: Any) -> Optional[int]:
        if isinstance(s, list) and all(isinstance(d, (int, type(None))) for d in s):
            return len(s)
        return None
    if rank(shape) is not None:
        return [rank(shape)]
    if isinstance(shape, list):
        return [r for r in (rank(s) for s in shape) if r is not None]
    if isinstance(shape, dict):
        return [r for r in (rank(s) for s in shape.values()) if r is not None]
    return []


def _check_axes(path: str, what: str, axes: Any, ranks: list, *, inserts: bool = False) -> None:
    """Refuses axes that are (or may be) the batch axis 0; None means every axis."""
    if axes is None:
        raise fail(path, f"{what} over every axis includes the batch axis: give the axis")
    for axis in (axes if isinstance(axes, (list, tuple)) else [axes]):
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise fail(path, f"{what}: axis {axis!r} is not an integer")
        if axis >= 0:
            if axis == 0:
                raise fail(path, f"{what} along axis 0 mixes the examples of a batch")
            continue
        if not ranks:
            raise fail(path, f"{what}: a negative axis with no recorded input shape (call the "
                              "layer on a keras.Input before returning the model)")
        for r in ranks:
            if (axis + r + (1 if inserts else 0)) % (r + (1 if inserts else 0)) == 0:
                raise fail(path, f"{what} along axis {axis} of a rank-{r} input is the batch "
                                  "axis: it mixes the examples of a batch")


def _node_kwargs(layer: dict) -> list:
    """The call kwargs recorded in a TF-op layer's inbound nodes."""
    out = []

    def walk(v: Any) -> None:
        if is_ref(v):
            if len(v) == 4:
                out.append(v[3])
        elif isinstance(v, list):
            for x in v:
                walk(x)
    walk(layer.get("inbound_nodes") or [])
    return out


def _check_batch_independence(path: str, layer: dict) -> None:
    name, config = layer["class_name"], dict(layer.get("config") or {})
    ranks = _ranks(layer)
    for key in _AXIS_LAYERS.get(name, ()):
        if key in config and not (key == "attention_axes" and config[key] is None):
            _check_axes(f"{path}.{key}", name, config[key], ranks)
    if name == "EinsumDense":
        eq = str(config.get("equation", ""))
        lhs, _, out = eq.partition("->")
        first = lhs.split(",")[0]
        if not (first.startswith("...") and out.startswith("...")
                or first[:1] and first[:1] == out[:1] and first[:1] not in lhs.split(",")[1]):
            raise fail(f"{path}.equation", f"EinsumDense {eq!r} must keep the batch letter "
                                            "(the first of the input) first in its output")
    if name not in ("TFOpLambda", "SlicingOpLambda"):
        return
    fn = config.get("function")
    if fn in _BATCH_MOVING_OPS:
        raise fail(path, f"tf.{fn} can merge or split the examples of a batch: use "
                          "keras.layers.Reshape (its target shape excludes the batch axis)")
    for kwargs in _node_kwargs(layer):
        if fn in _AXIS_OPS:
            default = {"concat": None, "stack": 0, "one_hot": -1, "expand_dims": None}.get(
                fn, None)
            axis = kwargs.get("axis", default)
            if fn == "squeeze" or fn == "compat.v1.squeeze":
                axis = kwargs.get("axis", kwargs.get("squeeze_dims"))
            _check_axes(path, f"tf.{fn}", axis, ranks,
                        inserts=fn in ("stack", "expand_dims", "one_hot"))
        if fn == "__operators__.getitem":
            spec = kwargs.get("slice_spec")
            first = spec[0] if isinstance(spec, list) and spec else spec
            full = isinstance(first, dict) and all(first.get(k) is None
                                                   for k in ("start", "stop", "step"))
            if not (full or first == "..." or (isinstance(first, dict) and first.get(
                    "class_name") == "__ellipsis__")):
                raise fail(path, "indexing the batch axis (x[i], x[a:b]) mixes or drops the "
                                  "examples of a batch: slice the other axes (x[:, i])")


def _check_layer(path: str, layer: Any, inputs: set) -> None:
    if not isinstance(layer, dict) or not isinstance(layer.get("class_name"), str):
        raise fail(path, f"expected a serialized layer, got {str(layer)[:80]!r}")
    name = layer["class_name"]
    registered = layer.get("registered_name")
    if name in REFUSED_LAYERS:
        raise fail(path, f"{name}: {REFUSED_LAYERS[name]}")
    if name in MODELS:
        _check_model_config(path, layer, inputs)
        return
    if name not in LAYERS or registered not in (None, name):
        raise fail(path, f"layer {registered or name!r} is not a stock Keras layer the DP "
                          "Trainer rebuilds (custom layers carry code and constants; allowed: "
                          f"{sorted(LAYERS)})")
    _check_layer_config(path, name, dict(layer.get("config") or {}), inputs)
    _check_batch_independence(path, layer)
    if "inbound_nodes" in layer:
        _check_kwargs(f"{path}.inbound_nodes", layer["inbound_nodes"])
    if "build_config" in layer:
        check_plain(f"{path}.build_config", layer["build_config"])


def _check_model_config(path: str, model: dict, inputs: set) -> None:
    config = model.get("config") or {}
    layers = config.get("layers")
    if not isinstance(layers, list) or not layers:
        raise fail(path, "a model configuration without layers")
    if len(layers) > MAX_LAYERS:
        raise fail(path, f"more than {MAX_LAYERS} layers")
    for i, layer in enumerate(layers):
        kind = layer.get("class_name") if isinstance(layer, dict) else "?"
        _check_layer(f"{path}.layers[{i}]({kind})", layer, inputs)
    for key in ("input_layers", "output_layers"):
        if key in config:
            _check_kwargs(f"{path}.{key}", config[key])


def _rename(model: dict) -> None:
    """Renames every non-input layer of a model configuration ``layer_<i>`` (in place)."""
    config = model["config"]
    config["name"] = "model"
    mapping: dict[str, str] = {}
    for i, layer in enumerate(config["layers"]):
        if layer.get("class_name") == "InputLayer":
            continue
        old = layer.get("name") or (layer.get("config") or {}).get("name")
        new = f"layer_{i}"
        if old is not None:
            mapping[old] = new
        if "name" in layer:
            layer["name"] = new
        layer.setdefault("config", {})["name"] = new
        if layer.get("class_name") in MODELS:
            _rename(layer)

    def walk(value: Any) -> Any:
        if is_ref(value) and value[0] in mapping:
            return [mapping[value[0]], *[walk(v) for v in value[1:]]]
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        return value

    for layer in config["layers"]:
        if "inbound_nodes" in layer:
            layer["inbound_nodes"] = walk(layer["inbound_nodes"])
    for key in ("input_layers", "output_layers"):
        if key in config:
            config[key] = walk(config[key])


def _model_inputs(model: dict) -> dict:
    """{input name: dtype} of a model configuration's input layers."""
    config = model["config"]
    out = {}
    for layer in config["layers"]:
        if layer.get("class_name") == "InputLayer":
            c = layer.get("config") or {}
            out[str(c.get("name") or layer.get("name"))] = str(c.get("dtype") or "float32")
    return out


@dataclasses.dataclass(frozen=True)
class Architecture:
    """A checked, canonical Keras model configuration (``model.to_json()`` form).

    Attributes:
      config: The configuration (layers renamed).
      inputs: {input name: dtype name}; each name is a feature the model reads.
    """

    config: dict
    inputs: dict

    def to_json(self) -> str:
        return json.dumps(self.config, sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> str:
        """SHA-256 of the canonical configuration (recorded with the release)."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def build(self) -> Any:
        """A fresh Keras model of this architecture (new random weights).

        Deserialized by Keras with the stock classes only: the executor's process holds no
        class of the user's module.
        """
        import tensorflow as tf
        model = tf.keras.models.model_from_json(self.to_json())
        return model


def check_model_json(model_json: Any, *, features: Optional[Iterable[str]] = None
                     ) -> Architecture:
    """Checks a ``model.to_json()`` configuration and returns its canonical Architecture.

    Args:
      model_json: The JSON text or its parsed dict.
      features: The feature names the examples hold (each model input must be one); None to
        skip that check.

    Raises:
      ArchitectureError: anything outside the allow-lists (module doc), with where and why.
    """
    if isinstance(model_json, str):
        try:
            model_json = json.loads(model_json)
        except ValueError as e:
            raise ArchitectureError(f"the model_fn's model is not JSON: {e}") from e
    if not isinstance(model_json, dict) or model_json.get("class_name") not in MODELS:
        kind = (model_json.get("class_name") if isinstance(model_json, dict)
                else type(model_json).__name__)
        raise ArchitectureError("model_fn must return a Keras Model (functional or "
                                f"Sequential); got a configuration of {kind!r}")
    model = copy.deepcopy(model_json)
    inputs = (_sequential_inputs(model) if model["class_name"] == "Sequential"
              else _model_inputs(model))
    for name in inputs:
        if not _FEATURE_RE.match(name):
            raise ArchitectureError(f"model input name {name!r} is not a feature name")
    if features is not None:
        known = set(features)
        missing = sorted(set(inputs) - known)
        if missing:
            raise ArchitectureError(
                f"the model's inputs {missing} are not features of the training examples "
                f"(features: {sorted(known)}); name each keras.Input after the (transformed) "
                "feature it reads")
    _check_model_config("model", model, set(inputs))
    _rename(model)
    return Architecture(config=model, inputs=dict(sorted(inputs.items())))


def _sequential_inputs(model: dict) -> dict:
    """A Sequential model reads features only through a first DenseFeatures layer."""
    layers = [layer for layer in model["config"]["layers"]
              if layer.get("class_name") != "InputLayer"]
    if not layers or layers[0].get("class_name") != "DenseFeatures":
        raise ArchitectureError(
            "a Sequential model takes one unnamed tensor: start it with a DenseFeatures layer "
            "(feature columns name the features it reads) or build a functional model whose "
            "keras.Input layers are named after the features")
    keys: dict = {}
    for col in layers[0].get("config", {}).get("feature_columns", []):
        for key in _column_keys(col):
            keys[key] = "float32"
    return keys


def _column_keys(col: Any) -> list:
    if not isinstance(col, dict):
        return []
    config = col.get("config") or {}
    out = []
    for key in ("key", "weight_feature_key"):
        if isinstance(config.get(key), str):
            out.append(config[key])
    for key in ("categorical_column", "source_column"):
        out += _column_keys(config.get(key))
    for k in config.get("keys") or []:
        out += [k] if isinstance(k, str) else _column_keys(k)
    return out
