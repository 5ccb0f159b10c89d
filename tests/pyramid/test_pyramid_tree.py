"""Tree (dyadic) aggregation of windows: cover, accounting, noise, variance log vs linear."""
import math

import dp_accounting
import numpy as np
import pandas as pd
import pytest
from dp_accounting.rdp import RdpAccountant

from sage_tfx.dp import noise as dp_noise
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidRequestError
from sage_tfx.pyramid import CountSpec
from sage_tfx.pyramid.plan import plan_window
from sage_tfx.pyramid.tree import DyadicTree, dyadic_cover, exact_tables, tree_levels


def frame(n=200, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"user": [f"u{u}" for u in rng.integers(0, 30, n)],
                         "y": (rng.random(n) < 0.3).astype(int)})


SPEC = CountSpec(groups=("user",), label="y", width=64, depth=3, epsilon=1.0)
GSPEC = CountSpec(groups=("user",), label="y", width=64, depth=3, epsilon=1.0,
                  mechanism="gaussian", delta=1e-6)


@pytest.mark.parametrize("levels", [0, 1, 3, 6])
def test_cover_partitions_every_range_with_few_nodes(levels):
    W = 2 ** levels
    for a in range(0, 3 * W):
        for b in range(a, a + W):
            cover = dyadic_cover(a, b, levels)
            covered = sorted(w for ell, j in cover for w in range(j << ell, (j + 1) << ell))
            assert covered == list(range(a, b + 1))
            assert len(cover) <= 2 * levels + 1


def test_levels():
    assert [tree_levels(h) for h in (1, 2, 3, 4, 5, 1024, 1025)] == [0, 1, 2, 2, 3, 10, 11]
    with pytest.raises(InvalidRequestError):
        tree_levels(0)


@pytest.mark.parametrize("spec", [SPEC, GSPEC])
@pytest.mark.parametrize("horizon", [1, 8, 1000])
def test_node_noise_makes_all_nodes_of_a_window_cost_the_spec(spec, horizon):
    L1 = tree_levels(horizon) + 1
    p = plan_window(spec, repeat=L1)
    flat = plan_window(spec)
    H = spec.depth * len(spec.groups) + 1
    if spec.mechanism == "laplace":
        # ε / (L+1) per node: each table's scale is (L+1) × the flat one; the L+1 nodes of a
        # window compose to ε exactly.
        assert p.scales == pytest.approx(flat.scales * L1, rel=1e-12)
        assert L1 * sum(H_i * spec.k / s for H_i, s in zip([spec.depth, 1], p.scales)) \
            == pytest.approx(spec.epsilon, rel=1e-9)
    else:
        # Independent check: L+1 releases of H rows at σ is one Gaussian of multiplier
        # σ / √(H (L+1)); dp_accounting's RDP ε at δ is the spec's.
        z = p.scales[0] / math.sqrt(H * L1)
        eps = RdpAccountant().compose(dp_accounting.GaussianDpEvent(z)).get_epsilon(spec.delta)
        assert 0.999 * spec.epsilon <= eps <= spec.epsilon * (1 + 1e-9)
        assert RdpAccountant().compose(p.event).get_epsilon(spec.delta) == pytest.approx(eps,
                                                                                      rel=1e-6)
        assert p.scales[0] < flat.scales[0] * math.sqrt(L1) * 1.01


def test_complete_nodes_sum_the_windows_and_partial_ones_are_never_read():
    tree = DyadicTree(SPEC, 8, SeededNoise(0))
    exact = [exact_tables(frame(seed=w), SPEC) for w in range(6)]
    for w, t in enumerate(exact):
        tree.add_window(w, t)
    tabs, var, n = tree.range_tables(0, 5)          # [0,4) + [4,6)
    assert n == 2
    truth = sum(t["user"] for t in exact)
    # Noise only: mean zero, variance 2 nodes × node variance.
    assert var["user"] == pytest.approx(2 * tree.plan.variance(0))
    resid = (tabs["user"] - truth).ravel()
    assert abs(resid.mean()) < 5 * math.sqrt(var["user"] / resid.size)
    assert resid.var() == pytest.approx(var["user"], rel=0.35)
    # [0, 7] needs node (3, 0), which holds 6 of its 8 windows: refused, not read.
    with pytest.raises(InvalidRequestError, match="not complete"):
        tree.range_tables(0, 7)
    with pytest.raises(InvalidRequestError):
        tree.add_window(5, exact[0])
    # Retention drops every node holding a window before 2.
    gone = tree.retain(2)
    assert (3, 0) in gone and (2, 0) in gone and (1, 0) in gone and (0, 1) in gone
    assert tree.range_tables(2, 5)[2] == 2           # [2,4) + [4,6)
    assert np.isfinite(tree.featurization(2, 5).featurize(frame(20, 9))).all()


