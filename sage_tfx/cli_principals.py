"""``sage-tfx principal ...``: who may use the ledger, in which roles and contexts.

::

    sage-tfx principal add alice --role admin        # the first one turns authentication on
    export SAGE_LEDGER_TOKEN_FILE=$HOME/.sage/alice.token            # (saved as printed)
    sage-tfx principal add etl --role pipeline --pg-role             # + a PostgreSQL login role
    sage-tfx principal bind etl --stream flights --context team-a
    sage-tfx principal list
    sage-tfx principal rotate etl [--pg-password]
    sage-tfx principal unbind etl --stream flights --context team-a
    sage-tfx principal disable etl
    sage-tfx principal seal                 # record the access digest of an older ledger
    sage-tfx --token file:$HOME/.sage/alice.token principal list     # or env:NAME

Tokens and database passwords are printed once, when issued; the ledger keeps a SHA-256 digest
of each token and PostgreSQL a SCRAM verifier of each password.
"""
from __future__ import annotations

import argparse
import secrets as rng
import urllib.parse

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import names

_ROLE_HELP = "admin | pipeline | auditor | client (repeatable)"


def add_parser(sub) -> None:
    """Adds the ``principal`` command and its actions to the top-level subparsers."""
    p = sub.add_parser("principal", help="issue and manage principals (tokens, roles, "
                                         "contexts, PostgreSQL login roles)")
    acts = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    c = acts.add_parser("add", help="issue a principal; prints its token once")
    c.add_argument("name")
    c.add_argument("--role", action="append", required=True, choices=names.ROLES,
                   help=_ROLE_HELP)
    c.add_argument("--pg-role", nargs="?", const="", metavar="ROLE",
                   help="PostgreSQL: also create a LOGIN role (default: the principal's name) "
                        "with least privilege for its roles, and a password printed once")
    c.add_argument("--pg-external", action="store_true",
                   help="with --pg-role: no password; the operator authenticates the role by "
                        "other means (certificate, GSSAPI, peer); an existing role is used as is")
    c.set_defaults(fn=_add)

    c = acts.add_parser("list", help="list principals, their roles and bindings")
    c.set_defaults(fn=_list)

    for name, fn, text in (("bind", _bind, "let a principal charge a (stream, context)"),
                           ("unbind", _unbind, "withdraw a binding")):
        c = acts.add_parser(name, help=text)
        c.add_argument("name")
        c.add_argument("--stream", required=True)
        c.add_argument("--context", required=True)
        c.set_defaults(fn=fn)

    c = acts.add_parser("disable", help="disable a principal (its token and database role)")
    c.add_argument("name")
    c.set_defaults(fn=_disable)

    c = acts.add_parser("seal", help="record the digest of the principals and bindings in the "
                                     "audit log (a ledger from before it was recorded with "
                                     "every change; 'sage-tfx verify' checks it)")
    c.set_defaults(fn=_seal)

    c = acts.add_parser("rotate", help="replace a principal's token; prints the new one once")
    c.add_argument("name")
    c.add_argument("--pg-password", action="store_true",
                   help="also replace its database role's password")
    c.set_defaults(fn=_rotate)


def _token_lines(name: str, token: str) -> list[str]:
    path = f"$HOME/.sage/{name}.token"
    return [
        f"token of {name} (shown once; the ledger keeps only its SHA-256 digest):",
        f"  {token}",
        "use it (a file or a Secret keeps it out of shell history and process lists):",
        f"  umask 077; mkdir -p $HOME/.sage; printf %s '{token}' > {path}",
        f"  export {names.TOKEN_FILE_ENV}={path}       # or: sage-tfx --token file:{path} ...",
        f"  export {names.TOKEN_ENV}=...                   # or: sage-tfx --token "
        f"env:{names.TOKEN_ENV} ...",
        f"  in Kubernetes: a Secret key mapped to ${names.TOKEN_ENV} "
        "(sage-tfx compile --token-secret NAME:KEY)",
    ]


