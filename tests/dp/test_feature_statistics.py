"""DP feature statistics (the core of DPStatisticsGen): sensitivities, noise scales, ε shares,
an empirical audit, and the post-processing rules that stock SchemaGen / ExampleValidator read.

Numbers are checked against their formulas and against dp_accounting / OpenDP directly.
"""
import dataclasses
from decimal import Decimal

import dp_accounting
import numpy as np
import pytest

from sage_tfx.dp import audit, noise as noise_lib
from sage_tfx.dp import feature_statistics as fs
from sage_tfx.dp import feature_statistics_release as fr
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError
from sage_tfx.ledger import accounting

K = 3
ALPHA = 1e-4
RUNS = 10_000


def _config(**kw):
    return fs.StatisticsConfig((fs.NumericFeature("x", -2.0, 6.0, num_bins=8, max_values=K),
                                fs.CategoricalFeature("c", domain=("a", "b", "c"),
                                                      max_values=K)), **kw)


def _rows(rng, n):
    rows = []
    for _ in range(n):
        row = {}
        m = int(rng.integers(0, 5))
        if m:
            row["x"] = [float(v) for v in rng.normal(2, 3, m)]
        m = int(rng.integers(0, 5))
        if m:
            row["c"] = [bytes(rng.choice([b"a", b"b", b"c", b"z"])) for _ in range(m)]
        rows.append(row)
    return rows


def _l1(a, b):
    return {k: float(np.abs(a[k] - b[k]).sum()) for k in a}


def test_sensitivities_bound_one_example_and_are_attained():
    """Adding any one example moves each query's exact aggregate by at most its declared L1
    sensitivity (random datasets, random and extreme examples); the extreme one attains it."""
    config = _config()
    declared = {key: sens for key, sens, _ in config.laplace_queries()}
    rng = np.random.default_rng(0)
    extreme = {"x": [6.0, -2.0, 6.0, 6.0, 6.0], "c": [b"a", b"b", b"c", b"a"]}
    worst = dict.fromkeys(declared, 0.0)
    for trial in range(200):
        rows = _rows(rng, int(rng.integers(0, 30)))
        extra = extreme if trial % 4 == 0 else _rows(rng, 1)[0]
        base, _ = config.aggregate(rows)
        added, _ = config.aggregate(rows + [extra])
        for key, change in _l1(added, base).items():
            assert change <= declared[key] + 1e-9, (key, change, extra)
            worst[key] = max(worst[key], change)
    # h = 4, K = 3: sum K·h = 12, squares K·h² = 48 (x = 6 and −2 are both at distance h).
    assert declared["x:sum"] == 12.0 and declared["x:squares"] == 48.0
    for key in ("x:values", "x:squares", "c:domain", "x:valency", "num_examples"):
        assert worst[key] == pytest.approx(declared[key]), key


def test_aggregates_add_up_over_disjoint_batches_and_bound_contributions():
    config = _config()
    rng = np.random.default_rng(1)
    a, b = _rows(rng, 40), _rows(rng, 25)
    whole, _ = config.aggregate(a + b)
    merged, _ = fr.merge([config.aggregate(a), config.aggregate(b)])
    for key in whole:
        np.testing.assert_allclose(whole[key], merged[key])
    # NaN values are absent, values past K dropped, zeros in their own cell, out-of-bounds clipped.
    row = {"x": [float("nan"), 0.0, 100.0, -100.0, 1.0], "c": [b"a", b"a", b"z", b"b"]}
    totals, _ = config.aggregate([row])
    assert list(totals["x:valency"]) == [0, 0, 0, 1]
    assert totals["x:values"][-1] == 1 and totals["x:values"][0] == 1  # -100 → -2: first bin
    assert totals["x:values"][-2] == 1  # 100 → 6: last bin (closed)
    assert totals["x:sum"][0] == pytest.approx((0 - 2) + (6 - 2) + (-2 - 2))
    assert list(totals["c:domain"]) == [1, 0, 0]  # first K values: a, a, z; z not in the domain


def test_shares_never_exceed_the_part_and_compose_to_it():
    config = _config()
    budget = config.budget(0.7)
    shares = [q.epsilon for q in budget.queries]
    assert len(shares) == 1 + 4 + 2
    total = sum(accounting.exact(e) for e in shares)
    assert total <= Decimal("0.7") and Decimal("0.7") - total < Decimal("1e-15")
    # OpenDP's own map of each sampler meets its share.
    for q in budget.queries:
        assert noise_lib.laplace_epsilon(q.scale, q.sensitivity) <= q.epsilon
        assert q.scale == pytest.approx(q.sensitivity / q.epsilon, rel=1e-12)
    # The composed event, accounted by dp_accounting: PLD's ε tends to the sum as δ → 0 (pure
    # ε-DP; at δ = 0 its discretized tail gives inf), RDP is never below it.
    event = config.dp_event(0.7)
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(event)
    assert 0.7 - 1e-6 < pld.get_epsilon(1e-12) <= 0.7
    assert pld.get_epsilon(1e-6) < 0.7
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(event)
    assert rdp.get_epsilon(1e-9) >= 0.7 - 1e-9


