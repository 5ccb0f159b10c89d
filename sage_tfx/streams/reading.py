"""Reading granted blocks back: the values of one feature in the blocks a grant released.

For in-process consumers of a grant (a DP statistic, a notebook); TFX pipelines read blocks with
``BlockExampleGen``. Only ever pass ``Grant.locations``: the ledger hands out locations after the
charge committed, and reading anything else would bypass the gate. TensorFlow is imported when
a function runs, never at import time.
"""
from __future__ import annotations

import glob
from typing import Sequence

import numpy as np

from sage_tfx.streams.blocks import block_files_glob


def block_files(locations: Sequence[str]) -> list[str]:
    """The data files of the blocks at ``locations`` (each a block directory), in order."""
    return [f for loc in locations for f in sorted(glob.glob(block_files_glob(loc)))]


def read_float_feature(locations: Sequence[str], name: str) -> np.ndarray:
    """Every value of the float (or int) feature ``name`` in the blocks; absent values are skipped.

    Raises:
      FileNotFoundError: a location holds no block file.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    empty = [loc for loc in locations if not glob.glob(block_files_glob(loc))]
    if empty:
        raise FileNotFoundError(f"no block file in {empty[:3]}")
    ds = tf.data.TFRecordDataset(block_files(locations), compression_type="GZIP").batch(4096)
    spec = {name: tf.io.VarLenFeature(tf.float32)}
    out = [tf.io.parse_example(batch, spec)[name].values.numpy() for batch in ds]
    return np.concatenate(out).astype(np.float64) if out else np.zeros(0)
