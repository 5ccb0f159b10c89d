"""DP hierarchical Poisson factorization PTK: the noise that runs vs the declared event, the
cell noise vs its formula, sensitivity of the count matrix, utility vs ε, validation."""
import json

import numpy as np
import pytest

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError
from sage_tfx.ptk.abstraction import batches_of
from sage_tfx.ptk.kernels import hpf

from kernel_checks import Recorder, check_discrete_laplace_draws, pure_charge, utility_gaps

HPF = "sage_tfx.ptk.kernels.hpf"
CFG = {"user": "u", "item": "i", "users": list(range(30)), "items": {"domain": list(range(12))},
       "k": 2, "iterations": 30}


def data(n, seed):
    """Two user types, each interacting mostly with one half of the items."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 30, n)
    half = rng.random(n) < 0.9
    i = np.where((u % 2 == 0) == half, rng.integers(0, 6, n), rng.integers(6, 12, n))
    return {"u": u, "i": i, "y": (u % 2).astype(np.int64)}


def test_noise_that_runs_matches_the_declared_event():
    rec = Recorder()
    hpf.train_dp(batches_of(data(200, 0)), 0.7, None, None, config=CFG, noise=rec)
    assert rec.scales() == [pytest.approx(1 / 0.7)]
    assert 1 / pure_charge(HPF, 0.7, CFG).event.noise_multiplier == pytest.approx(0.7)


def test_one_record_changes_one_cell_by_one():
    c = hpf.check_config(CFG)
    d = data(100, 1)
    d2 = {k: np.append(v, v[:1]) for k, v in d.items()}
    diff = hpf._matrix([d2], c).cells - hpf._matrix([d], c).cells
    assert np.abs(diff).sum() == 1
    out = {k: np.append(v, [99]) for k, v in d.items()}   # outside the declared domains
    assert np.abs(hpf._matrix([out], c).cells - hpf._matrix([d], c).cells).sum() == 0


def test_empirical_cell_noise_matches_formula():
    d, eps, noise, draws = data(300, 2), 0.5, SeededNoise(3), []
    for _ in range(300):
        s = hpf.train_dp(batches_of(d), eps, None, None, config=dict(CFG, iterations=1),
                         noise=noise)
        draws.append(np.asarray(s["counts"])[4, 3])
    true = int(np.sum((d["u"] == 4) & (d["i"] == 3)))
    check_discrete_laplace_draws(draws, true, 1 / eps)


def test_utility_approaches_nonprivate_as_epsilon_grows():
    train, test = data(3000, 4), data(1500, 5)
    gaps = utility_gaps(hpf, CFG, train, test, (0.02, 0.1, 50.0))
    assert gaps[0] > gaps[1] > gaps[2] - 1e-3 and abs(gaps[2]) < 0.005 and gaps[0] > 0.02
    # the embeddings separate the two user types
    s = hpf.erm(batches_of(train), config=CFG)
    f = hpf.featurize({"u": np.arange(30)}, s, CFG)
    top = np.argmax(np.column_stack([f["hpf_u0"], f["hpf_u1"]]), axis=1)
    assert len(set(top[::2]) & set(top[1::2])) == 0
    json.dumps(s)


def test_hashed_items_and_unknown_users():
    cfg = dict(CFG, items={"hash_width": 8})
    s = hpf.train_dp(batches_of(data(500, 6)), 1.0, None, None, config=cfg, noise=SeededNoise(0))
    assert np.asarray(s["beta"]).shape == (8, 2)
    f = hpf.featurize({"u": np.array([999])}, s, cfg)
    assert np.isfinite(f["hpf_act"]).all()
    assert hpf.eval([{"u": np.array([999]), "i": np.array([1])}], s, config=cfg).tolist() == [1.0]


@pytest.mark.parametrize("bad", [
    {"item": "i", "users": [1], "items": {"domain": [1]}},                  # no user column
    {"user": "u", "item": "i", "users": [], "items": {"domain": [1]}},
    {"user": "u", "item": "i", "users": [1, 1], "items": {"domain": [1]}},
    {"user": "u", "item": "i", "users": [1], "items": {}},
    {"user": "u", "item": "i", "users": [1], "items": {"hash_width": 7}},
    {"user": "u", "item": "i", "users": [1], "items": {"domain": [1]}, "k": 0},
    {"user": "u", "item": "i", "users": [1], "items": {"domain": [1]}, "a": -1.0},
])
def test_bad_config_is_refused(bad):
    with pytest.raises(InvalidRequestError):
        hpf.dp_event(1.0, bad)


def test_bad_budget_and_missing_columns_are_refused():
    with pytest.raises(InvalidPrivacyParameterError):
        hpf.dp_event(-1.0, CFG)
    with pytest.raises(InvalidRequestError):
        hpf.erm([{"u": np.array([1])}], config=CFG)