def test_noise_scale_matches_the_laplace_formula():
    """Empirical std of each query's noise (OpenDP) against sqrt(2)·Δ/ε_q."""
    config = _config()
    budget = config.budget(1.0)
    totals = config.zero()
    draws = {key: [] for key in totals}
    for _ in range(1500):
        noisy = fr.release(config, budget, totals)
        for key in draws:
            draws[key].append(noisy.values[key])
    for q in budget.queries:
        values = np.concatenate(draws[q.key])
        expected = np.sqrt(2.0) * q.sensitivity / q.epsilon
        assert abs(values.mean()) < 5 * expected / np.sqrt(values.size)
        assert values.std() == pytest.approx(expected, rel=0.1), q.key


def test_audit_catches_a_histogram_that_ignores_max_values():
    """Black-box audit of the value histogram: neighbours differ by one example with K values in
    one bin. The real mechanism passes at its share; the same release with sensitivity 1 (a
    mechanism that forgot the valency bound) is caught."""
    config = _config()
    budget = config.budget(1.0)
    q = budget.query("x:values")
    row = {"x": [5.5] * K}
    a, _ = config.aggregate([])
    b, _ = config.aggregate([row])

    assert b[q.key][7] - a[q.key][7] == K  # the bin [5, 6)

    def release(query):
        def run(totals, n):  # the bin's coordinate of n releases (coordinates are independent)
            return query.mechanism.add_noise(np.full(n, totals[q.key][7]), None)
        return run

    # As tests/dp/test_audit.py: a correct mechanism fails with probability ≤ ALPHA.
    good = audit.audit_mechanism(release(q), a, b, claimed_epsilon=q.epsilon, runs=RUNS,
                                 alpha=ALPHA)
    assert good.passed, good
    broken = dataclasses.replace(q, sensitivity=1.0)
    bad = audit.audit_mechanism(release(broken), a, b, claimed_epsilon=q.epsilon, runs=RUNS,
                                alpha=ALPHA)
    assert not bad.passed, bad


def _summary(config, noisy_values, vocab=None):
    budget = config.budget(1.0)
    values = {k: np.asarray(v, dtype=float) for k, v in noisy_values.items()}
    for key, _, cells in config.laplace_queries():
        values.setdefault(key, np.zeros(cells))
    return fr.summarize(config, budget, fr.NoisyStatistics(values, vocab or {})), budget


def test_post_processing_counts_are_integers_thresholded_and_consistent():
    config = _config()
    budget = config.budget(1.0)
    tau = budget.query("x:valency").threshold
    assert tau == pytest.approx(budget.query("x:valency").scale * np.log((K + 1) / 2e-3))
    summary, _ = _summary(config, {
        "num_examples": [-3.2],  # a negative noisy count: no examples
        "x:valency": [1.0, 900.0, 0.0, 0.0]})
    assert summary.num_examples == 0
    assert summary.features[0].common.num_non_missing == 0
    summary, _ = _summary(config, {
        "num_examples": [1000.4],
        "x:valency": [tau * 0.9, 600.0, 400.6, tau * 0.5],  # missing below τ: reported 0
        "x:values": [0, 0, 0, 0, 0, 1000.0, 0, 0, 450.0],  # bin [3, 4) and a cell of zeros
        "x:sum": [1400 * 1.5], "x:squares": [1400 * 3.0],
        "c:valency": [400.0, 600.0, 0.0, 0.0],
        "c:domain": [599.0, -20.0, tau * 0.5]})
    x = summary.features[0]
    assert summary.num_examples == 1000
    assert (x.common.num_missing, x.common.num_non_missing) == (0, 1000)
    assert (x.common.min_num_values, x.common.max_num_values) == (1, 2)
    assert x.common.avg_num_values == pytest.approx((600 + 2 * 400.6) / 1000.6)
    assert x.common.tot_num_values == round(x.common.avg_num_values * 1000)
    n = x.numeric
    assert (n.min, n.max) == (0.0, 4.0)  # the zeros' point and the right edge of [3, 4)
    assert n.num_zeros == 450 and n.min <= n.median <= n.max
    assert n.mean == pytest.approx(2.0 + 1400 * 1.5 / x.common.tot_num_values)
    assert min(n.bin_counts) >= 0 and list(n.quantiles) == sorted(n.quantiles)
    c = summary.features[1]
    assert (c.common.num_missing, c.common.num_non_missing) == (400, 600)
    assert c.categorical.values == ((b"a", 599.0),) and c.categorical.unique == 1


