"""ptklib kernels 4-6 (Analyze-Gauss, historical statistics, DP Lloyd): noise scales against
their formulas, declared events against dp_accounting, utility approaching the non-private
kernel as epsilon grows, input validation, serialisable states, featurizers, registration."""
import json

import dp_accounting
import numpy as np
import pytest

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError
from sage_tfx.ptk.abstraction import batches_of, check_charge
from sage_tfx.ptk.registry import default_registry
from sage_tfx.ptk.kernels import covariance, histstats, lloyd

from ptk_data import CV, CV_CONFIG, HS, HS_CONFIG, window

LL = "lloyd"
LL_CONFIG = {"columns": ["x0", "x1"], "lower": [-3.0, -3.0], "upper": [3.0, 3.0], "k": 3,
             "iterations": 4, "init": [[-1.0, -1.0], [0.0, 1.0], [1.0, 0.0]]}


class Tap:
    """A noise source that forwards to SeededNoise and records (kind, scale, noise drawn)."""

    def __init__(self, seed):
        self.inner, self.draws = SeededNoise(seed), []

    def _call(self, kind, v, scale):
        out = getattr(self.inner, kind)(v, scale)
        self.draws.append((kind, scale, np.asarray(out, dtype=float) - np.asarray(v, dtype=float)))
        return out

    def laplace(self, v, s):
        return self._call("laplace", v, s)

    def discrete_laplace(self, v, s):
        return self._call("discrete_laplace", v, s)

    def gaussian(self, v, s):
        return self._call("gaussian", v, s)

    def noise(self, kind):
        return np.concatenate([d.ravel() for k, _, d in self.draws if k == kind])


def blobs(n, seed, centres=((-2.0, -2.0), (0.0, 2.0), (2.0, -1.0))):
    rng = np.random.default_rng(seed)
    lab = rng.integers(0, len(centres), size=n)
    xy = np.asarray(centres)[lab] + rng.normal(0, 0.3, size=(n, 2))
    return {"x0": xy[:, 0], "x1": xy[:, 1], "label": lab}


def dlap_var(b):
    q = np.exp(-1 / b)
    return 2 * q / (1 - q) ** 2


# ---------------------------------------------------------------- 6: DP Lloyd
def test_lloyd_declared_event_matches_the_noise_that_runs():
    eps, t = 0.8, LL_CONFIG["iterations"]
    tap = Tap(0)
    lloyd.train_dp(batches_of(blobs(300, 0)), eps, None, None, config=LL_CONFIG, noise=tap)
    # per iteration: counts, sensitivity 1, eps/(2T); centred sums in the unit box, L1 sens d/2
    want = [("discrete_laplace", 2 * t / eps), ("laplace", (2 * t / eps) * 2 / 2)] * t
    assert [(k, s) for k, s, _ in tap.draws] == [(k, pytest.approx(s, rel=1e-12)) for k, s in want]
    charge = lloyd.dp_event(eps, LL_CONFIG)
    check_charge(charge)  # exact decimal pure-epsilon check: T * (eps_c + eps_s) <= eps
    m_c, m_s = lloyd.noise_multipliers(eps, LL_CONFIG)
    assert [s for _, s, _ in tap.draws[:2]] == [m_c, m_s * lloyd.sum_sensitivity(LL_CONFIG)]
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(charge.event)
    assert pld.get_epsilon(1e-9) == pytest.approx(eps, abs=0.01)
    for e in (0.1, 0.3, 1 / 3, 0.7, 1.0, 2.5):  # the ulp rounding keeps every budget accountable
        for share in (0.2, 0.5, 0.9):
            check_charge(lloyd.dp_event(e, dict(LL_CONFIG, count_share=share, iterations=7)))


