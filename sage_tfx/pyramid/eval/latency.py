"""Featurization latency (Pyramid Fig. 9): cached snapshot vs uncached, per example and batched.

*Cached* is what Pyramid's application servers do (§IV): the summed tables of the live windows
stay in memory (one :class:`~sage_tfx.pyramid.Featurization`) and key hashes are memoised.
*Uncached* re-reads and re-sums the live windows' sealed tables from the store for every request
and hashes every key afresh, as a server without a local snapshot would.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import pandas as pd

from sage_tfx.pyramid.windows import PyramidStore


def _median_ms(fn, reps: int) -> tuple[float, float]:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times)), float(np.percentile(times, 90))


def measure(store: PyramidStore, requests: pd.DataFrame, batch_sizes: Sequence[int] = (1, 100),
            reps: int = 50, uncached_reps: int = 10) -> list[dict]:
    """Median / p90 latency (ms) of featurizing ``batch`` rows, cached and uncached."""
    rows = []
    cached = store.featurization(cache=True)
    cached.featurize(requests.iloc[:1000])          # warm the hash memo, as a running server
    rng = np.random.default_rng(0)
    for batch in batch_sizes:
        def pick():
            return requests.iloc[rng.integers(0, len(requests), batch)]
        med, p90 = _median_ms(lambda: cached.featurize(pick(), cache=True), reps)
        rows.append(dict(mode="cached", batch=batch, median_ms=med, p90_ms=p90,
                         per_example_ms=med / batch))
        med, p90 = _median_ms(
            lambda: store.featurization(cache=False).featurize(pick(), cache=False), uncached_reps)
        rows.append(dict(mode="uncached", batch=batch, median_ms=med, p90_ms=p90,
                         per_example_ms=med / batch))
    return rows


def serialize(frame: pd.DataFrame, features: Sequence[str]) -> list[bytes]:
    """Rows as serialized tf.Examples (ints as int64, everything else as UTF-8 bytes)."""
    import tensorflow as tf
    out = []
    cols = {f: frame[f].tolist() for f in features}
    for i in range(len(frame)):
        ex = tf.train.Example()
        for f in features:
            v = cols[f][i]
            if isinstance(v, (int, np.integer)):
                ex.features.feature[f].int64_list.value.append(int(v))
            else:
                ex.features.feature[f].bytes_list.value.append(str(v).encode())
        out.append(ex.SerializeToString())
    return out


def measure_graph(store: PyramidStore, requests: pd.DataFrame, model_dir: str,
                  batch_sizes: Sequence[int] = (1, 100), reps: int = 50,
                  uncached_reps: int = 5) -> list[dict]:
    """Latency of the in-graph featurizer (:mod:`sage_tfx.pyramid.graph`) on serialized raw
    tf.Examples: *cached* = the SavedModel loaded once (a serving process); *uncached* = the
    SavedModel loaded from disk for every request (no resident snapshot)."""
    import tensorflow as tf
    from sage_tfx.pyramid.graph import example_feature_kinds, save_featurizer
    feat = store.featurization(cache=True)
    recs = serialize(requests, feat.spec.features)
    save_featurizer(feat, model_dir, example_feature_kinds(recs[0], feat.spec.features))
    serve = tf.saved_model.load(model_dir).signatures["serving_default"]
    serve(examples=tf.constant(recs[:1000]))                # trace / warm, as a running server
    rng = np.random.default_rng(0)
    rows = []
    for batch in batch_sizes:
        def pick():
            return tf.constant([recs[i] for i in rng.integers(0, len(recs), batch)])
        med, p90 = _median_ms(lambda: serve(examples=pick()), reps)
        rows.append(dict(mode="cached", batch=batch, median_ms=med, p90_ms=p90,
                         per_example_ms=med / batch))
        med, p90 = _median_ms(lambda: tf.saved_model.load(model_dir).signatures[
            "serving_default"](examples=pick()), uncached_reps)
        rows.append(dict(mode="uncached", batch=batch, median_ms=med, p90_ms=p90,
                         per_example_ms=med / batch))
    return rows
