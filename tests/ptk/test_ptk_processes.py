"""Two real processes on one ledger (SQLite, and PostgreSQL), and processes killed between a charge
and its release: no admitted PTK lost, no window trained twice, every charge released once, a
crashed charge finished by the next process from its recorded grant."""
import multiprocessing as mp
import os

import pytest

from sage_tfx.ptk.allocator import dec

import ptk_workers as workers
from ptk_data import HS, HS_CONFIG, window
from racing import race

SPAWN = mp.get_context("spawn")


def run_two(target, args_a, args_b):
    """Runs a ``ptk_workers.*_racing`` target in two spawned processes released together;
    returns their results (in completion order)."""
    return [r["result"] for r in race(target, [args_a, args_b], timeout=600)]


def run_one(fn, *args):
    """Runs fn(*args) in a spawned process; returns its exit code (a kill is -9)."""
    p = SPAWN.Process(target=fn, args=args)
    p.start()
    p.join(timeout=600)
    return p.exitcode


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=[pytest.mark.postgres,
                                                                   pytest.mark.slow])])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.db"
    return request.getfixturevalue("postgres_url")


def test_two_processes_registering_lose_no_ptk(make_store, url, tmp_path):
    store = make_store(url=url)
    store.advance_window(window(40000, 0), user_key="user")
    a, b = run_two(workers.register_many_racing, (url, str(tmp_path / "a"), "a", 6, True),
                   (url, str(tmp_path / "b"), "b", 6, True))
    ids = a + b
    assert all(i.startswith("ptk-") for i in ids), ids
    active = {r.ptk_id for r in store.lake.ptks()}
    assert active == set(ids)
    plan = store.plan()  # the current plan allocates every admitted PTK
    assert {m.ptk_id for p in plan.partitions for m in p.members} == set(ids)
    # one plan per admitted PTK, each one the previous plan's PTKs plus the new one (a stale
    # re-plan would drop a PTK another process had just admitted)
    members = [{m.ptk_id for p in store.lake.plan(seq)[1].partitions for m in p.members}
               for seq in range(1, len(ids) + 1)]
    assert store.lake.plan_seq() == len(ids)
    for before, after in zip([set()] + members, members):
        assert before < after and len(after - before) == 1, (before, after)
    out = store.advance_window(window(40000, 1), user_key="user")
    assert {t.ptk_id for t in out.trained} == set(ids)
    counts = workers.released_everything(store)
    assert counts["profiles"] == 2 and counts["versions"] == len(ids)


def test_two_processes_advancing_windows_train_each_window_once(make_store, url, tmp_path):
    store = make_store(url=url)
    store.advance_window(window(20000, 0), user_key="user")
    pids = [store.register_ptk(HS, config=HS_CONFIG, tau=0.2, menu=[(0.25, 600 + i)])
            for i in range(3)]
    a, b = run_two(workers.advance_many_racing, (url, str(tmp_path / "a"), [11, 12, 13]),
                   (url, str(tmp_path / "b"), [21, 22, 23]))  # two store directories
    assert sorted(a + b) == [1, 2, 3, 4, 5, 6]
    counts = workers.released_everything(store)
    plan = store.plan()
    assert counts["train"] == 6 * plan.K and counts["versions"] == 6 * 3
    for pid in pids:
        assert [v.window_index for v in store.lake.versions(pid)] == [1, 2, 3, 4, 5, 6]
    # each closed window's key and files are gone; every block within its budget
    assert store.lake.open_windows() == [6]
    for w in range(6):
        assert store.lake.window(w).files == () and store.lake.window_key(w) is None
    assert all(dec(b.epsilon_spent) <= dec(1.0) for b in store.ledger.blocks("ptk"))


