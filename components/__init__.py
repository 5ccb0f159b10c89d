"""TFX components of sage-tfx.

``SageGate`` asks the block ledger for a run's blocks and writes the decision as a ``SageGrant``;
``BlockExampleGen`` reads exactly the granted blocks into ``Examples``. Importing this package is
cheap: the names below import TFX (~30 s, TensorFlow included) only when first used.
"""
import importlib
from typing import Any

_LAZY = {
    "SageGate": "sage_tfx.components.gate.component",
    "BlockExampleGen": "sage_tfx.components.block_example_gen.component",
    "SageGrant": "sage_tfx.components.artifacts",
    "DPModelValidator": "sage_tfx.components.dp_validator.component",
    "DPTrainer": "sage_tfx.components.dp_trainer.component",
    "DPTransform": "sage_tfx.components.dp_transform.component",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
