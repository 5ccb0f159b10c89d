"""Tests of ``benchmarks/sage/bench_accountants.py`` (PLD vs RDP for DP-SGD) on a tiny setting."""
from __future__ import annotations

import csv
import importlib.util
import pathlib

import pytest

from sage_tfx.dp import dpsgd

SCRIPT = (pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "sage"
          / "bench_accountants.py")
TINY = dict(name="tiny", epsilon=0.3, delta=1e-5, batch_size=25, num_examples=1000, epochs=1)


@pytest.fixture
def bench():
    spec = importlib.util.spec_from_file_location("bench_accountants", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_compare_calibrates_both_accountants_to_the_target(bench):
    r = bench.compare(TINY)
    assert r["steps"] == 40
    event = lambda sigma: dpsgd.dpsgd_event(sigma, 25, 1000, 1)  # noqa: E731
    assert dpsgd.dpsgd_epsilon(event(r["sigma_rdp"]), 1e-5, "rdp") <= 0.3
    assert r["pld_epsilon_at_sigma_pld"] <= 0.3 < r["rdp_epsilon_at_sigma_pld"]
    assert r["pld_epsilon_at_sigma_rdp"] < 0.3 and r["sigma_pld"] < r["sigma_rdp"]
    assert r["noise_saved_pct"] == pytest.approx(100 * (1 - r["sigma_pld"] / r["sigma_rdp"]))


def test_main_writes_one_csv_row_per_setting(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "QUICK", [TINY])
    out = tmp_path / "acc.csv"
    assert bench.main(["--quick", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["setting"] for r in rows] == ["tiny"] and set(rows[0]) == set(bench.FIELDS)
    assert "golden MNIST run" in capsys.readouterr().out