def _password_lines(led, role: str, password) -> list[str]:
    parts = urllib.parse.urlsplit(led.redacted_url)
    where = f"{parts.hostname}:{parts.port or 5432}{parts.path}"
    lines = [f"database role: {role} (LOGIN, least privilege for its roles)"]
    if password is None:
        return lines + ["  no password: authenticate it by certificate, GSSAPI or peer in "
                        "pg_hba.conf"]
    return lines + [
        "database password (shown once; PostgreSQL keeps only a SCRAM verifier):",
        f"  {password}",
        f"connect as it: postgresql://{role}@{where} with the password in ~/.pgpass or "
        "$PGPASSFILE, or the whole URL in a Kubernetes Secret mapped to $SAGE_LEDGER_URL "
        "(sage-tfx compile --ledger-secret NAME:KEY); pipelines then take "
        "ledger_url=\"env:SAGE_LEDGER_URL\"",
    ]


def _add(led, a) -> int:
    pg_role = None if a.pg_role is None else (a.pg_role or a.name)
    if a.pg_external and pg_role is None:
        raise InvalidRequestError("--pg-external needs --pg-role")
    create = pg_role is not None and not (a.pg_external and led.pg_role_exists(pg_role))
    password = rng.token_urlsafe(32) if create and not a.pg_external else None
    was_open = led.open_mode
    token = led.add_principal(a.name, a.role, pg_role=pg_role, create_pg_role=create,
                              pg_password=password)
    lines = [f"added principal {a.name} (roles: {', '.join(sorted(set(a.role)))})"]
    lines += _token_lines(a.name, token)
    if pg_role is not None:
        lines += _password_lines(led, pg_role, password)
    if was_open:
        lines.append("authentication is now on: every connection to this ledger needs a "
                     "principal's token (or database role)")
    print("\n".join(lines))
    return 0


def _list(led, a) -> int:
    from sage_tfx.cli import _table
    bound: dict = {}
    for name, stream, context in led.bindings():
        bound.setdefault(name, []).append(f"{stream}/{context}")
    rows = [(p.name, ",".join(sorted(p.roles)), p.status, p.pg_role or "",
             " ".join(bound.get(p.name, []))) for p in led.principals()]
    mode = "open mode (no principal: every caller is the local admin)" if not rows else (
        f"{len(rows)} principal(s)")
    print(f"ledger {led.redacted_url}: {mode}")
    if rows:
        print(_table(rows, ("principal", "roles", "status", "pg_role", "bindings")))
    return 0


def _bind(led, a) -> int:
    led.bind(a.name, a.stream, a.context)
    print(f"bound {a.name} to stream {a.stream}, context {a.context}")
    return 0


def _unbind(led, a) -> int:
    led.unbind(a.name, a.stream, a.context)
    print(f"unbound {a.name} from stream {a.stream}, context {a.context}")
    return 0


def _disable(led, a) -> int:
    led.disable_principal(a.name)
    print(f"disabled {a.name}: its token and database role no longer work")
    return 0


def _seal(led, a) -> int:
    digest = led.seal_access()
    print(f"recorded the access digest {digest[:16]}... of the principals and bindings")
    return 0


def _rotate(led, a) -> int:
    password = rng.token_urlsafe(32) if a.pg_password else None
    token = led.rotate_token(a.name, pg_password=password)
    lines = [f"rotated {a.name}: its old token no longer works"] + _token_lines(a.name, token)
    if password is not None:
        lines += _password_lines(led, led.principal_info(a.name).pg_role, password)
    print("\n".join(lines))
    return 0


def token_argument(p: argparse.ArgumentParser) -> None:
    """The global ``--token`` option."""
    p.add_argument("--token", metavar="TOKEN", default=None,
                   help="the caller's token as env:NAME or file:/path (a plain token works too "
                        f"but shows in the process list); default ${names.TOKEN_ENV} or the "
                        f"file ${names.TOKEN_FILE_ENV}")
