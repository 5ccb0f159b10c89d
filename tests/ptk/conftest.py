"""Fixtures of the PTK store tests: a small synthetic stream and store factory (the shared data
and PTK types live in ``ptk_data``, re-exported here)."""
import pytest

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.ptk import PTKStore

from ptk_data import (CV, CV_CONFIG, HS, HS_CONFIG, SMALL, bad_eval, fails_on_data,  # noqa: F401
                      register_hist, test_registry, window, wrong_event)


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
