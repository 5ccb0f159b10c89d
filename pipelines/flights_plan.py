"""The TF-free half of the flights DP pipeline: its privacy plan and its settings.

``sage_tfx.pipelines.flights_dp_pipeline`` re-exports everything here; this module imports no
TensorFlow / TFX, so an adaptive runner (or a fast test) can build plans and check settings in
milliseconds.

The plan (Sage List. 1, §3.1): one run of the pipeline is DP as a whole. Its DP Transform
analyzers, its DP training and its DP validation read the same granted blocks, so the gate
charges the *composition* of the three parts once, before any block is read::

    plan = make_plan(1.0, 1e-6)                 # transform 0.1, train 0.6 (δ 1e-6), validate 0.3
    plan.cost() == {"epsilon": 1.0, "delta": 1e-6}

In basic mode the composition is the exact decimal sum of the parts
(``sage_tfx.ledger.accounting.exact``, the ledger's arithmetic), so :func:`make_plan` splits ε with
``Decimal`` and refuses a split whose shares are not exactly representable as floats (it never
rounds a privacy parameter).

Defaults of the pipeline (documented here, used by ``flights_dp_pipeline.create_pipeline``):

* Features (``flights_preprocessing``, transform ε split in three): ``distance`` and ``hour``
  scaled to [0, 1] by a DP (min, max) within public bounds, and ``dep_delay`` clipped to the
  public [-60, 300] minutes and centred on its DP mean, in hours (missing → the mean).
* Model: DP-SGD *linear* regression of ``arr_delay`` (minutes) on those features,
  :data:`DPSGD_DEFAULTS`: 5 epochs, batch 128, learning rate 0.3, ``l2_norm_clip`` 1 (a few
  seconds of training). On 10 daily blocks of January 2013 (~5,900 labelled training flights)
  with a train part of ε = 0.6, δ = 1e-6 its clipped eval MSE is ~250-300 min² over seeds (a
  non-private least-squares fit: ~245; predicting 0: ~550). A hidden layer, or ``dep_delay``
  squeezed into [0, 1] by its public range, does worse under the same noise (the noisy steps
  cannot fit a weight of a low-variance feature). ``algorithm="adassp"`` fits the same features
  by AdaSSP (no tuning; noisier at this n and ε).
* Validation: the squared error of the served prediction (minutes, the unit the trainer serves)
  against the raw ``arr_delay`` of the held-out eval split, clipped to :data:`DEFAULT_LOSS_BOUND`
  B = 3600 = 60² (an error beyond an hour counts as an hour); a flight without ``arr_delay``
  (cancelled or diverted, ~1% in January) counts as the worst loss B. Measured with the defaults
  above (10 blocks, ~2,950 eval flights, validate ε = 0.3, η = 0.05): DP estimate ~280, DP
  confidence interval ~[190, 400]. A target above the interval (e.g. 500) ACCEPTs; a target
  inside it — around the achievable loss, e.g. 280 — RETRYs (more blocks or a larger ε would
  narrow the interval, Sage §3.3); a target below it (e.g. 100) REJECTs. The interval narrows
  like 1/√n (Bernstein) plus B/(ε·n) (the corrections for the DP noise).
"""
from __future__ import annotations

import copy
import os
from decimal import Decimal
from typing import Any, Mapping, Optional

from sage_tfx.ledger import accounting
from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan

# --- data ---------------------------------------------------------------------------------------

LABEL_KEY = "arr_delay"  # minutes; absent for cancelled / diverted flights
SCHEMA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flights_schema")
SCHEMA_PATH = os.path.join(SCHEMA_DIR, "schema.pbtxt")  # hand-written, not inferred

# Public bounds of the raw features (the dataset's documentation, never looked up in the data).
DISTANCE_BOUNDS = (0.0, 5000.0)  # miles; the longest NYC route (JFK-HNL) is 4,983
HOUR_BOUNDS = (0.0, 24.0)  # scheduled departure hour, New York time
DEP_DELAY_BOUNDS = (-60.0, 300.0)  # minutes; values outside are clipped

# Outputs of flights_preprocessing.preprocessing_fn.
DISTANCE_SCALED = "distance_scaled"  # in [0, 1]
HOUR_SCALED = "hour_scaled"  # in [0, 1]
# (clip(dep_delay) - DP mean of dep_delay) / 60: hours from the mean. Both terms lie in
# DEP_DELAY_BOUNDS, so the value lies in ±(300 - (-60)) / 60 = ±6 (public); a missing value is 0.
DEP_DELAY_CENTERED = "dep_delay_centered"
DEP_DELAY_SCALE = 60.0
DEP_DELAY_CENTERED_BOUNDS = (-(DEP_DELAY_BOUNDS[1] - DEP_DELAY_BOUNDS[0]) / DEP_DELAY_SCALE,
                             (DEP_DELAY_BOUNDS[1] - DEP_DELAY_BOUNDS[0]) / DEP_DELAY_SCALE)