def test_lloyd_empirical_noise_matches_formula():
    eps, cfg = 1.0, dict(LL_CONFIG, iterations=2, k=2, init=None)
    tap = Tap(3)
    data = blobs(200, 1)
    for _ in range(150):
        lloyd.train_dp(batches_of(data), eps, None, None, config=cfg, noise=tap)
    b_c = 2 * 2 / eps                     # counts: T / (eps/2)
    b_s = (2 * 2 / eps) * (2 / 2)         # sums: same multiplier times d/2 = 1
    counts, sums = tap.noise("discrete_laplace"), tap.noise("laplace")
    assert np.std(counts) == pytest.approx(np.sqrt(dlap_var(b_c)), rel=0.1)
    assert np.std(sums) == pytest.approx(np.sqrt(2) * b_s, rel=0.1)
    assert abs(np.mean(sums)) < 4 * np.sqrt(2) * b_s / np.sqrt(len(sums))
    # a mechanism with half the noise would fail this
    assert not np.std(sums) == pytest.approx(np.sqrt(2) * b_s / 2, rel=0.1)


def _matched_error(state, ref):
    a, b = np.asarray(state["centroids"]), np.asarray(ref["centroids"])
    return max(np.min(np.linalg.norm(b - p, axis=1)) for p in a)


def test_lloyd_utility_approaches_nonprivate_as_epsilon_grows():
    data = blobs(2000, 2)
    ref = lloyd.train_nonprivate(batches_of(data), config=LL_CONFIG)
    # the non-private run recovers the three blobs
    assert _matched_error(ref, {"centroids": [[-2, -2], [0, 2], [2, -1]]}) < 0.15
    err, loss = {}, {}
    for eps in (0.05, 1.0, 1000.0):
        runs = [lloyd.train_dp(batches_of(data), eps, None, None, config=LL_CONFIG,
                               noise=SeededNoise(s)) for s in range(6)]
        err[eps] = np.mean([_matched_error(r, ref) for r in runs])
        loss[eps] = np.mean([lloyd.eval(batches_of(data), r, config=LL_CONFIG).mean()
                             for r in runs])
    np_loss = lloyd.eval(batches_of(data), ref, config=LL_CONFIG).mean()
    assert err[0.05] > err[1.0] > err[1000.0] and err[1000.0] < 0.01
    assert loss[1000.0] == pytest.approx(np_loss, rel=0.02) and loss[0.05] > loss[1000.0]


def test_lloyd_validation_clipping_state_and_featurizer():
    for bad in ({}, dict(LL_CONFIG, lower=[0, 0], upper=[0, 1]), dict(LL_CONFIG, k=0),
                dict(LL_CONFIG, iterations=1.5), dict(LL_CONFIG, count_share=1.0),
                dict(LL_CONFIG, columns=["x0", "x0"]), dict(LL_CONFIG, init=[[9, 9]] * 3),
                dict(LL_CONFIG, init=[[np.nan, 0.0]] * 3), dict(LL_CONFIG, seed=-1),
                dict(LL_CONFIG, upper=[3.0, np.inf])):
        with pytest.raises(InvalidRequestError):
            lloyd.dp_event(1.0, bad)
    for eps in (0, -1, float("nan"), float("inf"), True, "1"):
        with pytest.raises(InvalidPrivacyParameterError):
            lloyd.train_dp(batches_of(blobs(50, 0)), eps, None, None, config=LL_CONFIG)
    with pytest.raises(InvalidRequestError, match="lacks the declared column"):
        lloyd.train_dp([{"x0": np.zeros(3)}], 1.0, None, None, config=LL_CONFIG)
    # an outlier far outside the declared box cannot drag a centroid out of it
    data = blobs(200, 3)
    data["x0"][0] = 1e9
    s = lloyd.train_dp(batches_of(data), 1.0, None, None, config=LL_CONFIG, noise=SeededNoise(0))
    assert np.all(np.abs(np.asarray(s["centroids"])) <= 3.0)
    # the state is JSON and featurizes identically after a round trip; OpenDP noise by default
    s = lloyd.train_dp(batches_of(data), 1.0, None, None, config=LL_CONFIG)
    back = json.loads(json.dumps(s))
    batch = {"x0": np.array([-2.0, 2.0, np.nan]), "x1": np.array([-2.0, -1.0, 0.0])}
    f1, f2 = (lloyd.featurize(batch, st, LL_CONFIG) for st in (s, back))
    assert set(f1) == {"km_d0", "km_d1", "km_d2", "km_cluster"}
    for k in f1:
        np.testing.assert_array_equal(f1[k], f2[k])
    d = np.column_stack([f1[f"km_d{j}"] for j in range(3)])
    np.testing.assert_array_equal(np.argmin(d, axis=1), f1["km_cluster"])
    # the previous window's centroids are the public start of the next window's run
    ref = lloyd.train_nonprivate(batches_of(blobs(2000, 4)), config=dict(LL_CONFIG, iterations=1),
                                 prev_state=lloyd.train_nonprivate(batches_of(blobs(2000, 5)),
                                                                   config=LL_CONFIG))
    assert _matched_error(ref, {"centroids": [[-2, -2], [0, 2], [2, -1]]}) < 0.15


