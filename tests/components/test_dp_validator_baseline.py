"""DPModelValidator's baseline comparison: executor Do() with a baseline model, the blessing's
"not worse" rule, its own plan part, release once with both models' digests, and the spec.

Models and eval data as in test_dp_validator.py: y = 2x + 1 + N(0, 0.1²); a model w·x + b.
"""
import json
import os

import pytest

from test_dp_validator import _examples, _model, _plan, _props, _save_model, _trained_under
from trainerdata import grant as _grant

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mods():
    from sage_tfx.components import artifacts, plan_io
    from sage_tfx.components.dp_validator import component, executor, spec
    return component, executor, spec, artifacts, plan_io


@pytest.fixture(scope="module")
def examples_dir(tmp_path_factory):
    import numpy as np
    import tensorflow as tf
    from test_dp_validator import _serialize
    rng = np.random.default_rng(2024)
    x = rng.uniform(0.0, 1.0, 2000).astype(np.float32)
    y = (2.0 * x + 1.0 + rng.normal(0.0, 0.1, x.size)).astype(np.float32)
    root = tmp_path_factory.mktemp("examples")
    for split, n in (("train", 10), ("eval", x.size)):
        os.makedirs(root / f"Split-{split}")
        with tf.io.TFRecordWriter(str(root / f"Split-{split}" / "data_tfrecord-00000-of-00001.gz"),
                                  options="GZIP") as w:
            for r in _serialize(x[:n], y[:n], (x[:n] > 0.5).astype(np.int64)):
                w.write(r)
    return str(root)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """good: squared error 0.01; fair: 0.1 (b off by 0.3); both meet the target 0.2."""
    return {name: _save_model(str(tmp_path_factory.mktemp(name)), 2.0, b, two_outputs=True)
            for name, b in (("good", 1.0), ("fair", 1.3))}


def _baseline_plan(validate=1.0, baseline=1.0):
    return _plan(("train", 0.5), ("validate", validate),
                 *([("baseline", baseline)] if baseline else []))


def _run(mods, tmp_path, examples_dir, *, grant, model, baseline, name="blessing",
         compare=True, **kw):
    from tfx.types import standard_artifacts
    _, executor, spec, _, _ = mods
    _trained_under(model, grant)
    blessing = standard_artifacts.ModelBlessing()
    blessing.uri = str(tmp_path / name)
    props = _props(spec, target=0.2, **kw)
    if compare:
        props[spec.COMPARE_BASELINE_KEY] = 1
    inputs = {spec.EXAMPLES_KEY: [_examples(examples_dir)], spec.MODEL_KEY: [model],
              spec.GRANT_INPUT_KEY: [grant]}
    if baseline is not None:
        inputs[spec.BASELINE_MODEL_KEY] = baseline
    executor.Executor().Do(inputs, {spec.BLESSING_KEY: [blessing]}, props)
    return blessing


def _baseline(uri, model_id=7):
    m = _model(uri)
    m.id = model_id
    return [m]


def test_a_better_model_is_blessed_and_a_worse_one_refused(mods, tmp_path, examples_dir, models):
    from sage_tfx.ledger import open_ledger, releases
    _, _, spec, _, _ = mods
    grant = _grant(mods, tmp_path, _baseline_plan(), name="g1")
    better = _run(mods, tmp_path, examples_dir, grant=grant, model=_model(models["good"]),
                  baseline=_baseline(models["fair"]), name="better")
    assert better.get_int_custom_property("blessed") == 1
    assert os.path.exists(os.path.join(better.uri, spec.BLESSED_FILE_NAME))
    assert better.get_string_custom_property("outcome") == "ACCEPT"
    assert better.get_string_custom_property("baseline_outcome") == "NOT_WORSE"
    diff = better.get_float_custom_property("baseline_dp_difference")
    upper = better.get_float_custom_property("baseline_upper_bound")
    assert abs(diff + 0.09) < 0.02 and diff < upper <= 0.0
    assert better.get_float_custom_property("baseline_epsilon") == 1.0
    assert better.get_string_custom_property("baseline_model") == models["fair"]
    assert better.get_int_custom_property("baseline_model_id") == 7
    assert better.get_int_custom_property("baseline_replayed") == 0
    assert better.get_string_custom_property("baseline_release_name") == "baseline/comparison"
    with open(os.path.join(better.uri, spec.VALIDATION_FILE_NAME)) as f:
        record = json.load(f)["baseline_comparison"]
    assert record["outcome"] == "NOT_WORSE" and record["details"]["sum_sensitivity"] == 1.0
    # The recorded request names both models by digest, and the baseline part is claimed.
    with open_ledger(grant.get_string_custom_property("ledger_url")) as ledger:
        [rec] = [r for r in ledger.releases(grant.grant_id) if r.name == "baseline/comparison"]
        request = json.loads(rec.value)["request"]
    assert request["model_sha256"] == releases.tree_digest(models["good"])
    assert request["baseline_model_sha256"] == releases.tree_digest(models["fair"])
    assert request["plan_part"] == "baseline" and request["epsilon"] == 1.0

    grant2 = _grant(mods, tmp_path, _baseline_plan(), name="g2")
    worse = _run(mods, tmp_path, examples_dir, grant=grant2, model=_model(models["fair"]),
                 baseline=_baseline(models["good"]), name="worse")
    assert worse.get_string_custom_property("outcome") == "ACCEPT"  # it meets the SLA...
    assert worse.get_string_custom_property("baseline_outcome") == "WORSE"  # ...but is worse
    assert worse.get_int_custom_property("blessed") == 0
    assert sorted(os.listdir(worse.uri)) == [spec.NOT_BLESSED_FILE_NAME,
                                             spec.VALIDATION_FILE_NAME]


