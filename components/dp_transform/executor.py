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
   ``transform_graph`` as custom properties (``spec.*_PROPERTY``) and in the graph's
   :data:`PRIVACY_FILE_NAME`.
4. **Released once.** tf.Transform bakes every analyzer output (the noisy statistics) into the
   transform graph as constants, so the graph *is* the release, and it is released as a whole
   (``release_io.release_artifact_once``, name :data:`RELEASE_NAME`): the analysis runs into a
   staging directory, the tree is recorded against the grant with the run's request
   (:func:`release_request`), and only then becomes ``transform_graph``. A retried or re-run
   execution under the same grant (a KFP or Airflow retry, a re-run with the same run id, another
   process or output directory) gets the recorded graph byte for byte and runs no analyzer: no
   noise is drawn. Replaying per-analyzer values into a re-traced graph would not do: the
   SavedModel's bytes (function names, graph order) differ from one trace to the next, and the
   graph, not its constants, is what a Trainer and a serving model load. A different request
   under the same grant is refused (``ReleaseConflictError``). ``transformed_examples`` are not
   recorded (they are per-record data): they are always computed from the released graph by a
   transform-only pass (``materialize.py``), on the first run as on a replay. Both outputs carry
   ``replayed`` = 0/1 (``release_io.REPLAYED_PROPERTY``).

Not supported, on purpose: TFDV pre-/post-transform statistics (exact statistics of the granted
data, not DP: they are always disabled) and the analyzer cache (it stores exact analyzer
accumulators of earlier runs and would skip analyses a new grant pays for).
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from absl import logging
from tfx import types
from tfx.components.transform import executor as transform_executor
from tfx.components.transform import executor_utils as transform_executor_utils
from tfx.components.util import udf_utils
from tfx.dsl.io import fileio
from tfx.types import artifact_utils, standard_artifacts, standard_component_specs
from tfx.utils import io_utils

from sage_tfx.ledger import accounting
from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.components import artifacts
from sage_tfx.components import plan_io
from sage_tfx.components import release_io
from sage_tfx.components.block_example_gen import executor as block_example_gen_executor
from sage_tfx.components.block_example_gen import spec as block_example_gen_spec
from sage_tfx.components.dp_transform import budget as budget_lib
from sage_tfx.components.dp_transform import audit
from sage_tfx.components.dp_transform import materialize
from sage_tfx.components.dp_transform import privacy
from sage_tfx.components.dp_transform import spec
from sage_tfx.components.dp_transform import tracing
from sage_tfx.errors import MissingGrantError
from sage_tfx.ledger import open_ledger, releases

