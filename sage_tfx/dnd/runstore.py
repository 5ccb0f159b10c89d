"""A served Draw-and-Discard run's state in the ledger's database: instances, passes, tickets.

The k instances, every client's passes and the outstanding tickets live in the system-owned
``dnd_*`` tables of the ledger's database (SQLite embedded, PostgreSQL shared), written through
this module's own connection (a :class:`sage_tfx.ledger.store.Store`: its write transactions,
retries and durability). So a server restarted with the same run id resumes exactly where it
stopped (same grant, same instances, same pass counts), and several server processes (uvicorn
workers, machines on one PostgreSQL ledger) serve one run:

* ``dnd_runs`` — one row per grant: the run's settings (a restart with other settings is
  refused), the instance version counter, accepted / rejected counts, and when it was released;
* ``dnd_instances`` — the k current instances (little-endian float64), each with the version at
  which it was written (0: initial);
* ``dnd_versions`` — one row per accepted update: its version, the slot it overwrote and its
  SHA-256 (never the weights, never who sent it): every accepted update is in exactly one
  version, and versions count 1, 2, … without a gap;
* ``dnd_passes`` — updates returned and draws made per authenticated principal;
* ``dnd_tickets`` — outstanding draws by SHA-256 of the ticket, the principal that drew it and
  its expiry time (a ticket abandoned by its client expires after ``ttl`` seconds and no longer
  holds one of its passes);
* ``dnd_drawn`` — per outstanding ticket, the slot and version of the instance it drew, and
  ``dnd_retired`` — an overwritten instance's weights while an outstanding ticket drew it: the
  server measures a returned update's step from the instance it was drawn from
  (:meth:`RunStore.drawn_instance`). Both go with their tickets;
* ``dnd_rate`` — draws per principal in the current rate window (a per-client rate limit shared
  by every server process on the database).

A returned update is one unit: the ticket is consumed, the principal's pass counted and,
if the spam check accepted it, one uniformly drawn instance overwritten with the next version —
all or nothing. Times are the database's clock on PostgreSQL, this machine's on SQLite.

Draws and returned updates are written by group commit (:mod:`sage_tfx.dnd.groupcommit`): many
in one transaction and one fsync, each answered only once its own write is durable.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import secrets
import threading
import time
from typing import Callable, Optional, Sequence

import numpy as np

from sage_tfx.dnd.budget import UpdateRefused
from sage_tfx.dnd.groupcommit import GroupCommit
from sage_tfx.dnd.runtables import (MAX_TTL, RateLimit, RateLimitedError, RunReleasedError,
                                    UnknownTicketError, _tables)
from sage_tfx.errors import InvalidRequestError, SageError
from sage_tfx.ledger import secrets as ledger_secrets
from sage_tfx.ledger.store import Store
from sage_tfx.ledger.values import now

def encode(weights: np.ndarray) -> bytes:
    """Weights as little-endian float64 bytes (the wire and storage format)."""
    return np.ascontiguousarray(weights, dtype="<f8").tobytes()


def decode(body: bytes, dim: int) -> np.ndarray:
    """``dim`` float64 weights from their little-endian bytes. Raises ValueError."""
    if len(body) != 8 * dim:
        raise ValueError(f"expected {8 * dim} bytes ({dim} float64 weights), got {len(body)}")
    return np.frombuffer(bytes(body), dtype="<f8").astype(np.float64)


def check_ticket_ttl(ttl) -> float:
    """``ttl`` if it is a number of seconds in (0, one day]. Raises InvalidRequestError."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= MAX_TTL:
        raise InvalidRequestError(f"the ticket ttl must be in (0, {MAX_TTL:g}] seconds, got "
                                  f"{ttl!r}")
    return float(ttl)


def ticket_digest(ticket: str) -> str:
    """SHA-256 hex digest of a ticket (tickets are stored only as digests)."""
    return hashlib.sha256(ticket.encode("utf-8")).hexdigest()


@dataclasses.dataclass(frozen=True)
class RunRow:
    """A run's row: its settings, instance version and counters."""

    grant_id: str
    run_id: str
    settings: dict
    k: int
    dim: int
    passes: int
    version: int
    accepted: int
    rejected: int
    released_at: Optional[str]


_RUN_COLS = ("SELECT grant_id, run_id, settings, k, dim, passes, version, accepted, rejected, "
             "released_at FROM dnd_runs WHERE grant_id = ?")


