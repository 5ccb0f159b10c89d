"""DP bagging under callers that retry, restart and race: the replay matrix and the cursor.

Bagging row of the replay matrix: a purchase repeated under one grant — in the same process, in a
new process, with another teacher-cache directory, in two concurrent processes — ends with one
charge and one release, returned byte for byte, and a clean ``check_consistency``. The public
cursor is the ledger's: concurrent purchases (threads and real processes) never label the same
points. The racing tests run on SQLite and on PostgreSQL. (A server restart does not apply:
bagging has no server.)
"""
import json
import os
import threading

import numpy as np
import pytest
from racing import race

from sage_tfx.bagging import (LABELS_RELEASE, BaggingConfig, TeacherCache, fit_dp_bagging,
                              plan_labels, purchase)
from sage_tfx.errors import GrantStateError, InvalidRequestError, ReleaseConflictError
from sage_tfx.ledger import BlockSpec, open_ledger

CFG = BaggingConfig(k=4, n=10, lam=0.05)
EPS, DELTA = 2.0, 1e-5
BLOCKS = ["b1", "b2"]
SALT = b"release-test"


def data(N=600, P=400, d=3, seed=0):
    rng = np.random.default_rng(seed)
    w = np.array([1.5, -1.0, 0.5])[:d]
    X = rng.normal(size=(N, d))
    y = (X @ w + 0.5 * rng.normal(size=N) > 0).astype(int)
    return X, y, np.arange(N) // 2, rng.normal(size=(P, d))


PLAN = plan_labels(CFG, epsilon=EPS, delta=DELTA, public_size=400)


def make_ledger(tmp_path, url=None):
    url = url or f"sqlite:///{tmp_path}/ledger.db"
    ledger = open_ledger(url)
    ledger.create_stream("s", epsilon_g=100.0, delta_g=1e-3)
    ledger.add_blocks("s", [BlockSpec(b, str(tmp_path / b)) for b in BLOCKS])
    return url, ledger


def grant(ledger, run_id):
    d = ledger.request("s", run_id=run_id, blocks=BLOCKS, epsilon=PLAN.epsilon, delta=PLAN.delta)
    assert d.granted
    return d.grant.grant_id


def buy(url, grant_id, cache_dir=None, X=None, y=None, units=None, config=CFG):
    """One purchase, as any process would make it; returns what it published, as plain values."""
    X0, y0, u0, Xp = data()
    ledger = open_ledger(url)
    cache = TeacherCache(cache_dir, ledger=ledger) if cache_dir else None
    res = fit_dp_bagging(X0 if X is None else X, y0 if y is None else y,
                         u0 if units is None else units,
                         Xp, config=config, salt=SALT, public_declared=True, ledger=ledger,
                         grant_id=grant_id, cache=cache)
    return {"labels": res.labelling.labels.tobytes(), "start": int(res.labelling.public_index[0]),
            "report": json.dumps(res.report, sort_keys=True), "replayed": res.replayed,
            "trained": cache.trained if cache else None,
            "coef": np.asarray(res.student.coef_).tobytes()}


def _buy_in_child(url, grant_id, cache_dir, barrier, out):
    try:
        open_ledger(url).close()          # imports and connection before the race
        barrier.wait(timeout=120)
        out.put(buy(url, grant_id, cache_dir))
    except Exception as e:               # surfaces in the parent's assertion
        out.put({"error": repr(e)})


def run_children(url, grant_ids, cache_dirs):
    return race(_buy_in_child, [(url, g, c) for g, c in zip(grant_ids, cache_dirs)])


def one_charge(ledger, grant_ids):
    """Every block carries exactly the granted charges, and the ledger is consistent."""
    for b in ledger.blocks("s"):
        assert b.charges == len(grant_ids)
        assert b.epsilon_spent == pytest.approx(len(grant_ids) * PLAN.epsilon)
    assert ledger.check_consistency("s") == []


def cursor_of(ledger):
    """The ledger counter of the window's public cursor (the teachers' settings of fit_dp_bagging).
    """
    return purchase.cursor_name(stream="s", blocks=BLOCKS, config=CFG, salt=SALT,
                                settings={"l2": CFG.l2, "n_classes": 2})


