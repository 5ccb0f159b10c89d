"""Blocks: how a stream is cut into disjoint blocks, how blocks are named and where they are stored.

Block composition (Sage §3.2, §4) accounts privacy loss per block, so the split must be a
partition: every record lands in exactly one block, decided only by a public attribute of the
record. Two schemes are provided:

- ``TimeWindowScheme`` — half-open UTC time windows (hour, day, ISO week, month) for event-level
  privacy (§3.2: "one day's worth of data goes into one block").
- ``HashBucketScheme`` — salted hash buckets of a user id for user-level privacy (§4.4: "each
  user's data goes into one block").

Block storage layout (docs/design.md): a block is the directory ``<block_root>/<stream>/<block_id>``
holding its data files: gzip TFRecord files of ``tf.train.Example``, each encrypted with the
block's data key (Tink streaming AEAD, :mod:`sage_tfx.streams.blockfiles`) and named
``part-*.tfrecord.gz.tink``. Blocks written before encryption hold the same files in plaintext,
named ``part-*.tfrecord.gz``, until ``sage-tfx keys migrate`` encrypts them.

This module is pure Python (no TensorFlow / Beam) so it can be used from the ledger, the CLI, a
Beam worker or a notebook.
"""

from __future__ import annotations

import abc
import dataclasses
import datetime
import functools
import hashlib
import math
import numbers
import posixpath
import re
from typing import Any, Optional

from sage_tfx.errors import SageError

# Plaintext data files (the layout before encryption; also what a block file decrypts to).
BLOCK_FILE_PATTERN = "part-*.tfrecord.gz"
# Encrypted data files: a plaintext file's bytes under the block's data key.
ENCRYPTED_SUFFIX = ".tink"
ENCRYPTED_FILE_PATTERN = BLOCK_FILE_PATTERN + ENCRYPTED_SUFFIX

GRANULARITIES = ("hour", "day", "week", "month")

# Same alphabet as ledger names: a stream name or block id is also a directory name, so it must not
# contain '/', be '.'/'..' or start with '.' (the splitter's staging directories do).
_PATH_COMPONENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")

_SECONDS_PER_HOUR = 3600
_SECONDS_PER_DAY = 86400
# Proleptic Gregorian ordinal of 1970-01-01: unix day d is date.fromordinal(d + _EPOCH_ORDINAL).
_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()

# ISO-8601 date-time with a mandatory time part. The zone is optional in the pattern only so that a
# naive value gets its own error message rather than "unparsable".
_ISO_DATETIME_RE = re.compile(
    r"^(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})[T ]"
    r"(?P<h>\d{2}):(?P<mi>\d{2})(?::(?P<s>\d{2})(?:[.,]\d{1,9})?)?"
    r"(?P<tz>[Zz]|[+-]\d{2}(?::?\d{2})?)?$", re.ASCII)  # ASCII: \d must not match other digits
_ISO_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$", re.ASCII)

_HOUR_ID_RE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2})$", re.ASCII)
_DAY_ID_RE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$", re.ASCII)
_WEEK_ID_RE = re.compile(r"^(\d{4})-W(\d{2})$", re.ASCII)
_MONTH_ID_RE = re.compile(r"^(\d{4})-(\d{2})$", re.ASCII)
_BUCKET_ID_RE = re.compile(r"^bucket-(\d+)$", re.ASCII)
_CANONICAL_INT_RE = re.compile(r"^(0|[1-9][0-9]*)$")


class MalformedValueError(SageError, ValueError):
    """A record's block-key value cannot be assigned to a block (missing, NaN, unparsable, ...).

    Attributes:
      column: the block-key column.
      value: the offending value.
      reason: why it was rejected, without the column and value (for per-reason counts).
    """

    def __init__(self, column: str, value: Any, reason: str):
        super().__init__(f"column {column!r}: cannot assign value {value!r} to a block: {reason}")
        self.column = column
        self.value = value
        self.reason = reason


# --- storage layout ---------------------------------------------------------------------------


def check_path_component(kind: str, name: Any) -> str:
    """Checks that a stream name or block id is safe to use as one directory name.

    Args:
      kind: what the name is, for the error message ("stream", "block id").
      name: the name to check.

    Returns:
      ``name`` unchanged.

    Raises:
      ValueError: the name is empty, too long, contains '/' or starts with '.'.
    """
    if not isinstance(name, str) or not _PATH_COMPONENT_RE.match(name):
        raise ValueError(
            f"{kind} must be 1-128 characters of letters, digits, '_', '.', ':' or '-' starting "
            f"with a letter or digit (it names a directory), got {name!r}")
    return name


