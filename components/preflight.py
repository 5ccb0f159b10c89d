"""Check before charge: what a DP component would refuse from its configuration, refused first.

The SageGate charges a run's whole privacy plan before any data is released, and a charge is
never refunded. A configuration error that a component downstream would refuse (a non-DP
analyzer in a ``preprocessing_fn``, ε shares that do not fit the plan's transform part, a plan
part no component finds, two components on one part) must therefore be found before the charge:
when the pipeline is built or compiled, and again by the gate's executor before
``ledger.request``.

**Registry.** Every DP component type that consumes a grant registers what it spends and, if it
has one, a check of its configuration (:func:`register`; the built-in entries are at the end):

* ``DPTransform`` spends ``transform``; its check traces the ``preprocessing_fn`` against the
  schema (``dp_transform/preflight.py``);
* ``DPTrainer``, ``DnDTrainer``, ``DPBaggingTrainer`` spend ``train`` (the DPTrainer's check is
  ``sage_tfx.components.dp_trainer.preflight.check(exec_properties)``, found by import path);
* ``DPModelValidator`` spends ``validate``.

A check is ``check(exec_properties)`` or, registered with ``takes_plan=True``,
``check(exec_properties, plan)``; it raises an ``InvalidRequestError`` (or another
``ValueError`` of ``sage_tfx.errors``) to refuse.

**How the gate learns its downstream configuration.** TFX wires components by channels and the
gate is upstream of all of them, so nothing reaches its executor at run time but its own exec
properties. :func:`attach` (called on a built pipeline: by ``orchestration.for_orchestrator``,
hence by every ``build`` / ``compile_kubeflow`` / ``airflow_dag``, and by the project's
``create_pipeline`` functions) finds, for every SageGate with a plan, the components consuming
its grant, runs every check against the plan, and bakes the **facts** into the gate's
``preflight_json`` exec property: each component's type, node id, parts and checked
configuration (JSON-able exec properties, plus the files it reads — module file, schema file —
with their SHA-256), and the plan they were checked against. Exec properties travel with the node
under every orchestrator (LocalDagRunner's IR, the KFP job spec, the Airflow DAG file), so the
gate's executor reads the same facts wherever it runs (:func:`check_before_charge`): it refuses
facts that do not match the plan it is about to charge, files whose digest changed since the
build, parts that do not match, and re-runs every component check whose plan differs from the
one checked at build (a check whose code runs the user's module runs in a subprocess without the
ledger's credentials). Only then does it charge.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import subprocess
import sys
from typing import Any, Callable, Mapping, Optional, Union

from absl import logging

from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.errors import InvalidRequestError

FACTS_VERSION = 1
GATE_TYPE = "SageGate"
# Environment variables a check subprocess never gets (the ledger and its credentials).
_SECRET_ENV_PREFIXES = ("SAGE_LEDGER", "SAGE_KEY", "PGPASSWORD", "AIRFLOW_CONN_")

Check = Union[Callable[..., None], str]


class PreflightError(InvalidRequestError):
    """A pipeline's configuration would be refused by one of its DP components: nothing is
    charged."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """What one DP component type spends and how its configuration is checked.

    Attributes:
      component_type: the component's class name (``type(node).__name__``).
      parts: the plan parts it spends.
      check: None, a callable or a ``"module:function"`` import path (resolved when run).
      takes_plan: the check takes ``(exec_properties, plan)``, else ``(exec_properties)``.
      isolated: the check runs the user's (untrusted) module: at the gate it runs in a
        subprocess without the ledger's credentials.
      facts: ``facts(node, pipeline) -> dict`` of extra JSON-able facts (files and digests).
      parts_of: ``parts_of(exec_properties) -> parts`` where the parts depend on the
        configuration (a configurable part name, an optional second part); else ``parts``.
    """

    component_type: str
    parts: tuple[str, ...]
    check: Optional[Check] = None
    takes_plan: bool = False
    isolated: bool = False
    facts: Optional[Callable[[Any, Any], dict]] = None
    parts_of: Optional[Callable[[Mapping[str, Any]], tuple[str, ...]]] = None


_REGISTRY: dict[str, Entry] = {}


def register(entry: Entry) -> Entry:
    """Registers (or replaces) the entry of ``entry.component_type``."""
    _REGISTRY[entry.component_type] = entry
    return entry


def registered(component_type: str) -> Optional[Entry]:
    """The entry of a component type, or None (the type consumes no plan part)."""
    return _REGISTRY.get(component_type)


def file_digest(path: str) -> str:
    """SHA-256 of a local file."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# --- facts from a built pipeline ------------------------------------------------------------

