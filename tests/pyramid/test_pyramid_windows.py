"""Pyramid windows on a real SQLite ledger: charge once, seal, retention, roll-over deletion."""
import os

import numpy as np
import pandas as pd
import pytest

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError
from sage_tfx.ledger import open_ledger
from sage_tfx.pyramid import (BudgetDeniedError, CountSpec, NonCategoricalError, PyramidStore,
                              RetentionError, UnknownFeatureError, WindowSealedError)

SPEC = CountSpec(groups=("user", "item", ("user", "item")), label="y", width=256, epsilon=1.0)


def frame(n=400, seed=0):
    rng = np.random.default_rng(seed)
    user = rng.integers(0, 20, n)
    return pd.DataFrame({"user": [f"u{u}" for u in user], "item": rng.integers(0, 5, n),
                         "y": (rng.random(n) < 0.1 + 0.04 * (user % 10)).astype(int),
                         "delay": rng.normal(size=n)})


@pytest.fixture
def ledger(sqlite_url):
    led = open_ledger(sqlite_url)
    led.create_stream("obs", epsilon_g=2.5, delta_g=0.0)
    for w in range(6):
        for d in range(2):
            led.add_block("obs", f"w{w}d{d}", location=f"/data/w{w}d{d}")
    yield led
    led.close()


def store(tmp_path, ledger, **kw):
    return PyramidStore(SPEC, str(tmp_path / "pyr"), retention=2, ledger=ledger, stream="obs",
                        noise=kw.pop("noise", SeededNoise(0)), **kw)


def fill(s, w, seed=None):
    s.open_window(w, [f"w{w}d0", f"w{w}d1"])
    s.observe(frame(seed=w if seed is None else seed))


def test_seal_charges_each_window_once_with_the_spec_epsilon(tmp_path, ledger):
    s = store(tmp_path, ledger)
    fill(s, 0)
    r = s.seal()
    assert r.epsilon_charged == 1.0 and np.isclose(sum(r.table_epsilons), 1.0)
    assert r.noise_scales[0] == pytest.approx(5 * 4 / 1.0)      # n h k / eps, n = 3 groups + prior
    g = ledger.grant_for_run("obs", r.run_id)
    assert g.epsilon == 1.0 and {b.block_id for b in g.blocks} == {"w0d0", "w0d1"}
    assert ledger.remaining("obs", "w0d0")["epsilon"] == pytest.approx(1.5)
    assert ledger.remaining("obs", "w1d0")["epsilon"] == pytest.approx(2.5)
    assert r.run_id == f"pyramid-obs-{SPEC.digest()}-w0"
    # Re-opening a sealed window is refused and charges nothing.
    with pytest.raises(WindowSealedError):
        s.open_window(0, ["w0d0"])
    assert ledger.remaining("obs", "w0d0")["epsilon"] == pytest.approx(1.5)
    assert len(ledger.grants("obs")) == 1


class NoNoise:
    """A noise source that must never be asked: a replay draws no noise."""

    def __getattr__(self, name):
        raise AssertionError(f"noise drawn ({name}) for a release already recorded")


def test_a_charged_run_is_never_re_noised(tmp_path, ledger):
    s = store(tmp_path, ledger)
    fill(s, 0)
    first = s.seal()
    # A second store on the same ledger, same spec, same window: the run id replays, and the
    # recorded tables are published byte for byte (its own rows and noise are never used).
    other = PyramidStore(SPEC, str(tmp_path / "other"), retention=2, ledger=ledger, stream="obs",
                         noise=NoNoise())
    fill(other, 0, seed=7)
    r = other.seal()
    assert r.replayed and not first.replayed and r.grant_id == first.grant_id
    assert open(other.sealed_path(0), "rb").read() == open(s.sealed_path(0), "rb").read()
    assert other.hot_window is None and other.live_windows == (0,)
    assert ledger.remaining("obs", "w0d0")["epsilon"] == pytest.approx(1.5)
    assert len(ledger.releases(first.grant_id)) == 1


def test_retention_drops_oldest_window_and_calls_retrain(tmp_path, ledger):
    s = store(tmp_path, ledger)
    calls = []
    s.on_retrain(calls.append)
    for w in range(3):
        fill(s, w)
        r = s.seal()
    assert r.dropped == (0,) and r.retrain and calls == [(0,)]
    assert s.live_windows == (1, 2)
    assert not os.path.exists(tmp_path / "pyr" / "sealed" / "w0.npz")
    assert s.featurization().windows == (1, 2)
    with pytest.raises(RetentionError):
        s.open_window(0, ["w0d0"])
    with pytest.raises(WindowSealedError):
        s.open_window(2, ["w2d0"])


