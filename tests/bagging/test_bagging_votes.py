"""Gumbel and Gaussian noisy-max votes: noise against its formula, ε against an independent
dp_accounting computation, an audit that catches half the noise, δ = 0 grants, zero-label refusal,
and what a granted run charges equals what it runs. Tiny configurations, bounded time."""
import dataclasses
import json
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy import stats

from sage_tfx.bagging import BaggingConfig, fit_dp_bagging, labels_from_grant, plan_labels
from sage_tfx.bagging import votes as V
from sage_tfx.dp import noise as noise_lib
from sage_tfx.errors import (GrantTooSmallError, InvalidPrivacyParameterError,
                             InvalidRequestError)
from sage_tfx.ledger import BlockSpec, open_ledger

Z = 5.0    # two-sided tolerance in binomial standard deviations (each test can fail)


def _binom_ok(hits, n, p):
    return abs(hits - n * p) <= Z * math.sqrt(n * p * (1 - p)) + 1


# --- the noise against its formula -----------------------------------------------------------

def test_gumbel_vote_is_the_exponential_mechanism():
    """OpenDP's Gumbel noisy-max at β = k/λ picks class c with probability ∝ exp(n_c/β)."""
    mech = V.mechanism("gumbel", k=5, lam=0.5)
    assert mech.noise_scale == pytest.approx(10.0) and mech.pure_epsilon == pytest.approx(1.0)
    counts = np.tile([20, 10, 0], (3000, 1))
    labels = V.draw_labels(counts, mech)
    probs = np.exp(np.array([20, 10, 0]) / 10.0)
    probs /= probs.sum()
    for c in range(3):
        assert _binom_ok(int((labels == c).sum()), 3000, probs[c]), (c, np.bincount(labels))
    # a vote with half the noise scale would be far off the formula
    half = V.draw_labels(counts[:3000], dataclasses.replace(mech, noise_scale=5.0))
    assert not _binom_ok(int((half == 0).sum()), 3000, probs[0])


def test_gaussian_vote_noise_is_sigma():
    """σ = √2·k/λ per count (OpenDP's Gaussian): the sample std of the noise and the label
    probability Φ(d / (√2σ)) of a two-class vote with margin d."""
    mech = V.mechanism("gaussian", k=5, lam=0.5)
    sigma = math.sqrt(2) * 5 / 0.5
    assert mech.noise_scale == pytest.approx(sigma)
    noise = np.asarray(noise_lib.gaussian(np.zeros(4000), mech.noise_scale))
    # chi-square interval for the sample variance
    lo, hi = stats.chi2.ppf([1e-6, 1 - 1e-6], 3999) / 3999
    assert lo * sigma ** 2 <= noise.var(ddof=1) <= hi * sigma ** 2
    labels = V.draw_labels(np.tile([15, 0], (3000, 1)), mech)
    assert _binom_ok(int((labels == 0).sum()), 3000, stats.norm.cdf(15 / (math.sqrt(2) * sigma)))


# --- ε against an independent dp_accounting computation --------------------------------------

def test_gumbel_epsilon_is_zcdp_rho_lambda_squared_over_two():
    lam, k, p, delta = 0.05, 7, 300, 1e-5
    mech = V.mechanism("gumbel", k=k, lam=lam)
    assert mech.rho == pytest.approx(lam ** 2 / 2, rel=1e-12)           # (2λ)²/8, OpenDP's map
    assert noise_lib.gumbel_max_rho(mech.noise_scale, k) == mech.rho
    orders = np.array(list(range(2, 200)) + [256, 512, 1024], dtype=float)
    independent = rdp_lib.compute_epsilon(orders, p * lam ** 2 / 2 * orders, delta)[0]
    assert V.epsilon_of(mech, p, delta, "rdp") == pytest.approx(independent, rel=2e-3)
    # PLD of a pure 2λ-DP mechanism, composed p times
    pure = pld_lib.from_privacy_parameters(pld_common.DifferentialPrivacyParameters(2 * lam, 0.0))
    assert V.epsilon_of(mech, p, delta, "pld") == pytest.approx(
        pure.self_compose(p).get_epsilon_for_delta(delta), rel=1e-6)
    assert V.epsilon_of(mech, p, delta, "pure") == pytest.approx(2 * lam * p)


def test_gaussian_epsilon_matches_the_gaussian_pld():
    lam, k, p, delta = 0.1, 3, 200, 1e-5
    mech = V.mechanism("gaussian", k=k, lam=lam)
    sigma = math.sqrt(2) * k / lam
    independent = pld_lib.from_gaussian_mechanism(sigma, sensitivity=math.sqrt(2) * k)
    assert V.epsilon_of(mech, p, delta, "pld") == pytest.approx(
        independent.self_compose(p).get_epsilon_for_delta(delta), rel=2e-3)
    orders = np.array(list(range(2, 200)) + [256, 512, 1024], dtype=float)
    rdp = p * orders * k ** 2 / sigma ** 2          # ℓ2 change √2·k: α·2k²/(2σ²)
    assert V.epsilon_of(mech, p, delta, "rdp") == pytest.approx(
        rdp_lib.compute_epsilon(orders, rdp, delta)[0], rel=2e-3)
    assert V.epsilon_of(mech, p, delta, "pure") == math.inf


