"""DPTransform's transformed_examples: the released transform graph applied to the examples.

The release of a DPTransform run is its ``transform_graph``: tf.Transform bakes every analyzer
output (the noisy DP statistics) into that SavedModel as constants, so the graph *is* the
release. ``transformed_examples`` are not a release of their own — each is the released graph
applied to one granted record — so they are never recorded in the ledger (they hold per-record
data). They are always computed here, from the graph as released (recorded or replayed), by a
transform-only Beam pass (``tft_beam.TransformDataset`` over ``ReadTransformFn``: no analyzer
runs, no noise is drawn), written with the stock Transform's encoder and layout
(``Split-<name>/transformed_examples-*.gz``), each tf.Example serialized deterministically. The
first run and every replay thus write the same records from the same graph (byte for byte on a
runner that keeps the input order, such as the DirectRunner).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List

import apache_beam as beam
import tensorflow_transform.beam as tft_beam
from tfx import types
from tfx.components.transform import executor as transform_executor
from tfx.components.transform import executor_utils
from tfx.components.transform import labels as transform_labels
from tfx.components.util import examples_utils, tfxio_utils
from tfx.dsl.io import fileio
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import io_utils

from sage_tfx.components.dp_transform import spec


def transformed_output_paths(input_dict: Dict[str, List[types.Artifact]],
                             output_dict: Dict[str, List[types.Artifact]],
                             exec_properties: Dict[str, Any]) -> tuple[list, list, list]:
    """(data file patterns, their file formats, output path prefixes) of the transform splits,
    as the stock Transform resolves them; sets the outputs' ``split_names``."""
    examples = input_dict[spec.EXAMPLES_KEY]
    executor_utils.MatchNumberOfTransformedExamplesArtifacts(input_dict, output_dict)
    splits_config = executor_utils.ResolveSplitsConfig(
        exec_properties.get(standard_component_specs.SPLITS_CONFIG_KEY), examples)
    formats = [examples_utils.get_file_format(a) for a in examples]
    patterns, pattern_formats = [], []
    for split in splits_config.transform:
        for uri, file_format in zip(artifact_utils.get_split_uris(examples, split), formats):
            patterns.append(io_utils.all_files_pattern(uri))
            pattern_formats.append(file_format)
    transformed = output_dict[spec.TRANSFORMED_EXAMPLES_KEY]
    executor_utils.SetSplitNames(splits_config.transform, transformed)
    return patterns, pattern_formats, executor_utils.GetSplitPaths(transformed)


def canonical_example(serialized: bytes) -> bytes:
    """A tf.Example re-serialized deterministically (features in key order): the encoder's
    column order varies between runs, and the same records should give the same bytes."""
    from tensorflow.core.example import example_pb2
    return example_pb2.Example.FromString(serialized).SerializeToString(deterministic=True)


def transform_examples(graph_uri: str, input_dict: Dict[str, List[types.Artifact]],
                       output_dict: Dict[str, List[types.Artifact]],
                       exec_properties: Dict[str, Any],
                       make_beam_pipeline: Callable[[], Any]) -> None:
    """Writes ``transformed_examples`` by applying the transform graph at ``graph_uri``.

    Args:
      graph_uri: a transform_graph directory (``transform_fn/``, ``transformed_metadata/``).
      input_dict, output_dict, exec_properties: the DPTransform executor's.
      make_beam_pipeline: the executor's Beam pipeline factory (its beam_pipeline_args).
    """
    examples = input_dict[spec.EXAMPLES_KEY]
    patterns, formats, out_paths = transformed_output_paths(input_dict, output_dict,
                                                            exec_properties)
    for artifact in output_dict[spec.TRANSFORMED_EXAMPLES_KEY]:
        if fileio.exists(artifact.uri):  # a retry into the same uri: no stale shards
            io_utils.delete_dir(artifact.uri)
        fileio.makedirs(artifact.uri)
    payload_format, data_view_uri = tfxio_utils.resolve_payload_format_and_data_view_uri(
        examples)
    schema_file = io_utils.get_only_uri_in_dir(
        artifact_utils.get_single_uri(input_dict[spec.SCHEMA_KEY]))
    processor = transform_executor.TransformProcessor()
    metadata = processor._ReadMetadata(payload_format, schema_file)  # pylint: disable=protected-access
    datasets = processor._MakeDatasetList(  # pylint: disable=protected-access
        patterns, formats, payload_format, data_view_uri, False,
        materialize_output_paths=out_paths)
    for dataset in datasets:
        dataset.tfxio = processor._CreateTFXIO(dataset, metadata.schema)  # pylint: disable=protected-access
    file_format = formats[-1]  # as the stock Transform: the last input format
    force_tf_compat_v1 = bool(exec_properties.get(spec.FORCE_TF_COMPAT_V1_KEY, 0))
    temp_dir = os.path.join(output_dict[spec.TRANSFORMED_EXAMPLES_KEY][0].uri, ".temp_path")
    with make_beam_pipeline() as pipeline:
        with tft_beam.Context(temp_dir=temp_dir, force_tf_compat_v1=force_tf_compat_v1):
            transform_fn = pipeline | "ReadTransformFn" >> tft_beam.ReadTransformFn(graph_uri)
            _, transformed_metadata = transform_fn
            for dataset in datasets:
                infix = f"TransformIndex{dataset.index}"
                raw = pipeline | f"Read[{infix}]" >> dataset.tfxio.BeamSource()
                transformed, _ = (
                    ((raw, dataset.tfxio.TensorAdapterConfig()), transform_fn)
                    | f"Transform[{infix}]" >> tft_beam.TransformDataset(
                        output_record_batches=True))
                if file_format == transform_labels.FORMAT_TFRECORD:
                    _ = (transformed
                         | f"Encode[{infix}]" >> beam.ParDo(
                             processor._RecordBatchToExamplesFn(transformed_metadata.schema))  # pylint: disable=protected-access
                         | f"Values[{infix}]" >> beam.Values()
                         | f"Canonical[{infix}]" >> beam.Map(canonical_example)
                         | f"Write[{infix}]" >> beam.io.WriteToTFRecord(
                             dataset.materialize_output_path, file_name_suffix=".gz"))
                else:
                    _ = (transformed
                         | f"EncodeAndWrite[{infix}]" >> processor._EncodeAndWrite(  # pylint: disable=protected-access
                             schema=transformed_metadata.schema, file_format=file_format,
                             output_path=dataset.materialize_output_path))
    io_utils.delete_dir(temp_dir)
