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

**Secrets are referenced, never embedded.** Whatever a pipeline is compiled into — component
properties in ML Metadata, a KFP job spec, an Airflow DAG file — holds the ledger URL as a
reference, ``env:SAGE_LEDGER_URL`` (or ``file:/path``), that each pod or worker resolves when it
connects, or a URL without a password (the password in ``~/.pgpass``). A password-bearing URL is
refused at build time (:func:`check_no_secrets`). Kubeflow pods get the variable from a
Kubernetes Secret (:func:`compile_kubeflow`'s ``secrets``: the kfp-kubernetes ``secretAsEnv``
platform spec); Airflow workers from their own environment (an Airflow connection exported as
``AIRFLOW_CONN_...`` works too: ``env:AIRFLOW_CONN_SAGE_LEDGER``). Tokens travel the same way, as
``$SAGE_LEDGER_TOKEN`` or ``$SAGE_LEDGER_TOKEN_FILE``.

:data:`PIPELINES` (``catalog.py``) names the pipelines ``sage-tfx compile`` knows, each built
from one flat config dict (:func:`build`), so the command line, a DAG file and a test build the
same pipeline. On Kubeflow, ε and the window are KFP pipeline parameters where the gate charges
them directly (``catalog.RUNTIME_PARAMETERS``), set per run by ``sage-tfx submit``.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple

from sage_tfx.components.gate import component as gate_component
from sage_tfx.components.gate import driver as gate_driver
from sage_tfx.components.gate import spec as gate_spec
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import access, secrets
from sage_tfx.pipelines import catalog
from sage_tfx.pipelines.kfp_package import (  # noqa: F401  (re-exported)
    kubernetes_platform_spec, parse_secret_ref)
from sage_tfx.pipelines.catalog import AIRFLOW, KUBEFLOW, LOCAL, PIPELINES  # noqa: F401

# Kubeflow Pipelines' pipeline-name rule.
KFP_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$")
LEDGER_URL_ENV = "SAGE_LEDGER_URL"
LEDGER_URL_REF = secrets.ENV_PREFIX + LEDGER_URL_ENV  # what compiled pipelines hold
SPECS = "the pipeline's component properties (ML Metadata, compiled specs, DAG files)"


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

    Every gate's downstream configuration is checked against its plan first
    (``sage_tfx.components.preflight.attach``): a pipeline a component would refuse is refused
    here, before anything can be charged, and the facts are baked into the gate, whose executor
    re-checks them before it charges.

    Returns:
      The same pipeline (modified in place).

    Raises:
      PreflightError: a component that spends a gate's plan would refuse the run.
    """
    from sage_tfx.components import preflight

    preflight.attach(pipeline)  # check before charge: refuses here what a component would refuse
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


# --- the pipelines `sage-tfx compile` knows (pipelines/catalog.py) --------------------------------

def build(name: str, config: Mapping[str, Any], orchestrator: str = LOCAL):
    """Builds pipeline ``name`` of :data:`PIPELINES` from a flat config, for ``orchestrator``.

    For Kubeflow, the config values named in ``catalog.RUNTIME_PARAMETERS`` become KFP pipeline
    parameters (TFX ``RuntimeParameter``) with the config's values as defaults; those values are
    checked first, by building the pipeline once with them.

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
    builder, required, _ = PIPELINES[name]
    missing = [k for k in (*catalog.COMMON, *required) if config.get(k) is None]
    if missing:
        raise ValueError(f"pipeline {name} needs {missing}")
    config = dict(config)
    config["pipeline_name"] = check_pipeline_name(config.get("pipeline_name") or name)
    config["beam_pipeline_args"] = list(config.get("beam_pipeline_args") or [])
    pipeline = builder(dict(config))  # the compile-time values, checked by the constructors
    if orchestrator == KUBEFLOW and catalog.runtime_parameters(name, config):
        from tfx.orchestration.data_types import RuntimeParameter

        for key, (ptype, value) in catalog.runtime_parameters(name, config).items():
            config[key] = RuntimeParameter(name=key, ptype=ptype, default=value)
        pipeline = builder(config)
    return for_orchestrator(pipeline, orchestrator)


def runtime_defaults(pipeline) -> Dict[str, Any]:
    """``{name: default}`` of the RuntimeParameters in a built pipeline's component properties."""
    found: Dict[str, Any] = {}
    for node in pipeline.components:
        for value in node.exec_properties.values():
            if type(value).__name__ == "RuntimeParameter":
                found[value.name] = value.default
    return found


