"""DPTrainer: the TFX Trainer for the user's own Keras model, under a Sage privacy plan (Sage
§3.1, Tab. 1).

``DPTrainer`` (component) and what a module's ``model_fn`` returns: ``DPSGDSpec`` (a Keras model
trained with DP-SGD) or ``AdaSSPSpec`` (AdaSSP linear regression), with ``ModelFnArgs``. Importing
this package is cheap: names load TFX / TensorFlow on first use.
"""
from sage_tfx._lazy import lazy_exports

_LAZY = {
    "DPTrainer": "sage_tfx.components.dp_trainer.component",
    "DPSGDSpec": "sage_tfx.components.dp_trainer.model_fn",
    "AdaSSPSpec": "sage_tfx.components.dp_trainer.model_fn",
    "ModelFnArgs": "sage_tfx.components.dp_trainer.model_fn",
    "ArchitectureError": "sage_tfx.components.dp_trainer.architecture",
    "DPSGDRun": "sage_tfx.components.dp_trainer.guarantee",
    "GuaranteeMismatchError": "sage_tfx.components.dp_trainer.guarantee",
    "UnverifiedTrainingError": "sage_tfx.components.dp_trainer.guarantee",
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
