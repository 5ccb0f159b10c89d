"""DPBaggingTrainer executor: teachers on the granted private window, noisy labels on declared
public points, the student as a serving SavedModel, and a privacy report (DP bagging §4).

Privacy. The run spends exactly what the gate charged, re-derived from the grant
(``sage_tfx.bagging.labels_from_grant``): an rdp grant must be the event
``SelfComposed(query, p)`` of the configured votes (``sage_tfx.bagging.votes``: Laplace,
Gumbel or Gaussian noisy-max) and p labels are answered; a basic grant (ε, δ)
answers the largest p whose dp_accounting ε fits it (fixed_queries), or runs the paper's
data-dependent loop under the whole grant (paper mode: not differentially private, run only with
the exec property ``accept_not_differentially_private=1``, recorded on the model as the int
property ``not_differentially_private``; DPModelValidator refuses to bless it). The charge sits
on every block of the window: every unit, whatever its block, trains exactly k teachers.
Only the student and the report leave: no vote counts, noisy counts, teachers or ε̂ (per unit
or overall) are written or logged, and in paper mode neither is the data-dependent number of
answered queries. Feature scaling uses the public examples' statistics only.

Release once (``sage_tfx.bagging.purchase``, ``sage_tfx.ledger.releases``). The public range
comes from the ledger's cursor of the window, reserved before any vote. The labels are recorded
against the grant (``train/labels``: keyed by the plan part, ``grant/labels`` without a plan),
and the model directory (student + privacy report) as a tree (``train/model``) before it
appears in the artifact; the part is claimed for DPBaggingTrainer before the labels are drawn
(``releases.claim_part``), so no other trainer spends it. A re-executed trainer (a retried pod,
a manual re-run, another output directory, a concurrent twin) materializes the recorded tree byte
for byte: no Beam flow, no vote, no noise, no charge.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from typing import Any, Dict, List

import numpy as np
from absl import logging
from tfx import types
from tfx.dsl.components.base import base_beam_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils
from tfx.utils import path_utils

from sage_tfx.bagging import (BaggingConfig, TeacherCache, chunk_assignment, label_public,
                              labels_from_grant, plan_labels, purchase, train_student)
from sage_tfx.bagging.cache import cache_key
from sage_tfx.bagging.labelling import fixed_labels
from sage_tfx.components import artifacts
from sage_tfx.components.block_example_gen.spec import GRANT_ID_PROPERTY as EXAMPLES_GRANT_ID
from sage_tfx.components.dp_bagging_trainer import spec
from sage_tfx.errors import InvalidRequestError, MissingGrantError

__all__ = ["Executor", "config_from_exec_properties", "bagging_cost"]

COMPONENT = "DPBaggingTrainer"
# Release outputs, named under the plan part they spend (releases.part_release_name).
LABELS_OUTPUT = "labels"
MODEL_OUTPUT = "model"


def config_from_exec_properties(props: Dict[str, Any]) -> BaggingConfig:
    opt_in = props.get(spec.NON_DP_OPT_IN_KEY)
    if opt_in not in (None, 0, 1) or isinstance(opt_in, bool):
        raise InvalidRequestError(
            f"{spec.NON_DP_OPT_IN_KEY} must be the int 0 or 1, got {opt_in!r}")
    return BaggingConfig(k=props.get(spec.K_KEY), n=props.get(spec.N_KEY),
                         lam=props.get(spec.LAMBDA_KEY),
                         mode=props.get(spec.MODE_KEY), accountant=props.get(spec.ACCOUNTANT_KEY),
                         teacher=props.get(spec.TEACHER_KEY),
                         accept_not_differentially_private=opt_in == 1,
                         votes=props.get(spec.VOTES_KEY) or "laplace")


def feature_keys_of(props: Dict[str, Any]) -> list:
    keys = json.loads(props.get(spec.FEATURE_KEYS_KEY) or "[]")
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise InvalidRequestError("feature_keys must be a non-empty JSON list of feature names")
    return keys


def bagging_cost(config: BaggingConfig, *, epsilon: float, delta: float, public_size: int,
                 rdp: bool, rdp_orders=None) -> dict:
    """The gate's charge for a run, fixed before any private data is read.

    Returns ``{"epsilon", "delta"}`` (basic streams: ε(p) of the accountant, or the whole grant in
    paper mode) or ``{"event_json"}`` (rdp streams: the composed event of p votes). On an rdp
    stream the ledger composes that event by RDP, so p is planned with the RDP bound on the
    stream's order grid (``rdp_orders``, default the ledger's): the largest p whose event's RDP
    ε at ``delta`` (the stream's δ_g) is ≤ ``epsilon`` — not the config's accountant, whose
    Gumbel ``br`` or PLD bound would plan 15-27 % more votes whose RDP ε exceeds ``epsilon``.
    The trainer answers exactly the charged event's p (``labels_from_grant``).
    """
    from sage_tfx.ledger.accounting import DEFAULT_RDP_ORDERS, event_to_json

    plan = plan_labels(config, epsilon=epsilon, delta=delta, public_size=public_size,
                       rdp_orders=(rdp_orders or DEFAULT_RDP_ORDERS) if rdp else None)
    if rdp:
        if plan.event is None:
            raise InvalidRequestError(
                "paper mode cannot be charged as a DpEvent: use a basic stream")
        return {"event_json": event_to_json(plan.event)}
    return {"epsilon": plan.epsilon, "delta": plan.delta}


def _files(examples: types.Artifact, split: str) -> List[str]:
    names = artifact_utils.decode_split_names(examples.split_names) if examples.split_names else []
    if split not in names:
        raise InvalidRequestError(f"the Examples artifact {examples.uri} has no split {split!r} "
                                  f"(splits: {names})")
    uri = artifact_utils.get_split_uri([examples], split)
    return sorted(fileio.glob(os.path.join(uri, "*")))


def _read_records(path: str):
    from sage_tfx.components.block_example_gen.executor import read_gzip_tfrecords
    return read_gzip_tfrecords(path)


def _public_features(files, keys):
    from sage_tfx.components.dp_bagging_trainer.beam_flow import parse_examples
    rows = []
    for path in files:
        rows.extend(parse_examples(list(_read_records(path)), keys))
    X = np.array([[np.nan if v is None else float(v) for v in r] for r in rows], dtype=np.float64)
    return X.reshape(len(rows), len(keys))


def _train_cost(grant_artifact, grant):
    """(ε, δ, event, part name) this trainer may spend: the plan's ``train`` part if the gate
    stored a plan (the rest pays for e.g. DPModelValidator), else the whole grant (part
    ``releases.WHOLE_GRANT``)."""
    from sage_tfx.adaptive import plan as plan_lib
    from sage_tfx.components import plan_io
    from sage_tfx.ledger.releases import WHOLE_GRANT

    if fileio.exists(os.path.join(grant_artifact.uri, plan_io.PLAN_FILE_NAME)):
        part = plan_io.read_plan(grant_artifact).part(plan_lib.TRAIN)
        return part.epsilon, part.delta, part.event, part.name
    return grant.epsilon, grant.delta, grant.event, WHOLE_GRANT



def export_student(student, mean, std, feature_keys, path: str) -> None:
    """The student as a SavedModel: serialized tf.Examples in, P(class 1) out ('probabilities')."""
    import tensorflow as tf

    coef = getattr(student, "coef_", None)
    if coef is None:     # constant student
        w, b = np.zeros(len(feature_keys)), (30.0 if student.label == 1 else -30.0)
    else:
        w, b = np.asarray(coef, dtype=np.float64)[0], float(student.intercept_[0])

    class Student(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.constant(w / std, tf.float32)
            self.b = tf.constant(b - float(np.sum(w * mean / std)), tf.float32)
            self.mean = tf.constant(mean, tf.float32)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def serve(self, examples):
            spec_ = {k: tf.io.FixedLenFeature([], tf.float32, default_value=float(mean[i]))
                     for i, k in enumerate(feature_keys)}
            parsed = tf.io.parse_example(examples, spec_)
            X = tf.stack([parsed[k] for k in feature_keys], axis=1)
            return {spec.PREDICTION_OUTPUT: tf.sigmoid(tf.linalg.matvec(X, self.w) + self.b)}

    module = Student()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})


def _record_on_model(model: types.Artifact, report: dict) -> None:
    """Custom properties of the Model, from the released report (identical on a replay)."""
    if report["formally_dp"]:
        model.set_int_custom_property(spec.QUERIES_PROPERTY, int(report["queries"]))
    model.set_string_custom_property(spec.MODE_PROPERTY, report["mode"])
    model.set_float_custom_property(spec.EPSILON_PROPERTY, float(report["epsilon"]))
    model.set_float_custom_property(spec.DELTA_PROPERTY, float(report["delta"]))
    model.set_string_custom_property(spec.GRANT_ID_PROPERTY, report["grant_id"])
    model.set_int_custom_property(spec.NOT_DP_PROPERTY, int(report["not_differentially_private"]))


# The one artifact of a channel; zero or several is a clear error.
_one = functools.partial(artifacts.single_artifact, component=COMPONENT)


class Executor(base_beam_executor.BaseBeamExecutor):
    """Runs the Beam teacher flow, labels public points, exports the student."""

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        grant_artifact = _one(input_dict, spec.GRANT_INPUT_KEY, what="SageGrant (from SageGate)")
        grant = artifacts.read_grant(grant_artifact)  # a denial raises with the ledger's reason
        config = config_from_exec_properties(exec_properties)
        keys = feature_keys_of(exec_properties)
        if exec_properties.get(spec.PUBLIC_DECLARED_KEY) != 1:
            raise InvalidRequestError("public_examples are not declared public (public_declared=1)")
        private = _one(input_dict, spec.EXAMPLES_KEY, what="private Examples")
        public = _one(input_dict, spec.PUBLIC_EXAMPLES_KEY, what="public Examples")
        if public.has_custom_property(EXAMPLES_GRANT_ID):
            raise InvalidRequestError("public_examples were read from a gated private stream "
                                      "(grant "
                                      f"{public.get_string_custom_property(EXAMPLES_GRANT_ID)}): "
                                      "a private stream cannot be passed as public")
        recorded = (private.get_string_custom_property(EXAMPLES_GRANT_ID)
                    if private.has_custom_property(EXAMPLES_GRANT_ID) else "")
        if recorded != grant.grant_id:
            raise MissingGrantError(
                f"the private examples were read under grant {recorded or 'none'}, "
                                    f"not {grant.grant_id}: read them with BlockExampleGen from "
                                    "this grant")
        X_pub = _public_features(_files(public, exec_properties.get(spec.PUBLIC_SPLIT_KEY)), keys)
        if len(X_pub) == 0:
            raise InvalidRequestError("no public data to label")
        mean = np.nanmean(X_pub, axis=0)
        std = np.nanstd(X_pub, axis=0)
        std[~(std > 0)] = 1.0
        X_pub = (np.where(np.isnan(X_pub), mean, X_pub) - mean) / std
        model = _one(output_dict, spec.MODEL_KEY, what="Model output")
        from sage_tfx.ledger import open_ledger
        from sage_tfx.ledger.releases import (check_part_claim, claim_part, part_release_name,
                                              release_tree_once)
        with open_ledger(grant_artifact.ledger_url) as ledger:
            report_delta = float(
                ledger.stream(grant.stream).delta_g) if grant.mode == "rdp" else None
            eps, dlt, event, part = _train_cost(grant_artifact, grant)
            # One spender per plan part: refused before anything is read if another trainer
            # claimed it; claimed before the first release (the labels).
            check_part_claim(ledger, grant.grant_id, part, COMPONENT)
            labels_release = part_release_name(part, LABELS_OUTPUT)
            plan = labels_from_grant(config, epsilon=eps, delta=dlt, event=event,
                                     public_size=len(X_pub), report_delta=report_delta)
            files = _files(private, exec_properties.get(spec.SPLIT_KEY))
            salt = (
                exec_properties.get(spec.SALT_KEY) or f"sage-tfx-bagging:{grant.stream}").encode()
            cache = (TeacherCache(exec_properties.get(spec.CACHE_DIR_KEY), ledger=ledger)
                     if exec_properties.get(spec.CACHE_DIR_KEY) else None)
            blocks = sorted(b.block_id for b in grant.blocks)
            settings = {"l2": config.l2, "keys": keys}
            max_labels = exec_properties.get(spec.MAX_LABELS_KEY)
            key = cache_key(stream=grant.stream, blocks=blocks, k=config.k, n=config.n, salt=salt,
                            kind=config.teacher, settings=settings)
            request = purchase.purchase_request(config, stream=grant.stream,
                                                blocks=blocks, salt=salt,
                                                X_public=X_pub, settings=settings,
                                                max_labels=max_labels)
            # a re-execution with other settings under this grant is refused, not replayed silently
            purchase.recorded_purchase(ledger, grant.grant_id, request, labels_release)

            def label(start, stop):
                return self._label(config, plan, files, keys, exec_properties, mean, std, salt,
                                   X_pub[start:stop], cache, key, (grant.stream, blocks))

            def produce_into(staging):
                claim_part(ledger, grant.grant_id, part, COMPONENT)
                bought = purchase.buy_labels(
                    ledger, grant.grant_id, label=label, exact=plan.formally_dp, request=request,
                    cursor=purchase.cursor_name(stream=grant.stream, blocks=blocks, config=config,
                                                salt=salt, settings=settings),
                    reserve=purchase.reservation(plan.queries, public_size=len(X_pub),
                                                 max_labels=max_labels),
                    public_size=len(X_pub), name=labels_release)
                student = train_student(X_pub[bought.public_index], bought.labels, l2=config.l2)
                export_student(student, mean, std, keys, path_utils.serving_model_path(staging))
                charge = (
                    {"event": json.loads(grant_artifact.event_json)} if grant.event is not None
                          else {"epsilon": grant.epsilon, "delta": grant.delta})
                report = {**bought.report, "grant_id": grant.grant_id, "stream": grant.stream,
                          "k": config.k, "n": config.n, "teacher": config.teacher,
                          # the whole run's charge (all plan parts) sits on every block of the
                          # window
                          "per_block_charge": {b: charge for b in blocks}}
                with open(os.path.join(staging, spec.PRIVACY_REPORT_FILE), "w") as f:
                    f.write(json.dumps(report, indent=2, sort_keys=True))

            outcome = release_tree_once(ledger, grant.grant_id,
                                        part_release_name(part, MODEL_OUTPUT), model.uri,
                                        produce_into)
        with fileio.open(os.path.join(model.uri, spec.PRIVACY_REPORT_FILE)) as f:
            report = json.loads(f.read())
        _record_on_model(model, report)
        how = ("replayed the release recorded under grant %s (no noise drawn, nothing charged)"
               if outcome.replayed else "released under grant %s")
        if report["formally_dp"]:
            logging.info(
                "DPBaggingTrainer: %d public points labelled (fixed_queries), epsilon=%.4g "
                         "delta=%.3g; " + how, report["queries"], report["epsilon"],
                         report["delta"],
                         grant.grant_id)
        else:   # the answer count is data-dependent: not logged
            logging.warning("DPBaggingTrainer: paper mode, NOT differentially private (opted in "
                            "with %s): the whole grant epsilon=%.4g delta=%.3g was charged; " + how,
                            spec.NON_DP_OPT_IN_KEY, report["epsilon"],
                            report["delta"], grant.grant_id)

    def _beam_options(self):
        from apache_beam.options.pipeline_options import PipelineOptions
        return PipelineOptions(list(getattr(self, "_beam_pipeline_args", []) or []))

    def _label(self, config, plan, files, keys, props, mean, std, salt, pool, cache, key,
               window):
        from sage_tfx.components.dp_bagging_trainer.beam_flow import run_teacher_flow

        scratch = tempfile.mkdtemp(prefix="dp-bagging-")
        try:
            counts, units = None, None

            def train():
                nonlocal counts, units
                ens, counts, units = run_teacher_flow(
                    files, read_records=_read_records, feature_keys=keys,
                    label_key=props.get(spec.LABEL_KEY), unit_key=props.get(spec.UNIT_KEY),
                    mean=mean, std=std, k=config.k, n=config.n, salt=salt, kind=config.teacher,
                    l2=config.l2, X_vote=pool[:plan.queries] if plan.queries else None,
                    scratch=scratch, beam_options=self._beam_options())
                if not units:
                    raise InvalidRequestError("the private window is empty")
                if config.n > len(units):
                    raise InvalidRequestError(f"n = {config.n} teachers per partition but only "
                                              f"{len(units)} privacy units in the window")
                return {"ensemble": ens, "units": sorted(units, key=str)}

            entry = cache.get_or_train(key, train, window=window) if cache else train()
            ensemble, units_all = entry["ensemble"], entry["units"]
            if plan.formally_dp:
                if counts is None:      # cached teachers: votes in the driver
                    from sage_tfx.bagging import vote_counts
                    counts = vote_counts(ensemble, pool[:plan.queries])
                return fixed_labels(counts, k=config.k, lam=config.lam,
                                    accountant=config.accountant,
                                    epsilon=plan.epsilon, delta=plan.delta, votes=config.votes,
                                    bound=plan.bound)
            unit_chunks = chunk_assignment(units_all, k=config.k, n=config.n, salt=salt)
            return label_public(ensemble, pool, epsilon=plan.epsilon,
                                delta=plan.delta, lam=config.lam,
                                mode="paper", unit_chunks=unit_chunks,
                                accept_not_differentially_private=(
                                    config.accept_not_differentially_private))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
