"""The Beam pipeline of the splitter: records -> (block id, tf.train.Example) -> one file per block.

Imported by ``sage_tfx.streams.splitter`` only when a split runs (importing Beam takes seconds).
Workers import TensorFlow in ``DoFn.setup`` only to read TFRecord input; CSV rows are serialized
by ``sage_tfx.streams.example_codec``, and every block is written encrypted with a fresh data key
of its own (:mod:`sage_tfx.streams.blockfiles`), wrapped on the worker by the KEK the driver
names (a provider spec, never key material). Shape of the pipeline:

    files -> ParDo(read + type + assign block) -> GroupByKey(block id) -> ParDo(encrypt + write)
                    \\-> malformed (tagged output) -> count, first examples, counts by reason

One ``GroupByKey`` and one writing ``DoFn`` serve any number of blocks (a year of daily blocks is
~366 groups), instead of one Beam sink per block. The pipeline writes into a staging directory
only; ``sage_tfx.streams.splitter`` moves finished blocks into block storage.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from typing import Any, Iterable, Iterator, Optional, Sequence

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter

from sage_tfx.streams import records
from sage_tfx.streams.blocks import BlockScheme, MalformedValueError

METRICS_NAMESPACE = "sage_tfx.split"
_MALFORMED = "malformed"

# Records buffered per reader before they are emitted grouped by block.
CHUNK_RECORDS = 20_000
# Progress lines: every this many records read (per file) / blocks written (per worker).
PROGRESS_RECORDS = 100_000
PROGRESS_BLOCKS = 100


def _progress(verbose: bool, message: str) -> None:
    if verbose:
        print(f"[sage-tfx split] {message}", file=sys.stderr, flush=True)


def _malformed(source: str, position: int, reason: str, column: Optional[str] = None,
               value: Any = None, has_value: bool = False) -> beam.pvalue.TaggedOutput:
    record = {"source": source, "position": position, "reason": reason, "column": column,
              "value": records.short_repr(value) if has_value else None}
    return beam.pvalue.TaggedOutput(_MALFORMED, record)


class _ReadAndAssign(beam.DoFn):
    """Base of the readers: one input file in, (block id, [serialized Example, ...]) out.

    Records are batched per block within a chunk of the file before leaving the DoFn: Beam's
    per-element cost then applies to a few hundred batches rather than to every record.
    """

    def __init__(self, scheme: BlockScheme, verbose: bool):
        self._scheme = scheme
        self._verbose = verbose
        self._read = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "records_read")
        self._bad = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "records_malformed")

    def _records(self, path: str) -> Iterator[Any]:
        """Yields (block id, serialized Example) or a tagged malformed record per record."""
        raise NotImplementedError

    def process(self, path: str) -> Iterator[Any]:
        started = time.monotonic()
        n = 0
        pending: dict[str, list[bytes]] = collections.defaultdict(list)
        buffered = 0
        for out in self._records(path):
            n += 1
            if isinstance(out, beam.pvalue.TaggedOutput):
                self._bad.inc()
                yield out
            else:
                pending[out[0]].append(out[1])
                buffered += 1
                if buffered >= CHUNK_RECORDS:
                    yield from pending.items()
                    pending, buffered = collections.defaultdict(list), 0
            if n % PROGRESS_RECORDS == 0:
                self._read.inc(PROGRESS_RECORDS)
                _progress(self._verbose, f"read {n:,} records of {os.path.basename(path)} "
                                         f"({time.monotonic() - started:.0f}s)")
        yield from pending.items()
        self._read.inc(n % PROGRESS_RECORDS)
        _progress(self._verbose, f"read {n:,} records of {os.path.basename(path)} "
                                 f"({time.monotonic() - started:.1f}s)")


class CsvToBlocks(_ReadAndAssign):
    """Reads a CSV file, types each row by the schema, assigns its block, encodes its Example."""

    def __init__(self, scheme: BlockScheme, types: dict[str, str], verbose: bool = True):
        super().__init__(scheme, verbose)
        self._types = dict(types)

    def _records(self, path: str) -> Iterator[Any]:
        column = self._scheme.column
        block_of = self._scheme.block_of
        encode = records.CsvRowEncoder(self._types, column).encode
        for line, row in records.iter_csv_rows(path):
            try:
                key_value, serialized = encode(row)
            except records.RowError as e:
                yield _malformed(path, line, e.reason, e.column, e.value, e.column is not None)
                continue
            try:
                block_id = block_of(key_value).block_id
            except MalformedValueError as e:
                yield _malformed(path, line, e.reason, column, key_value, True)
                continue
            yield block_id, serialized


def _feature_value(example: Any, column: str) -> Any:
    """The single value of a feature, or None if absent/empty.

    Raises:
      ValueError: the feature holds more than one value (no single block).
    """
    if column not in example.features.feature:
        return None
    feature = example.features.feature[column]
    kind = feature.WhichOneof("kind")
    if kind is None:
        return None
    values = getattr(feature, kind).value
    if len(values) == 0:
        return None
    if len(values) > 1:
        raise ValueError(f"feature holds {len(values)} values, a block key needs exactly one")
    return values[0]


class TfRecordToBlocks(_ReadAndAssign):
    """Reads a TFRecord file of tf.train.Example (gzip if ``*.gz``) and assigns each its block.

    Records are passed through byte for byte.
    """

    def setup(self):
        """Imports TensorFlow on the worker."""
        import tensorflow as tf  # pylint: disable=g-import-not-at-top

        self._tf = tf

    def _records(self, path: str) -> Iterator[Any]:
        tf = self._tf
        column = self._scheme.column
        options = tf.io.TFRecordOptions(compression_type="GZIP" if path.endswith(".gz") else "")
        for index, serialized in enumerate(tf.compat.v1.io.tf_record_iterator(path, options), 1):
            try:
                example = tf.train.Example.FromString(serialized)
            except Exception:  # protobuf DecodeError; its class differs between implementations
                yield _malformed(path, index, "not a serialized tf.train.Example")
                continue
            try:
                value = _feature_value(example, column)
            except ValueError as e:
                yield _malformed(path, index, str(e), column)
                continue
            try:
                block_id = self._scheme.block_of(value).block_id
            except MalformedValueError as e:
                yield _malformed(path, index, e.reason, column, value, True)
                continue
            yield block_id, serialized


class WriteBlock(beam.DoFn):
    """Writes one block's records, encrypted with a new data key, as
    ``<staging>/<block_id>/part-00000-of-00001.tfrecord.gz.tink``.

    The file is written under a temporary name and renamed, so a retried bundle overwrites it
    (with a new key) and a block file is either complete or absent. The manifest line carries the
    key wrapped by the KEK (hex) and the KEK's id, for the driver to register with the block.
    """

    def __init__(self, staging_dir: str, stream: str, key_provider: str, verbose: bool = True):
        self._staging_dir = staging_dir
        self._stream = stream
        self._key_provider = key_provider
        self._verbose = verbose
        self._blocks = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "blocks_written")

    def setup(self):
        """Opens the key provider on the worker."""
        from sage_tfx.ledger import keys

        self._kek = keys.provider(self._key_provider, create=False)
        self._written = 0
        self._started = time.monotonic()

    def process(self, element: tuple[str, Iterable[list[bytes]]]) -> Iterator[dict]:
        """Writes one block's encrypted file and yields its metadata."""
        from sage_tfx.streams import blockfiles

        block_id, batches = element
        directory = os.path.join(self._staging_dir, block_id)
        os.makedirs(directory, exist_ok=True)
        name = blockfiles.encrypted_name(records.BLOCK_FILE_NAME)
        dk, kek_id, wrapped = blockfiles.new_block_key(self._kek, self._stream, block_id)
        n = blockfiles.write_block_file(
            os.path.join(directory, name), (r for batch in batches for r in batch), dk,
            blockfiles.file_aad(self._stream, block_id, name))
        self._blocks.inc()
        self._written += 1
        if self._written % PROGRESS_BLOCKS == 0:
            _progress(self._verbose, f"wrote {self._written} blocks "
                                     f"({time.monotonic() - self._started:.0f}s)")
        yield {"block_id": block_id, "records": n, "kek_id": kek_id, "wrapped_key": wrapped.hex()}


