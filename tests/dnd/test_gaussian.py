"""The gaussian unit (L2 clip, Gaussian noise, (ε, δ) per update) and its float-safe vector
sampler: noise against its formula, the charge, an empirical audit that catches half the noise,
and the sampler's distribution (KS) and cost in random bytes."""
import math

import numpy as np
import pytest
from dp_accounting import dp_event as dp_event_lib
from scipy import stats

from sage_tfx.dnd import ClientConfig, GLMSpec, client_update
from sage_tfx.dnd import noise as vector_noise
from sage_tfx.dnd.budget import RunBudget, request_run, run_delta, run_epsilon, run_event
from sage_tfx.dnd.client import (check_update_matches_ledger_epsilon, clip_gradient,
                                 gaussian_noise_multiplier, pld_epsilon)
from sage_tfx.dp.audit import gaussian_shift_audit
from sage_tfx.errors import InvalidPrivacyParameterError, MissingGrantError
from sage_tfx.ledger import Window, accounting, open_ledger


def _cfg(epsilon=8.0, delta=1e-6, gamma=0.05, clip=0.5):
    return ClientConfig(gamma=gamma, epsilon=epsilon, unit="gaussian", delta=delta,
                        l2_norm_clip=clip)


def test_config_needs_delta_and_l2_clip_and_keeps_them_to_its_unit():
    with pytest.raises(InvalidPrivacyParameterError, match="l2_norm_clip"):
        ClientConfig(0.1, epsilon=1.0, unit="gaussian", delta=1e-6)
    with pytest.raises(InvalidPrivacyParameterError, match="delta"):
        ClientConfig(0.1, epsilon=1.0, unit="gaussian", l2_norm_clip=1.0)
    with pytest.raises(InvalidPrivacyParameterError):
        ClientConfig(0.1, epsilon=1.0, unit="gaussian", delta=0.0, l2_norm_clip=1.0)
    with pytest.raises(InvalidPrivacyParameterError, match="gaussian unit"):
        ClientConfig(0.1, epsilon=1.0, unit="model", delta=1e-6)
    cfg = _cfg()
    assert ClientConfig.from_dict(cfg.to_dict()) == cfg
    old = {"gamma": 0.1, "l1_norm_clip": 1.0, "epsilon": 1.0, "unit": "model"}  # stored runs
    assert ClientConfig.from_dict(old) == ClientConfig(0.1, 1.0, 1.0, "model")


def test_l2_clip_bounds_the_norm_and_keeps_small_gradients():
    cfg = _cfg(clip=2.0)
    g = np.array([3.0, 4.0])
    assert np.allclose(clip_gradient(g, cfg), [1.2, 1.6])
    assert np.allclose(clip_gradient(g / 5, cfg), g / 5)


@pytest.mark.parametrize("epsilon", [1.0, 8.0])
def test_noise_multiplier_is_dp_accountings_and_the_charge_covers_the_sampler(epsilon):
    cfg = _cfg(epsilon)
    m = cfg.noise_multiplier
    share = vector_noise.SAMPLER_DELTA_SHARE
    # the PLD accountant's ε of GaussianDpEvent(m), plus the sampler's, is at most the charge ...
    assert pld_epsilon(m, 1e-6 * (1 - share)) <= epsilon - vector_noise.SAMPLER_EPSILON
    assert check_update_matches_ledger_epsilon(cfg, 7850) <= epsilon
    # ... and m is not wasteful: 1 % less noise would not meet it
    assert pld_epsilon(0.99 * m, 1e-6 * (1 - share)) > epsilon - vector_noise.SAMPLER_EPSILON
    assert vector_noise.sampler_delta(m, cfg.l2_sensitivity, 7850) <= 1e-6 * share
    assert cfg.noise_scale == pytest.approx(m * 2 * 0.05 * 0.5)
    assert cfg.update_event(7850) == dp_event_lib.GaussianDpEvent(m)
    assert gaussian_noise_multiplier(epsilon, 1e-6) == m


def test_noise_std_of_a_real_update_matches_the_formula():
    """Per-weight std of a real update's noise (the secure sampler) = m·2γC₂, up to the
    sampler's ≤ 1/64 grid allowance."""
    spec = GLMSpec("logistic", 29_999)
    cfg = _cfg(epsilon=4.0)
    rng = np.random.default_rng(0)
    x = rng.uniform(size=(10, spec.n_features))
    y = rng.integers(0, 2, size=10).astype(float)
    w = rng.normal(size=spec.dim)
    exact = client_update(spec, w, x, y, ClientConfig(0.05, 1.0, None, "gaussian",
                                                      l2_norm_clip=0.5))
    resid = client_update(spec, w, x, y, cfg) - exact
    sigma = cfg.sampler_std(spec.dim)
    assert cfg.noise_scale <= sigma <= cfg.noise_scale * (1 + 1 / 64)
    assert np.std(resid) == pytest.approx(sigma, rel=0.02)  # sd of the estimate: 0.4 %
    assert abs(np.mean(resid)) < 4 * sigma / math.sqrt(resid.size)
    assert stats.kstest(resid / sigma, "norm").pvalue > 1e-6


