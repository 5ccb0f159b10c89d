"""Private objects on disk (teachers, privacy units, vote counts): encrypted, authenticated
before they are unpickled.

Teachers are trained on a window's private rows, so what they are pickled into is as private as
the rows. Each file is a Tink streaming-AEAD ciphertext (:class:`sage_tfx.ledger.keys.DataKey`,
``AES256_GCM_HKDF_1MB``) of the pickle, bound by its associated data to what it holds (a cache
key, a scratch file's name). :func:`open_object` decrypts the whole file first: bytes that do not
authenticate (another key, another file's associated data, tampering, a plaintext pickle of an
older version) raise :class:`~sage_tfx.errors.InvalidRequestError` and are never unpickled.
"""
from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import keys

__all__ = ["seal_object", "open_object", "write_object", "read_object"]


def seal_object(obj: Any, dk: keys.DataKey, aad: bytes) -> bytes:
    """``obj`` pickled, then encrypted with ``dk`` and bound to ``aad``."""
    return dk.encrypt(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), aad)


def open_object(data: bytes, dk: keys.DataKey, aad: bytes) -> Any:
    """The object :func:`seal_object` sealed; unpickled only once the bytes authenticate."""
    try:
        plain = dk.decrypt(data, aad)
    except Exception as e:  # Tink raises its own error types on a wrong key or tampering
        raise InvalidRequestError(f"an encrypted object does not open for {aad!r}: "
                                  f"{type(e).__name__}") from e
    return pickle.loads(plain)


def write_object(path: str, obj: Any, dk: keys.DataKey, aad: bytes) -> None:
    """Writes ``obj`` encrypted to ``path``: a 0600 temporary file of this writer's own, then
    renamed over ``path``."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}-", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(seal_object(obj, dk, aad))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def read_object(path: str, dk: keys.DataKey, aad: bytes) -> Any:
    """The object in ``path`` (:func:`open_object`)."""
    with open(path, "rb") as f:
        return open_object(f.read(), dk, aad)
