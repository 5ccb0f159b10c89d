"""ptklib: the PTK types of the PTK paper's Tab. 1.

* :mod:`~sage_tfx.ptk.kernels.counts` — count featurization (row 1): DP per-label contingency
  tables over declared domains / hashing (the shared :mod:`sage_tfx.dp.counts` core).
* :mod:`~sage_tfx.ptk.kernels.trees` — DP random forest (row 2); features are leaf label rates.
* :mod:`~sage_tfx.ptk.kernels.hpf` — DP hierarchical Poisson factorization (row 3); user
  embeddings.
* :mod:`~sage_tfx.ptk.kernels.covariance` — Analyze-Gauss DP covariance (row 4); features are the
  projections on the top principal components (Gaussian).
* :mod:`~sage_tfx.ptk.kernels.histstats` — DP historical statistics (row 5): per-key DP counts
  and clipped means over a public, declared key domain (Laplace); features back off to the DP
  global mean for rare and unseen keys.
* :mod:`~sage_tfx.ptk.kernels.lloyd` — DP Lloyd (k-means) clustering (row 6): noisy counts and
  sums per iteration (Laplace); features are the distances to the centroids and the cluster id.

Each module defines ``train_dp``, ``eval``, ``dp_event`` (optionally ``erm``) for the store and a
``featurize(batch, state, config)`` for users.
"""
