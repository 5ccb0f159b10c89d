"""The Draw-and-Discard demo (``python -m sage_tfx.pipelines.dnd_demo``) at a tiny size: 60
clients through the service, curves of 6,000 updates."""
import os
import subprocess
import sys

import pytest

from sage_tfx.pipelines import dnd_demo


def test_dnd_demo_tiny(tmp_path, capsys):
    out = dnd_demo.run(str(tmp_path / "demo"), served=60, updates=6000, epsilon=4.0, delta=1e-6)
    text = capsys.readouterr().out
    for step in ("[1/5]", "[2/5]", "[3/5]", "[4/5]", "[5/5]", "plot:", "audit chain intact: True",
                 "has used its 1 update(s)", "second run granted: False"):
        assert step in text
    served = out["served"]
    assert served["granted"] and served["final"]
    assert served["accepted"] + served["rejected"] == 60
    assert served["accepted"] >= 55  # the spam check passes honest updates (>= 99 % in test_spam)
    assert 0.0 <= served["accuracy"] <= 1.0
    # what the run charged is what the ledger holds: (ε, δ) per update, one update per client,
    # on every block; the denied second run charged nothing
    assert out["spent"] == {f"bucket-{i}": (4.0, 1e-6) for i in range(8)}
    assert out["second_granted"] is False
    assert len(out["final"]) == 3
    for updates, acc in out["curves"].values():
        assert updates[0] == 1000 and updates[-1] == 6000
        assert all(0.0 <= a <= 1.0 for a in acc)
    assert os.path.getsize(out["png"]) > 0


@pytest.mark.parametrize("args", [["--epsilon", "-1"], ["--delta", "1.5"], ["--updates", "10"],
                                  ["--served", "0"]])
def test_dnd_demo_refuses_bad_arguments(tmp_path, args):
    r = subprocess.run([sys.executable, "-m", "sage_tfx.pipelines.dnd_demo",
                        "--out", str(tmp_path / "x"), *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "error:" in r.stderr
    assert not (tmp_path / "x").exists()


def test_the_long_curves_report_their_progress(capsys):
    from sage_tfx.dnd.eval import digits

    runs = dnd_demo.curves(digits.load(), dnd_demo.configs(4.0, 1e-6, 3000), 3000, every=0.0)
    lines = [line for line in capsys.readouterr().out.splitlines() if "updates, accuracy" in line]
    for n in (1, 2, 3):  # every curve, at its points before the last (printed when it ends)
        mine = [line for line in lines if f"curve {n}/3: " in line]
        assert len(mine) == len(dnd_demo.marks_up_to(3000)) - 1, lines
    assert len(runs) == 3
