"""How fast is one Beam read over many granted block files? Prints seconds; asserts nothing.

Compares, on N day-blocks of M records each (one gzip TFRecord file per block):
  (a) beam.Create(files) | ReadAllFromTFRecord(GZIP)
  (b) beam.Create(files) | Reshuffle | FlatMap(TF's C++ TFRecord reader)  (BlockExampleGen's read)
  (c) Flatten of one ReadFromTFRecord per file (only with --with-flatten: 557 s for 1,000 blocks)
  (d) BlockExampleGen's executor Do() end to end: ledger check + read + 2:1 split + write.

Usage: .venv/bin/python benchmarks/sage/read_blocks.py [--blocks 1000] [--records 20]
[--with-flatten]
"""
import argparse
import datetime
import os
import shutil
import tempfile
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument("--with-flatten", action="store_true")
    args = parser.parse_args()

    t0 = time.time()
    import apache_beam as beam
    import tensorflow as tf
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.tfrecordio import ReadAllFromTFRecord, ReadFromTFRecord
    from tfx.proto import example_gen_pb2
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils

    from sage_tfx.streams.blocks import block_location
    from sage_tfx.components import artifacts
    from sage_tfx.components.block_example_gen import component, executor, spec
    from sage_tfx.ledger import BlockSpec, Window, open_ledger
    print(f"imports: {time.time() - t0:.1f} s")

    tmp = tempfile.mkdtemp(prefix="read_blocks_")
    t0 = time.time()
    day0 = datetime.date(2020, 1, 1)
    specs, files = [], []
    for k in range(args.blocks):
        day = str(day0 + datetime.timedelta(days=k))
        loc = block_location(os.path.join(tmp, "blocks"), "s", day)
        os.makedirs(loc)
        path = os.path.join(loc, "part-00000-of-00001.tfrecord.gz")
        with tf.io.TFRecordWriter(path, options="GZIP") as w:
            for i in range(args.records):
                ex = tf.train.Example()
                ex.features.feature["day"].bytes_list.value.append(day.encode())
                ex.features.feature["i"].int64_list.value.append(i)
                w.write(ex.SerializeToString())
        specs.append(BlockSpec(day, loc, records=args.records))
        files.append(path)
    print(f"wrote {args.blocks} blocks x {args.records} records: {time.time() - t0:.1f} s")
    expected = args.blocks * args.records

    def count(build):
        t = time.time()
        with beam.Pipeline() as p:
            n = build(p) | beam.combiners.Count.Globally()
            _ = n | beam.Map(lambda c: c == expected or print("WRONG COUNT", c))
        return time.time() - t

    gzip = CompressionTypes.GZIP
    secs = count(lambda p: p | beam.Create(files) | ReadAllFromTFRecord(compression_type=gzip))
    print(f"(a) Create | ReadAllFromTFRecord: {secs:.1f} s")
    secs = count(lambda p: p | beam.Create(files) | beam.Reshuffle()
                 | beam.FlatMap(executor.read_gzip_tfrecords))
    print(f"(b) Create | Reshuffle | FlatMap(TF reader): {secs:.1f} s")
    if args.with_flatten:
        secs = count(lambda p: [p | f"R{k}" >> ReadFromTFRecord(f, compression_type=gzip)
                                for k, f in enumerate(files)] | beam.Flatten())
        print(f"(c) Flatten of {len(files)} ReadFromTFRecord: {secs:.1f} s")

    url = f"sqlite:///{tmp}/ledger.db"
    with open_ledger(url) as ledger:
        ledger.create_stream("s", epsilon_g=1.0, delta_g=1e-5)
        ledger.add_blocks("s", specs)
        grant = ledger.request("s", run_id="bench", window=Window(last=args.blocks),
                               epsilon=0.1).grant
    grant_artifact = artifacts.SageGrant()
    grant_artifact.uri = os.path.join(tmp, "grant")
    artifacts.write_grant(grant_artifact, grant, stream="s", run_id="bench", context="default",
                          ledger_url=url)
    examples = standard_artifacts.Examples()
    examples.uri = os.path.join(tmp, "examples")
    t = time.time()
    executor.Executor().Do({spec.GRANT_INPUT_KEY: [grant_artifact]},
                           {spec.EXAMPLES_KEY: [examples]},
                           {spec.OUTPUT_CONFIG_KEY: proto_utils.proto_to_json(
                               component.default_output_config()),
                            spec.OUTPUT_DATA_FORMAT_KEY: example_gen_pb2.FORMAT_TF_EXAMPLE,
                            spec.OUTPUT_FILE_FORMAT_KEY: example_gen_pb2.FORMAT_TFRECORDS_GZIP})
    print(f"(d) BlockExampleGen Do() on {args.blocks} granted blocks: {time.time() - t:.1f} s")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
