"""The block ledger: per-block privacy budgets, grants and a hash-chained audit log.

Sage §3.2 (Sage Access Control) and §4 (block composition, Theorem 4.3). A stream is split into
disjoint blocks; every block has its own budget under the stream's global (ε_g, δ_g). A run asks
for blocks (a list, or a window such as "the last 30 blocks") and a privacy cost; the ledger
charges *every* requested block or *none*, in one database transaction, and only after that
transaction commits are block locations handed out (**charge before release**). A grant whose
data was released stays charged for ever; only a reservation that never released data can be
cancelled. A repeated run id returns the same grant without charging twice.

Storage is SQLite (``sqlite:///path``, the embedded default; WAL journal with
``synchronous=FULL`` so an acknowledged grant is on disk) or PostgreSQL
(``postgresql://user@host:port/db``) for a ledger shared by many machines. All writers serialize
on one lock (SQLite's write lock, a PostgreSQL row lock on ``ledger_head``), which also orders the
audit chain.

Budget state per (stream, context, block) is cached in ``budgets`` for speed; it is always
derivable from the grants (``check_consistency`` recomputes it). Contexts (§3.2) are separate
budget lists for non-colluding consumers configured by the operator.
"""
from __future__ import annotations

import dataclasses
import fcntl
import datetime
import functools
import hashlib
import json
import math
import os
import re
import uuid
from decimal import Decimal
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence

from dp_accounting import dp_event as dp_event_lib

from sage_tfx import accounting
from sage_tfx.errors import (AccountingModeError, GrantStateError, InvalidRequestError,
                             RetiredBlockError, UnknownBlockError, UnknownStreamError)

ACTIVE = "active"
RETIRED = "retired"
RESERVED = "reserved"
RELEASED = "released"
CANCELLED = "cancelled"
DEFAULT_CONTEXT = "default"
GENESIS_HASH = "0" * 64
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")


def _check_name(kind: str, name: Any) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidRequestError(
            f"{kind} must be 1-128 characters of letters, digits, '_', '.', ':' or '-' "
            f"starting with a letter or digit, got {name!r}")
    return name


# --- value objects ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Stream:
    """A stream's configuration: global cap, accounting mode, block granularity, contexts."""

    name: str
    epsilon_g: float
    delta_g: float
    mode: str
    granularity: str
    contexts: tuple[str, ...]
    retire_epsilon: float
    orders: tuple[float, ...]
    created_at: str = ""

    @functools.cached_property
    def caps(self) -> tuple[float, ...]:
        """Per-order caps of the RDP filter (empty in basic mode)."""
        if self.mode != accounting.RDP:
            return ()
        return accounting.rdp_caps(self.epsilon_g, self.delta_g, self.orders)

    @functools.cached_property
    def exact_caps(self) -> tuple[Decimal, Decimal]:
        """(ε_g, δ_g) as exact decimals, for basic-mode sums."""
        return accounting.exact(self.epsilon_g), accounting.exact(self.delta_g)


@dataclasses.dataclass(frozen=True)
class BlockSpec:
    """A block to register: its id, storage location and half-open [start, end) description."""

    block_id: str
    location: str
    start: Optional[str] = None
    end: Optional[str] = None
    records: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class BlockState:
    """A block's budget state in one context."""

    stream: str
    context: str
    block_id: str
    seq: int
    location: str
    start: Optional[str]
    end: Optional[str]
    records: Optional[int]
    status: str
    epsilon_spent: float
    delta_spent: float
    charges: int

    @property
    def active(self) -> bool:
        return self.status == ACTIVE


class GrantedBlock(NamedTuple):
    """A block of a grant; ``location`` is None until the grant is released."""

    block_id: str
    location: Optional[str]


