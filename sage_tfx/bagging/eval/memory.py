"""The vote-memory benchmark: 24k private × 8k public points, n·k = 25,000 teachers.

The public implementation materialises dense float64 arrays of shape [N, k, n] (unit × partition
× chunk membership); here memory stays O(N·k) int32 chunk ids, O(k·n·d) teacher weights,
int32 counts [P, C] and batches of uint8 predictions. Peak memory is measured by tracemalloc
(numpy reports its buffers to it) around each phase and by the process's max RSS.
"""
from __future__ import annotations

import resource
import time
import tracemalloc

import numpy as np

from sage_tfx.bagging import accounting as acc
from sage_tfx.bagging.partition import chunk_assignment
from sage_tfx.bagging.teachers import train_teachers, vote_counts

__all__ = ["vote_memory_benchmark"]


def vote_memory_benchmark(*, private=24_000, public=8_000, n=250, k=100, d=29, seed=0,
                          paper_queries=None, log=print) -> dict:
    """Peak memory of the vote computation at the paper's scale, dense against batched."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=d)
    X = rng.normal(size=(private, d))
    y = (X @ w + 2 * rng.normal(size=private) > 0).astype(np.int64)
    Xp = rng.normal(size=(public, d))
    result = {"private": private, "public": public, "n": n, "k": k, "teachers": n * k,
              "dense_nkn_float64_gb": private * k * n * 8 / 1e9}
    tracemalloc.start()
    t0 = time.time()
    chunks = chunk_assignment(list(range(private)), k=k, n=n, salt=b"memory")
    ens = train_teachers(X, y, chunks, n=n)
    result["train_s"] = time.time() - t0
    result["train_peak_mb"] = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.reset_peak()
    t0 = time.time()
    counts = vote_counts(ens, Xp)
    result["votes_s"] = time.time() - t0
    result["votes_peak_mb"] = tracemalloc.get_traced_memory()[1] / 1e6
    result["counts_dtype"] = str(counts.dtype)
    tracemalloc.reset_peak()
    t0 = time.time()
    pma = acc.PersonalisedMomentsAccountant(chunks, n=n, lam=2.0 / n, delta=1e-5)
    q = public if paper_queries is None else paper_queries
    for start, pred in ens.predict_batches(Xp[:q]):
        pma.trajectory(pred, 2)
    result["paper_accountant_queries"] = q
    result["paper_accountant_s"] = time.time() - t0
    result["paper_accountant_peak_mb"] = tracemalloc.get_traced_memory()[1] / 1e6
    tracemalloc.stop()
    result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    for key, val in result.items():
        log(f"{key:28s} {val:.2f}" if isinstance(val, float) else f"{key:28s} {val}")
    return result
