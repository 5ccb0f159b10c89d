"""The ledger's storage: SQLite and PostgreSQL dialects, the schema and write transactions.

SQLite (``sqlite:///path``) is the embedded default, a file created 0600: WAL journal; COMMIT
runs with ``synchronous=NORMAL`` under the write lock and the writer fsyncs the WAL after
releasing it and before ``request()`` returns, so an acknowledged grant has been fsynced to the
WAL and survives a crash of the writer *and* a power loss (``?durability=process`` drops the
power-loss promise).
Writers queue on an OS file lock and then take SQLite's write lock; one chain orders the audit.

PostgreSQL (``postgresql://user@host:port/db``) is for a ledger shared by many machines. There is
no global lock: a write transaction locks the budget rows it charges (``FOR UPDATE``, in one
global order: ascending block ``seq`` within a (stream, context)), then the head of any free audit
chain (:mod:`~sage_tfx.ledger.audit` explains why that is still a verifiable total order). A
basic-mode request is one statement, a server-side procedure, in one round trip
(:mod:`~sage_tfx.ledger.pgrequest`);
the general path runs in two (psycopg pipeline mode): [BEGIN, the run-id check, the locked
budget rows, an audit chain head] and [the writes, COMMIT]. Deadlocks, serialisation failures
and unique-key races are retried with jittered exponential backoff; an idempotent write (a
request: its run id makes it so) is also retried on a fresh connection when the server ends the
session. Bulk block registration uses COPY.

:class:`Store` is the only code that talks to the database driver.
"""
from __future__ import annotations

import fcntl
import os
import random
import time
from typing import Any, Callable, Iterable, Optional, Sequence

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import audit, schema
from sage_tfx.ledger.queries import LOCATION
from sage_tfx.ledger.values import ACTIVE, now

# Conflicts and lost sessions are retried until this many seconds have passed (a deadline, not
# a count of attempts: under load and repeated session terminations a request keeps trying).
RETRY_SECONDS = 120.0
CHECKPOINT_EVERY = 64  # SQLite: commits of one connection between its WAL checkpoints
APPLICATION_NAME = "sage-tfx-ledger"  # PostgreSQL sessions of the ledger (pg_stat_activity)

# Request-path budget rows: (block_id, seq, status, eps, delta, rdp, location, budget row id).
BUDGET_ROWS = ("SELECT u.block_id, u.seq, u.status, u.eps_spent, u.delta_spent, u.rdp, "
               f"{LOCATION}, u.id FROM budgets u WHERE u.stream = ? AND u.context = ? ")


class _Rows:
    """Rows of several cursors, fetched when asked (after a pipeline sync on PostgreSQL)."""

    def __init__(self, cursors: list):
        self._cursors = cursors

    def fetchall(self) -> list:
        return [r for c in self._cursors for r in c.fetchall()]


class _Backend:
    """Connection handling and SQL dialect of one database kind."""

    kind = ""
    real = "REAL"
    bigint = "INTEGER"
    blob = "BLOB"
    serial_pk = "INTEGER PRIMARY KEY"
    lock = ""  # suffix that locks the budget rows a query returns
    hot = ""  # storage options of the budgets table
    budget_fk = ", FOREIGN KEY (stream, block_id) REFERENCES blocks(stream, block_id)"
    block_fk = " REFERENCES streams(stream)"

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

    def synced(self, conn) -> None:
        """Called after a commit, outside the write lock, before the write is acknowledged."""

    def retry_kind(self, exc: BaseException) -> Optional[str]:
        """``"conflict"`` or ``"disconnect"`` for a failure worth retrying, else None."""
        return None


