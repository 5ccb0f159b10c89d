"""The Kubeflow Pipelines package: Secrets as pod environment (kfp-kubernetes platform spec),
reading a compiled package and checking a run's parameter values against it.

No TensorFlow or TFX here: ``sage-tfx submit`` reads and sends a package compiled earlier.
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from sage_tfx.errors import InvalidRequestError

_K8S_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_K8S_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_secret_ref(text: str) -> Tuple[str, str]:
    """``NAME:KEY`` (a Kubernetes Secret and one of its keys) as ``(name, key)``.

    Raises:
      InvalidRequestError: not a Secret name (DNS subdomain) and a data key.
    """
    name, _, key = (text or "").partition(":")
    if not _K8S_NAME_RE.match(name) or not _K8S_KEY_RE.match(key):
        raise InvalidRequestError(
            f"a Kubernetes Secret reference is NAME:KEY (a Secret in the pipeline's namespace "
            f"and one of its data keys, e.g. sage-ledger:url), got {text!r}")
    return name, key


def kubernetes_platform_spec(executor_labels: Sequence[str],
                             k8s_secrets: Mapping[str, Tuple[str, str]]) -> dict:
    """The kfp-kubernetes platform spec that sets env vars from Secrets in every executor.

    ``{"platforms": {"kubernetes": {"deploymentSpec": {"executors": {label: {"secretAsEnv":
    [{"secretName": ..., "keyToEnv": [{"secretKey": ..., "envVar": ...}]}]}}}}}}`` — the
    format ``kfp.kubernetes.use_secret_as_env`` writes (``KubernetesExecutorConfig``).
    """
    by_secret: Dict[str, list] = {}
    for env, (name, key) in sorted(k8s_secrets.items()):
        if not _ENV_RE.match(env):
            raise InvalidRequestError(f"not an environment variable name: {env!r}")
        parse_secret_ref(f"{name}:{key}")
        by_secret.setdefault(name, []).append({"envVar": env, "secretKey": key})
    config = {"secretAsEnv": [{"keyToEnv": pairs, "secretName": name}
                              for name, pairs in sorted(by_secret.items())]}
    return {"platforms": {"kubernetes": {"deploymentSpec": {
        "executors": {label: config for label in sorted(executor_labels)}}}}}



def read_package(path: str) -> Tuple[dict, Optional[dict]]:
    """``(pipeline spec, platform spec or None)`` of a KFP package YAML (``sage-tfx compile``).

    Raises:
      InvalidRequestError: not a KFP v2 package (one pipeline spec, optionally a platform spec).
    """
    import yaml

    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    if not 1 <= len(docs) <= 2 or not isinstance(docs[0], dict) or "root" not in docs[0] \
            or "pipelineInfo" not in docs[0]:
        raise InvalidRequestError(
            f"{path} is not a Kubeflow Pipelines v2 package (the <name>.yaml that sage-tfx "
            f"compile --target kubeflow writes)")
    platform = docs[1] if len(docs) == 2 else None
    if platform is not None and "platforms" not in platform:
        raise InvalidRequestError(f"{path}: the second document is not a platform spec")
    return docs[0], platform


def with_secrets(spec: dict, platform: Optional[dict],
                 k8s_secrets: Mapping[str, Tuple[str, str]]) -> Optional[dict]:
    """The platform spec with ``k8s_secrets`` (``{env var: (Secret, key)}``) set in every
    executor; a variable already mapped by the package is re-mapped to the given Secret."""
    if not k8s_secrets:
        return platform
    labels = spec["deploymentSpec"]["executors"]
    merged: Dict[str, Dict[str, Tuple[str, str]]] = {label: {} for label in labels}
    executors = ((platform or {}).get("platforms", {}).get("kubernetes", {})
                 .get("deploymentSpec", {}).get("executors", {}))
    for label, config in executors.items():
        for entry in config.get("secretAsEnv", []):
            for pair in entry["keyToEnv"]:
                merged.setdefault(label, {})[pair["envVar"]] = (entry["secretName"],
                                                                pair["secretKey"])
    out: Dict[str, Any] = {}
    for label, env in merged.items():
        env.update(k8s_secrets)
        out.update(kubernetes_platform_spec([label], env)["platforms"]["kubernetes"]
                   ["deploymentSpec"]["executors"])
    return {"platforms": {"kubernetes": {"deploymentSpec": {"executors": out}}}}


def _typed(name: str, kind: str, text: str) -> Any:
    try:
        if kind == "NUMBER_INTEGER":
            return int(text)
        if kind == "NUMBER_DOUBLE":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError(text)
            return value
        if kind == "BOOLEAN":
            if text not in ("true", "false"):
                raise ValueError(text)
            return text == "true"
        if kind == "STRING":
            return text
    except ValueError:
        pass
    raise InvalidRequestError(f"--param {name}={text!r}: not a {kind.lower()}")


def check_parameters(spec: dict, given: Mapping[str, str]) -> Dict[str, Any]:
    """The run's parameter values: ``given`` (``{name: text}``) typed by the package's root
    input definitions and checked, never adjusted — ``epsilon`` / ``delta`` as the ledger checks
    a cost, ``window_last`` as a window. A parameter left out keeps the compiled default.

    Raises:
      InvalidRequestError / InvalidPrivacyParameterError (ValueErrors): an unknown name, a
        value of the wrong type, an invalid ε, δ or window, a required parameter left out.
    """
    from sage_tfx.ledger import Window, accounting

    declared = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise InvalidRequestError(
            f"the pipeline has no parameter {', '.join(unknown)}; its runtime parameters: "
            f"{', '.join(sorted(declared)) or 'none'} (the rest is fixed at compile time)")
    values = {k: _typed(k, declared[k].get("parameterType", "STRING"), v)
              for k, v in given.items()}
    if "epsilon" in values:
        accounting.check_epsilon(values["epsilon"])
    if "delta" in values:
        accounting.check_delta(values["delta"])
    if "window_last" in values:
        Window(last=values["window_last"])
    missing = sorted(k for k, d in declared.items()
                     if k not in values and "defaultValue" not in d and not d.get("isOptional"))
    if missing:
        raise InvalidRequestError(f"the pipeline needs --param for {', '.join(missing)}")
    return values


def run_pipeline_spec(spec: dict, platform: Optional[dict]) -> dict:
    """The ``pipeline_spec`` of a KFP v2 run: the pipeline spec, or with a platform spec both
    (``{"pipeline_spec": ..., "platform_spec": ...}``, as the KFP SDK sends a package)."""
    return {"pipeline_spec": spec, "platform_spec": platform} if platform else spec
