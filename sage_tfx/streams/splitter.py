"""The splitter: raw CSV / TFRecord data -> blocks in block storage -> the ledger.

A split is all-or-nothing. The Beam pipeline (:mod:`sage_tfx.streams.beam`) assigns every record
to its block with a ``BlockScheme`` and writes each block, encrypted with a data key of its own
(:mod:`sage_tfx.streams.blockfiles`; the key leaves the worker only wrapped by the KEK of
``$SAGE_KEY_PROVIDER``), into a staging directory
``<block_root>/<stream>/.staging-<uuid>/``. Only after the whole pipeline succeeded, no record was
malformed (or the caller chose to skip them) and no target block directory exists, the blocks are
moved into place (``<block_root>/<stream>/<block_id>``, one rename each) and, in
``split_and_register``, registered with the ledger in time order, each with its wrapped key in
the same transaction (a block is never registered without its key; a registration that fails
leaves neither). A registered block is
immutable: a split that would write into an existing block directory, re-register a block id or
(``split_and_register``) add a time block older than the stream's newest block fails before
anything is moved, so late data is refused, never merged. A crashed process can leave a
``.staging-*`` directory behind; it is never read and can be deleted.

This module does not import Beam or TensorFlow at module level; ``split_into_blocks`` imports the
Beam pipeline when it runs. ``block_root`` and the sources must be local paths (or a filesystem
mounted on every worker): blocks are moved into place with ``os.rename``, which is atomic within
one filesystem.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
import uuid
from typing import Any, Collection, Mapping, Optional, Sequence, Union

from sage_tfx.errors import SageError
from sage_tfx.streams.blocks import (BlockKey, BlockScheme, HashBucketScheme, TimeWindowScheme,
                                     block_location, check_path_component, parse_utc_seconds)
from sage_tfx.streams.records import (CSV, FLOAT, INPUT_FORMATS, MALFORMED_FILE, MANIFESTS_FILE,
                                      check_same_header, check_schema, detect_format,
                                      infer_csv_schema, resolve_source)

ON_MALFORMED = ("error", "skip")

# Prefix of the staging directory a split writes into before blocks are moved into place.
STAGING_PREFIX = ".staging-"


class MalformedRecordsError(SageError, ValueError):
    """A split found records that cannot be assigned to a block, and the policy is "error".

    Attributes:
      count: how many records were malformed.
      examples: a few of them (``MalformedRecord``), earliest first.
    """

    def __init__(self, count: int, examples: Sequence["MalformedRecord"], records_read: int):
        self.count = count
        self.examples = tuple(examples)
        self.records_read = records_read
        super().__init__(self.message())

    def message(self, skip_with: str = "on_malformed='skip'") -> str:
        """The error's text; ``skip_with`` spells the option that skips such records."""
        shown = "; ".join(str(e) for e in self.examples)
        return (f"{self.count} of {self.records_read} records cannot be assigned to a block, "
                f"e.g. {shown}. Nothing was written. Fix the data, or pass {skip_with} to "
                f"leave them out (they are counted and reported).")


class BlockExistsError(SageError, ValueError):
    """A split would write a block that already exists (a block, once written, is immutable)."""


class SplitKeyError(SageError, RuntimeError):
    """A block the pipeline wrote does not open with the driver's key-encryption key."""


class LateBlockError(SageError, ValueError):
    """A split would add a time block older than the stream's newest block.

    The ledger orders blocks by registration, and windows such as "the last 30 blocks" rely on
    that order being time order, so blocks are only ever appended at the end of time.
    """


@dataclasses.dataclass(frozen=True)
class MalformedRecord:
    """A record left out of every block, and why.

    Attributes:
      source: the input file.
      position: CSV: the line number (1 is the header); TFRecord: the record number (from 1).
      reason: why the record was rejected (no data values, so counts by reason are safe to log).
      column: the offending column, if one.
      value: ``repr`` of the offending value (truncated), if one.
    """

    source: str
    position: int
    reason: str
    column: Optional[str] = None
    value: Optional[str] = None

    def __str__(self) -> str:
        where = f"{self.source}:{self.position}"
        what = f" column {self.column!r} value {self.value}" if self.column is not None else ""
        return f"{where}:{what} ({self.reason})"