def _audit(cfg, runs):
    """Adjacent clients whose clipped gradients are ±C₂ on the intercept (worst case: their
    updates differ by exactly Δ₂ = 2γC₂). At w = 0, ŷ = 1/2: the gradients are ±1/2·e₀, which
    C₂ = 0.5 leaves unchanged."""
    spec = GLMSpec("logistic", 2)
    x = np.zeros((1, 2))

    def release(y, n):
        return np.array([client_update(spec, np.zeros(3), x, np.array([y]), cfg)[0]
                         for _ in range(n)])
    return gaussian_shift_audit(release, 0.0, 1.0, claimed_epsilon=cfg.epsilon,
                                delta=cfg.delta, runs=runs)


@pytest.mark.parametrize("epsilon", [1.0, 8.0])
def test_empirical_audit_bounds_the_update(epsilon):
    res = _audit(_cfg(epsilon, clip=0.5), 2000)
    assert res.normality_pvalue > 1e-6
    assert res.passed, res


@pytest.mark.parametrize("epsilon", [1.0, 8.0])
def test_empirical_audit_catches_half_the_noise(monkeypatch, epsilon):
    """A broken mechanism calibrated to sensitivity γC₂ instead of 2γC₂ (half the noise)."""
    cfg = _cfg(epsilon, clip=0.5)
    half = cfg.noise_multiplier / 2
    monkeypatch.setattr(ClientConfig, "noise_multiplier", property(lambda self: half))
    res = _audit(cfg, 2000)
    assert not res.passed, res


def test_vector_sampler_matches_its_distribution_and_stays_on_its_grid():
    m, sens, d = 0.65, 0.004, 20_000
    x = np.random.default_rng(1).normal(size=d)
    grid = vector_noise.sampler_grid(m, sens, d)
    out = vector_noise.gaussian_vector(x, m, sens, max_extra_delta=1e-9)
    steps = out / grid.step
    assert np.all(steps == np.rint(steps))  # every output is a grid point, exactly
    noise = out - np.rint(x / grid.step) * grid.step
    assert stats.kstest(noise / grid.sigma, "norm").pvalue > 1e-6
    assert np.std(noise) == pytest.approx(grid.sigma, rel=0.03)
    # the rounded sensitivity is covered: σ / (Δ + g√d) is the noise multiplier asked for
    assert grid.sigma / (sens + grid.step * math.sqrt(d)) == pytest.approx(m, rel=1e-12)
    assert grid.sigma <= m * sens * (1 + 1 / 64)
    # the discrete noise itself: integer draws with std s
    z = vector_noise.discrete_gaussian_noise(50_000, grid.discrete_std)
    assert z.dtype == np.int64
    assert stats.kstest(z / grid.discrete_std, "norm").pvalue > 1e-6


def test_vector_sampler_refuses_bad_input_and_a_short_delta():
    with pytest.raises(ValueError):
        vector_noise.gaussian_vector(np.array([1.0, np.nan]), 1.0, 1.0, max_extra_delta=1e-9)
    with pytest.raises(InvalidPrivacyParameterError):
        vector_noise.gaussian_vector(np.zeros(3), 0.0, 1.0, max_extra_delta=1e-9)
    with pytest.raises(InvalidPrivacyParameterError, match="max_extra_delta"):
        vector_noise.gaussian_vector(np.zeros(3), 1.0, 1.0, max_extra_delta=-1e-9)
    assert vector_noise.sampler_delta(1.0, 1.0, 3) == 0.0  # exact: no tail is cut
    with pytest.raises(ValueError, match="too large"):
        vector_noise.gaussian_vector(np.array([1e300]), 1.0, 1e-6, max_extra_delta=1e-9)


def test_vector_sampler_costs_sixteen_random_bytes_per_weight(monkeypatch):
    """The benchmark's cost model: one OS-randomness call of 16 bytes per weight (a redraw is
    rarer than 2⁻⁶⁰ per weight) and vectorised table look-ups, no per-weight Python."""
    calls = []
    real = vector_noise._random_words
    monkeypatch.setattr(vector_noise, "_random_words", lambda n: calls.append(n) or real(n))
    vector_noise.gaussian_vector(np.zeros(50_000), 0.65, 0.004, max_extra_delta=1e-9)
    assert calls == [50_000]