def test_no_baseline_resolved_blesses_on_the_sla_and_spends_nothing_more(mods, tmp_path,
                                                                           examples_dir, models):
    from sage_tfx.ledger import open_ledger
    grant = _grant(mods, tmp_path, _baseline_plan())
    blessing = _run(mods, tmp_path, examples_dir, grant=grant, model=_model(models["good"]),
                    baseline=[])
    assert blessing.get_int_custom_property("blessed") == 1
    assert blessing.get_string_custom_property("baseline_outcome") == "NO_BASELINE"
    assert not blessing.has_custom_property("baseline_dp_difference")
    with open_ledger(grant.get_string_custom_property("ledger_url")) as ledger:
        names = {r.name for r in ledger.releases(grant.grant_id)}
    assert "baseline/comparison" not in names and "validate/validation" in names


def test_the_comparison_needs_its_own_plan_part(mods, tmp_path, examples_dir):
    """Checked before any model is loaded (the models do not exist), even with no baseline
    resolved: a plan never depends on whether something was blessed before."""
    from sage_tfx.errors import MissingGrantError
    grant = _grant(mods, tmp_path, _baseline_plan(baseline=None))
    for baseline in ([], _baseline(str(tmp_path / "no_baseline"))):
        with pytest.raises(MissingGrantError, match="no 'baseline' part"):
            _run(mods, tmp_path, examples_dir, grant=grant,
                 model=_model(str(tmp_path / "no_model")), baseline=baseline)


def test_replay_and_another_baseline_under_the_same_grant(mods, tmp_path, examples_dir, models):
    from sage_tfx.errors import ReleaseConflictError
    grant = _grant(mods, tmp_path, _baseline_plan())
    first = _run(mods, tmp_path, examples_dir, grant=grant, model=_model(models["good"]),
                 baseline=_baseline(models["fair"]), name="first")
    again = _run(mods, tmp_path, examples_dir, grant=grant, model=_model(models["good"]),
                 baseline=_baseline(models["fair"]), name="again")
    assert again.get_int_custom_property("baseline_replayed") == 1
    assert again.get_int_custom_property("replayed") == 1
    for key in ("baseline_dp_difference", "baseline_upper_bound", "baseline_lower_bound"):
        assert again.get_float_custom_property(key) == first.get_float_custom_property(key)
    with pytest.raises(ReleaseConflictError, match="refused to publish a second release"):
        _run(mods, tmp_path, examples_dir, grant=grant, model=_model(models["good"]),
             baseline=_baseline(models["good"]), name="other")
    assert os.listdir(tmp_path / "other") == [mods[2].NOT_BLESSED_FILE_NAME]


def test_a_baseline_without_compare_baseline_is_refused(mods, tmp_path, examples_dir, models):
    grant = _grant(mods, tmp_path, _baseline_plan())
    with pytest.raises(ValueError, match="compare_baseline"):
        _run(mods, tmp_path, examples_dir, grant=grant, model=_model(models["good"]),
             baseline=_baseline(models["fair"]), compare=False)


def test_component_spec_with_a_baseline_channel(mods):
    from tfx.types import channel_utils, standard_artifacts
    from sage_tfx.components.artifacts import SageGrant
    component, _, spec, _, _ = mods
    channels = dict(examples=channel_utils.as_channel([standard_artifacts.Examples()]),
                    model=channel_utils.as_channel([standard_artifacts.Model()]),
                    grant=channel_utils.as_channel([SageGrant()]))
    baseline = channel_utils.as_channel([standard_artifacts.Model()])
    c = component.DPModelValidator(**channels, baseline_model=baseline, label_key="y",
                                   target=0.1, loss_bound=1.0, baseline_tolerance=0.01)
    assert c.inputs[spec.BASELINE_MODEL_KEY] is baseline
    assert c.exec_properties[spec.COMPARE_BASELINE_KEY] == 1
    assert c.exec_properties[spec.BASELINE_TOLERANCE_KEY] == 0.01
    plain = component.DPModelValidator(**channels, label_key="y", target=0.1, loss_bound=1.0)
    assert spec.BASELINE_MODEL_KEY not in plain.inputs
    assert plain.exec_properties.get(spec.COMPARE_BASELINE_KEY) is None
    for bad in ({"baseline_tolerance": -0.1}, {"baseline_eta": 1.5}):
        with pytest.raises(ValueError):
            component.DPModelValidator(**channels, baseline_model=baseline, label_key="y",
                                       target=0.1, loss_bound=1.0, **bad)
