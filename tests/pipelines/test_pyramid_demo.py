"""The Pyramid demo (``python -m sage_tfx.pipelines.pyramid_demo``) at a tiny size: 24,000
flights, three history months, retention two, a hot window of 500 flights."""
import os
import subprocess
import sys

import pytest

from sage_tfx.pipelines import pyramid_demo


def test_pyramid_demo_tiny(tmp_path, capsys):
    out = pyramid_demo.run(str(tmp_path / "demo"), limit=24_000, epsilon=0.5, history=3,
                           retention=2, hot_rows=500)
    text = capsys.readouterr().out
    for step in ("[1/5]", "[2/5]", "[3/5]", "[4/5]", "[5/5]", "plot:", "retrain",
                 "audit chain intact: True"):
        assert step in text
    # what the store charged is what the ledger holds: ε per sealed month, nothing elsewhere
    assert out["spent"] == {f"m{m:02d}": (0.5 if m <= 3 else 0.0) for m in range(1, 13)}
    assert text.count("charged epsilon = 0.5") == 3
    assert out["live"] == (2, 3)
    assert set(out["losses"]) == {"constant", "no counts", "DP counts"}
    assert all(0 < v < 1 for v in out["losses"].values())
    assert os.path.getsize(out["png"]) > 0
    # the hot window was discarded: no raw rows left in the store's directory
    assert not os.listdir(tmp_path / "demo" / "pyramid" / "hot")


@pytest.mark.parametrize("args", [["--retention", "5", "--history", "3"], ["--epsilon", "-1"],
                                  ["--hot-rows", "10"]])
def test_pyramid_demo_refuses_bad_arguments(tmp_path, args):
    r = subprocess.run([sys.executable, "-m", "sage_tfx.pipelines.pyramid_demo",
                        "--out", str(tmp_path / "x"), "--limit", "2000", *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "error:" in r.stderr
    assert not (tmp_path / "x" / "ledger.db").exists()
