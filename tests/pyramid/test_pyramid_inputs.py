"""Pyramid's charges and input checks: the k-aware quantile charge, max_variance, key kinds,
the bounded key-hash memo."""
import numpy as np
import pandas as pd
import pytest

from sage_tfx.dp import count_selection as cs
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidRequestError
from sage_tfx.pyramid import CountSpec, KeyKindError, PyramidStore, select_noise_weights
from sage_tfx.pyramid.featurize import Featurization


def frame(n=400, seed=0, user_as=str):
    rng = np.random.default_rng(seed)
    user = rng.integers(0, 20, n)
    return pd.DataFrame({"user": [user_as(u) for u in user], "item": rng.integers(0, 5, n),
                         "y": (rng.random(n) < 0.1 + 0.04 * (user % 10)).astype(int)})


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_weight_quantiles_are_charged_what_opendp_maps_for_groups_of_k(monkeypatch, k):
    """The ε each quantile is charged is OpenDP's own map at the neighbour distance of k
    observations (2k key totals) for the measurement that actually runs."""
    import opendp.prelude as dp
    from sage_tfx.pyramid import weights as weights_mod
    calls, ran = [], []
    real_meas, real_q = cs._quantile_meas, weights_mod.private_count_quantile

    def spy_meas(cands, alpha, scale):
        calls.append((cands, alpha, scale))
        return real_meas(cands, alpha, scale)

    def spy_q(*a, **kw):
        out = real_q(*a, **kw)
        ran.append(calls[-1])             # the measurement applied to the data
        return out

    monkeypatch.setattr(cs, "_quantile_meas", spy_meas)
    monkeypatch.setattr(weights_mod, "private_count_quantile", spy_q)
    spec = CountSpec(groups=("user", "item"), label="y", width=64, k=k)
    eps_w = 0.8
    select_noise_weights(frame(), spec, eps_w, max_count=1000)
    per = eps_w / len(spec.groups)
    assert len(ran) == len(spec.groups)
    for cands, alpha, scale in ran:
        meas = dp.m.make_private_quantile(
            dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.symmetric_distance(),
            dp.max_divergence(), candidates=list(cands), alpha=alpha, scale=scale)
        assert meas.map(2 * k) <= per * (1 + 1e-9)       # charged per quantile: per
        assert meas.map(2 * k) >= per * 0.9              # not wastefully over-noised
    scales = {r[2] for r in ran}
    # The helper reports the same map, and k = 1 is what the old constant assumed.
    assert cs.quantile_epsilon(0.1, per, 1000, k=k) == pytest.approx(per, rel=0.1)
    # The scale grows linearly with k (the old code used the k = 1 scale for every k).
    s1 = cs._quantile_scale(cs.quantile_candidates(1000), 0.1, per, 2)
    assert scales.pop() == pytest.approx(k * s1, rel=1e-6)


@pytest.mark.parametrize("bad", [float("nan"), -1, float("inf"), "0.1", True])
def test_bad_max_variance_is_refused_and_changes_nothing(tmp_path, bad):
    spec = CountSpec(groups=("user",), label="y", width=64)
    with pytest.raises(InvalidRequestError, match="max_variance"):
        PyramidStore(spec, str(tmp_path / "s"), retention=2, max_variance=bad)
    assert not (tmp_path / "s").exists()
    with pytest.raises(InvalidRequestError, match="max_variance"):
        Featurization(spec, {}, np.ones(2), {}, max_variance=bad)


def sealed_store(tmp_path, user_as):
    spec = CountSpec(groups=("user", "item"), label="y", width=256)
    s = PyramidStore(spec, str(tmp_path / "s"), retention=2, noise=SeededNoise(0))
    s.open_window(0)
    s.observe(frame(user_as=user_as))
    s.seal()
    return s


@pytest.mark.parametrize("count_as,serve_as", [(int, str), (str, int)])
def test_keys_of_another_kind_at_serving_raise(tmp_path, count_as, serve_as):
    s = sealed_store(tmp_path, count_as)
    f = s.featurization()
    ok = f.featurize(frame(50, seed=1, user_as=count_as))
    assert np.isfinite(ok).all()
    with pytest.raises(KeyKindError, match="user"):
        f.featurize(frame(50, seed=1, user_as=serve_as))
    # The snapshot keeps the check.
    f.save(str(tmp_path / "snap.npz"))
    g = Featurization.load(str(tmp_path / "snap.npz"))
    with pytest.raises(KeyKindError):
        g.featurize(frame(50, seed=1, user_as=serve_as))
    assert np.array_equal(g.featurize(frame(50, seed=1, user_as=count_as)), ok)


def test_python_and_numpy_ints_are_the_same_kind(tmp_path):
    s = sealed_store(tmp_path, int)
    f = s.featurization()
    a = f.featurize(frame(50, seed=1, user_as=int))
    fr = frame(50, seed=1, user_as=int)
    fr["user"] = fr["user"].astype(object)        # Python ints in an object column
    assert np.array_equal(a, f.featurize(fr))


def test_hash_memo_is_bounded_and_gives_the_same_features(tmp_path):
    s = sealed_store(tmp_path, str)
    f = s.featurization()
    f.max_cached_keys = 30
    rng = np.random.default_rng(3)
    for i in range(6):
        fr = frame(200, seed=i)
        fr["user"] = [f"x{v}" for v in rng.integers(0, 10_000, 200)]
        fr["item"] = rng.integers(0, 5, 200)
        assert np.array_equal(f.featurize(fr), f.featurize(fr, cache=False))
        assert all(len(m) <= 30 for m in f._hash_cache.values())
    small = frame(20, seed=9)
    assert np.array_equal(f.featurize(small), f.featurize(small, cache=False))
    assert 0 < max(len(m) for m in f._hash_cache.values()) <= 30
