"""DPBaggingTrainer: differentially private bagging as a TFX trainer (Jordon et al. 2019).

Importing this package is cheap: names load TFX / TensorFlow on first use.
"""
from sage_tfx._lazy import lazy_exports

_LAZY = {
    "DPBaggingTrainer": "sage_tfx.components.dp_bagging_trainer.component",
    "bagging_cost": "sage_tfx.components.dp_bagging_trainer.executor",
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
