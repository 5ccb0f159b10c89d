"""Pyramid under a caller who does not cooperate: one charge and one release per window whoever
seals it (a retry, a new process, another store directory, two concurrent processes), and two
processes sharing one store directory lose no part file and no window."""
import io
import multiprocessing
import os

import numpy as np
import pandas as pd
import pytest

from sage_tfx.dp import noise as dp_noise
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.ledger import open_ledger
from sage_tfx.pyramid import CountSpec, PyramidStore, windows
from sage_tfx.pyramid.featurize import group_keys
from sage_tfx.pyramid.sealing import discrete_laplace_variance

SPEC = CountSpec(groups=("user", "item"), label="y", width=256, epsilon=1.0)
WAIT = 600          # seconds a test waits for a child process (the machine may be loaded)


class NoNoise:
    """A noise source that must never be asked: a replay draws no noise."""

    def __getattr__(self, name):
        raise AssertionError(f"noise drawn ({name}) for a release already recorded")


def frame(n=300, seed=0):
    rng = np.random.default_rng(seed)
    user = rng.integers(0, 30, n)
    return pd.DataFrame({"user": [f"u{u}" for u in user], "item": rng.integers(0, 6, n),
                         "y": (user % 4 == 0).astype(int)})


def make_ledger(url):
    led = open_ledger(url)
    led.create_stream("obs", epsilon_g=2.5, delta_g=0.0)
    for w in range(4):
        for d in range(2):
            led.add_block("obs", f"w{w}d{d}", location=f"/data/w{w}d{d}")
    return led


def blocks(w):
    return [f"w{w}d0", f"w{w}d1"]


def store(url_or_ledger, state_dir, noise=None, retention=2):
    led = open_ledger(url_or_ledger) if isinstance(url_or_ledger, str) else url_or_ledger
    return PyramidStore(SPEC, str(state_dir), retention=retention, ledger=led, stream="obs",
                        noise=noise if noise is not None else SeededNoise(0))


def fill(s, w, seed=0, n=300):
    s.open_window(w, blocks(w))
    s.observe(frame(n, seed))


def one_charge_one_release(led, r, spec=SPEC):
    """The window's run holds one grant and one release (whose bytes are returned)."""
    grants = [g for g in led.grants("obs") if g.run_id == r.run_id]
    assert len(grants) == 1 and grants[0].grant_id == r.grant_id
    rels = led.releases(r.grant_id)
    assert [x.name for x in rels] == [windows.release_name(spec, r.window)]
    assert led.remaining("obs", blocks(r.window)[0])["epsilon"] == pytest.approx(1.5)
    assert led.check_consistency("obs") == [] and led.verify_audit().ok
    return rels[0].value


# -- the replay matrix ------------------------------------------------------------------------

def test_retry_in_the_same_process_publishes_the_recorded_tables(tmp_path, sqlite_url,
                                                                 monkeypatch):
    led = make_ledger(sqlite_url)
    s = store(led, tmp_path / "p")
    fill(s, 0)
    real = PyramidStore._publish

    def crash(*a, **kw):
        raise RuntimeError("crashed after recording, before publishing")

    monkeypatch.setattr(PyramidStore, "_publish", crash)
    with pytest.raises(RuntimeError):
        s.seal()
    assert s.hot_window == 0 and not s.live_windows          # nothing published yet
    monkeypatch.setattr(PyramidStore, "_publish", real)
    s.noise = NoNoise()
    r = s.seal()
    assert r.replayed
    assert open(s.sealed_path(0), "rb").read() == one_charge_one_release(led, r)


def _seal_then_die(url, state_dir):
    real = windows.release_once

    def die_after_recording(*a, **kw):
        real(*a, **kw)
        os._exit(9)                                       # kill -9 between record and publish

    windows.release_once = die_after_recording
    s = store(url, state_dir)
    fill(s, 0)
    s.seal()


def _seal_and_report(url, state_dir, q, draw=False, barrier=None):
    s = store(url, state_dir, noise=dp_noise.SECURE if draw else NoNoise())
    if s.hot_window is None:
        fill(s, 0, seed=3)
    if barrier is not None:
        barrier.wait(timeout=WAIT)
    r = s.seal()
    q.put((open(s.sealed_path(0), "rb").read(), r.replayed))


