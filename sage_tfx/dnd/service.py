"""The Draw-and-Discard service logic, independent of HTTP: tickets, budget, spam check, state.

One process holds the k instances (:class:`~sage_tfx.dnd.state.DnDState`). A draw is admitted
only through the run's :class:`~sage_tfx.dnd.budget.RunBudget` (no grant: every client is
refused); it returns a random ticket id and a copy of a uniformly drawn instance. A discard
returns the update with its ticket (each ticket is good for one update) and learns only whether
it was accepted. No response, log line or counter says which instance was drawn or replaced.
"""
from __future__ import annotations

import collections
import dataclasses
import secrets
import threading
from typing import Optional, Sequence

import numpy as np

from sage_tfx.dnd.budget import RunBudget, UpdateRefused
from sage_tfx.dnd.client import ClientConfig
from sage_tfx.dnd.glm import GLMSpec
from sage_tfx.dnd.state import DnDState


class UnknownTicketError(KeyError):
    """A discard with a ticket that was never issued, already used, or expired."""


@dataclasses.dataclass
class Counters:
    draws: int = 0
    accepted: int = 0
    rejected_spam: int = 0
    dropped: int = 0
    refused: int = 0


class DnDService:
    """Draw / discard / average over one state, under one run's budget.

    Args:
      spec, config: the model and the clients' Alg. 1 parameters (published by ``/v1/spec``).
      state: the k instances.
      budget: the granted run's budget, or None when the ledger denied the run (then
        ``refusal`` says why and every draw is refused).
      block_of: maps a client id to its block ids (e.g. a hash-bucket scheme's); if None the
        client names its blocks.
      max_tickets: outstanding draws kept; the oldest expire beyond it.
    """

    def __init__(self, spec: GLMSpec, config: ClientConfig, state: DnDState,
                 budget: Optional[RunBudget], *, refusal: str = "",
                 block_of=None, max_tickets: int = 100_000):
        if state.dim != spec.dim:
            raise ValueError(f"state has {state.dim} weights, the spec {spec.dim}")
        if budget is None and not refusal:
            raise ValueError("a service without a grant needs the reason (the ledger's denial)")
        self.spec = spec
        self.config = config
        self.state = state
        self.budget = budget
        self.refusal = refusal
        self.block_of = block_of
        self.max_tickets = max_tickets
        self._tickets: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()
        self.counters = Counters()

    def spec_dict(self) -> dict:
        out = {"model": self.spec.to_dict(), "client": self.config.to_dict(),
               "dim": self.spec.dim, "k": self.state.k}
        if self.config.private:
            out["noise_scale"] = self.config.noise_scale
            out["update_epsilon"] = self.config.update_epsilon(self.spec.dim)
        if self.budget is not None:
            out["run_id"] = self.budget.grant.run_id
            out["passes"] = self.budget.passes
        return out

    def _blocks(self, client_id: str, blocks: Optional[Sequence[str]]) -> list[str]:
        if self.block_of is not None:
            return list(self.block_of(client_id))
        return list(blocks or [])

    def draw(self, client_id: str, blocks: Optional[Sequence[str]] = None) -> tuple[str, np.ndarray]:
        """Admits one update of ``client_id`` and hands out (ticket id, drawn instance).

        Raises:
          UpdateRefused: no grant, block not granted or stopped, or no passes left.
        """
        if not client_id:
            raise UpdateRefused("a draw needs a client id")
        try:
            if self.budget is None:
                raise UpdateRefused(f"no grant for this run: {self.refusal}")
            self.budget.admit(client_id, self._blocks(client_id, blocks))
        except UpdateRefused:
            with self._lock:
                self.counters.refused += 1
            raise
        ticket, vector = self.state.draw()
        tid = secrets.token_hex(16)
        with self._lock:
            self._tickets[tid] = ticket
            while len(self._tickets) > self.max_tickets:
                self._tickets.popitem(last=False)
            self.counters.draws += 1
        return tid, vector

    def discard(self, ticket_id: str, update: np.ndarray) -> bool:
        """Returns one update; True if it was accepted into the instances.

        Raises:
          UnknownTicketError: unknown, used or expired ticket.
          ValueError: wrong length or non-finite weights (the ticket stays usable).
        """
        u = np.asarray(update, dtype=np.float64)
        if u.shape != (self.spec.dim,) or not np.all(np.isfinite(u)):
            raise ValueError(f"an update must be {self.spec.dim} finite float64 weights")
        with self._lock:
            ticket = self._tickets.pop(ticket_id, None)
            in_flight = len(self._tickets)
        if ticket is None:
            raise UnknownTicketError(ticket_id)
        if hasattr(self.state.spam_check, "in_flight"):
            self.state.spam_check.in_flight = in_flight  # stale draws widen the honest null
        before = (self.state.rejected, self.state.dropped)
        ok = self.state.discard(ticket, u)
        with self._lock:
            if ok:
                self.counters.accepted += 1
            elif self.state.rejected > before[0]:
                self.counters.rejected_spam += 1
            else:
                self.counters.dropped += 1
        return ok

    def average(self) -> np.ndarray:
        return self.state.average()

    def stats(self) -> dict:
        with self._lock:
            out = dataclasses.asdict(self.counters)
            out["outstanding_tickets"] = len(self._tickets)
        return out