class _SqliteBackend(_Backend):
    kind = "sqlite"

    def __init__(self, url: str):
        super().__init__(url)
        path, _, query = url[len("sqlite:///"):].partition("?")
        if not path:
            raise InvalidRequestError(f"sqlite URL needs a path: {url!r}")
        opts = dict(kv.partition("=")[::2] for kv in query.split("&") if kv)
        self.durability = opts.pop("durability", "power")
        if self.durability not in ("power", "process") or opts:
            raise InvalidRequestError(
                f"bad sqlite URL options in {url!r}: the only option is durability=power "
                "(default: an acknowledged grant survives power loss) or durability=process "
                "(it survives the writer's crash, kill -9; the newest grants may be lost on "
                "power loss)")
        self.path = path
        self._lock_fd: Optional[int] = None
        self._wal_fd: Optional[int] = None
        self._commits = 0

    def connect(self):
        import sqlite3
        create_private(self.path)
        conn = sqlite3.connect(self.path, timeout=120.0, isolation_level=None,
                               check_same_thread=False, cached_statements=256)
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL: COMMIT writes the WAL without fsync, so a committed transaction survives the
        # writer's crash (it is in the OS page cache). durability=power then fsyncs the WAL in
        # :meth:`synced`, after the write lock is released and before the write is acknowledged:
        # concurrent writers' fsyncs overlap (a group commit), and what a power loss keeps is a
        # prefix of the commits (WAL frames carry cumulative checksums) that holds every
        # acknowledged one. Checkpoints fsync the WAL before and the database after copying.
        conn.execute("PRAGMA synchronous=NORMAL")
        # Checkpoints (which fsync) run in :meth:`synced`, outside the write lock; SQLite's own,
        # inside a commit, only if those fall behind (e.g. many short-lived writers).
        conn.execute("PRAGMA wal_autocheckpoint=4000")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=120000")
        return conn

    def begin_write(self, conn) -> None:
        # Writers queue on an OS file lock first: SQLite's own busy handler polls with sleeps
        # of up to 100 ms, which would dominate tail latency with many writers. The lock is
        # released by the kernel if the process dies.
        if self._lock_fd is None:
            self._lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except BaseException:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            raise

    def end_write(self, conn) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def synced(self, conn) -> None:
        """Makes every committed transaction durable against power loss (durability=power)."""
        self._commits += 1
        if self._commits % CHECKPOINT_EVERY == 0:
            # PASSIVE: copies what it can without waiting for, or blocking, any writer.
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        if self.durability != "power":
            return
        if self._wal_fd is None:
            # The WAL exists while this connection is open (SQLite removes it with the last one).
            self._wal_fd = os.open(self.path + "-wal", os.O_RDONLY)
        os.fdatasync(self._wal_fd)


class _PostgresBackend(_Backend):
    kind = "postgresql"
    real = "DOUBLE PRECISION"
    bigint = "BIGINT"
    blob = "BYTEA"
    serial_pk = "BIGSERIAL PRIMARY KEY"
    lock = " FOR UPDATE OF u"
    # Room in each page for the charged row's new version: HOT updates skip the index writes.
    hot = " WITH (fillfactor = 60)"
    # No foreign keys from budgets to blocks and from blocks to streams: their per-row triggers
    # (a locking lookup per row) were most of bulk registration. Block and budget rows are only
    # written together, by add_blocks' one transaction, which holds the stream row FOR UPDATE;
    # nothing deletes a stream, block or budget row; check_consistency checks the pairing.
    budget_fk = block_fk = ""

    def connect(self):
        import psycopg
        return psycopg.connect(self.url, autocommit=True, application_name=APPLICATION_NAME,
                               options="-c synchronous_commit=on")

    def sql(self, text: str) -> str:
        return text.replace("?", "%s")

    def begin_write(self, conn) -> None:
        conn.execute("BEGIN")

    def retry_kind(self, exc: BaseException) -> Optional[str]:
        import psycopg
        from psycopg import errors
        if isinstance(exc, (errors.SerializationFailure, errors.DeadlockDetected,
                            errors.UniqueViolation, errors.LockNotAvailable)):
            return "conflict"
        if isinstance(exc, (errors.AdminShutdown, errors.QueryCanceled, psycopg.OperationalError,
                            psycopg.InterfaceError)):
            return "disconnect"
        return None