def _jsonable(value: Any) -> Any:
    """Exec property values as JSON: protos as JSON text, runtime parameters and placeholders by
    name (resolved only at run time: checks skip them)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if type(value).__name__ == "RuntimeParameter":
        return {"runtime_parameter": value.name}
    if hasattr(value, "DESCRIPTOR"):
        from google.protobuf import json_format
        return json_format.MessageToJson(value, sort_keys=True)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return {"unresolved": type(value).__name__}


def _consumes(node: Any, gate_id: str) -> bool:
    for channel in getattr(node, "inputs", {}).values():
        if getattr(channel, "producer_component_id", None) == gate_id:
            return True
    return False


def component_facts(node: Any, pipeline: Any) -> dict:
    """The facts of one grant consumer: type, node id, parts, exec properties, files."""
    entry = registered(type(node).__name__)
    facts = {"type": type(node).__name__, "id": node.id,
             "parts": (list(entry.parts_of(node.exec_properties) if entry.parts_of
                            else entry.parts) if entry else []),
             "exec_properties": {k: _jsonable(v) for k, v in sorted(node.exec_properties.items())}}
    if entry is not None and entry.facts is not None:
        facts.update(entry.facts(node, pipeline))
    return facts


def pipeline_facts(pipeline: Any, gate: Any) -> dict:
    """The facts the gate's executor re-checks: every registered component consuming the gate's
    grant (BlockExampleGen and stock components spend no plan part)."""
    consumers = [n for n in pipeline.components if n is not gate and _consumes(n, gate.id)
                 and registered(type(n).__name__) is not None]
    return {"version": FACTS_VERSION,
            "components": [component_facts(n, pipeline) for n in consumers]}


# --- the checks ------------------------------------------------------------------------------

def _resolve(check: Check) -> Optional[Callable[..., None]]:
    if not isinstance(check, str):
        return check
    module_name, _, function = check.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):  # the check's own module is missing
            logging.warning("preflight: %s is not installed; that component's configuration is "
                            "checked by the component itself only", module_name)
            return None
        raise
    return getattr(module, function)


def check_parts(facts: Mapping[str, Any], plan: plan_lib.PrivacyPlan) -> None:
    """Every grant consumer finds its part in the plan, and no part has two spenders.

    Raises:
      PreflightError: which component misses which part, or which part two components spend.
    """
    names = [p.name for p in plan.parts]
    spenders: dict[str, list[str]] = {}
    problems = []
    for c in facts.get("components", []):
        for part in c.get("parts", []):
            spenders.setdefault(part, []).append(f"{c['type']} {c['id']!r}")
            if part not in names:
                problems.append(f"  - {c['type']} {c['id']!r} spends plan part {part!r}, which "
                                f"the plan does not have (parts: {names})")
    for part, who in sorted(spenders.items()):
        if len(who) > 1:
            problems.append(f"  - plan part {part!r} is spent by {len(who)} components "
                            f"({', '.join(who)}): one charge pays for one spender per part; "
                            "give each its own part, or its own grant")
    if problems:
        raise PreflightError("the privacy plan does not match the components that spend it "
                             "(refused before any charge):\n" + "\n".join(problems))
    unspent = sorted(set(names) - set(spenders))
    if unspent:
        logging.warning("preflight: plan part(s) %s are charged but no registered component "
                        "spends them", unspent)


def _run_check(entry: Entry, component: Mapping[str, Any], plan: plan_lib.PrivacyPlan) -> None:
    fn = _resolve(entry.check) if entry.check is not None else None
    if fn is None:
        return
    props = dict(component["exec_properties"])
    props.update({k: v for k, v in component.items()
                  if k not in ("type", "id", "parts", "exec_properties")})
    if entry.takes_plan:
        fn(props, plan)
    else:
        fn(props)


def check_components(facts: Mapping[str, Any], plan: plan_lib.PrivacyPlan, *,
                     isolate: bool = False) -> None:
    """Runs :func:`check_parts` and every registered component check against ``plan``.

    Args:
      isolate: run the checks of ``isolated`` entries (the user's module) in a subprocess
        without the ledger's credentials (the gate's executor does).

    Raises:
      PreflightError: the plan parts do not match, or a component check refused; the message
        names the component and holds the check's own message.
    """
    check_parts(facts, plan)
    for component in facts.get("components", []):
        entry = registered(component["type"])
        if entry is None or entry.check is None:
            continue
        try:
            if isolate and entry.isolated:
                _run_isolated(component, plan)
            else:
                _run_check(entry, component, plan)
        except PreflightError:
            raise
        except ValueError as e:  # sage_tfx.errors are ValueErrors
            raise PreflightError(f"{component['type']} {component['id']!r} would refuse this "
                                 f"run (refused before any charge): {e}") from e


def _child_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(_SECRET_ENV_PREFIXES)}


def _run_isolated(component: Mapping[str, Any], plan: plan_lib.PrivacyPlan) -> None:
    payload = json.dumps({"component": component, "plan": plan.to_json()})
    proc = subprocess.run([sys.executable, "-m", "sage_tfx.components.preflight"],
                          input=payload, capture_output=True, text=True, env=_child_env(),
                          check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"error": proc.stderr[-2000:] or "no result",
                                                  "kind": "crash"}
    if result.get("error") is not None:
        if result.get("kind") == "refused":
            raise ValueError(result["error"])
        raise PreflightError(f"the preflight check of {component['type']} {component['id']!r} "
                             f"failed to run: {result['error']}")


def _child_main() -> None:  # python -m sage_tfx.components.preflight (the isolated check)
    payload = json.loads(sys.stdin.read())
    component = payload["component"]
    plan = plan_lib.PrivacyPlan.from_json(payload["plan"])
    entry = registered(component["type"])
    try:
        if entry is not None:
            _run_check(entry, component, plan)
        out = {"error": None}
    except ValueError as e:
        out = {"error": str(e), "kind": "refused"}
    except Exception as e:  # pylint: disable=broad-except  (reported to the parent)
        out = {"error": f"{type(e).__name__}: {e}", "kind": "crash"}
    print(json.dumps(out))


# --- build time and gate time ----------------------------------------------------------------

def _gates(pipeline: Any) -> list:
    from sage_tfx.components.gate import component as gate_component
    return [n for n in pipeline.components if isinstance(n, gate_component.SageGate)]


def attach(pipeline: Any) -> Any:
    """Checks every SageGate's downstream configuration against its plan and bakes the facts
    into the gate (``preflight_json``); returns the pipeline.

    Gates without a plan (a plain (ε, δ) charge) consume no plan parts: nothing to check. A plan
    given as a runtime parameter is checked by the gate's executor only.

    Raises:
      PreflightError: a component would refuse the run.
    """
    from sage_tfx.components.gate import spec as gate_spec

    for gate in _gates(pipeline):
        plan_json = gate.exec_properties.get(gate_spec.PLAN_JSON_KEY)
        if not plan_json:
            continue
        facts = pipeline_facts(pipeline, gate)
        if isinstance(plan_json, str):
            plan = plan_lib.PrivacyPlan.from_json(plan_json)
            facts["checked_plan_json"] = plan.to_json()
            text = json.dumps(facts, sort_keys=True)
            if gate.exec_properties.get(gate_spec.PREFLIGHT_JSON_KEY) == text:
                continue  # already checked: the same components, files and plan
            check_components(facts, plan)
        else:
            text = json.dumps(facts, sort_keys=True)
        gate.exec_properties[gate_spec.PREFLIGHT_JSON_KEY] = text
    return pipeline


def _check_files(facts: Mapping[str, Any]) -> list[str]:
    """Files the facts name whose digest changed since the build (unreadable files are left
    to the component: it may run where the file is)."""
    changed = []
    for component in facts.get("components", []):
        for file_key, digest_key in (("module_file", "module_file_sha256"),
                                     ("schema_file", "schema_sha256")):
            path, digest = component.get(file_key), component.get(digest_key)
            if path and digest and os.path.isfile(path) and file_digest(path) != digest:
                changed.append(f"{component['type']} {component['id']!r}: {path}")
    return changed


def check_before_charge(preflight_json: Optional[str], plan: plan_lib.PrivacyPlan) -> None:
    """The gate executor's preflight, before ``ledger.request`` (module doc).

    Raises:
      PreflightError: unreadable facts, changed files, mismatched parts, or a component check
        that refuses (re-run when the plan differs from the one checked at build).
    """
    if not preflight_json:
        logging.warning("SageGate: no preflight facts (the pipeline was not built through "
                        "sage_tfx.components.preflight.attach): the plan is charged without "
                        "checking the components that spend it")
        return
    try:
        facts = json.loads(preflight_json)
    except ValueError as e:
        raise PreflightError(f"preflight_json is not JSON: {e}") from e
    if facts.get("version") != FACTS_VERSION:
        raise PreflightError(f"preflight facts of version {facts.get('version')!r}, expected "
                             f"{FACTS_VERSION}: rebuild the pipeline")
    changed = _check_files(facts)
    if changed:
        raise PreflightError("files changed since the pipeline was built and checked (refused "
                             "before any charge; rebuild the pipeline): " + "; ".join(changed))
    if facts.get("checked_plan_json") == plan.to_json():
        check_parts(facts, plan)  # cheap; the component checks passed for this very plan
        return
    check_components(facts, plan, isolate=True)


def _transform_facts(node: Any, pipeline: Any) -> dict:
    from sage_tfx.components.dp_transform import preflight as transform_preflight
    return transform_preflight.facts(node, pipeline)


register(Entry("DPTransform", (plan_lib.TRANSFORM,),
               check="sage_tfx.components.dp_transform.preflight:check", takes_plan=True,
               isolated=True, facts=_transform_facts))
register(Entry("DPTrainer", (plan_lib.TRAIN,),
               check="sage_tfx.components.dp_trainer.preflight:check", isolated=True))
register(Entry("DnDTrainer", (plan_lib.TRAIN,)))
register(Entry("DPBaggingTrainer", (plan_lib.TRAIN,)))
# (Exec property names and part names of dp_validator/spec.py and dp_statistics_gen/spec.py,
# spelled out here: this module imports no component spec, hence no TFX.)
register(Entry("DPModelValidator", (plan_lib.VALIDATE,),
               parts_of=lambda props: ((plan_lib.VALIDATE, "baseline")
                                       if props.get("compare_baseline") else (plan_lib.VALIDATE,))))
register(Entry("DPStatisticsGen", ("statistics",),
               parts_of=lambda props: (props.get("plan_part") or "statistics",),
               check="sage_tfx.components.dp_statistics_gen.preflight:check", takes_plan=True))


if __name__ == "__main__":
    _child_main()
