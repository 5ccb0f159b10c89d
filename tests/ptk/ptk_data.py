"""Data, configurations and PTK types the PTK tests share, and the processes they spawn (a module
with a unique name: which ``conftest`` module a test finds depends on what the session collects)."""
import numpy as np

from sage_tfx.ptk import StoreConfig, TypeRegistry
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
    reg.register("hist_fails_on_data", train_dp=fails_on_data, eval=histstats.eval,
                 dp_event=histstats.dp_event)
    return reg


def fails_on_data(batches, epsilon, prev_state, prev_config, *, config, noise=None):
    """A train_dp that fits the schema probe (two made-up records) but fails on real data."""
    from sage_tfx.ptk.abstraction import concat
    data = concat(batches)
    if len(next(iter(data.values()))) > 2:
        raise ArithmeticError("diverged")
    return histstats.train_dp([data], epsilon, prev_state, prev_config, config=config,
                              noise=noise)


test_registry.__test__ = False


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
