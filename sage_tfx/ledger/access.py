"""Principals, roles and context bindings: who may do what to which budget list.

Sage §3.2 calls the ledger "a new type of access control": ML access to a block is allowed only
through the gate. This module says *who* may pass it. A **principal** holds one or more roles:

* ``admin`` — streams, blocks, budgets, retirement, keys, principals and bindings;
* ``pipeline`` — requests (grants), releases and recorded outputs, only in the (stream, context)
  budget lists bound to it (:meth:`AccessMixin.bind`);
* ``auditor`` — the audit log, verification, consistency checks and reports (read only);
* ``client`` — nothing on the ledger itself; services (Draw-and-Discard) accept its updates.

Credentials are random bearer tokens shown once when issued; the database keeps only their
SHA-256 digest (a token has 256 random bits, so a slow password hash adds nothing). On
PostgreSQL a principal may instead be a database login role (``pg_role``): the server then
authenticates the connection and the ledger maps ``current_user`` to the principal.

**Open mode.** A ledger with no principal is a single user's: every caller is the implicit
``local`` admin (the embedded SQLite default, one command away). Issuing the first principal
(it must hold ``admin``) turns authentication on for every connection opened afterwards.

**Tamper evidence.** Every change of principals or bindings records, in its audit entry, the
digest of both tables before and after it (:func:`access_digest`: names, roles, a hash of each
token digest, status, database role; every binding). :func:`access_problems` (``sage-tfx
verify``) replays those digests: a row edited, added or deleted outside the library shows as a
digest that does not match the one recorded next to it. On SQLite whoever may write the file
may also forge what the library records, so this is evidence, not a boundary (on PostgreSQL
only the ledger's owner may write these tables at all).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets as token_rng
from typing import Optional, Sequence

from sage_tfx.errors import AuthenticationError, InvalidRequestError, PermissionDeniedError
from sage_tfx.ledger import pgroles, secrets
from sage_tfx.ledger.names import (ADMIN, AUDITOR, CLIENT, PIPELINE, ROLES,  # noqa: F401
                                   TOKEN_ENV, TOKEN_FILE_ENV)
from sage_tfx.ledger.values import check_name, now

ACTIVE = "active"
DISABLED = "disabled"
TOKEN_PREFIX = "sage_"

# What each action needs. ``charge`` by a pipeline also needs a binding of its (stream, context).
CONFIGURE = "configure"  # streams, blocks, retirement, keys, principals
CHARGE = "charge"  # request, release, cancel, record a release
READ = "read"  # streams, blocks and grants
AUDIT = "audit"  # audit log, verification, consistency
COORDINATE = "coordinate"  # leases and counters the systems share (names outside "sage/")
ALLOWED = {
    CONFIGURE: {ADMIN},
    CHARGE: {ADMIN, PIPELINE},
    READ: {ADMIN, PIPELINE, AUDITOR},
    AUDIT: {ADMIN, AUDITOR},
    COORDINATE: {ADMIN, PIPELINE},
}


@dataclasses.dataclass(frozen=True)
class Principal:
    """An identity with roles; ``local`` (admin) is the caller of a ledger in open mode."""

    name: str
    roles: frozenset
    status: str = ACTIVE
    pg_role: Optional[str] = None

    def has(self, role: str) -> bool:
        """True if the principal holds ``role``."""
        return role in self.roles


LOCAL = Principal("local", frozenset({ADMIN}))


def token_digest(token: str) -> str:
    """The SHA-256 hex digest under which a token is stored."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_from_env(environ=os.environ) -> Optional[str]:
    """The caller's token from ``$SAGE_LEDGER_TOKEN`` or the file ``$SAGE_LEDGER_TOKEN_FILE``."""
    if environ.get(TOKEN_ENV):
        return secrets.resolve(environ[TOKEN_ENV], "token")
    if environ.get(TOKEN_FILE_ENV):
        return secrets.resolve(secrets.FILE_PREFIX + environ[TOKEN_FILE_ENV], "token")
    return None


