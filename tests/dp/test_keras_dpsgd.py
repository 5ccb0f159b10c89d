"""Tests of sage_tfx.dp.keras_dpsgd: DP-SGD with TF Privacy's DPSequential.

Argument checks that fail before TensorFlow is needed are fast; everything that builds or trains a
model is marked slow.
"""
import math

import dp_accounting
import numpy as np
import pytest

from sage_tfx.dp import dpsgd
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.dp import keras_dpsgd


def _regression_data(n=4000, d=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    w = rng.normal(size=d) / math.sqrt(d)
    y = (x @ w + 0.1 * rng.normal(size=n)).astype(np.float32)
    return x, y


_X, _Y = _regression_data(200, 3)
_OK = dict(layers=[], loss=None, batch_size=20, epochs=1, delta=1e-5, l2_norm_clip=1.0,
           epsilon=1.0)


@pytest.mark.parametrize("bad,error", [
    (dict(noise_multiplier=1.0), InvalidPrivacyParameterError),   # both ε and σ
    (dict(epsilon=None), InvalidPrivacyParameterError),           # neither
    (dict(epochs=0), InvalidPrivacyParameterError),
    (dict(epochs=1.5), InvalidPrivacyParameterError),
    (dict(batch_size=201), InvalidPrivacyParameterError),         # > n
    (dict(epsilon=-1.0), InvalidPrivacyParameterError),
    (dict(delta=0.0), InvalidPrivacyParameterError),
    (dict(l2_norm_clip=0.0), InvalidPrivacyParameterError),
    (dict(l2_norm_clip=math.nan), InvalidPrivacyParameterError),
    (dict(accountant="moments"), InvalidPrivacyParameterError),
    (dict(epsilon=None, noise_multiplier=0.0), InvalidPrivacyParameterError),
])
def test_train_rejects_bad_privacy_arguments_before_tensorflow(bad, error):
    with pytest.raises(error):
        keras_dpsgd.train_dp_keras(_X, _Y, **{**_OK, **bad})


@pytest.mark.parametrize("features,labels", [
    (_X, _Y[:-1]),
    (np.where(_X > 1, np.nan, _X), _Y),
    (_X[:, 0], _Y),
])
def test_train_rejects_bad_data_before_tensorflow(features, labels):
    with pytest.raises(ValueError):
        keras_dpsgd.train_dp_keras(features, labels, **_OK)


def test_expected_update_std():
    assert keras_dpsgd.expected_update_std(2.0, 0.5, 32, 0.1) == pytest.approx(0.1 * 2 * 0.5 / 32)


# --- slow: TensorFlow ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tf():
    tf, _, _ = keras_dpsgd.import_tf_privacy()
    return tf


@pytest.mark.slow
def test_train_learns_and_guarantee_matches_dp_accounting(tf):
    x, y = _regression_data()
    n, batch, epochs = x.shape[0], 64, 5
    model, guarantee = keras_dpsgd.train_dp_keras(
        x, y, layers=lambda: keras_dpsgd.mlp_layers((16,)),
        loss=tf.keras.losses.MeanSquaredError(), batch_size=batch, epochs=epochs, delta=1e-5,
        l2_norm_clip=1.0, epsilon=3.0, learning_rate=0.05, seed=0, accountant="rdp")
    mse = float(np.mean((model.predict(x, verbose=0)[:, 0] - y) ** 2))
    assert mse < 0.3 * float(np.var(y))  # learned most of the signal

    # The guarantee (RDP on request), recomputed independently with dp_accounting.
    steps = math.ceil(epochs * n / batch)
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        batch / n, dp_accounting.GaussianDpEvent(guarantee.noise_multiplier)), steps))
    assert guarantee.epsilon == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)
    assert guarantee.epsilon <= 3.0
    assert guarantee.epsilon == pytest.approx(3.0, rel=1e-3)
    assert (guarantee.num_examples, guarantee.batch_size, guarantee.steps) == (n, batch, steps)
    assert guarantee.l2_norm_clip == 1.0 and guarantee.accountant == "rdp"
    assert "Poisson" in guarantee.sampling
    # Exactly the accounted steps ran, each on a Poisson sample normalised by the expected size.
    assert int(model.optimizer.iterations.numpy()) == steps
    assert model.expected_batch_size == batch
    assert model._noise_multiplier == guarantee.noise_multiplier  # pylint: disable=protected-access
    assert model._enable_fast_peg_computation  # pylint: disable=protected-access


