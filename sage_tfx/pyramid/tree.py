"""Tree (binary-interval) aggregation of windows: noise that grows with log W, not W.

Pyramid's flat scheme answers "the last R windows" with the sum of R windows' tables, each with
its own noise: the noise variance grows linearly with R. The paper (§V, Fig. 7) also simulates a
binary-tree scheme (Chan, Shi & Song 2011; Dwork et al. 2010): every window's counts go into
each of the dyadic intervals (nodes) it belongs to, ``[j·2^ℓ, (j+1)·2^ℓ)`` for levels
``ℓ = 0 .. L`` with ``2^L ≥ R``, each node noised once; any range of ≤ R windows is the sum of
at most ``2L`` complete nodes (:func:`dyadic_cover`). An observation is in ``L + 1`` nodes, so
the node noise is that of ``L + 1`` releases which together cost the spec's (ε, δ)
(:func:`~sage_tfx.pyramid.plan.plan_window` with ``repeat = L + 1``): ε / (L + 1) per node with
Laplace (variance × (L+1)²), σ × ~√(L + 1) with Gaussian (variance × ~(L+1)). A window's charge
is the spec's (ε, δ), as in the flat scheme; the range's variance is
``Σ_nodes var(node) ≤ 2L · var(node)`` instead of ``R · var(window)``.

**What is stored.** A node is noised when its *first* window is added (its noise drawn once,
never stored on its own), then each later window's exact counts are added to the noisy state,
which replaces the previous one: at any time a node's stored state is one noisy release of the
windows it holds so far (counted in the ``L + 1`` releases each of them is charged for). Only
*complete* nodes are ever read by :meth:`DyadicTree.range_tables`: a partial node read twice
would reveal the exact counts added between the two reads. Nodes that hold any window before
the retention horizon are deleted (:meth:`DyadicTree.retain`).

This module is the mechanism and its accounting, in memory (benchmarks); a
:class:`~sage_tfx.pyramid.windows.PyramidStore` of a spec with ``aggregation="tree"`` keeps its
nodes on disk and on the ledger (:mod:`sage_tfx.pyramid.treestore`). No TensorFlow.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from sage_tfx.errors import InvalidRequestError
from sage_tfx.pyramid.featurize import CountSpec, Featurization, check_frame, group_keys
from sage_tfx.pyramid.plan import NoisePlan, plan_window

__all__ = ["tree_levels", "dyadic_cover", "exact_tables", "DyadicTree", "PRIOR_TABLE"]

PRIOR_TABLE = "__prior__"


def tree_levels(horizon: int) -> int:
    """``L = ⌈log2 horizon⌉``: levels ``0 .. L``, so a window is in ``L + 1`` nodes."""
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        raise InvalidRequestError(f"horizon must be an int >= 1 window, got {horizon!r}")
    return max(0, math.ceil(math.log2(horizon)))


def dyadic_cover(a: int, b: int, levels: int) -> list[tuple[int, int]]:
    """Nodes ``(ℓ, j)`` (``ℓ ≤ levels``) whose intervals partition windows ``[a, b]``: greedily
    the largest aligned interval starting at ``a``; at most ``2 · levels + 1`` nodes for a range
    of up to ``2^levels`` windows."""
    if not 0 <= a <= b:
        raise InvalidRequestError(f"need 0 <= a <= b, got [{a}, {b}]")
    out, x = [], a
    while x <= b:
        ell = 0
        while ell < levels and x % (2 ** (ell + 1)) == 0 and x + 2 ** (ell + 1) - 1 <= b:
            ell += 1
        out.append((ell, x >> ell))
        x += 2 ** ell
    return out


def exact_tables(frame: pd.DataFrame, spec: CountSpec) -> dict[str, np.ndarray]:
    """The exact (non-DP) integer cells of one window: one sketch per group, and the prior."""
    check_frame(frame, spec.features, spec.label, spec.n_labels)
    labels = frame[spec.label].to_numpy().astype(np.int64)
    out = {}
    for g in spec.groups:
        sk = spec.new_sketch(g)
        sk.add(group_keys(frame, g), labels)
        out[spec.group_name(g)] = sk.cells
    out[PRIOR_TABLE] = np.bincount(labels, minlength=spec.n_labels).astype(np.int64)
    return out


class DyadicTree:
    """Noisy dyadic nodes over windows (see the module docstring); in memory.

    Args:
      spec: the count spec (its (ε, δ) is what one window costs).
      horizon: the largest number of windows a range covers (the retention).
      noise: the noise source (OpenDP's unless an experiment passes seeded noise).
      weights: noise weights per table, as for the flat windows.
      rdp: plan the mechanism of an rdp stream (continuous Laplace) instead of a basic one.
    """

    def __init__(self, spec: CountSpec, horizon: int, noise, *,
                 weights: Optional[Sequence[float]] = None, rdp: bool = False):
        self.spec, self.levels, self.noise = spec, tree_levels(horizon), noise
        self.horizon = horizon
        self.plan: NoisePlan = plan_window(spec, weights, rdp=rdp, repeat=self.levels + 1)
        self._names = [spec.group_name(g) for g in spec.groups] + [PRIOR_TABLE]
        self.nodes: dict[tuple[int, int], dict] = {}
        self.newest: Optional[int] = None

    @property
    def nodes_per_window(self) -> int:
        """Nodes a window's tables are released in (one per level)."""
        return self.levels + 1

    def _noisy(self, tables: dict) -> dict:
        out = {}
        for i, name in enumerate(self._names):
            s = float(self.plan.scales[i])
            v = tables[name]
            if self.plan.mechanism == "discrete_gaussian":
                out[name] = np.asarray(self.noise.discrete_gaussian(v, s), dtype=np.int64)
            elif self.plan.mechanism == "laplace":
                out[name] = np.asarray(self.noise.laplace(v, s), dtype=np.float64)
            else:
                out[name] = np.asarray(self.noise.discrete_laplace(v, s), dtype=np.int64)
        return out

    def add_window(self, window: int, tables: dict) -> None:
        """Adds one window's exact tables to its ``L + 1`` nodes (windows in increasing order)."""
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise InvalidRequestError(f"window must be an int >= 0, got {window!r}")
        if self.newest is not None and window <= self.newest:
            raise InvalidRequestError(f"window {window} is not after the newest {self.newest}")
        if set(tables) != set(self._names):
            raise InvalidRequestError(f"need tables {self._names}, got {sorted(tables)}")
        for ell in range(self.levels + 1):
            key = (ell, window >> ell)
            node = self.nodes.get(key)
            if node is None:
                self.nodes[key] = {"tables": self._noisy(tables), "count": 1}
            else:
                node["tables"] = {n: node["tables"][n] + tables[n] for n in self._names}
                node["count"] += 1
        self.newest = window

    def complete(self, ell: int, j: int) -> bool:
        """True if node (ℓ, j) holds all of its 2^ℓ windows."""
        node = self.nodes.get((ell, j))
        return node is not None and node["count"] == 2 ** ell

    def range_tables(self, a: int, b: int) -> tuple[dict, float, int]:
        """``(tables, noise variance per cell of each table, nodes used)`` of windows
        ``[a, b]``, from complete nodes only. ``variances`` maps table name → summed variance."""
        cover = dyadic_cover(a, b, self.levels)
        missing = [c for c in cover if not self.complete(*c)]
        if missing:
            raise InvalidRequestError(f"windows [{a}, {b}] need nodes {missing} that are not "
                                      "complete (or were dropped)")
        sums = {n: sum(self.nodes[c]["tables"][n] for c in cover) for n in self._names}
        var = {n: len(cover) * self.plan.variance(i) for i, n in enumerate(self._names)}
        return sums, var, len(cover)

    def featurization(self, a: int, b: int, max_variance: float = 0.01) -> Featurization:
        """The count featurization of windows ``[a, b]`` (a :class:`Featurization`)."""
        sums, var, _ = self.range_tables(a, b)
        prior = sums.pop(PRIOR_TABLE)
        return Featurization(self.spec, sums, prior, var, tuple(range(a, b + 1)), max_variance)

    def retain(self, first: int) -> list[tuple[int, int]]:
        """Deletes every node holding a window before ``first``; returns the deleted nodes."""
        gone = [k for k in self.nodes if (k[1] << k[0]) < first]
        for k in gone:
            del self.nodes[k]
        return gone
