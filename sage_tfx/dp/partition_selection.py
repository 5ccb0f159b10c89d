"""DP partition selection: which keys of an unknown domain may be released, with noisy counts.

A vocabulary (or a statistic's "top values") over a private column has no public key domain:
releasing the keys that occur is itself a release. Desfontaines, Voss, Gipson and Mandayam
("Differentially private partition selection", PoPETs 2022) release a key only if a noisy count of
the records holding it passes a threshold calibrated to (ε, δ); Google's Privacy on Beam
(``SelectPartitions``) and PipelineDP (``LAPLACE_THRESHOLDING``) implement it. Here:

1. **Contribution bounding.** Each record contributes to at most ``max_partitions_contributed``
   (m) distinct keys, each counted once (:func:`bound_contributions`: a uniform sample of the
   record's distinct keys when it holds more; the sample uses the OS's entropy, and the bound holds
   for any choice). The count of a key is thus the number of records that hold it: adding or
   removing one record changes at most m counts, each by at most 1.
2. **Laplace thresholding.** Every key's count gets Laplace noise of scale ``m / ε`` (L1
   sensitivity m) and a key is released, with its noisy count, iff the noisy count is ≥ the
   threshold τ. Keys present in both neighbours: ε-DP (Laplace). A key held by one record only (in
   one neighbour, absent from the other) is released with probability
   ``P[1 + Lap(m/ε) ≥ τ] = ½·exp(−(τ − 1)·ε/m)``; for the record's m keys at most
   ``1 − (1 − δ₁)^m``. τ is the smallest threshold with that ≤ δ:
   ``τ = 1 − (m/ε)·ln(2·δ₁)``, ``δ₁ = 1 − (1 − δ)^{1/m}`` (the threshold of Google's
   ``LaplacePartitionSelection``). The whole release is (ε, δ)-DP under add-or-remove-one-record.
   OpenDP's map is slightly more conservative than this closed form (it rounds τ onto its noise
   grid): the τ that runs is at most ~1e-8 (relative) above it.

The release runs OpenDP's ``make_laplace_threshold`` (Rogers 2023's analysis; OpenDP's float
Laplace sampler, safe from the floating-point attack) on the map of exact counts, and OpenDP's own
privacy map of that measurement at ``d_in = (m, m, 1)`` must be ≤ (ε, δ): the closed-form τ is
raised by the ulps OpenDP's map needs, never lowered (:func:`threshold`).

Why the float measurement, not OpenDP's integer one: on integer counts OpenDP 0.16.0's
``make_laplace_threshold`` keeps a key iff ``count + Z ≥ τ`` but its privacy map reports
``δ = P[Z ≥ τ]`` for a key of count 1, one step short of ``P[Z ≥ τ − 1]`` (measured:
scale 1, τ = 2 releases a count-1 key with probability 0.269 while the map says δ = 0.099; see
``tests/dp/test_partition_selection.py``). The float measurement's map agrees with the closed
form above and with the measured release probability.

Privacy assumptions: add-or-remove-one-record adjacency; each record holds any number of keys,
of which at most m are counted; the threshold, m and (ε, δ) are public. The noisy counts of the
released keys are part of the release (ordering by them is post-processing, as are ``top_k`` and
``frequency_threshold``, :func:`order_and_filter`). The spend has no dp_accounting event (the
thresholding step has no RDP curve there): it is charged as basic (ε, δ) only.

This module imports no TensorFlow.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import secrets
from collections import Counter
from typing import Any, Hashable, Iterable, Mapping, Optional, Sequence

import dp_accounting

from sage_tfx.dp.noise import NoiseSource, SeededNoise
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.ledger.accounting import check_delta, check_epsilon

__all__ = ["PartitionSelection", "bound_contributions", "bounded_counts", "check_max_partitions",
           "laplace_threshold_delta", "order_and_filter", "recall", "select_partitions",
           "threshold"]

_SYSTEM_RANDOM = secrets.SystemRandom()


def _dp():
    import opendp.prelude as dp
    dp.enable_features("contrib")
    return dp


def check_max_partitions(max_partitions_contributed: Any) -> int:
    """``max_partitions_contributed`` (m) as an int >= 1.

    Raises:
      InvalidPrivacyParameterError: not an integer >= 1 (m fixes the sensitivity: never guessed).
    """
    m = max_partitions_contributed
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise InvalidPrivacyParameterError(
            f"max_partitions_contributed must be an int >= 1, got {m!r}")
    return m


def _per_partition_delta(delta: float, m: int) -> float:
    """δ₁ with ``1 − (1 − δ₁)^m = δ`` (computed without cancellation)."""
    return -math.expm1(math.log1p(-delta) / m)


def laplace_threshold_delta(scale: float, tau: float, m: int) -> float:
    """δ of Laplace thresholding at ``scale`` and threshold ``tau`` for m keys per record: the
    probability that at least one of a record's m keys, each held by that record only, is
    released (``1 − (1 − ½·exp(−(τ − 1)/scale))^m``; ``τ ≥ 1``)."""
    if tau < 1.0:
        raise InvalidPrivacyParameterError(f"a threshold below 1 releases count-1 keys with "
                                           f"probability > 1/2, got {tau!r}")
    one = 0.5 * math.exp(-(tau - 1.0) / scale)
    return -math.expm1(m * math.log1p(-one))


@functools.lru_cache(maxsize=256)
def _measurement(scale: float, tau: float):
    dp = _dp()
    domain = dp.map_domain(dp.atom_domain(T=str), dp.atom_domain(T=float, nan=False))
    metric = dp.l01inf_distance(dp.absolute_distance(T=float))
    return dp.m.make_laplace_threshold(domain, metric, scale=scale, threshold=tau)


def _opendp_map(scale: float, tau: float, m: int) -> tuple[float, float]:
    eps, delta = _measurement(scale, tau).map((m, float(m), 1.0))
    return float(eps), float(delta)


@functools.lru_cache(maxsize=256)
def _calibrated(epsilon: float, delta: float, m: int) -> tuple[float, float]:
    delta_1 = _per_partition_delta(delta, m)
    if not delta_1 < 0.5:
        raise InvalidPrivacyParameterError(
            f"delta={delta!r} with max_partitions_contributed={m} allows each key a release "
            "probability >= 1/2: partition selection needs a small delta (e.g. 1e-6)")
    scale = m / epsilon
    tau = 1.0 - scale * math.log(2.0 * delta_1)
    # OpenDP rounds onto its noise grid and maps conservatively (its δ is piecewise constant in
    # τ, up to ~1e-8 relative above the closed form): raise scale, then τ, by a doubling
    # increment until its own map agrees; never lower them.
    scale_step, tau_step = math.ulp(scale), math.ulp(tau)
    while True:
        got_eps, got_delta = _opendp_map(scale, tau, m)
        if got_eps > epsilon:
            scale += scale_step
            scale_step *= 2
            tau = max(tau, 1.0 - scale * math.log(2.0 * delta_1))
        elif got_delta > delta:
            tau += tau_step
            tau_step *= 2
        else:
            return scale, tau


def threshold(epsilon: float, delta: float, max_partitions_contributed: int = 1
              ) -> tuple[float, float]:
    """``(scale, τ)`` of (ε, δ)-DP Laplace thresholding with m keys per record.

    ``scale = m/ε`` and ``τ = 1 − scale·ln(2·δ₁)`` (module doc), each raised by the few ulps needed
    for OpenDP's privacy map of the measurement that runs to be ≤ (ε, δ); never lowered.

    Raises:
      InvalidPrivacyParameterError: ε not finite and > 0, δ not in (0, 1), bad m, or a δ so large
        that a key held by one record would be released with probability ≥ 1/2.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=False)
    return _calibrated(epsilon, delta, check_max_partitions(max_partitions_contributed))


