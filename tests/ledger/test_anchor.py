"""Audit anchors outside the database: rewritten history, truncated tails and rollbacks."""
import json
import os
import sqlite3

import pytest

from sage_tfx import cli
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import BlockSpec, open_ledger
from sage_tfx.ledger.anchor import read_key, verify_anchors, write_anchor
from sage_tfx.ledger.audit import entry_hash


def _grants(led, n, start=0):
    for i in range(start, start + n):
        assert led.request("s", run_id=f"r{i}", blocks=[f"d{i % 4}"], epsilon=0.01).granted


@pytest.fixture
def setup(ledger_url, tmp_path):
    led = open_ledger(ledger_url)
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    led.add_blocks("s", [BlockSpec(f"d{i}", f"/store/d{i}") for i in range(4)])
    _grants(led, 6)
    yield led, str(tmp_path / "anchors.jsonl")
    led.close()


def _rehash_chain(led, chain, from_seq):
    """What an attacker with write access does: recompute the chain after an edit, and its head."""
    rows = led._q("SELECT seq, ts, stream, kind, payload FROM audit WHERE chain = ? ORDER BY seq",
                  (chain,)).fetchall()
    prev = "0" * 64
    for seq, ts, stream, kind, payload in rows:
        digest = entry_hash(prev, seq, ts, stream, kind, payload)
        if seq >= from_seq:
            led._q("UPDATE audit SET prev_hash = ?, hash = ? WHERE seq = ?", (prev, digest, seq))
        prev = digest
    led._q("UPDATE ledger_head SET audit_seq = ?, audit_hash = ? WHERE id = ?",
           (rows[-1][0] if rows else 0, prev, chain))


def _grant_entry(led, run_id):
    seq, chain = led._q("SELECT seq, chain FROM audit WHERE kind = 'grant' AND payload LIKE ?",
                        (f'%"run_id":"{run_id}"%',)).fetchone()
    return seq, chain


def test_clean_ledger_matches_every_anchor(setup):
    led, path = setup
    write_anchor(led, path)
    _grants(led, 3, start=6)
    write_anchor(led, path)
    report = verify_anchors(led, path)
    assert report.ok and report.anchors == 2, report.problems
    lines = open(path).read().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["entries"] >= json.loads(lines[0])["entries"]


def test_rewritten_entry_passes_the_chain_but_not_the_anchor(setup):
    led, path = setup
    write_anchor(led, path)
    seq, chain = _grant_entry(led, "r2")
    payload = led._q("SELECT payload FROM audit WHERE seq = ?", (seq,)).fetchone()[0]
    led._q("UPDATE audit SET payload = ? WHERE seq = ?", (payload.replace('"r2"', '"forged"'), seq))
    assert not led.verify_audit().ok  # a naive edit breaks the chain ...
    _rehash_chain(led, chain, seq)
    assert led.verify_audit().ok  # ... a careful forger re-hashes it: the chain alone is fooled
    report = verify_anchors(led, path)
    assert not report.ok
    assert any("differs from its anchor" in p for p in report.problems), report.problems


def test_truncated_tail_is_detected(setup):
    led, path = setup
    write_anchor(led, path)
    seq, chain = _grant_entry(led, "r5")
    led._q("DELETE FROM audit WHERE seq >= ? AND chain = ?", (seq, chain))
    _rehash_chain(led, chain, seq)  # move the head back to the new last entry
    assert led.verify_audit().ok
    report = verify_anchors(led, path)
    assert not report.ok and any("truncated" in p for p in report.problems), report.problems


def _backup(url, dst):
    src = sqlite3.connect(url[len("sqlite:///"):])
    out = sqlite3.connect(dst)
    src.backup(out)
    src.close()
    out.close()


@pytest.mark.parametrize("activity_after_rollback", [False, True])
def test_rollback_to_an_older_copy_is_detected(sqlite_url, tmp_path, activity_after_rollback):
    led = open_ledger(sqlite_url)
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    led.add_blocks("s", [BlockSpec(f"d{i}", f"/store/d{i}") for i in range(4)])
    _grants(led, 3)
    path = str(tmp_path / "anchors.jsonl")
    write_anchor(led, path)
    old_copy = str(tmp_path / "old.db")
    _backup(sqlite_url, old_copy)  # a consistent copy of the ledger at this point
    _grants(led, 4, start=3)  # 0.04 more spent on the blocks ...
    write_anchor(led, path)
    assert verify_anchors(led, path).ok
    led.close()
    # ... which a rollback to the old copy would hand out again.
    os.remove(sqlite_url[len("sqlite:///"):])
    for suffix in ("-wal", "-shm"):
        if os.path.exists(sqlite_url[len("sqlite:///"):] + suffix):
            os.remove(sqlite_url[len("sqlite:///"):] + suffix)
    _backup("sqlite:///" + old_copy, sqlite_url[len("sqlite:///"):])
    led = open_ledger(sqlite_url)
    if activity_after_rollback:  # history grows past the anchored entry again, differently
        _grants(led, 8, start=100)
    assert led.verify_audit().ok and led.check_consistency("s") == []
    report = verify_anchors(led, path)
    assert not report.ok, report.problems
    expected = "differs from its anchor" if activity_after_rollback else "rolled back"
    assert any(expected in p for p in report.problems), report.problems
    led.close()


