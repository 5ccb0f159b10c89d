"""What one PTK training costs, as the DpEvent its PTK type declares (docs/design.md, "One
surface").

``cost(ptk_type, epsilon=, config=)`` is the event of
:meth:`~sage_tfx.ptk.abstraction.PTKType.charge`: what ``train_dp`` consumes at ``epsilon``,
checked against dp_accounting, and stored as the lineage's ``event`` of every version it trains.
The PTK store's stream is ``basic``: each partition's grant charges the (ε, δ) sums of the
charges of its members (``PrivacyCharge.epsilon`` / ``.delta``).

The grant: ``PTKStore(url, data_root, config)`` charges each window's partitions and profiles
itself (one grant per partition, released once); in a TFX pipeline ``PTKTrainer`` takes the
grant of the pipeline's ``SageGate``.
"""
from __future__ import annotations

from typing import Mapping, Optional, Union

from dp_accounting import dp_event as dp_event_lib

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ptk.abstraction import PTKType
from sage_tfx.ptk.registry import TypeRegistry, default_registry

__all__ = ["cost"]


def cost(ptk_type: Union[str, PTKType], *, epsilon: float, config: Optional[Mapping] = None,
         registry: Optional[TypeRegistry] = None) -> dp_event_lib.DpEvent:
    """The DpEvent of training a PTK of type ``ptk_type`` with ``config`` once at ``epsilon``.

    Args:
      ptk_type: a registered PTK type name (looked up in ``registry``) or a PTKType.
      epsilon: the training ε (a menu entry the allocator picked).
      config: the PTK's configuration dict (as given to ``PTKStore.register_ptk``).
      registry: where type names are looked up; default: the built-in ptklib kernels.
    Raises:
      UnknownPTKTypeError: no such registered type.
      InvalidRequestError / InvalidPrivacyParameterError: a config or ε the type refuses.
      UnaccountableEventError: the type declares an event the ledger cannot account.
    """
    if isinstance(ptk_type, str):
        ptk_type = (registry or default_registry()).get(ptk_type)
    if not isinstance(ptk_type, PTKType):
        raise InvalidRequestError(f"cost() of a PTK takes a PTK type name or PTKType, got "
                                  f"{ptk_type!r}")
    if config is not None and not isinstance(config, Mapping):
        raise InvalidRequestError(f"a PTK config is a dict, got {type(config).__name__}")
    return ptk_type.charge(epsilon, dict(config or {})).event