class Untouchable:
    """Private data that fails the test if a replay reads it (only its length may be asked)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __array__(self, *args, **kwargs):
        raise AssertionError("a replay read the private data")


def test_replay_in_the_same_process_another_cache_and_a_new_process(tmp_path):
    url, ledger = make_ledger(tmp_path)
    g = grant(ledger, "run-1")
    first = buy(url, g, str(tmp_path / "cache-a"))
    assert not first["replayed"] and first["trained"] == 1 and first["start"] == 0
    assert len(np.frombuffer(first["labels"], np.int64)) == PLAN.queries
    recorded = ledger.recorded_release(g, LABELS_RELEASE)
    # retry in the same process, and with another cache directory: no training, no private read
    again = buy(url, g, str(tmp_path / "cache-a"))
    elsewhere = buy(url, g, str(tmp_path / "cache-b"), X=Untouchable(600), y=Untouchable(600),
                    units=Untouchable(600))
    # a new process
    [child] = run_children(url, [g], [str(tmp_path / "cache-c")])
    for r in (again, elsewhere, child):
        assert r["replayed"] and r["trained"] in (0, None)
        assert {k: r[k] for k in ("labels", "start", "report", "coef")} == \
               {k: first[k] for k in ("labels", "start", "report", "coef")}
    assert [r.name for r in ledger.releases(g)] == [LABELS_RELEASE]
    assert ledger.recorded_release(g, LABELS_RELEASE) == recorded
    assert ledger.counter(cursor_of(ledger)) == PLAN.queries          # the cursor moved once
    one_charge(ledger, [g])


def test_two_concurrent_processes_under_one_grant_publish_one_release(tmp_path, ledger_url):
    url, ledger = make_ledger(tmp_path, ledger_url)
    g = grant(ledger, "run-1")
    a, b = run_children(url, [g, g], [str(tmp_path / "ca"), str(tmp_path / "cb")])
    assert a["labels"] == b["labels"] and a["report"] == b["report"] and a["start"] == b["start"]
    assert not (a["replayed"] and b["replayed"])       # exactly one of them produced it
    assert [r.name for r in ledger.releases(g)] == [LABELS_RELEASE]
    # both may have reserved a range before one lost the race; the loser's stays unused
    assert ledger.counter(cursor_of(ledger)) in (PLAN.queries, 2 * PLAN.queries)
    one_charge(ledger, [g])


def test_concurrent_purchases_in_processes_label_disjoint_points(tmp_path, ledger_url):
    url, ledger = make_ledger(tmp_path, ledger_url)
    grants = [grant(ledger, f"run-{i}") for i in range(3)]     # the reviewers' three purchases
    cache = str(tmp_path / "cache")   # shared: several processes may train the teachers at once
    results = run_children(url, grants, [cache] * 3)
    starts = sorted(r["start"] for r in results)
    p = PLAN.queries
    assert starts == [0, p, 2 * p]                       # disjoint, nothing skipped
    assert ledger.counter(cursor_of(ledger)) == 3 * p
    labelled = [np.frombuffer(r["labels"], np.int64) for r in results]
    assert all(len(lab) == p for lab in labelled)
    files = sorted(os.listdir(cache))          # one teacher file, no torn or leftover temporary
    assert len(files) == 1 and files[0].startswith("teachers-") and files[0].endswith(".tink")
    # encrypted under the one key the racing processes agreed on, kept in the ledger's database
    from sage_tfx.bagging import cache as cache_lib
    key = files[0][len("teachers-"):-len(cache_lib.SUFFIX)]
    reader = TeacherCache(cache, ledger=open_ledger(url))
    assert reader.has_key(key)
    reader.get_or_train(key, lambda: pytest.fail("retrained"))
    assert all(not r["replayed"] for r in results)
    one_charge(ledger, grants)


def test_concurrent_purchases_in_threads_label_disjoint_points(tmp_path):
    url, ledger = make_ledger(tmp_path)
    grants = [grant(ledger, f"run-{i}") for i in range(4)]
    out, errors = [], []

    def work(g):
        try:
            out.append(buy(url, g, str(tmp_path / "cache")))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(g,)) for g in grants]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors
    p = PLAN.queries
    assert sorted(r["start"] for r in out) == [0, p, 2 * p, 3 * p]
    one_charge(ledger, grants)


def test_another_request_under_the_same_grant_is_refused(tmp_path):
    url, ledger = make_ledger(tmp_path)
    g = grant(ledger, "run-1")
    buy(url, g)
    X, y, units, Xp = data()
    for change in (dict(config=BaggingConfig(k=4, n=10, lam=0.05, teacher="tree")),
                   dict(X_public=Xp[::-1]), dict(salt=b"other")):
        kw = dict(config=CFG, salt=SALT, public_declared=True, ledger=ledger, grant_id=g,
                  X_public=Xp)
        kw.update(change)
        with pytest.raises(ReleaseConflictError, match="already bought labels"):
            fit_dp_bagging(X, y, units, **kw)
    assert len(ledger.releases(g)) == 1
    one_charge(ledger, [g])


def test_refusals_before_anything_moves(tmp_path):
    url, ledger = make_ledger(tmp_path)
    X, y, units, Xp = data()
    kw = dict(config=CFG, salt=SALT, public_declared=True, ledger=ledger)
    g = grant(ledger, "run-1")
    with pytest.raises(InvalidRequestError, match="epsilon or delta"):   # the grant decides
        fit_dp_bagging(X, y, units, Xp, grant_id=g, epsilon=EPS, delta=DELTA, **kw)
    with pytest.raises(InvalidRequestError, match="both ledger and grant_id"):
        fit_dp_bagging(X, y, units, Xp, config=CFG, salt=SALT, public_declared=True, grant_id=g)
    with pytest.raises(InvalidRequestError, match="not the grant's window"):
        fit_dp_bagging(X, y, units, Xp, grant_id=g,
                       cache_id={"stream": "s", "blocks": ["b1"]}, **kw)
    with pytest.raises(InvalidRequestError, match="paper mode only"):
        fit_dp_bagging(X, y, units, Xp, grant_id=g, max_labels=5, **kw)
    reserved = ledger.request("s", run_id="run-r", blocks=BLOCKS, epsilon=PLAN.epsilon,
                              delta=PLAN.delta, release=False).grant.grant_id
    with pytest.raises(GrantStateError):
        fit_dp_bagging(X, y, units, Xp, grant_id=reserved, **kw)
    assert ledger.releases(g) == [] and ledger.counter(cursor_of(ledger)) == 0
    # every public point labelled: the next purchase is refused before the cursor moves
    small = Xp[:PLAN.queries]
    fit_dp_bagging(X, y, units, small, grant_id=g, **kw)
    g2 = grant(ledger, "run-2")
    with pytest.raises(InvalidRequestError, match="unlabelled public points"):
        fit_dp_bagging(X, y, units, small, grant_id=g2, **kw)
    assert ledger.releases(g2) == [] and ledger.counter(cursor_of(ledger)) == PLAN.queries
