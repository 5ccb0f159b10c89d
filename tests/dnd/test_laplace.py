"""The float-safe Laplace vector sampler of the L1 units (sage_tfx.dnd.laplace): its distribution
(KS, with a wrong-scale power check), its table against the exact inverse CDF, its cost in random
bytes, an empirical audit that catches half the noise, and its ε against dp_accounting."""
import math
from decimal import Decimal, localcontext

import numpy as np
import pytest
from dp_accounting import dp_event as dp_event_lib
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import special, stats

from sage_tfx.dnd import ClientConfig, GLMSpec, client_update
from sage_tfx.dnd import laplace as L
from sage_tfx.dnd.client import check_update_matches_ledger_epsilon
from sage_tfx.dp.audit import audit_mechanism
from sage_tfx.errors import InvalidPrivacyParameterError


def test_discrete_noise_is_two_sided_geometric_at_its_scale():
    """A tiny period: the exact pmf (1 − p)/(1 + p)·p^|z| by χ²; a wrong p is rejected."""
    period, n = 3, 40_000
    z = L.discrete_laplace_noise(n, period)
    assert z.dtype == np.int64

    def pvalue(p):
        edges = np.arange(-12, 13)
        pmf = (1 - p) / (1 + p) * p ** np.abs(edges)
        expect = np.append(pmf, 1 - pmf.sum()) * n   # the last cell: |z| > 12
        seen = np.array([np.sum(z == e) for e in edges] + [np.sum(np.abs(z) > 12)])
        return stats.chisquare(seen, expect).pvalue
    assert pvalue(2 ** (-1 / period)) > 1e-5
    assert pvalue(2 ** (-1 / (1.25 * period))) < 1e-5


def test_vector_noise_matches_laplace_at_the_sampler_scale_and_stays_on_its_grid():
    """A real grid (T ≥ 1024: continuous to 10⁻³): KS against Laplace(g·T/ln 2) at p > 1e-5; the
    same sample against a 15 % larger scale is rejected."""
    sens, eps, d = 0.1, 2.0, 50_000
    x = np.random.default_rng(1).normal(size=d)
    grid = L.laplace_grid(sens, eps, d)
    out = L.laplace_vector(x, sens, eps)
    steps = out / grid.step
    assert np.all(steps == np.rint(steps))  # every output is a grid point, exactly
    noise = out - np.rint(x / grid.step) * grid.step
    scale = grid.step * grid.period / math.log(2)
    assert stats.kstest(noise, "laplace", args=(0, scale)).pvalue > 1e-5
    assert stats.kstest(noise, "laplace", args=(0, 1.15 * scale)).pvalue < 1e-5
    assert np.std(noise) == pytest.approx(grid.std, rel=0.03)
    # the nominal √2·Δ/ε, plus at most the grid's allowance
    assert math.sqrt(2) * sens / eps <= grid.std <= math.sqrt(2) * sens / eps * 1.018
    assert d * grid.step <= sens / 64 and grid.period >= 1024


def test_table_is_the_exact_inverse_cdf():
    """Each stored probability equals the exact P(R = r) = 2(1 − p)pʳ to a relative 2⁻³⁹ (50-digit
    decimal arithmetic), and a draw's index is the first whose cumulative count exceeds it."""
    with localcontext() as ctx:  # 50 digits here only: the ledger sums with the default context
        ctx.prec = 50
        for period in (37, 1024, 1 << 20):
            cum, total = L.remainder_table(period)
            counts = np.diff(np.concatenate([[np.uint64(0)], cum]))
            rows = sorted({0, 1, period - 1} | set(
                np.random.default_rng(period).integers(0, period, 100).tolist()))
            two = Decimal(2)
            p = two ** (Decimal(-1) / period)
            for r in rows:
                exact = 2 * (1 - p) * p ** r
                got = Decimal(int(counts[r])) / Decimal(total)
                assert abs(got / exact - 1) <= Decimal(2) ** -39, (period, r)
            assert total < 1 << 64
    period = 37
    cum, total = L.remainder_table(period)
    r = np.array([0, 5, 35, 12])   # (cum[36] is the total: a redraw, tested below)
    words = np.concatenate([cum[r] - np.uint64(1), cum[r]])   # just below / at each boundary
    a = np.array([1 << 5, 1, 1 << 63, 6] * 2, dtype=np.uint64)  # 5, 0, 63, 1 trailing zeros
    g = L._geometric(a, words, period)
    assert g.tolist() == [period * k + j for k, j in zip([5, 0, 63, 1] * 2,
                                                         [0, 5, 35, 12, 1, 6, 36, 13])]


def test_a_zero_word_continues_and_a_word_past_the_total_is_redrawn(monkeypatch):
    period = 37
    cum, total = L.remainder_table(period)
    fresh = iter([np.array([1 << 3], dtype=np.uint64), np.array([5], dtype=np.uint64)])
    monkeypatch.setattr(L, "_random_words", lambda n: next(fresh))
    g = L._geometric(np.array([0], dtype=np.uint64),
                     np.array([np.uint64(total)], dtype=np.uint64), period)
    assert g.tolist() == [period * (64 + 3) + 0]


