"""DP-SGD for Keras models with TensorFlow Privacy's fast gradient clipping (Sage Tab. 1 NN / LG).

DP-SGD (Abadi et al., CCS 2016): clip each example's gradient to L2 norm ``l2_norm_clip`` (C), sum,
add ``N(0, (noise_multiplier · C)²)`` per coordinate, divide by the batch size, step. The models are
``DPSequential`` from TensorFlow Privacy 0.9, used with a plain Keras optimizer, and with
``layer_registry=make_default_layer_registry()`` so that per-example gradient norms come from the
"ghost norm" trick (Goodfellow 2015; Li et al. 2022) instead of materialized per-example gradients:
1.1–1.25x the non-private seconds per epoch for a 64-32-1 MLP, batch 256, on this 2-core machine
(``benchmarks/sage/bench_dpsgd.py``; per-example-gradient optimizers were 9–17x). With Poisson
sampling (below) and fixed-shape masked batches, the same benchmark measures 0.9–1.1x the
non-private CPU seconds per epoch (``benchmarks/results/audit/REPORT.md``): for a model this
small an epoch is dominated by per-step overhead, not by the clipping pass.

What TF Privacy 0.9 actually computes (read from ``dp_keras_model.py``, ``clip_grads.py`` and
``gradient_clipping_utils.add_aggregate_noise``), fast path, ``num_microbatches=None``:

1. per-example gradient norms ``‖gᵢ‖`` of the *unreduced* loss (trainable variables only);
2. weights ``cᵢ = C / max(C, ‖gᵢ‖)``; the gradient of the batch-mean of ``cᵢ·lossᵢ`` is
   ``(1/B) Σᵢ cᵢ gᵢ`` — the mean of clipped per-example gradients (B = actual batch size);
3. noise: for a mean-reduced loss (``SUM_OVER_BATCH_SIZE`` / ``AUTO``, Keras' default) each
   coordinate gets ``N(0, (noise_multiplier · C / B)²)``; for a ``SUM`` loss ``N(0, (σC)²)`` with
   no division. Both equal ``(Σᵢ clip(gᵢ) + N(0, σ²C²I)) / B`` resp. its B-multiple: the noise
   std on the *summed* clipped gradient is ``noise_multiplier · l2_norm_clip``;
4. gradients of ``model.losses`` (weight regularizers: data-independent) are added without noise;
   then ``optimizer.apply_gradients``. An SGD step with learning rate η therefore moves every
   weight by ``-η·(mean clipped gradient) + N(0, (η σ C / B)²)``.

``num_microbatches = k`` instead clips the *mean* gradient of each of k microbatches and adds noise
``σ·C/k`` to their mean. Adding or removing one example changes one microbatch mean by up to 2C,
so under add-or-remove adjacency the effective noise multiplier is ``σ/2`` — the reason TF
Privacy's ``compute_dp_sgd_privacy_statement(used_microbatching=True)`` halves it.
:func:`train_dp_keras` therefore always uses one example per microbatch (``None``).

Known limits (TF Privacy's, documented in its source): custom ``layer.add_loss()`` losses have no
privacy guarantee; the fast path needs every trainable layer in the registry (``Dense``,
``Embedding`` by default) and a loss whose unreduced form has shape ``[batch]``. Noise comes from
``tf.random.normal`` (floating-point Gaussian; Mironov 2012's attack is out of scope, as in every
TF Privacy model).

What :func:`train_dp_keras` runs (the in-memory DP-SGD of the Sage evaluation, the privacy
audits and the adaptive experiments; the DP Trainer component has its own loop over Poisson
batches built in Beam, ``components/dp_trainer/loop.py``, with the same accounting) is
:func:`make_poisson_dp_model`: the same
fast clipping, but every example joins every step independently with probability q
(:func:`poisson_batches`: the sampled rows of a step, padded to one fixed shape and masked), the
noise (``tf.random.Generator`` from OS entropy) is added to the clipped *sum* of the sampled rows
and the result divided by the *expected* batch size q·n — exactly the
``PoissonSampledDpEvent`` of :func:`sage_tfx.dp.dpsgd.dpsgd_event`. ``make_dp_keras_model``
(shuffled fixed-size batches, realised batch size) remains for experiments that compare the two.

TensorFlow is imported inside functions only: importing this module costs nothing.
"""
from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np

from sage_tfx.dp import dpsgd
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.ledger.accounting import check_positive