def test_roll_over_deletes_hot_raw_data_and_non_dp_artifacts(tmp_path, ledger):
    s = store(tmp_path, ledger)
    fill(s, 0)
    hot_dir = tmp_path / "pyr" / "hot" / "w0"
    artifact = s.hot_artifact_path("model.pkl")
    with open(artifact, "w") as f:
        f.write("a model trained on raw hot data")
    raw_before = sorted(os.listdir(hot_dir))
    assert len(raw_before) == 2 and len(s.hot_frame()) == 400
    r = s.seal()
    assert not hot_dir.exists()
    assert sorted(os.path.basename(p) for p in r.deleted) == raw_before
    # Nothing under the store holds raw rows any more: only the manifest and DP tables.
    left = [os.path.relpath(os.path.join(d, f), tmp_path / "pyr")
            for d, _, fs in os.walk(tmp_path / "pyr") for f in fs]
    assert sorted(left) == [".lock", "manifest.json", "sealed/w0.npz"]
    with pytest.raises(InvalidRequestError):
        s.hot_frame()


def test_bad_input_changes_nothing(tmp_path, ledger):
    s = store(tmp_path, ledger)
    fill(s, 0)
    before = open(tmp_path / "pyr" / "manifest.json").read()
    with pytest.raises(UnknownFeatureError):
        s.observe(frame().drop(columns=["item"]))
    bad = frame()
    bad["user"] = bad["delay"]
    with pytest.raises(NonCategoricalError):
        s.observe(bad)
    bad = frame()
    bad["y"] = 3
    with pytest.raises(InvalidRequestError):
        s.observe(bad)
    with pytest.raises(InvalidRequestError):
        s.open_window(1, ["w1d0"])           # window 0 is still hot
    with pytest.raises(InvalidPrivacyParameterError):
        s.seal(weights=[1.0, 0.0, 1.0, 1.0])
    with pytest.raises(InvalidRequestError):
        s.seal(weights=[1.0, 1.0])
    assert open(tmp_path / "pyr" / "manifest.json").read() == before
    assert len(ledger.grants("obs")) == 0 and s.hot_window == 0
    with pytest.raises(InvalidPrivacyParameterError):
        CountSpec(groups=("user",), label="y", epsilon=0.0)
    with pytest.raises(InvalidRequestError):
        CountSpec(groups=("user",), label="y", width=1000)
    with pytest.raises(InvalidRequestError):
        CountSpec(groups=("y",), label="y")


def test_denied_charge_leaves_the_window_open(tmp_path, ledger):
    spec = CountSpec(groups=("user",), label="y", width=64, epsilon=3.0)
    s = PyramidStore(spec, str(tmp_path / "p"), retention=2, ledger=ledger, stream="obs",
                     noise=SeededNoise(0))
    s.open_window(0, ["w0d0"])
    s.observe(frame())
    with pytest.raises(BudgetDeniedError):
        s.seal()
    assert s.hot_window == 0 and len(s.hot_frame()) == 400 and not s.live_windows


def test_weight_selection_is_charged_with_the_window_and_used_next(tmp_path, ledger):
    s = store(tmp_path, ledger)
    fill(s, 0)
    r = s.seal(weight_epsilon=0.5, max_count=10_000)
    assert r.epsilon_charged == pytest.approx(1.5)
    assert ledger.remaining("obs", "w0d0")["epsilon"] == pytest.approx(1.0)
    w = np.asarray(r.next_weights)
    assert w.shape == (4,) and np.all(w >= 1)
    assert w[-1] == pytest.approx(3 / np.sum(1 / w[:3]))     # the prior keeps eps / 4
    fill(s, 1)
    r1 = s.seal()
    assert r1.epsilon_charged == 1.0 and np.isclose(sum(r1.table_epsilons), 1.0)
    assert np.allclose(np.asarray(r1.noise_scales[:3]) / r1.noise_scales[0], w[:3] / w[0])
    assert r1.table_epsilons[-1] == pytest.approx(0.25)


