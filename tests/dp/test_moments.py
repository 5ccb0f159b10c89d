"""DP mean and variance from one bounded release (sage_tfx/dp/moments.py), and the histogram
channel of the DP quantiles behind ``dp_bucketize``: values against numpy, sensitivities audited.

The z-score and bucketize releases are post-processing of Laplace channels; each channel is
audited black-box at its share of ε on adjacent totals that differ by that channel's sensitivity
(one record of value ``upper`` added), and the same audit catches the channel with its
sensitivity halved. Confidence 1 − ALPHA; OpenDP noise (unseeded).
"""
import numpy as np
import pytest

from sage_tfx.dp import audit, histograms, mechanisms, moments
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidPrivacyParameterError

ALPHA = 1e-4
RUNS = 10_000


def test_mean_and_var_estimate_the_clipped_moments():
    x = np.random.default_rng(0).uniform(-5.0, 15.0, 50_000)
    got = moments.dp_mean_and_var(x, 0.0, 10.0, 1.0).value
    clipped = np.clip(x, 0.0, 10.0)
    assert got[0] == pytest.approx(clipped.mean(), abs=0.01)
    assert got[1] == pytest.approx(clipped.var(), rel=0.01)


def test_release_is_the_seeded_post_processing_of_three_laplace_channels():
    q = moments.MeanVarQuery(2.0, 6.0, 0.9)
    x = np.array([1.0, 2.5, 3.0, 7.0, np.nan])
    total = q.aggregate(x)
    c = np.clip(np.array([1.0, 2.5, 3.0, 7.0]), 2.0, 6.0) - 4.0
    assert total == pytest.approx([4.0, c.sum(), (c ** 2 - 2.0).sum()])
    noise = SeededNoise(3).laplace
    expected = [t + noise(0.0, m.sampler_scale) for t, m in zip(total, q.mechanisms)]
    assert q.noisy_aggregates(total, SeededNoise(3)) == pytest.approx(expected)
    n = max(expected[0], 1.0)
    mean_c = np.clip(expected[1] / n, -2.0, 2.0)
    var = np.clip((expected[2] + n * 2.0) / n - mean_c ** 2, 0.0, 4.0)
    assert q.release(total, SeededNoise(3)) == pytest.approx([4.0 + mean_c, var])
    # ε in exact thirds, each channel's Laplace at its own sensitivity
    assert [m.l1_sensitivity for m in q.mechanisms] == [1.0, 2.0, 2.0]
    assert sum(m.epsilon for m in q.mechanisms) == pytest.approx(0.9, rel=1e-15)
    assert [e.noise_multiplier for e in q.dp_event().events] == pytest.approx([1 / 0.3] * 3)


@pytest.mark.parametrize("channel", [0, 1, 2])
def test_each_channel_passes_its_audit_and_halved_sensitivity_is_caught(channel):
    """Adjacent: one more record of value ``upper`` (count +1, centred sum +h, shifted square
    +h²/2); each channel must be ε/3-DP."""
    q = moments.MeanVarQuery(0.0, 10.0, 1.5)
    base = q.aggregate(np.array([1.0, 4.0, 6.0]))
    plus = q.aggregate(np.array([1.0, 4.0, 6.0, 10.0]))
    assert np.count_nonzero(base != plus) == 3
    share = q.mechanisms[channel]

    def release(mech):
        return lambda t, n: mech.add_noise(np.full(n, t[channel]))

    good = audit.audit_mechanism(release(share), base, plus, claimed_epsilon=share.epsilon,
                                 runs=RUNS, alpha=ALPHA)
    assert good.passed, good
    halved = mechanisms.LaplaceMechanism(share.epsilon, share.l1_sensitivity / 2)
    broken = audit.audit_mechanism(release(halved), base, plus, claimed_epsilon=share.epsilon,
                                   runs=RUNS, alpha=ALPHA)
    assert not broken.passed, broken


def test_bucketize_histogram_channel_passes_and_halved_noise_is_caught():
    """dp_bucketize's boundaries are post-processing of QuantilesQuery's noisy histogram
    (sensitivity 1: one record moves one bin by one)."""
    q = histograms.QuantilesQuery((0.25, 0.5, 0.75), 0.0, 10.0, 0.8, num_bins=10)
    base = q.aggregate(np.array([1.0, 2.0, 5.5]))
    plus = q.aggregate(np.array([1.0, 2.0, 5.5, 5.6]))
    assert np.abs(plus - base).sum() == 1.0
    b = int(np.argmax(plus != base))

    def release(epsilon):
        mech = mechanisms.LaplaceMechanism(epsilon, 1.0)
        return lambda t, n: mech.add_noise(np.full(n, t[b]))

    assert audit.audit_mechanism(release(0.8), base, plus, claimed_epsilon=0.8, runs=RUNS,
                                 alpha=ALPHA).passed
    broken = audit.audit_mechanism(release(1.6), base, plus, claimed_epsilon=0.8, runs=RUNS,
                                   alpha=ALPHA)
    assert not broken.passed, broken


@pytest.mark.parametrize("lower,upper,epsilon", [
    (1.0, 1.0, 1.0), (2.0, 1.0, 1.0), (0.0, float("inf"), 1.0), (0.0, 1.0, 0.0),
    (0.0, 1.0, -1.0), (float("nan"), 1.0, 1.0)])
def test_bad_parameters_are_refused(lower, upper, epsilon):
    with pytest.raises(InvalidPrivacyParameterError):
        moments.MeanVarQuery(lower, upper, epsilon)
