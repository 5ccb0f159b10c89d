"""DPTransform's preflight: what its executor would refuse, found without data and before charge.

:func:`check` (registered in ``components/preflight.py``) loads the ``preprocessing_fn`` as the
stock Transform does (``module_file`` / ``module_path`` / ``preprocessing_fn``, ``custom_config``
bound if taken) and runs :func:`tracing.plan_shares` against the schema with the plan's
``transform`` part: the same audit (stock analyzers on features not declared public are refused,
all in one message naming each analyzer, its features and its DP replacement), the same shares
and the same exact-spend check (ε, and δ for DP vocabularies; an rdp part's Laplace
mechanisms) as the executor's first trace. Public features the schema lacks are refused too.

The schema must be known when the pipeline is built: :func:`facts` takes it from the
``ImportSchemaGen`` that feeds DPTransform (``schema_file``). A schema a stock ``SchemaGen``
infers from the granted data is computed after the charge (and from exact statistics of private
data); the preflight refuses it.
"""
from __future__ import annotations

import functools
import inspect
import os
from typing import Any, Callable, Mapping

from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.components.dp_transform import spec
from sage_tfx.errors import InvalidRequestError

SCHEMA_FILE_FACT = "schema_file"
SCHEMA_DIGEST_FACT = "schema_sha256"
SCHEMA_PRODUCER_FACT = "schema_producer"
MODULE_DIGEST_FACT = "module_file_sha256"


def facts(node: Any, pipeline: Any) -> dict:
    """The files a DPTransform node reads, with their digests, for the gate's re-check."""
    from sage_tfx.components.preflight import file_digest

    out: dict = {}
    module_file = node.exec_properties.get(spec.MODULE_FILE_KEY)
    if isinstance(module_file, str) and module_file:
        out["module_file"] = module_file
        if os.path.isfile(module_file):
            out[MODULE_DIGEST_FACT] = file_digest(module_file)
    channel = node.inputs.get(spec.SCHEMA_KEY)
    producer_id = getattr(channel, "producer_component_id", None)
    producer = next((n for n in pipeline.components if n.id == producer_id), None)
    out[SCHEMA_PRODUCER_FACT] = type(producer).__name__ if producer is not None else None
    schema_file = producer.exec_properties.get("schema_file") if producer is not None else None
    if isinstance(schema_file, str) and schema_file:
        out[SCHEMA_FILE_FACT] = schema_file
        if os.path.isfile(schema_file):
            out[SCHEMA_DIGEST_FACT] = file_digest(schema_file)
    return out


def _user_fn(props: Mapping[str, Any]) -> Callable[..., Any]:
    from tfx.components.util import udf_utils
    from tfx.utils import json_utils

    keys = (spec.MODULE_FILE_KEY, spec.MODULE_PATH_KEY, spec.PREPROCESSING_FN_KEY)
    fn = udf_utils.get_fn({k: props.get(k) or None for k in keys}, spec.PREPROCESSING_FN_KEY)
    try:
        takes_config = "custom_config" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_config = False
    if takes_config:
        raw = props.get(spec.CUSTOM_CONFIG_KEY)
        fn = functools.partial(fn, custom_config=(json_utils.loads(raw) if raw else {}) or {})
    return fn


def check(props: Mapping[str, Any], plan: plan_lib.PrivacyPlan) -> None:
    """Refuses a DPTransform configuration its executor would refuse under ``plan``.

    Args:
      props: DPTransform's exec properties plus :func:`facts`.
      plan: the privacy plan the gate charges.

    Raises:
      InvalidRequestError: no build-time schema, or a public feature the schema lacks.
      NonDPAnalyzerError: stock analyzers on features not declared public.
      InvalidPrivacyParameterError: ε / δ shares that do not spend the transform part exactly.
      MissingGrantError: the plan has no ``transform`` part.
    """
    from sage_tfx.components.dp_transform import executor, privacy, tracing

    schema_file = props.get(SCHEMA_FILE_FACT)
    if not schema_file:
        raise InvalidRequestError(
            f"DPTransform's schema comes from {props.get(SCHEMA_PRODUCER_FACT) or 'an unknown'} "
            "component, computed after the gate charges (from exact statistics of the granted "
            "data): the preflight needs the schema when the pipeline is built. Feed DPTransform "
            "from ImportSchemaGen(schema_file=...)")
    if not os.path.isfile(schema_file):
        raise InvalidRequestError(f"DPTransform's schema file {schema_file} is not readable here")
    budget = privacy.transform_budget(plan.part(plan_lib.TRANSFORM))
    public = executor.parse_public_features(props.get(spec.PUBLIC_FEATURES_KEY))
    feature_spec = tracing.feature_spec_from_schema_file(schema_file)
    unknown = sorted(set(public) - set(feature_spec))
    if unknown:
        raise InvalidRequestError(f"public_features {unknown} are not features of the schema "
                                  f"(features: {sorted(feature_spec)})")
    tracing.plan_shares(_user_fn(props), feature_spec, budget.epsilon, budget.delta,
                        public_features=public, planned_event_json=budget.event_json,
                        force_tf_compat_v1=bool(props.get(spec.FORCE_TF_COMPAT_V1_KEY)))
