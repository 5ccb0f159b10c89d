"""Block keys in the ledger: registered with their blocks, handed out through released grants
only, destroyed at retirement (at once, or after the hold of the grant that exhausted them)."""
import os
import re
import time

import pytest

from sage_tfx.errors import (GrantStateError, InvalidRequestError, PermissionDeniedError,
                             RetiredBlockError)
from sage_tfx.ledger import BlockSpec, keys, open_ledger
from sage_tfx.ledger.blockkeys import BLOCK_FILE_PATTERNS, HOLD_ENV, remove_block_files
from sage_tfx.streams import blockfiles

FIELD = b"the-secret-field-value"


def _block(root, kek, stream, block_id, n=50):
    """An encrypted block directory and its BlockSpec (wrapped key included)."""
    loc = os.path.join(root, stream, block_id)
    os.makedirs(loc)
    dk, kek_id, wrapped = blockfiles.new_block_key(kek, stream, block_id)
    name = "part-00000-of-00001.tfrecord.gz.tink"
    blockfiles.write_block_file(os.path.join(loc, name),
                                [FIELD + b"-" + block_id.encode() + b"-%d" % i for i in range(n)],
                                dk, blockfiles.file_aad(stream, block_id, name))
    return BlockSpec(block_id, loc, records=n, wrapped_key=wrapped, kek_id=kek_id)


def _ledger(url, root, kek, blocks=4, contexts=("default",), epsilon_g=1.0):
    led = open_ledger(url)
    led.create_stream("s", epsilon_g=epsilon_g, delta_g=1e-6, contexts=contexts)
    led.add_blocks("s", [_block(root, kek, "s", f"b{i}") for i in range(blocks)])
    return led


def _read(led, grant, kek):
    """Every record of a grant's blocks, decrypted with the keys the ledger hands out."""
    out = {}
    for block_id, key in led.grant_keys(grant.grant_id).items():
        loc = dict(zip(grant.block_ids, grant.locations))[block_id]
        path = os.path.join(loc, "part-00000-of-00001.tfrecord.gz.tink")
        out[block_id] = None if key is None else list(blockfiles.read_block_file(
            path, key.unwrap(kek), blockfiles.file_aad("s", block_id, path)))
    return out


@pytest.fixture
def kek(tmp_path):
    return keys.provider(f"file:{tmp_path}/kek.json")


def test_keys_register_with_their_blocks_and_only_a_released_grant_gets_them(ledger_url,
                                                                             tmp_path, kek):
    led = _ledger(ledger_url, str(tmp_path / "blocks"), kek)
    assert {k.block_id for k in led.block_keys("s")} == {"b0", "b1", "b2", "b3"}
    assert all(k.kek_id == kek.kek_id for k in led.block_keys("s"))
    g = led.request("s", run_id="r", blocks=["b1", "b2"], epsilon=0.1).grant
    got = _read(led, g, kek)
    assert set(got) == {"b1", "b2"}  # the grant's blocks, and no other
    assert got["b2"] == [FIELD + b"-b2-%d" % i for i in range(50)]
    res = led.request("s", run_id="res", blocks=["b3"], epsilon=0.1, release=False).grant
    with pytest.raises(GrantStateError, match="reserved"):
        led.grant_keys(res.grant_id)
    with pytest.raises(InvalidRequestError, match="unknown grant"):
        led.grant_keys("nope")
    assert any(e.kind == "grant_keys" and e.payload["grant_id"] == g.grant_id
               for e in led.audit_log("s"))
    # A block registered with half a key is refused, and nothing of its batch is registered.
    bad = BlockSpec("b9", str(tmp_path / "x"), wrapped_key=b"abc")
    with pytest.raises(InvalidRequestError, match="wrapped_key"):
        led.add_blocks("s", [_block(str(tmp_path / "blocks"), kek, "s", "b8"), bad])
    assert len(led.blocks("s")) == 4 and len(led.block_keys("s")) == 4


def test_a_pipeline_not_bound_to_the_grants_context_gets_no_keys(ledger_url, tmp_path, kek):
    led = _ledger(ledger_url, str(tmp_path / "blocks"), kek, contexts=("team-a", "team-b"))
    tokens = {n: led.add_principal(n, r) for n, r in (("root", ["admin"]), ("pa", ["pipeline"]),
                                                      ("pb", ["pipeline"]), ("aud", ["auditor"]))}
    led.close()
    root = open_ledger(ledger_url, token=tokens["root"])
    root.bind("pa", "s", "team-a")
    root.bind("pb", "s", "team-b")
    pa = open_ledger(ledger_url, token=tokens["pa"])
    g = pa.request("s", run_id="r", blocks=["b0"], epsilon=0.1, context="team-a").grant
    assert _read(pa, g, kek)["b0"][0] == FIELD + b"-b0-0"
    for other in ("pb", "aud"):
        with open_ledger(ledger_url, token=tokens[other]) as led2:
            with pytest.raises(PermissionDeniedError):
                led2.grant_keys(g.grant_id)
            with pytest.raises(PermissionDeniedError):
                led2.block_keys("s")
    with pytest.raises(PermissionDeniedError):
        pa.add_block_key("s", "b0", kek_id="x", wrapped=b"y")
    with pytest.raises(PermissionDeniedError):
        pa.shred_keys()
    assert root.grant_keys(g.grant_id)["b0"] is not None  # an admin may


