"""DPModelValidator executor: Sage's SLAed DP validation of a model, written as a ModelBlessing.

Sage §3.3 (SLAed DP validation, List. 2): the model's per-example losses (or 0/1 correctness) on
the held-out ``eval`` split are reduced to a DP count and a DP sum of clipped values
(``sage_tfx.dp.validation``), corrected for the DP noise and bounded with Bernstein's inequality.
The decision is ACCEPT, REJECT or RETRY; only ACCEPT blesses the model.

Privacy. The validator spends exactly the ``validate`` part of the run's privacy plan, which the
gate charged to the granted blocks together with the other stages (``sage_tfx.adaptive.plan``):

* basic plans: the part's ε (its δ, if any, is not needed: validation is (ε, 0)-DP);
* rdp plans: the part's DpEvent must be this validator's own ``dp_event(ε)`` (two Laplace
  mechanisms of noise multiplier 2/ε); ε is recovered from it and the event is re-derived and
  compared, so the noise drawn is exactly what was charged. Any other event is refused.

Everything this executor publishes (blessing properties, ``validation.json``, logs) is a
post-processing of the DP count and sum. The raw eval loss, the raw number of eval examples and
per-example values are never written or logged. Per-example values that cannot be computed (a
missing or non-numeric label, a NaN prediction, a log-loss prediction outside [0, 1]) count as
the worst value (loss B, or a wrong prediction) rather than raising, because an exception that
depends on the eval data would itself release information.

Released once. The validation result (``ValidationResult.to_dict()``: the DP quantities and the
decision) is recorded against the grant (``release_io.release_json_once``, name
:data:`RELEASE_NAME`) with the run's request (:func:`release_request`: the configuration, ε and
the model's digest) before the blessing is written. A retried or re-run execution under the same
grant gets the recorded result byte for byte and writes the same decision without loading the
model, reading an example or drawing noise; validating another model or with another
configuration under the same grant is refused (``ReleaseConflictError``, recorded as the
blessing's ``reason``; NOT_BLESSED). The blessing carries ``replayed`` = 0/1.

Baseline comparison (optional ``baseline_model``, e.g. from a ``LatestBlessedModelStrategy``
resolver): a second DP release on the same eval examples, spending the plan's ``baseline`` part,
under ``baseline/comparison``; the model is blessed only if it is also "not worse" than the
baseline at the configured confidence (``components/dp_validator/baseline.py``).

Assumptions, beyond those of ``sage_tfx.dp.validation``: the eval split was not used in training,
and its records come from the granted blocks (an Examples artifact that records a ``grant_id``,
as BlockExampleGen's do, must name this grant). Only a model its Sage trainer recorded as
trained and verified under this grant is validated (``check_trained_model``): a model of unknown
privacy is refused with the reason, never blessed.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Callable, Dict, List, Optional

from absl import logging
from dp_accounting import dp_event as dp_event_lib
from tfx import types
from tfx.dsl.components.base import base_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils
from tfx.utils import path_utils

from sage_tfx.ledger import accounting
from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.dp import validation
from sage_tfx.dp.comparison import ComparisonResult
from sage_tfx.components import artifacts, plan_io, release_io
from sage_tfx.components.block_example_gen.executor import verify_grant
from sage_tfx.components.block_example_gen.spec import GRANT_ID_PROPERTY as EXAMPLES_GRANT_ID
from sage_tfx.components.dp_trainer import guarantee as trainer_guarantee
from sage_tfx.components.dp_trainer.guarantee import MEMBERSHIP_FILE_NAME
from sage_tfx.components.dp_validator import baseline, spec
from sage_tfx.components.dp_validator.data import (ServingModel, eval_files, label_values,  # noqa: F401
                                                   labels_and_predictions, per_example_values)
from sage_tfx.errors import MissingGrantError, ReleaseConflictError
from sage_tfx.ledger import open_ledger, releases

# The release of a DPModelValidator run: its DP validation result (the noisy count and sum, the
# bounds and the decision), once per grant, keyed by the validate part it spends (claimed for
# DPModelValidator: no second validator spends the part).
COMPONENT = "DPModelValidator"
RELEASE_NAME = releases.part_release_name(plan_lib.VALIDATE, "validation")


# ---------------------------------------------------------------------------------------------
# Configuration: checked once, by the component at construction and by the executor at run time.


@dataclasses.dataclass(frozen=True)
class ValidatorConfig:
    """A DPModelValidator's configuration, checked (see :func:`check_config`)."""

    metric: str
    loss_fn: Optional[str]
    target: float
    loss_bound: float
    eta: float
    label_key: str
    prediction_key: Optional[str]
    eval_split: str
    signature_name: str
    batch_size: int

    def validator(self) -> "validation.LossValidator | validation.AccuracyValidator":
        """The Sage validator of ``sage_tfx.dp.validation`` this configuration describes."""
        if self.metric == spec.ACCURACY:
            return validation.AccuracyValidator(target=self.target, eta=self.eta)
        return validation.LossValidator(target=self.target, loss_bound=self.loss_bound,
                                        eta=self.eta, metric_name=self.loss_fn)


