"""PTKTrainer and PTKFeaturizer specs, the PTKState artifact and their keys."""
from tfx.types import standard_artifacts
from tfx.types.artifact import Artifact
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components.artifacts import SageGrant
from sage_tfx.components.gate.spec import GRANT_KEY

LEDGER_URL_KEY = "ledger_url"
PTK_ID_KEY = "ptk_id"
WINDOW_INDEX_KEY = "window_index"
VERSION_KEY = "version"
FEATURIZE_FN_KEY = "featurize_fn"
EXAMPLES_KEY = "examples"
PTK_STATE_KEY = "ptk_state"
FEATURIZED_KEY = "featurized_examples"
STATE_FILE = "state.json"
LINEAGE_FILE = "lineage.json"


class PTKState(Artifact):
    """One version of a PTK from the lake: ``state.json`` (the DP state) and ``lineage.json``
    (window, blocks, ε, δ, grant id, run id). Custom properties: ``ptk_id``, ``version`` (int),
    ``grant_id``; the type declares no PROPERTIES, which KFP v2 IR cannot carry for a custom
    type."""

    TYPE_NAME = "sage_tfx.PTKState"


class PTKTrainerSpec(ComponentSpec):
    PARAMETERS = {
        LEDGER_URL_KEY: ExecutionParameter(type=str),
        PTK_ID_KEY: ExecutionParameter(type=str),
        WINDOW_INDEX_KEY: ExecutionParameter(type=int),
    }
    INPUTS = {
        EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
        GRANT_KEY: ChannelParameter(type=SageGrant),
    }
    OUTPUTS = {PTK_STATE_KEY: ChannelParameter(type=PTKState)}
