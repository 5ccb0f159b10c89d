"""Pyramid (docs/papers.md, S&P 2017): windowed DP count featurization with retention.

* :mod:`~sage_tfx.pyramid.featurize` — :class:`CountSpec` and :class:`Featurization` (label rates
  with back-off from the sum of live windows).
* :mod:`~sage_tfx.pyramid.windows` — :class:`PyramidStore`: hot window, sealing with one ledger
  charge and one recorded release per (stream, spec, window), discard, restore, retention with
  drop + retrain, roll-over deletion; safe for several processes on one directory.
* :mod:`~sage_tfx.pyramid.sealing` — the noisy tables of a window, released once per grant.
* :mod:`~sage_tfx.pyramid.treestore` — the store's dyadic tree (``aggregation="tree"``): nodes
  released once when complete, ranges read from ≤ 2L+1 complete nodes
  (:mod:`~sage_tfx.pyramid.tree`: the mechanism, in memory).
* :mod:`~sage_tfx.pyramid.hot` — the directory lock and the hot windows' data keys (kept in the
  ledger's database); :mod:`~sage_tfx.pyramid.rows` — raw rows as bytes without pickle.
* :mod:`~sage_tfx.pyramid.weights` — weighted noise infusion with DP weights.
* :mod:`~sage_tfx.pyramid.selection` — DP count selection by mutual information.

* :mod:`~sage_tfx.pyramid.graph` — the featurization as a TF graph (SavedModel over raw
  tf.Examples; TensorFlow imported inside its functions only).

The count-table and sketch kernel is the shared :mod:`sage_tfx.dp.counts`. No TensorFlow at
import time.
"""
from sage_tfx.pyramid.cost import cost
from sage_tfx.pyramid.featurize import (CountSpec, Featurization, KeyKindError,
                                        NonCategoricalError, UnknownFeatureError)
from sage_tfx.pyramid.selection import select_groups
from sage_tfx.pyramid.weights import exact_noise_weights, select_noise_weights
from sage_tfx.pyramid.windows import (BudgetDeniedError, PyramidStore, RetentionError, SealResult,
                                      TreeWindowError, WindowSealedError, pyramid_run_id,
                                      release_name, window_event)

__all__ = ["CountSpec", "Featurization", "PyramidStore", "SealResult", "WindowSealedError",
           "RetentionError", "BudgetDeniedError", "TreeWindowError", "UnknownFeatureError",
           "NonCategoricalError", "KeyKindError",
           "select_groups", "pyramid_run_id", "select_noise_weights", "exact_noise_weights",
           "window_event", "release_name"]
__all__ += ["cost"]