def _check_name(name: str, value: Any, optional: bool = False) -> Optional[str]:
    if optional and (value is None or value == ""):
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def check_config(*, metric: Any, loss_fn: Any = None, target: Any, loss_bound: Any = None,
                 eta: Any = spec.DEFAULT_ETA, label_key: Any, prediction_key: Any = None,
                 eval_split: Any = spec.DEFAULT_EVAL_SPLIT,
                 signature_name: Any = spec.DEFAULT_SIGNATURE_NAME,
                 batch_size: Any = spec.DEFAULT_BATCH_SIZE) -> ValidatorConfig:
    """Checks a validator's arguments and fills in the defaults that depend on the metric.

    ``loss_fn`` defaults to ``squared_error`` for the ``loss`` metric and must be unset for
    ``accuracy``; ``loss_bound`` (B) is required for ``loss`` and is 1 for ``accuracy``.
    Nothing is clamped: a bad value raises.

    Returns:
      The checked ValidatorConfig (its ``validator()`` builds without error).

    Raises:
      ValueError: an unknown metric or loss_fn, a missing or invalid B, target, η, batch size
        or name.
    """
    if metric not in spec.METRICS:
        raise ValueError(f"metric must be one of {spec.METRICS}, got {metric!r}")
    loss_fn = None if loss_fn == "" else loss_fn
    if metric == spec.ACCURACY:
        if loss_fn is not None:
            raise ValueError(f"loss_fn applies to metric 'loss' only; metric 'accuracy' is the "
                             f"binary accuracy at threshold {spec.ACCURACY_THRESHOLD}, got "
                             f"loss_fn={loss_fn!r}")
        if loss_bound is not None and loss_bound != 1.0:
            raise ValueError(f"accuracy is a 0/1 metric: loss_bound must be 1 or unset, got "
                             f"{loss_bound!r}")
        loss_bound = 1.0
    else:
        loss_fn = spec.SQUARED_ERROR if loss_fn is None else loss_fn
        if loss_fn not in spec.LOSS_FNS:
            raise ValueError(f"loss_fn must be one of {spec.LOSS_FNS}, got {loss_fn!r}")
        if loss_bound is None:
            raise ValueError(
                "metric 'loss' needs loss_bound B: per-example losses are clipped to [0, B] and "
                "the DP noise on their sum scales with B (List. 2 line 15)")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    config = ValidatorConfig(
        metric=metric, loss_fn=loss_fn, target=target, loss_bound=loss_bound, eta=eta,
        label_key=_check_name("label_key", label_key),
        prediction_key=_check_name("prediction_key", prediction_key, optional=True),
        eval_split=_check_name("eval_split", eval_split),
        signature_name=_check_name("signature_name", signature_name), batch_size=batch_size)
    validator = config.validator()  # checks target, eta and B (ValueError)
    return dataclasses.replace(config, target=validator.target, eta=validator.eta,
                               loss_bound=validator.loss_bound)


