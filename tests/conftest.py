"""Shared fixtures: ledger URLs for both backends, a real PostgreSQL server for the session."""
import itertools
import os

import pytest

from sage_tfx.ledger import keys, pgserver

_counter = itertools.count()


@pytest.fixture(autouse=True, scope="session")
def _session_key_provider(tmp_path_factory):
    """Tests (and the processes they start) wrap data keys with a throw-away local KEK, never
    the user's ``~/.config/sage-tfx/kek.json``."""
    os.environ[keys.PROVIDER_ENV] = "file:" + str(tmp_path_factory.mktemp("kek") / "kek.json")


@pytest.fixture(scope="session")
def postgres_server():
    """A real PostgreSQL server started for this test session (yields its base URL)."""
    if pgserver.find_pg_bin() is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is not installed; .ci/run installs it")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    with pgserver.local_postgres() as url:
        yield url


@pytest.fixture
def postgres_url(postgres_server):
    """A fresh, empty database on the session's PostgreSQL server."""
    return pgserver.create_database(postgres_server, f"t{os.getpid()}_{next(_counter)}")


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path}/ledger.db"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request, tmp_path):
    """One URL per backend: every ledger test runs on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.db"
    return request.getfixturevalue("postgres_url")
