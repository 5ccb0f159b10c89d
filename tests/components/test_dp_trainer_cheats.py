"""Trainer modules written to defeat the DP Trainer's checks publish nothing but a DP model.

Each module here tries one way to put something else than DP-trained weights into the
published Model — the rows themselves, a model fitted without DP, a constant computed from the
data — and fails: its ``model_fn`` runs in a process that cannot read the data, open a TCP
connection or see the ledger's settings (Landlock, ``sandbox.py``); only the architecture's
JSON leaves that process, checked against stock-Keras allow-lists and rebuilt with fresh
weights; the executor writes the export and checks every file, variable and constant of it.
(The allow-lists themselves: ``test_dp_trainer_architecture.py``.)
"""
import os
import socket
import threading

import numpy as np
import pytest

from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
from sage_tfx.components.dp_trainer import sandbox
from trainerdata import (WIDE_AND_DEEP, examples_artifact, flights, grant_artifact,  # noqa: F401
                         mods, published, train, write_module)

pytestmark = pytest.mark.slow
needs_landlock = pytest.mark.skipif(sandbox.landlock_abi() < 4,
                                    reason="needs Landlock ABI >= 4 (Linux >= 6.7)")

PLAN = PrivacyPlan.of(PlanPart("transform", 0.5), PlanPart("train", 2.0, 1e-5))


@pytest.fixture
def world(mods, tmp_path, flights):
    graph, examples, rows = flights
    grant, released = grant_artifact(mods, tmp_path, PLAN, transform_graph=graph)
    return dict(grant=grant, released=released, examples=examples, rows=rows)


def _run(mods, tmp_path, world, body, config=None):
    return train(mods, tmp_path, grant=world["grant"],
                 examples=examples_artifact(world["examples"]),
                 module_file=write_module(tmp_path, body), transform_graph=world["released"],
                 config=config)


def _nothing_published(tmp_path, world):
    from sage_tfx.ledger import open_ledger
    assert published(tmp_path / "model") == []
    with open_ledger(world["grant"].ledger_url) as ledger:
        names = {r.name for r in ledger.releases(world["grant"].grant_id)}
    assert names == {"transform/transform_graph"}   # no model, not even the train part's claim


# A module that would publish a model fitted without DP: it reads the training examples itself.
READS_THE_DATA = '''
import glob
def model_fn(fn_args):
    rows = []
    for path in glob.glob(fn_args.custom_config["data"] + "/*/*"):
        with open(path, "rb") as f:                   # the transformed training examples
            rows.append(f.read())
    raise AssertionError(f"read {len(rows)} files of training data")
'''


@needs_landlock
def test_a_module_cannot_read_the_training_data(mods, tmp_path, world):
    from sage_tfx.components.dp_trainer.model_fn_runner import ModelFnError
    with pytest.raises(ModelFnError, match="PermissionError|read 0 files"):
        _run(mods, tmp_path, world, READS_THE_DATA, config={"data": world["examples"]})
    _nothing_published(tmp_path, world)


@needs_landlock
def test_a_module_cannot_write_into_the_transform_graph_or_reach_the_network(
        mods, tmp_path, world):
    """The extra-asset cheat (rows written where the export picks up assets) and a network
    exfiltration both fail in model_fn's process; it holds no ledger or key settings."""
    from sage_tfx.components.dp_trainer.model_fn_runner import ModelFnError
    assets = os.path.join(world["released"].uri, "transform_fn", "assets")
    with pytest.raises(ModelFnError, match="PermissionError"):
        _run(mods, tmp_path, world, f'''
            def model_fn(fn_args):
                with open({os.path.join(assets, "train_rows.json")!r}, "w") as f:
                    f.write("[1, 2, 3]")
            ''')
    assert "train_rows.json" not in os.listdir(assets)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    threading.Thread(target=lambda: server.accept(), daemon=True).start()
    port = server.getsockname()[1]
    os.environ["SAGE_LEDGER_URL"] = "postgresql://etl:secret@db/ledger"
    try:
        with pytest.raises(ModelFnError, match="PermissionError.*env: none"):
            _run(mods, tmp_path, world, f'''
                import os, socket
                def model_fn(fn_args):
                    env = os.environ.get("SAGE_LEDGER_URL") or "none"
                    try:
                        socket.create_connection(("127.0.0.1", {port}), timeout=5)
                    except OSError as e:
                        raise PermissionError(f"{{e}} (env: {{env}})")
                    raise AssertionError(f"connected (env: {{env}})")
                ''')
    finally:
        del os.environ["SAGE_LEDGER_URL"]
        server.close()
    _nothing_published(tmp_path, world)