def config_from_exec_properties(exec_properties: Dict[str, Any]) -> ValidatorConfig:
    """:func:`check_config` on a DPModelValidator's exec properties."""
    def get(key, default=None):
        value = exec_properties.get(key)
        return default if value is None else value
    return check_config(
        metric=get(spec.METRIC_KEY), loss_fn=get(spec.LOSS_FN_KEY),
        target=get(spec.TARGET_KEY), loss_bound=get(spec.LOSS_BOUND_KEY),
        eta=get(spec.ETA_KEY, spec.DEFAULT_ETA), label_key=get(spec.LABEL_KEY),
        prediction_key=get(spec.PREDICTION_KEY),
        eval_split=get(spec.EVAL_SPLIT_KEY, spec.DEFAULT_EVAL_SPLIT),
        signature_name=get(spec.SIGNATURE_NAME_KEY, spec.DEFAULT_SIGNATURE_NAME),
        batch_size=get(spec.BATCH_SIZE_KEY, spec.DEFAULT_BATCH_SIZE))


# ---------------------------------------------------------------------------------------------
# Privacy: the plan's validate part.


def _epsilon_of_event(event: dp_event_lib.DpEvent) -> Optional[float]:
    """ε if ``event`` has the shape of ``dp_event(ε)`` (two Laplace(2/ε) events), else None."""
    if not isinstance(event, dp_event_lib.ComposedDpEvent) or len(event.events) != 2:
        return None
    first = event.events[0]
    if not isinstance(first, dp_event_lib.LaplaceDpEvent):
        return None
    multiplier = first.noise_multiplier
    if (isinstance(multiplier, bool) or not isinstance(multiplier, (int, float))
            or not math.isfinite(multiplier) or multiplier <= 0):
        return None
    return 2.0 / float(multiplier)


def validation_epsilon(plan: plan_lib.PrivacyPlan, validator: Any,
                       part_name: str = plan_lib.VALIDATE) -> float:
    """The ε the validator may spend: exactly the plan's ``validate`` part (or ``part_name``:
    the baseline comparison spends the ``baseline`` part the same way).

    Args:
      plan: the run's privacy plan, already verified against the charged grant.
      validator: the validator (or comparator) that will spend it (its ``dp_event(ε)`` is what
        it consumes).
      part_name: the plan part.

    Returns:
      ε (finite, > 0). In basic mode the part's ε; in rdp mode the ε whose
      ``validator.dp_event(ε)`` is the part's event (compared as canonical JSON).

    Raises:
      MissingGrantError: no such part, or an rdp part whose event is not
        ``validator.dp_event(ε)`` for any ε (the validator would spend something not charged).
    """
    part = plan.part(part_name)
    if part.event is None:
        epsilon = accounting.check_epsilon(part.epsilon, f"{part_name}.epsilon")
        if part.delta:
            logging.warning("DPModelValidator: the plan's %s part charged delta=%s; it is "
                            "(epsilon, 0)-DP and spends none of it", part_name, part.delta)
        return epsilon
    charged = accounting.event_to_json(part.event)
    epsilon = _epsilon_of_event(part.event)
    if epsilon is not None and math.isfinite(epsilon) and epsilon > 0:
        if accounting.event_to_json(validator.dp_event(epsilon)) == charged:
            return epsilon
    raise MissingGrantError(
        f"the plan's {part_name} part charged the DpEvent {charged}, which is not this "
        "validator's dp_event(epsilon) (a ComposedDpEvent of two "
        "LaplaceDpEvent(noise_multiplier=2/epsilon): the DP count and the DP sum); refusing to "
        f"spend a budget that was not charged. Build the part as PlanPart('{part_name}', "
        "event=validator.dp_event(epsilon))")