def _write_json(value: Any, path: str) -> None:
    with open(path, "w") as f:
        json.dump(value, f)


def _write_malformed_report(_, path: str, count: int, examples: list, reasons: list) -> None:
    examples = sorted(examples, key=lambda m: (m["source"], m["position"]))
    reasons = sorted(reasons, key=lambda rn: (-rn[1], rn[0]))
    _write_json({"count": count, "examples": examples, "reasons": [list(r) for r in reasons]},
                path)


def build_split(pipeline: beam.Pipeline, paths: Sequence[str], input_format: str,
                scheme: BlockScheme, types: Optional[dict[str, str]], staging_dir: str,
                verbose: bool = True, *, stream: str, key_provider: str) -> None:
    """Adds the split to ``pipeline``: blocks and the two reports land in ``staging_dir``.

    ``stream`` and ``key_provider`` (a KEK spec, :func:`sage_tfx.ledger.keys.provider`) make
    each block's data key and bind its files to the block."""
    if input_format == records.CSV:
        reader = CsvToBlocks(scheme, types, verbose)
    else:
        reader = TfRecordToBlocks(scheme, verbose)
    assigned = (pipeline
                | "Files" >> beam.Create(list(paths))
                | "ReadAndAssign" >> beam.ParDo(reader).with_outputs(_MALFORMED, main="records"))
    (assigned.records
     | "GroupByBlock" >> beam.GroupByKey()
     | "WriteBlock" >> beam.ParDo(WriteBlock(staging_dir, stream, key_provider, verbose))
     | "CollectManifests" >> beam.combiners.ToList()
     | "WriteManifests" >> beam.Map(_write_json,
                                    os.path.join(staging_dir, records.MANIFESTS_FILE)))
    malformed = assigned[_MALFORMED]
    count = malformed | "CountMalformed" >> beam.combiners.Count.Globally()
    examples = (malformed
                | "FirstMalformed" >> beam.combiners.Top.Smallest(
                    records.MAX_MALFORMED_EXAMPLES, key=lambda m: (m["source"], m["position"])))
    reasons = (malformed
               | "Reasons" >> beam.Map(lambda m: m["reason"])
               | "CountReasons" >> beam.combiners.Count.PerElement()
               | "CollectReasons" >> beam.combiners.ToList())
    (pipeline
     | "ReportTrigger" >> beam.Create([None])
     | "WriteMalformed" >> beam.Map(
         _write_malformed_report, os.path.join(staging_dir, records.MALFORMED_FILE),
         count=beam.pvalue.AsSingleton(count), examples=beam.pvalue.AsSingleton(examples),
         reasons=beam.pvalue.AsSingleton(reasons)))


