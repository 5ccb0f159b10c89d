"""BlockExampleGen component spec and its exec-property / channel keys."""
from tfx.proto import example_gen_pb2
from tfx.types import standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components.artifacts import SageGrant
from sage_tfx.components.gate.spec import GRANT_KEY

# Exec-property keys. The ExampleGen ones are TFX's own, so BaseExampleGenExecutor reads them.
LEDGER_URL_KEY = "ledger_url"
OUTPUT_CONFIG_KEY = standard_component_specs.OUTPUT_CONFIG_KEY
OUTPUT_DATA_FORMAT_KEY = standard_component_specs.OUTPUT_DATA_FORMAT_KEY
OUTPUT_FILE_FORMAT_KEY = standard_component_specs.OUTPUT_FILE_FORMAT_KEY

# Channel keys.
GRANT_INPUT_KEY = GRANT_KEY
EXAMPLES_KEY = standard_component_specs.EXAMPLES_KEY

# Custom properties recorded on the output Examples artifact.
GRANT_ID_PROPERTY = "grant_id"
STREAM_PROPERTY = "stream"
RUN_ID_PROPERTY = "run_id"
BLOCK_IDS_PROPERTY = "block_ids"  # JSON list, in grant order
NUM_BLOCKS_PROPERTY = "num_blocks"


class BlockExampleGenSpec(ComponentSpec):
    """BlockExampleGen: a SageGrant in, the granted blocks' records as Examples out."""

    PARAMETERS = {
        LEDGER_URL_KEY: ExecutionParameter(type=str, optional=True),
        OUTPUT_CONFIG_KEY: ExecutionParameter(type=example_gen_pb2.Output),
        OUTPUT_DATA_FORMAT_KEY: ExecutionParameter(type=int),  # example_gen_pb2.PayloadFormat
        OUTPUT_FILE_FORMAT_KEY: ExecutionParameter(type=int),  # example_gen_pb2.FileFormat
    }
    INPUTS = {
        GRANT_INPUT_KEY: ChannelParameter(type=SageGrant),
    }
    OUTPUTS = {
        EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
    }
