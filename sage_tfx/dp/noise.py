"""Noise samplers that survive floating point: OpenDP's Laplace and Gaussian, continuous and
discrete.

Textbook floating-point Laplace (``-b * log(u)`` on a double ``u``, numpy's ``laplace``) leaks the
exact input through the low bits of the output (Mironov, CCS 2012): the set of doubles reachable
from ``f(D) + noise`` differs from the set reachable from ``f(D') + noise``. Every number sage-tfx
releases is noised here instead, by OpenDP's samplers (``opendp==0.16.0``):

* :func:`laplace` / :func:`gaussian` add noise to floats. OpenDP samples the noise exactly on a
  discretisation grid (granularity ``2**k``, chosen by OpenDP) and rounds the input onto that grid
  first, so every output is reachable from every input; its privacy map accounts for the rounding.
* :func:`discrete_laplace` / :func:`discrete_gaussian` add integer noise to integer counts
  (Canonne, Kamath & Steinke 2020), exactly, with no floating point at all.

:func:`laplace_epsilon` and :func:`gaussian_rho` return what OpenDP's own privacy map says the
sampler guarantees for a given sensitivity, so a caller can check that the ε it charges is the ε
the sampler delivers.

Seeded noise (:class:`SeededNoise`) exists only for experiments and tests that must be
reproducible: it uses numpy's generator and gives no protection against the floating-point
attack. Pass it explicitly (``noise=SeededNoise(0)``); components and pipelines never construct it
(``tests/test_layout.py`` checks), so a pipeline run always draws from OpenDP.

This module imports no TensorFlow.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Optional, Sequence, Union

import numpy as np

from sage_tfx.errors import InvalidPrivacyParameterError

ArrayLike = Union[np.ndarray, Sequence[Any], float, int]

__all__ = ["laplace", "gaussian", "discrete_laplace", "discrete_gaussian", "laplace_epsilon",
           "gaussian_rho", "noisy_max", "noisy_max_epsilon", "gumbel_max", "gumbel_max_rho",
           "SeededNoise", "NoiseSource"]


def _dp():
    import opendp.prelude as dp
    dp.enable_features("contrib")
    return dp


def _check_scale(scale: Any, name: str) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(scale)) or float(scale) <= 0:
        raise InvalidPrivacyParameterError(
            f"noise {name} must be a finite number > 0, got {scale!r}")
    return float(scale)


@functools.lru_cache(maxsize=256)
def _measurement(kind: str, integer: bool, scale: float):
    dp = _dp()
    t = "i64" if integer else float
    atom = dp.atom_domain(T=t) if integer else dp.atom_domain(T=t, nan=False)
    domain = dp.vector_domain(atom)
    if kind == "laplace":
        return dp.m.make_laplace(domain, dp.l1_distance(T=t), scale=scale)
    return dp.m.make_gaussian(domain, dp.l2_distance(T=t), scale=scale)


def _float_values(values: ArrayLike) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError("values to noise must be finite (no NaN or infinity)")
    return arr


def _int_values(values: ArrayLike) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind not in "iub":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"discrete noise needs integer counts, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def _apply(kind: str, integer: bool, scale: float, arr: np.ndarray):
    if arr.size == 0:
        return arr.copy()
    noisy = _measurement(kind, integer, scale)(arr.ravel().tolist())
    out = np.asarray(noisy, dtype=np.int64 if integer else np.float64).reshape(arr.shape)
    return out


def _scalar_or_array(out: np.ndarray, integer: bool):
    if out.ndim == 0:
        return int(out) if integer else float(out)
    return out


def laplace(values: ArrayLike, scale: float) -> Union[float, np.ndarray]:
    """``values`` plus independent Laplace(0, ``scale``) noise per coordinate (OpenDP).

    Returns a float for a scalar, else a float64 array of the same shape.

    Raises:
      InvalidPrivacyParameterError: ``scale`` not finite and > 0.
      ValueError: a NaN or infinite value.
    """
    scale = _check_scale(scale, "scale")
    arr = _float_values(values)
    return _scalar_or_array(_apply("laplace", False, scale, arr), False)


def gaussian(values: ArrayLike, sigma: float) -> Union[float, np.ndarray]:
    """``values`` plus independent N(0, ``sigma``²) noise per coordinate (OpenDP)."""
    sigma = _check_scale(sigma, "sigma")
    arr = _float_values(values)
    return _scalar_or_array(_apply("gaussian", False, sigma, arr), False)


def discrete_laplace(counts: ArrayLike, scale: float) -> Union[int, np.ndarray]:
    """Integer ``counts`` plus discrete Laplace noise, P(z) ∝ exp(-|z| / ``scale``) (OpenDP).

    For integer queries of L1 sensitivity Δ, ``scale = Δ / ε`` gives ε-DP, as the continuous one.
    Returns an int for a scalar, else an int64 array.
    """
    scale = _check_scale(scale, "scale")
    arr = _int_values(counts)
    return _scalar_or_array(_apply("laplace", True, scale, arr), True)


def discrete_gaussian(counts: ArrayLike, sigma: float) -> Union[int, np.ndarray]:
    """Integer ``counts`` plus discrete Gaussian noise, P(z) ∝ exp(-z² / 2σ²) (OpenDP)."""
    sigma = _check_scale(sigma, "sigma")
    arr = _int_values(counts)
    return _scalar_or_array(_apply("gaussian", True, sigma, arr), True)


def laplace_epsilon(scale: float, l1_sensitivity: float, *, integer: bool = False) -> float:
    """ε that OpenDP's privacy map guarantees for its (discrete) Laplace sampler at ``scale``."""
    scale = _check_scale(scale, "scale")
    sens = _check_scale(l1_sensitivity, "l1_sensitivity")
    m = _measurement("laplace", integer, scale)
    return float(m.map(int(sens) if integer else sens))


