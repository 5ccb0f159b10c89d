"""The Beam flow of DPBaggingTrainer: teachers and their votes.

    private tf.Examples ──parse──> (unit, x, y)
        ──one packed copy: X [N, d], y [N], chunk ids [N, k]──>
        partitions 0..k-1, each trains its n teachers from the packed copy (a side input)
        ──votes on the first p public points──> one int count matrix

Memory is O(N·d + N·k) — every row once, plus its k int32 chunk ids — instead of shuffling every
row k times (an earlier ``EmitKTimes`` → ``GroupByKey`` flow moved k·N rows: 555 MB more than the
library path at N = 4,000, k = 80). A partition trains exactly as
``sage_tfx.bagging.teachers.train_teachers`` does for that partition.

Teachers are written to a private scratch directory (never into an output artifact) so the
driver can cache them per window; the count matrix is the only thing the noisy argmax sees.
Everything written there (teachers, the privacy units, the vote counts: all private) is
encrypted (``sage_tfx.bagging.encrypted``) with a data key of this run, which the steps receive
wrapped by the KEK (``$SAGE_KEY_PROVIDER``; a worker never makes a KEK of its own) and the
driver keeps in memory only; nothing is unpickled before it authenticates.
Chunks without rows get the library's default teacher (all-zero weights / constant class 0),
exactly as ``sage_tfx.bagging.teachers.train_teachers`` does.
"""
from __future__ import annotations

import functools
import os
from typing import Optional, Sequence

import apache_beam as beam
import numpy as np

from sage_tfx.bagging import encrypted
from sage_tfx.bagging.partition import chunk_assignment
from sage_tfx.bagging.teachers import TeacherEnsemble, train_teachers
from sage_tfx.ledger import keys

__all__ = ["parse_examples", "run_teacher_flow"]


def _value(feature):
    kind = feature.WhichOneof("kind")
    vals = getattr(feature, kind).value if kind else []
    return vals[0] if len(vals) else None


def parse_examples(serialized: Sequence[bytes], keys: Sequence[str]) -> list[list]:
    """Values of ``keys`` (first value, None if absent) of each serialized tf.Example."""
    import tensorflow as tf
    out = []
    for record in serialized:
        ex = tf.train.Example.FromString(record)
        out.append(
            [_value(ex.features.feature[k]) if k in ex.features.feature else None for k in keys])
    return out


class _Parse(beam.DoFn):
    def __init__(self, feature_keys, label_key, unit_key, mean, std):
        self.keys = list(feature_keys) + [label_key, unit_key]
        self.mean, self.std = np.asarray(mean), np.asarray(std)

    def process(self, record):
        [row] = parse_examples([record], self.keys)
        *x, label, unit = row
        if label is None or unit is None:
            raise ValueError("every private example needs its label and privacy unit")
        x = np.array([self.mean[i] if v is None else float(v) for i, v in enumerate(x)])
        unit = unit.decode("utf-8") if isinstance(unit, bytes) else int(unit)
        yield unit, (x - self.mean) / self.std, int(label)


def _pack(rows, *, k, n, salt, d):
    """Every parsed row once, as arrays: (X [N, d], y [N], chunk ids [N, k] int32)."""
    if not rows:
        return np.zeros((0, d)), np.zeros(0, np.int64), np.zeros((0, k), np.int32)
    X = np.stack([r[1] for r in rows]).astype(np.float64)
    y = np.fromiter((r[2] for r in rows), dtype=np.int64, count=len(rows))
    return X, y, chunk_assignment([r[0] for r in rows], k=k, n=n, salt=salt)


def _train_partition(i, packed, *, n, kind, l2, n_classes, max_depth):
    """The n teachers of partition i, as ((i, j), teacher), from the packed rows."""
    X, y, chunks = packed
    if len(y) == 0:
        return
    ens = train_teachers(X, y, chunks[:, i:i + 1], n=n, kind=kind, n_classes=n_classes, l2=l2,
                         max_depth=max_depth)
    for j in range(n):
        yield (i, j), (ens.coef[0, j] if kind == "logistic" else ens.trees[j])


