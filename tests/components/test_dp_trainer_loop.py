"""The DP-SGD loop's clipped sums are the clipped per-example gradients, summed, by every path:
the one-pass sum (Dense layers), TF Privacy's ghost clipping and vectorized per-example
gradients, each against per-example gradients computed one example at a time."""
import numpy as np
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tf():
    import tensorflow
    return tensorflow


def _loop(tf, model, clip=0.5):
    from sage_tfx.components.dp_trainer import loop, objectives
    return loop.DPSGDLoop(model, loss=objectives.check_loss("binary_crossentropy"),
                          optimizer=tf.keras.optimizers.SGD(0.1), l2_norm_clip=clip,
                          noise_multiplier=1.0, expected_batch_size=8, max_batch_size=16)


def _brute_force(tf, dp, x, y, clip):
    """Σᵢ clip(∇ℓᵢ) from one example at a time."""
    total = [np.zeros(v.shape, np.float64) for v in dp._vars]
    for i in range(int(y.shape[0])):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(dp._losses(y[i:i + 1], dp.model({k: v[i:i + 1] for k, v in
                                                                   x.items()})))
        g = [tf.convert_to_tensor(t).numpy() for t in tape.gradient(
            loss, dp._vars, unconnected_gradients=tf.UnconnectedGradients.ZERO)]
        norm = np.sqrt(sum(np.sum(t.astype(np.float64) ** 2) for t in g))
        for acc, t in zip(total, g):
            acc += t * min(1.0, clip / norm)
    return total


def _mlp(tf, embedding=False):
    inp = {"a": tf.keras.Input(shape=(), name="a"), "b": tf.keras.Input(shape=(), name="b"),
           "c": tf.keras.Input(shape=(), name="c", dtype=tf.int64)}
    cols = [tf.stack([inp["a"], inp["b"]], axis=1)]
    if embedding:
        cols.append(tf.keras.layers.Flatten()(tf.keras.layers.Embedding(5, 3)(inp["c"])))
    x = tf.keras.layers.Concatenate()(cols) if len(cols) > 1 else cols[0]
    x = tf.keras.layers.Dense(16, activation="relu")(x)
    x = tf.keras.layers.Dense(8, activation="tanh")(x)
    return tf.keras.Model(inp, tf.keras.layers.Dense(1, activation="sigmoid")(x))


@pytest.mark.parametrize("embedding", [False, True])
def test_every_clipping_path_sums_the_clipped_per_example_gradients(tf, embedding):
    from sage_tfx.components.dp_trainer import loop
    rng = np.random.default_rng(0)
    n = 12
    x = {"a": tf.constant(rng.normal(size=n) * 3, tf.float32),
         "b": tf.constant(rng.normal(size=n), tf.float32),
         "c": tf.constant(rng.integers(0, 5, n), tf.int64)}
    y = tf.constant(rng.integers(0, 2, n).astype(np.float32))
    model = _mlp(tf, embedding)
    dp = _loop(tf, model)
    assert dp.one_pass == (not embedding) and loop.one_pass_layers(model) == (not embedding)
    expected = _brute_force(tf, dp, x, y, 0.5)
    paths = {"default": dp._clipped_sum}
    if dp.one_pass:
        dp.one_pass = False                      # the two-pass ghost path on the same model
        paths["ghost"] = dp._clipped_sum
        paths["one-pass"] = dp._one_pass_sum
    for name, fn in paths.items():
        got = [t.numpy() for t in fn(x, y)]
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-6, err_msg=name)
    # a batch of one example whose gradient is above the clip contributes exactly C
    dp.one_pass = not embedding
    one = [t.numpy() for t in dp._clipped_sum({k: v[:1] for k, v in x.items()}, y[:1])]
    norm = np.sqrt(sum(np.sum(t.astype(np.float64) ** 2) for t in one))
    assert norm <= 0.5 + 1e-6


