"""DPTrainer executor: the stock Trainer's run_fn machinery, spending exactly the plan's train part.

Sage §3.1 (List. 1): training is one DP stage of the pipeline; it may spend only the ``train``
part of the privacy plan the gate charged. The executor

1. reads the plan from the SageGrant (``plan_io.read_plan``: the grant must be released and the
   plan's cost must equal the charge) and its ``train`` part — no grant, a denial or a plan without
   a train part raise ``MissingGrantError`` before any data is touched;
2. builds the stock ``FnArgs`` (TFX's ``GenericExecutor._GetFnArgs``) and adds to
   ``fn_args.custom_config``: ``sage_train_part`` (``PlanPart.to_dict()``), ``sage_grant_id``,
   ``sage_num_train_records`` (counted here), ``sage_report_delta`` (rdp parts) and
   ``sage_guarantee_path``;
3. calls the user's ``run_fn``, which must export the serving model and report the DP guarantee it
   used (``report_guarantee``);
4. re-derives the privacy cost from the reported parameters with dp_accounting
   (``guarantee.verify_report``) and records it on the Model artifact, or — if the run_fn did not
   report, or the report does not fit the part — deletes the exported model and fails: a model
   whose privacy is unknown must never be blessed or pushed.

What the run_fn reports is checked, not trusted: ε is recomputed here from σ, batch size, n and
epochs; n may not exceed the records the executor counted in the train split(s). The executor
cannot see inside the run_fn, though: that the model was *trained* with the reported parameters
(and saw only the train split) is the run_fn's contract — the helpers in ``run_fn_utils`` keep it.
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
from sage_tfx.components import artifacts, plan_io
from sage_tfx.components.block_example_gen.spec import GRANT_ID_PROPERTY as EXAMPLES_GRANT_ID
from sage_tfx.components.dp_trainer import guarantee as guarantee_lib
from sage_tfx.components.dp_trainer import spec
from sage_tfx.errors import InvalidRequestError, MissingGrantError

# Plan-part param naming the δ at which an rdp part's ε is reported.
REPORT_DELTA_PARAM = "delta"


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
    from sage_tfx.ledger import open_ledger
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


def read_report(path: str) -> dict:
    """The run_fn's report at ``path``.

    Raises:
      GuaranteeMismatchError: no report (the run_fn did not call report_guarantee) or not JSON.
    """
    if not fileio.exists(path):
        raise guarantee_lib.GuaranteeMismatchError(
            "the run_fn did not report the DP guarantee it used: end it with "
            "sage_tfx.components.dp_trainer.report_guarantee(fn_args, guarantee). A model whose "
            "privacy is unknown is not published")
    with fileio.open(path, "r") as f:
        text = f.read()
    try:
        return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except ValueError as e:
        raise guarantee_lib.GuaranteeMismatchError(f"unreadable DP report {path}: {e}") from e


def set_model_properties(model: types.Artifact, verified: guarantee_lib.VerifiedGuarantee
                         ) -> None:
    """Records a verified guarantee as custom properties of the Model artifact."""
    for key, value in verified.model_properties().items():
        if isinstance(value, bool):
            model.set_int_custom_property(key, int(value))
        elif isinstance(value, int):
            model.set_int_custom_property(key, value)
        elif isinstance(value, float):
            model.set_float_custom_property(key, value)
        else:
            model.set_string_custom_property(key, str(value))


class Executor(trainer_executor.GenericExecutor):
    """GenericExecutor that hands run_fn the plan's train part and verifies what it spent."""

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        """Trains with the user's run_fn under the plan's train part; records the DP guarantee.

        Args:
          input_dict: ``examples``, optional ``transform_graph`` / ``schema``, ``grant``.
          output_dict: ``model``, ``model_run``.
          exec_properties: the stock Trainer's (train_args, eval_args, module_file / run_fn,
            custom_config).

        Raises:
          MissingGrantError: no / denied / mismatched grant, or no train part in the plan.
          GuaranteeMismatchError: the run_fn did not report, or spent other than the part.
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
        from sage_tfx.components.dp_trainer import run_fn_utils  # imports TensorFlow
        num_records = run_fn_utils.count_records(fn_args.train_files)
        model_artifact = artifact_utils.get_single_instance(output_dict[spec.MODEL_KEY])
        fileio.makedirs(model_artifact.uri)
        report_path = os.path.join(model_artifact.uri, guarantee_lib.GUARANTEE_FILE_NAME)
        for stale in (report_path, os.path.join(model_artifact.uri,
                                                guarantee_lib.MEMBERSHIP_FILE_NAME)):
            if fileio.exists(stale):  # a retry must not inherit the previous attempt's reports
                fileio.remove(stale)
        config.update({
            guarantee_lib.TRAIN_PART_CONFIG_KEY: part.to_dict(),
            guarantee_lib.GRANT_ID_CONFIG_KEY: grant.grant_id,
            guarantee_lib.NUM_TRAIN_RECORDS_CONFIG_KEY: num_records,
            guarantee_lib.REPORT_DELTA_CONFIG_KEY: report_delta,
            guarantee_lib.GUARANTEE_PATH_CONFIG_KEY: report_path,
        })
        fn_args.custom_config = config
        run_fn = udf_utils.get_fn(exec_properties, "run_fn")

        # The record count is not logged: it is an exact (non-DP) statistic of the granted data.
        logging.info("DPTrainer: grant %s, train part %s", grant.grant_id, part.to_dict())
        try:
            run_fn(fn_args)
            if not fileio.exists(fn_args.serving_model_dir):
                raise RuntimeError("run_fn failed to generate model.")
            report = read_report(report_path)
            verified = guarantee_lib.verify_report(
                report, part, grant_id=grant.grant_id, num_train_records=num_records,
                report_delta=report_delta)
        except Exception:
            # Not published (the execution fails), and not left behind for anyone to pick up.
            if fileio.exists(fn_args.serving_model_dir):
                fileio.rmtree(fn_args.serving_model_dir)
            raise
        record = verified.to_dict()
        record["reported"] = report
        record["train_part"] = part.to_dict()
        _write_json(report_path, record)
        set_model_properties(model_artifact, verified)
        logging.info("DPTrainer: model %s is (%.6g, %.3g)-DP (%s, %s accountant, grant %s)",
                     fn_args.serving_model_dir, verified.epsilon, verified.delta,
                     verified.algorithm, verified.accountant, grant.grant_id)
