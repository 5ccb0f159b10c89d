"""The flights DP pipeline's plan, settings and schema: fast, no TensorFlow."""
import subprocess
import sys
from decimal import Decimal

import pytest

from sage_tfx.ledger import accounting
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.ledger import BlockSpec, Window, open_ledger
from sage_tfx.pipelines import flights_plan as fp
from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan


def _exact_sum(values):
    return sum((accounting.exact(v) for v in values), Decimal(0))


def test_default_plan_parts():
    plan = fp.make_plan(1.0, 1e-6)
    assert [(p.name, p.epsilon, p.delta) for p in plan.parts] == [
        ("transform", 0.1, 0.0), ("train", 0.6, 1e-6), ("validate", 0.3, 0.0)]
    assert plan.mode == "basic"
    assert plan.cost() == {"epsilon": 1.0, "delta": 1e-6}


@pytest.mark.parametrize("epsilon, delta, transform_share, validate_share", [
    (1.0, 1e-6, 0.1, 0.3),
    (0.7, 1e-7, 0.1, 0.3),
    (2.0, 1e-5, 0.05, 0.25),
    (1 / 3, 1e-6, 0.1, 0.3),            # 0.3333333333333333: 16 digits, shares still exact
    (0.001, 1e-9, 0.2, 0.2),
    (0.123456789012345, 3e-8, 0.1, 0.3),
    (5.5, 1e-6, 0.0, 0.5),               # no transform part
    (1.0, 1e-6, 0.45, 0.45),
])
def test_parts_add_up_exactly(epsilon, delta, transform_share, validate_share):
    plan = fp.make_plan(epsilon, delta, transform_share=transform_share,
                        validate_share=validate_share)
    assert _exact_sum(p.epsilon for p in plan.parts) == accounting.exact(epsilon)
    assert _exact_sum(p.delta for p in plan.parts) == accounting.exact(delta)
    assert plan.cost() == {"epsilon": epsilon, "delta": delta}
    parts = {p.name: p for p in plan.parts}
    assert parts["train"].delta == delta  # δ all on training; the others are pure ε
    assert all(p.delta == 0.0 for name, p in parts.items() if name != "train")
    assert accounting.exact(parts["validate"].epsilon) == (
        accounting.exact(epsilon) * accounting.exact(validate_share))
    if transform_share:
        assert accounting.exact(parts["transform"].epsilon) == (
            accounting.exact(epsilon) * accounting.exact(transform_share))
    else:
        assert "transform" not in parts


def test_plan_charge_fits_a_global_budget_of_exactly_its_epsilon(tmp_path):
    """The ledger sums charges exactly: a plan of ε fills a block with ε_g = ε, no more."""
    plan = fp.make_plan(0.7, 1e-7)
    with open_ledger(f"sqlite:///{tmp_path}/ledger.db") as ledger:
        ledger.create_stream("flights", epsilon_g=1.4, delta_g=2e-7, granularity="day")
        ledger.add_blocks("flights", [BlockSpec("2013-01-01", str(tmp_path / "b"))])
        for run in ("r1", "r2"):
            assert ledger.request("flights", run_id=run, window=Window(last=1),
                                  **plan.cost()).granted
        assert not ledger.request("flights", run_id="r3", window=Window(last=1),
                                  **plan.cost()).granted
        [block] = ledger.blocks("flights")
        assert (block.epsilon_spent, block.delta_spent) == (1.4, 2e-7)


@pytest.mark.parametrize("epsilon", [0.30000000000000004, 2 / 3, 12.345678901234567])
def test_shares_that_are_not_floats_are_refused(epsilon):
    with pytest.raises(InvalidPrivacyParameterError, match="not exactly representable"):
        fp.make_plan(epsilon, 1e-6)


@pytest.mark.parametrize("kwargs, message", [
    (dict(epsilon=0.0, delta=1e-6), "epsilon"),
    (dict(epsilon=-1.0, delta=1e-6), "epsilon"),
    (dict(epsilon=float("nan"), delta=1e-6), "epsilon"),
    (dict(epsilon=float("inf"), delta=1e-6), "epsilon"),
    (dict(epsilon=1.0, delta=0.0), "delta must be > 0"),
    (dict(epsilon=1.0, delta=1.0), "delta"),
    (dict(epsilon=1.0, delta=-1e-6), "delta"),
    (dict(epsilon=1.0, delta=1e-6, transform_share=-0.1), "transform_share"),
    (dict(epsilon=1.0, delta=1e-6, transform_share=1.0), "transform_share"),
    (dict(epsilon=1.0, delta=1e-6, transform_share=float("nan")), "transform_share"),
    (dict(epsilon=1.0, delta=1e-6, transform_share=True), "transform_share"),
    (dict(epsilon=1.0, delta=1e-6, validate_share=0.0), "validate_share"),
    (dict(epsilon=1.0, delta=1e-6, validate_share="0.3"), "validate_share"),
    (dict(epsilon=1.0, delta=1e-6, transform_share=0.5, validate_share=0.5), "no epsilon"),
    (dict(epsilon=1.0, delta=1e-6, transform_share=0.6, validate_share=0.5), "no epsilon"),
])
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(InvalidPrivacyParameterError, match=message):
        fp.make_plan(**kwargs)


