"""Tests of the numpy DP regressions: AdaSSP linear regression and output-perturbed logistic."""
import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from sage_tfx.dp import dpsgd
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.dp import adassp as adassp_lib
from sage_tfx.dp import logistic as logistic_lib
from sage_tfx.dp.adassp import adassp
from sage_tfx.dp.logistic import dp_logistic_regression
from sage_tfx.dp.noise import SeededNoise


def _regression_data(n, d, seed=0, noise=0.1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) / math.sqrt(d)
    x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
    w = rng.normal(size=d) / 2
    y = np.clip(x @ w + noise * rng.normal(size=n), -1, 1)
    return x, y


def _classification_data(n, d, seed=0, margin_noise=0.3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) / math.sqrt(d)
    x /= np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
    w = 4 * rng.normal(size=d)
    y = (x @ w + margin_noise * rng.normal(size=n) > 0).astype(float)
    return x, y


def _analytic_gaussian_delta(noise_multiplier, epsilon):
    """δ(ε) of the Gaussian mechanism, exact (Balle & Wang, ICML 2018, Thm. 8)."""
    s = noise_multiplier
    return (stats.norm.cdf(1 / (2 * s) - epsilon * s)
            - math.exp(epsilon) * stats.norm.cdf(-1 / (2 * s) - epsilon * s))


# --- AdaSSP ------------------------------------------------------------------------------------

def test_adassp_approaches_ols_for_large_n():
    x, y = _regression_data(200_000, 5)
    ols = np.linalg.lstsq(x, y, rcond=None)[0]
    result = adassp(x, y, epsilon=1.0, delta=1e-6, x_bound=1.0, y_bound=1.0, noise=SeededNoise(1))
    assert np.linalg.norm(result.weights - ols) < 0.02 * np.linalg.norm(ols)
    mse_ols = np.mean((x @ ols - y) ** 2)
    assert np.mean((result.predict(x) - y) ** 2) < 1.01 * mse_ols


def test_adassp_is_noisy_for_tiny_epsilon():
    x, y = _regression_data(1_000, 5)
    ols = np.linalg.lstsq(x, y, rcond=None)[0]
    errors = [np.linalg.norm(adassp(x, y, epsilon=0.05, delta=1e-6, x_bound=1.0, y_bound=1.0,
                                    noise=SeededNoise(seed)).weights - ols) for seed in range(5)]
    assert min(errors) > 0.2 * np.linalg.norm(ols)
    # Large-ε run on the same data is far closer.
    big = adassp(x, y, epsilon=50.0, delta=1e-6, x_bound=1.0, y_bound=1.0, accountant="rdp",
                 noise=SeededNoise(0))
    assert np.linalg.norm(big.weights - ols) < min(errors) / 3


def test_adassp_empirical_noise_matches_formula():
    x, y = _regression_data(20_000, 3, seed=3)
    x_bound, y_bound, eps, delta = 2.0, 1.5, 1.0, 1e-6
    xtx, xty = x.T @ x, x.T @ y
    lambda_min = np.linalg.eigvalsh(xtx)[0]
    sigma = adassp_lib.adassp_noise_multiplier(eps, delta)
    runs = [
        adassp(x, y, epsilon=eps, delta=delta, x_bound=x_bound, y_bound=y_bound,
               noise=SeededNoise(seed))
            for seed in range(400)]
    d_xtx = np.stack([r.noisy_xtx - xtx for r in runs])
    d_xty = np.stack([r.noisy_xty - xty for r in runs])
    s_xx, s_xy = sigma * x_bound ** 2, sigma * x_bound * y_bound
    diag = np.concatenate([d_xtx[:, i, i] for i in range(3)])
    off = np.concatenate([d_xtx[:, i, j] for i in range(3) for j in range(i + 1, 3)])
    assert np.allclose(d_xtx, np.transpose(d_xtx, (0, 2, 1)))  # symmetric release
    assert np.std(diag) == pytest.approx(s_xx, rel=0.1)
    assert np.std(off) == pytest.approx(s_xx / math.sqrt(2), rel=0.1)
    assert np.std(d_xty) == pytest.approx(s_xy, rel=0.1)
    assert abs(np.mean(d_xty)) < 0.1 * s_xy
    # λ_min is far above the noise here, so the floor at 0 never binds.
    shift = s_xx * math.sqrt(math.log(6 / delta))
    lam = np.array([r.noisy_lambda_min for r in runs]) - (lambda_min - shift)
    assert np.std(lam) == pytest.approx(s_xx, rel=0.15)
    assert abs(np.mean(lam)) < 0.15 * s_xx


