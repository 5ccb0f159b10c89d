"""``sage-tfx keys migrate``: a ledger of plaintext blocks (the layout before encryption) is
encrypted block by block, resumably, and retired blocks' plaintext is deleted."""
import glob
import os

import pytest

from sage_tfx import cli
from sage_tfx.ledger import open_ledger
from sage_tfx.streams import migrate, reading
from sage_tfx.streams.blocks import block_files_glob, encrypted_files_glob
from test_block_encryption import SECRET, _records, write_plaintext_block


def _old_ledger(tmp_path, n=5):
    """A ledger as the splitter left it before encryption: plaintext files, no keys; b0 retired
    by the operator (the old retirement deleted nothing), b1 exhausted by a grant."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    led = open_ledger(url)
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    root = str(tmp_path / "blocks")
    specs = []
    for i in range(n):
        specs.append(write_plaintext_block(root, "s", f"b{i}", _records(f"b{i}")))
        # two files in one block, as Beam shards may leave
        with open(os.path.join(specs[-1].location, "part-00001-of-00002.tfrecord.gz"),
                  "wb") as f:
            import gzip
            from sage_tfx.streams import blockfiles
            f.write(gzip.compress(blockfiles.frame(SECRET + b"/second/" + f"b{i}".encode())))
    led.add_blocks("s", specs)
    led._q("UPDATE budgets SET status = 'retired' WHERE block_id = 'b0'")  # the old retire
    spent = led.request("s", run_id="spend", blocks=["b1"], epsilon=1.0).grant
    return url, led, spent


def _contents(led, block_ids):
    g = led.request("s", run_id=f"read-{len(led.grants('s'))}", blocks=list(block_ids),
                    epsilon=0.01).grant
    return {f.block_id: sorted(reading.read_granted_file(f))
            for f in reading.granted_files(led, g)}


def _plain(led, b):
    return glob.glob(block_files_glob(led.block("s", b).location))


def _enc(led, b):
    return glob.glob(encrypted_files_glob(led.block("s", b).location))


def test_migration_encrypts_active_blocks_and_deletes_retired_plaintext(tmp_path):
    url, led, spent = _old_ledger(tmp_path)
    before = _contents(led, ["b2", "b3", "b4"])
    report = migrate.migrate_ledger(led, hold=0, verbose=False)
    assert sorted(b for _, b in report.encrypted) == ["b2", "b3", "b4"]
    assert report.finished == () and report.skipped == ()
    assert report.shred.shredded == () and report.shred.files_removed == 4  # no keys to destroy
    for b in ("b2", "b3", "b4"):
        assert not _plain(led, b) and len(_enc(led, b)) == 2
        for path in _enc(led, b):
            assert SECRET not in open(path, "rb").read()
    for b in ("b0", "b1"):  # retired: their plaintext is gone (b1 once its grant's hold ended)
        assert not os.path.exists(led.block("s", b).location)
    assert {k.block_id for k in led.block_keys("s")} == {"b2", "b3", "b4"}
    assert _contents(led, ["b2", "b3", "b4"]) == before  # the same records, now decrypted
    # Idempotent: a second run changes nothing.
    files = {p: open(p, "rb").read() for b in ("b2", "b3", "b4") for p in _enc(led, b)}
    again = migrate.migrate_ledger(led, hold=0, verbose=False)
    assert again.encrypted == again.finished == () and again.shred.shredded == ()
    assert {p: open(p, "rb").read() for p in files} == files


def test_a_retired_block_still_held_by_its_grant_keeps_its_plaintext(tmp_path):
    url, led, spent = _old_ledger(tmp_path, n=3)
    report = migrate.migrate_ledger(led, verbose=False)  # default hold: 24 h
    assert report.shred.held == (("s", "b1"),)
    assert _plain(led, "b1") and not os.path.exists(led.block("s", "b0").location)


def test_migration_resumes_after_a_crash_before_the_key_is_registered(tmp_path, monkeypatch):
    url, led, spent = _old_ledger(tmp_path)
    before = _contents(led, ["b2", "b3", "b4"])
    real = led.add_block_key
    calls = []

    def crash(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise SystemExit("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(led, "add_block_key", crash)
    with pytest.raises(SystemExit):
        migrate.migrate_ledger(led, verbose=False)
    monkeypatch.undo()
    # b2 is done; b3 has ciphertext without a key and its plaintext: readable as plaintext.
    assert not _plain(led, "b2") and _plain(led, "b3") and _enc(led, "b3")
    assert _contents(led, ["b2", "b3", "b4"]) == before
    report = migrate.migrate_ledger(led, hold=0, verbose=False)
    assert sorted(b for _, b in report.encrypted) == ["b3", "b4"]
    assert _contents(led, ["b2", "b3", "b4"]) == before
    assert all(not _plain(led, b) for b in ("b2", "b3", "b4"))


def test_migration_resumes_after_a_crash_before_the_plaintext_is_deleted(tmp_path, monkeypatch):
    url, led, spent = _old_ledger(tmp_path)
    before = _contents(led, ["b2", "b3", "b4"])

    def crash(*args):
        raise SystemExit("killed")

    monkeypatch.setattr(migrate, "_check_and_remove", crash)
    with pytest.raises(SystemExit):
        migrate.migrate_ledger(led, verbose=False)
    monkeypatch.undo()
    assert _plain(led, "b2") and _enc(led, "b2") and led.block_keys("s")  # both forms
    assert _contents(led, ["b2"]) == {"b2": before["b2"]}  # the key is there: ciphertext read
    report = migrate.migrate_ledger(led, verbose=False)
    assert report.finished == (("s", "b2"),)
    assert sorted(b for _, b in report.encrypted) == ["b3", "b4"]
    assert _contents(led, ["b2", "b3", "b4"]) == before


def test_ciphertext_that_does_not_decrypt_keeps_the_plaintext(tmp_path, monkeypatch):
    url, led, spent = _old_ledger(tmp_path, n=3)
    monkeypatch.setattr(migrate, "_check_and_remove", lambda *a: None)
    migrate.migrate_ledger(led, verbose=False)  # registered, plaintext kept
    monkeypatch.undo()
    enc = sorted(_enc(led, "b2"))[0]
    open(enc, "wb").write(b"garbage")
    with pytest.raises(migrate.MigrationError, match="does not decrypt"):
        migrate.migrate_ledger(led, verbose=False)
    assert len(_plain(led, "b2")) == 2


def test_keys_commands(tmp_path, capsys):
    url, led, spent = _old_ledger(tmp_path, n=3)
    led.close()
    assert cli.main(["--ledger", url, "keys", "status"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["s", "3", "1", "0", "1", "0"] in rows  # blocks, active, keys, active without key
    assert cli.main(["--ledger", url, "keys", "migrate", "--hold", "0"]) == 0
    assert "encrypted 1 block(s)" in capsys.readouterr().out
    assert cli.main(["--ledger", url, "keys", "shred"]) == 0
    assert "destroyed 0 key(s), deleted 0 file(s); 1 retired block(s) still held" in \
        capsys.readouterr().out
    assert cli.main(["--ledger", url, "keys", "rotate"]) == 0
    assert "1 key(s) re-wrapped; older versions destroyed" in capsys.readouterr().out
    assert cli.main(["--ledger", url, "retire", "s", "b2"]) == 0
    assert "data key and local files are destroyed" in capsys.readouterr().out
    assert cli.main(["--ledger", url, "keys", "shred", "--hold", "-1"]) == 2
