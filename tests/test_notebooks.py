"""Every notebook in notebooks/ runs top to bottom in a real Jupyter kernel (nbclient).

A notebook is documentation that must stay true: it keeps its data small, and any cell error
fails the test. What each notebook promises to show is checked in its outputs.
"""
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# notebook -> (phrases its printed output must contain, number of inline images)
PROMISES = {
    "01_sage_quickstart.ipynb": (
        ("daily blocks", "retired blocks", "DP mean departure delay", "granted: False",
         "have budget left", "refused: epsilon", "chain(s), intact", "budget problems: none"), 1),
    "02_ptk_store.ipynb": (
        ("registered ptk-", "K = 1", "refused: PerformanceTargetError", "REJECT:",
         "notified version 1", "lineage:", "raw files left: 0"), 1),
    "03_pyramid.ipynb": (
        ("sealed window 3", "dropped window(s): (1,)", "retrain", "hot data deleted",
         "RetentionError", "WindowSealedError", "noise weights from window 1", "count GBT",
         "audit chain intact: True"), 1),
    "04_dp_bagging.ipynb": (
        ("labels paid for", "granted: True", "formally DP: True", "student AUROC", "replayed: True",
         "teachers reused: True", "not formally DP", "granted: False", "audit chain intact: True"),
         1),
    "05_draw_and_discard.ipynb": (
        ("granted: True charged epsilon per block: 3.0", "test accuracy per pass",
         "Theorem 1 spread", "noise-free test accuracy", "has used its 3 update(s)",
         "second run granted: False", "shifted passes: False", "III (opportunistic"), 1),
}

pytestmark = pytest.mark.slow


def test_every_notebook_states_its_promises():
    assert NOTEBOOKS and {p.name for p in NOTEBOOKS} == set(PROMISES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_and_shows_what_it_promises(path, tmp_path):
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    # jupyter_client starts the "python3" kernel with this interpreter (sys.executable).
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code)
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    phrases, images = PROMISES[path.name]
    missing = [p for p in phrases if p not in text]
    assert not missing, f"{path.name} no longer shows {missing}"
    assert sum("image/png" in o.get("data", {}) for o in outputs) == images
