"""What the multi-process PTK tests run in their child processes (spawned: fresh interpreters
that import this module), and the checks they make on the ledger and the lake afterwards."""
import json
import os
import signal
import time

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.ptk import PTKStore
from sage_tfx.ptk.abstraction import canonical_json

from ptk_data import HS, HS_CONFIG, SMALL, test_registry, window


def open_store(url, data_root, seed=0, lease_ttl=None):
    store = PTKStore(url, data_root, SMALL, noise=SeededNoise(seed), registry=test_registry())
    if lease_ttl is not None:
        store.windows.lease_ttl = lease_ttl
    return store


def _race(work, args) -> None:
    """Runs ``work`` as a ``tests/racing.race`` target: it starts at the barrier and puts one
    result (or the error) on the queue."""
    *args, barrier, out = args
    try:
        out.put({"result": work(*args, start=lambda: barrier.wait(timeout=120))})
    except BaseException as exc:  # reported to the parent, which fails the test
        out.put({"error": f"{type(exc).__name__}: {exc}"})


def register_many_racing(*args):
    _race(register_many, args)


def advance_many_racing(*args):
    _race(advance_many, args)


def train_again_racing(*args):
    _race(train_again, args)


def register_many(url, data_root, prefix, count, profiled, start=lambda: None):
    """Registers ``count`` PTKs with supplied menus (and one profiled if ``profiled``); each
    allocation takes 0.2 s longer than it would, so the two processes' re-plans overlap."""
    store = open_store(url, data_root)
    allocate = store._allocate

    def slow(*args, **kw):
        plan = allocate(*args, **kw)
        time.sleep(0.2)
        return plan

    store._allocate = slow
    try:
        start()
        ids = [store.register_ptk(HS, config=HS_CONFIG, tau=0.2, menu=[(0.05, 200 + i)],
                                  ptk_id=f"ptk-{prefix}{i}") for i in range(count)]
        if profiled:
            ids.append(store.register_ptk(HS, config=HS_CONFIG, tau=0.2,
                                          ptk_id=f"ptk-{prefix}prof"))
        return [i if isinstance(i, str) else f"REJECT {i.reason}" for i in ids]
    finally:
        store.close()


def advance_many(url, data_root, seeds, start=lambda: None):
    """Advances one window per seed (racing the other process for the window lease)."""
    store = open_store(url, data_root, seed=seeds[0])
    try:
        start()
        return [store.advance_window(window(6000, s), user_key="user").window for s in seeds]
    finally:
        store.close()


def train_again(url, data_root, w, start=lambda: None):
    """Re-runs window ``w``'s training (a replay); returns what it reported."""
    store = open_store(url, data_root)
    try:
        start()
        return [{k: getattr(t, k) for k in ("ptk_id", "version", "grant_id")}
                for t in store.windows.train(w)]
    finally:
        store.close()


def _die(*_a, **_kw):
    os.kill(os.getpid(), signal.SIGKILL)


def advance_and_die(url, data_root, seed, lease_ttl=2.0, elsewhere=False):
    """Advances a window and is killed after the partition's charge, before its release,
    holding the window lease. ``lease_ttl`` None: the store's own lease settings;
    ``elsewhere``: like a process on another machine (its holder id names no process that a
    contender could look for), so only its lease's heartbeat (2 s) tells it is gone."""
    from sage_tfx.ledger import leases
    from sage_tfx.ptk import windows
    windows.release_value_once = _die
    if elsewhere:
        leases.process_identity = lambda pid=None: None
    store = open_store(url, data_root, lease_ttl=lease_ttl)
    if elsewhere:
        store.windows.lease_heartbeat = 2.0
    store.advance_window(window(10000, seed), user_key="user")


def register_and_die(url, data_root, ptk_id):
    """Registers a profiled PTK and is killed after the profile's charge, before its release."""
    from sage_tfx.ptk import profiles
    profiles.release_value_once = _die
    store = open_store(url, data_root, lease_ttl=2.0)
    store.register_ptk(HS, config=HS_CONFIG, tau=0.2, ptk_id=ptk_id)


def released_everything(store) -> dict:
    """Checks that every charge of the store's stream is released once and that every lake
    version is the released state byte for byte; returns counts."""
    led, stream = store.ledger, store.cfg.stream
    assert led.check_consistency(stream) == []
    raw = dict(((p, v), s) for p, v, s in store.lake.db.q(
        "SELECT ptk_id, version, state FROM ptk_versions").fetchall())
    grants = led.grants(stream)
    train = [g for g in grants if g.run_id.startswith("ptk.w")]
    prof = [g for g in grants if g.run_id.startswith("ptk.profile.")]
    for g in grants:
        rel = led.releases(g.grant_id)
        assert rel, f"charged, never released: {g.run_id}"
        names = [r.name for r in rel]
        assert len(names) == len(set(names))
    for g in prof:
        assert [r.name for r in led.releases(g.grant_id)] == [f"ptk/profile/{g.run_id}"]
    versions = 0
    for rec in store.lake.ptks(status=None):
        for v in store.lake.versions(rec.ptk_id):
            versions += 1
            r = led.recorded_release(v.grant_id, f"ptk/train/{v.ptk_id}/w{v.window_index}")
            assert r is not None and json.loads(r.value)["state"] == v.state
            assert canonical_json({"state": json.loads(raw[(v.ptk_id, v.version)])}) \
                == r.value
    windows = {}
    for g in train:
        w = int(g.run_id.split(".")[1][1:])
        windows.setdefault(w, []).append(g.run_id)
    for w, runs in windows.items():
        assert len(runs) == len(set(runs))
        assert len({r.split(".")[2] for r in runs}) == 1, f"window {w} charged under two plans"
    return {"grants": len(grants), "train": len(train), "profiles": len(prof),
            "versions": versions}