@pytest.mark.parametrize("mode", ["basic", "rdp"])
def test_a_run_is_charged_epsilon_and_delta_per_update(sqlite_url, mode):
    """basic: passes × (ε, δ); rdp: the composed GaussianDpEvent. A grant short of it is refused."""
    from dndtest import STREAM, make_ledger
    cfg = _cfg(8.0, delta=1e-7)
    p = make_ledger(sqlite_url, mode=mode)
    with open_ledger(p.url, p.server) as led:
        d = request_run(led, STREAM, run_id="g1", config=cfg, dim=650, passes=3,
                        window=Window(last=4))
        assert d.granted
        RunBudget(d.grant, cfg, 650, passes=3)
        if mode == "basic":
            assert d.grant.epsilon == pytest.approx(24.0) == run_epsilon(cfg, 650, 3)
            assert d.grant.delta == pytest.approx(3e-7) == run_delta(cfg, 650, 3)
            assert all(b.delta_spent == pytest.approx(3e-7) for b in led.blocks(STREAM))
            short = _cfg(8.0, delta=2e-7)  # the run would need 6e-7
        else:
            want = dp_event_lib.SelfComposedDpEvent(
                dp_event_lib.GaussianDpEvent(cfg.noise_multiplier), 3)
            assert accounting.event_to_json(d.grant.event) == accounting.event_to_json(want)
            assert run_event(cfg, 650, 3) == d.grant.event
            short = _cfg(4.0, delta=1e-7)  # another event
        with pytest.raises(MissingGrantError):
            RunBudget(d.grant, short, 650, passes=3)


def test_table_lookup_is_the_exact_128_bit_inverse_cdf(monkeypatch):
    """Draws whose high word ties with table entries (the rare path) and random ones: the index
    is the first whose 128-bit cumulative entry exceeds u wherever u is more than E from it (the
    exact completion, :mod:`test_exact_sampler`, decides the rest)."""
    import bisect
    s = 1500.0
    hi, lo, bound, tau = vector_noise._table(s)
    cum = [(int(h) << 64) | int(l) for h, l in zip(hi, lo)]
    rng = np.random.default_rng(3)
    picks = rng.integers(1, hi.size - 1, size=200)
    rand = rng.integers(0, 2**63, size=200, dtype=np.uint64)
    off = np.uint64(bound + 1)
    u_hi = np.concatenate([hi[picks], hi[picks], rand])
    u_lo = np.concatenate([lo[picks] - off, lo[picks] + off, rand])  # no borrow: checked below
    monkeypatch.setattr(vector_noise, "_random_words", lambda n: (u_hi[:n], u_lo[:n]))
    monkeypatch.setattr(vector_noise, "_invert", lambda *a: pytest.fail("not decided"))
    z = vector_noise.discrete_gaussian_noise(600, s)
    for i in range(600):
        u = (int(u_hi[i]) << 64) | int(u_lo[i])
        assert u >> 64 == int(u_hi[i])
        assert z[i] == bisect.bisect_right(cum, u) - tau - 1


def test_a_served_gaussian_run_states_its_charge_and_passes_honest_updates(sqlite_url):
    """Over HTTP: the spec and the grant state (ε, δ) per update; real client updates (the
    secure sampler) pass the spam check; a doubled model does not (the norm bound refuses it)."""
    import httpx
    from dndtest import STREAM, bearer, make_ledger, serving

    from sage_tfx import services
    from sage_tfx.dnd.server import BINARY, TICKET_HEADER, build_service, create_app, encode
    from sage_tfx.streams import HashBucketScheme

    clients = [f"c{i}" for i in range(24)]
    p = make_ledger(sqlite_url, clients=clients)
    spec = GLMSpec("multinomial", 64, 10)
    cfg = ClientConfig(0.05, epsilon=8.0, unit="gaussian", delta=1e-7, l2_norm_clip=2.0)
    service = build_service(ledger_url=p.url, stream=STREAM, run_id="g1", spec=spec, config=cfg,
                            k=10, passes=1, window_last=4, token=p.server,
                            block_scheme=HashBucketScheme("client_id", 4, "dnd"))
    with open_ledger(p.url, p.server) as led:
        grant = led.grant(service.grant_id)
        assert grant.epsilon == pytest.approx(8.0) and grant.delta == pytest.approx(1e-7)
    app = create_app(service, services.Authenticator(p.url, token=p.server, cache_seconds=0))
    rng = np.random.default_rng(0)
    accepted = []
    with serving(app) as base, httpx.Client(base_url=base, timeout=60) as c:
        doc = c.get("/v1/spec", headers=bearer(p.client("c0"))).json()
        assert doc["update_epsilon"] == 8.0 and doc["update_delta"] == 1e-7
        assert doc["client"]["unit"] == "gaussian"
        # the std the sampler adds, not m·Δ₂ (which is 1-2 % below it here)
        assert doc["noise_scale"] == doc["noise_std"] == cfg.sampler_std(650)
        assert doc["noise_scale"] > 1.005 * cfg.noise_scale
        assert accounting.event_from_dict(doc["update_event"]) == cfg.update_event(650)
        for name in clients:
            who = bearer(p.client(name))
            r = c.post("/v1/draw", headers={"accept": BINARY, **who})
            w = np.frombuffer(r.content, "<f8")
            x, y = rng.uniform(size=(10, 64)), rng.integers(0, 10, size=10)
            u = client_update(spec, w, x, y, cfg) if name != "c23" else 2 * w + 1
            back = c.post(f"/v1/discard/{r.headers[TICKET_HEADER]}", content=encode(u),
                          headers={"content-type": BINARY, **who})
            accepted.append(back.status_code == 200 and back.json()["accepted"])
    # the doubled model is refused by the norm bound before the spam check (422)
    assert sum(accepted[:-1]) >= 22 and not accepted[-1] and back.status_code == 422
