"""The teacher cache on disk: encrypted with a per-window key kept (wrapped) in the ledger's
database, never unpickled unless it authenticates, shredded on demand and when the window's
blocks retire, re-wrapped by a KEK rotation."""
import io
import os
import pickle

import numpy as np
import pytest

from sage_tfx.bagging import TeacherCache, chunk_assignment, encrypted, train_teachers
from sage_tfx.bagging.cache import cache_key
from sage_tfx.ledger import BlockSpec, blockkeys, keys, open_ledger

WINDOW = ("s", ["b1", "b2"])


def ensemble(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(200, 3))
    y = (X[:, 0] > 0).astype(int)
    units = list(range(200))
    return train_teachers(X, y, chunk_assignment(units, k=2, n=4, salt=b"s"), n=4,
                          kind="logistic")


def key_of(blocks):
    return cache_key(stream="s", blocks=blocks, k=2, n=4, salt=b"s", kind="logistic",
                     settings={})


@pytest.fixture
def ledger(tmp_path):
    led = open_ledger(f"sqlite:///{tmp_path}/ledger.db")
    led.create_stream("s", epsilon_g=10.0, delta_g=1e-5)
    led.add_blocks("s", [BlockSpec(b, str(tmp_path / b)) for b in ("b1", "b2", "b3")])
    return led


@pytest.fixture
def unpickled(monkeypatch):
    """Every payload the encrypted module unpickles (it must only ever be authenticated)."""
    seen = []
    real = pickle.loads
    monkeypatch.setattr(encrypted.pickle, "loads", lambda b: seen.append(b) or real(b))
    return seen


def test_the_file_is_useless_without_its_key_and_round_trips_with_it(tmp_path, ledger,
                                                                      unpickled):
    d, key, ens = str(tmp_path / "cache"), key_of(WINDOW[1]), ensemble()
    cache = TeacherCache(d, ledger=ledger)
    got = cache.get_or_train(key, lambda: ens, window=WINDOW)
    assert got is ens and cache.trained == 1
    [name] = os.listdir(d)
    assert name == f"teachers-{key}.tink"
    assert os.stat(os.path.join(d, name)).st_mode & 0o077 == 0
    data = open(os.path.join(d, name), "rb").read()
    # no pickle (probed with an Unpickler: the fixture counts pickle.loads), and nothing of the
    # teachers in the clear
    with pytest.raises(Exception):
        pickle.Unpickler(io.BytesIO(data)).load()
    assert pickle.dumps({"ensemble": ens}, protocol=pickle.HIGHEST_PROTOCOL) not in data
    assert ens.coef.tobytes()[:64] not in data and b"TeacherEnsemble" not in data
    # with the key (another process: a new cache on the same directory and ledger): the same
    # teachers, no training
    again = TeacherCache(d, ledger=open_ledger(ledger.url))
    back = again.get_or_train(key, lambda: pytest.fail("retrained"), window=WINDOW)
    assert again.trained == 0 and np.array_equal(back.coef, ens.coef)
    assert len(unpickled) == 1
    # without it (a ledger that never held the key): a miss, the file is not unpickled
    other = open_ledger(f"sqlite:///{tmp_path}/other.db")
    stranger = TeacherCache(d, ledger=other)
    fresh = ensemble(seed=1)
    assert stranger.get_or_train(key, lambda: fresh, window=WINDOW) is fresh
    assert stranger.trained == 1 and len(unpickled) == 1


