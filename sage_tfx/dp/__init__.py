"""Differential privacy building blocks shared by every system (Sage §3.1, §3.3, Tab. 1).

* mechanisms and statistics — :mod:`~sage_tfx.dp.mechanisms` (Laplace, analytic Gaussian, budget
  splitting), :mod:`~sage_tfx.dp.queries` (counts, sums, means, group-by aggregates over a public
  domain), :mod:`~sage_tfx.dp.histograms` (histograms, min/max, quantiles over public bins);
* training — :mod:`~sage_tfx.dp.dpsgd` (DP-SGD accounting and noise calibration with
  dp_accounting), :mod:`~sage_tfx.dp.keras_dpsgd` (TF Privacy fast-clipping DP-SGD; TensorFlow
  imported inside its functions), :mod:`~sage_tfx.dp.adassp` (AdaSSP linear regression),
  :mod:`~sage_tfx.dp.logistic` (output-perturbed logistic regression);
* SLAed validation — :mod:`~sage_tfx.dp.validation` (ACCEPT / REJECT / RETRY validators),
  :mod:`~sage_tfx.dp.sla_bounds` (DP-noise corrections, Bernstein bounds),
  :mod:`~sage_tfx.dp.sla_baselines` (Tab. 2's No SLA / NP SLA / UC DP SLA, for evaluations);
* under a grant — :mod:`~sage_tfx.dp.granted` (statistics, validations and AdaSSP released once
  against the ledger grant that paid for them: a replay returns the recorded release).

Privacy parameters are checked with :mod:`sage_tfx.ledger.accounting`, so a value the ledger
accepts is the value a mechanism runs with. No TensorFlow at import time.
"""