@pytest.mark.parametrize("spec", [SPEC, GSPEC])
def test_range_variance_grows_log_not_linear(spec):
    """Empirical variance of a cell over ranges of R windows: flat grows ∝ R, the tree ∝ log R."""
    R_max, runs = 64, 12
    L = tree_levels(R_max)
    flat_plan = plan_window(spec)
    zeros = {k: np.zeros_like(v) for k, v in exact_tables(frame(5), spec).items()}
    flat_var, tree_var = {}, {}
    for R in (4, 16, 64):
        flat, tree = [], []
        for r in range(runs):
            t = DyadicTree(spec, R_max, SeededNoise(r))
            for w in range(R):
                t.add_window(w, zeros)
            tabs, var, n = t.range_tables(0, R - 1)
            tree.append(tabs["user"].ravel())
            rng = SeededNoise(1000 + r)
            f = sum(np.asarray(rng.discrete_gaussian(zeros["user"], flat_plan.scales[0])
                               if spec.mechanism == "gaussian" else
                               rng.discrete_laplace(zeros["user"], flat_plan.scales[0]))
                    for _ in range(R))
            flat.append(np.ravel(f))
        flat_var[R], tree_var[R] = np.var(np.concatenate(flat)), np.var(np.concatenate(tree))
        assert flat_var[R] == pytest.approx(R * flat_plan.variance(0), rel=0.1)
        assert tree_var[R] == pytest.approx(var["user"], rel=0.1)
        assert n <= 2 * L + 1
    # flat: ×16 from R = 4 to 64; tree: at most × (nodes ratio), here a power-of-two range is 1
    # node at every R, so constant.
    assert flat_var[64] / flat_var[4] == pytest.approx(16, rel=0.15)
    assert tree_var[64] / tree_var[4] == pytest.approx(1, rel=0.15)


def test_opendp_noise_path_runs():
    tree = DyadicTree(GSPEC, 4, dp_noise.SECURE)
    for w in range(4):
        tree.add_window(w, exact_tables(frame(seed=w), GSPEC))
    assert tree.range_tables(1, 3)[2] == 2


def test_audit_of_a_windows_nodes_passes_and_catches_half_the_noise():
    """All L+1 nodes one window enters, as stored, audited against the spec's (ε, δ)."""
    from sage_tfx.dp import audit
    spec = CountSpec(groups=("user",), label="y", width=8, depth=3, epsilon=2.0,
                     mechanism="gaussian", delta=1e-5)
    tabs_b = exact_tables(pd.DataFrame({"user": ["t"], "y": [1]}), spec)
    tabs_a = {k: np.zeros_like(v) for k, v in tabs_b.items()}
    b, s = spec.new_sketch(("user",))._hash(["t"])

    # Seeded sampler (the same distribution; OpenDP's path runs in test_opendp_noise_path_runs
    # and the Gaussian tables' own audit): deterministic and fast enough at load.
    tree = DyadicTree(spec, 8, SeededNoise(7))
    plan = tree.plan

    def release_with(factor):
        def release(x, n):
            tree.plan = plan.__class__(plan.mechanism, plan.scales * factor, plan.shares,
                                       plan.epsilon, plan.delta, plan.event, plan.rhos)
            out = []
            for _ in range(n):
                tree.nodes, tree.newest = {}, None
                tree.add_window(0, tabs_b if x == "b" else tabs_a)
                sig = tree.plan.scales / factor
                t = 0.0
                for node in tree.nodes.values():           # the 4 nodes window 0 is in
                    cells = node["tables"]["user"]
                    t += float(np.sum(cells[np.arange(3), b[0], 1] * s[0])) / sig[0] ** 2
                    t += float(node["tables"]["__prior__"][1]) / sig[1] ** 2
                out.append(t)
            return np.array(out)
        return release

    kw = dict(claimed_epsilon=2.0, delta=1e-5, runs=1000)
    good = audit.gaussian_shift_audit(release_with(1.0), "a", "b", **kw)
    assert good.epsilon_lower_bound <= 2.0, good
    broken = audit.gaussian_shift_audit(release_with(0.5), "a", "b", **kw)
    assert broken.epsilon_lower_bound > 2.0, broken