@pytest.mark.parametrize("spoil", ["flip", "swap", "plaintext"])
def test_bytes_that_do_not_authenticate_are_never_unpickled(tmp_path, ledger, unpickled, spoil):
    d = str(tmp_path / "cache")
    k1, k2 = key_of(["b1", "b2"]), key_of(["b3"])
    cache = TeacherCache(d, ledger=ledger)
    cache.get_or_train(k1, ensemble, window=WINDOW)
    cache.get_or_train(k2, ensemble, window=("s", ["b3"]))
    p1, p2 = cache.path(k1), cache.path(k2)
    if spoil == "flip":               # one bit of the ciphertext
        data = bytearray(open(p1, "rb").read())
        data[len(data) // 2] ^= 1
        open(p1, "wb").write(bytes(data))
    elif spoil == "swap":             # another window's file (its own key, its own cache key)
        os.replace(p2, p1)
    else:                             # a plaintext pickle of an older version beside it
        os.remove(p1)
        with open(p1[:-len(".tink")] + ".pkl", "wb") as f:
            pickle.dump({"ensemble": "from disk"}, f)
    reader = TeacherCache(d, ledger=open_ledger(ledger.url))
    fresh = ensemble(seed=2)
    assert reader.get_or_train(k1, lambda: fresh, window=WINDOW) is fresh   # a miss
    assert unpickled == [] and reader.trained == 1
    assert not os.path.exists(p1[:-len(".tink")] + ".pkl")
    with pytest.raises(Exception):
        encrypted.read_object(p1, keys.DataKey.new(), b"bagging-teachers/" + k1.encode())


def test_shred_destroys_the_key_then_the_file(tmp_path, ledger):
    d, key = str(tmp_path / "cache"), key_of(WINDOW[1])
    cache = TeacherCache(d, ledger=ledger)
    cache.get_or_train(key, ensemble, window=WINDOW)
    copy = open(cache.path(key), "rb").read()
    assert cache.has_key(key)
    assert cache.shred(key) == [cache.path(key)]
    assert not cache.has_key(key) and os.listdir(d) == []
    # a copy of the file made before is noise now
    open(cache.path(key), "wb").write(copy)
    later = TeacherCache(d, ledger=open_ledger(ledger.url))
    later.get_or_train(key, ensemble, window=WINDOW)
    assert later.trained == 1


def test_teachers_of_a_retired_window_are_shredded_after_the_lookup(tmp_path, ledger):
    d = str(tmp_path / "cache")
    old, live = key_of(["b1", "b2"]), key_of(["b3"])
    cache = TeacherCache(d, ledger=ledger)
    cache.get_or_train(old, ensemble, window=WINDOW)
    cache.get_or_train(live, ensemble, window=("s", ["b3"]))
    ledger.retire_block("s", "b2", reason="budget spent")
    # the lookup that finds them is answered (its grant paid for it); then they go
    served = cache.get_or_train(old, lambda: pytest.fail("retrained"), window=WINDOW)
    assert served is not None
    assert not cache.has_key(old) and not os.path.exists(cache.path(old))
    assert cache.has_key(live) and os.path.exists(cache.path(live))


def test_kek_rotation_rewraps_teacher_keys(tmp_path, ledger):
    kek = keys.LocalKeyFile(str(tmp_path / "kek.json"))
    d, key = str(tmp_path / "cache"), key_of(WINDOW[1])
    TeacherCache(d, ledger=ledger, key_provider=kek).get_or_train(key, ensemble, window=WINDOW)
    report = blockkeys.rotate_kek(ledger, kek)
    assert report["others"]["bagging_teacher_keys"] == 1 and kek.previous_versions() == 0
    after = TeacherCache(d, ledger=open_ledger(ledger.url), key_provider=kek)
    after.get_or_train(key, lambda: pytest.fail("retrained"), window=WINDOW)
    assert after.trained == 0


def test_without_a_ledger_the_key_lives_in_this_process_only(tmp_path):
    d, key = str(tmp_path / "cache"), key_of(WINDOW[1])
    first = TeacherCache(d)
    first.get_or_train(key, ensemble, window=WINDOW)
    second = TeacherCache(d)                        # same process: the memory key opens it
    second.get_or_train(key, lambda: pytest.fail("retrained"))
    first.shred(key)
    assert not second.has_key(key) and os.listdir(d) == []
