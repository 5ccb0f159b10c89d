"""Alg. 2: uniform and independent draw/replace, Theorem 1's spread, Lemma 2's fixation, no torn
or invented instances, and the paper's alternative strategies."""
import hashlib
import random
import threading

import numpy as np
import pytest
from scipy import stats

from sage_tfx.dnd import DnDState, initial_instances, stationary_variance
from sage_tfx.dnd.theory import lemma2_fixation_probability, simulate_fixation
from sage_tfx.dp.noise import SeededNoise


def _slot_of(instances, vector):
    hits = np.flatnonzero(np.all(instances == vector, axis=1))
    assert hits.size == 1
    return int(hits[0])


def test_draw_is_uniform_and_replace_is_independent_of_draw():
    """χ² on the real CSPRNG coins: draws uniform, (drawn, replaced) pairs independent."""
    k, n = 8, 4000
    state = DnDState(np.arange(k, dtype=float)[:, None] * np.ones((1, 2)))
    table = np.zeros((k, k), dtype=int)
    for i in range(n):
        before = state.instances_view()
        ticket, v = state.draw()
        drawn = _slot_of(before, v)
        assert state.discard(ticket, np.array([1000.0 + i, 0.0]))
        after = state.instances_view()
        changed = np.flatnonzero(np.any(before != after, axis=1))
        assert changed.size == 1
        table[drawn, changed[0]] += 1
    assert stats.chisquare(table.sum(axis=1)).pvalue > 1e-6  # draws uniform
    assert stats.chisquare(table.sum(axis=0)).pvalue > 1e-6  # replacements uniform
    assert stats.chi2_contingency(table).pvalue > 1e-6       # and independent
    assert table.trace() == pytest.approx(n / k, rel=0.3)    # same slot ≈ 1/k of the time


def _one_step_spreads(instances, b, reps, seed):
    noise = SeededNoise(seed)
    out = np.empty(reps)
    for r in range(reps):
        state = DnDState(instances, rng=random.Random(seed * 100_000 + r))
        t, v = state.draw()
        state.discard(t, noise.laplace(v, b))
        out[r] = state.spread()
    return out


@pytest.mark.parametrize("start", [1.0, 2.0])
def test_theorem1_one_update_keeps_the_spread_at_k_over_2_sigma2(start):
    """Theorem 1 as stated: from spread S, one draw-noise-discard step gives in expectation
    S·(1 − 2/k²) + σ²/k (pairwise-difference recursion), which is S exactly at S = (k/2)σ² and
    pulls any other S towards it. Checked within 5 % (the standard error here is ≈ 0.3 %)."""
    k, d, b = 8, 30, 0.5
    sigma2 = 2 * b ** 2
    target = stationary_variance(k, sigma2)
    inst = initial_instances(np.zeros(d), k, sigma2, np.random.default_rng(1))
    # Rescale so the spread is exactly start × (k/2)σ² (the recursion holds for any instances).
    inst = inst.mean(axis=0) + (inst - inst.mean(axis=0)) * np.sqrt(
        start * target / np.var(inst, axis=0, ddof=1).mean())
    spread0 = np.var(inst, axis=0, ddof=1).mean()
    after = _one_step_spreads(inst, b, 6000, seed=int(start))
    expected = spread0 * (1 - 2 / k ** 2) + sigma2 / k
    assert np.mean(after) == pytest.approx(expected, rel=0.01)
    if start == 1.0:
        assert np.mean(after) == pytest.approx(target, rel=0.05)
    else:
        assert np.mean(after) < spread0 - 3 * np.std(after) / np.sqrt(after.size)


def test_theorem1_long_run_spread_stays_near_k_over_2_sigma2():
    """Over many updates a chain's spread wanders around (k/2)σ² (time average, loose: one
    chain's genealogy correlates all weights)."""
    k, d, b = 10, 50, 0.5
    state = DnDState(initial_instances(np.zeros(d), k, 2 * b * b, np.random.default_rng(0)),
                     rng=random.Random(0))
    noise = SeededNoise(0)
    spreads = []
    for i in range(20_000):
        t, v = state.draw()
        state.discard(t, noise.laplace(v, b))
        if i % 20 == 0:
            spreads.append(state.spread())
    assert np.mean(spreads) == pytest.approx(stationary_variance(k, 2 * b * b), rel=0.1)


