"""Analyze-Gauss DP covariance PTK (PTK paper Tab. 1 row 4; Dwork, Talwar, Thakurta & Zhang,
STOC 2014). Features are the projections on the top-k principal components.

Config (public): ``columns`` (numeric columns), ``center`` and ``scale`` (per column, declared),
``k`` (components), ``delta`` (the δ of the (ε, δ) guarantee).

Each record is standardised with the public centre/scale and then scaled into the unit L2 ball,
so one record changes A = Σ x xᵀ by x xᵀ with ‖x xᵀ‖_F = ‖x‖² ≤ 1 (add/remove-one). Noise is added
to the d(d+1)/2 upper-triangle entries (L2 sensitivity ≤ 1) with the Gaussian σ that
dp_accounting's exact analytic Gaussian privacy-loss curve calibrates to (ε, δ); the declared
event is
``GaussianDpEvent(σ)`` and the charge (ε, δ). The components are the top-k eigenvectors of the
noisy symmetric matrix (post-processing).

Loss: ‖x - P Pᵀ x‖² ∈ [0, 1]; the exact ERM is the top-k eigenvectors of the empirical A.
"""
from __future__ import annotations

import functools

import numpy as np
from dp_accounting import dp_event as dp_event_lib
from dp_accounting.pld import privacy_loss_mechanism as plm
from scipy.optimize import brentq

from sage_tfx.dp import noise as dp_noise
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ptk.abstraction import PrivacyCharge, concat
from sage_tfx.ptk.kernels._common import check_epsilon, numeric_matrix


def check_config(config: dict) -> tuple:
    """The declared config's typed fields, or :class:`InvalidRequestError`."""
    try:
        cols = list(config["columns"])
        center = np.asarray(config["center"], dtype=float)
        scale = np.asarray(config["scale"], dtype=float)
        k, delta = int(config["k"]), float(config["delta"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequestError(
            f"covariance config needs columns, center, scale, k, delta: {exc}")
    if not cols or center.shape != (len(cols),) or scale.shape != (len(cols),) \
            or not np.all(scale > 0) or not 1 <= k <= len(cols) or not 0 < delta < 1:
        raise InvalidRequestError(f"bad covariance config {config!r}")
    return cols, center, scale, k, delta


def _rows(batches, config) -> np.ndarray:
    cols, center, scale, _, _ = check_config(config)
    data = concat(batches)
    if not data:
        return np.zeros((0, len(cols)))
    x = numeric_matrix(data, cols, "covariance")
    x = x[np.all(np.isfinite(x), axis=1)]
    x = (x - center) / scale
    norms = np.linalg.norm(x, axis=1)
    return x / np.maximum(norms, 1.0)[:, None]


@functools.lru_cache(maxsize=256)
def gaussian_sigma(epsilon: float, delta: float) -> float:
    """The smallest σ (sensitivity 1) whose Gaussian mechanism is (ε, δ)-DP by dp_accounting's
    exact analytic privacy-loss curve (``GaussianPrivacyLoss.get_delta_for_epsilon``, Balle &
    Wang 2018), found by bisection and then nudged up until the curve is at or below δ."""
    def gap(sigma: float) -> float:
        return plm.GaussianPrivacyLoss(sigma, sensitivity=1.0).get_delta_for_epsilon(epsilon) \
            - delta
    lo, hi = 1e-3, 1.0
    while gap(hi) > 0:
        lo, hi = hi, hi * 2
    sigma = brentq(gap, lo, hi, xtol=1e-12, rtol=1e-12)
    while gap(sigma) > 0:
        sigma = float(np.nextafter(sigma * (1 + 1e-12), np.inf))
    return float(sigma)


def dp_event(epsilon_train: float, config: dict) -> PrivacyCharge:
    """The :class:`PrivacyCharge` of :func:`train_dp` at ``epsilon_train``: Analyze-Gauss: a
    Gaussian event calibrated to (ε, ``delta``)."""
    delta = check_config(config)[4]
    epsilon_train = check_epsilon(epsilon_train)
    return PrivacyCharge(dp_event_lib.GaussianDpEvent(gaussian_sigma(epsilon_train, delta)),
                         epsilon_train, delta)


def _top(a: np.ndarray, k: int) -> np.ndarray:
    w, v = np.linalg.eigh((a + a.T) / 2.0)
    return v[:, np.argsort(w)[::-1][:k]]


def train_dp(trainset_iter, epsilon_train, prev_state, prev_config, *, config, noise=None):
    """A new DP state from the window's training batches at ``epsilon_train`` (noise from
    ``noise``, OpenDP by default; ``prev_state`` / ``prev_config``: the previous version's)."""
    noise = noise or dp_noise.SECURE
    epsilon_train = check_epsilon(epsilon_train)
    cols, _, _, k, delta = check_config(config)
    x = _rows(trainset_iter, config)
    a = x.T @ x
    d = a.shape[0]
    iu = np.triu_indices(d)
    sigma = gaussian_sigma(epsilon_train, delta)
    noisy = np.zeros_like(a)
    noisy[iu] = np.asarray(noise.gaussian(a[iu], sigma), dtype=float)
    noisy = np.triu(noisy) + np.triu(noisy, 1).T
    return {"columns": cols, "components": _top(noisy, k).tolist(), "sigma": sigma}


def erm(trainset_iter, *, config):
    """The same model trained without privacy: the profiler's non-private reference."""
    cols, _, _, k, _ = check_config(config)
    x = _rows(trainset_iter, config)
    return {"columns": cols, "components": _top(x.T @ x, k).tolist()}


def eval(testset_iter, state, *, config):  # noqa: A001 - the paper's name
    """Per-example losses in [0, 1] of ``state`` on the test batches (the profiler's metric)."""
    x = _rows(testset_iter, config)
    p = np.asarray(state["components"], dtype=float)
    resid = x - (x @ p) @ p.T
    return np.clip(np.sum(resid ** 2, axis=1), 0.0, 1.0)


def featurize(batch, state, config) -> dict:
    """Adds ``<name>0..<name>{k-1}`` (default name ``pc``): the projections of the standardised,
    unit-ball-scaled record on the DP top-k components of a pinned state. A missing value is
    replaced by its column's declared centre (public), i.e. contributes 0."""
    cols, center, scale, _, _ = check_config(config)
    raw = numeric_matrix(batch, cols, "covariance")
    z = (np.where(np.isfinite(raw), raw, center) - center) / scale
    z = z / np.maximum(np.linalg.norm(z, axis=1), 1.0)[:, None]
    proj = z @ np.asarray(state["components"], dtype=float)
    prefix = config.get("name", "pc")
    return {f"{prefix}{i}": proj[:, i] for i in range(proj.shape[1])}
