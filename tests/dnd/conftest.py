"""Fixtures of the Draw-and-Discard tests (helpers in ``dndtest.py``)."""
import pytest

from dndtest import make_ledger


@pytest.fixture
def principals(sqlite_url):
    """A SQLite ledger with a stream of four hash-bucket blocks and principals."""
    return make_ledger(sqlite_url)
