"""The ε budget of one DP Transform analysis run: what the DP analyzers may spend and did spend.

Every analyzer of :mod:`sage_tfx.components.dp_transform.analyzers` charges its ε to the active
:class:`DPBudget` and raises :class:`DPBudgetExceededError` before building anything if the charge
does not fit. :class:`DPPreprocessingFn` carries a budget with the user's ``preprocessing_fn``
wherever tf.Transform pickles and traces it; ``with dp_budget(epsilon):`` activates one for the
enclosed code only. Spends are accounted per trace graph (see the analyzers' module docstring).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
import weakref
from decimal import Decimal
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import dp_accounting
import tensorflow as tf

from sage_tfx.errors import InvalidPrivacyParameterError, MissingGrantError
from sage_tfx.ledger.accounting import check_epsilon, exact

# Under-spending is safe, so "fully spent" tolerates float rounding of a user's split; over-
# spending is never tolerated (exact decimal comparison, as the ledger does).
_FULL_SPEND_RELATIVE_TOLERANCE = 1e-9


class DPBudgetExceededError(InvalidPrivacyParameterError):
    """DP analyzers asked for more ε than the preprocessing_fn was granted."""


@dataclasses.dataclass(frozen=True)
class DPSpend:
    """One DP analyzer's charge: its name in the trace, its ε and its dp_accounting event."""

    name: str
    epsilon: float
    event: dp_accounting.DpEvent