def test_featurization_sums_live_windows_and_backs_off(tmp_path):
    spec = CountSpec(groups=("user",), label="y", width=1024, epsilon=1e6)   # ~no noise
    s = PyramidStore(spec, str(tmp_path / "p"), retention=3, noise=SeededNoise(0))
    for w in range(2):
        s.open_window(w)
        s.observe(frame(n=2000, seed=w))
        s.seal()
    f = s.featurization()
    data = pd.concat([frame(n=2000, seed=0), frame(n=2000, seed=1)])
    x = f.featurize(pd.DataFrame({"user": ["u3", "u9", "never-seen"]}))
    truth = data.groupby("user").y.mean()
    assert x[0, 0] == pytest.approx(truth["u3"], abs=1e-3)
    assert x[1, 0] == pytest.approx(truth["u9"], abs=1e-3)
    assert x[2, 0] == pytest.approx(data.y.mean(), abs=1e-3)       # back-off to the prior
    assert x[0, 1] == pytest.approx(np.log1p((data.user == "u3").sum()), abs=1e-3)
    assert f.feature_names() == ["user__p1", "user__logn"]
    uncached = s.featurization(cache=False).featurize(pd.DataFrame({"user": ["u3"]}), cache=False)
    assert np.allclose(uncached[0], x[0])
    path = str(tmp_path / "snap.npz")
    f.save(path)
    from sage_tfx.pyramid import Featurization
    assert np.allclose(Featurization.load(path).featurize(pd.DataFrame({"user": ["u3"]})), x[0])


def test_a_store_reopens_from_disk_with_the_same_spec_only(tmp_path):
    s = PyramidStore(SPEC, str(tmp_path / "p"), retention=2, noise=SeededNoise(0))
    s.open_window(0)
    s.observe(frame())
    s.seal()
    again = PyramidStore(SPEC, str(tmp_path / "p"), retention=2, noise=SeededNoise(0))
    assert again.live_windows == (0,)
    with pytest.raises(InvalidRequestError):
        PyramidStore(CountSpec(groups=("user",), label="y"), str(tmp_path / "p"), retention=2)


def test_seal_with_a_gate_grant_charges_nothing_more(tmp_path, ledger):
    s = store(tmp_path, ledger)
    s.open_window(0, ["w0d0", "w0d1"])
    s.observe(frame())
    wrong = ledger.request("obs", run_id="other-run", blocks=["w0d0", "w0d1"], epsilon=1.0).grant
    with pytest.raises(InvalidRequestError, match="does not pay"):
        s.seal(grant=wrong)
    cheap = ledger.request("obs", run_id=s.run_id(0), blocks=["w0d0", "w0d1"], epsilon=0.5).grant
    with pytest.raises(InvalidRequestError, match="does not pay"):
        s.seal(grant=cheap)
    assert s.hot_window == 0
    s2 = PyramidStore(SPEC, str(tmp_path / "s2"), retention=2, ledger=ledger, stream="obs",
                      noise=SeededNoise(0))
    s2.open_window(1, ["w1d0", "w1d1"])
    s2.observe(frame())
    g = ledger.request("obs", run_id=s2.run_id(1), blocks=["w1d0", "w1d1"], epsilon=1.0).grant
    r = s2.seal(grant=g)
    assert r.grant_id == g.grant_id
    assert ledger.remaining("obs", "w1d0")["epsilon"] == pytest.approx(1.5)


def test_rare_keys_back_off_even_when_their_raw_rate_is_extreme(tmp_path):
    spec = CountSpec(groups=("user",), label="y", width=1024, epsilon=1e6)
    s = PyramidStore(spec, str(tmp_path / "p"), retention=1, noise=SeededNoise(0))
    s.open_window(0)
    s.observe(pd.DataFrame({"user": ["once"] + ["many"] * 400 + ["x"] * 400,
                            "y": [1] + [1] * 400 + [0] * 400}))
    s.seal()
    x = s.featurization().featurize(pd.DataFrame({"user": ["once", "many"]}))
    assert x[0, 0] == pytest.approx(401 / 801, abs=1e-3)     # the prior, not P = 1
    assert x[1, 0] == pytest.approx(1.0)                       # 400 observations: kept


def test_the_hash_memo_tells_bools_from_equal_ints(tmp_path):
    """``True == 1`` in Python but the two keys hash differently: the cached featurization
    must give each its own counts, as the uncached one does."""
    spec = CountSpec(groups=("flag",), label="y", width=1024, epsilon=1e6)
    s = PyramidStore(spec, str(tmp_path / "p"), retention=3, noise=SeededNoise(0))
    s.open_window(0)
    s.observe(pd.DataFrame({"flag": [True] * 300 + [1] * 300, "y": [1] * 300 + [0] * 300}))
    s.seal()
    f = s.featurization()
    for keys in ([True, 1], [1, True], [True, 1, 1, True]):
        frame_ = pd.DataFrame({"flag": pd.Series(keys, dtype=object)})
        cached, uncached = f.featurize(frame_), f.featurize(frame_, cache=False)
        assert np.allclose(cached, uncached)
        rates = dict(zip(map(repr, keys), cached[:, 0]))
        assert rates["True"] == pytest.approx(1.0, abs=1e-3)
        assert rates["1"] == pytest.approx(0.0, abs=1e-3)
