"""The DP Trainer's module contract: ``model_fn(fn_args)`` says what to train; it trains nothing.

A TFX Trainer module ends in ``run_fn(fn_args)``, which reads the data, trains and writes the
export. A DP Trainer module ends in ``model_fn(fn_args)`` instead, which only *describes* the
training; the executor reads the granted data, runs DP-SGD and writes the export itself::

    from sage_tfx.components.dp_trainer import DPSGDSpec

    def model_fn(fn_args):                       # DPTrainer calls this instead of run_fn
        model = _build_keras_model(hidden_units=[100, 70, 50, 25])   # the module's own builder
        return DPSGDSpec(model=model, label_key="tips_xf", raw_label_keys=["tips"],
                         batch_size=256, epochs=4, l2_norm_clip=1.0)

* ``model``: an (uncompiled or compiled) Keras model — functional with ``keras.Input`` layers
  named after the (transformed) features it reads, or Sequential starting with DenseFeatures.
  Only its architecture is used (``architecture.py``): the executor rebuilds it with fresh
  weights from its configuration, so nothing the module's objects hold reaches the export.
* ``loss`` / ``optimizer``: a stock Keras loss / optimizer (or a name); default: those the model
  was compiled with (SGD(0.01) if none).
* ``label_bounds`` (optional): public (lo, hi) of the label; it is clipped to them and divided
  by max(|lo|, |hi|) for training, and the served prediction is scaled back (as AdaSSP's).
* ``batch_size`` (expected examples per step), ``epochs``, ``l2_norm_clip``: DP-SGD's settings
  on a basic plan part (σ is calibrated to the part's (ε, δ) by ``accountant``, PLD by
  default); an rdp part's event fixes q, σ and the steps itself.
* ``oversize`` / ``max_batch_size`` / ``truncation_share``: how steps that sample more than B
  examples are handled (``sage_tfx.dp.poisson_batching``); defaults: truncation at a B whose
  truncation δ is at most 1 % of the part's δ (basic), spill (rdp).

:class:`AdaSSPSpec` asks for AdaSSP linear regression on bounded features instead.

``fn_args`` (:class:`ModelFnArgs`) carries the transform output, the schema and the
``custom_config`` — no data files: the module describes a model, it does not read the data.
``model_fn`` runs in a process of its own; only the JSON of its result reaches the executor.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional, Sequence

from sage_tfx.dp import dpsgd, poisson_batching
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError

MODEL_FN = "model_fn"   # the function DPTrainer calls (exec property key and default name)
DPSGD = "dpsgd"
ADASSP = "adassp"


@dataclasses.dataclass(frozen=True)
class ModelFnArgs:
    """What ``model_fn`` receives: public inputs only (no data files, no output paths).

    Attributes:
      transform_output: The DP Transform's graph directory (``tft.TFTransformOutput(...)``),
        or None without a transform graph.
      schema_path: The raw data schema (pbtxt), or None.
      custom_config: The DPTrainer's ``custom_config``.
    """

    transform_output: Optional[str]
    schema_path: Optional[str]
    custom_config: dict

    @property
    def transform_graph_path(self) -> Optional[str]:
        """TFX's other name of :attr:`transform_output`."""
        return self.transform_output


@dataclasses.dataclass(frozen=True)
class DPSGDSpec:
    """Train ``model`` with DP-SGD (see the module doc for every field)."""

    model: Any
    label_key: str
    loss: Any = None
    optimizer: Any = None
    batch_size: int = 256
    epochs: float = 1.0
    l2_norm_clip: float = 1.0
    raw_label_keys: Sequence[str] = ()
    label_bounds: Optional[Sequence[float]] = None
    accountant: str = dpsgd.DEFAULT_ACCOUNTANT
    oversize: Optional[str] = None
    max_batch_size: Optional[int] = None
    truncation_share: Optional[float] = None
    seed: Optional[int] = None   # the initial weights only; noise and sampling never


@dataclasses.dataclass(frozen=True)
class AdaSSPSpec:
    """Linear regression by AdaSSP (Wang 2018) on bounded features (Sage Tab. 1 LR).

    Attributes:
      features: {feature: (lo, hi)} public bounds; each value is clipped to its bounds and
        scaled to [0, 1], and an intercept column is added (so ‖x‖ ≤ √(d + 1)).
      label_key: The label feature; clipped to ``label_bounds`` and divided by
        max(|lo|, |hi|) for training; the served prediction is scaled back.
      label_bounds: Public (lo, hi) of the label.
      rho: AdaSSP's failure probability (default ``sage_tfx.dp.adassp.DEFAULT_RHO``).
    """

    features: Mapping[str, Sequence[float]]
    label_key: str
    label_bounds: Sequence[float]
    rho: Optional[float] = None
    raw_label_keys: Sequence[str] = ()


