"""The PTK demo (``python -m sage_tfx.pipelines.ptk_demo``) on a tiny config: January-March to
profile and register, April to train, one subsample per fraction."""
import os

from sage_tfx.pipelines import ptk_demo


def test_ptk_demo_tiny(tmp_path, capsys):
    out = ptk_demo.run(str(tmp_path / "demo"), months=4, seeds=1, fractions=(0.1, 1.0))
    text = capsys.readouterr().out
    for step in ("[1/5]", "[2/5]", "[3/5]", "[4/5]", "[5/5]", "plot:"):
        assert step in text
    members = [m for p in out["plan"].partitions for m in p.members]
    assert len(members) == 5 and sum(float(m.epsilon) for m in members) <= 1.0
    assert out["grants"] >= 4  # three profiles and at least one training partition
    assert "0 raw block files left" in text
    assert os.path.getsize(out["png"]) > 0
    full = {r["variant"]: r["log_loss"] for r in out["rows"] if r["fraction"] == 1.0}
    assert set(full) == {"no_ptk", "dp_ptk", "nonprivate_ptk"}
    # the DP day/hour delay statistics of the other airports help the EWR model
    assert full["dp_ptk"] < full["no_ptk"]