def test_operator_retirement_destroys_the_key_and_files_in_every_context_only(ledger_url,
                                                                              tmp_path, kek):
    led = _ledger(ledger_url, str(tmp_path / "blocks"), kek, contexts=("a", "b"))
    loc = led.block("s", "b1", "a").location
    led.retire_block("s", "b1", "gdpr", context="a")
    assert "b1" in {k.block_id for k in led.block_keys("s")}  # still active in context b
    assert os.listdir(loc)
    led.retire_block("s", "b1", "gdpr", context="b")
    assert "b1" not in {k.block_id for k in led.block_keys("s")}
    assert not os.path.exists(loc)  # the files went with the key
    assert [e.payload["block"] for e in led.audit_log("s") if e.kind == "shred"] == ["b1"]
    with pytest.raises(RetiredBlockError):
        led.request("s", run_id="r", blocks=["b1"], epsilon=0.1, context="a")
    with pytest.raises(RetiredBlockError):
        led.add_block_key("s", "b1", kek_id="k", wrapped=b"w")
    led.retire_block("s", "b2", "all at once")
    assert {k.block_id for k in led.block_keys("s")} == {"b0", "b3"}


def test_the_grant_that_exhausts_a_block_still_reads_it_until_its_hold_ends(
        ledger_url, tmp_path, kek, monkeypatch):
    led = _ledger(ledger_url, str(tmp_path / "blocks"), kek)
    g = led.request("s", run_id="spend-all", blocks=["b0", "b1"], epsilon=1.0).grant
    assert led.block("s", "b0").status == "retired"  # retired by exhaustion, in the charge
    assert _read(led, g, kek)["b0"][0] == FIELD + b"-b0-0"  # ... and still readable by it
    report = led.shred_keys()  # default hold: 24 h
    assert report.shredded == () and set(report.held) == {("s", "b0"), ("s", "b1")}
    # A reservation holds its blocks until it is released (and then for the hold).
    res = led.request("s", run_id="res", blocks=["b2"], epsilon=1.0, release=False).grant
    report = led.shred_keys(hold=0)
    assert set(report.shredded) == {("s", "b0"), ("s", "b1")} and report.held == (("s", "b2"),)
    assert report.files_removed == 2 and report.wiped
    assert _read(led, g, kek) == {"b0": None, "b1": None}  # the key is gone for good
    assert not os.path.exists(os.path.join(str(tmp_path / "blocks"), "s", "b0"))
    led.release(res.grant_id)
    assert _read(led, led.grant(res.grant_id), kek)["b2"]  # within its hold
    # The next write that checks enforces the hold without any shred command.
    monkeypatch.setenv(HOLD_ENV, "0")
    led.add_blocks("s", [_block(str(tmp_path / "blocks"), kek, "s", "b4")])
    assert {k.block_id for k in led.block_keys("s")} == {"b3", "b4"}
    # A key hand-out looks too, at most once a minute per stream.
    led.request("s", run_id="spend-b3", blocks=["b3"], epsilon=1.0)
    g4 = led.request("s", run_id="r4", blocks=["b4"], epsilon=0.1).grant
    led.grant_keys(g4.grant_id)  # the first hand-out above looked less than a minute ago
    assert "b3" in {k.block_id for k in led.block_keys("s")}
    led._store.write(lambda: led._q("UPDATE leases SET expires_at = 0"))
    led.grant_keys(g4.grant_id)
    assert {k.block_id for k in led.block_keys("s")} == {"b4"}
    monkeypatch.setenv(HOLD_ENV, "-1")
    with pytest.raises(InvalidRequestError, match=HOLD_ENV):
        led.shred_keys()
    with pytest.raises(InvalidRequestError):
        led.shred_keys(hold=float("nan"))


def _wrapped_candidates(data: bytes):
    """Every Tink encrypted keyset found in raw bytes (an attacker scanning a database file)."""
    return [m.group(0) for m in re.finditer(
        rb'\{\s*"encryptedKeyset":\s*"[A-Za-z0-9+/=]+".*?"primaryKeyId":\s*\d+.*?\]\s*\}\s*\}',
        data, re.S)]


