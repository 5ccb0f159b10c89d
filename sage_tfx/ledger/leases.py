"""Leases and counters in the ledger's database: state that guards budget, shared by processes.

A **lease** is an exclusive, expiring claim on a name ("ptk/window", "pyramid/<store>"): the
holder must renew it before ``ttl`` seconds pass, and a holder that dies (kill -9, a lost pod)
loses it when it expires, so nobody waits for ever. A **counter** hands out disjoint ranges
atomically (a teacher cache's cursor: two processes never label the same points). Both live in
the ledger's database, so they hold across processes and machines on PostgreSQL as on SQLite.
Admin and pipeline principals use them; names under ``sage/`` are the ledger's own (admins).
"""
from __future__ import annotations

import contextlib
import os
import socket
import time
import uuid
from typing import Iterator, Optional

from sage_tfx.errors import InvalidRequestError, LeaseTimeoutError
from sage_tfx.ledger.values import now

_POLL = 0.05


RESERVED_PREFIX = "sage/"  # the ledger's own leases (key maintenance): admins only


def _check_name(ledger, name) -> str:
    """Returns ``name`` once the caller may hold it: any admin or pipeline principal for a
    system's name, an admin for the ledger's own (``sage/...``)."""
    from sage_tfx.ledger import access
    if not isinstance(name, str) or not 0 < len(name) <= 256:
        raise InvalidRequestError(f"a lease or counter name must be 1-256 characters, got {name!r}")
    ledger.authorize(access.CONFIGURE if name.startswith(RESERVED_PREFIX) else access.COORDINATE)
    return name


def new_holder() -> str:
    """A holder id unique to this process and call (host, pid, random)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class Lease:
    """A held lease; :meth:`renew` before ``ttl`` passes, or lose it."""

    def __init__(self, ledger, name: str, holder: str, ttl: float):
        self.ledger, self.name, self.holder, self.ttl = ledger, name, holder, ttl

    def renew(self) -> None:
        """Extends the lease by ``ttl``.

        Raises:
          LeaseTimeoutError: the lease expired and another holder took it.
        """
        if not self.ledger.acquire_lease(self.name, self.holder, self.ttl):
            raise LeaseTimeoutError(f"lease {self.name!r} was lost to another holder")


def _db_time(st) -> float:
    """Seconds since the epoch on the database's clock (PostgreSQL) or this machine's (SQLite,
    always local): leases held from several machines compare times on one clock."""
    if st.kind == "postgresql":
        return float(st.q("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])
    return time.time()


class LeaseMixin:
    """Leases and counters of :class:`~sage_tfx.ledger.core.Ledger` (needs ``self._store``)."""

    def acquire_lease(self, name: str, holder: str, ttl: float) -> bool:
        """Takes or renews the lease ``name`` for ``holder`` for ``ttl`` seconds.

        Returns False (changing nothing) while another holder's lease has not expired.
        """
        _check_name(self, name)
        if not (isinstance(ttl, (int, float)) and 0 < ttl < 86400 * 7):
            raise InvalidRequestError(f"lease ttl must be in (0, 7 days) seconds, got {ttl!r}")
        st = self._store
        lock = " FOR UPDATE" if st.kind == "postgresql" else ""

        def txn() -> bool:
            t = _db_time(st)
            row = st.q("SELECT holder, expires_at FROM leases WHERE name = ?" + lock,
                       (name,)).fetchone()
            if row is None:
                st.q("INSERT INTO leases (name, holder, expires_at, acquired_at) VALUES (?,?,?,?)",
                     (name, holder, t + ttl, now()))
                return True
            if row[0] != holder and row[1] > t:
                return False
            st.q("UPDATE leases SET holder = ?, expires_at = ?, acquired_at = ? WHERE name = ?",
                 (holder, t + ttl, now(), name))
            return True

        return st.write(txn)

    def release_lease(self, name: str, holder: str) -> None:
        """Gives the lease up if ``holder`` still holds it."""
        _check_name(self, name)
        st = self._store
        st.write(lambda: st.q("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder)))

    def lease_holder(self, name: str) -> Optional[str]:
        """The current (unexpired) holder of ``name``, or None."""
        _check_name(self, name)
        st = self._store
        row, t = st.read(lambda: (st.q("SELECT holder, expires_at FROM leases WHERE name = ?",
                                       (name,)).fetchone(), _db_time(st)))
        return row[0] if row is not None and row[1] > t else None

    @contextlib.contextmanager
    def lease(self, name: str, *, ttl: float = 60.0, wait: float = 120.0) -> Iterator[Lease]:
        """Holds ``name`` exclusively for the ``with`` body (waiting up to ``wait`` seconds).

        Raises:
          LeaseTimeoutError: another holder kept it for ``wait`` seconds.
        """
        holder = new_holder()
        deadline = time.monotonic() + wait
        while not self.acquire_lease(name, holder, ttl):
            if time.monotonic() >= deadline:
                raise LeaseTimeoutError(
                    f"lease {name!r} is held by {self.lease_holder(name) or 'another process'}; "
                    f"waited {wait:g} s")
            time.sleep(_POLL)
        try:
            yield Lease(self, name, holder, ttl)
        finally:
            self.release_lease(name, holder)

    def next_range(self, name: str, count: int) -> int:
        """Atomically advances counter ``name`` by ``count``; returns where the range starts."""
        _check_name(self, name)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidRequestError(f"count must be an integer >= 0, got {count!r}")
        st = self._store
        lock = " FOR UPDATE" if st.kind == "postgresql" else ""

        def txn() -> int:
            row = st.q("SELECT value FROM counters WHERE name = ?" + lock, (name,)).fetchone()
            if row is None:
                st.q("INSERT INTO counters (name, value) VALUES (?, ?)", (name, count))
                return 0
            st.q("UPDATE counters SET value = ? WHERE name = ?", (row[0] + count, name))
            return row[0]

        return st.write(txn)

    def counter(self, name: str) -> int:
        """The counter's current value (0 if never advanced)."""
        _check_name(self, name)
        row = self._store.read(lambda: self._store.q(
            "SELECT value FROM counters WHERE name = ?", (name,)).fetchone())
        return row[0] if row is not None else 0
