"""DPBaggingTrainer: differentially private bagging (Jordon, Yoon & van der Schaar, NeurIPS 2019)
as a TFX trainer under a Sage grant.

Example::

    cfg = BaggingConfig(k=50, n=100, lam=0.02)
    cost = bagging_cost(cfg, epsilon=3.0, delta=1e-5, public_size=len(public), rdp=False)
    gate = SageGate(ledger_url=url, stream="patients", window_last=30, **cost)
    examples = BlockExampleGen(grant=gate.outputs["grant"], ...)
    trainer = DPBaggingTrainer(examples=examples.outputs["examples"],
                               public_examples=public_gen.outputs["examples"], public_declared=True,
                               grant=gate.outputs["grant"], k=50, n=100, lam=0.02,
                               label_key="label", unit_key="user_id", feature_keys=[...])
    # trainer.outputs["model"] is a serving SavedModel (output 'probabilities') for
    # DPModelValidator and Pusher, with privacy_report.json beside it.
"""
from __future__ import annotations

import json
from typing import Optional, Sequence

from tfx import types
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import standard_artifacts

from sage_tfx.bagging import BaggingConfig
from sage_tfx.bagging.purchase import reservation
from sage_tfx.components.dp_bagging_trainer import executor, spec
from sage_tfx.errors import InvalidRequestError


class DPBaggingTrainer(base_component.BaseComponent):
    """Teachers on a granted private window, noisy labels on public points, the student.

    Component ``outputs`` contains ``model``: the student (``Format-Serving``) and
    ``privacy_report.json`` (p, ε, δ, votes, noise scale, the bound that won, mode,
    accountant, per-block charge), released once per
    grant: a re-execution gets the recorded directory back byte for byte.
    """

    SPEC_CLASS = spec.DPBaggingTrainerSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, *, examples: types.Channel, public_examples: types.Channel,
                 grant: types.Channel, k: int, n: int, lam: float, label_key: str,
                 unit_key: str, feature_keys: Sequence[str], public_declared: bool = False,
                 mode: str = "fixed_queries", accountant: str = "best", teacher: str = "logistic",
                 split: str = spec.DEFAULT_SPLIT, public_split: str = spec.DEFAULT_SPLIT,
                 salt: Optional[str] = None, cache_dir: Optional[str] = None,
                 accept_not_differentially_private: bool = False,
                 max_labels: Optional[int] = None, votes: str = "laplace"):
        """Args: see the module docstring; ``public_declared`` must be True (the user vouches
        that ``public_examples`` is public data); ``mode="paper"`` is not differentially private
        and needs ``accept_not_differentially_private=True`` (recorded on the model, which
        DPModelValidator then refuses to bless); ``max_labels`` (paper mode only) is how many
        public points a run reserves, by default all that are left for the window. Raises
        ValueError subclasses on bad input."""
        BaggingConfig(k=k, n=n, lam=lam, mode=mode, accountant=accountant, teacher=teacher,
                      accept_not_differentially_private=accept_not_differentially_private,
                      votes=votes)
        reservation(None if mode == "paper" else 0, public_size=1, max_labels=max_labels)
        if public_declared is not True:
            raise InvalidRequestError("declare the public examples public (public_declared=True): "
                                      "DP bagging labels them without any privacy protection")
        for name, value in (("label_key", label_key), ("unit_key", unit_key)):
            if not isinstance(value, str) or not value:
                raise InvalidRequestError(f"{name} must be a non-empty string")
        keys_json = json.dumps(list(feature_keys))
        executor.feature_keys_of({spec.FEATURE_KEYS_KEY: keys_json})
        super().__init__(spec=spec.DPBaggingTrainerSpec(
            examples=examples, public_examples=public_examples, grant=grant,
            k=k, n=n, lam=float(lam), mode=mode, accountant=accountant, teacher=teacher,
            label_key=label_key, unit_key=unit_key, feature_keys=keys_json, public_declared=1,
            split=split, public_split=public_split, salt=salt, cache_dir=cache_dir,
            accept_not_differentially_private=int(accept_not_differentially_private),
            max_labels=max_labels, votes=votes,
            model=types.Channel(type=standard_artifacts.Model)))
