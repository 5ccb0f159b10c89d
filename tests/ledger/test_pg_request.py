"""PostgreSQL's one-call request (``sage_request``) against the general path and SQLite."""
import pytest

from sage_tfx.ledger import BlockSpec, Window, open_ledger

pytestmark = pytest.mark.postgres


def _script(led):
    """The same requests on any backend; returns what a caller and an auditor can see."""
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6, contexts=("default", "team.b-2:x"),
                      retire_epsilon=0.05)
    led.add_blocks("s", [BlockSpec(f"b{i:03d}", f"/store/b{i:03d}") for i in range(40)])
    out = []
    steps = [
        dict(run_id="r1", blocks=["b005", "b003", "b004"], epsilon=0.3, delta=1e-7),
        dict(run_id="r1", blocks=["b005", "b003", "b004"], epsilon=0.3, delta=1e-7),  # replay
        dict(run_id="r2", window=Window(last=5), epsilon=1 / 3),
        dict(run_id="r3", window=Window(last=5), epsilon=0.62, context="team.b-2:x"),
        dict(run_id="r4", window=Window(last=5), epsilon=0.6),  # retires b035..b039
        dict(run_id="r5", window=Window(last=5, min_blocks=3), epsilon=0.1, release=False),
        dict(run_id="r6", blocks=["b005"], epsilon=0.8),  # denied
        dict(run_id="r7", blocks=["b001"], epsilon=1e-30),
        dict(run_id="r8", blocks=["b001", "b002"], epsilon=0.95),  # 1e-30 + 0.95: 31 digits
        dict(run_id="r9", blocks=["b001"], epsilon=0.01),  # retired block: an error
        dict(run_id="r10", window=Window(last=50), epsilon=1e-6),  # too few blocks: denied
        dict(run_id="r11", window=Window(last=30), epsilon=7e-7, delta=3e-7),
    ]
    for step in steps:
        try:
            d = led.request("s", **step)
            out.append((d.granted, d.replayed, d.reason,
                        d.grant and [(b.block_id, b.location) for b in d.grant.blocks],
                        d.grant and d.grant.status))
        except ValueError as exc:
            out.append((type(exc).__name__, str(exc)))
    for context in ("default", "team.b-2:x"):
        out.append([(b.block_id, b.status, b.epsilon_spent, b.delta_spent, b.charges)
                    for b in led.blocks("s", context)])
    out.append([(e.kind, {k: v for k, v in e.payload.items() if k != "grant_id"})
                for e in sorted(led.audit_log("s"), key=lambda e: e.seq)])
    assert led.check_consistency("s") == []
    report = led.verify_audit()
    assert report.ok, report.message
    return out


def test_one_call_requests_match_sqlite(postgres_url, tmp_path):
    sqlite = open_ledger(f"sqlite:///{tmp_path}/l.db")
    pg = open_ledger(postgres_url)
    calls = []
    original = pg._store.q

    def q(sql, params=()):
        calls.append(sql)
        return original(sql, params)

    pg._store.q = q
    expected, got = _script(sqlite), _script(pg)
    for a, b in zip(expected, got):
        assert a == b
    assert len(expected) == len(got)
    # The requests the general path decides read budget rows from the client: r1's replay, the
    # denials r6 and r10, r8 (a 31-digit sum, where Decimal rounds) and r9 (a retired block).
    assert sum("FROM budgets u WHERE" in c or "FROM (SELECT id FROM budgets" in c
               or "unnest(?::text[])" in c for c in calls) == 5
    sqlite.close()
    pg.close()


def test_server_side_hashes_verify_and_chain(postgres_url):
    """Entries hashed by the server verify with Python's entry_hash, across many chains."""
    led = open_ledger(postgres_url)
    led.create_stream("s.x-1:y", epsilon_g=10.0, delta_g=1e-3)
    led.add_blocks("s.x-1:y", [BlockSpec(f"B.{i}:z-{i}", f"/s/{i}") for i in range(20)])
    for i, eps in enumerate([1e-7, 0.1, 1 / 7, 2.5e-5, 1.0, 3.0000000000000004]):
        d = led.request("s.x-1:y", run_id=f"run.{i}:a-b", blocks=[f"B.{i}:z-{i}", "B.19:z-19"],
                        epsilon=eps, delta=1e-9 * i)
        assert d.granted and d.grant.epsilon == eps
    assert led.block("s.x-1:y", "B.19:z-19").charges == 6
    report = led.verify_audit()
    assert report.ok and report.entries == 8, report.message
    led._q("UPDATE audit SET payload = replace(payload, '0.1', '0.2') WHERE kind = 'grant'")
    assert not led.verify_audit().ok
    led.close()


def test_bulk_registration_makes_budget_rows_and_consistency_sees_orphans(postgres_url):
    led = open_ledger(postgres_url)
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6, contexts=("a", "b"))
    led.add_blocks("s", [BlockSpec(f"b{i:04d}", f"/s/{i}\tx\\y") for i in range(2000)])
    led.add_blocks("s", [BlockSpec("c0", "/s/c0", start="2024-01-01", records=7)])
    for context in ("a", "b"):
        blocks = led.blocks("s", context)
        assert [(b.block_id, b.seq) for b in blocks] == (
            [(f"b{i:04d}", i) for i in range(2000)] + [("c0", 2000)])
        assert all(b.status == "active" and b.charges == 0 for b in blocks)
    assert led.block("s", "b0007", "b").location == "/s/7\tx\\y"
    c0 = led.block("s", "c0", "a")
    assert c0.records == 7 and c0.start == "2024-01-01"
    assert led.check_consistency("s") == []
    # No foreign key on PostgreSQL: the consistency check is what reports a lost block row.
    led._q("DELETE FROM blocks WHERE block_id = 'b0003'")
    assert led.check_consistency("s") == ["budget row of b0003 has no block"] * 2
    led.close()


@pytest.mark.slow
def test_acknowledged_grants_survive_a_server_crash(tmp_path):
    """Grant locks are released before the WAL flush; the acknowledgement waits for it. The
    server is killed (``pg_ctl stop -m immediate``: no shutdown checkpoint, WAL buffers not
    written) right after the last acknowledgement and restarted: every grant is there."""
    import os
    import subprocess

    from sage_tfx.ledger import pgserver
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    pg_ctl = os.path.join(pgserver.find_pg_bin(), "pg_ctl")
    with pgserver.local_postgres() as url:
        led = open_ledger(url)
        datadir = led._q("SHOW data_directory").fetchone()[0]
        led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
        led.add_blocks("s", [BlockSpec(f"b{i:03d}", f"/s/{i}") for i in range(60)])
        acknowledged = [led.request("s", run_id=f"r{i}", blocks=[f"b{i % 60:03d}"],
                                    epsilon=0.01).grant.grant_id for i in range(120)]
        log = os.path.join(os.path.dirname(datadir), "server.log")  # not a pipe: the server
        subprocess.run(prefix + [pg_ctl, "-D", datadir, "-l", log, "-m", "immediate", "-w",
                                 "restart"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120)  # outlives pg_ctl
        led.close()
        led = open_ledger(url)
        assert {g.grant_id for g in led.grants("s")} == set(acknowledged)
        assert led.check_consistency("s") == [] and led.verify_audit().ok
        led.close()
