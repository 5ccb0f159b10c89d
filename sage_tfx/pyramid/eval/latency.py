"""Featurization latency (Pyramid Fig. 9): cached snapshot vs uncached, per example and batched.

*Cached* is what Pyramid's application servers do (§IV): the summed tables of the live windows
stay in memory (one :class:`~sage_tfx.pyramid.Featurization`) and key hashes are memoised.
*Uncached* re-reads and re-sums the live windows' sealed tables from the store for every request
and hashes every key afresh, as a server without a local snapshot would.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import pandas as pd

from sage_tfx.pyramid.windows import PyramidStore


def _median_ms(fn, reps: int) -> tuple[float, float]:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times)), float(np.percentile(times, 90))


def measure(store: PyramidStore, requests: pd.DataFrame, batch_sizes: Sequence[int] = (1, 100),
            reps: int = 50, uncached_reps: int = 10) -> list[dict]:
    """Median / p90 latency (ms) of featurizing ``batch`` rows, cached and uncached."""
    rows = []
    cached = store.featurization(cache=True)
    cached.featurize(requests.iloc[:1000])          # warm the hash memo, as a running server
    rng = np.random.default_rng(0)
    for batch in batch_sizes:
        def pick():
            return requests.iloc[rng.integers(0, len(requests), batch)]
        med, p90 = _median_ms(lambda: cached.featurize(pick(), cache=True), reps)
        rows.append(dict(mode="cached", batch=batch, median_ms=med, p90_ms=p90,
                         per_example_ms=med / batch))
        med, p90 = _median_ms(
            lambda: store.featurization(cache=False).featurize(pick(), cache=False), uncached_reps)
        rows.append(dict(mode="uncached", batch=batch, median_ms=med, p90_ms=p90,
                         per_example_ms=med / batch))
    return rows