# The label the trainer fits: arr_delay clipped to its public bounds, ÷ LABEL_SCALE (NaN where
# absent); the pipeline declares output_scale = LABEL_SCALE, so served predictions are minutes.
LABEL_BOUNDS = (-60.0, 300.0)
LABEL_SCALE = max(abs(LABEL_BOUNDS[0]), abs(LABEL_BOUNDS[1]))
ARR_DELAY_SCALED = "arr_delay_scaled"
ARR_DELAY_SCALED_BOUNDS = (LABEL_BOUNDS[0] / LABEL_SCALE, LABEL_BOUNDS[1] / LABEL_SCALE)


def transformed_features(algorithm: str) -> dict:
    """The trainer's features (``flights_dp_module``: bounds clip and scale in the model).

    DP-SGD reads ``dep_delay_centered`` as is: its spread (std ~0.4) keeps the problem well
    conditioned, where squeezing it into [0, 1] by its public range (std ~0.03) leaves the
    noisy gradient steps unable to fit its weight. AdaSSP needs every column bounded (its
    sensitivity), so it gets the public range and scales it to [0, 1] (a linear fit does not
    care).
    """
    dep: dict = {}
    if algorithm == ADASSP:
        dep.update(min=DEP_DELAY_CENTERED_BOUNDS[0], max=DEP_DELAY_CENTERED_BOUNDS[1])
    return {DISTANCE_SCALED: {"min": 0.0, "max": 1.0}, HOUR_SCALED: {"min": 0.0, "max": 1.0},
            DEP_DELAY_CENTERED: dep}


# --- training -----------------------------------------------------------------------------------

DPSGD = "dpsgd"
ADASSP = "adassp"
ALGORITHMS = (DPSGD, ADASSP)
MODEL_FN = "sage_tfx.pipelines.flights_dp_module.model_fn"
PREPROCESSING_FN = "sage_tfx.pipelines.flights_preprocessing.preprocessing_fn"
# tf.Transform traces the preprocessing_fn once in TF1 graph mode instead of five times in TF2
# mode: DPTransform took 8.4 s instead of 13.3 s on 10 daily blocks (about a third of an
# iteration). The DP analyzers, their budget and DPTransform's audit work in both modes, and the
# serving model applies the (TF1) transform graph through the same TFT layer.
TRANSFORM_FORCE_TF_COMPAT_V1 = True

# DP-SGD linear regression (see the module doc for why linear). epochs / batch size fix the number
# of steps; the noise multiplier is calibrated from the real number of examples to the train part.
DPSGD_DEFAULTS = {
    "task": "regression",
    "hidden_units": [],
    "epochs": 5,
    "batch_size": 128,
    "learning_rate": 0.3,
    "l2_norm_clip": 1.0,
}
ADASSP_DEFAULTS: dict = {}

# --- validation ---------------------------------------------------------------------------------

LOSS = "loss"
DEFAULT_LOSS_BOUND = 3600.0  # B = 60²: squared errors are clipped to one hour²
DEFAULT_ETA = 0.05
PREDICTION_KEY = "predictions"

# --- plan ---------------------------------------------------------------------------------------

DEFAULT_TRANSFORM_SHARE = 0.1
DEFAULT_VALIDATE_SHARE = 0.3