@dataclasses.dataclass(frozen=True)
class BlockManifest:
    """A block written to block storage.

    Attributes:
      block_id: the block's id.
      start: inclusive start (ISO-8601 UTC) for time windows, else None.
      end: exclusive end for time windows, else None.
      location: the block's directory (holds ``part-*.tfrecord.gz.tink``).
      records: number of records in the block.
      kek_id: the key-encryption key that wrapped the block's data key.
      wrapped_key: the block's data key, wrapped (register it with the block: :meth:`spec`).
    """

    block_id: str
    start: Optional[str]
    end: Optional[str]
    location: str
    records: int
    kek_id: Optional[str] = None
    wrapped_key: Optional[bytes] = dataclasses.field(default=None, repr=False)

    def spec(self) -> Any:
        """The ledger's ``BlockSpec`` of this block, its wrapped key included."""
        from sage_tfx.ledger import BlockSpec
        return BlockSpec(self.block_id, self.location, self.start, self.end, self.records,
                         wrapped_key=self.wrapped_key, kek_id=self.kek_id)


@dataclasses.dataclass(frozen=True)
class SplitResult:
    """What a split wrote and what it left out.

    Attributes:
      stream: the stream name.
      scheme: the scheme spec used (``BlockScheme.spec()``).
      blocks: the blocks written, in time order (bucket order for hash buckets).
      records_read: records read from the sources.
      malformed: records left out (always 0 unless ``on_malformed="skip"``).
      malformed_examples: a few left-out records, earliest first.
      malformed_by_reason: (reason, count) pairs, most frequent first.
      seconds: wall time of the split.
    """

    stream: str
    scheme: str
    blocks: tuple[BlockManifest, ...]
    records_read: int
    malformed: int = 0
    malformed_examples: tuple[MalformedRecord, ...] = ()
    malformed_by_reason: tuple[tuple[str, int], ...] = ()
    seconds: float = 0.0

    @property
    def records_written(self) -> int:
        """Records written over all blocks."""
        return sum(b.records for b in self.blocks)


# --- the split --------------------------------------------------------------------------------


def _log(verbose: bool, message: str) -> None:
    if verbose:
        print(f"[sage-tfx split] {message}", file=sys.stderr, flush=True)


def _csv_types(paths: Sequence[str], schema: Optional[Mapping[str, str]], scheme: BlockScheme,
               verbose: bool) -> dict[str, str]:
    """The CSV schema (given and checked, or inferred), with a usable block-key column."""
    header = check_same_header(paths)
    if schema is None:
        t0 = time.monotonic()
        types = infer_csv_schema(paths)
        _log(verbose, f"inferred CSV schema in {time.monotonic() - t0:.1f}s: {types}")
    else:
        types = check_schema(schema, header)
    if scheme.column not in types:
        raise ValueError(f"block-key column {scheme.column!r} is not in the CSV header {header}")
    key_type = types[scheme.column]
    if isinstance(scheme, HashBucketScheme) and key_type == FLOAT:
        raise ValueError(f"user-id column {scheme.column!r} is typed float; hash buckets need "
                         f"int or string ids (42.0 would hash differently from 42)")
    if isinstance(scheme, TimeWindowScheme) and key_type == FLOAT:
        _log(verbose, f"warning: time column {scheme.column!r} is float; blocks are exact but "
                      f"its stored float32 values are rounded (type it int)")
    return types


