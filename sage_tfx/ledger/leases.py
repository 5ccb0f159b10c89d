"""Leases and counters in the ledger's database: state that guards budget, shared by processes.

A **lease** is an exclusive, expiring claim on a name ("ptk/window", "pyramid/<store>"): the
holder must renew it before ``ttl`` seconds pass. A counter hands out disjoint ranges
atomically (a teacher cache's cursor: two processes never label the same points). Both live in
the ledger's database, so they hold across processes and machines on PostgreSQL as on SQLite.
Admin and pipeline principals use them; names under ``sage/`` are the ledger's own (admins).

**A dead holder** (kill -9, a lost pod) must not block the others for a whole ``ttl``:

* on the same machine it is seen at once: a holder id from :func:`new_holder` names its process
  (boot id, PID namespace, pid and the process's start time), and a contender on the same boot
  and PID namespace takes the lease over when that process no longer exists (``kill(pid, 0)``
  says so, or ``/proc`` shows a zombie or a later process under the reused pid);
* anywhere, with ``heartbeat``: :meth:`LeaseMixin.lease` then keeps the lease's expiry only
  ``heartbeat`` seconds ahead, renewed from a background thread on its own connection while
  the holder lives, so a holder that vanished loses it within ``heartbeat`` seconds. ``ttl``
  stays the holder's progress deadline: a live holder that has not called :meth:`Lease.renew`
  for ``ttl`` seconds stops beating, and loses the lease like a dead one.

A takeover is safe because the lease does not guard budget by itself: every charge is
idempotent by run id and every noisy output is released once (:mod:`~sage_tfx.ledger.releases`),
so a holder that was wrongly presumed dead and carries on publishes nothing twice; its next
:meth:`Lease.renew` raises :class:`~sage_tfx.errors.LeaseTimeoutError` (renewal never takes
back a lease someone else held meanwhile).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import threading
import time
import uuid
from typing import Iterator, Optional

from sage_tfx.errors import InvalidRequestError, LeaseTimeoutError
from sage_tfx.ledger.values import now

_POLL = 0.05
_PROC_MARK = " proc="
_log = logging.getLogger(__name__)


RESERVED_PREFIX = "sage/"  # the ledger's own leases (key maintenance): admins only


def _check_name(ledger, name) -> str:
    """Returns ``name`` once the caller may hold it: any admin or pipeline principal for a
    system's name, an admin for the ledger's own (``sage/...``)."""
    from sage_tfx.ledger import access
    if not isinstance(name, str) or not 0 < len(name) <= 256:
        raise InvalidRequestError(f"a lease or counter name must be 1-256 characters, got {name!r}")
    ledger.authorize(access.CONFIGURE if name.startswith(RESERVED_PREFIX) else access.COORDINATE)
    return name


def _check_seconds(what: str, value) -> float:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 < value < 86400 * 7):
        raise InvalidRequestError(f"lease {what} must be in (0, 7 days) seconds, got {value!r}")
    return float(value)


def _start_ticks(pid: int) -> Optional[tuple[str, str]]:
    """(state, start time in clock ticks since boot) of process ``pid`` from ``/proc``, or None
    when it cannot be read (no such process, no ``/proc``, or ``hidepid``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (fields[0], fields[19]) if len(fields) > 19 else None


def process_identity(pid: Optional[int] = None) -> Optional[str]:
    """``boot id/PID namespace/pid/start ticks`` of a process (default: this one), or None where
    Linux's ``/proc`` does not tell them."""
    pid = os.getpid() if pid is None else pid
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    got = _start_ticks(pid)
    return None if got is None or not boot else f"{boot}/{pidns}/{pid}/{got[1]}"


def new_holder() -> str:
    """A holder id unique to this process and call (host, pid, random), naming the process's
    identity (:func:`process_identity`) where it is known, so that contenders on this machine
    see when the process is gone."""
    base = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    ident = process_identity()
    return base if ident is None else f"{base}{_PROC_MARK}{ident}"


def holder_is_dead(holder: str) -> bool:
    """True only when ``holder`` names a process of this machine's boot and PID namespace that
    no longer runs; False when it runs, or when that cannot be told here (another machine or
    container, a holder id without a process identity)."""
    ident = holder.partition(_PROC_MARK)[2] if isinstance(holder, str) else ""
    mine = process_identity()
    parts = ident.split("/")
    if mine is None or len(parts) != 4 or parts[:2] != mine.split("/")[:2]:
        return False
    try:
        pid = int(parts[2])
    except ValueError:
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.ESRCH  # EPERM: it runs, as another user
    got = _start_ticks(pid)
    if got is None:
        return False  # it runs, and /proc hides it (hidepid): cannot tell a reused pid
    state, start = got
    return state == "Z" or start != parts[3]  # exited (not reaped), or the pid was reused


def _db_time(st) -> float:
    """Seconds since the epoch on the database's clock (PostgreSQL) or this machine's (SQLite,
    always local): leases held from several machines compare times on one clock."""
    if st.kind == "postgresql":
        return float(st.q("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])
    return time.time()


def _renew(st, name: str, holder: str, ttl: float) -> bool:
    """Extends ``holder``'s lease ``name`` to ``ttl`` seconds from now; False (nothing written)
    if it no longer holds it. Never takes a lease back: a row another holder replaced, or
    released, stays as it is."""
    def txn() -> bool:
        cur = st.q("UPDATE leases SET expires_at = ? WHERE name = ? AND holder = ?",
                   (_db_time(st) + ttl, name, holder))
        return cur.rowcount > 0

    return st.write(txn)


class Lease:
    """A held lease; :meth:`renew` before ``ttl`` passes, or lose it.

    With ``heartbeat`` (seconds), a background thread on a connection of its own keeps the
    lease's expiry ``heartbeat`` seconds ahead while this process lives and has renewed within
    ``ttl`` (see the module docstring); :meth:`stop` ends it.
    """

    def __init__(self, ledger, name: str, holder: str, ttl: float,
                 heartbeat: Optional[float] = None):
        self.ledger, self.name, self.holder, self.ttl = ledger, name, holder, ttl
        self.heartbeat = heartbeat
        self._progress = time.monotonic()
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if heartbeat is not None:
            self._thread = threading.Thread(target=self._beat, daemon=True,
                                            name=f"lease heartbeat {name}")
            self._thread.start()

    def renew(self) -> None:
        """Extends the lease (by ``ttl``, or with a heartbeat by ``heartbeat`` and restarts the
        ``ttl`` progress deadline).

        Raises:
          LeaseTimeoutError: the lease expired and another holder took it.
        """
        if self._lost.is_set() or not self.ledger.renew_lease(self.name, self.holder,
                                                              self.heartbeat or self.ttl):
            self._lost.set()
            raise LeaseTimeoutError(f"lease {self.name!r} was lost to another holder")
        self._progress = time.monotonic()

    def stop(self) -> None:
        """Stops the heartbeat (waits for a renewal under way, so none lands after this)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        from sage_tfx.ledger.store import Store
        try:
            st = Store(self.ledger._store.url)  # this thread's own connection
        except Exception as exc:  # the lease then lives on the holder's own renewals
            _log.warning("lease %r: no heartbeat connection (%s)", self.name, type(exc).__name__)
            return
        try:
            while not self._stop.wait(self.heartbeat / 3):
                if time.monotonic() - self._progress > self.ttl:
                    return  # no progress for ttl: let the lease lapse as a dead holder's does
                try:
                    if not _renew(st, self.name, self.holder, self.heartbeat):
                        self._lost.set()
                        return
                except Exception as exc:  # the database is unreachable: retry next beat
                    _log.warning("lease %r: heartbeat failed (%s)", self.name,
                                 type(exc).__name__)
        finally:
            st.close()


class LeaseMixin:
    """Leases and counters of :class:`~sage_tfx.ledger.core.Ledger` (needs ``self._store``)."""

    def acquire_lease(self, name: str, holder: str, ttl: float) -> bool:
        """Takes or renews the lease ``name`` for ``holder`` for ``ttl`` seconds.

        Returns False (changing nothing) while another holder's lease has not expired and that
        holder is not known to be dead (:func:`holder_is_dead`).
        """
        _check_name(self, name)
        ttl = _check_seconds("ttl", ttl)
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
                if not holder_is_dead(row[0]):
                    return False
                _log.warning("lease %r: its holder %s is no longer running; taken over",
                             name, row[0])
            st.q("UPDATE leases SET holder = ?, expires_at = ?, acquired_at = ? WHERE name = ?",
                 (holder, t + ttl, now(), name))
            return True

        return st.write(txn)

    def renew_lease(self, name: str, holder: str, ttl: float) -> bool:
        """Extends ``holder``'s lease ``name`` to ``ttl`` seconds from now; False (changing
        nothing) if it no longer holds it (never takes a lease back)."""
        _check_name(self, name)
        return _renew(self._store, name, holder, _check_seconds("ttl", ttl))

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
    def lease(self, name: str, *, ttl: float = 60.0, wait: float = 120.0,
              heartbeat: Optional[float] = None) -> Iterator[Lease]:
        """Holds ``name`` exclusively for the ``with`` body (waiting up to ``wait`` seconds).

        ``heartbeat`` (seconds, at most ``ttl``): keep the lease alive from a background thread
        so that it lapses ``heartbeat`` seconds after this process dies (or after ``ttl``
        seconds without :meth:`Lease.renew`), not ``ttl`` seconds after it was last renewed.

        Raises:
          LeaseTimeoutError: another holder kept it for ``wait`` seconds.
        """
        ttl = _check_seconds("ttl", ttl)
        if heartbeat is not None and _check_seconds("heartbeat", heartbeat) > ttl:
            raise InvalidRequestError(f"lease heartbeat {heartbeat} s exceeds its ttl {ttl} s")
        holder = new_holder()
        deadline = time.monotonic() + wait
        while not self.acquire_lease(name, holder, heartbeat or ttl):
            if time.monotonic() >= deadline:
                raise LeaseTimeoutError(
                    f"lease {name!r} is held by {self.lease_holder(name) or 'another process'}; "
                    f"waited {wait:g} s")
            time.sleep(_POLL)
        held = Lease(self, name, holder, ttl, heartbeat)
        try:
            yield held
        finally:
            held.stop()
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