LayersSpec = Any  # Sequence[tf.keras.layers.Layer] | Callable[[], Sequence[tf.keras.layers.Layer]]


def import_tf_privacy() -> tuple[Any, Any, Any]:
    """Imports TF, ``DPSequential`` and ``make_default_layer_registry`` without tf_estimator.

    ``tensorflow_privacy/__init__`` imports its estimators (hence ``tensorflow_estimator``) unless
    ``sys.skip_tf_privacy_import`` is set; we set it for the duration of the import only. If this is
    the process's first import of ``tensorflow_privacy``, its top-level re-exports
    (``tensorflow_privacy.DPKerasSGDOptimizer`` …) stay absent; submodule imports work as usual.
    """
    had_flag = hasattr(sys, "skip_tf_privacy_import")
    sys.skip_tf_privacy_import = True  # type: ignore[attr-defined]
    try:
        import tensorflow as tf
        from tensorflow_privacy.privacy.fast_gradient_clipping.layer_registry import (
            make_default_layer_registry)
        from tensorflow_privacy.privacy.keras_models.dp_keras_model import DPSequential
    finally:
        if not had_flag:
            del sys.skip_tf_privacy_import  # type: ignore[attr-defined]
    return tf, DPSequential, make_default_layer_registry


def _check_clip(l2_norm_clip: Any) -> float:
    return dpsgd.check_positive(l2_norm_clip, "l2_norm_clip")


def mlp_layers(hidden_units: Sequence[int] = (64, 32), output_units: int = 1,
               output_activation: str | None = None) -> list[Any]:
    """Fresh ``Dense`` layers of an MLP: ReLU hidden layers, then the output layer.

    Example: ``mlp_layers((64, 32))`` is the 64-32-1 regression MLP of the benchmarks; Sage's Taxi
    NN is ``mlp_layers((5000, 100))`` and its Criteo LG ``mlp_layers((), 1, "sigmoid")``.
    """
    tf, _, _ = import_tf_privacy()
    layers = [tf.keras.layers.Dense(int(u), activation="relu") for u in hidden_units]
    layers.append(tf.keras.layers.Dense(int(output_units), activation=output_activation))
    return layers


def make_dp_keras_model(layers: LayersSpec, *, input_shape: Sequence[int], l2_norm_clip: float,
                        noise_multiplier: float, num_microbatches: int | None = None,
                        require_fast_clipping: bool = True) -> Any:
    """A ``DPSequential`` (TF Privacy) with fast gradient clipping, not yet compiled.

    Args:
      layers: Keras layers, or a zero-argument callable returning them (layers cannot be shared
        between models). An ``Input`` layer of ``input_shape`` is prepended.
      input_shape: Shape of one example, e.g. ``(d,)``.
      l2_norm_clip: Per-example (per-microbatch) gradient clipping norm C, > 0.
      noise_multiplier: Noise std / C on the summed clipped gradients, > 0.
      num_microbatches: ``None`` (one example per microbatch; the only setting
        :mod:`sage_tfx.dp.dpsgd` accounts) or k dividing every batch size — then under add-or-remove
        adjacency the effective noise multiplier is ``noise_multiplier / 2`` (module docstring).
      require_fast_clipping: Raise unless every trainable layer is in the default registry
        (``Dense``, ``Embedding``); otherwise TF Privacy silently falls back to vectorized
        per-example gradients (correct, ~10x slower).

    Returns:
      The uncompiled ``DPSequential``; compile it with :func:`compile_dp`.

    Raises:
      InvalidPrivacyParameterError: l2_norm_clip or noise_multiplier not finite and > 0.
      ValueError: bad num_microbatches, or layers the fast path cannot clip.
    """
    l2_norm_clip = _check_clip(l2_norm_clip)
    noise_multiplier = dpsgd.check_positive(noise_multiplier, "noise_multiplier")
    if num_microbatches is not None and (
            isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int)
            or num_microbatches < 1):
        raise ValueError(f"num_microbatches must be None or an int ≥ 1, got {num_microbatches!r}")
    tf, dp_sequential, make_default_layer_registry = import_tf_privacy()
    layer_list = list(layers() if callable(layers) else layers)
    model = dp_sequential(
        l2_norm_clip=l2_norm_clip,
        noise_multiplier=noise_multiplier,
        num_microbatches=num_microbatches,
        # XLA recompiles for every new batch shape; with fixed batches it was ≤ 10% faster here,
        # within the noise of the shared machine.
        use_xla=False,
        layer_registry=make_default_layer_registry(),
        layers=[tf.keras.Input(shape=tuple(input_shape)), *layer_list],
    )
    fast = model._enable_fast_peg_computation  # pylint: disable=protected-access
    if require_fast_clipping and not fast:
        registry = make_default_layer_registry()
        slow = [type(layer).__name__ for layer in model.layers
                if layer.trainable_variables and not registry.is_elem(layer)]
        raise ValueError(
            f"layers {slow} have no fast gradient-norm function in TF Privacy's default layer "
            "registry (Dense, Embedding); pass require_fast_clipping=False to accept the slow path")
    return model


