"""Group commit in the run store: concurrent draws and updates share transactions (and fsyncs),
each is acknowledged only once its own transaction is committed and synced, a refusal refuses
alone, and a failed batch fails every request in it (HTTP 503 with Retry-After) writing
nothing."""
import hashlib
import threading
import time

import numpy as np
from dndtest import bearer, make_ledger, tiny_served
from fastapi.testclient import TestClient

from sage_tfx.dnd.groupcommit import StoreUnavailableError
from sage_tfx.dnd.runstore import RunStore, UnknownTicketError, encode

DIM, N = 3, 8


def _open(url):
    store = RunStore(url)
    store.open_run(grant_id="g1", stream="s", run_id="r1", settings={}, k=4, dim=DIM,
                   passes=100, initial=lambda: np.zeros((4, DIM)))
    return store


def _concurrently(fn, n):
    """fn(i) for i < n in n threads started together; [(True, value) | (False, error)]."""
    out, gate = [None] * n, threading.Barrier(n)

    def run(i):
        gate.wait()
        try:
            out[i] = (True, fn(i))
        except Exception as exc:
            out[i] = (False, exc)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    return out


def _slow_first_commit(store, calls, fail=False):
    """A spy on every transaction's COMMIT: counts them; the first waits so others queue."""
    def spy():
        calls.append(time.monotonic())
        if len(calls) == 1:
            time.sleep(0.2)
        if fail:
            raise RuntimeError("injected commit failure")
    store._st.before_commit = spy


def test_concurrent_updates_share_commits_and_each_acknowledged_one_is_durable(ledger_url):
    store = _open(ledger_url)
    tickets = [store.issue_ticket("g1", f"c{i}", ["b0"], passes=100, ttl=60) for i in range(N)]
    updates = [np.full(DIM, float(i)) for i in range(N)]
    commits, synced = [], []
    sync = store._st.backend.synced
    store._st.backend.synced = lambda conn: (sync(conn), synced.append(time.monotonic()))
    _slow_first_commit(store, commits)
    acked = []

    def discard(i):
        r = store.return_update("g1", f"c{i}", tickets[i], updates[i], accepted=True,
                                passes=100)
        acked.append((time.monotonic(), i))
        return r
    out = _concurrently(discard, N)
    assert all(ok for ok, _ in out), out
    assert 1 <= len(commits) < N and len(synced) == len(commits)  # one sync per transaction
    assert all(any(s <= t for s in synced) for t, _ in acked)  # acknowledged after a sync
    store.close()
    again = RunStore(ledger_url)  # a new connection, as a restarted server
    log = again.versions("g1")
    assert [v for v, _, _ in log] == list(range(1, N + 1))
    assert sorted(d for _, _, d in log) == sorted(hashlib.sha256(encode(u)).hexdigest()
                                                  for u in updates)
    assert again.problems("g1") == []
    again.close()


def test_a_refusal_in_a_batch_refuses_alone(ledger_url):
    store = _open(ledger_url)
    tickets = [store.issue_ticket("g1", "c", ["b0"], passes=100, ttl=60) for i in range(N)]
    tickets[3] = "0" * 32  # never issued
    commits = []
    _slow_first_commit(store, commits)
    out = _concurrently(lambda i: store.return_update("g1", "c", tickets[i], np.ones(DIM),
                                                      accepted=True, passes=100), N)
    assert len(commits) < N
    assert not out[3][0] and isinstance(out[3][1], UnknownTicketError)
    assert all(ok for i, (ok, _) in enumerate(out) if i != 3)
    assert store.run("g1").accepted == N - 1 and store.problems("g1") == []
    assert store.outstanding("g1") == 1  # the ticket replaced by the bad one
    store.close()


def test_a_failed_batch_fails_every_request_in_it_and_writes_nothing(ledger_url):
    store = _open(ledger_url)
    tickets = [store.issue_ticket("g1", f"c{i}", ["b0"], passes=100, ttl=60) for i in range(N)]
    before = (store.instance_versions("g1"), store.passes("g1"), store.outstanding("g1"),
              store.run("g1"))
    commits = []
    _slow_first_commit(store, commits, fail=True)

    def both(i):  # an update and a draw in the same batches
        if i % 2:
            return store.issue_ticket("g1", f"c{i}", ["b0"], passes=100, ttl=60)
        return store.return_update("g1", f"c{i}", tickets[i], np.ones(DIM), accepted=True,
                                   passes=100)
    out = _concurrently(both, N)
    assert len(commits) < N  # some failed transaction held several requests
    assert all(not ok and isinstance(e, StoreUnavailableError) for ok, e in out), out
    after = (store.instance_versions("g1"), store.passes("g1"), store.outstanding("g1"),
             store.run("g1"))
    assert after == before and store.versions("g1") == []
    store._st.before_commit = None  # the store recovers: the same tickets are still good
    assert store.return_update("g1", "c0", tickets[0], np.ones(DIM), accepted=True,
                               passes=100) is not None
    assert store.problems("g1") == []
    store.close()


def test_a_failed_commit_is_a_503_with_retry_after(sqlite_url):
    p, service, app = tiny_served(make_ledger(sqlite_url))
    c = TestClient(app)
    alice = bearer(p.client("alice"))
    t = c.post("/v1/draw", headers=alice).json()
    service.store._st.before_commit = lambda: (_ for _ in ()).throw(RuntimeError("disk"))
    r = c.post(f"/v1/discard/{t['ticket']}", headers=alice, json={"weights": t["weights"]})
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    d = c.post("/v1/draw", headers=alice)
    assert d.status_code == 503 and d.headers["retry-after"] == "1"
    service.store._st.before_commit = None
    r = c.post(f"/v1/discard/{t['ticket']}", headers=alice, json={"weights": t["weights"]})
    assert r.status_code == 200, r.text  # the retry lands: nothing of the failed one was kept
    assert service.store.problems(service.grant_id) == []
