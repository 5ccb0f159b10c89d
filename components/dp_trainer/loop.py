"""The DP Trainer's DP-SGD loop over Poisson batches streamed from disk (Abadi et al. 2016).

One step of the T the plan accounts: the step's examples (any number, possibly none; more than B
only under the ``spill`` policy, then in chunks of at most B), each example's gradient clipped
to L2 norm C, the clipped gradients summed over the step (its chunks included), one draw of
N(0, (σC)²) per coordinate added, the sum divided by the *expected* batch size q·n (never the
realised size, which would leak it), then one optimizer update. Gradients of weight
regularizers (data-independent) are added without noise.

When every trainable layer is a Dense layer on rank-2 inputs (MLPs, wide-and-deep models over
feature columns), the clipped sum takes one forward and one backward pass ("book-keeping",
Bu et al. 2023: :meth:`DPSGDLoop._one_pass_sum`). Otherwise per-example gradient norms come
from TensorFlow Privacy's fast ("ghost") clipping
(``clip_grads.compute_gradient_norms``) when every trainable layer is in the layer registry —
TF Privacy's registry functions for Dense, Embedding, EinsumDense, LayerNormalization and
MultiHeadAttention — and otherwise from vectorised per-example gradients (``tape.jacobian``
with pfor: slower, the same clipping). Either way the clipped sum is the gradient of
Σᵢ cᵢ·ℓᵢ with cᵢ = C / max(C, ‖gᵢ‖) held constant.

The loop counts what ran inside the traced update (:class:`NoiseRecord`: noisy updates, the
smallest and largest noise std); the executor verifies T updates at σ·C, each step id exactly
once. Nothing is logged but progress (steps done): training losses on private batches are not
DP.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Optional

import numpy as np
import tensorflow as tf
from absl import logging

from sage_tfx.components.dp_trainer import architecture as arch
from sage_tfx.components.dp_trainer import batching, objectives
from sage_tfx.components.dp_trainer.guarantee import UnverifiedTrainingError


def layer_registry() -> Any:
    """TF Privacy's fast-clipping registry with every registry function 0.9 ships."""
    import sys
    had = hasattr(sys, "skip_tf_privacy_import")
    sys.skip_tf_privacy_import = True  # type: ignore[attr-defined]
    try:
        from tensorflow_privacy.privacy.fast_gradient_clipping import layer_registry as lr
        from tensorflow_privacy.privacy.fast_gradient_clipping.registry_functions import (
            einsum_dense, layer_normalization, multi_head_attention)
    finally:
        if not had:
            del sys.skip_tf_privacy_import  # type: ignore[attr-defined]
    registry = lr.make_default_layer_registry()
    registry.insert(tf.keras.layers.EinsumDense, einsum_dense.einsum_layer_computation)
    registry.insert(tf.keras.layers.LayerNormalization,
                    layer_normalization.layer_normalization_computation)
    registry.insert(tf.keras.layers.MultiHeadAttention,
                    multi_head_attention.multi_head_attention_layer_computation)
    return registry


def _clip_grads():
    import sys
    had = hasattr(sys, "skip_tf_privacy_import")
    sys.skip_tf_privacy_import = True  # type: ignore[attr-defined]
    try:
        from tensorflow_privacy.privacy.fast_gradient_clipping import (clip_grads,
                                                                        gradient_clipping_utils)
    finally:
        if not had:
            del sys.skip_tf_privacy_import  # type: ignore[attr-defined]
    return clip_grads, gradient_clipping_utils


def one_pass_layers(model: Any) -> bool:
    """Whether every trainable layer of ``model`` is a Dense layer on a rank-2 input (and
    nothing trainable hides in a nested model): the one-pass clipped sum applies."""
    found = False
    for layer in model.layers:
        if not layer.trainable_variables:
            continue
        if type(layer) is not tf.keras.layers.Dense or getattr(layer, "_inbound_nodes", None) \
                is None or len(layer._inbound_nodes) != 1:  # pylint: disable=protected-access
            return False
        shape = layer.input_shape
        if not (isinstance(shape, tuple) and len(shape) == 2):
            return False
        found = True
    return found