def gaussian_rho(sigma: float, l2_sensitivity: float, *, integer: bool = False) -> float:
    """zCDP ρ that OpenDP's privacy map guarantees for its (discrete) Gaussian sampler."""
    sigma = _check_scale(sigma, "sigma")
    sens = _check_scale(l2_sensitivity, "l2_sensitivity")
    m = _measurement("gaussian", integer, sigma)
    return float(m.map(int(sens) if integer else sens))


@functools.lru_cache(maxsize=256)
def _noisy_max_measurement(scale: float, monotonic: bool):
    dp = _dp()
    return dp.m.make_noisy_max(dp.vector_domain(dp.atom_domain(T=float, nan=False)),
                               dp.linf_distance(T=float, monotonic=monotonic),
                               dp.max_divergence(), scale=scale)


def noisy_max(scores: ArrayLike, scale: float, *, monotonic: bool = False) -> int:
    """Index of the highest of ``scores`` after exponential noise of ``scale`` (OpenDP's
    ``make_noisy_max``: report-noisy-max with exponential noise, i.e. permute-and-flip, McKenna &
    Sheldon 2020 — the exponential-mechanism family). For scores of L∞ sensitivity Δ it is
    ``2Δ/scale``-DP, or ``Δ/scale``-DP when every score moves in the same direction between
    neighbours (``monotonic``); :func:`noisy_max_epsilon` returns OpenDP's own map."""
    scale = _check_scale(scale, "scale")
    arr = _float_values(scores).ravel()
    if arr.size == 0:
        raise ValueError("noisy_max needs at least one score")
    return int(_noisy_max_measurement(scale, bool(monotonic))(arr.tolist()))


def noisy_max_epsilon(scale: float, linf_sensitivity: float, *, monotonic: bool = False) -> float:
    """ε that OpenDP's privacy map guarantees for :func:`noisy_max` at ``scale``."""
    scale = _check_scale(scale, "scale")
    sens = _check_scale(linf_sensitivity, "linf_sensitivity")
    return float(_noisy_max_measurement(scale, bool(monotonic)).map(sens))


@functools.lru_cache(maxsize=256)
def _gumbel_max_measurement(scale: float):
    dp = _dp()
    return dp.m.make_noisy_max(dp.vector_domain(dp.atom_domain(T=int)), dp.linf_distance(T=int),
                               dp.zero_concentrated_divergence(), scale=scale)


def gumbel_max(counts: ArrayLike, scale: float) -> Union[int, np.ndarray]:
    """argmax of integer ``counts`` plus i.i.d. Gumbel(0, ``scale``) noise (OpenDP's
    ``make_noisy_max`` under zero-concentrated divergence: the exponential mechanism, sampled
    exactly on integer scores, no floating point). A 1-D input gives an index, a 2-D input
    [P, C] the index of every row. For counts of L∞ sensitivity Δ (not monotonic) it is
    ``2Δ/scale``-DP and ``(2Δ/scale)²/8``-zCDP (bounded range); :func:`gumbel_max_rho` returns
    OpenDP's own map."""
    scale = _check_scale(scale, "scale")
    arr = _int_values(counts)
    if arr.ndim not in (1, 2) or arr.shape[-1] == 0:
        raise ValueError("gumbel_max needs a non-empty vector or a [P, C] matrix of counts")
    m = _gumbel_max_measurement(scale)
    if arr.ndim == 1:
        return int(m(arr.tolist()))
    return np.fromiter((m(row) for row in arr.tolist()), dtype=np.int64, count=len(arr))


