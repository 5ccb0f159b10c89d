"""DPBaggingTrainer's Beam teacher flow trains the library's teachers from one copy of the rows
(no row is shuffled k times) and counts the same votes."""
import numpy as np
import pytest

from blockdata import make_example

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", ["logistic", "tree"])
def test_beam_flow_equals_the_library_teachers(tmp_path, kind):
    from sage_tfx.bagging import chunk_assignment, train_teachers, vote_counts
    from sage_tfx.components.dp_bagging_trainer.beam_flow import run_teacher_flow

    rng = np.random.default_rng(1)
    X = rng.normal(size=(120, 2)).astype(np.float32).astype(np.float64)   # tf.Example floats
    y = (X[:, 0] + 0.4 * X[:, 1] > 0).astype(int)
    units = np.arange(120) // 2
    files = {"f0": [], "f1": []}
    for r in range(120):
        files[f"f{r % 2}"].append(make_example({"x0": float(X[r, 0]), "x1": float(X[r, 1]),
                                                "user": int(units[r]), "label": int(y[r])})
                                  .SerializeToString())
    k, n, salt = 3, 5, b"flow"
    X_vote = rng.normal(size=(30, 2))
    ens, counts, seen = run_teacher_flow(
        sorted(files), read_records=lambda f: files[f], feature_keys=["x0", "x1"],
        label_key="label", unit_key="user", mean=np.zeros(2), std=np.ones(2), k=k, n=n,
        salt=salt, kind=kind, l2=1.0, X_vote=X_vote, scratch=str(tmp_path / "scratch"))
    assert sorted(seen) == sorted(set(units.tolist()))
    # the scratch (teachers, privacy units, vote counts) is encrypted: no pickle there
    import io
    import pickle
    scratch = sorted((tmp_path / "scratch").iterdir())
    assert [p.name for p in scratch] == ["counts.tink", "teachers.tink", "units.tink"]
    for p in scratch:
        with pytest.raises(Exception):
            pickle.Unpickler(io.BytesIO(p.read_bytes())).load()
    lib = train_teachers(X, y, chunk_assignment(units.tolist(), k=k, n=n, salt=salt), n=n,
                         kind=kind)
    if kind == "logistic":
        np.testing.assert_allclose(ens.coef, lib.coef, atol=1e-8)
    np.testing.assert_array_equal(counts, vote_counts(lib, X_vote))
    assert counts.sum() == k * n * len(X_vote)
