"""DPStatisticsGen's check before charge (registered in ``components/preflight.py``)."""
from __future__ import annotations

from typing import Any, Mapping

from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.components.dp_statistics_gen import privacy, spec
from sage_tfx.dp.feature_statistics import StatisticsConfig


def check(exec_properties: Mapping[str, Any], plan: plan_lib.PrivacyPlan) -> None:
    """Refuses, before the gate charges, what the executor would refuse from its configuration
    and the plan: no such part, δ = 0 with a vocabulary to select, an rdp event that is not the
    statistics' own (``privacy.part_budget``).

    Raises:
      MissingGrantError, InvalidRequestError: the run would be refused.
    """
    config = StatisticsConfig.from_json(exec_properties.get(spec.FEATURES_JSON_KEY) or "")
    privacy.part_budget(plan, exec_properties.get(spec.PLAN_PART_KEY) or spec.DEFAULT_PLAN_PART,
                        config)
