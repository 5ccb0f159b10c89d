"""DPStatisticsGen: TFX's StatisticsGen with differentially private statistics.

Stock StatisticsGen's statistics are exact, so a Sage pipeline cannot run it (nor SchemaGen and
ExampleValidator, which read them). DPStatisticsGen writes the same artifact —
``ExampleStatistics`` with one TFDV ``DatasetFeatureStatisticsList`` per split under
``Split-<name>/FeatureStats.pb`` — from DP counts, histograms, quantiles and top values of the
*declared* features, spending the plan part ``statistics``; stock SchemaGen and ExampleValidator
run on it unchanged::

    features = [NumericFeature("trip_seconds", 0, 7200, num_bins=24),
                CategoricalFeature("payment_type")]           # vocabulary by partition selection
    plan = PrivacyPlan.of(statistics_part(features, 0.5, 1e-7), PlanPart("train", ...), ...)
    gate = SageGate(ledger_url=LEDGER, stream="taxi", window_last=3, plan=plan)
    example_gen = BlockExampleGen(grant=gate.outputs["grant"])
    statistics_gen = DPStatisticsGen(examples=example_gen.outputs["examples"],
                                     grant=gate.outputs["grant"], features=features)
    schema_gen = tfx.components.SchemaGen(statistics=statistics_gen.outputs["statistics"])
    example_validator = tfx.components.ExampleValidator(
        statistics=statistics_gen.outputs["statistics"], schema=schema_gen.outputs["schema"])

What is DP and what stock consumers make of it: ``sage_tfx.dp.feature_statistics`` (the schema
SchemaGen infers from DP statistics is itself a post-processing of them, so it is DP too).
"""
from __future__ import annotations

import json
from typing import Optional, Sequence, Union

from tfx import types
from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import standard_artifacts

from sage_tfx.components.dp_statistics_gen import executor, spec
from sage_tfx.components.gate.executor import check_ledger_url
from sage_tfx.dp.feature_statistics import (DEFAULT_FAILURE_PROBABILITY, DEFAULT_NUM_QUANTILES,
                                            DEFAULT_NUM_TOP_VALUES, Feature, StatisticsConfig)
from sage_tfx.ledger import releases


class DPStatisticsGen(base_beam_component.BaseBeamComponent):
    """DP statistics of Examples read under a grant; outputs ``ExampleStatistics``.

    Component ``inputs`` contains:
      - ``examples``: Channel of type ``standard_artifacts.Examples`` read by BlockExampleGen
        under ``grant`` (gzip TFRecords of tf.Example; its splits are disjoint).
      - ``grant``: Channel of type ``SageGrant`` whose privacy plan has the ``plan_part`` part.
    Component ``outputs`` contains:
      - ``statistics``: Channel of type ``standard_artifacts.ExampleStatistics``:
          - ``{uri}/Split-<name>/FeatureStats.pb`` (a binary ``DatasetFeatureStatisticsList``,
            StatisticsGen's layout) and ``{uri}/dp_statistics.json`` (every query's ε share,
            sensitivity, noise scale and threshold);
          - custom properties ``grant_id``, ``plan_part``, ``epsilon``, ``delta`` (spent per
            split), ``replayed`` (1 if this execution replayed the recorded release),
            ``release_name``, ``release_digest``.
    """

    SPEC_CLASS = spec.DPStatisticsGenSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, *, examples: types.BaseChannel, grant: types.BaseChannel,
                 features: Union[StatisticsConfig, Sequence[Feature]],
                 failure_probability: float = DEFAULT_FAILURE_PROBABILITY,
                 num_quantiles: int = DEFAULT_NUM_QUANTILES,
                 num_top_values: int = DEFAULT_NUM_TOP_VALUES,
                 exclude_splits: Optional[Sequence[str]] = None,
                 plan_part: str = spec.DEFAULT_PLAN_PART,
                 ledger_url: Optional[str] = None):
        """Constructs a DPStatisticsGen.

        Args:
          examples: BlockExampleGen's Examples (e.g. ``example_gen.outputs["examples"]``).
          grant: the ``grant`` output of the SageGate that charged the run's plan.
          features: the features to describe, with their public parameters
            (``NumericFeature`` bounds, bins and valency bound; ``CategoricalFeature`` domain,
            or none for a DP vocabulary), or a whole ``StatisticsConfig`` (then the next three
            arguments are its own).
          failure_probability: β, the chance that noise alone makes an empty cell count as
            non-empty (presence, valency, min/max, zeros, domain values).
          num_quantiles: buckets of the quantiles histograms (TFDV's default 10).
          num_top_values: top values listed per categorical feature (TFDV's default 20).
          exclude_splits: splits not to describe (as StatisticsGen).
          plan_part: the plan part spent (``statistics_part(..., name=plan_part)``).
          ledger_url: the ledger the release is recorded in; default the grant's.

        Raises:
          ValueError (sage_tfx.errors subclasses): a bad feature, parameter, part name or URL.
        """
        config = features if isinstance(features, StatisticsConfig) else StatisticsConfig(
            tuple(features), failure_probability=failure_probability,
            num_quantiles=num_quantiles, num_top_values=num_top_values)
        releases.check_release_name(releases.part_release_name(plan_part,
                                                               executor.RELEASE_OUTPUT))
        if exclude_splits is not None and (isinstance(exclude_splits, str) or not all(
                isinstance(s, str) for s in exclude_splits)):
            raise ValueError(f"exclude_splits must be a list of split names, got "
                             f"{exclude_splits!r}")
        if ledger_url is not None:
            check_ledger_url(ledger_url)
        super().__init__(spec=spec.DPStatisticsGenSpec(
            features_json=config.to_json(),
            exclude_splits=json.dumps(list(exclude_splits)) if exclude_splits is not None
            else None,
            plan_part=plan_part,
            ledger_url=ledger_url,
            examples=examples,
            grant=grant,
            statistics=types.Channel(type=standard_artifacts.ExampleStatistics),
        ))
