"""Release once, PTK store: every way a run can be replayed — a retry in the same process, a new
process, another store directory, a server restart, two concurrent processes — ends with one
charge and one release per output, the replay byte for byte what was first released, no noise
drawn again, and the ledger consistent."""
import json

import pytest
from fastapi.testclient import TestClient

from sage_tfx import services
from sage_tfx.ptk.service import create_app

import ptk_workers as workers
from ptk_data import HS, HS_CONFIG, window
from test_ptk_processes import SPAWN, run_two

def trained_store(make_store, tmp_path):
    """A store whose window 1 trained two PTKs; returns (store, ids, window 1's releases)."""
    store = make_store()
    store.advance_window(window(20000, 0), user_key="user")
    ids = [store.register_ptk(HS, config=HS_CONFIG, tau=0.2, menu=[(0.25, 800 + i)])
           for i in range(2)]
    store.advance_window(window(20000, 1), user_key="user")
    return store, ids, releases(store, 1)


def releases(store, w):
    """{release name: bytes} of window ``w``'s training grants."""
    out = {}
    for g in store.ledger.grants("ptk"):
        if g.run_id.startswith(f"ptk.w{w}."):
            out.update({r.name: r.value for r in store.ledger.releases(g.grant_id)})
    return out


def forget_versions(store, w):
    """A crash after the release and before the lake write: the lake has no version of ``w``."""
    store.lake.db.q("DELETE FROM ptk_versions WHERE window_index = ?", (w,))


class Refuse:
    """A noise source and reader that fails when used: a replay must need neither."""

    def __getattr__(self, name):
        raise AssertionError(f"a replay drew noise ({name})")

    def __call__(self, *_a, **_kw):
        raise AssertionError("a replay read window data")


def no_noise(monkeypatch, store):
    monkeypatch.setattr(store.windows.files, "read", Refuse())
    monkeypatch.setattr(store, "noise", Refuse())


def states(store, w):
    return {p: store.lake.version_for_window(p, w).state for p, in store.lake.db.q(
        "SELECT ptk_id FROM ptk_versions WHERE window_index = ?", (w,)).fetchall()}


def test_retry_in_the_same_process(make_store, tmp_path, monkeypatch):
    store, ids, first = trained_store(make_store, tmp_path)
    before = states(store, 1)
    grants = len(store.ledger.grants("ptk"))
    no_noise(monkeypatch, store)
    again = store.windows.train(1)               # a retried call
    assert {t.ptk_id for t in again} == set(ids)
    forget_versions(store, 1)                    # and a retry after a crash before the lake write
    store.windows.train(1)
    assert states(store, 1) == before and releases(store, 1) == first
    assert len(store.ledger.grants("ptk")) == grants
    workers.released_everything(store)


def test_a_new_process_and_another_store_directory(make_store, tmp_path):
    store, ids, first = trained_store(make_store, tmp_path)
    before = states(store, 1)
    grants = len(store.ledger.grants("ptk"))
    forget_versions(store, 1)
    # another process with another store directory, on a machine that cannot see window 1's
    # files (moved away meanwhile): the replay needs none of them
    (tmp_path / "data").rename(tmp_path / "hidden")
    p = SPAWN.Pool(1)
    try:
        out = p.apply_async(workers.train_again,
                            (store.url, str(tmp_path / "elsewhere"), 1)).get(timeout=600)
    finally:
        p.close()
        p.join()
        (tmp_path / "hidden").rename(tmp_path / "data")
    assert {t["ptk_id"] for t in out} == set(ids)
    assert states(store, 1) == before and releases(store, 1) == first
    assert len(store.ledger.grants("ptk")) == grants
    workers.released_everything(store)


def test_two_concurrent_processes_release_once(make_store, tmp_path):
    store, ids, _ = trained_store(make_store, tmp_path)
    # window 2 arrives but is not trained: two processes train it at once, outside any lease
    with store.windows.lease():
        store.windows._ingest(2, window(20000, 2), "user", store.lake.plan_seq())
    a, b = run_two(workers.train_again_racing, (store.url, str(tmp_path / "a"), 2),
                   (store.url, str(tmp_path / "b"), 2))
    assert sorted(t["ptk_id"] for t in a) == sorted(t["ptk_id"] for t in b) == sorted(ids)
    assert {t["version"] for t in a} == {t["version"] for t in b} == {2}
    grants = [g for g in store.ledger.grants("ptk") if g.run_id.startswith("ptk.w2.")]
    assert len(grants) == store.plan().K
    assert len(releases(store, 2)) == 2
    workers.released_everything(store)


