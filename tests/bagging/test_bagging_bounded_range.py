"""The bounded-range (Dong–Durfee–Rogers) bound of Gumbel votes: exact pure-DP behaviour for one
query, never below an independent enumeration of the worst-case pairs (heterogeneous t's too),
dp_accounting's PLD of the pair against an independent binomial, and the labels it buys.
Small configurations, bounded time."""
import itertools
import math

import numpy as np
import pytest
from scipy import stats

from sage_tfx.bagging import bounded_range as br
from sage_tfx.bagging import votes as V


def _rr(eps, t):
    """RR(t): [(P-probability, privacy loss)] of its two outcomes (independent of the module)."""
    a = (math.exp(eps) - math.exp(t)) / (math.exp(eps) - 1.0)
    return [(a, t), (1.0 - a, t - eps)]


def _enumerated_delta(eps, ts, eps_g):
    """δ(ε_g) of RR(t_1) × … × RR(t_k), by enumerating the 2^k outcomes."""
    total = 0.0
    for outcome in itertools.product(*(_rr(eps, t) for t in ts)):
        prob = math.prod(m for m, _ in outcome)
        loss = sum(v for _, v in outcome)
        total += prob * max(0.0, 1.0 - math.exp(eps_g - loss))
    return total


def test_one_query_is_exactly_pure_dp():
    for eps in (0.1, 0.7, 2.0):
        assert br.delta(eps, 1, eps) == 0.0                       # δ(ε) = 0: ε-DP
        assert br.delta(eps, 1, 1.5 * eps) == 0.0
        assert br.delta(eps, 1, 0.9 * eps) > 0.0                  # and not (0.9ε, 0)-DP
        assert br.epsilon(eps, 1, 0.0) == eps
        assert br.epsilon(eps, 1, 1e-3) <= eps
    mech = V.mechanism("gumbel", k=3, lam=0.25)                  # 2λ = 0.5 BR
    assert V.epsilon_of(mech, 1, 1e-6, "br") <= mech.pure_epsilon
    assert V.max_queries(mech, 0.5, 0.0) == (1, 0.5, "pure")      # δ = 0: the pure bound


@pytest.mark.parametrize("eps", [0.3, 1.0])
def test_never_below_enumeration_of_every_worst_case_pair(eps):
    """For k ≤ 3 compositions: δ at every ε_g is ≥ the enumerated δ of every (t_1, …, t_k) on a
    grid (heterogeneous t's included), within 1e-6 of the best equal-t value on a fine grid
    (it is the optimum, not a loose bound), and at the ε it returns for δ the enumeration is ≤ δ."""
    for k, steps in ((1, 201), (2, 31), (3, 11)):
        grid = np.linspace(0.0, eps, steps)
        fine = np.linspace(0.0, eps, 1001)
        for eps_g in np.linspace(-0.5 * eps, k * eps, 7):
            ours = br.delta(eps, k, float(eps_g))
            worst = max(_enumerated_delta(eps, ts, eps_g)
                        for ts in itertools.product(grid, repeat=k))
            assert ours >= worst - 1e-12, (k, eps_g, ours, worst)
            homogeneous = max(_enumerated_delta(eps, [t] * k, eps_g) for t in fine)
            assert ours <= homogeneous + 1e-6, (k, eps_g, ours, homogeneous)
        for target in (1e-1, 1e-3):
            e = br.epsilon(eps, k, target)
            assert max(_enumerated_delta(eps, [t] * k, e) for t in fine) <= target + 1e-12
    # the enumeration has power: the middle t alone understates the worst case here
    assert _enumerated_delta(1.0, [0.5] * 2, 1.5) < br.delta(1.0, 2, 1.5) - 1e-3


def test_pld_of_the_pair_matches_an_independent_binomial():
    """dp_accounting's composed PLD of RR(t) (the cross-check inside ``delta``) against the
    binomial distribution of the number of high-loss outcomes."""
    eps, p = 0.05, 400
    for t in (0.0123, 0.025, 0.04):
        pld, frac = br.rr_pld(eps, t, p)
        a = _rr(eps, t)[0][0]
        j = np.arange(p + 1)
        loss = p * t - (p - j) * eps
        for eps_g in (0.2, 0.5, 1.0):
            exact = float((stats.binom.pmf(j, p, a) * np.clip(
                1 - np.exp(eps_g - loss), 0, None)).sum())
            assert pld.get_delta_for_epsilon(eps_g - frac) == pytest.approx(exact, rel=1e-6,
                                                                            abs=1e-14)


def test_more_labels_than_the_pure_dp_pld_and_the_best_picks_it():
    """n = 250 (λ = 2/250), δ = 1e-5, ε = 1: ≥ 3.5× the pure-DP PLD's labels, more than RDP's,
    recorded as the bound that won; p fits and p + 1 does not."""
    mech = V.mechanism("gumbel", k=50, lam=2 / 250)
    pure_pld = V.max_queries(mech, 1.0, 1e-5, accountant="pld")[0]
    rdp = V.max_queries(mech, 1.0, 1e-5, accountant="rdp")[0]
    p, eps, bound = V.max_queries(mech, 1.0, 1e-5, accountant="best")
    assert bound == "br" and eps <= 1.0
    assert p >= 3.5 * pure_pld and p > rdp
    assert br.delta(mech.pure_epsilon, p, 1.0) <= 1e-5 < br.delta(mech.pure_epsilon, p + 1, 1.0)
    for votes in ("laplace", "gaussian"):                # the bound is the Gumbel vote's only
        assert V.epsilon_of(V.mechanism(votes, k=50, lam=0.1), 10, 1e-5, "br") == math.inf


def test_bounded_range_is_below_the_pure_dp_pld():
    """Why ``best`` may skip the pure-DP PLD for Gumbel votes: ε by ``br`` ≤ ε by ``pld``."""
    mech = V.mechanism("gumbel", k=5, lam=0.05)
    for p in (1, 7, 60, 400):
        for delta in (1e-6, 1e-3):
            assert V.epsilon_of(mech, p, delta, "br") <= V.epsilon_of(mech, p, delta, "pld")


def test_beyond_the_query_cap_the_bound_says_nothing_and_rdp_decides():
    mech = V.mechanism("gumbel", k=5, lam=2e-4)         # RDP alone buys ~1.5M labels at ε = 1
    assert V.epsilon_of(mech, V.BR_MAX_QUERIES + 1, 1e-5, "br") == math.inf
    p, eps, bound = V.max_queries(mech, 1.0, 1e-5)
    assert (p, bound) == (V.max_queries(mech, 1.0, 1e-5, accountant="rdp")[0], "rdp")
    assert p > V.BR_MAX_QUERIES and eps <= 1.0