def test_a_module_that_hides_weights_in_the_architecture_publishes_nothing(
        mods, tmp_path, world):
    """Weights handed to the module by any means (here: the custom_config) and held as a
    constant of the architecture — a Lambda, a constant in a tf op — are refused before any
    data is read; set on a frozen layer, they are dropped (the model is rebuilt fresh)."""
    from sage_tfx.components.dp_trainer.architecture import ArchitectureError
    plain = np.linspace(-1, 1, 80).astype(np.float32).tolist()
    for shadow in ("tf.keras.layers.Lambda(lambda x: x * PLAIN[:2])(x)",
                   "tf.concat([x] * 40, axis=1) + tf.constant(PLAIN)"):
        with pytest.raises(ArchitectureError, match="Lambda|more than 64 numbers"):
            _run(mods, tmp_path, world, f'''
                def model_fn(fn_args):
                    PLAIN = tf.constant(fn_args.custom_config["plain"])
                    inp = inputs()
                    x = tf.stack([inp["distance_scaled"], inp["dep_delay_h"]], axis=1)
                    x = {shadow}
                    model = tf.keras.Model(inp, tf.keras.layers.Dense(1)(x))
                    return DPSGDSpec(model=model, label_key="arr_delay_scaled",
                                     loss="mse", batch_size=40, epochs=1)
                ''', config={"plain": plain})
        _nothing_published(tmp_path, world)
    frozen = _run(mods, tmp_path, world, '''
        def model_fn(fn_args):
            inp = inputs()
            x = tf.stack([inp["distance_scaled"], inp["dep_delay_h"]], axis=1)
            shadow = tf.keras.layers.Dense(40, trainable=False)
            out = tf.keras.layers.Dense(1)(shadow(x))
            model = tf.keras.Model(inp, out)
            shadow.set_weights([np.reshape(fn_args.custom_config["plain"], (2, 40)),
                                np.zeros(40)])
            return DPSGDSpec(model=model, label_key="arr_delay_scaled", loss="mse",
                             raw_label_keys=["arr_delay"], batch_size=40, epochs=1)
        ''', config={"plain": plain})
    from sage_tfx.components.dp_trainer.export import checkpoint_values
    exported = checkpoint_values(os.path.join(frozen.uri, "Format-Serving"))
    target = np.reshape(plain, (2, 40)).astype(np.float32)
    assert exported and not any(v.shape == target.shape and np.allclose(v, target)
                                for v in exported.values())


def test_a_module_cannot_declare_output_constants(mods, tmp_path, world):
    """Output scale and offset are the pipeline's declaration (checked finite), never the
    module's: a DPSGDSpec has no such field."""
    from sage_tfx.components.dp_trainer.model_fn_runner import ModelFnError
    with pytest.raises(ModelFnError, match="output_scale"):
        _run(mods, tmp_path, world, '''
            def model_fn(fn_args):
                inp = inputs()
                return DPSGDSpec(model=tf.keras.Model(inp, wide_and_deep(inp)),
                                 label_key="arr_delay_scaled", loss="mse", output_scale=37.5)
            ''')
    _nothing_published(tmp_path, world)