def test_a_server_restart(make_store, tmp_path):
    def app_of(store):
        auth = services.Authenticator(store.url, open_token_file=str(tmp_path / "token"))
        c = TestClient(create_app(store, auth=auth))
        c.headers["Authorization"] = f"Bearer {auth.open_token}"
        return c

    cols = lambda n, s: {k: v.tolist() for k, v in window(n, s).items()}  # noqa: E731
    first = make_store(data=tmp_path / "one")
    c = app_of(first)
    assert c.post("/windows", json={"columns": cols(20000, 0), "user_key": "user"}).status_code \
        == 200
    body = {"ptk_type": HS, "tau": 0.2, "config": HS_CONFIG, "ptk_id": "ptk-restart"}
    r = c.post("/ptks", json=body)
    assert r.status_code == 201, r.text
    (profile,) = first.ledger.grants("ptk")
    released = first.ledger.releases(profile.grant_id)
    first.close()
    second = make_store(data=tmp_path / "two")      # the restarted server: a new store object
    c = app_of(second)
    r = c.post("/ptks", json=body)                   # the client's retry after a lost answer
    assert r.status_code == 201 and r.json() == {"ptk_id": "ptk-restart"}
    assert second.ledger.grants("ptk") == [profile]
    assert second.ledger.releases(profile.grant_id) == released
    assert c.post("/ptks", json=dict(body, tau=0.3)).status_code == 400   # same id, other PTK
    r = c.post("/windows", json={"columns": cols(20000, 1), "user_key": "user"})
    assert r.status_code == 200 and r.json()["trained"][0]["version"] == 1
    trained = releases(second, 1)
    second.close()
    third = make_store(data=tmp_path / "three")
    c = app_of(third)
    r = c.post("/windows", json={"columns": cols(20000, 2), "user_key": "user"})
    assert r.status_code == 200 and r.json()["trained"][0]["version"] == 2
    assert releases(third, 1) == trained
    assert len([g for g in third.ledger.grants("ptk") if g.run_id.startswith("ptk.w1.")]) == 1
    counts = workers.released_everything(third)
    assert counts["profiles"] == 1 and counts["versions"] == 2
    assert json.loads(trained["ptk/train/ptk-restart/w1"])["state"] == \
        third.get_ptk("ptk-restart", 1).model_state


@pytest.mark.slow
def test_ptk_trainer_executor_replays_its_release(tmp_path):
    """A re-executed PTKTrainer pod with the same grant (a KFP / Airflow retry, a manual re-run)
    and another output directory gets the recorded state back byte for byte."""
    from test_ptk_trainer_refusals import STREAM, _run

    from sage_tfx.ledger import BlockSpec, open_ledger
    from sage_tfx.ptk import PTKStore, StoreConfig

    url = f"sqlite:///{tmp_path}/ledger.db"
    with open_ledger(url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=1.0, delta_g=1e-6, granularity="day")
        ledger.add_blocks(STREAM, [BlockSpec("d1", location=str(tmp_path / "d1"), records=10)])
    store = PTKStore(url, str(tmp_path / "ptkdata"), StoreConfig(stream="ptk"))
    pid = store.register_ptk(HS, config=HS_CONFIG, tau=0.2, menu=[(0.5, 200)])
    store.close()
    with open_ledger(url) as ledger:
        grant = ledger.request(STREAM, run_id="r-ok", blocks=["d1"], epsilon=0.5,
                               delta=0.0).grant
    outs = []
    for attempt in ("first", "retry"):
        _write_examples(tmp_path / attempt / "examples", grant.grant_id)
        _run(url, pid, tmp_path / attempt, grant)
        outs.append((tmp_path / attempt / "state" / "state.json").read_bytes())
    assert json.loads(outs[0]) == json.loads(outs[1])
    with open_ledger(url) as ledger:
        (rel,) = ledger.releases(grant.grant_id)
        assert rel.name == f"ptk/trainer/{pid}/w0"
        assert json.loads(rel.value)["state"] == json.loads(outs[0])
        assert ledger.check_consistency(STREAM) == []


def _write_examples(folder, grant_id):
    import tensorflow as tf
    split = folder / "Split-train"
    split.mkdir(parents=True)
    with tf.io.TFRecordWriter(str(split / "data_tfrecord-00000-of-00001.gz"),
                              options="GZIP") as w:
        for i in range(20):
            ex = tf.train.Example()
            ex.features.feature["city"].bytes_list.value.append("abcd"[i % 4].encode())
            ex.features.feature["delay"].float_list.value.append(float(i % 10))
            w.write(ex.SerializeToString())
