"""PostgreSQL login roles for principals: least privilege the database server enforces itself.

A library that talks to the ledger's database directly (a pipeline pod, a service) holds a
database credential. With the owner's DSN it could rewrite every budget, whatever the ledger's
own checks say; so a principal issued with ``sage-tfx principal add NAME --role pipeline
--pg-role`` gets a LOGIN role of its own, and the server enforces:

* **pipeline** — reads streams and blocks; reads and charges budget, grant and release rows
  only in the (stream, context) lists bound to its principal (row-level security); appends
  audit entries that name its own principal; advances audit chain heads only to entries that
  exist; may set a grant ``reserved`` → ``released`` and nothing else. Triggers refuse any
  update that lowers spent budget (ε, δ, an RDP order, the charge count), touches a retired
  block's row or moves a budget row; a grant that names another principal or lists a block its
  own transaction did not charge; and a release of a grant that is not released, not the
  role's own, or of another stream / context / run. Its one legitimate refund — cancelling its own
  reservation — runs through :data:`REFUND` (``sage_refund``), a SECURITY DEFINER function that
  checks the grant, the binding and that every value only goes down by at most the grant's charge.
  It never reads ``principals``, ``bindings`` or ``block_keys``: ``sage_grant_keys(grant_id)`` hands
  out the wrapped keys of its own *released* grants' blocks, and nothing else.
* **auditor** — SELECT on the ledger's tables, except ``principals.token_sha256`` and
  ``block_keys``; writes nothing. ``sage_access_rows()`` gives it the principals with a hash of
  each token digest, for the access digest ``verify`` checks
  (:func:`~sage_tfx.ledger.access.access_digest`).
* **client** — CONNECT only (clients talk to services, not to the ledger).
* **admin** — not a login role: admins act through the ledger owner's database role (the
  role that created the tables), with a token naming them.

No role but the owner may DELETE anything (``leases`` excepted: a lease holder gives its lease
up). The owner role (and any superuser) bypasses all of this: it is trusted, as is the server.

What the server cannot check: the *amount* a charge adds. The library computes it (in rdp mode
with dp_accounting) in the pipeline's own process, so a pipeline that bypasses the library can
under-charge its own bound contexts; ``Ledger.check_consistency`` (run by an auditor)
recomputes every block from the grants and reports any such difference.

The database role of a connection (``session_user``) maps to its principal; the functions
below are SECURITY DEFINER with a fixed ``search_path`` and are executable only by the roles
this module grants them to.
"""
from __future__ import annotations

from typing import Optional, Sequence

from sage_tfx.errors import (GrantStateError, InvalidRequestError, PermissionDeniedError)

SECURITY_VERSION = 3  # 3: sage_access_rows (the access digest an auditor checks)
MARKER = f"sage_security_v{SECURITY_VERSION}"
MAX_ROLE_NAME = 63  # PostgreSQL's NAMEDATALEN - 1

LEDGER_TABLES = ("ledger_head", "streams", "blocks", "budgets", "grants", "audit", "releases",
                 "principals", "bindings", "block_keys", "leases", "counters")
PRINCIPAL_COLUMNS = "name, roles, status, pg_role, created_at, updated_at"  # not token_sha256
REFUND = "sage_refund(TEXT, TEXT)"
GRANT_KEYS = "sage_grant_keys(TEXT)"
ACCESS_ROWS = "sage_access_rows()"
SCOPE = "sage_scope"  # the session's principal, its reach and its bindings (a view)
_SESSION = ("sage_identify(TEXT)",)
_PIPELINE_FUNCTIONS = _SESSION + ("sage_audit_has(BIGINT, BIGINT, TEXT)", REFUND, GRANT_KEYS)
# every SECURITY DEFINER function (none is executable by PUBLIC)
_DEFINER = _PIPELINE_FUNCTIONS + ("sage_may_charge(TEXT, TEXT)", ACCESS_ROWS)

