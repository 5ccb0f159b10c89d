"""The splitter: CSV typing, block placement (fast) and Beam DirectRunner splits (slow)."""

import collections
import csv
import datetime
import glob
import gzip
import os
import subprocess
import sys

import pytest

from sage_tfx.streams import example_codec, records, splitter
from sage_tfx.ledger import keys
from sage_tfx.streams.blocks import (HashBucketScheme, TimeWindowScheme, block_files_glob,
                                     block_location, encrypted_files_glob)
from sage_tfx.errors import UnknownStreamError
from sage_tfx.streams.records import RowError
from sage_tfx.streams.splitter import (BlockExistsError, BlockManifest, LateBlockError,
                                       MalformedRecord, MalformedRecordsError, SplitResult)

UTC = datetime.timezone.utc


def ts(*args) -> int:
    return int(datetime.datetime(*args, tzinfo=UTC).timestamp())


def write_csv(path, header, rows, opener=open):
    with opener(path, "wt", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


# === fast: sources, CSV typing, placement ======================================================


def test_import_is_light():
    code = ("import sys, sage_tfx.streams.splitter, sage_tfx.streams.example_codec; "
            "print(any(m in sys.modules for m in ('tensorflow', 'apache_beam', 'tfx')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_infer_csv_schema_widens_over_all_rows(tmp_path):
    path = write_csv(tmp_path / "a.csv", ["i", "f", "s", "empty", "big", "late_float", "nan"], [
        ["1", "0", "x", "", "1", "1", "1.5"],
        ["-2", "2.5", "1", "", str(2 ** 63), "2", "nan"],
        ["+3", "1e3", "", "", "3", "3", ""],
        ["4", ".5", "y", "", "4", "4.0", "-inf"],
    ])
    assert records.infer_csv_schema([path]) == {
        "i": "int", "f": "float", "s": "string", "empty": "string", "big": "string",
        "late_float": "float", "nan": "float"}


@pytest.mark.parametrize("text, expected", [
    ("12", "int"), ("-12", "int"), ("+0", "int"), (str(2 ** 63 - 1), "int"),
    (str(2 ** 63), "string"), (str(-(2 ** 63)), "int"), ("1_000", "string"), (" 12", "string"),
    ("12\n", "string"), ("١٢", "string"), ("²", "string"), ("1.", "float"), ("1e-3", "float"),
    ("NaN", "float"), ("Infinity", "float"), ("1e", "string"), ("0x10", "string"),
    ("abc", "string"), ("1,5", "string"),
])
def test_value_types(text, expected):
    assert records._value_type(text) == expected


def test_multi_file_headers_must_match(tmp_path):
    a = write_csv(tmp_path / "a.csv", ["t", "x"], [["1", "2"]])
    b = write_csv(tmp_path / "b.csv", ["t", "y"], [["1", "2"]])
    with pytest.raises(ValueError, match="headers differ"):
        records.infer_csv_schema([a, b])


@pytest.mark.parametrize("header, match", [
    ([], "empty CSV"), (["a", ""], "empty column"), (["a", "b", "a"], "duplicate"),
])
def test_bad_headers(tmp_path, header, match):
    path = tmp_path / "h.csv"
    path.write_text(",".join(header) + "\n" if header else "")
    with pytest.raises(ValueError, match=match):
        records.read_csv_header(str(path))


def test_gzip_csv(tmp_path):
    path = write_csv(tmp_path / "a.csv.gz", ["t", "x"], [["1", "a"], ["2", "b"]], opener=gzip.open)
    assert records.infer_csv_schema([path]) == {"t": "int", "x": "string"}
    assert [r for _, r in records.iter_csv_rows(path)] == [["1", "a"], ["2", "b"]]


def test_check_schema():
    assert records.check_schema({"b": "int", "a": "float"}, ["a", "b"]) == {"a": "float",
                                                                            "b": "int"}
    with pytest.raises(ValueError, match="missing"):
        records.check_schema({"a": "int"}, ["a", "b"])
    with pytest.raises(ValueError, match="not in the header"):
        records.check_schema({"a": "int", "b": "int", "c": "int"}, ["a", "b"])
    with pytest.raises(ValueError, match="types"):
        records.check_schema({"a": "double"}, ["a"])


def test_parse_csv_row():
    cols, types = ["i", "f", "s"], ["int", "float", "string"]
    assert records.parse_csv_row(["1", "2.5", "x"], cols, types) == {"i": 1, "f": 2.5, "s": "x"}
    assert records.parse_csv_row(["", "", ""], cols, types) == {"i": None, "f": None, "s": None}
    with pytest.raises(RowError, match="expected 3 fields, got 2"):
        records.parse_csv_row(["1", "2"], cols, types)
    with pytest.raises(RowError, match="int column 'i'") as e:
        records.parse_csv_row(["1.5", "2", "x"], cols, types)
    assert (e.value.column, e.value.value) == ("i", "1.5")
    with pytest.raises(RowError, match="float column 'f'"):
        records.parse_csv_row(["1", "abc", "x"], cols, types)
    with pytest.raises(RowError, match="int column"):
        records.parse_csv_row([str(2 ** 63), "1", "x"], cols, types)


def test_csv_row_encoder_equals_parse_then_encode():
    types = {"t": "int", "f": "float", "s": "string"}
    encoder = records.CsvRowEncoder(types, "t", cache_size=3)
    plain = example_codec.ExampleEncoder(types)
    rows = [["1", "0.0", "a"], ["1", "-0.0", "a"], ["", "2.5", ""], ["-7", "", "é"],
            ["1", "0.0", "a"]] * 3
    for row in rows:
        key, serialized = encoder.encode(row)
        values = records.parse_csv_row(row, list(types), list(types.values()))
        assert key == values["t"]
        assert serialized == plain.encode(values)
    with pytest.raises(RowError):
        encoder.encode(["x", "1", "a"])
    with pytest.raises(RowError):
        encoder.encode(["1", "1"])


def test_iter_csv_rows_handles_quotes_newlines_and_blank_lines(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text('t,s\n1,"a, ""b""\nc"\n\n2,x\n', encoding="utf-8")
    assert list(records.iter_csv_rows(str(path))) == [(3, ["1", 'a, "b"\nc']), (5, ["2", "x"])]


def test_resolve_source_and_detect_format(tmp_path):
    a = write_csv(tmp_path / "a.csv", ["t"], [["1"]])
    b = write_csv(tmp_path / "b.csv", ["t"], [["1"]])
    assert records.resolve_source(str(tmp_path / "*.csv")) == [a, b]
    assert records.resolve_source([b, a, a]) == [a, b]
    with pytest.raises(FileNotFoundError, match="matches no file"):
        records.resolve_source(str(tmp_path / "*.tfrecord"))
    assert records.detect_format(["x.csv", "y.csv.gz"]) == "csv"
    assert records.detect_format(["x.tfrecord.gz", "y.tfrecord"]) == "tfrecord"
    with pytest.raises(ValueError, match="mix"):
        records.detect_format(["x.csv", "y.tfrecord"])
    with pytest.raises(ValueError, match="input_format"):
        records.detect_format(["x.parquet"])


def test_split_rejects_bad_arguments_before_running(tmp_path):
    src = write_csv(tmp_path / "a.csv", ["t", "u", "f"], [["1", "2", "1.5"]])
    day = TimeWindowScheme("t", "day")
    root = str(tmp_path / "blocks")
    cases = [
        (dict(stream="a/b"), ValueError),
        (dict(on_malformed="ignore"), ValueError),
        (dict(scheme="time:t:day"), ValueError),
        (dict(block_root="gs://bucket/x"), ValueError),
        (dict(source=str(tmp_path / "none.csv")), FileNotFoundError),
        (dict(scheme=TimeWindowScheme("missing", "day")), ValueError),
        (dict(scheme=HashBucketScheme("f", 4, "s")), ValueError),  # float user ids
        (dict(schema={"t": "int"}), ValueError),
        (dict(input_format="parquet"), ValueError),
    ]
    for override, error in cases:
        kwargs = dict(stream="s", source=src, scheme=day, block_root=root)
        kwargs.update(override)
        with pytest.raises(error):
            splitter.split_into_blocks(kwargs.pop("stream"), kwargs.pop("source"),
                                       kwargs.pop("scheme"), kwargs.pop("block_root"),
                                       verbose=False, **kwargs)
    assert not os.path.exists(os.path.join(root, "s")) or not os.listdir(os.path.join(root, "s"))


def _stage(staging, block_ids):
    written = []
    for block_id in block_ids:
        os.makedirs(os.path.join(staging, block_id))
        with open(os.path.join(staging, block_id, records.BLOCK_FILE_NAME), "w") as f:
            f.write(block_id)
        written.append({"block_id": block_id, "records": len(block_id)})
    return written


def test_place_blocks_moves_in_time_order(tmp_path):
    root = str(tmp_path / "root")
    staging = os.path.join(root, "s", ".staging-x")
    written = _stage(staging, ["2013-01-03", "2012-12-31", "2013-01-01"])
    manifests = splitter._place_blocks(staging, written, "s", TimeWindowScheme("t", "day"), root,
                                       ())
    assert [m.block_id for m in manifests] == ["2012-12-31", "2013-01-01", "2013-01-03"]
    assert manifests[0] == BlockManifest("2012-12-31", "2012-12-31T00:00:00+00:00",
                                         "2013-01-01T00:00:00+00:00",
                                         block_location(root, "s", "2012-12-31"), 10)
    for m in manifests:
        assert glob.glob(block_files_glob(m.location))


def test_place_blocks_refuses_existing_directory_and_moves_nothing(tmp_path):
    root = str(tmp_path / "root")
    staging = os.path.join(root, "s", ".staging-x")
    written = _stage(staging, ["2013-01-01", "2013-01-02"])
    os.makedirs(block_location(root, "s", "2013-01-02"))  # even an empty directory counts
    with pytest.raises(BlockExistsError, match="immutable"):
        splitter._place_blocks(staging, written, "s", TimeWindowScheme("t", "day"), root, ())
    assert not os.path.exists(block_location(root, "s", "2013-01-01"))
    assert sorted(os.listdir(staging)) == ["2013-01-01", "2013-01-02"]


def test_place_blocks_refuses_registered_ids(tmp_path):
    root = str(tmp_path / "root")
    staging = os.path.join(root, "s", ".staging-x")
    written = _stage(staging, ["bucket-1", "bucket-0"])
    with pytest.raises(BlockExistsError, match="already registered"):
        splitter._place_blocks(staging, written, "s", HashBucketScheme("u", 2, "x"), root,
                               {"bucket-1"})
    assert not os.path.exists(block_location(root, "s", "bucket-0"))


def test_place_blocks_refuses_blocks_older_than_the_newest(tmp_path):
    root = str(tmp_path / "root")
    staging = os.path.join(root, "s", ".staging-x")
    written = _stage(staging, ["2013-01-05", "2013-01-12"])
    day = TimeWindowScheme("t", "day")
    with pytest.raises(LateBlockError, match="2013-01-05"):
        splitter._place_blocks(staging, written, "s", day, root, (), "2013-01-11T00:00:00+00:00")
    assert not os.path.exists(block_location(root, "s", "2013-01-12"))
    # The newest block's end is a valid start (half-open windows); offsets are compared as times.
    moved = splitter._place_blocks(staging, written, "s", day, root, (),
                                   "2013-01-04T19:00:00-05:00")
    assert [m.block_id for m in moved] == ["2013-01-05", "2013-01-12"]


def test_malformed_error_message():
    examples = [MalformedRecord("/d/a.csv", 7, "missing value", "t", "None")]
    err = MalformedRecordsError(3, examples, 10)
    assert isinstance(err, ValueError)
    assert "3 of 10 records" in str(err) and "/d/a.csv:7" in str(err)
    assert "on_malformed='skip'" in str(err)


def test_split_result_records_written():
    r = SplitResult("s", "time:t:day", (BlockManifest("a", None, None, "/x", 3),
                                         BlockManifest("b", None, None, "/y", 4)), 8, 1)
    assert r.records_written == 7


class FakeLedger:
    """Just the ledger surface the splitter uses."""

    def __init__(self, granularity="", existing=(), fail=False, known=True):
        self.granularity, self.existing, self.fail, self.known = granularity, existing, fail, known
        self.added = []

    def stream(self, name):
        if not self.known:
            raise UnknownStreamError(name)
        return collections.namedtuple("S", "granularity")(self.granularity)

    def blocks(self, name):
        return [collections.namedtuple("B", "block_id")(b) for b in self.existing]

    def add_blocks(self, name, specs):
        if self.fail:
            raise RuntimeError("ledger down")
        self.added.append((name, list(specs)))
        return len(specs)


@pytest.mark.parametrize("granularity", ["time:t:hour", "hour", "hash:t:4:s"])
def test_split_and_register_refuses_other_scheme_before_reading(tmp_path, granularity):
    src = write_csv(tmp_path / "a.csv", ["t"], [["1"]])
    with pytest.raises(ValueError, match="granularity"):
        splitter.split_and_register(FakeLedger(granularity), "s", src, TimeWindowScheme("t", "day"),
                                    str(tmp_path / "b"), verbose=False)


def test_split_and_register_unknown_stream(tmp_path):
    src = write_csv(tmp_path / "a.csv", ["t"], [["1"]])
    with pytest.raises(UnknownStreamError):
        splitter.split_and_register(FakeLedger(known=False), "s", src,
                                    TimeWindowScheme("t", "day"), str(tmp_path / "b"))


# === slow: Beam DirectRunner ===================================================================


def read_block(manifest, stream):
    """(files, serialized records) of a block, decrypted with the key its manifest carries;
    TensorFlow's TFRecord reader reads the decrypted bytes."""
    import tensorflow as tf

    dk = keys.DataKey.unwrap(keys.provider(), manifest.wrapped_key,
                             keys.aad_for(stream, manifest.block_id))
    records = []
    files = sorted(glob.glob(encrypted_files_glob(manifest.location)))
    assert not glob.glob(block_files_glob(manifest.location))  # no plaintext file
    for path in files:
        plain = os.path.join(os.path.dirname(path), "plain.gz")
        with open(path, "rb") as f:
            data = dk.decrypt(f.read(), keys.aad_for(stream, manifest.block_id,
                                                     os.path.basename(path)))
        assert data[:2] == b"\x1f\x8b"  # the plaintext is a gzip TFRecord file
        with open(plain, "wb") as f:
            f.write(data)
        options = tf.io.TFRecordOptions(compression_type="GZIP")
        records.extend(tf.compat.v1.io.tf_record_iterator(plain, options))
        os.remove(plain)
    return files, records


def example_to_dict(serialized):
    import tensorflow as tf

    example = tf.train.Example.FromString(serialized)
    out = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        values = list(getattr(feature, kind).value)
        assert len(values) == 1
        value = values[0]
        out[name] = value.decode("utf-8") if kind == "bytes_list" else value
    return out


def read_stream(block_root, stream, result):
    """{block_id: [record dict, ...]} of every block directory under the stream (each a block
    of the split ``result``, decrypted with the key its manifest carries)."""
    out = {}
    manifests = {m.block_id: m for m in result.blocks}
    stream_dir = os.path.join(block_root, stream)
    assert sorted(os.listdir(stream_dir)) == sorted(manifests)
    for block_id in sorted(os.listdir(stream_dir)):
        files, serialized = read_block(manifests[block_id], stream)
        assert [os.path.basename(f) for f in files] == [records.BLOCK_FILE_NAME + ".tink"]
        out[block_id] = [example_to_dict(r) for r in serialized]
    return out


def freeze(d):
    return tuple(sorted(d.items()))


# Rows exactly at and around block boundaries; t in unix seconds.
BOUNDARY_TIMES = [
    ts(2013, 1, 1), ts(2013, 1, 1) - 1, ts(2013, 1, 1, 23, 59, 59), ts(2013, 1, 2),
    ts(2012, 12, 31, 12), ts(2016, 2, 29), ts(2016, 2, 29, 23, 59, 59), ts(2016, 3, 1),
    0, -1, -86400, -86401, ts(1950, 6, 1, 12), ts(2013, 1, 7), ts(2013, 1, 7) - 1,
    ts(2013, 1, 1),  # a duplicate row: the multiset must keep both
]


def boundary_rows():
    rows = []
    for k, t in enumerate(BOUNDARY_TIMES):
        text = ["plain", "comma, inside", 'quote "q"', "line\nbreak", "é漢字", ""][k % 6]
        delay = ["0.5", "", "-1.25", "3"][k % 4]
        rows.append([str(t), str(k % 3), delay, text])
    rows.append(rows[0])
    return rows


@pytest.fixture(scope="module")
def boundary_csv(tmp_path_factory):
    d = tmp_path_factory.mktemp("src")
    return write_csv(d / "events.csv", ["t", "k", "delay", "text"], boundary_rows())


def expected_records(rows):
    out = []
    for t, k, delay, text in rows:
        r = {"t": int(t), "k": int(k)}
        if delay:
            r["delay"] = float(delay)  # all chosen values are exact in float32
        if text:
            r["text"] = text
        out.append(r)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("granularity", ["day", "hour", "week", "month"])
def test_csv_split_puts_every_record_in_exactly_its_block(tmp_path, boundary_csv, granularity):
    scheme = TimeWindowScheme("t", granularity)
    root = str(tmp_path / "blocks")
    result = splitter.split_into_blocks("events", boundary_csv, scheme, root, verbose=False)

    stored = read_stream(root, "events", result)
    rows = boundary_rows()
    expected = expected_records(rows)
    # Exactly the input multiset, nothing lost, nothing duplicated.
    got = collections.Counter(freeze(r) for records in stored.values() for r in records)
    assert got == collections.Counter(freeze(r) for r in expected)
    # Each record in the block its timestamp names.
    for block_id, block_records in stored.items():
        for r in block_records:
            assert scheme.block_of(r["t"]).block_id == block_id
    # Manifests: one per block directory, counts, boundaries, time order.
    assert [b.block_id for b in result.blocks] == sorted(stored)
    for b in result.blocks:
        assert b.records == len(stored[b.block_id])
        assert b.location == block_location(os.path.abspath(root), "events", b.block_id)
        assert (b.start, b.end) == (scheme.block_key(b.block_id).start,
                                    scheme.block_key(b.block_id).end)
    starts = [b.start for b in result.blocks]
    assert starts == sorted(starts)
    assert result.records_read == len(rows) == result.records_written
    assert result.malformed == 0
    assert result.scheme == scheme.spec()
    assert not [d for d in os.listdir(os.path.join(root, "events")) if d.startswith(".")]


@pytest.mark.slow
def test_day_split_boundary_assignments(tmp_path, boundary_csv):
    root = str(tmp_path / "blocks")
    result = splitter.split_into_blocks("events", boundary_csv, TimeWindowScheme("t", "day"),
                                        root, verbose=False)
    stored = read_stream(root, "events", result)
    times = {block_id: sorted(r["t"] for r in records) for block_id, records in stored.items()}
    assert times["2013-01-01"] == [ts(2013, 1, 1)] * 3 + [ts(2013, 1, 1, 23, 59, 59)]
    assert times["2012-12-31"] == [ts(2012, 12, 31, 12), ts(2013, 1, 1) - 1]
    assert times["2013-01-02"] == [ts(2013, 1, 2)]
    assert times["1970-01-01"] == [0]
    assert times["1969-12-31"] == [-86400, -1]
    assert times["1969-12-30"] == [-86401]
    assert times["2016-02-29"] == [ts(2016, 2, 29), ts(2016, 2, 29, 23, 59, 59)]
    assert times["2016-03-01"] == [ts(2016, 3, 1)]


@pytest.mark.slow
def test_tfrecord_input_is_copied_byte_for_byte(tmp_path):
    import tensorflow as tf

    src = str(tmp_path / "in.tfrecord.gz")
    originals = []
    with tf.io.TFRecordWriter(src, tf.io.TFRecordOptions(compression_type="GZIP")) as w:
        for k, t in enumerate(BOUNDARY_TIMES):
            ex = tf.train.Example()
            iso = datetime.datetime.fromtimestamp(t, UTC).isoformat()
            ex.features.feature["time"].bytes_list.value.append(iso.encode())
            ex.features.feature["k"].int64_list.value.append(k)
            ex.features.feature["x"].float_list.value.extend([0.5, 1.5])
            originals.append(ex.SerializeToString())
            w.write(originals[-1])
    scheme = TimeWindowScheme("time", "day")
    root = str(tmp_path / "blocks")
    result = splitter.split_into_blocks("ev", src, scheme, root, verbose=False)
    got = collections.Counter()
    for b in result.blocks:
        _, records = read_block(b, "ev")
        for r in records:
            assert scheme.block_of(tf.train.Example.FromString(r).features.feature["time"]
                                   .bytes_list.value[0]).block_id == b.block_id
        got.update(records)
    assert got == collections.Counter(originals)
    assert result.records_read == len(originals)


@pytest.mark.slow
def test_tfrecord_malformed_records(tmp_path):
    import tensorflow as tf

    src = str(tmp_path / "in.tfrecord")
    with tf.io.TFRecordWriter(src) as w:
        for value in [1357000200, None, "multi", 1357000300]:
            ex = tf.train.Example()
            if value == "multi":
                ex.features.feature["t"].int64_list.value.extend([1, 2])
            elif value is not None:
                ex.features.feature["t"].int64_list.value.append(value)
            w.write(ex.SerializeToString())
        w.write(b"\xff\xfenot a proto")
    result = splitter.split_into_blocks("ev", src, TimeWindowScheme("t", "day"),
                                        str(tmp_path / "b"), on_malformed="skip", verbose=False)
    assert result.malformed == 3 and result.records_read == 5
    assert [b.records for b in result.blocks] == [2]
    assert [(m.position, m.reason) for m in result.malformed_examples] == [
        (2, "missing value"), (3, "feature holds 2 values, a block key needs exactly one"),
        (5, "not a serialized tf.train.Example")]


MALFORMED_ROWS = [
    ["2013-01-01T10:00:00Z", "1"],       # ok
    ["", "2"],                            # missing key                 line 3
    ["2013-01-01T10:00:00", "3"],        # naive: no timezone guessed  line 4
    ["garbage", "4"],                     # unparsable                  line 5
    ["2013-01-02T00:00:00+00:00", "5"],  # ok
    ["2013-01-02T00:00:00Z", "6", "x"],  # extra field                 line 7
    ["2013-01-01T23:59:59Z", "oops"],    # not an int (schema given)   line 8
    ["2013-01-01T23:00:00-01:00", "8"],  # ok: 2013-01-02 00:00 UTC
]


@pytest.fixture()
def malformed_csv(tmp_path):
    return write_csv(tmp_path / "m.csv", ["time", "n"], MALFORMED_ROWS)


@pytest.mark.slow
def test_malformed_rows_fail_the_split_and_write_nothing(tmp_path, malformed_csv):
    root = str(tmp_path / "blocks")
    with pytest.raises(MalformedRecordsError) as e:
        splitter.split_into_blocks("s", malformed_csv, TimeWindowScheme("time", "day"), root,
                                   schema={"time": "string", "n": "int"}, verbose=False)
    assert e.value.count == 5
    assert "5 of 8 records" in str(e.value)
    assert f"{malformed_csv}:3" in str(e.value)
    assert not os.path.exists(root)  # no block, no staging, no directory left behind


@pytest.mark.slow
def test_malformed_rows_skipped_are_counted_and_reported(tmp_path, malformed_csv):
    root = str(tmp_path / "blocks")
    result = splitter.split_into_blocks("s", malformed_csv, TimeWindowScheme("time", "day"), root,
                                        schema={"time": "string", "n": "int"},
                                        on_malformed="skip", verbose=False)
    assert result.records_read == 8 and result.malformed == 5 and result.records_written == 3
    assert [(b.block_id, b.records) for b in result.blocks] == [("2013-01-01", 1),
                                                                ("2013-01-02", 2)]
    assert [m.position for m in result.malformed_examples] == [3, 4, 5, 7, 8]
    by_position = {m.position: m for m in result.malformed_examples}
    assert by_position[3].reason == "missing value" and by_position[3].column == "time"
    assert "timezone" in by_position[4].reason and by_position[4].value == "'2013-01-01T10:00:00'"
    assert by_position[7].reason == "expected 2 fields, got 3" and by_position[7].column is None
    assert by_position[8].column == "n" and by_position[8].value == "'oops'"
    assert sum(n for _, n in result.malformed_by_reason) == 5
    stored = read_stream(root, "s", result)
    assert sorted(r["n"] for rs in stored.values() for r in rs) == [1, 5, 8]


@pytest.mark.slow
def test_hash_bucket_split(tmp_path):
    rows = [[str(user), str(event)] for event in range(6) for user in range(60)]
    src = write_csv(tmp_path / "u.csv", ["user_id", "event"], rows)
    scheme = HashBucketScheme("user_id", 8, "test-salt")
    root = str(tmp_path / "blocks")
    result = splitter.split_into_blocks("users", src, scheme, root, verbose=False)
    stored = read_stream(root, "users", result)
    assert set(stored) <= {f"bucket-{k}" for k in range(8)}
    assert [b.block_id for b in result.blocks] == sorted(stored)
    users_in = collections.defaultdict(set)
    for block_id, block_records in stored.items():
        for r in block_records:
            assert scheme.block_of(r["user_id"]).block_id == block_id
            users_in[r["user_id"]].add(block_id)
    assert len(users_in) == 60 and all(len(b) == 1 for b in users_in.values())
    assert sum(len(rs) for rs in stored.values()) == 360
    assert all(b.start is None and b.end is None for b in result.blocks)


@pytest.mark.slow
def test_refuses_to_overwrite_existing_blocks(tmp_path, boundary_csv):
    root = str(tmp_path / "blocks")
    scheme = TimeWindowScheme("t", "month")
    first = splitter.split_into_blocks("events", boundary_csv, scheme, root, verbose=False)
    before = {b.block_id: open(glob.glob(encrypted_files_glob(b.location))[0], "rb").read()
              for b in first.blocks}
    with pytest.raises(BlockExistsError, match="immutable"):
        splitter.split_into_blocks("events", boundary_csv, scheme, root, verbose=False)
    after = {b.block_id: open(glob.glob(encrypted_files_glob(b.location))[0], "rb").read()
             for b in first.blocks}
    assert after == before
    assert sorted(os.listdir(os.path.join(root, "events"))) == sorted(before)


@pytest.mark.slow
def test_split_and_register_with_the_ledger(tmp_path, boundary_csv):
    from sage_tfx.ledger import open_ledger

    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    scheme = TimeWindowScheme("t", "week")
    ledger.create_stream("events", epsilon_g=1.0, delta_g=1e-6, granularity=scheme.spec())
    root = str(tmp_path / "blocks")
    result = splitter.split_and_register(ledger, "events", boundary_csv, scheme, root,
                                         verbose=False)
    states = ledger.blocks("events")
    assert [s.block_id for s in states] == [b.block_id for b in result.blocks]
    assert [s.start for s in states] == sorted(s.start for s in states)  # time order
    for s, b in zip(states, result.blocks):
        assert (s.location, s.start, s.end, s.records) == (b.location, b.start, b.end, b.records)
    # Each block registered with its own data key, wrapped by this process's KEK.
    registered = {k.block_id: k for k in ledger.block_keys("events")}
    assert {b.block_id: (b.kek_id, b.wrapped_key) for b in result.blocks} == {
        k.block_id: (k.kek_id, k.wrapped) for k in registered.values()}
    assert len({k.wrapped for k in registered.values()}) == len(registered)
    assert all(k.kek_id == keys.provider().kek_id for k in registered.values())
    # Again: the blocks are registered, so the split is refused and the ledger is unchanged.
    with pytest.raises(BlockExistsError, match="already registered"):
        splitter.split_and_register(ledger, "events", boundary_csv, scheme, root, verbose=False)
    assert len(ledger.blocks("events")) == len(states)
    # Older than the newest block (a week of 2015, before 2016-02-29): refused, nothing written.
    late = write_csv(tmp_path / "late.csv", ["t", "k", "delay", "text"],
                     [[str(ts(2015, 6, 1)), "1", "0.5", "x"]])
    with pytest.raises(LateBlockError):
        splitter.split_and_register(ledger, "events", late, scheme, root, verbose=False)
    assert not os.path.exists(block_location(root, "events", "2015-W23"))
    # Newer data is appended after the existing blocks.
    new = write_csv(tmp_path / "new.csv", ["t", "k", "delay", "text"],
                    [[str(ts(2016, 3, 7)), "1", "0.5", "x"], [str(ts(2016, 3, 20)), "2", "", ""]])
    splitter.split_and_register(ledger, "events", new, scheme, root, verbose=False)
    assert [s.block_id for s in ledger.blocks("events")][-3:] == ["2016-W09", "2016-W10",
                                                                 "2016-W11"]


@pytest.mark.slow
def test_failed_registration_removes_new_blocks(tmp_path, boundary_csv):
    root = str(tmp_path / "blocks")
    with pytest.raises(RuntimeError, match="ledger down"):
        splitter.split_and_register(FakeLedger(fail=True), "events", boundary_csv,
                                    TimeWindowScheme("t", "month"), root, verbose=False)
    assert os.listdir(os.path.join(root, "events")) == []


@pytest.mark.slow
def test_progress_is_printed(tmp_path, boundary_csv, capsys):
    splitter.split_into_blocks("events", boundary_csv, TimeWindowScheme("t", "month"),
                               str(tmp_path / "b"), verbose=True,
                               pipeline_options=["--runner=DirectRunner"])
    err = capsys.readouterr().err
    assert "read 17 records" in err and "blocks written" in err