def split_into_blocks(stream: str, source: Union[str, Sequence[str]], scheme: BlockScheme,
                      block_root: str, *, input_format: Optional[str] = None,
                      schema: Optional[Mapping[str, str]] = None, on_malformed: str = "error",
                      existing_block_ids: Collection[str] = (), not_before: Optional[str] = None,
                      pipeline_options: Any = None, key_provider: Optional[str] = None,
                      verbose: bool = True) -> SplitResult:
    """Splits raw records into blocks in block storage with a Beam pipeline (DirectRunner default).

    Each block becomes the directory ``block_location(block_root, stream, block_id)`` with one
    gzip TFRecord file of ``tf.train.Example`` encrypted with the block's own data key
    (``part-00000-of-00001.tfrecord.gz.tink``); the manifests carry the wrapped keys, which must
    be registered with the blocks (``ledger.add_blocks([m.spec() for m in result.blocks])``, as
    ``split_and_register`` does). CSV rows are
    typed by ``schema`` (int -> int64_list, float -> float_list (float32), string -> bytes_list;
    empty fields are absent features, as with TFX's CsvExampleGen); TFRecord records are copied
    byte for byte. Record order within a block is unspecified. Blocks are assigned from the exact
    parsed value, so a float timestamp column is assigned exactly but *stored* as float32, which
    can round across a boundary: type timestamps as int.

    Args:
      stream: the stream name (a directory under ``block_root``).
      source: a file, glob, or list of them; CSV files need identical headers.
      scheme: how records map to blocks (its ``column`` is the block key).
      block_root: root of block storage (a local directory; created if missing).
      input_format: "csv" or "tfrecord"; by default from the file extensions.
      schema: CSV only: column -> "int" | "float" | "string" for every column; by default
        inferred from all rows (``infer_csv_schema``).
      on_malformed: "error" (default) fails if any record cannot be assigned to a block (missing,
        NaN, unparsable key; CSV rows that do not fit the schema) and writes nothing; "skip"
        leaves such records out, counted in the result.
      existing_block_ids: block ids that must not be produced (e.g. already in the ledger).
      not_before: ISO-8601 time (e.g. the end of the stream's newest block); a time block
        starting earlier must not be produced.
      pipeline_options: ``apache_beam`` PipelineOptions, or a list of flags, for the pipeline.
      key_provider: the KEK that wraps the data keys, a spec for
        :func:`sage_tfx.ledger.keys.provider` (default ``$SAGE_KEY_PROVIDER``, else the local
        key file); Beam workers open it by this spec.
      verbose: print progress (records read, blocks written) to stderr.

    Returns:
      The blocks written (time order), records read and malformed records left out.

    Raises:
      FileNotFoundError: a source matches no file.
      ValueError: bad arguments, CSV header / schema problems.
      MalformedRecordsError: malformed records with ``on_malformed="error"``.
      BlockExistsError: a produced block's directory exists or its id is in
        ``existing_block_ids``; nothing was moved into block storage.
      LateBlockError: a produced time block starts before ``not_before``; nothing was moved.
    """
    started = time.monotonic()
    # Every argument is checked before the (minutes long) pipeline starts.
    check_path_component("stream", stream)
    if not isinstance(scheme, BlockScheme):
        raise ValueError(f"scheme must be a BlockScheme, got {scheme!r}")
    if on_malformed not in ON_MALFORMED:
        raise ValueError(f"on_malformed must be one of {ON_MALFORMED}, got {on_malformed!r}")
    if not isinstance(block_root, str) or not block_root or "://" in block_root:
        raise ValueError(f"block_root must be a non-empty local path (blocks are moved into place "
                         f"with os.rename), got {block_root!r}")
    if not_before is not None:
        parse_utc_seconds(not_before, "not_before")
    paths = resolve_source(source)
    fmt = input_format or detect_format(paths)
    if fmt not in INPUT_FORMATS:
        raise ValueError(f"input_format must be one of {INPUT_FORMATS}, got {fmt!r}")
    if fmt == CSV:
        types: Optional[dict[str, str]] = _csv_types(paths, schema, scheme, verbose)
    elif schema is not None:
        raise ValueError("schema applies to CSV sources only (TFRecord examples are copied as is)")
    else:
        types = None
    from sage_tfx.ledger import keys
    key_provider = key_provider or keys.default_spec()
    kek = keys.provider(key_provider)  # opens (or creates) the KEK before any work
    _log(verbose, f"block keys are wrapped by KEK {kek.kek_id}")

    stream_dir = os.path.join(os.path.abspath(block_root), stream)
    staging = os.path.join(stream_dir, STAGING_PREFIX + uuid.uuid4().hex)
    created = [d for d in (stream_dir, os.path.abspath(block_root)) if not os.path.exists(d)]
    os.makedirs(staging)
    manifests: list[BlockManifest] = []
    try:
        from sage_tfx.streams import beam  # Beam and TF are imported only when a split runs

        _log(verbose, f"splitting {len(paths)} {fmt} file(s) into {scheme.spec()} blocks of "
                      f"stream {stream!r}")
        records_read = beam.run_split(
            paths=paths, input_format=fmt, scheme=scheme, types=types, staging_dir=staging,
            stream=stream, key_provider=key_provider, pipeline_options=pipeline_options,
            verbose=verbose)
        written, malformed = _read_staging_reports(staging)
        malformed_count = malformed["count"]
        examples = tuple(MalformedRecord(**m) for m in malformed["examples"])
        reasons = tuple((r, n) for r, n in malformed["reasons"])
        total = sum(w["records"] for w in written) + malformed_count
        if records_read is not None and records_read != total:
            raise RuntimeError(f"split lost records: read {records_read}, wrote "
                               f"{total - malformed_count} + {malformed_count} malformed")
        records_read = total
        if malformed_count and on_malformed == "error":
            raise MalformedRecordsError(malformed_count, examples, records_read)
        _check_keys(staging, written, stream, kek)
        manifests = _place_blocks(staging, written, stream, scheme, os.path.abspath(block_root),
                                  existing_block_ids, not_before)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        for d in created if not manifests else ():  # a failed split leaves no directory behind
            with contextlib.suppress(OSError):
                os.rmdir(d)
    result = SplitResult(stream=stream, scheme=scheme.spec(), blocks=tuple(manifests),
                         records_read=records_read, malformed=malformed_count,
                         malformed_examples=examples, malformed_by_reason=reasons,
                         seconds=time.monotonic() - started)
    _log(verbose, f"done in {result.seconds:.1f}s: {records_read} records read, "
                  f"{len(manifests)} blocks written, {malformed_count} malformed skipped")
    return result


