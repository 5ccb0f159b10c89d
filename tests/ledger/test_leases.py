"""Leases and counters shared by processes through the ledger's database."""
import multiprocessing
import time

import pytest

from sage_tfx.errors import InvalidRequestError, LeaseTimeoutError
from sage_tfx.ledger import open_ledger


def test_a_lease_is_exclusive_until_it_expires(ledger_url):
    led = open_ledger(ledger_url)
    assert led.acquire_lease("w", "a", ttl=0.5)
    assert not led.acquire_lease("w", "b", ttl=0.5)
    assert led.acquire_lease("w", "a", ttl=0.5)  # renewal
    assert led.lease_holder("w") == "a"
    deadline = time.monotonic() + 30
    while not led.acquire_lease("w", "b", ttl=5):  # a holder that died loses it by time
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert led.lease_holder("w") == "b"
    led.release_lease("w", "a")  # not the holder: nothing happens
    assert led.lease_holder("w") == "b"
    led.release_lease("w", "b")
    assert led.lease_holder("w") is None
    for bad in (0, -1, float("nan"), "1"):
        with pytest.raises(InvalidRequestError):
            led.acquire_lease("w", "a", ttl=bad)


def test_the_lease_context_waits_then_times_out(ledger_url):
    led = open_ledger(ledger_url)
    with led.lease("x", ttl=30, wait=1) as held:
        held.renew()
        other = open_ledger(ledger_url)
        with pytest.raises(LeaseTimeoutError, match="held by"):
            with other.lease("x", ttl=30, wait=0.3):
                pass
    with led.lease("x", ttl=30, wait=1):
        pass


def _take(url, n, out):
    led = open_ledger(url)
    out.put([led.next_range("cursor", 3) for _ in range(n)])


def test_counter_ranges_are_disjoint_across_processes(ledger_url):
    led = open_ledger(ledger_url)
    assert led.counter("cursor") == 0
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_take, args=(ledger_url, 10, q)) for _ in range(3)]
    for p in procs:
        p.start()
    starts = sorted(s for _ in procs for s in q.get(timeout=120))
    for p in procs:
        p.join(timeout=60)
    assert starts == list(range(0, 90, 3))
    assert led.counter("cursor") == 90
    with pytest.raises(InvalidRequestError):
        led.next_range("cursor", -1)


def test_only_admins_and_pipelines_coordinate(tmp_path):
    """A client or auditor takes no lease and moves no counter; the ledger's own names
    (``sage/...``) are for admins."""
    from sage_tfx.errors import PermissionDeniedError
    url = f"sqlite:///{tmp_path}/l.db"
    led = open_ledger(url)
    root = led.add_principal("root", ["admin"])
    tok = {r: led.add_principal(r, [r]) for r in ("pipeline", "auditor", "client")}
    pipe = open_ledger(url, token=tok["pipeline"])
    assert pipe.acquire_lease("ptk/w", "p", ttl=5) and pipe.next_range("bagging/c", 2) == 0
    for role in ("auditor", "client"):
        other = open_ledger(url, token=tok[role])
        for call in (lambda: other.acquire_lease("ptk/w", "x", ttl=600000),
                     lambda: other.release_lease("ptk/w", "p"), lambda: other.lease_holder("ptk/w"),
                     lambda: other.next_range("bagging/c", 10 ** 12), lambda: other.counter("c")):
            with pytest.raises(PermissionDeniedError):
                call()
    with pytest.raises(PermissionDeniedError):
        pipe.acquire_lease("sage/keys/shred-check/s", "p", ttl=600000)
    assert open_ledger(url, token=root).acquire_lease("sage/keys/migrate", "r", ttl=5)
    assert pipe.lease_holder("ptk/w") == "p" and pipe.counter("bagging/c") == 2
