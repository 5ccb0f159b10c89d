"""ptklib: PTK types of the PTK paper's Tab. 1 (rows 4-6 here).

* :mod:`~sage_tfx.ptk.kernels.covariance` — Analyze-Gauss DP covariance; features are the
  projections on the top principal components (Gaussian).
* :mod:`~sage_tfx.ptk.kernels.histstats` — DP historical statistics: per-key DP counts and
  clipped means over a public, declared key domain (Laplace); features back off to the DP global
  mean for rare and unseen keys.
* :mod:`~sage_tfx.ptk.kernels.lloyd` — DP Lloyd (k-means) clustering: noisy counts and sums per
  iteration (Laplace); features are the distances to the centroids and the cluster id.

Each module defines ``train_dp``, ``eval``, ``dp_event`` (optionally ``erm``) for the store and a
``featurize(batch, state, config)`` for users.
"""