def test_a_new_process_publishes_what_a_killed_one_recorded(tmp_path, sqlite_url):
    led = make_ledger(sqlite_url)
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_seal_then_die, args=(sqlite_url, str(tmp_path / "p")))
    p.start()
    p.join(WAIT)
    assert p.exitcode == 9
    s = store(led, tmp_path / "p")
    assert s.hot_window == 0 and not s.live_windows          # killed before publishing
    hot_id = s._read()["hot"]["hot_id"]
    assert s._keys.exists(hot_id)
    q = ctx.Queue()
    p = ctx.Process(target=_seal_and_report, args=(sqlite_url, str(tmp_path / "p"), q))
    p.start()
    data, replayed = q.get(timeout=WAIT)
    p.join(WAIT)
    assert replayed and s.live_windows == (0,) and s.hot_window is None
    grant = led.grant_for_run("obs", s.run_id(0))
    r = windows.SealResult(0, s.run_id(0), 1.0, (), (), grant.grant_id, (), (), False)
    assert data == one_charge_one_release(led, r) == open(s.sealed_path(0), "rb").read()
    assert not s._keys.exists(hot_id) and not os.path.exists(tmp_path / "p" / "hot" / "w0")


def _exact_cells(spec, fr, group):
    sketch = spec.new_sketch(group)
    sketch.add(group_keys(fr, group), fr["y"].to_numpy().astype(np.int64))
    return sketch.cells


def test_other_store_directories_replay_the_grant_without_new_noise(tmp_path, ledger_url):
    """The reviewer's attack: more stores seal the window with the same grant to average the
    noise away. Each gets the recorded tables, so the average has the noise of one release."""
    spec = CountSpec(groups=("user",), label="y", width=4096, epsilon=1.0)
    led = make_ledger(ledger_url)
    g = led.request("obs", run_id=windows.pyramid_run_id("obs", spec, 0), blocks=blocks(0),
                    epsilon=1.0).grant
    fr = frame(2000, seed=0)
    tables = []
    for i in range(4):
        s = PyramidStore(spec, str(tmp_path / f"s{i}"), retention=2, ledger=led, stream="obs",
                         noise=None if i == 0 else NoNoise())
        s.open_window(0, blocks(0))
        s.observe(fr if i == 0 else frame(2000, seed=i))   # the others' own rows are ignored
        r = s.seal(grant=g)
        assert r.replayed == (i > 0) and r.grant_id == g.grant_id
        with np.load(s.sealed_path(0)) as z:
            tables.append(z["cells__user"].astype(np.float64))
    assert all(np.array_equal(t, tables[0]) for t in tables)
    assert one_charge_one_release(led, r, spec) == open(s.sealed_path(0), "rb").read()
    # Numerically: the averaged releases keep the single release's noise variance.
    resid = np.mean(tables, axis=0) - _exact_cells(spec, fr, ("user",))
    expected = discrete_laplace_variance(r.noise_scales[0])
    assert resid.var() == pytest.approx(expected, rel=0.1)
    led.close()


def test_two_concurrent_processes_make_one_charge_and_one_release(tmp_path, sqlite_url):
    led = make_ledger(sqlite_url)
    ctx = multiprocessing.get_context("spawn")
    q, barrier = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_seal_and_report,
                         args=(sqlite_url, str(tmp_path / f"s{i}"), q, True, barrier))
             for i in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=WAIT) for _ in procs]
    for p in procs:
        p.join(WAIT)
    assert results[0][0] == results[1][0]
    assert sorted(replayed for _, replayed in results) == [False, True]
    grant = led.grant_for_run("obs", windows.pyramid_run_id("obs", SPEC, 0))
    r = windows.SealResult(0, grant.run_id, 1.0, (), (), grant.grant_id, (), (), False)
    assert one_charge_one_release(led, r) == results[0][0]


# -- two processes on one store directory -----------------------------------------------------

