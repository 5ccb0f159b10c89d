"""The PTK store API, lake lineage, window runner and minimal exposure, on the real ledger."""
import json
import os

import pytest

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ptk import (FunctionReferenceError, PerformanceTargetError, Reject,
                          SubscriberError, UnaccountableEventError, UnknownPTKError)
from sage_tfx.ptk.allocator import dec

from ptk_data import CV, CV_CONFIG, HS_CONFIG, register_hist, window


def snapshot(store):
    """Everything a refused call must leave unchanged: the PTK tables and the ledger's grants."""
    db = store.lake.db
    out = {}
    for t in ("ptk_registry", "ptk_versions", "ptk_subscriptions", "ptk_outbox", "ptk_plans",
              "ptk_windows", "ptk_window_keys", "ptk_profiles"):
        out[t] = sorted(map(repr, db.q(f"SELECT * FROM {t}").fetchall()))
    grants = store.ledger.grants(store.cfg.stream)
    out["grants"] = sorted(g.grant_id for g in grants)
    out["releases"] = sorted((r.grant_id, r.name, r.digest) for g in grants
                             for r in store.ledger.releases(g.grant_id))
    out["blocks"] = sorted((b.block_id, b.epsilon_spent) for b in store.ledger.blocks("ptk"))
    return out


def test_register_train_lineage_and_minimal_exposure(make_store, tmp_path):
    store = make_store()
    store.advance_window(window(10000, 0), user_key="user")
    pid = register_hist(store)
    assert isinstance(pid, str) and pid.startswith("ptk-")
    prof = store.lake.ptk(pid).profile
    assert prof["grant_id"] and dec(prof["epsilon"]) <= dec(1.0)
    out = store.advance_window(window(10000, 1), user_key="user")
    (t,) = out.trained
    lin = store.lineage(pid)
    assert lin.window_index == 1 and lin.version == 1 and lin.grant_id == t.grant_id
    assert lin.n_used == t.n_used >= t.n and lin.blocks[0].startswith("w000001.t")
    records = {b.block_id: b.records for b in store.ledger.blocks("ptk")}
    assert lin.n_used == sum(records[b] for b in lin.blocks)  # whole blocks, no prefix
    assert sum(records[b] for b in lin.blocks[:-1]) < t.n  # the fewest blocks that hold n
    grant = store.ledger.grant(lin.grant_id)
    assert set(lin.blocks) <= set(grant.block_ids)
    assert grant.epsilon == lin.epsilon and grant.run_id == lin.run_id
    ptk = store.get_ptk(pid)
    assert ptk.oldest_contributing_window == ptk.newest_contributing_window == 1
    # minimal exposure: window 0's raw block files are gone once window 1 opened ...
    w0 = store.lake.window(0)
    assert w0.status == "closed" and w0.files == ()
    assert not os.path.exists(tmp_path / "data" / "ptk" / "w000000") or \
        not os.listdir(tmp_path / "data" / "ptk" / "w000000")
    # ... and after the last window closes nothing non-DP remains anywhere
    store.windows.close()
    leftover = [f for _, _, fs in os.walk(tmp_path / "data") for f in fs]
    assert leftover == []
    raw_values = {str(v) for v in window(10000, 1)["user"][:50]}
    for table in ("ptk_registry", "ptk_versions", "ptk_windows", "ptk_plans"):
        dump = json.dumps(store.lake.db.q(f"SELECT * FROM {table}").fetchall(), default=str)
        assert not any(u in dump for u in raw_values)
    # the stored state is exactly the DP output (noisy counts are not the true counts)
    assert set(ptk.model_state) == {"domain", "counts", "means"}  # only the DP release
    assert all(float(c).is_integer() for c in ptk.model_state["counts"])
    assert all(0.0 <= m <= 10.0 for m in ptk.model_state["means"])


def test_one_charge_per_partition_and_idempotent_window(make_store):
    store = make_store()
    store.advance_window(window(20000, 0), user_key="user")
    a = register_hist(store, tau=0.2)
    b = store.register_ptk(CV, 1, config=CV_CONFIG, tau=0.3)
    assert isinstance(a, str) and isinstance(b, str), (a, b)
    plan = store.plan()
    before = len(store.ledger.grants("ptk"))
    store.advance_window(window(20000, 1), user_key="user")
    train_grants = [g for g in store.ledger.grants("ptk") if g.run_id.startswith("ptk.w1.")]
    assert len(store.ledger.grants("ptk")) - before == len(train_grants) == plan.K
    for part, g in zip(plan.partitions, sorted(train_grants, key=lambda g: g.run_id)):
        assert dec(g.epsilon) == sum((dec(m.epsilon) for m in part.members), dec(0))
        assert dec(g.epsilon) == dec(part.epsilon_sum)
    # replaying the window's training: same grants back, no new versions, no new charge
    spent = {b.block_id: b.epsilon_spent for b in store.ledger.blocks("ptk")}
    again = store.windows.train(1)
    assert {t.grant_id for t in again} == {g.grant_id for g in train_grants}
    assert [len(store.lake.versions(p)) for p in (a, b)] == [1, 1]
    assert {b.block_id: b.epsilon_spent for b in store.ledger.blocks("ptk")} == spent
    # each block's ledger total stays within epsilon_g
    assert all(dec(b.epsilon_spent) <= dec(1.0) for b in store.ledger.blocks("ptk"))


