"""Trainer module file of the Pyramid pipeline: a small Keras model on count features, exported
with the in-graph featurizer in front of it.

``custom_config``: ``feature_names`` (the snapshot's ``Featurization.feature_names()``) and
``label``. The examples are PyramidTransform's ``transformed_examples`` (float count features +
int label); ``fn_args.transform_graph_path`` is its ``transform_graph``, whose
``pyramid_featurizer/`` SavedModel maps serialized raw tf.Examples to those features.

The exported SavedModel has two signatures:

* ``serving_default(examples: string[None]) -> {"probabilities": float32[None, 1]}`` — raw
  tf.Examples in, the featurizer and the model in one graph: serving needs nothing else.
* ``predict_features(features: float32[None, F]) -> {"probabilities": ...}`` — the model alone,
  for callers that featurize themselves (e.g. the Python featurizer of the snapshot).
"""
from __future__ import annotations

import os
from typing import Any, List

import tensorflow as tf

FEATURIZER_DIR = "pyramid_featurizer"   # = components.pyramid_transform.executor.FEATURIZER_DIR


def _dataset(files: List[str], names: List[str], label: str, batch: int, repeat: bool):
    spec = {n: tf.io.FixedLenFeature([], tf.float32) for n in names}
    spec[label] = tf.io.FixedLenFeature([], tf.int64)

    def parse(rec):
        ex = tf.io.parse_single_example(rec, spec)
        x = tf.stack([ex[n] for n in names])
        return x, tf.cast(ex[label], tf.float32)

    paths = [p for pattern in files for p in tf.io.gfile.glob(pattern)]
    ds = tf.data.TFRecordDataset(paths, compression_type="GZIP").map(parse).batch(batch)
    return ds.repeat() if repeat else ds


class ServingModel(tf.Module):
    """The featurizer (restored from the transform graph) followed by the trained model."""

    def __init__(self, featurizer, model: tf.keras.Model, n_features: int):
        super().__init__(name="pyramid_serving")
        self.featurizer = featurizer
        self.model = model
        self._n = n_features
        self.serve = tf.function(self._serve, input_signature=[
            tf.TensorSpec([None], tf.string, name="examples")])
        self.predict_features = tf.function(self._predict, input_signature=[
            tf.TensorSpec([None, n_features], tf.float32, name="features")])

    def _predict(self, features):
        return {"probabilities": self.model(features, training=False)}

    def _serve(self, examples):
        return self._predict(self.featurizer.featurize_serialized(examples))


def run_fn(fn_args: Any) -> None:
    """TFX entry point: logistic model (one hidden layer) on the count features; SavedModel out."""
    cfg = fn_args.custom_config or {}
    names, label = list(cfg["feature_names"]), cfg["label"]
    train = _dataset(fn_args.train_files, names, label, 64, True)
    evals = _dataset(fn_args.eval_files, names, label, 64, False)
    model = tf.keras.Sequential([tf.keras.layers.Input((len(names),), name="count_features"),
                                 tf.keras.layers.Dense(8, activation="tanh"),
                                 tf.keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss="binary_crossentropy",
                  metrics=["accuracy"])
    model.fit(train, steps_per_epoch=fn_args.train_steps, validation_data=evals,
              validation_steps=fn_args.eval_steps, verbose=0)
    if not fn_args.transform_graph_path:
        raise ValueError("the Pyramid trainer needs PyramidTransform's transform_graph")
    featurizer = tf.saved_model.load(os.path.join(fn_args.transform_graph_path, FEATURIZER_DIR))
    serving = ServingModel(featurizer, model, len(names))
    tf.saved_model.save(serving, fn_args.serving_model_dir, signatures={
        "serving_default": serving.serve.get_concrete_function(),
        "predict_features": serving.predict_features.get_concrete_function()})
