"""DPTransform component spec and its exec-property / channel / artifact-property keys."""
from tfx.proto import transform_pb2
from tfx.types import standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components.artifacts import SageGrant
from sage_tfx.components.gate.spec import GRANT_KEY

# Exec-property keys. The Transform ones are TFX's own, so the stock Transform executor reads them.
MODULE_FILE_KEY = standard_component_specs.MODULE_FILE_KEY
MODULE_PATH_KEY = standard_component_specs.MODULE_PATH_KEY
PREPROCESSING_FN_KEY = standard_component_specs.PREPROCESSING_FN_KEY
FORCE_TF_COMPAT_V1_KEY = standard_component_specs.FORCE_TF_COMPAT_V1_KEY
CUSTOM_CONFIG_KEY = standard_component_specs.CUSTOM_CONFIG_KEY
SPLITS_CONFIG_KEY = standard_component_specs.SPLITS_CONFIG_KEY
PUBLIC_FEATURES_KEY = "public_features"  # JSON list of feature names
LEDGER_URL_KEY = "ledger_url"

# Channel keys.
EXAMPLES_KEY = standard_component_specs.EXAMPLES_KEY
SCHEMA_KEY = standard_component_specs.SCHEMA_KEY
GRANT_INPUT_KEY = GRANT_KEY
TRANSFORM_GRAPH_KEY = standard_component_specs.TRANSFORM_GRAPH_KEY
TRANSFORMED_EXAMPLES_KEY = standard_component_specs.TRANSFORMED_EXAMPLES_KEY

# Custom properties of the output transform_graph artifact (what the run spent and why).
GRANT_ID_PROPERTY = "grant_id"
PLAN_PART_PROPERTY = "plan_part"              # "transform"
ACCOUNTING_MODE_PROPERTY = "accounting_mode"  # "basic" | "rdp"
EPSILON_SPENT_PROPERTY = "dp_epsilon_spent"   # float: Σ ε of the DP analyzers
DELTA_SPENT_PROPERTY = "dp_delta_spent"       # float: Σ δ (DP partition selection)
DP_EVENT_PROPERTY = "dp_event_json"           # composed DpEvent of the run, event_to_json
SPENDS_PROPERTY = "dp_spends"                 # JSON [{"name", "epsilon", "event"}], per analyzer
PUBLIC_FEATURES_PROPERTY = "public_features"  # JSON list, as declared
PUBLIC_ANALYZERS_PROPERTY = "public_analyzers"  # JSON [{"name", "features", ...}] non-DP, allowed


class DPTransformSpec(ComponentSpec):
    """DPTransform: Examples + Schema + a SageGrant with a plan in; a DP transform graph out."""

    PARAMETERS = {
        MODULE_FILE_KEY: ExecutionParameter(type=str, optional=True),
        MODULE_PATH_KEY: ExecutionParameter(type=str, optional=True),
        PREPROCESSING_FN_KEY: ExecutionParameter(type=str, optional=True),
        FORCE_TF_COMPAT_V1_KEY: ExecutionParameter(type=int, optional=True),
        CUSTOM_CONFIG_KEY: ExecutionParameter(type=str, optional=True),
        SPLITS_CONFIG_KEY: ExecutionParameter(type=transform_pb2.SplitsConfig, optional=True),
        PUBLIC_FEATURES_KEY: ExecutionParameter(type=str),
        LEDGER_URL_KEY: ExecutionParameter(type=str, optional=True),
    }
    INPUTS = {
        EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
        SCHEMA_KEY: ChannelParameter(type=standard_artifacts.Schema),
        GRANT_INPUT_KEY: ChannelParameter(type=SageGrant),
    }
    OUTPUTS = {
        TRANSFORM_GRAPH_KEY: ChannelParameter(type=standard_artifacts.TransformGraph),
        TRANSFORMED_EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples,
                                                   optional=True),
    }