@dataclasses.dataclass(frozen=True)
class Grant:
    """The ledger's permission for one run to read ``blocks`` at the charged privacy cost."""

    grant_id: str
    run_id: str
    stream: str
    context: str
    mode: str
    epsilon: Optional[float]
    delta: Optional[float]
    event: Optional[dp_event_lib.DpEvent]
    blocks: tuple[GrantedBlock, ...]
    status: str
    created_at: str

    @property
    def block_ids(self) -> tuple[str, ...]:
        return tuple(b.block_id for b in self.blocks)

    @property
    def locations(self) -> tuple[str, ...]:
        """Storage locations of the granted blocks.

        Raises:
          GrantStateError: the grant was not released, so it carries no locations.
        """
        if self.status != RELEASED:
            raise GrantStateError(f"grant {self.grant_id} is {self.status}: no data released")
        return tuple(b.location for b in self.blocks)  # type: ignore[misc]

    def to_dict(self) -> dict:
        return {
            "grant_id": self.grant_id, "run_id": self.run_id, "stream": self.stream,
            "context": self.context, "mode": self.mode, "epsilon": self.epsilon,
            "delta": self.delta,
            "event": accounting.event_to_dict(self.event) if self.event is not None else None,
            "blocks": [[b.block_id, b.location] for b in self.blocks],
            "status": self.status, "created_at": self.created_at,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "Grant":
        return cls(
            grant_id=d["grant_id"], run_id=d["run_id"], stream=d["stream"],
            context=d["context"], mode=d["mode"], epsilon=d["epsilon"], delta=d["delta"],
            event=accounting.event_from_dict(d["event"]) if d.get("event") else None,
            blocks=tuple(GrantedBlock(b, loc) for b, loc in d["blocks"]),
            status=d["status"], created_at=d["created_at"])

    @classmethod
    def from_json(cls, text: str) -> "Grant":
        return cls.from_dict(json.loads(text))


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome of a request: a grant, or a denial with its reason."""

    granted: bool
    grant: Optional[Grant] = None
    reason: str = ""
    replayed: bool = False


@dataclasses.dataclass(frozen=True)
class Window:
    """A window policy: the ``last`` most recent blocks that have budget left for the charge.

    ``min_blocks`` (default: ``last``) is how many must qualify for the request to be granted.
    """

    last: int
    min_blocks: Optional[int] = None

    def __post_init__(self):
        if isinstance(self.last, bool) or not isinstance(self.last, int) or self.last < 1:
            raise InvalidRequestError(f"Window.last must be an integer ≥ 1, got {self.last!r}")
        if self.min_blocks is not None and (
                isinstance(self.min_blocks, bool) or not isinstance(self.min_blocks, int)
                or not 1 <= self.min_blocks <= self.last):
            raise InvalidRequestError(
                f"Window.min_blocks must be an integer in [1, last], got {self.min_blocks!r}")

    @property
    def required(self) -> int:
        return self.last if self.min_blocks is None else self.min_blocks


@dataclasses.dataclass(frozen=True)
class AuditEntry:
    seq: int
    ts: str
    stream: Optional[str]
    kind: str
    payload: dict
    prev_hash: str
    hash: str


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """Result of verifying the audit hash chain."""

    ok: bool
    entries: int
    first_bad_seq: Optional[int] = None
    message: str = ""


def _audit_hash(prev_hash: str, seq: int, ts: str, stream: Optional[str], kind: str,
                payload_text: str) -> str:
    material = json.dumps([prev_hash, seq, ts, stream, kind, payload_text], separators=(",", ":"))
    return hashlib.sha256(material.encode()).hexdigest()


# --- storage backends -------------------------------------------------------------------------


class _Backend:
    """Connection handling and SQL dialect of one database kind."""

    kind = ""
    real = "REAL"
    bigint = "INTEGER"
    serial_pk = "INTEGER PRIMARY KEY"

    def __init__(self, url: str):
        self.url = url

    def connect(self):
        raise NotImplementedError

    def sql(self, text: str) -> str:
        return text

    def begin_write(self, conn) -> None:
        raise NotImplementedError

    def end_write(self, conn) -> None:
        """Called after COMMIT or ROLLBACK of a write transaction."""


class _SqliteBackend(_Backend):
    kind = "sqlite"

    def __init__(self, url: str):
        super().__init__(url)
        path = url[len("sqlite:///"):]
        if not path:
            raise InvalidRequestError(f"sqlite URL needs a path: {url!r}")
        self.path = path
        self._lock_fd: Optional[int] = None

    def connect(self):
        import sqlite3
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=120.0, isolation_level=None,
                               check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit returns only after the WAL is synced, so an acknowledged grant survives
        # a crash or power loss.
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=120000")
        return conn

    def begin_write(self, conn) -> None:
        # Writers queue on an OS file lock first: SQLite's own busy handler polls with sleeps
        # of up to 100 ms, which would dominate tail latency with many writers. The lock is
        # released by the kernel if the process dies.
        if self._lock_fd is None:
            self._lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except BaseException:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            raise

    def end_write(self, conn) -> None:
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)


class _PostgresBackend(_Backend):
    kind = "postgresql"
    real = "DOUBLE PRECISION"
    bigint = "BIGINT"
    serial_pk = "BIGSERIAL PRIMARY KEY"

    def connect(self):
        import psycopg
        conn = psycopg.connect(self.url, autocommit=True)
        conn.execute("SET synchronous_commit = on")
        return conn

    def sql(self, text: str) -> str:
        return text.replace("?", "%s")

    def begin_write(self, conn) -> None:
        conn.execute("BEGIN")
        conn.execute("SELECT audit_seq FROM ledger_head WHERE id = 1 FOR UPDATE")


def _backend_for(url: str) -> _Backend:
    if url.startswith("sqlite:///"):
        return _SqliteBackend(url)
    if url.startswith(("postgresql://", "postgres://")):
        return _PostgresBackend(url)
    raise InvalidRequestError(
        f"unsupported ledger URL {url!r}: use sqlite:///path/to/ledger.db or "
        "postgresql://user@host:port/dbname")


def _schema(b: _Backend) -> list[str]:
    r, i = b.real, b.bigint
    return [
        f"""CREATE TABLE IF NOT EXISTS ledger_head (
            id {i} PRIMARY KEY, audit_seq {i} NOT NULL, audit_hash TEXT NOT NULL,
            schema_version {i} NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS streams (
            stream TEXT PRIMARY KEY, epsilon_g {r} NOT NULL, delta_g {r} NOT NULL,
            mode TEXT NOT NULL, granularity TEXT NOT NULL, contexts TEXT NOT NULL,
            retire_epsilon {r} NOT NULL, orders TEXT NOT NULL, next_seq {i} NOT NULL,
            created_at TEXT NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS blocks (
            stream TEXT NOT NULL REFERENCES streams(stream), block_id TEXT NOT NULL,
            seq {i} NOT NULL, location TEXT NOT NULL, start_ts TEXT, end_ts TEXT,
            records {i}, created_at TEXT NOT NULL,
            PRIMARY KEY (stream, block_id), UNIQUE (stream, seq))""",
        f"""CREATE TABLE IF NOT EXISTS budgets (
            id {b.serial_pk}, stream TEXT NOT NULL, context TEXT NOT NULL,
            block_id TEXT NOT NULL, seq {i} NOT NULL, status TEXT NOT NULL,
            eps_spent TEXT NOT NULL, delta_spent TEXT NOT NULL, rdp TEXT, charges {i} NOT NULL,
            UNIQUE (stream, context, block_id),
            FOREIGN KEY (stream, block_id) REFERENCES blocks(stream, block_id))""",
        "CREATE INDEX IF NOT EXISTS budgets_window ON budgets (stream, context, status, seq)",
        f"""CREATE TABLE IF NOT EXISTS grants (
            grant_id TEXT PRIMARY KEY, stream TEXT NOT NULL, context TEXT NOT NULL,
            run_id TEXT NOT NULL, request TEXT NOT NULL, mode TEXT NOT NULL,
            epsilon {r}, delta {r}, event TEXT, blocks TEXT NOT NULL, status TEXT NOT NULL,
            created_at TEXT NOT NULL, released_at TEXT, UNIQUE (stream, run_id))""",
        f"""CREATE TABLE IF NOT EXISTS audit (
            seq {i} PRIMARY KEY, ts TEXT NOT NULL, stream TEXT, kind TEXT NOT NULL,
            payload TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL)""",
    ]


# --- the ledger -------------------------------------------------------------------------------


class Ledger:
    """A connection to a block ledger. Not thread-safe: open one per thread or process."""

    def __init__(self, url: str):
        self.url = url
        self._backend = _backend_for(url)
        self._conn = self._backend.connect()
        self._streams: dict[str, Stream] = {}
        # Fault-injection point for crash tests: called inside a write transaction right
        # before COMMIT.
        self._before_commit: Optional[Callable[[], None]] = None
        self._init_schema()

    # -- plumbing --

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def backend(self) -> str:
        return self._backend.kind

    def _q(self, sql: str, params: Sequence = ()) -> Any:
        return self._conn.execute(self._backend.sql(sql), tuple(params))

    def _many(self, sql: str, rows: Iterable[Sequence]) -> None:
        sql = self._backend.sql(sql)
        if self._backend.kind == "sqlite":
            self._conn.executemany(sql, rows)
        else:
            with self._conn.cursor() as cur:
                cur.executemany(sql, list(rows))

    def _update_budgets(self, updates: list) -> None:
        """Writes (eps_spent, delta_spent, rdp or None, budget id) rows and counts one charge."""
        if self._backend.kind == "sqlite":
            self._conn.executemany(
                "UPDATE budgets SET eps_spent = ?, delta_spent = ?, rdp = COALESCE(?, rdp), "
                "charges = charges + 1 WHERE id = ?", updates)
            return
        # PostgreSQL: one statement for all blocks (executemany would be a round trip per row).
        values = ",".join(["(%s, %s, %s::text, %s::bigint)"] * len(updates))
        self._conn.execute(
            "UPDATE budgets AS u SET eps_spent = v.e, delta_spent = v.d, "
            "rdp = COALESCE(v.r, u.rdp), charges = u.charges + 1 "
            f"FROM (VALUES {values}) AS v(e, d, r, id) WHERE u.id = v.id",
            [x for row in updates for x in row])

    def _write(self, fn: Callable[[], Any]) -> Any:
        """Runs ``fn`` inside one serialized write transaction; commits or rolls back."""
        self._backend.begin_write(self._conn)
        try:
            result = fn()
            if self._before_commit is not None:
                self._before_commit()
            self._conn.execute("COMMIT")
            return result
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        finally:
            self._backend.end_write(self._conn)

    def _init_schema(self) -> None:
        if self._backend.kind == "sqlite":
            self._conn.execute("BEGIN IMMEDIATE")
        else:
            self._conn.execute("BEGIN")
            self._conn.execute("SELECT pg_advisory_xact_lock(727272)")
        try:
            for stmt in _schema(self._backend):
                self._conn.execute(stmt)
            row = self._q("SELECT audit_seq FROM ledger_head WHERE id = 1").fetchone()
            if row is None:
                self._q("INSERT INTO ledger_head (id, audit_seq, audit_hash, schema_version) "
                        "VALUES (1, 0, ?, 1)", (GENESIS_HASH,))
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise

    def _audit(self, stream: Optional[str], kind: str, payload: dict) -> None:
        """Appends one entry to the audit chain (inside the caller's write transaction)."""
        seq, prev = self._q("SELECT audit_seq, audit_hash FROM ledger_head WHERE id = 1").fetchone()
        seq += 1
        ts = _now()
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        digest = _audit_hash(prev, seq, ts, stream, kind, text)
        self._q("INSERT INTO audit (seq, ts, stream, kind, payload, prev_hash, hash) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)", (seq, ts, stream, kind, text, prev, digest))
        self._q("UPDATE ledger_head SET audit_seq = ?, audit_hash = ? WHERE id = 1", (seq, digest))

    # -- streams --

    def create_stream(self, name: str, *, epsilon_g: float, delta_g: float,
                      mode: str = accounting.BASIC, granularity: str = "",
                      contexts: Sequence[str] = (DEFAULT_CONTEXT,),
                      retire_epsilon: Optional[float] = None,
                      orders: Sequence[float] = accounting.DEFAULT_RDP_ORDERS) -> Stream:
        """Creates a stream with global cap (ε_g, δ_g).

        Args:
          name: stream name.
          epsilon_g: global ε of every block.
          delta_g: global δ of every block (> 0 in rdp mode, where it pays for the conversion).
          mode: "basic" (Σε, Σδ) or "rdp" (DpEvents, per-order RDP filter).
          granularity: block scheme description, e.g. "time:timestamp:day".
          contexts: names of the non-colluding contexts, each with its own budget list.
          retire_epsilon: a block retires once an ε=retire_epsilon pure-DP charge no longer fits
            (default ε_g / 1000).
          orders: RDP order grid (rdp mode).
        Raises:
          InvalidPrivacyParameterError, InvalidRequestError: bad configuration or name taken.
        """
        _check_name("stream name", name)
        epsilon_g = accounting.check_epsilon(epsilon_g, "epsilon_g")
        if mode not in accounting.MODES:
            raise AccountingModeError(f"mode must be one of {accounting.MODES}, got {mode!r}")
        delta_g = accounting.check_delta(delta_g, "delta_g", allow_zero=(mode == accounting.BASIC))
        contexts = tuple(contexts)
        if not contexts or len(set(contexts)) != len(contexts):
            raise InvalidRequestError(f"contexts must be distinct and non-empty: {contexts!r}")
        for c in contexts:
            _check_name("context", c)
        retire_epsilon = accounting.check_epsilon(
            epsilon_g / 1000.0 if retire_epsilon is None else retire_epsilon, "retire_epsilon")
        if retire_epsilon > epsilon_g:
            raise InvalidRequestError(f"retire_epsilon {retire_epsilon} exceeds epsilon_g {epsilon_g}")
        orders = accounting.check_orders(orders)
        stream = Stream(name, epsilon_g, delta_g, mode, str(granularity), contexts,
                        retire_epsilon, orders if mode == accounting.RDP else (), _now())

        def txn():
            if self._q("SELECT 1 FROM streams WHERE stream = ?", (name,)).fetchone():
                raise InvalidRequestError(f"stream {name!r} already exists")
            self._q("INSERT INTO streams (stream, epsilon_g, delta_g, mode, granularity, contexts,"
                    " retire_epsilon, orders, next_seq, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (name, epsilon_g, delta_g, mode, stream.granularity, json.dumps(contexts),
                     retire_epsilon, json.dumps(stream.orders), 0, stream.created_at))
            self._audit(name, "create_stream", {
                "epsilon_g": epsilon_g, "delta_g": delta_g, "mode": mode,
                "granularity": stream.granularity, "contexts": list(contexts),
                "retire_epsilon": retire_epsilon, "orders": list(stream.orders)})
            return stream

        return self._write(txn)

    def stream(self, name: str) -> Stream:
        """The stream's configuration. Raises UnknownStreamError."""
        if name in self._streams:
            return self._streams[name]
        row = self._q("SELECT stream, epsilon_g, delta_g, mode, granularity, contexts, "
                      "retire_epsilon, orders, created_at FROM streams WHERE stream = ?",
                      (name,)).fetchone()
        if row is None:
            raise UnknownStreamError(f"unknown stream {name!r}")
        stream = Stream(row[0], row[1], row[2], row[3], row[4], tuple(json.loads(row[5])),
                        row[6], tuple(json.loads(row[7])), row[8])
        self._streams[name] = stream  # configuration is immutable once created
        return stream

    def streams(self) -> list[Stream]:
        names = [r[0] for r in self._q("SELECT stream FROM streams ORDER BY stream").fetchall()]
        return [self.stream(n) for n in names]

    def _context(self, stream: Stream, context: str) -> str:
        if context not in stream.contexts:
            raise InvalidRequestError(
                f"context {context!r} is not configured for stream {stream.name!r} "
                f"(configured: {', '.join(stream.contexts)})")
        return context

    # -- blocks --

    def add_block(self, stream: str, block_id: str, *, location: str,
                  start: Optional[str] = None, end: Optional[str] = None,
                  records: Optional[int] = None) -> BlockState:
        """Registers one new block with a full budget in every context."""
        self.add_blocks(stream, [BlockSpec(block_id, location, start, end, records)])
        return self.block(stream, block_id)

    def add_blocks(self, stream: str, specs: Sequence[BlockSpec]) -> int:
        """Registers new blocks (in the given order) in one transaction; returns how many.

        Raises:
          UnknownStreamError, InvalidRequestError: unknown stream, duplicate or malformed block.
        """
        s = self.stream(stream)
        specs = list(specs)
        if not specs:
            raise InvalidRequestError("no blocks to add")
        seen = set()
        for spec in specs:
            _check_name("block id", spec.block_id)
            if spec.block_id in seen:
                raise InvalidRequestError(f"block {spec.block_id!r} listed twice")
            seen.add(spec.block_id)
            if not isinstance(spec.location, str) or not spec.location:
                raise InvalidRequestError(f"block {spec.block_id!r} needs a storage location")
            if spec.records is not None and (not isinstance(spec.records, int) or spec.records < 0):
                raise InvalidRequestError(f"block {spec.block_id!r}: bad record count {spec.records!r}")

        def txn():
            next_seq = self._q("SELECT next_seq FROM streams WHERE stream = ?", (stream,)).fetchone()[0]
            ids = [spec.block_id for spec in specs]
            for chunk_start in range(0, len(ids), 500):
                chunk = ids[chunk_start:chunk_start + 500]
                marks = ",".join("?" * len(chunk))
                dup = self._q(f"SELECT block_id FROM blocks WHERE stream = ? AND block_id IN ({marks})",
                              [stream] + chunk).fetchone()
                if dup:
                    raise InvalidRequestError(f"block {dup[0]!r} already exists in stream {stream!r}")
            now = _now()
            self._many("INSERT INTO blocks (stream, block_id, seq, location, start_ts, end_ts, "
                       "records, created_at) VALUES (?,?,?,?,?,?,?,?)",
                       [(stream, sp.block_id, next_seq + k, sp.location, sp.start, sp.end,
                         sp.records, now) for k, sp in enumerate(specs)])
            zero_rdp = json.dumps([0.0] * len(s.orders)) if s.mode == accounting.RDP else None
            self._many("INSERT INTO budgets (stream, context, block_id, seq, status, eps_spent, "
                       "delta_spent, rdp, charges) VALUES (?,?,?,?,?,?,?,?,0)",
                       [(stream, c, sp.block_id, next_seq + k, ACTIVE, "0", "0", zero_rdp)
                        for c in s.contexts for k, sp in enumerate(specs)])
            self._q("UPDATE streams SET next_seq = ? WHERE stream = ?", (next_seq + len(specs), stream))
            digest = hashlib.sha256(json.dumps(
                [[sp.block_id, sp.location, sp.start, sp.end, sp.records] for sp in specs]
            ).encode()).hexdigest()
            self._audit(stream, "add_blocks", {
                "count": len(specs), "first": specs[0].block_id, "last": specs[-1].block_id,
                "first_seq": next_seq, "blocks_sha256": digest})
            return len(specs)

        return self._write(txn)

    _BLOCK_COLS = ("SELECT b.stream, u.context, b.block_id, b.seq, b.location, b.start_ts, "
                   "b.end_ts, b.records, u.status, u.eps_spent, u.delta_spent, u.rdp, u.charges "
                   "FROM blocks b JOIN budgets u ON u.stream = b.stream AND u.block_id = b.block_id ")

    def _block_state(self, s: Stream, row) -> BlockState:
        if s.mode == accounting.RDP:
            eps = accounting.rdp_epsilon(json.loads(row[11]), s.orders, s.delta_g)
            delta = s.delta_g if row[12] else 0.0
        else:
            eps, delta = float(Decimal(row[9])), float(Decimal(row[10]))
        return BlockState(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7],
                          row[8], eps, delta, row[12])

    def blocks(self, stream: str, context: str = DEFAULT_CONTEXT) -> list[BlockState]:
        """Every block of the stream with its budget state in ``context``, oldest first.

        In rdp mode ``epsilon_spent`` is the block's ε at δ_g as dp_accounting converts its RDP
        curve, and ``delta_spent`` is δ_g once anything was charged.
        """
        s = self.stream(stream)
        self._context(s, context)
        rows = self._q(self._BLOCK_COLS + "WHERE b.stream = ? AND u.context = ? ORDER BY b.seq",
                       (stream, context)).fetchall()
        return [self._block_state(s, r) for r in rows]

    def block(self, stream: str, block_id: str, context: str = DEFAULT_CONTEXT) -> BlockState:
        s = self.stream(stream)
        self._context(s, context)
        row = self._q(self._BLOCK_COLS + "WHERE b.stream = ? AND u.context = ? AND b.block_id = ?",
                      (stream, context, block_id)).fetchone()
        if row is None:
            raise UnknownBlockError(f"unknown block {block_id!r} in stream {stream!r}")
        return self._block_state(s, row)

    def remaining(self, stream: str, block_id: str, context: str = DEFAULT_CONTEXT) -> dict:
        """What is left of a block's budget: (ε, δ) in basic mode, per-order headroom in rdp."""
        s = self.stream(stream)
        self._context(s, context)
        row = self._q("SELECT eps_spent, delta_spent, rdp FROM budgets WHERE stream = ? AND "
                      "context = ? AND block_id = ?", (stream, context, block_id)).fetchone()
        if row is None:
            raise UnknownBlockError(f"unknown block {block_id!r} in stream {stream!r}")
        if s.mode == accounting.BASIC:
            return {"epsilon": float(accounting.exact(s.epsilon_g) - Decimal(row[0])),
                    "delta": float(accounting.exact(s.delta_g) - Decimal(row[1]))}
        spent = json.loads(row[2])
        return {"headroom": {a: cap - x for a, cap, x in zip(s.orders, s.caps, spent)}}

    def retire_block(self, stream: str, block_id: str, reason: str,
                     context: Optional[str] = None) -> None:
        """Retires a block for good (in one context, or all): it will never be charged again."""
        s = self.stream(stream)
        contexts = s.contexts if context is None else (self._context(s, context),)

        def txn():
            if not self._q("SELECT 1 FROM blocks WHERE stream = ? AND block_id = ?",
                           (stream, block_id)).fetchone():
                raise UnknownBlockError(f"unknown block {block_id!r} in stream {stream!r}")
            for c in contexts:
                self._q("UPDATE budgets SET status = ? WHERE stream = ? AND context = ? AND "
                        "block_id = ?", (RETIRED, stream, c, block_id))
                self._audit(stream, "retire", {"block": block_id, "context": c, "reason": reason})

        self._write(txn)

    # -- requests --

    def _normalize_cost(self, s: Stream, epsilon, delta, event):
        """Validates the cost against the stream's mode; returns (eps, delta, event, event_json)."""
        if s.mode == accounting.BASIC:
            if event is not None:
                raise AccountingModeError(
                    f"stream {s.name!r} uses basic accounting: charge (epsilon, delta), not a DpEvent")
            if epsilon is None:
                raise InvalidRequestError("a basic-mode request needs epsilon (and delta)")
            eps = accounting.check_epsilon(epsilon)
            dlt = accounting.check_delta(0.0 if delta is None else delta)
            return eps, dlt, None, None
        if epsilon is not None or delta is not None:
            raise AccountingModeError(
                f"stream {s.name!r} uses rdp accounting: charge a dp_accounting DpEvent "
                "(e.g. GaussianDpEvent, LaplaceDpEvent, PoissonSampledDpEvent), not (epsilon, delta)")
        if event is None:
            raise InvalidRequestError("an rdp-mode request needs a DpEvent")
        accounting.check_event(event)
        return None, None, event, accounting.event_to_json(event)

    def request(self, stream: str, *, run_id: str, blocks: Optional[Sequence[str]] = None,
                window: Optional[Window] = None, epsilon: Optional[float] = None,
                delta: Optional[float] = None, event: Optional[dp_event_lib.DpEvent] = None,
                context: str = DEFAULT_CONTEXT, release: bool = True) -> Decision:
        """Charges a run's privacy cost to every requested block, or to none.

        Args:
          stream: the stream.
          run_id: the run's id; a repeated id with the same request returns the same grant.
          blocks: explicit block ids (exactly one of ``blocks`` / ``window``).
          window: a window policy, resolved to concrete blocks at charge time.
          epsilon, delta: the cost in basic mode.
          event: the cost as a dp_accounting DpEvent in rdp mode.
          context: the budget list to charge.
          release: release the data in the same transaction (default). With False the grant is
            a reservation without locations; call :meth:`release` or :meth:`cancel` later.
        Returns:
          A Decision: granted with a Grant, or denied with a reason (recorded in the audit log).
        Raises:
          ValueError subclasses for bad input (nothing is written): unknown stream/block/context,
          retired block, bad privacy parameters, mode mismatch, empty request, run id reused for a
          different request.
        """
        s = self.stream(stream)
        _check_name("run id", run_id)
        self._context(s, context)
        eps, dlt, event, event_json = self._normalize_cost(s, epsilon, delta, event)
        if (blocks is None) == (window is None):
            raise InvalidRequestError("give exactly one of blocks=[...] or window=Window(...)")
        if blocks is not None:
            if isinstance(blocks, str):
                raise InvalidRequestError("blocks must be a list of block ids, not a string")
            blocks = list(blocks)
            if not blocks:
                raise InvalidRequestError("empty request: no blocks")
            if len(set(blocks)) != len(blocks):
                raise InvalidRequestError("a block is listed twice in the request")
        elif not isinstance(window, Window):
            raise InvalidRequestError(f"window must be a Window, got {window!r}")
        request_text = json.dumps({
            "blocks": blocks,
            "window": {"last": window.last, "min_blocks": window.min_blocks} if window else None,
            "epsilon": eps, "delta": dlt, "event": json.loads(event_json) if event_json else None,
            "context": context}, sort_keys=True)
        charge = accounting.rdp_curve(event, s.orders) if event is not None else None
        # Basic-mode sums run on exact decimals of the values the caller gave.
        dec_e, dec_d = (accounting.exact(eps), accounting.exact(dlt)) if eps is not None else (None, None)

        def txn() -> Decision:
            prior = self._q("SELECT grant_id, request FROM grants WHERE stream = ? AND run_id = ?",
                            (stream, run_id)).fetchone()
            if prior is not None:
                if prior[1] != request_text:
                    raise InvalidRequestError(
                        f"run id {run_id!r} already has grant {prior[0]} for a different request")
                return Decision(True, self._load_grant(prior[0]), replayed=True)
            if blocks is not None:
                rows = self._budget_rows(stream, context, blocks)
                states = {r[0]: r for r in rows}
                missing = [b for b in blocks if b not in states]
                if missing:
                    raise UnknownBlockError(
                        f"unknown block(s) in stream {stream!r}: {', '.join(missing[:10])}")
                retired = [b for b in blocks if states[b][2] != ACTIVE]
                if retired:
                    raise RetiredBlockError(
                        f"retired block(s) in stream {stream!r}, context {context!r}: "
                        f"{', '.join(retired[:10])}")
                chosen = [states[b] for b in blocks]
                short = [r for r in chosen if not self._fits(s, r, dec_e, dec_d, charge)]
                if short:
                    reason = self._shortfall(s, short, dec_e, dec_d)
                    return self._deny(s, run_id, context, request_text, reason)
            else:
                chosen = self._window_rows(s, context, window, dec_e, dec_d, charge)
                if len(chosen) < window.required:
                    reason = (f"window last={window.last}: only {len(chosen)} block(s) have budget "
                              f"left for this charge, {window.required} required")
                    return self._deny(s, run_id, context, request_text, reason)
                chosen.sort(key=lambda r: r[1])
            return Decision(True, self._charge(s, run_id, context, request_text, chosen,
                                               (eps, dlt), (dec_e, dec_d), event_json, charge,
                                               release))

        return self._write(txn)

    # Row layout used by the request path:
    # (block_id, seq, status, eps, delta, rdp, location, budget row id).
    _BUDGET_COLS = ("SELECT u.block_id, u.seq, u.status, u.eps_spent, u.delta_spent, u.rdp, "
                    "b.location, u.id FROM budgets u JOIN blocks b ON b.stream = u.stream AND "
                    "b.block_id = u.block_id WHERE u.stream = ? AND u.context = ? ")

    def _budget_rows(self, stream: str, context: str, block_ids: Sequence[str]) -> list:
        rows = []
        for k in range(0, len(block_ids), 500):
            chunk = list(block_ids[k:k + 500])
            marks = ",".join("?" * len(chunk))
            rows += self._q(
                self._BUDGET_COLS + f"AND u.block_id IN ({marks})",
                [stream, context] + chunk).fetchall()
        return rows

    def _window_rows(self, s: Stream, context: str, window: Window, eps, dlt, charge) -> list:
        """The ``window.last`` most recent active blocks that fit the charge."""
        chosen: list = []
        before = None
        page = window.last + 8
        while len(chosen) < window.last:
            sql = self._BUDGET_COLS + "AND u.status = ?"
            params: list = [s.name, context, ACTIVE]
            if before is not None:
                sql += " AND u.seq < ?"
                params.append(before)
            rows = self._q(sql + " ORDER BY u.seq DESC LIMIT ?", params + [page]).fetchall()
            if not rows:
                break
            for r in rows:
                if self._fits(s, r, eps, dlt, charge):
                    chosen.append(r)
                    if len(chosen) == window.last:
                        break
            before = rows[-1][1]
        return chosen

    @staticmethod
    def _fits(s: Stream, row, eps, dlt, charge) -> bool:
        if s.mode == accounting.BASIC:
            cap_e, cap_d = s.exact_caps
            return Decimal(row[3]) + eps <= cap_e and Decimal(row[4]) + dlt <= cap_d
        return accounting.rdp_fits(json.loads(row[5]), charge, s.caps)

    @staticmethod
    def _shortfall(s: Stream, rows, eps, dlt) -> str:
        names = ", ".join(r[0] for r in rows[:5]) + (" ..." if len(rows) > 5 else "")
        if s.mode == accounting.BASIC:
            worst = max(rows, key=lambda r: (Decimal(r[3]), Decimal(r[4])))
            rem_e = s.exact_caps[0] - Decimal(worst[3])
            rem_d = s.exact_caps[1] - Decimal(worst[4])
            return (f"insufficient budget on {len(rows)} block(s) ({names}): requested "
                    f"epsilon={eps}, delta={dlt}; block {worst[0]} has epsilon={rem_e}, "
                    f"delta={rem_d} left (short by epsilon={max(Decimal(0), eps - rem_e)}, "
                    f"delta={max(Decimal(0), dlt - rem_d)})")
        return (f"insufficient budget on {len(rows)} block(s) ({names}): the charge exceeds the "
                f"RDP cap at every order (epsilon_g={s.epsilon_g}, delta_g={s.delta_g})")

    def _deny(self, s: Stream, run_id: str, context: str, request_text: str, reason: str) -> Decision:
        self._audit(s.name, "deny", {"run_id": run_id, "context": context,
                                     "request": json.loads(request_text), "reason": reason})
        return Decision(False, None, reason)

    def _charge(self, s: Stream, run_id, context, request_text, rows, cost, dec_cost, event_json,
                charge, release: bool) -> Grant:
        eps, dlt = cost
        grant_id = uuid.uuid4().hex
        now = _now()
        block_ids = [r[0] for r in rows]
        updates, retired = [], []
        probe = (accounting.rdp_curve(accounting.laplace_event(s.retire_epsilon), s.orders)
                 if s.mode == accounting.RDP else None)
        retire_e = accounting.exact(s.retire_epsilon)
        for r in rows:
            if s.mode == accounting.BASIC:
                new_e = Decimal(r[3]) + dec_cost[0]
                new_d = Decimal(r[4]) + dec_cost[1]
                still = new_e + retire_e <= s.exact_caps[0]
                updates.append((str(new_e), str(new_d), None, r[7]))
            else:
                curve = [x + c for x, c in zip(json.loads(r[5]), charge)]
                still = accounting.rdp_fits(curve, probe, s.caps)
                updates.append((r[3], r[4], json.dumps(curve), r[7]))
            if not still:
                retired.append(r)
        self._update_budgets(updates)
        status = RELEASED if release else RESERVED
        self._q("INSERT INTO grants (grant_id, stream, context, run_id, request, mode, epsilon, "
                "delta, event, blocks, status, created_at, released_at) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (grant_id, s.name, context, run_id, request_text, s.mode, eps, dlt, event_json,
                 json.dumps(block_ids), status, now, now if release else None))
        self._audit(s.name, "grant", {
            "grant_id": grant_id, "run_id": run_id, "context": context, "blocks": block_ids,
            "epsilon": eps, "delta": dlt,
            "event": json.loads(event_json) if event_json else None, "status": status})
        for r in retired:
            self._q("UPDATE budgets SET status = ? WHERE id = ?", (RETIRED, r[7]))
            self._audit(s.name, "retire", {"block": r[0], "context": context,
                                           "reason": "budget exhausted", "grant_id": grant_id})
        return Grant(grant_id, run_id, s.name, context, s.mode, eps, dlt,
                     accounting.event_from_json(event_json) if event_json else None,
                     tuple(GrantedBlock(r[0], r[6] if release else None) for r in rows),
                     status, now)

    # -- grants --

    def _load_grant(self, grant_id: str) -> Grant:
        row = self._q("SELECT grant_id, run_id, stream, context, mode, epsilon, delta, event, "
                      "blocks, status, created_at FROM grants WHERE grant_id = ?",
                      (grant_id,)).fetchone()
        if row is None:
            raise InvalidRequestError(f"unknown grant {grant_id!r}")
        ids = json.loads(row[8])
        if row[9] == RELEASED:
            locs = {}
            for k in range(0, len(ids), 500):
                chunk = ids[k:k + 500]
                locs.update(self._q(
                    "SELECT block_id, location FROM blocks WHERE stream = ? AND block_id IN "
                    f"({','.join('?' * len(chunk))})", [row[2]] + chunk).fetchall())
            granted = tuple(GrantedBlock(b, locs[b]) for b in ids)
        else:
            granted = tuple(GrantedBlock(b, None) for b in ids)
        return Grant(row[0], row[1], row[2], row[3], row[4], row[5], row[6],
                     accounting.event_from_json(row[7]) if row[7] else None,
                     granted, row[9], row[10])

    def grant(self, grant_id: str) -> Grant:
        """The grant with this id. Raises InvalidRequestError if there is none."""
        return self._load_grant(grant_id)

    def grant_for_run(self, stream: str, run_id: str) -> Optional[Grant]:
        row = self._q("SELECT grant_id FROM grants WHERE stream = ? AND run_id = ?",
                      (stream, run_id)).fetchone()
        return self._load_grant(row[0]) if row else None

    def grants(self, stream: str) -> list[Grant]:
        ids = [r[0] for r in self._q("SELECT grant_id FROM grants WHERE stream = ? "
                                     "ORDER BY created_at", (stream,)).fetchall()]
        return [self._load_grant(g) for g in ids]

    def release(self, grant_id: str) -> Grant:
        """Releases a reserved grant's data: only now are block locations handed out."""
        def txn():
            row = self._q("SELECT status, stream FROM grants WHERE grant_id = ?", (grant_id,)).fetchone()
            if row is None:
                raise InvalidRequestError(f"unknown grant {grant_id!r}")
            if row[0] == CANCELLED:
                raise GrantStateError(f"grant {grant_id} was cancelled; request a new one")
            if row[0] == RESERVED:
                self._q("UPDATE grants SET status = ?, released_at = ? WHERE grant_id = ?",
                        (RELEASED, _now(), grant_id))
                self._audit(row[1], "release", {"grant_id": grant_id})
            return self._load_grant(grant_id)

        return self._write(txn)

    def cancel(self, grant_id: str) -> Grant:
        """Cancels a reservation that never released data and refunds its charge.

        A block the reservation retired stays retired (the conservative choice).

        Raises:
          GrantStateError: the grant released data (never refunded) or is already cancelled.
        """
        def txn():
            row = self._q("SELECT status, stream, context FROM grants WHERE grant_id = ?",
                          (grant_id,)).fetchone()
            if row is None:
                raise InvalidRequestError(f"unknown grant {grant_id!r}")
            if row[0] != RESERVED:
                raise GrantStateError(
                    f"grant {grant_id} is {row[0]}: only a reservation that never released data "
                    "can be cancelled; released data stays charged")
            stream, context = row[1], row[2]
            self._q("UPDATE grants SET status = ? WHERE grant_id = ?", (CANCELLED, grant_id))
            blocks = json.loads(self._q("SELECT blocks FROM grants WHERE grant_id = ?",
                                        (grant_id,)).fetchone()[0])
            s = self.stream(stream)
            derived = self._derived_states(s, context)
            for b in blocks:
                eps, dlt, curve, n = derived.get(b, (Decimal(0), Decimal(0), [0.0] * len(s.orders), 0))
                self._q("UPDATE budgets SET eps_spent = ?, delta_spent = ?, rdp = ?, charges = ? "
                        "WHERE stream = ? AND context = ? AND block_id = ?",
                        (str(eps), str(dlt), json.dumps(curve) if s.mode == accounting.RDP else None,
                         n, stream, context, b))
            self._audit(stream, "cancel", {"grant_id": grant_id, "blocks": blocks})
            return self._load_grant(grant_id)

        return self._write(txn)

    def _derived_states(self, s: Stream, context: str) -> dict:
        """Every charged block's (ε, δ, RDP curve, charges) recomputed from non-cancelled grants."""
        out: dict = {}
        rows = self._q("SELECT epsilon, delta, event, blocks FROM grants WHERE stream = ? AND "
                       "context = ? AND status <> ? ORDER BY created_at, grant_id",
                       (s.name, context, CANCELLED)).fetchall()
        for e, d, ev, blocks in rows:
            curve = accounting.rdp_curve(accounting.event_from_json(ev), s.orders) if ev else None
            for b in json.loads(blocks):
                eps, dlt, acc, n = out.get(b, (Decimal(0), Decimal(0), [0.0] * len(s.orders), 0))
                if s.mode == accounting.BASIC:
                    eps, dlt = eps + accounting.exact(e), dlt + accounting.exact(d)
                else:
                    acc = [x + y for x, y in zip(acc, curve)]
                out[b] = (eps, dlt, acc, n + 1)
        return out

    # -- audit and consistency --

    def audit_log(self, stream: Optional[str] = None, limit: Optional[int] = None) -> list[AuditEntry]:
        """Audit entries, oldest first (the last ``limit`` if given)."""
        sql = "SELECT seq, ts, stream, kind, payload, prev_hash, hash FROM audit"
        params: list = []
        if stream is not None:
            sql += " WHERE stream = ?"
            params.append(stream)
        sql += " ORDER BY seq DESC" if limit else " ORDER BY seq"
        if limit:
            sql += " LIMIT ?"
            params.append(int(limit))
        rows = self._q(sql, params).fetchall()
        if limit:
            rows.reverse()
        return [AuditEntry(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6]) for r in rows]

    def verify_audit(self) -> AuditReport:
        """Recomputes the hash chain from the first entry to the head; reports the first break."""
        prev = GENESIS_HASH
        n = 0
        cur = self._q("SELECT seq, ts, stream, kind, payload, prev_hash, hash FROM audit ORDER BY seq")
        for seq, ts, stream, kind, payload, prev_hash, digest in cur:
            n += 1
            if seq != n:
                return AuditReport(False, n - 1, seq, f"entry {n} is missing (found seq {seq})")
            if prev_hash != prev or _audit_hash(prev, seq, ts, stream, kind, payload) != digest:
                return AuditReport(False, n - 1, seq, f"entry {seq} does not match its hash chain")
            prev = digest
        head_seq, head_hash = self._q(
            "SELECT audit_seq, audit_hash FROM ledger_head WHERE id = 1").fetchone()
        if head_seq != n or head_hash != prev:
            return AuditReport(False, n, n + 1,
                               f"chain ends at entry {n} but the head records entry {head_seq}")
        return AuditReport(True, n, None, f"{n} entries, chain intact")

    def check_consistency(self, stream: str) -> list[str]:
        """Problems found by recomputing every block's budget from grants (empty list: none).

        Checks: cached budget == derived budget; no block above its cap; every non-cancelled
        grant has an audit entry.
        """
        s = self.stream(stream)
        problems = []
        for context in s.contexts:
            rows = self._q("SELECT block_id, eps_spent, delta_spent, rdp, charges FROM budgets "
                           "WHERE stream = ? AND context = ?", (stream, context)).fetchall()
            derived = self._derived_states(s, context)
            for block_id, e, d, rdp, charges in rows:
                eps, dlt, curve, n = derived.get(
                    block_id, (Decimal(0), Decimal(0), [0.0] * len(s.orders), 0))
                if s.mode == accounting.BASIC:
                    if Decimal(e) != eps or Decimal(d) != dlt or charges != n:
                        problems.append(f"{context}/{block_id}: cached ({e}, {d}, {charges}) != "
                                        f"derived ({eps}, {dlt}, {n})")
                    if eps > accounting.exact(s.epsilon_g) or dlt > accounting.exact(s.delta_g):
                        problems.append(f"{context}/{block_id}: over cap ({eps}, {dlt})")
                else:
                    cached = json.loads(rdp)
                    if charges != n or any(not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
                                           for a, b in zip(cached, curve)):
                        problems.append(f"{context}/{block_id}: cached RDP != derived RDP")
                    if n and not any(x <= cap for x, cap in zip(curve, s.caps)):
                        problems.append(f"{context}/{block_id}: over the RDP cap at every order")
        audited = {e.payload["grant_id"] for e in self.audit_log(stream) if e.kind == "grant"}
        for (gid,) in self._q("SELECT grant_id FROM grants WHERE stream = ?", (stream,)).fetchall():
            if gid not in audited:
                problems.append(f"grant {gid} has no audit entry")
        return problems


def open_ledger(url: str) -> Ledger:
    """Opens (creating if needed) the ledger at a database URL.

    ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or
    ``postgresql://user@host:port/dbname``.
    """
    return Ledger(url)
