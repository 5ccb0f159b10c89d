"""Count featurization inside the TF graph: a snapshot as a ``tf.Module`` over raw tf.Examples.

:func:`featurizer_module` turns a :class:`~sage_tfx.pyramid.featurize.Featurization` whose spec
uses the ``"tf_siphash"`` hash family into a ``tf.Module`` that maps serialized raw tf.Examples
to the same count features as :meth:`Featurization.featurize` (same names, same order): it parses
the counted columns, encodes every key as :func:`sage_tfx.dp.counts.encode_key_text` does, hashes
it with ``tf.strings.to_hash_bucket_strong`` under the rows' SipHash keys, reads the summed sketch
cells (non-trainable variables, so a 2^20-wide sketch does not bloat the graph proto), takes the
min (count-min) or median of signed cells (count-median), and applies the same rates with
back-off to the prior. The module saved by :func:`save_featurizer` is a SavedModel with the
signature ``serving_default(examples: string[None]) -> {"features": float32[None, F]}``; a
trained model that wraps it serves raw tf.Examples with no Python and no snapshot beside it.

Only the first value of each counted feature is used (as the Python featurizer reads examples);
a missing feature is the missing key ``"N"``. Counted features are int64 or bytes in the
tf.Example (``feature_kinds``); float features are not categorical and are refused.

TensorFlow is imported inside the functions only (the core imports no TF at import time).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from sage_tfx.dp.counts import COUNT_MEDIAN, HASH_TF_SIPHASH, siphash_keys
from sage_tfx.errors import InvalidRequestError
from sage_tfx.pyramid.featurize import Featurization, NonCategoricalError, UnknownFeatureError

__all__ = ["INT", "BYTES", "FEATURES_OUTPUT", "featurizer_module", "save_featurizer",
           "example_feature_kinds"]

INT, BYTES = "int64", "bytes"
FEATURES_OUTPUT = "features"


def example_feature_kinds(records, features) -> dict[str, str]:
    """``{feature: "int64" | "bytes"}`` read off serialized tf.Examples (one, or an iterable:
    the first example that carries a feature gives its type)."""
    import tensorflow as tf
    kinds: dict[str, str] = {}
    for record in ([records] if isinstance(records, bytes) else records):
        ex = tf.train.Example.FromString(record)
        for f in features:
            feat = ex.features.feature.get(f)
            kind = feat.WhichOneof("kind") if feat is not None else None
            if f in kinds or kind is None:
                continue
            if kind == "float_list":
                raise NonCategoricalError(f"feature {f!r} is a float: bin it first")
            kinds[f] = INT if kind == "int64_list" else BYTES
        if len(kinds) == len(set(features)):
            return kinds
    missing = [f for f in features if f not in kinds]
    raise UnknownFeatureError(f"feature(s) {missing} are in no example: cannot tell their type")


def _check(feat: Featurization, feature_kinds: Mapping[str, str]) -> None:
    if not isinstance(feat, Featurization):
        raise InvalidRequestError("need a Featurization (a snapshot of the live windows)")
    if feat.spec.hash_family != HASH_TF_SIPHASH:
        raise InvalidRequestError(
            f"in-graph featurization needs a count spec with hash_family={HASH_TF_SIPHASH!r}, "
            f"got {feat.spec.hash_family!r} (its tables cannot be read by a TF graph)")
    missing = [f for f in feat.spec.features if f not in feature_kinds]
    if missing:
        raise UnknownFeatureError(f"no tf.Example type for feature(s) {missing}")
    bad = {f: k for f, k in feature_kinds.items() if k not in (INT, BYTES)}
    if bad:
        raise NonCategoricalError(f"counted features must be {INT!r} or {BYTES!r}, got {bad}")


def _cells(cells) -> np.ndarray:
    c = np.asarray(cells)
    return c.astype(np.float64) if c.dtype.kind == "f" else c.astype(np.int64)


def featurizer_module(feat: Featurization, feature_kinds: Mapping[str, str]) -> Any:
    """A ``tf.Module`` computing ``feat``'s count features in-graph (see the module docstring).

    Its tf.functions: ``featurize_serialized(examples)`` (string[None] -> float32[None, F]) and
    ``featurize(values)`` (a dict of raw [None] tensors, int64 or string -> float32[None, F]).
    """
    import tensorflow as tf
    _check(feat, feature_kinds)
    spec = feat.spec
    kinds = {f: feature_kinds[f] for f in spec.features}
    groups = [(spec.group_name(g), g) for g in spec.groups]

    class PyramidFeaturizer(tf.Module):
        def __init__(self):
            super().__init__(name="pyramid_featurizer")
            # int64 cells (discrete Laplace, basic streams) or float64 (Laplace, rdp streams)
            self.cells = [tf.Variable(_cells(feat.cells[name]), trainable=False,
                                      name=f"cells_{i}") for i, (name, _) in enumerate(groups)]
            self.prior = tf.constant(feat.prior, tf.float64)
            self.noise_var = [tf.constant(float(feat.noise_var.get(name, 0.0)), tf.float64)
                              for name, _ in groups]
            self.feature_names = tf.constant(feat.feature_names())

        def _key(self, values, group):
            parts = [values[f] for f in group]
            if len(group) == 1:
                return parts[0]
            return tf.strings.join(
                ["T"] + [x for p in parts
                         for x in (tf.strings.as_string(tf.strings.length(p)), ":", p)])

        def _estimate(self, cells, keys, salt):
            hs = [tf.strings.to_hash_bucket_strong(keys, 2 * spec.width, key=list(k))
                  for k in siphash_keys(salt, spec.depth)]
            vals = []
            for r, h in enumerate(hs):
                v = tf.cast(tf.gather(cells[r], h // 2), tf.float64)          # batch × labels
                if spec.kind == COUNT_MEDIAN:
                    v = v * tf.cast(2 * (h % 2) - 1, tf.float64)[:, None]
                vals.append(v)
            vals = tf.stack(vals, axis=1)                                      # batch × h × L
            if spec.kind != COUNT_MEDIAN:
                return tf.reduce_min(vals, axis=1)
            s = tf.sort(vals, axis=1)
            mid = spec.depth // 2
            return s[:, mid] if spec.depth % 2 else (s[:, mid - 1] + s[:, mid]) / 2.0

        def _rates(self, est, noise_var):
            c = tf.maximum(est, 0.0)
            n = tf.reduce_sum(c, axis=1)
            p = c / n[:, None]
            ps = (c + self.prior) / (n[:, None] + 1.0)
            var = tf.reduce_max(ps * (1 - ps), axis=1) / n \
                + noise_var * tf.reduce_sum(ps ** 2, axis=1) / n ** 2
            bad = ~(n > 0) | ~tf.math.is_finite(var) | (var > feat.max_variance)
            p = tf.where(bad[:, None], tf.broadcast_to(self.prior, tf.shape(p)), p)
            return p, n

        @tf.function(input_signature=[{f: tf.TensorSpec([None], tf.int64 if k == INT
                                                         else tf.string, name=f)
                                       for f, k in kinds.items()}])
        def featurize(self, values):
            enc = {}
            for f, k in kinds.items():
                v = values[f]
                enc[f] = tf.strings.join(["I", tf.strings.as_string(v)]) if k == INT \
                    else tf.strings.join(["S", v])
            return self._features(enc)

        def _features(self, enc):
            cols = []
            for (name, g), cells, nv in zip(groups, self.cells, self.noise_var):
                est = self._estimate(cells, self._key(enc, g), spec.group_salt(g))
                p, n = self._rates(est, nv)
                cols += [p[:, 1:], tf.math.log1p(n)[:, None]]
            return tf.cast(tf.concat(cols, axis=1), tf.float32)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def featurize_serialized(self, examples):
            parsed = tf.io.parse_example(examples, {
                f: tf.io.VarLenFeature(tf.int64 if k == INT else tf.string)
                for f, k in kinds.items()})
            enc = {}
            for f, k in kinds.items():
                rag = tf.RaggedTensor.from_sparse(parsed[f])
                present = rag.row_lengths() > 0
                first = rag[:, :1].to_tensor(default_value=0 if k == INT else "",
                                             shape=[None, 1])[:, 0]
                text = tf.strings.join(["I", tf.strings.as_string(first)]) if k == INT \
                    else tf.strings.join(["S", first])
                enc[f] = tf.where(present, text, tf.fill(tf.shape(text), "N"))
            return self._features(enc)

    return PyramidFeaturizer()


def save_featurizer(feat: Featurization, path: str, feature_kinds: Mapping[str, str]) -> Any:
    """Saves :func:`featurizer_module` as a SavedModel at ``path`` (signature in the module
    docstring) and returns the module."""
    import tensorflow as tf
    module = featurizer_module(feat, feature_kinds)
    serve = module.featurize_serialized.get_concrete_function()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serving(examples):
        return {FEATURES_OUTPUT: module.featurize_serialized(examples)}

    tf.saved_model.save(module, path, signatures={"serving_default": serving,
                                                  "featurize_serialized": serve})
    return module
