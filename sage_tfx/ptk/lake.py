"""The PTK lake (PTK paper §5.1): registry, versioned DP states with lineage, subscriptions,
the notification outbox, plans and the training windows, in their own ``ptk_*`` tables of the
ledger's database (same URL: ``sqlite:///path`` or ``postgresql://...``).

Only DP outputs are stored here. The one non-DP thing the store holds is a window's raw block
files (``ptk_windows`` lists their paths); :meth:`Lake.close_window` deletes them when the window
closes. This module is the only code of the PTK store that talks to the database driver; it uses
its own connection and never touches the ledger's tables.
"""
from __future__ import annotations

import datetime
import json
import os
import threading
from typing import Any, Callable, Optional, Sequence

from sage_tfx.errors import InvalidRequestError

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS ptk_registry (
        ptk_id TEXT PRIMARY KEY, name TEXT NOT NULL, train_dp_ref TEXT NOT NULL,
        eval_ref TEXT NOT NULL, dp_event_ref TEXT NOT NULL, erm_ref TEXT, config TEXT NOT NULL,
        tau {real} NOT NULL, train_frequency {int} NOT NULL, status TEXT NOT NULL,
        menu TEXT NOT NULL, profile TEXT, registered_window {int}, created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL)""",
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
        closed_at TEXT)""",
]
def now() -> str:
    """The current UTC time, ISO-8601 with microseconds."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")


REGISTRY_COLS = ("ptk_id", "name", "train_dp_ref", "eval_ref", "dp_event_ref", "erm_ref",
                 "config", "tau", "train_frequency", "status", "menu", "profile",
                 "registered_window", "created_at", "updated_at")
VERSION_COLS = ("ptk_id", "version", "window_index", "state", "config", "epsilon", "delta",
                "event", "grant_id", "run_id", "stream", "blocks", "n_used", "partition_index",
                "oldest_window", "newest_window", "created_at")
JSON_COLS = {"config", "menu", "profile", "state", "blocks", "files"}


class LakeDB:
    """One connection to the database of ``url`` with ``?`` placeholders on both dialects."""

    def __init__(self, url: str):
        self.url = url
        self._lock = threading.RLock()
        if url.startswith("sqlite:///"):
            import sqlite3
            path = url[len("sqlite:///"):]
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
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

    def q(self, sql: str, params: Sequence = ()):
        if self.kind == "postgresql":
            sql = sql.replace("?", "%s")
        with self._lock:
            return self.conn.execute(sql, tuple(params))

    def transaction(self):
        db = self

        class _Txn:
            def __enter__(self):
                db._lock.acquire()
                db.conn.execute("BEGIN IMMEDIATE" if db.kind == "sqlite" else "BEGIN")

            def __exit__(self, exc_type, *_):
                try:
                    db.conn.execute("ROLLBACK" if exc_type else "COMMIT")
                finally:
                    db._lock.release()
                return False
        return _Txn()

    def close(self) -> None:
        self.conn.close()


def _row(cols, row) -> Optional[dict]:
    if row is None:
        return None
    out = dict(zip(cols, row))
    for k in JSON_COLS & out.keys():
        if out[k] is not None:
            out[k] = json.loads(out[k])
    return out


class Lake:
    """Registry, versions (with lineage), subscriptions, outbox, plans and windows."""

    def __init__(self, url: str):
        self.db = LakeDB(url)

    def close(self) -> None:
        self.db.close()

    # --- registry -------------------------------------------------------------------------
    def insert_ptk(self, rec: dict) -> None:
        vals = [json.dumps(rec[c]) if c in JSON_COLS and rec.get(c) is not None else rec.get(c)
                for c in REGISTRY_COLS]
        self.db.q(f"INSERT INTO ptk_registry ({', '.join(REGISTRY_COLS)}) VALUES "
                  f"({', '.join('?' * len(REGISTRY_COLS))})", vals)

    def update_ptk(self, ptk_id: str, **fields) -> None:
        sets = ", ".join(f"{k} = ?" for k in fields) + ", updated_at = ?"
        vals = [json.dumps(v) if k in JSON_COLS else v for k, v in fields.items()]
        self.db.q(f"UPDATE ptk_registry SET {sets} WHERE ptk_id = ?", [*vals, now(), ptk_id])

    def ptk(self, ptk_id: str) -> Optional[dict]:
        return _row(REGISTRY_COLS, self.db.q(
            f"SELECT {', '.join(REGISTRY_COLS)} FROM ptk_registry WHERE ptk_id = ?",
            (ptk_id,)).fetchone())

    def ptks(self, status: Optional[str] = "active") -> list[dict]:
        sql = f"SELECT {', '.join(REGISTRY_COLS)} FROM ptk_registry"
        rows = self.db.q(sql + " WHERE status = ? ORDER BY ptk_id", (status,)) if status \
            else self.db.q(sql + " ORDER BY ptk_id")
        return [_row(REGISTRY_COLS, r) for r in rows.fetchall()]

    # --- versions -------------------------------------------------------------------------
    def add_version(self, rec: dict) -> dict:
        """Appends the next version of a PTK; a second state for the same window is refused
        (the existing version is returned), so a replayed window run stores nothing new."""
        with self.db.transaction():
            prior = self.version_for_window(rec["ptk_id"], rec["window_index"])
            if prior is not None:
                return prior
            last = self.db.q("SELECT MAX(version) FROM ptk_versions WHERE ptk_id = ?",
                             (rec["ptk_id"],)).fetchone()[0]
            rec = dict(rec, version=(last or 0) + 1, created_at=now())
            vals = [json.dumps(rec[c]) if c in JSON_COLS else rec[c] for c in VERSION_COLS]
            self.db.q(f"INSERT INTO ptk_versions ({', '.join(VERSION_COLS)}) VALUES "
                      f"({', '.join('?' * len(VERSION_COLS))})", vals)
            return rec

    def version(self, ptk_id: str, version: Optional[int] = None) -> Optional[dict]:
        sql = f"SELECT {', '.join(VERSION_COLS)} FROM ptk_versions WHERE ptk_id = ? "
        row = (self.db.q(sql + "ORDER BY version DESC LIMIT 1", (ptk_id,)) if version is None
               else self.db.q(sql + "AND version = ?", (ptk_id, version))).fetchone()
        return _row(VERSION_COLS, row)

    def version_for_window(self, ptk_id: str, window_index: int) -> Optional[dict]:
        return _row(VERSION_COLS, self.db.q(
            f"SELECT {', '.join(VERSION_COLS)} FROM ptk_versions WHERE ptk_id = ? AND "
            "window_index = ?", (ptk_id, window_index)).fetchone())

    def versions(self, ptk_id: str) -> list[dict]:
        return [_row(VERSION_COLS, r) for r in self.db.q(
            f"SELECT {', '.join(VERSION_COLS)} FROM ptk_versions WHERE ptk_id = ? "
            "ORDER BY version", (ptk_id,)).fetchall()]

    # --- subscriptions and outbox ---------------------------------------------------------
    def subscribe(self, ptk_id: str, endpoint: str) -> None:
        with self.db.transaction():
            if self.db.q("SELECT 1 FROM ptk_subscriptions WHERE ptk_id = ? AND endpoint = ?",
                          (ptk_id, endpoint)).fetchone() is None:
                self.db.q("INSERT INTO ptk_subscriptions (ptk_id, endpoint, created_at) "
                          "VALUES (?, ?, ?)", (ptk_id, endpoint, now()))

    def subscribers(self, ptk_id: str) -> list[str]:
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
        return [tuple(r) for r in self.db.q(
            "SELECT ptk_id, version, endpoint, attempts FROM ptk_outbox WHERE status = 'pending' "
            "ORDER BY ptk_id, version, endpoint").fetchall()]

    def mark(self, ptk_id: str, version: int, endpoint: str, status: str,
             error: Optional[str] = None) -> None:
        self.db.q("UPDATE ptk_outbox SET status = ?, attempts = attempts + 1, last_error = ?, "
                  "updated_at = ? WHERE ptk_id = ? AND version = ? AND endpoint = ?",
                  (status, error, now(), ptk_id, version, endpoint))

    def outbox(self) -> list[dict]:
        cols = ("ptk_id", "version", "endpoint", "attempts", "status", "last_error")
        return [dict(zip(cols, r)) for r in self.db.q(
            f"SELECT {', '.join(cols)} FROM ptk_outbox ORDER BY ptk_id, version").fetchall()]

    # --- plans ----------------------------------------------------------------------------
    def save_plan(self, plan: dict) -> int:
        with self.db.transaction():
            last = self.db.q("SELECT MAX(plan_seq) FROM ptk_plans").fetchone()[0] or 0
            self.db.q("INSERT INTO ptk_plans (plan_seq, plan, created_at) VALUES (?, ?, ?)",
                      (last + 1, json.dumps(plan), now()))
            return last + 1

    def plan(self) -> tuple[int, Optional[dict]]:
        row = self.db.q("SELECT plan_seq, plan FROM ptk_plans ORDER BY plan_seq DESC LIMIT 1"
                        ).fetchone()
        return (0, None) if row is None else (row[0], json.loads(row[1]))

    # --- windows (the only non-DP state: raw block files) --------------------------------
    def open_window(self, window_index: int, files: list, blocks: list, records: int) -> None:
        self.db.q("INSERT INTO ptk_windows (window_index, status, files, blocks, records, "
                  "opened_at) VALUES (?, 'open', ?, ?, ?, ?)",
                  (window_index, json.dumps(files), json.dumps(blocks), records, now()))

    def window(self, window_index: int) -> Optional[dict]:
        cols = ("window_index", "status", "files", "blocks", "records", "plan_seq", "opened_at",
                "closed_at")
        return _row(cols, self.db.q(f"SELECT {', '.join(cols)} FROM ptk_windows WHERE "
                                    "window_index = ?", (window_index,)).fetchone())

    def open_windows(self) -> list[int]:
        return [r[0] for r in self.db.q("SELECT window_index FROM ptk_windows WHERE status = "
                                        "'open' ORDER BY window_index").fetchall()]

    def last_window(self) -> Optional[int]:
        return self.db.q("SELECT MAX(window_index) FROM ptk_windows").fetchone()[0]

    def close_window(self, window_index: int, remove: Callable[[str], Any] = os.remove) -> None:
        """Deletes the window's raw block files, then marks it closed with no file list."""
        w = self.window(window_index)
        if w is None or w["status"] == "closed":
            return
        for path in w["files"]:
            if os.path.exists(path):
                remove(path)
        self.db.q("UPDATE ptk_windows SET status = 'closed', files = '[]', closed_at = ? "
                  "WHERE window_index = ?", (now(), window_index))