def create_private(path: str) -> None:
    """Creates the SQLite file ``path`` empty and 0600 unless it exists (SQLite makes its
    ``-wal`` and ``-shm`` files with the database's mode). Whoever can write the file can
    rewrite the ledger; whoever can read it can read wrapped block keys and token digests."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        pass


def _backend_for(url: str) -> _Backend:
    if url.startswith("sqlite:///"):
        return _SqliteBackend(url)
    if url.startswith(("postgresql://", "postgres://")):
        return _PostgresBackend(url)
    from sage_tfx.ledger import secrets
    raise InvalidRequestError(
        f"unsupported ledger URL {secrets.redact(url)!r}: use sqlite:///path/to/ledger.db or "
        "postgresql://user@host:port/dbname")


class Store:
    """One connection to the ledger database, with the dialect's write transactions.

    Audit entries of a write transaction are buffered (:meth:`audit`) and chained at commit.
    ``before_commit`` is a fault-injection point for crash tests: when set, it is called inside
    every write transaction right before COMMIT.
    """

    def __init__(self, url: str):
        self.url = url
        self.backend = _backend_for(url)
        self.before_commit: Optional[Callable[[], None]] = None
        self._pending: list[tuple[Optional[str], str, str]] = []
        self._chain_cur: Any = None
        self._analyze: set = set()
        self._flush_after_unlock = False
        self.principal = "local"  # who writes: set by the Ledger once the caller is identified
        # PostgreSQL: a role other than the ledger's owner (pgroles.restricted)
        self.restricted = False
        deadline = time.monotonic() + RETRY_SECONDS
        attempt = 0
        while True:
            try:
                self.conn = self.backend.connect()
                schema.init(self)
                break
            except Exception as exc:  # a session ended by the server while opening: reopen
                if self.backend.retry_kind(exc) is None or time.monotonic() >= deadline:
                    raise
                attempt += 1
                time.sleep(min(0.5, 0.01 * attempt))

    @property
    def kind(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self.backend.kind

    def close(self) -> None:
        """Closes the connection and the SQLite lock and WAL file descriptors."""
        self.conn.close()
        for name in ("_lock_fd", "_wal_fd"):
            fd = getattr(self.backend, name, None)
            if fd is not None:
                os.close(fd)
                setattr(self.backend, name, None)

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

    def bulk_insert(self, table: str, columns: Sequence[str], rows: Sequence[Sequence]) -> None:
        """Inserts many rows: executemany on SQLite, COPY on PostgreSQL."""
        cols = ", ".join(columns)
        if self.kind == "sqlite":
            marks = ",".join("?" * len(columns))
            self.conn.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", rows)
            return
        from psycopg import errors
        try:
            with self.conn.cursor() as cur, cur.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        except errors.UniqueViolation as exc:  # the key is the check (see :meth:`existing`)
            raise InvalidRequestError(f"already registered: {exc.diag.message_detail}") from exc
        self._analyze.add(table)

    def add_budgets(self, stream: str, contexts: Sequence[str], first_seq: int, count: int,
                    zero_rdp: Optional[str]) -> None:
        """Fresh budget rows, one per context, for the blocks just added with these ``seq``.

        Made from the block rows by the server (one INSERT ... SELECT per context over the
        (stream, seq) key), so the blocks travel to the database once.
        """
        for context in contexts:
            self.q("INSERT INTO budgets (stream, context, block_id, seq, status, eps_spent, "
                   "delta_spent, rdp, charges, location) SELECT stream, ?, block_id, seq, ?, '0', "
                   "'0', ?, 0, location FROM blocks WHERE stream = ? AND seq >= ? AND seq < ? "
                   "ORDER BY seq",
                   (context, ACTIVE, zero_rdp, stream, first_seq, first_seq + count))
        self._analyze.add("budgets")

    def analyze(self) -> None:
        """Refreshes the planner statistics of tables that grew in bulk (PostgreSQL)."""
        for table in sorted(self._analyze):
            self.conn.execute(f"ANALYZE {table}")
        self._analyze.clear()

    def existing(self, stream: str, block_ids: Sequence[str]) -> Optional[str]:
        """One of ``block_ids`` already registered in ``stream``, or None.

        PostgreSQL: always None; :meth:`bulk_insert`'s COPY reports the violated key instead.
        """
        if self.kind == "postgresql":
            return None
        for k in range(0, len(block_ids), 500):
            chunk = list(block_ids[k:k + 500])
            row = self.q(f"SELECT block_id FROM blocks WHERE stream = ? AND block_id IN "
                         f"({','.join('?' * len(chunk))}) LIMIT 1", [stream] + chunk).fetchone()
            if row:
                return row[0]
        return None

    # -- the request path (queued statements: results are read after the pipeline syncs) --

    def budget_rows(self, stream: str, context: str, block_ids: Sequence[str]) -> _Rows:
        """The request-path rows of these blocks, locked on PostgreSQL, in ascending seq."""
        if self.kind == "postgresql":
            # The id list drives the join: one key lookup per block, whatever the statistics.
            return _Rows([self.q(
                "SELECT u.block_id, u.seq, u.status, u.eps_spent, u.delta_spent, u.rdp, "
                f"{LOCATION}, u.id FROM unnest(?::text[]) AS k(block_id) JOIN budgets u ON "
                "u.stream = ? AND u.context = ? AND u.block_id = k.block_id ORDER BY u.seq" +
                self.backend.lock, (list(block_ids), stream, context))])
        curs = []
        for k in range(0, len(block_ids), 500):
            chunk = list(block_ids[k:k + 500])
            curs.append(self.q(BUDGET_ROWS + f"AND u.block_id IN ({','.join('?' * len(chunk))})",
                               [stream, context] + chunk))
        return _Rows(curs)

    def window_rows(self, stream: str, context: str, status: str, page: int) -> _Rows:
        """The rows of the ``page`` most recent blocks that had ``status`` (locked, ascending).

        A row's status may have changed between choosing and locking (PostgreSQL): the caller
        re-checks it. Reads only the newest ``page`` entries of the (stream, context, status,
        seq) index, never the whole stream.
        """
        # The newest ids drive the join (by row id: one lookup each, whatever the statistics).
        return _Rows([self.q(
            "SELECT u.block_id, u.seq, u.status, u.eps_spent, u.delta_spent, u.rdp, "
            f"{LOCATION}, u.id FROM (SELECT id FROM budgets WHERE stream = ? AND context = ? "
            "AND status = ? ORDER BY seq DESC LIMIT ?) AS c JOIN budgets u ON u.id = c.id "
            "ORDER BY u.seq" + self.backend.lock,
            (stream, context, status, page))])

    def reserve_audit(self) -> None:
        """Queues the lock of an audit chain head (PostgreSQL), after the row locks taken so far."""
        if self.kind == "postgresql" and self._chain_cur is None:
            self._chain_cur = self.conn.execute("SELECT * FROM sage_audit_chain()")

    def audit(self, stream: Optional[str], kind: str, payload: dict) -> None:
        """Buffers one audit entry of the current write transaction (chained at commit).

        Every entry names the principal that made the change (``principal``)."""
        payload = dict(payload, principal=self.principal)
        self._pending.append((stream, kind, audit.payload_text(payload)))

    def update_budgets(self, updates: list) -> None:
        """Writes (eps_spent, delta_spent, rdp or None, budget id) rows and counts one charge.

        ``status`` is not written here: an indexed column, rewritten only on retirement.
        """
        if self.kind == "sqlite":
            self.conn.executemany(
                "UPDATE budgets SET eps_spent = ?, delta_spent = ?, rdp = COALESCE(?, rdp), "
                "charges = charges + 1 WHERE id = ?", updates)
            return
        # PostgreSQL: one statement for all blocks, its text the same for any number of blocks
        # (so the server prepares and plans it once per connection).
        cols = list(zip(*updates))
        self.conn.execute(
            "UPDATE budgets AS u SET eps_spent = v.e, delta_spent = v.d, "
            "rdp = COALESCE(v.r, u.rdp), charges = u.charges + 1 "
            "FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[]) AS v(e, d, r, id) "
            "WHERE u.id = v.id", [list(c) for c in cols])

    def _flush_audit(self) -> None:
        if not self._pending:
            return
        n = len(self._pending)
        if self.kind == "sqlite":
            chain = 1
            head = self.q("SELECT audit_seq, audit_hash FROM ledger_head WHERE id = 1").fetchone()
            seqs = list(range(head[0] + 1, head[0] + 1 + n))
        else:
            self.reserve_audit()
            chain, last_seq, last_hash, first = self._chain_cur.fetchone()
            head = (last_seq, last_hash)
            seqs = [first]
            if n > 1:
                seqs += sorted(r[0] for r in self.q(
                    "SELECT nextval('audit_seq_gen') FROM generate_series(1, ?)", (n - 1,)))
        rows = audit.link(head, seqs, now(), self._pending)
        self.many("INSERT INTO audit (seq, ts, stream, kind, payload, prev_hash, hash, chain) "
                  "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [r + (chain,) for r in rows])
        self.q("UPDATE ledger_head SET audit_seq = ?, audit_hash = ? WHERE id = ?",
               (rows[-1][0], rows[-1][6], chain))

    def write(self, fn: Callable[[], Any], *, pipeline: bool = False, idempotent: bool = False,
              flush_after_unlock: bool = False) -> Any:
        """Runs ``fn`` inside one write transaction; commits, or rolls back and re-raises.

        Conflicts (deadlock, serialisation failure, unique-key race) are retried with backoff;
        with ``idempotent`` a lost session is retried on a new connection. ``pipeline`` batches
        the statements into round trips on PostgreSQL (``fn`` must not use COPY).

        ``flush_after_unlock`` (PostgreSQL, as SQLite always does): ``fn`` has set
        ``synchronous_commit`` off for its transaction, so COMMIT does not wait for the WAL
        flush and the row locks are released at once; a second transaction, queued in the
        same round trip, then commits with ``synchronous_commit=on`` and so waits until the WAL
        is flushed past its own commit record, which lies after ours. The write is acknowledged
        only then: it survives a crash of the server or machine. A commit that became visible
        but was never flushed can be lost only together with every later one (the WAL is a
        sequence), and nobody was told it happened.
        """
        def once():
            self._flush_after_unlock = flush_after_unlock and self.kind == "postgresql"
            result = self._write_once(fn, pipeline and self.kind == "postgresql")
            self.backend.synced(self.conn)
            return result

        return self.retrying(once, idempotent)

    def read(self, fn: Callable[[], Any]) -> Any:
        """Runs the reads of ``fn``; on a lost session, again on a new connection."""
        return self.retrying(fn, idempotent=True)

    def retrying(self, fn: Callable[[], Any], idempotent: bool) -> Any:
        """``fn()``, retried on conflicts and, if ``idempotent``, on a lost session, until
        :data:`RETRY_SECONDS` have passed (jittered exponential backoff, capped at 0.5 s)."""
        attempt = 0
        deadline = time.monotonic() + RETRY_SECONDS
        while True:
            try:
                return fn()
            except Exception as exc:
                kind = self.backend.retry_kind(exc) or self._lost_session(exc)
                if kind is None or time.monotonic() >= deadline or (kind == "disconnect"
                                                                    and not idempotent):
                    raise
                time.sleep(min(0.5, 0.002 * 2 ** min(attempt, 10)) * random.uniform(0.5, 1.5))
                if kind == "disconnect":
                    self._reconnect()
                attempt += 1

    def _lost_session(self, exc: BaseException) -> Optional[str]:
        """``"disconnect"`` when a PostgreSQL session died under another error: psycopg can
        raise a plain ``ValueError`` from its prepared-statement path when the server ends the
        session mid-statement (seen with ``pg_terminate_backend`` during ``CALL``)."""
        if self.kind != "postgresql" or isinstance(exc, (KeyboardInterrupt, SystemExit)):
            return None
        from psycopg import pq
        conn = self.conn
        if conn.broken or conn.closed or conn.pgconn.status == pq.ConnStatus.BAD:
            return "disconnect"
        return None

    def _write_once(self, fn: Callable[[], Any], pipeline: bool) -> Any:
        self._pending, self._chain_cur = [], None
        try:
            if pipeline:
                with self.conn.pipeline():
                    return self._txn(fn)
            return self._txn(fn)
        except BaseException:
            try:
                self.conn.execute("ROLLBACK")
            except Exception:  # the session is gone: the server rolled back
                pass
            raise
        finally:
            self._pending, self._chain_cur = [], None
            self.backend.end_write(self.conn)

    def _txn(self, fn: Callable[[], Any]) -> Any:
        self.backend.begin_write(self.conn)
        result = fn()
        self._flush_audit()
        if self.before_commit is not None:
            self.before_commit()
        self.conn.execute("COMMIT")
        if self._flush_after_unlock:  # writes WAL, so its commit waits for the WAL flush
            # (a transaction that only took an xid, without WAL, would commit unflushed)
            self.conn.execute("SELECT pg_logical_emit_message(true, 'sage-flush', '')")
        return result

    def _reconnect(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass
        try:
            self.conn = self.backend.connect()
        except Exception as exc:  # still down: the next attempt fails on the closed connection
            if self.backend.retry_kind(exc) != "disconnect":
                raise

    def read_snapshot(self, fn: Callable[[], Any]) -> Any:
        """Runs the reads of ``fn`` on one consistent snapshot of the database."""
        self.conn.execute("BEGIN" if self.kind == "sqlite"
                          else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            return fn()
        finally:
            self.conn.execute("COMMIT")
