"""PyramidTransform executor: every split of the input Examples, count-featurized with Beam.

Each output tf.Example holds the snapshot's count features (float, named by
``Featurization.feature_names()``: ``<group>__p<label>`` and ``<group>__logn``) and the label
(int64), written in the standard Examples layout (``Split-<name>/*.gz``) so the stock Trainer
reads them. The featurization runs in Python inside Beam (BLAKE2b-hashed sketches), not inside
the TF graph: a served model takes count features, which the serving side computes from the same
snapshot (the paper's featurization service, §IV / App. B).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

import apache_beam as beam
import pandas as pd
from tfx import types
from tfx.dsl.components.base import base_beam_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils

from sage_tfx.components import pyramid_artifacts as pa
from sage_tfx.components.pyramid_counts.executor import example_values
from sage_tfx.components.pyramid_transform import spec as s


class _Featurize(beam.DoFn):
    def __init__(self, path: str):
        self._path = path
        self._feat = None

    def setup(self):
        from sage_tfx.pyramid import Featurization
        self._feat = Featurization.load(self._path)

    def process(self, batch: List[bytes]):
        import tensorflow as tf
        spec = self._feat.spec
        cols = list(spec.features) + [spec.label]
        frame = pd.DataFrame([example_values(r, cols) for r in batch], columns=cols)
        x = self._feat.featurize(frame)
        names = self._feat.feature_names()
        for row, label in zip(x, frame[spec.label].tolist()):
            ex = tf.train.Example()
            for name, v in zip(names, row):
                ex.features.feature[name].float_list.value.append(float(v))
            ex.features.feature[spec.label].int64_list.value.append(int(label))
            yield ex.SerializeToString()


class Executor(base_beam_executor.BaseBeamExecutor):

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]], exec_properties: Dict[str, Any]) -> None:
        from sage_tfx.components.block_example_gen.executor import read_gzip_tfrecords
        examples = artifact_utils.get_single_instance(input_dict[s.EXAMPLES_KEY])
        feat = artifact_utils.get_single_instance(input_dict[s.FEATURIZATION_KEY])
        out = artifact_utils.get_single_instance(output_dict[s.TRANSFORMED_EXAMPLES_KEY])
        path = os.path.join(feat.uri, pa.FEATURIZATION_FILE)
        splits = artifact_utils.decode_split_names(examples.split_names)
        batch = int(exec_properties.get(s.BATCH_SIZE_KEY) or 512)
        with self._make_beam_pipeline() as p:
            for split in splits:
                files = sorted(fileio.glob(os.path.join(
                    artifact_utils.get_split_uri([examples], split), "*")))
                _ = (p | f"Files[{split}]" >> beam.Create(files)
                     | f"Read[{split}]" >> beam.FlatMap(read_gzip_tfrecords)
                     | f"Batch[{split}]" >> beam.BatchElements(min_batch_size=batch,
                                                               max_batch_size=batch)
                     | f"Featurize[{split}]" >> beam.ParDo(_Featurize(path))
                     | f"Write[{split}]" >> beam.io.WriteToTFRecord(
                         os.path.join(out.uri, f"Split-{split}", "data_tfrecord"),
                         file_name_suffix=".gz"))
        out.split_names = artifact_utils.encode_split_names(splits)
        out.set_string_custom_property("featurization_windows", feat.windows or "")
        out.set_string_custom_property("payload_format", "FORMAT_TF_EXAMPLE")