def compile_kubeflow(pipeline, output_dir: str, *, image: str,
                     output_filename: Optional[str] = None,
                     k8s_secrets: Optional[Mapping[str, Tuple[str, str]]] = None) -> str:
    """Compiles a pipeline to a Kubeflow Pipelines v2 job spec (JSON) with KubeflowV2DagRunner.

    Args:
      pipeline: a ``tfx.dsl.Pipeline``; its SageGates are switched to KFP's job id. Refused if
        anything in it holds a password (:func:`check_no_secrets`).
      output_dir: where the JSON is written.
      image: the container image every pod runs (the sage-tfx ``Dockerfile``).
      output_filename: default ``<pipeline name>.json``.
      k8s_secrets: ``{env var: (Kubernetes Secret name, key)}`` set in every pod, e.g.
        ``{"SAGE_LEDGER_URL": ("sage-ledger", "url")}`` (the platform spec of the package).

    The KFP package ``<name>.yaml`` (:func:`write_kfp_package`) is written beside the JSON; it
    is what ``sage-tfx submit`` sends. The pipeline's RuntimeParameters are the root's input
    parameters, with their defaults as ``defaultValue`` (and in the job's runtime config).

    Returns:
      The path of the written JSON.
    """
    from tfx.orchestration.kubeflow.v2 import kubeflow_v2_dag_runner as kfp_v2

    check_pipeline_name(pipeline.pipeline_info.pipeline_name)
    check_no_secrets(pipeline)
    for_orchestrator(pipeline, KUBEFLOW)
    filename = output_filename or f"{pipeline.pipeline_info.pipeline_name}.json"
    os.makedirs(output_dir, exist_ok=True)
    defaults = runtime_defaults(pipeline)
    kfp_v2.KubeflowV2DagRunner(
        config=kfp_v2.KubeflowV2DagRunnerConfig(default_image=image, use_pipeline_spec_2_1=True),
        output_dir=output_dir, output_filename=filename).run(
            pipeline, parameter_values=defaults or None)
    path = os.path.join(output_dir, filename)
    if defaults:
        # KFP reads a parameter's default from the spec (the UI, a run that leaves it out).
        with open(path) as f:
            job = json.load(f)
        declared = job["pipelineSpec"]["root"]["inputDefinitions"]["parameters"]
        for key, value in defaults.items():
            declared[key].update(defaultValue=value, isOptional=True)
        with open(path, "w") as f:
            json.dump(job, f, indent=2, sort_keys=True)
    write_kfp_package(path, k8s_secrets or {})
    return path


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

    check_no_secrets(pipeline)
    for_orchestrator(pipeline, AIRFLOW)
    dag_config = {
        "schedule": schedule,
        "start_date": start_date or datetime.datetime(2024, 1, 1,
                                                      tzinfo=datetime.timezone.utc),
        "catchup": False,
    }
    return AirflowDagRunner(AirflowPipelineConfig(airflow_dag_config=dag_config)).run(pipeline)


def deployment_from_env(environ: Mapping[str, str] = os.environ, prefix: str = "SAGE_"
                        ) -> Dict[str, Any]:
    """What the environment of a pod or worker decides about a compiled pipeline: where the
    ledger is (``$SAGE_LEDGER_URL``) and how Beam runs (``$SAGE_BEAM_ARGS``, space-separated
    flags) — never a stream, window or privacy parameter, which stay those compiled in.

    A ledger URL with a password becomes the reference ``env:SAGE_LEDGER_URL``
    (:func:`ledger_url_from_env`): the pipeline holds the reference, each task resolves it.
    """
    config: Dict[str, Any] = {}
    url = ledger_url_from_env(environ, prefix + "LEDGER_URL")
    if url:
        config["ledger_url"] = url
    if environ.get(prefix + "BEAM_ARGS"):
        config["beam_pipeline_args"] = environ[prefix + "BEAM_ARGS"].split()
    return config


def config_from_env(environ: Mapping[str, str] = os.environ, prefix: str = "SAGE_"
                    ) -> Dict[str, Any]:
    """The whole :func:`build` config of the environment-configured flights DAG file
    (``pipelines/flights_airflow_dag.py``): ``$SAGE_PIPELINE_CONFIG`` (JSON), then
    :func:`deployment_from_env`. DAG files written by ``sage-tfx compile`` never read
    ``$SAGE_PIPELINE_CONFIG``: their stream, window and ε are the compiled ones.

    Raises:
      InvalidRequestError: ``$SAGE_PIPELINE_CONFIG`` holds a password-bearing ledger URL.
    """
    config: Dict[str, Any] = json.loads(environ.get(prefix + "PIPELINE_CONFIG", "{}"))
    if config.get("ledger_url"):
        secrets.check_no_password(config["ledger_url"], f"${prefix}PIPELINE_CONFIG")
    config.update(deployment_from_env(environ, prefix))
    return config


