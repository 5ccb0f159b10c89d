"""Data for DPTrainer run_fns: a split's gzip TFRecords of tf.Example -> numpy, and the same
featurization in TensorFlow for the serving graph, so training and serving agree.

Used through :mod:`sage_tfx.components.dp_trainer.run_fn_utils` (the run_fn author's one import).
Reading a split is no release: the numpy arrays stay inside the run_fn, which must train with DP.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
from tfx.dsl.io import fileio

_READ_BATCH = 4096



@dataclasses.dataclass(frozen=True)
class Column:
    """A numeric model input: a (transformed) feature, its default, optional public bounds.

    Featurization (identical in :func:`featurize` and :func:`featurize_tf`): the feature's first
    value, ``default`` if absent (or NaN); then, if both bounds are given, clipped to
    ``[min, max]`` and scaled to ``[0, 1]``. The bounds must be public (chosen without looking at
    the data): they fix the sensitivity of AdaSSP / logistic regression.
    """

    name: str
    default: float = 0.0
    min: Optional[float] = None
    max: Optional[float] = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a column needs a feature name, got {self.name!r}")
        if (self.min is None) != (self.max is None):
            raise ValueError(f"column {self.name!r}: give both min and max, or neither")
        for v in (self.default, self.min, self.max):
            if v is not None and not math.isfinite(float(v)):
                raise ValueError(f"column {self.name!r}: default and bounds must be finite")
        if self.min is not None and not float(self.min) < float(self.max):
            raise ValueError(f"column {self.name!r}: min must be < max, got {self.min}, "
                             f"{self.max}")

    @property
    def scaled(self) -> bool:
        return self.min is not None


ColumnsSpec = Union[Mapping[str, Any], Sequence[Any]]


def columns_from_config(spec: ColumnsSpec) -> tuple[Column, ...]:
    """Columns from a custom_config value.

    Accepts ``{"name": {"default": 0, "min": 0, "max": 24}, ...}``, ``{"name": default}``, or a
    list of names / such dicts with a ``name`` key. A mapping's columns are taken in sorted name
    order: TFX serializes custom_config with sorted keys, so insertion order would not survive
    the trip into the executor (a list keeps its order).
    """
    if isinstance(spec, Mapping):
        items = sorted(spec.items())
    else:
        items = [(s, None) if isinstance(s, str) else (s["name"], s) for s in spec]
    out = []
    for name, value in items:
        if value is None:
            out.append(Column(name))
        elif isinstance(value, Mapping):
            out.append(Column(name, float(value.get("default", 0.0)),
                              _opt_float(value.get("min")), _opt_float(value.get("max"))))
        else:
            out.append(Column(name, float(value)))
    if not out:
        raise ValueError("no feature columns given")
    if len({c.name for c in out}) != len(out):
        raise ValueError(f"duplicate feature columns: {[c.name for c in out]}")
    return tuple(out)


def _opt_float(v: Any) -> Optional[float]:
    return None if v is None else float(v)


INT, FLOAT, BYTES = "int", "float", "bytes"


@dataclasses.dataclass(frozen=True)
class SplitData:
    """One split read into numpy.

    Attributes:
      features: (n, d) float32 featurized columns (:func:`featurize`).
      labels: (n,) float64 raw label values, NaN where absent (None without a label key).
      raw: {name: (n,) float64 raw first values, NaN where absent} of the columns (and label).
      kinds: {name: "int" | "float" | "bytes" | None (never present)} as stored in the records.
      num_records: n, records read.
    """

    features: np.ndarray
    labels: Optional[np.ndarray]
    raw: dict
    kinds: dict
    num_records: int

    @property
    def num_examples(self) -> int:
        return self.num_records


def _compression(path: str) -> str:
    with fileio.open(path, "rb") as f:
        return "GZIP" if f.read(2) == b"\x1f\x8b" else ""


def data_files(file_patterns: Sequence[str]) -> list[str]:
    """The files of TFX file patterns such as ``fn_args.train_files`` (sorted, de-duplicated)."""
    files: list[str] = []
    for pattern in file_patterns:
        files.extend(fileio.glob(pattern))
    return sorted(set(files))


def serialized_records(file_patterns: Sequence[str], batch_size: int = _READ_BATCH):
    """Batches (lists) of serialized records of gzip (or uncompressed) TFRecord files."""
    for path in data_files(file_patterns):
        ds = tf.data.TFRecordDataset(path, compression_type=_compression(path))
        for batch in ds.batch(batch_size).as_numpy_iterator():
            yield list(batch)


def count_records(file_patterns: Sequence[str]) -> int:
    """Number of records in the files of TFX file patterns."""
    total = 0
    for path in data_files(file_patterns):
        ds = tf.data.TFRecordDataset(path, compression_type=_compression(path))
        total += int(ds.reduce(np.int64(0), lambda n, _: n + 1).numpy())
    return total


def _first_values(column: Any) -> tuple[np.ndarray, Optional[str]]:
    """(first value per row as float64, NaN if none; kind) of an Arrow list column."""
    import pyarrow as pa
    import pyarrow.compute as pc
    value_type = column.type.value_type
    if pa.types.is_integer(value_type):
        kind = INT
    elif pa.types.is_floating(value_type):
        kind = FLOAT
    elif pa.types.is_null(value_type):  # never present in this batch
        return np.full(len(column), np.nan), None
    else:
        kind = BYTES
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
    out = np.full(len(column), np.nan)
    if kind == BYTES:
        return out, kind
    flat = column.flatten().to_numpy(zero_copy_only=False).astype(np.float64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    has = lengths > 0
    out[has] = flat[starts[has]]
    return out, kind


def read_columns(file_patterns: Sequence[str], names: Sequence[str]
                 ) -> tuple[dict, dict, int]:
    """Reads the first value of each named feature from tf.Example TFRecords.

    Types are inferred per record batch (tfx_bsl's decoder), so int64 and float features both
    work without a schema. Absent values are NaN.

    Returns:
      ``({name: (n,) float64}, {name: kind or None}, n)``.

    Raises:
      ValueError: a named feature holds strings (only numeric features are supported).
    """
    from tfx_bsl.coders import example_coder
    decoder = example_coder.ExamplesToRecordBatchDecoder()
    chunks: dict[str, list] = {name: [] for name in names}
    kinds: dict[str, Optional[str]] = {name: None for name in names}
    n = 0
    for batch in serialized_records(file_patterns):
        record_batch = decoder.DecodeBatch(batch)
        fields = record_batch.schema.names
        for name in names:
            if name in fields:
                values, kind = _first_values(record_batch.column(fields.index(name)))
                if kind == BYTES:
                    raise ValueError(f"feature {name!r} holds strings; DP trainers read numeric "
                                     "features only (encode categories in the transform)")
                if kind is not None:
                    if kinds[name] not in (None, kind):
                        raise ValueError(f"feature {name!r} is {kinds[name]} in some records "
                                         f"and {kind} in others")
                    kinds[name] = kind
            else:
                values = np.full(len(batch), np.nan)
            chunks[name].append(values)
        n += len(batch)
    raw = {name: (np.concatenate(parts) if parts else np.zeros(0))
           for name, parts in chunks.items()}
    return raw, kinds, n


def featurize(raw: Mapping[str, np.ndarray], columns: Sequence[Column]) -> np.ndarray:
    """The (n, d) float32 model input of raw first values (NaN = absent); see :class:`Column`."""
    cols = []
    for c in columns:
        v = np.asarray(raw[c.name], dtype=np.float64).astype(np.float32)
        v = np.where(np.isnan(v), np.float32(c.default), v)
        if c.scaled:
            lo, hi = np.float32(c.min), np.float32(c.max)
            v = (np.clip(v, lo, hi) - lo) / (hi - lo)
        cols.append(v.astype(np.float32))
    return np.stack(cols, axis=1)


def read_split(fn_args: Any, split: str, columns: Sequence[Column], *,
               label_key: Optional[str] = None) -> SplitData:
    """Reads the ``train`` or ``eval`` files of ``fn_args`` into numpy.

    With a transform graph, ``examples`` are the Transform's transformed examples, so columns and
    label name *transformed* features.

    Args:
      fn_args: The run_fn's FnArgs.
      split: ``"train"`` (``fn_args.train_files``) or ``"eval"`` (``fn_args.eval_files``).
      columns: The model's input columns.
      label_key: The label feature, read raw (NaN where absent); None for no label.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    patterns = fn_args.train_files if split == "train" else fn_args.eval_files
    names = [c.name for c in columns] + ([label_key] if label_key else [])
    raw, kinds, n = read_columns(patterns, list(dict.fromkeys(names)))
    if n == 0:
        raise ValueError(f"the {split} split has no records ({patterns})")
    return SplitData(features=featurize(raw, columns),
                     labels=raw[label_key] if label_key else None,
                     raw=raw, kinds=kinds, num_records=n)


def _first_value_tf(t: Any, batch: Any) -> tuple[Any, Any]:
    """(first value as float32 [batch], present bool [batch]) of a dense / sparse / ragged input."""
    if isinstance(t, tf.RaggedTensor):
        t = t.to_sparse()
    if isinstance(t, tf.SparseTensor):
        batch64 = tf.cast(batch, tf.int64)
        first = tf.sparse.reset_shape(tf.sparse.slice(t, [0, 0], tf.stack([batch64, 1])),
                                      tf.stack([batch64, 1]))
        values = tf.sparse.to_dense(first, default_value=tf.zeros([], first.dtype))[:, 0]
        present = tf.sparse.to_dense(
            tf.SparseTensor(first.indices, tf.ones_like(first.values, tf.bool), first.dense_shape),
            default_value=False)[:, 0]
        return tf.cast(values, tf.float32), present
    t = tf.reshape(t, tf.stack([batch, -1]))[:, 0]
    return tf.cast(t, tf.float32), tf.ones_like(t, tf.bool)


def featurize_tf(features: Mapping[str, Any], columns: Sequence[Column], batch: Any = None
                 ) -> Any:
    """TensorFlow twin of :func:`featurize` on parsed (or transformed) features: [batch, d]."""
    if batch is None:
        any_t = next(iter(features.values()))
        batch = (any_t.dense_shape[0] if isinstance(any_t, tf.SparseTensor)
                 else tf.shape(any_t)[0])
    batch = tf.cast(batch, tf.int32)
    cols = []
    for c in columns:
        if c.name in features:
            v, present = _first_value_tf(features[c.name], batch)
            v = tf.where(present & ~tf.math.is_nan(v), v, tf.constant(c.default, tf.float32))
        else:
            v = tf.fill(tf.expand_dims(batch, 0), tf.constant(c.default, tf.float32))
        if c.scaled:
            lo, hi = tf.constant(c.min, tf.float32), tf.constant(c.max, tf.float32)
            v = (tf.clip_by_value(v, lo, hi) - lo) / (hi - lo)
        cols.append(v)
    return tf.stack(cols, axis=1)
