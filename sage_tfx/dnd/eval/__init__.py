"""The Draw-and-Discard evaluation (§V–VI): the library behind benchmarks/dnd/.

:mod:`~sage_tfx.dnd.eval.simulate` (sequential runs), :mod:`~sage_tfx.dnd.eval.digits` (Figs. 2–4),
:mod:`~sage_tfx.dnd.eval.known_weights` (§V-C), :mod:`~sage_tfx.dnd.eval.phishing` (§VI-A).
"""
