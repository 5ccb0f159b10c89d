"""The pipelines ``sage-tfx compile`` knows, each built from one flat config dict.

This module imports no TensorFlow or TFX at module level (``sage-tfx compile --help`` reads
:data:`PIPELINES` and :data:`RUNTIME_PARAMETERS` from here); each builder imports its pipeline
module when it runs.

Runtime parameters: on Kubeflow Pipelines, the names in :data:`RUNTIME_PARAMETERS` become
pipeline parameters of the compiled job (TFX ``RuntimeParameter``), whose compile-time values
are the defaults and which ``sage-tfx submit --param NAME=VALUE`` sets per run. Only values the
gate charges directly are runtime parameters: the gate requests its grant with the submitted
value, and every component downstream reads the granted cost from the grant, so what runs
equals what was charged. A cost that is computed from ε at build time (a privacy plan split
over components, DP bagging's ε(p), a Pyramid count spec's ε) stays a compile-time value.

A user's own pipeline is named by reference, ``module:function`` (:func:`builder_of`): the
function takes the same flat config as keyword arguments and returns the ``tfx.dsl.Pipeline``;
it has no runtime parameters.
"""
from __future__ import annotations

import importlib
import re
from typing import Any, Callable, Dict, Mapping, Sequence, Tuple

from sage_tfx.errors import InvalidRequestError

KUBEFLOW, AIRFLOW, LOCAL = "kubeflow", "airflow", "local"

# Every config also takes pipeline_name, beam_pipeline_args and (for Airflow) metadata_path.
COMMON = ("pipeline_root", "metadata_path", "ledger_url", "stream")


def _flights_dp(config: Mapping[str, Any]):
    from sage_tfx.pipelines import flights_dp_pipeline as fp
    c = dict(config)
    shares = {k: float(c.pop(k)) for k in ("transform_share", "validate_share") if k in c}
    if not c.get("use_transform", True):
        shares["transform_share"] = 0.0
    plan = fp.make_plan(float(c.pop("epsilon")), float(c.pop("delta")), **shares)
    return fp.create_pipeline(plan=plan, **c)


def _gate_stats(config: Mapping[str, Any]):
    from sage_tfx.pipelines import gate_stats_pipeline
    return gate_stats_pipeline.create_pipeline(**config)


def _ptk(config: Mapping[str, Any]):
    from sage_tfx.pipelines import ptk_pipeline
    return ptk_pipeline.create_pipeline(**config)


def _pyramid(config: Mapping[str, Any]):
    from sage_tfx.pipelines import pyramid_pipeline
    from sage_tfx.pyramid import CountSpec

    c = dict(config)
    spec = c.pop("spec")
    if not isinstance(spec, Mapping):
        raise ValueError(f"pyramid: spec is a JSON object of CountSpec fields (groups, label, "
                         f"width, epsilon, hash_family='tf_siphash', ...), got {spec!r}")
    spec = dict(spec)
    spec["groups"] = tuple(tuple(g) if isinstance(g, list) else g
                           for g in spec.get("groups", ()))
    return pyramid_pipeline.create_pipeline(spec=CountSpec(**spec), **c)


def _dp_bagging(config: Mapping[str, Any]):
    from sage_tfx.pipelines import dp_bagging_pipeline
    return dp_bagging_pipeline.create_pipeline(**config)


def _dnd(config: Mapping[str, Any]):
    from sage_tfx.pipelines import dnd_pipeline
    c = dict(config)
    # the run's settings; delta (per update) and l2_norm_clip belong to unit "gaussian"
    settings = {k: c.pop(k) for k in ("k", "gamma", "passes", "n_c", "unit", "delta",
                                      "l2_norm_clip") if k in c}
    c["settings"] = dnd_pipeline.email_settings(epsilon=float(c.pop("epsilon")), **settings)
    return dnd_pipeline.create_pipeline(c.pop("pipeline_name"), c.pop("pipeline_root"),
                                        c.pop("metadata_path"), **c)


# name -> (builder of a config, its required config keys besides COMMON, one line of help).
PIPELINES: Dict[str, Tuple[Callable, Tuple[str, ...], str]] = {
    "flights-dp": (_flights_dp, ("epsilon", "delta", "target", "serving_model_dir"),
                   "the Sage DP training pipeline (plan: DP Transform, DP-SGD, DP validation)"),
    "gate-stats": (_gate_stats, ("window_last", "epsilon"),
                   "gate -> BlockExampleGen -> StatisticsGen"),
    "ptk": (_ptk, ("window_last", "ptk_id", "window_index", "epsilon", "delta"),
            "one PTK training run; epsilon/delta: the PTK's allocation (sage-tfx ptk plan)"),
    "pyramid": (_pyramid, ("spec", "store_dir", "count_window", "count_blocks", "hot_blocks",
                           "hot_epsilon"),
                "Pyramid count tables, snapshot, count-featurized training"),
    "dp-bagging": (_dp_bagging, ("window_last", "public_csv_dir", "public_size", "epsilon",
                                 "delta", "k", "n", "label_key", "unit_key", "feature_keys"),
                   "DP bagging on a private window with a declared-public set"),
    "dnd": (_dnd, ("window_last", "epsilon", "validate_epsilon", "target", "serving_model_dir"),
            "Draw-and-Discard on the email blocks (epsilon/delta: per update; "
            "--set unit=gaussian --set l2_norm_clip=C2 --delta D for the Gaussian unit)"),
}