def _votes(item, X_vote, n_classes):
    _, teacher = item
    if isinstance(teacher, np.ndarray):
        pred = (X_vote @ teacher[:-1] + teacher[-1] > 0).astype(np.int64)
    elif isinstance(teacher, int):
        pred = np.full(len(X_vote), teacher)
    else:
        pred = teacher.predict(X_vote).astype(np.int64)
    counts = np.zeros((len(X_vote), n_classes), dtype=np.int64)
    counts[np.arange(len(X_vote)), pred] = 1
    return counts


_KEY_AAD = keys.aad_for("bagging-scratch", "run-key")


def _file_aad(name: str) -> bytes:
    return keys.aad_for("bagging-scratch", name)


@functools.lru_cache(maxsize=8)
def _scratch_key(wrapped: bytes) -> keys.DataKey:
    """The run's scratch key, unwrapped once per worker process with the platform's KEK."""
    return keys.DataKey.unwrap(keys.provider(create=False), wrapped, _KEY_AAD)


def _save(obj, path, wrapped):
    encrypted.write_object(path, obj, _scratch_key(wrapped), _file_aad(os.path.basename(path)))


def run_teacher_flow(files: Sequence[str], *, read_records, feature_keys, label_key, unit_key,
                     mean, std, k: int, n: int, salt: bytes, kind: str, l2: float,
                     X_vote: Optional[np.ndarray], scratch: str, n_classes: int = 2,
                     max_depth: int = 3, beam_options=None):
    """Runs the flow; returns (TeacherEnsemble, counts [len(X_vote), C] or None, unit ids)."""
    d = len(feature_keys)
    X_vote = None if X_vote is None else np.asarray(X_vote, dtype=np.float64)

    os.makedirs(scratch, mode=0o700, exist_ok=True)
    run_key = keys.DataKey.new()
    wrapped = run_key.wrap(keys.provider(), _KEY_AAD)
    with beam.Pipeline(options=beam_options) as p:
        rows = (p | "Files" >> beam.Create(list(files)) | "Reshuffle" >> beam.Reshuffle()
                | "Read" >> beam.FlatMap(read_records)
                | "Parse" >> beam.ParDo(_Parse(feature_keys, label_key, unit_key, mean, std)))
        packed = (rows | "AllRows" >> beam.combiners.ToList()
                  | "Pack" >> beam.Map(_pack, k=k, n=n, salt=salt, d=d))
        teachers = (p | "Partitions" >> beam.Create(list(range(k)))
                    | "TrainPartition" >> beam.FlatMap(
                        _train_partition, beam.pvalue.AsSingleton(packed), n=n, kind=kind,
                        l2=l2, n_classes=n_classes, max_depth=max_depth))
        _ = (teachers | "AllTeachers" >> beam.combiners.ToList()
             | "SaveTeachers" >> beam.Map(_save, os.path.join(scratch, "teachers.tink"), wrapped))
        _ = (rows | "Units" >> beam.Map(lambda r: r[0]) | "Distinct" >> beam.Distinct()
             | "UnitList" >> beam.combiners.ToList()
             | "SaveUnits" >> beam.Map(_save, os.path.join(scratch, "units.tink"), wrapped))
        if X_vote is not None and len(X_vote):
            _ = (teachers | "Votes" >> beam.Map(_votes, X_vote, n_classes)
                 | "CountMatrix" >> beam.CombineGlobally(
                     lambda cs: sum(cs, np.zeros((len(X_vote), n_classes), np.int64)))
                 | "SaveCounts" >> beam.Map(_save, os.path.join(scratch, "counts.tink"), wrapped))

    def load(name, default=None):
        path = os.path.join(scratch, name)
        if not os.path.exists(path):
            return default
        return encrypted.read_object(path, run_key, _file_aad(name))

    trained = dict(load("teachers.tink", []))
    units = load("units.tink", [])
    if kind == "logistic":
        coef = np.zeros((k, n, d + 1))
        for (i, j), w in trained.items():
            coef[i, j] = w
        ensemble = TeacherEnsemble("logistic", k, n, n_classes, d, coef=coef)
    else:
        trees = tuple(trained.get((i, j), 0) for i in range(k) for j in range(n))
        ensemble = TeacherEnsemble("tree", k, n, n_classes, d, trees=trees)
    counts = load("counts.tink")
    return ensemble, (None if counts is None else np.asarray(counts, dtype=np.int32)), units
