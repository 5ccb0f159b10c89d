"""DPTrainer owns the privacy loop (issue 23): a run_fn that trains by itself — plain Keras with an
honest-looking report, a DP algorithm called directly — trains twice, exports another model or
the private model's training state is refused, and its model is not published.

Executor runs on the generated flights Examples of ``trainerdata.py``; each run_fn is a module
file written here. (DPModelValidator's refusal of a model without the trainer's record is in
``test_dp_validator.py``.)
"""
import math
import os

import pytest

from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
from sage_tfx.components.dp_trainer import guarantee as g
from trainerdata import (examples_artifact, flights, grant_artifact, labeled,  # noqa: F401
                         mods, train)

pytestmark = pytest.mark.slow

_MODULE = '''
import numpy as np
import tensorflow as tf

from sage_tfx.components.dp_trainer import run_fn_utils as dp
from sage_tfx.dp import adassp, keras_dpsgd


def run_fn(fn_args):
    columns = dp.columns_from_config({{"distance": {{"min": 0, "max": 5000}},
                                      "hour": {{"min": 0, "max": 24}},
                                      "dep_delay": {{"min": -60, "max": 300}}}})
    data = dp.read_split(fn_args, "train", columns, label_key="arr_delay")
    keep = ~np.isnan(data.labels)
    x, y = data.features[keep], (np.clip(data.labels[keep], -60, 300) / 300).astype(np.float32)
    n = len(x)

    def private():
        return dp.private_training(fn_args).dpsgd(
            lambda: keras_dpsgd.mlp_layers((), 1), x, y, loss=tf.keras.losses.MeanSquaredError(),
            batch_size=30, epochs=2, l2_norm_clip=1.0)

{body}
'''

def _steps(rows):
    """The DP-SGD steps of ``private()`` below: batch 30, 2 epochs over the labeled rows."""
    return math.ceil(2 * labeled(rows["train"]) / 30)


_CHEATS = {
    # Plain Keras, no DP at all, with the report the plan's DP-SGD run would have written.
    "plain_keras": '''
    _, run = dp.dpsgd_noise_for(fn_args, n, batch_size=30, epochs=2, l2_norm_clip=1.0)
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=30, epochs=2, verbose=0)
    dp.export_serving_model(fn_args, model, columns, kinds=data.kinds)
    dp.report_guarantee(fn_args, run, trained_steps=run.steps)
''',
    # AdaSSP called directly at the part's (ε, δ): DP, but not run (nor observed) by the executor.
    "dp_algorithm_called_directly": '''
    part = dp.train_part(fn_args)
    result = adassp.adassp(x, y, epsilon=part.epsilon, delta=part.delta, x_bound=3 ** 0.5,
                           y_bound=1.0)
    model = dp.linear_keras_model(result.weights)
    dp.export_serving_model(fn_args, model, columns, kinds=data.kinds)
    dp.report_guarantee(fn_args, result, num_examples=n)
''',
    # The private model, then a second fit: twice the accounted noisy steps.
    "trained_twice": '''
    model = private()
    model.fit(keras_dpsgd.poisson_batches(x, y[:, None], 0.1, 5), verbose=0)
    dp.export_serving_model(fn_args, model, columns, kinds=data.kinds)
''',
    # The private model is trained, but a plain one is exported.
    "exported_another": '''
    private()
    plain = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    plain.compile(optimizer="sgd", loss="mse")
    plain.fit(x, y, epochs=1, verbose=0)
    dp.export_serving_model(fn_args, plain, columns, kinds=data.kinds)
''',
    # The private model, fine-tuned without DP after the executor's loop.
    "fine_tuned_without_dp": '''
    model = private()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y[:, None]) ** 2)
    for v, grad in zip(model.trainable_variables, tape.gradient(loss, model.trainable_variables)):
        v.assign_sub(0.1 * grad)
    dp.export_serving_model(fn_args, model, columns, kinds=data.kinds)
''',
    # The private model saved as it is: with its noise generator's key and counter.
    "exported_with_the_noise_state": '''
    model = private()
    model.save(fn_args.serving_model_dir, save_format="tf")
''',
}