def block_location(block_root: str, stream: str, block_id: str) -> str:
    """The storage directory of a block: ``<block_root>/<stream>/<block_id>``.

    Args:
      block_root: root directory of block storage (a local path or a URI such as ``gs://b/x``).
      stream: the stream name.
      block_id: the block id.

    Returns:
      The block's directory, also its ``location`` in the ledger.

    Raises:
      ValueError: empty root, or a stream / block id that is not a safe directory name.
    """
    if not isinstance(block_root, str) or not block_root:
        raise ValueError(f"block_root must be a non-empty path, got {block_root!r}")
    check_path_component("stream", stream)
    check_path_component("block id", block_id)
    # posixpath, not os.path: locations may be URIs, which always use '/'.
    return posixpath.join(block_root.rstrip("/") or "/", stream, block_id)


def block_files_glob(location: str) -> str:
    """The glob matching a block's plaintext data files: ``<location>/part-*.tfrecord.gz``."""
    return posixpath.join(location.rstrip("/"), BLOCK_FILE_PATTERN)


def encrypted_files_glob(location: str) -> str:
    """The glob matching a block's encrypted data files: ``<location>/part-*.tfrecord.gz.tink``."""
    return posixpath.join(location.rstrip("/"), ENCRYPTED_FILE_PATTERN)


# --- block keys and schemes -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BlockKey:
    """The block a record belongs to.

    Attributes:
      block_id: the block's id, unique in its stream (e.g. "2013-01-01", "bucket-07").
      start: for time windows, the window's inclusive start as ISO-8601 UTC
        ("2013-01-01T00:00:00+00:00"); None for hash buckets.
      end: for time windows, the window's exclusive end (the next window's start); None for hash
        buckets.
    """

    block_id: str
    start: Optional[str] = None
    end: Optional[str] = None

    def sort_key(self) -> tuple:
        """Orders blocks in time order (then by id); ISO strings of one format sort by time."""
        return (self.start is None, self.start or "", self.block_id)


class BlockScheme(abc.ABC):
    """How records are assigned to blocks: a pure function of one column's value."""

    column: str

    @abc.abstractmethod
    def block_of(self, value: Any) -> BlockKey:
        """The block of a record whose block-key column holds ``value``.

        Raises:
          MalformedValueError: the value cannot be assigned (missing, NaN, unparsable, ...).
        """

    @abc.abstractmethod
    def block_key(self, block_id: str) -> BlockKey:
        """The full key (with boundaries) of a block id this scheme produces.

        Raises:
          ValueError: the id is not one this scheme can produce.
        """

    @abc.abstractmethod
    def spec(self) -> str:
        """A string that ``scheme_from_spec`` turns back into an equal scheme."""


def _check_column(column: Any) -> None:
    if not isinstance(column, str) or not column or ":" in column:
        # ':' separates the fields of a spec string.
        raise ValueError(f"block-key column must be a non-empty name without ':', got {column!r}")


def _iso_utc(seconds: int) -> str:
    """ISO-8601 UTC string of an integer unix time, e.g. "2013-01-01T00:00:00+00:00"."""
    days, rem = divmod(seconds, _SECONDS_PER_DAY)
    date = datetime.date.fromordinal(days + _EPOCH_ORDINAL)
    return (datetime.datetime.combine(date, datetime.time(), tzinfo=datetime.timezone.utc)
            + datetime.timedelta(seconds=rem)).isoformat()


def _unix_seconds(date: datetime.date) -> int:
    """Unix time of midnight UTC at the start of ``date``."""
    return (date.toordinal() - _EPOCH_ORDINAL) * _SECONDS_PER_DAY


