"""Secrets referenced, never embedded: ledger URLs and tokens by reference, and redaction.

A ledger URL or a token may be given as itself or as a *reference* that is resolved only in the
process that connects:

* ``env:NAME`` — the value of environment variable ``NAME`` (a Kubernetes Secret mounted with
  ``secretKeyRef``, an Airflow connection exported to the worker, ...);
* ``file:/path`` — the contents of a file, stripped of surrounding white space (a Kubernetes
  Secret mounted as a volume, a Docker secret).

Pipelines, compiled specs, DAG files and ML Metadata properties carry the reference; logs carry
:func:`redact`-ed URLs. :func:`check_no_password` refuses a URL that would put a password into
something that is written down.
"""
from __future__ import annotations

import os
from typing import Optional

from sage_tfx.errors import InvalidRequestError

ENV_PREFIX = "env:"
FILE_PREFIX = "file:"
_HIDDEN = "***"


def is_reference(value: str) -> bool:
    """Whether ``value`` is an ``env:`` or ``file:`` reference rather than the secret itself."""
    return isinstance(value, str) and value.startswith((ENV_PREFIX, FILE_PREFIX))


def resolve(value: str, what: str = "ledger URL") -> str:
    """The secret a reference points to (a plain value is returned as it is).

    Raises:
      InvalidRequestError: an unset variable, an unreadable or empty file, or not a string.
    """
    if not isinstance(value, str):
        raise InvalidRequestError(f"{what} must be a string, got {type(value).__name__}")
    if value.startswith(ENV_PREFIX):
        name = value[len(ENV_PREFIX):]
        resolved = os.environ.get(name)
        if not name or not resolved:
            raise InvalidRequestError(
                f"{what} refers to environment variable {name!r}, which is not set in this process")
        return resolved.strip()
    if value.startswith(FILE_PREFIX):
        path = value[len(FILE_PREFIX):]
        try:
            with open(path, encoding="utf-8") as f:
                resolved = f.read().strip()
        except OSError as e:
            raise InvalidRequestError(f"{what} refers to file {path!r}, which cannot be read: "
                                      f"{e.strerror}") from e
        if not resolved:
            raise InvalidRequestError(f"{what} refers to file {path!r}, which is empty")
        return resolved
    return value


_SECRET_KEYS = ("password", "sslpassword")


def _pg_params(url: str) -> Optional[dict]:
    """A PostgreSQL URL's or keyword DSN's parameters as libpq reads them, or None if it is
    not one. libpq's parser, not ``urllib``: ``postgresql://u:#pw@db/x`` has password ``#pw``
    for libpq, and a URL parser sees a fragment there."""
    try:
        from psycopg.conninfo import conninfo_to_dict
        return conninfo_to_dict(url)
    except Exception:  # not a conninfo string (e.g. sqlite:///path)
        return None


def has_password(url: str) -> bool:
    """Whether a (resolved) URL or DSN carries a password (``password`` / ``sslpassword``, in the
    user info, the query or a keyword DSN); an unparseable one that mentions one counts."""
    if not isinstance(url, str) or is_reference(url) or url.startswith("sqlite:///"):
        return False
    params = _pg_params(url)
    if params is None:
        return "password" in url.lower()
    return any(params.get(k) for k in _SECRET_KEYS)


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (references are returned as they are).

    A password-bearing PostgreSQL URL is rebuilt from libpq's reading of it (user, hosts, port,
    database and the other parameters, the secrets as ``***``); a keyword DSN stays one.
    """
    if not isinstance(url, str) or not has_password(url):
        return url
    params = _pg_params(url)
    if params is None:
        return _HIDDEN
    shown = {k: (_HIDDEN if k in _SECRET_KEYS else v) for k, v in params.items()}
    if "://" not in url:
        return " ".join(f"{k}={v}" for k, v in shown.items())
    scheme = url.split("://", 1)[0]
    user, password = shown.pop("user", ""), shown.pop("password", None)
    host, port, db = shown.pop("host", ""), shown.pop("port", ""), shown.pop("dbname", "")
    userinfo = user + (f":{password}" if password else "")
    netloc = (f"{userinfo}@" if userinfo else "") + host + (f":{port}" if port else "")
    query = "&".join(f"{k}={v}" for k, v in shown.items())
    return f"{scheme}://{netloc}/{db}" + (f"?{query}" if query else "")


def check_no_password(url: str, where: str) -> str:
    """Returns ``url`` if writing it into ``where`` leaks no password; else raises.

    Raises:
      InvalidRequestError: the URL carries a password; the message says how to reference it.
    """
    if has_password(url):
        raise InvalidRequestError(
            f"the ledger URL {redact(url)} carries a password, which would be written into "
            f"{where}: pass a reference instead — 'env:SAGE_LEDGER_URL' (a variable set from a "
            "Kubernetes Secret or the worker's environment) or 'file:/path/to/secret' — or "
            "keep the password in ~/.pgpass / $PGPASSFILE")
    return url