def check_examples_grant(examples: types.Artifact, grant_id: str) -> None:
    """Refuses Examples that record a grant other than the one whose plan pays for validation.

    Raises:
      MissingGrantError: the Examples artifact's ``grant_id`` custom property names another grant.
    """
    if examples.has_custom_property(EXAMPLES_GRANT_ID):
        recorded = examples.get_string_custom_property(EXAMPLES_GRANT_ID)
        if recorded and recorded != grant_id:
            raise MissingGrantError(
                f"the eval Examples ({examples.uri}) were read under grant {recorded}, but the "
                f"grant input is {grant_id}: validation must spend the plan charged for the data "
                "it reads")


def check_trained_model(model: types.Artifact, grant_id: str) -> None:
    """Refuses a model whose trainer did not record a verified DP training under this grant.

    A Sage trainer writes the Model's ``grant_id`` only after checking what it ran against the
    grant's plan (DnDTrainer: its RunBudget; DPTrainer: its own privacy loop, marked
    ``dp_verification = "observed"``). A model without that record — the stock Trainer's, or one
    whose DP training the trainer did not observe — has no known privacy: it is never blessed.

    Raises:
      UnverifiedTrainingError: no record of this grant, or a DPTrainer model not verified from
        what ran.
    """
    prop = spec.GRANT_ID_PROPERTY
    recorded = model.get_string_custom_property(prop) if model.has_custom_property(prop) else ""
    if recorded != grant_id:
        raise trainer_guarantee.UnverifiedTrainingError(
            f"the model {model.uri} records no DP training under grant {grant_id} (its "
            f"{prop!r} is {recorded!r}): only a model a Sage trainer (DPTrainer, DnDTrainer) "
            "trained and verified under this grant is validated and blessed")
    verification = trainer_guarantee.VERIFICATION_PROPERTY
    if model.has_custom_property("dp_algorithm") and (
            not model.has_custom_property(verification)
            or model.get_string_custom_property(verification) != trainer_guarantee.OBSERVED):
        raise trainer_guarantee.UnverifiedTrainingError(
            f"the DPTrainer model {model.uri} was not verified from the training the executor "
            f"ran ({verification!r} is not {trainer_guarantee.OBSERVED!r}): its privacy is what "
            "a run_fn reported, not what ran")


def refuse_not_dp_model(model: types.Artifact, blessing: types.Artifact) -> bool:
    """True (and the blessing says why) if ``model`` was trained without a DP guarantee.

    A model whose artifact carries ``not_differentially_private = 1`` (its trainer ran a
    non-DP mode under an explicit opt-in) is never blessed as DP, whatever its accuracy: the
    opt-in was to train it, not to release it as a DP model. Nothing is read or spent.
    """
    if not (model.has_custom_property(spec.NOT_DP_PROPERTY)
            and model.get_int_custom_property(spec.NOT_DP_PROPERTY) == 1):
        return False
    blessing.set_int_custom_property(spec.NOT_DP_PROPERTY, 1)
    blessing.set_string_custom_property(spec.REASON_PROPERTY, (
        f"the model {model.uri} is not differentially private (its trainer ran under an explicit "
        "non-DP opt-in): a DP validator never blesses it"))
    logging.warning("DPModelValidator: NOT_BLESSED: %s",
                    blessing.get_string_custom_property(spec.REASON_PROPERTY))
    return True


# ---------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------
# The decision (Evaluator's blessing layout).


def _write_marker(blessing: types.Artifact, blessed: bool) -> None:
    """Exactly one of BLESSED / NOT_BLESSED, and the int property ``blessed`` saying the same."""
    fileio.makedirs(blessing.uri)
    for name in (spec.BLESSED_FILE_NAME, spec.NOT_BLESSED_FILE_NAME):
        path = os.path.join(blessing.uri, name)
        if fileio.exists(path):
            fileio.remove(path)
    name = spec.BLESSED_FILE_NAME if blessed else spec.NOT_BLESSED_FILE_NAME
    with fileio.open(os.path.join(blessing.uri, name), "w") as f:
        f.write("")
    blessing.set_int_custom_property(
        spec.BLESSED_PROPERTY, spec.BLESSED_VALUE if blessed else spec.NOT_BLESSED_VALUE)