def _observe_parts(url, state_dir, barrier, k, seed):
    s = store(url, state_dir)
    barrier.wait(timeout=WAIT)
    for i in range(k):
        s.observe(frame(10, seed=seed * 100 + i))


def test_two_processes_observing_one_hot_window_keep_every_row(tmp_path, sqlite_url):
    led = make_ledger(sqlite_url)
    s = store(led, tmp_path / "p")
    s.open_window(0, blocks(0))
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_observe_parts, args=(sqlite_url, str(tmp_path / "p"),
                                                      barrier, 8, i + 1)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(WAIT)
        assert p.exitcode == 0
    got = s.hot_frame()
    assert len(got) == 2 * 8 * 10
    sent = pd.concat([frame(10, seed=j * 100 + i) for j in (1, 2) for i in range(8)])
    assert sorted(map(tuple, got.values.tolist())) == sorted(map(tuple, sent.values.tolist()))


def _seal_window_0(url, state_dir):
    s = store(url, state_dir)
    fill(s, 0)
    s.seal()


def test_retention_drops_windows_another_process_sealed(tmp_path, sqlite_url):
    led = make_ledger(sqlite_url)
    mine = store(led, tmp_path / "p")                  # opened before the other process seals
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_seal_window_0, args=(sqlite_url, str(tmp_path / "p")))
    p.start()
    p.join(WAIT)
    assert p.exitcode == 0
    for w in (1, 2):
        fill(mine, w, seed=w)
        r = mine.seal()
    assert r.dropped == (0,) and mine.live_windows == (1, 2)
    assert not os.path.exists(mine.sealed_path(0))
    assert mine.featurization().windows == (1, 2)


# -- denials, discard, restore --------------------------------------------------------------

def test_a_spent_stream_denies_and_discard_unlocks_the_store(tmp_path, sqlite_url):
    led = make_ledger(sqlite_url)
    led.request("obs", run_id="another-system", blocks=blocks(1), epsilon=2.5)   # spends w1
    assert not led.block("obs", "w1d0").active                                   # retired
    s = store(led, tmp_path / "p")
    fill(s, 1)
    with pytest.raises(windows.BudgetDeniedError, match="spent"):
        s.seal()
    hot_id = s._read()["hot"]["hot_id"]
    assert s.hot_window == 1 and len(s.hot_frame()) == 300 and s._keys.exists(hot_id)
    hot_dir = tmp_path / "p" / "hot" / "w1"
    with open(s.hot_artifact_path("model.bin"), "w") as f:
        f.write("trained on raw rows")
    files = sorted(os.listdir(hot_dir))
    deleted = s.discard_window()
    assert sorted(os.path.basename(d) for d in deleted) == files
    assert not hot_dir.exists() and s.hot_window is None and not s._keys.exists(hot_id)
    assert len(led.grants("obs")) == 1 and not s.live_windows       # no charge, no release
    fill(s, 2)                                                         # the store is unlocked
    assert s.seal().window == 2
    assert led.check_consistency("obs") == []


def test_an_administrators_retirement_is_not_a_budget_denial(tmp_path, sqlite_url):
    from sage_tfx.errors import RetiredBlockError
    led = make_ledger(sqlite_url)
    led.retire_block("obs", "w0d1", "withdrawn by its owner")
    s = store(led, tmp_path / "p")
    fill(s, 0)
    with pytest.raises(RetiredBlockError):
        s.seal()
    assert s.hot_window == 0
    s.discard_window()
    assert s.hot_window is None and not led.grants("obs")


def test_a_store_that_lost_its_files_restores_them_from_the_ledger(tmp_path, sqlite_url):
    led = make_ledger(sqlite_url)
    s = store(led, tmp_path / "p")
    fill(s, 0)
    s.seal()
    recorded = open(s.sealed_path(0), "rb").read()
    before = s.featurization(cache=False).featurize(frame(20, seed=5))
    os.remove(s.sealed_path(0))
    after = s.featurization(cache=False).featurize(frame(20, seed=5))
    assert np.array_equal(before, after) and open(s.sealed_path(0), "rb").read() == recorded
    fresh = store(led, tmp_path / "fresh", noise=NoNoise())
    r = fresh.restore(0)
    assert r.replayed and open(fresh.sealed_path(0), "rb").read() == recorded
    with pytest.raises(ValueError, match="never charged"):
        fresh.restore(3)
    assert len(led.releases(r.grant_id)) == 1 and len(led.grants("obs")) == 1


