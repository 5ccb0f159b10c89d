"""DP statistics over count tables: quantiles of key counts, and mutual-information selection.

Two releases that choose *how* to count, each from OpenDP (``opendp==0.16.0``), each pure ε-DP
under add/remove of one observation:

* :func:`private_count_quantile` — a quantile of a table's per-key totals (Pyramid's noise
  weights, §III.B.2 / App. A.2), by OpenDP's exponential-mechanism quantile
  (``make_private_quantile``) over a public geometric grid of candidates. One observation moves
  one key's total by 1 or adds a key with total 1: the multiset of totals changes by at most
  two elements (symmetric distance 2); neighbours that differ in ``k`` observations (group
  privacy, Pyramid's ``k``) change it by at most ``2k`` elements. ``d_in = 2k`` is what is given
  to OpenDP's privacy map, both to calibrate the scale and to check the ε charged.
* :func:`private_top_k` — the ``k`` best of a vector of scores (Pyramid's count selection,
  §III.B.4 / App. A.3) by OpenDP's noisy top-k, for scores of a stated L∞ sensitivity.

:func:`mi_score` is the scaled plug-in mutual information ``n · I(X; L)`` (nats), whose
sensitivity :func:`mi_score_sensitivity` is derived below and checked numerically in the tests.

Derivation. With ``g(c) = c ln c``, ``n·I = g(n) − Σ_l g(c_l) − Σ_x g(c_x) + Σ_{x,l} g(c_xl)``.
Adding one observation ``(x, l)`` raises ``n, c_l, c_x, c_xl`` by one each, and
``g(c+1) − g(c) ∈ [ln(c+1), ln(c+1) + 1]``. The change is therefore at most
``ln(n+1) − ln(c_l+1) + ln(c_xl+1) − ln(c_x+1) + 2 ≤ ln(n+1) + 2`` and at least
``−ln(c_l+1) − ln(c_x+1) + ln(n+1) − 2 ≥ −ln(n+1) − 2``, so with a public bound ``N`` on the
number of observations, ``|Δ(n·I)| ≤ ln(N + 1) + 2``.

This module imports no TensorFlow.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np

from sage_tfx.dp.counts import encode_key
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger.accounting import check_epsilon

__all__ = ["quantile_candidates", "quantile_d_in", "quantile_epsilon", "private_count_quantile",
           "mi_score", "mi_score_sensitivity",
           "top_k_scale", "private_top_k"]



def quantile_d_in(k: int = 1) -> int:
    """Symmetric distance of the multiset of key totals between neighbours differing in ``k``
    observations: each observation moves one key's total (one element out, one in), so ``2k``."""
    return 2 * _check_int("k", k, 1)


def _dp():
    import opendp.prelude as dp
    dp.enable_features("contrib")
    return dp