def _read_staging_reports(staging: str) -> tuple[list[dict], dict]:
    with open(os.path.join(staging, MANIFESTS_FILE)) as f:
        written = json.load(f)
    with open(os.path.join(staging, MALFORMED_FILE)) as f:
        malformed = json.load(f)
    return written, malformed


def _check_keys(staging: str, written: Sequence[dict], stream: str, kek: Any) -> None:
    """Every staged block's key opens with this process's KEK and opens the block's files (their
    first segment): a worker with another KEK, or two attempts at one block that wrote under two
    keys, fail the split before anything is registered.

    Raises:
      SplitKeyError: a key or file does not open.
    """
    import glob

    from sage_tfx.ledger import keys
    from sage_tfx.streams import blockfiles
    from sage_tfx.streams.blocks import ENCRYPTED_FILE_PATTERN
    for w in written:
        block_id, wrapped = w["block_id"], _wrapped(w)
        try:
            if wrapped is None:
                raise ValueError("no key")
            dk = keys.DataKey.unwrap(kek, wrapped, blockfiles.key_aad(stream, block_id))
            paths = glob.glob(os.path.join(staging, block_id, ENCRYPTED_FILE_PATTERN))
            for path in paths:
                with open(path, "rb") as f, dk.decrypting(
                        f, blockfiles.file_aad(stream, block_id, path)) as plain:
                    plain.read(1)
            if not paths:
                raise ValueError("no block file")
        except Exception as e:
            raise SplitKeyError(
                f"block {block_id} was written under a key that does not open with KEK "
                f"{kek.kek_id} (is $SAGE_KEY_PROVIDER the same KEK on every Beam worker?): {e}. "
                "Nothing was written.") from e


def _wrapped(written: dict) -> Optional[bytes]:
    return bytes.fromhex(written["wrapped_key"]) if written.get("wrapped_key") else None


def _place_blocks(staging: str, written: Sequence[dict], stream: str, scheme: BlockScheme,
                  block_root: str, existing_block_ids: Collection[str],
                  not_before: Optional[str] = None) -> list[BlockManifest]:
    """Moves staged blocks into block storage, all or none; returns manifests in time order."""
    keys: list[BlockKey] = sorted((scheme.block_key(w["block_id"]) for w in written),
                                  key=BlockKey.sort_key)
    by_id = {w["block_id"]: w for w in written}
    manifests = [BlockManifest(k.block_id, k.start, k.end,
                               block_location(block_root, stream, k.block_id),
                               by_id[k.block_id]["records"], by_id[k.block_id].get("kek_id"),
                               _wrapped(by_id[k.block_id]))
                 for k in keys]
    existing = set(existing_block_ids)
    registered = sorted(m.block_id for m in manifests if m.block_id in existing)
    if registered:
        raise BlockExistsError(
            f"{len(registered)} block(s) of this split are already registered in stream "
            f"{stream!r}, e.g. {registered[:5]}; a registered block is immutable, so nothing was "
            f"written (split only data of new blocks)")
    if not_before is not None:
        limit = parse_utc_seconds(not_before, "not_before")
        late = [m.block_id for m in manifests
                if m.start is not None and parse_utc_seconds(m.start) < limit]
        if late:
            raise LateBlockError(
                f"{len(late)} block(s) of this split start before {not_before}, the end of the "
                f"newest block of stream {stream!r}, e.g. {late[:5]}; blocks are appended in time "
                f"order only, so nothing was written (leave out late records)")
    present = [m.location for m in manifests if os.path.lexists(m.location)]
    if present:
        raise BlockExistsError(
            f"{len(present)} block director(y/ies) already exist, e.g. {present[:5]}; blocks are "
            f"immutable, so nothing was written (split only data of new blocks)")
    moved: list[BlockManifest] = []
    try:
        for m in manifests:
            if os.path.lexists(m.location):  # appeared since the check above: a concurrent split
                raise BlockExistsError(f"block directory {m.location} appeared during the split; "
                                       f"nothing was written")
            os.rename(os.path.join(staging, m.block_id), m.location)
            moved.append(m)
    except BaseException:
        for m in moved:  # undo: these directories were created by this split a moment ago
            shutil.rmtree(m.location, ignore_errors=True)
        raise
    return manifests


