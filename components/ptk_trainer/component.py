"""PTKTrainer: trains a registered PTK on the blocks a SageGate granted (PTK paper §5.4).

Example::

    gate = SageGate(ledger_url=URL, stream="events", window_last=2, epsilon=eps_i)
    example_gen = BlockExampleGen(grant=gate.outputs["grant"], ledger_url=URL)
    trainer = PTKTrainer(examples=example_gen.outputs["examples"], grant=gate.outputs["grant"],
                         ledger_url=URL, ptk_id=ptk_id, window_index=7)
    featurizer = PTKFeaturizer(examples=..., ptk_state=trainer.outputs["ptk_state"],
                               ledger_url=URL)

``eps_i`` is the PTK's allocation from the store's plan; the trainer refuses a grant whose
(ε, δ) is not exactly the PTK type's declared charge.
"""
from __future__ import annotations

from tfx import types
from tfx.dsl.components.base import base_component, executor_spec

from sage_tfx.components.ptk_trainer import executor, spec
from sage_tfx.components.ptk_trainer.spec import PTKState


class PTKTrainer(base_component.BaseComponent):
    """Outputs ``ptk_state`` (a :class:`PTKState`: the lake version and its lineage)."""

    SPEC_CLASS = spec.PTKTrainerSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, *, examples: types.BaseChannel, grant: types.BaseChannel,
                 ledger_url: str, ptk_id: str, window_index: int):
        if not isinstance(window_index, int) or window_index < 0:
            raise ValueError(f"window_index must be a non-negative int, got {window_index!r}")
        super().__init__(spec=spec.PTKTrainerSpec(
            examples=examples, grant=grant, ledger_url=ledger_url, ptk_id=ptk_id,
            window_index=window_index,
            ptk_state=types.Channel(type=PTKState)))
