"""Running the sage-tfx pipelines off the laptop: Kubeflow Pipelines (v2 IR), Airflow, Beam runners.

The same ``create_pipeline`` builds the pipeline for every orchestrator; what differs is where the
gate's pipeline run id comes from (``SageGate``'s ``orchestrator``) and how the pipeline is
handed over:

* Kubeflow Pipelines v2: :func:`compile_kubeflow` writes the pipeline job JSON (TFX's
  ``KubeflowV2DagRunner``). Every pod runs TFX's ``kubeflow_v2_run_executor`` in the sage-tfx image
  (``Dockerfile``); the gate's run id is the KFP job's ``{{$.pipeline_job_uuid}}``, which Vertex AI
  Pipelines and open-source KFP >= 2.4 substitute in constant parameters (older backends leave
  it as text and the gate refuses to run: pass an explicit ``run_id`` there).
* Airflow 2: :func:`airflow_dag` returns the DAG (TFX's ``AirflowDagRunner``), which a DAG file in
  Airflow's dags folder exposes (``pipelines/flights_airflow_dag.py``); the gate's run id is the
  DAG run id.
* Beam: every Beam-backed component reads the pipeline's ``beam_pipeline_args`` (``--runner``,
  ``--job_endpoint``, ``--environment_type`` ...), passed with ``--beam-arg`` on the command line.

With several pods or workers the ledger must be shared: a PostgreSQL URL (``$SAGE_LEDGER_URL``).

:data:`PIPELINES` names the pipelines ``sage-tfx compile`` knows, each built from one flat config
dict (:func:`build`), so the command line, a DAG file and a test build the same pipeline.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, Mapping, Optional, Sequence

from sage_tfx.components.gate import component as gate_component
from sage_tfx.components.gate import driver as gate_driver
from sage_tfx.components.gate import spec as gate_spec

# Kubeflow Pipelines' pipeline-name rule.
KFP_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$")
KUBEFLOW, AIRFLOW, LOCAL = "kubeflow", "airflow", "local"


def check_pipeline_name(name: str) -> str:
    """Checks a pipeline name against KFP's ``[a-z0-9][a-z0-9-]{0,127}`` (also fine for Airflow).

    Raises:
      ValueError: the name does not match.
    """
    if not isinstance(name, str) or not KFP_NAME_RE.match(name):
        raise ValueError(f"pipeline name must match [a-z0-9][a-z0-9-]{{0,127}} (Kubeflow "
                         f"Pipelines), got {name!r}")
    return name


def for_orchestrator(pipeline, orchestrator: str):
    """Points every SageGate of a built pipeline at ``orchestrator``'s pipeline run id, and
    bakes its node id and the pipeline name into its exec properties.

    A gate's default ledger run id is ``<pipeline>.<node id>.<pipeline run id>``. Kubeflow pods
    and Airflow tasks hand their executor no pipeline node, so without the baked-in ids every
    gate of a pipeline run would derive one run id, and the second gate would replay the first
    one's grant (one charge for two) or fail. Called here, after the pipeline is built, the ids
    are final (``with_id`` done, the pipeline named). Under LocalDagRunner the executor's
    context names the node and wins: the run ids stay those of a pipeline built without this.
    For Airflow the gates also get a driver that names their grant artifacts per node (TFX's
    legacy launcher names them ``grant:<run id>``, one name for every gate of a run).

    Args:
      pipeline: a ``tfx.dsl.Pipeline``.
      orchestrator: ``"local"``, ``"kubeflow"`` or ``"airflow"``.

    Returns:
      The same pipeline (modified in place).
    """
    value = gate_component.pipeline_run_id_for(orchestrator)
    name = pipeline.pipeline_info.pipeline_name
    for node in pipeline.components:
        if isinstance(node, gate_component.SageGate):
            node.exec_properties[gate_spec.PIPELINE_RUN_ID_KEY] = value
            node.exec_properties[gate_spec.NODE_ID_KEY] = node.id
            node.exec_properties[gate_spec.PIPELINE_ID_KEY] = name
            if orchestrator == AIRFLOW:
                node.driver_class = gate_driver.NodeScopedNamesDriver
            else:
                node.driver_class = type(node).DRIVER_CLASS
    return pipeline


# --- the pipelines `sage-tfx compile` knows -------------------------------------------------------

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


# name -> (builder of config, required config keys). Every config also takes pipeline_name,
# pipeline_root, metadata_path, ledger_url, stream and beam_pipeline_args.
PIPELINES: Dict[str, tuple] = {
    "flights-dp": (_flights_dp, ("epsilon", "delta", "target", "serving_model_dir")),
    "gate-stats": (_gate_stats, ("window_last", "epsilon")),
}
_COMMON = ("pipeline_root", "metadata_path", "ledger_url", "stream")


def build(name: str, config: Mapping[str, Any], orchestrator: str = LOCAL):
    """Builds pipeline ``name`` of :data:`PIPELINES` from a flat config, for ``orchestrator``.

    Args:
      name: a key of :data:`PIPELINES` (the default pipeline name too).
      config: ``create_pipeline`` keyword arguments; for ``flights-dp``, ``epsilon`` / ``delta``
        (and optionally ``transform_share``) build the plan with ``make_plan``.
      orchestrator: ``"local"``, ``"kubeflow"`` or ``"airflow"``.

    Raises:
      ValueError: unknown pipeline, a missing config key, a name KFP rejects, and whatever the
        pipeline's create_pipeline raises.
    """
    if name not in PIPELINES:
        raise ValueError(f"unknown pipeline {name!r}; known: {sorted(PIPELINES)}")
    builder, required = PIPELINES[name]
    missing = [k for k in (*_COMMON, *required) if config.get(k) is None]
    if missing:
        raise ValueError(f"pipeline {name} needs {missing}")
    config = dict(config)
    config["pipeline_name"] = check_pipeline_name(config.get("pipeline_name") or name)
    config["beam_pipeline_args"] = list(config.get("beam_pipeline_args") or [])
    return for_orchestrator(builder(config), orchestrator)


def compile_kubeflow(pipeline, output_dir: str, *, image: str,
                     output_filename: Optional[str] = None) -> str:
    """Compiles a pipeline to a Kubeflow Pipelines v2 job spec (JSON) with KubeflowV2DagRunner.

    Args:
      pipeline: a ``tfx.dsl.Pipeline``; its SageGates are switched to KFP's job id.
      output_dir: where the JSON is written.
      image: the container image every pod runs (the sage-tfx ``Dockerfile``).
      output_filename: default ``<pipeline name>.json``.

    Returns:
      The path of the written JSON.
    """
    from tfx.orchestration.kubeflow.v2 import kubeflow_v2_dag_runner as kfp_v2

    check_pipeline_name(pipeline.pipeline_info.pipeline_name)
    for_orchestrator(pipeline, KUBEFLOW)
    filename = output_filename or f"{pipeline.pipeline_info.pipeline_name}.json"
    os.makedirs(output_dir, exist_ok=True)
    kfp_v2.KubeflowV2DagRunner(
        config=kfp_v2.KubeflowV2DagRunnerConfig(default_image=image, use_pipeline_spec_2_1=True),
        output_dir=output_dir, output_filename=filename).run(pipeline)
    return os.path.join(output_dir, filename)


def airflow_dag(pipeline, *, schedule: Optional[str] = None, start_date=None):
    """The Airflow DAG of a pipeline built for ``"airflow"`` (TFX's AirflowDagRunner).

    Args:
      pipeline: a ``tfx.dsl.Pipeline``; its SageGates are switched to Airflow's run id. The DAG
        id is the pipeline name.
      schedule: an Airflow schedule (default None: runs only when triggered).
      start_date: default 2024-01-01 UTC.
    """
    import datetime

    from tfx.orchestration.airflow.airflow_dag_runner import AirflowDagRunner, AirflowPipelineConfig

    for_orchestrator(pipeline, AIRFLOW)
    dag_config = {
        "schedule": schedule,
        "start_date": start_date or datetime.datetime(2024, 1, 1,
                                                      tzinfo=datetime.timezone.utc),
        "catchup": False,
    }
    return AirflowDagRunner(AirflowPipelineConfig(airflow_dag_config=dag_config)).run(pipeline)


def config_from_env(environ: Mapping[str, str] = os.environ, prefix: str = "SAGE_"
                    ) -> Dict[str, Any]:
    """A :func:`build` config from environment variables (for DAG files and pods).

    ``$SAGE_PIPELINE_CONFIG`` holds the whole config as JSON; ``$SAGE_LEDGER_URL`` (the shared
    ledger) and ``$SAGE_BEAM_ARGS`` (space-separated Beam flags) override its keys.
    """
    config: Dict[str, Any] = json.loads(environ.get(prefix + "PIPELINE_CONFIG", "{}"))
    if environ.get(prefix + "LEDGER_URL"):
        config["ledger_url"] = environ[prefix + "LEDGER_URL"]
    if environ.get(prefix + "BEAM_ARGS"):
        config["beam_pipeline_args"] = environ[prefix + "BEAM_ARGS"].split()
    return config


def airflow_dag_file(name: str, config: Mapping[str, Any]) -> str:
    """The text of a DAG file that builds pipeline ``name`` with ``config`` for Airflow."""
    return AIRFLOW_DAG_TEMPLATE.format(name=name, config=json.dumps(dict(config)))


AIRFLOW_DAG_TEMPLATE = '''"""Airflow DAG: sage-tfx pipeline {name!r} (written by `sage-tfx compile --target airflow`)."""
import json

from sage_tfx.pipelines import orchestration

CONFIG = json.loads({config!r})
CONFIG.update(orchestration.config_from_env())  # $SAGE_LEDGER_URL, $SAGE_BEAM_ARGS override
DAG = orchestration.airflow_dag(orchestration.build({name!r}, CONFIG, "airflow"))
'''


def parse_beam_args(values: Optional[Sequence[str]]) -> list:
    """``--beam-arg`` values as Beam flags (each value one flag, e.g. ``--runner=PortableRunner``)."""
    flags = []
    for v in values or []:
        if not v.startswith("--"):
            raise ValueError(f"a --beam-arg value is one Beam flag such as --runner=DirectRunner, "
                             f"got {v!r}")
        flags.append(v)
    return flags

