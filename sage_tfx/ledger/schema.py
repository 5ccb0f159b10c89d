"""The ledger's tables, the PostgreSQL functions they need, and the migrations between versions.

Schema 4 (this version) adds, in one migration, what release-once and access control need:

* ``releases`` — what each grant released, by name: the digest and either the bytes themselves
  (small values) or their durable location (:mod:`~sage_tfx.ledger.releases`); and
  ``grants.principal``, who made each grant (only it, or an admin, records its releases);
* ``principals`` and ``bindings`` — who may call, in which roles, on which (stream, context)
  budget lists; tokens are stored as SHA-256 digests only (:mod:`~sage_tfx.ledger.access`);
* ``block_keys`` — every encrypted block's data key, wrapped by a key-encryption key; a
  retired block's row is deleted (crypto-shredding);
* ``leases`` and ``counters`` — exclusive, expiring leases and atomic counters that systems
  share across processes (:mod:`~sage_tfx.ledger.leases`).

Older ledgers migrate when they are opened (inside the schema lock, one transaction).
"""
from __future__ import annotations

from sage_tfx.ledger import pgrequest, pgroles
from sage_tfx.ledger.audit import GENESIS_HASH

SCHEMA_VERSION = 4
PG_CHAINS = 64  # audit chains on PostgreSQL: more than the writers that run at once