def test_bad_input_changes_nothing(make_store):
    store = make_store()
    store.advance_window(window(10000, 0), user_key="user")
    pid = register_hist(store)
    snap = snapshot(store)
    bad = [
        (FunctionReferenceError, lambda: store.register_ptk("nope.mod:f", tau=0.2)),
        (FunctionReferenceError, lambda: store.register_ptk("no_such_type", tau=0.2)),
        (PerformanceTargetError, lambda: register_hist(store, tau=0.0)),
        (PerformanceTargetError, lambda: register_hist(store, tau=1.5)),
        (InvalidRequestError, lambda: register_hist(store, train_frequency=0)),
        (InvalidRequestError, lambda: register_hist(store, train_frequency=-2)),
        (UnaccountableEventError, lambda: register_hist(store, ptk_type="hist_wrong_event")),
        (InvalidRequestError, lambda: register_hist(store, config={"key": "city"})),
        (UnknownPTKError, lambda: store.deregister_ptk("ptk-unknown")),
        (UnknownPTKError, lambda: store.update_ptk_config("ptk-unknown", HS_CONFIG)),
        (PerformanceTargetError, lambda: store.update_ptk_performance_target(pid, 2)),
        (InvalidRequestError, lambda: store.update_ptk_config(pid, {"key": "city"})),
        (UnknownPTKError, lambda: store.subscribe_to_ptk("ptk-unknown", "http://127.0.0.1:9/")),
        (SubscriberError, lambda: store.subscribe_to_ptk(pid, "ftp://x/")),
        (SubscriberError, lambda: store.subscribe_to_ptk(pid, "http://127.0.0.1:9/")),
        (UnknownPTKError, lambda: store.notify_new_ptk_state("ptk-unknown")),
        (InvalidRequestError, lambda: store.advance_window({}, user_key="user")),
        (InvalidRequestError, lambda: store.advance_window(window(10, 1), user_key="nope")),
        (InvalidRequestError, lambda: store.advance_window(window(10, 1), window_index=0)),
    ]
    for err, call in bad:
        with pytest.raises(err):
            call()
        assert snapshot(store) == snap, call


def test_reject_keeps_the_plan_and_deregister_replans(make_store):
    store = make_store()
    store.advance_window(window(10000, 0), user_key="user")
    ids = [register_hist(store, menu=[(1.0, 3000)]) for _ in range(2)]
    assert all(isinstance(i, str) for i in ids)
    plan = store.plan()
    assert plan.K == 2 and plan.total == 6000
    small = dict(store.cfg.__dict__)
    # a third PTK needing eps 1 and 3000 samples breaks N_max: REJECT, plan unchanged
    from sage_tfx.ptk import StoreConfig
    tight = make_store(url=store.url, config=StoreConfig(**dict(small, n_max=6000)))
    r = register_hist(tight, menu=[(1.0, 3000)])
    assert isinstance(r, Reject) and not r and "N_max = 6000" in r.reason
    assert tight.plan() == plan and len(tight.lake.ptks()) == 2
    after = store.deregister_ptk(ids[0])
    assert after.K == 1 and store.plan().total == 3000
    with pytest.raises(UnknownPTKError):
        store.deregister_ptk(ids[0])


def test_a_registration_that_fits_the_plan_is_proven_optimal_without_a_solve(make_store,
                                                                               monkeypatch):
    from sage_tfx.ptk import allocator
    store = make_store()
    a = register_hist(store, menu=[(0.3, 1000)])
    b = register_hist(store, menu=[(0.3, 500)])
    assert store.plan().optimal and store.plan().total == 1000
    solves = []
    real = allocator.milp
    monkeypatch.setattr(allocator, "milp", lambda *x, **k: solves.append(1) or real(*x, **k))
    c = register_hist(store, menu=[(0.2, 800)])  # fits the partition's unused budget
    plan = store.plan()
    assert not solves and plan.optimal and plan.proof == "floor"
    assert plan.total == 1000 and plan.lower_bound == 1000
    assert sorted(m.ptk_id for p in plan.partitions for m in p.members) == sorted(
        [a, b, c])
    # a deregistration does not keep the larger workload's bound: it is solved again
    assert store.deregister_ptk(a).optimal and solves and store.plan().total == 800
    assert store.plan().proof != "floor"


