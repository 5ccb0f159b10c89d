"""SageGate: the only path from block storage into a pipeline starts here (Sage §3.2).

The gate asks the block ledger to charge a run's privacy cost to a set of blocks (an explicit
list, or a window such as "the last 30 blocks with budget left") and writes the ledger's decision
into a ``SageGrant`` artifact. ``BlockExampleGen`` then reads exactly the granted blocks.

Example::

    gate = SageGate(ledger_url="sqlite:////data/ledger.db", stream="flights",
                    window_last=30, epsilon=0.1, delta=1e-7)
    # A denial is an explicit outcome (DENIED marker, granted=0). Either let BlockExampleGen fail
    # with MissingGrantError, or skip the data-reading part of the pipeline on a denial:
    with tfx.dsl.Cond(gate.outputs["grant"].future()[0].custom_property("granted") == 1):
        example_gen = BlockExampleGen(grant=gate.outputs["grant"], ledger_url=...)
        statistics_gen = tfx.components.StatisticsGen(examples=example_gen.outputs["examples"])
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from tfx import types
from tfx.dsl.components.base import base_component, executor_spec
from tfx.dsl.placeholder import placeholder as ph

from sage_tfx.components.artifacts import SageGrant
from sage_tfx.components.gate import executor
from sage_tfx.components.gate import spec
from sage_tfx.ledger import DEFAULT_CONTEXT

if TYPE_CHECKING:  # an annotation only: the gate imports the plan module when given one
    from sage_tfx.adaptive.plan import PrivacyPlan


# Where the gate's pipeline run id comes from, per orchestrator. LocalDagRunner resolves TFX's
# execution-invocation placeholder; Kubeflow Pipelines v2 IR has no such placeholder and
# substitutes its own job placeholder in a constant parameter; Airflow renders the Jinja template
# of the DAG run id in the task's exec properties. ``sage_tfx.pipelines.orchestration`` switches a
# built pipeline's gates to the right one (``for_orchestrator``).
ORCHESTRATORS = ("local", "kubeflow", "airflow")
KUBEFLOW_PIPELINE_RUN_ID = "{{$.pipeline_job_uuid}}"
AIRFLOW_PIPELINE_RUN_ID = "{{ dag.dag_id }}.{{ run_id }}"


def pipeline_run_id_for(orchestrator: str) -> Union[str, ph.Placeholder]:
    """The ``pipeline_run_id`` exec property of a SageGate run by ``orchestrator``.

    Args:
      orchestrator: ``"local"`` (LocalDagRunner, the default), ``"kubeflow"`` or ``"airflow"``.

    Raises:
      ValueError: an unknown orchestrator.
    """
    if orchestrator == "local":
        return ph.execution_invocation().pipeline_run_id
    if orchestrator == "kubeflow":
        return KUBEFLOW_PIPELINE_RUN_ID
    if orchestrator == "airflow":
        return AIRFLOW_PIPELINE_RUN_ID
    raise ValueError(f"orchestrator must be 'local', 'kubeflow' or 'airflow', got {orchestrator!r}")


def _dynamic(value: Any) -> bool:
    """A value resolved only at run time (placeholder or RuntimeParameter): not checked here."""
    return isinstance(value, ph.Placeholder) or type(value).__name__ == "RuntimeParameter"


class SageGate(base_component.BaseComponent):
    """Requests blocks from the Sage block ledger; outputs the grant (or denial) as ``grant``.

    Component ``outputs`` contains:
      - ``grant``: Channel of type ``SageGrant`` (see ``sage_tfx.components.artifacts``).
    """

    SPEC_CLASS = spec.SageGateSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, *, ledger_url: str, stream: str,
                 epsilon: Optional[float] = None, delta: Optional[float] = None,
                 event_json: Optional[str] = None,
                 blocks: Optional[Sequence[str]] = None,
                 window_last: Optional[int] = None, window_min_blocks: Optional[int] = None,
                 context: str = DEFAULT_CONTEXT,
                 run_id: Optional[Union[str, ph.Placeholder]] = None,
                 plan: Optional[Union["PrivacyPlan", str]] = None,
                 orchestrator: str = "local", min_records: Optional[int] = None):
        """Constructs a SageGate.

        Args:
          ledger_url: the block ledger, ``sqlite:////abs/path/ledger.db`` or
            ``postgresql://user@host:port/db``.
          stream: the stream to read.
          epsilon: basic-mode cost ε (> 0, finite) charged to every granted block.
          delta: basic-mode cost δ in [0, 1) (default 0).
          event_json: rdp-mode cost: ``sage_tfx.ledger.accounting.event_to_json(dp_event)``; instead
          of
            epsilon / delta.
          blocks: explicit block ids (instead of a window).
          window_last: request the ``window_last`` most recent blocks with budget left for the
            charge.
          window_min_blocks: with ``window_last``: how many such blocks suffice (default: all
            ``window_last``); fewer means a denial.
          context: the ledger context (budget list) to charge.
          plan: a ``sage_tfx.adaptive.plan.PrivacyPlan`` (or its JSON) instead of epsilon / delta /
            event_json: the gate charges the plan's composed cost and stores the plan beside the
            grant, where DPTransform, DPTrainer and DPModelValidator read their parts.
          run_id: the ledger run id. Default: ``<pipeline>.<node id>.<pipeline run id>``, so
            retrying the node in the same pipeline run returns the same grant without charging
            twice, and every new pipeline run is a new request. An explicit run id makes every
            pipeline run with it replay one grant.
          orchestrator: which orchestrator supplies the pipeline run id: ``"local"``
            (LocalDagRunner), ``"kubeflow"`` (KFP v2: ``{{$.pipeline_job_uuid}}``) or
            ``"airflow"`` (the DAG run id). ``sage_tfx.pipelines.orchestration.for_orchestrator``
            switches an already built pipeline, and bakes in the gate's node id and the pipeline
            name, which Kubeflow and Airflow do not give the executor: without them (and without
            ``run_id``) a gate run by those orchestrators refuses to derive a run id.
          min_records: the fewest records the granted blocks must hold, by the ledger's public
            per-block sizes (``BlockSpec.records``). The gate then reserves, checks the sizes and
            either releases the data or cancels the reservation (a refund: nothing was read) and
            writes a denial. For components that cannot run on too little data (an empty
            window, DP bagging's n chunks), so that they fail before anything is charged.

        Raises:
          ValueError (sage_tfx.errors subclasses): both or neither of blocks / window_last,
            invalid ε / δ / DpEvent, both (ε, δ) and event_json, a malformed name or URL, an
            unknown orchestrator.
        """
        if not _dynamic(ledger_url):
            executor.check_ledger_url(ledger_url)
        if not _dynamic(stream):
            executor.check_name("stream", stream)
        if not _dynamic(context):
            executor.check_name("context", context)
        if run_id is not None and not _dynamic(run_id):
            executor.check_name("run_id", run_id)
        plan_json = None
        if plan is not None:
            if epsilon is not None or delta is not None or event_json is not None:
                raise ValueError("give a privacy plan or (epsilon, delta) / event_json, not both")
            plan_json, cost = executor.plan_cost(plan)
            epsilon, delta, event_json = cost["epsilon"], cost["delta"], cost["event_json"]
        if min_records is not None and not _dynamic(min_records):
            executor.check_min_records(min_records)
        values = (blocks, window_last, window_min_blocks, epsilon, delta, event_json)
        if not any(_dynamic(v) for v in values):
            request = executor.build_request(
                blocks=blocks, window_last=window_last, window_min_blocks=window_min_blocks,
                epsilon=epsilon, delta=delta, event_json=event_json)
            epsilon, delta = request["epsilon"], request["delta"]  # validated floats
            if blocks is not None:
                blocks = request["blocks"]
        blocks_json = (json.dumps(list(blocks)) if blocks is not None and not _dynamic(blocks)
                       else blocks)
        super().__init__(spec=spec.SageGateSpec(
            ledger_url=ledger_url,
            stream=stream,
            context=context,
            ledger_run_id=run_id,
            pipeline_run_id=pipeline_run_id_for(orchestrator),
            blocks=blocks_json,
            window_last=window_last,
            window_min_blocks=window_min_blocks,
            min_records=min_records,
            epsilon=epsilon,
            delta=delta,
            event_json=event_json,
            plan_json=plan_json,
            grant=types.Channel(type=SageGrant),
        ))
