"""The ledger's storage: SQLite and PostgreSQL dialects, the schema and write transactions.

SQLite (``sqlite:///path``) is the embedded default: WAL journal with ``synchronous=FULL``, so an
acknowledged grant is on disk, and an OS file lock that queues writers. PostgreSQL
(``postgresql://user@host:port/db``) is for a ledger shared by many machines. All writers
serialize on one lock (SQLite's write lock, a row lock on ``ledger_head`` in PostgreSQL), which
also orders the audit chain. :class:`Store` is the only code that talks to the database driver.
"""
from __future__ import annotations

import fcntl
import os
from typing import Any, Callable, Iterable, Optional, Sequence

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger.audit import GENESIS_HASH

SCHEMA_VERSION = 1


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



class Store:
    """One connection to the ledger database, with the dialect's write transactions.

    ``before_commit`` is a fault-injection point for crash tests: when set, it is called inside
    every write transaction right before COMMIT.
    """

    def __init__(self, url: str):
        self.url = url
        self.backend = _backend_for(url)
        self.conn = self.backend.connect()
        self.before_commit: Optional[Callable[[], None]] = None
        self._init_schema()

    @property
    def kind(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self.backend.kind

    def close(self) -> None:
        self.conn.close()

    def q(self, sql: str, params: Sequence = ()) -> Any:
        """Executes one statement written with ``?`` placeholders; returns the cursor."""
        return self.conn.execute(self.backend.sql(sql), tuple(params))

    def many(self, sql: str, rows: Iterable[Sequence]) -> None:
        """Executes one statement for each row of parameters."""
        sql = self.backend.sql(sql)
        if self.kind == "sqlite":
            self.conn.executemany(sql, rows)
        else:
            with self.conn.cursor() as cur:
                cur.executemany(sql, list(rows))

    def update_budgets(self, updates: list) -> None:
        """Writes (eps_spent, delta_spent, rdp or None, budget id) rows and counts one charge."""
        if self.kind == "sqlite":
            self.conn.executemany(
                "UPDATE budgets SET eps_spent = ?, delta_spent = ?, rdp = COALESCE(?, rdp), "
                "charges = charges + 1 WHERE id = ?", updates)
            return
        # PostgreSQL: one statement for all blocks (executemany would be a round trip per row).
        values = ",".join(["(%s, %s, %s::text, %s::bigint)"] * len(updates))
        self.conn.execute(
            "UPDATE budgets AS u SET eps_spent = v.e, delta_spent = v.d, "
            "rdp = COALESCE(v.r, u.rdp), charges = u.charges + 1 "
            f"FROM (VALUES {values}) AS v(e, d, r, id) WHERE u.id = v.id",
            [x for row in updates for x in row])

    def write(self, fn: Callable[[], Any]) -> Any:
        """Runs ``fn`` inside one serialized write transaction; commits or rolls back."""
        self.backend.begin_write(self.conn)
        try:
            result = fn()
            if self.before_commit is not None:
                self.before_commit()
            self.conn.execute("COMMIT")
            return result
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        finally:
            self.backend.end_write(self.conn)

    def _init_schema(self) -> None:
        if self.kind == "sqlite":
            self.conn.execute("BEGIN IMMEDIATE")
        else:
            self.conn.execute("BEGIN")
            self.conn.execute("SELECT pg_advisory_xact_lock(727272)")
        try:
            for stmt in _schema(self.backend):
                self.conn.execute(stmt)
            row = self.q("SELECT audit_seq FROM ledger_head WHERE id = 1").fetchone()
            if row is None:
                self.q("INSERT INTO ledger_head (id, audit_seq, audit_hash, schema_version) "
                       "VALUES (1, 0, ?, ?)", (GENESIS_HASH, SCHEMA_VERSION))
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