def test_the_one_pass_sum_is_refused_where_it_would_be_wrong(tf):
    """A shared Dense layer, a Dense layer on a sequence, a LayerNormalization: ghost or
    per-example paths instead."""
    from sage_tfx.components.dp_trainer import loop
    inp = tf.keras.Input(shape=(4,))
    shared = tf.keras.layers.Dense(4)
    assert not loop.one_pass_layers(tf.keras.Model(inp, shared(shared(inp))))
    seq = tf.keras.Input(shape=(3, 4))
    assert not loop.one_pass_layers(tf.keras.Model(seq, tf.keras.layers.Dense(2)(seq)))
    norm = tf.keras.layers.LayerNormalization()(tf.keras.layers.Dense(4)(inp))
    assert not loop.one_pass_layers(tf.keras.Model(inp, norm))
    assert loop.one_pass_layers(tf.keras.Model(inp, tf.keras.layers.Dense(1)(inp)))


def _batches(tf, sizes, rng):
    """A dataset of (step, features, labels) as ``batching.read_batches`` + the parser yield."""
    def gen():
        for step, m in enumerate(sizes):
            yield (np.int64(step), {"a": rng.normal(size=m).astype(np.float32) * 3,
                                    "b": rng.normal(size=m).astype(np.float32),
                                    "c": rng.integers(0, 5, m)},
                   rng.integers(0, 2, m).astype(np.float32))
    sig = (tf.TensorSpec((), tf.int64),
           {"a": tf.TensorSpec((None,), tf.float32), "b": tf.TensorSpec((None,), tf.float32),
            "c": tf.TensorSpec((None,), tf.int64)},
           tf.TensorSpec((None,), tf.float32))
    return tf.data.Dataset.from_generator(gen, output_signature=sig)


def test_each_update_adds_gaussian_noise_of_std_sigma_c_over_the_expected_batch(tf):
    """Noise-only steps (no example sampled) through the traced loop: with SGD(1) the update is
    -N(0, (σC)²)/(q·n) per coordinate — checked by a KS test on every weight of 6 steps, which
    a missing C, a wrong divisor (the realised size 0 would give inf) or a skipped step fails."""
    from scipy import stats

    from sage_tfx.components.dp_trainer import loop, objectives
    model = _mlp(tf)
    clip, sigma, expected = 0.5, 1.3, 8.0
    dp = loop.DPSGDLoop(model, loss=objectives.check_loss("binary_crossentropy"),
                        optimizer=tf.keras.optimizers.SGD(1.0), l2_norm_clip=clip,
                        noise_multiplier=sigma, expected_batch_size=expected, max_batch_size=16)
    before = np.concatenate([v.numpy().ravel() for v in dp._vars])
    steps = 6
    ids = dp._segment(iter(_batches(tf, [0] * steps, np.random.default_rng(1))), tf.constant(10))
    assert sorted(ids.numpy().tolist()) == list(range(steps))
    after = np.concatenate([v.numpy().ravel() for v in dp._vars])
    delta = (before - after).astype(np.float64)
    scale = clip * sigma * np.sqrt(steps) / expected        # the sum of 6 independent updates
    assert stats.kstest(delta / scale, "norm").pvalue > 1e-6  # unseeded: 1e-6 false alarms
    assert abs(np.std(delta) / scale - 1) < 0.1             # ~1,250 coordinates: ±3 % (1 s.d.)
    updates, lo, hi = dp.record.read()
    assert updates == steps and lo == pytest.approx(clip * sigma) == hi


def test_a_spilled_step_sums_its_chunks_once_and_adds_noise_once(tf):
    """A step of 37 examples with B = 16 runs three clipping chunks and one noisy update: with
    σ = 0 the update is exactly the clipped sum over all 37 / (q·n)."""
    from sage_tfx.components.dp_trainer import loop, objectives
    model = _mlp(tf)
    dp = loop.DPSGDLoop(model, loss=objectives.check_loss("binary_crossentropy"),
                        optimizer=tf.keras.optimizers.SGD(1.0), l2_norm_clip=0.5,
                        noise_multiplier=0.0, expected_batch_size=8.0, max_batch_size=16)
    data = list(_batches(tf, [37], np.random.default_rng(2)))[0]
    _, x, y = data
    expected = _brute_force(tf, dp, x, y, 0.5)
    before = [v.numpy().copy() for v in dp._vars]
    dp._segment(iter(_batches(tf, [37], np.random.default_rng(2))), tf.constant(5))
    for b, v, e in zip(before, dp._vars, expected):
        np.testing.assert_allclose(b - v.numpy(), e / 8.0, rtol=2e-4, atol=2e-6)
    assert dp.record.read()[0] == 1