def split_and_register(ledger: Any, stream: str, source: Union[str, Sequence[str]],
                       scheme: BlockScheme, block_root: str, **split_kwargs: Any) -> SplitResult:
    """Splits ``source`` into blocks and registers them with the ledger in time order.

    Fails before reading any data if the caller may not register blocks (an admin's job), the
    stream is unknown or was created with another block scheme (``granularity``), since blocks
    of two schemes would not partition the stream. Fails
    after splitting, before anything is written, if a block is already registered or (time
    blocks) starts before the end of the stream's newest block: blocks are appended in time
    order. Registration is one ledger transaction; if it fails, the new block directories are
    removed.

    Args:
      ledger: a ``sage_tfx.ledger.Ledger`` (anything with ``stream``, ``blocks``, ``add_blocks``).
      stream: the ledger stream.
      source, scheme, block_root: see ``split_into_blocks``.
      **split_kwargs: further ``split_into_blocks`` arguments (input_format, schema,
        on_malformed, pipeline_options, verbose).

    Returns:
      The split result; its blocks are now in the ledger with a full budget.

    Raises:
      PermissionDeniedError: the caller is not an admin (nothing was read or written).
      UnknownStreamError: the stream is not in the ledger.
      ValueError: the stream's granularity names a different scheme.
      BlockExistsError, LateBlockError: see above.
      Everything ``split_into_blocks`` and ``ledger.add_blocks`` raise.
    """
    authorize = getattr(ledger, "authorize", None)
    if authorize is not None:  # only a caller who may register blocks runs the split
        from sage_tfx.ledger import access
        authorize(access.CONFIGURE)
    config = ledger.stream(stream)
    _check_granularity(getattr(config, "granularity", ""), scheme, stream)
    # Every context lists the same blocks (each with its own budget): read the first one's.
    contexts = getattr(config, "contexts", None)
    states = ledger.blocks(stream, contexts[0]) if contexts else ledger.blocks(stream)
    existing = {b.block_id for b in states}
    ends = [b.end for b in states if getattr(b, "end", None)]
    newest_end = max(ends, key=parse_utc_seconds) if ends else None
    result = split_into_blocks(stream, source, scheme, block_root, existing_block_ids=existing,
                               not_before=newest_end, **split_kwargs)
    if not result.blocks:
        return result
    specs = [m.spec() for m in result.blocks]
    try:
        ledger.add_blocks(stream, specs)
    except BaseException:
        for m in result.blocks:  # never registered, so no grant can point at them
            shutil.rmtree(m.location, ignore_errors=True)
        raise
    _log(split_kwargs.get("verbose", True),
         f"registered {len(specs)} blocks of stream {stream!r} "
         f"({specs[0].block_id} .. {specs[-1].block_id})")
    return result


def _check_granularity(granularity: str, scheme: BlockScheme, stream: str) -> None:
    """The stream's recorded scheme (a spec, or a bare "day"-like granularity) must match."""
    if not granularity:
        return
    if granularity == scheme.spec():
        return
    if isinstance(scheme, TimeWindowScheme) and granularity == scheme.granularity:
        return
    raise ValueError(f"stream {stream!r} was created with granularity {granularity!r}, but this "
                     f"split uses {scheme.spec()!r}; blocks of different schemes would overlap")
