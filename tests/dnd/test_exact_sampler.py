"""The gaussian unit's vector sampler draws 𝒩_ℤ(0, s²) exactly, so ``GaussianDpEvent(m)`` is a
proved rdp charge for it: the CDF bounds bracket 50-digit values, every draw (table, tie, tail)
is the exact inverse CDF of its random bits, the realised distribution's Rényi divergence is
within dp_accounting's RDP of ``GaussianDpEvent`` at every order of the ledger's grid (a table
with cut tails is infinite there: the check can fail), and the std it adds is what ``/v1/spec``
and :func:`noise_std` report."""
import math

import mpmath
import numpy as np
import pytest
from dp_accounting import dp_event as dp_event_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy import stats

from sage_tfx.dnd import ClientConfig
from sage_tfx.dnd import noise as vector_noise
from sage_tfx.ledger import accounting

mpmath.mp.prec = 256


def _exact_cdf(s, zs, reach):
    """F(z) of 𝒩_ℤ(0, s²) at 256 bits, summing |k| ≤ reach (the rest is below 2^-256 here)."""
    w = [mpmath.exp(-mpmath.mpf(k) ** 2 / (2 * mpmath.mpf(s) ** 2)) for k in range(-reach,
                                                                                  reach + 1)]
    cum = np.cumsum(np.array(w, dtype=object))
    total = cum[-1]
    return {z: cum[z + reach] / total for z in zs}


