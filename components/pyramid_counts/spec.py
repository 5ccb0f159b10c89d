"""PyramidCountTable component spec and its keys."""
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components.artifacts import SageGrant
from sage_tfx.components.gate.spec import GRANT_KEY
from sage_tfx.components.pyramid_artifacts import PyramidWindowTable

GRANT_INPUT_KEY = GRANT_KEY            # "grant"
WINDOW_TABLE_KEY = "window_table"

LEDGER_URL_KEY = "ledger_url"
STORE_DIR_KEY = "store_dir"
SPEC_JSON_KEY = "spec_json"            # sage_tfx.pyramid.CountSpec.to_json(), as JSON text
WINDOW_KEY = "window"
RETENTION_KEY = "retention"


class PyramidCountTableSpec(ComponentSpec):
    PARAMETERS = {
        LEDGER_URL_KEY: ExecutionParameter(type=str),
        STORE_DIR_KEY: ExecutionParameter(type=str),
        SPEC_JSON_KEY: ExecutionParameter(type=str),
        WINDOW_KEY: ExecutionParameter(type=int),
        RETENTION_KEY: ExecutionParameter(type=int),
    }
    INPUTS = {GRANT_INPUT_KEY: ChannelParameter(type=SageGrant)}
    OUTPUTS = {WINDOW_TABLE_KEY: ChannelParameter(type=PyramidWindowTable)}
