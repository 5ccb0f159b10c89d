"""Trainer module file of the Pyramid pipeline: a small Keras model on count features.

``custom_config``: ``feature_names`` (the snapshot's ``Featurization.feature_names()``) and
``label``. The examples are PyramidTransform's output (float count features + int label).
"""
from __future__ import annotations

from typing import Any, List

import tensorflow as tf


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
    model.save(fn_args.serving_model_dir, save_format="tf")
