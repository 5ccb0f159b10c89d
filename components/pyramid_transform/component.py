"""PyramidTransform: maps Examples to count features inside the TF graph (a Transform-style step).
"""
from __future__ import annotations

import json
from typing import Mapping, Optional

from tfx import types
from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import standard_artifacts

from sage_tfx.components.pyramid_transform import executor, spec as s


class PyramidTransform(base_beam_component.BaseBeamComponent):
    """Outputs ``transform_graph`` (the snapshot's featurizer, a SavedModel mapping serialized raw
    tf.Examples to count features) and ``transformed_examples`` (count features + label, computed
    by that same graph). ``feature_kinds`` (``{feature: "int64" | "bytes"}``) is read off the first
    example when not given."""

    SPEC_CLASS = s.PyramidTransformSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, *, examples: types.BaseChannel, featurization: types.BaseChannel,
                 batch_size: int = 512, feature_kinds: Optional[Mapping[str, str]] = None):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if feature_kinds is not None and not all(
                v in ("int64", "bytes") for v in dict(feature_kinds).values()):
            raise ValueError(f"feature_kinds values must be 'int64' or 'bytes': {feature_kinds!r}")
        super().__init__(spec=s.PyramidTransformSpec(
            examples=examples, featurization=featurization, batch_size=batch_size,
            feature_kinds=None if feature_kinds is None else json.dumps(dict(feature_kinds)),
            transformed_examples=types.Channel(type=standard_artifacts.Examples),
            transform_graph=types.Channel(type=standard_artifacts.TransformGraph)))
