"""DPStatisticsGen: StatisticsGen with DP statistics (TFDV protos) under a Sage privacy plan.

``DPStatisticsGen`` (component), ``statistics_part`` (the plan part it spends) and the declared
features (``NumericFeature``, ``CategoricalFeature``). Importing this package is cheap: names
load TFX on first use.
"""
from sage_tfx._lazy import lazy_exports

_LAZY = {
    "DPStatisticsGen": "sage_tfx.components.dp_statistics_gen.component",
    "statistics_part": "sage_tfx.components.dp_statistics_gen.privacy",
    "NumericFeature": "sage_tfx.dp.feature_statistics",
    "CategoricalFeature": "sage_tfx.dp.feature_statistics",
    "StatisticsConfig": "sage_tfx.dp.feature_statistics",
}

__all__, __getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
