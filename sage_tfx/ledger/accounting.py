"""Privacy parameters, dp_accounting events and the per-block RDP filter.

Two accounting modes are supported per stream (Sage §4, Theorem 4.3: every charge touches only
the blocks the run reads, so each block is accounted on its own):

``basic``
    A charge is an (ε, δ) pair; a block admits it while Σε ≤ ε_g and Σδ ≤ δ_g (the paper's rule).
    Sums are exact: each value is taken as the decimal number its shortest ``repr`` shows, so
    ``0.1 + 0.2 + 0.7`` fits a cap of ``1.0``, and nothing is ever rounded in the ledger's favour
    or against it.

``rdp``
    A charge is a dp_accounting ``DpEvent``. Each block keeps its Rényi-DP curve ``R(α)`` on one
    fixed grid of orders ``Λ`` and admits a charge if *some* order stays within its cap::

        cap(α) = ε_g − ln(|Λ| / δ_g) / (α − 1)

    Why this is (ε_g, δ_g)-DP even though the admitting order may change from charge to charge
    (an RDP *filter*; cf. Feldman & Zrnic 2021, Lécuyer 2021): fix a block and an order α, and let
    ``L_t`` be the privacy loss of the first t charges on that block and ``R_t(α)`` their summed
    RDP at α. For adaptively chosen mechanisms, ``M_t = exp((α−1)(L_t − R_t(α)))`` is a
    non-negative supermartingale with ``M_0 = 1`` (each mechanism's RDP bounds the conditional
    moment of its loss). By Ville's inequality, at any stopping time T,
    ``P[L_T > ε_g and R_T(α) ≤ cap(α)] ≤ P[M_T ≥ exp((α−1)(ε_g − cap(α)))]
    = exp(−ln(|Λ|/δ_g)) = δ_g / |Λ|``.
    The ledger only admits a charge if afterwards some α ∈ Λ has ``R(α) ≤ cap(α)``, so at the
    end ``L_T > ε_g`` implies one of the |Λ| events above; the union bound gives
    ``P[L_T > ε_g] ≤ δ_g``, i.e. (ε_g, δ_g)-DP for the block. Splitting δ_g across the grid is
    what pays for letting the order vary.

    A block's spent ε is reported at δ_g with dp_accounting's own RDP-to-DP conversion (tighter
    than the filter's, so the reported ε never exceeds ε_g for an admitted block).

This module imports no TensorFlow.
"""
from __future__ import annotations

import decimal
import functools
import json
import math
from decimal import Decimal
from typing import Any, Sequence

import attr
import dp_accounting
import numpy as np
from dp_accounting import dp_event as dp_event_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.ledger.names import BASIC, MODES, RDP  # noqa: F401  (accounting modes)

# Fixed order grid of RDP streams. Few enough orders that the union bound costs little
# (ln 30 ≈ 3.4 nats of the ln(|Λ|/δ_g) term), dense enough around the orders that matter for
# ε_g between 0.1 and 10 at δ_g around 1e-6..1e-9.
DEFAULT_RDP_ORDERS: tuple[float, ...] = (
    1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 28.0,
    32.0, 40.0, 48.0, 56.0, 64.0, 80.0, 96.0, 128.0, 160.0, 192.0, 256.0, 384.0, 512.0, 1024.0,
)


def check_positive(value: Any, name: str) -> float:
    """Returns ``value`` as a float if it is a finite number > 0 (bools rejected).

    For every parameter that fixes a guarantee: ε, a sensitivity, a noise multiplier, a public
    bound. Such a value is never clamped or guessed.

    Raises:
      InvalidPrivacyParameterError: NaN, infinite, zero, negative or not a number.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise InvalidPrivacyParameterError(f"{name} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out) or out <= 0:
        raise InvalidPrivacyParameterError(f"{name} must be finite and > 0, got {value!r}")
    return out


def check_epsilon(epsilon: Any, name: str = "epsilon") -> float:
    """Returns ``epsilon`` as a float if it is a finite number > 0 (see :func:`check_positive`)."""
    return check_positive(epsilon, name)


def check_delta(delta: Any, name: str = "delta", allow_zero: bool = True) -> float:
    """Returns ``delta`` as a float if it lies in [0, 1) (or (0, 1) when ``allow_zero`` is False).

    Raises:
      InvalidPrivacyParameterError: NaN, negative, ≥ 1, or zero when zero is not allowed.
    """
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating, np.integer)):
        raise InvalidPrivacyParameterError(f"{name} must be a number, got {delta!r}")
    value = float(delta)
    if not math.isfinite(value) or value < 0 or value >= 1 or (value == 0 and not allow_zero):
        interval = "[0, 1)" if allow_zero else "(0, 1)"
        raise InvalidPrivacyParameterError(f"{name} must lie in {interval}, got {delta!r}")
    return value


def exact(value: float) -> Decimal:
    """The decimal number a float's shortest repr shows (what the user typed)."""
    return Decimal(repr(float(value)))


