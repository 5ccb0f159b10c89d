"""DP logistic regression by output perturbation (Chaudhuri, Monteleoni & Sarwate, JMLR 2011).

Sage's Criteo LG pipeline (Tab. 1) trains logistic regression with DP-SGD; that path is
:mod:`sage_tfx.dp.keras_dpsgd` with a single ``Dense(1, activation="sigmoid")`` layer. This
module is the closed-form alternative for small d (Chaudhuri et al., Alg. 1): fit the L2-regularized
logistic regression

    J(θ) = (1/n) Σᵢ log(1 + exp(−yᵢ θᵀxᵢ)) + (λ/2) ‖θ‖²,      yᵢ ∈ {−1, +1},  ‖xᵢ‖ ≤ x_bound,

to high precision, then release ``θ̂ + N(0, (σ·Δ)² I)`` (the Gaussian instead of the paper's
Gamma-norm noise, which gives (ε, δ)-DP with σ calibrated by dp_accounting; the event is
``GaussianDpEvent(σ)``).

Sensitivity. The logistic loss is ``x_bound``-Lipschitz in θ and J is λ-strongly convex, so for
datasets differing in one example (same n) the exact minimizers satisfy
``‖θ*(D) − θ*(D')‖ ≤ 2·x_bound / (n·λ)`` (Chaudhuri et al. 2011, Cor. 8 with L = x_bound). The
solver stops only once ``‖∇J(θ̂)‖ ≤ grad_tol`` — a data-independent criterion — so strong convexity
gives ``‖θ̂ − θ*‖ ≤ grad_tol / λ`` for every dataset, and

    Δ = 2·x_bound / (n·λ) + 2·grad_tol / λ.

(With the default grad_tol = 1e-10 the second term is negligible; floating-point rounding is, as
in every implementation, outside the proof.)

Assumptions, stated with every result:

* **Adjacency: replace-one** (bounded DP): neighbouring datasets have the same size n, which is
  public (in Sage, block record counts are ledger metadata). This is the adjacency of Chaudhuri et
  al.; it is *not* the add-or-remove adjacency of :mod:`sage_tfx.dp.dpsgd` and AdaSSP. An
  add-or-remove guarantee would need a different sensitivity analysis (n changes the objective).
* ``x_bound`` is public and chosen without looking at the data; rows are clipped to it.
* No intercept: append a constant column (it counts towards ``x_bound`` and is regularized).

This module imports only numpy, scipy and dp_accounting.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import dp_event as dp_event_lib
from scipy import special

from sage_tfx.dp import dpsgd
from sage_tfx.ledger.accounting import check_delta, check_epsilon, check_positive
from sage_tfx.dp._common import check_features, clip_rows
from sage_tfx.dp.mechanisms import noise_source, secure_gaussian_sigma
from sage_tfx.dp.noise import NoiseSource

REPLACE_ONE = "replace_one"
DEFAULT_GRAD_TOL = 1e-10


@dataclasses.dataclass(frozen=True)
class DPLogisticResult:
    """Output of :func:`dp_logistic_regression`; every field is a DP release or public.

    Attributes:
      weights: θ, shape (d,), for labels in {−1, +1} (``predict`` maps back to the input labels).
      epsilon: ε of the run at ``delta`` (≤ the requested ε).
      delta: δ.
      accountant: ``"rdp"`` or ``"pld"``.
      event: ``GaussianDpEvent(noise_multiplier)``.
      noise_multiplier: σ = noise std / sensitivity.
      sensitivity: Δ = 2·x_bound/(n·λ) + 2·grad_tol/λ (replace-one).
      neighboring_relation: ``"replace_one"``.
      num_examples: n (public under replace-one adjacency).
      l2_reg: λ.
      x_bound: Row norm bound the features were clipped to.
      labels: The two label values, (negative, positive), as given.
    """

    weights: np.ndarray
    epsilon: float
    delta: float
    accountant: str
    event: dp_event_lib.DpEvent
    noise_multiplier: float
    sensitivity: float
    neighboring_relation: str
    num_examples: int
    l2_reg: float
    x_bound: float
    labels: tuple[float, float]

    def decision_function(self, features: Any) -> np.ndarray:
        """θᵀx for each row."""
        return np.asarray(features, dtype=np.float64) @ self.weights

    def predict_proba(self, features: Any) -> np.ndarray:
        """P(positive label | x) for each row."""
        return special.expit(self.decision_function(features))

    def predict(self, features: Any) -> np.ndarray:
        """The more likely label of each row, in the caller's label values."""
        return np.where(self.decision_function(features) >= 0, self.labels[1], self.labels[0])


