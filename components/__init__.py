"""TFX components of sage-tfx.

``SageGate`` asks the block ledger for a run's blocks and writes the decision as a ``SageGrant``;
``BlockExampleGen`` reads exactly the granted blocks into ``Examples``; the DP trainers, transforms
and validator of each system follow. Every component folder exports its component class here
(``tests/components/test_exports.py`` checks it). Importing this package is cheap: the names below
import TFX (~30 s, TensorFlow included) only when first used.
"""
from sage_tfx._lazy import lazy_exports

_LAZY = {
    "SageGate": "sage_tfx.components.gate.component",
    "BlockExampleGen": "sage_tfx.components.block_example_gen.component",
    "SageGrant": "sage_tfx.components.artifacts",
    "DPModelValidator": "sage_tfx.components.dp_validator.component",
    "DPStatisticsGen": "sage_tfx.components.dp_statistics_gen.component",
    "DPTrainer": "sage_tfx.components.dp_trainer.component",
    "DPTransform": "sage_tfx.components.dp_transform.component",
    "PTKTrainer": "sage_tfx.components.ptk_trainer.component",
    "PTKFeaturizer": "sage_tfx.components.ptk_featurizer.component",
    "PTKState": "sage_tfx.components.ptk_trainer.spec",
    "DnDTrainer": "sage_tfx.components.dnd_trainer.component",
    "DnDExporter": "sage_tfx.components.dnd_exporter.component",
    "DPBaggingTrainer": "sage_tfx.components.dp_bagging_trainer.component",
    "PyramidCountTable": "sage_tfx.components.pyramid_counts.component",
    "PyramidSnapshot": "sage_tfx.components.pyramid_snapshot.component",
    "PyramidTransform": "sage_tfx.components.pyramid_transform.component",
    "PyramidWindowTable": "sage_tfx.components.pyramid_artifacts",
    "PyramidFeaturization": "sage_tfx.components.pyramid_artifacts",
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
