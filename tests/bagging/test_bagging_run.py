"""A whole run: teachers, labels, student; bad input refused; teachers cached per window."""
import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from sage_tfx.bagging import (BaggingConfig, TeacherCache, chunk_assignment, fit_dp_bagging,
                              label_public, plan_labels, train_teachers)
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError


def data(N=1200, P=600, d=4, seed=0):
    rng = np.random.default_rng(seed)
    w = np.array([1.5, -1.0, 0.5, 0.0])[:d]
    X = rng.normal(size=(N, d))
    y = (X @ w + 0.5 * rng.normal(size=N) > 0).astype(int)
    Xp = rng.normal(size=(P, d))
    yp = (Xp @ w > 0).astype(int)
    return X, y, np.arange(N) // 2, Xp, yp        # two rows per privacy unit


def test_batched_logistic_teachers_equal_scikit_learn():
    X, y, units, _, _ = data()
    ch = chunk_assignment(np.unique(units).tolist(), k=3, n=7, salt=b"s")[units]
    ens = train_teachers(X, y, ch, n=7, l2=2.0)
    for i, j in [(0, 0), (1, 4), (2, 6)]:
        rows = ch[:, i] == j
        X1 = np.hstack([X[rows], np.ones((rows.sum(), 1))])
        sk = LogisticRegression(C=0.5, fit_intercept=False, tol=1e-12,
                                max_iter=5000).fit(X1, y[rows])
        np.testing.assert_allclose(ens.coef[i, j], sk.coef_[0], atol=1e-6)


@pytest.mark.parametrize("mode", ["fixed_queries", "paper"])
def test_run_labels_and_trains_a_useful_student(mode):
    X, y, units, Xp, yp = data()
    cfg = BaggingConfig(k=10, n=20, lam=0.2, mode=mode,
                        accept_not_differentially_private=mode == "paper")
    res = fit_dp_bagging(X, y, units, Xp, config=cfg, epsilon=5.0, delta=1e-5, salt=b"s",
                         public_declared=True, noise=SeededNoise(0))
    lab = res.labelling
    assert 0 < lab.queries <= len(Xp) and len(lab.labels) == lab.queries
    assert lab.formally_dp == (mode == "fixed_queries")
    assert (lab.labels == yp[:lab.queries]).mean() > 0.7
    assert (res.student.predict(Xp) == yp).mean() > 0.75
    report = lab.report()
    assert "counts" not in str(report).lower() and res.report["public_start"] == 0
    if mode == "paper":     # the grant, charged whole; the data-dependent count is not reported
        assert lab.epsilon == 5.0 and report["queries"] is None
        assert report["not_differentially_private"] is True
    else:
        assert report["queries"] == lab.queries and report["not_differentially_private"] is False


@pytest.mark.parametrize("change,err", [
    (dict(config=dict(k=0, n=5, lam=0.1)), InvalidRequestError),
    (dict(config=dict(k=2, n=0, lam=0.1)), InvalidRequestError),
    (dict(config=dict(k=2, n=5, lam=0.0)), InvalidPrivacyParameterError),
    (dict(config=dict(k=2, n=5, lam=-1.0)), InvalidPrivacyParameterError),
    (dict(config=dict(k=2, n=601, lam=0.1)), InvalidRequestError),      # n > 600 units
    (dict(public_declared=False), InvalidRequestError),
    (dict(X_public=np.zeros((0, 4))), InvalidRequestError),
    (dict(empty=True), InvalidRequestError),
    (dict(epsilon=0.0), InvalidPrivacyParameterError),
])
def test_bad_input_is_refused(change, err):
    X, y, units, Xp, _ = data()
    kwargs = dict(epsilon=1.0, delta=1e-5, salt=b"s", public_declared=True, X_public=Xp)
    kwargs.update({k: v for k, v in change.items() if k not in ("config", "empty")})
    if change.get("empty"):
        X, y, units = X[:0], y[:0], units[:0]
    with pytest.raises(err):
        cfg = BaggingConfig(**change.get("config", dict(k=2, n=5, lam=0.1)))
        fit_dp_bagging(X, y, units, config=cfg, **kwargs)


def test_teachers_cached_per_window_and_public_cursor_advances(tmp_path):
    from sage_tfx.ledger import BlockSpec, open_ledger
    X, y, units, Xp, _ = data()
    ledger = open_ledger(f"sqlite:///{tmp_path}/ledger.db")
    ledger.create_stream("s", epsilon_g=20.0, delta_g=1e-4)
    ledger.add_blocks("s", [BlockSpec(b, str(tmp_path / b)) for b in ("b1", "b2", "b3")])
    cfg = BaggingConfig(k=4, n=10, lam=0.05)
    plan = plan_labels(cfg, epsilon=1.0, delta=1e-5, public_size=len(Xp))

    def grant(run, blocks=("b1", "b2")):
        return ledger.request("s", run_id=run, blocks=list(blocks), epsilon=plan.epsilon,
                              delta=plan.delta).grant.grant_id

    cache = TeacherCache(str(tmp_path / "cache"))
    kw = dict(config=cfg, salt=b"s", public_declared=True, cache=cache, ledger=ledger)
    first = fit_dp_bagging(X, y, units, Xp, grant_id=grant("r1"), **kw)
    second = fit_dp_bagging(X, y, units, Xp, grant_id=grant("r2"), **kw)
    assert cache.trained == 1 and not first.teachers_cached and second.teachers_cached
    q = first.labelling.queries
    assert q == plan.queries and second.labelling.public_index[0] == q   # fresh public points
    # a new process reads the cache from disk; another window trains again
    disk = TeacherCache(str(tmp_path / "cache"))
    third = fit_dp_bagging(X, y, units, Xp, grant_id=grant("r3"), **{**kw, "cache": disk})
    assert disk.trained == 0 and third.labelling.public_index[0] == 2 * q
    fit_dp_bagging(X, y, units, Xp, grant_id=grant("r4", ["b3"]), **{**kw, "cache": disk})
    assert disk.trained == 1
    # the cache holds teachers only (the cursor is the ledger's), encrypted, in files only we
    # can read
    assert sorted(p.name.endswith(".tink") for p in (tmp_path / "cache").iterdir()) == [True, True]
    assert all(p.stat().st_mode & 0o077 == 0 for p in (tmp_path / "cache").iterdir())


def test_tree_teachers_multiclass():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(900, 2))
    y = np.digitize(X[:, 0], [-0.5, 0.5])
    ch = chunk_assignment(list(range(900)), k=3, n=5, salt=b"s")
    ens = train_teachers(X, y, ch, n=5, kind="tree", n_classes=3)
    Xp = rng.normal(size=(200, 2))
    res = label_public(ens, Xp, epsilon=50.0, delta=1e-5, lam=1.0, noise=SeededNoise(1))
    assert (res.labels == np.digitize(Xp[:res.queries, 0], [-0.5, 0.5])).mean() > 0.8
