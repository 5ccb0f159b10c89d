"""Peak memory of DPBaggingTrainer's Beam teacher flow against the library path.

Synthetic private rows (Gaussian features of the Heart Failure width, 2 rows per unit) as
serialized tf.Examples in memory; runs ``run_teacher_flow`` (DirectRunner) and, in a fresh
process, the library's ``train_teachers`` + ``vote_counts`` on the same rows. Prints the max RSS
growth over the process's baseline after imports and data (``ru_maxrss``), and the time.
``--flow-module`` loads another implementation of ``run_teacher_flow`` from a file, for a
before/after comparison (e.g. ``git show <commit>:components/dp_bagging_trainer/beam_flow.py``).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bagging/beam_flow_memory.py
        [--private 4000 --k 80 --n 50] [--library] [--flow-module FILE]
"""
from __future__ import annotations

import argparse
import importlib.util
import resource
import sys
import time

import numpy as np


def _rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--private", type=int, default=4000)
    ap.add_argument("--public", type=int, default=1000)
    ap.add_argument("--k", type=int, default=80)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--d", type=int, default=29)
    ap.add_argument("--library", action="store_true", help="the library path instead of Beam")
    ap.add_argument("--flow-module", default=None)
    args = ap.parse_args(argv)
    import tempfile

    import tensorflow as tf

    from sage_tfx.bagging import chunk_assignment, train_teachers, vote_counts

    rng = np.random.default_rng(0)
    keys = [f"x{i}" for i in range(args.d)]
    X = rng.normal(size=(args.private, args.d)).astype(np.float32).astype(np.float64)
    y = (X @ rng.normal(size=args.d) > 0).astype(np.int64)
    units = np.arange(args.private) // 2
    X_vote = rng.normal(size=(args.public, args.d))
    records = []
    for r in range(args.private):
        ex = tf.train.Example()
        for i, key in enumerate(keys):
            ex.features.feature[key].float_list.value.append(float(X[r, i]))
        ex.features.feature["user"].int64_list.value.append(int(units[r]))
        ex.features.feature["label"].int64_list.value.append(int(y[r]))
        records.append(ex.SerializeToString())
    files = {f"f{i}": records[i::8] for i in range(8)}
    if not args.library:
        import apache_beam  # noqa: F401  (imports before the baseline)
        if args.flow_module:
            spec = importlib.util.spec_from_file_location("flow_under_test", args.flow_module)
            mod = importlib.util.module_from_spec(spec)
            sys.modules["flow_under_test"] = mod      # Beam pickles its functions by module
            spec.loader.exec_module(mod)
        else:
            from sage_tfx.components.dp_bagging_trainer import beam_flow as mod
    base = _rss_mb()
    t0 = time.time()
    if args.library:
        ens = train_teachers(X, y, chunk_assignment(units.tolist(), k=args.k, n=args.n,
                                                    salt=b"mem"), n=args.n)
        counts = vote_counts(ens, X_vote)
    else:
        ens, counts, _ = mod.run_teacher_flow(
            sorted(files), read_records=lambda f: files[f], feature_keys=keys, label_key="label",
            unit_key="user", mean=np.zeros(args.d), std=np.ones(args.d), k=args.k, n=args.n,
            salt=b"mem", kind="logistic", l2=1.0, X_vote=X_vote,
            scratch=tempfile.mkdtemp(prefix="flowmem-"))
    what = "library" if args.library else (args.flow_module or "beam_flow (this tree)")
    print(f"{what}: N={args.private} k={args.k} n={args.n} d={args.d}: max RSS growth "
          f"{_rss_mb() - base:.0f} MB over a {base:.0f} MB baseline, {time.time() - t0:.0f}s; "
          f"votes {int(counts.sum())}")


if __name__ == "__main__":
    sys.exit(main())
