"""DP baseline comparison (DPModelValidator's "not worse" rule): noise scales and sensitivities
against their formulas, the charged event against dp_accounting, and the coverage of both
confidence bounds measured on simulated test sets (OpenDP noise) — including a regime where the
DP noise dominates, so a bound that forgot the noise would miss its confidence."""
import math

import dp_accounting
import numpy as np
import pytest

from sage_tfx.dp.comparison import ComparisonOutcome, ComparisonResult, LossDifferenceComparator
from sage_tfx.dp.noise import SeededNoise


def test_sensitivity_is_the_loss_bound():
    """One added example moves the count by 1 and the difference sum by at most B (= B for a
    candidate at the worst loss and a baseline at 0, NaNs included)."""
    comp = LossDifferenceComparator(loss_bound=2.0, eta=0.05)
    rng = np.random.default_rng(0)
    cand, base = rng.uniform(0, 5, 200), rng.uniform(0, 5, 200)
    extra = [(9.0, 0.0), (np.nan, 1.0), (1.0, np.nan), (0.0, 9.0), (np.inf, -1.0)]
    changes = []
    for c, b in list(zip(rng.uniform(-1, 9, 100), rng.uniform(-1, 9, 100))) + extra:
        before = comp.differences(cand, base).sum()
        after = comp.differences(np.append(cand, c), np.append(base, b)).sum()
        changes.append(abs(after - before))
    assert max(changes) <= 2.0 and max(changes) == 2.0
    d = comp.differences([np.nan, 1.0], [1.0, np.nan])
    assert list(d) == [2.0 - 1.0, 1.0 - 0.0]  # NaN: the candidate at B, the baseline at 0


def test_noise_scales_match_the_formula_and_the_charged_event():
    eps, bound = 0.8, 2.0
    comp = LossDifferenceComparator(loss_bound=bound, eta=0.05)
    d = np.linspace(-0.5, 0.5, 301)
    count_noise, sum_noise = [], []
    for _ in range(1500):
        r = comp.compare(d + 1.0, np.full(d.size, 1.0), epsilon=eps)
        count_noise.append(r.n_test_dp - d.size)
        sum_noise.append(r.details["dp_sum"] - d.sum())
    assert np.std(count_noise) == pytest.approx(math.sqrt(2) * 2.0 / eps, rel=0.1)
    assert np.std(sum_noise) == pytest.approx(math.sqrt(2) * 2.0 * bound / eps, rel=0.1)
    assert r.details["count_noise_scale"] == 2.0 / eps
    assert r.details["sum_noise_scale"] == 2.0 * bound / eps
    # The event: ε/2 on the count (sensitivity 1) + ε/2 on the sum (sensitivity B).
    event = comp.dp_event(eps)
    assert event == dp_accounting.ComposedDpEvent(
        [dp_accounting.LaplaceDpEvent(2.0 / eps), dp_accounting.LaplaceDpEvent(2.0 / eps)])
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(event)
    assert eps - 1e-6 < pld.get_epsilon(1e-12) <= eps


def _two_point(rng, n, mu, bound):
    """n i.i.d. d in {−B, +B} with mean mu (the worst case of Hoeffding's variance)."""
    p = (1.0 + mu / bound) / 2.0
    return np.where(rng.uniform(size=n) < p, bound, -bound)


