"""KEK rotation: every live block key re-wrapped, the old KEK versions destroyed, so a copy of
the database made before the rotation (a backup) no longer opens any block."""
import json
import shutil
import sqlite3
import types

import pytest

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import BlockSpec, blockkeys, keys, open_ledger
from sage_tfx.ledger.blockkeys import WrappedKey
from test_block_keys import FIELD, _block, _read


@pytest.fixture
def setup(tmp_path):
    kek = keys.provider(f"file:{tmp_path}/kek.json")
    url = f"sqlite:///{tmp_path}/ledger.db"
    led = open_ledger(url)
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    led.add_blocks("s", [_block(str(tmp_path / "blocks"), kek, "s", f"b{i}") for i in range(5)])
    yield led, kek, tmp_path
    led.close()


def _backup_keys(path):
    with sqlite3.connect(path) as db:
        return [WrappedKey(*r[:3], bytes(r[3])) for r in db.execute(
            "SELECT stream, block_id, kek_id, wrapped FROM block_keys")]


def test_rotation_rewraps_every_key_and_kills_older_backups(setup):
    led, kek, tmp = setup
    old_id = kek.kek_id
    led._wipe()  # a consistent backup of the database file
    shutil.copy(tmp / "ledger.db", tmp / "backup.db")
    backup = _backup_keys(tmp / "backup.db")
    assert len(backup) == 5 and backup[0].unwrap(kek)  # the backup opens blocks, for now
    seen = []
    blockkeys.register_rewrapper("test-hot-windows", lambda ledger, k: seen.append(k.kek_id) or 7)
    try:
        report = blockkeys.rotate_kek(led, kek)
    finally:
        blockkeys._REWRAPPERS.pop("test-hot-windows")
    assert report["rewrapped"] == 5 and not report["resumed"] and report["destroyed"]
    # (systems imported in this process register their own tables, with no rows here)
    assert report["others"].pop("test-hot-windows") == 7 and seen == [kek.kek_id]
    assert not any(report["others"].values())
    assert kek.kek_id != old_id and kek.previous_versions() == 0
    with open(tmp / "kek.json") as f:
        assert len(json.load(f)["key"]) == 1  # only the new version is left
    live = led.block_keys("s")
    assert {k.kek_id for k in live} == {kek.kek_id}
    assert not {k.wrapped for k in live} & {k.wrapped for k in backup}
    for key in backup:  # the backup's wrapped keys never open again
        with pytest.raises(InvalidRequestError, match="does not open"):
            key.unwrap(keys.provider(f"file:{tmp}/kek.json"))
    g = led.request("s", run_id="r", blocks=["b3"], epsilon=0.1).grant
    assert _read(led, g, kek)["b3"][0] == FIELD + b"-b3-0"  # the blocks still read
    assert [e.payload["count"] for e in led.audit_log() if e.kind == "rewrap_keys"] == [5]


def test_an_interrupted_rotation_is_finished_by_the_next(setup):
    led, kek, tmp = setup
    kek.rotate()  # crashed after the new version was added ...
    new_id = kek.kek_id
    key = led.block_keys("s")[0]  # ... and after re-wrapping one key
    led._store.write(lambda: led._q("UPDATE block_keys SET kek_id = ?, wrapped = ? WHERE "
                                    "block_id = ?", (new_id, key.unwrap(kek).wrap(kek, key.aad),
                                                     key.block_id)))
    report = blockkeys.rotate_kek(led, kek)
    assert report["resumed"] and report["rewrapped"] == 4 and kek.kek_id == new_id
    assert kek.previous_versions() == 0
    assert all(k.unwrap(kek) for k in led.block_keys("s"))


def test_a_key_that_does_not_open_keeps_the_old_versions(setup):
    led, kek, tmp = setup
    foreign = keys.provider(f"file:{tmp}/other.json")
    led.add_blocks("s", [_block(str(tmp / "blocks"), foreign, "s", "alien")])
    with pytest.raises(InvalidRequestError, match="do not open.*kept"):
        blockkeys.rotate_kek(led, kek)
    assert kek.previous_versions() == 1  # nothing destroyed while a key needs it
    assert sum(k.kek_id == kek.kek_id for k in led.block_keys("s")) == 5
    led.retire_block("s", "alien", "not ours")
    report = blockkeys.rotate_kek(led, kek)  # resumes and completes
    assert report["resumed"] and kek.previous_versions() == 0


def test_keys_of_others_that_nothing_rewraps_keep_the_old_versions(setup):
    led, kek, tmp = setup
    led._store.write(lambda: (
        led._q("CREATE TABLE hot_keys (hot_id TEXT, kek_id TEXT, wrapped BLOB)"),
        led._q("INSERT INTO hot_keys VALUES ('w1', ?, ?)",
               (kek.kek_id, keys.DataKey.new().wrap(kek, b"hot/w1")))))
    assert blockkeys.other_wrapped_keys(led) == {"hot_keys": 1}
    with pytest.raises(InvalidRequestError, match="hot_keys.*previous versions were kept"):
        blockkeys.rotate_kek(led, kek)
    assert kek.previous_versions() == 1
    assert {k.kek_id for k in led.block_keys("s")} == {kek.kek_id}  # block keys already moved
    blockkeys.register_rewrapper("hot_keys", lambda ledger, k: 1)
    try:
        assert blockkeys.rotate_kek(led, kek)["resumed"]
    finally:
        blockkeys._REWRAPPERS.pop("hot_keys")
    assert kek.previous_versions() == 0


def test_keep_previous_rewraps_without_destroying(setup):
    led, kek, tmp = setup
    report = blockkeys.rotate_kek(led, kek, destroy=False)
    assert report["rewrapped"] == 5 and kek.previous_versions() == 1


def test_a_provider_that_cannot_rotate_says_so():
    class Kms(keys.KeyProvider):
        key_id = "kms:x"

        def aead(self):
            raise AssertionError("not used")

    anyone = types.SimpleNamespace(authorize=lambda action: None)  # the caller may configure
    with pytest.raises(InvalidRequestError, match="key service"):
        blockkeys.rotate_kek(anyone, Kms())
    assert Kms().kek_id == "kms:x"
    with pytest.raises(InvalidRequestError):
        Kms().destroy_previous()
    assert BlockSpec("b", "/x", kek_id="k", wrapped_key=b"w").wrapped_key == b"w"