# The release of a DPTransform run: its transform graph, once per grant (one transform part
# per plan, so one name per grant), and the file in it recording what the analyzers spent.
COMPONENT = "DPTransform"
# Keyed by the plan part it spends; the part is claimed for DPTransform (release_io).
RELEASE_NAME = releases.part_release_name(plan_lib.TRANSFORM, "transform_graph")
PRIVACY_FILE_NAME = "dp_transform_privacy.json"


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
        self._feature_spec: dict = {}
        self._force_tf_compat_v1 = False

    def _GetPreprocessingFn(self, inputs: Mapping[str, Any],
                            unused_outputs: Mapping[str, Any]) -> Callable[..., Any]:
        """The user's preprocessing_fn (stock resolution), run under the grant's budget."""
        if self._budget is None:
            raise MissingGrantError(
                "DPTransform resolves its preprocessing_fn only inside Do(), after reading the "
                "grant's privacy plan")
        user_fn = super()._GetPreprocessingFn(inputs, unused_outputs)
        budget = self._budget
        # The shares of analyzers called without ε, fixed by a planning trace (no data read);
        # it also audits the function and checks the full spend before Beam runs anything.
        plan = tracing.plan_shares(user_fn, self._feature_spec, budget.epsilon, budget.delta,
                                   public_features=self._public_features,
                                   planned_event_json=budget.event_json,
                                   force_tf_compat_v1=self._force_tf_compat_v1)
        audited = audit.AuditedPreprocessingFn(
            audit.bind_epsilon(user_fn, budget.epsilon, budget.delta),
            public_features=self._public_features,
            planned_event_json=budget.event_json)
        self._dp_fn = budget_lib.DPPreprocessingFn(audited, budget.epsilon, delta=budget.delta,
                                                   allocation=plan.allocation)
        return self._dp_fn

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        """Checks the grant, releases the transform graph once, writes the transformed examples.

        Args:
          input_dict: ``examples`` (from BlockExampleGen), ``schema``, ``grant`` (one SageGrant
            holding a plan with a ``transform`` part).
          output_dict: ``transform_graph``, optionally ``transformed_examples``.
          exec_properties: the keys of ``sage_tfx.components.dp_transform.spec``.

        Raises:
          MissingGrantError: no grant, a denial, no plan or no ``transform`` part, a grant the
            ledger does not confirm, or Examples read under another grant.
          ReleaseConflictError: the grant already released a transform graph for another
            request (module, configuration, public features, schema or budget).
          audit.NonDPAnalyzerError: a non-DP analyzer over a feature that is not public.
          InvalidPrivacyParameterError: the analyzers over- or under-spend the part (including
            ``DPBudgetExceededError``), or an unusable part (basic with δ > 0; rdp not a
            composition of Laplace events).
          ValueError: a public feature the schema does not have.
        """
        grant_artifact = _single_grant(input_dict)
        plan = plan_io.read_plan(grant_artifact)
        url = release_io.ledger_url_for(grant_artifact, exec_properties.get(spec.LEDGER_URL_KEY),
                                        component="DPTransform")
        grant = artifacts.read_grant(grant_artifact)
        budget = privacy.transform_budget(plan.part(plan_lib.TRANSFORM))
        check_examples_from_grant(input_dict[spec.EXAMPLES_KEY], grant.grant_id)
        public = parse_public_features(exec_properties.get(spec.PUBLIC_FEATURES_KEY))
        schema_uri = artifact_utils.get_single_uri(input_dict[spec.SCHEMA_KEY])
        known = _schema_feature_names(schema_uri)
        unknown = sorted(set(public) - known)
        if unknown:
            raise ValueError(f"public_features {unknown} are not features of the schema "
                             f"(features: {sorted(known)})")
        graph = artifact_utils.get_single_instance(output_dict[spec.TRANSFORM_GRAPH_KEY])
        request = release_request(input_dict, exec_properties, budget, public)

        with open_ledger(url) as ledger:
            grant = block_example_gen_executor.verify_grant(grant, ledger, ledger.redacted_url)
            logging.info("DPTransform: grant %s, transform part %s epsilon=%r, public features %s",
                         grant.grant_id, budget.mode, budget.epsilon, list(public))
            try:
                outcome = release_io.release_artifact_once(
                    ledger, grant.grant_id, RELEASE_NAME, graph,
                    lambda staging: self._analyze_into(staging, input_dict, exec_properties,
                                                       budget, public),
                    request=request, component=COMPONENT, part=plan_lib.TRANSFORM)
                transformed = output_dict.get(spec.TRANSFORMED_EXAMPLES_KEY) or []
                if transformed:
                    materialize.transform_examples(graph.uri, input_dict, output_dict,
                                                   exec_properties, self._make_beam_pipeline)
                    release_io.mark(output_dict[spec.TRANSFORMED_EXAMPLES_KEY], outcome.release,
                                    outcome.replayed)
            except Exception:
                _discard_outputs(output_dict)
                raise
        record = read_privacy_record(graph.uri)
        graph.set_string_custom_property(spec.GRANT_ID_PROPERTY, grant.grant_id)
        graph.set_string_custom_property(spec.PLAN_PART_PROPERTY, plan_lib.TRANSFORM)
        for key, prop in _RECORD_PROPERTIES:
            value = record.get(key, 0.0)  # graphs released before δ was recorded spent none
            if isinstance(value, float):
                graph.set_float_custom_property(prop, value)
            else:
                graph.set_string_custom_property(
                    prop, value if isinstance(value, str) else json.dumps(value, sort_keys=True))
        logging.info("DPTransform: %s epsilon=%r in DP analyzer(s) %s; public analyzers %s",
                     "replayed a release that spent" if outcome.replayed else "spent",
                     record["epsilon_spent"], [s["name"] for s in record["spends"]],
                     [u["name"] for u in record["public_analyzers"]])

    def _analyze_into(self, staging: str, input_dict: Dict[str, List[types.Artifact]],
                      exec_properties: Dict[str, Any], budget: privacy.TransformBudget,
                      public: tuple[str, ...]) -> None:
        """Runs the stock Transform's analysis under the budget and writes the transform graph
        (plus :data:`PRIVACY_FILE_NAME`, what it spent) into ``staging``: the noise is drawn here,
        and only when the ledger has no release of this grant's transform graph."""
        self._budget, self._public_features, self._dp_fn = budget, public, None
        self._feature_spec = tracing.feature_spec_from_schema_file(io_utils.get_only_uri_in_dir(
            artifact_utils.get_single_uri(input_dict[spec.SCHEMA_KEY])))
        self._force_tf_compat_v1 = bool(exec_properties.get(spec.FORCE_TF_COMPAT_V1_KEY))
        props = dict(exec_properties)
        props[standard_component_specs.DISABLE_STATISTICS_KEY] = 1
        props.pop(standard_component_specs.STATS_OPTIONS_UPDATER_FN_KEY, None)
        stock_inputs = {k: v for k, v in input_dict.items() if k != spec.GRANT_INPUT_KEY}
        stock_inputs.pop(standard_component_specs.ANALYZER_CACHE_KEY, None)
        staged = standard_artifacts.TransformGraph()
        staged.uri = staging
        try:
            super().Do(stock_inputs, {spec.TRANSFORM_GRAPH_KEY: [staged]}, props)
            dp_fn = self._dp_fn
            if dp_fn is None:
                raise MissingGrantError("the stock Transform never resolved the preprocessing_fn")
            spends = dp_fn.budget.spends  # raises if traces spent differently
            spent_event = dp_fn.budget.dp_event()
            privacy.check_spent(budget, dp_fn.budget.spent, spent_event,
                                dp_fn.budget.spent_delta)
        finally:
            self._budget = None
        uses = dp_fn.preprocessing_fn.analyzer_uses
        record = {
            "accounting_mode": budget.mode,
            "epsilon_spent": float(dp_fn.budget.spent),
            "delta_spent": float(dp_fn.budget.spent_delta),
            "dp_event": accounting.event_to_json(spent_event),
            "spends": [{"name": s.name, "epsilon": s.epsilon, "delta": s.delta,
                        "event": accounting.event_to_dict(s.event)} for s in spends],
            "public_features": list(public),
            "public_analyzers": json.loads(audit.uses_to_json(
                [u for u in uses if u.kind == audit.PUBLIC])),
        }
        with open(os.path.join(staging, PRIVACY_FILE_NAME), "w") as f:
            f.write(json.dumps(record, sort_keys=True, indent=1))


