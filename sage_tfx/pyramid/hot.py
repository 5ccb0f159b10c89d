"""What a Pyramid store shares between processes: its directory lock, and hot-window keys.

* :class:`DirLock` — an exclusive ``flock`` on ``<state_dir>/.lock``, held by every call that
  changes the store (open, observe, seal, discard, restore). Each call re-reads the manifest
  under it, so two processes on one directory see each other's windows and parts.
* :class:`HotKeys` — the data key of each hot window (a Tink streaming-AEAD keyset,
  :class:`sage_tfx.ledger.keys.DataKey`), wrapped by the key-encryption key and kept in the
  ``pyramid_hot_keys`` table of the **ledger's database**, reached through its own connection
  (the ledger's tables are never touched). The key is never written beside the data: the hot
  directory alone, or a copy of it, is unreadable. Sealing or discarding a window deletes its
  key row (crypto-shredding) before its files. A store without a ledger (offline experiments)
  keeps its hot keys in this process's memory only.
* :func:`write_part` / :func:`read_part` — one encrypted part file of raw rows
  (:mod:`sage_tfx.pyramid.rows`, no pickle), bound to its file name by the associated data.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from typing import Iterator, Optional

from sage_tfx.errors import InvalidRequestError, LeaseTimeoutError
from sage_tfx.ledger import blockkeys, keys, systemdb
from sage_tfx.ledger.values import now
from sage_tfx.pyramid import rows

__all__ = ["DirLock", "HotKeys", "ledger_db", "write_part", "read_part"]

LOCK_FILE = ".lock"
_POLL = 0.02


class DirLock:
    """An exclusive, re-entrant (per object and thread) lock on a store directory."""

    def __init__(self, directory: str, wait: float = 600.0):
        self.path = os.path.join(directory, LOCK_FILE)
        self.wait = float(wait)
        self._local = threading.local()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Holds the directory lock (reentrant within a thread)."""
        depth = getattr(self._local, "depth", 0)
        if depth:
            self._local.depth = depth + 1
            try:
                yield
            finally:
                self._local.depth -= 1
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + self.wait
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LeaseTimeoutError(f"the Pyramid store lock {self.path} stayed "
                                                f"held by another process for {self.wait:g} s")
                    time.sleep(_POLL)
            self._local.depth = 1
            try:
                yield
            finally:
                self._local.depth = 0
        finally:
            os.close(fd)  # closing the descriptor releases the lock (also if this process dies)


_SCHEMA = """CREATE TABLE IF NOT EXISTS pyramid_hot_keys (
    hot_id TEXT PRIMARY KEY, store_id TEXT NOT NULL, stream TEXT NOT NULL,
    window_index {int} NOT NULL, kek_id TEXT NOT NULL, wrapped {blob} NOT NULL,
    created_at TEXT NOT NULL)"""

_MEMORY: dict[str, keys.DataKey] = {}   # hot keys of stores without a ledger (this process)


def rewrap_hot_keys(ledger, kek: keys.KeyProvider) -> int:
    """``sage-tfx keys rotate``: the open hot windows' keys re-wrapped under the new KEK."""
    return blockkeys.rewrap_table(
        ledger, kek, "pyramid_hot_keys", ["hot_id"],
        lambda r: keys.aad_for("pyramid", r["stream"], r["store_id"], r["hot_id"]),
        columns=["stream", "store_id"])


blockkeys.register_rewrapper("pyramid_hot_keys", rewrap_hot_keys)


def ledger_db(url: str, schema: str = _SCHEMA):
    """A short-lived connection to the ledger's database for a Pyramid table (``schema``):
    the hot keys by default, the tree's node claims (:mod:`sage_tfx.pyramid.treestore`)."""
    return systemdb.connect(url, schema, "sage-tfx-pyramid")


