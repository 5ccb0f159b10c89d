"""The PTK abstraction (PTK paper §4, Fig. 1): a PTK struct, PTK types by importable reference,
and the privacy charge a PTK type declares.

A *PTK type* is three importable functions, named ``package.module:function`` so a registration
survives restarts and can be sent over the network:

* ``train_dp(trainset_iter, epsilon_train, prev_state, prev_config, *, config, noise) -> state``
  — an ``epsilon_train``-DP training procedure (§4.1). ``trainset_iter`` yields record batches
  (dicts of equal-length numpy columns); the state must be JSON-serialisable (it goes to the lake).
* ``eval(testset_iter, state, *, config) -> numpy array`` — the per-example losses, each in
  [0, 1] (the profiler's sensitivity argument needs bounded per-example losses, §5.2).
* ``dp_event(epsilon_train, config) -> PrivacyCharge`` — the dp_accounting ``DpEvent`` that
  ``train_dp`` consumes at that budget, with the (epsilon, delta) the ledger is charged.

Optionally ``erm(trainset_iter, *, config) -> state`` — the exact (non-DP) empirical risk
minimiser used by the profiler's lower bound (Fig. 3, step 4). By default these are looked up in
the module of ``train_dp`` under the names ``dp_event`` and ``erm``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import math
import re
from decimal import Decimal
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import dp_accounting
import numpy as np
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError, SageError

Batch = Mapping[str, np.ndarray]
_REF_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


class UnknownPTKError(SageError, ValueError):
    """No PTK with this id is registered."""


class FunctionReferenceError(SageError, ValueError):
    """A ``package.module:function`` reference that does not import or is not callable."""


class UnaccountableEventError(SageError, ValueError):
    """A PTK type declared a DpEvent that the ledger cannot account, or that spends more than
    the (epsilon, delta) it asks to be charged."""


class PerformanceTargetError(SageError, ValueError):
    """A performance target outside (0, 1]."""


class SubscriberError(SageError, ValueError):
    """A subscriber endpoint that is malformed or does not answer."""


@dataclasses.dataclass(frozen=True)
class PrivacyCharge:
    """What one ``train_dp`` call spends: its DpEvent and the (epsilon, delta) charged for it."""

    event: dp_event_lib.DpEvent
    epsilon: float
    delta: float = 0.0


@dataclasses.dataclass(frozen=True)
class PTK:
    """Fig. 1's ``struct ptk``: id, model state, config, tau, oldest/newest contributing window."""

    id: str
    model_state: Any
    config: dict
    tau: float
    oldest_contributing_window: Optional[int]
    newest_contributing_window: Optional[int]
    version: int = 0


def resolve_reference(ref: Any) -> Callable:
    """Imports ``package.module:function``; raises :class:`FunctionReferenceError` otherwise."""
    if not isinstance(ref, str) or not _REF_RE.match(ref):
        raise FunctionReferenceError(
            f"a function reference must look like 'package.module:function', got {ref!r}")
    module_name, attr = ref.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module failing at import
        raise FunctionReferenceError(f"cannot import module {module_name!r} of {ref!r}: {exc}") \
            from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise FunctionReferenceError(f"{ref!r}: module {module_name!r} has no callable {attr!r}")
    return fn


def sibling_reference(ref: str, name: str) -> Optional[str]:
    """``pkg.mod:name`` for the module of ``ref`` if that module defines a callable ``name``."""
    module_name = ref.split(":")[0]
    try:
        return f"{module_name}:{name}" if callable(
            getattr(importlib.import_module(module_name), name, None)) else None
    except Exception:
        return None