# name -> {config key: type} that compile as KFP pipeline parameters (see the module doc).
RUNTIME_PARAMETERS: Dict[str, Dict[str, type]] = {
    "flights-dp": {"window_last": int},
    "gate-stats": {"epsilon": float, "delta": float, "window_last": int},
    "ptk": {"epsilon": float, "delta": float, "window_last": int},
    "pyramid": {},
    "dp-bagging": {"window_last": int},
    "dnd": {"window_last": int},
}


def runtime_parameters(name: str, config: Mapping[str, Any]) -> Dict[str, Tuple[type, Any]]:
    """``{key: (type, compile-time value)}`` of pipeline ``name``'s runtime parameters that
    ``config`` sets (a key left out of the config stays out of the compiled pipeline)."""
    return {k: (t, t(config[k])) for k, t in RUNTIME_PARAMETERS.get(name, {}).items()
            if config.get(k) is not None}


# --- a user's pipeline: module:function ------------------------------------------------------

_REFERENCE_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)"
                           r":([A-Za-z_][A-Za-z0-9_]*)$")


def is_reference(name: str) -> bool:
    """Whether ``name`` names a user's pipeline (``module:function``), not one of PIPELINES."""
    return isinstance(name, str) and ":" in name


def _reference(name: str) -> Tuple[str, str]:
    m = _REFERENCE_RE.match(name)
    if not m:
        raise InvalidRequestError(
            f"a pipeline reference is module:function (e.g. my_pipelines.fraud:create_pipeline), "
            f"got {name!r}")
    return m.group(1), m.group(2)


def builder_of(name: str) -> Callable[[Mapping[str, Any]], Any]:
    """The builder of a config for pipeline ``name``: one of PIPELINES, or the function a
    reference ``module:function`` names, called with the config as keyword arguments.

    Raises:
      InvalidRequestError: unknown pipeline, a malformed reference, or one that does not import.
    """
    if not is_reference(name):
        if name not in PIPELINES:
            raise InvalidRequestError(f"unknown pipeline {name!r}; known: {sorted(PIPELINES)} "
                                      f"or a reference module:function")
        return PIPELINES[name][0]
    module, function = _reference(name)
    try:
        fn = getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as exc:
        raise InvalidRequestError(
            f"pipeline {name}: cannot import it here ({type(exc).__name__}: {exc}); compile "
            f"where the module is importable, as in the pods (installed in the image, or on "
            f"$PYTHONPATH)") from None

    def build(config: Mapping[str, Any]):
        pipeline = fn(**config)
        if not hasattr(pipeline, "components") or not hasattr(pipeline, "pipeline_info"):
            raise InvalidRequestError(f"pipeline {name} returned {type(pipeline).__name__}, "
                                      f"not a tfx.dsl.Pipeline")
        return pipeline

    return build


def default_name(name: str) -> str:
    """The pipeline name a config without ``pipeline_name`` gets: the catalog name, or a
    reference's module (its last part, ``_`` -> ``-``)."""
    if not is_reference(name):
        return name
    return _reference(name)[0].rsplit(".", 1)[-1].lower().replace("_", "-")


def missing_keys(name: str, config: Mapping[str, Any]) -> list:
    """The config keys pipeline ``name`` needs that ``config`` leaves unset (a reference needs
    COMMON; its function checks the rest)."""
    required: Sequence[str] = () if is_reference(name) else PIPELINES[name][1]
    return [k for k in (*COMMON, *required) if config.get(k) is None]


def help_text(spell: Callable[[str], str] = str) -> str:
    """One paragraph per pipeline: what it is, its required keys (as ``spell`` names them, e.g.
    by their command-line flags) and runtime parameters."""
    lines = []
    for name, (_, required, what) in PIPELINES.items():
        runtime = ", ".join(RUNTIME_PARAMETERS[name]) or "none"
        lines.append(f"  {name}: {what}\n    needs: {', '.join(map(spell, required))}\n"
                     f"    KFP runtime parameters: {runtime}")
    return "\n".join(lines)