def bound_contributions(keys: Iterable[Hashable], max_partitions_contributed: int,
                        rng: Any = None) -> list:
    """The distinct keys one record contributes: all of them if at most m, else a uniform sample
    of m (``rng.sample``; default the OS's entropy). Order of first appearance is kept."""
    m = check_max_partitions(max_partitions_contributed)
    distinct = list(dict.fromkeys(keys))
    if len(distinct) <= m:
        return distinct
    chosen = set((rng or _SYSTEM_RANDOM).sample(range(len(distinct)), m))
    return [k for i, k in enumerate(distinct) if i in chosen]


def bounded_counts(records: Iterable[Iterable[Hashable]], max_partitions_contributed: int,
                   rng: Any = None) -> Counter:
    """Exact number of records holding each key, each record bounded to m distinct keys.

    Counts of disjoint batches add up (``Counter`` sums), so they can be combined anywhere before
    the one noisy release.
    """
    counts: Counter = Counter()
    for record in records:
        counts.update(bound_contributions(record, max_partitions_contributed, rng))
    return counts


@dataclasses.dataclass(frozen=True)
class PartitionSelection:
    """(ε, δ)-DP Laplace thresholding of key counts with m keys per record (module doc).

    Attributes:
      epsilon, delta: the guarantee, charged as basic (ε, δ).
      max_partitions_contributed: m, the most keys a record is counted for.
    """

    epsilon: float
    delta: float
    max_partitions_contributed: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        object.__setattr__(self, "delta", check_delta(self.delta, allow_zero=False))
        check_max_partitions(self.max_partitions_contributed)
        threshold(self.epsilon, self.delta, self.max_partitions_contributed)  # δ usable

    @property
    def scale(self) -> float:
        """Scale of the Laplace noise on every count (m/ε, OpenDP-calibrated)."""
        return threshold(self.epsilon, self.delta, self.max_partitions_contributed)[0]

    @property
    def threshold(self) -> float:
        """τ: a key is released iff its noisy count is ≥ τ."""
        return threshold(self.epsilon, self.delta, self.max_partitions_contributed)[1]

    def dp_event(self) -> dp_accounting.DpEvent:
        """No dp_accounting event describes the thresholding: ``UnsupportedDpEvent`` (an rdp
        ledger cannot compose it; a basic ledger charges (ε, δ))."""
        return dp_accounting.UnsupportedDpEvent()

    def release(self, counts: Mapping[Hashable, float],
                noise: Optional[NoiseSource] = None) -> dict:
        """The released keys and their noisy counts from the exact bounded counts.

        Args:
          counts: exact number of records per key (:func:`bounded_counts`), each count >= 0.
          noise: None (always, outside tests) runs OpenDP's ``make_laplace_threshold``; a
            :class:`~sage_tfx.dp.noise.SeededNoise` draws numpy Laplace noise and thresholds it
            the same way (reproducible experiments only).

        Returns:
          ``{key: noisy count}`` of the keys whose noisy count is >= :attr:`threshold`.

        Raises:
          ValueError: a negative, NaN or infinite count.
        """
        keys = list(counts)
        values = [float(counts[k]) for k in keys]
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise ValueError("counts must be finite and >= 0")
        if not keys:
            return {}
        scale, tau = self.scale, self.threshold
        if noise is None:
            out = _measurement(scale, tau)({str(i): v for i, v in enumerate(values)})
            return {keys[int(i)]: float(v) for i, v in out.items()}
        if not isinstance(noise, SeededNoise):
            raise TypeError("noise must be None (OpenDP) or a SeededNoise (tests only)")
        noisy = noise.laplace(values, scale)
        noisy = [float(v) for v in (noisy if len(values) > 1 else [noisy])]
        return {k: v for k, v in zip(keys, noisy) if v >= tau}


