"""DP linear regression by AdaSSP (Wang, UAI 2018, Alg. 2) — Sage's Taxi LR pipeline (Tab. 1).

AdaSSP ("adaptive sufficient statistics perturbation") releases three statistics of the clipped data
with the Gaussian mechanism and solves a ridge regression on them:

1. ``λ_min(XᵀX)``, the smallest eigenvalue (sensitivity ``x_bound²``, Weyl's inequality), released
   as ``λ̃ = max(λ_min + s·Z − s·√log(6/δ), 0)``: shifted down by √log(6/δ) noise stds so that
   λ̃ ≤ λ_min with high probability;
2. ``XᵀX`` (Frobenius sensitivity ``‖xxᵀ‖_F = ‖x‖² ≤ x_bound²``), plus ``s·(G + Gᵀ)/2`` with ``G``
   i.i.d. N(0, 1) — Wang's symmetric noise, isotropic with std ``s`` in the Frobenius geometry
   (diagonal std ``s``, off-diagonal std ``s/√2``);
3. ``Xᵀy`` (sensitivity ``x_bound·y_bound``), plus ``N(0, (σ·x_bound·y_bound)² I)``;

where ``s = σ·x_bound²``. The ridge ``λ = max(0, s·√(d·log(2d²/ρ)) − λ̃)`` (a high-probability
bound on the spectral norm of the matrix noise, minus the data's own curvature) and the weights
are ``θ = (XᵀX~ + λI)⁻¹ Xᵀy~``.

Privacy: each release is a Gaussian mechanism with the *same* noise multiplier σ (noise std /
sensitivity), so the run is ``SelfComposedDpEvent(GaussianDpEvent(σ), 3)``. Wang splits (ε, δ)
into thirds with ``σ = √log(6/δ) / (ε/3)``; here σ is instead calibrated with dp_accounting so that
the composed event is exactly (ε, δ)-DP for the chosen accountant, which needs less noise (e.g.
ε = 1, δ = 1e-6: σ = 7.32 with PLD against Wang's 11.85). Everything after the three releases is
post-processing.

Assumptions: adjacency is add-or-remove-one row; ``x_bound`` and ``y_bound`` are chosen without
looking at the data (rows and labels are clipped to them here); ``n`` is not used by the mechanism.
No intercept is fitted: append a constant column (it counts towards ``x_bound``).

This module imports only numpy and dp_accounting.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.dp import dpsgd
from sage_tfx.ledger.accounting import (check_delta, check_epsilon, check_positive, event_from_dict,
                                        event_to_dict)
from sage_tfx.dp._common import check_features, clip_rows
from sage_tfx.dp.mechanisms import noise_source, secure_gaussian_sigma
from sage_tfx.dp.noise import NoiseSource

NUM_RELEASES = 3  # λ_min, XᵀX, Xᵀy
DEFAULT_RHO = 0.1  # Sage Tab. 1 (Wang 2018 uses 0.05)


def adassp_event(noise_multiplier: float) -> dp_event_lib.DpEvent:
    """The DpEvent of AdaSSP with noise multiplier σ: three Gaussian releases, composed.

    Raises:
      InvalidPrivacyParameterError: σ not finite and > 0.
    """
    sigma = dpsgd.check_positive(noise_multiplier, "noise_multiplier")
    return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), NUM_RELEASES)


def adassp_noise_multiplier(epsilon: float, delta: float, accountant: str = dpsgd.PLD) -> float:
    """Smallest σ (within 1e-6) with :func:`adassp_event` (σ) (ε, δ)-DP under ``accountant``.

    Raises:
      InvalidPrivacyParameterError: bad ε, δ or accountant.
    """
    return _calibrated(check_epsilon(epsilon), check_delta(delta, allow_zero=False),
                       dpsgd.check_accountant(accountant))[0]


def _calibrated(epsilon: float, delta: float, accountant: str) -> tuple[float, float]:
    """(σ, ε achieved at δ), cached (:func:`sage_tfx.dp.dpsgd.calibrated_noise`)."""
    return dpsgd.calibrated_noise(adassp_event, epsilon, delta, accountant)


@dataclasses.dataclass(frozen=True)
class AdaSSPResult:
    """Output of :func:`adassp`. Every field is a DP release or public (post-processing only).

    Attributes:
      weights: θ, shape (d,).
      epsilon: ε of the run at ``delta`` (≤ the requested ε).
      delta: δ.
      accountant: ``"rdp"`` or ``"pld"``.
      event: ``SelfComposedDpEvent(GaussianDpEvent(noise_multiplier), 3)``.
      noise_multiplier: σ, the noise std of each release divided by its sensitivity.
      neighboring_relation: ``"add_or_remove_one"``.
      x_bound: Row norm bound the features were clipped to.
      y_bound: Label bound the labels were clipped to.
      rho: Failure probability used for the ridge λ.
      ridge: λ added to the diagonal.
      noisy_lambda_min: The released (shifted, floored at 0) smallest eigenvalue of XᵀX.
      noisy_xtx: Released XᵀX, shape (d, d), symmetric.
      noisy_xty: Released Xᵀy, shape (d,).
    """

    weights: np.ndarray
    epsilon: float
    delta: float
    accountant: str
    event: dp_event_lib.DpEvent
    noise_multiplier: float
    neighboring_relation: str
    x_bound: float
    y_bound: float
    rho: float
    ridge: float
    noisy_lambda_min: float
    noisy_xtx: np.ndarray
    noisy_xty: np.ndarray

    def predict(self, features: Any) -> np.ndarray:
        """``features @ weights`` (no clipping: prediction is post-processing)."""
        return np.asarray(features, dtype=np.float64) @ self.weights

    def to_dict(self) -> dict:
        """A JSON-ready dict: arrays as nested lists, the event as ``accounting.event_to_dict``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in _ARRAYS:
            out[key] = np.asarray(out[key], dtype=np.float64).tolist()
        out["event"] = event_to_dict(self.event)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "AdaSSPResult":
        """The result :meth:`to_dict` wrote (float64 arrays, read-only)."""
        fields = dict(data)
        for key in _ARRAYS:
            fields[key] = np.asarray(fields[key], dtype=np.float64)
            fields[key].flags.writeable = False
        fields["event"] = event_from_dict(fields["event"])
        return cls(**fields)


