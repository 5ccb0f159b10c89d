"""PyramidCountTable: seal one window of DP count tables from the blocks a SageGate granted.

Example::

    spec = CountSpec(groups=("tailnum", "dest"), label="late", width=2**16, epsilon=1.0)
    gate = SageGate(ledger_url=url, stream="flights", blocks=window_blocks, epsilon=spec.epsilon,
                    run_id=pyramid_run_id("flights", spec, window=3))
    counts = PyramidCountTable(grant=gate.outputs["grant"], ledger_url=url, store_dir=store,
                               spec=spec, window=3, retention=12)

``CountSpec(..., aggregation="tree", levels=4)`` (levels = ⌈log2 retention⌉) seals the window
into dyadic tree nodes instead (same gate cost); :class:`PyramidSnapshot` then reads the live
windows from at most ``2 levels + 1`` complete nodes.
"""
from __future__ import annotations

import json

from tfx import types
from tfx.dsl.components.base import base_beam_component, executor_spec

from sage_tfx.components.pyramid_artifacts import PyramidWindowTable
from sage_tfx.components.pyramid_counts import executor, spec as s
from sage_tfx.pyramid import CountSpec


class PyramidCountTable(base_beam_component.BaseBeamComponent):
    """Outputs ``window_table`` (PyramidWindowTable); the store directory keeps the sealed tables.
    """

    SPEC_CLASS = s.PyramidCountTableSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, *, grant: types.BaseChannel, ledger_url: str, store_dir: str,
                 spec: CountSpec, window: int, retention: int):
        if not isinstance(spec, CountSpec):
            raise ValueError("spec must be a sage_tfx.pyramid.CountSpec")
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"window must be an int >= 0, got {window!r}")
        if isinstance(retention, bool) or not isinstance(retention, int) or retention < 1:
            raise ValueError(f"retention must be an int >= 1, got {retention!r}")
        super().__init__(spec=s.PyramidCountTableSpec(
            grant=grant, ledger_url=ledger_url, store_dir=store_dir,
            spec_json=json.dumps(spec.to_json(), sort_keys=True), window=window,
            retention=retention,
            window_table=types.Channel(type=PyramidWindowTable)))
