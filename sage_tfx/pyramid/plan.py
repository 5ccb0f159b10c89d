"""The noise of one window's tables and what it costs: Laplace (pure ε) or Gaussian (zCDP).

A :class:`NoisePlan` says which sampler adds noise to which table at which scale, and what the
ledger charges for it — the same numbers: the plan is computed once per seal, its scales go to
:func:`~sage_tfx.pyramid.sealing.draw_tables`, its cost to the ledger.

* **Laplace** (``CountSpec.mechanism = "laplace"``, δ = 0): table ``i`` of ``h_i`` rows gets
  OpenDP discrete Laplace noise of scale ``h_i k / ε_i`` per cell (``ε_i`` the noise-weighted
  share, :func:`~sage_tfx.dp.counts.table_epsilons`), charged ``(ε, 0)`` on a basic stream; on
  an rdp stream continuous Laplace noise, charged :func:`~sage_tfx.dp.counts.table_event`.
* **Gaussian** (``mechanism = "gaussian"``, ``0 < δ < 1``): every cell of table ``i`` gets
  OpenDP's *discrete* Gaussian noise (``make_gaussian`` on integer vectors: exact integer
  sampling, no floating point) of std ``σ_i = c · w_i`` (``w_i`` the noise weights, 1 when
  even). Neighbours differing in ``k`` observations change one cell per row by at most ``k``
  (each row of a table is a vector of L2 sensitivity ``k``), so row by row the tables are
  ``Σ_i h_i`` Gaussian mechanisms of noise multiplier ``σ_i / k``:
  ``ComposedDpEvent([SelfComposedDpEvent(GaussianDpEvent(σ_i / k), h_i)])``, of zCDP
  ``ρ = Σ_i h_i k² / (2 σ_i²)``. ``c`` is the smallest value for which dp_accounting's RDP
  accountant gives ε ≤ the spec's ε at the spec's δ (``calibrate_dp_mechanism``). RDP, not PLD:
  the discrete Gaussian is ρ-zCDP exactly like the continuous one (Canonne, Kamath & Steinke
  2020, Thm. 4), i.e. its Rényi divergences are bounded by the continuous Gaussian's curve that
  the RDP accountant uses, whereas the continuous PLD is not a bound proved for it. Each σ_i is
  then raised by the ulps OpenDP's own map needs (its ρ at ``d_in = k`` never above the
  event's). Charged: the event on an rdp stream, ``(ε, δ)`` (a δ > 0 grant) on a basic stream.

For 11 tables of 5 rows at (ε = 1, δ = 1e-6), k = 1, this gives σ = 33.6 per cell against the
Laplace standard deviation of 77.8 (``√2 · 55``).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional, Sequence

import dp_accounting
import numpy as np
from dp_accounting.rdp import RdpAccountant

from sage_tfx.dp import noise as dp_noise
from sage_tfx.dp.counts import noise_scales, table_epsilons, table_event
from sage_tfx.dp.mechanisms import secure_laplace_scale
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.pyramid.featurize import GAUSSIAN, CountSpec

__all__ = ["NoisePlan", "plan_window", "window_event", "gaussian_event", "gaussian_sigmas",
           "table_depths", "DISCRETE_LAPLACE", "CONTINUOUS_LAPLACE", "DISCRETE_GAUSSIAN"]

DISCRETE_LAPLACE, CONTINUOUS_LAPLACE, DISCRETE_GAUSSIAN = \
    "discrete_laplace", "laplace", "discrete_gaussian"


def table_depths(spec: CountSpec) -> list[int]:
    """Rows of each table: ``depth`` per group, then 1 for the label prior."""
    return [spec.depth] * len(spec.groups) + [1]


def _weights(spec: CountSpec, weights: Optional[Sequence[float]]) -> np.ndarray:
    if weights is None:
        return np.ones(spec.n_tables)
    table_epsilons(1.0, weights, n_tables=spec.n_tables)       # validates them
    return np.asarray(weights, dtype=np.float64)


def gaussian_event(sigmas: Sequence[float], depths: Sequence[int], k: int
                   ) -> dp_accounting.DpEvent:
    """One Gaussian mechanism (noise multiplier ``σ_i / k``) per row of every table."""
    return dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(float(s) / k), int(d))
        for s, d in zip(sigmas, depths)])


def _rdp_epsilon(event: dp_accounting.DpEvent, delta: float) -> float:
    return float(RdpAccountant().compose(event).get_epsilon(delta))


def _repeated(event: dp_accounting.DpEvent, repeat: int) -> dp_accounting.DpEvent:
    return event if repeat == 1 else dp_accounting.SelfComposedDpEvent(event, repeat)


def gaussian_sigmas(spec: CountSpec, weights: Optional[Sequence[float]] = None,
                    repeat: int = 1) -> np.ndarray:
    """The charged σ of every table (before OpenDP's ulps): ``c · w_i``, ``c`` calibrated with
    dp_accounting's RDP accountant so that ``repeat`` releases of the tables (an observation in
    ``repeat`` tree nodes, :mod:`sage_tfx.pyramid.tree`) together meet the spec's (ε, δ)."""
    if spec.mechanism != GAUSSIAN:
        raise InvalidPrivacyParameterError(f"spec {spec.digest()} is not a Gaussian spec")
    w = _weights(spec, weights)
    return _calibrated(spec, tuple(float(v) for v in w), repeat).copy()


