"""A test-only stand-in for a Sage trainer: writes the serving model ``w·x + b`` (TFX Trainer's
``Format-Serving`` layout, as test_dp_validator's models) and the record a Sage trainer writes
on its Model (the grant it ran under), so a pipeline test controls exactly how good each run's
model is. DPTrainer itself is tested in test_dp_trainer*.py and the flights e2e test."""
from tfx.dsl.component.experimental.annotations import InputArtifact, OutputArtifact, Parameter
from tfx.dsl.component.experimental.decorators import component
from tfx.types import standard_artifacts

from sage_tfx.components.artifacts import SageGrant


@component
def FixedModelTrainer(grant: InputArtifact[SageGrant],
                      model: OutputArtifact[standard_artifacts.Model],
                      w: Parameter[float], b: Parameter[float]):
    from sage_tfx.components import artifacts
    from test_dp_validator import _save_model
    _save_model(model.uri, w, b, two_outputs=True)
    model.set_string_custom_property("grant_id", artifacts.read_grant(grant).grant_id)
