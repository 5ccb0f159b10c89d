"""Fixtures of the orchestration tests (data helpers in flightsdata.py)."""
import pytest

from flightsdata import split_flights


@pytest.fixture(scope="module")
def flights_blocks(tmp_path_factory):
    """(root, ledger_url, block ids) of a fresh SQLite ledger with DAYS daily blocks."""
    root = tmp_path_factory.mktemp("flights")
    ledger_url = f"sqlite:///{root}/ledger.db"
    split = split_flights(root, ledger_url)
    return root, ledger_url, [b.block_id for b in split.blocks]
