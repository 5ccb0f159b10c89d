"""Gaussian (zCDP) count tables: σ against the formula, ε against an independent dp_accounting
computation and OpenDP's map, the ledger charge (δ > 0 grant, rdp event), release once, and an
empirical audit that catches half the noise."""
import io
import math

import dp_accounting
import numpy as np
import pandas as pd
import pytest
from dp_accounting.rdp import RdpAccountant

from sage_tfx.dp import audit
from sage_tfx.dp import noise as dp_noise
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.ledger import open_ledger
from sage_tfx.pyramid import CountSpec, PyramidStore
from sage_tfx.pyramid.plan import plan_window, window_event
from sage_tfx.pyramid.sealing import draw_tables


def gspec(**kw):
    base = dict(groups=("user", "item"), label="y", width=256, epsilon=1.0,
                mechanism="gaussian", delta=1e-6)
    return CountSpec(**{**base, **kw})


def frame(n=300, seed=0):
    rng = np.random.default_rng(seed)
    user = rng.integers(0, 20, n)
    return pd.DataFrame({"user": [f"u{u}" for u in user], "item": rng.integers(0, 5, n),
                         "y": (rng.random(n) < 0.1 + 0.04 * (user % 10)).astype(int)})


def unit_multiplier(eps, delta):
    """Noise multiplier of ONE Gaussian mechanism at (ε, δ), by dp_accounting's RDP accountant."""
    return dp_accounting.calibrate_dp_mechanism(
        RdpAccountant, dp_accounting.GaussianDpEvent, eps, delta,
        dp_accounting.LowerEndpointAndGuess(1e-6, 1.0), tol=1e-10)


@pytest.mark.parametrize("n_groups,depth,k,eps,delta", [
    (10, 5, 1, 1.0, 1e-6), (2, 5, 3, 0.5, 1e-5), (4, 3, 2, 2.0, 1e-7)])
def test_sigma_is_the_formula_and_epsilon_is_dp_accountings(n_groups, depth, k, eps, delta):
    spec = CountSpec(groups=tuple(f"f{i}" for i in range(n_groups)), label="y", depth=depth,
                     k=k, epsilon=eps, delta=delta, mechanism="gaussian")
    plan = plan_window(spec)
    H = n_groups * depth + 1                       # rows: depth per group, 1 for the prior
    # Even weights: all tables one Gaussian of L2 sensitivity k·√H, σ = k √H z*(ε, δ).
    sigma = k * math.sqrt(H) * unit_multiplier(eps, delta)
    assert plan.scales == pytest.approx(np.full(n_groups + 1, sigma), rel=1e-6)
    # ε of the tables, recomputed independently from the σ that runs.
    z = plan.scales[0] / (k * math.sqrt(H))
    got = RdpAccountant().compose(dp_accounting.GaussianDpEvent(z)).get_epsilon(delta)
    assert got <= eps * (1 + 1e-9) and got >= eps * 0.999
    # The charged event gives the same ε, and OpenDP's own map (discrete Gaussian, integer L2
    # distance k per row) gives a total ρ no larger than the event's.
    assert RdpAccountant().compose(plan.event).get_epsilon(delta) == pytest.approx(got, rel=1e-6)
    rho_opendp = sum(d * dp_noise.gaussian_rho(s, k, integer=True)
                     for s, d in zip(plan.scales, [depth] * n_groups + [1]))
    assert rho_opendp <= plan.rhos.sum() * (1 + 1e-12)
    assert plan.rhos.sum() == pytest.approx(k * k * H / (2 * sigma ** 2), rel=1e-6)


def test_gaussian_beats_laplace_for_eleven_tables_of_five_rows():
    # The numbers: 11 tables × 5 rows at (ε = 1, δ = 1e-6), k = 1.
    H = 55
    sigma = math.sqrt(H) * unit_multiplier(1.0, 1e-6)
    assert sigma == pytest.approx(33.6, abs=0.05)
    assert math.sqrt(2) * H == pytest.approx(77.8, abs=0.05)   # the Laplace std per cell
    spec = gspec(groups=tuple(f"f{i}" for i in range(10)))    # 10 groups + 1-row prior: H = 51
    assert plan_window(spec).scales[0] < 33.6 < math.sqrt(2) * 51


def test_weights_scale_sigma_and_keep_epsilon():
    spec = gspec()
    w = [1.0, 4.0, 2.0]
    plan = plan_window(spec, w)
    assert plan.scales / plan.scales[0] == pytest.approx(np.array(w), rel=1e-9)
    got = RdpAccountant().compose(plan.event).get_epsilon(1e-6)
    assert 0.999 <= got <= 1.0 + 1e-9


@pytest.mark.parametrize("kw", [dict(delta=0.0), dict(delta=1.0), dict(delta=float("nan")),
                                dict(delta=-1e-6), dict(mechanism="laplace", delta=1e-6),
                                dict(mechanism="gauss")])
def test_bad_mechanism_or_delta_refused(kw):
    with pytest.raises((InvalidPrivacyParameterError, ValueError)):
        gspec(**kw)


def test_laplace_spec_digest_is_unchanged():
    spec = CountSpec(groups=("user",), label="y")
    assert "mechanism" not in spec.to_json() and "delta" not in spec.to_json()
    assert CountSpec.from_json(gspec().to_json()) == gspec()
    assert gspec().digest() != CountSpec(groups=("user", "item"), label="y", width=256).digest()


