"""The Chicago taxi sample (``sage_tfx.streams.chicago_taxi_csv_path``, 15,002 trips) as a
Pyramid workload.

Label: tips > 20 % of the fare (``fare > 0``; trips with no fare are dropped). Counted features:
pickup and dropoff community areas, dropoff census tract, company, payment type, start hour and
weekday, and the pairs (pickup, dropoff) and (company, payment type). Missing areas / tracts are
their own value ``-1``. Rows are ordered by ``trip_start_timestamp``; the ``month`` column is a
window index 1..12 of equal-count time buckets (the sample spans several years), so the protocol
of :mod:`sage_tfx.pyramid.eval.experiments` (window 1 set aside for weights) applies unchanged.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

FEATURES = ("pickup_community_area", "dropoff_community_area", "dropoff_census_tract",
            "company", "payment_type", "trip_start_hour", "trip_start_day")
PAIRS = (("pickup_community_area", "dropoff_community_area"), ("company", "payment_type"))
LABEL = "y"


def load_taxi(windows: int = 12) -> pd.DataFrame:
    """Chicago taxi trips in time order, split into ``windows`` windows."""
    from sage_tfx.streams import chicago_taxi_csv_path
    d = pd.read_csv(chicago_taxi_csv_path())
    d = d[d["fare"] > 0].sort_values("trip_start_timestamp", kind="stable")
    out = pd.DataFrame({f: d[f].fillna(-1).astype(np.int64).to_numpy() for f in
                        ("pickup_community_area", "dropoff_community_area",
                         "dropoff_census_tract", "trip_start_hour", "trip_start_day")})
    out["company"] = d["company"].fillna("NA").astype(str).to_numpy()
    out["payment_type"] = d["payment_type"].fillna("NA").astype(str).to_numpy()
    out[LABEL] = (d["tips"] > 0.2 * d["fare"]).astype(np.int64).to_numpy()
    out["month"] = 1 + (np.arange(len(out)) * windows) // len(out)
    return out.reset_index(drop=True)
