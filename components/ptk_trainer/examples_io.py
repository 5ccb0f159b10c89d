"""Examples artifacts <-> numpy columns for the PTK components (TensorFlow's gzip TFRecords)."""
from __future__ import annotations

import glob
import os

import numpy as np


def split_files(examples_uri: str, split: str) -> list[str]:
    return sorted(glob.glob(os.path.join(examples_uri, f"Split-{split}", "*.gz")))


def _value(feature):
    kind = feature.WhichOneof("kind")
    vals = getattr(feature, kind).value if kind else []
    if not vals:
        return None
    v = vals[0]
    return v.decode() if isinstance(v, bytes) else v


def read_split(examples_uri: str, split: str) -> tuple[list, dict]:
    """The split's serialized examples and their first values as columns (missing: NaN)."""
    import tensorflow as tf
    raw, rows = [], []
    for path in split_files(examples_uri, split):
        for rec in tf.data.TFRecordDataset(path, compression_type="GZIP").as_numpy_iterator():
            ex = tf.train.Example.FromString(rec)
            raw.append(ex)
            rows.append({k: _value(f) for k, f in ex.features.feature.items()})
    names = sorted({k for r in rows for k in r})
    cols = {}
    for k in names:
        vals = [r.get(k) for r in rows]
        if all(isinstance(v, (int, float)) or v is None for v in vals):
            cols[k] = np.array([np.nan if v is None else float(v) for v in vals])
        else:
            cols[k] = np.array(["" if v is None else str(v) for v in vals])
    return raw, cols


def write_split(examples_uri: str, split: str, examples: list) -> None:
    import tensorflow as tf
    folder = os.path.join(examples_uri, f"Split-{split}")
    os.makedirs(folder, exist_ok=True)
    with tf.io.TFRecordWriter(os.path.join(folder, "data_tfrecord-00000-of-00001.gz"),
                              options="GZIP") as w:
        for ex in examples:
            w.write(ex.SerializeToString())