def test_adassp_noise_multiplier_is_exact_and_beats_wang_split():
    eps, delta = 1.0, 1e-6
    sigma = adassp_lib.adassp_noise_multiplier(eps, delta)
    # Three Gaussians with multiplier σ = one Gaussian with multiplier σ/√3 (exactly).
    assert _analytic_gaussian_delta(sigma / math.sqrt(3), eps) <= delta
    assert _analytic_gaussian_delta((sigma - 1e-3) / math.sqrt(3), eps) > delta * 0.99
    wang = math.sqrt(math.log(6 / delta)) / (eps / 3)
    assert sigma < wang
    # RDP is looser, so it asks for more noise.
    assert adassp_lib.adassp_noise_multiplier(eps, delta, "rdp") > sigma


def test_adassp_result_accounting():
    x, y = _regression_data(500, 2)
    result = adassp(x, y, epsilon=0.5, delta=1e-6, x_bound=1.0, y_bound=1.0, noise=SeededNoise(0))
    assert result.event == dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(result.noise_multiplier), 3)
    assert result.epsilon <= 0.5
    assert result.epsilon == pytest.approx(0.5, rel=1e-4)
    assert result.epsilon == dpsgd.dpsgd_epsilon(result.event, 1e-6, "pld")
    assert result.neighboring_relation == "add_or_remove_one"
    with pytest.raises(ValueError):
        result.weights[0] = 1.0  # read-only


def test_adassp_clips_features_and_labels():
    x, y = _regression_data(300, 3)
    far = x.copy()
    far[:10] *= 50.0                       # rows beyond x_bound
    y_far = y.copy()
    y_far[:10] = 100.0                      # labels beyond y_bound
    clipped = far.copy()
    clipped[:10] /= np.linalg.norm(clipped[:10], axis=1, keepdims=True)
    a = adassp(far, y_far, epsilon=1.0, delta=1e-6, x_bound=1.0, y_bound=1.0, noise=SeededNoise(7))
    b = adassp(clipped, np.where(y_far > 1, 1.0, y_far), epsilon=1.0, delta=1e-6, x_bound=1.0,
               y_bound=1.0, noise=SeededNoise(7))
    np.testing.assert_allclose(a.weights, b.weights)


_X, _Y = _regression_data(20, 2)
_ADASSP_OK = dict(epsilon=1.0, delta=1e-6, x_bound=1.0, y_bound=1.0)


@pytest.mark.parametrize("bad,error", [
    (dict(epsilon=0), InvalidPrivacyParameterError),
    (dict(epsilon=-1), InvalidPrivacyParameterError),
    (dict(epsilon=math.inf), InvalidPrivacyParameterError),
    (dict(epsilon=math.nan), InvalidPrivacyParameterError),
    (dict(delta=0), InvalidPrivacyParameterError),
    (dict(delta=1), InvalidPrivacyParameterError),
    (dict(accountant="moments"), InvalidPrivacyParameterError),
    (dict(x_bound=0), ValueError),
    (dict(x_bound=-1), ValueError),
    (dict(x_bound=math.inf), ValueError),
    (dict(y_bound=math.nan), ValueError),
    (dict(y_bound=True), ValueError),
    (dict(rho=0), ValueError),
    (dict(rho=1), ValueError),
])
def test_adassp_rejects_bad_arguments(bad, error):
    with pytest.raises(error):
        adassp(_X, _Y, **{**_ADASSP_OK, **bad})


@pytest.mark.parametrize("features,labels", [
    (_X[:, 0], _Y),                        # 1-D features
    (_X, _Y[:-1]),                         # length mismatch
    (np.where(_X > 0, np.nan, _X), _Y),    # NaN
    (_X, np.full_like(_Y, np.inf)),        # infinite labels
    (np.zeros((0, 2)), np.zeros(0)),       # empty
])
def test_adassp_rejects_bad_data(features, labels):
    with pytest.raises(ValueError):
        adassp(features, labels, **_ADASSP_OK)


# --- Logistic regression -----------------------------------------------------------------------

def test_logistic_accuracy_approaches_non_private_for_large_n():
    x, y = _classification_data(200_000, 5)
    y_signed = np.where(y == 1, 1.0, -1.0)
    nonprivate = logistic_lib.fit_logistic(x, y_signed, 1e-3)
    acc_nonprivate = np.mean((x @ nonprivate >= 0) == (y == 1))
    result = dp_logistic_regression(x, y, epsilon=1.0, delta=1e-6, l2_reg=1e-3,
                                    noise=SeededNoise(0))
    acc = np.mean(result.predict(x) == y)
    assert acc_nonprivate > 0.85
    assert acc > acc_nonprivate - 0.01


def test_logistic_is_noisy_for_small_n_and_epsilon():
    x, y = _classification_data(500, 5)
    y_signed = np.where(y == 1, 1.0, -1.0)
    nonprivate = logistic_lib.fit_logistic(x, y_signed, 1e-2)
    result = dp_logistic_regression(x, y, epsilon=0.1, delta=1e-6, l2_reg=1e-2,
                                    noise=SeededNoise(0))
    assert np.linalg.norm(result.weights - nonprivate) > np.linalg.norm(nonprivate)


