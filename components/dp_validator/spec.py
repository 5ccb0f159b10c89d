"""DPModelValidator component spec, its exec-property / channel keys and its blessing layout."""
from tfx.components.evaluator import constants as evaluator_constants
from tfx.types import standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components.artifacts import SageGrant
from sage_tfx.components.gate.spec import GRANT_KEY

# Channel keys: TFX's own names (Evaluator's inputs and output), so pipelines read the same.
EXAMPLES_KEY = standard_component_specs.EXAMPLES_KEY  # "examples"
MODEL_KEY = standard_component_specs.MODEL_KEY  # "model"
GRANT_INPUT_KEY = GRANT_KEY  # "grant"
BLESSING_KEY = standard_component_specs.BLESSING_KEY  # "blessing"
# Optional: the model to compare with (e.g. a LatestBlessedModelStrategy resolver's "model").
BASELINE_MODEL_KEY = standard_component_specs.BASELINE_MODEL_KEY  # "baseline_model"

# Exec-property keys.
METRIC_KEY = "metric"
LOSS_FN_KEY = "loss_fn"
TARGET_KEY = "target"
LOSS_BOUND_KEY = "loss_bound"
ETA_KEY = "eta"
LABEL_KEY = "label_key"
PREDICTION_KEY = "prediction_key"
EVAL_SPLIT_KEY = "eval_split"
SIGNATURE_NAME_KEY = "signature_name"
BATCH_SIZE_KEY = "batch_size"
LEDGER_URL_KEY = "ledger_url"  # optional: the ledger to trust (default: the grant's)
# The baseline comparison (components/dp_validator/baseline.py). ``compare_baseline`` = 1 when
# the component was given a baseline_model channel: the plan must then have a baseline part even
# when the channel resolves no model (the first run), so the plan never depends on history.
COMPARE_BASELINE_KEY = "compare_baseline"
BASELINE_TOLERANCE_KEY = "baseline_tolerance"
BASELINE_ETA_KEY = "baseline_eta"  # default: eta

# Exec-property values and defaults.
LOSS = "loss"
ACCURACY = "accuracy"
METRICS = (LOSS, ACCURACY)
SQUARED_ERROR = "squared_error"
LOG_LOSS = "log_loss"
ABSOLUTE_ERROR = "absolute_error"
LOSS_FNS = (SQUARED_ERROR, LOG_LOSS, ABSOLUTE_ERROR)
ACCURACY_THRESHOLD = 0.5  # binary accuracy: predicted class 1 iff prediction > 0.5 (as Keras)
DEFAULT_ETA = 0.05  # List. 1 line 30: confidence 0.95
DEFAULT_EVAL_SPLIT = "eval"
DEFAULT_SIGNATURE_NAME = "serving_default"
DEFAULT_BATCH_SIZE = 256
BASELINE_PART = "baseline"  # the plan part the comparison spends
DEFAULT_BASELINE_TOLERANCE = 0.0

# Blessing layout: the Evaluator's own names, so stock Pusher and tfx.dsl.Cond read the decision.
BLESSED_FILE_NAME = evaluator_constants.BLESSED_FILE_NAME  # "BLESSED"
NOT_BLESSED_FILE_NAME = evaluator_constants.NOT_BLESSED_FILE_NAME  # "NOT_BLESSED"
BLESSED_PROPERTY = evaluator_constants.ARTIFACT_PROPERTY_BLESSED_KEY  # "blessed"
BLESSED_VALUE = evaluator_constants.BLESSED_VALUE  # 1
NOT_BLESSED_VALUE = evaluator_constants.NOT_BLESSED_VALUE  # 0
CURRENT_MODEL_PROPERTY = evaluator_constants.ARTIFACT_PROPERTY_CURRENT_MODEL_URI_KEY
CURRENT_MODEL_ID_PROPERTY = evaluator_constants.ARTIFACT_PROPERTY_CURRENT_MODEL_ID_KEY
VALIDATION_FILE_NAME = "validation.json"

