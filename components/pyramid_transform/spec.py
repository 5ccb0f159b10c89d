"""PyramidTransform component spec and its keys."""
from tfx.types import standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components.pyramid_artifacts import PyramidFeaturization

EXAMPLES_KEY = standard_component_specs.EXAMPLES_KEY                        # "examples"
FEATURIZATION_KEY = "featurization"
# "transformed_examples"
TRANSFORMED_EXAMPLES_KEY = standard_component_specs.TRANSFORMED_EXAMPLES_KEY
TRANSFORM_GRAPH_KEY = standard_component_specs.TRANSFORM_GRAPH_KEY          # "transform_graph"
BATCH_SIZE_KEY = "batch_size"
FEATURE_KINDS_KEY = "feature_kinds"


class PyramidTransformSpec(ComponentSpec):
    PARAMETERS = {BATCH_SIZE_KEY: ExecutionParameter(type=int),
                  FEATURE_KINDS_KEY: ExecutionParameter(type=str, optional=True)}
    INPUTS = {
        EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
        FEATURIZATION_KEY: ChannelParameter(type=PyramidFeaturization),
    }
    OUTPUTS = {TRANSFORMED_EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
               TRANSFORM_GRAPH_KEY: ChannelParameter(type=standard_artifacts.TransformGraph)}
