"""Envelope encryption: data keys wrapped by a KEK, bound to what they encrypt."""
import io
import os
import stat

import pytest

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import keys


def test_a_data_key_round_trips_and_is_bound_to_its_block(tmp_path):
    kek = keys.provider(f"file:{tmp_path}/kek.json")
    assert stat.S_IMODE(os.stat(tmp_path / "kek.json").st_mode) == 0o600
    dk = keys.DataKey.new()
    aad = keys.aad_for("flights", "2013-01-01")
    wrapped = dk.wrap(kek, aad)
    data = os.urandom(3_000_000)  # several 1 MB segments
    ct = dk.encrypt(data, b"file-0")
    assert data[:64] not in ct and len(ct) > len(data)
    again = keys.DataKey.unwrap(keys.provider(f"file:{tmp_path}/kek.json"), wrapped, aad)
    assert again.decrypt(ct, b"file-0") == data
    with pytest.raises(InvalidRequestError, match="does not open"):
        keys.DataKey.unwrap(kek, wrapped, keys.aad_for("flights", "2013-01-02"))
    with pytest.raises(Exception):
        again.decrypt(ct, b"file-1")  # a file moved to another name does not open
    with pytest.raises(Exception):
        again.decrypt(ct[:-100], b"file-0")  # truncation is detected
    other = keys.provider(f"file:{tmp_path}/other.json")
    with pytest.raises(InvalidRequestError):
        keys.DataKey.unwrap(other, wrapped, aad)


def test_streams_and_rotation(tmp_path):
    kek = keys.LocalKeyFile(str(tmp_path / "k.json"))
    dk = keys.DataKey.new()
    old = dk.wrap(kek, b"a")
    kek.rotate()
    new = dk.wrap(kek, b"a")
    assert keys.DataKey.unwrap(kek, old, b"a") and keys.DataKey.unwrap(kek, new, b"a")
    out = keys._Kept()
    with dk.encrypting(out, b"x") as w:
        for _ in range(5):
            w.write(b"row\n" * 1000)
    with dk.decrypting(io.BytesIO(out.getvalue()), b"x") as r:
        assert r.read() == b"row\n" * 5000


def test_provider_specs(tmp_path, monkeypatch):
    monkeypatch.setenv(keys.PROVIDER_ENV, f"file:{tmp_path}/env.json")
    assert keys.provider().key_id == f"file:{tmp_path}/env.json"
    for bad in ("nope", "file:", "vault:secret/x"):
        with pytest.raises(InvalidRequestError):
            keys.provider(bad)
    with pytest.raises(InvalidRequestError):
        keys.LocalKeyFile(str(tmp_path / "missing.json"), create=False)