_ARRAYS = ("weights", "noisy_xtx", "noisy_xty")


def release_from_moments(xtx: np.ndarray, xty: np.ndarray, *, noise_multiplier: float,
                         x_bound: float, y_bound: float, delta: float, rho: float,
                         noise: NoiseSource | None = None) -> tuple:
    """AdaSSP's three releases and its ridge solve, from the exact moments of clipped data.

    Noise of std ``σ·Δ`` per release, Δ = x_bound² (λ_min, XᵀX) and x_bound·y_bound (Xᵀy), from
    ``noise`` (None: OpenDP, at a std raised by the ulps OpenDP's map needs to meet σ).

    Returns:
      (weights, ridge, noisy_lambda_min, noisy_xtx, noisy_xty).
    """
    src = noise_source(noise)
    d = xtx.shape[0]
    s_xx = noise_multiplier * x_bound ** 2
    s_xy = noise_multiplier * x_bound * y_bound
    std_xx = secure_gaussian_sigma(s_xx, x_bound ** 2)
    std_xy = secure_gaussian_sigma(s_xy, x_bound * y_bound)
    lambda_min = float(np.linalg.eigvalsh(xtx)[0])
    # Release 1: smallest eigenvalue, biased down so that it underestimates w.h.p.
    noisy_lambda_min = max(
        float(src.gaussian(lambda_min, std_xx)) - s_xx * math.sqrt(math.log(6.0 / delta)), 0.0)
    # Release 2: XᵀX + s_xx (G + Gᵀ)/2 for G with iid N(0, 1) entries: N(0, s_xx²) on the
    # diagonal, N(0, s_xx²/2) above it, mirrored below.
    upper = np.triu_indices(d, 1)
    noisy_xtx = np.diag(np.asarray(src.gaussian(np.diag(xtx), std_xx), dtype=np.float64))
    if upper[0].size:
        off = np.asarray(src.gaussian(xtx[upper], std_xx / math.sqrt(2.0)), dtype=np.float64)
        noisy_xtx[upper] = off
        noisy_xtx[(upper[1], upper[0])] = off
    # Release 3: Xᵀy.
    noisy_xty = np.asarray(src.gaussian(xty, std_xy), dtype=np.float64).reshape(d)

    ridge = max(0.0, s_xx * math.sqrt(d * math.log(2.0 * d * d / rho)) - noisy_lambda_min)
    system = noisy_xtx + ridge * np.eye(d)
    try:
        weights = np.linalg.solve(system, noisy_xty)
    except np.linalg.LinAlgError:  # singular noisy system (post-processing, so any solve is DP)
        weights = np.linalg.lstsq(system, noisy_xty, rcond=None)[0]
    return weights, ridge, noisy_lambda_min, noisy_xtx, noisy_xty