def read_membership_audit(model: types.Artifact) -> Optional[dict]:
    """The DPTrainer's membership-inference audit of ``model`` (``membership_inference.json``),
    or None if the run_fn wrote none. Not DP: shown next to the decision, never used by it."""
    path = os.path.join(model.uri, MEMBERSHIP_FILE_NAME)
    if not fileio.exists(path):
        return None
    with fileio.open(path) as f:
        return json.loads(f.read())


def write_decision(blessing: types.Artifact, result: validation.ValidationResult, *,
                   loss_bound: float, grant_id: str, model: types.Artifact,
                   membership: Optional[dict] = None, not_worse: bool = True,
                   baseline_comparison: Optional[dict] = None) -> None:
    """Writes a validation result as a ModelBlessing: blessed iff the outcome is ACCEPT (and,
    with a baseline comparison, ``not_worse``; its record goes to ``validation.json``).

    Only the DP quantities of ``result`` are recorded (custom properties, and the full
    ``result.to_dict()`` in ``validation.json``), plus the trainer's membership-inference audit
    of the model if it wrote one (``membership_auc`` / ``membership_advantage`` properties and
    ``validation.json["membership_inference"]``; an audit, not a DP quantity).
    """
    _write_marker(blessing, result.outcome == validation.Outcome.ACCEPT and not_worse)
    blessing.set_string_custom_property(spec.OUTCOME_PROPERTY, result.outcome.value)
    blessing.set_string_custom_property(spec.METRIC_NAME_PROPERTY, result.metric_name)
    for key in spec.RESULT_FLOAT_PROPERTIES:
        value = float(getattr(result, key))
        if math.isfinite(value):  # MLMD cannot store ±inf / NaN; validation.json has them
            blessing.set_float_custom_property(key, value)
    blessing.set_float_custom_property(spec.LOSS_BOUND_PROPERTY, float(loss_bound))
    blessing.set_string_custom_property(spec.GRANT_ID_PROPERTY, grant_id)
    blessing.set_string_custom_property(spec.CURRENT_MODEL_PROPERTY, model.uri)
    blessing.set_int_custom_property(spec.CURRENT_MODEL_ID_PROPERTY, model.id)
    record = result.to_dict()
    if baseline_comparison is not None:
        record[spec.BASELINE_COMPARISON_FIELD] = baseline_comparison
    if membership is not None:
        record["membership_inference"] = membership
        blessing.set_float_custom_property(spec.MEMBERSHIP_AUC_PROPERTY, float(membership["auc"]))
        blessing.set_float_custom_property(spec.MEMBERSHIP_ADVANTAGE_PROPERTY,
                                           float(membership["attacker_advantage"]))
    with fileio.open(os.path.join(blessing.uri, spec.VALIDATION_FILE_NAME), "w") as f:
        f.write(json.dumps(record, sort_keys=True, indent=2))


def model_values(config: ValidatorConfig, examples: types.Artifact,
                 model_artifact: types.Artifact) -> Any:
    """The model's per-example values (losses or correctness) on the eval split, in file order
    (so two models' values are aligned example by example). Never published."""
    files = eval_files(examples, config.eval_split)
    model = ServingModel(
        path_utils.serving_model_path(model_artifact.uri,
                                      path_utils.is_old_model_artifact(model_artifact)),
        signature_name=config.signature_name, prediction_key=config.prediction_key)
    labels, predictions = labels_and_predictions(
        files, model, label_key=config.label_key, batch_size=config.batch_size)
    return per_example_values(config.metric, config.loss_fn, labels, predictions)


