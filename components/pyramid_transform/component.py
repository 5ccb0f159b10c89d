"""PyramidTransform: maps Examples to count-featurized Examples with a PyramidFeaturization."""
from __future__ import annotations

from tfx import types
from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import standard_artifacts

from sage_tfx.components.pyramid_transform import executor, spec as s


class PyramidTransform(base_beam_component.BaseBeamComponent):
    """Outputs ``transformed_examples`` (Examples of count features + label)."""

    SPEC_CLASS = s.PyramidTransformSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, *, examples: types.BaseChannel, featurization: types.BaseChannel,
                 batch_size: int = 512):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        super().__init__(spec=s.PyramidTransformSpec(
            examples=examples, featurization=featurization, batch_size=batch_size,
            transformed_examples=types.Channel(type=standard_artifacts.Examples)))