@pytest.mark.parametrize("votes", V.VOTES)
def test_max_queries_is_the_best_bound_and_maximal(votes):
    mech = V.mechanism(votes, k=4, lam=0.1)
    p, eps, bound = V.max_queries(mech, 2.0, 1e-5)
    assert p >= 1 and eps <= 2.0
    assert eps == min(V.epsilon_of(mech, p, 1e-5, b) for b in V.BOUNDS)
    assert V.epsilon_of(mech, p, 1e-5, bound) == eps
    assert min(V.epsilon_of(mech, p + 1, 1e-5, b) for b in V.BOUNDS) > 2.0
    for b in V.BOUNDS:      # the best is at least every single bound
        assert p >= V.max_queries(mech, 2.0, 1e-5, accountant=b)[0]


def test_gumbel_buys_about_four_times_the_laplace_labels():
    """ρ = λ²/2 instead of the Laplace vote's (2λ)²/2 (issue 25's n = 250 setting, ε = 1)."""
    lap = V.max_queries(V.mechanism("laplace", k=50, lam=2 / 250), 1.0, 1e-5, accountant="rdp")
    gumbel = V.mechanism("gumbel", k=50, lam=2 / 250)
    gum = V.max_queries(gumbel, 1.0, 1e-5, accountant="rdp")
    assert lap[0] == 238 and gum[2] == "rdp"
    assert gum[0] >= 3.5 * lap[0]
    assert V.max_queries(gumbel, 1.0, 1e-5)[2] == "br"    # the bounded-range bound buys more


# --- empirical audits: the claim holds, half the noise is caught -----------------------------

def _cp(hits, n, alpha=1e-4):
    lo = stats.beta.ppf(alpha, hits, n - hits + 1) if hits else 0.0
    hi = stats.beta.ppf(1 - alpha, hits + 1, n - hits) if hits < n else 1.0
    return lo, hi


def _label1_rates(mech, counts_d, counts_d2, n):
    a = V.draw_labels(np.tile(counts_d, (n, 1)), mech)
    b = V.draw_labels(np.tile(counts_d2, (n, 1)), mech)
    return int((a == 1).sum()), int((b == 1).sum())


def test_gumbel_audit_holds_and_catches_half_the_noise():
    """Canary: the k = 5 teachers of one unit move their votes from class 0 to class 1. The
    Clopper–Pearson lower bound of ε from P(label 1) stays ≤ 2λ = 1; with half the noise it
    exceeds 1."""
    mech = V.mechanism("gumbel", k=5, lam=0.5)
    d, d2 = [20, 0], [15, 5]
    n = 6000

    def eps_lb(m):
        h, h2 = _label1_rates(m, d, d2, n)
        return math.log(_cp(h2, n)[0] / _cp(h, n)[1])

    assert eps_lb(mech) <= mech.pure_epsilon
    assert eps_lb(dataclasses.replace(mech, noise_scale=mech.noise_scale / 2)) > mech.pure_epsilon


def test_gaussian_audit_holds_and_catches_half_the_noise():
    """Same canary for GNMax at λ = 1: the lower bound of δ at ε = 1 from P(label 1) stays
    below the δ(1) dp_accounting's PLD gives one vote; with half the noise it exceeds it."""
    mech = V.mechanism("gaussian", k=5, lam=1.0)
    sigma = mech.noise_scale
    t = 0.75 * math.sqrt(2) * sigma           # margin: 0.75 noise std of the vote difference
    d, d2 = [round(t), 0], [round(t) - 5, 5]
    acct = dp_accounting.pld.PLDAccountant()
    acct.compose(mech.event)
    claim = acct.get_delta(1.0)
    n = 4000

    def delta_lb(m):
        h, h2 = _label1_rates(m, d, d2, n)
        return _cp(h2, n)[0] - math.e * _cp(h, n)[1]

    assert delta_lb(mech) <= claim
    assert delta_lb(dataclasses.replace(mech, noise_scale=sigma / 2)) > claim


# --- grants: δ = 0, zero labels, the λ = 0.5 case ------------------------------------

def test_pure_bound_buys_what_one_query_costs():
    """λ = 0.5: one query is exactly 1-DP; ε = 1 buys 1 label and ε = 2 buys 2 (was 0 and 1)."""
    cfg = BaggingConfig(k=3, n=10, lam=0.5)
    assert plan_labels(cfg, epsilon=1.0, delta=1e-5, public_size=100).queries == 1
    assert plan_labels(cfg, epsilon=2.0, delta=1e-5, public_size=100).queries == 2


@pytest.mark.parametrize("votes", ["laplace", "gumbel"])
def test_delta_zero_grant_for_pure_votes(votes):
    cfg = BaggingConfig(k=3, n=10, lam=0.1, votes=votes)
    plan = plan_labels(cfg, epsilon=1.0, delta=0.0, public_size=100)
    assert (plan.queries, plan.bound, plan.delta) == (5, "pure", 0.0)
    assert plan.epsilon == pytest.approx(5 * 0.2)


