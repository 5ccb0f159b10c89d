"""fixed_queries against dp_accounting; the paper's accountant against Table 2; k = 1 is SAA."""
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld

from sage_tfx.bagging import (BaggingConfig, PersonalisedMomentsAccountant, epsilon_of, max_queries,
                              plan_labels, queries_event)
from sage_tfx.bagging.accounting import moments_epsilon
from sage_tfx.errors import InvalidPrivacyParameterError


def _independent_eps(p, lam, delta, accountant):
    acc = dp_accounting.rdp.RdpAccountant(
        ) if accountant == "rdp" else dp_accounting.pld.PLDAccountant()
    acc.compose(dp_accounting.LaplaceDpEvent(1 / (2 * lam)), p)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
@pytest.mark.parametrize("epsilon,lam", [(1.0, 0.02), (3.0, 0.008)])
def test_fixed_queries_charge_is_dp_accounting_and_maximal(accountant, epsilon, lam):
    delta = 1e-5
    p = max_queries(epsilon, delta, lam=lam, accountant=accountant)
    assert p > 1
    assert _independent_eps(p, lam, delta, accountant) <= epsilon < _independent_eps(p + 1, lam,
                                                                                     delta,
                                                                                     accountant)
    plan = plan_labels(BaggingConfig(k=50, n=100, lam=lam, accountant=accountant),
                       epsilon=epsilon, delta=delta, public_size=10**6)
    assert plan.queries == p and plan.formally_dp
    assert plan.event == dp_accounting.SelfComposedDpEvent(
        dp_accounting.LaplaceDpEvent(1 / (2 * lam)), p)
    assert plan.epsilon == pytest.approx(_independent_eps(p, lam, delta, accountant), rel=1e-12)
    # a small public set caps p, and the charge follows the cap
    small = plan_labels(BaggingConfig(k=50, n=100, lam=lam, accountant=accountant),
                        epsilon=epsilon, delta=delta, public_size=7)
    assert small.queries == 7 and small.event == queries_event(lam, 7)


def test_composition_beats_per_query_sum():
    # RDP/PLD composition answers more than basic composition of the 2λ pure-DP queries
    lam = 2 / 250
    assert max_queries(3.0, 1e-5, lam=lam, accountant="pld") > max_queries(3.0, 1e-5,
                                                                           lam=lam) > 3.0 / (
                                                                               2 * lam)


@pytest.mark.parametrize("bad", [dict(epsilon=0, delta=1e-5), dict(epsilon=-1, delta=1e-5),
                                 dict(epsilon=1, delta=0), dict(epsilon=1, delta=1.5),
                                 dict(epsilon=float("nan"), delta=1e-5)])
def test_bad_grant_is_refused(bad):
    with pytest.raises(InvalidPrivacyParameterError):
        max_queries(bad["epsilon"], bad["delta"], lam=0.1)


def test_vector_laplace_is_dominated_by_the_scalar_event():
    """The 2-coordinate change (+d, -d) costs no more than one Laplace of sensitivity 2d."""
    b = 10.0
    whole = pld.from_laplace_mechanism(b, sensitivity=4.0, value_discretization_interval=1e-3)
    for part in (1.0, 2.0):
        split = pld.from_laplace_mechanism(b, sensitivity=part,
                                           value_discretization_interval=1e-3).compose(
            pld.from_laplace_mechanism(b, sensitivity=4.0 - part,
                                       value_discretization_interval=1e-3))
        for delta in (1e-3, 1e-5):
            assert split.self_compose(20).get_epsilon_for_delta(delta) <= \
                whole.self_compose(20).get_epsilon_for_delta(delta)


def test_discrete_laplace_on_integer_counts_would_be_undercharged():
    """Why the votes get OpenDP's continuous Laplace: the integer discrete Laplace costs more."""
    k, n = 1, 100
    b, sens = k / (2 / n), 2 * k
    cont = pld.from_laplace_mechanism(b, sensitivity=sens, value_discretization_interval=1e-4)
    disc = pld.from_discrete_laplace_mechanism(1 / b, sensitivity=sens,
                                               value_discretization_interval=1e-4)
    assert disc.self_compose(300).get_epsilon_for_delta(1e-5) > cont.self_compose(
        300).get_epsilon_for_delta(1e-5)


def _saa_labels(epsilon, *, n=250, delta=1e-3, reproduce_alg1=True):
    """Alg. 1's loop with k = 1 (SAA): m = 1 for every unit whatever the votes."""
    rng = np.random.default_rng(0)
    unit_chunks = rng.integers(0, n, size=(300, 1))
    pma = PersonalisedMomentsAccountant(unit_chunks, n=n, lam=2 / n, delta=delta, max_order=32)
    answered = 0
    while True:
        pred = rng.integers(0, 2, size=(512, 1, n)).astype(np.uint8)
        a = pma.answer(pred, epsilon, 2, reproduce_alg1=reproduce_alg1)
        answered += a
        if a < len(pred):
            return answered, pma


@pytest.mark.parametrize("epsilon,expected", [(1, 264), (3, 2108), (5, 5269)])
def test_paper_accountant_reproduces_table2_saa_at_delta_1e3(epsilon, expected):
    """Table 2's SAA counts come out of the paper's own accountant at δ = 1e-3 (not the 1e-5 of §5).
    """
    answered, pma = _saa_labels(epsilon)
    assert answered == expected
    assert pma.epsilon_hat() >= epsilon        # Alg. 1 answers the query that crosses ε
    assert moments_epsilon(expected - 1, lam=2 / 250, delta=1e-3) < epsilon


