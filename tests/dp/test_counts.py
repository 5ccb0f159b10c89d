"""dp.counts and dp.count_selection: sketches, their sensitivity, noise scale, stable hashing."""
import itertools
import math
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from sage_tfx.dp import counts as C
from sage_tfx.dp import count_selection as S
from sage_tfx.dp.noise import SECURE, SeededNoise
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError


def _sketch(kind, depth=5, width=64, n_labels=3):
    return C.CountSketch(kind, depth, width, n_labels, b"salt")


@pytest.mark.parametrize("kind", C.SKETCH_KINDS)
def test_one_observation_changes_exactly_h_cells_by_one_in_its_label_column(kind):
    rng = np.random.default_rng(0)
    keys = [f"u{int(v)}" for v in rng.integers(0, 40, 300)]
    labels = rng.integers(0, 3, 300)
    base = _sketch(kind)
    base.add(keys, labels)
    for key, label in [("u3", 2), ("new-key", 0), (("pair", 7), 1)]:
        plus = _sketch(kind)
        plus.add(keys + [key], np.append(labels, label))
        diff = plus.cells - base.cells
        assert np.abs(diff).sum() == base.l1_sensitivity == 5      # h, not h * n_labels
        assert np.count_nonzero(diff) == 5
        assert set(np.nonzero(diff)[2]) == {label}                  # only the label column
        assert np.count_nonzero(diff.any(axis=(1, 2))) == 5         # one cell in each row


def test_sensitivity_of_n_tables_over_k_observations():
    assert C.l1_sensitivity(4, 5, 1) == 20
    assert C.l1_sensitivity(4, 5, 3) == 60
    # Empirically: 3 tables, k = 2 observations added.
    rng = np.random.default_rng(1)
    keys = [[f"{t}-{int(v)}" for v in rng.integers(0, 30, 100)] for t in range(3)]
    labels = rng.integers(0, 2, 100)
    extra = [[f"{t}-x", f"{t}-3"] for t in range(3)]
    total = 0
    for t in range(3):
        a, b = _sketch(C.COUNT_MEDIAN, n_labels=2), _sketch(C.COUNT_MEDIAN, n_labels=2)
        a.add(keys[t], labels)
        b.add(keys[t] + extra[t], np.append(labels, [0, 1]))
        total += np.abs(b.cells - a.cells).sum()
    assert total == C.l1_sensitivity(3, 5, 2)


def test_even_and_weighted_splits_compose_to_epsilon():
    eps = C.table_epsilons(1.0, n_tables=4)
    assert np.allclose(eps, 0.25) and math.isclose(eps.sum(), 1.0)
    assert np.allclose(C.noise_scales(eps, depth=5, k=1), 20.0)     # paper: b = n h k / eps
    w = C.table_epsilons(2.0, weights=[1.0, 10.0, 100.0])
    assert math.isclose(w.sum(), 2.0)
    scales = C.noise_scales(w, depth=5)
    assert np.allclose(scales / scales[0], [1.0, 10.0, 100.0])       # noise scale ∝ weight
    # Composition: the per-table pure-DP epsilons OpenDP's map reports sum to the total.
    from sage_tfx.dp.noise import laplace_epsilon
    assert math.isclose(sum(laplace_epsilon(s, 5, integer=True) for s in scales), 2.0,
                        rel_tol=1e-9)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_bad_epsilon_is_refused(bad):
    with pytest.raises(InvalidPrivacyParameterError):
        C.table_epsilons(bad, n_tables=2)


@pytest.mark.parametrize("bad", [[1.0, 0.0], [1.0, -2.0], [float("nan")], []])
def test_bad_weights_are_refused(bad):
    with pytest.raises(InvalidPrivacyParameterError):
        C.table_epsilons(1.0, weights=bad)


@pytest.mark.parametrize("width", [0, 1, 3, 1000, 2.0, True])
def test_width_must_be_a_power_of_two(width):
    with pytest.raises(InvalidRequestError):
        C.CountSketch(C.COUNT_MIN, 5, width, 2, b"s")


@pytest.mark.parametrize("depth", [0, 9, 2.5])
def test_depth_bounds(depth):
    with pytest.raises(InvalidRequestError):
        C.CountSketch(C.COUNT_MIN, depth, 64, 2, b"s")


def test_labels_out_of_range_change_nothing():
    s = _sketch(C.COUNT_MIN)
    with pytest.raises(InvalidRequestError):
        s.add(["a", "b"], [0, 3])
    with pytest.raises(InvalidRequestError):
        s.add(["a", "b"], [0.5, 1.0])
    assert not s.cells.any()


def test_exact_without_collisions_and_count_min_overcounts_only():
    rng = np.random.default_rng(2)
    keys = [int(v) for v in rng.zipf(1.5, 2000) % 500]
    labels = rng.integers(0, 2, 2000)
    exact = C.CountTable(2)
    exact.add(keys, labels)
    cm = C.CountSketch(C.COUNT_MIN, 5, 64, 2, b"s")
    cm.add(keys, labels)
    probe = sorted(set(keys))
    truth = exact.estimate(probe)
    assert np.all(cm.estimate(probe) >= truth)
    wide = C.CountSketch(C.COUNT_MEDIAN, 5, 2 ** 16, 2, b"s")
    wide.add(keys, labels)
    assert np.array_equal(wide.estimate(probe), truth)


