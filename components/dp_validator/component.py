"""DPModelValidator: Sage's SLAed DP model validation (§3.3, List. 2) as a TFX component.

The validator runs the trained model's serving signature on the held-out eval split, releases a
DP count and a DP sum of per-example losses (or 0/1 correctness) at exactly the ε of the privacy
plan's ``validate`` part, and decides ACCEPT / REJECT / RETRY with a high-probability guarantee:
P[ACCEPT and the true metric misses its target] ≤ η. The decision is a standard
``ModelBlessing`` (Evaluator's layout), so stock Pusher pushes only ACCEPTed models::

    plan = PrivacyPlan.of(PlanPart("train", ...), PlanPart("validate", 0.1))
    gate = SageGate(ledger_url=LEDGER, stream="taxi", window_last=30, **plan.cost())
    # ... BlockExampleGen(grant=gate.outputs["grant"]) -> Transform -> Trainer ...
    validator = DPModelValidator(
        examples=example_gen.outputs["examples"], model=trainer.outputs["model"],
        grant=gate.outputs["grant"], label_key="tips", metric="loss",
        loss_fn="squared_error", loss_bound=1.0, target=0.01, eta=0.05)
    pusher = tfx.components.Pusher(model=trainer.outputs["model"],
                                   model_blessing=validator.outputs["blessing"], ...)
    # or: with tfx.dsl.Cond(validator.outputs["blessing"].future()[0]
    #                       .custom_property("blessed") == 1): ...

RETRY and REJECT are NOT_BLESSED (``blessed`` = 0); the ``outcome`` custom property tells them
apart for the privacy-adaptive runner (retry with more data or a larger ε, or give up).
"""
from __future__ import annotations

from typing import Any, Optional

from tfx import types
from tfx.dsl.components.base import base_component, executor_spec
from tfx.dsl.placeholder import placeholder as ph
from tfx.types import standard_artifacts

from sage_tfx.components.dp_validator import baseline, executor
from sage_tfx.components.dp_validator import spec
from sage_tfx.components.gate.executor import check_ledger_url


def _dynamic(value: Any) -> bool:
    """A value resolved only at run time (placeholder or RuntimeParameter): not checked here."""
    return isinstance(value, ph.Placeholder) or type(value).__name__ == "RuntimeParameter"


