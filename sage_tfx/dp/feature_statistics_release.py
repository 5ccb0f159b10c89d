"""The noisy release of :mod:`sage_tfx.dp.feature_statistics` and its post-processing.

:func:`release` draws each query's noise once (OpenDP's Laplace, at the scale of its share) and
selects the vocabularies; :func:`summarize` turns the noisy values into the quantities a TFDV
``FeatureNameStatistics`` holds (integers where TFDV stores integers), by post-processing only.
The rules are stated in :mod:`sage_tfx.dp.feature_statistics`. This module imports no TensorFlow.
"""
from __future__ import annotations

import collections
import dataclasses
import math
from typing import Mapping, Optional

import numpy as np

from sage_tfx.dp.feature_statistics import (NUM_EXAMPLES, RANK_HISTOGRAM_BUCKETS,
                                            CategoricalFeature, NumericFeature,
                                            StatisticsBudget, StatisticsConfig,
                                            VocabularyBudget)
from sage_tfx.dp.histograms import occupied_range, quantiles_from_counts
from sage_tfx.dp.mechanisms import noise_source
from sage_tfx.dp.noise import SECURE, NoiseSource
from sage_tfx.dp.partition_selection import PartitionSelection
from sage_tfx.errors import InvalidRequestError


@dataclasses.dataclass(frozen=True)
class NoisyStatistics:
    """A split's DP release: each query's noisy value, and each vocabulary's selected values
    with their noisy counts."""

    values: dict
    vocabularies: dict


@dataclasses.dataclass(frozen=True)
class CommonStatistics:
    """TFDV's ``CommonStatistics`` of one feature (post-processed DP values)."""

    num_non_missing: int
    num_missing: int
    min_num_values: int
    max_num_values: int
    avg_num_values: float
    tot_num_values: int
    num_values_quantiles: tuple[float, ...]  # boundaries of equal-mass buckets, or () if absent


@dataclasses.dataclass(frozen=True)
class NumericStatistics:
    """TFDV's ``NumericStatistics`` of one feature (post-processed DP values)."""

    mean: float
    std_dev: float
    num_zeros: int
    min: float
    median: float
    max: float
    bin_edges: tuple[float, ...]
    bin_counts: tuple[float, ...]
    quantiles: tuple[float, ...]  # boundaries of equal-mass buckets


@dataclasses.dataclass(frozen=True)
class CategoricalStatistics:
    """TFDV's ``StringStatistics`` of one feature: released values by decreasing noisy count."""

    values: tuple[tuple[bytes, float], ...]
    unique: int
    avg_length: float
    num_top_values: int


@dataclasses.dataclass(frozen=True)
class FeatureSummary:
    """One feature's DP statistics; ``numeric`` / ``categorical`` is None when absent."""

    feature: object
    common: CommonStatistics
    numeric: Optional[NumericStatistics] = None
    categorical: Optional[CategoricalStatistics] = None


@dataclasses.dataclass(frozen=True)
class SplitStatistics:
    """The DP statistics of one split, ready for a ``DatasetFeatureStatistics`` proto."""

    num_examples: int
    features: tuple[FeatureSummary, ...]


# ---------------------------------------------------------------------------------------------
# The release.


def select_vocabulary(counts: Mapping[bytes, int], budget: VocabularyBudget,
                      noise: NoiseSource | None = None) -> dict[bytes, float]:
    """Values of a categorical feature released by partition selection, with noisy counts.

    Laplace thresholding at the vocabulary's (ε, δ) with ``max_partitions_contributed`` =
    ``max_values`` (:class:`sage_tfx.dp.partition_selection.PartitionSelection`): each example
    counts once for each distinct value among its first ``max_values`` values
    (``StatisticsConfig.aggregate``), so one example moves at most ``max_values`` counts by 1.
    """
    selection = PartitionSelection(budget.epsilon, budget.delta, budget.max_values)
    return selection.release(counts, None if noise is SECURE else noise)


def release(config: StatisticsConfig, budget: StatisticsBudget,
            totals: Mapping[str, np.ndarray],
            vocabularies: Mapping[str, Mapping[bytes, int]] | None = None,
            noise: NoiseSource | None = None) -> NoisyStatistics:
    """Draws the noise of every query once and selects every vocabulary.

    Args:
      config: the declared features.
      budget: ``config.budget(ε, δ)``: the shares charged.
      totals: exact aggregates of the split (``config.aggregate``, summed over batches).
      vocabularies: per vocabulary feature, the exact number of examples per value.
      noise: the noise source; None (always, in components and pipelines) is OpenDP.

    Raises:
      InvalidRequestError: aggregates that do not match the configuration.
    """
    noise = noise_source(noise)
    vocabularies = vocabularies or {}
    values = {}
    for q in budget.queries:
        total = np.asarray(totals.get(q.key, np.zeros(q.cells)), dtype=np.float64)
        if total.shape != (q.cells,):
            raise InvalidRequestError(f"aggregate {q.key!r} has shape {total.shape}, expected "
                                      f"({q.cells},)")
        values[q.key] = np.asarray(q.mechanism.add_noise(total, noise), dtype=np.float64)
    selected = {v.feature: select_vocabulary(vocabularies.get(v.feature, {}), v, noise)
                for v in budget.vocabularies}
    return NoisyStatistics(values, selected)


# ---------------------------------------------------------------------------------------------
# Post-processing.


def _count(noisy: float, threshold: float) -> int:
    """A noisy count as TFDV's integer: 0 unless above the threshold, else rounded."""
    return int(round(noisy)) if noisy > threshold else 0


