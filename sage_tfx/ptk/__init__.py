"""The Sage PTK store (``docs/papers.md``, "PTK store") on the block ledger.

Modules: :mod:`~sage_tfx.ptk.abstraction` (the PTK struct, PTK types, declared DpEvents),
:mod:`~sage_tfx.ptk.registry` (the operator's registry of PTK types, by name),
:mod:`~sage_tfx.ptk.kernels` (ptklib), :mod:`~sage_tfx.ptk.profiler` (Fig. 3),
:mod:`~sage_tfx.ptk.profiles` (charged, released-once profile runs),
:mod:`~sage_tfx.ptk.allocator` (Fig. 4 with ``scipy.optimize.milp``), :mod:`~sage_tfx.ptk.lake`
(versions + lineage in ``ptk_*`` tables), :mod:`~sage_tfx.ptk.windows` (tumbling window 𝒯 and
trainer), :mod:`~sage_tfx.ptk.windowfiles` (encrypted window blocks),
:mod:`~sage_tfx.ptk.notify` (HTTP callbacks), :mod:`~sage_tfx.ptk.store` (the API),
:mod:`~sage_tfx.ptk.api` (typed HTTP requests) and :mod:`~sage_tfx.ptk.service` (FastAPI).
"""
from sage_tfx.ptk.abstraction import (PTK, FunctionReferenceError, PerformanceTargetError,
                                      PrivacyCharge, PTKType, SubscriberError,
                                      UnaccountableEventError, UnknownPTKError)
from sage_tfx.ptk.allocator import Allocation, Option, allocate
from sage_tfx.ptk.cost import cost
from sage_tfx.ptk.registry import TypeRegistry, UnknownPTKTypeError, default_registry
from sage_tfx.ptk.store import PTKStore, Reject, StoreConfig

__all__ = ["PTK", "PTKType", "PrivacyCharge", "PTKStore", "StoreConfig", "Reject", "allocate",
           "Allocation", "Option", "UnknownPTKError", "FunctionReferenceError",
           "UnaccountableEventError", "PerformanceTargetError", "SubscriberError", "TypeRegistry",
           "UnknownPTKTypeError", "default_registry"]
__all__ += ["cost"]
