"""OpenDP-backed noise samplers: distribution against the formula, privacy map, bad input."""
import math

import numpy as np
import pytest
from scipy import stats

from sage_tfx.dp import noise
from sage_tfx.errors import InvalidPrivacyParameterError

N = 20_000


def test_laplace_matches_its_distribution():
    out = noise.laplace(np.zeros(N), 2.0)
    assert out.shape == (N,) and out.dtype == np.float64
    # accept at p > 1e-5 (a correct sampler fails once in 100,000 runs); a wrong scale is
    # rejected by the same test with p far below that
    assert stats.kstest(out, stats.laplace(scale=2.0).cdf).pvalue > 1e-5
    assert stats.kstest(out, stats.laplace(scale=1.6).cdf).pvalue < 1e-5


def test_gaussian_matches_its_distribution():
    out = noise.gaussian(np.full((100, 200), 5.0), 3.0)
    assert out.shape == (100, 200)
    assert stats.kstest(out.ravel() - 5.0, stats.norm(scale=3.0).cdf).pvalue > 1e-5
    assert stats.kstest(out.ravel() - 5.0, stats.norm(scale=2.7).cdf).pvalue < 1e-5
    assert abs(out.std(ddof=1) - 3.0) < 0.1


def test_discrete_laplace_pmf():
    scale = 1.5
    z = noise.discrete_laplace(np.zeros(N, dtype=np.int64), scale)
    assert z.dtype == np.int64
    # P(z) = (1 - a) / (1 + a) * a^|z| with a = exp(-1/scale); compare with a chi-square test
    a = math.exp(-1.0 / scale)
    support = np.arange(-6, 7)
    pmf = (1 - a) / (1 + a) * a ** np.abs(support)
    observed = np.array([(z == k).sum() for k in support] + [(np.abs(z) > 6).sum()])
    expected = np.append(pmf, 1 - pmf.sum()) * N
    assert stats.chisquare(observed, expected).pvalue > 1e-5
    var = 2 * a / (1 - a) ** 2
    assert abs(z.var() - var) < 0.1 * var


def test_discrete_gaussian_variance_and_large_counts():
    z = noise.discrete_gaussian(np.full(N, 3_000_000_000, dtype=np.int64), 4.0)
    assert z.dtype == np.int64
    d = z - 3_000_000_000
    assert abs(d.mean()) < 0.15 and abs(d.std() - 4.0) < 0.15


def test_scalars_stay_scalars():
    assert isinstance(noise.laplace(1.0, 1.0), float)
    assert isinstance(noise.discrete_laplace(7, 1.0), int)
    assert noise.laplace(np.array([]), 1.0).shape == (0,)


def test_privacy_map_is_the_calibration():
    assert noise.laplace_epsilon(2.0, 1.0) == pytest.approx(0.5)
    assert noise.laplace_epsilon(0.5, 3, integer=True) == pytest.approx(6.0)
    assert noise.gaussian_rho(2.0, 1.0) == pytest.approx(1 / 8)


@pytest.mark.parametrize("scale", [0, -1.0, float("nan"), float("inf"), "1", True, None])
def test_bad_scale_is_refused(scale):
    with pytest.raises(InvalidPrivacyParameterError):
        noise.laplace([1.0], scale)
    with pytest.raises(InvalidPrivacyParameterError):
        noise.discrete_gaussian([1], scale)


def test_bad_values_are_refused():
    with pytest.raises(ValueError):
        noise.laplace([1.0, float("nan")], 1.0)
    with pytest.raises(ValueError):
        noise.discrete_laplace([1.5], 1.0)


def test_seeded_noise_is_reproducible_and_has_the_same_law():
    a = noise.SeededNoise(7).laplace(np.zeros(N), 2.0)
    b = noise.SeededNoise(7).laplace(np.zeros(N), 2.0)
    assert np.array_equal(a, b)
    assert stats.kstest(a, stats.laplace(scale=2.0).cdf).pvalue > 1e-5
    z = noise.SeededNoise(3).discrete_laplace(np.zeros(N, dtype=np.int64), 1.5)
    a_ = math.exp(-1 / 1.5)
    assert abs(z.var() - 2 * a_ / (1 - a_) ** 2) < 0.1 * 2 * a_ / (1 - a_) ** 2


def test_secure_source_draws_fresh_noise():
    x = noise.SECURE.laplace(np.zeros(1000), 1.0)
    y = noise.SECURE.laplace(np.zeros(1000), 1.0)
    assert not np.array_equal(x, y)