def parse_utc_seconds(value: Any, column: str = "value") -> int:
    """Floor of the unix time (seconds, UTC) of a timestamp value.

    Window boundaries are whole seconds, so ``floor(t)`` lies in a window exactly when ``t`` does:
    flooring loses nothing for block assignment, and integer arithmetic keeps boundaries exact.

    Args:
      value: unix seconds (int or float, negative allowed), or an ISO-8601 date-time string / bytes
        with a timezone ("2013-01-01T10:00:00Z", "...+05:30", "...-0500").
      column: the column name, for error messages.

    Returns:
      The integer unix time, rounded down.

    Raises:
      MalformedValueError: None, bool, NaN/inf, empty or unparsable string, a string without a
        timezone (we never guess one), or another type.
    """
    if value is None:
        raise MalformedValueError(column, value, "missing value")
    if isinstance(value, bool):
        raise MalformedValueError(column, value, "a boolean is not a timestamp")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        if not math.isfinite(f):
            raise MalformedValueError(column, value, "not a finite number")
        return math.floor(f)  # exact: floor of a float is an integer-valued float
    if isinstance(value, (bytes, bytearray)):
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedValueError(column, value, "bytes are not UTF-8") from None
    elif isinstance(value, str):
        text = value
    else:
        raise MalformedValueError(column, value, f"unsupported type {type(value).__name__}")
    if not text:
        raise MalformedValueError(column, value, "empty string")
    m = _ISO_DATETIME_RE.match(text)
    if m is None:
        if _ISO_DATE_RE.match(text):
            raise MalformedValueError(
                column, value, "a date without a time and timezone; we never guess a timezone "
                "(write e.g. '2013-01-01T00:00:00Z')")
        raise MalformedValueError(
            column, value, "not an ISO-8601 date-time with timezone (e.g. '2013-01-01T10:00:00Z') "
            "nor a unix timestamp")
    tz = m.group("tz")
    if tz is None:
        raise MalformedValueError(
            column, value, "ISO-8601 date-time without a timezone; we never guess one "
            "(append 'Z' for UTC or an offset like '+00:00')")
    try:
        date = datetime.date(int(m.group("y")), int(m.group("mo")), int(m.group("d")))
        hour, minute = int(m.group("h")), int(m.group("mi"))
        second = int(m.group("s") or 0)
        datetime.time(hour, minute, second)  # validates ranges; rejects 24:00 and leap second 60
    except ValueError as e:
        raise MalformedValueError(column, value, f"invalid date-time ({e})") from None
    if tz in ("Z", "z"):
        offset = 0
    else:
        digits = tz[1:].replace(":", "")
        off_h, off_m = int(digits[:2]), int(digits[2:] or 0)
        if off_h > 23 or off_m > 59:
            raise MalformedValueError(column, value, f"invalid UTC offset {tz!r}")
        offset = (off_h * 3600 + off_m * 60) * (1 if tz[0] == "+" else -1)
    # The fraction of a second is dropped on purpose: see the flooring argument above.
    return _unix_seconds(date) + hour * 3600 + minute * 60 + second - offset