@functools.lru_cache(maxsize=64)
def _calibrated(spec: CountSpec, w: tuple, repeat: int) -> np.ndarray:
    """:func:`gaussian_sigmas`, computed once per (spec, weights, repeat) in a process (the
    calibration is deterministic; a tree store plans every seal)."""
    w = np.asarray(w)
    depths = table_depths(spec)
    c = dp_accounting.calibrate_dp_mechanism(
        RdpAccountant, lambda c: _repeated(gaussian_event(c * w, depths, spec.k), repeat),
        spec.epsilon, spec.delta, dp_accounting.LowerEndpointAndGuess(1e-9, 1.0), tol=1e-9)
    sigmas = c * w
    if _rdp_epsilon(_repeated(gaussian_event(sigmas, depths, spec.k), repeat),
                    spec.delta) > spec.epsilon * (1 + 1e-9):
        raise AssertionError("calibrated Gaussian noise exceeds the spec's epsilon")
    return sigmas


def _opendp_sigma(sigma: float, k: int) -> float:
    """σ' ≥ σ whose OpenDP discrete-Gaussian map at ``d_in = k`` is ≤ ``k² / (2σ²)``."""
    rho, s, step = k * k / (2.0 * sigma * sigma), sigma, 1
    while dp_noise.gaussian_rho(s, k, integer=True) > rho:
        for _ in range(step):
            s = math.nextafter(s, math.inf)
        step *= 2
    return s


@dataclasses.dataclass(frozen=True)
class NoisePlan:
    """The sampler, scales and cost of one window's tables (groups, then the prior).

    Attributes:
      mechanism: :data:`DISCRETE_LAPLACE`, :data:`CONTINUOUS_LAPLACE` or
        :data:`DISCRETE_GAUSSIAN`.
      scales: per table, the Laplace scale or the Gaussian σ that the sampler runs with.
      shares: per table, its part of the window's ε (Laplace: the ε_i that sum to ε; Gaussian:
        ε attributed in proportion to the table's ρ — not separately composable).
      epsilon, delta: the tables' cost.
      event: the DpEvent of the tables (None for discrete Laplace on a basic stream).
      rhos: per table its zCDP ρ (Gaussian only).
    """

    mechanism: str
    scales: np.ndarray
    shares: np.ndarray
    epsilon: float
    delta: float
    event: Optional[dp_accounting.DpEvent]
    rhos: Optional[np.ndarray] = None

    def variance(self, i: int) -> float:
        """Noise variance of one cell of table ``i``: discrete Laplace's exactly, 2b² for the
        continuous one, σ² for the discrete Gaussian (an upper bound: its variance is below σ²)."""
        s = float(self.scales[i])
        if self.mechanism == DISCRETE_LAPLACE:
            q = math.exp(-1.0 / s)
            return 2.0 * q / (1.0 - q) ** 2
        return 2.0 * s * s if self.mechanism == CONTINUOUS_LAPLACE else s * s


def plan_window(spec: CountSpec, weights: Optional[Sequence[float]] = None, *,
                rdp: bool = False, repeat: Optional[int] = None) -> NoisePlan:
    """The noise of a window's tables under ``spec`` at noise ``weights``, on a basic stream
    or (``rdp``) an rdp one. See the module docstring. With ``repeat`` > 1 the tables are
    released ``repeat`` times with independent noise (a window in ``repeat`` tree nodes): the
    scales are those for which the ``repeat`` releases *together* cost the spec's (ε, δ), and
    :attr:`NoisePlan.event` is the composition of all of them. Default: the spec's
    :attr:`~sage_tfx.pyramid.featurize.CountSpec.nodes_per_window` (``levels + 1`` for a tree
    spec, whose scales are then those of one node)."""
    if repeat is None:
        repeat = spec.nodes_per_window
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise InvalidPrivacyParameterError(f"repeat must be an int >= 1, got {repeat!r}")
    depths = table_depths(spec)
    if spec.mechanism == GAUSSIAN:
        sig = gaussian_sigmas(spec, weights, repeat)
        rhos = np.array([d * spec.k ** 2 / (2.0 * s * s) for s, d in zip(sig, depths)])
        scales = np.array([_opendp_sigma(float(s), spec.k) for s in sig])
        return NoisePlan(DISCRETE_GAUSSIAN, scales, spec.epsilon * rhos / rhos.sum() / repeat,
                         spec.epsilon, spec.delta,
                         _repeated(gaussian_event(sig, depths, spec.k), repeat), rhos)
    eps = table_epsilons(spec.epsilon / repeat, weights, n_tables=spec.n_tables)
    if rdp:
        event = dp_accounting.ComposedDpEvent(
            [table_event(float(e), d) for e, d in zip(eps, depths)])
        scales = np.array([secure_laplace_scale(float(e) / d, spec.k) for e, d in zip(eps, depths)])
        return NoisePlan(CONTINUOUS_LAPLACE, scales, eps, spec.epsilon, 0.0,
                         _repeated(event, repeat))
    scales = np.append(noise_scales(eps[:-1], spec.depth, spec.k),
                       noise_scales(eps[-1:], 1, spec.k))
    return NoisePlan(DISCRETE_LAPLACE, scales, eps, spec.epsilon, 0.0, None)


def window_event(spec: CountSpec, weights: Optional[Sequence[float]] = None
                 ) -> dp_accounting.DpEvent:
    """The DpEvent one window's tables cost on an rdp stream (what
    :meth:`~sage_tfx.pyramid.windows.PyramidStore.seal` charges there, and what a pipeline's
    gate must charge): Laplace — one :func:`~sage_tfx.dp.counts.table_event` per table at the ε
    shares of ``weights`` (even split if None); Gaussian — :func:`gaussian_event`. For a tree
    spec, the ``levels + 1`` node releases a window is in, composed."""
    return plan_window(spec, weights, rdp=True).event
