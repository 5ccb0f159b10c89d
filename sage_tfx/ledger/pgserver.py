"""A throw-away local PostgreSQL server for tests and benchmarks of the shared ledger.

Starts a real ``postgres`` (Debian's PostgreSQL packages) in a fresh data directory, listening on
loopback only, and stops it afterwards. When run as root the server runs as the ``postgres``
system user, since PostgreSQL refuses to run as root.
"""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Iterator, Optional


def find_pg_bin() -> Optional[str]:
    """The directory holding initdb/pg_ctl, or None when PostgreSQL is not installed."""
    for candidate in [os.environ.get("SAGE_PG_BIN", "")] + sorted(
            glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if candidate and os.path.exists(os.path.join(candidate, "initdb")):
            return candidate
    initdb = shutil.which("initdb")
    return os.path.dirname(os.path.realpath(initdb)) if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_postgres(dbname: str = "sage") -> Iterator[str]:
    """Runs a private PostgreSQL server for the duration of the block; yields its URL.

    Raises:
      RuntimeError: PostgreSQL is not installed or the server did not start.
    """
    pg_bin = find_pg_bin()
    if pg_bin is None:
        raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    user = "postgres" if as_root else os.environ.get("USER", "postgres")
    workdir = tempfile.mkdtemp(prefix="sage-pg-")
    datadir = os.path.join(workdir, "data")
    if as_root:
        shutil.chown(workdir, "postgres", "postgres")
    port = _free_port()
    log = os.path.join(workdir, "server.log")

    def run(args, **kw):
        return subprocess.run(prefix + args, check=True, capture_output=True, text=True, **kw)

    try:
        run([os.path.join(pg_bin, "initdb"), "-D", datadir, "-U", user, "--auth=trust",
             "--no-sync", "-E", "UTF8"])
        opts = (
            f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={workdir} "
                "-c max_connections=100 -c fsync=on -c synchronous_commit=on")
        run([os.path.join(pg_bin, "pg_ctl"), "-D", datadir, "-l", log, "-o", opts, "-w", "-t", "60",
             "start"])
        run([os.path.join(pg_bin, "createdb"), "-h", "127.0.0.1", "-p", str(port),
             "-U", user, dbname])
        yield f"postgresql://{user}@127.0.0.1:{port}/{dbname}"
    except subprocess.CalledProcessError as exc:
        detail = exc.stderr
        if os.path.exists(log):
            with open(log) as f:
                detail += f.read()[-2000:]
        raise RuntimeError(f"could not start PostgreSQL: {detail}") from exc
    finally:
        if os.path.exists(os.path.join(datadir, "postmaster.pid")):
            subprocess.run(prefix + [os.path.join(pg_bin, "pg_ctl"), "-D", datadir, "-m", "fast",
                                     "-w", "stop"], capture_output=True)
        for _ in range(20):
            try:
                shutil.rmtree(workdir)
                break
            except OSError:
                time.sleep(0.2)


def create_database(url: str, name: str) -> str:
    """Creates a new database on the server at ``url``; returns its URL."""
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + "/" + name