def test_register_without_a_window_rejects_with_reason(make_store):
    store = make_store()
    r = register_hist(store)
    assert isinstance(r, Reject) and "no training window is open" in r.reason
    assert store.lake.ptks() == [] and store.ledger.grants("ptk") == []


def test_profile_budget_is_charged_and_exhausts(make_store):
    store = make_store()
    store.advance_window(window(8000, 0), user_key="user")
    first = register_hist(store)
    assert isinstance(first, str)
    grants = store.ledger.grants("ptk")
    assert len(grants) == 1 and grants[0].run_id == f"ptk.profile.{first}"
    # the profile charge is the maximum over the menu of the parallel parts: eps 1.0 here
    assert grants[0].epsilon == 1.0
    # the next profile needs fresh profile blocks; 3000 records cannot hold a second one
    second = register_hist(store)
    assert isinstance(second, Reject) and "profile" in second.reason


def test_update_target_reprofiles_and_replans(make_store):
    store = make_store()
    store.advance_window(window(20000, 0), user_key="user")
    pid = register_hist(store, tau=0.3)
    old = store.lake.ptk(pid).profile["grant_id"]
    plan = store.update_ptk_performance_target(pid, 0.25)
    assert plan.feasible
    rec = store.lake.ptk(pid)
    assert rec.tau == 0.25 and rec.profile["grant_id"] != old


@pytest.mark.postgres
@pytest.mark.slow
def test_store_on_postgres(make_store, postgres_url):
    store = make_store(url=postgres_url)
    store.advance_window(window(10000, 0), user_key="user")
    pid = register_hist(store)
    assert isinstance(pid, str)
    store.advance_window(window(10000, 1), user_key="user")
    assert store.lineage(pid).version == 1
    assert store.windows.train(1)[0].version == 1  # idempotent on PostgreSQL too
    store.windows.close()
    assert store.lake.window(1).files == ()


def test_train_frequency_and_config_update(make_store):
    store = make_store()
    store.advance_window(window(20000, 0), user_key="user")
    every2 = register_hist(store, train_frequency=2)
    assert isinstance(every2, str)
    trained = []
    for w in (1, 2, 3, 4):
        out = store.advance_window(window(3000, w), user_key="user")
        trained.append([t.ptk_id for t in out.trained if t.trained])
    assert trained == [[], [every2], [], [every2]]
    assert [v.window_index for v in store.lake.versions(every2)] == [2, 4]
    # a config update re-profiles on the open window (charged) and applies from the next window
    store.advance_window(window(20000, 5), user_key="user")
    new = dict(HS_CONFIG, upper=12.0)
    plan = store.update_ptk_config(every2, new)
    assert plan.feasible and store.lake.ptk(every2).config == new
    store.advance_window(window(3000, 6), user_key="user")
    assert store.get_ptk(every2).config == new


def test_a_training_failure_is_released_as_a_failure_and_the_window_closes(make_store):
    """A PTK whose train_dp fails on the window's data after the partition's charge: the
    failure (its class only) is the release, the other PTK of the partition trains, nothing is
    charged twice and the window still closes."""
    import ptk_workers
    store = make_store()
    store.advance_window(window(20000, 0), user_key="user")
    bad = register_hist(store, ptk_type="hist_fails_on_data", menu=[(0.25, 700)])
    good = register_hist(store, menu=[(0.25, 800)])
    out = store.advance_window(window(20000, 1), user_key="user")
    by = {t.ptk_id: t for t in out.trained}
    assert "ArithmeticError" in by[bad].skipped and by[good].version == 1
    (g,) = [g for g in store.ledger.grants("ptk") if g.run_id.startswith("ptk.w1.")]
    rel = store.ledger.recorded_release(g.grant_id, f"ptk/train/{bad}/w1")
    assert json.loads(rel.value) == {"failed": "ArithmeticError"}
    assert store.windows.train(1)[0].skipped == by[bad].skipped   # a replay: the same
    store.advance_window(window(20000, 2), user_key="user")
    assert store.lake.window(1).status == "closed" and store.lake.version(bad) is None
    ptk_workers.released_everything(store)


