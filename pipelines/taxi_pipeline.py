"""TFX's Chicago taxi pipeline (``taxi_pipeline_native_keras.py``), made DP under a Sage grant.

The TFX example's structure, component for component, on blocks of a ledger stream::

    TFX example                     here
    CsvExampleGen                   SageGate(plan) → BlockExampleGen (the granted blocks only)
    StatisticsGen                   DPStatisticsGen (the plan's statistics part)
    SchemaGen, ExampleValidator     the stock components, on the DP statistics
    Transform(module_file)          DPTransform(module_file): the same preprocessing_fn, its
                                    analyzers DP (``from sage_tfx.components.dp_transform
                                    import tft``), on the checked-in schema (ImportSchemaGen)
    Trainer(module_file)            DPTrainer(module_file): ``model_fn`` instead of ``run_fn``
    LatestBlessedModelResolver      the same Resolver
    Evaluator (accuracy ≥ 0.6,      DPModelValidator: DP accuracy ≥ target with probability
      not worse than the baseline)  1 − η, and a DP comparison with the last blessed model
    Pusher                          the stock Pusher

The module file is ``pipelines/taxi_utils_dp.py`` (TFX's, both halves converted). The data go
into blocks with the CLI first — the trip CSV TFX ships with the ``big_tipper`` label
(``data/big_tipper_label/data.csv`` in the tfx wheel), monthly blocks::

    sage-tfx --ledger sqlite:///taxi.db create-stream taxi --epsilon-g 10 --delta-g 1e-5 \\
        --granularity month
    sage-tfx --ledger sqlite:///taxi.db import taxi "$CSV" \\
        --scheme time:trip_start_timestamp:month --block-root blocks/

``python -m sage_tfx.pipelines.taxi_pipeline --out out/taxi`` does both (the CLI import, then
one run on LocalDagRunner; ~2 min on 2 cores) and prints what the run decided.

The whole run is charged once by the gate, before any block is read (:func:`make_plan`): its
parts, in order, pay for the DP statistics, the transform's nine analyzers (δ for the two
vocabularies), DP-SGD, the DP validation and the baseline comparison. A configuration a component
would refuse is refused when the pipeline is built (``preflight.attach``).
"""
from __future__ import annotations

import os
from typing import Optional, Sequence

from tfx import v1 as tfx

from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
from sage_tfx.components import artifacts as sage_artifacts
from sage_tfx.components import preflight
from sage_tfx.components.block_example_gen.component import BlockExampleGen
from sage_tfx.components.dp_statistics_gen.component import DPStatisticsGen
from sage_tfx.components.dp_statistics_gen.privacy import statistics_part
from sage_tfx.components.dp_trainer.component import DPTrainer
from sage_tfx.components.dp_transform.component import DPTransform
from sage_tfx.components.dp_validator.component import DPModelValidator
from sage_tfx.components.gate.component import SageGate
from sage_tfx.dp.feature_statistics import CategoricalFeature, NumericFeature

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_FILE = os.path.join(HERE, "taxi_utils_dp.py")
SCHEMA_PATH = os.path.join(HERE, "taxi_schema", "schema.pbtxt")
LABEL_KEY = "big_tipper"          # the raw label the validator scores (tips > 20 % of the fare)
DEFAULT_TARGET = 0.6              # the TFX example's Evaluator threshold on binary accuracy
DELTA = 1e-6

# DPStatisticsGen's declared features (public bounds and bins; values by partition selection).
STATISTICS_FEATURES = (
    NumericFeature("trip_seconds", 0.0, 7200.0, num_bins=24),
    NumericFeature("trip_miles", 0.0, 50.0, num_bins=25),
    NumericFeature("fare", 0.0, 200.0, num_bins=20),
    NumericFeature("trip_start_hour", 0.0, 24.0, num_bins=24, dtype="int"),
    CategoricalFeature("payment_type"),
)


def make_plan(*, statistics_epsilon: float = 0.5, transform_epsilon: float = 1.0,
              train_epsilon: float = 3.0, validate_epsilon: float = 0.5,
              baseline_epsilon: float = 0.5, delta: float = DELTA) -> PrivacyPlan:
    """The run's plan: statistics, transform, train, validate and baseline parts (basic).

    δ goes to the statistics part's and the transform's partition selections and to DP-SGD
    (each gets ``delta``); the validations are pure ε.
    """
    return PrivacyPlan.of(statistics_part(list(STATISTICS_FEATURES), statistics_epsilon, delta),
                          PlanPart("transform", transform_epsilon, delta),
                          PlanPart("train", train_epsilon, delta),
                          PlanPart("validate", validate_epsilon),
                          PlanPart("baseline", baseline_epsilon))