def test_a_partition_killed_between_charge_and_release_is_released_by_the_next_process(
        make_store, tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.db"
    store = make_store(url=url)
    store.advance_window(window(20000, 0), user_key="user")
    pid = store.register_ptk(HS, config=HS_CONFIG, tau=0.2, menu=[(0.5, 1000)])
    assert run_one(workers.advance_and_die, url, str(tmp_path / "dead"), 1) == -9
    (g,) = [g for g in store.ledger.grants("ptk") if g.run_id.startswith("ptk.w1.")]
    assert store.ledger.releases(g.grant_id) == [] and store.lake.version(pid) is None
    spent = {b.block_id: b.epsilon_spent for b in store.ledger.blocks("ptk")}
    store.windows.lease_wait = 60
    store.advance_window(window(20000, 2), user_key="user")   # waits out the dead lease
    assert [v.window_index for v in store.lake.versions(pid)] == [1, 2]
    assert store.lineage(pid, 1).grant_id == g.grant_id   # the crashed charge, released
    again = [g2 for g2 in store.ledger.grants("ptk") if g2.run_id.startswith("ptk.w1.")]
    assert again == [g]                                       # and not charged a second time
    assert all(b.epsilon_spent == spent[b.block_id]
               for b in store.ledger.blocks("ptk") if b.block_id.startswith("w000001"))
    workers.released_everything(store)


def _killed_holder_is_taken_over(store, url, tmp_path, wait, elsewhere=False):
    """A process killed while it holds the window lease (after a partition's charge, before
    its release); then this process advances within ``wait`` seconds: the crashed charge is
    released once from its grant, never charged again, and everything else released once."""
    store.advance_window(window(20000, 0), user_key="user")
    pid = store.register_ptk(HS, config=HS_CONFIG, tau=0.2, menu=[(0.5, 1000)])
    assert run_one(workers.advance_and_die, url, str(tmp_path / "dead"), 1, None, elsewhere) == -9
    (g,) = [g for g in store.ledger.grants("ptk") if g.run_id.startswith("ptk.w1.")]
    assert store.ledger.releases(g.grant_id) == []
    (held,) = store.lake.db.q("SELECT holder FROM leases WHERE name = 'ptk/ptk/windows'"
                              ).fetchall()   # never given up: the holder was killed
    assert f":{os.getpid()}:" not in held[0]
    store.windows.lease_wait = wait
    store.advance_window(window(20000, 2), user_key="user")
    assert [v.window_index for v in store.lake.versions(pid)] == [1, 2]
    assert store.lineage(pid, 1).grant_id == g.grant_id
    assert [x for x in store.ledger.grants("ptk") if x.run_id.startswith("ptk.w1.")] == [g]
    (rel,) = store.ledger.releases(g.grant_id)
    assert rel.name == f"ptk/train/{pid}/w1"
    workers.released_everything(store)


def test_a_window_lease_of_a_killed_process_on_this_machine_is_taken_over_at_once(
        make_store, url, tmp_path):
    """Its holder's process is gone: the next advance takes the lease on its first attempt
    (no wait at all), not after the lease's 300 s."""
    _killed_holder_is_taken_over(make_store(url=url), url, tmp_path, wait=0)


def test_a_window_lease_of_a_killed_process_elsewhere_lapses_with_its_heartbeat(
        make_store, tmp_path):
    """A holder this machine cannot look for (another host or container): its lease lapses
    when its heartbeat stops (2 s here, 15 s by default), far inside the 120 s this waits."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    _killed_holder_is_taken_over(make_store(url=url), url, tmp_path, wait=120, elsewhere=True)


def test_a_profile_killed_between_charge_and_release_is_finished(make_store, tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.db"
    store = make_store(url=url)
    store.advance_window(window(20000, 0), user_key="user")
    assert run_one(workers.register_and_die, url, str(tmp_path / "dead"), "ptk-crashed") == -9
    (g,) = store.ledger.grants("ptk")
    assert g.run_id == "ptk.profile.ptk-crashed" and store.ledger.releases(g.grant_id) == []
    assert store.lake.profile_run(g.run_id).status == "pending"
    store.windows.lease_wait = 60
    store.advance_window(window(20000, 1), user_key="user")   # closes window 0: finishes it
    (rel,) = store.ledger.releases(g.grant_id)
    assert store.lake.profile_run(g.run_id).status == "released"
    # the client's retry gets the recorded profile: no new charge, no data read (window 0 gone)
    pid = store.register_ptk(HS, config=HS_CONFIG, tau=0.2, ptk_id="ptk-crashed")
    assert pid == "ptk-crashed" and store.ledger.grants("ptk") == [g]
    assert store.lake.ptk(pid).profile["grant_id"] == g.grant_id
    assert store.ledger.releases(g.grant_id) == [rel]
    workers.released_everything(store)
