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
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets as token_rng
from typing import Optional, Sequence

from sage_tfx.errors import AuthenticationError, InvalidRequestError, PermissionDeniedError
from sage_tfx.ledger import secrets
from sage_tfx.ledger.values import check_name, now

ADMIN = "admin"
PIPELINE = "pipeline"
AUDITOR = "auditor"
CLIENT = "client"
ROLES = (ADMIN, PIPELINE, AUDITOR, CLIENT)
ACTIVE = "active"
DISABLED = "disabled"
TOKEN_ENV = "SAGE_LEDGER_TOKEN"
TOKEN_FILE_ENV = "SAGE_LEDGER_TOKEN_FILE"
TOKEN_PREFIX = "sage_"

# What each action needs. ``charge`` by a pipeline also needs a binding of its (stream, context).
CONFIGURE = "configure"  # streams, blocks, retirement, keys, principals
CHARGE = "charge"  # request, release, cancel, record a release
READ = "read"  # streams, blocks and grants
AUDIT = "audit"  # audit log, verification, consistency
ALLOWED = {
    CONFIGURE: {ADMIN},
    CHARGE: {ADMIN, PIPELINE},
    READ: {ADMIN, PIPELINE, AUDITOR},
    AUDIT: {ADMIN, AUDITOR},
}


@dataclasses.dataclass(frozen=True)
class Principal:
    """An identity with roles; ``local`` (admin) is the caller of a ledger in open mode."""

    name: str
    roles: frozenset
    status: str = ACTIVE
    pg_role: Optional[str] = None

    def has(self, role: str) -> bool:
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


def identify(store, token: Optional[str]) -> Principal:
    """The principal a connection acts as (``LOCAL`` in open mode).

    Raises:
      AuthenticationError: principals exist and the token (or database role) matches no
        active one.
    """
    if store.q("SELECT count(*) FROM principals").fetchone()[0] == 0:
        return LOCAL
    if store.kind == "postgresql":
        user = store.q("SELECT current_user").fetchone()[0]
        row = store.q(_COLS + "WHERE pg_role = ?", (user,)).fetchone()
        if row is not None and token is None:
            return _active(_principal(row))
    if token is None:
        raise AuthenticationError(
            "this ledger has principals: authenticate with a token (open_ledger(url, "
            f"token=...), ${TOKEN_ENV} or ${TOKEN_FILE_ENV}); an admin issues one with "
            "'sage-tfx principal add NAME --role ROLE'")
    return lookup(store, token)


def lookup(store, token: str) -> Principal:
    """The active principal holding ``token``. Raises AuthenticationError."""
    if not isinstance(token, str) or not token:
        raise AuthenticationError("no token given")
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
        return self._store.q("SELECT 1 FROM bindings WHERE principal = ? AND stream = ? AND "
                             "context = ?", (name, stream, context)).fetchone() is not None

    def authenticate(self, token: str) -> Principal:
        """The active principal holding ``token`` (for services that check their callers).

        Raises:
          AuthenticationError: no active principal holds it.
        """
        return self._store.read(lambda: lookup(self._store, token))

    def principals(self) -> list[Principal]:
        self.authorize(CONFIGURE)
        return [_principal(r) for r in self._store.q(_COLS + "ORDER BY name").fetchall()]

    def add_principal(self, name: str, roles: Sequence[str], *,
                      pg_role: Optional[str] = None) -> str:
        """Issues a principal and returns its token (shown once; only its digest is kept).

        The first principal of a ledger must hold ``admin``: it turns authentication on.

        Raises:
          InvalidRequestError: a bad name or role, the name is taken, or a first principal
            without ``admin``.
        """
        check_name("principal name", name)
        roles = check_roles(roles)
        if pg_role is not None:
            check_name("pg_role", pg_role)
        self.authorize(CONFIGURE)
        token = TOKEN_PREFIX + token_rng.token_urlsafe(32)

        def txn():
            n = self._store.q("SELECT count(*) FROM principals").fetchone()[0]
            if n == 0 and ADMIN not in roles:
                raise InvalidRequestError(
                    "the first principal turns authentication on and must hold the admin role "
                    f"(got {sorted(roles)}); add an admin first")
            if self._store.q("SELECT 1 FROM principals WHERE name = ?", (name,)).fetchone():
                raise InvalidRequestError(f"principal {name!r} already exists")
            ts = now()
            self._store.q("INSERT INTO principals (name, roles, token_sha256, status, pg_role, "
                          "created_at, updated_at) VALUES (?,?,?,?,?,?,?)",
                          (name, json.dumps(sorted(roles)), token_digest(token), ACTIVE, pg_role,
                           ts, ts))
            self._store.audit(None, "principal_add", {"name": name, "roles": sorted(roles),
                                                      "pg_role": pg_role})

        self._store.write(txn)
        return token

    def rotate_token(self, name: str) -> str:
        """Replaces a principal's token; the old one stops working at once."""
        self.authorize(CONFIGURE)
        token = TOKEN_PREFIX + token_rng.token_urlsafe(32)
        self._set_principal(name, "principal_rotate", token_sha256=token_digest(token))
        return token

    def disable_principal(self, name: str) -> None:
        """Disables a principal: its token and database role no longer authenticate."""
        self.authorize(CONFIGURE)
        self._set_principal(name, "principal_disable", status=DISABLED)

    def _set_principal(self, name: str, kind: str, **columns) -> None:
        def txn():
            if not self._store.q("SELECT 1 FROM principals WHERE name = ?", (name,)).fetchone():
                raise InvalidRequestError(f"unknown principal {name!r}")
            sets = ", ".join(f"{c} = ?" for c in columns)
            self._store.q(f"UPDATE principals SET {sets}, updated_at = ? WHERE name = ?",
                          tuple(columns.values()) + (now(), name))
            self._store.audit(None, kind, {"name": name})

        self._store.write(txn)

    def bind(self, principal: str, stream: str, context: str) -> None:
        """Lets ``principal`` charge the (stream, context) budget list."""
        self.authorize(CONFIGURE)
        s = self.stream(stream)
        self._context(s, context)

        def txn():
            if not self._store.q("SELECT 1 FROM principals WHERE name = ?",
                                 (principal,)).fetchone():
                raise InvalidRequestError(f"unknown principal {principal!r}")
            if self._bound(principal, stream, context):
                return
            self._store.q("INSERT INTO bindings (principal, stream, context, created_at) "
                          "VALUES (?,?,?,?)", (principal, stream, context, now()))
            self._store.audit(stream, "bind", {"name": principal, "context": context})

        self._store.write(txn)

    def unbind(self, principal: str, stream: str, context: str) -> None:
        """Withdraws a binding (grants already made stay as they are)."""
        self.authorize(CONFIGURE)

        def txn():
            self._store.q("DELETE FROM bindings WHERE principal = ? AND stream = ? AND "
                          "context = ?", (principal, stream, context))
            self._store.audit(stream, "unbind", {"name": principal, "context": context})

        self._store.write(txn)

    def bindings(self, principal: Optional[str] = None) -> list[tuple[str, str, str]]:
        """(principal, stream, context) bindings, of one principal or all."""
        self.authorize(CONFIGURE)
        sql = "SELECT principal, stream, context FROM bindings "
        rows = (self._store.q(sql + "WHERE principal = ? ORDER BY stream, context", (principal,))
                if principal else self._store.q(sql + "ORDER BY principal, stream, context"))
        return [tuple(r) for r in rows.fetchall()]
