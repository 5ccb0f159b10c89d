"""Many writer processes on one ledger, and writers killed mid-request (SQLite and PostgreSQL)."""
import collections
import multiprocessing
import os
import random
import signal
import time
from decimal import Decimal

import pytest

from sage_tfx.ledger import accounting
from sage_tfx.ledger import open_ledger
from sage_tfx.ledger.loadgen import WriterPlan, run_writer, run_writers, setup_stream

NUM_BLOCKS = 24


def _check_invariants(url, stream, results):
    """No block over its cap, no grant lost, every grant audited, cached == derived state."""
    led = open_ledger(url)
    try:
        grants = {g.grant_id: g for g in led.grants(stream)}
        returned = [g for r in results if r is not None for g in r.granted]
        # No grant lost: everything a writer was told it got is in the ledger, released.
        for run_id, grant_id, block_ids, eps in returned:
            g = grants[grant_id]
            assert g.run_id == run_id and g.block_ids == tuple(block_ids) and g.status == "released"
        # Each block's spent budget is exactly the sum of the grants that touched it ...
        expected = collections.defaultdict(Decimal)
        for g in grants.values():
            for b in g.block_ids:
                expected[b] += accounting.exact(g.epsilon)
        for block in led.blocks(stream):
            assert Decimal(repr(block.epsilon_spent)) == expected[block.block_id]
            assert expected[block.block_id] <= Decimal("1.0")  # ... and never over the cap.
        assert led.check_consistency(stream) == []
        audit = led.verify_audit()
        assert audit.ok, audit.message
        audited = [e.payload["grant_id"] for e in led.audit_log(stream) if e.kind == "grant"]
        assert sorted(audited) == sorted(grants)
        return grants
    finally:
        led.close()


@pytest.mark.parametrize("backend",
                         ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_sixteen_writers_overlapping_requests(backend, tmp_path, request):
    url = (f"sqlite:///{tmp_path}/ledger.db" if backend == "sqlite"
           else request.getfixturevalue("postgres_url"))
    setup_stream(url, "s", NUM_BLOCKS)
    # 16 writers x 25 requests of 6 overlapping blocks at ε=0.05: demand far exceeds the budget
    # (each block can take 20 charges), so most of the late requests must be denied.
    plans = [WriterPlan(url, "s", w, requests=25, num_blocks=NUM_BLOCKS, blocks_per_request=6,
                        epsilon=0.05, seed=1) for w in range(16)]
    results = run_writers(plans)
    assert all(r is not None for r in results)
    grants = _check_invariants(url, "s", results)
    granted = sum(len(r.granted) for r in results)
    denied = sum(r.denied for r in results)
    assert granted + denied == 16 * 25 and granted == len(grants)
    assert denied > 0  # contention really happened
    led = open_ledger(url)
    # Budget was used up where requests overlapped: blocks reached the cap exactly.
    assert sum(b.epsilon_spent == 1.0 for b in led.blocks("s")) >= 2


@pytest.mark.parametrize("backend",
                         ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_writer_killed_inside_the_transaction_leaves_no_partial_charge(backend, tmp_path, request):
    url = (f"sqlite:///{tmp_path}/ledger.db" if backend == "sqlite"
           else request.getfixturevalue("postgres_url"))
    setup_stream(url, "s", NUM_BLOCKS)
    plans = [WriterPlan(url, "s", 0, requests=10, num_blocks=NUM_BLOCKS, blocks_per_request=5,
                        epsilon=0.01, seed=2, kill_before_commit_at=4)]
    results = run_writers(plans)
    assert results == [None]  # the writer died by SIGKILL
    led = open_ledger(url)
    grants = led.grants("s")
    # Requests 0..3 committed; request 4 was killed after all its writes but before COMMIT.
    assert sorted(g.run_id for g in grants) == [f"w0-s2-r{i}" for i in range(4)]
    assert sum(b.charges for b in led.blocks("s")) == 4 * 5
    assert led.check_consistency("s") == []
    assert led.verify_audit().ok
    # The ledger keeps working for the next writer.
    d = led.request("s", run_id="after", blocks=["b0000000"], epsilon=0.01)
    assert d.granted and led.verify_audit().ok


_FORK = multiprocessing.get_context("fork")


def _entries(led):
    return led._q("SELECT count(*) FROM audit").fetchone()[0]


def _acknowledged(paths):
    """(run id, grant id) pairs the writers were handed, from their unbuffered ack files."""
    out = []
    for path in paths:
        if os.path.exists(path):
            with open(path) as f:
                # A SIGKILL can cut the last line short: only complete lines were acknowledged.
                out += [tuple(line.split()) for line in f.read().split("\n")[:-1]]
    return out


@pytest.mark.parametrize("backend", ["sqlite", pytest.param(
    "postgres", marks=[pytest.mark.postgres, pytest.mark.slow])])
def test_random_sigkills_under_load_keep_the_ledger_consistent(backend, tmp_path, request):
    """Four writers are SIGKILLed at random moments, repeatedly: every grant a writer was handed
    is in the ledger, no block is over its cap, the cache and the audit chains are intact."""
    url = (f"sqlite:///{tmp_path}/ledger.db" if backend == "sqlite"
           else request.getfixturevalue("postgres_url"))
    setup_stream(url, "s", NUM_BLOCKS)
    rng = random.Random(7)
    watcher = open_ledger(url)
    acks = []
    for round_ in range(5):
        start = _entries(watcher)
        paths = [str(tmp_path / f"ack-{round_}-{w}") for w in range(4)]
        acks += paths
        procs = [_FORK.Process(target=run_writer, args=(WriterPlan(
            url, "s", w, requests=100000, num_blocks=NUM_BLOCKS, blocks_per_request=4,
            epsilon=0.0001, seed=3 + round_, ack_path=paths[w]),)) for w in range(4)]
        for p in procs:
            p.start()
        # Kill once the writers are in full swing, at a random point of their work.
        target = start + rng.randrange(20, 200)
        deadline = time.time() + 120
        while _entries(watcher) < target:
            assert time.time() < deadline, "writers made no progress"
            time.sleep(0.01)
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            p.join()
            assert p.exitcode == -signal.SIGKILL
        led = open_ledger(url)
        assert led.check_consistency("s") == []
        assert led.verify_audit().ok
        led.close()
    acknowledged = _acknowledged(acks)
    grants = {g.run_id: g.grant_id for g in watcher.grants("s")}
    assert len(acknowledged) >= 100
    assert all(grants.get(run_id) == grant_id for run_id, grant_id in acknowledged)
    # No block over its cap: each spent exactly what its grants charged.
    _check_invariants(url, "s", [])
