"""Large streams: reads use indexes (never a scan of the stream); windows page further back."""
import pytest

from sage_tfx.ledger import BlockSpec, Window, open_ledger, pgrequest, schema


def _ledger(url, n):
    led = open_ledger(url)
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    led.add_blocks("s", [BlockSpec(f"b{i:05d}", f"/store/b{i:05d}") for i in range(n)])
    return led


def _captured_selects(led, action):
    """The SELECT statements (with parameters) a ledger call runs."""
    seen = []
    original = led._store.q

    def q(sql, params=()):
        if sql.lstrip().upper().startswith("SELECT") and "budgets" in sql:
            seen.append((sql, tuple(params)))
        return original(sql, params)

    led._store.q = q
    try:
        action()
    finally:
        led._store.q = original
    return seen


def _rows_touched(node):
    """Rows each scan of budgets/blocks in an EXPLAIN ANALYZE JSON plan read."""
    out = []
    if node.get("Relation Name") in ("budgets", "blocks"):
        out.append((node["Relation Name"], node["Node Type"], node.get("Actual Loops", 1) * (
            node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0) +
            node.get("Rows Removed by Index Recheck", 0))))
    for child in node.get("Plans", []):
        out += _rows_touched(child)
    return out


def test_window_and_block_reads_use_indexes(ledger_url):
    """No read of a request touches more than a window's worth of a 20,000-block stream."""
    led = _ledger(ledger_url, 20_000)
    led._q("ANALYZE")
    selects = _captured_selects(led, lambda: (
        led.request("s", run_id="w", window=Window(last=30), epsilon=0.01),
        led.request("s", run_id="b", blocks=[f"b{i:05d}" for i in range(100, 130)],
                    epsilon=0.01)))
    if led.backend == "postgresql":
        # One server-side call per request (no budget SELECT from the client): its two locking
        # reads, run with the same parameters.
        assert selects == []
        params = {"stream": "s", "context": "default", "page": 38,
                  "blocks": [f"b{i:05d}" for i in range(100, 130)]}
        selects = [(sql.format(**{k: f"%({k})s" for k in params}), params)
                   for sql in (pgrequest.WINDOW_ROWS, pgrequest.BLOCK_ROWS)]
    assert len(selects) == 2
    for sql, params in selects:
        if led.backend == "sqlite":
            plan = " | ".join(r[-1] for r in led._q("EXPLAIN QUERY PLAN " + sql,
                                                    params).fetchall())
            # SCAN = every row; the (stream, context, block_id) key without block_id = every
            # block of the stream.
            assert not any(step.startswith(("SCAN u", "SCAN b", "SCAN budgets", "SCAN blocks"))
                           for step in plan.split(" | ")), plan  # "SCAN c": the window's page
            assert "USING" in plan and all(
                "block_id=?" in step for step in plan.split(" | ") if "autoindex_budgets" in step
                or "autoindex_blocks" in step), plan
        else:
            plan = led._store.conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql,
                                           params).fetchone()[0]
            touched = _rows_touched(plan[0]["Plan"])
            assert touched and all(n <= 100 for _, _, n in touched), touched
    led.close()


def test_window_looks_further_back_when_the_newest_blocks_are_spent(ledger_url):
    led = _ledger(ledger_url, 100)
    # The newest 60 blocks have 0.05 left: a 0.1 charge fits only on b00000..b00039.
    assert led.request("s", run_id="spend", blocks=[f"b{i:05d}" for i in range(40, 100)],
                       epsilon=0.95).granted
    d = led.request("s", run_id="w", window=Window(last=10), epsilon=0.1)
    assert d.granted
    assert d.grant.block_ids == tuple(f"b{i:05d}" for i in range(30, 40))
    d = led.request("s", run_id="all", window=Window(last=41), epsilon=0.1)
    assert not d.granted and "only 40 block(s)" in d.reason
    assert led.check_consistency("s") == [] and led.verify_audit().ok
    led.close()


def test_sqlite_durability_options(tmp_path):
    import multiprocessing
    import os
    import signal

    from sage_tfx.errors import InvalidRequestError
    from sage_tfx.ledger.loadgen import WriterPlan, run_writer, setup_stream
    with pytest.raises(InvalidRequestError):
        open_ledger(f"sqlite:///{tmp_path}/x.db?durability=sometimes")
    with pytest.raises(InvalidRequestError):
        open_ledger(f"sqlite:///{tmp_path}/x.db?fsync=off")
    for durability in ("process", "power"):
        url = f"sqlite:///{tmp_path}/{durability}.db?durability={durability}"
        setup_stream(url, "s", 10)
        ack = str(tmp_path / f"ack-{durability}")
        # The writer dies by SIGKILL inside its 31st request; its 30 acknowledged grants stay.
        proc = multiprocessing.get_context("fork").Process(target=run_writer, args=(WriterPlan(
            url, "s", 0, requests=40, num_blocks=10, blocks_per_request=2, epsilon=0.01,
            kill_before_commit_at=30, ack_path=ack),))
        proc.start()
        proc.join()
        assert proc.exitcode == -signal.SIGKILL
        with open(ack) as f:
            acknowledged = [line.split() for line in f.read().splitlines()]
        led = open_ledger(url)
        grants = {g.run_id: g.grant_id for g in led.grants("s")}
        assert len(acknowledged) == 30 and len(grants) == 30
        assert all(grants[run_id] == grant_id for run_id, grant_id in acknowledged)
        assert led.check_consistency("s") == [] and led.verify_audit().ok
        led.close()
        assert os.path.exists(url[len("sqlite:///"):].split("?")[0])


def test_schema_2_ledger_gets_locations_in_its_budget_rows(ledger_url):
    """Schema 3 keeps a block's location in its budget rows. A schema-2 ledger is migrated on
    open; a row still without one (an older writer) reads it from ``blocks``; a wrong one is a
    consistency problem."""
    led = _ledger(ledger_url, 40)
    assert led.request("s", run_id="before", blocks=["b00001"], epsilon=0.1).granted
    led._q("ALTER TABLE budgets DROP COLUMN location")  # the schema-2 table
    led._q("UPDATE ledger_head SET schema_version = 2")
    led.close()
    led = open_ledger(ledger_url)
    assert led._q("SELECT count(*) FROM budgets WHERE location IS NULL").fetchone()[0] == 0
    assert {r[0] for r in led._q("SELECT schema_version FROM ledger_head").fetchall()} == {
        schema.SCHEMA_VERSION}
    d = led.request("s", run_id="after", blocks=["b00001", "b00002"], epsilon=0.1)
    assert [(b.block_id, b.location) for b in d.grant.blocks] == [
        ("b00001", "/store/b00001"), ("b00002", "/store/b00002")]
    assert led.check_consistency("s") == []
    # Rows an older version of the code wrote after the migration: no location of their own.
    led._q("UPDATE budgets SET location = NULL WHERE block_id IN ('b00003', 'b00038')")
    d = led.request("s", run_id="old-rows", blocks=["b00003", "b00004"], epsilon=0.1)
    assert [b.location for b in d.grant.blocks] == ["/store/b00003", "/store/b00004"]
    w = led.request("s", run_id="window", window=Window(last=3), epsilon=0.1)
    assert [(b.block_id, b.location) for b in w.grant.blocks] == [
        (f"b000{i}", f"/store/b000{i}") for i in (37, 38, 39)]
    assert led.check_consistency("s") == []
    led._q("UPDATE budgets SET location = '/elsewhere' WHERE block_id = 'b00005'")
    assert led.check_consistency("s") == [
        "budget row of b00005 has location '/elsewhere', its block '/store/b00005'"]
    led.close()