def check_roles(roles: Sequence[str]) -> frozenset:
    """``roles`` as a frozenset of known roles. Raises InvalidRequestError."""
    if isinstance(roles, str):
        roles = [roles]
    roles = frozenset(roles)
    if not roles or not roles <= set(ROLES):
        raise InvalidRequestError(f"roles must be a non-empty subset of {ROLES}, got "
                                  f"{sorted(roles)!r}")
    return roles


def _principal(row) -> Principal:
    return Principal(row[0], frozenset(json.loads(row[1])), row[2], row[3])


_COLS = "SELECT name, roles, status, pg_role FROM principals "
# Audit entries of principal and binding changes: each records the access digest around it.
ACCESS_KINDS = ("principal_add", "principal_rotate", "principal_disable", "bind", "unbind",
                "access_seal")
_ACCESS_LOCK = 727273  # PostgreSQL: serialises changes of principals and bindings
# PostgreSQL: through a SECURITY DEFINER function (an auditor's role cannot read token digests)
_PG_ACCESS_ROWS = "SELECT name, roles, token_check, status, pg_role FROM sage_access_rows()"


def access_digest(store) -> str:
    """SHA-256 of the principals and bindings tables as the library wrote them: each
    principal's name, sorted roles, the SHA-256 of its token digest, status and database role,
    and every binding, in one canonical JSON text."""
    if store.kind == "postgresql":
        principals = store.q(_PG_ACCESS_ROWS).fetchall()
    else:
        principals = [(n, r, None if t is None else hashlib.sha256(t.encode()).hexdigest(), st,
                       pg) for n, r, t, st, pg in store.q(
            "SELECT name, roles, token_sha256, status, pg_role FROM principals").fetchall()]
    doc = {"principals": sorted([n, sorted(json.loads(r)), t, st, pg]
                                for n, r, t, st, pg in principals),
           "bindings": sorted(list(b) for b in store.q(
               "SELECT principal, stream, context FROM bindings").fetchall())}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def access_problems(store) -> list[str]:
    """What the audit log's access digests say about the principals and bindings tables
    (empty: every change went through the library). Call inside one read snapshot."""
    marks = ", ".join("?" * len(ACCESS_KINDS))
    last, problems = None, []
    for seq, text in store.q(f"SELECT seq, payload FROM audit WHERE kind IN ({marks}) "
                             "ORDER BY seq", ACCESS_KINDS).fetchall():
        payload = json.loads(text)
        if "acl" not in payload:
            continue  # written before digests were recorded
        if last is not None and payload.get("acl_before") != last[1]:
            problems.append(f"principals or bindings were changed outside the library between "
                            f"audit entries {last[0]} and {seq}")
        last = (seq, payload["acl"])
    current = access_digest(store)
    if last is None:
        if store.q("SELECT count(*) FROM principals").fetchone()[0]:
            problems.append("no access digest is recorded in the audit log (a ledger from "
                            "before they were): check 'sage-tfx principal list', then record "
                            "one with 'sage-tfx principal seal'")
    elif current != last[1]:
        problems.append(f"principals or bindings differ from what audit entry {last[0]} "
                        "recorded: a row was edited, added or deleted outside the library")
    return problems


def identify(store, token: Optional[str]) -> Principal:
    """The principal a connection acts as (``LOCAL`` in open mode).

    On PostgreSQL a connection whose database role is a principal's login role (``pg_role``)
    is that principal; a token, if also given, must name the same one.

    Raises:
      AuthenticationError: principals exist and the token (or database role) matches no
        active one, or the token and the database role name different principals.
    """
    if store.kind == "postgresql":
        return _identify_pg(store, token)
    if store.q("SELECT count(*) FROM principals").fetchone()[0] == 0:
        return LOCAL
    if token is None:
        raise _no_token()
    return lookup(store, token)


def _no_token() -> AuthenticationError:
    return AuthenticationError(
        "this ledger has principals: authenticate with a token (open_ledger(url, "
        f"token=...), ${TOKEN_ENV} or ${TOKEN_FILE_ENV}); an admin issues one with "
        "'sage-tfx principal add NAME --role ROLE'")