@pytest.mark.slow
def test_train_with_explicit_noise_multiplier(tf):
    x, y = _regression_data(n=1000)
    _, guarantee = keras_dpsgd.train_dp_keras(
        x, y, layers=lambda: keras_dpsgd.mlp_layers(()), loss=tf.keras.losses.MeanSquaredError(),
        batch_size=100, epochs=2, delta=1e-5, l2_norm_clip=1.0, noise_multiplier=1.5, seed=1)
    assert guarantee.noise_multiplier == 1.5
    assert guarantee.epsilon == dpsgd.dpsgd_epsilon(dpsgd.dpsgd_event(1.5, 100, 1000, 2), 1e-5)


def _update_samples(tf, *, noise_multiplier, l2_norm_clip, batch, lr, reduction, microbatches,
                    dim=200, repeats=20):
    """Weight changes of single SGD steps from zero weights on data with zero gradient."""
    model = keras_dpsgd.make_dp_keras_model(
        [tf.keras.layers.Dense(1, kernel_initializer="zeros")], input_shape=(dim,),
        l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier,
        num_microbatches=microbatches)
    keras_dpsgd.compile_dp(model, loss=tf.keras.losses.MeanSquaredError(reduction=reduction),
                           learning_rate=lr)
    x = np.zeros((batch, dim), np.float32)
    y = np.zeros((batch, 1), np.float32)  # prediction 0 = label: every gradient is exactly 0
    zeros = [np.zeros_like(w) for w in model.get_weights()]
    samples = []
    for _ in range(repeats):
        model.set_weights(zeros)
        model.train_on_batch(x, y)
        samples.append(np.concatenate([w.ravel() for w in model.get_weights()]))
    return np.stack(samples)


@pytest.mark.slow
@pytest.mark.parametrize("reduction,microbatches,divisor", [
    ("sum_over_batch_size", None, 32),   # mean loss: noise σC on the sum, divided by B
    ("sum", None, 1),                    # sum loss: σC, no division
    ("sum_over_batch_size", 4, 4),       # 4 microbatches: σC on their sum, divided by 4
])
def test_update_noise_std_matches_formula(tf, reduction, microbatches, divisor):
    tf.keras.utils.set_random_seed(3)
    sigma, clip, batch, lr = 4.0, 0.5, 32, 0.5
    samples = _update_samples(tf, noise_multiplier=sigma, l2_norm_clip=clip, batch=batch, lr=lr,
                              reduction=reduction, microbatches=microbatches)
    expected = lr * sigma * clip / divisor
    if divisor == batch:
        assert expected == keras_dpsgd.expected_update_std(sigma, clip, batch, lr)
    assert np.std(samples) == pytest.approx(expected, rel=0.05)   # ~4,000 samples: ±1.1% (1 sd)
    assert abs(np.mean(samples)) < 4 * expected / math.sqrt(samples.size)
    # Fresh noise at every step: repeated steps from the same weights differ.
    assert not np.allclose(samples[0], samples[1])


