"""DP count selection picks the informative pair; it is charged before it reads."""
import numpy as np
import pandas as pd
import pytest

from sage_tfx.errors import InvalidRequestError, ReleaseConflictError
from sage_tfx.ledger import open_ledger
from sage_tfx.pyramid import select_groups
from sage_tfx.pyramid.selection import pair_gains


def xor_frame(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    a, b, c, d = (rng.integers(0, 4, n) for _ in range(4))
    y = ((a + b) % 2 == 0).astype(int)            # only the pair (a, b) explains y
    flip = rng.random(n) < 0.05
    return pd.DataFrame({"a": a, "b": b, "c": c, "d": d, "y": np.where(flip, 1 - y, y)})


def test_exact_gain_is_largest_for_the_interacting_pair():
    pairs, gains = pair_gains(xor_frame(), ["a", "b", "c", "d"], "y")
    assert pairs[int(np.argmax(gains))] == ("a", "b")


def test_private_selection_finds_it_and_charges_the_ledger(sqlite_url):
    led = open_ledger(sqlite_url)
    led.create_stream("s", epsilon_g=1.0, delta_g=0.0)
    led.add_block("s", "b0", location="/x")
    got = select_groups(xor_frame(), ["a", "b", "c", "d"], "y", 1, 0.5, max_records=10_000,
                        ledger=led, stream="s", blocks=["b0"], run_id="sel-w0")
    assert got == [("a", "b")]
    assert led.remaining("s", "b0")["epsilon"] == pytest.approx(0.5)
    # A replay of the run id returns the recorded choice, even on other data (where (c, d)
    # is the pair to find): no new noise, no new charge, one release.
    swapped = xor_frame(seed=1).rename(columns={"a": "c", "b": "d", "c": "a", "d": "b"})
    again = select_groups(swapped, ["a", "b", "c", "d"], "y", 1, 0.5, max_records=10_000,
                          ledger=led, stream="s", blocks=["b0"], run_id="sel-w0")
    assert again == [("a", "b")]
    assert led.remaining("s", "b0")["epsilon"] == pytest.approx(0.5)
    grant = led.grant_for_run("s", "sel-w0")
    assert [r.name for r in led.releases(grant.grant_id)] == ["pyramid/select_groups"]
    assert led.check_consistency("s") == []
    # the same run id asked for another guarantee (per user of 5 observations): not the
    # recorded choice passed off as its answer
    with pytest.raises(ReleaseConflictError, match=r"\['k'\]"):
        select_groups(xor_frame(), ["a", "b", "c", "d"], "y", 1, 0.5, max_records=10_000, k=5,
                      ledger=led, stream="s", blocks=["b0"], run_id="sel-w0")
    assert led.remaining("s", "b0")["epsilon"] == pytest.approx(0.5)


@pytest.mark.parametrize("kw", [dict(n_select=0), dict(n_select=7), dict(max_records=10),
                                dict(features=["a"]), dict(k=0), dict(k=1.5), dict(k=True)])
def test_bad_selection_requests(kw):
    args = dict(frame=xor_frame(200), features=["a", "b", "c", "d"], label="y", n_select=1,
                epsilon=1.0, max_records=10_000)
    args.update(kw)
    with pytest.raises(InvalidRequestError):
        select_groups(**args)


# -- per user: neighbours differ in the k observations of one user --

FEATS = ["a", "b", "c"]


def window(n, seed):
    """n observations of three binary features, the label independent of them."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({f: rng.integers(0, 2, n) for f in FEATS + ["y"]})


def xor_user(k, seed=7):
    """One user's k observations: the label is a XOR b, so only the pair (a, b) gains."""
    rng = np.random.default_rng(seed)
    a, b, c = (rng.integers(0, 2, k) for _ in range(3))
    return pd.DataFrame({"a": a, "b": b, "c": c, "y": (a ^ b).astype(int)})


@pytest.mark.parametrize("max_records, k, n_select, eps", [(200, 1, 1, 1.0), (200, 150, 1, 1.0),
                                                           (10_000, 5, 2, 0.3),
                                                           (50, 40, 3, 4.0)])
def test_selection_noise_scale_for_k_contributions(monkeypatch, max_records, k, n_select, eps):
    """The L∞ sensitivity is k · 2 (ln(N + 1) + 2), and the scale select_groups draws with is the
    exponential mechanism's peeled n_select times: 2 · n_select · Δ_k / ε (closed form, not
    OpenDP's search); OpenDP's own map at Δ_k gives at most ε."""
    from sage_tfx.dp import count_selection as cs
    from sage_tfx.pyramid import selection
    delta_k = 2 * k * (np.log(max_records + 1) + 2)
    assert selection.gain_sensitivity(max_records, k) == pytest.approx(delta_k, rel=1e-12)
    used = []
    real = cs._top_k_meas
    monkeypatch.setattr(cs, "_top_k_meas", lambda n, kk, sc: used.append(sc) or real(n, kk, sc))
    select_groups(window(40, 0), FEATS, "y", n_select, eps, max_records=max_records, k=k)
    scale = used[-1]                                  # the measurement that drew the choice
    assert scale == pytest.approx(2 * n_select * delta_k / eps, rel=1e-6)
    assert real(3, n_select, scale).map(delta_k) <= eps * (1 + 1e-9)


def _frequencies(frame, k, eps, draws):
    got = [select_groups(frame, FEATS, "y", 1, eps, max_records=200, k=k)[0]
           for _ in range(draws)]
    pairs, _ = pair_gains(frame, FEATS, "y")
    return np.array([sum(g == p for g in got) for p in pairs])


def _epsilon_lower_bound(x, y, draws, alpha=1e-5):
    """Largest lower confidence bound (Clopper-Pearson, each side at ``alpha``) of
    ln P(D)/P(D') over the outcomes and both directions."""
    from scipy.stats import beta
    lo = lambda c: beta.ppf(alpha, c, draws - c + 1) if c > 0 else 0.0         # noqa: E731
    hi = lambda c: beta.ppf(1 - alpha, c + 1, draws - c) if c < draws else 1.0  # noqa: E731
    return max(np.log(max(lo(a), 1e-300) / hi(b)) for a, b in [*zip(x, y), *zip(y, x)])


def _exact_probabilities(frame, k, eps):
    """Report-noisy-max with exponential noise of scale s (the permute-and-flip mechanism, what
    OpenDP's noisy max runs under pure DP): outcome i wins with probability
    ∫ f_i(t) Π_{j≠i} F_j(t) dt, where score j + Exp(s) has density f_j and CDF F_j."""
    from scipy.integrate import quad
    _, gains = pair_gains(frame, FEATS, "y")
    g = np.asarray(gains) - max(gains)
    s = 2 * (2 * k * (np.log(201) + 2)) / eps

    def cdf(j, t):
        return -np.expm1(-(t - g[j]) / s) if t > g[j] else 0.0

    def wins(i):
        def f(t):
            return np.exp(-(t - g[i]) / s) / s * np.prod([cdf(j, t) for j in range(3) if j != i])
        return quad(f, g[i], g[i] + 60 * s, points=sorted(set(g[g > g[i]])), limit=200)[0]

    p = np.array([wins(i) for i in range(3)])
    assert abs(p.sum() - 1) < 1e-6
    return p


def test_selection_is_private_per_user_and_a_k_unaware_one_is_caught():
    """Neighbouring windows: D (20 observations) and D' = D + one user's 150 observations. The
    user moves the (a, b) gain by far more than one observation's bound, so a selection
    calibrated per observation (k=1) shows a privacy loss above ε on these neighbours, while the
    one calibrated for k=150 does not. Both draw with the probabilities of report-noisy-max with
    exponential noise at their scale (computed here by integration, not by OpenDP)."""
    from scipy.stats import chisquare
    eps, k, draws = 1.0, 150, 1200
    d = window(20, 3)
    d2 = pd.concat([d, xor_user(k)], ignore_index=True)
    _, g, = pair_gains(d, FEATS, "y")
    _, g2 = pair_gains(d2, FEATS, "y")
    shift = np.max(np.abs(np.subtract(g2, g)))
    from sage_tfx.pyramid.selection import gain_sensitivity
    assert gain_sensitivity(200, 1) < shift <= gain_sensitivity(200, k)
    found = {}
    for kk in (k, 1):
        x, y = _frequencies(d, kk, eps, draws), _frequencies(d2, kk, eps, draws)
        for counts, frame in ((x, d), (y, d2)):
            p = _exact_probabilities(frame, kk, eps)
            assert chisquare(counts, p * draws).pvalue > 1e-5, (kk, counts, p)
        found[kk] = _epsilon_lower_bound(x, y, draws)
    assert found[k] <= eps                # k-aware: no evidence of a loss above ε
    assert found[1] > eps                 # per observation only: caught on one user's rows
