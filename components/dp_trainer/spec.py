"""DPTrainer component spec and its exec-property / channel keys.

The keys of the stock Trainer are reused (``tfx.types.standard_component_specs``), so TFX's
``GenericExecutor`` machinery (fn_args, module loading and packaging) reads them unchanged;
``grant``, ``model_fn`` and the declared output constants are added. There is no ``run_fn``:
the module's ``model_fn`` describes the model, the executor trains and exports it.
"""
from tfx.proto import trainer_pb2
from tfx.types import standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components.artifacts import SageGrant
from sage_tfx.components.dp_trainer import model_fn as model_fn_lib
from sage_tfx.components.dp_trainer import preflight
from sage_tfx.components.gate.spec import GRANT_KEY

# Exec-property keys (the Trainer's own, then DPTrainer's).
TRAIN_ARGS_KEY = standard_component_specs.TRAIN_ARGS_KEY
EVAL_ARGS_KEY = standard_component_specs.EVAL_ARGS_KEY
MODULE_FILE_KEY = standard_component_specs.MODULE_FILE_KEY
MODULE_PATH_KEY = standard_component_specs.MODULE_PATH_KEY
CUSTOM_CONFIG_KEY = standard_component_specs.CUSTOM_CONFIG_KEY
MODEL_FN_KEY = model_fn_lib.MODEL_FN
OUTPUT_SCALE_KEY = preflight.OUTPUT_SCALE_KEY     # public constants the pipeline declares:
OUTPUT_OFFSET_KEY = preflight.OUTPUT_OFFSET_KEY   # predictions = model output * scale + offset

# Channel keys.
EXAMPLES_KEY = standard_component_specs.EXAMPLES_KEY
TRANSFORM_GRAPH_KEY = standard_component_specs.TRANSFORM_GRAPH_KEY
SCHEMA_KEY = standard_component_specs.SCHEMA_KEY
GRANT_INPUT_KEY = GRANT_KEY
MODEL_KEY = standard_component_specs.MODEL_KEY
MODEL_RUN_KEY = standard_component_specs.MODEL_RUN_KEY


class DPTrainerSpec(ComponentSpec):
    """DPTrainer: Examples (+ transform graph, schema) and a SageGrant in; a DP Model out.

    Unlike the stock Trainer there is no ``base_model`` (its privacy could not be checked), no
    ``hyperparameters`` input (a Tuner searches on the granted data without DP) and no
    ``run_fn``.
    """

    PARAMETERS = {
        TRAIN_ARGS_KEY: ExecutionParameter(type=trainer_pb2.TrainArgs),
        EVAL_ARGS_KEY: ExecutionParameter(type=trainer_pb2.EvalArgs),
        MODULE_FILE_KEY: ExecutionParameter(type=str, optional=True),
        MODULE_PATH_KEY: ExecutionParameter(type=str, optional=True),
        MODEL_FN_KEY: ExecutionParameter(type=str, optional=True),
        CUSTOM_CONFIG_KEY: ExecutionParameter(type=str, optional=True),
        OUTPUT_SCALE_KEY: ExecutionParameter(type=float, optional=True),
        OUTPUT_OFFSET_KEY: ExecutionParameter(type=float, optional=True),
    }
    INPUTS = {
        EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
        TRANSFORM_GRAPH_KEY: ChannelParameter(type=standard_artifacts.TransformGraph,
                                              optional=True),
        SCHEMA_KEY: ChannelParameter(type=standard_artifacts.Schema, optional=True),
        GRANT_INPUT_KEY: ChannelParameter(type=SageGrant),
    }
    OUTPUTS = {
        MODEL_KEY: ChannelParameter(type=standard_artifacts.Model),
        MODEL_RUN_KEY: ChannelParameter(type=standard_artifacts.ModelRun),
    }