class NoiseRecord(tf.Module):
    """How many noisy updates ran, and the smallest / largest noise std they added."""

    def __init__(self) -> None:
        super().__init__(name="dp_noise_record")
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.min_stddev = tf.Variable(np.inf, dtype=tf.float64, trainable=False)
        self.max_stddev = tf.Variable(0.0, dtype=tf.float64, trainable=False)

    def count(self, stddev: Any) -> None:
        stddev = tf.cast(stddev, tf.float64)
        self.updates.assign_add(1)
        self.min_stddev.assign(tf.minimum(self.min_stddev, stddev))
        self.max_stddev.assign(tf.maximum(self.max_stddev, stddev))

    def read(self) -> tuple[int, float, float]:
        n = int(self.updates.numpy())
        if n == 0:
            return 0, 0.0, 0.0
        return n, float(self.min_stddev.numpy()), float(self.max_stddev.numpy())


def _dense_first(t: Any, dtype: tf.DType) -> Any:
    """A [m] tensor of each row's first value (0 / '' when absent) of a sparse feature."""
    if isinstance(t, tf.SparseTensor):
        rows = tf.cast(t.dense_shape[0], tf.int64)
        first = tf.sparse.reset_shape(
            tf.sparse.slice(t, [0, 0], tf.stack([rows, 1])), tf.stack([rows, 1]))
        t = tf.sparse.to_dense(first)[:, 0]
    return tf.cast(t, dtype) if t.dtype != dtype and dtype != tf.string else t


class ExampleParser:
    """Serialized tf.Examples → (model inputs, labels) with the examples' feature spec.

    Args:
      feature_spec: {feature: tf.io.FixedLenFeature / VarLenFeature} of the training examples
        (the transform's transformed feature spec, or the schema's).
      inputs: {model input: dtype name} (``Architecture.inputs``).
      label_key: The label feature (float32 labels; None for a parser of inputs only).
      label_bounds: Public (lo, hi): labels are clipped to them and divided by max(|lo|, |hi|).
    """

    def __init__(self, feature_spec: Mapping[str, Any], inputs: Mapping[str, str],
                 label_key: Optional[str], label_bounds: Optional[tuple] = None):
        names = list(inputs) + ([label_key] if label_key else [])
        missing = [n for n in names if n not in feature_spec]
        if missing:
            raise arch.ArchitectureError(f"features {missing} are not in the examples' feature "
                                         f"spec ({sorted(feature_spec)})")
        self.spec = {n: feature_spec[n] for n in names}
        self.dtypes = {n: tf.as_dtype(d) for n, d in inputs.items()}
        self.label_key = label_key
        self.label_bounds = None if label_bounds is None else tuple(map(float, label_bounds))

    def features(self, parsed: Mapping[str, Any]) -> dict:
        return {n: _dense_first(parsed[n], d) for n, d in self.dtypes.items()}

    def __call__(self, serialized: Any) -> tuple[dict, Any]:
        parsed = tf.io.parse_example(serialized, self.spec)
        labels = tf.cast(_dense_first(parsed[self.label_key], tf.float32), tf.float32)
        if self.label_bounds is not None:
            lo, hi = self.label_bounds
            labels = tf.clip_by_value(labels, lo, hi) / max(abs(lo), abs(hi))
        return self.features(parsed), labels