@dataclasses.dataclass(frozen=True)
class PTKType:
    """A PTK type resolved from its references (see the module docstring)."""

    train_dp_ref: str
    eval_ref: str
    dp_event_ref: str
    erm_ref: Optional[str] = None

    @classmethod
    def resolve(cls, train_dp_fn: str, eval_fn: str, dp_event_fn: Optional[str] = None,
                erm_fn: Optional[str] = None) -> "PTKType":
        resolve_reference(train_dp_fn)
        resolve_reference(eval_fn)
        dp_event_fn = dp_event_fn or sibling_reference(train_dp_fn, "dp_event")
        if dp_event_fn is None:
            raise FunctionReferenceError(
                f"{train_dp_fn!r} declares no DpEvent: give dp_event_fn or define dp_event "
                "beside train_dp")
        resolve_reference(dp_event_fn)
        erm_fn = erm_fn or sibling_reference(train_dp_fn, "erm")
        if erm_fn is not None:
            resolve_reference(erm_fn)
        return cls(train_dp_fn, eval_fn, dp_event_fn, erm_fn)

    def train_dp(self, batches, epsilon, prev_state, prev_config, *, config, noise=None):
        return resolve_reference(self.train_dp_ref)(batches, epsilon, prev_state, prev_config,
                                                    config=config, noise=noise)

    def eval(self, batches, state, *, config) -> np.ndarray:
        losses = np.asarray(resolve_reference(self.eval_ref)(batches, state, config=config),
                            dtype=float).ravel()
        if losses.size and (not np.all(np.isfinite(losses)) or losses.min() < 0
                            or losses.max() > 1):
            raise InvalidRequestError(
                f"{self.eval_ref} returned losses outside [0, 1]; the profiler needs bounded "
                "per-example losses")
        return losses

    def erm(self, batches, *, config):
        if self.erm_ref is None:
            return None
        return resolve_reference(self.erm_ref)(batches, config=config)

    def charge(self, epsilon: float, config: dict) -> PrivacyCharge:
        """The declared charge for ``train_dp`` at ``epsilon``, checked against dp_accounting."""
        declared = resolve_reference(self.dp_event_ref)(epsilon, config)
        if not isinstance(declared, PrivacyCharge):
            raise UnaccountableEventError(
                f"{self.dp_event_ref} must return a PrivacyCharge, got {type(declared).__name__}")
        check_charge(declared)
        return declared


def _pure_epsilon(event: dp_event_lib.DpEvent) -> Optional[Decimal]:
    """The exact epsilon of a pure-DP event tree (Laplace, composed), or None if not pure."""
    if isinstance(event, dp_event_lib.NoOpDpEvent):
        return Decimal(0)
    if isinstance(event, dp_event_lib.LaplaceDpEvent):
        return None if event.noise_multiplier <= 0 else Decimal(1) / Decimal(
            repr(float(event.noise_multiplier)))
    if isinstance(event, dp_event_lib.SelfComposedDpEvent):
        inner = _pure_epsilon(event.event)
        return None if inner is None else inner * event.count
    if isinstance(event, dp_event_lib.ComposedDpEvent):
        parts = [_pure_epsilon(e) for e in event.events]
        return None if any(p is None for p in parts) else sum(parts, Decimal(0))
    return None


def _accountable(event: dp_event_lib.DpEvent) -> bool:
    if isinstance(event, (dp_event_lib.NoOpDpEvent, dp_event_lib.LaplaceDpEvent,
                          dp_event_lib.GaussianDpEvent)):
        return True
    if isinstance(event, dp_event_lib.SelfComposedDpEvent):
        return _accountable(event.event)
    if isinstance(event, dp_event_lib.ComposedDpEvent):
        return all(_accountable(e) for e in event.events)
    return False


_PLD_CACHE: dict = {}


def _gaussian_delta(event: dp_event_lib.GaussianDpEvent, epsilon: float) -> float:
    """The exact δ(ε) of one Gaussian mechanism (dp_accounting's analytic privacy-loss curve)."""
    from dp_accounting.pld import privacy_loss_mechanism as plm
    return plm.GaussianPrivacyLoss(event.noise_multiplier,
                                   sensitivity=1.0).get_delta_for_epsilon(epsilon)


