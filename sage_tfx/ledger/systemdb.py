"""A system's own table in the ledger's database, reached through its own short connection.

Systems keep state that guards budget or data beside the ledger's tables, in the same database,
so it holds across processes and machines as the ledger does (Pyramid's hot-window keys and
tree node claims, DP bagging's teacher-cache keys). They never touch the ledger's own tables:
each opens a short-lived connection with :func:`connect`, which creates the system's table if
it is missing (``{int}`` and ``{blob}`` in its DDL take the dialect's types).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import secrets

__all__ = ["SystemDB", "connect"]

_DDL_LOCK = 727274   # PostgreSQL advisory lock taken while a system's table is created


class SystemDB:
    """One short-lived connection to the ledger's database (SQLite or PostgreSQL, autocommit)."""

    def __init__(self, url: str, schema: str, application: str = "sage-tfx"):
        url = secrets.resolve(url)
        if url.startswith("sqlite:///"):
            import sqlite3
            path = url[len("sqlite:///"):].partition("?")[0]
            self.kind, self.ph = "sqlite", "?"
            self.conn = sqlite3.connect(path, timeout=120.0, isolation_level=None)
            self.conn.execute("PRAGMA busy_timeout=120000")
            ddl = schema.format(int="INTEGER", blob="BLOB")
        elif url.startswith(("postgresql://", "postgres://")):
            import psycopg
            self.kind, self.ph = "postgresql", "%s"
            self.conn = psycopg.connect(url, autocommit=True, application_name=application)
            ddl = schema.format(int="BIGINT", blob="BYTEA")
        else:
            raise InvalidRequestError(f"unsupported ledger URL {secrets.redact(url)!r}")
        if self.kind == "postgresql":   # concurrent CREATE TABLE IF NOT EXISTS may collide
            with self.conn.transaction():
                self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
                self.conn.execute(ddl)
        else:
            self.conn.execute(ddl)

    def q(self, sql: str, params=()):
        """Runs one statement (``?`` placeholders in either dialect)."""
        return self.conn.execute(sql.replace("?", self.ph), tuple(params))

    def close(self) -> None:
        """Closes the connection."""
        self.conn.close()


@contextlib.contextmanager
def connect(url: str, schema: str, application: str = "sage-tfx") -> Iterator[SystemDB]:
    """A :class:`SystemDB` on the ledger at ``url`` with the table of ``schema``, closed after."""
    db = SystemDB(url, schema, application)
    try:
        yield db
    finally:
        db.close()