@pytest.mark.parametrize("s,sample", [(2.5, None), (37.75, None), (1500.0, 41)])
def test_cdf_bounds_bracket_the_exact_cdf(s, sample):
    lo, hi, big_k = vector_noise._cdf_bounds(s, 192)
    zs = list(range(-big_k - 1, big_k + 1))
    if sample:
        zs = sorted(set(zs[::len(zs) // sample] + [-1, 0, big_k]))
    exact = _exact_cdf(s, zs, int(18 * s) + 40)
    for z in zs:
        i = z + big_k + 1
        assert lo[i] <= exact[z] * 2 ** 192 <= hi[i], z
        assert hi[i] - lo[i] < 2 ** 64  # below one unit of the 128-bit table
    assert all(a <= b for a, b in zip(lo, lo[1:]))  # monotone: bisection is sound


def test_every_draw_is_the_exact_inverse_cdf_of_its_bits(monkeypatch):
    """u set at table entries ± E (ties on the high word, undecidable by 128 bits), in both tails
    and far beyond the table: the returned z satisfies F(z − 1) ≤ u < F(z) for the full u, the
    128 bits plus the 64-bit extensions the sampler read."""
    s = 2.5
    hi, lo, bound, tau = vector_noise._table(s)
    entries = [(int(h) << 64) | int(w) for h, w in zip(hi, lo)]
    us = [0, 1, 2 ** 60, 2 ** 128 - 1, 2 ** 128 - 2 ** 40]
    for c in entries[::7]:
        us += [c - bound - 1, c - 1, c, c + bound]
    us = [u for u in us if 0 <= u < 2 ** 128]
    rng = np.random.default_rng(5)
    ext = []

    def more_bits():
        ext[-1].append(int(rng.integers(0, 2 ** 63)) * 2 + int(rng.integers(0, 2)))
        return ext[-1][-1]

    monkeypatch.setattr(vector_noise, "_more_bits", more_bits)
    exact = _exact_cdf(s, range(-200, 200), 400)
    extended = 0
    for u in us:
        ext.append([])
        words = (np.array([u >> 64], dtype=np.uint64), np.array([u & (2 ** 64 - 1)],
                                                                dtype=np.uint64))
        monkeypatch.setattr(vector_noise, "_random_words", lambda n, w=words: w)
        z = int(vector_noise.discrete_gaussian_noise(1, s)[0])
        bits, v = 128, u
        for word in ext[-1]:
            v, bits = (v << 64) | word, bits + 64
        extended += bool(ext[-1])
        # every continuation of the bits read lies in [F(z − 1), F(z))
        lo_u, hi_u = mpmath.mpf(v) / 2 ** bits, mpmath.mpf(v + 1) / 2 ** bits
        assert exact[z - 1] <= lo_u and hi_u <= exact[z], (u, z)
    assert extended >= 10  # the exact completion ran, not just the table


def _renyi(p, q, alpha, support=None):
    """D_α(P‖Q) of two pmfs (dicts over integers), +inf where Q misses P; ``support``
    restricts the sum (to the range both computed pmfs cover)."""
    total = mpmath.mpf(0)
    for z, pz in p.items():
        if pz == 0 or (support is not None and z not in support):
            continue
        qz = q.get(z, 0)
        if qz == 0:
            return math.inf
        total += pz ** alpha * qz ** (1 - alpha)
    return float(mpmath.log(total) / (alpha - 1))


def _pmf_from_bounds(s, shift=0):
    """The sampler's distribution: P(z) = F(z) − F(z − 1), F bracketed to 2^-1600 by the
    sampler's own bounds (their midpoints), over the whole range they cover."""
    lo, hi, big_k = vector_noise._cdf_bounds(s, 1600)
    mid = [a + b for a, b in zip(lo, hi)]  # exact integers: no cancellation near F = 1
    return {z + shift: mpmath.mpf(mid[i] - mid[i - 1]) / 2 ** 1601
            for i, z in enumerate(range(-big_k - 1, big_k + 1)) if i > 0}


def test_realised_distribution_has_the_gaussian_events_rdp_at_every_order():
    """D_α(𝒩_ℤ(0, s²) ‖ 𝒩_ℤ(v, s²)) of the distribution the sampler draws, against
    dp_accounting's RDP of GaussianDpEvent(s/v), on the ledger's own order grid. A sampler with
    the old cut tails (|z| ≤ τ) has infinite divergence: the charge would not hold for it."""
    s = 3.0
    p = _pmf_from_bounds(s)
    orders = accounting.DEFAULT_RDP_ORDERS
    for v in (1, 2, 4):
        q = _pmf_from_bounds(s, v)
        acc = rdp_lib.RdpAccountant(list(orders))
        acc.compose(dp_event_lib.GaussianDpEvent(s / v))
        for alpha, charged in zip(orders, acc._rdp):  # pylint: disable=protected-access
            if alpha * v > 30 * s:  # beyond the covered range the shifted pmf runs out
                continue
            real = _renyi(p, q, alpha, support=p.keys() & q.keys())  # the rest < 2^-1500
            assert real <= charged * (1 + 1e-9), (v, alpha, real, charged)
            if alpha <= 16:
                assert real >= 0.95 * charged  # tight: the event is not a loose bound
    tau = vector_noise._tau(s)
    cut = {z: pz for z, pz in p.items() if abs(z) <= tau}
    cut_shifted = {z + 1: pz for z, pz in cut.items()}
    assert _renyi(cut, cut_shifted, 2.0) == math.inf


def test_draws_follow_the_exact_pmf():
    s = 2.5
    z = vector_noise.discrete_gaussian_noise(200_000, s)
    exact = _exact_cdf(s, range(-11, 11), 100)
    edges = list(range(-8, 8))  # bins (−∞, −8], {−7}, …, {7}, [8, ∞)
    probs = [float(exact[-8])] + [float(exact[e] - exact[e - 1]) for e in edges[1:]] \
        + [float(1 - exact[7])]
    counts = [np.sum(z <= -8)] + [np.sum(z == e) for e in edges[1:]] + [np.sum(z >= 8)]
    assert stats.chisquare(counts, np.array(probs) * z.size).pvalue > 1e-5


def test_noise_std_is_what_the_sampler_adds():
    """The std reported (``noise_std``, ``/v1/spec``'s ``noise_scale``) against the table's own
    distribution (analytic) and 400,000 draws (empirical, SE 0.11 %); m·Δ₂, the old report, is
    more than 1 % below both (caught)."""
    cfg = ClientConfig(0.002, epsilon=8.0, unit="gaussian", delta=1e-6, l2_norm_clip=2.0)
    d = 7850
    m, sens = cfg.noise_multiplier, cfg.l2_sensitivity
    grid = vector_noise.sampler_grid(m, sens, d)
    hi, lo, _, tau = vector_noise._table(grid.discrete_std)
    cum = np.array([(int(h) << 64 | int(w)) / 2 ** 128 for h, w in zip(hi, lo)])
    pmf = np.diff(cum)
    zs = np.arange(-tau, tau + 1, dtype=np.float64)
    analytic = grid.step * math.sqrt(float(np.sum(pmf * zs * zs)))
    reported = vector_noise.noise_std(m, sens, d)
    assert reported == cfg.sampler_std(d) == pytest.approx(analytic, rel=1e-9)
    x = np.random.default_rng(2).normal(size=d) * 0.01
    noise = np.concatenate([vector_noise.gaussian_vector(x, m, sens) - np.rint(x / grid.step)
                            * grid.step for _ in range(51)])
    assert np.std(noise) == pytest.approx(reported, rel=0.005)
    assert m * sens < 0.99 * reported
