"""The loss and the optimizer the DP Trainer takes from a module: stock Keras ones, rebuilt.

``model_fn`` hands back their configurations (JSON); the executor checks them against these
allow-lists and builds fresh objects from them, in its own process. Never a DP optimizer: the
DP Trainer clips and noises the gradients itself (``loop.py``).

TensorFlow is imported inside functions only.
"""
from __future__ import annotations

from typing import Any, Mapping

from sage_tfx.components.dp_trainer.config_checks import (ArchitectureError, check_object,
                                                          check_plain)

LOSSES = {
    # Keras loss class -> names a compiled model may carry as a string.
    "MeanSquaredError": ("mse", "mean_squared_error"),
    "MeanAbsoluteError": ("mae", "mean_absolute_error"),
    "MeanAbsolutePercentageError": ("mape", "mean_absolute_percentage_error"),
    "MeanSquaredLogarithmicError": ("msle", "mean_squared_logarithmic_error"),
    "Huber": ("huber", "huber_loss"),
    "LogCosh": ("log_cosh", "logcosh"),
    "BinaryCrossentropy": ("binary_crossentropy", "bce"),
    "BinaryFocalCrossentropy": ("binary_focal_crossentropy",),
    "CategoricalCrossentropy": ("categorical_crossentropy",),
    "SparseCategoricalCrossentropy": ("sparse_categorical_crossentropy",),
    "Poisson": ("poisson",),
    "Hinge": ("hinge",),
    "SquaredHinge": ("squared_hinge",),
    "KLDivergence": ("kl_divergence", "kld", "kullback_leibler_divergence"),
}
OPTIMIZERS = frozenset({"SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Nadam", "Adamax",
                        "Adadelta", "Ftrl", "Lion"})
SCHEDULES = frozenset({"ExponentialDecay", "PiecewiseConstantDecay", "PolynomialDecay",
                       "InverseTimeDecay", "CosineDecay", "CosineDecayRestarts"})


def check_loss(config: Any) -> dict:
    """A stock Keras loss configuration ({class_name, config}), from a Loss or a loss name.

    Raises:
      ArchitectureError: not a stock loss.
    """
    if isinstance(config, str):
        config = {"class_name": "function", "config": config}
    if not isinstance(config, dict):
        raise ArchitectureError(f"the loss must be a tf.keras.losses.Loss or a loss name, got "
                                f"{config!r}")
    name = config.get("class_name")
    if name == "function":  # a compiled model's loss given by name
        by_alias = {alias: cls for cls, aliases in LOSSES.items() for alias in aliases}
        fn = config.get("config")
        if fn not in by_alias:
            raise ArchitectureError(f"loss {fn!r} is not a stock Keras loss (allowed: "
                                    f"{sorted(by_alias)})")
        return {"class_name": by_alias[fn], "config": {}}
    if name not in LOSSES or config.get("registered_name") not in (None, name):
        raise ArchitectureError(f"loss {config.get('registered_name') or name!r} is not a stock "
                                f"Keras loss (allowed: {sorted(LOSSES)})")
    inner = {k: v for k, v in dict(config.get("config") or {}).items()
             if k not in ("reduction", "name", "fn")}
    for k, v in inner.items():
        check_plain(f"loss.{k}", v)
    return {"class_name": name, "config": inner}


def build_loss(config: Mapping[str, Any], *, reduction: str = "none") -> Any:
    """The Keras loss of a :func:`check_loss` configuration with the given reduction."""
    import tensorflow as tf
    cls = getattr(tf.keras.losses, config["class_name"])
    return cls(**dict(config["config"]), reduction=reduction)


def check_optimizer(config: Any) -> dict:
    """A stock Keras optimizer configuration (never a DP optimizer: the executor clips and
    noises), with a constant learning rate or a stock schedule.

    Raises:
      ArchitectureError: anything else.
    """
    if isinstance(config, str):
        config = {"class_name": config, "config": {}}
    if not isinstance(config, dict):
        raise ArchitectureError(f"the optimizer must be a tf.keras.optimizers.Optimizer or a "
                                f"name, got {config!r}")
    name = config.get("class_name")
    if isinstance(name, str) and name.lower() in {o.lower() for o in OPTIMIZERS}:
        name = next(o for o in OPTIMIZERS if o.lower() == name.lower())
    if name not in OPTIMIZERS or config.get("registered_name") not in (None, name):
        raise ArchitectureError(
            f"optimizer {config.get('registered_name') or name!r} is not a stock Keras optimizer "
            f"(allowed: {sorted(OPTIMIZERS)}); never a DP optimizer: the DP Trainer clips and "
            "noises the gradients itself")
    inner = dict(config.get("config") or {})
    if inner.get("is_legacy_optimizer"):
        raise ArchitectureError("legacy Keras optimizers are not supported; use "
                                "tf.keras.optimizers.<name>")
    out = {}
    for k, v in inner.items():
        if k == "learning_rate" and isinstance(v, dict):
            check_object("optimizer.learning_rate", v, SCHEDULES, "learning-rate schedule")
        else:
            check_plain(f"optimizer.{k}", v)
        out[k] = v
    return {"class_name": name, "config": out}


def build_optimizer(config: Mapping[str, Any]) -> Any:
    """A fresh Keras optimizer of a :func:`check_optimizer` configuration."""
    import tensorflow as tf
    inner = dict(config["config"])
    lr = inner.get("learning_rate")
    if isinstance(lr, dict):
        inner["learning_rate"] = getattr(tf.keras.optimizers.schedules,
                                         lr["class_name"]).from_config(lr.get("config") or {})
    return getattr(tf.keras.optimizers, config["class_name"]).from_config(inner)
