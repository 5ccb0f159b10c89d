"""Two tree stores (two directories) over one ledger: every node released once, under any
interleaving of their seals, and every block spends exactly what the ledger charged it."""
import io
import json

import numpy as np
import pandas as pd
import pytest

from sage_tfx.errors import InvalidRequestError, LeaseTimeoutError
from sage_tfx.ledger import open_ledger
from sage_tfx.pyramid import CountSpec, PyramidStore, TreeWindowError, pyramid_run_id
from sage_tfx.pyramid import treestore
from sage_tfx.pyramid.tree import exact_tables

SPEC = CountSpec(groups=("user",), label="y", width=64, depth=3, epsilon=1.0,
                 aggregation="tree", levels=2)
EPS_G = 20.0
N_WINDOWS = 4


class ZeroNoise:
    """Adds nothing, so a store's featurization must equal the exact sum of its live windows:
    a window read twice or missed shows. (Spend is computed from the recorded scales.)"""

    def discrete_laplace(self, values, scale):
        return np.asarray(values)

    laplace = discrete_gaussian = discrete_laplace


def frame(w, n=50):
    rng = np.random.default_rng(100 + w)
    return pd.DataFrame({"user": [f"u{u}" for u in rng.integers(0, 10, n)],
                         "y": (rng.random(n) < 0.4).astype(int)})


# (store, window) in the order they are sealed. "review" is issue 36's: store A seals 0, 2, 3,
# then store B seals 0 and 1.
INTERLEAVINGS = {
    "review": [("A", 0), ("A", 2), ("A", 3), ("B", 0), ("B", 1)],
    "b_takes_over": [("A", 0), ("B", 0), ("B", 1), ("A", 2), ("B", 2), ("B", 3)],
    "b_starts_mid_node": [("A", 0), ("B", 1), ("A", 1), ("A", 2), ("A", 3)],
    "replays_then_new": [("A", 0), ("A", 1), ("B", 0), ("B", 1), ("B", 2), ("A", 3), ("B", 3)],
    "alternate": [("A", 0), ("B", 0), ("A", 1), ("B", 1), ("B", 2), ("A", 2), ("A", 3),
                  ("B", 3)],
    "skips": [("A", 0), ("A", 3), ("B", 0), ("B", 1), ("B", 3)],
    "b_alone_from_1": [("B", 1), ("B", 2), ("B", 3)],   # nodes (1, 0), (2, 0) without window 0
}
# The seals refused before their charge: late windows (a node holding them was released
# without them) and windows of nodes another store holds part of.
REFUSED = {"review": [("B", 1)], "b_takes_over": [("A", 2)], "b_starts_mid_node": [("B", 1)],
           "replays_then_new": [("A", 3)], "alternate": [], "skips": [("B", 1)],
           "b_alone_from_1": []}


def node_epsilon(meta):
    """ε one node release spends per observation: discrete Laplace of scale b on a row of L1
    sensitivity k is k/b-DP; the depth rows of the sketch and the prior compose."""
    return sum(d * SPEC.k / b for b, d in zip(meta["scales"], [SPEC.depth, 1]))


def make_ledger(url, n=N_WINDOWS):
    led = open_ledger(url)
    led.create_stream("obs", epsilon_g=EPS_G, delta_g=1e-3)
    for w in range(n):
        led.add_block("obs", f"b{w}", location=f"/d/{w}")
    return led


def check_spend(led, exact=True):
    """Asserts every node has one release on the whole ledger, whichever store made it, and
    that per block the releases holding its window spend at most (``exact``: exactly) what
    the ledger charged the block. Returns {window: charged ε}."""
    releases = tree_releases(led)
    assert {n: len(r) for n, r in releases.items() if len(r) != 1} == {}
    spent = {w: 0.0 for w in range(N_WINDOWS)}
    for [(_, meta)] in releases.values():
        for w in meta["windows"]:
            spent[w] += node_epsilon(meta)
    charged = {w: EPS_G - led.remaining("obs", f"b{w}")["epsilon"] for w in range(N_WINDOWS)}
    for w in range(N_WINDOWS):
        assert spent[w] <= charged[w] * (1 + 1e-9) + 1e-12, (w, spent[w], charged[w])
        if exact:
            assert spent[w] == pytest.approx(charged[w], rel=1e-6, abs=1e-12), (w, spent, charged)
    return charged


def tree_releases(led):
    """name -> [(grant, meta)] of every tree node recorded on the ledger."""
    out = {}
    prefix = f"pyramid/tree/{SPEC.digest()}/"
    for g in led.grants("obs"):
        for r in led.releases(g.grant_id):
            if r.name.startswith(prefix):
                with np.load(io.BytesIO(r.value), allow_pickle=False) as z:
                    out.setdefault(r.name, []).append((g.grant_id, json.loads(str(z["meta"]))))
    return out


