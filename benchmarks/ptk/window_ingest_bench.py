"""Time to advance the PTK store by one window (ingest only: split, encrypt, register the blocks).

    .venv/bin/python benchmarks/ptk/window_ingest_bench.py [--records 200000] [--windows 5]

Prints the median and the fastest window. With no PTK registered this is the cost of the
window itself: the user-hash split, one encrypted block file per bucket (the window's data key,
``$SAGE_KEY_PROVIDER``'s KEK; a throw-away one in a temporary directory when unset), the ledger
registration, the window lease, and closing the previous window (key and files destroyed).
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from sage_tfx.ptk import PTKStore, StoreConfig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--windows", type=int, default=5)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    n = a.records
    cols = {"user": np.array([f"u{i}" for i in range(n)]),
            "city": rng.choice(np.array(list("abcd")), n), "delay": rng.normal(size=n),
            "x0": rng.normal(size=n), "x1": rng.normal(size=n)}
    with tempfile.TemporaryDirectory() as d:
        os.environ.setdefault("SAGE_KEY_PROVIDER", f"file:{d}/kek.json")
        store = PTKStore(f"sqlite:///{d}/ledger.db", f"{d}/data", StoreConfig())
        times = []
        try:
            for _ in range(a.windows):
                t0 = time.perf_counter()
                store.advance_window(cols, user_key="user")
                times.append(time.perf_counter() - t0)
            store.windows.close()
        finally:
            store.close()
    med = statistics.median(times)
    print(f"{n:,} records x {a.windows} windows: median {med:.3f} s per window "
          f"({n / med:,.0f} records/s), fastest {min(times):.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
