"""A served run's state in the ledger's database (SQLite and PostgreSQL): it survives a new
connection (a restarted server), passes are counted per principal, tickets expire by time, and
an update is consumed, counted and placed in one transaction."""
import hashlib
import threading
import time

import numpy as np
import pytest

from sage_tfx.dnd.budget import UpdateRefused
from sage_tfx.dnd.runstore import RunReleasedError, RunStore, UnknownTicketError, encode
from sage_tfx.errors import InvalidRequestError

K, DIM = 4, 3
SETTINGS = {"model": {"family": "logistic"}, "spam_check": True}


def _open(url, grant_id="g1", passes=2, settings=SETTINGS, k=K, seed=0):
    store = RunStore(url)
    row, created = store.open_run(
        grant_id=grant_id, stream="s", run_id="r1", settings=settings, k=k, dim=DIM,
        passes=passes, initial=lambda: np.random.default_rng(seed).normal(size=(k, DIM)))
    return store, row, created


def test_a_new_connection_resumes_the_run_exactly(ledger_url):
    store, row, created = _open(ledger_url)
    assert created and row.version == 0 and row.passes == 2
    before = store.instances("g1", DIM)
    t = store.issue_ticket("g1", "alice", ["b0"], passes=2, ttl=60)
    slot, version = store.return_update("g1", "alice", t, np.ones(DIM), accepted=True, passes=2)
    assert version == 1
    store.close()
    # "restart": a new connection, different initial instances offered: the stored ones win
    again, row2, created2 = _open(ledger_url, seed=99)
    assert not created2 and row2.version == 1 and row2.accepted == 1
    after = again.instances("g1", DIM)
    for (s0, v0, w0), (s1, v1, w1) in zip(before, after):
        assert s0 == s1
        if s1 == slot:
            assert v1 == 1 and np.array_equal(w1, np.ones(DIM))
        else:
            assert v1 == 0 and np.array_equal(w0, w1)
    assert again.passes("g1") == {"alice": (1, 1)}
    t2 = again.issue_ticket("g1", "alice", ["b0"], passes=2, ttl=60)
    again.return_update("g1", "alice", t2, np.zeros(DIM), accepted=False, passes=2)
    with pytest.raises(UpdateRefused, match="used its 2"):   # across connections
        again.issue_ticket("g1", "alice", ["b0"], passes=2, ttl=60)
    assert again.problems("g1") == []
    again.close()


def test_a_restart_with_other_settings_is_refused(ledger_url):
    _open(ledger_url)[0].close()
    for kw in (dict(passes=3), dict(k=5), dict(settings={**SETTINGS, "spam_check": False})):
        with pytest.raises(InvalidRequestError, match="same ones"):
            _open(ledger_url, **kw)


def test_passes_are_held_by_unexpired_tickets_and_freed_by_expiry(ledger_url):
    store, _, _ = _open(ledger_url, passes=1)
    t = store.issue_ticket("g1", "alice", ["b0"], passes=1, ttl=0.5)
    with pytest.raises(UpdateRefused, match="unexpired"):
        store.issue_ticket("g1", "alice", ["b0"], passes=1, ttl=0.5)
    assert store.outstanding("g1") == 1
    time.sleep(0.7)
    assert store.outstanding("g1") == 0   # expired by time, not by a count
    with pytest.raises(UnknownTicketError):
        store.return_update("g1", "alice", t, np.ones(DIM), accepted=True, passes=1)
    t2 = store.issue_ticket("g1", "alice", ["b0"], passes=1, ttl=60)   # the pass is free again
    store.issue_ticket("g1", "bob", ["b1"], passes=1, ttl=0.01)
    time.sleep(0.05)
    assert store.sweep("g1") == 1    # bob's abandoned ticket; alice's live one stays
    assert store.ticket_blocks("g1", "alice", t2) == ["b0"]
    store.return_update("g1", "alice", t2, np.ones(DIM), accepted=True, passes=1)
    assert store.passes("g1")["alice"] == (1, 2) and store.problems("g1") == []


def test_a_ticket_is_its_principals_and_good_for_one_update(ledger_url):
    store, _, _ = _open(ledger_url)
    t = store.issue_ticket("g1", "alice", ["b0"], passes=2, ttl=60)
    versions = store.instance_versions("g1")
    for who, ticket in (("bob", t), ("alice", "0" * 32)):
        with pytest.raises(UnknownTicketError):
            store.return_update("g1", who, ticket, np.ones(DIM), accepted=True, passes=2)
        with pytest.raises(UnknownTicketError):
            store.ticket_blocks("g1", who, ticket)
    assert store.instance_versions("g1") == versions and store.passes("g1")["alice"] == (0, 1)
    store.return_update("g1", "alice", t, np.ones(DIM), accepted=True, passes=2)
    with pytest.raises(UnknownTicketError):
        store.return_update("g1", "alice", t, np.ones(DIM), accepted=True, passes=2)
    assert store.passes("g1")["alice"] == (1, 1)


def test_a_released_run_takes_nothing_and_a_refused_update_changes_nothing(ledger_url):
    store, _, _ = _open(ledger_url)
    t = store.issue_ticket("g1", "alice", ["b0"], passes=2, ttl=60)
    store.close_run("g1")
    before = (store.instance_versions("g1"), store.passes("g1"), store.outstanding("g1"))
    with pytest.raises(RunReleasedError):
        store.return_update("g1", "alice", t, np.ones(DIM), accepted=True, passes=2)
    with pytest.raises(RunReleasedError):
        store.issue_ticket("g1", "bob", ["b0"], passes=2, ttl=60)
    # rolled back: the ticket, the pass and the instances are as they were
    assert (store.instance_versions("g1"), store.passes("g1"), store.outstanding("g1")) == before


def test_concurrent_updates_land_in_exactly_one_version_each(ledger_url):
    """Four connections (as four server processes would) return updates at once: versions are
    1..N without a gap, each accepted update's digest is logged once, every instance is its
    slot's last logged write, and passes counted equal updates returned."""
    stores = [_open(ledger_url, passes=1000)[0] for _ in range(4)]
    sent, lock = [], threading.Lock()

    def client(i):
        st = stores[i]
        rng = np.random.default_rng(i)
        for _ in range(15):
            t = st.issue_ticket("g1", f"c{i}", ["b0"], passes=1000, ttl=60)
            u = rng.normal(size=DIM)
            st.return_update("g1", f"c{i}", t, u, accepted=True, passes=1000)
            with lock:
                sent.append(hashlib.sha256(encode(u)).hexdigest())
    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    log = stores[0].versions("g1")
    assert [v for v, _, _ in log] == list(range(1, 61))
    assert sorted(d for _, _, d in log) == sorted(sent)
    assert stores[0].problems("g1") == []
    assert {p: u for p, (u, _) in stores[0].passes("g1").items()} == {f"c{i}": 15 for i in range(4)}
