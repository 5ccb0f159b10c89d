"""PyramidSnapshot: the featurization of a Pyramid store (sum of its live windows) as an artifact.

The snapshot is what application servers cache (Pyramid §IV); PyramidTransform reads it. With a
tree spec (``aggregation="tree"``) the sum is read from the complete dyadic nodes covering the
live windows (at most ``2 levels + 1``), never from a partial node.
"""
from __future__ import annotations

import json
from typing import Optional

from tfx import types
from tfx.dsl.components.base import base_component, executor_spec

from sage_tfx.components.pyramid_artifacts import PyramidFeaturization
from sage_tfx.components.pyramid_snapshot import executor, spec as s
from sage_tfx.pyramid import CountSpec


class PyramidSnapshot(base_component.BaseComponent):
    """Outputs ``featurization`` (PyramidFeaturization)."""

    SPEC_CLASS = s.PyramidSnapshotSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, *, store_dir: str, spec: CountSpec, retention: int,
                 window_table: Optional[types.BaseChannel] = None, max_variance: float = 0.01):
        if not isinstance(spec, CountSpec):
            raise ValueError("spec must be a sage_tfx.pyramid.CountSpec")
        if not float(max_variance) > 0:
            raise ValueError(f"max_variance must be > 0, got {max_variance!r}")
        super().__init__(spec=s.PyramidSnapshotSpec(
            window_table=window_table, store_dir=store_dir,
            spec_json=json.dumps(spec.to_json(), sort_keys=True), retention=retention,
            max_variance=float(max_variance),
            featurization=types.Channel(type=PyramidFeaturization)))