# Privileges of each sage role's login role (in addition to CONNECT, which PUBLIC has).
_GRANTS = {
    "pipeline": [
        "SELECT ON streams, blocks",
        "SELECT, UPDATE (audit_seq, audit_hash) ON ledger_head",
        "SELECT, UPDATE (eps_spent, delta_spent, rdp, charges, status) ON budgets",
        "SELECT, INSERT, UPDATE (status, released_at) ON grants",
        "SELECT, INSERT ON releases",
        "INSERT ON audit",
        "SELECT, INSERT, UPDATE, DELETE ON leases",
        "SELECT, INSERT, UPDATE ON counters",
        "USAGE ON SEQUENCE audit_seq_gen",
        f"SELECT ON {SCOPE}",
    ],
    "auditor": [
        "SELECT ON ledger_head, streams, blocks, budgets, grants, audit, releases, bindings, "
        f"leases, counters, {SCOPE}",
        f"SELECT ({PRINCIPAL_COLUMNS}) ON principals",
    ],
    "client": [],
}
_FUNCTIONS_OF = {"pipeline": _PIPELINE_FUNCTIONS, "auditor": _SESSION + (ACCESS_ROWS,),
                 "client": ()}


def _functions(schema: str) -> list[str]:
    """The SECURITY DEFINER helpers and trigger functions, for the ledger in ``schema``."""
    definer = f"SECURITY DEFINER SET search_path = {schema}, pg_temp"
    owner = (f"(SELECT relowner FROM pg_catalog.pg_class "
             f"WHERE oid = '{schema}.ledger_head'::regclass)")
    # Triggers run as the writer, whose temporary objects come first in an unqualified lookup
    # unless pg_temp is named last: a login role must not shadow what a guard reads.
    fixed = f"SET search_path = {schema}, pg_temp"
    refuse = ("RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE = ")
    # After loading grant p_grant_id into g: it exists, and the caller may charge its context.
    grant_checks = f"""IF NOT FOUND THEN
                RAISE EXCEPTION 'unknown grant %', p_grant_id
                  USING ERRCODE = 'invalid_parameter_value';
              END IF;
              IF NOT sage_may_charge(g.stream, g.context) THEN
                {refuse} format('database role %s is not bound to stream %s, context %s',
                                session_user, g.stream, g.context);
              END IF;"""
    return [
        # Who the session is: the principal mapped to session_user (p_digest NULL) or holding
        # the token digest, and how many principals exist (0: open mode).
        f"""CREATE OR REPLACE FUNCTION sage_identify(p_digest TEXT)
            RETURNS TABLE (principals BIGINT, name TEXT, roles TEXT, status TEXT, pg_role TEXT)
            LANGUAGE sql STABLE {definer} AS $$
              SELECT (SELECT count(*) FROM principals), p.name, p.roles, p.status, p.pg_role
                FROM (SELECT 1) AS one LEFT JOIN principals p ON CASE WHEN p_digest IS NULL
                  THEN p.pg_role = session_user ELSE p.token_sha256 = p_digest END
                ORDER BY p.name LIMIT 1 $$""",
        # The session's active principal and its bindings (one row per binding, or one with
        # no stream). A view, not a function: the planner inlines it into the row-level
        # policies (one small join per statement), and it reads principals and bindings with
        # its owner's rights while a login role may read only this.
        f"""CREATE OR REPLACE VIEW {SCOPE} AS
              SELECT p.name AS principal, p.roles::jsonb ?| array['admin', 'auditor'] AS reads_all,
                     p.roles::jsonb ? 'admin' AS writes_all, b.stream, b.context
                FROM principals p LEFT JOIN bindings b ON b.principal = p.name
               WHERE p.pg_role = session_user AND p.status = 'active'""",
        # The owner (or a member of it, or a superuser), an admin, or a principal bound to
        # (stream, context).
        f"""CREATE OR REPLACE FUNCTION sage_may_charge(p_stream TEXT, p_context TEXT)
            RETURNS BOOLEAN LANGUAGE sql STABLE {definer} AS $$
              SELECT pg_has_role(session_user, {owner}, 'USAGE') OR EXISTS (
                SELECT 1 FROM {SCOPE} s WHERE s.writes_all
                  OR (s.stream = p_stream AND s.context = p_context)) $$""",
        # The principals as the access digest covers them: a hash of each token digest only.
        f"""CREATE OR REPLACE FUNCTION sage_access_rows()
            RETURNS TABLE (name TEXT, roles TEXT, token_check TEXT, status TEXT, pg_role TEXT)
            LANGUAGE sql STABLE {definer} AS $$
              SELECT p.name, p.roles, encode(sha256(convert_to(p.token_sha256, 'UTF8')), 'hex'),
                     p.status, p.pg_role FROM principals p $$""",
        f"""CREATE OR REPLACE FUNCTION sage_audit_has(p_chain BIGINT, p_seq BIGINT, p_hash TEXT)
            RETURNS BOOLEAN LANGUAGE sql STABLE {definer} AS $$
              SELECT EXISTS (SELECT 1 FROM audit WHERE chain = p_chain AND seq = p_seq
                             AND hash = p_hash) $$""",
        # Whether an RDP curve (JSON list of floats, Infinity allowed) is >= another, order by
        # order. Text parsing, not json: Python writes Infinity, which JSON has no word for.
        """CREATE OR REPLACE FUNCTION sage_curve_ge(a TEXT, b TEXT) RETURNS BOOLEAN
            LANGUAGE sql IMMUTABLE AS $$
              SELECT CASE WHEN a IS NULL OR b IS NULL THEN a IS NOT DISTINCT FROM b ELSE
                (SELECT cardinality(x) = cardinality(y) AND
                        coalesce(bool_and(u::float8 >= v::float8), true)
                   FROM (SELECT string_to_array(btrim(a, '[] '), ',') AS x,
                                string_to_array(btrim(b, '[] '), ',') AS y) AS p,
                        LATERAL unnest(p.x, p.y) AS z(u, v)
                  GROUP BY p.x, p.y) END $$""",
        # A cancelled reservation's refund (Ledger.cancel on PostgreSQL): the new block states
        # the library derived, applied only if they fit what one refund of this grant can be.
        f"""CREATE OR REPLACE FUNCTION sage_refund(p_grant_id TEXT, p_rows TEXT) RETURNS VOID
            LANGUAGE plpgsql VOLATILE {definer} AS $$
            DECLARE g RECORD; r RECORD; u RECORD; ge NUMERIC; gd NUMERIC; n INT := 0;
            BEGIN
              SELECT stream, context, status, blocks, mode, request INTO g FROM grants
                WHERE grant_id = p_grant_id FOR UPDATE;
              {grant_checks}
              IF g.status <> 'reserved' THEN
                RAISE EXCEPTION 'grant % is %: only a reservation that never released data can %',
                  p_grant_id, g.status, 'be cancelled'
                  USING ERRCODE = 'object_not_in_prerequisite_state';
              END IF;
              IF (SELECT count(*) <> count(DISTINCT x.block) FROM json_to_recordset(p_rows::json)
                  AS x(block TEXT)) THEN
                {refuse} format('a refund of grant %s lists a block twice', p_grant_id);
              END IF;
              UPDATE grants SET status = 'cancelled' WHERE grant_id = p_grant_id;
              ge := coalesce((g.request::json ->> 'epsilon')::numeric, 0);
              gd := coalesce((g.request::json ->> 'delta')::numeric, 0);
              FOR r IN SELECT * FROM json_to_recordset(p_rows::json)
                  AS x(block TEXT, eps TEXT, delta TEXT, rdp TEXT, charges BIGINT) LOOP
                IF NOT EXISTS (SELECT 1 FROM json_array_elements_text(g.blocks::json) AS e(b)
                               WHERE e.b = r.block) THEN
                  {refuse} format('block %s is not in grant %s', r.block, p_grant_id);
                END IF;
                SELECT * INTO u FROM budgets WHERE stream = g.stream AND context = g.context
                  AND block_id = r.block FOR UPDATE;
                IF NOT FOUND THEN
                  {refuse} format('block %s has no budget row', r.block);
                END IF;
                IF r.eps::numeric > u.eps_spent::numeric
                   OR r.delta::numeric > u.delta_spent::numeric
                   OR r.charges > u.charges OR r.charges < u.charges - 1 OR r.eps::numeric < 0
                   OR r.delta::numeric < 0
                   OR (g.mode = 'basic' AND (r.eps::numeric < u.eps_spent::numeric - ge
                                             OR r.delta::numeric < u.delta_spent::numeric - gd))
                   OR NOT sage_curve_ge(u.rdp, r.rdp)
                   OR (r.rdp IS NOT NULL AND NOT sage_curve_ge(r.rdp, regexp_replace(
                         r.rdp, '[^,\\[\\] ]+', '0', 'g'))) THEN
                  {refuse} format('the refund of block %s exceeds what grant %s charged',
                                  r.block, p_grant_id);
                END IF;
                UPDATE budgets SET eps_spent = r.eps, delta_spent = r.delta,
                       rdp = r.rdp, charges = r.charges WHERE id = u.id;
                n := n + 1;
              END LOOP;
              IF n <> json_array_length(g.blocks::json) THEN
                {refuse} format('a refund of grant %s must cover each of its blocks once',
                                p_grant_id);
              END IF;
            END $$""",
        # The wrapped data keys of a released grant's blocks, for a principal that may charge
        # the grant's (stream, context); a retired block's key no longer exists.
        f"""CREATE OR REPLACE FUNCTION sage_grant_keys(p_grant_id TEXT)
            RETURNS TABLE (block_id TEXT, kek_id TEXT, wrapped BYTEA)
            LANGUAGE plpgsql STABLE {definer} AS $$
            DECLARE g RECORD;
            BEGIN
              SELECT x.stream, x.context, x.status, x.blocks INTO g FROM grants x
                WHERE x.grant_id = p_grant_id;
              {grant_checks}
              IF g.status <> 'released' THEN
                RAISE EXCEPTION 'grant % is %: only a released grant''s keys are handed out',
                  p_grant_id, g.status USING ERRCODE = 'object_not_in_prerequisite_state';
              END IF;
              RETURN QUERY SELECT k.block_id, k.kek_id, k.wrapped
                FROM json_array_elements_text(g.blocks::json) WITH ORDINALITY AS e(b, ord)
                JOIN block_keys k ON k.stream = g.stream AND k.block_id = e.b ORDER BY e.ord;
            END $$""",
        # Triggers (run as the writer): the owner passes, everyone else is checked.
        f"""CREATE OR REPLACE FUNCTION sage_guard_budgets() RETURNS trigger LANGUAGE plpgsql
            {fixed} AS $$
            BEGIN
              IF pg_has_role(current_user, {owner}, 'USAGE') THEN RETURN NEW; END IF;
              {refuse} format('database role %s may not lower spent budget, touch a retired block '
                'or move a budget row (block %s, stream %s, context %s): budgets only grow, '
                'and a refund goes through sage_refund', current_user, OLD.block_id,
                OLD.stream, OLD.context);
            END $$""",
        # A grant a login role inserts names the role's principal and lists only blocks whose
        # budget rows this very transaction charged (their xmin is its xid): no grant over blocks
        # it did not charge, nor over retired ones (a retired row takes no update).
        f"""CREATE OR REPLACE FUNCTION sage_guard_grants() RETURNS trigger LANGUAGE plpgsql
            {fixed} AS $$
            BEGIN
              IF pg_has_role(current_user, {owner}, 'USAGE') THEN RETURN NEW; END IF;
              IF TG_OP = 'INSERT' AND NEW.status IN ('reserved', 'released') THEN
                IF NEW.principal IS DISTINCT FROM (SELECT s.principal FROM {SCOPE} s LIMIT 1)
                THEN
                  {refuse} format('database role %s may only make grants naming its own '
                    'principal (grant %s)', current_user, NEW.grant_id);
                END IF;
                IF EXISTS (SELECT 1 FROM json_array_elements_text(NEW.blocks::json) AS e(b)
                             LEFT JOIN budgets u ON u.stream = NEW.stream
                              AND u.context = NEW.context AND u.block_id = e.b
                            WHERE u.id IS NULL OR u.xmin <> pg_current_xact_id()::xid) THEN
                  {refuse} format('grant %s lists a block its transaction did not charge',
                                  NEW.grant_id);
                END IF;
                RETURN NEW;
              END IF;
              IF TG_OP = 'UPDATE' AND OLD.status = 'reserved' AND NEW.status = 'released' THEN
                RETURN NEW;
              END IF;
              {refuse} format('database role %s may only release its reservations (grant %s: '
                '%s -> %s)', current_user, NEW.grant_id,
                CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, NEW.status);
            END $$""",
        # A release a login role records: of an existing, released grant of the same stream,
        # context and run, made by the role's own principal, recorded in its name.
        f"""CREATE OR REPLACE FUNCTION sage_guard_releases() RETURNS trigger LANGUAGE plpgsql
            {fixed} AS $$
            DECLARE g RECORD; mine TEXT;
            BEGIN
              IF pg_has_role(current_user, {owner}, 'USAGE') THEN RETURN NEW; END IF;
              SELECT s.principal INTO mine FROM {SCOPE} s LIMIT 1;
              SELECT x.stream, x.context, x.run_id, x.status, x.principal INTO g FROM grants x
                WHERE x.grant_id = NEW.grant_id;
              IF FOUND AND g.stream = NEW.stream AND g.context = NEW.context
                 AND g.run_id = NEW.run_id AND g.status = 'released' AND mine IS NOT NULL
                 AND NEW.principal = mine AND g.principal IS NOT DISTINCT FROM mine THEN
                RETURN NEW;
              END IF;
              {refuse} format('database role %s may only record releases of its own released '
                'grants, in its own name (grant %s)', current_user, NEW.grant_id);
            END $$""",
        f"""CREATE OR REPLACE FUNCTION sage_guard_audit() RETURNS trigger LANGUAGE plpgsql
            {fixed} AS $$
            DECLARE mine TEXT;
            BEGIN
              IF pg_has_role(current_user, {owner}, 'USAGE') THEN RETURN NEW; END IF;
              SELECT s.principal INTO mine FROM {SCOPE} s LIMIT 1;
              IF mine IS NOT NULL AND NEW.payload::jsonb ->> 'principal' = mine THEN
                RETURN NEW;
              END IF;
              {refuse} format('database role %s may only append audit entries naming its own '
                'principal %s', current_user, coalesce(mine, '(none)'));
            END $$""",
        f"""CREATE OR REPLACE FUNCTION sage_guard_head() RETURNS trigger LANGUAGE plpgsql
            {fixed} AS $$
            BEGIN
              IF pg_has_role(current_user, {owner}, 'USAGE') THEN RETURN NEW; END IF;
              IF NEW.audit_seq > OLD.audit_seq
                 AND sage_audit_has(NEW.id, NEW.audit_seq, NEW.audit_hash) THEN
                RETURN NEW;
              END IF;
              {refuse} format('database role %s may only advance audit chain %s to an entry it '
                'appended', current_user, OLD.id);
            END $$""",
    ]


