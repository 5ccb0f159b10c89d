"""Count featurization PTK: declared event vs the noise that runs, noise scale vs its formula,
utility vs ε, input validation, store registration; the shared DomainTable."""
import numpy as np
import pytest

from sage_tfx.dp import counts as dp_counts
from sage_tfx.dp import noise as dp_noise
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ptk.abstraction import batches_of
from sage_tfx.ptk.kernels import counts

from kernel_checks import Recorder, check_discrete_laplace_draws, pure_charge, utility_gaps

CNT = "sage_tfx.ptk.kernels.counts"
CFG = {"label": "y", "features": {"k": {"domain": list(range(10))},
                                  "h": {"hash_width": 32, "hash_depth": 2}}}


def data(n, seed):
    rng = np.random.default_rng(seed)
    k = rng.integers(0, 10, n)
    h = rng.integers(0, 20, n)
    y = (rng.random(n) < 0.1 + 0.08 * k).astype(np.int64)
    return {"k": k, "h": h, "y": y}


def test_noise_that_runs_matches_the_declared_event():
    rec = Recorder()
    counts.train_dp(batches_of(data(200, 0)), 0.6, None, None, config=CFG, noise=rec)
    # two tables, eps/2 each; sensitivities 1 (domain) and hash_depth = 2 (count-min sketch)
    assert rec.scales() == [pytest.approx(1 / 0.3), pytest.approx(2 / 0.3)]
    # OpenDP's own privacy map of its discrete Laplace at each table's scale and sensitivity
    for sens, eps_i, scale in counts.noise_plan(0.6, CFG).values():
        assert dp_noise.laplace_epsilon(scale, sens, integer=True) == pytest.approx(eps_i)
    charge = pure_charge(CNT, 0.6, CFG)
    assert sum(1 / e.noise_multiplier for e in charge.event.events) == pytest.approx(0.6)


def test_domain_table_sensitivity_is_one_and_out_of_domain_keys_are_dropped():
    a, b = dp_counts.DomainTable(["x", "y"], 2), dp_counts.DomainTable(["x", "y"], 2)
    a.add(["x", "y", "z"], np.array([0, 1, 1]))
    b.add(["x", "y", "z", "y"], np.array([0, 1, 1, 0]))
    assert np.abs(a.cells - b.cells).sum() == a.l1_sensitivity == 1
    assert a.cells.sum() == 2
    assert a.estimate(["z"]).tolist() == [[0.0, 0.0]]
    with pytest.raises(InvalidRequestError):
        dp_counts.DomainTable(["x", "x"], 2)


def test_empirical_noise_std_matches_formula():
    cfg = {"label": "y", "features": {"k": {"domain": list(range(10))}}}
    d = data(300, 1)
    eps, noise, draws = 0.5, SeededNoise(2), []
    for _ in range(300):
        s = counts.train_dp(batches_of(d), eps, None, None, config=cfg, noise=noise)
        draws.append(np.asarray(s["tables"]["k"])[3, 1])
    true = int(np.sum((d["k"] == 3) & (d["y"] == 1)))
    check_discrete_laplace_draws(draws, true, 1 / eps)


def test_utility_approaches_nonprivate_as_epsilon_grows():
    train, test = data(3000, 3), data(2000, 4)
    gaps = utility_gaps(counts, CFG, train, test, (0.01, 0.1, 10.0), seeds=range(5))
    assert gaps[0] > gaps[1] > gaps[2] >= -1e-3
    assert gaps[2] < 0.002
    # the features carry the signal: rate of label 1 increases with k
    f = counts.featurize({"k": np.arange(10), "h": np.zeros(10)},
                         counts.erm(batches_of(train), config=CFG), CFG)
    assert np.corrcoef(np.arange(10), f["cnt_k_rate1"])[0, 1] > 0.95


def test_unseen_keys_back_off_to_the_prior():
    train = data(500, 5)
    s = counts.erm(batches_of(train), config=CFG)
    f = counts.featurize({"k": np.array([99]), "h": np.array([0])}, s, CFG)
    assert f["cnt_k_rate1"][0] == pytest.approx(s["prior"][1])
    assert f["cnt_k_logn"][0] == 0.0


def test_accumulate_sums_windows():
    cfg = dict(CFG, accumulate=True)
    s1 = counts.erm(batches_of(data(100, 6)), config=cfg)
    s2 = counts.train_dp(batches_of(data(100, 7)), 1.0, s1, cfg, config=cfg, noise=SeededNoise(0))
    assert np.asarray(s2["tables"]["k"]).sum() > 150


@pytest.mark.parametrize("bad", [
    {"features": {"k": {"domain": [1]}}},                        # no label
    {"label": "y", "features": {}},                              # nothing declared
    {"label": "y", "features": {"k": {}}},                       # neither domain nor hashing
    {"label": "y", "features": {"k": {"domain": [1], "hash_width": 8}}},
    {"label": "y", "features": {"k": {"hash_width": 6}}},        # not a power of two
    {"label": "y", "features": {"k": {"domain": []}}},
    {"label": "y", "n_labels": 1, "features": {"k": {"domain": [1]}}},
    {"label": "y", "smoothing": 0, "features": {"k": {"domain": [1]}}},
])
def test_bad_config_is_refused(bad):
    with pytest.raises(InvalidRequestError):
        counts.dp_event(1.0, bad)


def test_bad_labels_and_missing_columns_are_refused():
    d = data(10, 8)
    with pytest.raises(InvalidRequestError):
        counts.erm([dict(d, y=d["y"] + 5)], config=CFG)
    with pytest.raises(InvalidRequestError):
        counts.erm([{"k": d["k"], "y": d["y"]}], config=CFG)

