"""The PTK abstraction (PTK paper §4, Fig. 1): a PTK struct, PTK types, and the privacy charge a
PTK type declares.

A *PTK type* is three functions the operator registers under a name
(:mod:`sage_tfx.ptk.registry`; the ptklib kernels are built in as ``histstats``, ``covariance``,
...). Clients name a registered type; no code a client names is ever imported or called.

* ``train_dp(trainset_iter, epsilon_train, prev_state, prev_config, *, config, noise) -> state``
  — an ``epsilon_train``-DP training procedure (§4.1). ``trainset_iter`` yields record batches
  (dicts of equal-length numpy columns); the state must be JSON-serialisable (it goes to the lake).
* ``eval(testset_iter, state, *, config) -> numpy array`` — the per-example losses, each in
  [0, 1] (the profiler's sensitivity argument needs bounded per-example losses, §5.2).
* ``dp_event(epsilon_train, config) -> PrivacyCharge`` — the dp_accounting ``DpEvent`` that
  ``train_dp`` consumes at that budget, with the (epsilon, delta) the ledger is charged.

Optionally ``erm(trainset_iter, *, config) -> state`` — the exact (non-DP) empirical risk
minimiser used by the profiler's lower bound (Fig. 3, step 4) — and
``featurize(batch, state, config) -> dict`` for the PTK's users.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from decimal import Decimal
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import dp_accounting
import numpy as np
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError, SageError

Batch = Mapping[str, np.ndarray]


class UnknownPTKError(SageError, ValueError):
    """No PTK with this id is registered."""


class FunctionReferenceError(SageError, ValueError):
    """A PTK type that is not registered (or a ``module:function`` reference, which is refused:
    PTK types come from the operator's registry only)."""


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


# What a kernel raises on a config or batch it cannot use (besides its InvalidRequestError).
KERNEL_INPUT_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError,
                       ArithmeticError)


def _where(fn: Callable) -> str:
    """``module:qualname`` of a registered function (lineage only: never imported back)."""
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


@dataclasses.dataclass(frozen=True)
class PTKType:
    """A registered PTK type: its name and its functions (see the module docstring)."""

    name: str
    train_dp_fn: Callable
    eval_fn: Callable
    dp_event_fn: Callable
    erm_fn: Optional[Callable] = None
    featurize_fn: Optional[Callable] = None

    def __post_init__(self):
        for part in ("train_dp_fn", "eval_fn", "dp_event_fn"):
            if not callable(getattr(self, part)):
                raise FunctionReferenceError(f"PTK type {self.name!r}: {part} is not callable")
        for part in ("erm_fn", "featurize_fn"):
            if getattr(self, part) is not None and not callable(getattr(self, part)):
                raise FunctionReferenceError(f"PTK type {self.name!r}: {part} is not callable")

    @classmethod
    def from_module(cls, name: str, module: ModuleType) -> "PTKType":
        """The type a kernel module defines (``train_dp``, ``eval``, ``dp_event``; optionally
        ``erm`` and ``featurize``)."""
        need = [f for f in ("train_dp", "eval", "dp_event")
                if not callable(getattr(module, f, None))]
        if need:
            raise FunctionReferenceError(
                f"module {module.__name__!r} does not define {need}: not a PTK type")
        opt = {f: getattr(module, f, None) for f in ("erm", "featurize")}
        return cls(name, module.train_dp, module.eval, module.dp_event,
                   opt["erm"] if callable(opt["erm"]) else None,
                   opt["featurize"] if callable(opt["featurize"]) else None)

    @property
    def has_erm(self) -> bool:
        """The type defines ``erm`` (the non-private reference the profiler compares with)."""
        return self.erm_fn is not None

    def references(self) -> dict:
        """Where each function lives, for the lake's lineage columns (informative only)."""
        return {"train_dp_ref": _where(self.train_dp_fn), "eval_ref": _where(self.eval_fn),
                "dp_event_ref": _where(self.dp_event_fn),
                "erm_ref": _where(self.erm_fn) if self.erm_fn else None}

    def train_dp(self, batches, epsilon, prev_state, prev_config, *, config, noise=None):
        """Calls the type's ``train_dp``: a new DP state from ``batches`` at ``epsilon``."""
        return self.train_dp_fn(batches, epsilon, prev_state, prev_config, config=config,
                                noise=noise)

    def eval(self, batches, state, *, config) -> np.ndarray:
        """Per-example losses of ``state`` on ``batches``, checked to be finite and in [0, 1].

        Raises:
          InvalidRequestError: the type returned a loss outside [0, 1] or not finite.
        """
        losses = np.asarray(self.eval_fn(batches, state, config=config), dtype=float).ravel()
        if losses.size and (not np.all(np.isfinite(losses)) or losses.min() < 0
                            or losses.max() > 1):
            raise InvalidRequestError(
                f"PTK type {self.name!r} returned losses outside [0, 1]; the profiler needs "
                "bounded per-example losses")
        return losses

    def erm(self, batches, *, config):
        """The type's non-private ``erm`` state on ``batches``, or None if it defines none."""
        return None if self.erm_fn is None else self.erm_fn(batches, config=config)

    def featurize(self, batch, state, config) -> dict:
        """Features of ``batch`` computed with ``state`` (the type's ``featurize``).

        Raises:
          FunctionReferenceError: the type registers no ``featurize``.
        """
        if self.featurize_fn is None:
            raise FunctionReferenceError(f"PTK type {self.name!r} registers no featurize")
        return self.featurize_fn(batch, state, config)

    def charge(self, epsilon: float, config: dict) -> PrivacyCharge:
        """The declared charge for ``train_dp`` at ``epsilon``, checked against dp_accounting."""
        try:
            declared = self.dp_event_fn(epsilon, config)
        except SageError:
            raise
        except KERNEL_INPUT_ERRORS as exc:  # a config the kernel cannot read: bad input
            raise InvalidRequestError(
                f"PTK type {self.name!r} refused the config: {type(exc).__name__}: {exc}") from exc
        if not isinstance(declared, PrivacyCharge):
            raise UnaccountableEventError(
                f"PTK type {self.name!r} must declare a PrivacyCharge, got "
                f"{type(declared).__name__}")
        check_charge(declared)
        return declared

    def check(self, config: Mapping, menu_eps: Sequence[float]) -> None:
        """Validates ``config`` and the declared event at every menu epsilon (nothing runs on
        data)."""
        if not isinstance(config, Mapping):
            raise InvalidRequestError(f"a PTK config is a dict, got {type(config).__name__}")
        for eps in menu_eps:
            self.charge(eps, dict(config))


def canonical_json(obj: Any) -> bytes:
    """The bytes a state or profile is released as: sorted keys, no spaces (one encoding, so a
    replay compares byte for byte)."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"a PTK state must be JSON-serialisable: {exc}") from exc


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