# -- hot windows at rest ------------------------------------------------------------------------

def test_hot_window_files_hold_no_plaintext_rows(tmp_path, sqlite_url):
    led = make_ledger(sqlite_url)
    s = store(led, tmp_path / "p")
    s.open_window(0, blocks(0))
    secret = pd.DataFrame({"user": [f"secret-user-{i:04d}" for i in range(200)],
                           "item": np.arange(200, dtype=np.int64) + 987_654_321,
                           "y": np.arange(200) % 2})
    s.observe(secret)
    raw = b"".join(open(os.path.join(d, f), "rb").read()
                   for d, _, fs in os.walk(tmp_path / "p") for f in fs)
    ledger_db = b"".join(open(str(tmp_path / f), "rb").read() for f in os.listdir(tmp_path)
                         if f.startswith("ledger.db"))
    for data in (raw, ledger_db):
        assert b"secret-user" not in data and "secret-user".encode("utf-32-le") not in data
        assert b"987654321" not in data and np.int64(987_654_321).tobytes() not in data
    pd.testing.assert_frame_equal(s.hot_frame(), secret)
    # The key is in the ledger's database (wrapped), never beside the data; without it the
    # files are noise: a copy of a part taken before the seal cannot be read after it.
    hot = s._read()["hot"]
    part = [f for f in os.listdir(tmp_path / "p" / "hot" / "w0") if f.startswith("raw-")][0]
    copy = open(tmp_path / "p" / "hot" / "w0" / part, "rb").read()
    s.seal()
    assert not s._keys.exists(hot["hot_id"])
    os.makedirs(tmp_path / "stolen")
    open(tmp_path / "stolen" / part, "wb").write(copy)
    other = store(led, tmp_path / "p")
    with pytest.raises(ValueError, match="gone"):
        from sage_tfx.pyramid import hot as hot_lib
        hot_lib.read_part(str(tmp_path / "stolen" / part), other._keys.get(hot["hot_id"]),
                          s.store_id, hot["hot_id"])


def test_a_renamed_or_swapped_part_does_not_decrypt(tmp_path, sqlite_url):
    led = make_ledger(sqlite_url)
    s = store(led, tmp_path / "p")
    fill(s, 0)
    d = tmp_path / "p" / "hot" / "w0"
    part = [f for f in os.listdir(d) if f.startswith("raw-")][0]
    os.rename(d / part, d / part.replace("raw-000000", "raw-000001"))
    with pytest.raises(ValueError, match="does not decrypt"):
        s.hot_frame()


def test_rows_round_trip_without_pickle():
    from sage_tfx.pyramid import rows
    fr = pd.DataFrame({
        "mixed": pd.Series([True, 1, None, "a\x00", b"\x00\xff", 2 ** 70, 1.5], dtype=object),
        "i": np.arange(7, dtype=np.int64), "u": np.arange(7, dtype=np.uint8),
        "b": np.array([True, False] * 3 + [True]), "s": [f"s{i}" for i in range(7)],
        "c": pd.Categorical(list("abcabca"))})
    back = rows.decode_frame(rows.encode_frame(fr))
    pd.testing.assert_frame_equal(back, fr)
    assert [type(v) for v in back["mixed"]] == [bool, int, type(None), str, bytes, int, float]
    with pytest.raises(ValueError, match="Decimal"):
        import decimal
        rows.encode_frame(pd.DataFrame({"x": [decimal.Decimal(1)]}))
    buf = io.BytesIO()           # a crafted file with a pickled object array is not unpickled
    np.savez(buf, meta=np.frombuffer(b'{"format": "sage-tfx/pyramid-rows/1", "columns": '
                                     b'[{"name": "x", "dtype": "object", "native": true}], '
                                     b'"rows": 1}', dtype=np.uint8),
             c0=np.array([object()], dtype=object))
    with pytest.raises(ValueError, match="pickle"):
        rows.decode_frame(buf.getvalue())