class DPSGDLoop:
    """DP-SGD updates of ``model`` (module doc): one :meth:`step` per accounted step.

    Args:
      model: The rebuilt Keras model (fresh weights).
      loss: A :func:`objectives.check_loss` configuration.
      optimizer: A Keras optimizer (never a DP one).
      l2_norm_clip: C.
      noise_multiplier: σ (noise std / C on the clipped sum).
      expected_batch_size: q·n, the divisor of the noisy sum.
      max_batch_size: B: examples per clipping pass (a spilled step runs several).
    """

    def __init__(self, model: Any, *, loss: Mapping[str, Any], optimizer: Any,
                 l2_norm_clip: float, noise_multiplier: float, expected_batch_size: float,
                 max_batch_size: int):
        self.model = model
        self.per_example = objectives.build_loss(loss, reduction="none")
        self.optimizer = optimizer
        self.clip = float(l2_norm_clip)
        self.sigma = float(noise_multiplier)
        self.expected = float(expected_batch_size)
        self.max_batch = int(max_batch_size)
        self.registry = layer_registry()
        clip_grads, utils = _clip_grads()
        self._clip_grads = clip_grads
        self._utils = utils
        self.fast = utils.all_trainable_layers_are_registered(model, self.registry)
        self.one_pass = one_pass_layers(model)
        self.record = NoiseRecord()
        self._noise = tf.random.Generator.from_non_deterministic_state()
        self._vars = list(model.trainable_variables)
        if not self._vars:
            raise arch.ArchitectureError("the model has no trainable weights")
        optimizer.build(self._vars)
        self._segment = tf.function(self._segment, reduce_retracing=True)

    def _losses(self, y: Any, p: Any) -> Any:
        """[m] per-example losses: a rank-1 output (or label) is a column."""
        p = tf.cast(p, tf.float32)
        if p.shape.rank == 1:
            p = p[:, None]
        if y.shape.rank == 1 and p.shape[-1] == 1:
            y = y[:, None]
        return tf.reshape(self.per_example(y, p), [-1])

    def _norms(self, x: Any, y: Any) -> Any:
        if self.fast:
            return self._clip_grads.compute_gradient_norms(
                self.model, self.registry, x, y,
                per_example_loss_fn=lambda yt, yp, w: self._losses(yt, yp),
                trainable_vars=self._vars)
        with tf.GradientTape() as tape:
            losses = self._losses(y, self.model(x, training=True))
        jac = tape.jacobian(losses, self._vars, experimental_use_pfor=True,
                            unconnected_gradients=tf.UnconnectedGradients.ZERO)
        m = tf.shape(losses)[0]
        squares = [tf.reduce_sum(tf.reshape(tf.square(tf.convert_to_tensor(j)), [m, -1]), axis=1)
                   for j in jac]
        return tf.sqrt(tf.add_n(squares))

    def _clipped_sum(self, x: Any, y: Any) -> list:
        """Σ over the rows of their gradients, each clipped to norm C."""
        if self.one_pass:
            return self._one_pass_sum(x, y)
        norms = self._norms(x, y)
        weights = tf.stop_gradient(self.clip / tf.maximum(self.clip, norms))
        with tf.GradientTape() as tape:
            losses = self._losses(y, self.model(x, training=True))
            total = tf.reduce_sum(weights * losses)
        grads = tape.gradient(total, self._vars,
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return [tf.convert_to_tensor(g) for g in grads]

    def _one_pass_sum(self, x: Any, y: Any) -> list:
        """The clipped sum from one forward and one backward pass (all trainable layers Dense
        on rank-2 inputs; Bu et al., "Differentially private optimization on large model at
        small cost", ICML 2023, "book-keeping"): with aᵢ a Dense layer's input row and gᵢ the
        gradient of ℓᵢ at its pre-activation output, example i's kernel gradient is aᵢgᵢᵀ, so
        ‖∇ᵢ‖² = Σ_layers ‖aᵢ‖²‖gᵢ‖² (+ ‖gᵢ‖² for the bias), and Σᵢ cᵢ∇ᵢ = Aᵀ(c ⊙ G) — the
        clipped sum without the second backward pass of ghost clipping."""
        records: list = []
        tape = tf.GradientTape(watch_accessed_variables=False)

        def forward(layer, args, kwargs):
            if not layer.trainable_variables:
                return layer(*args, **kwargs), None
            a = tf.cast(args[0], layer.kernel.dtype)
            z = tf.matmul(a, layer.kernel)
            tape.watch(z)
            out = z + layer.bias if layer.use_bias else z
            records.append((layer, a, z))
            return layer.activation(out), None

        with tape:
            outputs, _ = self._utils.model_forward_pass(self.model, x, generator_fn=forward)
            total = tf.reduce_sum(self._losses(y, outputs))
        grads_z = tape.gradient(total, [z for _, _, z in records],
                                unconnected_gradients=tf.UnconnectedGradients.ZERO)
        squares = []
        for (layer, a, _), g in zip(records, grads_z):
            g2 = tf.reduce_sum(tf.square(g), axis=1)
            squares.append(tf.reduce_sum(tf.square(a), axis=1) * g2)
            if layer.use_bias:
                squares.append(g2)
        norms = tf.sqrt(tf.add_n(squares))
        c = tf.stop_gradient(self.clip / tf.maximum(self.clip, norms))
        by_var = {}
        for (layer, a, _), g in zip(records, grads_z):
            cg = g * c[:, None]
            by_var[layer.kernel.ref()] = tf.matmul(a, cg, transpose_a=True)
            if layer.use_bias:
                by_var[layer.bias.ref()] = tf.reduce_sum(cg, axis=0)
        return [by_var.get(v.ref(), tf.zeros_like(v)) for v in self._vars]

    def _noisy_update(self, summed: list) -> None:
        std = tf.constant(self.clip * self.sigma, summed[0].dtype)
        self.record.count(std)
        noisy = [(g + self._noise.normal(tf.shape(g), stddev=std, dtype=g.dtype)) / self.expected
                 for g in summed]
        if self.model.losses:  # weight regularizers: data-independent, added without noise
            with tf.GradientTape() as tape:
                regularization = tf.add_n(self.model.losses)
            noisy = [a + tf.convert_to_tensor(b) for a, b in zip(noisy, tape.gradient(
                regularization, self._vars, unconnected_gradients=tf.UnconnectedGradients.ZERO))]
        self.optimizer.apply_gradients(zip(noisy, self._vars))

    def _step_sum(self, features: Mapping[str, Any], labels: Any) -> list:
        """The step's clipped sum over its examples, in chunks of at most B (traced)."""
        m = tf.shape(labels)[0]
        summed = [tf.zeros_like(v) for v in self._vars]
        for start in tf.range(0, m, self.max_batch):  # no iteration: a noise-only step
            stop = tf.minimum(m, start + self.max_batch)
            part = self._clipped_sum({k: v[start:stop] for k, v in features.items()},
                                     labels[start:stop])
            summed = [a + b for a, b in zip(summed, part)]
        return summed

    def _segment(self, iterator: Any, count: Any) -> Any:
        """Up to ``count`` steps from ``iterator`` in one traced loop; the step ids it ran."""
        ids = tf.TensorArray(tf.int64, size=0, dynamic_size=True)
        for i in tf.range(count):
            batch = iterator.get_next_as_optional()
            if not batch.has_value():
                break
            step, features, labels = batch.get_value()
            self._noisy_update(self._step_sum(features, labels))
            ids = ids.write(i, step)
        return ids.stack()

    def train(self, batches_dir: str, parser: ExampleParser, steps: int, *,
              progress: Optional[Callable[[int, int, float], None]] = None) -> set:
        """Runs every step written in ``batches_dir``; returns the step ids seen.

        The steps run in about twenty segments, each one traced loop (as Keras's ``fit`` runs
        ``steps_per_execution`` steps per call), with a progress call between segments.

        Raises:
          UnverifiedTrainingError: a step id twice (the batches are not the accounted ones).
        """
        seen: set = set()
        dataset = batching.read_batches(batches_dir).map(
            lambda step, examples: (step, *parser(examples)), num_parallel_calls=2).prefetch(2)
        iterator = iter(dataset)
        start = time.monotonic()
        every = tf.constant(max(1, -(-steps // 20)))
        done = 0
        while True:
            ran = [int(t) for t in self._segment(iterator, every).numpy()]
            if not ran:
                break
            for t in ran:
                if t in seen:
                    raise UnverifiedTrainingError(f"the batches hold step {t} twice")
                seen.add(t)
            done += len(ran)
            if progress is not None:
                progress(done, steps, time.monotonic() - start)
        return seen


def log_progress(done: int, total: int, seconds: float) -> None:
    """The loop's progress line (no loss: training metrics of private batches are not DP)."""
    rate = done / seconds if seconds > 0 else float("inf")
    logging.info("DPTrainer: DP-SGD step %d/%d (%.1f s, %.1f steps/s)", done, total, seconds,
                 rate)
