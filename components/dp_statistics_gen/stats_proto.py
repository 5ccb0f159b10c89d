"""DP split statistics as TFDV's ``DatasetFeatureStatisticsList`` (what StatisticsGen writes).

One ``DatasetFeatureStatistics`` per split, one ``FeatureNameStatistics`` per declared feature
(path = its name; type INT / FLOAT from the declared dtype, STRING for categorical features),
filled from :class:`sage_tfx.dp.feature_statistics_release.SplitStatistics`: post-processed DP
values only. Fields TFDV would fill from the data but that no DP query releases (weighted
statistics, custom statistics, ``num_nan``-style counts) are left unset.
"""
from __future__ import annotations

from tensorflow_metadata.proto.v0 import statistics_pb2

from sage_tfx.dp.feature_statistics import INT, NumericFeature
from sage_tfx.dp.feature_statistics_release import (CommonStatistics, FeatureSummary,
                                                    SplitStatistics)

_FNS = statistics_pb2.FeatureNameStatistics
_HISTOGRAM = statistics_pb2.Histogram


def _quantile_buckets(histogram: statistics_pb2.Histogram, boundaries, total: float) -> None:
    """Equal-mass buckets between consecutive quantile boundaries (TFDV's QUANTILES layout)."""
    histogram.type = _HISTOGRAM.QUANTILES
    n = len(boundaries) - 1
    for low, high in zip(boundaries[:-1], boundaries[1:]):
        histogram.buckets.add(low_value=float(low), high_value=float(high),
                              sample_count=float(total) / n)


def _common(proto: statistics_pb2.CommonStatistics, common: CommonStatistics) -> None:
    proto.num_non_missing = common.num_non_missing
    proto.num_missing = common.num_missing
    proto.min_num_values = common.min_num_values
    proto.max_num_values = common.max_num_values
    proto.avg_num_values = common.avg_num_values
    proto.tot_num_values = common.tot_num_values
    if common.num_values_quantiles:
        _quantile_buckets(proto.num_values_histogram, common.num_values_quantiles,
                          common.num_non_missing)


def _feature(proto: statistics_pb2.FeatureNameStatistics, summary: FeatureSummary) -> None:
    feature = summary.feature
    proto.path.step.append(feature.name)
    if isinstance(feature, NumericFeature):
        proto.type = _FNS.INT if feature.dtype == INT else _FNS.FLOAT
        num = proto.num_stats
        _common(num.common_stats, summary.common)
        s = summary.numeric
        if s is None:
            return
        num.mean, num.std_dev, num.num_zeros = s.mean, s.std_dev, s.num_zeros
        num.min, num.median, num.max = s.min, s.median, s.max
        standard = num.histograms.add(type=_HISTOGRAM.STANDARD)
        for low, high, count in zip(s.bin_edges[:-1], s.bin_edges[1:], s.bin_counts):
            standard.buckets.add(low_value=low, high_value=high, sample_count=count)
        _quantile_buckets(num.histograms.add(), s.quantiles, summary.common.tot_num_values)
        return
    proto.type = _FNS.STRING
    string = proto.string_stats
    _common(string.common_stats, summary.common)
    s = summary.categorical
    if s is None:
        return
    string.unique = s.unique
    string.avg_length = s.avg_length
    for value, count in s.values[:s.num_top_values]:
        string.top_values.add(value=value.decode("utf-8", "replace"), frequency=count)
    for rank, (value, count) in enumerate(s.values):
        string.rank_histogram.buckets.add(low_rank=rank, high_rank=rank, sample_count=count,
                                          label=value.decode("utf-8", "replace"))


def to_proto(summary: SplitStatistics) -> statistics_pb2.DatasetFeatureStatisticsList:
    """The ``DatasetFeatureStatisticsList`` of one split (a single dataset, as StatisticsGen)."""
    out = statistics_pb2.DatasetFeatureStatisticsList()
    dataset = out.datasets.add(num_examples=summary.num_examples)
    for feature in summary.features:
        _feature(dataset.features.add(), feature)
    return out