def select_partitions(counts: Mapping[Hashable, float], epsilon: float, delta: float,
                      max_partitions_contributed: int = 1, *,
                      noise: Optional[NoiseSource] = None) -> dict:
    """``PartitionSelection(ε, δ, m).release(counts, noise)``: the kept keys, noisy counts."""
    return PartitionSelection(epsilon, delta, max_partitions_contributed).release(counts, noise)


def order_and_filter(noisy_counts: Mapping[Any, float], *, top_k: Optional[int] = None,
                     frequency_threshold: Optional[float] = None) -> list[tuple[Any, float]]:
    """Released keys in tf.Transform's vocabulary order: decreasing (noisy) count, then reverse
    lexicographic key; only counts >= ``frequency_threshold``, at most ``top_k`` (post-processing
    of the release: free).

    Raises:
      ValueError: ``top_k`` not a positive int, ``frequency_threshold`` negative (tft's rules).
    """
    if top_k is not None and (isinstance(top_k, bool) or int(top_k) != top_k or top_k <= 0):
        raise ValueError(f"top_k must be positive, but got: {top_k!r}")
    if frequency_threshold is not None and not float(frequency_threshold) >= 0:
        raise ValueError(f"frequency_threshold must be non-negative, but got: "
                         f"{frequency_threshold!r}")
    items = sorted(noisy_counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    if frequency_threshold is not None:
        items = [kv for kv in items if kv[1] >= float(frequency_threshold)]
    return items[:int(top_k)] if top_k is not None else items


def recall(released: Sequence[Any], true_counts: Mapping[Any, float], k: int) -> float:
    """Share of the true top-``k`` keys (by exact count, ties broken as tft) that were released."""
    true_top = [key for key, _ in order_and_filter(true_counts, top_k=k)]
    if not true_top:
        raise ValueError("no keys to recall")
    kept = set(released)
    return sum(1 for key in true_top if key in kept) / len(true_top)