def test_a_bad_observation_writes_nothing(tmp_path, sqlite_url):
    import decimal
    led = make_ledger(sqlite_url)
    s = store(led, tmp_path / "p")
    fill(s, 0)
    before = s._read()
    bad = frame(5)
    bad["user"] = [decimal.Decimal(i) for i in range(5)]
    with pytest.raises(ValueError, match="Decimal"):
        s.observe(bad)
    assert s._read() == before and len(os.listdir(tmp_path / "p" / "hot" / "w0")) == 1


def test_kek_rotation_rewraps_the_open_hot_window(tmp_path, sqlite_url, monkeypatch):
    """`sage-tfx keys rotate` re-wraps the hot window's key (so the old KEK version can go) and
    the hot rows still read; before, rotation refused to destroy the old version."""
    from sage_tfx.ledger import blockkeys, keys
    monkeypatch.setenv(keys.PROVIDER_ENV, f"file:{tmp_path}/kek.json")
    led = make_ledger(sqlite_url)
    s = store(led, tmp_path / "p")
    fill(s, 0)
    before = s.hot_frame()
    old = led._q("SELECT kek_id, wrapped FROM pyramid_hot_keys").fetchall()
    kek = keys.provider()
    report = blockkeys.rotate_kek(led, kek)
    assert report["destroyed"] and report["others"]["pyramid_hot_keys"] == 1
    new = led._q("SELECT kek_id, wrapped FROM pyramid_hot_keys").fetchall()
    assert new[0][0] == kek.kek_id != old[0][0] and bytes(new[0][1]) != bytes(old[0][1])
    aad = keys.aad_for("pyramid", "obs", s.store_id, s._read()["hot"]["hot_id"])
    assert keys.DataKey.unwrap(keys.provider(), bytes(new[0][1]), aad)
    with pytest.raises(ValueError, match="does not open"):  # the old version is gone
        keys.DataKey.unwrap(keys.provider(), bytes(old[0][1]), aad)
    pd.testing.assert_frame_equal(store(sqlite_url, tmp_path / "p").hot_frame(), before)


def test_resealing_with_other_weights_is_a_conflict_and_the_same_weights_replay(tmp_path,
                                                                               sqlite_url):
    """The release name leaves the weights out (one grant, one release of the window), so a
    second seal of the window with other weights must not be handed the first release as its
    own: ReleaseConflictError, nothing published, nothing charged. The same weights replay."""
    from sage_tfx.errors import ReleaseConflictError
    from sage_tfx.pyramid.sealing import read_meta
    led = make_ledger(sqlite_url)
    first = store(led, tmp_path / "a")
    fill(first, 0)
    weights = [3.0, 3.0, 1.0]
    sealed = first.seal(weights=weights)
    other = store(sqlite_url, tmp_path / "b", noise=NoNoise())
    fill(other, 0, seed=1)
    spent = led.block("obs", "w0d0").epsilon_spent
    for bad in ([1.0, 1.0, 1.0], None, [3.0, 3.0, 1.5]):     # None: the even default split
        with pytest.raises(ReleaseConflictError, match="ε per table"):
            other.seal(weights=bad)
        assert other.hot_window == 0 and not os.path.exists(other.sealed_path(0))
    assert led.block("obs", "w0d0").epsilon_spent == spent
    again = other.seal(weights=weights)
    assert again.replayed and again.noise_scales == sealed.noise_scales
    with open(first.sealed_path(0), "rb") as f, open(other.sealed_path(0), "rb") as g:
        data = f.read()
        assert g.read() == data
    grant = led.grant_for_run("obs", first.run_id(0))
    assert [r.name for r in led.releases(grant.grant_id)] == [first.release_name(0)]
    # what the conflict compares is what was drawn: ε per table from the weights (1/w ∝ ε_i)
    eps = read_meta(data)["epsilons"]
    assert eps[0] == pytest.approx(eps[1]) and eps[2] == pytest.approx(3 * eps[0])
    assert sum(eps) == pytest.approx(SPEC.epsilon)