def gumbel_max_rho(scale: float, linf_sensitivity: int) -> float:
    """zCDP ρ that OpenDP's privacy map guarantees for :func:`gumbel_max` at ``scale``."""
    scale = _check_scale(scale, "scale")
    sens = _check_scale(linf_sensitivity, "linf_sensitivity")
    if sens != int(sens):
        raise InvalidPrivacyParameterError(f"gumbel_max scores are integer counts: the "
                                           f"sensitivity must be an integer, got {sens}")
    return float(_gumbel_max_measurement(scale).map(int(sens)))


class SeededNoise:
    """Reproducible numpy noise for experiments and tests only: NOT protected against the
    floating-point attack. Same functions as this module; pass it explicitly where an
    experiment needs reproducibility. Components and pipelines never construct it.
    """

    def __init__(self, seed: Optional[int] = None, rng: Optional[np.random.Generator] = None):
        self.rng = rng if rng is not None else np.random.default_rng(seed)

    def laplace(self, values: ArrayLike, scale: float):
        """``values`` plus Laplace noise of ``scale`` from the seeded generator (experiments and
        tests only)."""
        scale = _check_scale(scale, "scale")
        arr = _float_values(values)
        return _scalar_or_array(arr + self.rng.laplace(0.0, scale, size=arr.shape), False)

    def gaussian(self, values: ArrayLike, sigma: float):
        """``values`` plus Gaussian noise of std ``sigma`` from the seeded generator (experiments
        and tests only)."""
        sigma = _check_scale(sigma, "sigma")
        arr = _float_values(values)
        return _scalar_or_array(arr + self.rng.normal(0.0, sigma, size=arr.shape), False)

    def discrete_laplace(self, counts: ArrayLike, scale: float):
        """Difference of two geometrics: exactly discrete Laplace with P(z) ∝ exp(-|z|/scale)."""
        scale = _check_scale(scale, "scale")
        arr = _int_values(counts)
        p = -math.expm1(-1.0 / scale)
        z = self.rng.geometric(p, size=arr.shape) - self.rng.geometric(p, size=arr.shape)
        return _scalar_or_array(arr + z.astype(np.int64), True)

    def noisy_max(self, scores: ArrayLike, scale: float, *, monotonic: bool = False) -> int:
        """Argmax of scores plus i.i.d. exponential noise of ``scale`` (the distribution of
        OpenDP's ``make_noisy_max``)."""
        scale = _check_scale(scale, "scale")
        arr = _float_values(scores).ravel()
        if arr.size == 0:
            raise ValueError("noisy_max needs at least one score")
        return int(np.argmax(arr + self.rng.exponential(scale, size=arr.shape)))

    def gumbel_max(self, counts: ArrayLike, scale: float):
        """argmax of counts plus i.i.d. Gumbel noise of ``scale`` per row (the distribution of
        OpenDP's ``make_noisy_max`` under zCDP)."""
        scale = _check_scale(scale, "scale")
        arr = _int_values(counts)
        if arr.ndim not in (1, 2) or arr.shape[-1] == 0:
            raise ValueError("gumbel_max needs a non-empty vector or a [P, C] matrix of counts")
        out = np.argmax(arr + self.rng.gumbel(0.0, scale, size=arr.shape), axis=-1)
        return int(out) if arr.ndim == 1 else out.astype(np.int64)

    def discrete_gaussian(self, counts: ArrayLike, sigma: float):
        """Rounded Gaussian stand-in for experiments (not the exact discrete Gaussian)."""
        sigma = _check_scale(sigma, "sigma")
        arr = _int_values(counts)
        z = np.rint(self.rng.normal(0.0, sigma, size=arr.shape)).astype(np.int64)
        return _scalar_or_array(arr + z, True)


class _OpenDPNoise:
    """The module's OpenDP samplers as an object with :class:`SeededNoise`'s methods."""

    laplace = staticmethod(laplace)
    gaussian = staticmethod(gaussian)
    discrete_laplace = staticmethod(discrete_laplace)
    discrete_gaussian = staticmethod(discrete_gaussian)
    noisy_max = staticmethod(noisy_max)
    gumbel_max = staticmethod(gumbel_max)


NoiseSource = Union[SeededNoise, _OpenDPNoise]
SECURE = _OpenDPNoise()
"""The default noise source: OpenDP. ``noise or SECURE`` where a ``noise=`` argument is optional."""