def compile_dp(model: Any, *, loss: Any, optimizer: Any = None, learning_rate: float = 0.01,
               metrics: Sequence[Any] | None = None) -> Any:
    """Compiles a model from :func:`make_dp_keras_model` with a plain (non-DP) Keras optimizer.

    Args:
      model: A ``DPSequential``.
      loss: A ``tf.keras.losses.Loss`` instance (e.g. ``MeanSquaredError()``) with reduction
        ``AUTO``, ``SUM_OVER_BATCH_SIZE`` or ``SUM``: TF Privacy reads ``loss.reduction`` to scale
        the noise and rebuilds the unreduced loss from ``loss.get_config()``; strings and bare
        functions do not work.
      optimizer: A Keras optimizer; default ``SGD(learning_rate)``. Never a DP optimizer: the model
        already clips and noises (a DP optimizer would do it twice).
      learning_rate: Used only for the default optimizer.
      metrics: Keras metrics.

    Returns:
      ``model``, compiled.

    Raises:
      ValueError: a loss TF Privacy cannot clip, a TF Privacy DP optimizer, or a bad learning rate.
    """
    tf, _, _ = import_tf_privacy()
    if not isinstance(loss, tf.keras.losses.Loss):
        raise ValueError(
            f"loss must be a tf.keras.losses.Loss instance (e.g. MeanSquaredError()), got {loss!r}")
    if loss.reduction == tf.keras.losses.Reduction.NONE:
        raise ValueError("loss reduction NONE is not supported by TF Privacy's fast clipping")
    if optimizer is None:
        optimizer = tf.keras.optimizers.SGD(
            learning_rate=check_positive(learning_rate, "learning_rate"))
    if "privacy" in type(optimizer).__module__ or type(optimizer).__name__.startswith(
            ("DP", "VectorizedDP")):
        raise ValueError("use a standard Keras optimizer: DPSequential already clips and noises")
    model.compile(optimizer=optimizer, loss=loss, metrics=list(metrics or []))
    return model


