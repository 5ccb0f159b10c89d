"""§IV figures: reported, never charged. Lemma 3's constant is checked against its own derivation.
"""
import math

import numpy as np
import pytest
from scipy import stats

from sage_tfx.dnd.theory import (adversary_table, lemma1_expected_epsilon, lemma3_epsilon,
                                 lemma3_epsilon_paper)


def test_lemma1_expected_loss():
    assert lemma1_expected_epsilon(1.0, 2) == pytest.approx(0.25)  # the paper's k = 2 case
    assert lemma1_expected_epsilon(2.0, 20) == pytest.approx(0.95)


def test_lemma3_paper_constant_is_3_over_sqrt_t_and_ours_is_sqrt2_larger():
    eps, delta = 1.0, 1e-8
    t = 10_000
    assert lemma3_epsilon_paper(eps, t, delta) * math.sqrt(t) == pytest.approx(2.98, abs=0.01)
    ours = lemma3_epsilon(eps, t, delta)
    # Large T: ε√(ln(1/2δ))/√T, i.e. √2 × the paper's figure (w = 2γ, not √2γ).
    assert ours == pytest.approx(math.sqrt(2) * lemma3_epsilon_paper(eps, t, delta), rel=0.01)
    # Lemma 1 of Kenthapadi et al.: with σ_T = √(2T)·b and w = ε·b the bound is met with equality.
    sigma_t, w = math.sqrt(2 * t), eps
    assert sigma_t * ours == pytest.approx(w * math.sqrt(2 * (math.log(1 / (2 * delta)) + ours)))


def test_lemma3_gaussian_bound_holds_for_the_sum_of_laplace_noises():
    """The CLT step: T Laplace(b) noises have variance 2Tb² (what σ_T assumes)."""
    rng = np.random.default_rng(0)
    s = rng.laplace(0.0, 0.3, size=(20_000, 50)).sum(axis=1)
    assert np.var(s) == pytest.approx(2 * 50 * 0.09, rel=0.05)
    assert stats.kurtosis(s) == pytest.approx(3 / 50, abs=0.1)  # nearly Gaussian


def test_adversary_table_orders_the_adversaries():
    row = adversary_table(1.0, 20, 10_000)
    values = list(row.values())
    assert values[0] == 1.0 and values[0] > values[1] > values[3] > values[2] > 0