@dataclasses.dataclass(frozen=True)
class TrainingSpec:
    """What the executor takes from ``model_fn``, parsed and checked from its JSON.

    ``algorithm`` is ``dpsgd`` (architecture, loss, optimizer, DP-SGD settings) or ``adassp``
    (features with bounds, label bounds, rho). Every check raises before any data is read.
    """

    algorithm: str
    label_key: str
    raw_label_keys: tuple = ()
    architecture: Any = None           # architecture.Architecture (dpsgd)
    loss: Optional[dict] = None
    optimizer: Optional[dict] = None
    batch_size: Optional[int] = None
    epochs: Optional[float] = None
    l2_norm_clip: Optional[float] = None
    accountant: Optional[str] = None
    oversize: Optional[str] = None
    max_batch_size: Optional[int] = None
    truncation_share: Optional[float] = None
    seed: Optional[int] = None
    features: tuple = ()               # ((name, lo, hi), ...) (adassp)
    label_bounds: Optional[tuple] = None
    rho: Optional[float] = None

    def to_dict(self) -> dict:
        """JSON-able (recorded with the release: a replay must ask the same)."""
        out = dataclasses.asdict(self)
        out["architecture"] = (self.architecture.config if self.architecture is not None
                               else None)
        out["architecture_sha256"] = (self.architecture.digest if self.architecture is not None
                                      else None)
        return out


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"model_fn: {what} must be a feature name, got {value!r}")
    return value


def _positive(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise InvalidPrivacyParameterError(f"model_fn: {what} must be finite and > 0, got "
                                           f"{value!r}")
    return float(value)


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidPrivacyParameterError(f"model_fn: {what} must be an int >= 1, got "
                                           f"{value!r}")
    return int(value)


def _bounds(value: Any, what: str) -> tuple:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError) as e:
        raise InvalidPrivacyParameterError(f"model_fn: {what} must be (lo, hi), got "
                                           f"{value!r}") from e
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise InvalidPrivacyParameterError(f"model_fn: {what} must be finite with lo < hi, got "
                                           f"{value!r}")
    return lo, hi


def parse_training_spec(data: Any, *, features: Optional[Sequence[str]] = None) -> TrainingSpec:
    """The :class:`TrainingSpec` of the JSON ``model_fn_runner`` produced.

    Args:
      data: The runner's ``spec`` (a dict of JSON values).
      features: The features of the training examples (model inputs and the label must be).

    Raises:
      ArchitectureError, InvalidRequestError, InvalidPrivacyParameterError: anything the
        executor will not train.
    """
    from sage_tfx.components.dp_trainer import architecture as arch
    from sage_tfx.components.dp_trainer import objectives
    if not isinstance(data, dict):
        raise InvalidRequestError(f"model_fn's result is not an object: {data!r}")
    algorithm = data.get("algorithm")
    label_key = _name(data.get("label_key"), "label_key")
    if features is not None and label_key not in set(features):
        raise InvalidRequestError(
            f"model_fn: label_key {label_key!r} is not a feature of the training examples "
            f"(features: {sorted(features)})")
    raw_labels = tuple(_name(k, "raw_label_keys[]") for k in data.get("raw_label_keys") or ())
    if algorithm == ADASSP:
        feats = data.get("features")
        if not isinstance(feats, dict) or not feats:
            raise InvalidRequestError("model_fn: AdaSSPSpec.features must map features to "
                                      "(lo, hi) bounds")
        parsed = tuple((_name(k, "feature"), *_bounds(v, f"bounds of {k!r}"))
                       for k, v in sorted(feats.items()))
        if features is not None:
            missing = sorted({k for k, _, _ in parsed} - set(features))
            if missing:
                raise InvalidRequestError(f"model_fn: features {missing} are not in the "
                                          f"training examples (features: {sorted(features)})")
        rho = data.get("rho")
        if rho is not None and not (isinstance(rho, (int, float)) and not isinstance(rho, bool)
                                    and 0 < rho < 1):
            raise InvalidPrivacyParameterError(f"model_fn: rho must lie in (0, 1), got {rho!r}")
        return TrainingSpec(algorithm=ADASSP, label_key=label_key, raw_label_keys=raw_labels,
                            features=parsed,
                            label_bounds=_bounds(data.get("label_bounds"), "label_bounds"),
                            rho=None if rho is None else float(rho))
    if algorithm != DPSGD:
        raise InvalidRequestError(f"model_fn must return a DPSGDSpec or an AdaSSPSpec, got "
                                  f"algorithm {algorithm!r}")
    architecture = arch.check_model_json(data.get("model"), features=features)
    if label_key in architecture.inputs:
        raise InvalidRequestError(f"model_fn: the label {label_key!r} is also a model input")
    oversize = data.get("oversize")
    if oversize is not None:
        poisson_batching.check_oversize(oversize)
    max_batch = data.get("max_batch_size")
    share = data.get("truncation_share")
    if share is not None and not (isinstance(share, (int, float)) and not isinstance(share, bool)
                                  and 0 < share < 1):
        raise InvalidPrivacyParameterError(
            f"model_fn: truncation_share must lie in (0, 1), got {share!r}")
    return TrainingSpec(
        algorithm=DPSGD, label_key=label_key, raw_label_keys=raw_labels,
        architecture=architecture, loss=objectives.check_loss(data.get("loss")),
        optimizer=objectives.check_optimizer(data.get("optimizer") or "SGD"),
        label_bounds=(None if data.get("label_bounds") is None
                      else _bounds(data.get("label_bounds"), "label_bounds")),
        batch_size=_count(data.get("batch_size"), "batch_size"),
        epochs=_positive(data.get("epochs"), "epochs"),
        l2_norm_clip=_positive(data.get("l2_norm_clip"), "l2_norm_clip"),
        accountant=dpsgd.check_accountant(data.get("accountant") or dpsgd.DEFAULT_ACCOUNTANT),
        oversize=oversize, max_batch_size=None if max_batch is None else _count(
            max_batch, "max_batch_size"),
        truncation_share=None if share is None else float(share),
        seed=_seed(data.get("seed")))