@pytest.mark.slow
def test_gradients_are_clipped_exactly(tf):
    """Mean of per-example clipped gradients: 2(w·x − y)x clipped to C, one big and one small."""
    clip, lr = 1.0, 0.1
    model = keras_dpsgd.make_dp_keras_model(
        [tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")], input_shape=(3,),
        l2_norm_clip=clip, noise_multiplier=1e-9)
    keras_dpsgd.compile_dp(model, loss=tf.keras.losses.MeanSquaredError(), learning_rate=lr)
    w0 = np.ones(3)
    x = np.array([[1.0, 2.0, 2.0], [0.1, 0.0, 0.0]], np.float32)
    y = np.array([[-10.0], [0.0]], np.float32)
    grads = 2 * (x @ w0 - y[:, 0])[:, None] * x        # norms 90 and 0.02: clipped, unclipped
    norms = np.linalg.norm(grads, axis=1)
    clipped = grads / np.maximum(1.0, norms / clip)[:, None]
    model.train_on_batch(x, y)
    np.testing.assert_allclose(model.get_weights()[0][:, 0], w0 - lr * clipped.mean(axis=0),
                               rtol=0, atol=1e-6)
    assert norms[0] > clip > norms[1]


@pytest.mark.slow
def test_make_model_rejects_layers_without_fast_clipping(tf):
    with pytest.raises(ValueError, match="BatchNormalization"):
        keras_dpsgd.make_dp_keras_model(
            [tf.keras.layers.Dense(4), tf.keras.layers.BatchNormalization(),
             tf.keras.layers.Dense(1)],
            input_shape=(3,), l2_norm_clip=1.0, noise_multiplier=1.0)


@pytest.mark.slow
def test_compile_rejects_string_loss_and_dp_optimizer(tf):
    model = keras_dpsgd.make_dp_keras_model(keras_dpsgd.mlp_layers(()), input_shape=(3,),
                                            l2_norm_clip=1.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="Loss instance"):
        keras_dpsgd.compile_dp(model, loss="mse")
    with pytest.raises(ValueError, match="NONE"):
        keras_dpsgd.compile_dp(model, loss=tf.keras.losses.MeanSquaredError(reduction="none"))
    from tensorflow_privacy.privacy.optimizers.dp_optimizer_keras import DPKerasSGDOptimizer
    with pytest.raises(ValueError, match="standard Keras optimizer"):
        keras_dpsgd.compile_dp(model, loss=tf.keras.losses.MeanSquaredError(),
                               optimizer=DPKerasSGDOptimizer(1.0, 1.0, learning_rate=0.1))


# --- Poisson DP-SGD: the sampling, normalisation and sensitivity that the event charges ---------


def test_poisson_masks_sample_each_example_independently():
    """What PoissonSampledDpEvent(q) charges: every example joins every step independently
    with probability q; padding is marked 0 and never a sampled row."""
    n, q, steps = 1000, 0.05, 1000
    indices, mask = keras_dpsgd.poisson_masks(n, q, steps, 8, np.random.default_rng(0))
    assert indices.shape == mask.shape and indices.shape[0] == steps
    sizes = mask.sum(axis=1)
    assert indices.shape[1] % 8 == 0 and sizes.max() <= indices.shape[1] < sizes.max() + 8
    counts = np.zeros(n)
    for rows, m in zip(indices, mask):
        k = int(m.sum())
        assert m[:k].all() and not m[k:].any()           # sampled rows first, then padding
        assert np.all(np.diff(rows[:k]) > 0)            # distinct rows
        assert not rows[k:].any()                        # padding gathers row 0, weight 0
        counts[rows[:k]] += 1
    # Batch sizes are Binomial(n, q) (fixed-size batches would have variance 0) ...
    assert abs(sizes.mean() - n * q) < 5 * math.sqrt(n * q * (1 - q) / steps)
    assert sizes.var(ddof=1) == pytest.approx(n * q * (1 - q), rel=0.2)  # rel. sd 0.045
    # ... every example joins Binomial(steps, q) batches (no epoch structure) ...
    assert abs(counts.mean() - steps * q) < 5 * math.sqrt(steps * q * (1 - q) / n)
    assert counts.var(ddof=1) == pytest.approx(steps * q * (1 - q), rel=0.2)
    # ... and inclusions are independent across examples: pairwise joint rate q².
    member = np.zeros((steps, n), bool)
    member[np.nonzero(mask)[0], indices[mask]] = True
    joint = (member[:, ::2] & member[:, 1::2]).mean()   # disjoint pairs of examples
    assert abs(joint - q * q) < 5 * math.sqrt(q * q / (steps * n / 2))
    for bad_q in (0.0, 1.5, math.nan):
        with pytest.raises(InvalidPrivacyParameterError):
            keras_dpsgd.poisson_masks(n, bad_q, steps)
    with pytest.raises(ValueError):
        keras_dpsgd.poisson_masks(n, q, steps, pad_multiple=0)


@pytest.mark.slow
def test_poisson_batches_have_one_shape_and_mask_the_padding(tf):
    n, q, steps = 200, 0.1, 300
    x = np.arange(n, dtype=np.float32)[:, None]
    shapes, sizes = set(), []
    for bx, by, bm in keras_dpsgd.poisson_batches(x, x + 1, q, steps):
        shapes.add(tuple(bx.shape))
        k = int(bm.numpy().sum())
        ids = bx.numpy()[:k, 0].astype(int)
        assert len(set(ids)) == k and np.all(by.numpy()[:k, 0] == ids + 1)
        sizes.append(k)
    assert len(shapes) == 1 and len(sizes) == steps    # one trace; exactly the accounted steps
    assert sizes.count(int(n * q)) < steps / 4          # real sizes vary (Binomial)


def _check_padded_clipped_sum(tf, clip, lr, expected, jit):
    model = keras_dpsgd.make_poisson_dp_model(
        [tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")], input_shape=(3,),
        l2_norm_clip=clip, noise_multiplier=1e-9, expected_batch_size=expected, jit_compile=jit)
    keras_dpsgd.compile_dp(model, loss=tf.keras.losses.MeanSquaredError(), learning_rate=lr)
    w0 = np.ones(3)
    x = np.array([[1.0, 2.0, 2.0], [0.1, 0.0, 0.0]], np.float32)
    y = np.array([[-10.0], [0.0]], np.float32)
    grads = 2 * (x @ w0 - y[:, 0])[:, None] * x
    clipped = grads / np.maximum(1.0, np.linalg.norm(grads, axis=1) / clip)[:, None]
    model.train_on_batch(x, y)
    np.testing.assert_allclose(model.get_weights()[0][:, 0],
                               w0 - lr * clipped.sum(axis=0) / expected, rtol=0, atol=1e-6)
    # Padding rows (mask 0) contribute exactly nothing, however large their gradient: the
    # update is the same clipped sum / expected size (not / padded or realised size).
    model.set_weights([w0[:, None].astype(np.float32)])
    pad_x = np.concatenate([x, np.full((6, 3), 50.0, np.float32)])
    pad_y = np.concatenate([y, np.full((6, 1), -99.0, np.float32)])
    model.train_on_batch(pad_x, pad_y, sample_weight=np.array([1, 1, 0, 0, 0, 0, 0, 0],
                                                              np.float32))
    np.testing.assert_allclose(model.get_weights()[0][:, 0],
                               w0 - lr * clipped.sum(axis=0) / expected, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_poisson_step_divides_by_the_expected_batch_size(tf):
    """Opacus #571: the noisy clipped sum is divided by the expected batch size q·n, whatever
    the realised size (dividing by the realised size would leak it)."""
    clip, lr, expected = 1.0, 0.1, 8.0
    for jit in (False, True):   # the XLA-compiled step computes the same update
        _check_padded_clipped_sum(tf, clip, lr, expected, jit)
    # Noise: realised batches of 10 and of 0 examples, expected 40: std lr·σ·C/40 in both.
    sigma, clip, lr = 4.0, 0.5, 0.5
    noisy = keras_dpsgd.make_poisson_dp_model(
        [tf.keras.layers.Dense(1, kernel_initializer="zeros")], input_shape=(100,),
        l2_norm_clip=clip, noise_multiplier=sigma, expected_batch_size=40, jit_compile=True)
    keras_dpsgd.compile_dp(noisy, loss=tf.keras.losses.MeanSquaredError(), learning_rate=lr)
    zeros = [np.zeros_like(w) for w in noisy.get_weights()]
    for realised, padded in ((10, 10), (0, 0), (10, 16)):
        mask = (np.arange(padded) < realised).astype(np.float32)
        samples = []
        for _ in range(20):
            noisy.set_weights(zeros)
            noisy.train_on_batch(np.zeros((padded, 100), np.float32),
                                 np.zeros((padded, 1), np.float32), sample_weight=mask)
            samples.append(np.concatenate([w.ravel() for w in noisy.get_weights()]))
        assert np.std(samples) == pytest.approx(lr * sigma * clip / 40, rel=0.05), realised
        assert not np.allclose(samples[0], samples[1])   # fresh noise every step under XLA
    # Every noisy aggregation was counted inside the (XLA-compiled) step, with the std it drew
    # with — the one whose empirical value was just checked — and the counters are no weights.
    steps, low, high = noisy.noisy_aggregations()
    assert steps == 60 == int(noisy.optimizer.iterations.numpy())
    assert low == high == float(np.float32(sigma * clip))
    assert len(noisy.get_weights()) == len(noisy.trainable_variables) == 2


@pytest.mark.slow
def test_microbatching_is_never_used_and_would_double_the_sensitivity(tf):
    """TF Privacy #620: k microbatches double the add-or-remove sensitivity of each microbatch
    mean. Our trainer never microbatches, so TF Privacy's own accounting of an unmicrobatched
    Poisson run equals ours, and its microbatched accounting is far above it."""
    model = keras_dpsgd.make_poisson_dp_model(
        keras_dpsgd.mlp_layers((4,)), input_shape=(3,), l2_norm_clip=1.0, noise_multiplier=1.0,
        expected_batch_size=10)
    assert model._num_microbatches is None  # pylint: disable=protected-access
    from tensorflow_privacy.privacy.analysis import compute_dp_sgd_privacy_lib as lib
    n, batch, epochs, sigma, delta = 1000, 50, 2, 1.1, 1e-5
    ours = dpsgd.dpsgd_epsilon(dpsgd.dpsgd_event(sigma, batch, n, epochs), delta, "rdp")
    theirs = lib._compute_dp_sgd_example_privacy(  # pylint: disable=protected-access
        epochs, sigma, delta, used_microbatching=False, poisson_subsampling_probability=batch / n)
    assert ours == pytest.approx(theirs, rel=1e-9)
    microbatched = lib._compute_dp_sgd_example_privacy(  # pylint: disable=protected-access
        epochs, sigma, delta, used_microbatching=True, poisson_subsampling_probability=batch / n)
    assert microbatched > 2 * ours
