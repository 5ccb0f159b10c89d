"""PostgreSQL faults: sessions terminated mid-request, conflicts retried, never a lost grant."""
import random
import threading
import time

import psycopg
import pytest

from sage_tfx.ledger import open_ledger, pgrequest
from sage_tfx.ledger.loadgen import WriterPlan, run_writers, setup_stream
from sage_tfx.ledger.store import APPLICATION_NAME

from test_ledger_concurrency import _acknowledged, _check_invariants

pytestmark = pytest.mark.postgres


def test_conflicts_are_retried_and_charged_once(postgres_url):
    setup_stream(postgres_url, "s", 8)
    led = open_ledger(postgres_url)
    failures = iter([psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected])

    def before_commit():
        exc = next(failures, None)
        if exc is not None:
            raise exc("injected")

    led._store.before_commit = before_commit
    d = led.request("s", run_id="r", blocks=["b0000001", "b0000002"], epsilon=0.25)
    assert d.granted and not d.replayed
    assert next(failures, "done") == "done"  # both injected failures happened
    assert [b.charges for b in led.blocks("s")][:3] == [0, 1, 1]
    assert led.block("s", "b0000001").epsilon_spent == 0.25
    assert len(led.grants("s")) == 1
    assert led.check_consistency("s") == [] and led.verify_audit().ok


@pytest.mark.parametrize("path", ["call", "pipeline"])
def test_a_lost_session_is_retried_through_the_run_id(postgres_url, path, monkeypatch):
    """The server ends the session right after the grant committed: the client cannot tell
    whether it did; the retry finds it by its run id instead of charging twice, and waits for
    the WAL flush before acknowledging it. ``call``: the one-statement procedure (the default
    path); ``pipeline``: the function inside BEGIN ... COMMIT (the general path's transport)."""
    setup_stream(postgres_url, "s", 8)
    led = open_ledger(postgres_url)
    killer = psycopg.connect(postgres_url, autocommit=True)
    store = led._store
    pid = store.conn.info.backend_pid
    calls, flushes = [], []

    def die():
        calls.append(1)
        killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
        raise psycopg.OperationalError("terminating connection due to administrator command")

    if path == "call":
        conn, original_execute = store.conn, store.conn.execute

        def execute(sql, *args, **kw):
            result = original_execute(sql, *args, **kw)  # committed
            if sql.startswith("CALL sage_request_call") and not calls:
                die()
            return result

        conn.execute = execute  # the first connection only; the retry gets a new one
    else:
        original = store._write_once
        store.before_commit = lambda: None  # takes the pipelined path

        def txn_then_die(fn, pipeline):
            result = original(fn, pipeline)  # committed
            if not calls:
                die()
            return result

        store._write_once = txn_then_die
    original_flush = pgrequest.flush_wal

    def flush(st):
        flushes.append(1)
        original_flush(st)

    monkeypatch.setattr(pgrequest, "flush_wal", flush)
    d = led.request("s", run_id="r", blocks=["b0000003"], epsilon=0.5)
    assert calls == [1]
    assert d.granted and d.replayed  # the second attempt found the committed grant
    assert flushes == [1]  # and acknowledged it only after a WAL flush
    assert led.block("s", "b0000003").charges == 1
    assert led.check_consistency("s") == [] and led.verify_audit().ok


@pytest.mark.slow
def test_sessions_terminated_mid_request_lose_nothing(postgres_url, tmp_path):
    """pg_terminate_backend on random writer sessions, many times, while 6 writers overlap."""
    setup_stream(postgres_url, "s", 24)
    paths = [str(tmp_path / f"ack-{w}") for w in range(6)]
    plans = [WriterPlan(postgres_url, "s", w, requests=150, num_blocks=24, blocks_per_request=5,
                        epsilon=0.002, seed=11, ack_path=paths[w]) for w in range(6)]
    stop, terminated = threading.Event(), []

    def kill_sessions():
        rng = random.Random(5)
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            while not stop.is_set():
                time.sleep(rng.uniform(0.003, 0.02))
                pids = [r[0] for r in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND "
                    "datname = current_database() AND pid <> pg_backend_pid()",
                    (APPLICATION_NAME,)).fetchall()]
                if pids:
                    pid = rng.choice(pids)
                    if conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]:
                        terminated.append(pid)

    killer = threading.Thread(target=kill_sessions)
    killer.start()
    try:
        results = run_writers(plans, timeout=240)
    finally:
        stop.set()
        killer.join()
    assert all(r is not None for r in results), "a writer gave up"
    assert len(terminated) >= 20
    _check_invariants(postgres_url, "s", results)
    acknowledged = _acknowledged(paths)
    assert len(acknowledged) == sum(len(r.granted) for r in results) > 0
    led = open_ledger(postgres_url)
    grants = {g.run_id: g.grant_id for g in led.grants("s")}
    assert all(grants[run_id] == grant_id for run_id, grant_id in acknowledged)
    # Every request was answered: granted or denied, none lost to a terminated session.
    assert sum(len(r.granted) + r.denied for r in results) == 6 * 150
    led.close()