def _seed(value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequestError(f"model_fn: seed must be an int >= 0 or None, got {value!r}")
    return int(value)


def spec_to_json(spec: Any) -> dict:
    """The JSON of a ``model_fn`` result (run in ``model_fn``'s own process).

    Raises:
      InvalidRequestError: not a DPSGDSpec / AdaSSPSpec, or objects Keras cannot serialize.
    """
    if isinstance(spec, AdaSSPSpec):
        return {"algorithm": ADASSP, "label_key": spec.label_key,
                "raw_label_keys": list(spec.raw_label_keys),
                "features": {str(k): [float(v) for v in b] for k, b in spec.features.items()},
                "label_bounds": [float(v) for v in spec.label_bounds], "rho": spec.rho}
    if not isinstance(spec, DPSGDSpec):
        raise InvalidRequestError(
            f"model_fn must return a DPSGDSpec or an AdaSSPSpec, got {type(spec).__name__}")
    import json

    import tensorflow as tf
    model = spec.model
    if not isinstance(model, tf.keras.Model):
        raise InvalidRequestError(f"DPSGDSpec.model must be a tf.keras.Model, got "
                                  f"{type(model).__name__}")
    loss = spec.loss if spec.loss is not None else getattr(model, "loss", None)
    optimizer = (spec.optimizer if spec.optimizer is not None
                 else getattr(model, "optimizer", None))
    return {"algorithm": DPSGD, "label_key": spec.label_key,
            "raw_label_keys": list(spec.raw_label_keys),
            "label_bounds": (None if spec.label_bounds is None
                             else [float(v) for v in spec.label_bounds]),
            "model": json.loads(model.to_json()), "loss": _serialize_loss(loss),
            "optimizer": _serialize_optimizer(optimizer), "batch_size": spec.batch_size,
            "epochs": spec.epochs, "l2_norm_clip": spec.l2_norm_clip,
            "accountant": spec.accountant, "oversize": spec.oversize, "seed": spec.seed,
            "max_batch_size": spec.max_batch_size, "truncation_share": spec.truncation_share}


def _serialize_loss(loss: Any) -> Any:
    import tensorflow as tf
    if loss is None:
        raise InvalidRequestError("DPSGDSpec needs a loss (or a model compiled with one)")
    if isinstance(loss, str):
        return loss
    if isinstance(loss, tf.keras.losses.Loss):
        return tf.keras.losses.serialize(loss)
    if callable(loss) and getattr(loss, "__name__", None):
        return loss.__name__
    raise InvalidRequestError(f"the loss must be a tf.keras.losses.Loss or a loss name, got "
                              f"{loss!r}")


def _serialize_optimizer(optimizer: Any) -> Any:
    import tensorflow as tf
    if optimizer is None or isinstance(optimizer, str):
        return optimizer
    if isinstance(optimizer, dict):
        return optimizer
    return tf.keras.optimizers.serialize(optimizer)
