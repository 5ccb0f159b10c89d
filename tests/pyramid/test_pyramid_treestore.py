"""A PyramidStore with tree aggregation: charges, node noise, release once, restart, retention."""
import json
import os

import dp_accounting
import numpy as np
import pandas as pd
import pytest
from dp_accounting.rdp import RdpAccountant

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import accounting, open_ledger
from sage_tfx.pyramid import CountSpec, PyramidStore
from sage_tfx.pyramid.treestore import node_path, node_release_name
from sage_tfx.pyramid.tree import exact_tables

LSPEC = CountSpec(groups=("user",), label="y", width=128, depth=3, epsilon=1.0,
                  aggregation="tree", levels=2)
GSPEC = CountSpec(groups=("user",), label="y", width=128, depth=3, epsilon=1.0,
                  mechanism="gaussian", delta=1e-6, aggregation="tree", levels=2)


class NoNoise:
    """A noise source that must never be asked: a replay draws no noise."""

    def __getattr__(self, name):
        raise AssertionError(f"noise drawn ({name}) for a release already recorded")


def frame(w, n=60):
    rng = np.random.default_rng(w)
    return pd.DataFrame({"user": [f"u{u}" for u in rng.integers(0, 12, n)],
                         "y": (rng.random(n) < 0.4).astype(int)})


def make_ledger(url, n=8, mode=accounting.BASIC, eps=20.0):
    led = open_ledger(url)
    if mode == accounting.BASIC:
        led.create_stream("obs", epsilon_g=eps, delta_g=1e-3)
    else:
        led.create_stream("obs", epsilon_g=eps, delta_g=1e-3, mode=mode)
    for w in range(n):
        led.add_block("obs", f"b{w}", location=f"/d/{w}")
    return led


def seal_all(s, windows):
    out = []
    for w in windows:
        s.open_window(w, [f"b{w}"] if s.ledger is not None else ())
        s.observe(frame(w))
        out.append(s.seal())
    return out


def node_ids(s):
    return sorted(tuple(map(int, k.split("/"))) for k in s._read()["tree"]["nodes"])


@pytest.mark.parametrize("spec", [LSPEC, GSPEC])
def test_charge_per_block_is_the_composed_cost_of_its_nodes(tmp_path, sqlite_url, spec):
    """rdp stream: a block's spent RDP curve is the composition of the L+1 node releases that
    contain it, each rebuilt from the scales recorded in the node files (dp_accounting)."""
    led = make_ledger(sqlite_url, n=4, mode=accounting.RDP)
    s = PyramidStore(spec, str(tmp_path / "t"), retention=4, ledger=led, stream="obs",
                     noise=SeededNoise(1))
    seal_all(s, range(4))
    assert node_ids(s) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (2, 0)]
    orders = led.stream("obs").orders
    for w in range(4):
        events = []
        for ell in range(spec.levels + 1):
            with np.load(node_path(s.state_dir, ell, w >> ell)) as z:
                meta = json.loads(str(z["meta"]))
            assert w in meta["windows"]
            for sc, d in zip(meta["scales"], [spec.depth, 1]):
                ev = (dp_accounting.GaussianDpEvent(sc / spec.k) if spec.mechanism == "gaussian"
                      else dp_accounting.LaplaceDpEvent(sc / spec.k))
                events.append(dp_accounting.SelfComposedDpEvent(ev, d))
        acc = RdpAccountant(orders=list(orders)).compose(dp_accounting.ComposedDpEvent(events))
        spent = [g for g in led.grants("obs") if f"b{w}" in [b.block_id for b in g.blocks]]
        assert len(spent) == 1
        ledger_curve = accounting.rdp_curve(spent[0].event, orders)
        # the ledger charged no less than the nodes that run (OpenDP's ulps make these a hair
        # larger scales than the charged ones: the nodes cost at most the charge)
        assert np.all(np.asarray(acc._rdp) <= np.asarray(ledger_curve) * (1 + 1e-9))
        assert np.allclose(acc._rdp, ledger_curve, rtol=1e-6)
    assert led.check_consistency("obs") == []


