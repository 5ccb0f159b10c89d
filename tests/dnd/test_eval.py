"""The evaluation library on tiny configurations (full runs live in benchmarks/dnd/)."""
import numpy as np
import pytest

from sage_tfx.dnd import ClientConfig
from sage_tfx.dnd.eval import digits, known_weights, phishing


def test_digits_curves_record_progress_and_server_batching_runs():
    s = digits.Setting(passes=2, points=2)
    data = digits.load()
    curves = digits.run_all(
        digits.fig2_k(s, ks=(1,)) + digits.fig2_batching(s, ks=(), batches=(10,)),
                            s, data)
    k1, batch = curves
    assert k1.updates == 2 * (len(data[1]) // 10) and len(k1.samples) == 2
    assert k1.test_accuracy[-1] > 0.6  # one model, 250 noise-free steps: clearly above chance
    assert batch.label == "N_s=10" and batch.train_loss[-1] < batch.train_loss[0] + 1e-9


def test_known_weights_formula_has_33_terms_and_the_papers_metrics():
    assert len(known_weights.TERMS) == 33 and known_weights.SPEC.dim == 33
    x, y = known_weights.synthesize(50_000, np.random.default_rng(0))
    assert x.min() >= 0 and x.max() <= 1
    m = known_weights._metrics(known_weights.TRUE_WEIGHTS, x, y)
    # The true model on our synthetic features scores like the paper's production model.
    assert m["accuracy"] == pytest.approx(0.80, abs=0.03)
    assert m["precision"] == pytest.approx(0.79, abs=0.08)
    assert m["recall"] == pytest.approx(0.72, abs=0.08)


def test_phishing_features_are_public_bounded_and_time_ordered():
    x, y, week = phishing.load()
    assert x.shape == (3921, phishing.SPEC.n_features) and 0 <= x.min() and x.max() <= 1
    assert np.all(np.diff(week) >= 0) and 0.05 < y.mean() < 0.15


def test_phishing_private_run_is_charged_to_the_ledger():
    r = phishing.run("tiny", ClientConfig(0.05, 1.0, 2.0), k=4, passes=1, test_weeks=3)
    assert r.charged_epsilon == pytest.approx(2.0) and r.train_blocks == 10
    assert 0.0 <= r.metrics["roc_auc"] <= 1.0


def test_batched_simulation_is_alg1_and_tracks_the_sequential_path():
    """The batched path's gradients and clipping equal GLMSpec.gradient and clip_gradient for
    every unit, and without noise it learns digits as the sequential DnDState path does."""
    from sage_tfx.dnd.client import clip_gradient
    from sage_tfx.dnd.eval import batched
    from sage_tfx.dnd.eval.simulate import RunConfig, run_curve
    spec = digits.SPEC
    xtr, ytr, xte, yte = digits.load()
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, spec.dim))
    rows = rng.integers(0, len(ytr), size=(3, 10))
    xt = np.hstack([np.ones((len(ytr), 1)), xtr])
    got = batched._grads(w.reshape(3, 10, 65), xt[rows], np.eye(10)[ytr[rows]])
    want = np.stack([spec.gradient(w[i], xtr[rows[i]], ytr[rows[i]]) for i in range(3)])
    assert np.allclose(got, want)
    for cfg in (ClientConfig(0.1, 0.3, 1.0, "model"), ClientConfig(0.1, 0.01, 1.0, "feature"),
                ClientConfig(0.1, epsilon=1.0, unit="gaussian", delta=1e-6, l2_norm_clip=0.2)):
        assert np.allclose(batched._clip(want, cfg), [clip_gradient(g, cfg) for g in want])
    cfg = ClientConfig(0.05, 1.0, None, "feature")
    seq = run_curve(spec, RunConfig("k=5", 5, cfg), xtr, ytr, xte, yte, passes=16, points=1)
    bat = batched.run_batched(spec, cfg, 5, xtr, ytr, xte, yte, updates=seq.updates,
                              marks=[seq.updates], in_flight=1)
    assert seq.test_accuracy[-1] > 0.6 and bat.test_accuracy[-1] > 0.6
    assert abs(seq.test_accuracy[-1] - bat.test_accuracy[-1]) < 0.15
