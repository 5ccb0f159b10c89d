"""Weighted noise infusion (Pyramid §III.B.2, App. A.2): noise weights chosen under DP.

The paper gives two descriptions that disagree. §III.B.2 says the budget is "shared between each
feature proportionally to this quantile of its counts", i.e. ``ε_i ∝ q_i``, which puts *more*
noise (``b_i = h k / ε_i ∝ 1/q_i``) on low-count features — yet the same paragraph says the goal
is "adding less noise to low-count features" and that the heuristic "makes the noise's
standard-deviation proportional to the typical counts of each feature", i.e. ``b_i ∝ q_i``.
We implement the stated goal: the noise *scale* of table ``i`` is proportional to its weight
``w_i = q_i``, so ``ε_i = ε · (1/w_i) / Σ_j (1/w_j)`` and ``Σ ε_i = ε`` exactly
(:func:`sage_tfx.dp.counts.table_epsilons`): any positive weights give a valid sequential
composition, so clipping the weights (the paper rescales them to [1, 10k]) is post-processing.

The weights themselves read the data, so they are released under DP too. The paper uses smooth
sensitivity with Cauchy noise (J-List); we use OpenDP's exponential-mechanism quantile instead
(:func:`sage_tfx.dp.count_selection.private_count_quantile`: a maintained, pure ε-DP
implementation). One observation changes every group's key totals, so the ``n`` quantiles are
composed sequentially: each gets ``ε_w / n``, calibrated by OpenDP's map at the spec's
neighbour distance (``2k`` key totals for groups of ``k`` observations); the whole weight
release is ``ε_w``-DP for such groups and is charged to the window it reads
(:meth:`sage_tfx.pyramid.windows.PyramidStore.seal`).
The label prior (one key, counted by every observation) keeps the even share ``ε / n_tables``:
weighting it by its single huge count would drown the back-off rates in noise.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from sage_tfx.dp.count_selection import private_count_quantile
from sage_tfx.dp.counts import CountTable
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger.accounting import check_epsilon
from sage_tfx.pyramid.featurize import CountSpec, check_frame, group_keys

__all__ = ["key_totals", "select_noise_weights", "exact_noise_weights"]


def key_totals(frame: pd.DataFrame, spec: CountSpec) -> dict:
    """Exact per-key totals of every group in ``frame`` (non-DP; hot-window only)."""
    check_frame(frame, spec.features, spec.label, spec.n_labels)
    out = {}
    for g in spec.groups:
        t = CountTable(spec.n_labels)
        t.add(group_keys(frame, g), frame[spec.label].to_numpy())
        out[spec.group_name(g)] = t.key_totals()
    return out


def _finish(q: list, max_ratio: float) -> np.ndarray:
    w = np.maximum(np.asarray(q, dtype=np.float64), 1.0)
    w = np.minimum(w, w.min() * max_ratio)
    # The label prior keeps an even share ε / n_tables: its weight is the harmonic mean of the
    # group weights (ε_prior = ε (1/w_p) / (Σ_g 1/w_g + 1/w_p) = ε / (n_groups + 1)).
    return np.append(w, len(w) / np.sum(1.0 / w))


def select_noise_weights(frame: pd.DataFrame, spec: CountSpec, epsilon: float, *,
                         quantile: float = 0.1, max_count: int, max_ratio: float = 1e4,
                         ) -> np.ndarray:
    """ε-DP noise weights, one per table of ``spec`` (groups, then the label prior).

    Args:
      frame: the window's raw observations.
      spec: the count spec.
      epsilon: ε of the whole weight release (split evenly over the groups).
      quantile: which quantile of each group's key totals (the paper: 0.01 in §V, 0.1 in A.2).
      max_count: public upper bound on a key total (e.g. the window's maximum size).
      max_ratio: largest weight / smallest weight (post-processing clip; the paper uses 1e4).
    """
    epsilon = check_epsilon(epsilon)
    if not 1.0 <= float(max_ratio):
        raise InvalidRequestError(f"max_ratio must be >= 1, got {max_ratio!r}")
    totals = key_totals(frame, spec)
    per = epsilon / len(spec.groups)
    q = [private_count_quantile(totals[spec.group_name(g)], quantile, per, max_count, k=spec.k)
         for g in spec.groups]
    return _finish(q, max_ratio)


def exact_noise_weights(frame: pd.DataFrame, spec: CountSpec, *, quantile: float = 0.1,
                        max_ratio: float = 1e4,
                        totals: Optional[dict] = None) -> np.ndarray:
    """The non-private weights of §V (exact quantiles): for experiments comparing with DP ones."""
    totals = totals if totals is not None else key_totals(frame, spec)
    q = [float(np.quantile(totals[spec.group_name(g)], quantile)) if len(totals[spec.group_name(g)])
         else 1.0 for g in spec.groups]
    return _finish(q, max_ratio)
