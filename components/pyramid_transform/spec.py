"""PyramidTransform component spec and its keys."""
from tfx.types import standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components.pyramid_artifacts import PyramidFeaturization

EXAMPLES_KEY = standard_component_specs.EXAMPLES_KEY                        # "examples"
FEATURIZATION_KEY = "featurization"
TRANSFORMED_EXAMPLES_KEY = standard_component_specs.TRANSFORMED_EXAMPLES_KEY  # "transformed_examples"
BATCH_SIZE_KEY = "batch_size"


class PyramidTransformSpec(ComponentSpec):
    PARAMETERS = {BATCH_SIZE_KEY: ExecutionParameter(type=int)}
    INPUTS = {
        EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
        FEATURIZATION_KEY: ChannelParameter(type=PyramidFeaturization),
    }
    OUTPUTS = {TRANSFORMED_EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples)}