def validate_model(config: ValidatorConfig, validator: Any, epsilon: float,
                   examples: types.Artifact, model_artifact: types.Artifact,
                   values: Optional[Callable[[], Any]] = None) -> validation.ValidationResult:
    """Runs the model on the eval split and draws the DP validation (OpenDP noise, never
    seeded): what a DPModelValidator releases, called only when the ledger has no release of
    this grant's validation. ``values``: the model's per-example values, if already computed."""
    if values is None:
        return validator.validate(model_values(config, examples, model_artifact),
                                  epsilon=epsilon)
    return validator.validate(values(), epsilon=epsilon)


def release_request(config: ValidatorConfig, epsilon: float,
                    model_artifact: types.Artifact) -> dict:
    """What a DPModelValidator run asks, recorded with its release: the configuration that
    decides the outcome, ε, and the model by digest (a replay validates the same model or is
    refused; the eval examples are fixed by the grant)."""
    fields = dataclasses.asdict(config)
    fields.pop("batch_size")  # how many examples per model call: no bearing on the result
    return {"component": "DPModelValidator", "plan_part": plan_lib.VALIDATE, **fields,
            "epsilon": epsilon, "model_sha256": release_io.tree_digest(model_artifact.uri)}


def _baseline_model(input_dict: Dict[str, List[types.Artifact]],
                    compare: Optional["baseline.BaselineConfig"]) -> Optional[types.Artifact]:
    """The resolved baseline model, or None (no channel, or a resolver that found none).

    Raises:
      ValueError: a baseline without ``compare_baseline``, or more than one.
    """
    models = list(input_dict.get(spec.BASELINE_MODEL_KEY) or [])
    if models and compare is None:
        raise ValueError(f"a {spec.BASELINE_MODEL_KEY} was given but {spec.COMPARE_BASELINE_KEY} "
                         "is not set: build the validator with baseline_model=...")
    if len(models) > 1:
        raise ValueError(f"expected at most one {spec.BASELINE_MODEL_KEY}, got {len(models)}")
    return models[0] if models else None