def test_theorem1_fails_without_discarding_same_instance_variance_grows():
    """The property is Draw-and-Discard's: always replacing the drawn instance diverges (Fig. 1)."""
    k, d, b = 10, 200, 0.5
    sigma2 = 2 * b ** 2
    rng = np.random.default_rng(3)
    state = DnDState(initial_instances(np.zeros(d), k, sigma2, rng), strategy="same_instance",
                     rng=random.Random(4))
    noise = SeededNoise(5)
    for _ in range(3000):
        t, v = state.draw()
        state.discard(t, noise.laplace(v, b))
    assert state.spread() > 3 * stationary_variance(k, sigma2)


def test_lemma2_fixation_probability_is_one_over_k():
    """One update marked in the real state takes over all k slots with probability 1/k."""
    k, trials = 4, 1500
    fixed = 0
    coins = random.Random(11)
    for _ in range(trials):
        state = DnDState(np.zeros((k, 1)), rng=coins)
        t, _ = state.draw()
        state.discard(t, np.ones(1))  # the marked update
        while 0 < state.instances_view().sum() < k:
            t, v = state.draw()
            state.discard(t, v)  # copy the drawn instance: its mark travels with it
        fixed += state.instances_view().sum() == k
    assert stats.binomtest(fixed, trials, lemma2_fixation_probability(k)).pvalue > 1e-3
    assert stats.binomtest(round(simulate_fixation(6, 3000, random.Random(2)) * 3000), 3000,
                           1 / 6).pvalue > 1e-3


def test_every_slot_is_an_initial_or_accepted_vector_under_concurrency():
    k, d = 6, 50
    state = DnDState(initial_instances(np.zeros(d), k, 1.0))
    known = {hashlib.sha256(v.tobytes()).hexdigest() for v in state.instances_view()}
    lock = threading.Lock()

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(300):
            t, v = state.draw()
            u = v + rng.normal(size=d)
            if state.discard(t, u):
                with lock:
                    known.add(hashlib.sha256(u.tobytes()).hexdigest())
    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert state.accepted == 1800
    assert all(hashlib.sha256(v.tobytes()).hexdigest() in known for v in state.instances_view())


def test_draw_returns_a_copy_and_nothing_identifies_the_slot():
    state = DnDState(np.zeros((3, 2)))
    t, v = state.draw()
    v[:] = 99.0
    assert not np.any(state.instances_view() == 99.0)
    assert t._slot is None  # only same_instance remembers the slot


def test_accept_1_over_k_accepts_a_fraction_one_over_k():
    state = DnDState(np.zeros((1, 2)), strategy="accept_1_over_k", accept_k=5,
                     rng=random.Random(0))
    acc = sum(state.discard(state.draw()[0], np.ones(2)) for _ in range(5000))
    assert stats.binomtest(acc, 5000, 0.2).pvalue > 1e-3


def test_server_batch_replaces_the_model_by_the_mean_of_each_batch():
    state = DnDState(np.zeros((1, 2)), strategy="server_batch", batch_size=3)
    for val in (1.0, 2.0):
        state.discard(state.draw()[0], np.full(2, val))
    assert np.array_equal(state.average(), np.zeros(2))
    state.discard(state.draw()[0], np.full(2, 6.0))
    assert np.allclose(state.average(), [3.0, 3.0])


def test_average_on_replace_halves_the_step():
    state = DnDState(np.zeros((1, 1)), strategy="same_instance", average_on_replace=True)
    t, _ = state.draw()
    state.discard(t, np.array([4.0]))
    assert state.average()[0] == 2.0


@pytest.mark.parametrize("kwargs", [dict(strategy="nope"), dict(strategy="server_batch"),
                                    dict(strategy="accept_1_over_k", accept_k=0)])
def test_bad_configuration_raises(kwargs):
    with pytest.raises(ValueError):
        DnDState(np.zeros((1, 2)), **kwargs)


def test_bad_update_raises_and_changes_nothing():
    state = DnDState(np.zeros((2, 2)))
    t, _ = state.draw()
    for bad in (np.zeros(3), np.array([np.nan, 0.0])):
        with pytest.raises(ValueError):
            state.discard(t, bad)
    assert state.accepted == 0 and np.array_equal(state.instances_view(), np.zeros((2, 2)))


def test_initialisation_needs_a_spread():
    with pytest.raises(ValueError):
        initial_instances(np.zeros(3), 5, 0.0)
    inst = initial_instances(np.zeros(20_000), 10, 2.0, np.random.default_rng(0))
    assert np.var(inst, axis=0, ddof=1).mean() == pytest.approx(10.0, rel=0.02)
