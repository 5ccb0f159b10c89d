"""SageGate executor: one ledger request, the decision written as a SageGrant artifact.

Sage §3.2: the ledger charges every requested block (or none) and only then hands out block
locations. A denial (not enough budget left) is an outcome, not a failure: the executor writes the
DENIED marker and ``granted`` = 0 and returns normally. Bad configuration (unknown stream or block,
a privacy cost that does not match the stream's accounting mode, a run id reused for a different
request) raises a ``ValueError`` subclass and the component fails.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Dict, List, Optional, Sequence

from absl import logging
from tfx import types
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils

from sage_tfx.ledger import accounting, secrets
from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.components import artifacts, plan_io
from sage_tfx.components.gate import spec
from sage_tfx.errors import AccountingModeError, InvalidRequestError
from sage_tfx.ledger import DEFAULT_CONTEXT, Decision, Window, open_ledger
from sage_tfx.ledger.values import check_name  # the ledger's own name rules

# Derived run ids use the ledger's name alphabet (``check_name``: 1-128 characters).
_BAD_CHARS_RE = re.compile(r"[^A-Za-z0-9_.:\-]")
_MAX_NAME = 128

REPLAYED_KEY = "replayed"


def check_ledger_url(url: Any) -> str:
    """Checks the form of a ledger URL (sqlite:///path or postgresql://...), or a reference to
    one (``env:NAME``, ``file:/path``: resolved where the ledger is opened), that holds no
    password: component properties land in ML Metadata, compiled specs and DAG files."""
    if secrets.is_reference(url) and url.partition(":")[2]:
        return url
    if not isinstance(url, str) or not url.startswith(
            ("sqlite:///", "postgresql://", "postgres://")) or url == "sqlite:///":
        raise InvalidRequestError(
            f"ledger_url must be sqlite:///path/to/ledger.db, postgresql://user@host:port/db or "
            f"a reference env:NAME / file:/path, got {secrets.redact(url)!r}")
    return secrets.check_no_password(url, "the pipeline's component properties (ML Metadata, "
                                          "compiled specs, DAG files)")


def derive_run_id(pipeline_name: str, node_id: str, pipeline_run_id: str) -> str:
    """The default ledger run id of a gate: ``<pipeline>.<node>.<pipeline run id>``.

    Re-running (retrying) the node in the same pipeline run gives the same run id, so the ledger
    returns the same grant without charging again; a new pipeline run gives a new run id.
    Characters the ledger does not accept become '-'; an id longer than 128 characters keeps a
    prefix and a hash of the whole. When that text alone could stand for two different
    (pipeline, node) pairs — a '.' inside a name (``a.b`` + ``c`` against ``a`` + ``b.c``) or a
    replaced character (``my pipe`` against ``my-pipe``) — a hash of the exact triple is
    appended, so two gates never share a run id (plain names keep the id they always had).
    """
    raw = f"{pipeline_name}.{node_id}.{pipeline_run_id}"
    run_id = _BAD_CHARS_RE.sub("-", raw)
    if not run_id[:1].isalnum():
        run_id = "r" + run_id
    digest = hashlib.sha256(json.dumps([pipeline_name, node_id, pipeline_run_id]).encode()
                            ).hexdigest()[:16]
    names = f"{pipeline_name}{node_id}"
    if "." in names or _BAD_CHARS_RE.search(names):
        run_id = f"{run_id}-{digest}"
    if len(run_id) > _MAX_NAME:
        run_id = run_id[:_MAX_NAME - len(digest) - 1] + "-" + digest
    return run_id


def build_request(*, blocks: Optional[Sequence[str]] = None, window_last: Optional[int] = None,
                  window_min_blocks: Optional[int] = None, epsilon: Optional[float] = None,
                  delta: Optional[float] = None,
                  event_json: Optional[str] = None) -> Dict[str, Any]:
    """Validates a gate's request and returns the keyword arguments of ``Ledger.request``.

    Exactly one of ``blocks`` / ``window_last``; exactly one of ``epsilon`` (with optional
    ``delta``, basic mode) / ``event_json`` (rdp mode). Privacy parameters are checked, never
    clamped.

    Returns:
      ``{"blocks": list | None, "window": Window | None, "epsilon": float | None,
      "delta": float | None, "event": DpEvent | None}``.

    Raises:
      InvalidRequestError, InvalidPrivacyParameterError, AccountingModeError (ValueErrors).
    """
    if (blocks is None) == (window_last is None):
        raise InvalidRequestError(
            "give exactly one of blocks=[block ids] or window_last=N (the last N blocks with "
            f"budget left), got blocks={blocks!r}, window_last={window_last!r}")
    window = None
    if blocks is not None:
        if window_min_blocks is not None:
            raise InvalidRequestError("window_min_blocks needs window_last, not blocks")
        if isinstance(blocks, (str, bytes)) or not all(isinstance(b, str) for b in blocks):
            raise InvalidRequestError(f"blocks must be a list of block ids, got {blocks!r}")
        blocks = list(blocks)
        if not blocks:
            raise InvalidRequestError("blocks is empty: request at least one block")
        if len(set(blocks)) != len(blocks):
            raise InvalidRequestError(f"a block is listed twice in blocks={blocks!r}")
    else:
        window = Window(last=window_last, min_blocks=window_min_blocks)
    event = None
    if event_json is not None:
        if epsilon is not None or delta is not None:
            raise AccountingModeError(
                "give either epsilon (and delta) for a basic-mode stream or event_json (a "
                "serialized dp_accounting DpEvent) for an rdp-mode stream, not both")
        if not isinstance(event_json, str):
            raise InvalidRequestError(
                "event_json must be the text of sage_tfx.ledger.accounting.event_to_json(event), "
                "got "
                f"{type(event_json).__name__}")
        try:
            event = accounting.event_from_json(event_json)
        except (ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError
            raise InvalidRequestError(f"event_json is not a serialized DpEvent: {e}") from e
        accounting.check_event(event)
    else:
        if epsilon is None:
            if delta is not None:
                raise InvalidRequestError("delta was given without epsilon")
            raise InvalidRequestError(
                "give the run's privacy cost: epsilon (and delta) for a basic-mode stream, or "
                "event_json for an rdp-mode stream")
        epsilon = accounting.check_epsilon(epsilon)
        if delta is not None:
            delta = accounting.check_delta(delta)
    return {"blocks": blocks, "window": window, "epsilon": epsilon, "delta": delta,
            "event": event}


def plan_cost(plan: Any) -> tuple:
    """A privacy plan (``PrivacyPlan`` or its JSON) as ``(plan_json, cost)``.

    ``cost`` holds the gate's request parameters: ``epsilon`` / ``delta`` for a basic plan or
    ``event_json`` (the composed DpEvent) for an rdp plan; the others are None.
    """
    if isinstance(plan, str):
        try:
            plan = plan_lib.PrivacyPlan.from_json(plan)
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidRequestError(f"plan is not a serialized PrivacyPlan: {e}") from e
    if not isinstance(plan, plan_lib.PrivacyPlan):
        raise InvalidRequestError(
            f"plan must be a sage_tfx.adaptive.plan.PrivacyPlan, got {plan!r}")
    cost = plan.cost()
    if "event" in cost:
        return plan.to_json(), {"epsilon": None, "delta": None,
                                "event_json": accounting.event_to_json(cost["event"])}
    return plan.to_json(), {"epsilon": cost["epsilon"], "delta": cost["delta"], "event_json": None}


def _get(exec_properties: Dict[str, Any], key: str) -> Any:
    """An optional exec property; absent, None and "" all mean unset."""
    value = exec_properties.get(key)
    return None if value is None or value == "" else value


def request_from_exec_properties(exec_properties: Dict[str, Any]) -> Dict[str, Any]:
    """``build_request`` from a gate's exec properties."""
    blocks_json = _get(exec_properties, spec.BLOCKS_KEY)
    blocks = None
    if blocks_json is not None:
        try:
            blocks = json.loads(blocks_json)
        except ValueError as e:
            raise InvalidRequestError(f"{spec.BLOCKS_KEY} must be a JSON list: {e}") from e
    window_last = _get(exec_properties, spec.WINDOW_LAST_KEY)
    window_min = _get(exec_properties, spec.WINDOW_MIN_BLOCKS_KEY)
    epsilon = _get(exec_properties, spec.EPSILON_KEY)
    delta = _get(exec_properties, spec.DELTA_KEY)
    return build_request(
        blocks=blocks,
        window_last=int(window_last) if window_last is not None else None,
        window_min_blocks=int(window_min) if window_min is not None else None,
        epsilon=epsilon, delta=delta, event_json=_get(exec_properties, spec.EVENT_JSON_KEY))


def check_min_records(min_records: Any) -> int:
    """``min_records`` as an int >= 1.

    Raises:
      InvalidRequestError: not an integer >= 1.
    """
    if isinstance(min_records, bool) or not isinstance(min_records, int) or min_records < 1:
        raise InvalidRequestError(f"min_records must be an integer >= 1, got {min_records!r}")
    return min_records


def request_with_min_records(ledger, stream: str, *, run_id: str, context: str, request: dict,
                             min_records: int) -> Decision:
    """A request whose blocks must hold ``min_records`` records (the ledger's public sizes).

    The charge is reserved (no locations), the granted blocks' recorded sizes are summed, and the
    reservation is then released, or cancelled — a refund, since no data was released — and the
    run denied with the reason. Block sizes are ledger metadata, never read from the data; a
    block registered without a size cannot be counted and is a denial.
    """
    decision = ledger.request(stream, run_id=run_id, context=context, release=False, **request)
    if not decision.granted:
        return decision
    grant = decision.grant
    if grant.status == "cancelled":  # a replay of a run this check denied before
        return Decision(False, None, _too_few_reason(grant, ledger, stream, context, min_records),
                        replayed=True)
    if grant.status == "released":  # a replay of a run that passed the check
        return decision
    reason = _too_few_reason(grant, ledger, stream, context, min_records)
    if reason:
        ledger.cancel(grant.grant_id)
        logging.warning("SageGate: reservation %s cancelled and refunded: %s", grant.grant_id,
                        reason)
        return Decision(False, None, reason, replayed=decision.replayed)
    return Decision(True, ledger.release(grant.grant_id), "", replayed=decision.replayed)


def _too_few_reason(grant, ledger, stream: str, context: str, min_records: int) -> str:
    sizes = [ledger.block(stream, b.block_id, context).records for b in grant.blocks]
    if any(n is None for n in sizes):
        return (f"min_records={min_records} needs the ledger's block sizes, but a granted block "
                "was registered without one")
    total = sum(sizes)
    if total < min_records:
        return (f"the granted blocks hold {total} records (ledger block sizes), fewer than "
                f"min_records={min_records}")
    return ""


def node_identity(context: Any, exec_properties: Dict[str, Any]) -> tuple:
    """``(pipeline id, node id)`` of the gate, from which its default run id is derived.

    The executor context's ids where it has them (LocalDagRunner), else the ``pipeline_id`` /
    ``node_id`` exec properties baked in when the pipeline was built for its orchestrator
    (Kubeflow and Airflow give an executor no pipeline node).

    Raises:
      InvalidRequestError: neither names the node (or the pipeline): two gates of one pipeline
        run would share one run id, and the second would replay the first one's grant.
    """
    node = getattr(context, "pipeline_node", None) if context is not None else None
    info = getattr(context, "pipeline_info", None) if context is not None else None
    node_id = (node.node_info.id if node is not None else "") or _get(exec_properties,
                                                                      spec.NODE_ID_KEY)
    pipeline_id = (info.id if info is not None else "") or _get(exec_properties,
                                                               spec.PIPELINE_ID_KEY)
    if not node_id or not pipeline_id:
        missing = " and ".join(k for k, v in (("pipeline node id", node_id),
                                              ("pipeline name", pipeline_id)) if not v)
        raise InvalidRequestError(
            f"SageGate cannot derive its run id: the orchestrator gave no {missing} and the gate "
            f"has no {spec.NODE_ID_KEY!r} / {spec.PIPELINE_ID_KEY!r} exec property. Build the "
            "pipeline for its orchestrator (sage_tfx.pipelines.orchestration.for_orchestrator; "
            "compile_kubeflow and airflow_dag do) or pass run_id")
    return str(pipeline_id), str(node_id)


class Executor(base_executor.BaseExecutor):
    """Asks the ledger for the run's blocks and writes the decision (grant or denial)."""

    def _run_id(self, exec_properties: Dict[str, Any]) -> str:
        explicit = _get(exec_properties, spec.RUN_ID_KEY)
        if explicit is not None:
            return check_name("run_id", explicit)
        ctx = self._context
        pipeline_run_id = _get(exec_properties, spec.PIPELINE_RUN_ID_KEY) or (
            ctx.pipeline_run_id if ctx is not None else None)
        if pipeline_run_id and "{{" in str(pipeline_run_id):
            # A constant run id would replay one grant in every run: refuse it.
            raise InvalidRequestError(
                f"SageGate got the unresolved pipeline run id template {pipeline_run_id!r}: this "
                "orchestrator does not substitute it. Build the pipeline for the orchestrator "
                "that runs it (sage_tfx.pipelines.orchestration.for_orchestrator) or pass run_id")
        if not pipeline_run_id:
            raise InvalidRequestError(
                "SageGate needs a run id: pass run_id=... or run it in a pipeline whose "
                "orchestrator provides a pipeline run id")
        pipeline_id, node_id = node_identity(ctx, exec_properties)
        return derive_run_id(pipeline_id, node_id, pipeline_run_id)

    def Do(self, input_dict: Dict[str, List[types.Artifact]],
           output_dict: Dict[str, List[types.Artifact]],
           exec_properties: Dict[str, Any]) -> None:
        """Requests the blocks from the ledger; writes a grant or a denial, never nothing.

        Args:
          input_dict: unused (the gate has no inputs).
          output_dict: ``grant``: a list of one SageGrant artifact.
          exec_properties: the keys of ``sage_tfx.components.gate.spec``.

        Raises:
          ValueError subclasses (sage_tfx.errors) for bad configuration; nothing is charged.
        """
        self._log_startup(input_dict, output_dict, exec_properties)
        ledger_url = check_ledger_url(exec_properties.get(spec.LEDGER_URL_KEY))
        stream = check_name("stream", exec_properties.get(spec.STREAM_KEY))
        context = check_name("context",
                             _get(exec_properties, spec.CONTEXT_KEY) or DEFAULT_CONTEXT)
        request = request_from_exec_properties(exec_properties)
        plan = None
        plan_json = _get(exec_properties, spec.PLAN_JSON_KEY)
        if plan_json:
            plan, cost = plan_lib.PrivacyPlan.from_json(plan_json), plan_cost(plan_json)[1]
            charged = (request.get("epsilon"), request.get("delta"),
                       accounting.event_to_json(request["event"]) if request.get("event") else None)
            if charged != (cost["epsilon"], cost["delta"], cost["event_json"]):
                raise ValueError(f"the request's cost {charged} is not the plan's cost {cost}")
            # Check before charge: whatever a component spending the plan would refuse from its
            # configuration is refused here, before the ledger is asked (components/preflight).
            from sage_tfx.components import preflight
            preflight.check_before_charge(_get(exec_properties, spec.PREFLIGHT_JSON_KEY), plan)
        run_id = self._run_id(exec_properties)
        grant_artifact = artifact_utils.get_single_instance(output_dict[spec.GRANT_KEY])

        min_records = _get(exec_properties, spec.MIN_RECORDS_KEY)
        with open_ledger(ledger_url) as ledger:
            if min_records is None:
                decision = ledger.request(stream, run_id=run_id, context=context, **request)
            else:
                decision = request_with_min_records(
                    ledger, stream, run_id=run_id, context=context, request=request,
                    min_records=check_min_records(min_records))

        if decision.granted:
            grant = decision.grant
            logging.info("SageGate: ledger %s granted run %s on stream %s: grant %s, %d block(s)"
                         "%s", secrets.redact(ledger_url), run_id, stream, grant.grant_id,
                         len(grant.blocks),
                         " (replayed, not charged again)" if decision.replayed else "")
            artifacts.write_grant(grant_artifact, grant, stream=stream, run_id=run_id,
                                  context=context, ledger_url=ledger_url)
            if plan is not None:
                plan_lib.check_grant_matches(plan, grant)
                plan_io.write_plan(grant_artifact, plan)
        else:
            logging.warning("SageGate: ledger %s denied run %s on stream %s: %s",
                            secrets.redact(ledger_url), run_id, stream, decision.reason)
            artifacts.write_grant(grant_artifact, None, stream=stream, run_id=run_id,
                                  context=context, ledger_url=ledger_url,
                                  reason=decision.reason)
        grant_artifact.set_int_custom_property(REPLAYED_KEY, int(bool(decision.replayed)))