def test_basic_stream_charges_the_spec_once_per_window_and_nodes_compose_to_it(tmp_path,
                                                                               sqlite_url):
    led = make_ledger(sqlite_url, n=4)
    s = PyramidStore(LSPEC, str(tmp_path / "t"), retention=4, ledger=led, stream="obs",
                     noise=SeededNoise(2))
    seal_all(s, range(4))
    for w in range(4):
        assert led.remaining("obs", f"b{w}")["epsilon"] == pytest.approx(20.0 - LSPEC.epsilon)
        eps = 0.0
        for ell in range(LSPEC.levels + 1):
            with np.load(node_path(s.state_dir, ell, w >> ell)) as z:
                meta = json.loads(str(z["meta"]))
            # discrete Laplace of scale b on rows of L1 sensitivity k: k/b per row
            eps += sum(d * LSPEC.k / b for b, d in zip(meta["scales"], [LSPEC.depth, 1]))
        assert eps <= LSPEC.epsilon * (1 + 1e-9) and eps == pytest.approx(LSPEC.epsilon, 1e-6)


@pytest.mark.parametrize("spec", [LSPEC, GSPEC])
def test_range_is_the_true_sum_plus_noise_of_the_expected_variance(tmp_path, spec):
    """Offline store, 6 windows, retention 4: the live range [2, 5] is read from nodes
    (1,1) and (1,2) only. Over 15 seeds the cells minus the true counts have the variance of
    two nodes; an audit with half the noise (variance / 4) is caught."""
    ret, errs = 4, []
    truth = None
    for seed in range(15):
        s = PyramidStore(spec, str(tmp_path / f"s{seed}"), retention=ret,
                         noise=SeededNoise(seed))
        seal_all(s, range(6))
        f = s.featurization()
        assert f.windows == (2, 3, 4, 5)
        if truth is None:
            ex = [exact_tables(frame(w), spec) for w in range(2, 6)]
            truth = sum(e["user"] for e in ex)
            var = f.noise_var["user"]
        errs.append((f.cells["user"] - truth).ravel())
    e = np.concatenate(errs).astype(float)
    # the variance of two nodes at the per-node scale (the tree's plan)
    from sage_tfx.pyramid.plan import plan_window
    assert var == pytest.approx(2 * plan_window(spec).variance(0), rel=1e-12)

    def audit(x):                  # mean 0 and the variance the store reports, within 10 %
        return abs(x.mean()) < 5 * np.sqrt(var / x.size) and abs(x.var() / var - 1) < 0.1

    assert audit(e)
    assert not audit(e / 2)        # a store that drew half the noise std is caught


def test_replay_from_a_second_store_returns_the_recorded_nodes(tmp_path, sqlite_url):
    led = make_ledger(sqlite_url, n=4)
    s = PyramidStore(LSPEC, str(tmp_path / "a"), retention=4, ledger=led, stream="obs",
                     noise=SeededNoise(3))
    seal_all(s, range(4))
    before = {n: open(node_path(s.state_dir, *n), "rb").read() for n in node_ids(s)}
    other = PyramidStore(LSPEC, str(tmp_path / "b"), retention=4,
                         ledger=open_ledger(sqlite_url), stream="obs", noise=NoNoise())
    assert all(r.replayed for r in seal_all(other, range(4)))
    for n, data in before.items():
        assert open(node_path(str(tmp_path / "b"), *n), "rb").read() == data
        rels = [r for g in led.grants("obs") for r in led.releases(g.grant_id)
                if r.name == node_release_name(LSPEC, *n)]
        assert len(rels) == 1
    assert led.remaining("obs", "b0")["epsilon"] == pytest.approx(19.0)   # no second charge
    assert led.check_consistency("obs") == []


def test_restart_answers_the_same_range_and_retention_drops_nodes(tmp_path, sqlite_url):
    led = make_ledger(sqlite_url, n=8)
    d = str(tmp_path / "t")
    s = PyramidStore(LSPEC, d, retention=4, ledger=led, stream="obs", noise=SeededNoise(4))
    seal_all(s, range(5))
    f1 = s.featurization()
    s2 = PyramidStore(LSPEC, d, retention=4, ledger=led, stream="obs", noise=NoNoise())
    f2 = s2.featurization()
    assert f2.windows == f1.windows == (1, 2, 3, 4)
    assert all(np.array_equal(f1.cells[k], f2.cells[k]) for k in f1.cells)
    # node (2,0) holds window 0 (dropped): deleted; so are the leaf and (1,0)
    assert node_ids(s2) == [(0, 1), (0, 2), (0, 3), (0, 4), (1, 1)]
    os.remove(node_path(d, 1, 1))             # a lost node file: restored from the ledger
    f3 = s2.featurization(cache=False)
    assert all(np.array_equal(f1.cells[k], f3.cells[k]) for k in f1.cells)
    s3 = PyramidStore(LSPEC, d, retention=4, ledger=led, stream="obs", noise=SeededNoise(5))
    r = seal_all(s3, [5])[0]
    assert r.dropped == (1,) and (1, 2) in node_ids(s2) and (0, 1) not in node_ids(s2)
    acc = os.listdir(os.path.join(d, "tree", "acc"))
    assert len(acc) == 1                        # the partial sum of node (2, 1): windows 4, 5
    assert s2.featurization().windows == (2, 3, 4, 5)


