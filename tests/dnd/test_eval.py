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
