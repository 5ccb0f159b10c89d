"""DPModelValidator's baseline comparison: the candidate against the last blessed model, DP.

TFX's Evaluator takes ``baseline_model`` from a ``LatestBlessedModelStrategy`` resolver and
blesses only a model that is not worse than it. DPModelValidator does the same on the eval split
with one DP release (:class:`sage_tfx.dp.comparison.LossDifferenceComparator`): the DP mean of
the per-example loss difference (candidate − baseline, both clipped to [0, B]) with a confidence
bound, so the blessing requires, beside the SLA's ACCEPT, that with probability ≥ 1 − η the
candidate is not worse than the baseline by more than ``baseline_tolerance``.

Privacy. The comparison spends its own plan part, ``baseline`` (basic: its ε; rdp: exactly the
comparator's ``dp_event(ε)``), not a share of ``validate``: the SLA validation keeps its
calibration and its event, and the ledger's charge says what the comparison costs. A validator
given a ``baseline_model`` channel requires the part even when the channel resolves no model (the
first run, before anything is blessed): then nothing is compared, the part is left unspent and
the blessing says ``baseline_outcome = NO_BASELINE``, as the Evaluator passes its change
thresholds without a baseline.

Released once, under ``baseline/comparison``: the request records the configuration, ε and both
models' digests, so a replay compares the same two models (a retry whose resolver now returns
another baseline is refused with ``ReleaseConflictError``). Both models see the same eval
examples in the same order; the baseline may have been trained on blocks that are in this eval
split (earlier windows overlap), which makes its loss optimistic and the comparison conservative.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional

from tfx import types

from sage_tfx.components import release_io
from sage_tfx.components.dp_validator import spec
from sage_tfx.dp.comparison import ComparisonOutcome, ComparisonResult, LossDifferenceComparator
from sage_tfx.ledger import releases

COMPONENT = "DPModelValidator"
RELEASE_NAME = releases.part_release_name(spec.BASELINE_PART, "comparison")


@dataclasses.dataclass(frozen=True)
class BaselineConfig:
    """The comparison's own settings: τ (metric units, ≥ 0) and η."""

    tolerance: float
    eta: float


def baseline_config(exec_properties: Dict[str, Any], eta: float) -> Optional[BaselineConfig]:
    """The comparison settings, or None if the validator compares with no baseline.

    Raises:
      ValueError: a bad tolerance or η (via the comparator).
    """
    if not exec_properties.get(spec.COMPARE_BASELINE_KEY):
        return None
    tolerance = exec_properties.get(spec.BASELINE_TOLERANCE_KEY)
    baseline_eta = exec_properties.get(spec.BASELINE_ETA_KEY)
    return BaselineConfig(
        tolerance=spec.DEFAULT_BASELINE_TOLERANCE if tolerance is None else tolerance,
        eta=eta if baseline_eta is None else baseline_eta)


def comparator(config: Any, baseline: BaselineConfig) -> LossDifferenceComparator:
    """The comparator for a validator configuration (its metric, loss_fn and B)."""
    return LossDifferenceComparator(
        loss_bound=config.loss_bound, eta=baseline.eta, tolerance=baseline.tolerance,
        metric=config.metric, metric_name=config.loss_fn or config.metric)


def release_request(config: Any, baseline: BaselineConfig, epsilon: float,
                    model: types.Artifact, baseline_model: types.Artifact) -> dict:
    """What the comparison asks, recorded with its release: the validator's configuration
    that decides the values, τ, η, ε and both models' digests."""
    fields = dataclasses.asdict(config)
    for key in ("batch_size", "target", "eta"):  # no bearing on the comparison
        fields.pop(key)
    return {"component": COMPONENT, "plan_part": spec.BASELINE_PART, **fields,
            "tolerance": baseline.tolerance, "eta": baseline.eta, "epsilon": epsilon,
            "model_sha256": release_io.tree_digest(model.uri),
            "baseline_model_sha256": release_io.tree_digest(baseline_model.uri)}


def compare_once(ledger, grant_id: str, comp: LossDifferenceComparator, epsilon: float,
                 candidate_values: Callable[[], Any], baseline_values: Callable[[], Any],
                 request: dict):
    """The comparison released once under the grant (``release_io.release_json_once``, the
    ``baseline`` part claimed for DPModelValidator); the values are computed only if nothing
    is recorded. Returns the JsonRelease."""
    return release_io.release_json_once(
        ledger, grant_id, RELEASE_NAME,
        lambda: comp.compare(candidate_values(), baseline_values(), epsilon=epsilon).to_dict(),
        request=request, component=COMPONENT, part=spec.BASELINE_PART)


def not_worse(baseline: Optional[BaselineConfig], result: Optional[ComparisonResult]) -> bool:
    """Whether the comparison lets the model be blessed: no comparison asked, no baseline
    resolved, or NOT_WORSE."""
    return baseline is None or result is None or result.outcome == ComparisonOutcome.NOT_WORSE


def write_properties(blessing: types.Artifact, baseline: BaselineConfig,
                     result: Optional[ComparisonResult], released: Any = None,
                     baseline_model: Optional[types.Artifact] = None) -> dict:
    """Records the comparison on the blessing (DP quantities only); returns its JSON record
    for ``validation.json`` (``{"outcome": "NO_BASELINE"}`` when no baseline was resolved)."""
    blessing.set_float_custom_property(spec.BASELINE_TOLERANCE_PROPERTY, float(baseline.tolerance))
    blessing.set_float_custom_property(spec.BASELINE_ETA_PROPERTY, float(baseline.eta))
    if result is None:
        blessing.set_string_custom_property(spec.BASELINE_OUTCOME_PROPERTY, spec.NO_BASELINE)
        return {"outcome": spec.NO_BASELINE}
    blessing.set_string_custom_property(spec.BASELINE_OUTCOME_PROPERTY, result.outcome.value)
    for field in spec.BASELINE_FLOAT_FIELDS:
        value = float(getattr(result, field))
        if math.isfinite(value):  # MLMD cannot store NaN / ±inf; validation.json has them
            blessing.set_float_custom_property(f"baseline_{field}", value)
    blessing.set_string_custom_property(spec.BASELINE_MODEL_PROPERTY, baseline_model.uri)
    blessing.set_int_custom_property(spec.BASELINE_MODEL_ID_PROPERTY, baseline_model.id)
    blessing.set_int_custom_property(spec.BASELINE_REPLAYED_PROPERTY, int(released.replayed))
    blessing.set_string_custom_property(spec.BASELINE_RELEASE_NAME_PROPERTY,
                                        released.release.name)
    blessing.set_string_custom_property(spec.BASELINE_RELEASE_DIGEST_PROPERTY,
                                        released.release.digest)
    return result.to_dict()
