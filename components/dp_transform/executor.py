"""DPTransform executor: the stock TFX Transform, run on the grant's transform share of ε.

Sage §3.1 / List. 1. The executor is TFX's own Transform executor with three changes:

1. **Budget first.** Before anything is read, ``Do`` reads the run's privacy plan from the
   SageGrant (``plan_io.read_plan``: a released grant whose charge equals the plan's cost),
   checks the grant against the ledger (as ``BlockExampleGen`` does: an edited grant.json or
   plan cannot raise the budget), requires the Examples to come from that grant (their
   ``grant_id`` custom property, set by ``BlockExampleGen``), and takes the plan's ``transform``
   part (:func:`privacy.transform_budget`). No grant, a denial, or no ``transform`` part:
   ``MissingGrantError``.
2. **The preprocessing_fn runs under that budget.** ``_GetPreprocessingFn`` (the stock hook that
   resolves ``module_file`` / ``preprocessing_fn``) wraps the user's function as
   ``DPPreprocessingFn(AuditedPreprocessingFn(fn), epsilon=<transform ε>)``. The stock machinery
   then traces, analyzes and writes exactly as Transform does, so ``transform_graph`` and
   ``transformed_examples`` have the stock layout and any Trainer reads them unchanged. Every
   trace is audited (``audit.py``): non-DP analyzers over non-public features are refused, and
   every trace must spend exactly the budget — all in tf.Transform's first trace, before any
   data is read.
3. **Spent = charged.** After the run the budget's spends must be consistent across traces and
   equal to the plan part (basic: Σε; rdp: the same Laplace mechanisms); they are recorded on
   ``transform_graph`` as custom properties (``spec.*_PROPERTY``).

Not supported, on purpose: TFDV pre-/post-transform statistics (exact statistics of the granted
data, not DP: they are always disabled) and the analyzer cache (it stores exact analyzer
accumulators of earlier runs and would skip analyses a new grant pays for).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from absl import logging
from tfx import types
from tfx.components.transform import executor as transform_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils, standard_component_specs
from tfx.utils import io_utils

from sage_tfx.ledger import accounting, secrets
from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.components import artifacts
from sage_tfx.components import plan_io
from sage_tfx.components.block_example_gen import executor as block_example_gen_executor
from sage_tfx.components.block_example_gen import spec as block_example_gen_spec
from sage_tfx.components.dp_transform import budget as budget_lib
from sage_tfx.components.dp_transform import audit
from sage_tfx.components.dp_transform import privacy
from sage_tfx.components.dp_transform import spec
from sage_tfx.errors import MissingGrantError
from sage_tfx.ledger import Grant, open_ledger


def parse_public_features(value: Any) -> tuple[str, ...]:
    """The declared public features from their exec-property JSON (or a list).

    Raises:
      ValueError: not a list of distinct non-empty strings.
    """
    if value is None or value == "":
        return ()
    names = json.loads(value) if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"public_features must be a list of feature names, got {value!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"public_features lists a feature twice: {list(names)}")
    return tuple(names)


def _schema_feature_names(schema_uri: str) -> set:
    schema = io_utils.SchemaReader().read(io_utils.get_only_uri_in_dir(schema_uri))
    names = {f.name for f in schema.feature} | {f.name for f in schema.sparse_feature}
    for group in schema.tensor_representation_group.values():
        names |= set(group.tensor_representation)
    return names


def _single_grant(input_dict: Mapping[str, List[types.Artifact]]) -> types.Artifact:
    grants = input_dict.get(spec.GRANT_INPUT_KEY) or []
    if len(grants) != 1:
        raise MissingGrantError(
            f"DPTransform needs exactly one SageGrant as input '{spec.GRANT_INPUT_KEY}' (the "
            f"SageGate output of this run), got {len(grants)}: DP analyzers may only spend "
            "budget the ledger charged")
    return grants[0]


def verify_with_ledger(grant_artifact: types.Artifact, grant: Grant,
                       ledger_url: Optional[str]) -> Grant:
    """Checks the grant against the ledger that issued it (see BlockExampleGen).

    Raises:
      MissingGrantError: no ledger to ask, a different ledger than the pinned one, or a grant
        the ledger does not hold released as written.
    """
    issued_by = grant_artifact.ledger_url
    url = ledger_url or issued_by
    if not url:
        raise MissingGrantError(
            f"grant artifact {grant_artifact.uri} records no ledger_url and none was given")
    if issued_by and issued_by != url:
        raise MissingGrantError(
            f"grant {grant.grant_id} was issued by ledger {secrets.redact(issued_by)}, but this "
            f"DPTransform only trusts ledger {secrets.redact(url)}")
    with open_ledger(url) as ledger:
        return block_example_gen_executor.verify_grant(grant, ledger, url)


def check_examples_from_grant(examples: Sequence[types.Artifact], grant_id: str) -> None:
    """Raises MissingGrantError unless every Examples artifact was read under ``grant_id``."""
    key = block_example_gen_spec.GRANT_ID_PROPERTY
    for artifact in examples:
        got = (artifact.get_string_custom_property(key)
               if artifact.has_custom_property(key) else None)
        if got != grant_id:
            raise MissingGrantError(
                f"Examples {artifact.uri} were read under grant {got!r}, not under grant "
                f"{grant_id!r} whose plan this DPTransform spends: the ledger charged the "
                "transform epsilon to that grant's blocks only. Feed DPTransform the "
                "BlockExampleGen output of the same SageGate grant")


def _discard_outputs(output_dict: Mapping[str, List[types.Artifact]]) -> None:
    for artifact_list in output_dict.values():
        for artifact in artifact_list:
            if artifact.uri and fileio.exists(artifact.uri):
                io_utils.delete_dir(artifact.uri)
                fileio.makedirs(artifact.uri)


class Executor(transform_executor.Executor):
    """TFX Transform whose preprocessing_fn spends exactly the grant's ``transform`` ε."""

    def __init__(self, context: Optional[Any] = None) -> None:
        super().__init__(context)
        self._budget: Optional[privacy.TransformBudget] = None
        self._public_features: tuple[str, ...] = ()
        self._dp_fn: Optional[budget_lib.DPPreprocessingFn] = None

    def _GetPreprocessingFn(self, inputs: Mapping[str, Any],
                            unused_outputs: Mapping[str, Any]) -> Callable[..., Any]:
        """The user's preprocessing_fn (stock resolution), run under the grant's budget."""
        if self._budget is None:
            raise MissingGrantError(
                "DPTransform resolves its preprocessing_fn only inside Do(), after reading the "
                "grant's privacy plan")
        user_fn = super()._GetPreprocessingFn(inputs, unused_outputs)
        audited = audit.AuditedPreprocessingFn(
            audit.bind_epsilon(user_fn, self._budget.epsilon),
            public_features=self._public_features,
            planned_event_json=self._budget.event_json)
        self._dp_fn = budget_lib.DPPreprocessingFn(audited, self._budget.epsilon)
        return self._dp_fn

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        """Checks the grant, runs the stock Transform under its budget, records the spend.

        Args:
          input_dict: ``examples`` (from BlockExampleGen), ``schema``, ``grant`` (one SageGrant
            holding a plan with a ``transform`` part).
          output_dict: ``transform_graph``, optionally ``transformed_examples``.
          exec_properties: the keys of ``sage_tfx.components.dp_transform.spec``.

        Raises:
          MissingGrantError: no grant, a denial, no plan or no ``transform`` part, a grant the
            ledger does not confirm, or Examples read under another grant.
          audit.NonDPAnalyzerError: a non-DP analyzer over a feature that is not public.
          InvalidPrivacyParameterError: the analyzers over- or under-spend the part (including
            ``DPBudgetExceededError``), or an unusable part (basic with δ > 0; rdp not a
            composition of Laplace events).
          ValueError: a public feature the schema does not have.
        """
        grant_artifact = _single_grant(input_dict)
        plan = plan_io.read_plan(grant_artifact)
        grant = verify_with_ledger(grant_artifact, artifacts.read_grant(grant_artifact),
                                   exec_properties.get(spec.LEDGER_URL_KEY))
        budget = privacy.transform_budget(plan.part(plan_lib.TRANSFORM))
        check_examples_from_grant(input_dict[spec.EXAMPLES_KEY], grant.grant_id)
        public = parse_public_features(exec_properties.get(spec.PUBLIC_FEATURES_KEY))
        known = _schema_feature_names(
            artifact_utils.get_single_uri(input_dict[spec.SCHEMA_KEY]))
        unknown = sorted(set(public) - known)
        if unknown:
            raise ValueError(f"public_features {unknown} are not features of the schema "
                             f"(features: {sorted(known)})")
        logging.info("DPTransform: grant %s, transform part %s epsilon=%r, public features %s",
                     grant.grant_id, budget.mode, budget.epsilon, list(public))

        self._budget, self._public_features, self._dp_fn = budget, public, None
        props = dict(exec_properties)
        props[standard_component_specs.DISABLE_STATISTICS_KEY] = 1
        props.pop(standard_component_specs.STATS_OPTIONS_UPDATER_FN_KEY, None)
        stock_inputs = {k: v for k, v in input_dict.items() if k != spec.GRANT_INPUT_KEY}
        stock_inputs.pop(standard_component_specs.ANALYZER_CACHE_KEY, None)
        try:
            super().Do(stock_inputs, output_dict, props)
            dp_fn = self._dp_fn
            if dp_fn is None:
                raise MissingGrantError("the stock Transform never resolved the preprocessing_fn")
            spends = dp_fn.budget.spends  # raises if traces spent differently
            spent_event = dp_fn.budget.dp_event()
            privacy.check_spent(budget, dp_fn.budget.spent, spent_event)
        except Exception:
            _discard_outputs(output_dict)
            raise
        finally:
            self._budget = None

        uses = dp_fn.preprocessing_fn.analyzer_uses
        public_uses = [u for u in uses if u.kind == audit.PUBLIC]
        for graph in output_dict[spec.TRANSFORM_GRAPH_KEY]:
            graph.set_string_custom_property(spec.GRANT_ID_PROPERTY, grant.grant_id)
            graph.set_string_custom_property(spec.PLAN_PART_PROPERTY, plan_lib.TRANSFORM)
            graph.set_string_custom_property(spec.ACCOUNTING_MODE_PROPERTY, budget.mode)
            graph.set_float_custom_property(spec.EPSILON_SPENT_PROPERTY, dp_fn.budget.spent)
            graph.set_string_custom_property(spec.DP_EVENT_PROPERTY,
                                             accounting.event_to_json(spent_event))
            graph.set_string_custom_property(spec.SPENDS_PROPERTY, json.dumps(
                [{"name": s.name, "epsilon": s.epsilon,
                  "event": accounting.event_to_dict(s.event)} for s in spends], sort_keys=True))
            graph.set_string_custom_property(spec.PUBLIC_FEATURES_PROPERTY,
                                             json.dumps(list(public)))
            graph.set_string_custom_property(spec.PUBLIC_ANALYZERS_PROPERTY,
                                             audit.uses_to_json(public_uses))
        logging.info("DPTransform: spent epsilon=%r in %d DP analyzer(s) %s; public analyzers %s",
                     dp_fn.budget.spent, len(spends), [s.name for s in spends],
                     [u.name for u in public_uses])
