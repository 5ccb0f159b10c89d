"""DP tree featurization PTK: the gini utility's sensitivity and monotonicity, the noise that runs
vs the declared event and OpenDP's map, selection / leaf noise vs their formulas, utility vs ε,
input validation, store registration."""
import json

import numpy as np
import pytest

from sage_tfx.dp import noise as dp_noise
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError
from sage_tfx.ptk.abstraction import batches_of
from sage_tfx.ptk.kernels import trees

from kernel_checks import Recorder, check_discrete_laplace_draws, pure_charge, utility_gaps

TR = "sage_tfx.ptk.kernels.trees"
CFG = {"label": "y", "numeric": {"a": [float(t) for t in range(1, 10)]},
       "categorical": {"b": ["0", "1", "2", "3", "4"]}, "n_trees": 3, "depth": 3,
       "features_per_node": 2}


def data(n, seed):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 10, n)
    b = rng.integers(0, 5, n).astype(str)
    y = ((a > 5) ^ (b == "2")).astype(np.int64)
    return {"a": a, "b": b, "y": np.where(rng.random(n) < 0.1, 1 - y, y)}


def test_gini_utility_moves_by_less_than_two_and_all_in_one_direction():
    c = trees.check_config(dict(CFG, n_labels=3))
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(300):
        n = int(rng.integers(0, 12))
        d = {"a": rng.uniform(0, 10, n + 1), "b": rng.integers(0, 6, n + 1).astype(str),
             "y": rng.integers(0, 3, n + 1)}
        for col in ("a", "b"):
            big = trees._bins(d, c)[col]
            u_small = trees.split_utilities(col, big[:n], d["y"][:n], c)
            u_big = trees.split_utilities(col, big, d["y"], c)
            diff = u_big - u_small          # adding one record
            assert np.all(diff <= 1e-12) and np.all(diff > -2.0)
            worst = max(worst, float(-diff.min()))
    assert worst > 1.5                     # the bound 2 is nearly reached, so it is not loose


def test_noise_that_runs_matches_the_declared_event_and_opendp_map():
    rec = Recorder()
    trees.train_dp(batches_of(data(300, 1)), 0.8, None, None, config=CFG, noise=rec)
    eps_l = 0.8 / (3 * 4)
    sel = [x for x in rec.calls if x[0] == "noisy_max"]
    leaf = [x for x in rec.calls if x[0] == "discrete_laplace"]
    assert len(sel) == 3 * (2 ** 3 - 1) and len(leaf) == 3
    assert all(s[1] == pytest.approx(2 / eps_l) and s[2] is True for s in sel)
    assert all(s[1] == pytest.approx(1 / eps_l) for s in leaf)
    assert dp_noise.noisy_max_epsilon(2 / eps_l, 2.0, monotonic=True) == pytest.approx(eps_l)
    charge = pure_charge(TR, 0.8, CFG)
    assert charge.event.count * (1 / charge.event.event.noise_multiplier) == pytest.approx(0.8)


@pytest.mark.parametrize("source", [dp_noise.SECURE, SeededNoise(4)])
def test_selection_probability_matches_exponential_noise_formula(source):
    # report-noisy-max with Exp(scale) noise on two scores a gap g apart picks the lower one with
    # probability exp(-g/scale)/2
    scale, gap, runs = 1.0, 0.7, 3000
    lower = sum(source.noisy_max([0.0, gap], scale, monotonic=True) == 0 for _ in range(runs))
    p = 0.5 * np.exp(-gap / scale)
    assert lower / runs == pytest.approx(p, abs=4 * np.sqrt(p * (1 - p) / runs))


def test_leaf_count_noise_std_matches_formula():
    cfg = dict(CFG, n_trees=1, depth=1)
    d, eps, draws = data(200, 2), 0.6, []
    noise = SeededNoise(5)
    for _ in range(300):
        s = trees.train_dp(batches_of(d), eps, None, None, config=cfg, noise=noise)
        draws.append(np.asarray(s["trees"][0]["leaf_counts"]).sum())
    # one tree, one split level + the leaf level: scale 1 / (eps / 2); four independent leaf
    # cells, whatever split is chosen, sum to 200 + noise
    check_discrete_laplace_draws(draws, 200, 1 / (eps / 2), cells=4)


def test_utility_approaches_nonprivate_as_epsilon_grows():
    train, test = data(3000, 3), data(2000, 4)
    gaps = utility_gaps(trees, CFG, train, test, (0.05, 1.0, 100.0), seeds=range(4))
    assert gaps[0] > gaps[1] > gaps[2] - 1e-3 and abs(gaps[2]) < 0.005 and gaps[0] > 0.02


def test_features_and_state():
    s = trees.train_dp(batches_of(data(500, 5)), 1.0, None, None,
                       config=dict(CFG, output="both"), noise=SeededNoise(0))
    json.dumps(s)
    f = trees.featurize(data(7, 6), s, dict(CFG, output="both"))
    assert len(f) == 3 + 3 * 8
    onehot = np.column_stack([f[f"tree0_leaf{k}"] for k in range(8)])
    assert np.all(onehot.sum(axis=1) == 1)
    assert all(np.all((v >= 0) & (v <= 1)) for v in f.values())


@pytest.mark.parametrize("bad", [
    {"numeric": {"a": [1.0]}},                                  # no label
    {"label": "y"},                                             # no features
    {"label": "y", "numeric": {"a": [2.0, 1.0]}},               # thresholds not increasing
    {"label": "y", "numeric": {"a": []}},
    {"label": "y", "categorical": {"b": ["x", "x"]}},
    {"label": "y", "numeric": {"a": [1.0]}, "depth": 0},
    {"label": "y", "numeric": {"a": [1.0]}, "features_per_node": 2},
    {"label": "y", "numeric": {"a": [1.0]}, "output": "ids"},
])
def test_bad_config_is_refused(bad):
    with pytest.raises(InvalidRequestError):
        trees.dp_event(1.0, bad)


def test_bad_budget_labels_and_columns_are_refused():
    with pytest.raises(InvalidPrivacyParameterError):
        trees.dp_event(0.0, CFG)
    d = data(20, 7)
    with pytest.raises(InvalidRequestError):
        trees.erm([dict(d, y=d["y"] + 2)], config=CFG)
    with pytest.raises(InvalidRequestError):
        trees.erm([{"a": d["a"], "y": d["y"]}], config=CFG)



def test_noisy_max_refuses_bad_input_and_reports_opendp_epsilon():
    for source in (dp_noise.SECURE, SeededNoise(0)):
        with pytest.raises(InvalidPrivacyParameterError):
            source.noisy_max([1.0, 2.0], 0.0)
        with pytest.raises(ValueError):
            source.noisy_max([], 1.0)
        with pytest.raises(ValueError):
            source.noisy_max([1.0, float("nan")], 1.0)
    # not monotonic: twice the epsilon at the same scale
    assert dp_noise.noisy_max_epsilon(4.0, 2.0) == pytest.approx(1.0)
    assert dp_noise.noisy_max_epsilon(4.0, 2.0, monotonic=True) == pytest.approx(0.5)