# What the released graph spent (PRIVACY_FILE_NAME keys) -> its custom property on transform_graph.
_RECORD_PROPERTIES = (
    ("accounting_mode", spec.ACCOUNTING_MODE_PROPERTY),
    ("epsilon_spent", spec.EPSILON_SPENT_PROPERTY),
    ("delta_spent", spec.DELTA_SPENT_PROPERTY),
    ("dp_event", spec.DP_EVENT_PROPERTY),
    ("spends", spec.SPENDS_PROPERTY),
    ("public_features", spec.PUBLIC_FEATURES_PROPERTY),
    ("public_analyzers", spec.PUBLIC_ANALYZERS_PROPERTY),
)


def read_privacy_record(graph_uri: str) -> dict:
    """What a released transform graph spent (its :data:`PRIVACY_FILE_NAME`)."""
    with fileio.open(os.path.join(graph_uri, PRIVACY_FILE_NAME), "r") as f:
        return json.loads(f.read())


def release_request(input_dict: Dict[str, List[types.Artifact]],
                    exec_properties: Dict[str, Any], budget: privacy.TransformBudget,
                    public: tuple[str, ...]) -> dict:
    """What a DPTransform run asks, recorded with its release: a replay must ask the same.

    The preprocessing code (a module file by content digest, a packaged module by its wheel's
    content-hashed name, or an import path), its configuration, the splits, the public
    features, the schema (by digest) and the budget. The examples are not in it: the grant
    fixes the blocks they are read from.
    """
    module_file = exec_properties.get(spec.MODULE_FILE_KEY)
    module_path = exec_properties.get(spec.MODULE_PATH_KEY)
    if module_path:
        module, wheels = udf_utils.decode_user_module_key(module_path)
        module_path = [module, sorted(os.path.basename(w) for w in wheels)]
    splits = transform_executor_utils.ResolveSplitsConfig(
        exec_properties.get(standard_component_specs.SPLITS_CONFIG_KEY),
        input_dict[spec.EXAMPLES_KEY])
    schema_file = io_utils.get_only_uri_in_dir(
        artifact_utils.get_single_uri(input_dict[spec.SCHEMA_KEY]))
    request = {
        "component": "DPTransform",
        "plan_part": plan_lib.TRANSFORM,
        "accounting_mode": budget.mode,
        "epsilon": budget.epsilon,
        "event": budget.event_json,
        "module_file_sha256": release_io.file_digest(module_file) if module_file else None,
        "module_path": module_path,
        "preprocessing_fn": exec_properties.get(spec.PREPROCESSING_FN_KEY) or None,
        "custom_config": exec_properties.get(spec.CUSTOM_CONFIG_KEY) or None,
        "force_tf_compat_v1": int(bool(exec_properties.get(spec.FORCE_TF_COMPAT_V1_KEY, 0))),
        # Sorted: without a splits_config the stock resolution lists the splits in set order.
        "splits": {"analyze": sorted(splits.analyze), "transform": sorted(splits.transform)},
        "public_features": list(public),
        "schema_sha256": release_io.file_digest(schema_file),
    }
    if budget.delta:  # only then: requests recorded before δ existed keep their bytes
        request["delta"] = budget.delta
    return request