def _pld_epsilon(key: str, event: dp_event_lib.DpEvent, delta: float) -> float:
    """dp_accounting's PLD epsilon of ``event`` at ``delta`` (memoised on the event's repr)."""
    if (key, delta) not in _PLD_CACHE:
        accountant = dp_accounting.pld.PLDAccountant()
        accountant.compose(event)
        _PLD_CACHE[(key, delta)] = float(accountant.get_epsilon(delta))
    return _PLD_CACHE[(key, delta)]


def check_charge(charge: PrivacyCharge) -> None:
    """Raises :class:`UnaccountableEventError` unless the event can be accounted and spends at
    most (epsilon, delta) according to dp_accounting: exactly for pure-DP event trees and for a
    single Gaussian (its analytic privacy-loss curve), by the PLD accountant otherwise."""
    event, eps, dlt = charge.event, charge.epsilon, charge.delta
    if not isinstance(event, dp_event_lib.DpEvent) or not _accountable(event):
        raise UnaccountableEventError(
            f"the ledger cannot account {type(event).__name__}: a PTK type must declare a "
            "Laplace / Gaussian DpEvent or a composition of them")
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps > 0):
        raise InvalidPrivacyParameterError(f"epsilon must be finite and > 0, got {eps!r}")
    if not (isinstance(dlt, (int, float)) and 0 <= dlt < 1):
        raise InvalidPrivacyParameterError(f"delta must lie in [0, 1), got {dlt!r}")
    pure = _pure_epsilon(event)
    if pure is not None:
        if pure > Decimal(repr(float(eps))):
            raise UnaccountableEventError(
                f"the declared event is {pure}-DP but asks to be charged epsilon={eps}")
        return
    if dlt <= 0:
        raise UnaccountableEventError("an approximate-DP event (Gaussian) needs delta > 0")
    if isinstance(event, dp_event_lib.GaussianDpEvent):  # one Gaussian: the exact curve
        spent_delta = _gaussian_delta(event, eps)
        if spent_delta > dlt:
            raise UnaccountableEventError(
                f"the declared Gaussian event has delta={spent_delta:.3g} at epsilon={eps} "
                f"(dp_accounting's exact curve), more than the charged delta={dlt}")
        return
    spent = _pld_epsilon(repr(event), event, dlt)
    if spent > eps:
        raise UnaccountableEventError(
            f"the declared event spends epsilon={spent:.6g} at delta={dlt} (dp_accounting PLD), "
            f"more than the charged epsilon={eps}")


def hash_positions(keys, salt: str) -> np.ndarray:
    """A uniform position in [0, 1) per key: a salted SHA-256 (independent of other records)."""
    out = np.empty(len(keys))
    for i, k in enumerate(keys):
        h = hashlib.sha256(f"{salt}\x00{k}".encode()).digest()
        out[i] = int.from_bytes(h[:8], "big") / 2.0 ** 64
    return out


def record_keys(columns: Mapping[str, np.ndarray]) -> list:
    """One string per record from all its values: an identity that does not depend on the
    record's position, so hashing it assigns each record independently of the others."""
    names = sorted(columns)
    return ["\x1f".join(map(str, row)) for row in zip(*(np.asarray(columns[c]).tolist()
                                                        for c in names))]


def batches_of(columns: Mapping[str, np.ndarray], size: int = 4096) -> Iterator[dict]:
    """Splits a dict of equal-length columns into record batches."""
    n = len(next(iter(columns.values()))) if columns else 0
    for start in range(0, n, size):
        yield {k: np.asarray(v)[start:start + size] for k, v in columns.items()}


def concat(batches: Iterable[Batch]) -> dict:
    """Concatenates record batches into one dict of columns."""
    parts: dict[str, list] = {}
    for b in batches:
        for k, v in b.items():
            parts.setdefault(k, []).append(np.asarray(v))
    return {k: np.concatenate(v) for k, v in parts.items()}
