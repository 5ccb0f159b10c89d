"""PyramidSnapshot component spec and its keys."""
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components.pyramid_artifacts import PyramidFeaturization, PyramidWindowTable

WINDOW_TABLE_KEY = "window_table"
FEATURIZATION_KEY = "featurization"

STORE_DIR_KEY = "store_dir"
SPEC_JSON_KEY = "spec_json"
RETENTION_KEY = "retention"
MAX_VARIANCE_KEY = "max_variance"


class PyramidSnapshotSpec(ComponentSpec):
    PARAMETERS = {
        STORE_DIR_KEY: ExecutionParameter(type=str),
        SPEC_JSON_KEY: ExecutionParameter(type=str),
        RETENTION_KEY: ExecutionParameter(type=int),
        MAX_VARIANCE_KEY: ExecutionParameter(type=float),
    }
    INPUTS = {WINDOW_TABLE_KEY: ChannelParameter(type=PyramidWindowTable, optional=True)}
    OUTPUTS = {FEATURIZATION_KEY: ChannelParameter(type=PyramidFeaturization)}