@pytest.mark.parametrize("name", sorted(INTERLEAVINGS))
def test_two_stores_release_each_node_once_and_spend_what_was_charged(tmp_path, sqlite_url,
                                                                      name):
    led = make_ledger(sqlite_url)
    stores = {s: PyramidStore(SPEC, str(tmp_path / s), retention=4,
                              ledger=open_ledger(sqlite_url), stream="obs", noise=ZeroNoise())
              for s in "AB"}
    refused = []
    for s, w in INTERLEAVINGS[name]:
        store = stores[s]
        store.open_window(w, [f"b{w}"])
        store.observe(frame(w))
        spent_before = led.remaining("obs", f"b{w}")["epsilon"]
        try:
            store.seal()
        except InvalidRequestError as e:
            # a refused seal changes nothing: no charge, the hot window stays open
            assert led.remaining("obs", f"b{w}")["epsilon"] == spent_before
            assert store.hot_window == w
            store.discard_window()
            refused.append((s, w, type(e).__name__))

    charged = check_spend(led)
    # each store reads its live windows exactly once (zero noise: the exact sums)
    for store in stores.values():
        f = store.featurization(cache=False)
        assert f.windows == store.live_windows
        exact = [exact_tables(frame(w), SPEC) for w in f.windows]
        assert np.array_equal(f.cells["user"], sum((e["user"] for e in exact),
                                                   np.zeros_like(f.cells["user"])))
        assert np.array_equal(f.prior_counts, sum((e["__prior__"] for e in exact),
                                                  np.zeros(SPEC.n_labels)))
    assert led.check_consistency("obs") == []
    assert refused == [(s, w, "TreeWindowError") for s, w in REFUSED[name]]
    if name == "review":
        # window 1 comes after node (1, 0) was released without it: refused before any charge
        assert charged[1] == 0.0 and led.grant_for_run("obs", pyramid_run_id("obs", SPEC, 1)) \
            is None


def test_a_seal_waits_for_the_trees_ledger_lease_and_charges_nothing_without_it(tmp_path,
                                                                               sqlite_url):
    """The check, the charge and the node claims of one seal run under the tree's lease in the
    ledger's database: while another holder keeps it, a seal of any store directory times out
    before charging."""
    led = make_ledger(sqlite_url, n=1)
    store = PyramidStore(SPEC, str(tmp_path / "a"), retention=4, ledger=led, stream="obs",
                         noise=ZeroNoise(), lock_wait=0.3)
    store.open_window(0, ["b0"])
    store.observe(frame(0))
    with led.lease(treestore._lease_name(store), ttl=60):
        with pytest.raises(LeaseTimeoutError):
            store.seal()
    assert led.grants("obs") == [] and store.hot_window == 0
    store.seal()                                      # the lease is free again
    assert led.remaining("obs", "b0")["epsilon"] == pytest.approx(EPS_G - SPEC.epsilon)


def test_a_refused_window_names_the_node_and_the_windows_in_the_way(tmp_path, sqlite_url):
    led = make_ledger(sqlite_url, n=3)
    a, b = (PyramidStore(SPEC, str(tmp_path / d), retention=4, ledger=open_ledger(sqlite_url),
                         stream="obs", noise=ZeroNoise()) for d in "ab")
    for w in (0, 2):
        a.open_window(w, [f"b{w}"])
        a.observe(frame(w))
        a.seal()
    b.open_window(1, ["b1"])
    b.observe(frame(1))
    with pytest.raises(TreeWindowError, match=r"too late.*node 1/0.*\[0\]"):
        b.seal()                                      # (1, 0) was released with window 0 only
    b.discard_window()
    c = PyramidStore(SPEC, str(tmp_path / "c"), retention=4, ledger=open_ledger(sqlite_url),
                     stream="obs", noise=ZeroNoise())
    c.open_window(3, ["b0"])
    c.observe(frame(3))
    with pytest.raises(TreeWindowError, match=r"node 1/1.*windows \[2\]"):
        c.seal()                                      # window 2 of (1, 1) is store a's
    assert led.grant_for_run("obs", pyramid_run_id("obs", SPEC, 3)) is None


def _seal_in_child(url, state_dir, windows, barrier, out):
    """One store process: seals ``windows`` in order (a refused seal is discarded)."""
    try:
        store = PyramidStore(SPEC, state_dir, retention=4, ledger=open_ledger(url),
                             stream="obs", noise=ZeroNoise())
        barrier.wait(timeout=120)
        refused = []
        for w in windows:
            store.open_window(w, [f"b{w}"])
            store.observe(frame(w))
            try:
                store.seal()
            except TreeWindowError:
                store.discard_window()
                refused.append(w)
        out.put({"refused": refused, "live": list(store.live_windows)})
    except Exception as e:                           # surfaces in the parent's assertion
        out.put({"error": repr(e)})


@pytest.mark.parametrize("plan", [{"A": [0, 1, 2, 3], "B": [0, 1, 2, 3]},
                                  {"A": [0, 2, 3], "B": [0, 1]}])
def test_two_store_processes_sealing_at_once_release_each_node_once(tmp_path, sqlite_url, plan):
    """Two processes, two directories, one ledger, started at one instant. Replicas that seal
    the same windows spend exactly the charge; any mix releases every node once and never
    spends more than a block's charge."""
    from racing import race
    led = make_ledger(sqlite_url)
    results = race(_seal_in_child, [(sqlite_url, str(tmp_path / s), ws)
                                    for s, ws in plan.items()])
    check_spend(led, exact=plan["A"] == plan["B"])
    if plan["A"] == plan["B"]:
        assert all(r["refused"] == [] and r["live"] == [0, 1, 2, 3] for r in results)
    assert led.check_consistency("obs") == []