def _check_args(epsilon, delta, x_bound, y_bound, rho, accountant) -> tuple:
    """(ε, δ, x_bound, y_bound) checked, with rho and the accountant (nothing is clamped)."""
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=False)
    dpsgd.check_accountant(accountant)
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not 0 < rho < 1:
        raise ValueError(f"rho must lie in (0, 1), got {rho!r}")
    return (epsilon, delta, check_positive(x_bound, "x_bound"),
            check_positive(y_bound, "y_bound"))


def adassp(features: Any, labels: Any, *, epsilon: float, delta: float, x_bound: float,
           y_bound: float, rho: float = DEFAULT_RHO, accountant: str = dpsgd.PLD,
           noise: NoiseSource | None = None) -> AdaSSPResult:
    """(ε, δ)-DP linear regression by AdaSSP (Wang 2018, Alg. 2; Sage Tab. 1 "LR").

    Args:
      features: (n, d) matrix. Rows with ‖x‖ > x_bound are scaled down to x_bound.
      labels: (n,) vector. Values are clipped to [-y_bound, y_bound].
      epsilon: ε > 0, finite.
      delta: δ in (0, 1).
      x_bound: Public bound on ‖x‖₂ per row, chosen without looking at the data.
      y_bound: Public bound on |y|, chosen without looking at the data.
      rho: Failure probability in (0, 1) for the ridge λ (Sage Tab. 1 uses 0.1).
      accountant: ``"pld"`` (default, tight) or ``"rdp"`` to calibrate σ.
      noise: noise source; None (always, in components and pipelines) is OpenDP. Experiments
        and tests may pass ``SeededNoise(seed)``.

    Returns:
      An :class:`AdaSSPResult` with the weights and the DpEvent / (ε, δ) the run consumes.

    Raises:
      InvalidPrivacyParameterError: bad ε, δ or accountant (never clamped).
      ValueError: bad features, labels, bounds or rho.
    """
    epsilon, delta, x_bound, y_bound = _check_args(epsilon, delta, x_bound, y_bound, rho,
                                                   accountant)
    x, y = check_features(features, labels)
    x = clip_rows(x, x_bound)
    y = np.clip(y, -y_bound, y_bound)
    return adassp_from_moments(x.T @ x, x.T @ y, epsilon=epsilon, delta=delta, x_bound=x_bound,
                               y_bound=y_bound, rho=rho, accountant=accountant, noise=noise)


def adassp_from_moments(xtx: Any, xty: Any, *, epsilon: float, delta: float, x_bound: float,
                        y_bound: float, rho: float = DEFAULT_RHO, accountant: str = dpsgd.PLD,
                        noise: NoiseSource | None = None) -> AdaSSPResult:
    """:func:`adassp` from the exact moments XᵀX, Xᵀy of rows already clipped to ``x_bound``
    and labels clipped to ``y_bound`` (e.g. summed in Beam: the data never sits in one process).

    Raises:
      InvalidPrivacyParameterError: bad ε, δ or accountant (never clamped).
      ValueError: moments of the wrong shape or not finite, bad bounds or rho.
    """
    epsilon, delta, x_bound, y_bound = _check_args(epsilon, delta, x_bound, y_bound, rho,
                                                   accountant)
    xtx = np.asarray(xtx, dtype=np.float64)
    xty = np.asarray(xty, dtype=np.float64).reshape(-1)
    if xtx.ndim != 2 or xtx.shape != (xty.size, xty.size) or not (
            np.all(np.isfinite(xtx)) and np.all(np.isfinite(xty))):
        raise ValueError(f"moments must be a finite (d, d) XᵀX and (d,) Xᵀy, got {xtx.shape} "
                         f"and {xty.shape}")
    sigma, achieved_epsilon = _calibrated(epsilon, delta, accountant)
    event = adassp_event(sigma)

    weights, ridge, noisy_lambda_min, noisy_xtx, noisy_xty = release_from_moments(
        xtx, xty, noise_multiplier=sigma, x_bound=x_bound, y_bound=y_bound, delta=delta,
        rho=rho, noise=noise)

    for array in (weights, noisy_xtx, noisy_xty):
        array.flags.writeable = False
    return AdaSSPResult(
        weights=weights,
        epsilon=achieved_epsilon,
        delta=delta,
        accountant=accountant,
        event=event,
        noise_multiplier=sigma,
        neighboring_relation=dpsgd.ADD_OR_REMOVE_ONE,
        x_bound=x_bound,
        y_bound=y_bound,
        rho=float(rho),
        ridge=ridge,
        noisy_lambda_min=noisy_lambda_min,
        noisy_xtx=noisy_xtx,
        noisy_xty=noisy_xty,
    )
