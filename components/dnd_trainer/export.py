"""A GLM weight vector as a serving SavedModel (what DPModelValidator and Pusher take).

Signature ``serving_default``: one string tensor ``examples`` of serialized tf.Examples in; one
output per example: ``probabilities`` (logistic: P(y = 1)) or ``predictions`` (linear: the mean,
poisson: exp of the linear predictor). Features are parsed with their stored type, mapped to
[0, 1] with the public bounds exactly as clients map them (clipped), and a missing feature takes
its bounds' midpoint (public, like the bounds).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Sequence

import numpy as np

from sage_tfx.components.dnd_trainer.protocol import FeatureSpec

PROBABILITIES = "probabilities"
PREDICTIONS = "predictions"
MODEL_FILE = "dnd_model.json"   # the weights and features beside the SavedModel (public: DP output)


def output_key(family: str) -> str:
    return PROBABILITIES if family == "logistic" else PREDICTIONS


def export_glm(family: str, weights: np.ndarray, features: Sequence[FeatureSpec],
               path: str) -> None:
    """Writes the SavedModel of ``weights`` ([b₀, b₁, …, b_p]) to ``path``."""
    import tensorflow as tf

    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (len(features) + 1,) or not np.all(np.isfinite(w)):
        raise ValueError(f"weights must be {len(features) + 1} finite numbers, got {w.shape}")
    keys = [f.key for f in features]
    lo = np.array([f.lower for f in features])
    span = np.array([f.upper for f in features]) - lo
    parse_spec = {f.key: (tf.io.FixedLenFeature([], tf.int64, default_value=int(round(f.midpoint)))
                          if f.dtype == "int" else
                          tf.io.FixedLenFeature([], tf.float32, default_value=f.midpoint))
                  for f in features}
    out = output_key(family)

    class GLM(tf.Module):
        def __init__(self):
            super().__init__()
            self.b0 = tf.constant(w[0], tf.float64)
            self.w = tf.constant(w[1:], tf.float64)
            self.lo = tf.constant(lo, tf.float64)
            self.span = tf.constant(span, tf.float64)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def serve(self, examples):
            parsed = tf.io.parse_example(examples, parse_spec)
            x = tf.stack([tf.cast(parsed[k], tf.float64) for k in keys], axis=1)
            x = tf.clip_by_value((x - self.lo) / self.span, 0.0, 1.0)
            eta = tf.linalg.matvec(x, self.w) + self.b0
            if family == "logistic":
                y = tf.sigmoid(eta)
            elif family == "poisson":
                y = tf.exp(tf.minimum(eta, 50.0))
            else:
                y = eta
            return {out: tf.cast(y, tf.float32)}

    module = GLM()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    with tf.io.gfile.GFile(os.path.join(path, MODEL_FILE), "w") as f:
        f.write(json.dumps({"family": family, "weights": w.tolist(),
                            "features": [dataclasses.asdict(ft) for ft in features]}, indent=2))