def test_gaussian_votes_refuse_delta_zero_and_bad_choices():
    with pytest.raises(GrantTooSmallError, match="no pure-DP bound"):
        plan_labels(BaggingConfig(k=3, n=10, lam=0.1, votes="gaussian"), epsilon=1.0, delta=0.0,
                    public_size=100)
    with pytest.raises(InvalidRequestError):
        BaggingConfig(k=3, n=10, lam=0.1, votes="cauchy")
    with pytest.raises(InvalidPrivacyParameterError):
        BaggingConfig(k=3, n=10, lam=0.1, accountant="moments")
    with pytest.raises(InvalidRequestError, match="Laplace votes only"):
        BaggingConfig(k=3, n=10, lam=0.1, votes="gumbel", mode="paper",
                      accept_not_differentially_private=True)


@pytest.mark.parametrize("votes", V.VOTES)
def test_a_grant_that_buys_no_label_is_refused(votes):
    X, y, units, Xp = _data()
    cfg = BaggingConfig(k=2, n=5, lam=1.0, votes=votes)     # one vote costs ε = 2 (pure)
    with pytest.raises(GrantTooSmallError, match="buys no label"):
        plan_labels(cfg, epsilon=0.5, delta=1e-5, public_size=len(Xp))
    with pytest.raises(GrantTooSmallError):
        fit_dp_bagging(X, y, units, Xp, config=cfg, salt=b"s", public_declared=True,
                       epsilon=0.5, delta=1e-5)


# --- what is charged equals what runs --------------------------------------------------------

def _data(N=300, P=200, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, 3))
    y = (X @ np.array([1.5, -1.0, 0.5]) > 0).astype(int)
    return X, y, np.arange(N) // 2, rng.normal(size=(P, 3))


def _ledger(tmp_path, mode="basic"):
    ledger = open_ledger(f"sqlite:///{tmp_path}/ledger.db")
    ledger.create_stream("s", epsilon_g=50.0, delta_g=1e-3, mode=mode)
    ledger.add_blocks("s", [BlockSpec("b1", str(tmp_path / "b1"))])
    return ledger


def test_delta_zero_gumbel_purchase_under_a_grant(tmp_path):
    X, y, units, Xp = _data()
    cfg = BaggingConfig(k=3, n=8, lam=0.1, votes="gumbel")
    ledger = _ledger(tmp_path)
    plan = plan_labels(cfg, epsilon=2.0, delta=0.0, public_size=len(Xp))
    d = ledger.request("s", run_id="r", blocks=["b1"], epsilon=plan.epsilon, delta=0.0)
    assert d.granted and plan.queries == 10
    res = fit_dp_bagging(X, y, units, Xp, config=cfg, salt=b"s", public_declared=True,
                         ledger=ledger, grant_id=d.grant.grant_id)
    rep = res.report
    assert ((rep["queries"], rep["vote_mechanism"], rep["bound"], rep["delta"])
            == (10, "gumbel", "pure", 0.0))
    assert len(res.labelling.labels) == 10 and rep["noise_scale"] == pytest.approx(30.0)
    assert rep["epsilon"] <= d.grant.epsilon
    again = fit_dp_bagging(X, y, units, Xp, config=cfg, salt=b"s", public_declared=True,
                           ledger=ledger, grant_id=d.grant.grant_id)
    assert again.replayed and np.array_equal(again.labelling.labels, res.labelling.labels)


@pytest.mark.parametrize("votes", ["gumbel", "gaussian"])
def test_rdp_grant_binds_the_vote_mechanism(tmp_path, votes):
    X, y, units, Xp = _data()
    cfg = BaggingConfig(k=3, n=8, lam=0.2, votes=votes)
    ledger = _ledger(tmp_path, mode="rdp")
    plan = plan_labels(cfg, epsilon=2.0, delta=1e-5, public_size=len(Xp))
    d = ledger.request("s", run_id="r", blocks=["b1"], event=plan.event)
    assert d.granted
    res = fit_dp_bagging(X, y, units, Xp, config=cfg, salt=b"s", public_declared=True,
                         ledger=ledger, grant_id=d.grant.grant_id)
    rep = res.report
    assert rep["queries"] == plan.queries == len(res.labelling.labels)
    assert rep["vote_mechanism"] == votes and rep["per_query_rho"] == pytest.approx(0.2 ** 2 / 2)
    from sage_tfx.ledger.accounting import event_from_dict
    assert event_from_dict(rep["event"]) == plan.event
    # the same charge does not describe another mechanism: refused before any vote
    other = "gaussian" if votes == "laplace" else "laplace"
    with pytest.raises(InvalidRequestError, match="not"):
        labels_from_grant(dataclasses.replace(cfg, votes=other), epsilon=None, delta=None,
                          event=plan.event, public_size=len(Xp), report_delta=1e-3)
    assert json.dumps(rep)      # JSON-able