class DPModelValidator(base_component.BaseComponent):
    """Validates a model with Sage's SLAed DP validator; outputs a ``ModelBlessing``.

    Component ``inputs`` contains:
      - ``examples``: Channel of type ``standard_artifacts.Examples`` (validated on the
        ``eval_split`` split, gzip TFRecords of tf.Example, e.g. from BlockExampleGen).
      - ``model``: Channel of type ``standard_artifacts.Model`` (a SavedModel under
        ``Format-Serving`` whose serving signature takes serialized tf.Examples).
      - ``grant``: Channel of type ``SageGrant`` whose privacy plan has a ``validate`` part.
    Component ``outputs`` contains:
      - ``blessing``: Channel of type ``standard_artifacts.ModelBlessing``:
          - ``{uri}/BLESSED`` (ACCEPT) or ``{uri}/NOT_BLESSED`` (REJECT, RETRY, or a failed
            run), and ``{uri}/validation.json``: ``ValidationResult.to_dict()`` (DP quantities);
          - custom properties ``blessed`` (1 iff ACCEPT), ``outcome`` ("ACCEPT" / "REJECT" /
            "RETRY"), ``metric_name``, ``target``, ``dp_estimate``, ``upper_bound``,
            ``lower_bound``, ``n_test_dp``, ``epsilon``, ``delta``, ``eta``, ``loss_bound``,
            ``grant_id``, ``current_model``, ``current_model_id``, ``replayed`` (1 if this
            execution replayed the validation recorded for its grant: see the executor),
            ``release_name``, ``release_digest``. A non-finite bound (no evidence) is left out
            of the properties, as MLMD cannot store ±inf. With a ``baseline_model`` channel
            also ``baseline_outcome`` (NOT_WORSE / WORSE / INCONCLUSIVE / NO_BASELINE),
            ``baseline_dp_difference``, ``baseline_upper_bound``, ``baseline_lower_bound``,
            ``baseline_n_test_dp``, ``baseline_epsilon``, ``baseline_eta``,
            ``baseline_tolerance``, ``baseline_model``, ``baseline_model_id``,
            ``baseline_replayed``, ``baseline_release_name``, ``baseline_release_digest``, and
            ``validation.json["baseline_comparison"]``; ``blessed`` is 1 iff ACCEPT and
            NOT_WORSE (or NO_BASELINE).
    """

    SPEC_CLASS = spec.DPModelValidatorSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, *, examples: types.BaseChannel, model: types.BaseChannel,
                 grant: types.BaseChannel, label_key: str, target: float,
                 baseline_model: Optional[types.BaseChannel] = None,
                 baseline_tolerance: float = spec.DEFAULT_BASELINE_TOLERANCE,
                 baseline_eta: Optional[float] = None,
                 metric: str = spec.LOSS, loss_fn: Optional[str] = None,
                 loss_bound: Optional[float] = None, eta: float = spec.DEFAULT_ETA,
                 prediction_key: Optional[str] = None,
                 eval_split: str = spec.DEFAULT_EVAL_SPLIT,
                 signature_name: str = spec.DEFAULT_SIGNATURE_NAME,
                 batch_size: int = spec.DEFAULT_BATCH_SIZE,
                 ledger_url: Optional[str] = None):
        """Constructs a DPModelValidator.

        Args:
          examples: Examples holding the held-out eval split (never used in training).
          model: the trained model (e.g. ``trainer.outputs["model"]``).
          grant: the ``grant`` output of the SageGate that charged the run's privacy plan.
          label_key: the tf.Example feature holding the label (a single int or float).
          target: the quality target: the expected loss (metric "loss", lower is better) or the
            expected binary accuracy (metric "accuracy").
          metric: "loss" or "accuracy" (binary, predicted class 1 iff prediction > 0.5).
          loss_fn: for metric "loss": "squared_error" (default), "log_loss" (prediction is a
            probability in [0, 1]) or "absolute_error".
          loss_bound: B, required for metric "loss": losses are clipped to [0, B] (List. 2
            line 15) and the DP noise on their sum scales with B. Accuracy uses B = 1.
          eta: 1 − confidence: P[ACCEPT and the true metric misses the target] ≤ eta (and the
            same for REJECT and meeting it).
          prediction_key: the serving signature's output to validate; optional when it has
            exactly one output.
          eval_split: the split of ``examples`` to validate on.
          signature_name: the SavedModel signature taking serialized tf.Examples.
          batch_size: examples per model call.
          ledger_url: the ledger the validation is released in (and the grant verified
            against); default the one named in the grant artifact.
          baseline_model: a Model channel to compare with, as the Evaluator's (e.g. the
            ``model`` output of a ``tfx.dsl.Resolver`` with
            ``tfx.dsl.experimental.LatestBlessedModelStrategy``). Then the plan needs a
            ``baseline`` part, and the blessing also requires that the model is not worse than
            the baseline (``baseline_tolerance``, at confidence 1 − ``baseline_eta``) on the same
            eval examples. A channel that resolves no model compares nothing
            (``baseline_outcome`` = NO_BASELINE).
          baseline_tolerance: τ ≥ 0, in the metric's units: "not worse" means
            E[loss(model) − loss(baseline)] ≤ τ (accuracy: E[acc(model) − acc(baseline)] ≥ −τ).
            With τ = 0 the model must be shown better; a retrained model of equal quality needs
            τ > 0.
          baseline_eta: 1 − confidence of the comparison (default ``eta``).

        Raises:
          ValueError: an unknown metric or loss_fn, a missing or invalid loss_bound, target,
            eta or batch_size, an empty label_key / split / signature name, a malformed
            ledger_url, a negative or non-finite baseline_tolerance, a bad baseline_eta.
        """
        values = (metric, loss_fn, target, loss_bound, eta, label_key, prediction_key,
                  eval_split, signature_name, batch_size)
        if not any(_dynamic(v) for v in values):
            config = executor.check_config(
                metric=metric, loss_fn=loss_fn, target=target, loss_bound=loss_bound, eta=eta,
                label_key=label_key, prediction_key=prediction_key, eval_split=eval_split,
                signature_name=signature_name, batch_size=batch_size)
            loss_fn, target, loss_bound, eta = (config.loss_fn, config.target,
                                                config.loss_bound, config.eta)
            if baseline_model is not None and not any(
                    _dynamic(v) for v in (baseline_tolerance, baseline_eta)):
                baseline.comparator(config, baseline.BaselineConfig(  # checks τ and η
                    baseline_tolerance, eta if baseline_eta is None else baseline_eta))
        if ledger_url is not None and not _dynamic(ledger_url):
            check_ledger_url(ledger_url)
        super().__init__(spec=spec.DPModelValidatorSpec(
            metric=metric,
            loss_fn=loss_fn,
            target=target,
            loss_bound=loss_bound,
            eta=eta,
            label_key=label_key,
            prediction_key=prediction_key,
            eval_split=eval_split,
            signature_name=signature_name,
            batch_size=batch_size,
            ledger_url=ledger_url,
            compare_baseline=1 if baseline_model is not None else None,
            baseline_tolerance=baseline_tolerance if baseline_model is not None else None,
            baseline_eta=baseline_eta if baseline_model is not None else None,
            examples=examples,
            model=model,
            grant=grant,
            baseline_model=baseline_model,
            blessing=types.Channel(type=standard_artifacts.ModelBlessing),
        ))
