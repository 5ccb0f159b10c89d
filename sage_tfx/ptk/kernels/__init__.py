"""ptklib: PTK types used by the store's tests and evaluation (PTK paper Tab. 1, rows 4 and 5).

* :mod:`~sage_tfx.ptk.kernels.counts` — count featurization (row 1): DP per-label contingency
  tables over declared domains / hashing (the shared :mod:`sage_tfx.dp.counts` core).
* :mod:`~sage_tfx.ptk.kernels.trees` — DP random forest (row 2); features are leaf label rates.
* :mod:`~sage_tfx.ptk.kernels.hpf` — DP hierarchical Poisson factorization (row 3); user
  embeddings.
* :mod:`~sage_tfx.ptk.kernels.histstats` — DP historical statistics: per-key DP counts and
  clipped means over a public, declared key domain (Laplace).
* :mod:`~sage_tfx.ptk.kernels.covariance` — Analyze-Gauss DP covariance; features are the
  projections on the top principal components (Gaussian).
"""
