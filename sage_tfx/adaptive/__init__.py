"""Privacy plans and privacy-adaptive training (Sage §3.1, §3.3).

* :mod:`~sage_tfx.adaptive.plan` — a run's :class:`PrivacyPlan`: what each DP stage (transform,
  train, validate) spends, charged by the gate once;
* :mod:`~sage_tfx.adaptive.allocator` — the per-block budget :class:`Allocator` shared by the
  pipelines waiting on a stream;
* :mod:`~sage_tfx.adaptive.search` — :class:`AdaptiveSearch`, one pipeline's Block/Conserve or
  Block/Aggressive search (start small, double ε or the window on RETRY);
* :mod:`~sage_tfx.adaptive.statistic` — one iteration of a DP statistic pipeline, released once
  against its grant (:func:`run_statistic_iteration`).

Depends on :mod:`sage_tfx.ledger` and :mod:`sage_tfx.dp`; no TensorFlow at import time.
"""
from sage_tfx.adaptive.allocator import (ALLOCATION_POLICIES, EVEN, FCFS, UNITS_PER_BLOCK,
                                         AllocationError, Allocator, IterationPlan)
from sage_tfx.adaptive.cost import cost
from sage_tfx.adaptive.plan import PlanPart, PrivacyPlan
from sage_tfx.adaptive.search import (AGGRESSIVE, CONSERVE, SEARCH_POLICIES, AdaptiveSearch,
                                      IterationRecord, SearchConfig, conserve_waste_bound)
from sage_tfx.adaptive.statistic import StatisticIteration, run_statistic_iteration

__all__ = ["PlanPart", "PrivacyPlan", "Allocator", "AllocationError", "IterationPlan",
           "AdaptiveSearch", "SearchConfig", "IterationRecord", "conserve_waste_bound",
           "UNITS_PER_BLOCK", "EVEN", "FCFS", "ALLOCATION_POLICIES", "CONSERVE", "AGGRESSIVE",
           "SEARCH_POLICIES", "StatisticIteration", "run_statistic_iteration"]
__all__ += ["cost"]
