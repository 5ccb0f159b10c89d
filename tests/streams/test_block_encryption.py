"""Encrypted block files and reading them through a grant (streams.blockfiles, streams.reading).

Fast tests write blocks with ``blockfiles`` directly; the slow ones check TensorFlow's reader
against the encrypted files and read a grant of a Beam split back with ``read_float_feature``.
"""
import glob
import gzip
import logging
import os

import pytest

from sage_tfx.errors import MissingGrantError, RetiredBlockError
from sage_tfx.ledger import BlockSpec, keys, open_ledger
from sage_tfx.streams import blockfiles, reading
from sage_tfx.streams.blockfiles import CorruptBlockFileError
from sage_tfx.streams.blocks import encrypted_files_glob

SECRET = b"value-nobody-may-read"
NAME = "part-00000-of-00001.tfrecord.gz.tink"


def _records(tag, n=40):
    return [SECRET + b"/" + tag.encode() + b"/%d" % i * (1 + i % 5) for i in range(n)]


def write_encrypted_block(root, stream, block_id, records):
    """An encrypted block directory as the splitter writes it; returns its BlockSpec."""
    loc = os.path.join(root, stream, block_id)
    os.makedirs(loc)
    dk, kek_id, wrapped = blockfiles.new_block_key(keys.provider(), stream, block_id)
    blockfiles.write_block_file(os.path.join(loc, NAME), records, dk,
                                blockfiles.file_aad(stream, block_id, NAME))
    return BlockSpec(block_id, loc, records=len(records), wrapped_key=wrapped, kek_id=kek_id)


def write_plaintext_block(root, stream, block_id, records):
    """A block of the layout before encryption: a plaintext gzip TFRecord file, no key."""
    loc = os.path.join(root, stream, block_id)
    os.makedirs(loc)
    with gzip.open(os.path.join(loc, "part-00000-of-00001.tfrecord.gz"), "wb") as f:
        f.write(b"".join(blockfiles.frame(r) for r in records))
    return BlockSpec(block_id, loc, records=len(records))


@pytest.fixture
def ledger(tmp_path):
    led = open_ledger(f"sqlite:///{tmp_path}/ledger.db")
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6)
    root = str(tmp_path / "blocks")
    led.add_blocks("s", [write_encrypted_block(root, "s", f"b{i}", _records(f"b{i}"))
                         for i in range(3)])
    led.add_blocks("s", [write_plaintext_block(root, "s", "old", _records("old"))])
    yield led
    led.close()


def _read_grant(led, grant):
    out = {}
    for f in reading.granted_files(led, grant):
        out.setdefault(f.block_id, []).extend(reading.read_granted_file(f))
    return out


def test_a_grant_reads_its_blocks_and_only_them(ledger, caplog):
    g = ledger.request("s", run_id="r", blocks=["b0", "b2", "old"], epsilon=0.1).grant
    with caplog.at_level(logging.WARNING):
        got = _read_grant(ledger, g)
    assert got == {"b0": _records("b0"), "b2": _records("b2"), "old": _records("old")}
    assert "block old of stream s is not encrypted" in caplog.text
    files = reading.granted_files(ledger, g)
    assert all(f.wrapped_key is None for f in files if f.block_id == "old")
    assert {f.key_provider for f in files if f.block_id != "old"} == {keys.default_spec()}
    reserved = ledger.request("s", run_id="res", blocks=["b1"], epsilon=0.1,
                              release=False).grant
    with pytest.raises(MissingGrantError, match="reserved"):
        reading.granted_files(ledger, reserved)


def test_a_block_file_without_its_key_yields_nothing(ledger):
    loc = ledger.block("s", "b1").location
    data = open(os.path.join(loc, NAME), "rb").read()
    assert SECRET not in data and b"b1/" not in data
    with pytest.raises(OSError):  # gzip.BadGzipFile: not a gzip file
        gzip.decompress(data)
    with pytest.raises(CorruptBlockFileError):  # another block's key does not open it
        other = keys.DataKey.new()
        list(blockfiles.read_block_file(os.path.join(loc, NAME), other,
                                        blockfiles.file_aad("s", "b1", NAME)))