# The ledger's decimal sums run in this fixed context, never in the thread's current one: a caller
# that sets ``decimal.getcontext().prec`` (a notebook, a library) must not change how budgets add
# up. 28 digits is Python's default and what the PostgreSQL one-call path assumes (MAX_DIGITS).
CONTEXT = decimal.Context(prec=28, rounding=decimal.ROUND_HALF_EVEN, Emin=-999999, Emax=999999,
                          capitals=1, clamp=0, flags=[],
                          traps=[decimal.InvalidOperation, decimal.DivisionByZero,
                                 decimal.Overflow])


def in_ledger_context(fn):
    """Decorator: ``fn`` runs its decimal arithmetic in :data:`CONTEXT`."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with decimal.localcontext(CONTEXT):
            return fn(*args, **kwargs)
    return wrapper


# --- DpEvent serialization --------------------------------------------------------------------

_EVENT_CLASSES = {
    cls.__name__: cls
    for cls in vars(dp_event_lib).values()
    if isinstance(cls, type) and issubclass(cls, dp_event_lib.DpEvent) and attr.has(cls)
}


def event_to_dict(event: dp_event_lib.DpEvent) -> dict:
    """A JSON-able dict of a DpEvent that keeps every field name (``{"class": ..., ...}``)."""
    if not isinstance(event, dp_event_lib.DpEvent):
        raise InvalidPrivacyParameterError(f"expected a dp_accounting DpEvent, got {event!r}")
    out: dict[str, Any] = {"class": type(event).__name__}
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        if isinstance(value, dp_event_lib.DpEvent):
            value = event_to_dict(value)
        elif isinstance(value, (list, tuple)):
            value = [event_to_dict(v) if isinstance(v, dp_event_lib.DpEvent) else v for v in value]
        elif isinstance(value, np.generic):
            value = value.item()
        out[field.name] = value
    return out


def event_from_dict(data: dict) -> dp_event_lib.DpEvent:
    """Rebuilds a DpEvent from :func:`event_to_dict` output (only dp_accounting's own classes)."""
    if not isinstance(data, dict) or data.get("class") not in _EVENT_CLASSES:
        raise InvalidPrivacyParameterError(f"not a serialized dp_accounting DpEvent: {data!r}")
    cls = _EVENT_CLASSES[data["class"]]
    kwargs = {}
    for field in attr.fields(cls):
        value = data.get(field.name)
        if isinstance(value, dict) and "class" in value:
            value = event_from_dict(value)
        elif isinstance(value, list):
            value = [event_from_dict(v) if isinstance(v, dict) else v for v in value]
        kwargs[field.name] = value
    return cls(**kwargs)


def event_to_json(event: dp_event_lib.DpEvent) -> str:
    """Canonical JSON text of a DpEvent (sorted keys: equal events give equal text)."""
    return json.dumps(event_to_dict(event), sort_keys=True)


def event_from_json(text: str) -> dp_event_lib.DpEvent:
    """Inverse of :func:`event_to_json`."""
    return event_from_dict(json.loads(text))


def _check_event_fields(event: dp_event_lib.DpEvent) -> None:
    """Rejects events whose parameters make no sense (NaN, ≤ 0 noise, probabilities ∉ [0, 1])."""
    name = type(event).__name__
    if isinstance(event, (dp_event_lib.NoOpDpEvent, dp_event_lib.NonPrivateDpEvent,
                          dp_event_lib.UnsupportedDpEvent)):
        raise InvalidPrivacyParameterError(
            f"{name} cannot be charged: the ledger charges mechanisms with a finite privacy cost")
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        if isinstance(value, dp_event_lib.DpEvent):
            _check_event_fields(value)
        elif isinstance(value, (list, tuple)):
            if not value and isinstance(event, dp_event_lib.ComposedDpEvent):
                raise InvalidPrivacyParameterError("ComposedDpEvent with no events")
            for v in value:
                if isinstance(v, dp_event_lib.DpEvent):
                    _check_event_fields(v)
        elif isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
            if not math.isfinite(float(value)):
                raise InvalidPrivacyParameterError(f"{name}.{field.name} is {value!r}")
            if field.name == "noise_multiplier" and value <= 0:
                raise InvalidPrivacyParameterError(
                    f"{name}.noise_multiplier must be > 0, got {value!r}")
            if field.name == "count" and (value < 1 or int(value) != value):
                raise InvalidPrivacyParameterError(
                    f"{name}.count must be a whole number ≥ 1, got {value!r}")
            if field.name.endswith("probability") and not 0 <= value <= 1:
                raise InvalidPrivacyParameterError(
                    f"{name}.{field.name} must lie in [0, 1], got {value!r}")


def check_event(event: Any) -> dp_event_lib.DpEvent:
    """Returns ``event`` if it is a DpEvent the RDP accountant can account with finite cost.

    Raises:
      InvalidPrivacyParameterError: not a DpEvent, bad parameters, or not accountable by RDP.
    """
    if not isinstance(event, dp_event_lib.DpEvent):
        raise InvalidPrivacyParameterError(f"expected a dp_accounting DpEvent, got {event!r}")
    _check_event_fields(event)
    if not rdp_lib.RdpAccountant(DEFAULT_RDP_ORDERS).supports(event):
        raise InvalidPrivacyParameterError(
            f"dp_accounting's RDP accountant cannot account {type(event).__name__}: {event}")
    return event


@functools.lru_cache(maxsize=4096)
def _rdp_curve_cached(event_json: str, orders: tuple[float, ...]) -> tuple[float, ...]:
    accountant = rdp_lib.RdpAccountant(list(orders))
    accountant.compose(event_from_json(event_json))
    curve = tuple(float(x) for x in accountant._rdp)  # pylint: disable=protected-access
    if any(math.isnan(x) or x < 0 for x in curve):
        raise InvalidPrivacyParameterError(f"RDP curve of {event_json} is invalid: {curve}")
    if all(math.isinf(x) for x in curve):
        raise InvalidPrivacyParameterError(f"{event_json} has infinite RDP at every order")
    return curve


def rdp_curve(event: dp_event_lib.DpEvent, orders: Sequence[float]) -> tuple[float, ...]:
    """The RDP of ``event`` at each order, as dp_accounting's RdpAccountant computes it."""
    check_event(event)
    return _rdp_curve_cached(event_to_json(event), tuple(float(a) for a in orders))


def check_orders(orders: Sequence[float]) -> tuple[float, ...]:
    """Returns a valid RDP order grid: strictly increasing finite orders > 1."""
    grid = tuple(float(a) for a in orders)
    if (not grid or any(not math.isfinite(a) or a <= 1 for a in grid)
            or list(grid) != sorted(set(grid))):
        raise InvalidPrivacyParameterError(
            f"RDP orders must be distinct, increasing, finite and > 1, got {orders!r}")
    return grid


def rdp_caps(epsilon_g: float, delta_g: float, orders: Sequence[float]) -> tuple[float, ...]:
    """Per-order caps of the RDP filter: cap(α) = ε_g − ln(|Λ|/δ_g)/(α−1) (see module doc)."""
    check_epsilon(epsilon_g, "epsilon_g")
    check_delta(delta_g, "delta_g", allow_zero=False)
    log_term = math.log(len(orders) / delta_g)
    return tuple(epsilon_g - log_term / (a - 1.0) for a in orders)


def rdp_fits(spent: Sequence[float], charge: Sequence[float], caps: Sequence[float]) -> bool:
    """True if some order stays within its cap after adding ``charge`` to ``spent``."""
    return any(s + c <= cap for s, c, cap in zip(spent, charge, caps))


def rdp_epsilon(spent: Sequence[float], orders: Sequence[float], delta: float) -> float:
    """ε at ``delta`` of an RDP curve, with dp_accounting's conversion."""
    if not any(spent):
        return 0.0
    eps, _ = rdp_lib.compute_epsilon(np.asarray(orders), np.asarray(spent), delta)
    return float(eps)


def laplace_event(epsilon: float) -> dp_event_lib.LaplaceDpEvent:
    """The Laplace mechanism with sensitivity 1 that is ``epsilon``-DP."""
    return dp_accounting.LaplaceDpEvent(noise_multiplier=1.0 / check_epsilon(epsilon))