def check_data(features: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` as float32 arrays, labels as a column: n ≥ 1 aligned rows, all finite.

    Raises:
      ValueError: bad shapes, misaligned rows, NaN or infinite values.
    """
    x = np.asarray(features, dtype=np.float32)
    y = np.asarray(labels, dtype=np.float32)
    if x.ndim < 2 or x.shape[0] < 1:
        raise ValueError(f"features must be an (n, ...) array with n ≥ 1, got shape {x.shape}")
    if y.ndim == 1:
        y = y[:, None]  # per-example loss of shape [batch], as the fast path requires
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"labels have {y.shape[0]} rows, features {x.shape[0]}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("features or labels contain NaN or infinite values")
    return x, y


def shuffled_batches(features: np.ndarray, labels: np.ndarray, batch_size: int,
                     seed: int | None = None) -> Any:
    """A ``tf.data.Dataset`` of shuffled fixed-size batches (reshuffled each epoch, remainder
    dropped).

    Shuffles example *indices* and gathers each batch in one op: same batches as
    ``from_tensor_slices((x, y)).shuffle(n).batch(b, drop_remainder=True)``, about twice as fast
    for 15k rows (per-element shuffling cost more than the whole DP overhead in the benchmark).
    Every batch has exactly ``batch_size`` examples; an epoch has ``n // batch_size`` batches.
    """
    tf, _, _ = import_tf_privacy()
    x, y = tf.constant(features), tf.constant(labels)
    return (tf.data.Dataset.range(len(features))
            .shuffle(len(features), seed=seed, reshuffle_each_iteration=True)
            .batch(int(batch_size), drop_remainder=True)
            .map(lambda idx: (tf.gather(x, idx), tf.gather(y, idx)))
            .prefetch(tf.data.AUTOTUNE))


def train_dp_keras(features: Any, labels: Any, *, layers: LayersSpec, loss: Any, batch_size: int,
                   epochs: int, delta: float, l2_norm_clip: float, epsilon: float | None = None,
                   noise_multiplier: float | None = None,
                   accountant: str = dpsgd.DEFAULT_ACCOUNTANT,
                   optimizer: Any = None, learning_rate: float = 0.01,
                   metrics: Sequence[Any] | None = None, seed: int | None = None,
                   verbose: int = 0) -> tuple[Any, dpsgd.DPGuarantee]:
    """Trains a Keras model with DP-SGD and returns it with its (ε, δ) guarantee.

    Give either a target ``epsilon`` (σ is calibrated by
    :func:`sage_tfx.dp.dpsgd.calibrate_noise_multiplier` from the real number of examples) or an
    explicit ``noise_multiplier`` (ε is computed).

    Training runs exactly what :func:`sage_tfx.dp.dpsgd.dpsgd_event` charges: ``steps =
    ceil(epochs · n / batch_size)`` steps, each on a Poisson-sampled batch (every example
    independently with ``q = batch_size / n``, :func:`poisson_batches`), the clipped-gradient
    sum plus ``N(0, (σC)²)`` divided by the expected batch size ``batch_size``
    (:func:`make_poisson_dp_model`); add-or-remove-one adjacency, one example per microbatch.
    Keras sees the whole run as one epoch (``model.history`` has one entry).

    Args:
      features: (n, ...) float array.
      labels: (n,) or (n, k) array.
      layers: Keras layers or a callable returning them (see :func:`make_dp_keras_model`).
      loss: A ``tf.keras.losses.Loss`` instance (see :func:`compile_dp`).
      batch_size: Examples per step, ≤ n.
      epochs: Whole passes over the data, ≥ 1.
      delta: δ in (0, 1) of the guarantee.
      l2_norm_clip: Per-example gradient clipping norm C.
      epsilon: Target ε; exclusive with ``noise_multiplier``.
      noise_multiplier: σ; exclusive with ``epsilon``.
      accountant: ``"pld"`` (default; pessimistic, an upper bound, tighter) or ``"rdp"``.
      optimizer: A Keras optimizer; default ``SGD(learning_rate)``.
      learning_rate: For the default optimizer.
      metrics: Keras metrics.
      seed: Seeds TF / numpy / Python (``tf.keras.utils.set_random_seed``): the initial weights
        only. The DP noise and the Poisson sampling always come from OS entropy.
      verbose: Keras ``fit`` verbosity.

    Returns:
      ``(model, guarantee)``: the trained ``PoissonDPSequential`` (``model.history`` holds the fit
      history)
      and its :class:`sage_tfx.dp.dpsgd.DPGuarantee`.

    Raises:
      InvalidPrivacyParameterError: bad ε, δ, σ, C, sizes or accountant; both or neither of
        epsilon / noise_multiplier; an unreachable ε.
      ValueError: bad data, layers, loss or optimizer.
    """
    if (epsilon is None) == (noise_multiplier is None):
        raise InvalidPrivacyParameterError("give exactly one of epsilon and noise_multiplier")
    if isinstance(epochs, bool) or not isinstance(epochs, (int, np.integer)) or epochs < 1:
        raise InvalidPrivacyParameterError(f"epochs must be an int ≥ 1, got {epochs!r}")
    x, y = check_data(features, labels)
    num_examples = x.shape[0]
    l2_norm_clip = _check_clip(l2_norm_clip)
    if noise_multiplier is None:
        noise_multiplier = dpsgd.calibrate_noise_multiplier(
            epsilon, delta, batch_size, num_examples, int(epochs), accountant)
    guarantee = dpsgd.dpsgd_guarantee(
        noise_multiplier, batch_size, num_examples, int(epochs), delta, l2_norm_clip, accountant)

    tf, _, _ = import_tf_privacy()
    if seed is not None:
        tf.keras.utils.set_random_seed(int(seed))  # initialisation only: noise and sampling never
    model = make_poisson_dp_model(layers, input_shape=x.shape[1:], l2_norm_clip=l2_norm_clip,
                                  noise_multiplier=guarantee.noise_multiplier,
                                  expected_batch_size=guarantee.batch_size)
    compile_dp(model, loss=loss, optimizer=optimizer, learning_rate=learning_rate,
               metrics=metrics)
    steps_before = int(model.optimizer.iterations.numpy())  # a passed-in optimizer may have run
    model.fit(poisson_batches(x, y, guarantee.batch_size / num_examples, guarantee.steps),
              epochs=1, verbose=verbose)
    trained_steps = int(model.optimizer.iterations.numpy()) - steps_before
    if trained_steps != guarantee.steps:  # exactly the accounted steps ran
        raise RuntimeError(f"ran {trained_steps} steps but accounted {guarantee.steps}")
    return model, guarantee


# --- Poisson-sampled DP-SGD: what the PoissonSampledDpEvent charges is what runs ---------------

_POISSON_CLASS: list[Any] = []


def _poisson_dp_class() -> Any:
    """``PoissonDPSequential``: TF Privacy's ``DPSequential`` with a Poisson DP-SGD step.

    Built on first use (TensorFlow imported here). The step keeps TF Privacy's fast clipping
    (``clip_grads.compute_clipped_gradients_and_outputs``: ghost norms, clip weights) and
    replaces only the aggregation: the *sum* of clipped per-example gradients, plus
    ``N(0, (σC)²)`` drawn from a ``tf.random.Generator`` seeded from OS entropy (unaffected by
    ``tf.keras.utils.set_random_seed``), divided by the *expected* batch size ``q·n`` — never by
    the realised size, which would leak it (Opacus #571).
    """
    if _POISSON_CLASS:
        return _POISSON_CLASS[0]
    tf, dp_sequential, _ = import_tf_privacy()
    from tensorflow_privacy.privacy.fast_gradient_clipping import clip_grads

    class _AggregationRecord(tf.Module):
        """How many noisy aggregations ran, and the smallest / largest noise std added."""

        def __init__(self) -> None:
            super().__init__(name="dp_aggregations")
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.min_stddev = tf.Variable(np.inf, dtype=tf.float64, trainable=False)
            self.max_stddev = tf.Variable(0.0, dtype=tf.float64, trainable=False)

        def count(self, stddev: Any) -> None:
            stddev = tf.cast(stddev, tf.float64)  # a tensor: exact (float32 ⊂ float64)
            self.steps.assign_add(1)
            self.min_stddev.assign(tf.minimum(self.min_stddev, stddev))
            self.max_stddev.assign(tf.maximum(self.max_stddev, stddev))

    class PoissonDPSequential(dp_sequential):  # type: ignore[misc, valid-type]
        """DP-SGD on Poisson-sampled batches, normalised by the expected batch size."""

        def __init__(self, *args: Any, expected_batch_size: float, jit_compile: bool = False,
                     **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.expected_batch_size = float(expected_batch_size)
            # XLA for the private part of the step only (predict / evaluate stay plain Keras)
            self._noisy_gradients = (tf.function(self.noisy_gradients, jit_compile=True)
                                     if jit_compile else self.noisy_gradients)
            self._noise_rng = tf.random.Generator.from_non_deterministic_state()
            # What the noisy aggregation ran, counted inside the traced step (a tf.Module, so
            # the counters are not model weights and an exported copy does not carry them).
            self.dp_ran = _AggregationRecord()

        def noisy_aggregations(self) -> tuple[int, float, float]:
            """(noisy aggregations run, smallest and largest noise std they added).

            Counted where the noise is added, inside the traced (or XLA-compiled) step: every
            DP-SGD step, whoever called ``fit``, is one aggregation. The std is
            ``l2_norm_clip · noise_multiplier`` rounded to the gradients' dtype (float32: within
            2⁻²⁴ relative), the value the sampler draws with. Std 0.0 when none ran.
            """
            steps = int(self.dp_ran.steps.numpy())
            if steps == 0:
                return 0, 0.0, 0.0
            return (steps, float(self.dp_ran.min_stddev.numpy()),
                    float(self.dp_ran.max_stddev.numpy()))

        def train_step(self, data: Any) -> Any:
            if self._clipping_loss is None:
                self._make_clipping_loss()
            x, y, mask = tf.keras.utils.unpack_x_y_sample_weight(data)
            grads, y_pred = self._noisy_gradients(x, y, mask)
            if self.losses:  # weight regularizers: data-independent, no noise (as TF Privacy)
                with tf.GradientTape() as tape:
                    regularization = tf.add_n(self.losses)
                grads = [a + b for a, b in zip(grads, tape.gradient(
                    regularization, self.trainable_variables,
                    unconnected_gradients=tf.UnconnectedGradients.ZERO))]
            # The reported (non-DP, never released) training loss: the mean over the real rows.
            report_weights = mask
            if mask is not None and self.loss.reduction != tf.keras.losses.Reduction.SUM:
                size = tf.cast(tf.shape(mask)[0], mask.dtype)
                report_weights = mask * size / tf.maximum(tf.reduce_sum(mask), 1.0)
            self.compiled_loss(y, y_pred, sample_weight=report_weights,
                               regularization_losses=self.losses)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            self.compiled_metrics.update_state(y, y_pred, sample_weight=mask)
            return {m.name: m.result() for m in self.metrics}

        def noisy_gradients(self, x: Any, y: Any, mask: Any = None) -> tuple[list[Any], Any]:
            """(clipped sum + N(0, (σC)²)) / expected batch size, and the predictions."""
            summed, y_pred = self.clipped_sum(x, y, mask)
            # σ·C in the gradients' dtype: the std the sampler actually draws with.
            std = tf.constant(self._l2_norm_clip * self._noise_multiplier, summed[0].dtype)
            self.dp_ran.count(std)
            return [(g + self._noise_rng.normal(tf.shape(g), stddev=std, dtype=g.dtype))
                    / self.expected_batch_size for g in summed], y_pred

        def clipped_sum(self, x: Any, y: Any, mask: Any = None) -> tuple[list[Any], Any]:
            """The sum of per-example gradients clipped to C over the rows with mask 1, and
            the predictions. Rows with mask 0 (padding) contribute exactly zero: their weighted
            loss is 0, so is their gradient (norm 0, clip weight 1, times weight 0)."""
            clipped, y_pred, _ = clip_grads.compute_clipped_gradients_and_outputs(
                input_model=self, x_batch=x, y_batch=y, weight_batch=mask,
                l2_norm_clip=self._l2_norm_clip, layer_registry=self._layer_registry,
                num_microbatches=None, clipping_loss=self._clipping_loss)
            if self.loss.reduction == tf.keras.losses.Reduction.SUM:
                return list(clipped), y_pred
            # A mean-reduced clipping loss divides by the number of rows (padding included,
            # Keras' SUM_OVER_BATCH_SIZE): undo it exactly.
            size = tf.cast(tf.shape(y)[0], clipped[0].dtype)
            return [tf.where(size > 0, g * size, tf.zeros_like(g)) for g in clipped], y_pred

    _POISSON_CLASS.append(PoissonDPSequential)
    return PoissonDPSequential


def make_poisson_dp_model(layers: LayersSpec, *, input_shape: Sequence[int], l2_norm_clip: float,
                          noise_multiplier: float, expected_batch_size: float,
                          jit_compile: bool = False) -> Any:
    """A ``PoissonDPSequential`` (fast clipping required), not yet compiled.

    One example per microbatch, always: k microbatches would double the add-or-remove
    sensitivity of each microbatch mean (TF Privacy #620), which the accounting does not charge.

    ``jit_compile=True`` XLA-compiles the private part of the training step (forward pass,
    ghost norms, clipped sum, noise, division); with the fixed-shape batches of
    :func:`poisson_batches` it compiles once. The optimizer update, predict and evaluate stay
    plain Keras, and the computation is the same either way. Off by default: for the small
    MLPs measured (``benchmarks/results/audit/REPORT.md``) it changed the steady-state epoch by
    less than the machine's noise and added ~0.6 CPU-seconds of compilation per model.

    Raises:
      InvalidPrivacyParameterError: l2_norm_clip, noise_multiplier or expected_batch_size not
        finite and > 0.
      ValueError: layers the fast path cannot clip.
    """
    l2_norm_clip = _check_clip(l2_norm_clip)
    noise_multiplier = dpsgd.check_positive(noise_multiplier, "noise_multiplier")
    expected = dpsgd.check_positive(expected_batch_size, "expected_batch_size")
    tf, _, make_default_layer_registry = import_tf_privacy()
    layer_list = list(layers() if callable(layers) else layers)
    model = _poisson_dp_class()(
        l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier, num_microbatches=None,
        use_xla=False, layer_registry=make_default_layer_registry(),
        layers=[tf.keras.Input(shape=tuple(input_shape)), *layer_list],
        expected_batch_size=expected, jit_compile=jit_compile)
    if not model._enable_fast_peg_computation:  # pylint: disable=protected-access
        raise ValueError("Poisson DP-SGD needs every trainable layer in TF Privacy's fast-clipping "
                         "registry (Dense, Embedding)")
    return model


def poisson_batches(features: np.ndarray, labels: np.ndarray, sampling_probability: float,
                    steps: int, *, pad_multiple: int = 8) -> Any:
    """A ``tf.data.Dataset`` of ``steps`` Poisson-sampled batches, padded to one fixed size.

    Every example joins every batch independently with probability q (:func:`poisson_masks`,
    numpy's generator seeded from OS entropy, never from a user seed): the real batch sizes are
    Binomial(n, q), possibly 0. This is the sampling ``PoissonSampledDpEvent(q, ...)`` accounts.

    Each element is ``(x, y, mask)``: the sampled rows first (mask 1), then padding rows (copies
    of row 0, mask 0) up to ``P`` = the largest realised size of the run rounded up to a multiple
    of ``pad_multiple``. Every batch of the run has the same shape, so the training step is
    traced (and with ``jit_compile`` XLA-compiled) once, not once per batch size; the mask is the
    sample weight of :class:`PoissonDPSequential`, under which padding rows contribute exactly zero
    to the clipped sum (the step divides by the *expected* batch size, never by P or by the
    realised size). ``P`` depends on the sampling only, never on the data, and is not released.
    """
    indices, mask = poisson_masks(len(features), sampling_probability, int(steps), pad_multiple)
    tf, _, _ = import_tf_privacy()
    x, y = tf.constant(features), tf.constant(labels)
    return (tf.data.Dataset.from_tensor_slices((indices, mask.astype(np.float32)))
            .map(lambda idx, m: (tf.gather(x, idx), tf.gather(y, idx), m))
            .prefetch(tf.data.AUTOTUNE))


def poisson_masks(n: int, sampling_probability: float, steps: int, pad_multiple: int = 8,
                  rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The row indices ``(steps, P)`` and 0/1 masks of :func:`poisson_batches` (numpy only).

    Row ``t`` holds the indices of the examples sampled at step ``t`` (each independently with
    probability q), in increasing order, then zeros with mask 0. ``rng`` defaults to fresh OS
    entropy (pass one only in tests).

    Drawn as the same distribution in O(batch) per step instead of O(n): independent
    Bernoulli(q) inclusions are exactly a Binomial(n, q) size, then a uniformly random subset
    of that size (``Generator.choice`` without replacement) — 3 s → 0.1 s for the 336,776
    flights and 2,630 steps.
    """
    q = float(sampling_probability)
    if not 0.0 < q <= 1.0:
        raise InvalidPrivacyParameterError(f"sampling probability must lie in (0, 1], got {q!r}")
    if isinstance(pad_multiple, bool) or not isinstance(pad_multiple, int) or pad_multiple < 1:
        raise ValueError(f"pad_multiple must be an int >= 1, got {pad_multiple!r}")
    if n < 1 or steps < 0:
        raise ValueError(f"need n >= 1 examples and steps >= 0, got n={n}, steps={steps}")
    gen = np.random.default_rng() if rng is None else rng
    sizes = gen.binomial(n, q, size=steps)
    chosen = [np.sort(gen.choice(n, size=k, replace=False)) for k in sizes]
    longest = max((c.size for c in chosen), default=0)
    padded = max(pad_multiple, -(-longest // pad_multiple) * pad_multiple)
    indices = np.zeros((steps, padded), np.int64)
    mask = np.zeros((steps, padded), bool)
    for t, rows in enumerate(chosen):
        indices[t, :rows.size] = rows
        mask[t, :rows.size] = True
    return indices, mask


def expected_update_std(noise_multiplier: float, l2_norm_clip: float, batch_size: int,
                        learning_rate: float) -> float:
    """Std of the noise in one plain-SGD weight update of a mean-loss DP model: η·σ·C / B."""
    return learning_rate * noise_multiplier * l2_norm_clip / batch_size


__all__ = [
    "check_data", "compile_dp", "expected_update_std", "import_tf_privacy", "make_dp_keras_model",
    "make_poisson_dp_model", "mlp_layers", "poisson_batches", "poisson_masks", "shuffled_batches",
    "train_dp_keras",
]