class Executor(base_executor.BaseExecutor):
    """Validates a model with Sage's SLAed DP validator at the plan's validate ε."""

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        """Reads the plan, runs the model on the eval split, writes the DP decision.

        The blessing is NOT_BLESSED from the start: if anything below raises, the artifact still
        holds a decision and it is not a blessing.

        Args:
          input_dict: ``examples`` (Examples), ``model`` (Model), ``grant`` (SageGrant); one
            artifact each; optionally ``baseline_model`` (none or one Model: what a
            LatestBlessedModelStrategy resolver found), compared if ``compare_baseline``.
          output_dict: ``blessing``: a list of one ModelBlessing artifact.
          exec_properties: the keys of ``sage_tfx.components.dp_validator.spec``.

        Raises:
          MissingGrantError: no grant, a denial, no privacy plan, no ``validate`` part, an rdp
            part that is not this validator's event, eval Examples of another grant, or a grant
            the ledger does not confirm; with ``compare_baseline``, the same for the ``baseline``
            part. Raised before the model or any example is read.
          UnverifiedTrainingError: a model without its trainer's verified record of this grant
            (``check_trained_model``); also raised before anything is read.
          ReleaseConflictError: the grant already released a validation (or a comparison) for
            another model, baseline or configuration.
          ValueError, FileNotFoundError: bad configuration, split, model or signature.
        """
        self._log_startup(input_dict, output_dict, exec_properties)
        blessing = artifact_utils.get_single_instance(output_dict[spec.BLESSING_KEY])
        _write_marker(blessing, blessed=False)
        stale = os.path.join(blessing.uri, spec.VALIDATION_FILE_NAME)
        if fileio.exists(stale):  # a retried execution: no result until this one has one
            fileio.remove(stale)
        config = config_from_exec_properties(exec_properties)
        validator = config.validator()
        examples = artifact_utils.get_single_instance(input_dict[spec.EXAMPLES_KEY])
        model_artifact = artifact_utils.get_single_instance(input_dict[spec.MODEL_KEY])
        grant_artifact = artifact_utils.get_single_instance(input_dict[spec.GRANT_INPUT_KEY])
        compare = baseline.baseline_config(exec_properties, config.eta)
        baseline_model = _baseline_model(input_dict, compare)
        comparator = baseline.comparator(config, compare) if compare is not None else None
        try:
            plan = plan_io.read_plan(grant_artifact)
            grant = artifacts.read_grant(grant_artifact)
            epsilon = validation_epsilon(plan, validator)
            if comparator is not None:
                baseline_epsilon = validation_epsilon(plan, comparator, spec.BASELINE_PART)
            check_examples_grant(examples, grant.grant_id)
            url = release_io.ledger_url_for(
                grant_artifact, exec_properties.get(spec.LEDGER_URL_KEY),
                component="DPModelValidator")
        except MissingGrantError as e:
            blessing.set_string_custom_property(spec.REASON_PROPERTY, str(e))
            raise
        if refuse_not_dp_model(model_artifact, blessing):  # NOT_BLESSED is already written
            return
        try:
            check_trained_model(model_artifact, grant.grant_id)
        except trainer_guarantee.UnverifiedTrainingError as e:
            blessing.set_string_custom_property(spec.REASON_PROPERTY, str(e))
            raise

        request = release_request(config, epsilon, model_artifact)
        cache: list = []

        def candidate_values():  # the candidate's values, computed once for both releases
            if not cache:
                cache.append(model_values(config, examples, model_artifact))
            return cache[0]

        compared = None
        with open_ledger(url) as ledger:
            try:
                grant = verify_grant(grant, ledger, ledger.redacted_url)
                released = release_io.release_json_once(
                    ledger, grant.grant_id, RELEASE_NAME,
                    lambda: validate_model(config, validator, epsilon, examples,
                                           model_artifact, candidate_values).to_dict(),
                    request=request, component=COMPONENT, artifacts=[blessing],
                    part=plan_lib.VALIDATE)
                if baseline_model is not None:
                    compared = baseline.compare_once(
                        ledger, grant.grant_id, comparator, baseline_epsilon, candidate_values,
                        lambda: model_values(config, examples, baseline_model),
                        baseline.release_request(config, compare, baseline_epsilon,
                                                 model_artifact, baseline_model))
            except (MissingGrantError, ReleaseConflictError) as e:
                blessing.set_string_custom_property(spec.REASON_PROPERTY, str(e))
                raise
        result = validation.ValidationResult.from_dict(released.value)
        comparison = (ComparisonResult.from_dict(compared.value) if compared is not None
                      else None)
        record = (baseline.write_properties(blessing, compare, comparison, compared,
                                            baseline_model) if compare is not None else None)

        membership = read_membership_audit(model_artifact)
        write_decision(blessing, result, loss_bound=config.loss_bound,
                       grant_id=grant.grant_id, model=model_artifact, membership=membership,
                       not_worse=baseline.not_worse(compare, comparison),
                       baseline_comparison=record)
        if comparison is not None:
            logging.info("DPModelValidator: against the baseline %s: %s (DP difference %.6g, "
                         "bounds [%.6g, %.6g], tolerance %s, eta %s, epsilon %s)",
                         baseline_model.uri, comparison.outcome.value,
                         comparison.dp_difference, comparison.lower_bound,
                         comparison.upper_bound, comparison.tolerance, comparison.eta,
                         comparison.epsilon)
        if membership is not None:
            logging.info("DPModelValidator: trainer's membership-inference audit of the model "
                         "(not DP): AUC %.3f, attacker advantage %.3f", membership["auc"],
                         membership["attacker_advantage"])
        # Only DP quantities are logged: the raw loss and example count are never released.
        logging.info("DPModelValidator: grant %s, %s target %s at epsilon=%s, eta=%s: %s "
                     "(DP estimate %.6g, bounds [%.6g, %.6g], DP count %.1f)", grant.grant_id,
                     result.metric_name, result.target, epsilon, result.eta,
                     result.outcome.value, result.dp_estimate, result.lower_bound,
                     result.upper_bound, result.n_test_dp)
