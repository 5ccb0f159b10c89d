"""Teachers cached per window, so the adaptive loop can buy more labels without retraining.

Teachers depend on the window's private data, the partition (k, n, salt), the teacher type and
its settings; the cache key is all of them. Each later purchase is a new set of queries to the
same teachers and is charged again on the ledger (the ledger composes the charges). Which public
points a purchase labels is not the cache's business: the public cursor is a counter in the
ledger's database (``sage_tfx.bagging.purchase``), atomic across threads and processes.

**Encrypted at rest, like Pyramid's hot windows.** Teachers are trained on private rows, so the
cache keeps them in memory and, when given a directory, on disk only encrypted
(:mod:`sage_tfx.bagging.encrypted`: Tink streaming AEAD, the cache key as associated data,
authenticated before anything is unpickled): one file ``teachers-<key>.tink`` per window. Each
window's teachers have their own data key, wrapped by the key-encryption key
(``$SAGE_KEY_PROVIDER``, :mod:`sage_tfx.ledger.keys`) and kept in the ``bagging_teacher_keys``
table of the **ledger's database** (with the window's stream and blocks), never beside the
files: the directory alone, or a copy of it, is unreadable. Without a ledger the key lives in
this process's memory only (the files then outlive it unreadable). ``sage-tfx keys rotate``
re-wraps the keys under a new KEK version.

**Shredding.** :meth:`TeacherCache.shred` deletes a window's key first (crypto-shredding: every
copy of its files becomes noise), then its file. After every lookup the cache shreds the
teachers of each window a block of which is retired in every context of its stream — the
moment the ledger destroys the block's own data key (:mod:`sage_tfx.ledger.blockkeys`) and no
grant can buy labels from the window again; the lookup that found them is still answered. A
file whose key is gone, that does not authenticate, or a plaintext pickle of an older version
is deleted, never read, and counts as a miss.

Two processes that miss at once both train (teachers are a deterministic function of the
window); the first wrapped key recorded is the one both use, and each replaces the file
atomically from its own temporary file.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from typing import Callable, Optional, Sequence

from sage_tfx.bagging import encrypted
from sage_tfx.bagging.teachers import TeacherEnsemble
from sage_tfx.errors import (InvalidRequestError, PermissionDeniedError, UnknownBlockError,
                             UnknownStreamError)
from sage_tfx.ledger import blockkeys, keys, systemdb
from sage_tfx.ledger.values import now

__all__ = ["TeacherCache", "cache_key", "rewrap_teacher_keys"]

SUFFIX = ".tink"
_LEGACY_SUFFIX = ".pkl"   # plaintext pickles of older versions: deleted unread
_SCHEMA = """CREATE TABLE IF NOT EXISTS bagging_teacher_keys (
    cache_key TEXT PRIMARY KEY, stream TEXT NOT NULL, blocks TEXT NOT NULL,
    kek_id TEXT NOT NULL, wrapped {blob} NOT NULL, created_at TEXT NOT NULL)"""
_MEMORY: dict[str, keys.DataKey] = {}   # teacher keys of caches without a ledger (this process)


def cache_key(*, stream: str, blocks, k: int, n: int, salt: bytes, kind: str,
              settings: dict) -> str:
    """Stable key of one window's teachers."""
    payload = json.dumps({"stream": stream, "blocks": sorted(blocks), "k": k, "n": n,
                          "salt": hashlib.sha256(salt).hexdigest(), "kind": kind,
                          "settings": settings}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _aad(key: str) -> bytes:
    return keys.aad_for("bagging-teachers", key)


def rewrap_teacher_keys(ledger, kek: keys.KeyProvider) -> int:
    """``sage-tfx keys rotate``: the teacher caches' keys re-wrapped under the new KEK."""
    return blockkeys.rewrap_table(ledger, kek, "bagging_teacher_keys", ["cache_key"],
                                  lambda r: _aad(r["cache_key"]))


blockkeys.register_rewrapper("bagging_teacher_keys", rewrap_teacher_keys)


class TeacherCache:
    """A window's teachers by :func:`cache_key`: in memory, and encrypted under ``directory``
    when one is given (see the module docstring).

    Args:
      directory: where the encrypted teacher files go (None: memory only).
      ledger: whose database keeps the wrapped data keys (None: this process's memory).
      key_provider: the key-encryption key (a ``KeyProvider`` or a provider spec; default
        ``$SAGE_KEY_PROVIDER``).
    """

    def __init__(self, directory: Optional[str] = None, *, ledger=None, key_provider=None):
        self.directory, self.ledger = directory, ledger
        self._kek_spec = key_provider
        self._mem: dict[str, dict] = {}
        self._keys: dict[str, keys.DataKey] = {}
        self._lock = threading.Lock()
        self.trained = 0   # how many times a train function actually ran

    @functools.cached_property
    def kek(self) -> keys.KeyProvider:
        """The key-encryption key provider (resolved on first use)."""
        given = self._kek_spec
        return given if isinstance(given, keys.KeyProvider) else keys.provider(given)

    def _db(self):
        return systemdb.connect(self.ledger.url, _SCHEMA, "sage-tfx-bagging")

    def path(self, key: str) -> Optional[str]:
        """The encrypted file of ``key``'s teachers (None without a directory)."""
        return os.path.join(self.directory, f"teachers-{key}{SUFFIX}") if self.directory else None

    # -- keys --

    def _data_key(self, key: str, window: Optional[tuple] = None) -> Optional[keys.DataKey]:
        """The data key of ``key``'s teachers; made (and stored wrapped) when ``window`` =
        (stream, blocks) is given and none exists; None if it is gone."""
        if key in self._keys:
            return self._keys[key]
        if self.ledger is None:
            dk = _MEMORY.get(key)
            if dk is None and window is not None:
                dk = _MEMORY.setdefault(key, keys.DataKey.new())
        else:
            with self._db() as db:
                row = db.q("SELECT wrapped FROM bagging_teacher_keys WHERE cache_key = ?",
                           (key,)).fetchone()
                if row is None and window is not None:
                    stream, blocks = window
                    db.q("INSERT INTO bagging_teacher_keys (cache_key, stream, blocks, kek_id, "
                         "wrapped, created_at) VALUES (?,?,?,?,?,?) ON CONFLICT (cache_key) DO "
                         "NOTHING", (key, str(stream), json.dumps(sorted(map(str, blocks))),
                                     self.kek.kek_id,
                                     keys.DataKey.new().wrap(self.kek, _aad(key)), now()))
                    # the first key recorded is the one every writer uses
                    row = db.q("SELECT wrapped FROM bagging_teacher_keys WHERE cache_key = ?",
                               (key,)).fetchone()
            dk = None if row is None else keys.DataKey.unwrap(self.kek, bytes(row[0]), _aad(key))
        if dk is not None:
            self._keys[key] = dk
        return dk

    def has_key(self, key: str) -> bool:
        """Whether ``key``'s data key is still kept (for tests and audits; never reads it)."""
        if self.ledger is None:
            return key in _MEMORY
        with self._db() as db:
            return db.q("SELECT 1 FROM bagging_teacher_keys WHERE cache_key = ?",
                        (key,)).fetchone() is not None

    # -- entries --

    def _remove(self, *paths: Optional[str]) -> list[str]:
        gone = []
        for p in paths:
            if p and os.path.exists(p):
                os.remove(p)
                gone.append(p)
        return gone

    def _load(self, key: str) -> Optional[dict]:
        if key in self._mem:
            return self._mem[key]
        path = self.path(key)
        if path is None:
            return None
        self._remove(path[:-len(SUFFIX)] + _LEGACY_SUFFIX)    # never unpickle plaintext
        if not os.path.exists(path):
            return None
        dk = self._data_key(key)      # a KEK that does not open it raises: nothing is deleted
        try:
            if dk is None:
                raise InvalidRequestError(f"the key of {path} is destroyed")
            self._mem[key] = encrypted.read_object(path, dk, _aad(key))
        except InvalidRequestError:   # shredded, foreign or altered: a miss, and the file goes
            self._remove(path)
            return None
        return self._mem[key]

    def _store(self, key: str, entry: dict, window: tuple) -> None:
        self._mem[key] = entry
        path = self.path(key)
        if path:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            encrypted.write_object(path, entry, self._data_key(key, window), _aad(key))

    def shred(self, key: str) -> list[str]:
        """Destroys ``key``'s teachers: the data key first (everywhere it is kept), then the
        file and the memory copy. Returns the deleted paths."""
        self._mem.pop(key, None)
        self._keys.pop(key, None)
        _MEMORY.pop(key, None)
        if self.ledger is not None:
            with self._db() as db:
                db.q("DELETE FROM bagging_teacher_keys WHERE cache_key = ?", (key,))
        path = self.path(key)
        return self._remove(path, path and path[:-len(SUFFIX)] + _LEGACY_SUFFIX)

    def _retired(self, stream: str, blocks: Sequence[str]) -> bool:
        """Whether a block of the window is retired in every context of its stream."""
        try:
            contexts = self.ledger.stream(stream).contexts
            return any(all(not self.ledger.block(stream, b, c).active for c in contexts)
                       for b in blocks)
        except (UnknownBlockError, UnknownStreamError, PermissionDeniedError):
            return False   # not this ledger's window, or not ours to judge: kept

    def shred_retired(self) -> list[str]:
        """Shreds the teachers of every window (of this ledger) with a block retired in every
        context; returns their cache keys."""
        if self.ledger is None:
            return []
        with self._db() as db:
            rows = db.q("SELECT cache_key, stream, blocks FROM bagging_teacher_keys").fetchall()
        done = [key for key, stream, blocks in rows if self._retired(stream, json.loads(blocks))]
        for key in done:
            self.shred(key)
        return done

    def get_or_train(self, key: str, train: Callable[[], TeacherEnsemble], *,
                     window: Optional[tuple[str, Sequence[str]]] = None) -> TeacherEnsemble:
        """The cached teachers of ``key``, or ``train()``'s, cached (``trained`` counts calls).

        ``window`` = (stream, block ids) the teachers were trained on: recorded with the key, so
        they are shredded once the window's blocks retire (then, after this lookup)."""
        with self._lock:
            entry = self._load(key)
            if entry is None:
                entry = {"ensemble": train()}
                self.trained += 1
                self._store(key, entry, window or ("", ()))
            self.shred_retired()
            return entry["ensemble"]
