"""A window's raw block files, encrypted at rest with the window's own data key.

Each window gets a fresh :class:`~sage_tfx.ledger.keys.DataKey` (Tink streaming AEAD); its
wrapped form (under the operator's key-encryption key, ``$SAGE_KEY_PROVIDER``) is the only copy,
kept in the lake's ``ptk_window_keys`` table of the ledger's database. Every block file is the
encryption of one ``.npz`` with the block's identity as associated data, so a file moved to
another block or window does not decrypt. Closing the window deletes the wrapped key first:
from then on its files, any copy of them and any backup of the database are unreadable
(crypto-shredding), and the files themselves are deleted next.
"""
from __future__ import annotations

import io
import os
import tempfile
import threading
from typing import Iterable, Mapping, Optional

import numpy as np

from sage_tfx.errors import InvalidRequestError, MissingGrantError
from sage_tfx.ledger import blockkeys, keys
from sage_tfx.ptk.abstraction import concat

SUFFIX = ".npz.sealed"


def rewrap_window_keys(ledger, kek: keys.KeyProvider) -> int:
    """``sage-tfx keys rotate``: the open windows' keys re-wrapped under the new KEK."""
    return blockkeys.rewrap_table(
        ledger, kek, "ptk_window_keys", ["window_index"],
        lambda r: keys.aad_for("ptk", r["stream"], f"w{r['window_index']:06d}"),
        columns=["stream"])


blockkeys.register_rewrapper("ptk_window_keys", rewrap_window_keys)


class WindowFiles:
    """Writes and reads the encrypted block files of the store's windows."""

    def __init__(self, lake, stream: str, data_root: str,
                 key_provider: Optional[keys.KeyProvider] = None):
        self.lake, self.stream = lake, stream
        self.data_root = os.path.abspath(data_root)
        self._provider = key_provider
        self._keys: dict[int, keys.DataKey] = {}
        self._lock = threading.Lock()

    @property
    def provider(self) -> keys.KeyProvider:
        """The key provider wrapping window data keys (the default one on first use)."""
        if self._provider is None:
            self._provider = keys.provider()
        return self._provider

    def _aad(self, window_index: int, block_id: Optional[str] = None) -> bytes:
        parts = ("ptk", self.stream, f"w{window_index:06d}") + ((block_id,) if block_id else ())
        return keys.aad_for(*parts)

    def key(self, window_index: int, *, create: bool = False) -> keys.DataKey:
        """The window's data key (unwrapped once per process), made when ``create``.

        Raises:
          MissingGrantError: the key is destroyed (the window closed): its data is gone.
        """
        with self._lock:
            got = self._keys.get(window_index)
            if got is not None:
                return got
            stored = self.lake.window_key(window_index)
            if stored is None:
                if not create:
                    raise MissingGrantError(
                        f"window {window_index}'s data key is destroyed (the window closed): its "
                        "raw data cannot be read any more")
                fresh = keys.DataKey.new()
                wrapped = fresh.wrap(self.provider, self._aad(window_index)).decode("utf-8")
                stored = (self.provider.kek_id,
                          self.lake.put_window_key(window_index, self.stream,
                                                   self.provider.kek_id, wrapped))
            got = keys.DataKey.unwrap(self.provider, stored[1].encode("utf-8"),
                                      self._aad(window_index))
            self._keys[window_index] = got
            return got

    def forget(self, window_index: int) -> None:
        """Drops this process's unwrapped copy of a window's key."""
        with self._lock:
            self._keys.pop(window_index, None)

    def folder(self, window_index: int) -> str:
        """The directory of window ``window_index``'s block files."""
        return os.path.join(self.data_root, self.stream, f"w{window_index:06d}")

    def write_block(self, window_index: int, block_id: str, columns: Mapping) -> str:
        """Encrypts one block's columns into its file (written whole, then renamed)."""
        buf = io.BytesIO()
        np.savez(buf, **{k: np.asarray(v) for k, v in columns.items()})
        sealed = self.key(window_index, create=True).encrypt(
            buf.getvalue(), self._aad(window_index, block_id))
        folder = self.folder(window_index)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, block_id + SUFFIX)
        fd, tmp = tempfile.mkstemp(prefix=f".{block_id}.", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(sealed)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        return path

    def read_block(self, window_index: int, block_id: str, path: str) -> dict:
        """The columns of one block file (authenticated: a foreign or altered file raises)."""
        try:
            with open(path, "rb") as f:
                sealed = f.read()
        except OSError as exc:
            raise MissingGrantError(f"block file {path} cannot be read: {exc.strerror}") from exc
        try:
            plain = self.key(window_index).decrypt(sealed, self._aad(window_index, block_id))
        except MissingGrantError:
            raise
        except Exception as exc:  # Tink raises on tampering or a wrong key
            raise InvalidRequestError(f"block file {path} does not decrypt for block "
                                      f"{block_id}: {type(exc).__name__}") from exc
        return dict(np.load(io.BytesIO(plain), allow_pickle=False))

    def read(self, window_index: int, blocks: Iterable[tuple[str, str]]) -> dict:
        """The concatenated columns of (block id, path) pairs of one window."""
        return concat(self.read_block(window_index, b, p) for b, p in blocks)


def window_of(block_id: str) -> int:
    """The window index a block id ``w000007.t041`` belongs to."""
    try:
        return int(block_id.split(".", 1)[0][1:])
    except (ValueError, IndexError) as exc:
        raise InvalidRequestError(f"{block_id!r} is not a PTK window block id") from exc
