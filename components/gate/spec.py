"""SageGate component spec and its exec-property / channel keys."""
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components.artifacts import SageGrant

# Exec-property keys.
LEDGER_URL_KEY = "ledger_url"
STREAM_KEY = "stream"
CONTEXT_KEY = "context"
# Not "run_id": TFX's legacy launcher (AirflowDagRunner) reserves that execution property name.
RUN_ID_KEY = "ledger_run_id"
# Resolved at run time from the orchestrator's pipeline run id (a placeholder): it derives the
# default run id and keeps a cached gate from standing in for a new pipeline run.
PIPELINE_RUN_ID_KEY = "pipeline_run_id"
# The gate's pipeline node id and pipeline name, baked in when the pipeline is built for an
# orchestrator (``sage_tfx.pipelines.orchestration.for_orchestrator``). The executor derives the
# default run id from them where its context names no node (Kubeflow pods, Airflow tasks); under
# LocalDagRunner the context's own ids win. (Not "component_id" / "pipeline_name": the legacy
# launcher of AirflowDagRunner reserves those execution property names.)
NODE_ID_KEY = "node_id"
PIPELINE_ID_KEY = "pipeline_id"
BLOCKS_KEY = "blocks"  # JSON list of block ids
WINDOW_LAST_KEY = "window_last"
WINDOW_MIN_BLOCKS_KEY = "window_min_blocks"
# The fewest records (the ledger's public per-block sizes) the granted blocks must hold; fewer
# means a denial and the reservation is cancelled (refunded: no data was released).
MIN_RECORDS_KEY = "min_records"
EPSILON_KEY = "epsilon"
DELTA_KEY = "delta"
EVENT_JSON_KEY = "event_json"
# A sage_tfx.adaptive.plan.PrivacyPlan as JSON: the cost charged is the plan's composed cost, and
# the plan
# is stored beside the grant for the DP components (components/plan_io.py).
PLAN_JSON_KEY = "plan_json"
# What the components that spend the plan were configured with, baked in when the pipeline is
# built (components/preflight.py, ``attach``): the executor re-checks it before it charges.
PREFLIGHT_JSON_KEY = "preflight_json"

# Output channel key.
GRANT_KEY = "grant"


class SageGateSpec(ComponentSpec):
    """SageGate: one ledger request (blocks or a window, at a privacy cost) -> a SageGrant."""

    PARAMETERS = {
        LEDGER_URL_KEY: ExecutionParameter(type=str),
        STREAM_KEY: ExecutionParameter(type=str),
        CONTEXT_KEY: ExecutionParameter(type=str),
        RUN_ID_KEY: ExecutionParameter(type=str, optional=True),
        PIPELINE_RUN_ID_KEY: ExecutionParameter(type=str, optional=True),
        NODE_ID_KEY: ExecutionParameter(type=str, optional=True),
        PIPELINE_ID_KEY: ExecutionParameter(type=str, optional=True),
        BLOCKS_KEY: ExecutionParameter(type=str, optional=True),
        WINDOW_LAST_KEY: ExecutionParameter(type=int, optional=True),
        WINDOW_MIN_BLOCKS_KEY: ExecutionParameter(type=int, optional=True),
        MIN_RECORDS_KEY: ExecutionParameter(type=int, optional=True),
        EPSILON_KEY: ExecutionParameter(type=float, optional=True),
        DELTA_KEY: ExecutionParameter(type=float, optional=True),
        EVENT_JSON_KEY: ExecutionParameter(type=str, optional=True),
        PLAN_JSON_KEY: ExecutionParameter(type=str, optional=True),
        PREFLIGHT_JSON_KEY: ExecutionParameter(type=str, optional=True),
    }
    INPUTS = {}
    OUTPUTS = {
        GRANT_KEY: ChannelParameter(type=SageGrant),
    }
