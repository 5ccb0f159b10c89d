"""Poisson-sampled DP-SGD batches built in Beam (Chua et al., NeurIPS 2024), streamed by tf.data.

The DP Trainer never holds the training set in one process. Two Beam jobs over the granted
(transformed) examples:

1. :func:`count_examples` counts the examples that carry a label (an unlabelled record is not
   trained on; dropping it is a per-record step, so neighbouring datasets stay neighbours) — n,
   which a basic plan part's σ and q are calibrated from;
2. :func:`write_batches`: every labelled example independently draws the steps it joins
   (``sage_tfx.dp.poisson_batching.assign_steps``: each of the T steps with probability q, from a
   generator seeded by OS entropy in each worker), examples are grouped by step — every step
   0..T-1 is emitted, an empty one too — and each step's batch is capped at B by the oversize
   policy (``cap_batch``: truncated to a random B, or kept whole to be chunked by the trainer).
   Each step becomes one record: a ``tf.train.Example`` with ``step`` (int64) and ``examples``
   (the serialized examples of the batch). A small JSON file beside the batches records how
   many steps were truncated.

Steps are independent and identically distributed, so the trainer may take them in any order
(:func:`read_batches`): memory is O(B · steps in flight), never O(n). The batch files hold
training data: they live in a private directory the executor deletes after training.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Iterable, Optional, Sequence

import apache_beam as beam
from tfx.dsl.io import fileio

from sage_tfx.dp import poisson_batching

STEP_FEATURE = "step"
EXAMPLES_FEATURE = "examples"
BATCH_FILE_PREFIX = "batches"
STATS_FILE = "batching_stats.json"
DROPPED = "dropped"


def has_label(serialized: bytes, label_key: str) -> bool:
    """Whether a serialized tf.Example holds a value of ``label_key`` (a finite one, for floats)."""
    from tensorflow.core.example import example_pb2
    example = example_pb2.Example.FromString(serialized)
    feature = example.features.feature.get(label_key)
    if feature is None:
        return False
    kind = feature.WhichOneof("kind")
    if kind == "float_list":
        values = feature.float_list.value
        return len(values) > 0 and all(math.isfinite(v) for v in values)
    if kind == "int64_list":
        return len(feature.int64_list.value) > 0
    if kind == "bytes_list":
        return len(feature.bytes_list.value) > 0
    return False


def batch_record(step: int, examples: Sequence[bytes]) -> bytes:
    """One step's batch as a serialized tf.Example (``step``, ``examples``)."""
    from tensorflow.core.example import example_pb2
    out = example_pb2.Example()
    out.features.feature[STEP_FEATURE].int64_list.value.append(int(step))
    out.features.feature[EXAMPLES_FEATURE].bytes_list.value.extend(list(examples))
    return out.SerializeToString()


def parse_batch_record(serialized: bytes) -> tuple[int, list]:
    """(step, serialized examples) of :func:`batch_record`."""
    from tensorflow.core.example import example_pb2
    example = example_pb2.Example.FromString(serialized)
    feats = example.features.feature
    return int(feats[STEP_FEATURE].int64_list.value[0]), list(
        feats[EXAMPLES_FEATURE].bytes_list.value)


def read_examples(pipeline: Any, file_patterns: Sequence[str]) -> Any:
    """The serialized records of TFRecord file patterns (gzip detected by suffix)."""
    reads = [pipeline | f"Read[{i}]" >> beam.io.ReadFromTFRecord(pattern)
             for i, pattern in enumerate(file_patterns)]
    return reads | "Flatten" >> beam.Flatten()


def count_examples(pipeline: Any, file_patterns: Sequence[str], label_key: str,
                   out_dir: str) -> Any:
    """Adds to ``pipeline`` the count of labelled examples, written to ``out_dir``; read it
    with :func:`read_count` after the pipeline ran."""
    return (read_examples(pipeline, file_patterns)
            | "Labelled" >> beam.Filter(has_label, label_key)
            | "Count" >> beam.combiners.Count.Globally()
            | "Json" >> beam.Map(lambda n: json.dumps({"num_examples": int(n)}))
            | "Write" >> beam.io.WriteToText(os.path.join(out_dir, "count"),
                                             shard_name_template="", file_name_suffix=".json"))


def read_count(out_dir: str) -> int:
    """The count :func:`count_examples` wrote."""
    with fileio.open(os.path.join(out_dir, "count.json")) as f:
        return int(json.loads(f.read())["num_examples"])


class AssignSteps(beam.DoFn):
    """(step, example) for every step an example joins (a generator seeded by OS entropy)."""

    def __init__(self, steps: int, q: float):
        super().__init__()
        self.steps, self.q, self.rng = int(steps), float(q), None

    def setup(self) -> None:
        self.rng = poisson_batching.new_rng()

    def process(self, serialized: bytes) -> Iterable[tuple]:
        for t in poisson_batching.assign_steps(self.rng, self.steps, self.q):
            yield int(t), serialized


