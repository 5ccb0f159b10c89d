"""DPTrainer: the TFX Trainer under a Sage privacy plan (Sage §3.1, Tab. 1).

``DPTrainer`` (component), ``private_training`` (the executor's privacy loop a run_fn trains
with) and the run_fn helpers of ``run_fn_utils``. Importing this package is cheap: names load
TFX / TensorFlow on first use.
"""
from sage_tfx._lazy import lazy_exports

_LAZY = {
    "DPTrainer": "sage_tfx.components.dp_trainer.component",
    "private_training": "sage_tfx.components.dp_trainer.run_fn_utils",
    "PrivateTraining": "sage_tfx.components.dp_trainer.private",
    "report_guarantee": "sage_tfx.components.dp_trainer.run_fn_utils",
    "report_membership_inference": "sage_tfx.components.dp_trainer.run_fn_utils",
    "train_part": "sage_tfx.components.dp_trainer.run_fn_utils",
    "dpsgd_noise_for": "sage_tfx.components.dp_trainer.run_fn_utils",
    "DPSGDRun": "sage_tfx.components.dp_trainer.guarantee",
    "GuaranteeMismatchError": "sage_tfx.components.dp_trainer.guarantee",
    "UnverifiedTrainingError": "sage_tfx.components.dp_trainer.guarantee",
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