def _scope(table: str, reach: str) -> str:
    """A row of ``table`` is in the session's scope: its principal reaches every row
    (``reach``: reads_all / writes_all) or is bound to the row's (stream, context).

    A correlated EXISTS, checked per row the query reaches: the planner still drives the
    request path by the index (a hashed IN subplan made it scan every budget row).
    """
    return (f"EXISTS (SELECT 1 FROM {SCOPE} s WHERE s.{reach} OR (s.stream = {table}.stream "
            f"AND s.context = {table}.context))")


def _policies() -> list[str]:
    """Row-level security of the budget, grant and release rows (the owner bypasses it)."""
    out = []
    for table, writes in (("budgets", ("UPDATE",)), ("grants", ("INSERT", "UPDATE")),
                          ("releases", ("INSERT",))):
        out.append(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        out.append(f"DROP POLICY IF EXISTS sage_read ON {table}")
        out.append(f"CREATE POLICY sage_read ON {table} FOR SELECT "
                   f"USING ({_scope(table, 'reads_all')})")
        for cmd in writes:
            name = f"sage_{cmd.lower()}"
            out.append(f"DROP POLICY IF EXISTS {name} ON {table}")
            write = _scope(table, "writes_all")
            using = f"USING ({write}) " if cmd == "UPDATE" else ""
            out.append(f"CREATE POLICY {name} ON {table} FOR {cmd} {using}"
                       f"WITH CHECK ({write})")
    return out


_LOWERED = ("NEW.eps_spent::numeric < OLD.eps_spent::numeric OR "
            "NEW.delta_spent::numeric < OLD.delta_spent::numeric OR NEW.charges < OLD.charges "
            "OR OLD.status = 'retired' "
            "OR (NEW.rdp IS DISTINCT FROM OLD.rdp AND NOT sage_curve_ge(NEW.rdp, OLD.rdp)) "
            "OR NEW.stream IS DISTINCT FROM OLD.stream OR NEW.context IS DISTINCT FROM "
            "OLD.context OR NEW.block_id IS DISTINCT FROM OLD.block_id OR NEW.seq IS DISTINCT "
            "FROM OLD.seq OR NEW.location IS DISTINCT FROM OLD.location")


def _triggers(owner_name: str) -> list[str]:
    """The guard triggers (AFTER ROW: a refusal aborts the statement).

    Installed with the first login role (:func:`grant`): a row trigger costs every write of
    the table some microseconds even when its WHEN is false, which a ledger without login
    roles should not pay. WHEN skips the owner's writes (``owner_name``, an SQL literal)
    without calling the function; any other role (superusers included) runs it, and it lets
    the owner's members pass.
    """
    others = f"current_user <> {owner_name}"
    return [f"CREATE OR REPLACE TRIGGER {name} AFTER {event} FOR EACH ROW WHEN ({others}{extra}) "
            f"EXECUTE FUNCTION {name}()" for name, event, extra in (
                ("sage_guard_budgets", "UPDATE ON budgets", f" AND ({_LOWERED})"),
                ("sage_guard_grants", "INSERT OR UPDATE ON grants", ""),
                ("sage_guard_releases", "INSERT ON releases", ""),
                ("sage_guard_audit", "INSERT ON audit", ""),
                ("sage_guard_head", "UPDATE ON ledger_head", ""))]


def _schema(conn) -> str:
    from psycopg import sql
    return sql.Identifier(conn.execute("SELECT current_schema()").fetchone()[0]).as_string(conn)


def installed(conn) -> bool:
    """Whether this version's functions and policies are in the ledger's database."""
    return conn.execute(f"SELECT to_regprocedure('{MARKER}()') IS NOT NULL").fetchone()[0]


def install(store) -> None:
    """Creates the functions and policies (inside the owner's schema transaction).

    Done once per :data:`SECURITY_VERSION`: policies take table locks, which opening a ledger
    should not. The triggers come with the first login role (:func:`guard`).
    """
    conn = store.conn
    if installed(conn):
        return
    for stmt in _functions(_schema(conn)) + _policies():
        conn.execute(stmt)
    for fn in _DEFINER:
        conn.execute(f"REVOKE ALL ON FUNCTION {fn} FROM PUBLIC")
    for (role,) in conn.execute(  # auditors' login roles made before this version's functions
            "SELECT pg_role FROM principals WHERE pg_role IS NOT NULL AND status = 'active' "
            "AND roles::jsonb ? 'auditor'").fetchall():
        if role_exists(conn, role):
            for fn in _FUNCTIONS_OF["auditor"]:
                conn.execute(f"GRANT EXECUTE ON FUNCTION {fn} TO {_ident(conn, role)}")
    if conn.execute("SELECT 1 FROM pg_trigger WHERE tgname = 'sage_guard_budgets' LIMIT 1"
                    ).fetchone():
        guard(store)  # login roles exist: their guards follow this version (new ones added)
    conn.execute(f"CREATE FUNCTION {MARKER}() RETURNS INT LANGUAGE sql IMMUTABLE AS 'SELECT 1'")


def guard(store) -> None:
    """Installs (or renews, for the current owner) the guard triggers."""
    from psycopg import sql
    conn = store.conn
    owner = conn.execute("SELECT pg_get_userbyid(relowner) FROM pg_class "
                         "WHERE oid = to_regclass('ledger_head')").fetchone()[0]
    for stmt in _triggers(sql.Literal(owner).as_string(conn)):
        conn.execute(stmt)


def restricted(store) -> bool:
    """Whether this connection's database role is not the ledger's owner (PostgreSQL).

    Such a role cannot (and must not) create or migrate the schema: the owner does that. It
    opens a ledger whose schema is current, or gets a clear error.

    Raises:
      PermissionDeniedError: the role may not read the ledger at all (e.g. a client's).
      InvalidRequestError: the schema needs a migration or this version's security objects,
        which only the owner can make.
    """
    from psycopg import errors

    from sage_tfx.ledger import schema
    conn = store.conn
    row = conn.execute("SELECT pg_has_role(c.relowner, 'USAGE'), session_user FROM pg_class c "
                       "WHERE c.oid = to_regclass('ledger_head')").fetchone()
    if row is None or row[0]:
        return False  # a new ledger (this role creates and owns it), or the owner
    try:
        version = conn.execute("SELECT max(schema_version) FROM ledger_head").fetchone()[0]
    except errors.InsufficientPrivilege as exc:
        raise PermissionDeniedError(
            f"database role {row[1]!r} may not read this ledger (a client principal talks to "
            "services, not to the ledger's database)") from exc
    if version != schema.SCHEMA_VERSION or not installed(conn):
        raise InvalidRequestError(
            f"this ledger's schema is version {version} (this code: {schema.SCHEMA_VERSION}, "
            f"security {SECURITY_VERSION}): its owner must open it once to migrate it; database "
            f"role {row[1]!r} cannot")
    return True


# -- login roles of principals --

def check_role_name(role: str) -> str:
    """Returns ``role`` if it is a usable PostgreSQL role name (1-63 characters)."""
    from sage_tfx.ledger.values import check_name
    check_name("pg_role", role)
    if len(role) > MAX_ROLE_NAME:
        raise InvalidRequestError(f"a PostgreSQL role name has at most {MAX_ROLE_NAME} "
                                  f"characters, got {len(role)}")
    return role


def check_roles_for_login(roles: Sequence[str]) -> None:
    """Refuses a login role for admins (they act through the ledger owner's role)."""
    if "admin" in roles:
        raise InvalidRequestError(
            "an admin acts through the ledger owner's database role (the one that created the "
            "tables) with a token naming it; a --pg-role is for pipeline, auditor and client "
            "principals")


def _ident(conn, name: str) -> str:
    from psycopg import sql
    return sql.Identifier(name).as_string(conn)


def role_exists(conn, role: str) -> bool:
    """True if the PostgreSQL role ``role`` exists."""
    return conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is not None


def create_login(store, role: str, password: Optional[str]) -> None:
    """Creates LOGIN role ``role`` (inside the caller's transaction).

    With a password, only its SCRAM-SHA-256 verifier is sent (computed here by libpq): the
    secret itself never reaches the server, its logs or ``pg_stat_activity``. Without one the
    operator authenticates the role by other means (certificate, GSSAPI, peer).

    Raises:
      InvalidRequestError: the role exists already.
    """
    conn = store.conn
    if role_exists(conn, role):
        raise InvalidRequestError(
            f"database role {role!r} already exists: choose another name with --pg-role ROLE, "
            "or give it to the principal as it is with --pg-existing")
    conn.execute(f"CREATE ROLE {_ident(conn, role)} LOGIN{_password_clause(conn, role, password)}")


def _password_clause(conn, role: str, password: Optional[str]) -> str:
    if password is None:
        return ""
    from psycopg import sql
    verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(),
                                            b"scram-sha-256").decode()
    return " PASSWORD " + sql.Literal(verifier).as_string(conn)


