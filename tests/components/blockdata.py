"""Test data of the component tests: block storage written with TensorFlow.

Blocks follow docs/design.md: a directory ``<block_root>/<stream>/<block_id>`` holding gzip TFRecord
files of tf.train.Example, encrypted with the block's data key as the splitter writes them
(``part-*.tfrecord.gz.tink``, :func:`write_encrypted_block`) or, the layout before encryption,
in plaintext (``part-*.tfrecord.gz``, :func:`write_block_file`). Every record carries the id of its
block (feature ``block``), so a test can tell which blocks reached an Examples artifact.
"""
import csv
import datetime
import glob
import os

from sage_tfx.streams.blocks import block_location

STREAM = "events"
DAY_BLOCKS = ("2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04")
RECORDS_PER_BLOCK = 30


def write_block_file(location, examples, name="part-00000-of-00001.tfrecord.gz"):
    """Writes tf.train.Examples as one gzip TFRecord file of a block directory."""
    import tensorflow as tf
    os.makedirs(location, exist_ok=True)
    with tf.io.TFRecordWriter(os.path.join(location, name), options="GZIP") as w:
        for ex in examples:
            w.write(ex.SerializeToString())


def write_encrypted_block(location, stream, block_id, parts):
    """Writes lists of tf.train.Examples as a block's encrypted part files, under one new data
    key; returns the key's (kek_id, wrapped) for the block's BlockSpec."""
    from sage_tfx.ledger import keys
    from sage_tfx.streams import blockfiles
    os.makedirs(location, exist_ok=True)
    dk, kek_id, wrapped = blockfiles.new_block_key(keys.provider(), stream, block_id)
    for k, examples in enumerate(parts):
        name = f"part-{k:05d}-of-{len(parts):05d}.tfrecord.gz.tink"
        blockfiles.write_block_file(os.path.join(location, name),
                                    [ex.SerializeToString() for ex in examples], dk,
                                    blockfiles.file_aad(stream, block_id, name))
    return kek_id, wrapped


def make_example(features):
    """A tf.train.Example from {name: int | float | str}."""
    import tensorflow as tf
    ex = tf.train.Example()
    for k, v in features.items():
        f = ex.features.feature[k]
        if isinstance(v, bool) or isinstance(v, int):
            f.int64_list.value.append(int(v))
        elif isinstance(v, float):
            f.float_list.value.append(v)
        else:
            f.bytes_list.value.append(str(v).encode())
    return ex


def read_examples(pattern):
    """Parsed tf.train.Examples of every gzip TFRecord file matching a glob."""
    import tensorflow as tf
    files = sorted(glob.glob(pattern, recursive=True))
    out = []
    for path in files:
        for rec in tf.data.TFRecordDataset(path, compression_type="GZIP").as_numpy_iterator():
            out.append(tf.train.Example.FromString(rec))
    return out


def feature_value(example, name):
    f = example.features.feature[name]
    kind = f.WhichOneof("kind")
    value = getattr(f, kind).value[0]
    return value.decode() if isinstance(value, bytes) else value




def write_taxi_month_blocks(block_root, stream, months):
    """Writes encrypted monthly blocks of the Chicago taxi CSV (tfx wheel) and returns their
    BlockSpecs (wrapped keys included).

    Months, not days: the CSV has ~10 trips a day but ~300 a month. Column types are inferred
    over the whole file (int, else float, else string); empty fields are absent features, as with
    CsvExampleGen.
    """
    from sage_tfx.streams.datasets import chicago_taxi_csv_path
    from sage_tfx.ledger import BlockSpec

    with open(chicago_taxi_csv_path(), newline="") as f:
        rows = list(csv.DictReader(f))

    def kind(values):
        values = [v for v in values if v != ""]
        for cast, name in ((int, "int"), (float, "float")):
            try:
                for v in values:
                    cast(v)
                return name
            except ValueError:
                continue
        return "string"

    types = {c: kind([r[c] for r in rows]) for c in rows[0]}
    by_month = {}
    for r in rows:
        ts = datetime.datetime.fromtimestamp(int(r["trip_start_timestamp"]), datetime.timezone.utc)
        by_month.setdefault(ts.strftime("%Y-%m"), []).append(r)
    specs = []
    for month in months:
        exs = []
        for r in by_month[month]:
            feats = {}
            for c, v in r.items():
                if v == "":
                    continue
                feats[c] = int(v) if types[c] == "int" else float(v) if types[c] == "float" else v
            exs.append(make_example(feats))
        loc = block_location(block_root, stream, month)
        kek_id, wrapped = write_encrypted_block(loc, stream, month, [exs])
        y, m = map(int, month.split("-"))
        end = f"{y + (m == 12):04d}-{m % 12 + 1:02d}"
        specs.append(BlockSpec(month, loc, f"{month}-01T00:00:00+00:00",
                               f"{end}-01T00:00:00+00:00", len(exs), wrapped_key=wrapped,
                               kek_id=kek_id))
    return specs


def write_encrypted_day_blocks(block_root, stream, days, rows_of_day):
    """Encrypted day blocks of ``rows_of_day(day)`` (a list of tf.train.Examples each), one part
    file per block; returns their BlockSpecs (wrapped keys included)."""
    from sage_tfx.ledger import BlockSpec
    specs = []
    for day in days:
        rows = rows_of_day(day)
        loc = block_location(block_root, stream, day)
        kek_id, wrapped = write_encrypted_block(loc, stream, day, [rows])
        start = datetime.date.fromisoformat(day)
        specs.append(BlockSpec(day, loc, f"{start}T00:00:00+00:00",
                               f"{start + datetime.timedelta(days=1)}T00:00:00+00:00",
                               len(rows), wrapped_key=wrapped, kek_id=kek_id))
    return specs
