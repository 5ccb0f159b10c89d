"""ptklib: PTK types used by the store's tests and evaluation (PTK paper Tab. 1, rows 4 and 5).

* :mod:`~sage_tfx.ptk.kernels.histstats` — DP historical statistics: per-key DP counts and
  clipped means over a public, declared key domain (Laplace).
* :mod:`~sage_tfx.ptk.kernels.covariance` — Analyze-Gauss DP covariance; features are the
  projections on the top principal components (Gaussian).
"""