# ------------------------------------------------------ 5: historical statistics
def test_histstats_sum_noise_matches_formula_and_backoff():
    eps, tap = 0.5, Tap(4)
    data = window(300, 7)
    for _ in range(200):
        histstats.train_dp(batches_of(data), eps, None, None, config=HS_CONFIG, noise=tap)
    b = (10.0 - 0.0) / eps  # centred sums: sensitivity (hi - lo)/2 at eps/2
    sums = tap.noise("laplace")
    assert np.std(sums) == pytest.approx(np.sqrt(2) * b, rel=0.1)
    # back-off: unseen keys get the DP global mean, rare keys shrink towards it
    state = {"domain": ["a", "b", "c"], "counts": [1000.0, 2.0, -3.0], "means": [2.0, 9.0, 7.0]}
    cfg = dict(HS_CONFIG, domain=["a", "b", "c"], backoff=10.0)
    f = histstats.featurize({"city": np.array(["a", "b", "c", "zz"])}, state, cfg)
    g = (1000 * 2.0 + 2 * 9.0) / 1002
    np.testing.assert_allclose(f["city_delay_count"], [1000.0, 2.0, 0.0, 0.0])
    np.testing.assert_allclose(f["city_delay_mean"],
                               [(1000 * 2 + 10 * g) / 1010, (2 * 9 + 10 * g) / 12, g, g])
    with pytest.raises(InvalidRequestError, match="lacks the declared column"):
        histstats.featurize({"town": np.array(["a"])}, state, cfg)
    with pytest.raises(InvalidPrivacyParameterError):
        histstats.train_dp(batches_of(data), 0.0, None, None, config=HS_CONFIG)
    with pytest.raises(InvalidRequestError):
        histstats.dp_event(1.0, dict(HS_CONFIG, domain=["a", "a"]))
    with pytest.raises(InvalidRequestError):
        histstats.dp_event(1.0, dict(HS_CONFIG, backoff=-1))


def test_histstats_utility_approaches_nonprivate_as_epsilon_grows():
    data, test = window(2000, 8), window(2000, 9)
    erm_loss = histstats.eval(batches_of(test), histstats.erm(batches_of(data), config=HS_CONFIG),
                              config=HS_CONFIG).mean()
    loss = {eps: np.mean([histstats.eval(batches_of(test), histstats.train_dp(
        batches_of(data), eps, None, None, config=HS_CONFIG, noise=SeededNoise(s)),
        config=HS_CONFIG).mean() for s in range(8)]) for eps in (0.01, 1.0, 1000.0)}
    assert loss[0.01] > loss[1.0] > loss[1000.0] >= erm_loss * 0.999
    assert loss[1000.0] == pytest.approx(erm_loss, rel=1e-3)
    s = histstats.train_dp(batches_of(data), 1.0, None, None, config=HS_CONFIG)  # OpenDP
    assert json.loads(json.dumps(s)) == s


# ------------------------------------------------------------ 4: Analyze-Gauss
def test_covariance_empirical_noise_matches_sigma():
    tap = Tap(5)
    for _ in range(300):
        covariance.train_dp(batches_of(window(100, 10)), 0.5, None, None, config=CV_CONFIG,
                            noise=tap)
    sigma = covariance.gaussian_sigma(0.5, CV_CONFIG["delta"])
    g = tap.noise("gaussian")
    assert len(g) == 300 * 6  # d(d+1)/2 upper-triangle entries per run
    assert np.std(g) == pytest.approx(sigma, rel=0.05)


