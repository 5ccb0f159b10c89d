"""DPTrainer: the TFX Trainer under a Sage privacy plan (Sage §3.1, Tab. 1).

``DPTrainer`` (component), ``report_guarantee`` (the last call of every run_fn) and the run_fn
helpers of ``run_fn_utils``. Importing this package is cheap: names load TFX / TensorFlow on first
use.
"""
import importlib
from typing import Any

_LAZY = {
    "DPTrainer": "sage_tfx.components.dp_trainer.component",
    "report_guarantee": "sage_tfx.components.dp_trainer.run_fn_utils",
    "train_part": "sage_tfx.components.dp_trainer.run_fn_utils",
    "dpsgd_noise_for": "sage_tfx.components.dp_trainer.run_fn_utils",
    "DPSGDRun": "sage_tfx.components.dp_trainer.guarantee",
    "GuaranteeMismatchError": "sage_tfx.components.dp_trainer.guarantee",
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