def test_anchor_file_edits_and_forgeries_are_detected(sqlite_url, tmp_path):
    led = open_ledger(sqlite_url)
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    led.add_blocks("s", [BlockSpec(f"d{i}", f"/store/d{i}") for i in range(4)])
    key_file = tmp_path / "anchor.key"
    key_file.write_bytes(os.urandom(32))
    key = read_key(str(key_file))
    path = str(tmp_path / "anchors.jsonl")
    for i in range(3):
        _grants(led, 2, start=2 * i)
        write_anchor(led, path, key)
    assert verify_anchors(led, path, key).ok
    lines = open(path).read().splitlines()
    # Dropping a middle line breaks the line links.
    with open(tmp_path / "dropped.jsonl", "w") as f:
        f.write("\n".join([lines[0], lines[2]]) + "\n")
    assert any("does not follow" in p
               for p in verify_anchors(led, str(tmp_path / "dropped.jsonl"), key).problems)
    # Under another key (or none) no line verifies.
    other = os.urandom(32)
    assert len(verify_anchors(led, path, other).problems) == 3
    # A forger without the key who rewrites a line and re-links the file still fails the MAC.
    rec = json.loads(lines[1])
    rec["entries"] = 1
    forged = [lines[0], json.dumps(rec, sort_keys=True, separators=(",", ":"))]
    import hashlib
    nxt = json.loads(lines[2])
    nxt["prev"] = hashlib.sha256(forged[1].encode()).hexdigest()
    forged.append(json.dumps(nxt, sort_keys=True, separators=(",", ":")))
    with open(tmp_path / "forged.jsonl", "w") as f:
        f.write("\n".join(forged) + "\n")
    problems = verify_anchors(led, str(tmp_path / "forged.jsonl"), key).problems
    assert any("line 2 has no valid HMAC" in p for p in problems)
    assert not any("does not follow" in p for p in problems)  # the links were repaired
    led.close()


def test_short_key_file_is_rejected(tmp_path):
    key_file = tmp_path / "k"
    key_file.write_bytes(b"short")
    with pytest.raises(InvalidRequestError):
        read_key(str(key_file))


def test_cli_anchor_and_verify(sqlite_url, tmp_path, capsys):
    led = open_ledger(sqlite_url)
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    led.add_blocks("s", [BlockSpec(f"d{i}", f"/store/d{i}") for i in range(4)])
    _grants(led, 4)
    key_file = tmp_path / "anchor.key"
    key_file.write_bytes(os.urandom(32))
    path = str(tmp_path / "anchors.jsonl")
    base = ["--ledger", sqlite_url]
    assert cli.main(base + ["audit", "anchor", "--file", path, "--key-file", str(key_file)]) == 0
    assert "with HMAC" in capsys.readouterr().out
    assert cli.main(base + ["verify", "--anchors", path, "--key-file", str(key_file)]) == 0
    assert "anchors: OK" in capsys.readouterr().out
    assert not led.request("s", run_id="big", blocks=["d0"], epsilon=0.999).granted
    assert cli.main(base + ["audit", "anchor", "--file", path, "--key-file", str(key_file)]) == 0
    # Hide the denial: drop its entry and move the head back.
    seq, chain = led._q("SELECT seq, chain FROM audit WHERE kind = 'deny'").fetchone()
    led._q("DELETE FROM audit WHERE seq >= ?", (seq,))
    _rehash_chain(led, chain, seq)
    assert cli.main(base + ["verify"]) == 0  # the chain alone cannot tell
    assert cli.main(base + ["verify", "--anchors", path, "--key-file", str(key_file)]) == 4
    assert "anchors: FAILED" in capsys.readouterr().out
    assert cli.main(base + ["audit", "anchor"]) == 2  # no --file
    led.close()