def _check_int(name: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise InvalidRequestError(f"{name} must be an int >= {lo}, got {v!r}")
    return int(v)


def quantile_candidates(max_count: int, per_octave: int = 8) -> tuple[float, ...]:
    """Public geometric grid ``1 .. max_count`` (``per_octave`` points per doubling)."""
    max_count = _check_int("max_count", max_count, 1)
    n = max(2, int(np.ceil(np.log2(max_count) * per_octave)) + 1)
    return tuple(float(v) for v in np.unique(np.round(np.geomspace(1.0, max_count, n), 6)))


@functools.lru_cache(maxsize=64)
def _quantile_meas(candidates: tuple, alpha: float, scale: float):
    dp = _dp()
    return dp.m.make_private_quantile(
        dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.symmetric_distance(),
        dp.max_divergence(), candidates=list(candidates), alpha=alpha, scale=scale)


@functools.lru_cache(maxsize=64)
def _quantile_scale(candidates: tuple, alpha: float, epsilon: float, d_in: int) -> float:
    dp = _dp()
    return dp.binary_search_param(lambda s: _quantile_meas(candidates, alpha, s),
                                  d_in=d_in, d_out=epsilon, T=float)


def quantile_epsilon(alpha: float, epsilon: float, max_count: int, k: int = 1) -> float:
    """ε that OpenDP's own privacy map gives the quantile :func:`private_count_quantile` runs
    for (``alpha``, ``epsilon``, ``max_count``, ``k``), at neighbour distance ``2k``."""
    cands = quantile_candidates(max_count)
    d_in = quantile_d_in(k)
    scale = _quantile_scale(cands, float(alpha), check_epsilon(epsilon), d_in)
    return float(_quantile_meas(cands, float(alpha), scale).map(d_in))


def private_count_quantile(key_totals: Sequence[int], alpha: float, epsilon: float,
                           max_count: int, k: int = 1) -> float:
    """ε-DP ``alpha``-quantile of a table's per-key totals, on a public grid up to ``max_count``,
    for neighbours that differ in ``k`` observations (OpenDP's map at ``d_in = 2k``).

    Raises:
      InvalidPrivacyParameterError: ε not finite and > 0.
      InvalidRequestError: ``alpha`` outside (0, 1), ``max_count`` < 1, ``k`` < 1.
    """
    epsilon = check_epsilon(epsilon)
    if not isinstance(alpha, (float, int)) or not 0.0 < float(alpha) < 1.0:
        raise InvalidRequestError(f"alpha must lie in (0, 1), got {alpha!r}")
    d_in = quantile_d_in(k)
    cands = quantile_candidates(max_count)
    scale = _quantile_scale(cands, float(alpha), epsilon, d_in)
    meas = _quantile_meas(cands, float(alpha), scale)
    if meas.map(d_in) > epsilon * (1 + 1e-9):
        raise AssertionError("OpenDP quantile map exceeds the requested epsilon")
    data = np.asarray(key_totals, dtype=np.float64).ravel().tolist()
    return float(meas(data))


def _entropy_term(counts: np.ndarray) -> float:
    c = counts[counts > 0].astype(np.float64)
    return float(np.sum(c * np.log(c)))


def mi_score(keys: Sequence[Any], labels: Any) -> float:
    """``n · I(X; L)`` in nats, from the empirical joint distribution of keys and labels."""
    lab = np.asarray(labels)
    if len(keys) != lab.shape[0]:
        raise InvalidRequestError("one label per key")
    n = len(keys)
    if n == 0:
        return 0.0
    codes: dict[bytes, int] = {}
    x = np.fromiter((codes.setdefault(encode_key(k), len(codes)) for k in keys),
                    dtype=np.int64, count=n)
    _, l = np.unique(lab, return_inverse=True)
    joint = np.bincount(x * (l.max() + 1) + l, minlength=(x.max() + 1) * (l.max() + 1))
    return (float(n * np.log(n)) - _entropy_term(np.bincount(l)) - _entropy_term(np.bincount(x))
            + _entropy_term(joint))


def mi_score_sensitivity(max_records: int) -> float:
    """Bound on the change of :func:`mi_score` when one of ≤ ``max_records`` observations is
    added or removed: ``ln(max_records + 1) + 2`` (derivation in the module docstring)."""
    return float(np.log(_check_int("max_records", max_records, 1) + 1) + 2.0)


@functools.lru_cache(maxsize=64)
def _top_k_meas(n: int, k: int, scale: float):
    dp = _dp()
    return dp.m.make_noisy_top_k(dp.vector_domain(dp.atom_domain(T=float, nan=False), size=n),
                                 dp.linf_distance(T=float), dp.max_divergence(), k=k, scale=scale)


@functools.lru_cache(maxsize=64)
def top_k_scale(n: int, k: int, sensitivity: float, epsilon: float) -> float:
    """The noise scale OpenDP's noisy top-k needs for ``k`` of ``n`` scores of L∞
    ``sensitivity`` at ``epsilon`` (its own privacy map, searched once per arguments)."""
    dp = _dp()
    return dp.binary_search_param(lambda sc: _top_k_meas(n, k, sc), d_in=sensitivity,
                                  d_out=epsilon, T=float)


def private_top_k(scores: Sequence[float], k: int, sensitivity: float, epsilon: float) -> list[int]:
    """Indices of ``k`` high scores, ε-DP for scores of L∞ ``sensitivity`` (OpenDP noisy top-k)."""
    epsilon = check_epsilon(epsilon)
    sensitivity = check_epsilon(sensitivity, "sensitivity")
    s = np.asarray(scores, dtype=np.float64)
    k = _check_int("k", k, 1)
    if s.ndim != 1 or not np.all(np.isfinite(s)) or k > s.size:
        raise InvalidRequestError(f"need a finite score vector with at least k={k} entries")
    meas = _top_k_meas(s.size, k, top_k_scale(s.size, k, sensitivity, epsilon))
    if meas.map(sensitivity) > epsilon * (1 + 1e-9):
        raise AssertionError("OpenDP top-k map exceeds the requested epsilon")
    return [int(i) for i in meas(s.tolist())]