def create_pipeline(*, pipeline_name: str, pipeline_root: str, metadata_path: str,
                    ledger_url: str, stream: str, window_last: int, serving_model_dir: str,
                    plan: Optional[PrivacyPlan] = None, module_file: str = MODULE_FILE,
                    trainer_config: Optional[dict] = None,
                    transform_config: Optional[dict] = None, target: float = DEFAULT_TARGET,
                    eta: float = 0.05, baseline_tolerance: float = 0.02,
                    run_id: Optional[str] = None,
                    beam_pipeline_args: Optional[Sequence[str]] = None) -> tfx.dsl.Pipeline:
    """The DP taxi pipeline on the ``window_last`` most recent blocks of ``stream``.

    Args:
      pipeline_name, pipeline_root, metadata_path: the TFX pipeline and its SQLite MLMD.
      ledger_url, stream, window_last, run_id: the gate's request.
      serving_model_dir: where Pusher pushes a blessed model.
      plan: the run's plan (default :func:`make_plan`).
      module_file: the DPTransform / DPTrainer module.
      trainer_config: the DPTrainer's custom_config (``epochs``, ``batch_size``, ...).
      transform_config: the DPTransform's custom_config (for a preprocessing_fn taking one).
      target, eta: DPModelValidator's accuracy target and 1 − confidence.
      baseline_tolerance: how much worse than the last blessed model still blesses.
      beam_pipeline_args: Beam options of the Beam-backed components.
    """
    plan = plan or make_plan()
    gate = SageGate(ledger_url=ledger_url, stream=stream, window_last=window_last, plan=plan,
                    run_id=run_id)
    granted = gate.outputs["grant"].future()[0].custom_property(sage_artifacts.GRANTED_KEY)
    with tfx.dsl.Cond(granted == sage_artifacts.GRANTED_VALUE):
        example_gen = BlockExampleGen(grant=gate.outputs["grant"], ledger_url=ledger_url)
        statistics_gen = DPStatisticsGen(examples=example_gen.outputs["examples"],
                                         grant=gate.outputs["grant"],
                                         features=list(STATISTICS_FEATURES),
                                         ledger_url=ledger_url)
        schema_gen = tfx.components.SchemaGen(statistics=statistics_gen.outputs["statistics"])
        example_validator = tfx.components.ExampleValidator(
            statistics=statistics_gen.outputs["statistics"], schema=schema_gen.outputs["schema"])
        # DPTransform reads the checked-in schema: a schema inferred in this run comes after the
        # charge, and what DPTransform would refuse is checked before it.
        schema_import = tfx.components.ImportSchemaGen(schema_file=SCHEMA_PATH)
        transform = DPTransform(examples=example_gen.outputs["examples"],
                                schema=schema_import.outputs["schema"],
                                grant=gate.outputs["grant"], module_file=module_file,
                                custom_config=transform_config, ledger_url=ledger_url)
        trainer = DPTrainer(module_file=module_file,
                            examples=transform.outputs["transformed_examples"],
                            transform_graph=transform.outputs["transform_graph"],
                            schema=schema_import.outputs["schema"], grant=gate.outputs["grant"],
                            custom_config=trainer_config)
        model_resolver = tfx.dsl.Resolver(
            strategy_class=tfx.dsl.experimental.LatestBlessedModelStrategy,
            model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
            model_blessing=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing)
        ).with_id("latest_blessed_model_resolver")
        validator = DPModelValidator(
            examples=example_gen.outputs["examples"], model=trainer.outputs["model"],
            grant=gate.outputs["grant"], baseline_model=model_resolver.outputs["model"],
            baseline_tolerance=baseline_tolerance, label_key=LABEL_KEY, metric="accuracy",
            target=target, eta=eta, ledger_url=ledger_url)
        pusher = tfx.components.Pusher(
            model=trainer.outputs["model"], model_blessing=validator.outputs["blessing"],
            push_destination=tfx.proto.PushDestination(
                filesystem=tfx.proto.PushDestination.Filesystem(
                    base_directory=serving_model_dir)))
    return preflight.attach(tfx.dsl.Pipeline(
        pipeline_name=pipeline_name, pipeline_root=pipeline_root,
        components=[gate, example_gen, statistics_gen, schema_gen, example_validator,
                    schema_import, transform, trainer, model_resolver, validator, pusher],
        enable_cache=False,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            metadata_path),
        beam_pipeline_args=list(beam_pipeline_args or ["--direct_num_workers=1"])))