def _run_row(r) -> RunRow:
    return RunRow(r[0], r[1], json.loads(r[2]), *r[3:10])


class RunStore:
    """The ``dnd_*`` tables of one ledger database, through one connection (thread-safe).

    Args:
      url: the ledger's URL (``sqlite:///…``, ``postgresql://…`` or an ``env:`` / ``file:``
        reference to one).
    """

    def __init__(self, url: str):
        self._st = Store(ledger_secrets.resolve(url))
        self._lock = threading.Lock()  # the write connection (held by the committer)
        self._reader: Optional[Store] = None  # reads do not wait for a batch's commit and fsync
        self._rlock = threading.Lock()
        self._rng = secrets.SystemRandom()
        self._local = threading.local()  # the read connection while this thread reads
        self._group = GroupCommit(self._st, self._lock, self._q,
                                  (UnknownTicketError, UpdateRefused, SageError))
        st = self._st

        def create():
            if st.kind == "postgresql":  # concurrent CREATE TABLE IF NOT EXISTS may collide
                st.q("SELECT pg_advisory_xact_lock(727273)")
            for stmt in _tables(st.backend):
                st.q(stmt)
        self._write(create)

    @property
    def commits(self) -> int:
        """Group-commit transactions of draws and updates this store committed."""
        return self._group.commits

    @property
    def kind(self) -> str:
        """The database kind (``sqlite`` or ``postgresql``)."""
        return self._st.kind

    def close(self) -> None:
        """Closes the database connection."""
        with self._lock:
            self._st.close()
        with self._rlock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

    def _write(self, fn: Callable):
        with self._lock:
            return self._st.write(fn)

    def _read(self, fn: Callable):
        with self._rlock:
            if self._reader is None:
                self._reader = Store(self._st.url)
            self._local.st = self._reader
            try:
                return self._reader.read(fn)
            finally:
                self._local.st = None

    def _q(self, sql: str, params: Sequence = ()):
        return (getattr(self._local, "st", None) or self._st).q(sql, params)

    def _time(self) -> float:
        if self._st.kind == "postgresql":
            return float(self._q("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])
        return time.time()

    @property
    def _for_update(self) -> str:
        return " FOR UPDATE" if self._st.kind == "postgresql" else ""

    # -- runs --

    def open_run(self, *, grant_id: str, stream: str, run_id: str, settings: dict, k: int,
                 dim: int, passes: int, initial: Callable[[], np.ndarray]) -> tuple[RunRow, bool]:
        """The run of ``grant_id``: created with ``initial()`` (k, dim) instances if new.

        Returns (its row, whether this call created it). A run that exists must have been
        created with the same settings, k, dim and passes.

        Raises:
          InvalidRequestError: the run exists with other settings (the server was restarted
            with other parameters under the same run id).
        """
        settings_json = json.dumps(settings, sort_keys=True)
        existing = self.run(grant_id)
        if existing is None:
            inst = np.asarray(initial(), dtype=np.float64)
            if inst.shape != (k, dim) or not np.all(np.isfinite(inst)):
                raise InvalidRequestError(f"initial instances must be {k} x {dim} finite numbers")

            def create() -> bool:
                if self._q("SELECT 1 FROM dnd_runs WHERE grant_id = ?" + self._for_update,
                           (grant_id,)).fetchone() is not None:
                    return False  # another process created it first: use theirs
                self._q("INSERT INTO dnd_runs (grant_id, stream, run_id, settings, k, dim, passes, "
                        "version, accepted, rejected, released_at, created_at) VALUES "
                        "(?,?,?,?,?,?,?,0,0,0,NULL,?)",
                        (grant_id, stream, run_id, settings_json, k, dim, passes, now()))
                self._st.many("INSERT INTO dnd_instances (grant_id, slot, version, weights) "
                              "VALUES (?,?,0,?)",
                              [(grant_id, s, encode(inst[s])) for s in range(k)])
                return True
            created = self._write(create)
            existing = self.run(grant_id)
        else:
            created = False
        mine = (json.loads(settings_json), k, dim, passes)
        theirs = (existing.settings, existing.k, existing.dim, existing.passes)
        if mine != theirs:
            raise InvalidRequestError(
                f"run {run_id!r} (grant {grant_id}) is served with settings {theirs[0]}, "
                f"k={theirs[1]}, "
                f"{theirs[2]} weights, passes={theirs[3]}; a restart must use the same ones "
                "(a new run needs a new run id)")
        return existing, created

    def run(self, grant_id: str) -> Optional[RunRow]:
        """The stored run of ``grant_id``, or None."""
        row = self._read(lambda: self._q(_RUN_COLS, (grant_id,)).fetchone())
        return _run_row(row) if row is not None else None

    def runs(self) -> list[RunRow]:
        """Every served run of this database, oldest first."""
        rows = self._read(lambda: self._q(_RUN_COLS.replace("WHERE grant_id = ?", "ORDER BY "
                                                            "created_at")).fetchall())
        return [_run_row(r) for r in rows]

    def close_run(self, grant_id: str) -> None:
        """Marks the run released: from now on no draw or update is accepted."""
        def txn():
            self._q("UPDATE dnd_runs SET released_at = ? WHERE grant_id = ? AND released_at IS "
                    "NULL", (now(), grant_id))
        self._write(txn)

    # -- draws and updates --

    def issue_ticket(self, grant_id: str, principal: str, blocks: Sequence[str], *, passes: int,
                     ttl: float, drawn: Optional[tuple[int, int, np.ndarray]] = None,
                     rate: Optional[RateLimit] = None) -> str:
        """A new ticket for one update of ``principal`` (whose data lies in ``blocks``),
        expiring in ``ttl`` seconds.

        ``drawn`` = (slot, version, weights) of the instance handed out: recorded with the ticket
        (the weights are stored only if that version was overwritten meanwhile). ``rate``: the
        principal's draws are counted in the current window and refused beyond the limit.

        Raises:
          RateLimitedError: the principal drew ``rate.draws`` times in this window (nothing
            changed).
          UpdateRefused: the principal has used its passes, or holds unexpired tickets for all
            of the passes it has left.
          RunReleasedError: the run was released.
        """
        check_ticket_ttl(ttl)
        ticket = secrets.token_hex(16)
        digest = ticket_digest(ticket)

        def txn() -> None:
            t = self._time()
            run = self._q("SELECT released_at FROM dnd_runs WHERE grant_id = ?",
                          (grant_id,)).fetchone()
            if run is None:
                raise InvalidRequestError(f"no served run for grant {grant_id}")
            if run[0] is not None:
                raise RunReleasedError(f"the run's model was released at {run[0]}: it takes "
                                       "no more updates")
            self._q("INSERT INTO dnd_passes (grant_id, principal, used, draws) VALUES (?,?,0,0) "
                    "ON CONFLICT (grant_id, principal) DO NOTHING", (grant_id, principal))
            used = self._q("SELECT used FROM dnd_passes WHERE grant_id = ? AND principal = ?"
                           + self._for_update, (grant_id, principal)).fetchone()[0]
            if self._q("DELETE FROM dnd_tickets WHERE grant_id = ? AND principal = ? AND "
                       "expires_at <= ?", (grant_id, principal, t)).rowcount:
                self._drop_orphans(grant_id)
            held = self._q("SELECT count(*) FROM dnd_tickets WHERE grant_id = ? AND "
                           "principal = ?", (grant_id, principal)).fetchone()[0]
            if used >= passes:
                raise UpdateRefused(f"client {principal!r} has used its {passes} update(s) of "
                                    "this run")
            if used + held >= passes:
                raise UpdateRefused(
                    f"client {principal!r} holds {held} unexpired draw(s) for the {passes - used} "
                    f"update(s) it has left: return one, or wait until it expires ({ttl:g} s "
                    "after its draw)")
            if rate is not None:
                self._count_rate(grant_id, principal, rate, t)
            self._q("INSERT INTO dnd_tickets (grant_id, ticket_sha256, principal, blocks, "
                    "issued_at, expires_at) VALUES (?,?,?,?,?,?)",
                    (grant_id, digest, principal, json.dumps(list(blocks)), t, t + ttl))
            if drawn is not None:
                self._record_drawn(grant_id, digest, *drawn)
            self._q("UPDATE dnd_passes SET draws = draws + 1 WHERE grant_id = ? AND "
                    "principal = ?", (grant_id, principal))

        self._group.run(txn)
        return ticket

    def _count_rate(self, grant_id: str, principal: str, rate: RateLimit, t: float) -> None:
        start = (t // rate.seconds) * rate.seconds
        self._q("INSERT INTO dnd_rate (grant_id, principal, window_start, draws) VALUES "
                "(?,?,?,0) ON CONFLICT (grant_id, principal) DO NOTHING",
                (grant_id, principal, start))
        window, draws = self._q("SELECT window_start, draws FROM dnd_rate WHERE grant_id = ? AND "
                                "principal = ?" + self._for_update,
                                (grant_id, principal)).fetchone()
        if window < start:
            window, draws = start, 0
        if draws >= rate.draws:
            raise RateLimitedError(
                f"client {principal!r} drew {draws} update(s) in this {rate.seconds:g} s window, "
                f"the limit is {rate.draws}", retry_after=max(window + rate.seconds - t, 0.0))
        self._q("UPDATE dnd_rate SET window_start = ?, draws = ? WHERE grant_id = ? AND "
                "principal = ?", (window, draws + 1, grant_id, principal))

    def _record_drawn(self, grant_id: str, digest: str, slot: int, version: int,
                      weights: np.ndarray) -> None:
        self._q("INSERT INTO dnd_drawn (grant_id, ticket_sha256, slot, version) VALUES (?,?,?,?)",
                (grant_id, digest, int(slot), int(version)))
        # The instance row's lock orders this against an overwrite (:meth:`_retire` takes it too):
        # either the overwrite sees this record and keeps the weights, or this sees the new
        # version and keeps the weights the mirror handed out.
        row = self._q("SELECT version FROM dnd_instances WHERE grant_id = ? AND slot = ?"
                      + self._for_update, (grant_id, int(slot))).fetchone()
        if row is not None and int(row[0]) != int(version):  # overwritten since the mirror's sync
            self._q("INSERT INTO dnd_retired (grant_id, slot, version, weights) VALUES (?,?,?,?) "
                    "ON CONFLICT (grant_id, slot, version) DO NOTHING",
                    (grant_id, int(slot), int(version), encode(weights)))

    def drawn_instance(self, grant_id: str, principal: str, ticket: str, dim: int,
                       known: Optional[Callable[[int, int], Optional[np.ndarray]]] = None
                       ) -> Optional[np.ndarray]:
        """The instance an outstanding ticket of ``principal`` drew, or None if the ticket has no
        record (issued by a server from before draws were recorded).

        ``known(slot, version)`` may return that instance from memory (a version's weights never
        change): then only the ticket's small record is read, not the weights."""
        digest = ticket_digest(ticket)

        def read():
            row = self._q("SELECT d.slot, d.version FROM dnd_drawn d JOIN dnd_tickets t ON "
                          "t.grant_id = d.grant_id AND t.ticket_sha256 = d.ticket_sha256 WHERE "
                          "d.grant_id = ? AND d.ticket_sha256 = ? AND t.principal = ?",
                          (grant_id, digest, principal)).fetchone()
            if row is None:
                return None
            cached = known(int(row[0]), int(row[1])) if known is not None else None
            if cached is not None:
                return cached
            w = self._q("SELECT weights FROM dnd_instances WHERE grant_id = ? AND slot = ? AND "
                        "version = ?", (grant_id, row[0], row[1])).fetchone()
            if w is None:
                w = self._q("SELECT weights FROM dnd_retired WHERE grant_id = ? AND slot = ? "
                            "AND version = ?", (grant_id, row[0], row[1])).fetchone()
            return None if w is None else w[0]
        data = self._read(read)
        if data is None or isinstance(data, np.ndarray):
            return data
        return decode(data, dim)

    def ticket_blocks(self, grant_id: str, principal: str, ticket: str) -> list[str]:
        """The blocks of an outstanding, unexpired ticket drawn by ``principal``.

        Raises:
          UnknownTicketError: no such ticket.
        """
        row = self._read(lambda: self._q(
            "SELECT blocks FROM dnd_tickets WHERE grant_id = ? AND ticket_sha256 = ? AND "
            "principal = ? AND expires_at > ?",
            (grant_id, ticket_digest(ticket), principal, self._time())).fetchone())
        if row is None:
            raise UnknownTicketError(ticket)
        return json.loads(row[0])

    def return_update(self, grant_id: str, principal: str, ticket: str, update: np.ndarray, *,
                      accepted: bool, passes: int) -> Optional[tuple[int, int]]:
        """Consumes the ticket, counts the pass and, if ``accepted``, overwrites one instance
        drawn uniformly (CSPRNG) with ``update`` at the next version — in one transaction.

        Returns (slot, version) of the overwritten instance, or None for a rejected update.

        Raises:
          UnknownTicketError: the ticket is unknown, used, expired or another principal's.
          UpdateRefused: the principal has no pass left (nothing changed).
          RunReleasedError: the run was released meanwhile (nothing changed).
        """
        data = encode(update)
        digest = hashlib.sha256(data).hexdigest()

        def txn():
            t = self._time()
            gone = self._q("DELETE FROM dnd_tickets WHERE grant_id = ? AND ticket_sha256 = ? AND "
                           "principal = ? AND expires_at > ?",
                           (grant_id, ticket_digest(ticket), principal, t)).rowcount
            if gone != 1:
                raise UnknownTicketError(ticket)
            counted = self._q("UPDATE dnd_passes SET used = used + 1 WHERE grant_id = ? AND "
                              "principal = ? AND used < ?", (grant_id, principal, passes)).rowcount
            if counted != 1:
                raise UpdateRefused(f"client {principal!r} has used its {passes} update(s)")
            run = self._q("SELECT version, k, released_at FROM dnd_runs WHERE grant_id = ?"
                          + self._for_update, (grant_id,)).fetchone()
            if run[2] is not None:
                raise RunReleasedError(f"the run's model was released at {run[2]}")
            if not accepted:
                self._forget_drawn(grant_id, ticket_digest(ticket))
                self._q("UPDATE dnd_runs SET rejected = rejected + 1 WHERE grant_id = ?",
                        (grant_id,))
                return None
            self._forget_drawn(grant_id, ticket_digest(ticket))
            version, slot = run[0] + 1, self._rng.randrange(run[1])
            self._retire(grant_id, slot)
            self._q("UPDATE dnd_instances SET version = ?, weights = ? WHERE grant_id = ? AND "
                    "slot = ?", (version, data, grant_id, slot))
            self._q("INSERT INTO dnd_versions (grant_id, version, slot, digest, created_at) "
                    "VALUES (?,?,?,?,?)", (grant_id, version, slot, digest, now()))
            self._q("UPDATE dnd_runs SET version = ?, accepted = accepted + 1 WHERE grant_id = ?",
                    (version, grant_id))
            return slot, version

        return self._group.run(txn)

    def _forget_drawn(self, grant_id: str, digest: str) -> None:
        """Drops a consumed ticket's draw record, and the kept instance it alone referred to."""
        row = self._q("SELECT slot, version FROM dnd_drawn WHERE grant_id = ? AND "
                      "ticket_sha256 = ?", (grant_id, digest)).fetchone()
        if row is None:
            return
        self._q("DELETE FROM dnd_drawn WHERE grant_id = ? AND ticket_sha256 = ?",
                (grant_id, digest))
        self._q("DELETE FROM dnd_retired WHERE grant_id = ? AND slot = ? AND version = ? AND "
                "NOT EXISTS (SELECT 1 FROM dnd_drawn d WHERE d.grant_id = dnd_retired.grant_id "
                "AND d.slot = dnd_retired.slot AND d.version = dnd_retired.version)",
                (grant_id, row[0], row[1]))

    def _drop_orphans(self, grant_id: str) -> None:
        """Draw records of tickets gone (expired, deleted) and kept instances nobody refers to."""
        self._q("DELETE FROM dnd_drawn WHERE grant_id = ? AND NOT EXISTS (SELECT 1 FROM "
                "dnd_tickets t WHERE t.grant_id = dnd_drawn.grant_id AND t.ticket_sha256 = "
                "dnd_drawn.ticket_sha256)", (grant_id,))
        self._q("DELETE FROM dnd_retired WHERE grant_id = ? AND NOT EXISTS (SELECT 1 FROM "
                "dnd_drawn d WHERE d.grant_id = dnd_retired.grant_id AND d.slot = "
                "dnd_retired.slot AND d.version = dnd_retired.version)", (grant_id,))

    def _retire(self, grant_id: str, slot: int) -> None:
        """Keeps the instance about to be overwritten while an outstanding ticket drew it."""
        self._q("SELECT version FROM dnd_instances WHERE grant_id = ? AND slot = ?"
                + self._for_update, (grant_id, slot))
        self._q("INSERT INTO dnd_retired (grant_id, slot, version, weights) SELECT i.grant_id, "
                "i.slot, i.version, i.weights FROM dnd_instances i WHERE i.grant_id = ? AND "
                "i.slot = ? AND EXISTS (SELECT 1 FROM dnd_drawn d WHERE d.grant_id = i.grant_id "
                "AND d.slot = i.slot AND d.version = i.version) "
                "ON CONFLICT (grant_id, slot, version) DO NOTHING", (grant_id, slot))

    def sweep(self, grant_id: str) -> int:
        """Deletes every expired ticket of the run, the draw records of tickets gone and the
        retired instances no ticket refers to; returns how many tickets."""
        def txn() -> int:
            gone = self._q("DELETE FROM dnd_tickets WHERE grant_id = ? AND expires_at <= ?",
                           (grant_id, self._time())).rowcount
            self._drop_orphans(grant_id)
            return gone
        return self._write(txn)

    # -- reads --

    def version(self, grant_id: str) -> int:
        """The run's instance version: it moves with every accepted update (0: none yet)."""
        row = self._read(lambda: self._q("SELECT version FROM dnd_runs WHERE grant_id = ?",
                                         (grant_id,)).fetchone())
        return int(row[0]) if row is not None else 0

    def instance_versions(self, grant_id: str) -> dict[int, int]:
        """{slot: version} of the current instances."""
        return dict(self._read(lambda: self._q(
            "SELECT slot, version FROM dnd_instances WHERE grant_id = ?", (grant_id,)).fetchall()))

    def instances(self, grant_id: str, dim: int,
                  slots: Optional[Sequence[int]] = None) -> list[tuple[int, int, np.ndarray]]:
        """(slot, version, weights) of the current instances (all, or ``slots``), by slot."""
        sql = "SELECT slot, version, weights FROM dnd_instances WHERE grant_id = ?"
        params: list = [grant_id]
        if slots is not None:
            if not slots:
                return []
            sql += f" AND slot IN ({', '.join('?' * len(slots))})"
            params += [int(s) for s in slots]
        rows = self._read(lambda: self._q(sql + " ORDER BY slot", params).fetchall())
        return [(int(s), int(v), decode(w, dim)) for s, v, w in rows]

    def outstanding(self, grant_id: str) -> int:
        """Unexpired tickets of the run (draws whose update may still come back)."""
        return self._read(lambda: self._q(
            "SELECT count(*) FROM dnd_tickets WHERE grant_id = ? AND expires_at > ?",
            (grant_id, self._time())).fetchone()[0])

    def passes(self, grant_id: str) -> dict[str, tuple[int, int]]:
        """{principal: (updates returned, draws made)}."""
        rows = self._read(lambda: self._q(
            "SELECT principal, used, draws FROM dnd_passes WHERE grant_id = ?",
            (grant_id,)).fetchall())
        return {p: (int(u), int(d)) for p, u, d in rows}

    def versions(self, grant_id: str) -> list[tuple[int, int, str]]:
        """(version, slot, SHA-256 of the update) of every accepted update, oldest first."""
        rows = self._read(lambda: self._q(
            "SELECT version, slot, digest FROM dnd_versions WHERE grant_id = ? ORDER BY version",
            (grant_id,)).fetchall())
        return [(int(v), int(s), d) for v, s, d in rows]

    def problems(self, grant_id: str) -> list[str]:
        """Consistency of a run's tables (empty: none): versions 1..N without a gap, N equal to
        the accepted count and the run's version, each instance's version logged with its
        digest, and returned updates equal to accepted + rejected."""
        run = self.run(grant_id)
        if run is None:
            return [f"no served run for grant {grant_id}"]
        out = []
        log = self.versions(grant_id)
        if [v for v, _, _ in log] != list(range(1, len(log) + 1)):
            out.append("instance versions are not 1..N without a gap")
        if len(log) != run.accepted or run.version != run.accepted:
            out.append(f"{len(log)} logged versions, {run.accepted} accepted, run version "
                       f"{run.version}")
        by_version = {v: (s, d) for v, s, d in log}
        newest = {s: v for v, s, _ in log}  # the last version written to each slot
        for slot, version, w in self.instances(grant_id, run.dim):
            if version != newest.get(slot, 0):
                out.append(f"instance {slot} is at version {version}, its last logged write "
                           f"is {newest.get(slot, 0)}")
            elif version and by_version[version][1] != hashlib.sha256(encode(w)).hexdigest():
                out.append(f"instance {slot} at version {version} is not the logged update")
        used = sum(u for u, _ in self.passes(grant_id).values())
        if used != run.accepted + run.rejected:
            out.append(f"{used} updates counted against passes, {run.accepted + run.rejected} "
                       "accepted or rejected")
        return out