def test_bad_options_are_refused_and_charge_nothing(tmp_path, sqlite_url):
    for bad in [dict(aggregation="dyadic"), dict(aggregation="tree"),
                dict(aggregation="tree", levels=-1), dict(aggregation="tree", levels=1.5),
                dict(levels=3)]:
        with pytest.raises(InvalidRequestError):
            CountSpec(groups=("user",), label="y", **bad)
    led = make_ledger(sqlite_url, n=2)
    for retention in (5, 2, 1):              # levels=2 fits a retention of 3 or 4 only
        with pytest.raises(InvalidRequestError, match="retention"):
            PyramidStore(LSPEC, str(tmp_path / "r"), retention=retention, ledger=led,
                         stream="obs")
    s = PyramidStore(LSPEC, str(tmp_path / "t"), retention=4, ledger=led, stream="obs")
    s.open_window(0, ["b0"])
    s.observe(frame(0))
    with pytest.raises(InvalidRequestError, match="weights"):
        s.seal(weights=[1.0, 2.0])
    assert led.grants("obs") == [] and s.hot_window == 0
    assert led.remaining("obs", "b0")["epsilon"] == pytest.approx(20.0)


def test_skipped_windows_are_empty_and_a_denied_seal_releases_nothing(tmp_path, sqlite_url):
    s = PyramidStore(LSPEC, str(tmp_path / "o"), retention=4, noise=SeededNoise(6))
    seal_all(s, [0, 1, 3])                          # window 2 skipped
    assert node_ids(s) == [(0, 0), (0, 1), (0, 3), (1, 0), (1, 1), (2, 0)]
    with np.load(node_path(s.state_dir, 2, 0)) as z:
        assert json.loads(str(z["meta"]))["windows"] == [0, 1, 3]
        f = s.featurization()
        assert f.windows == (0, 1, 3) and np.array_equal(f.cells["user"], z["cells__user"])
    from sage_tfx.pyramid import BudgetDeniedError
    led = make_ledger(sqlite_url, n=1, eps=0.5)
    d = PyramidStore(LSPEC, str(tmp_path / "d"), retention=4, ledger=led, stream="obs")
    d.open_window(0, ["b0"])
    d.observe(frame(0))
    with pytest.raises(BudgetDeniedError):
        d.seal()
    assert d.hot_window == 0 and not os.path.exists(os.path.join(d.state_dir, "tree"))


def test_a_gate_grant_of_window_event_pays_for_a_tree_window(tmp_path, sqlite_url):
    """rdp stream: the gate charges window_event(spec) (the L+1 node releases composed); the
    store takes that grant and charges nothing more; a grant of the flat event is refused."""
    from sage_tfx.pyramid import pyramid_run_id, window_event
    from sage_tfx.pyramid.plan import plan_window
    led = make_ledger(sqlite_url, n=2, mode=accounting.RDP)
    flat = CountSpec(**{**GSPEC.to_json(), "groups": GSPEC.groups, "aggregation": "flat",
                        "levels": None})
    ev = window_event(GSPEC)              # one node's Gaussian tables, released L+1 = 3 times
    assert isinstance(ev, dp_accounting.SelfComposedDpEvent) and ev.count == 3
    assert accounting.event_to_json(ev.event) == accounting.event_to_json(
        plan_window(flat, repeat=3).event.event)
    s = PyramidStore(GSPEC, str(tmp_path / "t"), retention=4, ledger=led, stream="obs",
                     noise=SeededNoise(7))
    bad = led.request("obs", run_id=pyramid_run_id("obs", GSPEC, 1), blocks=["b1"],
                      event=window_event(flat)).grant
    s.open_window(1, ["b1"])
    s.observe(frame(1))
    with pytest.raises(InvalidRequestError, match="does not pay"):
        s.seal(grant=bad)
    good = led.request("obs", run_id=pyramid_run_id("obs", GSPEC, 0), blocks=["b0"],
                       event=window_event(GSPEC)).grant
    s.discard_window()
    s.open_window(0, ["b0"])
    s.observe(frame(0))
    spent = led.block("obs", "b0").epsilon_spent
    r = s.seal(grant=good)
    assert r.grant_id == good.grant_id and led.block("obs", "b0").epsilon_spent == spent
    assert [x.name for x in led.releases(good.grant_id)] == [node_release_name(GSPEC, 0, 0)]
