"""The DP bagging demo (``python -m sage_tfx.pipelines.bagging_demo``) at a tiny size: k = 2
partitions of n = 10 teachers, a grant of ε = 2."""
import os
import subprocess
import sys

from sage_tfx.pipelines import bagging_demo


def test_bagging_demo_tiny(tmp_path, capsys):
    out = bagging_demo.run(str(tmp_path / "demo"), epsilon=2.0, k=2, n=10)
    text = capsys.readouterr().out
    for step in ("[1/5]", "[2/5]", "[3/5]", "[4/5]", "[5/5]", "plot:", "formally DP: True",
                 "audit chain intact: True"):
        assert step in text
    # the grant's charge is what every block holds, and it is within the requested ε
    assert out["queries"] >= 1 and 0 < out["epsilon"] <= 2.0
    assert out["spent"] == {f"b{i}": round(out["epsilon"], 6) for i in range(3)}
    assert out["replayed"] is True
    assert 0.0 <= out["student"]["auroc"] <= 1.0 and out["reference"]["auroc"] > 0.6
    assert os.path.getsize(out["png"]) > 0


def test_bagging_demo_refuses_bad_epsilon(tmp_path):
    r = subprocess.run([sys.executable, "-m", "sage_tfx.pipelines.bagging_demo",
                        "--out", str(tmp_path / "x"), "--epsilon", "0"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "error:" in r.stderr
    assert not (tmp_path / "x").exists()
