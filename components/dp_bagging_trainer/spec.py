"""DPBaggingTrainer component spec and its exec-property / channel keys."""
from tfx.types import standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components.artifacts import SageGrant
from sage_tfx.components.dp_validator.spec import NOT_DP_PROPERTY  # noqa: F401 (executor reads it here)
from sage_tfx.components.gate.spec import GRANT_KEY

# Channel keys.
EXAMPLES_KEY = standard_component_specs.EXAMPLES_KEY          # private: BlockExampleGen's output
PUBLIC_EXAMPLES_KEY = "public_examples"                       # declared public, unlabelled use
GRANT_INPUT_KEY = GRANT_KEY                                   # "grant"
MODEL_KEY = standard_component_specs.MODEL_KEY                # "model": the student

# Exec-property keys.
K_KEY = "k"
N_KEY = "n"
LAMBDA_KEY = "lam"
MODE_KEY = "mode"
ACCOUNTANT_KEY = "accountant"
VOTES_KEY = "votes"                        # laplace (default) / gumbel / gaussian noisy-max
TEACHER_KEY = "teacher"
LABEL_KEY = "label_key"
UNIT_KEY = "unit_key"
FEATURE_KEYS_KEY = "feature_keys"          # JSON list of float/int feature names
PUBLIC_DECLARED_KEY = "public_declared"    # int 1: the user declares public_examples public
SPLIT_KEY = "split"
PUBLIC_SPLIT_KEY = "public_split"
SALT_KEY = "salt"
CACHE_DIR_KEY = "cache_dir"
# int 1: the user accepts that mode "paper" is NOT differentially private (required by that
# mode, refused by the others); recorded on the Model as NOT_DP_PROPERTY.
NON_DP_OPT_IN_KEY = "accept_not_differentially_private"
MAX_LABELS_KEY = "max_labels"              # paper mode: public points a run reserves (default all)

DEFAULT_SPLIT = "train"

# Files and properties written into the Model artifact.
PRIVACY_REPORT_FILE = "privacy_report.json"
PREDICTION_OUTPUT = "probabilities"        # serving output: P(class 1), one per example
QUERIES_PROPERTY = "bagging_queries"
MODE_PROPERTY = "bagging_mode"
EPSILON_PROPERTY = "epsilon"
DELTA_PROPERTY = "delta"
GRANT_ID_PROPERTY = "grant_id"
# NOT_DP_PROPERTY ("not_differentially_private"): int 1 on a paper-mode model, 0 otherwise; the
# name DPModelValidator reads to refuse blessing a model that is not DP.


class DPBaggingTrainerSpec(ComponentSpec):
    """Private Examples + public Examples + SageGrant in; the student Model out."""

    PARAMETERS = {
        K_KEY: ExecutionParameter(type=int),
        N_KEY: ExecutionParameter(type=int),
        LAMBDA_KEY: ExecutionParameter(type=float),
        MODE_KEY: ExecutionParameter(type=str),
        ACCOUNTANT_KEY: ExecutionParameter(type=str),
        VOTES_KEY: ExecutionParameter(type=str, optional=True),
        TEACHER_KEY: ExecutionParameter(type=str),
        LABEL_KEY: ExecutionParameter(type=str),
        UNIT_KEY: ExecutionParameter(type=str),
        FEATURE_KEYS_KEY: ExecutionParameter(type=str),
        PUBLIC_DECLARED_KEY: ExecutionParameter(type=int),
        SPLIT_KEY: ExecutionParameter(type=str),
        PUBLIC_SPLIT_KEY: ExecutionParameter(type=str),
        SALT_KEY: ExecutionParameter(type=str, optional=True),
        CACHE_DIR_KEY: ExecutionParameter(type=str, optional=True),
        NON_DP_OPT_IN_KEY: ExecutionParameter(type=int, optional=True),
        MAX_LABELS_KEY: ExecutionParameter(type=int, optional=True),
    }
    INPUTS = {
        EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
        PUBLIC_EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
        GRANT_INPUT_KEY: ChannelParameter(type=SageGrant),
    }
    OUTPUTS = {
        MODEL_KEY: ChannelParameter(type=standard_artifacts.Model),
    }
