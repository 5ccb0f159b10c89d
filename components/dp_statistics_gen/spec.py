"""DPStatisticsGen component spec, its exec-property / channel keys and its output layout."""
from tfx.components.statistics_gen import stats_artifact_utils
from tfx.types import standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components.artifacts import SageGrant
# The part's default name and the rdp params key live with statistics_part (no TFX there).
from sage_tfx.components.dp_statistics_gen.privacy import (  # noqa: F401
    DEFAULT_PLAN_PART, EPSILON_PARAM)
from sage_tfx.components.gate.spec import GRANT_KEY

# Channel keys: StatisticsGen's own names, so pipelines wire it the same way.
EXAMPLES_KEY = standard_component_specs.EXAMPLES_KEY  # "examples"
GRANT_INPUT_KEY = GRANT_KEY  # "grant"
STATISTICS_KEY = standard_component_specs.STATISTICS_KEY  # "statistics"

# Exec-property keys.
FEATURES_JSON_KEY = "features_json"  # StatisticsConfig.to_json(): features and post-processing
EXCLUDE_SPLITS_KEY = standard_component_specs.EXCLUDE_SPLITS_KEY  # JSON list, as StatisticsGen
PLAN_PART_KEY = "plan_part"  # the privacy plan part this component spends
LEDGER_URL_KEY = "ledger_url"  # optional: the ledger to trust (default: the grant's)

# Output layout: StatisticsGen's, read by stock SchemaGen / ExampleValidator
# (tfx.components.statistics_gen.stats_artifact_utils.load_statistics).
STATS_FILE_NAME = stats_artifact_utils.BINARY_PB_BASENAME  # "FeatureStats.pb" per Split-<name>
DP_FILE_NAME = "dp_statistics.json"  # the budget of every query (ε, sensitivity, scale, τ)

# Custom properties of the ExampleStatistics artifact.
GRANT_ID_PROPERTY = "grant_id"
PLAN_PART_PROPERTY = "plan_part"
EPSILON_PROPERTY = "epsilon"
DELTA_PROPERTY = "delta"
REPLAYED_PROPERTY = "replayed"  # release_io: 1 if this execution replayed a recorded release
RELEASE_NAME_PROPERTY = "release_name"
RELEASE_DIGEST_PROPERTY = "release_digest"


class DPStatisticsGenSpec(ComponentSpec):
    """DPStatisticsGen: Examples + SageGrant in, DP ExampleStatistics out."""

    PARAMETERS = {
        FEATURES_JSON_KEY: ExecutionParameter(type=str),
        EXCLUDE_SPLITS_KEY: ExecutionParameter(type=str, optional=True),
        PLAN_PART_KEY: ExecutionParameter(type=str, optional=True),
        LEDGER_URL_KEY: ExecutionParameter(type=str, optional=True),
    }
    INPUTS = {
        EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
        GRANT_INPUT_KEY: ChannelParameter(type=SageGrant),
    }
    OUTPUTS = {
        STATISTICS_KEY: ChannelParameter(type=standard_artifacts.ExampleStatistics),
    }
