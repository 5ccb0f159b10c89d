"""PTKFeaturizer component spec (keys and the PTKState artifact are PTKTrainer's)."""
from tfx.types import standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components.ptk_trainer.spec import (EXAMPLES_KEY, FEATURIZE_FN_KEY, FEATURIZED_KEY,
                                                  LEDGER_URL_KEY, PTK_ID_KEY, PTK_STATE_KEY,
                                                  VERSION_KEY, PTKState)


class PTKFeaturizerSpec(ComponentSpec):
    PARAMETERS = {
        LEDGER_URL_KEY: ExecutionParameter(type=str),
        PTK_ID_KEY: ExecutionParameter(type=str, optional=True),
        VERSION_KEY: ExecutionParameter(type=int, optional=True),
        FEATURIZE_FN_KEY: ExecutionParameter(type=str, optional=True),
    }
    INPUTS = {
        EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
        PTK_STATE_KEY: ChannelParameter(type=PTKState, optional=True),
    }
    OUTPUTS = {FEATURIZED_KEY: ChannelParameter(type=standard_artifacts.Examples)}