def test_check_plan_requires_exactly_the_spent_parts():
    fp.check_plan(fp.make_plan(1.0, 1e-6), use_transform=True)
    no_transform = fp.make_plan(1.0, 1e-6, transform_share=0.0)
    fp.check_plan(no_transform, use_transform=False)
    with pytest.raises(ValueError, match=r"missing \['transform'\]"):
        fp.check_plan(no_transform, use_transform=True)
    with pytest.raises(ValueError, match=r"unused \['transform'\]"):
        fp.check_plan(fp.make_plan(1.0, 1e-6), use_transform=False)
    with pytest.raises(ValueError, match=r"missing \['validate'\]"):
        fp.check_plan(PrivacyPlan.of(PlanPart("train", 1.0, 1e-6)), use_transform=False)
    with pytest.raises(TypeError, match="PrivacyPlan"):
        fp.check_plan({"epsilon": 1.0}, use_transform=False)


def test_trainer_config():
    config = fp.trainer_config()
    assert config["algorithm"] == "dpsgd" and config["hidden_units"] == []
    assert {k: config[k] for k in ("epochs", "batch_size", "learning_rate", "l2_norm_clip")} == {
        "epochs": 5, "batch_size": 128, "learning_rate": 0.3, "l2_norm_clip": 1.0}
    assert set(config["features"]) == {fp.DISTANCE_SCALED, fp.HOUR_SCALED,
                                       fp.DEP_DELAY_CENTERED}
    assert "min" not in config["features"][fp.DEP_DELAY_CENTERED]  # DP-SGD: unsquashed
    assert config["label"] == fp.ARR_DELAY_SCALED and config["raw_label"] == "arr_delay"
    assert config["label_bounds"] == [-0.2, 1.0] and fp.output_scale(True) == 300.0
    config["features"][fp.HOUR_SCALED]["min"] = 5.0  # a copy: the defaults stay intact
    assert fp.trainer_config()["features"][fp.HOUR_SCALED]["min"] == 0.0

    adassp = fp.trainer_config("adassp")
    assert adassp["algorithm"] == "adassp" and "epochs" not in adassp
    assert all("min" in c and "max" in c for c in adassp["features"].values())  # bounded rows
    assert adassp["features"][fp.DEP_DELAY_CENTERED]["max"] == 6.0

    raw = fp.trainer_config("dpsgd", {"epochs": 1, "seed": 3}, use_transform=False)
    assert "features" not in raw and "label" not in raw  # the module's raw defaults
    assert (raw["epochs"], raw["seed"]) == (1, 3) and raw["label_bounds"] == [-60.0, 300.0]
    for bad, message in [(("logistic", None), "algorithm must be"),
                         (("dpsgd", {"algorithm": "adassp"}), "sets algorithm"),
                         (("dpsgd", {"task": "classification"}), "regression")]:
        with pytest.raises(ValueError, match=message):
            fp.trainer_config(*bad)


def test_checked_in_schema_describes_the_block_records(tmp_path):
    """schema.pbtxt names every column nycflights13_csv writes, with the type the splitter
    gives it (int64 / float / bytes), and marks as optional exactly the columns with gaps."""
    from tensorflow_metadata.proto.v0 import schema_pb2
    from google.protobuf import text_format
    from sage_tfx.streams import datasets, records

    schema = text_format.Parse(open(fp.SCHEMA_PATH).read(), schema_pb2.Schema())
    types = {f.name: schema_pb2.FeatureType.Name(f.type) for f in schema.feature}
    csv = datasets.nycflights13_csv(str(tmp_path / "flights.csv"), limit_days=2)
    inferred = records.infer_csv_schema([csv.path])
    kinds = {"int": "INT", "float": "FLOAT", "string": "BYTES"}
    assert types == {name: kinds[t] for name, t in inferred.items()}
    assert tuple(f.name for f in schema.feature) == datasets.NYCFLIGHTS13_COLUMNS
    optional = {f.name for f in schema.feature if f.presence.min_fraction < 1.0}
    assert optional == {"tailnum", "dep_delay", "arr_delay", "air_time"}
    assert not any(f.HasField("shape") for f in schema.feature)  # all VarLen in tf.Transform


def test_plan_module_imports_no_tensorflow():
    code = ("import sys; import sage_tfx.pipelines.flights_plan\n"
            "print(','.join(m for m in ('tensorflow', 'tfx', 'tensorflow_transform') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