def test_a_lake_from_before_the_type_registry_migrates_without_importing(tmp_path, monkeypatch):
    """Old rows named code by reference: the built-in kernels' references map to their type
    names (a string match), anything else stays without a type and is never imported."""
    import importlib
    import sqlite3

    from sage_tfx.ptk.lake import Lake
    path = tmp_path / "old.db"
    con = sqlite3.connect(path)
    con.execute("""CREATE TABLE ptk_registry (
        ptk_id TEXT PRIMARY KEY, name TEXT NOT NULL, train_dp_ref TEXT NOT NULL,
        eval_ref TEXT NOT NULL, dp_event_ref TEXT NOT NULL, erm_ref TEXT, config TEXT NOT NULL,
        tau REAL NOT NULL, train_frequency INTEGER NOT NULL, status TEXT NOT NULL,
        menu TEXT NOT NULL, profile TEXT, registered_window INTEGER, created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL)""")
    for pid, ref in (("ptk-old", "sage_tfx.ptk.kernels.histstats"), ("ptk-evil", "builtins")):
        con.execute("INSERT INTO ptk_registry VALUES (?, ?, ?, ?, ?, NULL, '{}', 0.2, 1, "
                    "'active', '[]', NULL, 0, 't', 't')",
                    (pid, pid, f"{ref}:train_dp" if ref != "builtins" else "builtins:eval",
                     f"{ref}:eval", f"{ref}:dp_event"))
    con.commit()
    con.close()
    calls = []
    monkeypatch.setattr(importlib, "import_module", lambda *a, **k: calls.append(a))
    lake = Lake(f"sqlite:///{path}")
    try:
        assert lake.ptk("ptk-old").ptk_type == "histstats"
        assert lake.ptk("ptk-evil").ptk_type is None and calls == []
    finally:
        lake.close()


NEVER_TRAINS = {  # configs that can never train on these windows (issue: both were a 201)
    "a column the windows lack": dict(HS_CONFIG, key="nonexistent"),
    "bounds whose noise scale is infinite": dict(HS_CONFIG, lower=-1e308, upper=1e308),
}


@pytest.mark.parametrize("what", list(NEVER_TRAINS))
def test_a_config_that_can_never_train_is_refused_at_registration(make_store, what):
    """Checked against the store's columns (the newest window's) at every menu epsilon, before
    the profiler charges anything: a clear error and nothing changed."""
    store = make_store()
    store.advance_window(window(20000, 0), user_key="user")
    good = register_hist(store)   # profiled: its config may be updated
    before = snapshot(store)
    bad = NEVER_TRAINS[what]
    for call in (lambda: register_hist(store, config=bad, menu=[(0.25, 700)]),
                 lambda: register_hist(store, config=bad),   # profiled: would charge first
                 lambda: store.update_ptk_config(good, bad)):
        with pytest.raises(InvalidRequestError, match="cannot train on the store's columns"):
            call()
    assert snapshot(store) == before
    out = store.advance_window(window(20000, 1), user_key="user")
    assert [t.ptk_id for t in out.trained if t.trained] == [good]


def test_a_noise_scale_that_overflows_only_at_a_small_epsilon_is_refused(make_store):
    store = make_store()
    store.advance_window(window(20000, 0), user_key="user")
    wide = dict(HS_CONFIG, lower=-1e307, upper=1e307)   # (upper - lower) / eps: inf below 0.11
    assert isinstance(register_hist(store, config=wide, menu=[(1.0, 800)]), str)
    with pytest.raises(InvalidRequestError, match="at epsilon=0.05: .*noise scale"):
        register_hist(store, config=wide, menu=[(1.0, 800), (0.05, 900)])


def test_one_ptk_that_cannot_train_never_stops_the_others(make_store):
    """PTKs registered before the store had columns (or in a lake from before registrations
    were checked) that the windows do not fit: every window is still accepted, they are
    skipped with the reason and not charged, the others train; a replay skips them again."""
    import ptk_workers
    store = make_store()
    bad = {what: register_hist(store, config=cfg, menu=[(0.25, 700 + i)])
           for i, (what, cfg) in enumerate(NEVER_TRAINS.items())}
    good = register_hist(store, menu=[(0.25, 800)])
    assert all(isinstance(p, str) for p in [good, *bad.values()])
    for w in range(3):
        out = store.advance_window(window(20000, w), user_key="user")
        by = {t.ptk_id: t for t in out.trained}
        assert by[good].version == w + 1
        for pid in bad.values():
            assert "do not fit" in by[pid].skipped and "not charged" in by[pid].skipped
        charged = [g for g in store.ledger.grants("ptk") if g.run_id.startswith(f"ptk.w{w}.")]
        assert sum(dec(g.epsilon) for g in charged) == dec(0.25)   # the good PTK's only
    again = {t.ptk_id: t.skipped for t in store.windows.train(2)}
    assert again[good] is None and all("do not fit" in again[p] for p in bad.values())
    for pid in bad.values():
        assert store.lake.version(pid) is None
    ptk_workers.released_everything(store)
