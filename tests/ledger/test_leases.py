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


def _hold(url, name, ttl, heartbeat, elsewhere, out):
    """Holds lease ``name`` until killed. ``elsewhere``: like a holder on another machine (its
    holder id names no process a contender here could look for)."""
    from sage_tfx.ledger import leases
    if elsewhere:
        leases.process_identity = lambda pid=None: None
    kw = {} if heartbeat is None else {"heartbeat": heartbeat}
    with open_ledger(url).lease(name, ttl=ttl, wait=60, **kw) as held:
        out.put(held.holder)
        while True:
            time.sleep(60)


def _start_holder(url, *args):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_hold, args=(url, *args, out))
    p.start()
    return p, out.get(timeout=120)


def test_a_holder_killed_on_this_machine_loses_its_lease_at_once(ledger_url):
    led = open_ledger(ledger_url)
    p, holder = _start_holder(ledger_url, "w", 3600.0, None, False)
    try:
        assert led.lease_holder("w") == holder
        assert not led.acquire_lease("w", "me", ttl=5)   # it runs: the lease is its
    finally:
        p.kill()
        p.join(60)
    assert led.acquire_lease("w", "me", ttl=5)   # at once, not in an hour
    assert led.lease_holder("w") == "me"


def test_only_a_process_known_to_be_gone_is_a_dead_holder():
    import os
    import subprocess
    import sys

    from sage_tfx.ledger.leases import holder_is_dead, new_holder, process_identity
    if process_identity() is None:
        pytest.skip("no /proc: holders are told dead by their heartbeat only")
    assert not holder_is_dead(new_holder())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        holder = f"h:{child.pid}:x proc={process_identity(child.pid)}"
        assert not holder_is_dead(holder)
    finally:
        child.kill()
        child.wait()
    assert holder_is_dead(holder)
    boot, ns, pid, start = process_identity().split("/")
    assert holder_is_dead(f"h:{pid}:x proc={boot}/{ns}/{pid}/{int(start) - 1}")  # pid reused
    for unknown in (f"h:1:x proc=other-boot/{ns}/{child.pid}/{start}",   # another machine
                    f"h:1:x proc={boot}/1/{child.pid}/{start}",   # another PID namespace
                    f"h:{child.pid}:x", "a", f"h:1:x proc={boot}/{ns}/-1/0",
                    f"h:1:x proc={boot}/{ns}/x/0", f"h:{os.getpid()}:x proc=garbage"):
        assert not holder_is_dead(unknown), unknown


def test_the_heartbeat_keeps_a_live_holder_and_a_dead_one_lapses(ledger_url):
    """A holder this machine cannot look for: while it lives its heartbeat renews the lease
    (the expiry moves on; ttl is an hour); killed, the lease lapses with the heartbeat."""
    led = open_ledger(ledger_url)
    p, holder = _start_holder(ledger_url, "h", 3600.0, 3.0, True)
    try:
        expiries, deadline = set(), time.monotonic() + 120
        while len(expiries) < 3:
            assert time.monotonic() < deadline, "the heartbeat did not renew the lease"
            (row,) = led._q("SELECT holder, expires_at FROM leases WHERE name = 'h'").fetchall()
            assert row[0] == holder
            expiries.add(row[1])
            time.sleep(0.2)
    finally:
        p.kill()
        p.join(60)
    deadline = time.monotonic() + 120
    while not led.acquire_lease("h", "me", ttl=5):
        assert time.monotonic() < deadline, "the dead holder's lease did not lapse"
        time.sleep(0.05)


def test_a_holder_that_stops_renewing_loses_its_lease_and_never_takes_it_back(ledger_url):
    led, other = open_ledger(ledger_url), open_ledger(ledger_url)
    with pytest.raises(InvalidRequestError, match="exceeds its ttl"):
        with led.lease("s", ttl=1.0, heartbeat=2.0):
            pass
    with led.lease("s", ttl=1.0, heartbeat=0.5) as held:   # ttl: the progress deadline
        deadline = time.monotonic() + 120
        while not other.acquire_lease("s", "other", ttl=600):
            assert time.monotonic() < deadline, "a stalled holder kept its lease"
            time.sleep(0.05)
        with pytest.raises(LeaseTimeoutError, match="lost"):
            held.renew()
        assert not led.renew_lease("s", held.holder, 5)
    assert led.lease_holder("s") == "other"   # leaving the lease gave up nothing of the other's