# Further custom properties of the blessing: the decision and the DP quantities behind it.
OUTCOME_PROPERTY = "outcome"  # "ACCEPT" | "REJECT" | "RETRY"
METRIC_NAME_PROPERTY = "metric_name"  # "squared_error", "log_loss", "absolute_error", "accuracy"
DP_ESTIMATE_PROPERTY = "dp_estimate"
UPPER_BOUND_PROPERTY = "upper_bound"
LOWER_BOUND_PROPERTY = "lower_bound"
N_TEST_DP_PROPERTY = "n_test_dp"
EPSILON_PROPERTY = "epsilon"
DELTA_PROPERTY = "delta"
ETA_PROPERTY = "eta"
TARGET_PROPERTY = "target"
LOSS_BOUND_PROPERTY = "loss_bound"
# The DPTrainer's membership-inference audit of the model, if it wrote one (not DP: shown only).
MEMBERSHIP_AUC_PROPERTY = "membership_auc"
MEMBERSHIP_ADVANTAGE_PROPERTY = "membership_advantage"
GRANT_ID_PROPERTY = "grant_id"
# Release once (components/release_io.py): 1 if this execution replayed a recorded validation.
REPLAYED_PROPERTY = "replayed"
RELEASE_NAME_PROPERTY = "release_name"
RELEASE_DIGEST_PROPERTY = "release_digest"
REASON_PROPERTY = "reason"  # why validation was refused (no usable grant); refusals only
# int 1 on a Model trained without a DP guarantee under an explicit opt-in (DP bagging's paper
# mode): such a model is never blessed, and the blessing carries the same int 1 and a reason.
NOT_DP_PROPERTY = "not_differentially_private"
# The baseline comparison, on blessings of a validator given a baseline_model channel.
BASELINE_OUTCOME_PROPERTY = "baseline_outcome"  # NOT_WORSE | WORSE | INCONCLUSIVE | NO_BASELINE
NO_BASELINE = "NO_BASELINE"  # the channel resolved no model (e.g. nothing blessed yet)
BASELINE_MODEL_PROPERTY = "baseline_model"  # its uri
BASELINE_MODEL_ID_PROPERTY = "baseline_model_id"
BASELINE_REPLAYED_PROPERTY = "baseline_replayed"
BASELINE_RELEASE_NAME_PROPERTY = "baseline_release_name"
BASELINE_RELEASE_DIGEST_PROPERTY = "baseline_release_digest"
BASELINE_COMPARISON_FIELD = "baseline_comparison"  # in validation.json
# Float properties "baseline_<field>" holding the ComparisonResult field (finite values only).
BASELINE_FLOAT_FIELDS = ("dp_difference", "upper_bound", "lower_bound", "n_test_dp", "epsilon")
BASELINE_TOLERANCE_PROPERTY = "baseline_tolerance"
BASELINE_ETA_PROPERTY = "baseline_eta"
# Float properties holding the ValidationResult field of the same name. MLMD cannot store
# ±inf / NaN (its SQL breaks), so a non-finite value (e.g. an upper bound of inf when the DP
# count is too small for any evidence) is left out here; validation.json always has it.
RESULT_FLOAT_PROPERTIES = (DP_ESTIMATE_PROPERTY, UPPER_BOUND_PROPERTY, LOWER_BOUND_PROPERTY,
                           N_TEST_DP_PROPERTY, EPSILON_PROPERTY, DELTA_PROPERTY, ETA_PROPERTY,
                           TARGET_PROPERTY)


class DPModelValidatorSpec(ComponentSpec):
    """DPModelValidator: eval Examples + Model + SageGrant in, a ModelBlessing out."""

    PARAMETERS = {
        METRIC_KEY: ExecutionParameter(type=str),
        LOSS_FN_KEY: ExecutionParameter(type=str, optional=True),
        TARGET_KEY: ExecutionParameter(type=float),
        LOSS_BOUND_KEY: ExecutionParameter(type=float, optional=True),
        ETA_KEY: ExecutionParameter(type=float),
        LABEL_KEY: ExecutionParameter(type=str),
        PREDICTION_KEY: ExecutionParameter(type=str, optional=True),
        EVAL_SPLIT_KEY: ExecutionParameter(type=str),
        SIGNATURE_NAME_KEY: ExecutionParameter(type=str),
        BATCH_SIZE_KEY: ExecutionParameter(type=int),
        LEDGER_URL_KEY: ExecutionParameter(type=str, optional=True),
        COMPARE_BASELINE_KEY: ExecutionParameter(type=int, optional=True),
        BASELINE_TOLERANCE_KEY: ExecutionParameter(type=float, optional=True),
        BASELINE_ETA_KEY: ExecutionParameter(type=float, optional=True),
    }
    INPUTS = {
        EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
        MODEL_KEY: ChannelParameter(type=standard_artifacts.Model),
        GRANT_INPUT_KEY: ChannelParameter(type=SageGrant),
        BASELINE_MODEL_KEY: ChannelParameter(type=standard_artifacts.Model, optional=True),
    }
    OUTPUTS = {
        BLESSING_KEY: ChannelParameter(type=standard_artifacts.ModelBlessing),
    }
