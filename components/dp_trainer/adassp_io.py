"""AdaSSP in the DP Trainer: the clipped moments summed in Beam, the linear serving model.

Rows are the declared features, each clipped to its public (lo, hi) and scaled to [0, 1], then
an intercept 1, so ‖x‖ ≤ √(d + 1); labels are clipped to the public label bounds and divided by
max(|lo|, |hi|), so |y| ≤ 1. XᵀX and Xᵀy are summed over the labelled examples in Beam (the data
never sits in one process: O(d²) memory), then ``sage_tfx.dp.adassp.adassp_from_moments``
releases them. An absent feature value is 0 before clipping, as the serving parser reads it.
"""
from __future__ import annotations

import json
import os
from typing import Any, Sequence

import apache_beam as beam
import numpy as np

from sage_tfx.components.dp_trainer import batching

MOMENTS_FILE = "moments"


def first_value(example: Any, key: str) -> float:
    """The first numeric value of ``key`` in a parsed tf.Example (0.0 when absent)."""
    feature = example.features.feature.get(key)
    if feature is None:
        return 0.0
    kind = feature.WhichOneof("kind")
    values = getattr(feature, kind).value if kind in ("float_list", "int64_list") else ()
    return float(values[0]) if len(values) else 0.0


def label_scale(bounds: Sequence[float]) -> float:
    """max(|lo|, |hi|): the label's divisor in training, its multiplier at serving."""
    lo, hi = bounds
    return max(abs(float(lo)), abs(float(hi)))


def row(serialized: bytes, features: Sequence[tuple], label_key: str,
        label_bounds: Sequence[float]) -> tuple:
    """(x with the intercept, y) of one labelled example."""
    from tensorflow.core.example import example_pb2
    example = example_pb2.Example.FromString(serialized)
    x = [(min(max(first_value(example, k), lo), hi) - lo) / (hi - lo) for k, lo, hi in features]
    lo_y, hi_y = label_bounds
    y = min(max(first_value(example, label_key), lo_y), hi_y) / label_scale(label_bounds)
    return np.asarray(x + [1.0], np.float64), float(y)


class Moments(beam.CombineFn):
    """(XᵀX, Xᵀy, n) of (x, y) rows."""

    def create_accumulator(self):
        return None, None, 0

    def add_input(self, acc, xy):
        x, y = xy
        xtx, xty, n = acc
        outer, cross = np.outer(x, x), x * y
        return (outer if xtx is None else xtx + outer,
                cross if xty is None else xty + cross, n + 1)

    def merge_accumulators(self, accs):
        out = (None, None, 0)
        for xtx, xty, n in accs:
            if xtx is not None:
                out = (xtx if out[0] is None else out[0] + xtx,
                       xty if out[1] is None else out[1] + xty, out[2] + n)
        return out

    def extract_output(self, acc):
        xtx, xty, n = acc
        return {"xtx": None if xtx is None else xtx.tolist(),
                "xty": None if xty is None else xty.tolist(), "n": int(n)}


def moments(pipeline: Any, file_patterns: Sequence[str], training: Any, out_dir: str) -> None:
    """Adds to ``pipeline`` the moments of the labelled examples, written to ``out_dir``."""
    feats = tuple(training.features)
    _ = (batching.read_examples(pipeline, file_patterns)
         | "Labelled" >> beam.Filter(batching.has_label, training.label_key)
         | "Rows" >> beam.Map(row, feats, training.label_key, tuple(training.label_bounds))
         | "Moments" >> beam.CombineGlobally(Moments())
         | "Json" >> beam.Map(json.dumps)
         | "Write" >> beam.io.WriteToText(os.path.join(out_dir, MOMENTS_FILE),
                                          shard_name_template="", file_name_suffix=".json"))


def read_moments(out_dir: str) -> tuple:
    """(XᵀX, Xᵀy, n) :func:`moments` wrote (None, None, 0 for no labelled example)."""
    from tfx.dsl.io import fileio
    with fileio.open(os.path.join(out_dir, MOMENTS_FILE + ".json")) as f:
        data = json.loads(f.read())
    if not data["n"]:
        return None, None, 0
    return np.asarray(data["xtx"]), np.asarray(data["xty"]), int(data["n"])


def linear_model(features: Sequence[tuple], weights: Any) -> Any:
    """The served linear model: the same clipping and scaling, then ``x · w + b`` (Keras)."""
    import tensorflow as tf
    inputs = {k: tf.keras.Input(shape=(), name=k, dtype=tf.float32) for k, _, _ in features}
    scaled = [(tf.clip_by_value(inputs[k], lo, hi) - lo) / (hi - lo) for k, lo, hi in features]
    dense = tf.keras.layers.Dense(1)
    out = dense(tf.stack(scaled, axis=1))
    model = tf.keras.Model(inputs, out)
    w = np.asarray(weights, np.float32)
    dense.set_weights([w[:-1].reshape(-1, 1), w[-1:]])
    return model


__all__ = ["linear_model", "label_scale", "moments", "read_moments", "row"]