def run_split(*, paths: Sequence[str], input_format: str, scheme: BlockScheme,
              types: Optional[dict[str, str]], staging_dir: str, stream: str, key_provider: str,
              pipeline_options: Any = None, verbose: bool = True) -> Optional[int]:
    """Builds and runs the split pipeline to completion.

    Args:
      paths, input_format, scheme, types, staging_dir, stream, key_provider: see
        ``build_split``.
      pipeline_options: PipelineOptions, a list of flags, or None (DirectRunner).
      verbose: print progress to stderr.

    Returns:
      The ``records_read`` counter if the runner reports metrics, else None.
    """
    from apache_beam.options.pipeline_options import PipelineOptions

    # flags=[]: PipelineOptions() would otherwise parse the host program's sys.argv.
    if pipeline_options is None:
        pipeline_options = PipelineOptions(flags=[], runner="DirectRunner")
    elif not isinstance(pipeline_options, PipelineOptions):
        pipeline_options = PipelineOptions(flags=list(pipeline_options))
    pipeline = beam.Pipeline(options=pipeline_options)
    build_split(pipeline, paths, input_format, scheme, types, staging_dir, verbose,
                stream=stream, key_provider=key_provider)
    result = pipeline.run()
    result.wait_until_finish()
    try:
        counters = result.metrics().query(
            MetricsFilter().with_namespace(METRICS_NAMESPACE).with_name("records_read"))["counters"]
    except Exception:  # some runners do not support metrics queries; the count is a cross-check
        return None
    if not counters:
        return None
    return sum((c.committed if c.committed is not None else c.attempted) for c in counters)