@pytest.mark.parametrize("epsilon", [1, 3, 5])
def test_runs_stop_before_the_query_that_would_cross_epsilon(epsilon):
    """What runs answer: every answered query keeps ε̂ <= ε, the next one would cross it."""
    answered, pma = _saa_labels(epsilon, reproduce_alg1=False)
    lam, delta = 2 / 250, 1e-3
    assert pma.epsilon_hat() <= epsilon
    # independently of the accountant object: with k = 1, S = number of answered queries
    assert moments_epsilon(answered, lam=lam, delta=delta) <= epsilon
    assert moments_epsilon(answered + 1, lam=lam, delta=delta) > epsilon
    assert answered == _saa_labels(epsilon)[0] - 1   # one fewer than Alg. 1: the crossing query


def test_paper_delta_1e5_does_not_reproduce_table2():
    assert _saa_labels(1, delta=1e-5)[0] != 264


def test_personal_m_and_star():
    # k = 4 partitions, n = 3: unit 0 sits in chunk 0 everywhere, unit 1 in chunk 1 everywhere
    unit_chunks = np.array([[0, 0, 0, 0], [1, 1, 1, 1]])
    pred = np.zeros((1, 4, 3), np.uint8)
    pred[0, :2, 0] = 1          # unit 0's teachers split 2/2 -> m = 1/2
    pred[0, :, 2] = 1           # the paper's fixed ∗ chunk (last) unanimous -> m(∗) = 1
    pma = PersonalisedMomentsAccountant(unit_chunks, n=3, lam=0.1, delta=1e-5)
    m2, m2_star, m2_worst = pma._m_squared(pred, 2)
    assert m2[0].tolist() == [0.25, 1.0]
    assert m2_star.tolist() == [1.0]
    assert m2_worst.tolist() == [1.0]
    # no partition is unanimous, so an added unit could join all-0 chunks: worst-case m(∗) = 1
    assert pma.answer(pred, 100.0, 2) == 1 and pma.S.tolist() == [0.25, 1.0]


def test_k1_reduces_to_subsample_and_aggregate():
    # with one partition every unit's m is 1, so ε̂ after q queries is the SAA moments bound
    answered, pma = _saa_labels(3)
    assert np.all(pma.S == answered)
    assert pma.epsilon_hat() == pytest.approx(
        float(moments_epsilon(answered, lam=2 / 250, delta=1e-3)))
    # and the moments bound of the paper is the zCDP bound of a 2λ-DP mechanism
    lam, delta, q = 2 / 250, 1e-3, 1000
    zcdp = min((2 * lam ** 2 * q * l * (l + 1) + math.log(1 / delta)) / l for l in range(1, 33))
    assert float(moments_epsilon(q, lam=lam, delta=delta)) == pytest.approx(zcdp)


def test_epsilon_of_zero_queries_is_zero():
    assert epsilon_of(0, lam=0.1, delta=1e-5) == 0.0


def test_labels_from_grant_spends_exactly_the_charge():
    from sage_tfx.bagging import labels_from_grant
    from sage_tfx.errors import InvalidRequestError
    cfg = BaggingConfig(k=10, n=50, lam=0.04)
    plan = plan_labels(cfg, epsilon=2.0, delta=1e-5, public_size=5000)
    # basic grant of ε(p): the trainer derives the same p
    again = labels_from_grant(cfg, epsilon=plan.epsilon, delta=plan.delta, event=None,
                              public_size=5000)
    assert again.queries == plan.queries
    # rdp grant: the event itself says p; ε reported at the stream's δ
    rdp = labels_from_grant(cfg, epsilon=None, delta=None, event=plan.event, public_size=5000,
                            report_delta=1e-5)
    assert rdp.queries == plan.queries and rdp.epsilon == pytest.approx(plan.epsilon)
    with pytest.raises(InvalidRequestError):     # an event for another λ
        labels_from_grant(BaggingConfig(k=10, n=50, lam=0.05), epsilon=None, delta=None,
                          event=plan.event, public_size=5000, report_delta=1e-5)
    with pytest.raises(InvalidRequestError):     # paper mode has no DpEvent
        labels_from_grant(BaggingConfig(k=10, n=50, lam=0.04, mode="paper"), epsilon=None,
                          delta=None, event=plan.event, public_size=5000, report_delta=1e-5)
    with pytest.raises(InvalidRequestError):     # paid for more labels than public points
        labels_from_grant(cfg, epsilon=None, delta=None, event=plan.event, public_size=10,
                          report_delta=1e-5)
    with pytest.raises(InvalidRequestError):
        plan_labels(cfg, epsilon=2.0, delta=1e-5, public_size=0)


def test_personal_m_multiclass():
    # 3 classes, k = 3: unit 0's teachers vote (0, 1, 2) -> least-voted share 1/3 -> m = 2/3
    unit_chunks = np.array([[0, 0, 0]])
    pred = np.array([[[0, 2], [1, 2], [2, 2]]], dtype=np.uint8)
    pma = PersonalisedMomentsAccountant(unit_chunks, n=2, lam=0.1, delta=1e-5)
    m2, m2_star, _ = pma._m_squared(pred, 3)
    assert m2[0, 0] == pytest.approx((2 / 3) ** 2)
    assert m2_star[0] == pytest.approx(1.0)       # ∗ (last chunk) unanimous for class 2
