"""The ε budget of one DP Transform analysis run: what the DP analyzers may spend and did spend.

Every analyzer of :mod:`sage_tfx.components.dp_transform.analyzers` charges its ε to the active
:class:`DPBudget` and raises :class:`DPBudgetExceededError` before building anything if the charge
does not fit. :class:`DPPreprocessingFn` carries a budget with the user's ``preprocessing_fn``
wherever tf.Transform pickles and traces it; ``with dp_budget(epsilon):`` activates one for the
enclosed code only. Spends are accounted per trace graph (see the analyzers' module docstring).

A budget holds ε and δ. The Laplace analyzers spend ε only; DP partition selection (the DP
vocabularies) spends ε and δ, so a plan part that pays for one has a δ, which the analyzers must
spend exactly too (an unspent δ was charged for nothing).

**Shares.** An analyzer is given its ε explicitly (``epsilon=0.1``, as before), or called with
``epsilon=None`` (the drop-ins of ``sage_tfx.components.dp_transform.tft``) and an optional
``weight``: it then takes a share of what the explicit ones leave, in proportion to its weight,
and the analyzers that need δ share δ the same way. The shares are fixed before the run by a
planning trace (:class:`Allocation`, computed by ``tracing.plan_shares``), which counts the
requests; the budget of the run hands every request its share by position in the trace, so every
trace of one run sees the same shares. A request with no allocation fails (no guessed ε).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
import math
import weakref
from decimal import Decimal
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import dp_accounting
import tensorflow as tf

from sage_tfx.dp import mechanisms
from sage_tfx.errors import InvalidPrivacyParameterError, MissingGrantError
from sage_tfx.ledger.accounting import check_delta, check_epsilon, check_positive, exact

# Under-spending is safe, so "fully spent" tolerates float rounding of a user's split; over-
# spending is never tolerated (exact decimal comparison, as the ledger does).
_FULL_SPEND_RELATIVE_TOLERANCE = 1e-9


class DPBudgetExceededError(InvalidPrivacyParameterError):
    """DP analyzers asked for more ε (or δ) than the preprocessing_fn was granted."""


@dataclasses.dataclass(frozen=True)
class DPSpend:
    """One DP analyzer's charge: its name in the trace, its ε, its dp_accounting event and its δ
    (0 for the Laplace analyzers)."""

    name: str
    epsilon: float
    event: dp_accounting.DpEvent
    delta: float = 0.0


@dataclasses.dataclass(frozen=True)
class ShareRequest:
    """An analyzer called without an explicit ε: its name, weight and whether it spends δ."""

    name: str
    weight: float
    needs_delta: bool


@dataclasses.dataclass(frozen=True)
class Allocation:
    """The (ε, δ) of every share request of a trace, in trace order (``tracing.plan_shares``).

    Attributes:
      requests: the requests the planning trace made.
      shares: ``(epsilon, delta)`` per request; their sum plus the explicit spends is at most the
        budget, in exact decimals (the last share takes the remainder, as ``split_budget``).
    """

    requests: tuple[ShareRequest, ...]
    shares: tuple[tuple[float, float], ...]


def _float_at_most(value: Decimal) -> float:
    out = float(value)
    while out > 0 and exact(out) > value:
        out = math.nextafter(out, 0.0)
    return out


def allocate(requests: Sequence[ShareRequest], epsilon: float, delta: float,
             spent_epsilon: Decimal, spent_delta: Decimal) -> Allocation:
    """Splits what the explicit spends leave of (ε, δ) among ``requests`` by weight; δ only
    among those that need it.

    Raises:
      DPBudgetExceededError: the explicit spends leave no ε for the requests, or no δ for the
        ones that need it.
    """
    if not requests:
        return Allocation((), ())
    left_eps = exact(epsilon) - spent_epsilon
    left_delta = exact(delta) - spent_delta
    names = [r.name for r in requests]
    if left_eps <= 0:
        raise DPBudgetExceededError(
            f"DP analyzers {names} take a share of epsilon, but the analyzers with an explicit "
            f"epsilon spend all of epsilon={epsilon!r} (spent {spent_epsilon})")
    eps_shares = [s.epsilon for s in mechanisms.split_budget(
        _float_at_most(left_eps), 0.0, [r.weight for r in requests])]
    delta_users = [i for i, r in enumerate(requests) if r.needs_delta]
    delta_shares = [0.0] * len(requests)
    if delta_users:
        if left_delta <= 0:
            raise DPBudgetExceededError(
                f"DP analyzer(s) {[names[i] for i in delta_users]} (DP partition selection) "
                f"spend delta, but the budget has delta={delta!r} (spent {spent_delta}): give "
                "the plan's transform part a delta, e.g. PlanPart('transform', epsilon, 1e-6)")
        split = mechanisms.split_budget(1.0, _float_at_most(left_delta),
                                        [requests[i].weight for i in delta_users])
        for i, share in zip(delta_users, split):
            delta_shares[i] = share.delta
    return Allocation(tuple(requests), tuple(zip(eps_shares, delta_shares)))


class DPBudget:
    """The ε granted to one Transform analysis run and what its DP analyzers spent.

    Spends are recorded per trace (tf.Transform traces the preprocessing_fn in several graphs);
    every trace must fit the grant, and all traces must spend the same.
    """

    def __init__(self, epsilon: float, *, delta: float = 0.0, require_full_spend: bool = True,
                 allocation: Optional[Allocation] = None, planning: bool = False) -> None:
        """Creates an empty budget.

        Args:
          epsilon: the ε the run may spend (e.g. the ledger grant's epsilon), finite and > 0.
          delta: the δ it may spend (DP partition selection), in [0, 1).
          require_full_spend: if True, :meth:`check_fully_spent` (called at the end of
            ``dp_budget`` and of each ``DPPreprocessingFn`` call) fails on an under-spend too:
            an unspent share usually means an analyzer was forgotten.
          allocation: the shares of the analyzers called without an explicit ε.
          planning: a planning trace (``tracing.plan_shares``): share requests are recorded
            and get the whole (ε, δ) as a provisional share (valid parameters for any analyzer;
            the over-spend check counts the explicit spends only); nothing is checked for a
            full spend.

        Raises:
          InvalidPrivacyParameterError: bad ε or δ.
        """
        self.epsilon = check_epsilon(epsilon)
        self.delta = check_delta(delta)
        self.require_full_spend = require_full_spend and not planning
        self.allocation = allocation
        self.planning = planning
        # Trace graphs are only weakly referenced (and not pickled): their spends outlive them.
        self._trace_ids: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
        self._traces: dict[int, list[DPSpend]] = {}
        self._requests: dict[int, list[ShareRequest]] = {}
        # planning: names whose spend is a provisional share (requested, not yet spent / spent)
        self._pending: dict[int, list[str]] = {}
        self._provisional: dict[int, set] = {}

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

    @staticmethod
    def _total_delta(spends: Sequence[DPSpend]) -> Decimal:
        return sum((exact(s.delta) for s in spends), Decimal(0))

    def share(self, name: str, weight: float, needs_delta: bool, trace: Any
              ) -> tuple[float, float]:
        """The (ε, δ) of an analyzer called without an explicit ε (see module doc).

        Raises:
          InvalidPrivacyParameterError: a bad weight; a request the allocation does not hold (a
            preprocessing_fn that traces differently from its planning trace).
          DPBudgetExceededError: (planning) δ is needed but the budget has none.
          MissingGrantError: no allocation (the budget was not planned).
        """
        weight = check_positive(weight, f"{name} weight")
        self._trace(trace)
        requests = self._requests.setdefault(self._trace_ids[trace], [])
        request = ShareRequest(name, weight, bool(needs_delta))
        index = len(requests)
        requests.append(request)
        if self.planning:
            if needs_delta and not self.delta > 0:
                raise DPBudgetExceededError(
                    f"DP analyzer {name!r} (DP partition selection) spends delta, but the "
                    "preprocessing_fn's budget has delta=0: give the plan's transform part a "
                    "delta, e.g. PlanPart('transform', epsilon, 1e-6) (basic mode only: "
                    "partition selection has no RDP curve)")
            # provisional shares: this trace only counts the requests; the analyzer's spend (next,
            # under the same name) is not checked against the budget
            self._pending.setdefault(self._trace_ids[trace], []).append(name)
            return self.epsilon, (self.delta if needs_delta else 0.0)
        if self.allocation is None:
            raise MissingGrantError(
                f"DP analyzer {name!r} has no explicit epsilon and the budget no allocation of "
                "shares: run the preprocessing_fn in DPTransform (or plan it with "
                "sage_tfx.components.dp_transform.tracing.plan_shares), or give epsilon=...")
        if index >= len(self.allocation.requests) or self.allocation.requests[index] != request:
            raise InvalidPrivacyParameterError(
                f"DP analyzer {name!r} is share request #{index} of this trace, but the planning "
                f"trace made {list(self.allocation.requests)}: the preprocessing_fn must trace "
                "the same way every time")
        return self.allocation.shares[index]

    def spend(self, name: str, epsilon: float, event: dp_accounting.DpEvent,
              trace: Any, *, delta: float = 0.0) -> DPSpend:
        """Charges one analyzer's ε to the budget of ``trace`` (the graph being traced).

        Args:
          name: analyzer name; made unique within the trace by a ``_<n>`` suffix.
          epsilon: ε the analyzer's release is DP for.
          event: its dp_accounting DpEvent.
          trace: the object identifying the trace, normally ``tf.compat.v1.get_default_graph()``.
          delta: δ the release spends (DP partition selection), default 0.

        Returns:
          The recorded spend.

        Raises:
          InvalidPrivacyParameterError: bad ε or δ.
          DPBudgetExceededError: the trace's spends plus ``epsilon`` (or ``delta``) exceed the
            grant.
        """
        epsilon = check_epsilon(epsilon)
        delta = check_delta(delta)
        spends = self._trace(trace)
        trace_id = self._trace_ids[trace]
        pending = self._pending.get(trace_id, [])
        provisional = self.planning and name in pending
        if provisional:
            pending.remove(name)
        explicit = self.explicit_spends(trace)
        spent_delta = self._total_delta(explicit)
        if not provisional and spent_delta + exact(delta) > exact(self.delta):
            hint = "" if self.delta else (": give the plan's transform part a delta (DP "
                                          "partition selection spends delta)")
            raise DPBudgetExceededError(
                f"DP analyzer {name!r} requests delta={delta!r} but only "
                f"{exact(self.delta) - spent_delta} of the preprocessing_fn's "
                f"delta={self.delta!r} remains{hint}")
        spent = self._total(explicit)
        if not provisional and spent + exact(epsilon) > exact(self.epsilon):
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
        record = DPSpend(unique, epsilon, event, delta)
        spends.append(record)
        if provisional:
            self._provisional.setdefault(trace_id, set()).add(unique)
        return record

    def explicit_spends(self, trace: Any = None) -> tuple[DPSpend, ...]:
        """The spends of ``trace`` (default: of every trace, which must agree) that are not
        provisional shares of a planning trace."""
        if trace is not None:
            ids = [self._trace_ids[trace]] if trace in self._trace_ids else []
        else:
            ids = list(self._traces)
        distinct: list[tuple[DPSpend, ...]] = []
        for i in ids:
            spends = tuple(s for s in self._traces.get(i, ())
                           if s.name not in self._provisional.get(i, set()))
            if spends not in distinct:
                distinct.append(spends)
        if len(distinct) > 1:
            raise InvalidPrivacyParameterError(
                f"the preprocessing_fn spent differently in different traces: {distinct}")
        return distinct[0] if distinct else ()

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
            spent_delta = float(self._total_delta(spends))
            if spent_delta < self.delta * (1.0 - _FULL_SPEND_RELATIVE_TOLERANCE):
                raise InvalidPrivacyParameterError(
                    f"the preprocessing_fn spent delta={spent_delta!r} of its grant "
                    f"delta={self.delta!r} ({[s.name for s in spends]}): only DP partition "
                    "selection (dp_vocabulary) spends delta; plan the transform part with the "
                    "delta its analyzers spend (delta=0 without a DP vocabulary)")

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
    def spent_delta(self) -> float:
        """Total δ of :attr:`spends`."""
        return float(self._total_delta(self.spends))

    @property
    def requests(self) -> tuple[ShareRequest, ...]:
        """The share requests of the run: those of its traces, which must all agree.

        Raises:
          InvalidPrivacyParameterError: two traces requested differently.
        """
        distinct = {tuple(r) for r in self._requests.values()}
        if len(distinct) > 1:
            raise InvalidPrivacyParameterError(
                f"the preprocessing_fn requested shares differently in different traces: "
                f"{distinct}")
        return distinct.pop() if distinct else ()

    def trace_requests(self, trace: Any) -> tuple[ShareRequest, ...]:
        """The share requests made so far in ``trace``, in order."""
        self._trace(trace)
        return tuple(self._requests.get(self._trace_ids[trace], ()))

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
def dp_budget(epsilon: float, *, delta: float = 0.0, require_full_spend: bool = True,
              allocation: Optional[Allocation] = None) -> Iterator[DPBudget]:
    """Runs the enclosed code under a fresh :class:`DPBudget` (this thread only; see module doc).

    For a Transform run prefer :class:`DPPreprocessingFn`, whose budget travels with the
    pickled ``preprocessing_fn`` to wherever tf.Transform traces it. On a normal exit, checks that
    all traces spent the same and, if ``require_full_spend``, that each spent the whole grant.

    Args:
      epsilon: ε granted to the run.
      delta: δ granted to the run (DP partition selection).
      require_full_spend: see :class:`DPBudget`.
      allocation: the shares of analyzers called without ε (:class:`DPBudget`).

    Yields:
      The budget; read ``budget.spends`` / ``budget.dp_event()`` after the block.

    Raises:
      InvalidPrivacyParameterError: bad ε, a nested budget, inconsistent traces or an
        under-spend (with ``require_full_spend``).
    """
    budget = DPBudget(epsilon, delta=delta, require_full_spend=require_full_spend,
                      allocation=allocation)
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
                 epsilon: float, *, delta: float = 0.0, require_full_spend: bool = True,
                 allocation: Optional[Allocation] = None, planning: bool = False) -> None:
        """Wraps ``preprocessing_fn``.

        Args:
          preprocessing_fn: the user's function of the Transform inputs.
          epsilon: ε granted to one analysis run.
          delta: δ granted to it (DP partition selection).
          require_full_spend, allocation, planning: see :class:`DPBudget`.

        Raises:
          InvalidPrivacyParameterError: bad ε or δ.
        """
        self.preprocessing_fn = preprocessing_fn
        self.budget = DPBudget(epsilon, delta=delta, require_full_spend=require_full_spend,
                               allocation=allocation, planning=planning)

    def __call__(self, inputs: Mapping[str, Any]) -> Mapping[str, Any]:
        with _activate(self.budget):
            outputs = self.preprocessing_fn(inputs)
        if self.budget.require_full_spend:
            self.budget.check_fully_spent(trace=tf.compat.v1.get_default_graph())
        return outputs
