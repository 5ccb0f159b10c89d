"""Fixtures of the PTK store tests: the store factory. The data, configurations and PTK types the
tests share live in ``ptk_data`` (tests import them from there: which ``conftest`` module a test
module finds depends on what else the session collects)."""
import pytest

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.ptk import PTKStore

from ptk_data import SMALL, test_registry


@pytest.fixture
def make_store(tmp_path):
    stores = []

    def make(url=None, config=SMALL, noise=None, data=None, registry=None):
        url = url or f"sqlite:///{tmp_path}/ledger.db"
        s = PTKStore(url, str(data or tmp_path / "data"), config, noise=noise or SeededNoise(0),
                     registry=registry or test_registry())
        stores.append(s)
        return s
    yield make
    for s in stores:
        s.close()