def run_iteration(**create_pipeline_kwargs):
    """Runs the pipeline once with LocalDagRunner; the IterationResult of this run (read as the
    flights pipeline's, ``flights_dp_pipeline.read_iteration_result``)."""
    import datetime

    from tfx.dsl.compiler import compiler, constants
    from tfx.orchestration.portable import runtime_parameter_utils

    from sage_tfx.pipelines.flights_dp_pipeline import read_iteration_result
    ir = compiler.Compiler().compile(create_pipeline(**create_pipeline_kwargs))
    pipeline_run_id = datetime.datetime.now().isoformat()
    runtime_parameter_utils.substitute_runtime_parameter(
        ir, {constants.PIPELINE_RUN_ID_PARAMETER_NAME: pipeline_run_id})
    tfx.orchestration.LocalDagRunner().run_with_ir(ir)
    return read_iteration_result(create_pipeline_kwargs["metadata_path"],
                                 create_pipeline_kwargs["pipeline_name"], pipeline_run_id)


def import_taxi_blocks(out: str, stream: str = "taxi", *, epsilon_g: float = 10.0,
                       delta_g: float = 1e-5) -> str:
    """The trips TFX ships into monthly blocks of a new ledger under ``out``, with the
    ``sage-tfx`` CLI as the module docstring shows; returns the ledger URL."""
    import subprocess
    import sys

    from sage_tfx.streams.datasets import chicago_taxi_big_tipper_csv_path
    url = f"sqlite:///{out}/ledger.db"
    cli = [sys.executable, "-m", "sage_tfx.cli", "--ledger", url]
    subprocess.run(cli + ["create-stream", stream, "--epsilon-g", repr(epsilon_g),
                          "--delta-g", repr(delta_g), "--granularity", "month"], check=True)
    subprocess.run(cli + ["import", stream, chicago_taxi_big_tipper_csv_path(), "--scheme",
                          "time:trip_start_timestamp:month", "--block-root",
                          os.path.join(out, "blocks")], check=True)
    return url


def main(argv: Optional[Sequence[str]] = None) -> int:
    import time

    from sage_tfx.pipelines import demo_cli
    ap = demo_cli.parser(__doc__)
    ap.add_argument("--out", default="out/taxi", help="output directory (recreated)")
    ap.add_argument("--window", type=int, default=24, help="months the run trains on")
    ap.add_argument("--train-epsilon", type=float, default=3.0, help="the plan's train part")
    ap.add_argument("--epochs", type=int, default=10, help="DP-SGD epochs")
    ap.add_argument("--target", type=float, default=DEFAULT_TARGET,
                    help="DPModelValidator's accuracy target")
    args = ap.parse_args(argv)
    if args.window < 1 or args.epochs < 1:
        ap.error("--window and --epochs must be at least 1")
    try:
        plan = make_plan(train_epsilon=args.train_epsilon)
    except ValueError as e:  # InvalidPrivacyParameterError: before anything is written
        ap.error(f"--train-epsilon: {e}")
    t0 = time.time()
    out = demo_cli.fresh_out(args.out)
    demo_cli.log("[1/2] importing TFX's taxi trips into monthly blocks (sage-tfx import)")
    url = import_taxi_blocks(out)
    demo_cli.log(f"[2/2] the DP taxi pipeline on the last {args.window} months, "
                 f"charged (ε, δ) = ({plan.cost()['epsilon']:g}, {plan.cost()['delta']:g}) "
                 f"once ({time.time() - t0:.0f}s)")
    result = run_iteration(pipeline_name="taxi-dp", pipeline_root=os.path.join(out, "tfx"),
                           metadata_path=os.path.join(out, "mlmd.db"), ledger_url=url,
                           stream="taxi", window_last=args.window,
                           serving_model_dir=os.path.join(out, "serving"), plan=plan,
                           trainer_config={"epochs": args.epochs}, target=args.target)
    guarantee = result.model_guarantee
    demo_cli.log(f"outcome: {result.outcome} (accuracy lower bound "
                 f"{result.blessing.get('lower_bound', float('nan')):.3f} against target "
                 f"{args.target:g}); pushed: {result.pushed}")
    demo_cli.log(f"model: DP-SGD at ε={guarantee.get('dp_epsilon', float('nan')):.3g}, "
                 f"δ={guarantee.get('dp_delta', float('nan')):.2g}, "
                 f"σ={guarantee.get('dp_noise_multiplier', float('nan')):.3g}, "
                 f"{guarantee.get('dp_steps', '?')} steps; served from "
                 f"{os.path.join(out, 'serving')}")
    demo_cli.log(f"done in {time.time() - t0:.0f}s")
    return 0 if result.outcome in ("ACCEPT", "REJECT", "RETRY") else 1


if __name__ == "__main__":
    raise SystemExit(main())