@pytest.mark.parametrize("damage", ["truncate", "flip", "rename", "other_block"])
def test_a_damaged_or_moved_file_does_not_decrypt(ledger, tmp_path, damage):
    g = ledger.request("s", run_id="r", blocks=["b0"], epsilon=0.1).grant
    f = reading.granted_files(ledger, g)[0]
    data = bytearray(open(f.path, "rb").read())
    if damage == "truncate":
        data = data[:-40]
    elif damage == "flip":
        data[len(data) // 2] ^= 1
    elif damage == "other_block":  # b1's file in b0's place
        data = open(os.path.join(ledger.block("s", "b1").location, NAME), "rb").read()
    path = f.path if damage != "rename" else f.path.replace("00000-of", "00001-of")
    if damage == "rename":
        os.rename(f.path, path)
    else:
        open(path, "wb").write(bytes(data))
    moved = reading.GrantedFile(path, f.stream, f.block_id, f.wrapped_key, f.key_provider)
    with pytest.raises(CorruptBlockFileError, match="does not decrypt"):
        list(reading.read_granted_file(moved))


def test_a_retired_blocks_data_is_gone_for_a_grant_made_before(ledger):
    g = ledger.request("s", run_id="r", blocks=["b0", "b1"], epsilon=0.1).grant
    ledger.retire_block("s", "b1", "retire")
    with pytest.raises(RetiredBlockError, match="retired since the grant"):
        reading.granted_files(ledger, g)
    # Encrypted files left behind (a copy put back) without a key: unreadable, not plaintext.
    loc = ledger.block("s", "b0").location
    ledger._q("DELETE FROM block_keys WHERE block_id = 'b0'")
    with pytest.raises(RetiredBlockError, match="key was destroyed"):
        reading.granted_files(ledger, ledger.grant(g.grant_id))
    assert glob.glob(encrypted_files_glob(loc))


def test_plaintext_framing_is_checked():
    good = b"".join(blockfiles.frame(r) for r in (b"abc", b"defg"))
    import io
    assert list(blockfiles.iter_tfrecords(io.BytesIO(good))) == [b"abc", b"defg"]
    bad = bytearray(good)
    bad[13] ^= 1
    with pytest.raises(CorruptBlockFileError, match="CRC"):
        list(blockfiles.iter_tfrecords(io.BytesIO(bytes(bad))))
    with pytest.raises(CorruptBlockFileError, match="truncated"):
        list(blockfiles.iter_tfrecords(io.BytesIO(good[:-3])))


def test_read_float_feature_refuses_locations():
    with pytest.raises(TypeError, match="through a released grant"):
        reading.read_float_feature(["/blocks/s/b0"], "x")


# === slow: TensorFlow's reader and a Beam split =================================================


@pytest.mark.slow
def test_tensorflow_reads_no_record_from_an_encrypted_block_file(ledger):
    import tensorflow as tf
    path = os.path.join(ledger.block("s", "b0").location, NAME)
    for compression in ("GZIP", ""):
        with pytest.raises(tf.errors.OpError):
            list(tf.compat.v1.io.tf_record_iterator(
                path, tf.io.TFRecordOptions(compression_type=compression)))


@pytest.mark.slow
def test_split_then_read_float_feature_through_a_grant(tmp_path):
    from sage_tfx.ledger import Window
    from sage_tfx.streams import TimeWindowScheme, split_and_register
    rows = [(1357000000 + 3600 * 7 * i, i * 0.25, f"name-{i}-{SECRET.decode()}")
            for i in range(60)]
    src = tmp_path / "in.csv"
    src.write_text("t,x,who\n" + "".join(f"{t},{x},{w}\n" for t, x, w in rows))
    led = open_ledger(f"sqlite:///{tmp_path}/ledger.db")
    scheme = TimeWindowScheme("t", "day")
    led.create_stream("s", epsilon_g=1.0, delta_g=1e-6, granularity=scheme.spec())
    result = split_and_register(led, "s", str(src), scheme, str(tmp_path / "blocks"),
                                verbose=False)
    for b in result.blocks:  # no field value of any row in any block file
        data = b"".join(open(p, "rb").read() for p in glob.glob(encrypted_files_glob(b.location)))
        assert SECRET not in data and b"name-" not in data
    g = led.request("s", run_id="r", window=Window(last=3), epsilon=0.5).grant
    got = sorted(reading.read_float_feature(led, g, "x"))
    want = sorted(x for t, x, _ in rows if TimeWindowScheme("t", "day").block_of(t).block_id
                  in g.block_ids)
    assert got == pytest.approx(want) and len(want) > 0


def test_the_split_refuses_blocks_whose_keys_do_not_open(tmp_path):
    from sage_tfx.streams import splitter
    staging = str(tmp_path / "staging")
    os.makedirs(os.path.join(staging, "b0"))
    kek, other = keys.provider(), keys.provider(f"file:{tmp_path}/other.json")
    dk, kek_id, wrapped = blockfiles.new_block_key(kek, "s", "b0")
    path = os.path.join(staging, "b0", NAME)
    blockfiles.write_block_file(path, _records("b0"), dk, blockfiles.file_aad("s", "b0", NAME))
    written = [{"block_id": "b0", "records": 40, "kek_id": kek_id, "wrapped_key": wrapped.hex()}]
    splitter._check_keys(staging, written, "s", kek)  # opens
    with pytest.raises(splitter.SplitKeyError, match="same KEK on every Beam worker"):
        splitter._check_keys(staging, written, "s", other)
    # Two attempts at one block: the file of one, the key of the other.
    _, _, wrapped2 = blockfiles.new_block_key(kek, "s", "b0")
    written[0]["wrapped_key"] = wrapped2.hex()
    with pytest.raises(splitter.SplitKeyError):
        splitter._check_keys(staging, written, "s", kek)