@pytest.mark.parametrize("cheat, error", [
    ("plain_keras", "no DP training ran through the executor"),
    ("dp_algorithm_called_directly", "no DP training ran through the executor"),
    ("trained_twice", "ran {twice} noisy DP-SGD steps but the plan accounts {once}"),
    ("exported_another", "not the model the executor's DP training produced"),
    ("fine_tuned_without_dp", "not the model the executor's DP training produced"),
    ("exported_with_the_noise_state", "carries the state of the DP noise generator"),
])
def test_a_model_trained_outside_the_privacy_loop_is_not_published(mods, tmp_path, flights,
                                                                   cheat, error):
    uri, rows = flights
    error = error.format(once=_steps(rows), twice=_steps(rows) + 5)
    module = tmp_path / f"{cheat}.py"
    module.write_text(_MODULE.format(body=_CHEATS[cheat]))
    grant = grant_artifact(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 1.0, 1e-6)))
    with pytest.raises(g.UnverifiedTrainingError, match=error):
        train(mods, tmp_path, grant=grant, examples=examples_artifact(uri),
              module_file=str(module))
    assert not os.path.exists(tmp_path / "model" / "Format-Serving")


def test_the_same_run_fn_through_the_loop_is_published(mods, tmp_path, flights):
    """The control: the module above, honest (one private training, exported unchanged), passes
    — so each refusal above is the cheat's, not the module's."""
    uri, rows = flights
    module = tmp_path / "honest.py"
    module.write_text(_MODULE.format(body='''
    dp.export_serving_model(fn_args, private(), columns, kinds=data.kinds)
'''))
    grant = grant_artifact(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 1.0, 1e-6)))
    model = train(mods, tmp_path, grant=grant, examples=examples_artifact(uri),
                  module_file=str(module))
    assert model.get_string_custom_property("dp_verification") == "observed"
    assert model.get_int_custom_property("dp_steps") == _steps(rows)
    assert os.path.exists(tmp_path / "model" / "Format-Serving" / "saved_model.pb")


def test_a_retried_trainer_publishes_the_recorded_model(mods, tmp_path, flights):
    """Release once: a re-execution under the same grant (a retried pod, another output uri)
    gets the first model byte for byte and its properties, without training; another request
    under the grant is refused and publishes nothing."""
    from sage_tfx.errors import ReleaseConflictError
    from sage_tfx.ledger import open_ledger, releases
    uri, rows = flights
    runs = tmp_path / "runs.txt"
    module = tmp_path / "counted.py"
    module.write_text(_MODULE.format(body=f'''
    with open({str(runs)!r}, "a") as f:
        f.write("ran\\n")
    dp.export_serving_model(fn_args, private(), columns, kinds=data.kinds)
'''))
    grant = grant_artifact(mods, tmp_path, PrivacyPlan.of(PlanPart("train", 1.0, 1e-6)))
    first = train(mods, tmp_path, grant=grant, examples=examples_artifact(uri),
                  module_file=str(module), name="model")
    again = train(mods, tmp_path, grant=grant, examples=examples_artifact(uri),
                  module_file=str(module), name="model-retry")
    assert runs.read_text() == "ran\n"
    assert first.get_int_custom_property("replayed") == 0
    assert again.get_int_custom_property("replayed") == 1
    assert releases.tree_digest(first.uri) == releases.tree_digest(again.uri)
    for key in ("dp_epsilon", "dp_steps", "grant_id", "dp_verification", "release_digest"):
        assert again.get_custom_property(key) == first.get_custom_property(key)
    with pytest.raises(ReleaseConflictError, match="train/model"):
        train(mods, tmp_path, grant=grant, examples=examples_artifact(uri),
              module_file=str(module), name="model-other", config={"lr": 0.5})
    assert runs.read_text() == "ran\n"
    assert not os.path.exists(tmp_path / "model-other" / "Format-Serving")
    url = grant.get_string_custom_property("ledger_url")
    with open_ledger(url) as ledger:
        g = artifacts_grant_id(grant)
        assert sorted(r.name for r in ledger.releases(g)) == ["part/train", "train/model"]
        assert ledger.check_consistency("flights") == []


def artifacts_grant_id(grant):
    import json
    with open(os.path.join(grant.uri, "grant.json")) as f:
        return json.load(f)["grant_id"]
