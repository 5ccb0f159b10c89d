"""End to end under LocalDagRunner: SageGate → BlockExampleGen → (trainer) → DPModelValidator
with a LatestBlessedModelStrategy resolver as its baseline → stock Pusher, three runs: the first
model is blessed on its SLA alone (nothing blessed yet), a better one is blessed against it, and
a worse one that still meets the SLA is refused against the better one."""
import os

import numpy as np
import pytest

from blockdata import make_example, write_encrypted_day_blocks

pytestmark = pytest.mark.slow

STREAM = "regression"
DAYS = ("2024-05-01", "2024-05-02", "2024-05-03")
PER_BLOCK = 2000  # ~2,000 eval examples per run (BlockExampleGen's 2:1 split)


def _ledger(tmp_path):
    from sage_tfx.ledger import open_ledger
    url = f"sqlite:///{tmp_path}/ledger.db"
    rng = np.random.default_rng(8)

    def rows(day):
        x = rng.uniform(0, 1, PER_BLOCK)
        y = 2 * x + 1 + rng.normal(0, 0.1, PER_BLOCK)
        return [make_example({"x": float(a), "y": float(b)}) for a, b in zip(x, y)]

    specs = write_encrypted_day_blocks(str(tmp_path / "blocks"), STREAM, DAYS, rows)
    with open_ledger(url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=10.0, delta_g=1e-5, granularity="day")
        ledger.add_blocks(STREAM, specs)
    return url


def _pipeline(tmp_path, url, b):
    from tfx import v1 as tfx
    from fixed_model_trainer import FixedModelTrainer
    from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
    from sage_tfx.components import BlockExampleGen, DPModelValidator, SageGate, preflight

    plan = PrivacyPlan.of(PlanPart("validate", 1.0), PlanPart("baseline", 1.0))
    gate = SageGate(ledger_url=url, stream=STREAM, window_last=3, plan=plan)
    example_gen = BlockExampleGen(grant=gate.outputs["grant"])
    trainer = FixedModelTrainer(grant=gate.outputs["grant"], w=2.0, b=b)
    resolver = tfx.dsl.Resolver(
        strategy_class=tfx.dsl.experimental.LatestBlessedModelStrategy,
        model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
        model_blessing=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing),
    ).with_id("latest_blessed_model_resolver")
    validator = DPModelValidator(
        examples=example_gen.outputs["examples"], model=trainer.outputs["model"],
        grant=gate.outputs["grant"], baseline_model=resolver.outputs["model"], label_key="y",
        prediction_key="prediction", metric="loss", loss_fn="squared_error", loss_bound=1.0,
        target=0.2)
    pusher = tfx.components.Pusher(
        model=trainer.outputs["model"], model_blessing=validator.outputs["blessing"],
        push_destination=tfx.proto.PushDestination(
            filesystem=tfx.proto.PushDestination.Filesystem(
                base_directory=str(tmp_path / "serving"))))
    return preflight.attach(tfx.dsl.Pipeline(
        pipeline_name="baseline-e2e", pipeline_root=str(tmp_path / "root"),
        components=[gate, example_gen, trainer, resolver, validator, pusher],
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            str(tmp_path / "mlmd.db"))))


def test_latest_blessed_model_is_the_baseline_a_better_model_is_pushed_a_worse_one_is_not(
        tmp_path):
    from ml_metadata.metadata_store import metadata_store
    from tfx import v1 as tfx
    from tfx.orchestration import metadata
    url = _ledger(tmp_path)
    outcomes = []
    # Squared errors: b = 1.3 → 0.1 (meets the target 0.2), b = 1.0 → 0.01 (better by 0.09),
    # then b = 1.3 again: it meets the target but is worse than the blessed b = 1.0.
    for b in (1.3, 1.0, 1.3):
        tfx.orchestration.LocalDagRunner().run(_pipeline(tmp_path, url, b))
        store = metadata_store.MetadataStore(
            metadata.sqlite_metadata_connection_config(str(tmp_path / "mlmd.db")))
        blessing = max(store.get_artifacts_by_type("ModelBlessing"), key=lambda a: a.id)
        pushed = max(store.get_artifacts_by_type("PushedModel"), key=lambda a: a.id)
        props = {k: getattr(v, v.WhichOneof("value")) for k, v in
                 blessing.custom_properties.items()}
        outcomes.append((props["outcome"], props["baseline_outcome"], props["blessed"],
                         pushed.custom_properties["pushed"].int_value,
                         props.get("baseline_model_id"), props["current_model_id"]))
    first, better, worse = outcomes
    assert first[:4] == ("ACCEPT", "NO_BASELINE", 1, 1)
    assert better[:4] == ("ACCEPT", "NOT_WORSE", 1, 1)
    assert better[4] == first[5]  # the baseline was the first run's (blessed) model
    assert worse[:4] == ("ACCEPT", "WORSE", 0, 0)
    assert worse[4] == better[5]  # the latest blessed model, not the first one
    assert len(os.listdir(tmp_path / "serving")) == 2
