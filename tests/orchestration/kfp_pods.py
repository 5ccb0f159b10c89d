"""Runs a compiled Kubeflow Pipelines v2 job spec task by task, as Kubeflow's pods would.

No cluster is reachable from the test machines, so this does, on this machine, the part of the
KFP backend that matters for a TFX pipeline: it parses the job JSON with the pipeline-spec protos,
walks the root DAG in dependency order, evaluates each task's trigger condition (TFX's ``Cond``)
on the upstream artifacts' metadata, builds the task's ``ExecutorInput`` (parameters from the
IR, input artifacts from the producers' executor outputs, output artifacts under the pipeline
root), substitutes KFP's job placeholders in constant parameters as the KFP driver does, and
runs the executor's container command and arguments from the IR (``{{$}}`` replaced by the
ExecutorInput JSON) in a fresh process. The only liberty taken: ``python`` in the container
command resolves to this virtualenv's interpreter (the image's ``python`` in a pod).

With the KFP package beside the job (``<job>.yaml``: pipeline spec + kfp-kubernetes platform
spec), each executor's ``secretAsEnv`` entries set its environment from ``k8s_secrets``
(``{secret name: {key: value}}``), as the KFP driver does from the namespace's Secrets; a
missing Secret or key fails the task, as Kubernetes refuses to start such a container.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from typing import Dict, List

from google.protobuf import json_format, struct_pb2
from kfp.pipeline_spec import pipeline_spec_pb2 as pb

_CONDITION_RE = re.compile(
    r"^\(inputs\.artifacts\['([^']+)'\]\.artifacts\[0\]\.metadata\['([^']+)'\] == "
    r"([-0-9.]+)\)$")


def load_job(path: str) -> pb.PipelineJob:
    """The PipelineJob of a compiled JSON (fails on any field the protos do not know)."""
    job = pb.PipelineJob()
    with open(path) as f:
        json_format.Parse(f.read(), job)
    return job


def pipeline_spec(job: pb.PipelineJob) -> pb.PipelineSpec:
    spec = pb.PipelineSpec()
    json_format.ParseDict(json_format.MessageToDict(job.pipeline_spec), spec)
    return spec


def deployment(spec: pb.PipelineSpec) -> pb.PipelineDeploymentConfig:
    config = pb.PipelineDeploymentConfig()
    json_format.ParseDict(json_format.MessageToDict(spec.deployment_spec), config)
    return config


def dag_order(spec: pb.PipelineSpec) -> List[str]:
    """The root DAG's task names in dependency order (ties by name)."""
    tasks = spec.root.dag.tasks
    done: List[str] = []
    while len(done) < len(tasks):
        ready = sorted(n for n, t in tasks.items()
                       if n not in done and all(d in done for d in t.dependent_tasks))
        if not ready:
            raise ValueError("the DAG has a cycle")
        done.append(ready[0])
    return done


def _condition_holds(condition: str, inputs: pb.ExecutorInput.Inputs) -> bool:
    """TFX's Cond, compiled to CEL over an input artifact's metadata (the one form TFX emits
    for ``custom_property(...) == value``)."""
    if not condition:
        return True
    m = _CONDITION_RE.match(condition)
    if m is None:
        raise NotImplementedError(f"trigger condition not understood: {condition}")
    key, field, value = m.group(1), m.group(2), float(m.group(3))
    metadata = json_format.MessageToDict(inputs.artifacts[key].artifacts[0].metadata)
    return metadata.get(field) == value


def _substitute(value: struct_pb2.Value, placeholders: Dict[str, str]) -> struct_pb2.Value:
    """KFP's job placeholders inside a constant string parameter (the KFP driver's job)."""
    if value.WhichOneof("kind") == "string_value":
        text = value.string_value
        for k, v in placeholders.items():
            text = text.replace(k, v)
        return struct_pb2.Value(string_value=text)
    return value


def platform_env(path: str, k8s_secrets: Dict[str, Dict[str, str]]) -> Dict[str, Dict[str, str]]:
    """``{executor label: {env var: value}}`` from the package's kfp-kubernetes platform spec."""
    import yaml

    package = os.path.splitext(path)[0] + ".yaml"
    if not os.path.exists(package):
        return {}
    with open(package) as f:
        docs = list(yaml.safe_load_all(f))
    if len(docs) < 2:  # no platform spec: no Secrets
        return {}
    executors = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    out: Dict[str, Dict[str, str]] = {}
    for label, config in executors.items():
        for entry in config.get("secretAsEnv", []):
            data = k8s_secrets[entry["secretName"]]  # KeyError: the Secret does not exist
            for pair in entry["keyToEnv"]:
                out.setdefault(label, {})[pair["envVar"]] = data[pair["secretKey"]]
    return out


def parameter_values(spec: pb.PipelineSpec, job: pb.PipelineJob,
                     parameters: Dict[str, object] = None) -> Dict[str, struct_pb2.Value]:
    """The run's pipeline parameters as the KFP backend resolves them: the spec's defaults,
    then the job's runtime config, then ``parameters`` (a run's submitted values)."""
    values = {k: p.default_value for k, p in spec.root.input_definitions.parameters.items()
              if p.HasField("default_value")}
    values.update(job.runtime_config.parameter_values)
    for k, v in (parameters or {}).items():
        values[k] = json_format.ParseDict(v, struct_pb2.Value())
    return values


