"""Sealing on an rdp stream: the charge is the DpEvent of the Laplace mechanism that runs,
checked against dp_accounting and the noise that runs."""
import math

import dp_accounting
import numpy as np
import pandas as pd
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import accounting, open_ledger
from sage_tfx.pyramid import CountSpec, PyramidStore
from sage_tfx.pyramid.featurize import group_keys
from sage_tfx.pyramid.windows import window_event

SPEC = CountSpec(groups=("user", "item"), label="y", width=256, depth=5, epsilon=2.0)
DELTA_G = 1e-5


def frame(n=300, seed=0):
    rng = np.random.default_rng(seed)
    user = rng.integers(0, 15, n)
    return pd.DataFrame({"user": [f"u{u}" for u in user], "item": rng.integers(0, 4, n),
                         "y": (user % 3 == 0).astype(int)})


@pytest.fixture
def ledger(sqlite_url):
    led = open_ledger(sqlite_url)
    led.create_stream("obs", epsilon_g=20.0, delta_g=DELTA_G, mode=accounting.RDP)
    for w in range(3):
        led.add_block("obs", f"b{w}", location=f"/data/b{w}")
    yield led
    led.close()


def expected_accountant(orders):
    """The mechanism, composed by hand: per group table h rows, each a Laplace of L1
    sensitivity 1 and scale h / ε_i; the prior one Laplace of scale 1 / ε_i; ε_i = ε / 3."""
    eps_i = SPEC.epsilon / SPEC.n_tables
    acc = rdp_lib.RdpAccountant(list(orders))
    for _ in SPEC.groups:
        for _ in range(SPEC.depth):
            acc.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=SPEC.depth / eps_i))
    acc.compose(dp_accounting.LaplaceDpEvent(noise_multiplier=1.0 / eps_i))
    return acc


def test_rdp_seal_charges_the_laplace_event_and_runs_that_noise(tmp_path, ledger):
    store = PyramidStore(SPEC, str(tmp_path / "pyr"), retention=2, ledger=ledger, stream="obs")
    df = frame()
    store.open_window(0, ["b0"])
    store.observe(df)
    res = store.seal()
    grant = ledger.grant_for_run("obs", res.run_id)
    assert grant.mode == accounting.RDP and grant.epsilon is None
    assert accounting.event_to_json(grant.event) == accounting.event_to_json(res.event) \
        == accounting.event_to_json(window_event(SPEC))          # what a pipeline's gate charges
    # Against dp_accounting: the ledger's spent ε at δ_g is the composed mechanism's.
    stream = ledger.stream("obs")
    want = expected_accountant(stream.orders).get_epsilon(DELTA_G)
    spent = {b.block_id: b.epsilon_spent for b in ledger.blocks("obs")}
    assert spent["b0"] == pytest.approx(want, rel=1e-9) and spent["b1"] == 0.0
    # Its pure ε (Σ 1 / noise multiplier) is the spec's ε: nothing charged beyond the tables.
    pure = sum(e.event.noise_multiplier ** -1 * e.count for e in res.event.events)
    assert pure == pytest.approx(SPEC.epsilon)
    # The noise that ran: continuous (float cells), Laplace of scale h k / ε_i (OpenDP, secure).
    scale = SPEC.depth / (SPEC.epsilon / SPEC.n_tables)
    assert res.noise_scales[0] == pytest.approx(scale, rel=1e-9) and res.noise_scales[0] >= scale
    feat = store.featurization()
    labels = df["y"].to_numpy()
    noise = []
    for g in SPEC.groups:
        exact = SPEC.new_sketch(g)
        exact.add(group_keys(df, g), labels)
        noisy = feat.cells[SPEC.group_name(g)]
        assert noisy.dtype == np.float64 and not np.all(noisy == np.round(noisy))
        noise.append((noisy - exact.cells).ravel())
    noise = np.concatenate(noise)                      # 2 × 5 × 256 × 2 = 5120 draws
    assert np.mean(np.abs(noise)) == pytest.approx(scale, rel=0.06)      # E|Laplace| = b
    assert np.std(noise) == pytest.approx(math.sqrt(2) * scale, rel=0.08)
    assert abs(np.mean(noise)) < 0.5


def test_rdp_grants_and_refusals(tmp_path, ledger):
    store = PyramidStore(SPEC, str(tmp_path / "pyr"), retention=2, ledger=ledger, stream="obs")
    store.open_window(0, ["b0", "b1"])
    store.observe(frame())
    # Weight selection has no DpEvent: refused on an rdp stream, nothing charged or sealed.
    with pytest.raises(InvalidRequestError, match="rdp"):
        store.seal(weight_epsilon=0.5, max_count=100)
    assert store.hot_window == 0 and not ledger.grants("obs")
    # A gate grant of another event does not pay for the window.
    run_id = store.run_id(0)
    wrong = ledger.request("obs", run_id=run_id, blocks=["b0", "b1"],
                           event=accounting.laplace_event(SPEC.epsilon))
    with pytest.raises(InvalidRequestError, match="does not pay"):
        store.seal(grant=wrong.grant)
    assert store.hot_window == 0
    # The right event, charged by a gate beforehand: sealing charges nothing more.
    event = window_event(SPEC)
    store2 = PyramidStore(SPEC, str(tmp_path / "pyr2"), retention=2, ledger=ledger, stream="obs")
    store2.open_window(1, ["b2"])
    store2.observe(frame(seed=1))
    paid = ledger.request("obs", run_id=store2.run_id(1), blocks=["b2"], event=event)
    before = ledger.block("obs", "b2").epsilon_spent
    res = store2.seal(grant=paid.grant)
    assert res.grant_id == paid.grant.grant_id and store2.live_windows == (1,)
    assert ledger.block("obs", "b2").epsilon_spent == before > 0