def set_password(store, role: str, password: str) -> None:
    """Replaces the login password of ``role`` (its SCRAM verifier only)."""
    conn = store.conn
    conn.execute(f"ALTER ROLE {_ident(conn, role)}{_password_clause(conn, role, password)}")


def grant(store, role: str, roles: Sequence[str]) -> None:
    """Gives ``role`` exactly the privileges of the sage ``roles`` (revoking any others)."""
    conn = store.conn
    if not role_exists(conn, role):
        raise InvalidRequestError(f"database role {role!r} does not exist")
    guard(store)
    revoke(store, role)
    who = _ident(conn, role)
    for r in sorted(set(roles)):
        for privilege in _GRANTS[r]:
            conn.execute(f"GRANT {privilege} TO {who}")
        for fn in _FUNCTIONS_OF[r]:
            conn.execute(f"GRANT EXECUTE ON FUNCTION {fn} TO {who}")


def revoke(store, role: str) -> None:
    """Takes every ledger privilege from ``role`` (a disabled principal's role keeps none)."""
    conn = store.conn
    who = _ident(conn, role)
    conn.execute(f"REVOKE ALL ON {', '.join(LEDGER_TABLES + (SCOPE,))} FROM {who}")
    conn.execute(f"REVOKE ALL ON SEQUENCE audit_seq_gen FROM {who}")
    for fn in _DEFINER:
        conn.execute(f"REVOKE ALL ON FUNCTION {fn} FROM {who}")


