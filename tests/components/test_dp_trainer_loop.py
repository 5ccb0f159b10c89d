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
