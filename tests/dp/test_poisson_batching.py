"""Poisson batches built record by record: the sampling DP-SGD is accounted for, and the δ that
truncating at B adds (sage_tfx.dp.poisson_batching). Numpy and scipy only."""
import math

import numpy as np
import pytest
from scipy import stats

from sage_tfx.dp import poisson_batching as pb
from sage_tfx.errors import InvalidPrivacyParameterError


def test_each_example_joins_each_step_independently_with_probability_q():
    """assign_steps draws Binomial(T, q) steps, then a uniform subset: every (example, step)
    inclusion is Bernoulli(q), independently — so a step's batch size is Binomial(n, q)."""
    rng = np.random.default_rng(1)
    n, steps, q = 3000, 40, 0.03
    sizes = np.zeros(steps, np.int64)
    joined = np.zeros(n, np.int64)
    for i in range(n):
        s = pb.assign_steps(rng, steps, q)
        assert len(set(s.tolist())) == len(s) and all(0 <= t < steps for t in s)
        sizes[s] += 1
        joined[i] = len(s)
    # per-step sizes: Binomial(n, q) (mean nq, variance nq(1-q)); tested with a chi-square on
    # the standardized sum of squares, and per-example counts: Binomial(T, q).
    z = (sizes - n * q) / math.sqrt(n * q * (1 - q))
    assert stats.chi2.sf(float(np.sum(z ** 2)), steps) > 1e-3
    counts = np.bincount(joined, minlength=8)[:8]
    expected = stats.binom.pmf(np.arange(8), steps, q) * n
    assert stats.chisquare(counts[:5], expected[:5] * counts[:5].sum() / expected[:5].sum()
                           ).pvalue > 1e-3
    # a broken sampler (every example in exactly round(Tq) steps) fails the same test
    broken = np.bincount(np.full(n, round(steps * q)), minlength=8)[:5]
    assert stats.chisquare(broken + 1e-9, expected[:5] * n / expected[:5].sum()).pvalue < 1e-6


def test_truncation_delta_is_the_union_bound_and_choose_max_batch_the_smallest_b():
    n, q, steps, eps = 10_000, 0.0256, 400, 1.0
    for b in (256, 300, 376):
        independent = (1 + math.exp(eps)) * steps * stats.binom.sf(b, n + 1, q)
        bound = min(independent, 1 + math.exp(eps))   # P[E] <= 1
        assert pb.truncation_delta(eps, n, q, steps, b) == pytest.approx(bound, rel=1e-12)
        assert pb.truncation_delta(eps, n, q, steps, b) >= bound    # rounded up, never down
    b = pb.choose_max_batch(n, q, steps, epsilon=eps, delta_budget=1e-8)
    assert b % pb.MAX_BATCH_MULTIPLE == 0
    assert pb.truncation_delta(eps, n, q, steps, b) <= 1e-8
    assert pb.truncation_delta(eps, n, q, steps, b - 8) > 1e-8
    # a batch cap no step can exceed costs nothing
    assert pb.truncation_delta(eps, 100, 0.5, 10, 104) == 0.0
    assert pb.choose_max_batch(100, 0.5, 10, epsilon=eps, delta_budget=1e-30) == 104


def test_cap_batch_truncates_to_a_random_subset_or_keeps_all():
    rng = np.random.default_rng(0)
    batch = list(range(20))
    kept, dropped = pb.cap_batch(rng, batch, 8, pb.TRUNCATE)
    assert len(kept) == 8 and dropped == 12 and set(kept) <= set(batch)
    kept, dropped = pb.cap_batch(rng, batch, 8, pb.SPILL)
    assert sorted(kept) == batch and dropped == 0
    # the subset kept is uniform: every example equally likely to stay
    stays = np.zeros(20)
    for _ in range(4000):
        stays[pb.cap_batch(rng, batch, 8, pb.TRUNCATE)[0]] += 1
    assert stats.chisquare(stays).pvalue > 1e-3


@pytest.mark.parametrize("call", [
    lambda: pb.truncation_delta(1.0, 0, 0.1, 10, 8),
    lambda: pb.truncation_delta(1.0, 100, 0.0, 10, 8),
    lambda: pb.truncation_delta(1.0, 100, 1.5, 10, 8),
    lambda: pb.truncation_delta(float("nan"), 100, 0.1, 10, 8),
    lambda: pb.truncation_delta(1.0, 100, 0.1, 0, 8),
    lambda: pb.truncation_delta(1.0, 100, 0.1, 10, 0),
    lambda: pb.choose_max_batch(100, 0.1, 10, epsilon=1.0, delta_budget=0.0),
    lambda: pb.check_oversize("drop"),
])
def test_bad_arguments_are_refused(call):
    with pytest.raises(InvalidPrivacyParameterError):
        call()