def test_one_fixed_number_of_random_bytes_per_weight(monkeypatch):
    calls = []
    real = L._random_words
    monkeypatch.setattr(L, "_random_words", lambda n: calls.append(n) or real(n))
    L.laplace_vector(np.zeros(50_000), 0.1, 8.0)
    assert calls == [4 * 50_000]   # 32 bytes per weight, one OS call


@pytest.mark.parametrize("unit, dim", [("model", 650), ("feature", 387)])
def test_epsilon_of_the_unit_is_covered_by_the_charged_laplace_event(unit, dim):
    """The proved ε ≤ the charge; dp_accounting's RDP of the charged LaplaceDpEvent is
    min(ε, αε²/2), which every ε-DP mechanism meets, and which the discrete mechanism's own
    RDP (computed exactly at the largest shift) stays under."""
    cfg = ClientConfig(gamma=0.05, l1_norm_clip=1.0, epsilon=1.0 if unit == "model" else 0.02,
                       unit=unit)
    charged = cfg.update_epsilon(dim)
    event = cfg.update_event(dim)
    assert isinstance(event, dp_event_lib.LaplaceDpEvent)
    assert 1 / event.noise_multiplier == pytest.approx(charged, rel=1e-12)
    proved = check_update_matches_ledger_epsilon(cfg, dim)
    assert charged * (1 - 1e-3) <= proved <= charged
    orders = [1.5, 2.0, 4.0, 16.0, 64.0]
    acc = rdp_privacy_accountant.RdpAccountant(orders)
    acc.compose(event)
    grid = L.laplace_grid(cfg.l1_sensitivity(dim), charged, dim)
    shift = int(math.floor(cfg.l1_sensitivity(dim) / grid.step + dim))
    t = grid.period / math.log(2)
    zs = np.arange(-shift - int(40 * t), int(40 * t) + 1)   # beyond: mass < e⁻⁴⁰
    lp, lq = -np.abs(zs) / t, -np.abs(zs + shift) / t   # one coordinate takes the whole shift
    for a, rdp in zip(orders, acc._rdp):
        assert rdp == pytest.approx(min(charged, a * charged ** 2 / 2), rel=1e-9)
        own = (special.logsumexp(a * lp + (1 - a) * lq) - special.logsumexp(lp)) / (a - 1)
        assert own <= min(proved, a * proved ** 2 / 2) <= rdp


def _audit(cfg, runs):
    """Adjacent clients whose clipped gradients are ±C on the intercept (worst case: updates
    differ by 2γC in one weight)."""
    spec = GLMSpec("logistic", 2)
    x = np.zeros((1, 2))

    def release(y, n):
        return np.array([client_update(spec, np.zeros(3), x, np.array([y]), cfg)[0]
                         for _ in range(n)])
    # α = 10⁻³: a tail event's true ratio is exactly e^ε, so a correct mechanism fails with
    # probability ≤ α
    return audit_mechanism(release, 0.0, 1.0, claimed_epsilon=cfg.epsilon, runs=runs,
                           alpha=1e-3)


def test_empirical_audit_bounds_the_update_and_catches_half_the_noise(monkeypatch):
    cfg = ClientConfig(gamma=0.2, l1_norm_clip=0.5, epsilon=1.0)
    res = _audit(cfg, 3000)
    assert res.passed, res
    assert res.epsilon_lower_bound > 0.5   # the audit sees most of ε = 1
    monkeypatch.setattr(ClientConfig, "sensitivity_per_weight",
                        property(lambda self: self.gamma * self.clip))   # γC, not 2γC
    res = _audit(cfg, 3000)
    assert not res.passed, res


def test_sampler_refuses_bad_input():
    with pytest.raises(ValueError):
        L.laplace_vector(np.array([1.0, np.nan]), 1.0, 1.0)
    for sens, eps in ((0.0, 1.0), (1.0, 0.0), (1.0, L.SAMPLER_EPSILON), (1.0, math.inf)):
        with pytest.raises(InvalidPrivacyParameterError):
            L.laplace_vector(np.zeros(3), sens, eps)
    with pytest.raises(InvalidPrivacyParameterError, match="table"):
        L.laplace_vector(np.zeros(10 ** 6), 1.0, 1.0)   # ε too small for a million weights
    with pytest.raises(ValueError, match="too large"):
        L.laplace_vector(np.array([1e300]), 1e-6, 1.0)


def test_the_spam_checks_null_covers_the_sampler_scale():
    """The scale the spam check assumes (b × max_scale_ratio) is never below the sampler's."""
    for d in (1, 3, 650, 50_000):
        for eps in (1e-3, 0.3, 8.0, 100.0):
            if d / eps > 1e5:   # the table would exceed MAX_PERIOD (refused, tested below)
                continue
            for sens in (1e-3, 0.1, 7.0):
                grid = L.laplace_grid(sens, eps, d)
                ratio = grid.step * grid.period / math.log(2) / (sens / eps)
                assert 1.0 <= ratio <= L.max_scale_ratio(eps)
    with pytest.raises(InvalidPrivacyParameterError):
        L.max_scale_ratio(L.SAMPLER_EPSILON)
