"""The PTK lake (PTK paper §5.1): registry, versioned DP states with lineage, subscriptions,
the notification outbox, plans and the training windows, in their own ``ptk_*`` tables of the
ledger's database (same URL: ``sqlite:///path`` or ``postgresql://...``).

Only DP outputs are stored here. The one non-DP thing the store holds is a window's raw block
files (``ptk_windows`` lists their paths), encrypted with the window's data key, whose wrapped
form is in ``ptk_window_keys``; :meth:`Lake.close_window` deletes the key (crypto-shredding) and
then the files when the window closes. ``ptk_profiles`` records each profile run before it is
charged, so a crashed profile is finished (released) when its window closes.

Every change of the registry bumps the plan sequence in the same transaction
(:meth:`Lake.commit_plan`), so two processes that register at once never lose a PTK: the
second one sees the sequence moved and re-plans. This module is the only code of the PTK store
that talks to the database driver; it uses its own connection (the ledger URL, references
resolved) and never touches the ledger's tables.
"""
from __future__ import annotations

import json
import os
import threading
from typing import Any, Callable, Optional, Sequence

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import secrets
from sage_tfx.ledger.values import now  # the ledger's timestamps (ISO-8601, UTC, µs)
from sage_tfx.ptk.allocator import Allocation
from sage_tfx.ptk.results import OutboxEntry, ProfileRun, PTKRecord, PTKVersion, WindowInfo

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS ptk_registry (
        ptk_id TEXT PRIMARY KEY, name TEXT NOT NULL, train_dp_ref TEXT NOT NULL,
        eval_ref TEXT NOT NULL, dp_event_ref TEXT NOT NULL, erm_ref TEXT, config TEXT NOT NULL,
        tau {real} NOT NULL, train_frequency {int} NOT NULL, status TEXT NOT NULL,
        menu TEXT NOT NULL, profile TEXT, registered_window {int}, created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL, ptk_type TEXT)""",
    """CREATE TABLE IF NOT EXISTS ptk_versions (
        ptk_id TEXT NOT NULL, version {int} NOT NULL, window_index {int} NOT NULL,
        state TEXT NOT NULL, config TEXT NOT NULL, epsilon {real} NOT NULL, delta {real} NOT NULL,
        event TEXT NOT NULL, grant_id TEXT NOT NULL, run_id TEXT NOT NULL, stream TEXT NOT NULL,
        blocks TEXT NOT NULL, n_used {int} NOT NULL, partition_index {int} NOT NULL,
        oldest_window {int} NOT NULL, newest_window {int} NOT NULL, created_at TEXT NOT NULL,
        PRIMARY KEY (ptk_id, version), UNIQUE (ptk_id, window_index))""",
    """CREATE TABLE IF NOT EXISTS ptk_subscriptions (
        ptk_id TEXT NOT NULL, endpoint TEXT NOT NULL, created_at TEXT NOT NULL,
        PRIMARY KEY (ptk_id, endpoint))""",
    """CREATE TABLE IF NOT EXISTS ptk_outbox (
        ptk_id TEXT NOT NULL, version {int} NOT NULL, endpoint TEXT NOT NULL,
        attempts {int} NOT NULL, status TEXT NOT NULL, last_error TEXT, updated_at TEXT NOT NULL,
        PRIMARY KEY (ptk_id, version, endpoint))""",
    """CREATE TABLE IF NOT EXISTS ptk_plans (
        plan_seq {int} PRIMARY KEY, plan TEXT NOT NULL, created_at TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS ptk_windows (
        window_index {int} PRIMARY KEY, status TEXT NOT NULL, files TEXT NOT NULL,
        blocks TEXT NOT NULL, records {int} NOT NULL, plan_seq {int}, opened_at TEXT NOT NULL,
        closed_at TEXT, schema TEXT, unfit TEXT)""",
    """CREATE TABLE IF NOT EXISTS ptk_window_keys (
        window_index {int} PRIMARY KEY, stream TEXT NOT NULL, kek_id TEXT NOT NULL,
        wrapped TEXT NOT NULL, created_at TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS ptk_profiles (
        run_id TEXT PRIMARY KEY, ptk_id TEXT NOT NULL, spec TEXT NOT NULL,
        window_index {int} NOT NULL, status TEXT NOT NULL, created_at TEXT NOT NULL)""",
]
_BUILTINS = ("counts", "trees", "hpf", "covariance", "histstats", "lloyd")
REGISTRY_COLS = ("ptk_id", "name", "ptk_type", "train_dp_ref", "eval_ref", "dp_event_ref",
                 "erm_ref", "config", "tau", "train_frequency", "status", "menu", "profile",
                 "registered_window", "created_at", "updated_at")
VERSION_COLS = ("ptk_id", "version", "window_index", "state", "config", "epsilon", "delta",
                "event", "grant_id", "run_id", "stream", "blocks", "n_used", "partition_index",
                "oldest_window", "newest_window", "created_at")
JSON_COLS = {"config", "menu", "profile", "state", "blocks", "files", "spec", "schema", "unfit"}


class LakeDB:
    """One connection to the database of ``url`` with ``?`` placeholders on both dialects."""

    def __init__(self, url: str):
        self.url = url
        url = secrets.resolve(url)
        self._lock = threading.RLock()
        self._depth = 0
        if url.startswith("sqlite:///"):
            import sqlite3

            from sage_tfx.ledger.store import create_private
            path = url[len("sqlite:///"):]
            create_private(path)  # the ledger's file: the same mode whoever opens it first
            self.kind = "sqlite"
            self.conn = sqlite3.connect(path, timeout=120.0, isolation_level=None,
                                        check_same_thread=False)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA busy_timeout=120000")
            real, integer = "REAL", "INTEGER"
        elif url.startswith(("postgresql://", "postgres://")):
            import psycopg
            self.kind = "postgresql"
            self.conn = psycopg.connect(url, autocommit=True)
            real, integer = "DOUBLE PRECISION", "BIGINT"
        else:
            raise InvalidRequestError(f"unsupported database URL {url!r}")
        with self.transaction():
            for stmt in _SCHEMA:
                self.q(stmt.format(real=real, int=integer))
            self._migrate()

    def _columns(self, table: str) -> list[str]:
        if self.kind == "sqlite":
            return [r[1] for r in self.q(f"PRAGMA table_info({table})").fetchall()]
        return [r[0] for r in self.q(
            "SELECT column_name FROM information_schema.columns WHERE table_name = ? AND "
            "table_schema = current_schema()", (table,)).fetchall()]

    def _migrate(self) -> None:
        """Lakes made before the type registry: a ``ptk_type`` column, filled for the built-in
        kernels from their recorded references (a string match; nothing is imported). Lakes
        made before windows recorded their columns: ``schema`` and ``unfit`` (NULL: unknown,
        every due PTK trains as it did)."""
        have = self._columns("ptk_windows")
        for col in ("schema", "unfit"):
            if col not in have:
                self.q(f"ALTER TABLE ptk_windows ADD COLUMN {col} TEXT")
        if "ptk_type" not in self._columns("ptk_registry"):
            self.q("ALTER TABLE ptk_registry ADD COLUMN ptk_type TEXT")
            for name in _BUILTINS:
                self.q("UPDATE ptk_registry SET ptk_type = ? WHERE ptk_type IS NULL AND "
                       "train_dp_ref = ?", (name, f"sage_tfx.ptk.kernels.{name}:train_dp"))

    def q(self, sql: str, params: Sequence = ()):
        """Runs ``sql`` (``?`` placeholders) with ``params``; returns the cursor."""
        if self.kind == "postgresql":
            sql = sql.replace("?", "%s")
        with self._lock:
            return self.conn.execute(sql, tuple(params))

    def transaction(self, *, lock_plans: bool = False):
        """One write transaction (re-entrant: an inner ``with`` joins the outer one).
        ``lock_plans`` serialises plan changes on PostgreSQL (SQLite's BEGIN IMMEDIATE already
        serialises every writer)."""
        db = self

        class _Txn:
            def __enter__(self):
                db._lock.acquire()
                db._depth += 1
                if db._depth == 1:
                    db.conn.execute("BEGIN IMMEDIATE" if db.kind == "sqlite" else "BEGIN")
                if lock_plans and db.kind == "postgresql":
                    db.conn.execute("LOCK TABLE ptk_plans IN EXCLUSIVE MODE")

            def __exit__(self, exc_type, *_):
                try:
                    db._depth -= 1
                    if db._depth == 0:
                        db.conn.execute("ROLLBACK" if exc_type else "COMMIT")
                finally:
                    db._lock.release()
                return False
        return _Txn()

    def close(self) -> None:
        """Closes the database connection."""
        self.conn.close()


PROFILE_COLS = ("run_id", "ptk_id", "spec", "window_index", "status", "created_at")
WINDOW_COLS = ("window_index", "status", "files", "blocks", "records", "plan_seq", "opened_at",
               "closed_at", "schema", "unfit")


def _row(cls, cols, row):
    """A row as ``cls`` (JSON columns decoded), or None."""
    if row is None:
        return None
    out = dict(zip(cols, row))
    for k in JSON_COLS & out.keys():
        if out[k] is not None:
            out[k] = json.loads(out[k])
    return cls.from_row(out)


class Lake:
    """Registry, versions (with lineage), subscriptions, outbox, plans and windows."""

    def __init__(self, url: str):
        self.db = LakeDB(url)

    def close(self) -> None:
        """Closes the database connection."""
        self.db.close()

    # --- registry -------------------------------------------------------------------------
    def insert_ptk(self, rec: dict) -> None:
        """Inserts a PTK registry row."""
        vals = [json.dumps(rec[c]) if c in JSON_COLS and rec.get(c) is not None else rec.get(c)
                for c in REGISTRY_COLS]
        self.db.q(f"INSERT INTO ptk_registry ({', '.join(REGISTRY_COLS)}) VALUES "
                  f"({', '.join('?' * len(REGISTRY_COLS))})", vals)

    def update_ptk(self, ptk_id: str, **fields) -> None:
        """Updates fields of a PTK registry row (JSON columns encoded)."""
        sets = ", ".join(f"{k} = ?" for k in fields) + ", updated_at = ?"
        vals = [json.dumps(v) if k in JSON_COLS else v for k, v in fields.items()]
        self.db.q(f"UPDATE ptk_registry SET {sets} WHERE ptk_id = ?", [*vals, now(), ptk_id])

    def ptk(self, ptk_id: str) -> Optional[PTKRecord]:
        """The registry record of ``ptk_id`` (any status), or None."""
        return _row(PTKRecord, REGISTRY_COLS, self.db.q(
            f"SELECT {', '.join(REGISTRY_COLS)} FROM ptk_registry WHERE ptk_id = ?",
            (ptk_id,)).fetchone())

    def ptks(self, status: Optional[str] = "active") -> list[PTKRecord]:
        """The registry's PTKs of ``status`` (None: all), by id."""
        sql = f"SELECT {', '.join(REGISTRY_COLS)} FROM ptk_registry"
        rows = self.db.q(sql + " WHERE status = ? ORDER BY ptk_id", (status,)) if status \
            else self.db.q(sql + " ORDER BY ptk_id")
        return [_row(PTKRecord, REGISTRY_COLS, r) for r in rows.fetchall()]

    # --- versions -------------------------------------------------------------------------
    def add_version(self, rec: dict) -> PTKVersion:
        """Appends the next version of a PTK; a second state for the same window is refused
        (the existing version is returned), so a replayed window run stores nothing new."""
        with self.db.transaction():
            prior = self.version_for_window(rec["ptk_id"], rec["window_index"])
            if prior is not None:
                return prior
            last = self.db.q("SELECT MAX(version) FROM ptk_versions WHERE ptk_id = ?",
                             (rec["ptk_id"],)).fetchone()[0]
            rec = dict(rec, version=(last or 0) + 1, created_at=now())
            state_json = rec.pop("state_json", None)  # the released bytes, stored verbatim
            if state_json is not None:
                rec["state"] = json.loads(state_json)
            vals = [state_json if c == "state" and state_json is not None
                    else json.dumps(rec[c]) if c in JSON_COLS else rec[c] for c in VERSION_COLS]
            self.db.q(f"INSERT INTO ptk_versions ({', '.join(VERSION_COLS)}) VALUES "
                      f"({', '.join('?' * len(VERSION_COLS))})", vals)
            return PTKVersion.from_row(rec)

    def version(self, ptk_id: str, version: Optional[int] = None) -> Optional[PTKVersion]:
        """The newest (or the given) version of a PTK, or None."""
        sql = f"SELECT {', '.join(VERSION_COLS)} FROM ptk_versions WHERE ptk_id = ? "
        row = (self.db.q(sql + "ORDER BY version DESC LIMIT 1", (ptk_id,)) if version is None
               else self.db.q(sql + "AND version = ?", (ptk_id, version))).fetchone()
        return _row(PTKVersion, VERSION_COLS, row)

    def version_for_window(self, ptk_id: str, window_index: int) -> Optional[PTKVersion]:
        """The version a PTK trained on window ``window_index``, or None."""
        return _row(PTKVersion, VERSION_COLS, self.db.q(
            f"SELECT {', '.join(VERSION_COLS)} FROM ptk_versions WHERE ptk_id = ? AND "
            "window_index = ?", (ptk_id, window_index)).fetchone())

    def versions(self, ptk_id: str) -> list[PTKVersion]:
        """Every version of a PTK, oldest first."""
        return [_row(PTKVersion, VERSION_COLS, r) for r in self.db.q(
            f"SELECT {', '.join(VERSION_COLS)} FROM ptk_versions WHERE ptk_id = ? "
            "ORDER BY version", (ptk_id,)).fetchall()]

    # --- subscriptions and outbox ---------------------------------------------------------
    def subscribe(self, ptk_id: str, endpoint: str) -> None:
        """Subscribes ``endpoint`` to new versions of ``ptk_id`` (once)."""
        with self.db.transaction():
            if self.db.q("SELECT 1 FROM ptk_subscriptions WHERE ptk_id = ? AND endpoint = ?",
                          (ptk_id, endpoint)).fetchone() is None:
                self.db.q("INSERT INTO ptk_subscriptions (ptk_id, endpoint, created_at) "
                          "VALUES (?, ?, ?)", (ptk_id, endpoint, now()))

    def subscribers(self, ptk_id: str) -> list[str]:
        """The endpoints subscribed to ``ptk_id``."""
        return [r[0] for r in self.db.q("SELECT endpoint FROM ptk_subscriptions WHERE ptk_id = ? "
                                        "ORDER BY endpoint", (ptk_id,)).fetchall()]

    def enqueue(self, ptk_id: str, version: int) -> None:
        """One outbox row per subscriber of ``ptk_id`` for ``version`` (idempotent)."""
        with self.db.transaction():
            for ep in self.subscribers(ptk_id):
                if self.db.q("SELECT 1 FROM ptk_outbox WHERE ptk_id = ? AND version = ? AND "
                             "endpoint = ?", (ptk_id, version, ep)).fetchone() is None:
                    self.db.q("INSERT INTO ptk_outbox (ptk_id, version, endpoint, attempts, "
                              "status, updated_at) VALUES (?, ?, ?, 0, 'pending', ?)",
                              (ptk_id, version, ep, now()))

    def pending(self) -> list[tuple[str, int, str, int]]:
        """Undelivered notifications: (ptk_id, version, endpoint, attempts)."""
        return [tuple(r) for r in self.db.q(
            "SELECT ptk_id, version, endpoint, attempts FROM ptk_outbox WHERE status = 'pending' "
            "ORDER BY ptk_id, version, endpoint").fetchall()]

    def mark(self, ptk_id: str, version: int, endpoint: str, status: str,
             error: Optional[str] = None) -> None:
        """Records a delivery attempt of a notification and its new status."""
        self.db.q("UPDATE ptk_outbox SET status = ?, attempts = attempts + 1, last_error = ?, "
                  "updated_at = ? WHERE ptk_id = ? AND version = ? AND endpoint = ?",
                  (status, error, now(), ptk_id, version, endpoint))

    def outbox(self) -> list[OutboxEntry]:
        """Every notification (any status), by PTK and version."""
        cols = ("ptk_id", "version", "endpoint", "attempts", "status", "last_error")
        return [OutboxEntry(*r) for r in self.db.q(
            f"SELECT {', '.join(cols)} FROM ptk_outbox ORDER BY ptk_id, version").fetchall()]

    # --- plans ----------------------------------------------------------------------------
    def plan_seq(self) -> int:
        """The current plan's sequence number (0 before the first plan)."""
        return self.db.q("SELECT MAX(plan_seq) FROM ptk_plans").fetchone()[0] or 0

    def commit_plan(self, expected_seq: int, plan: dict, change: Callable[[], Any]):
        """Applies ``change`` (registry writes) and saves ``plan`` as the next plan in ONE
        transaction, if the plan is still ``expected_seq``; returns (seq, change's result), or
        None when another process changed the plan meanwhile (nothing written)."""
        with self.db.transaction(lock_plans=True):
            if self.plan_seq() != expected_seq:
                return None
            out = change()
            self.db.q("INSERT INTO ptk_plans (plan_seq, plan, created_at) VALUES (?, ?, ?)",
                      (expected_seq + 1, json.dumps(plan), now()))
            return expected_seq + 1, out

    def plan(self, seq: Optional[int] = None) -> tuple[int, Optional[Allocation]]:
        """(seq, plan) of the current plan, or of plan ``seq``."""
        row = (self.db.q("SELECT plan_seq, plan FROM ptk_plans ORDER BY plan_seq DESC LIMIT 1")
               if seq is None else self.db.q("SELECT plan_seq, plan FROM ptk_plans WHERE "
                                             "plan_seq = ?", (seq,))).fetchone()
        return (0, None) if row is None else (row[0], Allocation.from_dict(json.loads(row[1])))

    # --- profile runs (recorded before their charge) --------------------------------------
    def profile_run(self, run_id: str) -> Optional[ProfileRun]:
        """The profile run recorded under ``run_id``, or None."""
        return _row(ProfileRun, PROFILE_COLS, self.db.q(
            f"SELECT {', '.join(PROFILE_COLS)} FROM ptk_profiles WHERE "
                                    "run_id = ?", (run_id,)).fetchone())

    def add_profile_run(self, run_id: str, ptk_id: str, spec: dict,
                        window_index: int) -> ProfileRun:
        """Records a profile run (pending) or returns the one recorded under ``run_id``."""
        with self.db.transaction():
            prior = self.profile_run(run_id)
            if prior is None:
                self.db.q("INSERT INTO ptk_profiles (run_id, ptk_id, spec, window_index, status, "
                          "created_at) VALUES (?, ?, ?, ?, 'pending', ?)",
                          (run_id, ptk_id, json.dumps(spec), window_index, now()))
                prior = self.profile_run(run_id)
            return prior

    def set_profile_status(self, run_id: str, status: str) -> None:
        """Sets the status of a profile run."""
        self.db.q("UPDATE ptk_profiles SET status = ? WHERE run_id = ?", (status, run_id))

    def pending_profiles(self, window_index: int) -> list[ProfileRun]:
        """The profile runs of a window still pending (charged or not, never released)."""
        return [self.profile_run(r[0]) for r in self.db.q(
            "SELECT run_id FROM ptk_profiles WHERE status = 'pending' AND window_index = ? "
            "ORDER BY run_id", (window_index,)).fetchall()]

    # --- windows (the only non-DP state: raw block files) --------------------------------
    def open_window(self, window_index: int, files: list, blocks: list, records: int,
                    plan_seq: Optional[int] = None, schema: Optional[list] = None,
                    unfit: Optional[dict] = None) -> None:
        """Records an open window, the plan it trains under and the PTKs of that plan its
        columns (``schema``: ``[[name, "number" | "string"], ...]``) do not fit (``unfit``:
        id -> why), all fixed at ingest, so a resumed run charges exactly the partitions the
        first attempt did."""
        self.db.q("INSERT INTO ptk_windows (window_index, status, files, blocks, records, "
                  "plan_seq, opened_at, schema, unfit) VALUES (?, 'open', ?, ?, ?, ?, ?, ?, ?)",
                  (window_index, json.dumps(files), json.dumps(blocks), records, plan_seq, now(),
                   None if schema is None else json.dumps(schema),
                   None if unfit is None else json.dumps(unfit)))

    def schema(self) -> Optional[list]:
        """The store's columns: the schema of the newest window that recorded one, or None."""
        row = self.db.q("SELECT schema FROM ptk_windows WHERE schema IS NOT NULL ORDER BY "
                        "window_index DESC LIMIT 1").fetchone()
        return None if row is None else json.loads(row[0])

    def window(self, window_index: int) -> Optional[WindowInfo]:
        """A window's record (open or closed), or None."""
        return _row(WindowInfo, WINDOW_COLS, self.db.q(
            f"SELECT {', '.join(WINDOW_COLS)} FROM ptk_windows WHERE "
                                    "window_index = ?", (window_index,)).fetchone())

    def open_windows(self) -> list[int]:
        """Indices of the open windows, oldest first."""
        return [r[0] for r in self.db.q("SELECT window_index FROM ptk_windows WHERE status = "
                                        "'open' ORDER BY window_index").fetchall()]

    def last_window(self) -> Optional[int]:
        """The highest window index, or None if there is none."""
        return self.db.q("SELECT MAX(window_index) FROM ptk_windows").fetchone()[0]

    def close_window(self, window_index: int, remove: Callable[[str], Any] = os.remove) -> None:
        """Destroys the window's data key, deletes its raw block files, then marks it closed
        with no file list (a crash in between leaves files nobody can decrypt)."""
        w = self.window(window_index)
        if w is None or w.status == "closed":
            return
        self.drop_window_key(window_index)
        for path in w.files:
            if os.path.exists(path):
                remove(path)
        self.db.q("UPDATE ptk_windows SET status = 'closed', files = '[]', closed_at = ? "
                  "WHERE window_index = ?", (now(), window_index))

    # --- window keys (wrapped; the data key itself is never stored) ----------------------
    def put_window_key(self, window_index: int, stream: str, kek_id: str, wrapped: str) -> str:
        """Stores a window's wrapped data key; returns the one stored first if there is one."""
        with self.db.transaction():
            got = self.window_key(window_index)
            if got is not None:
                return got[1]
            self.db.q("INSERT INTO ptk_window_keys (window_index, stream, kek_id, wrapped, "
                      "created_at) VALUES (?, ?, ?, ?, ?)",
                      (window_index, stream, kek_id, wrapped, now()))
            return wrapped

    def window_key(self, window_index: int) -> Optional[tuple[str, str]]:
        """(kek_id, wrapped key) of a window, or None once it is destroyed."""
        row = self.db.q("SELECT kek_id, wrapped FROM ptk_window_keys WHERE window_index = ?",
                        (window_index,)).fetchone()
        return None if row is None else (row[0], row[1])

    def drop_window_key(self, window_index: int) -> None:
        """Deletes the data key of a window (its files can no longer be read)."""
        self.db.q("DELETE FROM ptk_window_keys WHERE window_index = ?", (window_index,))
