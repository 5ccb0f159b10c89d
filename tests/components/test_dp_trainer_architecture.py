"""What the DP Trainer takes from a module: a stock-Keras architecture, rebuilt with fresh weights.

Each refusal is a way a module could carry data or non-DP weights into the published model, or
break per-example clipping; TensorFlow builds the models (no TFX, no data).
"""
import json
import sys

import numpy as np
import pytest

from sage_tfx.components.dp_trainer import architecture as arch
from sage_tfx.components.dp_trainer import objectives

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tf():
    import tensorflow
    return tensorflow


def _inputs(tf):
    return {"a": tf.keras.Input(shape=(), name="a"),
            "c": tf.keras.Input(shape=(), name="c", dtype=tf.int64)}


def _config(model):
    return json.loads(model.to_json())


def test_the_taxi_wide_and_deep_model_passes_and_rebuilds_with_fresh_weights(tf):
    """TFX's own taxi model (DenseFeatures with numeric and indicator columns, Dense layers,
    tf.squeeze), with the weights a module set: rebuilt, it has the same architecture and none
    of those weights; its layers are renamed and its inputs keep their feature names."""
    import importlib
    import os

    import tfx
    sys.path.insert(0, os.path.join(os.path.dirname(tfx.__file__), "examples",
                                    "chicago_taxi_pipeline"))
    try:
        taxi = importlib.import_module("taxi_utils_native_keras")
    finally:
        sys.path.pop(0)
    model = taxi._build_keras_model([16, 8])
    for w in model.trainable_weights:
        w.assign(np.full(w.shape, 7.0, w.dtype.as_numpy_dtype))   # "plain-trained" weights
    checked = arch.check_model_json(model.to_json())
    assert set(checked.inputs) == {"trip_miles_xf", "fare_xf", "trip_seconds_xf",
                                   "payment_type_xf", "company_xf", "pickup_latitude_xf",
                                   "pickup_longitude_xf", "dropoff_latitude_xf",
                                   "dropoff_longitude_xf", "trip_start_hour_xf",
                                   "trip_start_day_xf", "trip_start_month_xf",
                                   "pickup_census_tract_xf", "dropoff_census_tract_xf",
                                   "pickup_community_area_xf", "dropoff_community_area_xf"}
    assert checked.inputs["company_xf"] == "int32" and checked.inputs["fare_xf"] == "float32"
    names = [layer["name"] for layer in checked.config["config"]["layers"]
             if layer["class_name"] != "InputLayer"]
    assert names and all(n.startswith("layer_") for n in names)
    rebuilt = checked.build()
    assert [w.shape for w in rebuilt.trainable_weights] == [w.shape for w in
                                                           model.trainable_weights]
    assert not any(np.any(w.numpy() == 7.0) for w in rebuilt.trainable_weights)
    assert len(checked.digest) == 64 and checked.digest == arch.check_model_json(
        model.to_json()).digest


def test_a_functional_model_with_an_embedding_and_layer_norm_passes(tf):
    inp = _inputs(tf)
    emb = tf.keras.layers.Flatten()(tf.keras.layers.Embedding(10, 4)(inp["c"]))
    x = tf.keras.layers.Concatenate()([tf.expand_dims(inp["a"], -1), emb])
    x = tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(8, activation="relu")(x))
    out = tf.keras.layers.Dense(1, kernel_regularizer=tf.keras.regularizers.L2(0.01))(x * 2.0)
    checked = arch.check_model_json(tf.keras.Model(inp, out[:, 0]).to_json(),
                                    features={"a", "c", "label"})
    assert checked.inputs == {"a": "float32", "c": "int64"}
    assert checked.build()({"a": tf.zeros([3]), "c": tf.zeros([3], tf.int64)}).shape == [3]


def _refused(tf, build, match, features=None):
    with pytest.raises(arch.ArchitectureError, match=match):
        arch.check_model_json(build(tf).to_json(), features=features)


def _dense_after(tf, layer):
    inp = _inputs(tf)
    x = layer(tf.stack([inp["a"], tf.cast(inp["c"], tf.float32)], axis=1))
    return tf.keras.Model(inp, tf.keras.layers.Dense(1)(x))


PLAIN = np.linspace(-1, 1, 2 * 3).reshape(2, 3).astype(np.float32)   # "non-DP weights"


