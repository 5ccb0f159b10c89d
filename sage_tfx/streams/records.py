"""Reading raw records: sources, CSV typing and parsing, the block file layout.

Pure Python (no Beam, no TensorFlow): used by the splitter's driver
(:mod:`sage_tfx.streams.splitter`) and inside the Beam workers of :mod:`sage_tfx.streams.beam`,
which both import this module and never each other's callers.
"""

from __future__ import annotations

import csv
import glob
import gzip
import io
import os
import re
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

from sage_tfx.streams import example_codec

CSV = "csv"
TFRECORD = "tfrecord"
INPUT_FORMATS = (CSV, TFRECORD)

# Value types of CSV columns; they map to tf.train.Example int64_list / float_list / bytes_list.
INT, FLOAT, STRING, SCHEMA_TYPES = example_codec.INT, example_codec.FLOAT, example_codec.STRING, \
    example_codec.SCHEMA_TYPES


# Name of the single data file of a block written by the splitter (matches BLOCK_FILE_PATTERN).
BLOCK_FILE_NAME = "part-00000-of-00001.tfrecord.gz"

# Files the Beam pipeline leaves in the staging directory for the driver.
MANIFESTS_FILE = "_blocks.json"
MALFORMED_FILE = "_malformed.json"

# How many malformed records are kept as examples in reports and errors.
MAX_MALFORMED_EXAMPLES = 5

_INT64_MIN, _INT64_MAX = example_codec.INT64_MIN, example_codec.INT64_MAX
# Strict forms (used with fullmatch): int() and float() alone would also accept '1_000', ' 12\n'
# and non-ASCII digits.
_INT_RE = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|nan|inf|infinity)",
                       re.IGNORECASE)


# --- sources and CSV typing (pure Python; also used inside Beam workers) ----------------------


def resolve_source(source: Union[str, Sequence[str]]) -> list[str]:
    """Expands a path, glob or list of them into a sorted list of existing files.

    Raises:
      FileNotFoundError: a path or glob matches no file.
    """
    patterns = [source] if isinstance(source, str) else list(source)
    if not patterns:
        raise FileNotFoundError("no source given")
    paths: list[str] = []
    for pattern in patterns:
        matched = sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
        if not matched:
            raise FileNotFoundError(f"source {pattern!r} matches no file")
        paths.extend(matched)
    return sorted(set(paths))


def detect_format(paths: Sequence[str]) -> str:
    """"csv" or "tfrecord" from the file names (``.csv[.gz]``, ``.tfrecord[.gz]`` / ``.tfr[.gz]``).

    Raises:
      ValueError: unknown or mixed extensions; pass ``input_format`` explicitly then.
    """
    formats = set()
    for p in paths:
        name = p[:-3] if p.endswith(".gz") else p
        if name.endswith(".csv"):
            formats.add(CSV)
        elif name.endswith((".tfrecord", ".tfrecords", ".tfr")):
            formats.add(TFRECORD)
        else:
            raise ValueError(
                f"cannot tell the format of {p!r}: pass input_format='csv' or 'tfrecord'")
    if len(formats) != 1:
        raise ValueError(f"sources mix formats {sorted(formats)}: split them separately")
    return formats.pop()


def open_text(path: str) -> io.TextIOBase:
    """Opens a UTF-8 CSV file for ``csv.reader`` (transparently gunzipping ``*.gz``)."""
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def read_csv_header(path: str) -> list[str]:
    """The header row of a CSV file.

    Raises:
      ValueError: empty file, or empty / duplicate column names.
    """
    with open_text(path) as f:
        header = next(csv.reader(f), None)
    if not header:
        raise ValueError(f"{path}: empty CSV file (a header row is required)")
    if any(not name for name in header):
        raise ValueError(f"{path}: empty column name in header {header}")
    dups = sorted({name for name in header if header.count(name) > 1})
    if dups:
        raise ValueError(f"{path}: duplicate column names {dups}")
    return header


def _parse_int(text: str) -> Optional[int]:
    """The value of a strict decimal int64 field, else None."""
    # isdigit() alone admits non-ASCII digits such as '²'; the regex handles signs.
    if (text.isdigit() and text.isascii()) or _INT_RE.fullmatch(text):
        value = int(text)
        if _INT64_MIN <= value <= _INT64_MAX:
            return value
    return None


def _value_type(text: str) -> str:
    """The narrowest schema type that can hold a non-empty CSV field."""
    if _parse_int(text) is not None:
        return INT
    if _INT_RE.fullmatch(text):
        # Beyond int64: kept exact as a string rather than losing digits as a float.
        return STRING
    if _FLOAT_RE.fullmatch(text):
        return FLOAT
    return STRING


def infer_csv_schema(paths: Sequence[str]) -> dict[str, str]:
    """Infers column types over *all* rows of the CSV files: int, else float, else string.

    All rows, not a sample: a type guessed from a prefix (a fare column whose first values are
    "0") would fail later rows, and every block must share one schema. A column that is empty in
    every row is typed string.

    Args:
      paths: CSV files with identical headers.

    Returns:
      Column name -> "int" | "float" | "string", in header order.

    Raises:
      ValueError: headers differ between files, or a header is invalid.
    """
    header = check_same_header(paths)
    rank = {INT: 0, FLOAT: 1, STRING: 2}
    # None: no non-empty value seen yet.
    types: list[Optional[str]] = [None] * len(header)
    # Texts already classified, per column: most columns repeat a few values.
    seen: list[set[str]] = [set() for _ in header]
    for path in paths:
        for _, row in iter_csv_rows(path):
            for i, text in enumerate(row[:len(header)]):
                current = types[i]
                if text and current != STRING and text not in seen[i]:
                    t = _value_type(text)
                    if current is None or rank[t] > rank[current]:
                        types[i] = t
                    if len(seen[i]) < 65536:
                        seen[i].add(text)
    return {name: (t or STRING) for name, t in zip(header, types)}