def test_presence_is_exact_with_probability_at_least_one_minus_beta():
    """A feature present in every example: noise alone must make it look optional (num_missing
    > 0, which SchemaGen turns into an optional feature) in at most a β share of releases."""
    config = fs.StatisticsConfig((fs.NumericFeature("x", 0.0, 1.0),), failure_probability=0.05)
    budget = config.budget(1.0)
    rows = [{"x": [0.5]}] * 500
    totals, _ = config.aggregate(rows)
    optional = 0
    runs = 600
    for seed in range(runs):
        noisy = fr.release(config, budget, totals, noise=SeededNoise(seed))
        summary = fr.summarize(config, budget, noisy)
        optional += summary.features[0].common.num_missing > 0
    # P(noise > τ on the missing cell) ≤ β / cells = 0.025: 15 expected, 40 is > 6 σ away.
    assert optional <= 40


@pytest.mark.parametrize("build,error", [
    (lambda: fs.NumericFeature("x", 1.0, 1.0), InvalidPrivacyParameterError),
    (lambda: fs.NumericFeature("x", 0.0, float("inf")), InvalidPrivacyParameterError),
    (lambda: fs.NumericFeature("x", 0.0, 1.0, max_values=0), InvalidRequestError),
    (lambda: fs.NumericFeature("x", 0.0, 1.0, dtype="double"), InvalidRequestError),
    (lambda: fs.NumericFeature("a:b", 0.0, 1.0), InvalidRequestError),
    (lambda: fs.CategoricalFeature("c", domain=("a", "a")), InvalidRequestError),
    (lambda: fs.CategoricalFeature("c", domain="ab"), InvalidRequestError),
    (lambda: fs.StatisticsConfig((fs.NumericFeature("x", 0, 1),) * 2), InvalidRequestError),
    (lambda: _config(failure_probability=1.0), InvalidPrivacyParameterError),
    (lambda: _config().budget(0.0), InvalidPrivacyParameterError),
    (lambda: _config().budget(float("nan")), InvalidPrivacyParameterError),
    (lambda: fs.StatisticsConfig((fs.CategoricalFeature("c"),)).budget(1.0),
     InvalidPrivacyParameterError),
    (lambda: fs.StatisticsConfig((fs.CategoricalFeature("c"),)).dp_event(1.0),
     InvalidRequestError),
    (lambda: fs.StatisticsConfig.from_json('{"features": [{"kind": "text", "name": "t"}]}'),
     InvalidRequestError),
    (lambda: fs.StatisticsConfig.from_json("{"), InvalidRequestError),
])
def test_bad_configurations_are_refused(build, error):
    with pytest.raises(error):
        build()


def test_configuration_round_trips_through_json():
    config = fs.StatisticsConfig((fs.NumericFeature("x", 0, 5, dtype="int", num_bins=5),
                                  fs.CategoricalFeature("c", domain=("u", "v"), max_values=2),
                                  fs.CategoricalFeature("w")), failure_probability=0.01,
                                 num_quantiles=4, num_top_values=3)
    assert fs.StatisticsConfig.from_json(config.to_json()) == config
    budget = config.budget(1.0, 1e-6)
    assert [v.feature for v in budget.vocabularies] == ["w"]
    assert budget.vocabularies[0].delta == 1e-6
    assert sum(accounting.exact(q.epsilon) for q in budget.queries) + accounting.exact(
        budget.vocabularies[0].epsilon) <= Decimal(1)


def test_vocabulary_by_partition_selection_lists_common_values_only():
    """A categorical feature without a domain: common values are released with noisy counts
    (the top values), a value held by a single example is not (δ bounds that), and each
    example counts once per distinct value among its first max_values values."""
    from sage_tfx.dp.partition_selection import PartitionSelection
    config = fs.StatisticsConfig((fs.CategoricalFeature("city", max_values=2),))
    budget = config.budget(2.0, 1e-6)
    [vocab] = budget.vocabularies
    assert (vocab.delta, vocab.max_values) == (1e-6, 2)
    spent = accounting.exact(vocab.epsilon) + sum(accounting.exact(q.epsilon)
                                                  for q in budget.queries)
    assert Decimal(2) - Decimal("1e-15") < spent <= Decimal(2)
    rows = ([{"city": [b"paris", b"paris", b"lyon"]}] * 300 + [{"city": [b"nice"]}] * 200
            + [{"city": [b"rare"]}])
    totals, counts = config.aggregate(rows)
    # "lyon" is the third value of its examples: past max_values, never counted.
    assert counts["city"] == {b"paris": 300, b"nice": 200, b"rare": 1}
    assert list(totals["city:valency"]) == [0, 201, 300]
    selection = PartitionSelection(vocab.epsilon, vocab.delta, 2)
    for _ in range(20):
        noisy = fr.release(config, budget, totals, counts)
        assert set(noisy.vocabularies["city"]) == {b"paris", b"nice"}
        assert all(c >= selection.threshold for c in noisy.vocabularies["city"].values())
    summary = fr.summarize(config, budget, noisy)
    cat = summary.features[0].categorical
    assert [v for v, _ in cat.values] == [b"paris", b"nice"] and cat.unique == 2
    assert cat.avg_length == pytest.approx(
        (5 * cat.values[0][1] + 4 * cat.values[1][1]) / (cat.values[0][1] + cat.values[1][1]))