class DPBudget:
    """The ε granted to one Transform analysis run and what its DP analyzers spent.

    Spends are recorded per trace (tf.Transform traces the preprocessing_fn in several graphs);
    every trace must fit the grant, and all traces must spend the same.
    """

    def __init__(self, epsilon: float, *, require_full_spend: bool = True) -> None:
        """Creates an empty budget.

        Args:
          epsilon: the ε the run may spend (e.g. the ledger grant's epsilon), finite and > 0.
          require_full_spend: if True, :meth:`check_fully_spent` (called at the end of
            ``dp_budget`` and of each ``DPPreprocessingFn`` call) fails on an under-spend too:
            an unspent share usually means an analyzer was forgotten.

        Raises:
          InvalidPrivacyParameterError: bad ε.
        """
        self.epsilon = check_epsilon(epsilon)
        self.require_full_spend = require_full_spend
        # Trace graphs are only weakly referenced (and not pickled): their spends outlive them.
        self._trace_ids: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
        self._traces: dict[int, list[DPSpend]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # tf.Transform pickles the preprocessing_fn (and with it this budget) to trace it again
        # in Beam workers; graphs do not pickle, spends do.
        state = dict(self.__dict__)
        state["_trace_ids"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._trace_ids = weakref.WeakKeyDictionary()

    def _trace(self, trace: Any) -> list[DPSpend]:
        if trace not in self._trace_ids:
            self._trace_ids[trace] = max(self._traces, default=-1) + 1
        return self._traces.setdefault(self._trace_ids[trace], [])

    @staticmethod
    def _total(spends: Sequence[DPSpend]) -> Decimal:
        return sum((exact(s.epsilon) for s in spends), Decimal(0))

    def spend(self, name: str, epsilon: float, event: dp_accounting.DpEvent,
              trace: Any) -> DPSpend:
        """Charges one analyzer's ε to the budget of ``trace`` (the graph being traced).

        Args:
          name: analyzer name; made unique within the trace by a ``_<n>`` suffix.
          epsilon: ε the analyzer's release is DP for.
          event: its dp_accounting DpEvent.
          trace: the object identifying the trace, normally ``tf.compat.v1.get_default_graph()``.

        Returns:
          The recorded spend.

        Raises:
          InvalidPrivacyParameterError: bad ε.
          DPBudgetExceededError: the trace's spends plus ``epsilon`` exceed the grant.
        """
        epsilon = check_epsilon(epsilon)
        spends = self._trace(trace)
        spent = self._total(spends)
        if spent + exact(epsilon) > exact(self.epsilon):
            remaining = exact(self.epsilon) - spent
            raise DPBudgetExceededError(
                f"DP analyzer {name!r} requests epsilon={epsilon!r} but only {remaining} of the "
                f"preprocessing_fn's epsilon={self.epsilon!r} remains (spent {spent}); over by "
                f"{spent + exact(epsilon) - exact(self.epsilon)}. Split the grant with "
                f"sage_tfx.dp.mechanisms.split_budget.")
        taken = {s.name for s in spends}
        unique = name
        for n in itertools.count(1):
            if unique not in taken:
                break
            unique = f"{name}_{n}"
        record = DPSpend(unique, epsilon, event)
        spends.append(record)
        return record

    def trace_spends(self, trace: Any) -> tuple[DPSpend, ...]:
        """The spends recorded so far in ``trace`` (the graph being traced), in order."""
        return tuple(self._trace(trace))

    def check_fully_spent(self, trace: Any = None) -> None:
        """Raises unless every trace (or just ``trace``) spent the whole grant.

        Raises:
          InvalidPrivacyParameterError: some trace spent less than the grant.
        """
        traces = [self._trace(trace)] if trace is not None else list(self._traces.values())
        for spends in traces:
            spent = float(self._total(spends))
            if spent < self.epsilon * (1.0 - _FULL_SPEND_RELATIVE_TOLERANCE):
                raise InvalidPrivacyParameterError(
                    f"the preprocessing_fn spent epsilon={spent!r} of its grant "
                    f"epsilon={self.epsilon!r} ({[s.name for s in spends]}); spend the whole grant "
                    f"or pass require_full_spend=False")

    @property
    def spends(self) -> tuple[DPSpend, ...]:
        """The spends of the run: those of its traces, which must all agree.

        Raises:
          InvalidPrivacyParameterError: two traces spent differently (a non-deterministic
            preprocessing_fn cannot be accounted).
        """
        distinct: list[tuple[DPSpend, ...]] = []
        for spends in self._traces.values():
            if tuple(spends) not in distinct:
                distinct.append(tuple(spends))
        if len(distinct) > 1:
            raise InvalidPrivacyParameterError(
                f"the preprocessing_fn spent differently in different traces: {distinct}")
        return distinct[0] if distinct else ()

    @property
    def spent(self) -> float:
        """Total ε of :attr:`spends` (basic composition)."""
        return float(self._total(self.spends))

    @property
    def remaining(self) -> float:
        """Grant minus :attr:`spent`."""
        return float(exact(self.epsilon) - self._total(self.spends))

    def dp_event(self) -> dp_accounting.DpEvent:
        """The composition of all spends' events (``NoOpDpEvent`` if nothing was spent)."""
        events = [s.event for s in self.spends]
        if not events:
            return dp_accounting.NoOpDpEvent()
        return dp_accounting.ComposedDpEvent(events)


_ACTIVE_BUDGET: contextvars.ContextVar[Optional[DPBudget]] = contextvars.ContextVar(
    "sage_tfx_active_dp_budget", default=None)


@contextlib.contextmanager
def _activate(budget: DPBudget) -> Iterator[DPBudget]:
    active = _ACTIVE_BUDGET.get()
    if active is not None and active is not budget:
        raise InvalidPrivacyParameterError(
            "a DP budget is already active: nest neither dp_budget nor DPPreprocessingFn")
    token = _ACTIVE_BUDGET.set(budget)
    try:
        yield budget
    finally:
        _ACTIVE_BUDGET.reset(token)


def active_budget() -> DPBudget:
    """The budget DP analyzers charge now.

    Raises:
      MissingGrantError: no ``dp_budget`` / ``DPPreprocessingFn`` is active.
    """
    budget = _ACTIVE_BUDGET.get()
    if budget is None:
        raise MissingGrantError(
            "DP analyzers must run under a budget: wrap the preprocessing_fn in "
            "DPPreprocessingFn(fn, epsilon=...) or build the Transform inside dp_budget(epsilon)")
    return budget


@contextlib.contextmanager
def dp_budget(epsilon: float, *, require_full_spend: bool = True) -> Iterator[DPBudget]:
    """Runs the enclosed code under a fresh :class:`DPBudget` (this thread only; see module doc).

    For a Transform run prefer :class:`DPPreprocessingFn`, whose budget travels with the
    pickled ``preprocessing_fn`` to wherever tf.Transform traces it. On a normal exit, checks that
    all traces spent the same and, if ``require_full_spend``, that each spent the whole grant.

    Args:
      epsilon: ε granted to the run.
      require_full_spend: see :class:`DPBudget`.

    Yields:
      The budget; read ``budget.spends`` / ``budget.dp_event()`` after the block.

    Raises:
      InvalidPrivacyParameterError: bad ε, a nested budget, inconsistent traces or an
        under-spend (with ``require_full_spend``).
    """
    budget = DPBudget(epsilon, require_full_spend=require_full_spend)
    with _activate(budget):
        yield budget
    _ = budget.spends  # raises on inconsistent traces
    if require_full_spend:
        budget.check_fully_spent()


class DPPreprocessingFn:
    """A ``preprocessing_fn`` whose every trace runs under one :class:`DPBudget` of ``epsilon``.

    Sage's module files define ``preprocessing_fn(inputs, epsilon)`` (List. 1); adapt them with
    ``DPPreprocessingFn(functools.partial(fn, epsilon=e), epsilon=e)``. After the run,
    ``.budget.spends`` / ``.budget.dp_event()`` say what it spent. One instance per analysis run.
    """

    def __init__(self, preprocessing_fn: Callable[[Mapping[str, Any]], Mapping[str, Any]],
                 epsilon: float, *, require_full_spend: bool = True) -> None:
        """Wraps ``preprocessing_fn``.

        Args:
          preprocessing_fn: the user's function of the Transform inputs.
          epsilon: ε granted to one analysis run.
          require_full_spend: see :class:`DPBudget`.

        Raises:
          InvalidPrivacyParameterError: bad ε.
        """
        self.preprocessing_fn = preprocessing_fn
        self.budget = DPBudget(epsilon, require_full_spend=require_full_spend)

    def __call__(self, inputs: Mapping[str, Any]) -> Mapping[str, Any]:
        with _activate(self.budget):
            outputs = self.preprocessing_fn(inputs)
        if self.budget.require_full_spend:
            self.budget.check_fully_spent(trace=tf.compat.v1.get_default_graph())
        return outputs