# PostgreSQL: through a SECURITY DEFINER function (a login role cannot read ``principals``).
_PG_IDENTIFY = "SELECT principals, name, roles, status, pg_role FROM sage_identify(?)"


def _identify_pg(store, token: Optional[str]) -> Principal:
    row = store.q(_PG_IDENTIFY, (None,)).fetchone()
    if row[0] == 0:
        return LOCAL
    by_role = _principal(row[1:]) if row[1] is not None else None
    if token is None:
        if by_role is None:
            raise _no_token()
        return _active(by_role)
    p = lookup(store, token)
    if by_role is not None and by_role.name != p.name:
        raise AuthenticationError(
            f"this connection's database role is principal {by_role.name!r}'s, but the token "
            f"names principal {p.name!r}: connect with that principal's own credentials")
    return p


def lookup(store, token: str) -> Principal:
    """The active principal holding ``token``. Raises AuthenticationError."""
    if not isinstance(token, str) or not token:
        raise AuthenticationError("no token given")
    if store.kind == "postgresql":
        row = store.q(_PG_IDENTIFY, (token_digest(token),)).fetchone()
        row = row[1:] if row[1] is not None else None
    else:
        row = store.q(_COLS + "WHERE token_sha256 = ?", (token_digest(token),)).fetchone()
    if row is None:
        raise AuthenticationError("unknown token")
    return _active(_principal(row))


def _active(p: Principal) -> Principal:
    if p.status != ACTIVE:
        raise AuthenticationError(f"principal {p.name!r} is disabled")
    return p