@pytest.fixture
def many_chains(postgres_url):
    """A ledger written by 8 concurrent writers: its audit spread over several chains."""
    setup_stream(postgres_url, "s", 24)
    plans = [WriterPlan(postgres_url, "s", w, requests=25, num_blocks=24, blocks_per_request=4,
                        epsilon=0.001, seed=21) for w in range(8)]
    assert all(r is not None for r in run_writers(plans))
    led = open_ledger(postgres_url)
    yield led
    led.close()


def test_concurrent_writers_use_several_chains_in_one_verifiable_order(many_chains, tmp_path):
    from sage_tfx.ledger.anchor import verify_anchors, write_anchor
    led = many_chains
    chains = dict(led._q("SELECT chain, count(*) FROM audit GROUP BY chain").fetchall())
    assert len(chains) > 1, chains  # grants did not queue on one head
    assert led.verify_audit().ok and led.check_consistency("s") == []
    path = str(tmp_path / "anchors.jsonl")
    write_anchor(led, path)
    assert verify_anchors(led, path).ok
    # Remove one entry from the middle of the second-largest chain: its successor's link breaks.
    chain = sorted(chains, key=chains.get)[-2]
    seqs = [r[0] for r in led._q("SELECT seq FROM audit WHERE chain = ? ORDER BY seq",
                                 (chain,)).fetchall()]
    victim = seqs[len(seqs) // 2]
    led._q("DELETE FROM audit WHERE seq = ?", (victim,))
    report = led.verify_audit()
    assert not report.ok and report.first_bad_seq == seqs[len(seqs) // 2 + 1], report
    assert not verify_anchors(led, path).ok


def test_moving_an_entry_to_another_chain_is_detected(many_chains):
    led = many_chains
    seq, chain = led._q("SELECT seq, chain FROM audit WHERE kind = 'grant' ORDER BY seq DESC "
                        "LIMIT 1").fetchone()
    led._q("UPDATE audit SET chain = ? WHERE seq = ?", (chain % 64 + 1, seq))
    assert not led.verify_audit().ok


def test_a_session_lost_under_a_psycopg_value_error_is_retried(postgres_url):
    """psycopg can report a session the server ended mid-``CALL`` as a plain ValueError from its
    prepared-statement path ("too many values to unpack"): the retry sees the broken connection,
    finds the committed grant by its run id and charges nothing twice. A ValueError on a live
    connection is a real error and is raised."""
    setup_stream(postgres_url, "s", 8)
    led = open_ledger(postgres_url)
    killer = psycopg.connect(postgres_url, autocommit=True)
    store = led._store
    conn, original_execute = store.conn, store.conn.execute
    calls = []

    def execute(sql, *args, **kw):
        result = original_execute(sql, *args, **kw)  # committed
        if sql.startswith("CALL sage_request_call") and not calls:
            calls.append(1)
            killer.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
            with pytest.raises(psycopg.OperationalError):  # the client notices the lost session
                original_execute("SELECT 1")
            raise ValueError("too many values to unpack (expected 1)")
        return result

    conn.execute = execute  # the first connection only; the retry gets a new one
    d = led.request("s", run_id="r", blocks=["b0000003"], epsilon=0.5)
    assert calls == [1] and d.granted and d.replayed
    assert led.block("s", "b0000003").charges == 1
    assert led.check_consistency("s") == [] and led.verify_audit().ok

    live = store.conn
    live_execute = live.execute

    def fails(sql, *args, **kw):
        if sql.startswith("CALL sage_request_call"):
            raise ValueError("a bug, not a lost session")
        return live_execute(sql, *args, **kw)

    live.execute = fails
    with pytest.raises(ValueError, match="a bug"):
        led.request("s", run_id="r2", blocks=["b0000004"], epsilon=0.5)
    live.execute = live_execute
    assert led.block("s", "b0000004").charges == 0
    killer.close()
    led.close()