# Cached because a split computes the window of every record, and records of one window are many.
@functools.lru_cache(maxsize=4096)
def _hour_window(hour_index: int) -> BlockKey:
    """The hour window [h, h+1) where h is hours since the epoch."""
    start = hour_index * _SECONDS_PER_HOUR
    day = datetime.date.fromordinal(start // _SECONDS_PER_DAY + _EPOCH_ORDINAL)
    hour = (start % _SECONDS_PER_DAY) // _SECONDS_PER_HOUR
    return BlockKey(f"{day.isoformat()}T{hour:02d}", _iso_utc(start),
                    _iso_utc(start + _SECONDS_PER_HOUR))


@functools.lru_cache(maxsize=4096)
def _date_window(granularity: str, day_index: int) -> BlockKey:
    """The day, ISO week (from Monday) or month window holding unix day ``day_index``."""
    day = datetime.date.fromordinal(day_index + _EPOCH_ORDINAL)
    if granularity == "day":
        first, after = day, day + datetime.timedelta(days=1)
        block_id = first.isoformat()
    elif granularity == "week":
        first = day - datetime.timedelta(days=day.weekday())
        after = first + datetime.timedelta(days=7)
        iso_year, iso_week, _ = first.isocalendar()
        block_id = f"{iso_year:04d}-W{iso_week:02d}"
    else:
        first = day.replace(day=1)
        after = (datetime.date(first.year + 1, 1, 1) if first.month == 12
                 else datetime.date(first.year, first.month + 1, 1))
        block_id = f"{first.year:04d}-{first.month:02d}"
    return BlockKey(block_id, _iso_utc(_unix_seconds(first)), _iso_utc(_unix_seconds(after)))


@dataclasses.dataclass(frozen=True)
class TimeWindowScheme(BlockScheme):
    """Half-open UTC time windows [start, end) of one granularity: event-level privacy (Sage §3.2).

    A record at exactly 00:00:00 belongs to the new day; 23:59:59.999999 to the old one. Weeks are
    ISO weeks starting Monday 00:00 UTC, named by ISO year and week ("2013-W01" starts Monday
    2012-12-31). All computation is in integer seconds, so boundaries are exact.

    Attributes:
      column: the timestamp column (unix seconds or ISO-8601 with timezone).
      granularity: "hour", "day", "week" or "month".
    """

    column: str
    granularity: str

    def __post_init__(self):
        _check_column(self.column)
        if self.granularity not in GRANULARITIES:
            raise ValueError(
                f"granularity must be one of {GRANULARITIES}, got {self.granularity!r}")

    def block_of(self, value: Any) -> BlockKey:
        """The window containing the timestamp ``value``.

        Raises:
          MalformedValueError: see ``parse_utc_seconds``; also times whose window falls outside
            the years 1..9999.
        """
        seconds = parse_utc_seconds(value, self.column)
        try:
            return self._window(seconds)
        except (ValueError, OverflowError):
            raise MalformedValueError(
                self.column, value, "time outside the supported years 1..9999") from None

    def _window(self, seconds: int) -> BlockKey:
        # Python's // floors, which is right for negative (pre-1970) times too.
        if self.granularity == "hour":
            return _hour_window(seconds // _SECONDS_PER_HOUR)
        return _date_window(self.granularity, seconds // _SECONDS_PER_DAY)

    def block_key(self, block_id: str) -> BlockKey:
        """The window named by ``block_id`` (the inverse of ``block_of(...).block_id``).

        Raises:
          ValueError: ``block_id`` is not a canonical id of this granularity.
        """
        patterns = {"hour": _HOUR_ID_RE, "day": _DAY_ID_RE, "week": _WEEK_ID_RE,
                    "month": _MONTH_ID_RE}
        m = patterns[self.granularity].match(block_id) if isinstance(block_id, str) else None
        try:
            if m is None:
                raise ValueError("wrong format")
            parts = [int(p) for p in m.groups()]
            if self.granularity == "hour":
                if parts[3] > 23:
                    raise ValueError("hour out of range")
                seconds = _unix_seconds(datetime.date(*parts[:3])) + parts[3] * _SECONDS_PER_HOUR
            elif self.granularity == "day":
                seconds = _unix_seconds(datetime.date(*parts))
            elif self.granularity == "week":
                seconds = _unix_seconds(datetime.date.fromisocalendar(parts[0], parts[1], 1))
            else:
                seconds = _unix_seconds(datetime.date(parts[0], parts[1], 1))
            key = self._window(seconds)
        except (ValueError, OverflowError) as e:
            raise ValueError(f"{block_id!r} is not a {self.granularity} block id ({e})") from None
        if key.block_id != block_id:
            raise ValueError(f"{block_id!r} is not a canonical {self.granularity} block id "
                             f"(expected {key.block_id!r})")
        return key

    def spec(self) -> str:
        """E.g. "time:trip_start_timestamp:day"."""
        return f"time:{self.column}:{self.granularity}"


@dataclasses.dataclass(frozen=True)
class HashBucketScheme(BlockScheme):
    """Salted hash buckets of a user id: user-level privacy (Sage §4.4, blocks by user id).

    bucket = int(sha256(salt + "\\x00" + str(user_id)), big-endian) mod num_buckets. The id is
    hashed as its decimal / text form, so the integer 42 and the string "42" share a bucket. The
    salt is not a secret (it is stored in the spec and the ledger): it makes bucketings of
    different streams independent and keeps a stream's assignment stable forever.

    Attributes:
      column: the user-id column (integers or strings; floats are rejected).
      num_buckets: number of buckets (blocks), >= 1.
      salt: non-empty string without NUL.
    """

    column: str
    num_buckets: int
    salt: str

    def __post_init__(self):
        _check_column(self.column)
        if (isinstance(self.num_buckets, bool) or not isinstance(self.num_buckets, int)
                or self.num_buckets < 1):
            raise ValueError(f"num_buckets must be an integer >= 1, got {self.num_buckets!r}")
        if not isinstance(self.salt, str) or not self.salt or "\x00" in self.salt:
            # NUL separates salt from id in the hashed string; inside the salt it would be
            # ambiguous.
            raise ValueError(f"salt must be a non-empty string without NUL, got {self.salt!r}")

    @property
    def _width(self) -> int:
        return len(str(self.num_buckets - 1))

    def bucket_of(self, value: Any) -> int:
        """The bucket index in [0, num_buckets) of user id ``value``.

        Raises:
          MalformedValueError: None, empty string, float (42.0 would hash unlike 42), bool, other
            types, or bytes that are not UTF-8.
        """
        if value is None:
            raise MalformedValueError(self.column, value, "missing value")
        if isinstance(value, bool):
            raise MalformedValueError(self.column, value, "a boolean is not a user id")
        if isinstance(value, numbers.Integral):
            text = str(int(value))
        elif isinstance(value, numbers.Real):
            raise MalformedValueError(
                self.column, value, "user ids must be integers or strings, not floats "
                "(42.0 would hash differently from 42)")
        elif isinstance(value, (bytes, bytearray)):
            try:
                text = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedValueError(self.column, value, "bytes are not UTF-8") from None
        elif isinstance(value, str):
            text = value
        else:
            raise MalformedValueError(self.column, value,
                                      f"unsupported type {type(value).__name__}")
        if not text:
            raise MalformedValueError(self.column, value, "empty string")
        try:
            data = (self.salt + "\x00" + text).encode("utf-8")
        except UnicodeEncodeError:
            raise MalformedValueError(self.column, value, "not encodable as UTF-8") from None
        return int.from_bytes(hashlib.sha256(data).digest(), "big") % self.num_buckets

    def block_of(self, value: Any) -> BlockKey:
        """The bucket block of user id ``value`` (see ``bucket_of``)."""
        return BlockKey(f"bucket-{self.bucket_of(value):0{self._width}d}")

    def block_key(self, block_id: str) -> BlockKey:
        """The key of a bucket id such as "bucket-07".

        Raises:
          ValueError: not a canonical bucket id of this scheme.
        """
        m = _BUCKET_ID_RE.match(block_id) if isinstance(block_id, str) else None
        if (m is None or len(m.group(1)) != self._width
                or int(m.group(1)) >= self.num_buckets):
            raise ValueError(f"{block_id!r} is not a bucket id of a {self.num_buckets}-bucket "
                             f"scheme (expected 'bucket-' + {self._width} digits)")
        return BlockKey(block_id)

    def spec(self) -> str:
        """E.g. "hash:user_id:64:my-salt" (the salt may contain ':')."""
        return f"hash:{self.column}:{self.num_buckets}:{self.salt}"


def scheme_from_spec(spec: str) -> BlockScheme:
    """Parses a scheme spec: "time:<column>:<granularity>" or "hash:<column>:<buckets>:<salt>".

    Args:
      spec: the spec string, as produced by ``BlockScheme.spec()``.

    Returns:
      The scheme; ``scheme_from_spec(s.spec()) == s``.

    Raises:
      ValueError: an unknown kind, missing fields or invalid values.
    """
    if not isinstance(spec, str):
        raise ValueError(f"scheme spec must be a string, got {spec!r}")
    kind, _, rest = spec.partition(":")
    if kind == "time":
        fields = rest.split(":")
        if len(fields) != 2:
            raise ValueError(
                f"time scheme spec must be 'time:<column>:<granularity>', got {spec!r}")
        return TimeWindowScheme(fields[0], fields[1])
    if kind == "hash":
        fields = rest.split(":", 2)  # the salt, last, may contain ':'
        if len(fields) != 3:
            raise ValueError(
                f"hash scheme spec must be 'hash:<column>:<num_buckets>:<salt>', got {spec!r}")
        column, n, salt = fields
        if not _CANONICAL_INT_RE.match(n):
            raise ValueError(
                f"num_buckets must be a canonical decimal integer, got {n!r} in {spec!r}")
        return HashBucketScheme(column, int(n), salt)
    raise ValueError(f"unknown block scheme kind {kind!r} in {spec!r} (expected 'time' or 'hash')")


def check_granularity(granularity: str, *, flag: str = "granularity") -> str:
    """Returns a stream's ``granularity`` if the splitter can import into it: a scheme spec
    (:func:`scheme_from_spec`) or a bare time granularity (``day``, as ``TimeWindowScheme`` has).

    Args:
      granularity: the value given.
      flag: how the caller names it in the error (e.g. ``--granularity``).

    Raises:
      ValueError: neither; the stream would refuse every split.
    """
    if granularity in GRANULARITIES:
        return granularity
    try:
        scheme_from_spec(granularity)
    except ValueError as exc:
        raise ValueError(
            f"{flag} {granularity!r} is not a block scheme ({exc}): give e.g. "
            f"time:timestamp:day or hash:user_id:64:SALT, or one of {', '.join(GRANULARITIES)}"
            ) from None
    return granularity
