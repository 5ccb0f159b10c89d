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
import urllib.parse
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


def _password_parts(url: str) -> tuple[Optional[str], list[tuple[str, str]]]:
    """(the password of the URL's user info, the query's key/value pairs)."""
    parts = urllib.parse.urlsplit(url)
    return parts.password, urllib.parse.parse_qsl(parts.query, keep_blank_values=True)


def has_password(url: str) -> bool:
    """Whether a (resolved) URL carries a password, in its user info or as ``?password=``."""
    if not isinstance(url, str) or is_reference(url) or "://" not in url:
        return False
    try:
        password, query = _password_parts(url)
    except ValueError:
        return True  # unparseable: treat as secret
    return bool(password) or any(k.lower() == "password" for k, _ in query)


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (references are returned as they are)."""
    if not isinstance(url, str) or not has_password(url):
        return url
    try:
        parts = urllib.parse.urlsplit(url)
        password, query = _password_parts(url)
    except ValueError:
        return _HIDDEN
    netloc = parts.netloc
    if password:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{_HIDDEN}@{hostport}"
    query_text = urllib.parse.urlencode(
        [(k, _HIDDEN if k.lower() == "password" else v) for k, v in query], safe="*")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query_text, parts.fragment))


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
