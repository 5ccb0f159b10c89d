"""DnDTrainer: Draw-and-Discard (Pihur et al.) over a granted window, exported as a SavedModel.

Importing this package is cheap: names load TFX / TensorFlow on first use.
"""
from sage_tfx._lazy import lazy_exports

_LAZY = {
    "DnDTrainer": "sage_tfx.components.dnd_trainer.component",
    "dnd_train_part": "sage_tfx.components.dnd_trainer.protocol",
    "FeatureSpec": "sage_tfx.components.dnd_trainer.protocol",
    "export_glm": "sage_tfx.components.dnd_trainer.export",
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