def _signed_labels(y: np.ndarray) -> tuple[np.ndarray, tuple[float, float]]:
    values = set(np.unique(y).tolist())
    for neg, pos in ((0.0, 1.0), (-1.0, 1.0)):
        if values <= {neg, pos}:
            return np.where(y == pos, 1.0, -1.0), (neg, pos)
    raise ValueError(
        f"labels must be binary, in {{0, 1}} or {{-1, 1}}; got values {sorted(values)[:10]}")


def objective_and_gradient(weights: np.ndarray, x: np.ndarray, y_signed: np.ndarray,
                           l2_reg: float) -> tuple[float, np.ndarray]:
    """J(θ) and ∇J(θ) of the L2-regularized logistic loss (labels in {−1, +1})."""
    margins = y_signed * (x @ weights)
    value = float(np.mean(np.logaddexp(0.0, -margins)) + 0.5 * l2_reg * weights @ weights)
    grad = -(x.T @ (y_signed * special.expit(-margins))) / x.shape[0] + l2_reg * weights
    return value, grad


def fit_logistic(x: np.ndarray, y_signed: np.ndarray, l2_reg: float,
                 grad_tol: float = DEFAULT_GRAD_TOL, max_iter: int = 200) -> np.ndarray:
    """Minimizes J by damped Newton's method until ‖∇J‖ ≤ grad_tol. NOT private on its own.

    Raises:
      RuntimeError: no convergence within max_iter (does not happen for λ > 0 in exact
        arithmetic: J is smooth and strongly convex).
    """
    n, d = x.shape
    weights = np.zeros(d)
    value, grad = objective_and_gradient(weights, x, y_signed, l2_reg)
    for _ in range(max_iter):
        if np.linalg.norm(grad) <= grad_tol:
            return weights
        p = special.expit(y_signed * (x @ weights))
        hessian = (x.T * (p * (1.0 - p))) @ x / n + l2_reg * np.eye(d)
        step = -np.linalg.solve(hessian, grad)
        t = 1.0
        # Armijo backtracking; full steps near the optimum give quadratic convergence.
        while True:
            candidate = weights + t * step
            new_value, new_grad = objective_and_gradient(candidate, x, y_signed, l2_reg)
            if new_value <= value + 1e-4 * t * (grad @ step):
                break
            t *= 0.5
            if t < 1e-12:
                break
        if t < 1e-12:
            # Float64 cannot decrease J further; accept a point only if its gradient is smaller.
            if np.linalg.norm(new_grad) >= np.linalg.norm(grad):
                break
        weights, value, grad = candidate, new_value, new_grad
    if np.linalg.norm(grad) <= grad_tol:
        return weights
    raise RuntimeError(
        f"logistic regression did not reach ‖∇J‖ ≤ {grad_tol} (got {np.linalg.norm(grad):.3g}); "
        "raise grad_tol (it enters the sensitivity) or l2_reg")


def logistic_noise_multiplier(epsilon: float, delta: float, accountant: str = dpsgd.PLD) -> float:
    """Smallest σ (within 1e-6) with ``GaussianDpEvent(σ)`` (ε, δ)-DP under ``accountant``.

    Raises:
      InvalidPrivacyParameterError: bad ε, δ or accountant.
    """
    return _calibrated(check_epsilon(epsilon), check_delta(delta, allow_zero=False),
                       dpsgd.check_accountant(accountant))[0]


