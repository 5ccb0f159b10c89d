"""PyramidTransform executor: the snapshot as an in-graph featurizer, and Examples featurized by it.

1. ``transform_graph``: ``{uri}/pyramid_featurizer/`` is the SavedModel of
   :func:`sage_tfx.pyramid.graph.save_featurizer` — ``serving_default(examples: string[None])
   -> {"features": float32[None, F]}``, features named by ``Featurization.feature_names()``. A
   trained model wraps it (``pipelines/pyramid_module.py``) so that serving takes raw tf.Examples
   and needs nothing beside the model. The count spec must use the ``"tf_siphash"`` hash family.
2. ``transformed_examples``: every split, featurized with Beam by running that same SavedModel on
   batches of serialized records, so training sees exactly the features serving computes. Each
   output tf.Example holds the float count features and the label (int64), in the standard
   Examples layout (``Split-<name>/*.gz``) for the stock Trainer.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

import apache_beam as beam
from tfx import types
from tfx.dsl.components.base import base_beam_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils

from sage_tfx.components import pyramid_artifacts as pa
from sage_tfx.components.pyramid_counts.executor import example_values
from sage_tfx.components.pyramid_transform import spec as s

FEATURIZER_DIR = "pyramid_featurizer"


class _Featurize(beam.DoFn):
    def __init__(self, model_dir: str, names: List[str], label: str):
        self._dir, self._names, self._label = model_dir, names, label
        self._fn = None

    def setup(self):
        import tensorflow as tf
        self._fn = tf.saved_model.load(self._dir).signatures["serving_default"]

    def process(self, batch: List[bytes]):
        import tensorflow as tf
        from sage_tfx.pyramid.graph import FEATURES_OUTPUT
        x = self._fn(examples=tf.constant(batch))[FEATURES_OUTPUT].numpy()
        for record, row in zip(batch, x):
            ex = tf.train.Example()
            for name, v in zip(self._names, row):
                ex.features.feature[name].float_list.value.append(float(v))
            label = example_values(record, [self._label])[self._label]
            if label is not None:
                ex.features.feature[self._label].int64_list.value.append(int(label))
            yield ex.SerializeToString()


class Executor(base_beam_executor.BaseBeamExecutor):

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]], exec_properties: Dict[str, Any]) -> None:
        from sage_tfx.components.block_example_gen.executor import read_gzip_tfrecords
        from sage_tfx.pyramid import Featurization
        from sage_tfx.pyramid.graph import example_feature_kinds, save_featurizer
        examples = artifact_utils.get_single_instance(input_dict[s.EXAMPLES_KEY])
        feat_art = artifact_utils.get_single_instance(input_dict[s.FEATURIZATION_KEY])
        out = artifact_utils.get_single_instance(output_dict[s.TRANSFORMED_EXAMPLES_KEY])
        graph = artifact_utils.get_single_instance(output_dict[s.TRANSFORM_GRAPH_KEY])
        feat = Featurization.load(os.path.join(feat_art.uri, pa.FEATURIZATION_FILE))
        splits = artifact_utils.decode_split_names(examples.split_names)
        files = {split: sorted(fileio.glob(os.path.join(
            artifact_utils.get_split_uri([examples], split), "*"))) for split in splits}
        kinds = exec_properties.get(s.FEATURE_KINDS_KEY)
        if kinds:
            kinds = json.loads(kinds)
        else:    # the first examples that carry each counted feature give its type
            records = (r for split in splits for path in files[split]
                       for r in read_gzip_tfrecords(path))
            kinds = example_feature_kinds(records, feat.spec.features)
        model_dir = os.path.join(graph.uri, FEATURIZER_DIR)
        save_featurizer(feat, model_dir, kinds)     # refuses a spec a TF graph cannot hash
        batch = int(exec_properties.get(s.BATCH_SIZE_KEY) or 512)
        dofn = _Featurize(model_dir, feat.feature_names(), feat.spec.label)
        with self._make_beam_pipeline() as p:
            for split in splits:
                _ = (p | f"Files[{split}]" >> beam.Create(files[split])
                     | f"Read[{split}]" >> beam.FlatMap(read_gzip_tfrecords)
                     | f"Batch[{split}]" >> beam.BatchElements(min_batch_size=batch,
                                                               max_batch_size=batch)
                     | f"Featurize[{split}]" >> beam.ParDo(dofn)
                     | f"Write[{split}]" >> beam.io.WriteToTFRecord(
                         os.path.join(out.uri, f"Split-{split}", "data_tfrecord"),
                         file_name_suffix=".gz"))
        out.split_names = artifact_utils.encode_split_names(splits)
        out.set_string_custom_property("featurization_windows", json.dumps(list(feat.windows)))
        out.set_string_custom_property("payload_format", "FORMAT_TF_EXAMPLE")
        graph.set_string_custom_property("featurization_windows", json.dumps(list(feat.windows)))
        graph.set_string_custom_property("spec_digest", feat.spec.digest())