def _absent(num_examples: int) -> CommonStatistics:
    return CommonStatistics(0, num_examples, 0, 0, 0.0, 0, ())


def _common(cells: np.ndarray, threshold: float, num_examples: int,
            num_quantiles: int) -> CommonStatistics:
    present = [k for k in range(1, cells.size) if cells[k] > threshold]
    num_missing = min(_count(cells[0], threshold), num_examples)
    num_non_missing = num_examples - num_missing
    if not present or num_non_missing <= 0:
        return _absent(num_examples)
    lo, hi = present[0], present[-1]
    weights = np.maximum(cells[lo:hi + 1], 0.0)
    ks = np.arange(lo, hi + 1, dtype=np.float64)
    avg = float((weights * ks).sum() / weights.sum())  # weights[0] > threshold ≥ 0
    cumulative = np.cumsum(weights) / weights.sum()
    qs = np.linspace(0.0, 1.0, num_quantiles + 1)
    boundaries = tuple(float(ks[min(int(np.searchsorted(cumulative, q - 1e-12)), ks.size - 1)])
                       for q in qs)
    return CommonStatistics(num_non_missing, num_missing, lo, hi, avg,
                            int(round(avg * num_non_missing)), boundaries)


def _numeric(f: NumericFeature, noisy: Mapping[str, np.ndarray], budget: StatisticsBudget,
             common: CommonStatistics, num_quantiles: int) -> NumericStatistics:
    cells = noisy[f"{f.name}:values"]
    q = budget.query(f"{f.name}:values")
    edges = np.asarray(f.bin_edges)
    bins, zeros = cells[:-1], cells[-1]
    zero_at = float(np.clip(0.0, f.lower, f.upper))
    zero_bin = int(np.clip(np.searchsorted(edges, zero_at, side="right") - 1, 0, f.num_bins - 1))
    merged = np.maximum(bins, 0.0)
    merged[zero_bin] += max(zeros, 0.0)
    low, high = occupied_range(bins, edges, q.threshold)
    if zeros > q.threshold:  # the cell of exact zeros is a point at clip(0)
        occupied = bool(np.any(bins > q.threshold))
        low = min(low, zero_at) if occupied else zero_at
        high = max(high, zero_at) if occupied else zero_at
    quantiles = np.clip(quantiles_from_counts(merged, edges, np.linspace(0, 1, num_quantiles + 1)),
                        low, high)
    median = float(np.clip(quantiles_from_counts(merged, edges, [0.5])[0], low, high))
    n_values = max(common.tot_num_values, 1)
    midpoint, h = (f.lower + f.upper) / 2.0, f.half_range
    centered_mean = float(np.clip(noisy[f"{f.name}:sum"][0] / n_values, -h, h))
    variance = float(np.clip(noisy[f"{f.name}:squares"][0] / n_values - centered_mean ** 2,
                             0.0, h * h))
    return NumericStatistics(
        mean=midpoint + centered_mean, std_dev=math.sqrt(variance),
        num_zeros=min(_count(zeros, q.threshold), common.tot_num_values),
        min=float(low), median=median, max=float(high), bin_edges=tuple(float(e) for e in edges),
        bin_counts=tuple(float(c) for c in merged), quantiles=tuple(float(v) for v in quantiles))


def _categorical(f: CategoricalFeature, noisy: NoisyStatistics, budget: StatisticsBudget,
                 num_top_values: int) -> CategoricalStatistics:
    if f.domain is not None:
        q = budget.query(f"{f.name}:domain")
        counts = noisy.values[f"{f.name}:domain"]
        released = {v.encode("utf-8"): float(c) for v, c in zip(f.domain, counts)
                    if c > q.threshold}
    else:
        released = {bytes(v): float(c) for v, c in noisy.vocabularies[f.name].items() if c > 0}
    ordered = tuple(sorted(released.items(), key=lambda vc: (-vc[1], vc[0])))
    mass = sum(c for _, c in ordered)
    avg_length = sum(len(v) * c for v, c in ordered) / mass if mass > 0 else 0.0
    return CategoricalStatistics(ordered[:RANK_HISTOGRAM_BUCKETS], len(ordered), avg_length,
                                 num_top_values)


def summarize(config: StatisticsConfig, budget: StatisticsBudget,
              noisy: NoisyStatistics) -> SplitStatistics:
    """The post-processed statistics of a split (see :mod:`sage_tfx.dp.feature_statistics`)."""
    num_examples = max(0, int(round(noisy.values[NUM_EXAMPLES][0])))
    out = []
    for f in config.features:
        q = budget.query(f"{f.name}:valency")
        common = _common(noisy.values[q.key], q.threshold, num_examples, config.num_quantiles)
        numeric = categorical = None
        if common.num_non_missing > 0:
            if isinstance(f, NumericFeature):
                numeric = _numeric(f, noisy.values, budget, common, config.num_quantiles)
            else:
                categorical = _categorical(f, noisy, budget, config.num_top_values)
        out.append(FeatureSummary(f, common, numeric, categorical))
    return SplitStatistics(num_examples, tuple(out))


def merge(parts) -> tuple[dict, dict]:
    """Sums exact aggregates of disjoint batches: ``[(totals, vocabularies), ...]``."""
    totals: dict = {}
    vocab: dict = {}
    for t, v in parts:
        for key, value in t.items():
            totals[key] = totals[key] + value if key in totals else np.array(value, dtype=float)
        for name, counter in v.items():
            vocab.setdefault(name, collections.Counter()).update(counter)
    return totals, vocab