def _calibrated(epsilon: float, delta: float, accountant: str) -> tuple[float, float]:
    """(σ, ε achieved at δ), cached (:func:`sage_tfx.dp.dpsgd.calibrated_noise`)."""
    return dpsgd.calibrated_noise(dp_accounting.GaussianDpEvent, epsilon, delta, accountant)


def output_sensitivity(num_examples: int, l2_reg: float, x_bound: float = 1.0,
                       grad_tol: float = DEFAULT_GRAD_TOL) -> float:
    """Replace-one L2 sensitivity of the solver's output: 2·x_bound/(n·λ) + 2·grad_tol/λ."""
    return 2.0 * x_bound / (num_examples * l2_reg) + 2.0 * grad_tol / l2_reg


def dp_logistic_regression(features: Any, labels: Any, *, epsilon: float, delta: float,
                           l2_reg: float, x_bound: float = 1.0, accountant: str = dpsgd.PLD,
                           grad_tol: float = DEFAULT_GRAD_TOL,
                           noise: NoiseSource | None = None) -> DPLogisticResult:
    """(ε, δ)-DP L2-regularized logistic regression by output perturbation (Chaudhuri et al. 2011).

    Replace-one adjacency with n public; see the module docstring for the sensitivity proof sketch.

    Args:
      features: (n, d) matrix; rows with ‖x‖ > x_bound are scaled down to x_bound.
      labels: (n,) binary labels in {0, 1} or {−1, +1}.
      epsilon: ε > 0, finite.
      delta: δ in (0, 1).
      l2_reg: λ > 0 (larger λ: smaller sensitivity, more bias).
      x_bound: Public bound on ‖x‖₂, chosen without looking at the data (default 1).
      accountant: ``"pld"`` (default) or ``"rdp"`` to calibrate σ.
      grad_tol: Solver stopping tolerance on ‖∇J‖; enters the sensitivity.
      noise: noise source; None (always, in components and pipelines) is OpenDP; experiments and
        tests may pass ``SeededNoise(seed)``.

    Returns:
      A :class:`DPLogisticResult`.

    Raises:
      InvalidPrivacyParameterError: bad ε, δ or accountant (never clamped).
      ValueError: bad features, labels, l2_reg, x_bound or grad_tol.
      RuntimeError: the solver did not converge (see :func:`fit_logistic`).
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=False)
    dpsgd.check_accountant(accountant)
    l2_reg = check_positive(l2_reg, "l2_reg")
    x_bound = check_positive(x_bound, "x_bound")
    grad_tol = check_positive(grad_tol, "grad_tol")
    x, y = check_features(features, labels)
    y_signed, label_values = _signed_labels(y)
    x = clip_rows(x, x_bound)
    n, d = x.shape

    sigma, achieved_epsilon = _calibrated(epsilon, delta, accountant)
    sensitivity = output_sensitivity(n, l2_reg, x_bound, grad_tol)
    weights = fit_logistic(x, y_signed, l2_reg, grad_tol)
    std = secure_gaussian_sigma(sigma * sensitivity, sensitivity)  # OpenDP's ρ ≤ the charged ρ
    weights = np.asarray(noise_source(noise).gaussian(weights, std), dtype=np.float64).reshape(d)
    weights.flags.writeable = False
    event = dp_accounting.GaussianDpEvent(sigma)
    return DPLogisticResult(
        weights=weights,
        epsilon=achieved_epsilon,
        delta=delta,
        accountant=accountant,
        event=event,
        noise_multiplier=sigma,
        sensitivity=sensitivity,
        neighboring_relation=REPLACE_ONE,
        num_examples=n,
        l2_reg=l2_reg,
        x_bound=x_bound,
        labels=label_values,
    )
