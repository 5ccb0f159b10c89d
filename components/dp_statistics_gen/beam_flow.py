"""The exact aggregates of every split, computed by Beam (noise is drawn once, afterwards).

Each split's gzip TFRecords of tf.Example are parsed into the declared features' values (a
value of another kind than declared counts as absent: never an error, since an error that
depends on the data would itself release information), batched, aggregated by
``StatisticsConfig.aggregate`` (additive) and combined globally; the exact totals are written to
a scratch file for the executor, which adds the noise (``feature_statistics_release.release``).
Nothing exact leaves the executor.
"""
from __future__ import annotations

import os
import pickle
from typing import Mapping, Sequence

import apache_beam as beam

from sage_tfx.dp import feature_statistics_release as release_lib
from sage_tfx.dp.feature_statistics import NumericFeature, StatisticsConfig

_NUMERIC_KINDS = ("float_list", "int64_list")
_CATEGORICAL_KINDS = ("bytes_list",)


def parse_example(record: bytes, kinds: Sequence[tuple[str, tuple[str, ...]]]) -> dict:
    """{feature: values} of a serialized tf.Example, for the declared features only; a feature
    absent or of another kind than declared has no values."""
    from tensorflow.core.example import example_pb2
    example = example_pb2.Example.FromString(record)
    out = {}
    for name, accepted in kinds:
        feature = example.features.feature.get(name)
        kind = feature.WhichOneof("kind") if feature is not None else None
        if kind in accepted:
            out[name] = list(getattr(feature, kind).value)
    return out


def feature_kinds(config: StatisticsConfig) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The tf.Example value kinds each declared feature accepts."""
    return tuple((f.name, _NUMERIC_KINDS if isinstance(f, NumericFeature) else _CATEGORICAL_KINDS)
                 for f in config.features)


class _MergeFn(beam.CombineFn):
    """Sums (totals, vocabularies) of disjoint batches (release_lib.merge)."""

    def create_accumulator(self):
        return ({}, {})

    def add_input(self, accumulator, element):
        return release_lib.merge([accumulator, element])

    def merge_accumulators(self, accumulators):
        return release_lib.merge(accumulators)

    def extract_output(self, accumulator):
        return accumulator


def _save(value, path: str) -> None:
    with open(path, "wb") as f:
        pickle.dump(value, f)


def aggregate_splits(pipeline_factory, config: StatisticsConfig,
                     files: Mapping[str, Sequence[str]], scratch: str) -> dict:
    """Runs one Beam pipeline over every split; returns {split: (totals, vocabularies)}.

    Args:
      pipeline_factory: the executor's ``_make_beam_pipeline`` (its Beam options).
      config: the declared features.
      files: each split's data files.
      scratch: a local directory for the exact totals (removed by the caller).
    """
    kinds = feature_kinds(config)
    paths = {split: os.path.join(scratch, f"{i}.pkl") for i, split in enumerate(files)}
    with pipeline_factory() as p:
        for split, split_files in files.items():
            _ = (p
                 | f"Files[{split}]" >> beam.Create(list(split_files))
                 | f"Read[{split}]" >> beam.io.ReadAllFromTFRecord(
                     compression_type=beam.io.filesystem.CompressionTypes.GZIP)
                 | f"Parse[{split}]" >> beam.Map(parse_example, kinds)
                 | f"Batch[{split}]" >> beam.BatchElements(min_batch_size=64,
                                                          max_batch_size=4096)
                 | f"Aggregate[{split}]" >> beam.Map(config.aggregate)
                 | f"Combine[{split}]" >> beam.CombineGlobally(_MergeFn())
                 | f"Save[{split}]" >> beam.Map(_save, paths[split]))
    out = {}
    for split, path in paths.items():
        with open(path, "rb") as f:
            out[split] = pickle.load(f)
    return out