def check_same_header(paths: Sequence[str]) -> list[str]:
    """The common header of CSV files.

    Raises:
      ValueError: a header is invalid or differs from the first file's.
    """
    header = read_csv_header(paths[0])
    for p in paths[1:]:
        other = read_csv_header(p)
        if other != header:
            raise ValueError(f"CSV headers differ: {paths[0]} has {header}, {p} has {other}")
    return header


def check_schema(schema: Mapping[str, str], header: Sequence[str]) -> dict[str, str]:
    """Validates a given CSV schema against a header; returns it in header order.

    Raises:
      ValueError: unknown types, or columns missing from / not in the header.
    """
    bad = {k: v for k, v in schema.items() if v not in SCHEMA_TYPES}
    if bad:
        raise ValueError(f"schema types must be one of {SCHEMA_TYPES}, got {bad}")
    missing = [c for c in header if c not in schema]
    extra = [c for c in schema if c not in header]
    if missing or extra:
        raise ValueError(f"schema must type exactly the CSV columns: missing {missing}, "
                         f"not in the header {extra} (tip: start from infer_csv_schema(...))")
    return {c: schema[c] for c in header}


class RowError(ValueError):
    """A CSV row that cannot be typed (wrong field count, a value not of its column's type)."""

    def __init__(self, reason: str, column: Optional[str] = None, value: Any = None):
        super().__init__(reason)
        self.reason, self.column, self.value = reason, column, value


def parse_csv_field(name: str, type_: str, text: str) -> Union[int, float, str, None]:
    """Types one CSV field by its column type; an empty field is None (an absent feature).

    Raises:
      RowError: the text is not a value of the type.
    """
    if not text:
        return None
    if type_ == STRING:
        return text
    if type_ == INT:
        value = _parse_int(text)
        if value is None:
            raise RowError(f"not an int64 in int column {name!r}", name, text)
        return value
    if not _FLOAT_RE.fullmatch(text):
        raise RowError(f"not a number in float column {name!r}", name, text)
    return float(text)


def parse_csv_row(row: Sequence[str], columns: Sequence[str],
                  types: Sequence[str]) -> dict[str, Union[int, float, str, None]]:
    """Types one CSV row by the schema; empty fields become None (absent features).

    Raises:
      RowError: the row has the wrong number of fields or a value does not parse as its type.
    """
    if len(row) != len(columns):
        raise RowError(f"expected {len(columns)} fields, got {len(row)}")
    return {name: parse_csv_field(name, t, text) for name, t, text in zip(columns, types, row)}


class CsvRowEncoder:
    """Types CSV rows by a schema and serializes them as ``tf.train.Example``, in one pass.

    Most columns repeat their values (months, carriers, delays), so each column memoizes the
    serialized feature of a field *text* (not of the parsed value: "-0.0" and "0.0" differ in
    float32 bits but compare equal). Typing is ``parse_csv_field`` on every cache miss, so cached
    and uncached rows are typed identically.

    Args:
      types: column -> "int" | "float" | "string", in CSV column order.
      key_column: the block-key column, whose typed value ``encode`` also returns.
      cache_size: memoized texts per column (bounds memory on high-cardinality columns).
    """

    def __init__(self, types: Mapping[str, str], key_column: str, cache_size: int = 65536):
        self._columns = list(types)
        self._types = [types[c] for c in self._columns]
        self._key_index = self._columns.index(key_column)
        self._encoder = example_codec.ExampleEncoder(types)
        self._caches: list[dict[str, bytes]] = [{} for _ in self._columns]
        self._cache_size = cache_size

    def encode(self, row: Sequence[str]) -> tuple[Union[int, float, str, None], bytes]:
        """(typed block-key value, serialized Example) of one row.

        Raises:
          RowError: wrong field count, or a field that is not of its column's type.
        """
        if len(row) != len(self._columns):
            raise RowError(f"expected {len(self._columns)} fields, got {len(row)}")
        entries = []
        for i, text in enumerate(row):
            if not text:
                continue  # missing value: an absent feature, as TFX's CsvExampleGen writes it
            cache = self._caches[i]
            entry = cache.get(text)
            if entry is None:
                name = self._columns[i]
                entry = self._encoder.entry(name, parse_csv_field(name, self._types[i], text))
                if len(cache) < self._cache_size:
                    cache[text] = entry
            entries.append(entry)
        i = self._key_index
        key_value = parse_csv_field(self._columns[i], self._types[i], row[i])
        return key_value, self._encoder.join(entries)


def iter_csv_rows(path: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each data row of a CSV file; the header (line 1) is skipped."""
    with open_text(path) as f:
        reader = csv.reader(f)
        next(reader, None)
        for row in reader:
            if not row:  # a blank line is not a record (csv yields [] for it)
                continue
            yield reader.line_num, row


def short_repr(value: Any, limit: int = 120) -> str:
    """``repr(value)``, truncated: malformed values go into logs and error messages."""
    r = repr(value)
    return r if len(r) <= limit else r[:limit] + "..."