class CapBatch(beam.DoFn):
    """One step's batch record under the oversize policy; the number dropped, tagged."""

    def __init__(self, max_batch: int, oversize: str):
        super().__init__()
        self.max_batch, self.oversize, self.rng = int(max_batch), oversize, None

    def setup(self) -> None:
        self.rng = poisson_batching.new_rng()

    def process(self, element: tuple) -> Iterable[Any]:
        step, grouped = element
        kept, dropped = poisson_batching.cap_batch(self.rng, list(grouped["examples"]),
                                                   self.max_batch, self.oversize)
        yield batch_record(step, kept)
        yield beam.pvalue.TaggedOutput(DROPPED, int(dropped))


class TruncationStats(beam.CombineFn):
    """(steps truncated, examples dropped) over the steps' dropped counts."""

    def create_accumulator(self):
        return 0, 0

    def add_input(self, acc, dropped):
        return acc[0] + int(dropped > 0), acc[1] + int(dropped)

    def merge_accumulators(self, accs):
        accs = list(accs)
        return sum(a[0] for a in accs), sum(a[1] for a in accs)

    def extract_output(self, acc):
        return {"truncated_steps": int(acc[0]), "dropped_examples": int(acc[1])}


def write_batches(pipeline: Any, file_patterns: Sequence[str], out_dir: str, *,
                  label_key: str, sampling_probability: float, steps: int, max_batch_size: int,
                  oversize: str, num_shards: int = 0) -> None:
    """Adds to ``pipeline`` the T Poisson batches of the labelled examples (module doc).

    Writes ``out_dir/batches-*.tfrecord.gz`` and ``out_dir/batching_stats.json``
    (``{"steps": T, "truncated_steps": k, "dropped_examples": m}``).
    """
    oversize = poisson_batching.check_oversize(oversize)
    joined = (read_examples(pipeline, file_patterns)
              | "Labelled" >> beam.Filter(has_label, label_key)
              | "AssignSteps" >> beam.ParDo(AssignSteps(steps, sampling_probability)))
    every_step = (pipeline | "Steps" >> beam.Create(range(int(steps)))
                  | "StepKey" >> beam.Map(lambda t: (int(t), None)))
    batches = ({"examples": joined, "step": every_step}
               | "GroupByStep" >> beam.CoGroupByKey()
               | "CapBatch" >> beam.ParDo(CapBatch(max_batch_size, oversize)).with_outputs(
                   DROPPED, main="batches"))
    _ = (batches.batches
         | "WriteBatches" >> beam.io.WriteToTFRecord(
             os.path.join(out_dir, BATCH_FILE_PREFIX), file_name_suffix=".tfrecord.gz",
             num_shards=num_shards))
    _ = (batches[DROPPED]
         | "Stats" >> beam.CombineGlobally(TruncationStats())
         | "StatsJson" >> beam.Map(lambda s: json.dumps({"steps": int(steps), **s}))
         | "WriteStats" >> beam.io.WriteToText(os.path.join(out_dir, "batching_stats"),
                                               shard_name_template="", file_name_suffix=".json"))


def read_stats(out_dir: str) -> dict:
    """What :func:`write_batches` recorded (steps, truncated steps, dropped examples)."""
    with fileio.open(os.path.join(out_dir, STATS_FILE)) as f:
        return json.loads(f.read())


def batch_files(out_dir: str) -> list:
    """The batch files :func:`write_batches` wrote."""
    return sorted(fileio.glob(os.path.join(out_dir, f"{BATCH_FILE_PREFIX}-*.tfrecord.gz")))


def read_batches(out_dir: str, *, num_parallel_reads: Optional[int] = 2) -> Any:
    """A ``tf.data.Dataset`` of ``(step: int64 [], examples: string [m])`` over the batch files
    (any order of steps; each step once)."""
    import tensorflow as tf
    spec = {STEP_FEATURE: tf.io.FixedLenFeature([], tf.int64),
            EXAMPLES_FEATURE: tf.io.VarLenFeature(tf.string)}

    def parse(record):
        parsed = tf.io.parse_single_example(record, spec)
        return parsed[STEP_FEATURE], tf.sparse.to_dense(parsed[EXAMPLES_FEATURE],
                                                        default_value=b"")

    files = batch_files(out_dir)
    return (tf.data.TFRecordDataset(files, compression_type="GZIP",
                                    num_parallel_reads=num_parallel_reads)
            .map(parse, num_parallel_calls=2).prefetch(2))
