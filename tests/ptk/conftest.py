"""Fixtures of the PTK store tests: a small synthetic stream and store factory."""
import numpy as np
import pytest

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.ptk import PTKStore, StoreConfig, TypeRegistry
from sage_tfx.ptk.kernels import histstats

HS = "histstats"  # registered PTK type names (the built-in ptklib kernels)
CV = "covariance"
HS_CONFIG = {"key": "city", "domain": ["a", "b", "c", "d"], "value": "delay",
             "lower": 0.0, "upper": 10.0}
CV_CONFIG = {"columns": ["x0", "x1", "x2"], "center": [0, 0, 0], "scale": [2, 2, 2], "k": 1,
             "delta": 1e-7}
SMALL = StoreConfig(stream="ptk", epsilon_g=1.0, delta_g=1e-6, n_max=200_000, train_buckets=16,
                    profile_buckets=8, profile_share=0.5, menu=(0.25, 0.5, 1.0),
                    profile_epsilon=0.1, profile_n_max=64)


def window(n: int, seed: int) -> dict:
    """n records: a user id, a city with a city-dependent delay, three correlated columns."""
    rng = np.random.default_rng(seed)
    city = rng.choice(np.array(["a", "b", "c", "d"]), size=n)
    base = {"a": 2.0, "b": 4.0, "c": 6.0, "d": 8.0}
    z = rng.normal(size=n)
    return {"user": np.array([f"u{seed}-{i}" for i in range(n)]), "city": city,
            "delay": np.array([base[c] for c in city]) + rng.normal(0, 0.5, size=n),
            "x0": z + 0.1 * rng.normal(size=n), "x1": z + 0.1 * rng.normal(size=n),
            "x2": rng.normal(size=n) * 0.1}


def test_registry() -> TypeRegistry:
    """The built-in kernels plus two broken types the refusal tests register by name."""
    reg = TypeRegistry()
    reg.register("hist_wrong_event", train_dp=histstats.train_dp, eval=histstats.eval,
                 dp_event=wrong_event, erm=histstats.erm)
    reg.register("hist_bad_eval", train_dp=histstats.train_dp, eval=bad_eval,
                 dp_event=histstats.dp_event)
    return reg


test_registry.__test__ = False


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


def register_hist(store, tau=0.2, **kw):
    return store.register_ptk(kw.pop("ptk_type", HS), kw.pop("train_frequency", 1),
                              config=kw.pop("config", HS_CONFIG), tau=tau, **kw)


def bad_eval(batches, state, *, config):
    """An eval that breaks the [0, 1] loss contract."""
    return np.array([2.0])


def wrong_event(epsilon_train, config):
    """Declares a charge of epsilon_train but an event that spends twice as much."""
    from dp_accounting import dp_event as dp_event_lib
    from sage_tfx.ptk.abstraction import PrivacyCharge
    return PrivacyCharge(dp_event_lib.LaplaceDpEvent(0.5 / epsilon_train), epsilon_train)