def test_logistic_empirical_noise_matches_formula():
    x, y = _classification_data(2_000, 4, seed=5)
    l2_reg, eps, delta = 0.01, 1.0, 1e-6
    theta = logistic_lib.fit_logistic(x, np.where(y == 1, 1.0, -1.0), l2_reg)
    sigma = logistic_lib.logistic_noise_multiplier(eps, delta)
    noise = np.stack([
        dp_logistic_regression(x, y, epsilon=eps, delta=delta, l2_reg=l2_reg,
                               noise=SeededNoise(seed)).weights
        - theta for seed in range(300)])
    expected = sigma * (2 / (2_000 * l2_reg) + 2 * logistic_lib.DEFAULT_GRAD_TOL / l2_reg)
    assert np.std(noise) == pytest.approx(expected, rel=0.1)
    assert abs(np.mean(noise)) < 0.1 * expected
    assert _analytic_gaussian_delta(sigma, eps) <= delta


def test_logistic_sensitivity_bound_holds_on_neighbours():
    """‖θ*(D) − θ*(D')‖ ≤ 2/(nλ) for D' = D with one example replaced (Chaudhuri et al. Cor. 8)."""
    n, d, l2_reg = 200, 3, 0.05
    x, y = _classification_data(n, d, seed=11)
    y_signed = np.where(y == 1, 1.0, -1.0)
    theta = logistic_lib.fit_logistic(x, y_signed, l2_reg)
    bound = logistic_lib.output_sensitivity(n, l2_reg)
    rng = np.random.default_rng(0)
    worst = 0.0
    for i in range(20):
        for direction in [theta / np.linalg.norm(theta), -theta / np.linalg.norm(theta),
                          rng.normal(size=d)]:
            x2, y2 = x.copy(), y_signed.copy()
            x2[i] = direction / np.linalg.norm(direction)
            y2[i] = -np.sign(x2[i] @ theta) or 1.0  # the most surprising label
            worst = max(worst, np.linalg.norm(logistic_lib.fit_logistic(x2, y2, l2_reg) - theta))
    assert 0 < worst <= bound
    assert worst > 0.2 * bound  # the bound is not vacuous


def test_logistic_result_fields_and_labels():
    x, y = _classification_data(1_000, 3)
    signed = np.where(y == 1, 1, -1)
    result = dp_logistic_regression(x * 3, signed, epsilon=1.0, delta=1e-6, l2_reg=0.01,
                                    noise=SeededNoise(0))
    assert result.labels == (-1.0, 1.0)
    assert set(np.unique(result.predict(x))) <= {-1.0, 1.0}
    assert result.event == dp_accounting.GaussianDpEvent(result.noise_multiplier)
    assert result.epsilon <= 1.0
    assert result.neighboring_relation == "replace_one"
    assert result.num_examples == 1_000
    assert result.sensitivity == logistic_lib.output_sensitivity(1_000, 0.01)
    probs = result.predict_proba(x)
    assert np.all((probs >= 0) & (probs <= 1))


def test_fit_logistic_reaches_gradient_tolerance():
    x, y = _classification_data(5_000, 6)
    y_signed = np.where(y == 1, 1.0, -1.0)
    theta = logistic_lib.fit_logistic(x, y_signed, 1e-4)
    _, grad = logistic_lib.objective_and_gradient(theta, x, y_signed, 1e-4)
    assert np.linalg.norm(grad) <= logistic_lib.DEFAULT_GRAD_TOL


_XC, _YC = _classification_data(50, 2)
_LOGISTIC_OK = dict(epsilon=1.0, delta=1e-6, l2_reg=0.1)


@pytest.mark.parametrize("bad,error", [
    (dict(epsilon=0), InvalidPrivacyParameterError),
    (dict(epsilon=math.nan), InvalidPrivacyParameterError),
    (dict(delta=0), InvalidPrivacyParameterError),
    (dict(delta=2), InvalidPrivacyParameterError),
    (dict(accountant="RDP"), InvalidPrivacyParameterError),
    (dict(l2_reg=0), ValueError),
    (dict(l2_reg=-0.1), ValueError),
    (dict(x_bound=0), ValueError),
    (dict(grad_tol=0), ValueError),
])
def test_logistic_rejects_bad_arguments(bad, error):
    with pytest.raises(error):
        dp_logistic_regression(_XC, _YC, **{**_LOGISTIC_OK, **bad})


@pytest.mark.parametrize("labels", [_YC * 2, _YC + 0.5, np.arange(50.0)])
def test_logistic_rejects_non_binary_labels(labels):
    with pytest.raises(ValueError, match="binary"):
        dp_logistic_regression(_XC, labels, **_LOGISTIC_OK)