def test_count_median_is_unbiased_under_noise_and_count_min_is_biased_down():
    keys = [f"k{i % 50}" for i in range(5000)]
    labels = np.zeros(5000, dtype=int)
    truth = 100.0
    err_med, err_min = [], []
    for seed in range(40):
        for kind, errs in ((C.COUNT_MEDIAN, err_med), (C.COUNT_MIN, err_min)):
            s = C.CountSketch(kind, 5, 4096, 2, b"s")
            s.add(keys, labels)
            s.add_noise(50.0, SeededNoise(seed))
            errs.append(s.estimate([f"k{i}" for i in range(50)])[:, 0].mean() - truth)
    assert abs(np.mean(err_med)) < 5
    assert np.mean(err_min) < -30   # min of 5 Laplace(50) draws is strongly negative


def test_opendp_noise_scale_matches_the_formula():
    # discrete Laplace of scale b = n h k / eps: its variance is 2q/(1-q)^2, q = e^{-1/b}.
    n, h, k, eps = 3, 5, 1, 1.5
    scale = C.noise_scales(C.table_epsilons(eps, n_tables=n), depth=h, k=k)[0]
    assert math.isclose(scale, n * h * k / eps)
    s = C.CountSketch(C.COUNT_MEDIAN, h, 2048, 2, b"s")
    s.add_noise(scale, SECURE)
    x = s.cells.ravel().astype(float)
    q = math.exp(-1 / scale)
    var = 2 * q / (1 - q) ** 2
    assert abs(x.mean()) < 4 * math.sqrt(var / x.size)
    assert abs(x.var() / var - 1) < 0.05
    # The shape is Laplace: KS test against the continuous Laplace of the same scale, loosely.
    assert stats.kstest(x + np.random.default_rng(0).uniform(-0.5, 0.5, x.size),
                        stats.laplace(scale=scale).cdf).statistic < 0.02


def test_empirical_privacy_audit_of_one_cell():
    # Neighbouring sketches differ by 1 in one cell; with scale h/eps each cell's likelihood
    # ratio is bounded by e^{eps/h}. Estimate P[out = v] for D and D' and compare.
    eps, h = 1.0, 5
    scale = h / eps
    d = SeededNoise(3).discrete_laplace(np.zeros(400_000, dtype=np.int64), scale)
    dp_ = SeededNoise(4).discrete_laplace(np.ones(400_000, dtype=np.int64), scale)
    ratios = []
    for v in range(-5, 6):
        a, b = np.mean(d == v), np.mean(dp_ == v)
        ratios.append(abs(math.log(a / b)))
    assert max(ratios) < eps / h * 1.5 and max(ratios) > eps / h * 0.5


def test_hashing_is_stable_across_processes():
    code = ("from sage_tfx.dp.counts import key_hashes;"
            "b,s=key_hashes(['a',('x',1),3,2.5,None],b'salt',5,1024);"
            "print(b.tolist(),s.tolist())")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={"PYTHONHASHSEED": str(seed), "PATH": ""}, check=True).stdout
            for seed in (1, 2)}
    assert len(outs) == 1
    b, s = C.key_hashes(["a", ("x", 1), 3, 2.5, None], b"salt", 5, 1024)
    assert outs.pop().strip() == f"{b.tolist()} {s.tolist()}"
    b2, _ = C.key_hashes(["a"], b"other", 5, 1024)
    assert b2.tolist() != b[:1].tolist()
    assert C.encode_key(1) == C.encode_key(1.0) != C.encode_key("1")


def test_hash_rows_are_roughly_uniform():
    b, s = C.key_hashes(list(range(20000)), b"s", 5, 16)
    for r in range(5):
        counts = np.bincount(b[:, r], minlength=16)
        assert stats.chisquare(counts).pvalue > 1e-4
    assert abs(s.mean()) < 0.03


# -- count_selection --

def test_mi_score_matches_sklearn():
    from sklearn.metrics import mutual_info_score
    rng = np.random.default_rng(5)
    x = rng.integers(0, 7, 500)
    y = (x + rng.integers(0, 3, 500)) % 2
    assert math.isclose(S.mi_score(x.tolist(), y), 500 * mutual_info_score(x, y), rel_tol=1e-9)


def test_mi_score_sensitivity_bound_holds_on_adversarial_neighbours():
    rng = np.random.default_rng(6)
    worst = 0.0
    for trial in range(150):
        n = int(rng.integers(1, 60))
        x = rng.integers(0, int(rng.integers(1, 10)), n).tolist()
        y = rng.integers(0, 2, n)
        base = S.mi_score(x, y)
        for xv, yv in itertools.product(list(set(x)) + [99], [0, 1]):
            worst = max(worst, abs(S.mi_score(x + [xv], np.append(y, yv)) - base)
                        / S.mi_score_sensitivity(n + 1))
        if n > 1:
            worst = max(worst, abs(S.mi_score(x[1:], y[1:]) - base) / S.mi_score_sensitivity(n))
    assert worst <= 1.0
    assert worst > 0.3     # the bound is not vacuous


def test_private_quantile_is_close_at_high_epsilon_and_refuses_bad_input():
    data = np.random.default_rng(7).poisson(40, 3000)
    q = S.private_count_quantile(data, 0.1, 5.0, 10_000)
    assert 0.7 * np.quantile(data, 0.1) <= q <= 1.3 * np.quantile(data, 0.1)
    with pytest.raises(InvalidPrivacyParameterError):
        S.private_count_quantile(data, 0.1, 0.0, 100)
    with pytest.raises(InvalidRequestError):
        S.private_count_quantile(data, 1.0, 1.0, 100)


def test_private_top_k_picks_clear_winners_and_is_random_when_scores_tie():
    assert sorted(S.private_top_k([0, 1000, 2, 900], 2, 1.0, 1.0)) == [1, 3]
    picks = {S.private_top_k([5.0] * 4, 1, 1.0, 1.0)[0] for _ in range(40)}
    assert len(picks) > 1
    with pytest.raises(InvalidRequestError):
        S.private_top_k([1.0, 2.0], 3, 1.0, 1.0)
