"""Reproductions of the Sage paper's evaluation (SOSP '19, §5); numpy only, no TensorFlow.

* :mod:`sage_tfx.experiments.tab2` — Tab. 2, reliability of the SLAed validators.
"""