def airflow_dag_file(name: str, config: Mapping[str, Any]) -> str:
    """The text of a DAG file that builds pipeline ``name`` with ``config`` for Airflow.

    Raises:
      InvalidRequestError: the config's ledger URL holds a password (the file would too).
    """
    if config.get("ledger_url"):
        secrets.check_no_password(config["ledger_url"], "an Airflow DAG file")
    return AIRFLOW_DAG_TEMPLATE.format(name=name, config=json.dumps(dict(config)))


AIRFLOW_DAG_TEMPLATE = ('''"""Airflow DAG: sage-tfx pipeline {name!r} '''  # one line in the DAG
                        '''(written by `sage-tfx compile --target airflow`).

The ledger URL is read where the DAG runs: ``env:SAGE_LEDGER_URL`` resolves in each task from
the worker's environment (a password-bearing $SAGE_LEDGER_URL stays there, never in this file,
the serialized DAG or ML Metadata).
"""
import json

from sage_tfx.pipelines import orchestration

CONFIG = json.loads({config!r})
CONFIG.update(orchestration.deployment_from_env())  # only $SAGE_LEDGER_URL, $SAGE_BEAM_ARGS
DAG = orchestration.airflow_dag(orchestration.build({name!r}, CONFIG, "airflow"))
''')


# --- secrets: referenced, never embedded ---------------------------------------------------------

_URL_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>,;]+")


def _strings(value) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)


def check_no_secrets(pipeline):
    """Refuses a pipeline that would write a password into ML Metadata, a spec or a DAG file.

    Every string in every component's properties (and every Beam flag) is searched for URLs;
    one with a password is refused with the message of ``secrets.check_no_password``.

    Raises:
      InvalidRequestError: which component and property, and how to reference the URL instead.
    """
    found = [(f"component {node.id}, property {key}", text)
             for node in pipeline.components
             for key, value in sorted(node.exec_properties.items())
             for text in _strings(value)]
    found += [("a Beam flag", flag) for flag in pipeline.beam_pipeline_args or []]
    for where, text in found:
        for url in _URL_RE.findall(text):
            if secrets.has_password(url):
                try:
                    secrets.check_no_password(url, SPECS)
                except InvalidRequestError as exc:
                    raise InvalidRequestError(f"{where}: {exc}") from None
    return pipeline


def ledger_url_from_env(environ: Mapping[str, str] = os.environ,
                        name: str = LEDGER_URL_ENV) -> Optional[str]:
    """``$SAGE_LEDGER_URL`` as a pipeline may hold it: the URL when it has no password, else
    the reference ``env:SAGE_LEDGER_URL``, resolved by every pod or worker that connects."""
    value = environ.get(name)
    if not value:
        return None
    return secrets.ENV_PREFIX + name if secrets.has_password(value) else value


def write_kfp_package(job_path: str, k8s_secrets: Mapping[str, Tuple[str, str]]) -> str:
    """Writes ``<job>.yaml`` beside a compiled job JSON: the Kubeflow Pipelines package that
    ``sage-tfx submit`` (or ``kfp.Client().create_run_from_pipeline_package``) submits — the
    pipeline spec, then (with Secrets) the platform spec (:func:`kubernetes_platform_spec`) as
    a second YAML document.

    (The job JSON is Vertex AI's PipelineJob, which has no platform spec: kfp-pipeline-spec
    0.1.16's ``PipelineJob`` holds ``pipeline_spec`` and ``runtime_config`` only.)
    """
    import yaml

    with open(job_path) as f:
        spec = json.load(f)["pipelineSpec"]
    labels = spec["deploymentSpec"]["executors"]
    path = os.path.splitext(job_path)[0] + ".yaml"
    docs = [spec] + ([kubernetes_platform_spec(labels, k8s_secrets)] if k8s_secrets else [])
    with open(path, "w") as f:
        yaml.safe_dump_all(docs, f, sort_keys=True)
    return path


def token_env_secret(token_secret: Optional[str]) -> Dict[str, Tuple[str, str]]:
    """``{"SAGE_LEDGER_TOKEN": (name, key)}`` for a ``NAME:KEY`` token Secret (or nothing)."""
    return {access.TOKEN_ENV: parse_secret_ref(token_secret)} if token_secret else {}


def parse_beam_args(values: Optional[Sequence[str]]) -> list:
    """``--beam-arg`` values as Beam flags (each value one flag, e.g. ``--runner=PortableRunner``).
    """
    flags = []
    for v in values or []:
        if not v.startswith("--"):
            raise ValueError(f"a --beam-arg value is one Beam flag such as --runner=DirectRunner, "
                             f"got {v!r}")
        flags.append(v)
    return flags