class AccessMixin:
    """Principal management and authorization of :class:`~sage_tfx.ledger.core.Ledger`.

    Needs ``self._store`` and ``self.principal``.
    """

    principal: Principal

    @property
    def open_mode(self) -> bool:
        """Whether this connection runs without authentication (no principal existed)."""
        return self.principal is LOCAL

    def authorize(self, action: str, *, stream: Optional[str] = None,
                  context: Optional[str] = None, principal: Optional[Principal] = None) -> None:
        """Checks that ``principal`` (default: this connection's) may do ``action``.

        Raises:
          PermissionDeniedError: the principal's roles do not allow it, or a pipeline acts on a
            (stream, context) not bound to it.
        """
        p = principal or self.principal
        if p is LOCAL or p.has(ADMIN):
            return
        allowed = ALLOWED[action]
        if not p.roles & allowed:
            raise PermissionDeniedError(
                f"principal {p.name!r} (roles {sorted(p.roles)}) may not {action}: it needs one "
                f"of {sorted(allowed)}")
        if action == CHARGE or (action == READ and not p.has(AUDITOR) and context is not None):
            if stream is None or context is None or not self._bound(p.name, stream, context):
                raise PermissionDeniedError(
                    f"principal {p.name!r} is not bound to stream {stream!r}, context "
                    f"{context!r}: an admin binds it with 'sage-tfx principal bind {p.name} "
                    f"--stream {stream} --context {context}'")

    def _bound(self, name: str, stream: str, context: str) -> bool:
        if self._store.restricted:  # a login role sees only its own principal's bindings
            return name == self.principal.name and self._store.q(
                f"SELECT 1 FROM {pgroles.SCOPE} WHERE stream = ? AND context = ?",
                (stream, context)).fetchone() is not None
        return self._store.q("SELECT 1 FROM bindings WHERE principal = ? AND stream = ? AND "
                             "context = ?", (name, stream, context)).fetchone() is not None

    def authenticate(self, token: str) -> Principal:
        """The active principal holding ``token`` (for services that check their callers).

        Raises:
          AuthenticationError: no active principal holds it.
        """
        return self._store.read(lambda: lookup(self._store, token))

    def principals(self) -> list[Principal]:
        """Every principal, by name (needs CONFIGURE)."""
        self.authorize(CONFIGURE)
        return [_principal(r) for r in self._store.q(_COLS + "ORDER BY name").fetchall()]

    def add_principal(self, name: str, roles: Sequence[str], *,
                      pg_role: Optional[str] = None, create_pg_role: bool = False,
                      pg_password: Optional[str] = None) -> str:
        """Issues a principal and returns its token (shown once; only its digest is kept).

        The first principal of a ledger must hold ``admin``: it turns authentication on.

        Args:
          name: the principal's name.
          roles: some of ``admin``, ``pipeline``, ``auditor``, ``client``.
          pg_role: PostgreSQL: the principal's own database login role, given exactly the
            privileges of ``roles`` (:mod:`~sage_tfx.ledger.pgroles`); a connection as that
            role is this principal.
          create_pg_role: create ``pg_role`` (LOGIN) rather than use an existing role.
          pg_password: the new role's password (only its SCRAM verifier reaches the server);
            None: the operator authenticates the role by other means.

        Raises:
          InvalidRequestError: a bad name or role, the name or database role is taken, a first
            principal without ``admin``, a database role for an admin, or on SQLite.
        """
        check_name("principal name", name)
        roles = check_roles(roles)
        if pg_role is not None:
            self._check_pg_role(pg_role, roles)
        elif create_pg_role or pg_password is not None:
            raise InvalidRequestError("create_pg_role and pg_password need pg_role")
        if pg_password is not None and not create_pg_role:
            raise InvalidRequestError("pg_password is for a role created here (create_pg_role)")
        self.authorize(CONFIGURE)
        token = TOKEN_PREFIX + token_rng.token_urlsafe(32)

        def txn():
            before = self._access_before()
            n = self._store.q("SELECT count(*) FROM principals").fetchone()[0]
            if n == 0 and ADMIN not in roles:
                raise InvalidRequestError(
                    "the first principal turns authentication on and must hold the admin role "
                    f"(got {sorted(roles)}); add an admin first")
            if self._store.q("SELECT 1 FROM principals WHERE name = ?", (name,)).fetchone():
                raise InvalidRequestError(f"principal {name!r} already exists")
            if pg_role is not None:
                taken = self._store.q("SELECT name FROM principals WHERE pg_role = ?",
                                      (pg_role,)).fetchone()
                if taken:
                    raise InvalidRequestError(
                        f"database role {pg_role!r} already belongs to principal {taken[0]!r}")
                if create_pg_role:
                    pgroles.create_login(self._store, pg_role, pg_password)
                pgroles.grant(self._store, pg_role, roles)
            ts = now()
            self._store.q("INSERT INTO principals (name, roles, token_sha256, status, pg_role, "
                          "created_at, updated_at) VALUES (?,?,?,?,?,?,?)",
                          (name, json.dumps(sorted(roles)), token_digest(token), ACTIVE, pg_role,
                           ts, ts))
            self._audit_access(None, "principal_add", {
                "name": name, "roles": sorted(roles), "pg_role": pg_role,
                "pg_role_created": bool(create_pg_role)}, before)

        self._store.write(txn)
        return token

    def _check_pg_role(self, pg_role: str, roles: frozenset) -> None:
        if self._store.kind != "postgresql":
            raise InvalidRequestError("database login roles (pg_role) need a PostgreSQL ledger")
        pgroles.check_role_name(pg_role)
        pgroles.check_roles_for_login(roles)

    def pg_role_exists(self, role: str) -> bool:
        """Whether database role ``role`` exists (PostgreSQL; False on SQLite)."""
        self.authorize(CONFIGURE)
        return self._store.kind == "postgresql" and pgroles.role_exists(self._store.conn, role)

    def principal_info(self, name: str) -> Principal:
        """One principal. Raises InvalidRequestError if unknown."""
        self.authorize(CONFIGURE)
        row = self._store.q(_COLS + "WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise InvalidRequestError(f"unknown principal {name!r}")
        return _principal(row)

    def rotate_token(self, name: str, *, pg_password: Optional[str] = None) -> str:
        """Replaces a principal's token; the old one stops working at once.

        ``pg_password`` also replaces the password of the principal's database role.
        """
        self.authorize(CONFIGURE)
        token = TOKEN_PREFIX + token_rng.token_urlsafe(32)

        def pg(p: Principal) -> None:
            if pg_password is not None:
                if not p.pg_role:
                    raise InvalidRequestError(f"principal {name!r} has no database role")
                pgroles.set_password(self._store, p.pg_role, pg_password)

        self._set_principal(name, "principal_rotate", pg, token_sha256=token_digest(token))
        return token

    def disable_principal(self, name: str) -> None:
        """Disables a principal: its token and database role no longer authenticate, and the
        role loses every privilege (its open sessions at their next statement)."""
        self.authorize(CONFIGURE)

        def pg(p: Principal) -> None:
            if p.pg_role and self._store.kind == "postgresql":
                pgroles.disable(self._store, p.pg_role)

        self._set_principal(name, "principal_disable", pg, status=DISABLED)

    def _set_principal(self, name: str, kind: str, pg, **columns) -> None:
        def txn():
            before = self._access_before()
            row = self._store.q(_COLS + "WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise InvalidRequestError(f"unknown principal {name!r}")
            pg(_principal(row))
            sets = ", ".join(f"{c} = ?" for c in columns)
            self._store.q(f"UPDATE principals SET {sets}, updated_at = ? WHERE name = ?",
                          tuple(columns.values()) + (now(), name))
            self._audit_access(None, kind, {"name": name}, before)

        self._store.write(txn)

    def bind(self, principal: str, stream: str, context: str) -> None:
        """Lets ``principal`` charge the (stream, context) budget list."""
        self.authorize(CONFIGURE)
        s = self.stream(stream)
        self._context(s, context)

        def txn():
            before = self._access_before()
            if not self._store.q("SELECT 1 FROM principals WHERE name = ?",
                                 (principal,)).fetchone():
                raise InvalidRequestError(f"unknown principal {principal!r}")
            if self._bound(principal, stream, context):
                return
            self._store.q("INSERT INTO bindings (principal, stream, context, created_at) "
                          "VALUES (?,?,?,?)", (principal, stream, context, now()))
            self._audit_access(stream, "bind", {"name": principal, "context": context}, before)

        self._store.write(txn)

    def unbind(self, principal: str, stream: str, context: str) -> None:
        """Withdraws a binding (grants already made stay as they are)."""
        self.authorize(CONFIGURE)

        def txn():
            before = self._access_before()
            if not self._bound(principal, stream, context):
                raise InvalidRequestError(f"principal {principal!r} is not bound to stream "
                                          f"{stream!r}, context {context!r}")
            self._store.q("DELETE FROM bindings WHERE principal = ? AND stream = ? AND "
                          "context = ?", (principal, stream, context))
            self._audit_access(stream, "unbind", {"name": principal, "context": context},
                               before)

        self._store.write(txn)

    def seal_access(self) -> str:
        """Records the access digest of the principals and bindings as they are now (a ledger
        from before digests were recorded; see :func:`access_problems`); returns it. An edit
        made outside the library since the last recorded digest stays reported."""
        self.authorize(CONFIGURE)

        def txn() -> str:
            before = self._access_before()
            self._audit_access(None, "access_seal", {}, before)
            return before

        return self._store.write(txn)

    def _access_before(self) -> str:
        """The access digest at the start of a change (which then holds the access lock on
        PostgreSQL, so the digests of concurrent changes chain in audit order)."""
        if self._store.kind == "postgresql":
            self._store.q("SELECT pg_advisory_xact_lock(?)", (_ACCESS_LOCK,))
        return access_digest(self._store)

    def _audit_access(self, stream: Optional[str], kind: str, payload: dict,
                      before: str) -> None:
        self._store.audit(stream, kind, dict(payload, acl_before=before,
                                             acl=access_digest(self._store)))

    def bindings(self, principal: Optional[str] = None) -> list[tuple[str, str, str]]:
        """(principal, stream, context) bindings, of one principal or all."""
        self.authorize(CONFIGURE)
        sql = "SELECT principal, stream, context FROM bindings "
        rows = (self._store.q(sql + "WHERE principal = ? ORDER BY stream, context", (principal,))
                if principal else self._store.q(sql + "ORDER BY principal, stream, context"))
        return [tuple(r) for r in rows.fetchall()]
