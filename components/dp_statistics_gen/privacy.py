"""The plan part DPStatisticsGen spends: built by :func:`statistics_part`, read back by
:func:`part_budget` (which refuses a part that is not exactly what the statistics spend).

No TFX import here: ``statistics_part`` builds plans anywhere (a notebook, a plan module)."""
from __future__ import annotations

import math
from typing import Sequence, Union

from absl import logging

from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.dp.feature_statistics import Feature, StatisticsConfig
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError, MissingGrantError
from sage_tfx.ledger import accounting

DEFAULT_PLAN_PART = "statistics"
EPSILON_PARAM = "epsilon"  # rdp parts: the part's ε, stored in PlanPart.params


def _config(features: Union[StatisticsConfig, Sequence[Feature]]) -> StatisticsConfig:
    if isinstance(features, StatisticsConfig):
        return features
    return StatisticsConfig(tuple(features))


def statistics_part(features: Union[StatisticsConfig, Sequence[Feature]], epsilon: float,
                    delta: float = 0.0, *, rdp: bool = False,
                    name: str = DEFAULT_PLAN_PART) -> plan_lib.PlanPart:
    """The privacy plan part of a DPStatisticsGen over ``features`` at (ε, δ).

    Basic streams: ``PlanPart(name, ε, δ)`` (δ > 0 is needed, and spent, only by features
    without a public domain: their vocabulary is selected by partition selection). rdp streams:
    the exact DpEvent of one split's release (``StatisticsConfig.dp_event(ε)``; every categorical
    feature must declare its domain), with ε kept in the part's params.

    Raises:
      InvalidPrivacyParameterError, InvalidRequestError: a bad ε or δ, δ = 0 with a vocabulary
        to select, or an rdp part with δ or with a vocabulary.
    """
    config = _config(features)
    if rdp:
        if delta:
            raise InvalidPrivacyParameterError("an rdp statistics part is pure epsilon-DP (Laplace "
                                               f"only): delta must be 0, got {delta!r}")
        epsilon = accounting.check_epsilon(epsilon)
        return plan_lib.PlanPart(name, event=config.dp_event(epsilon),
                                 params=((EPSILON_PARAM, epsilon),))
    config.budget(epsilon, delta)  # checks ε, δ and δ > 0 for vocabularies
    return plan_lib.PlanPart(name, epsilon, delta)


def part_budget(plan: plan_lib.PrivacyPlan, name: str,
                config: StatisticsConfig) -> tuple[float, float]:
    """The (ε, δ) the statistics spend: exactly the plan part ``name``.

    Returns:
      (ε, δ) of the part; δ is what partition selection spends (0 without a vocabulary).

    Raises:
      MissingGrantError: no such part, an (ε, δ) the configuration cannot spend (δ = 0 with a
        vocabulary to select), or an rdp part whose event is not ``config.dp_event(ε)``.
    """
    part = plan.part(name)
    if part.event is None:
        epsilon, delta = part.epsilon, part.delta or 0.0
        if delta and not config.vocabulary_features:
            logging.warning("DPStatisticsGen: the plan's %s part charged delta=%s; with a public "
                            "domain for every categorical feature the statistics are "
                            "(epsilon, 0)-DP and spend none of it", name, delta)
            delta = 0.0
        try:
            config.budget(epsilon, delta)
        except (InvalidPrivacyParameterError, InvalidRequestError) as e:
            raise MissingGrantError(f"the plan's {name!r} part cannot pay for these "
                                    f"statistics: {e}") from e
        return epsilon, delta
    charged = accounting.event_to_json(part.event)
    epsilon = part.param(EPSILON_PARAM)
    ok = (not isinstance(epsilon, bool) and isinstance(epsilon, (int, float))
          and math.isfinite(epsilon) and epsilon > 0)
    if ok:
        try:
            ok = accounting.event_to_json(config.dp_event(float(epsilon))) == charged
        except InvalidRequestError as e:
            raise MissingGrantError(f"the plan's {name!r} part is an rdp event: {e}") from e
    if not ok:
        raise MissingGrantError(
            f"the plan's {name!r} part charged the DpEvent {charged} with params "
            f"{dict(part.params)}, which is not these statistics' dp_event(epsilon); refusing to "
            "spend a budget that was not charged. Build the part with statistics_part(features, "
            "epsilon, rdp=True)")
    return float(epsilon), 0.0