class HotKeys:
    """Hot-window data keys of one store: in the ledger's database, or in memory (no ledger).

    Args:
      ledger: the store's ledger (None: keys live in this process's memory).
      store_id, stream: what the keys belong to (bound into the wrapping's associated data).
      kek: the key provider, or a provider spec; default :func:`sage_tfx.ledger.keys.provider`.
    """

    def __init__(self, ledger, store_id: str, stream: str, kek=None):
        self.ledger, self.store_id, self.stream = ledger, store_id, stream
        self._kek_spec = kek
        self._kek: Optional[keys.KeyProvider] = None
        self._cache: dict[str, keys.DataKey] = {}

    @property
    def kek(self) -> keys.KeyProvider:
        """The key-encryption key provider (resolved on first use)."""
        if self._kek is None:
            spec = self._kek_spec
            self._kek = spec if isinstance(spec, keys.KeyProvider) else keys.provider(spec)
        return self._kek

    def _aad(self, hot_id: str) -> bytes:
        return keys.aad_for("pyramid", self.stream, self.store_id, hot_id)

    def _db(self):
        return ledger_db(self.ledger.url)

    def create(self, hot_id: str, window: int) -> keys.DataKey:
        """A fresh data key for the hot window ``hot_id``, stored wrapped."""
        dk = keys.DataKey.new()
        if self.ledger is None:
            _MEMORY[hot_id] = dk
        else:
            wrapped = dk.wrap(self.kek, self._aad(hot_id))
            with self._db() as db:
                db.q("INSERT INTO pyramid_hot_keys (hot_id, store_id, stream, window_index, "
                     "kek_id, wrapped, created_at) VALUES (?,?,?,?,?,?,?)",
                     (hot_id, self.store_id, self.stream, int(window), self.kek.kek_id,
                      wrapped, now()))
        self._cache[hot_id] = dk
        return dk

    def get(self, hot_id: str) -> keys.DataKey:
        """The hot window's data key.

        Raises:
          InvalidRequestError: the key is gone (destroyed, or kept by another process's memory).
        """
        if hot_id in self._cache:
            return self._cache[hot_id]
        if self.ledger is None:
            dk = _MEMORY.get(hot_id)
        else:
            with self._db() as db:
                row = db.q("SELECT wrapped FROM pyramid_hot_keys WHERE hot_id = ?",
                           (hot_id,)).fetchone()
            dk = None if row is None else keys.DataKey.unwrap(self.kek, bytes(row[0]),
                                                               self._aad(hot_id))
        if dk is None:
            raise InvalidRequestError(
                f"the key of hot window {hot_id} is gone (destroyed, or held by the memory of "
                "the process that opened an offline store): its rows cannot be read; "
                "discard_window() deletes them")
        self._cache[hot_id] = dk
        return dk

    def destroy(self, hot_id: str) -> None:
        """Deletes the hot window's key everywhere it is kept: its files become noise."""
        self._cache.pop(hot_id, None)
        _MEMORY.pop(hot_id, None)
        if self.ledger is not None:
            with self._db() as db:
                db.q("DELETE FROM pyramid_hot_keys WHERE hot_id = ?", (hot_id,))

    def exists(self, hot_id: str) -> bool:
        """Whether the key is still kept (for tests and audits; never reads the key)."""
        if self.ledger is None:
            return hot_id in _MEMORY
        with self._db() as db:
            return db.q("SELECT 1 FROM pyramid_hot_keys WHERE hot_id = ?",
                        (hot_id,)).fetchone() is not None


def _part_aad(store_id: str, hot_id: str, name: str) -> bytes:
    return keys.aad_for("pyramid", store_id, hot_id, name)


def write_part(path: str, frame, dk: keys.DataKey, store_id: str, hot_id: str) -> None:
    """Writes ``frame``'s rows encrypted to ``path`` (via a hidden temporary file)."""
    data = dk.encrypt(rows.encode_frame(frame),
                      _part_aad(store_id, hot_id, os.path.basename(path)))
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def read_part(path: str, dk: keys.DataKey, store_id: str, hot_id: str):
    """The rows of one part file (raises if it was altered, renamed or is of another window)."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        plain = dk.decrypt(data, _part_aad(store_id, hot_id, os.path.basename(path)))
    except Exception as e:  # Tink raises its own error types on tampering
        raise InvalidRequestError(f"hot-window part {path} does not decrypt: {e}") from e
    return rows.decode_frame(plain)