def _share(value: Any, name: str, *, allow_zero: bool) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidPrivacyParameterError(f"{name} must be a number in [0, 1), got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise InvalidPrivacyParameterError(f"{name} must be finite, got {value!r}")
    share = accounting.exact(value)
    if share < 0 or share >= 1 or (share == 0 and not allow_zero):
        bounds = "[0, 1)" if allow_zero else "(0, 1)"
        raise InvalidPrivacyParameterError(f"{name} must lie in {bounds}, got {value!r}")
    return share


def _as_float(amount: Decimal, what: str) -> float:
    """The float whose shortest repr is exactly ``amount``; raises if there is none."""
    value = float(amount)
    if accounting.exact(value) != amount:
        raise InvalidPrivacyParameterError(
            f"the {what} share {amount} is not exactly representable as a float (nearest "
            f"{value!r}): the parts would not add up exactly to the plan's epsilon. Choose an "
            "epsilon or shares with fewer significant digits (e.g. epsilon=1.0, shares 0.1 / 0.3)")
    return value


def make_plan(epsilon: float, delta: float, *, transform_share: float = DEFAULT_TRANSFORM_SHARE,
              validate_share: float = DEFAULT_VALIDATE_SHARE) -> PrivacyPlan:
    """The basic-mode plan of one flights DP pipeline run (Sage List. 1).

    Parts (in this order): ``transform`` = ε·transform_share (pure ε), ``train`` = the rest of ε
    with all of δ, ``validate`` = ε·validate_share (pure ε). The parts' exact decimal sums
    (``sage_tfx.ledger.accounting.exact``, as the ledger sums) are exactly ``epsilon`` and
    ``delta``, so ``plan.cost() == {"epsilon": epsilon, "delta": delta}``. ``transform_share=0``
    leaves the transform part out (a pipeline with ``use_transform=False``).

    Args:
      epsilon: the run's total ε (finite, > 0).
      delta: the run's total δ, all spent by training (DP-SGD and AdaSSP need δ > 0).
      transform_share: fraction of ε for the DP Transform analyzers, in [0, 1).
      validate_share: fraction of ε for DP validation, in (0, 1).

    Returns:
      The PrivacyPlan (basic mode).

    Raises:
      InvalidPrivacyParameterError: bad ε, δ (including δ = 0) or shares, shares that leave no ε
        for training, or shares that are not exactly representable as floats.
    """
    epsilon = accounting.check_epsilon(epsilon)
    delta = accounting.check_delta(delta)
    if delta == 0:
        raise InvalidPrivacyParameterError(
            "delta must be > 0: the train part (DP-SGD or AdaSSP, Gaussian noise) needs delta > 0")
    t_share = _share(transform_share, "transform_share", allow_zero=True)
    v_share = _share(validate_share, "validate_share", allow_zero=False)
    if t_share + v_share >= 1:
        raise InvalidPrivacyParameterError(
            f"transform_share + validate_share = {t_share + v_share} leaves no epsilon for "
            "training; their sum must be < 1")
    total = accounting.exact(epsilon)
    transform = total * t_share
    validate = total * v_share
    train = total - transform - validate
    parts = []
    if t_share > 0:
        parts.append(PlanPart(plan_lib.TRANSFORM, _as_float(transform, "transform")))
    parts.append(PlanPart(plan_lib.TRAIN, _as_float(train, "train"), delta))
    parts.append(PlanPart(plan_lib.VALIDATE, _as_float(validate, "validate")))
    plan = PrivacyPlan.of(*parts)
    cost = plan.cost()
    if (accounting.exact(cost["epsilon"]) != total
            or accounting.exact(cost["delta"]) != accounting.exact(delta)):
        # The invariant the gate relies on; unreachable after the checks above.
        raise InvalidPrivacyParameterError(f"plan cost {cost} != ({epsilon!r}, {delta!r})")
    return plan


def check_plan(plan: PrivacyPlan, *, use_transform: bool) -> None:
    """Checks that ``plan`` has exactly the parts the pipeline will spend.

    ``train`` and ``validate`` always; ``transform`` iff ``use_transform`` (a transform part
    without a DP Transform would be charged and never used).

    Raises:
      TypeError: not a PrivacyPlan. ValueError: missing or superfluous parts.
    """
    if not isinstance(plan, PrivacyPlan):
        raise TypeError(
            f"plan must be a sage_tfx.adaptive.plan.PrivacyPlan, got {type(plan).__name__}")
    names = [p.name for p in plan.parts]
    expected = ([plan_lib.TRANSFORM] if use_transform else []) + [plan_lib.TRAIN,
                                                                    plan_lib.VALIDATE]
    missing = [n for n in expected if n not in names]
    extra = [n for n in names if n not in expected]
    if missing or extra:
        hint = ("make_plan(..., transform_share=0) for use_transform=False"
                if not use_transform else "make_plan(epsilon, delta)")
        raise ValueError(
            f"the plan has parts {names} but this pipeline (use_transform={use_transform}) spends "
            f"exactly {expected}: missing {missing}, unused {extra}; e.g. {hint}")


def trainer_config(algorithm: str = DPSGD, overrides: Optional[Mapping[str, Any]] = None, *,
                   use_transform: bool = True) -> dict:
    """The DPTrainer ``custom_config`` for ``flights_dp_module.model_fn``.

    The algorithm's defaults (:data:`DPSGD_DEFAULTS` / :data:`ADASSP_DEFAULTS`), the transformed
    feature columns when ``use_transform`` (else the module's raw ``DEFAULT_FEATURES``), then
    ``overrides`` on top.

    Raises:
      ValueError: an unknown algorithm, an ``algorithm`` override that disagrees, or a
        classification task (the validator scores minutes of delay).
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    overrides = dict(overrides or {})
    if overrides.get("algorithm", algorithm) != algorithm:
        raise ValueError(f"trainer_config sets algorithm={overrides['algorithm']!r} but "
                         f"algorithm={algorithm!r}")
    config: dict = {"algorithm": algorithm}
    config.update(copy.deepcopy(DPSGD_DEFAULTS if algorithm == DPSGD else ADASSP_DEFAULTS))
    if use_transform:
        config.update({"features": transformed_features(algorithm), "label": ARR_DELAY_SCALED,
                       "raw_label": LABEL_KEY,
                       "label_bounds": list(ARR_DELAY_SCALED_BOUNDS)})
    else:  # the raw label in minutes: clipped and scaled by the trainer, served in minutes
        config["label_bounds"] = list(LABEL_BOUNDS)
    config.update(overrides)
    if config.pop("task", "regression") != "regression":
        raise ValueError("this pipeline validates the squared error of arr_delay in minutes: "
                         f"trainer_config task must be 'regression', got {overrides['task']!r}")
    return config


def output_scale(use_transform: bool) -> float:
    """The DPTrainer's declared output_scale: the transform's label is ÷ LABEL_SCALE."""
    return LABEL_SCALE if use_transform else 1.0