def disable(store, role: str) -> None:
    """NOLOGIN and no privileges: open sessions lose access at their next statement."""
    conn = store.conn
    if role_exists(conn, role):
        conn.execute(f"ALTER ROLE {_ident(conn, role)} NOLOGIN")
        revoke(store, role)


# -- what libraries call --

def grant_keys(store, grant_id: str) -> list[tuple[str, str, bytes]]:
    """``sage_grant_keys(grant_id)``: (block id, KEK id, wrapped key) of a released grant's
    blocks, in grant order, for a caller that may charge the grant's (stream, context).

    Raises:
      InvalidRequestError: unknown grant. GrantStateError: not released.
      PermissionDeniedError: the caller is not bound to the grant's (stream, context).
    """
    return call(store, "SELECT block_id, kek_id, wrapped FROM sage_grant_keys(%s)",
                (grant_id,), lambda cur: [(r[0], r[1], bytes(r[2])) for r in cur.fetchall()])


def refund(store, grant_id: str, rows_json: str) -> None:
    """``sage_refund(grant_id, rows)``: cancels a reservation and writes its refund."""
    call(store, "SELECT sage_refund(%s, %s)", (grant_id, rows_json), lambda cur: None)


def call(store, sql_text: str, params: tuple, read):
    """Runs one statement, mapping the functions' refusals to sage_tfx errors."""
    from psycopg import errors
    try:
        return read(store.conn.execute(sql_text, params))
    except errors.InsufficientPrivilege as exc:
        raise PermissionDeniedError(exc.diag.message_primary) from exc
    except errors.InvalidParameterValue as exc:
        raise InvalidRequestError(exc.diag.message_primary) from exc
    except errors.ObjectNotInPrerequisiteState as exc:
        raise GrantStateError(exc.diag.message_primary) from exc