def test_cell_noise_std_matches_sigma():
    spec = gspec(groups=("user",), width=2 ** 12, depth=5)
    plan = plan_window(spec)
    empty = pd.DataFrame({"user": pd.Series([], dtype=object), "item": pd.Series([], dtype=int),
                          "y": pd.Series([], dtype=int)})
    data = draw_tables(empty, spec, plan, noise=dp_noise.SECURE, meta={})
    with np.load(io.BytesIO(data)) as z:
        cells = z["cells__user"].astype(np.float64).ravel()
    n = cells.size                                  # 40,960 cells
    assert abs(cells.mean()) < 4 * plan.scales[0] / math.sqrt(n)
    assert cells.std() == pytest.approx(plan.scales[0], rel=0.03)


def _statistic_release(spec, scale_factor):
    """Scalar statistic of the real sealed tables: the sum of the cells the extra observations
    hit, signed and weighted by 1/σ² (sufficient for the shift between the neighbours)."""
    plan = plan_window(spec)
    if scale_factor != 1.0:
        plan = plan.__class__(plan.mechanism, plan.scales * scale_factor, plan.shares,
                              plan.epsilon, plan.delta, plan.event, plan.rhos)
    rows = spec.k
    extra = pd.DataFrame({"user": ["target"] * rows, "item": [7] * rows, "y": [1] * rows})
    s_user, s_item = spec.new_sketch(("user",)), spec.new_sketch(("item",))
    hit = {}
    for name, sk, key in (("user", s_user, "target"), ("item", s_item, 7)):
        b, s = sk._hash([key])
        hit[name] = (b[0], s[0])
    sig = plan_window(spec).scales

    def release(x, n):
        fr = extra if x == "b" else extra.iloc[:0]
        out = []
        for _ in range(n):
            with np.load(io.BytesIO(draw_tables(fr, spec, plan, noise=dp_noise.SECURE,
                                                meta={}))) as z:
                t = 0.0
                for i, name in enumerate(("user", "item")):
                    b, s = hit[name]
                    cells = z[f"cells__{name}"]
                    t += float(np.sum(cells[np.arange(spec.depth), b, 1] * s)) / sig[i] ** 2
                t += float(z["prior"][1]) / sig[2] ** 2
                out.append(t)
        return np.array(out)
    return release


def test_audit_passes_the_real_noise_and_catches_half_of_it():
    spec = gspec(groups=("user", "item"), width=8, depth=3, epsilon=2.0, delta=1e-5)
    kw = dict(claimed_epsilon=2.0, delta=1e-5, runs=700)
    good = audit.gaussian_shift_audit(_statistic_release(spec, 1.0), "a", "b", **kw)
    assert good.epsilon_lower_bound <= 2.0, good
    broken = audit.gaussian_shift_audit(_statistic_release(spec, 0.5), "a", "b", **kw)
    assert broken.epsilon_lower_bound > 2.0, broken


@pytest.fixture
def ledger(sqlite_url):
    led = open_ledger(sqlite_url)
    led.create_stream("obs", epsilon_g=5.0, delta_g=1e-4)
    led.create_stream("rdp", epsilon_g=5.0, delta_g=1e-5, mode="rdp")
    for st in ("obs", "rdp"):
        for w in range(3):
            led.add_block(st, f"w{w}", location=f"/data/{st}/w{w}")
    yield led
    led.close()


def seal_one(path, ledger, spec, stream):
    s = PyramidStore(spec, str(path), retention=2, ledger=ledger, stream=stream,
                     noise=SeededNoise(0))
    s.open_window(0, ["w0"])
    s.observe(frame())
    return s, s.seal()


def test_seal_charges_epsilon_delta_and_replays(tmp_path, ledger):
    spec = gspec()
    s, r = seal_one(tmp_path / "a", ledger, spec, "obs")
    g = ledger.grant_for_run("obs", r.run_id)
    assert (g.epsilon, g.delta) == (1.0, 1e-6)
    assert ledger.remaining("obs", "w0")["epsilon"] == pytest.approx(4.0)
    assert r.noise_scales == pytest.approx(tuple(plan_window(spec).scales))
    assert np.isfinite(s.featurization().featurize(frame(20, 1))).all()
    # Another store directory replays the recorded tables: same bytes, no new charge.
    s2 = PyramidStore(spec, str(tmp_path / "b"), retention=2, ledger=ledger, stream="obs")
    r2 = s2.restore(0)
    assert r2.replayed and open(s.sealed_path(0), "rb").read() == \
        open(s2.sealed_path(0), "rb").read()
    assert ledger.remaining("obs", "w0")["epsilon"] == pytest.approx(4.0)


def test_seal_on_rdp_stream_charges_the_gaussian_event(tmp_path, ledger):
    from sage_tfx.ledger import accounting
    spec = gspec(delta=1e-5)
    _, r = seal_one(tmp_path / "r", ledger, spec, "rdp")
    g = ledger.grant_for_run("rdp", r.run_id)
    assert accounting.event_to_json(g.event) == accounting.event_to_json(window_event(spec))
    assert RdpAccountant().compose(g.event).get_epsilon(1e-5) <= 1.0 + 1e-9