@pytest.mark.parametrize("n,epsilon,mu", [
    (20_000, 0.005, 0.02),  # DP noise dominates: a bound without it misses (checked below)
    (800, 20.0, -0.1),      # sampling dominates
])
def test_confidence_bounds_cover_the_expected_difference(n, epsilon, mu):
    eta, bound, trials = 0.05, 1.0, 800
    comp = LossDifferenceComparator(loss_bound=bound, eta=eta)
    rng = np.random.default_rng(int(n))
    above = below = naive_above = 0
    widths = []
    for _ in range(trials):
        d = _two_point(rng, n, mu, bound)
        r = comp.compare(np.clip(d, 0, None), np.clip(-d, 0, None), epsilon=epsilon)
        above += mu > r.upper_bound
        below += mu < r.lower_bound
        widths.append(r.upper_bound - r.lower_bound)
        # What a bound that ignored the DP noise would say: the noisy mean plus Hoeffding.
        naive = r.dp_difference + 2 * bound * math.sqrt(math.log(3 / eta) / (2 * r.n_test_dp))
        naive_above += mu > naive
    # Each bound may miss with probability ≤ η = 5 % (40 of 800 expected at worst; +3 σ).
    limit = trials * eta + 3 * math.sqrt(trials * eta * (1 - eta))
    assert above <= limit and below <= limit, (above, below)
    assert np.median(widths) < 0.25  # not vacuous (the range of d is [-1, 1])
    if epsilon < 1:
        assert naive_above > limit, naive_above  # the test would catch a noise-blind bound


def test_decisions_and_tolerance():
    comp = LossDifferenceComparator(loss_bound=1.0, eta=0.05)
    noise = SeededNoise(1)
    base = np.full(5000, 0.3)
    assert comp.compare(base - 0.1, base, epsilon=2.0, noise=noise).outcome == \
        ComparisonOutcome.NOT_WORSE
    assert comp.compare(base + 0.1, base, epsilon=2.0, noise=noise).outcome == \
        ComparisonOutcome.WORSE
    assert comp.compare(base, base, epsilon=2.0, noise=noise).outcome == \
        ComparisonOutcome.INCONCLUSIVE
    lenient = LossDifferenceComparator(loss_bound=1.0, eta=0.05, tolerance=0.1)
    assert lenient.compare(base, base, epsilon=2.0, noise=noise).outcome == \
        ComparisonOutcome.NOT_WORSE
    # No evidence (n_min <= 0): the whole range, never NOT_WORSE at tolerance 0.
    r = comp.compare(base[:3] - 0.3, base[:3], epsilon=0.1, noise=noise)
    assert (r.lower_bound, r.upper_bound, r.outcome) == (-1.0, 1.0, ComparisonOutcome.INCONCLUSIVE)
    assert ComparisonResult.from_dict(r.to_dict()) == r


def test_accuracy_is_reported_in_accuracy_units():
    comp = LossDifferenceComparator(loss_bound=1.0, eta=0.05, metric="accuracy")
    rng = np.random.default_rng(2)
    cand = (rng.uniform(size=4000) < 0.9).astype(float)
    base = (rng.uniform(size=4000) < 0.7).astype(float)
    r = comp.compare(cand, base, epsilon=2.0, noise=SeededNoise(3))
    assert r.outcome == ComparisonOutcome.NOT_WORSE
    assert r.lower_bound < r.dp_difference < r.upper_bound
    assert r.dp_difference == pytest.approx(0.2, abs=0.03)
    # A NaN counts against the candidate: wrong for it, right for the baseline.
    assert list(comp.differences([np.nan], [np.nan])) == [1.0]


@pytest.mark.parametrize("kwargs", [
    {"loss_bound": 0.0, "eta": 0.05}, {"loss_bound": 1.0, "eta": 1.0},
    {"loss_bound": 1.0, "eta": 0.05, "tolerance": -0.1},
    {"loss_bound": 1.0, "eta": 0.05, "tolerance": float("inf")},
    {"loss_bound": 2.0, "eta": 0.05, "metric": "accuracy"},
    {"loss_bound": 1.0, "eta": 0.05, "metric": "auc"},
])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        LossDifferenceComparator(**kwargs)


def test_bad_inputs():
    comp = LossDifferenceComparator(loss_bound=1.0, eta=0.05)
    with pytest.raises(ValueError):
        comp.compare([0.1, 0.2], [0.1], epsilon=1.0)
    with pytest.raises(ValueError):
        comp.compare([0.1], [0.1], epsilon=0.0)