def _subspace_gap(a, b):
    pa, pb = (np.asarray(s["components"]) for s in (a, b))
    return np.linalg.norm(pa @ pa.T - pb @ pb.T)


def test_covariance_utility_approaches_nonprivate_and_featurizer():
    data = window(1500, 11)
    cfg = dict(CV_CONFIG, k=2, center=[0, 0, 0])
    data["x2"] = data["x2"] * 5  # three well-separated eigenvalues: both components defined
    erm = covariance.erm(batches_of(data), config=cfg)
    gap = {eps: np.mean([_subspace_gap(covariance.train_dp(
        batches_of(data), eps, None, None, config=cfg, noise=SeededNoise(s)), erm)
        for s in range(6)]) for eps in (0.05, 1.0, 1000.0)}
    assert gap[0.05] > gap[1.0] > gap[1000.0] and gap[1000.0] < 0.05
    s = json.loads(json.dumps(covariance.train_dp(batches_of(data), 1.0, None, None, config=cfg)))
    f = covariance.featurize({"x0": np.array([1.0, np.nan]), "x1": np.array([1.0, 0.0]),
                              "x2": np.array([0.0, 0.0])}, s, cfg)
    assert set(f) == {"pc0", "pc1"} and np.all(np.isfinite(f["pc0"]))
    with pytest.raises(InvalidPrivacyParameterError):
        covariance.dp_event(-1.0, cfg)
    with pytest.raises(InvalidRequestError, match="lacks the declared column"):
        covariance.featurize({"x0": np.zeros(2)}, s, cfg)


# ------------------------------------------------ all three: registrable by the store
def test_kernels_register_allocate_and_train_in_the_store(make_store):
    store = make_store()

    def win(seed):
        w = window(20000, seed)
        b = blobs(20000, seed + 100)
        w["x0"], w["x1"] = b["x0"], b["x1"]
        return w
    store.advance_window(win(0), user_key="user")
    ids = {}
    for ref, cfg, tau in ((HS, HS_CONFIG, 0.2), (CV, CV_CONFIG, 0.3), (LL, LL_CONFIG, 0.2)):
        t = default_registry().get(ref)
        assert t.charge(0.5, cfg).epsilon == 0.5
        ids[ref] = store.register_ptk(ref, 1, config=cfg, tau=tau)
        assert isinstance(ids[ref], str), ids[ref]
    assert not default_registry().get(LL).has_erm
    out = store.advance_window(win(1), user_key="user")
    assert {t.ptk_id for t in out.trained} == set(ids.values())
    state = store.get_ptk(ids[LL]).model_state
    f = lloyd.featurize(blobs(10, 0), state, LL_CONFIG)
    assert f["km_cluster"].shape == (10,)
    lin = store.lineage(ids[LL])
    grant = store.ledger.grant(lin.grant_id)  # one charge per partition, before the run
    members = [t for t in out.trained if t.grant_id == lin.grant_id]
    assert grant.epsilon == pytest.approx(sum(float(t.epsilon) for t in members))
    assert set(lin.blocks) <= set(grant.block_ids)


def test_lloyd_count_release_empirical_audit():
    """Neighbouring datasets (one extra row in the only cluster): the released count must have
    |log P(k | D) / P(k | D')| within its share eps_c = eps / (2T); half the noise would give
    twice that."""
    cfg = dict(LL_CONFIG, k=1, iterations=1, init=[[0.0, 0.0]])
    d = {"x0": np.zeros(10), "x1": np.zeros(10)}
    d2 = {k: np.append(v, 1.0) for k, v in d.items()}
    noise, runs, eps = SeededNoise(11), 8000, 1.0
    draws = [np.array([lloyd.train_dp([x], eps, None, None, config=cfg, noise=noise)["counts"][0]
                       for _ in range(runs)]) for x in (d, d2)]
    worst = max(abs(np.log(np.mean(draws[0] == k) / np.mean(draws[1] == k))) for k in range(8, 14))
    assert 0.3 < worst < 0.75  # true value eps_c = 0.5