# --- the export check, on exports an executor bug (or a patched executor) could write ---------


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    import tensorflow as tf
    from sage_tfx.components.dp_trainer import export as export_lib
    root = tmp_path_factory.mktemp("export")
    inp = {"a": tf.keras.Input(shape=(), name="a"), "b": tf.keras.Input(shape=(), name="b")}
    frozen = tf.keras.layers.Dense(2, trainable=False)
    model = tf.keras.Model(inp, tf.keras.layers.Dense(1)(frozen(tf.stack([inp["a"], inp["b"]],
                                                                          axis=1))))
    fresh = [w.numpy() for w in model.non_trainable_weights]
    spec = {"a": tf.io.FixedLenFeature([], tf.float32), "b": tf.io.FixedLenFeature([], tf.float32)}
    return export_lib, model, fresh, spec, root


def _save(export, name, change=None):
    export_lib, model, fresh, spec, root = export
    out = str(root / name)
    if change:
        change(model)
    export_lib.save_serving_model(model, out, inputs={"a": "float32", "b": "float32"},
                                  raw_spec=spec, transform_output=None)
    return out, [w.numpy() for w in model.trainable_weights]


def test_the_export_check_refuses_anything_but_the_dp_model(export):
    from sage_tfx.components.dp_trainer.guarantee import UnverifiedTrainingError
    export_lib, model, fresh, _, _ = export
    out, trained = _save(export, "ok")
    export_lib.check_export(out, trained=trained, fresh=fresh, transform_output=None)
    with open(os.path.join(out, "assets.extra.json"), "w") as f:   # an extra file
        f.write("[]")
    with pytest.raises(UnverifiedTrainingError, match="assets.extra.json"):
        export_lib.check_export(out, trained=trained, fresh=fresh, transform_output=None)
    os.makedirs(os.path.join(out, "assets"), exist_ok=True)
    os.replace(os.path.join(out, "assets.extra.json"), os.path.join(out, "assets", "rows.json"))
    with pytest.raises(UnverifiedTrainingError, match="not one of the DP transform"):
        export_lib.check_export(out, trained=trained, fresh=fresh, transform_output=None)
    os.remove(os.path.join(out, "assets", "rows.json"))
    # a non-trainable weight that is not its fresh value (set from data, say)
    out2, trained2 = _save(export, "frozen", lambda m: m.non_trainable_weights[0].assign(
        np.full(m.non_trainable_weights[0].shape, 0.25, np.float32)))
    with pytest.raises(UnverifiedTrainingError, match="neither a DP-trained weight"):
        export_lib.check_export(out2, trained=trained2, fresh=fresh, transform_output=None)
    # trained weights that are not those of the export (another model exported)
    with pytest.raises(UnverifiedTrainingError, match="neither a DP-trained|lacks"):
        export_lib.check_export(out, trained=[t + 1 for t in trained], fresh=fresh,
                                transform_output=None)


def test_the_export_check_refuses_a_weight_held_as_a_constant(export, tmp_path):
    """A serving function computing x @ W_plain with W_plain a graph constant (the
    shadow-constant cheat, were it ever written into an export)."""
    import tensorflow as tf
    from sage_tfx.components.dp_trainer.guarantee import UnverifiedTrainingError
    export_lib, model, fresh, _, _ = export
    w_plain = tf.constant(np.linspace(-1, 1, 200).reshape(2, 100).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32)])
    def shadow(x):
        return {"predictions": tf.reduce_sum(tf.matmul(x, w_plain), axis=1, keepdims=True)}
    out = str(tmp_path / "shadow")
    model.save(out, save_format="tf", signatures={"serving_default": shadow},
               include_optimizer=False)
    with pytest.raises(UnverifiedTrainingError, match="constant of shape"):
        export_lib.check_export(out, trained=[w.numpy() for w in model.trainable_weights],
                                fresh=[w.numpy() for w in model.non_trainable_weights],
                                transform_output=None)
