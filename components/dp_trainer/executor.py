"""DPTrainer executor: the stock Trainer's run_fn machinery, with the executor owning the
privacy loop and spending exactly the plan's train part.

Sage §3.1 (List. 1): training is one DP stage of the pipeline; it may spend only the ``train``
part of the privacy plan the gate charged. The executor

1. reads the plan from the SageGrant (``plan_io.read_plan``: the grant must be released and the
   plan's cost must equal the charge) and its ``train`` part — no grant, a denial or a plan without
   a train part raise ``MissingGrantError`` before any data is touched;
2. builds the stock ``FnArgs`` (TFX's ``GenericExecutor._GetFnArgs``) and adds to
   ``fn_args.custom_config``: ``sage_train_part`` (``PlanPart.to_dict()``), ``sage_grant_id``,
   ``sage_num_train_records`` (counted here), ``sage_report_delta`` (rdp parts) and
   ``sage_guarantee_path``;
3. calls the user's ``run_fn`` with its privacy loop active (``private.PrivateTraining``): the
   run_fn supplies the model and the data (``run_fn_utils.private_training(fn_args).dpsgd(...)``
   or ``.adassp(...)``), the executor trains — the plan's DP-SGD steps with Poisson sampling,
   counted inside the training step, or AdaSSP's three Gaussian releases — and the run_fn exports
   the trained model;
4. takes what ran (``TrainingRecord``: noisy steps, q, σ, C, n), checks that the exported model is
   the one trained, derives the privacy cost from the record with dp_accounting
   (``guarantee.verify_record``) and records it on the Model artifact. A run_fn that trained by
   itself (plain Keras, a DP algorithm called directly), trained twice or exported another model
   fails the component (``UnverifiedTrainingError``) and its model is deleted: a model whose
   privacy the executor did not observe is never published, and DPModelValidator blesses no
   DPTrainer model without ``dp_verification = "observed"``.

A run_fn's own report (``report_guarantee``) is optional and never accounted; if present, every
fact it states must agree with what ran. That the model saw only the train split remains the
run_fn's contract (``run_fn_utils.read_split``).

Released once (``release_io.release_artifact_once``, name :data:`RELEASE_NAME`): steps 3-4 write
the Model directory (serving model, verified record, the Model's properties) into a staging
directory that is recorded against the grant, with the run's request (:func:`release_request`),
before it becomes the Model artifact's contents. A retried or re-run execution under the same
grant gets the recorded Model byte for byte and its properties, without reading an example or
training; another request under the grant is refused (``ReleaseConflictError``). A failed
attempt (refused training) records and publishes nothing.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

from absl import logging
from tfx import types
from tfx.components.trainer import executor as trainer_executor
from tfx.components.util import udf_utils
from tfx.dsl.io import fileio
from tfx.types import artifact_utils

from sage_tfx.ledger import accounting
from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.components import artifacts, plan_io, release_io
from sage_tfx.components.block_example_gen.spec import GRANT_ID_PROPERTY as EXAMPLES_GRANT_ID
from sage_tfx.components.dp_trainer import guarantee as guarantee_lib
from sage_tfx.components.dp_trainer import private
from sage_tfx.components.dp_trainer import spec
from sage_tfx.errors import InvalidRequestError, MissingGrantError
from sage_tfx.ledger import open_ledger, releases

# Plan-part param naming the δ at which an rdp part's ε is reported.
REPORT_DELTA_PARAM = "delta"
# The DP Trainer's release: the Model directory (serving model, verified record, properties),
# once per grant, keyed by the plan part it spends ("train/model"); the part is claimed for
# DPTrainer, so no other trainer spends it again.
COMPONENT = "DPTrainer"
RELEASE_NAME = releases.part_release_name(plan_lib.TRAIN, "model")
PROPERTIES_FILE_NAME = "dp_model_properties.json"


def check_custom_config(custom_config: Any) -> dict:
    """Returns the user's custom_config (a dict, maybe empty) without reserved ``sage_`` keys.

    Raises:
      InvalidRequestError: not a dict, or a key the executor reserves.
    """
    if custom_config is None:
        return {}
    if not isinstance(custom_config, dict):
        raise InvalidRequestError(
            f"custom_config must be a dict, got {type(custom_config).__name__}")
    reserved = sorted(k for k in custom_config if str(k).startswith(guarantee_lib.RESERVED_PREFIX))
    if reserved:
        raise InvalidRequestError(
            f"custom_config keys starting with {guarantee_lib.RESERVED_PREFIX!r} are reserved "
            f"for the plan DPTrainer hands to run_fn: {reserved}")
    return dict(custom_config)


def _single_grant(input_dict: Dict[str, List[types.Artifact]]) -> types.Artifact:
    grants = input_dict.get(spec.GRANT_INPUT_KEY) or []
    if len(grants) != 1:
        raise MissingGrantError(
            f"DPTrainer needs exactly one SageGrant in '{spec.GRANT_INPUT_KEY}' (from SageGate), "
            f"got {len(grants)}: no privacy budget was charged for training")
    return grants[0]


def _check_examples_grant(examples: List[types.Artifact], grant_id: str) -> None:
    """Examples that record a grant (BlockExampleGen's) must record this one."""
    for artifact in examples:
        if artifact.has_custom_property(EXAMPLES_GRANT_ID):
            recorded = artifact.get_string_custom_property(EXAMPLES_GRANT_ID)
            if recorded and recorded != grant_id:
                raise MissingGrantError(
                    f"the examples were read under grant {recorded}, but the plan to spend is "
                    f"grant {grant_id}'s: train on the blocks of the grant that charged training")


def report_delta_for(part: plan_lib.PlanPart, grant_artifact: types.Artifact,
                     stream: str) -> Optional[float]:
    """δ at which ε of an rdp train part is reported: the part's ``delta`` param, else δ_g.

    δ_g is the stream's global δ (the δ of the ledger's RDP filter), read from the ledger the
    grant artifact names. None for basic parts (their δ is the part's own).

    Raises:
      MissingGrantError: an rdp part without a delta param whose ledger cannot be read.
    """
    if part.mode != accounting.RDP:
        return None
    value = part.param(REPORT_DELTA_PARAM)
    if value is not None:
        return accounting.check_delta(value, f"train part param {REPORT_DELTA_PARAM}",
                                      allow_zero=False)
    url = grant_artifact.ledger_url
    if not url:
        raise MissingGrantError(
            "an rdp train part needs a delta to report epsilon at: give the plan part a "
            f"({REPORT_DELTA_PARAM!r}, delta) param, or a grant that names its ledger")
    with open_ledger(url) as ledger:
        return float(ledger.stream(stream).delta_g)


def _write_json(path: str, value: Any) -> None:
    with fileio.open(path, "w") as f:
        f.write(json.dumps(value, sort_keys=True, indent=1))


def read_report(path: str) -> Optional[dict]:
    """The run_fn's optional report at ``path``, or None.

    Raises:
      GuaranteeMismatchError: a report that is not JSON.
    """
    if not fileio.exists(path):
        return None
    with fileio.open(path, "r") as f:
        text = f.read()
    try:
        return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except ValueError as e:
        raise guarantee_lib.GuaranteeMismatchError(f"unreadable DP report {path}: {e}") from e


def set_model_properties(model: types.Artifact, properties: dict) -> None:
    """Records a verified guarantee's properties (``model_properties()``) on the Model."""
    for key, value in properties.items():
        if isinstance(value, bool):
            model.set_int_custom_property(key, int(value))
        elif isinstance(value, int):
            model.set_int_custom_property(key, value)
        elif isinstance(value, float):
            model.set_float_custom_property(key, value)
        else:
            model.set_string_custom_property(key, str(value))


class Executor(trainer_executor.GenericExecutor):
    """GenericExecutor that trains run_fn's model in its own privacy loop and verifies what ran."""

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        """Trains the run_fn's model privately under the plan's train part; records what ran.

        Args:
          input_dict: ``examples``, optional ``transform_graph`` / ``schema``, ``grant``.
          output_dict: ``model``, ``model_run``.
          exec_properties: the stock Trainer's (train_args, eval_args, module_file / run_fn,
            custom_config).

        Raises:
          MissingGrantError: no / denied / mismatched grant, or no train part in the plan.
          UnverifiedTrainingError: no (or more than one) training ran through the executor's
            loop, or the exported model is not the one it trained.
          GuaranteeMismatchError: what ran does not fit the part, or a report contradicts it.
          RuntimeError: the run_fn wrote no serving model.
        """
        self._log_startup(input_dict, output_dict, exec_properties)
        grant_artifact = _single_grant(input_dict)
        plan = plan_io.read_plan(grant_artifact)
        grant = artifacts.read_grant(grant_artifact)
        part = plan.part(plan_lib.TRAIN)
        _check_examples_grant(input_dict.get(spec.EXAMPLES_KEY) or [], grant.grant_id)
        report_delta = report_delta_for(part, grant_artifact, grant.stream)

        fn_args = self._GetFnArgs(input_dict, output_dict, exec_properties)
        config = check_custom_config(fn_args.custom_config)
        model_artifact = artifact_utils.get_single_instance(output_dict[spec.MODEL_KEY])
        request = release_request(part, config, exec_properties)

        def produce_into(staging: str) -> None:
            _train(fn_args, staging, model_artifact.uri, exec_properties, part, grant.grant_id,
                   config, report_delta)

        url = release_io.ledger_url_for(grant_artifact, None, component="DPTrainer")
        with open_ledger(url) as ledger:
            out = release_io.release_artifact_once(ledger, grant.grant_id, RELEASE_NAME,
                                                   model_artifact, produce_into,
                                                   request=request, component=COMPONENT,
                                                   part=part.name)
        with fileio.open(os.path.join(model_artifact.uri, PROPERTIES_FILE_NAME), "r") as f:
            properties = json.loads(f.read())
        set_model_properties(model_artifact, properties)
        logging.info("DPTrainer: model %s is (%.6g, %.3g)-DP (%s, grant %s)%s",
                     model_artifact.uri, properties["dp_epsilon"], properties.get("dp_delta", 0),
                     properties.get("dp_algorithm"), grant.grant_id,
                     " (the recorded release, replayed)" if out.replayed else "")


def release_request(part: plan_lib.PlanPart, config: dict,
                    exec_properties: Dict[str, Any]) -> dict:
    """What a DPTrainer run was asked, recorded with its release: a replay must ask the same.

    The examples are the grant's (fixed by the grant); the rest is the train part, the user's
    custom_config, the train / eval args and the module (its file's digest, or its import path).
    """
    module_file = exec_properties.get("module_file")
    module = (release_io.file_digest(module_file)
              if module_file and os.path.isfile(module_file) else module_file)
    return {"train_part": part.to_dict(), "custom_config": config, "module": module,
            "module_path": exec_properties.get("module_path"),
            "run_fn": exec_properties.get("run_fn"),
            "train_args": exec_properties.get("train_args"),
            "eval_args": exec_properties.get("eval_args")}


def _train(fn_args, staging: str, model_uri: str, exec_properties: Dict[str, Any],
           part: plan_lib.PlanPart, grant_id: str, config: dict,
           report_delta: Optional[float]) -> None:
    """Runs the run_fn in the executor's privacy loop, writing the model into ``staging``.

    ``staging`` stands for the Model artifact's uri until the release is recorded: the serving
    model, the verified record (:data:`GUARANTEE_FILE_NAME`) and the Model's properties
    (:data:`PROPERTIES_FILE_NAME`) are written there, and published only once recorded.
    """
    from sage_tfx.components.dp_trainer import run_fn_utils  # imports TensorFlow
    num_records = run_fn_utils.count_records(fn_args.train_files)
    for attr in ("serving_model_dir", "eval_model_dir"):
        rel = os.path.relpath(getattr(fn_args, attr), model_uri)
        setattr(fn_args, attr, os.path.join(staging, rel))
    report_path = os.path.join(staging, guarantee_lib.GUARANTEE_FILE_NAME)
    config = dict(config)
    config.update({
        guarantee_lib.TRAIN_PART_CONFIG_KEY: part.to_dict(),
        guarantee_lib.GRANT_ID_CONFIG_KEY: grant_id,
        guarantee_lib.NUM_TRAIN_RECORDS_CONFIG_KEY: num_records,
        guarantee_lib.REPORT_DELTA_CONFIG_KEY: report_delta,
        guarantee_lib.GUARANTEE_PATH_CONFIG_KEY: report_path,
    })
    fn_args.custom_config = config
    run_fn = udf_utils.get_fn(exec_properties, "run_fn")
    training = private.PrivateTraining(part, num_train_records=num_records,
                                       report_delta=report_delta)

    # The record count is not logged: it is an exact (non-DP) statistic of the granted data.
    logging.info("DPTrainer: grant %s, train part %s", grant_id, part.to_dict())
    with training.active():
        run_fn(fn_args)
    if not fileio.exists(fn_args.serving_model_dir):
        raise RuntimeError("run_fn failed to generate model.")
    ran = training.record()
    training.check_exported(fn_args.serving_model_dir)
    verified = guarantee_lib.verify_record(
        ran, part, grant_id=grant_id, num_train_records=num_records, report_delta=report_delta)
    report = read_report(report_path)
    if report is not None:
        guarantee_lib.check_report(report, ran)
    record = verified.to_dict()
    record["ran"] = ran.to_dict()
    record["reported"] = report
    record["train_part"] = part.to_dict()
    _write_json(report_path, record)
    _write_json(os.path.join(staging, PROPERTIES_FILE_NAME), verified.model_properties())