@pytest.mark.parametrize("name, build, match", [
    ("lambda holding non-DP weights",
     lambda tf: _dense_after(tf, tf.keras.layers.Lambda(lambda x: tf.matmul(x, PLAIN))),
     "Lambda"),
    ("tf op with a constant matrix",
     lambda tf: _dense_after(tf, lambda x: tf.linalg.matmul(x, tf.constant(PLAIN))),
     "not one of the tf functions"),
    ("an added constant array",
     lambda tf: _dense_after(tf, lambda x: tf.concat([x] * 40, axis=1) + tf.constant(
         np.arange(80, dtype=np.float32))), "more than 64 numbers"),
    ("batch normalization", lambda tf: _dense_after(tf, tf.keras.layers.BatchNormalization()),
     "BatchNormalization"),
    ("dropout", lambda tf: _dense_after(tf, tf.keras.layers.Dropout(0.5)), "Dropout"),
    ("normalization from data",
     lambda tf: _dense_after(tf, tf.keras.layers.Normalization(mean=[1.0, 2.0],
                                                               variance=[1.0, 4.0])),
     "Normalization"),
    ("a constant initializer with an array",
     lambda tf: _dense_after(tf, tf.keras.layers.Dense(
         3, kernel_initializer=tf.keras.initializers.Constant(PLAIN))),
     "Constant initializer may hold one number"),
    ("an activity regularizer",
     lambda tf: _dense_after(tf, tf.keras.layers.Dense(
         3, activity_regularizer=tf.keras.regularizers.L2(0.1))), "activity regularizer"),
])
def test_architectures_that_carry_data_or_break_clipping_are_refused(tf, name, build, match):
    _refused(tf, build, match)


def _rank1(tf, op):
    inp = _inputs(tf)
    return tf.keras.Model(inp, tf.keras.layers.Dense(1)(tf.stack(
        [op(inp["a"]), tf.cast(inp["c"], tf.float32)], axis=1)))


@pytest.mark.parametrize("name, build, match", [
    ("a softmax over the batch",
     lambda tf: _dense_after(tf, tf.keras.layers.Softmax(axis=0)), "axis 0 mixes"),
    ("a batch mean", lambda tf: _rank1(tf, lambda x: x - tf.reduce_mean(x)),
     "every axis includes the batch"),
    ("a reduction along axis 0", lambda tf: _rank1(tf, lambda x: x * tf.reduce_sum(x, axis=0)),
     "axis 0 mixes"),
    ("another example's value", lambda tf: _rank1(tf, lambda x: x + x[0]), "indexing the batch"),
    ("a reshape across examples",
     lambda tf: _dense_after(tf, lambda x: tf.reshape(x, [-1, 4])), "tf.reshape can merge"),
    ("a concatenation of examples",
     lambda tf: _dense_after(tf, lambda x: tf.keras.layers.Concatenate(axis=0)([x, x])),
     "axis 0 mixes"),
])
def test_layers_that_mix_the_examples_of_a_batch_are_refused(tf, name, build, match):
    """One example's gradient must depend on its own row only, or clipping bounds nothing."""
    _refused(tf, build, match)


def test_custom_layers_and_registered_classes_are_refused(tf):
    @tf.keras.utils.register_keras_serializable(package="Evil", name="Dense")
    class Shadow(tf.keras.layers.Layer):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.w = tf.constant(PLAIN)

        def call(self, x):
            return tf.matmul(x, self.w)

    _refused(tf, lambda tf: _dense_after(tf, Shadow()), "not a stock Keras layer")


def test_vocabulary_columns_and_unknown_inputs_are_refused(tf):
    def vocab(tf):
        col = tf.feature_column.indicator_column(
            tf.feature_column.categorical_column_with_vocabulary_list("s", ["alice", "bob"]))
        inp = {"s": tf.keras.Input(shape=(), name="s", dtype=tf.string)}
        return tf.keras.Model(inp, tf.keras.layers.Dense(1)(
            tf.keras.layers.DenseFeatures([col])(inp)))
    _refused(tf, vocab, "VocabularyListCategoricalColumn")

    def unknown(tf):
        inp = _inputs(tf)
        return tf.keras.Model(inp, tf.keras.layers.Dense(1)(tf.stack(
            [inp["a"], tf.cast(inp["c"], tf.float32)], axis=1)))
    _refused(tf, unknown, "not features of the training examples", features={"a", "label"})

    def sequential(tf):
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        model.build((None, 3))
        return model
    _refused(tf, sequential, "Sequential model takes one unnamed tensor")


def test_losses_and_optimizers_are_stock_and_rebuilt(tf):
    assert objectives.check_loss("binary_crossentropy") == {"class_name": "BinaryCrossentropy",
                                                      "config": {}}
    loss = objectives.check_loss(tf.keras.losses.serialize(
        tf.keras.losses.BinaryCrossentropy(from_logits=True)))
    built = objectives.build_loss(loss)
    assert built.from_logits and built.reduction == "none"
    for bad in ("my_loss", {"class_name": "Custom>Loss", "config": {}}):
        with pytest.raises(arch.ArchitectureError, match="stock Keras loss"):
            objectives.check_loss(bad)
    opt = objectives.check_optimizer(tf.keras.optimizers.serialize(tf.keras.optimizers.SGD(
        tf.keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.9))))
    sgd = objectives.build_optimizer(opt)
    assert type(sgd).__name__ == "SGD"
    assert sgd.get_config()["learning_rate"]["class_name"] == "ExponentialDecay"
    assert type(objectives.build_optimizer(objectives.check_optimizer("adam"))).__name__ == "Adam"
    for bad in ("DPKerasSGDOptimizer", {"class_name": "SGD", "config": {"is_legacy_optimizer":
                                                                        True}}):
        with pytest.raises(arch.ArchitectureError):
            objectives.check_optimizer(bad)
