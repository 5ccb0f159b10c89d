"""DnDTrainer component spec and its exec-property / channel keys."""
from tfx.types import standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter

from sage_tfx.components.artifacts import SageGrant
from sage_tfx.components.gate.spec import GRANT_KEY

# Channel keys.
EXAMPLES_KEY = standard_component_specs.EXAMPLES_KEY          # BlockExampleGen's output
GRANT_INPUT_KEY = GRANT_KEY                                   # "grant"
MODEL_KEY = standard_component_specs.MODEL_KEY                # "model": the averaged GLM

# Exec-property keys.
FAMILY_KEY = "family"
K_KEY = "k"
GAMMA_KEY = "gamma"
CLIP_KEY = "l1_norm_clip"
EPSILON_KEY = "epsilon"                    # per update (model unit) / per weight (feature unit)
UNIT_KEY = "unit"                          # "model" | "feature" | "gaussian"
DELTA_KEY = "delta"                        # δ per update (gaussian unit only)
L2_CLIP_KEY = "l2_norm_clip"               # C₂ (gaussian unit only)
PASSES_KEY = "passes"
N_C_KEY = "n_c"                            # examples per client
CLIENT_KEY = "client_key"                  # the declared privacy-unit column (e.g. a user id)
FEATURES_KEY = "features"                  # JSON [{"key", "lower", "upper", "dtype"}]
LABEL_KEY = "label_key"
SPLIT_KEY = "split"
SPAM_CHECK_KEY = "spam_check"              # int 1 (default) / 0

DEFAULT_SPLIT = "train"

# Files and properties written into the Model artifact.
PRIVACY_REPORT_FILE = "privacy_report.json"
GRANT_ID_PROPERTY = "grant_id"
UPDATES_PROPERTY = "dnd_updates_accepted"
REPLAYED_PROPERTY = "release_replayed"         # 1: the grant's recorded model was returned
RELEASE_DIGEST_PROPERTY = "release_sha256"     # of the recorded model tree

# The release the grant buys (sage_tfx.ledger.releases), keyed by the plan part it spends:
# "train/model" under a plan (as DPTrainer's: the part's claim lets only one of them publish),
# "grant/model" for a grant charged without a plan.
COMPONENT = "DnDTrainer"
RELEASE_OUTPUT = "model"


class DnDTrainerSpec(ComponentSpec):
    """Examples + SageGrant in; the averaged Draw-and-Discard model out."""

    PARAMETERS = {
        FAMILY_KEY: ExecutionParameter(type=str),
        K_KEY: ExecutionParameter(type=int),
        GAMMA_KEY: ExecutionParameter(type=float),
        CLIP_KEY: ExecutionParameter(type=float),
        EPSILON_KEY: ExecutionParameter(type=float),
        UNIT_KEY: ExecutionParameter(type=str),
        DELTA_KEY: ExecutionParameter(type=float, optional=True),
        L2_CLIP_KEY: ExecutionParameter(type=float, optional=True),
        PASSES_KEY: ExecutionParameter(type=int),
        N_C_KEY: ExecutionParameter(type=int),
        CLIENT_KEY: ExecutionParameter(type=str),
        FEATURES_KEY: ExecutionParameter(type=str),
        LABEL_KEY: ExecutionParameter(type=str),
        SPLIT_KEY: ExecutionParameter(type=str),
        SPAM_CHECK_KEY: ExecutionParameter(type=int),
    }
    INPUTS = {
        EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
        GRANT_INPUT_KEY: ChannelParameter(type=SageGrant),
    }
    OUTPUTS = {
        MODEL_KEY: ChannelParameter(type=standard_artifacts.Model),
    }
