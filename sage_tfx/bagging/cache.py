"""Teachers cached per window, so the adaptive loop can buy more labels without retraining.

Teachers depend on the window's private data, the partition (k, n, salt), the teacher type and
its settings; the cache key is all of them. Each later purchase is a new set of queries to the
same teachers and is charged again on the ledger (the ledger composes the charges). Which public
points a purchase labels is not the cache's business: the public cursor is a counter in the
ledger's database (``sage_tfx.bagging.purchase``), atomic across threads and processes.
The cache lives in memory, and on disk (pickle) when given a directory that only the
component's own process can read: cached teachers are private, like the data. Two processes
that miss at once both train (teachers are a deterministic function of the window) and each
replaces the file atomically from its own temporary file.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
import threading
from typing import Callable, Optional

from sage_tfx.bagging.teachers import TeacherEnsemble

__all__ = ["TeacherCache", "cache_key"]


def cache_key(*, stream: str, blocks, k: int, n: int, salt: bytes, kind: str,
              settings: dict) -> str:
    """Stable key of one window's teachers."""
    payload = json.dumps({"stream": stream, "blocks": sorted(blocks), "k": k, "n": n,
                          "salt": hashlib.sha256(salt).hexdigest(), "kind": kind,
                          "settings": settings}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


class TeacherCache:
    """A window's teachers by :func:`cache_key`: in memory, and pickled under ``directory``
    (private to the component's process) when one is given."""

    def __init__(self, directory: Optional[str] = None):
        self.directory = directory
        self._mem: dict[str, dict] = {}
        self._lock = threading.Lock()
        self.trained = 0   # how many times a train function actually ran

    def _path(self, key):
        return os.path.join(self.directory, f"teachers-{key}.pkl") if self.directory else None

    def _load(self, key) -> Optional[dict]:
        if key in self._mem:
            return self._mem[key]
        path = self._path(key)
        if path and os.path.exists(path):
            with open(path, "rb") as f:
                self._mem[key] = pickle.load(f)
            return self._mem[key]
        return None

    def _store(self, key, entry):
        self._mem[key] = entry
        path = self._path(key)
        if path:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".teachers-{key}-", suffix=".tmp",
                                       dir=self.directory)
            try:
                with os.fdopen(fd, "wb") as f:   # mkstemp: mode 0600, a name no other writer has
                    pickle.dump(entry, f)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.remove(tmp)
                raise

    def get_or_train(self, key: str, train: Callable[[], TeacherEnsemble]) -> TeacherEnsemble:
        """The cached teachers of ``key``, or ``train()``'s, cached (``trained`` counts calls)."""
        with self._lock:
            entry = self._load(key)
            if entry is None:
                entry = {"ensemble": train()}
                self.trained += 1
                self._store(key, entry)
            return entry["ensemble"]