def test_a_retired_block_cannot_be_decrypted_with_files_database_and_kek_in_hand(tmp_path, kek):
    url = f"sqlite:///{tmp_path}/ledger.db"
    led = _ledger(url, str(tmp_path / "blocks"), kek)
    loc = led.block("s", "b1").location
    path = os.path.join(loc, "part-00000-of-00001.tfrecord.gz.tink")
    stolen = open(path, "rb").read()  # the attacker keeps a copy of the block file
    assert FIELD not in stolen
    wrapped = next(k.wrapped for k in led.block_keys("s") if k.block_id == "b1")
    secret = re.search(rb'"encryptedKeyset":\s*"([^"]+)"', wrapped).group(1)

    def db_bytes():
        paths = [f"{tmp_path}/ledger.db{suffix}" for suffix in ("", "-wal")]
        return b"".join(open(p, "rb").read() for p in paths if os.path.exists(p))

    assert secret in db_bytes()  # the scan below would find it, were it there
    led.retire_block("s", "b1", "retire")
    raw = db_bytes()
    assert secret not in raw
    assert os.path.getsize(f"{tmp_path}/ledger.db-wal") == 0  # truncated by the checkpoint
    assert not os.path.exists(path)
    aad = blockfiles.file_aad("s", "b1", path)
    opened = 0
    for candidate in _wrapped_candidates(raw):  # the other blocks' keys are still there
        try:
            dk = keys.DataKey.unwrap(kek, candidate, keys.aad_for("s", "b1"))
        except InvalidRequestError:
            continue
        dk.decrypt(stolen, aad)
        opened += 1
    assert opened == 0 and len(_wrapped_candidates(raw)) == 3


def test_postgres_deletes_and_vacuums(postgres_url, tmp_path, kek):
    led = _ledger(postgres_url, str(tmp_path / "blocks"), kek)
    led.retire_block("s", "b0", "retire")
    assert [k.block_id for k in led.block_keys("s")] == ["b1", "b2", "b3"]
    for _ in range(50):  # the statistics reach the view shortly after the VACUUM
        row = led._q("SELECT last_vacuum, n_dead_tup FROM pg_stat_user_tables WHERE "
                     "relname = 'block_keys'").fetchone()
        if row[0] is not None:
            break
        time.sleep(0.1)
    assert row[0] is not None and row[1] == 0


def test_remove_block_files_deletes_block_data_only(tmp_path):
    loc = tmp_path / "b"
    loc.mkdir()
    for name in ("part-0.tfrecord.gz", "part-0.tfrecord.gz.tink", "part-1.tfrecord.gz.tink.a1.tmp",
                 "notes.txt"):
        (loc / name).write_bytes(b"x")
    assert remove_block_files(str(loc)) == 3 and os.listdir(loc) == ["notes.txt"]
    assert remove_block_files("gs://bucket/s/b") == 0
    from sage_tfx.streams import blocks
    assert BLOCK_FILE_PATTERNS == (blocks.BLOCK_FILE_PATTERN, blocks.ENCRYPTED_FILE_PATTERN)


def test_files_that_cannot_be_deleted_do_not_undo_the_shred(tmp_path, kek, monkeypatch):
    led = _ledger(f"sqlite:///{tmp_path}/ledger.db", str(tmp_path / "blocks"), kek)
    from sage_tfx.ledger import blockkeys

    def read_only(location):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(blockkeys, "remove_block_files", read_only)
    led.retire_block("s", "b0", "retire")  # no error: the key is destroyed, the files stay
    assert "b0" not in {k.block_id for k in led.block_keys("s")}
    monkeypatch.undo()
    report = led.shred_keys()  # the sweep deletes them later
    assert report.files_removed == 1 and report.shredded == ()


@pytest.mark.postgres
def test_a_pipeline_login_role_gets_its_grants_keys_from_the_server(postgres_url, tmp_path, kek):
    import urllib.parse
    import uuid
    led = _ledger(postgres_url, str(tmp_path / "blocks"), kek, contexts=("a", "b"))
    tokens = {"root": led.add_principal("root", ["admin"])}
    led.close()
    role, password = f"etl_{uuid.uuid4().hex[:8]}", "pw-" + uuid.uuid4().hex
    with open_ledger(postgres_url, token=tokens["root"]) as root:
        root.add_principal("etl", ["pipeline"], pg_role=role, create_pg_role=True,
                           pg_password=password)
        root.bind("etl", "s", "a")
        other = root.request("s", run_id="theirs", blocks=["b0"], epsilon=0.1, context="b").grant
    parts = urllib.parse.urlsplit(postgres_url)
    url = urllib.parse.urlunsplit(parts._replace(
        netloc=f"{role}:{password}@{parts.hostname}:{parts.port}"))
    with open_ledger(url) as etl:
        g = etl.request("s", run_id="mine", blocks=["b1", "b2"], epsilon=0.1, context="a").grant
        assert _read(etl, g, kek)["b2"][0] == FIELD + b"-b2-0"
        with pytest.raises((PermissionDeniedError, InvalidRequestError)):  # invisible to it
            etl.grant_keys(other.grant_id)
        with pytest.raises(PermissionDeniedError):
            etl.block_keys("s")
