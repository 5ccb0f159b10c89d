"""Gate → BlockExampleGen → DPStatisticsGen → SchemaGen → ExampleValidator: TFX data validation
on DP statistics.

The gate charges the plan's ``statistics`` part (``statistics_part(features, ε, δ)``) to a window
of blocks before any data is read; DPStatisticsGen releases DP statistics of the declared
features once per grant; stock SchemaGen infers a schema from them (a post-processing of DP
statistics, hence DP) and stock ExampleValidator checks every split against it. The pipeline is
checked before any charge (``preflight.attach``: the plan part pays for the features). As in
``gate_stats_pipeline``, a denial skips the readers (``tfx.dsl.Cond`` on the grant).

Run locally::

    from tfx import v1 as tfx
    from sage_tfx.dp.feature_statistics import CategoricalFeature, NumericFeature
    from sage_tfx.pipelines.dp_data_validation_pipeline import create_pipeline
    tfx.orchestration.LocalDagRunner().run(create_pipeline(
        pipeline_name="taxi-dp-validation", pipeline_root="/tmp/root",
        metadata_path="/tmp/mlmd.db", ledger_url="sqlite:////tmp/ledger.db", stream="taxi",
        window_last=3, features=[NumericFeature("trip_seconds", 0, 7200),
                                 CategoricalFeature("payment_type")],
        epsilon=1.0, delta=1e-7))
"""
from __future__ import annotations

from typing import Optional, Sequence

from tfx import v1 as tfx

from sage_tfx.adaptive.plan import PrivacyPlan
from sage_tfx.components import preflight
from sage_tfx.components.block_example_gen.component import BlockExampleGen
from sage_tfx.components.dp_statistics_gen.component import DPStatisticsGen
from sage_tfx.components.dp_statistics_gen.privacy import statistics_part
from sage_tfx.components.gate.component import SageGate
from sage_tfx.dp.feature_statistics import Feature
from sage_tfx.ledger import DEFAULT_CONTEXT


def create_pipeline(pipeline_name: str, pipeline_root: str, metadata_path: str,
                    ledger_url: str, stream: str, window_last: int,
                    features: Sequence[Feature], epsilon: float, delta: float = 0.0, *,
                    context: str = DEFAULT_CONTEXT, run_id: Optional[str] = None,
                    failure_probability: Optional[float] = None,
                    beam_pipeline_args: Optional[Sequence[str]] = None,
                    enable_cache: bool = False) -> tfx.dsl.Pipeline:
    """Builds the DP data-validation pipeline on a window of blocks.

    Args:
      pipeline_name, pipeline_root, metadata_path: the TFX pipeline and its SQLite MLMD.
      ledger_url, stream, window_last, context, run_id: the gate's request (see SageGate).
      features: the declared features (public bounds, bins, domains, valency bounds).
      epsilon, delta: the statistics part (δ > 0 if a categorical feature has no domain).
      failure_probability: β of DPStatisticsGen's thresholds (default its own).
      beam_pipeline_args, enable_cache: as for any TFX pipeline.
    """
    part = statistics_part(features, epsilon, delta)
    gate = SageGate(ledger_url=ledger_url, stream=stream, window_last=window_last,
                    plan=PrivacyPlan.of(part), context=context, run_id=run_id)
    with tfx.dsl.Cond(gate.outputs["grant"].future()[0].custom_property("granted") == 1):
        example_gen = BlockExampleGen(grant=gate.outputs["grant"], ledger_url=ledger_url)
        kwargs = {} if failure_probability is None else {
            "failure_probability": failure_probability}
        statistics_gen = DPStatisticsGen(examples=example_gen.outputs["examples"],
                                         grant=gate.outputs["grant"], features=features,
                                         ledger_url=ledger_url, **kwargs)
        schema_gen = tfx.components.SchemaGen(statistics=statistics_gen.outputs["statistics"])
        example_validator = tfx.components.ExampleValidator(
            statistics=statistics_gen.outputs["statistics"], schema=schema_gen.outputs["schema"])
    return preflight.attach(tfx.dsl.Pipeline(  # check before charge
        pipeline_name=pipeline_name,
        pipeline_root=pipeline_root,
        components=[gate, example_gen, statistics_gen, schema_gen, example_validator],
        enable_cache=enable_cache,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            metadata_path),
        beam_pipeline_args=list(beam_pipeline_args or []),
    ))
