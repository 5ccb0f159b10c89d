"""DnDTrainer: Draw-and-Discard (Pihur et al.) as a TFX trainer under a Sage grant.

Example::

    settings = RunSettings("logistic", n_features=2, k=10, gamma=0.5, l1_norm_clip=1.0,
                           epsilon=1.0, passes=2, n_c=5)
    plan = PrivacyPlan.of(dnd_train_part(settings), PlanPart("validate", epsilon=1.0))
    gate = SageGate(ledger_url=url, stream="email", window_last=4, plan=plan)
    examples = BlockExampleGen(grant=gate.outputs["grant"], ...)
    trainer = DnDTrainer(examples=examples.outputs["examples"], grant=gate.outputs["grant"],
                         settings=settings, features=[FeatureSpec("x0", 0, 10)],
                         client_key="user", label_key="label")
    # trainer.outputs["model"]: a serving SavedModel (Format-Serving, output 'probabilities'
    # for logistic, 'predictions' otherwise) for DPModelValidator and Pusher, with
    # privacy_report.json beside it.

The gaussian unit (L2 clip, Gaussian noise at (ε, δ) per update; the plan's train part is then
``passes × (ε, δ)``, or ``SelfComposedDpEvent(GaussianDpEvent(m), passes)`` with
``dnd_train_part(settings, rdp=True)`` on rdp streams)::

    settings = RunSettings("logistic", n_features=2, k=10, gamma=0.5, l1_norm_clip=1.0,
                           epsilon=8.0, passes=2, n_c=5, unit="gaussian", delta=1e-7,
                           l2_norm_clip=1.0)
"""
from __future__ import annotations

from typing import Sequence

from tfx import types
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import standard_artifacts

from sage_tfx.components.dnd_trainer import executor, spec
from sage_tfx.components.dnd_trainer.protocol import (FeatureSpec, RunSettings, features_to_json)
from sage_tfx.errors import InvalidRequestError


class DnDTrainer(base_component.BaseComponent):
    """k instances, clients of N_c examples of one privacy unit, the average as the model.

    Component ``outputs`` contains ``model``: the average (``Format-Serving``) and
    ``privacy_report.json`` (ε and δ per update, passes, unit, the charge, updates
    accepted/rejected). ``settings.unit`` is ``model`` / ``feature`` (L1 clip, Laplace) or
    ``gaussian`` (L2 clip ``l2_norm_clip``, Gaussian noise at (ε, δ) per update).
    """

    SPEC_CLASS = spec.DnDTrainerSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, *, examples: types.Channel, grant: types.Channel, settings: RunSettings,
                 features: Sequence[FeatureSpec], client_key: str, label_key: str,
                 split: str = spec.DEFAULT_SPLIT, spam_check: bool = True):
        """Args: see the module docstring. ``features`` carry public bounds (from the schema),
        never bounds read from the data; ``settings.n_features`` must equal ``len(features)``.
        Raises ValueError subclasses on bad input."""
        if not isinstance(settings, RunSettings):
            raise InvalidRequestError("settings must be a RunSettings")
        features = list(features)
        if settings.n_features != len(features):
            raise InvalidRequestError(f"settings.n_features = {settings.n_features} but "
                                      f"{len(features)} features given")
        props = {spec.FEATURES_KEY: features_to_json(features), spec.CLIENT_KEY: client_key,
                 spec.LABEL_KEY: label_key, spec.FAMILY_KEY: settings.family,
                 spec.K_KEY: settings.k,
                 spec.GAMMA_KEY: float(settings.gamma), spec.CLIP_KEY: float(settings.l1_norm_clip),
                 spec.EPSILON_KEY: float(settings.epsilon), spec.UNIT_KEY: settings.unit,
                 spec.PASSES_KEY: settings.passes, spec.N_C_KEY: settings.n_c,
                 spec.SPLIT_KEY: split, spec.SPAM_CHECK_KEY: int(bool(spam_check))}
        for key, value in ((spec.DELTA_KEY, settings.delta),
                           (spec.L2_CLIP_KEY, settings.l2_norm_clip)):
            if value is not None:   # gaussian unit only (RunSettings refuses them elsewhere)
                props[key] = float(value)
        executor.settings_from_exec_properties(props)
        super().__init__(spec=spec.DnDTrainerSpec(
            examples=examples, grant=grant, **props,
            model=types.Channel(type=standard_artifacts.Model)))