def tables(b) -> list[str]:
    """CREATE statements of every ledger table and index, in the dialect of backend ``b``."""
    r, i, blob = b.real, b.bigint, b.blob
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
            stream TEXT NOT NULL{b.block_fk}, block_id TEXT NOT NULL,
            seq {i} NOT NULL, location TEXT NOT NULL, start_ts TEXT, end_ts TEXT,
            records {i}, created_at TEXT NOT NULL,
            PRIMARY KEY (stream, block_id), UNIQUE (stream, seq))""",
        f"""CREATE TABLE IF NOT EXISTS budgets (
            id {b.serial_pk}, stream TEXT NOT NULL, context TEXT NOT NULL,
            block_id TEXT NOT NULL, seq {i} NOT NULL, status TEXT NOT NULL,
            eps_spent TEXT NOT NULL, delta_spent TEXT NOT NULL, rdp TEXT, charges {i} NOT NULL,
            location TEXT,
            UNIQUE (stream, context, block_id){b.budget_fk}){b.hot}""",
        "CREATE INDEX IF NOT EXISTS budgets_window ON budgets (stream, context, status, seq)",
        f"""CREATE TABLE IF NOT EXISTS grants (
            grant_id TEXT PRIMARY KEY, stream TEXT NOT NULL, context TEXT NOT NULL,
            run_id TEXT NOT NULL, request TEXT NOT NULL, mode TEXT NOT NULL,
            epsilon {r}, delta {r}, event TEXT, blocks TEXT NOT NULL, status TEXT NOT NULL,
            created_at TEXT NOT NULL, released_at TEXT, principal TEXT,
            UNIQUE (stream, run_id))""",
        f"""CREATE TABLE IF NOT EXISTS audit (
            seq {i} PRIMARY KEY, ts TEXT NOT NULL, stream TEXT, kind TEXT NOT NULL,
            payload TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL,
            chain {i} NOT NULL DEFAULT 1)""",
        # -- schema 4 --
        f"""CREATE TABLE IF NOT EXISTS releases (
            grant_id TEXT NOT NULL, name TEXT NOT NULL, stream TEXT NOT NULL,
            context TEXT NOT NULL, run_id TEXT NOT NULL, digest TEXT NOT NULL, size {i} NOT NULL,
            location TEXT, value {blob}, principal TEXT NOT NULL, created_at TEXT NOT NULL,
            PRIMARY KEY (grant_id, name))""",
        """CREATE TABLE IF NOT EXISTS principals (
            name TEXT PRIMARY KEY, roles TEXT NOT NULL, token_sha256 TEXT UNIQUE,
            status TEXT NOT NULL, pg_role TEXT, created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS bindings (
            principal TEXT NOT NULL, stream TEXT NOT NULL, context TEXT NOT NULL,
            created_at TEXT NOT NULL, PRIMARY KEY (principal, stream, context))""",
        f"""CREATE TABLE IF NOT EXISTS block_keys (
            stream TEXT NOT NULL, block_id TEXT NOT NULL, kek_id TEXT NOT NULL,
            wrapped {blob} NOT NULL, created_at TEXT NOT NULL, PRIMARY KEY (stream, block_id))""",
        f"""CREATE TABLE IF NOT EXISTS leases (
            name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at {r} NOT NULL,
            acquired_at TEXT NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS counters (
            name TEXT PRIMARY KEY, value {i} NOT NULL)""",
    ]


# PostgreSQL: the audit sequence, and a function that locks the head of a free chain (waiting
# for a random one only when all are busy) and draws the next seq after that lock.
PG_FUNCTIONS = [
    "CREATE SEQUENCE IF NOT EXISTS audit_seq_gen",
    f"""CREATE OR REPLACE FUNCTION sage_audit_chain()
        RETURNS TABLE (chain BIGINT, last_seq BIGINT, last_hash TEXT, next_seq BIGINT) AS $$
        DECLARE h RECORD;
        BEGIN
          SELECT id, audit_seq, audit_hash INTO h FROM ledger_head
            ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1;
          IF NOT FOUND THEN
            SELECT id, audit_seq, audit_hash INTO h FROM ledger_head
              WHERE id = 1 + floor(random() * {PG_CHAINS})::int FOR UPDATE;
          END IF;
          RETURN QUERY SELECT h.id, h.audit_seq, h.audit_hash, nextval('audit_seq_gen');
        END $$ LANGUAGE plpgsql""",
]


def init(store) -> None:
    """Creates the tables of a new ledger, or migrates an older one, in one transaction.

    On PostgreSQL only the ledger's owner does: another database role (a principal's login
    role, :mod:`~sage_tfx.ledger.pgroles`) opens a current schema as it is.
    """
    conn = store.conn
    if store.kind == "postgresql" and pgroles.restricted(store):
        store.restricted = True
        return
    if store.kind == "sqlite":
        conn.execute("BEGIN IMMEDIATE")
    else:
        conn.execute("BEGIN")
        conn.execute("SELECT pg_advisory_xact_lock(727272)")
    try:
        for stmt in tables(store.backend):
            conn.execute(stmt)
        version = store.q("SELECT max(schema_version) FROM ledger_head").fetchone()[0]
        if version is not None and version < 2:
            _migrate_v1(store)
        if version is not None and version < 3:
            _migrate_v2(store)
        if "principal" not in columns(store, "grants"):  # schema 4: who made each grant
            conn.execute("ALTER TABLE grants ADD COLUMN principal TEXT")
        if version is not None and version < SCHEMA_VERSION:
            # Schema 4 adds tables (created above) and grants.principal; record the version.
            store.q("UPDATE ledger_head SET schema_version = ?", (SCHEMA_VERSION,))
        chains = 1 if store.kind == "sqlite" else PG_CHAINS
        have = {r[0] for r in store.q("SELECT id FROM ledger_head").fetchall()}
        for c in range(1, chains + 1):
            if c not in have:
                store.q("INSERT INTO ledger_head (id, audit_seq, audit_hash, schema_version) "
                        "VALUES (?, 0, ?, ?)", (c, GENESIS_HASH, SCHEMA_VERSION))
        if store.kind == "postgresql":
            for stmt in PG_FUNCTIONS + pgrequest.FUNCTIONS:
                conn.execute(stmt)
            pgroles.install(store)
            if version is not None and version < 2:
                conn.execute("SELECT setval('audit_seq_gen', "
                             "(SELECT GREATEST(COALESCE(max(seq), 0), 1) FROM audit))")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def version(store) -> int:
    """The schema version the ledger's database records."""
    return store.q("SELECT max(schema_version) FROM ledger_head").fetchone()[0]


def columns(store, table: str) -> list[str]:
    """The column names of ``table``."""
    if store.kind == "sqlite":
        return [r[1] for r in store.q(f"PRAGMA table_info({table})").fetchall()]
    return [r[0] for r in store.q("SELECT column_name FROM information_schema.columns WHERE "
                                  "table_name = ? AND table_schema = current_schema()",
                                  (table,)).fetchall()]


def _migrate_v1(store) -> None:
    """Schema 1 had one chain and no ``audit.chain`` column."""
    if "chain" not in columns(store, "audit"):
        store.conn.execute(f"ALTER TABLE audit ADD COLUMN chain {store.backend.bigint} "
                           "NOT NULL DEFAULT 1")


def _migrate_v2(store) -> None:
    """Schema 2 read a block's location from ``blocks`` on every request; 3 keeps it in the
    block's budget rows too (written with them; a block's location never changes)."""
    if "location" not in columns(store, "budgets"):
        store.conn.execute("ALTER TABLE budgets ADD COLUMN location TEXT")
    store.q("UPDATE budgets SET location = (SELECT b.location FROM blocks b WHERE "
            "b.stream = budgets.stream AND b.block_id = budgets.block_id) "
            "WHERE location IS NULL")