def write_job(path: str, pipeline_spec_dict: dict, runtime_config: dict) -> str:
    """A job JSON (PipelineJob) from a submitted run's pipeline spec and runtime config."""
    config = {"gcsOutputDirectory": runtime_config.get("pipeline_root")
              or pipeline_spec_dict.get("defaultPipelineRoot", ""),
              "parameterValues": runtime_config.get("parameters") or {}}
    with open(path, "w") as f:
        json.dump({"pipelineSpec": pipeline_spec_dict, "runtimeConfig": config}, f)
    return path


def run_job(path: str, *, env: Dict[str, str] = None, job_uuid: str = None,
            log_dir: str = None, k8s_secrets: Dict[str, Dict[str, str]] = None,
            base_env: Dict[str, str] = None,
            parameters: Dict[str, object] = None) -> Dict[str, dict]:
    """Runs every task of the compiled job at ``path``; returns ``{task: result}``.

    ``parameters`` sets pipeline parameters (runtime parameters) as a submitted run does; a
    task input bound to a pipeline parameter gets the resolved value (:func:`parameter_values`).

    A result is ``{"ran": bool, "outputs": {key: RuntimeArtifact as dict}, "seconds": float}``;
    a task whose trigger condition is false is skipped (``ran`` False), like KFP does.

    Raises:
      subprocess.CalledProcessError: a task's process failed (its log is in ``log_dir``).
    """
    import time

    job = load_job(path)
    spec = pipeline_spec(job)
    executors = deployment(spec).executors
    root = job.runtime_config.gcs_output_directory
    job_uuid = job_uuid or str(uuid.uuid4())
    job_name = f"{spec.pipeline_info.name}-{job_uuid[:8]}"
    placeholders = {"{{$.pipeline_job_uuid}}": job_uuid, "{{$.pipeline_job_name}}": job_name}
    values = parameter_values(spec, job, parameters)
    outputs: Dict[str, Dict[str, pb.RuntimeArtifact]] = {}
    results: Dict[str, dict] = {}
    run_env = dict(os.environ if base_env is None else base_env, **(env or {}))
    from_secrets = platform_env(path, k8s_secrets or {})
    run_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + run_env.get("PATH", "")
    for name in dag_order(spec):
        task = spec.root.dag.tasks[name]
        component = spec.components[task.component_ref.name]
        executor_input = pb.ExecutorInput()
        for key, param in task.inputs.parameters.items():
            if param.component_input_parameter:  # KeyError: a required parameter not given
                value = values[param.component_input_parameter]
            else:
                value = _substitute(param.runtime_value.constant, placeholders)
            executor_input.inputs.parameter_values[key].CopyFrom(value)
        for key, art in task.inputs.artifacts.items():
            produced = outputs[art.task_output_artifact.producer_task][
                art.task_output_artifact.output_artifact_key]
            executor_input.inputs.artifacts[key].artifacts.append(produced)
        if not _condition_holds(task.trigger_policy.condition, executor_input.inputs):
            results[name] = {"ran": False, "outputs": {}, "seconds": 0.0}
            outputs[name] = {}
            continue
        task_root = os.path.join(root, job_uuid, name)
        for key, definition in component.output_definitions.artifacts.items():
            executor_input.outputs.artifacts[key].artifacts.append(pb.RuntimeArtifact(
                name=f"{job_name}/{name}/{key}", type=definition.artifact_type,
                uri=os.path.join(task_root, key)))
        executor_input.outputs.output_file = os.path.join(task_root, "executor_output.json")

        container = executors[component.executor_label].container
        invocation = json_format.MessageToJson(executor_input)
        argv = [*container.command, *[invocation if a == "{{$}}" else a for a in container.args]]
        start = time.monotonic()
        log = os.path.join(log_dir or task_root, f"{name}.log")
        os.makedirs(os.path.dirname(log), exist_ok=True)
        with open(log, "w") as f:
            subprocess.run(argv,
                           env=dict(run_env, **from_secrets.get(component.executor_label, {})),
                           stdout=f, stderr=subprocess.STDOUT, check=True)
        executor_output = pb.ExecutorOutput()
        with open(executor_input.outputs.output_file) as f:
            json_format.Parse(f.read(), executor_output, ignore_unknown_fields=True)
        produced = {}
        for key, declared in executor_input.outputs.artifacts.items():
            artifact = pb.RuntimeArtifact()
            artifact.CopyFrom(declared.artifacts[0])
            written = executor_output.artifacts[key].artifacts[0]
            artifact.metadata.CopyFrom(written.metadata)
            artifact.uri = written.uri or artifact.uri
            produced[key] = artifact
        outputs[name] = produced
        results[name] = {"ran": True, "seconds": time.monotonic() - start,
                         "outputs": {k: json_format.MessageToDict(v) for k, v in produced.items()},
                         "argv": argv}
    return results
