"""The Draw-and-Discard service logic, independent of HTTP: one served run's draws and updates.

The run's k instances, passes and tickets live in the ledger's database
(:class:`~sage_tfx.dnd.runstore.RunStore`); each process keeps a mirror of the instances
(a :class:`~sage_tfx.dnd.state.DnDState`, refreshed by instance version before every draw and
spam check), so any number of processes serve one run and a restart resumes it.

Callers are authenticated principals (the HTTP layer checks their bearer tokens): a client's
passes are keyed by its principal's name, never by an id it declares. A draw is admitted only if
the run is granted, the client's blocks are in the grant and not stopped, and the client has a
pass left that no unexpired draw holds; it returns a random ticket and a copy of a uniformly
drawn instance. An update comes back with its ticket, from the principal that drew it, and
learns only whether it was accepted. No response, log line or counter says which instance was
drawn or replaced.

**Release once.** :meth:`DnDService.release` closes the run (no more draws or updates) and
records the average of its final instances against the grant (``dnd/average``, the float64
bytes) before anyone sees it; every later call, in any process, returns that record byte for
byte.

**Bounded influence.** Before the spam check, a returned update's step from the instance its
ticket drew must be within the norm bound of the run's unit (:class:`~sage_tfx.dnd.spam.NormBound`:
L2 for the gaussian unit, L1 for the Laplace units; honest updates exceed it with probability
≤ 10⁻⁶). An update beyond it raises :class:`UpdateOutOfBoundsError` and changes nothing: no pass
is counted, no instance is overwritten, the ticket stays outstanding (usable until it expires).
With a :class:`~sage_tfx.dnd.runstore.RateLimit` a principal draws at most ``draws`` updates per
window, counted in the database (every server process on it shares the count).
"""
from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Callable, Optional, Sequence

import numpy as np

from sage_tfx.dnd.budget import RunBudget, UpdateRefused
from sage_tfx.dnd.client import ClientConfig
from sage_tfx.dnd.glm import GLMSpec
from sage_tfx.dnd.runstore import (RateLimit, RateLimitedError, RunReleasedError, RunStore,
                                   UnknownTicketError, check_ticket_ttl, decode, encode)
from sage_tfx.dnd.spam import NormBound, SpamCheck
from sage_tfx.dnd.state import DnDState, initial_instances
from sage_tfx.errors import InvalidRequestError, MissingGrantError
from sage_tfx.ledger import accounting

__all__ = ["DnDService", "UnknownTicketError", "UpdateRefused", "RunReleasedError",
           "RateLimit", "RateLimitedError", "UpdateOutOfBoundsError", "RELEASE_NAME",
           "DEFAULT_TICKET_TTL"]

RELEASE_NAME = "dnd/average"
RECENT_BYTES = 64 * 2 ** 20  # memory for overwritten instances kept for the norm bound
DEFAULT_TICKET_TTL = 300.0  # seconds a draw may stay out before its pass is free again


class UpdateOutOfBoundsError(InvalidRequestError):
    """A returned update moves further from its drawn instance than an honest one can (HTTP 422;
    nothing changed, the ticket stays outstanding)."""


@dataclasses.dataclass(frozen=True)
class Average:
    """The prediction model: the mean of the k instances, and whether it is the run's recorded
    release (``final``) or the live average of a run still taking updates."""

    weights: np.ndarray
    final: bool
    version: int


class DnDService:
    """Draw / discard / average of one served run, under the run's budget.

    Build it with :meth:`open` (a granted run) or :meth:`denied` (the ledger's denial).

    Args:
      spec, config: the model and the clients' Alg. 1 parameters (published by ``/v1/spec``).
      budget: the granted run's budget (its blocks and stopped blocks), or None when the ledger
        denied the run (then ``refusal`` says why and every draw is refused).
      store: the run's tables (None for a denied run).
      k, passes: instances, and updates each client may send.
      spam_check: the calibrated check of returned models (None: every update is accepted).
      ticket_ttl: seconds before an unreturned draw expires and frees its pass.
      block_of: maps a principal's name to its block ids (e.g. a hash-bucket scheme's); if None
        the client names its blocks.
      ledger: opens the server's ledger connection (records and reads the release).
      norm_bound: the per-update norm bound checked before the spam check (None: not checked).
      rate: the per-principal rate limit of draws (None: none).
    """

    def __init__(self, spec: GLMSpec, config: ClientConfig, budget: Optional[RunBudget], *,
                 store: Optional[RunStore], k: int, passes: int, refusal: str = "",
                 spam_check: Optional[SpamCheck] = None,
                 ticket_ttl: float = DEFAULT_TICKET_TTL, block_of=None,
                 ledger: Optional[Callable] = None, norm_bound: Optional[NormBound] = None,
                 rate: Optional[RateLimit] = None):
        if budget is None and not refusal:
            raise ValueError("a service without a grant needs the reason (the ledger's denial)")
        if budget is not None and store is None:
            raise ValueError("a granted run needs its store")
        check_ticket_ttl(ticket_ttl)
        self.spec, self.config, self.budget, self.store = spec, config, budget, store
        self.k, self.passes, self.refusal = k, passes, refusal
        self.spam_check = spam_check
        self.ticket_ttl = float(ticket_ttl)
        self.block_of = block_of
        self.ledger = ledger
        self.norm_bound = norm_bound
        self.rate = rate
        self._out_of_bounds = 0
        self._lock = threading.Lock()  # the mirror and its versions
        self._refused = 0
        self._released: Optional[bytes] = None
        self._mirror: Optional[DnDState] = None
        self._versions: dict[int, int] = {}
        self._synced = -1  # the run version the mirror is known to be at (-1: sync from scratch)
        # Overwritten instances by (slot, version), newest last, for the norm bound of tickets
        # that drew them (a version's weights never change; the database keeps them too).
        self._recent: collections.OrderedDict = collections.OrderedDict()
        if store is not None:
            rows = store.instances(self.grant_id, spec.dim)
            if len(rows) != k:
                raise ValueError(f"the run has {len(rows)} instances, expected {k}")
            self._mirror = DnDState(np.stack([w for _, _, w in rows]))
            self._versions = {s: v for s, v, _ in rows}
            if spam_check is not None and spam_check.background:
                # The thresholds exist before the first update; later ones are recalibrated in
                # the background (SpamCheck), never on a request's path.
                spam_check.prime(self._mirror, in_flight=max(store.outstanding(self.grant_id), 0))

    @classmethod
    def open(cls, store: RunStore, budget: RunBudget, spec: GLMSpec, config: ClientConfig, *,
             k: int, spam_check: bool = True, b0: Optional[np.ndarray] = None,
             norm_bound: bool = True, **kwargs) -> "DnDService":
        """The service of a granted run: resumes the run's stored state, or creates it with
        k instances drawn from N(b⁰, (k/2)σ²) (Theorem 1's spread). ``norm_bound``: check
        every update against :meth:`NormBound.for_config` of the run's unit."""
        grant = budget.grant
        b0 = np.zeros(spec.dim) if b0 is None else np.asarray(b0, dtype=np.float64)
        settings = {"model": spec.to_dict(), "client": config.to_dict(),
                    "strategy": "draw_discard", "spam_check": bool(spam_check and k >= 2)}
        store.open_run(grant_id=grant.grant_id, stream=grant.stream, run_id=grant.run_id,
                       settings=settings, k=k, dim=spec.dim, passes=budget.passes,
                       initial=lambda: initial_instances(b0, k, config.noise_variance))
        check = (SpamCheck.for_config(config, background=True, process=True)
                 if settings["spam_check"] else None)
        bound = NormBound.for_config(config, spec.dim) if norm_bound else None
        return cls(spec, config, budget, store=store, k=k, passes=budget.passes,
                   spam_check=check, norm_bound=bound, **kwargs)

    @classmethod
    def denied(cls, spec: GLMSpec, config: ClientConfig, reason: str, *, k: int,
               passes: int) -> "DnDService":
        """The service of a run the ledger denied: it refuses every draw with ``reason``."""
        return cls(spec, config, None, store=None, k=k, passes=passes, refusal=reason)

    @property
    def grant_id(self) -> Optional[str]:
        """The id of the grant the run is charged under, or None for a denied service."""
        return self.budget.grant.grant_id if self.budget is not None else None

    def spec_dict(self) -> dict:
        """What ``GET /spec`` returns: the model, client configuration, k, passes and noise."""
        out = {"model": self.spec.to_dict(), "client": self.config.to_dict(),
               "dim": self.spec.dim, "k": self.k, "passes": self.passes,
               "ticket_ttl": self.ticket_ttl, "granted": self.budget is not None}
        if self.config.private:
            # what the samplers add per weight: the Gaussian's σ is the sampler's (m against the
            # rounded sensitivity, ≤ 1.6 % above m·Δ₂); the Laplace units state b and the std
            std = self.config.sampler_std(self.spec.dim)
            out["noise_scale"] = std if self.config.gaussian else self.config.noise_scale
            out["noise_std"] = std
            out["update_epsilon"] = self.config.update_epsilon(self.spec.dim)
            out["update_delta"] = self.config.update_delta(self.spec.dim)
            out["update_event"] = accounting.event_to_dict(self.config.update_event(self.spec.dim))
        if self.budget is not None:
            out["run_id"] = self.budget.grant.run_id
        return out

    def _blocks(self, principal: str, blocks: Optional[Sequence[str]]) -> list[str]:
        if self.block_of is not None:
            return list(self.block_of(principal))
        return list(blocks or [])

    def _refuse(self):
        with self._lock:
            self._refused += 1

    def draw(self, principal: str,
             blocks: Optional[Sequence[str]] = None) -> tuple[str, np.ndarray]:
        """Admits one update of ``principal`` and hands out (ticket, drawn instance).

        Raises:
          UpdateRefused: no grant, block not granted or stopped, or no pass left.
          RunReleasedError: the run's model was released.
        """
        if not principal:
            raise UpdateRefused("a draw needs an authenticated principal")
        try:
            if self.budget is None:
                raise UpdateRefused(f"no grant for this run: {self.refusal}")
            mine = self._blocks(principal, blocks)
            self.budget.check_blocks(principal, mine)
            # The ticket records what it drew (with or without this process's norm bound, so
            # every process on the run can check the update's step).
            self._sync()
            with self._lock:
                slot, vector = self._mirror.draw_slot()
                drawn = (slot, self._versions[slot], vector)
            ticket = self.store.issue_ticket(self.grant_id, principal, mine, passes=self.passes,
                                             ttl=self.ticket_ttl, drawn=drawn, rate=self.rate)
        except UpdateRefused:
            self._refuse()
            raise
        return ticket, vector

    def discard(self, principal: str, ticket: str, update: np.ndarray) -> bool:
        """Returns one update; True if the spam check accepted it into the instances.

        Raises:
          UnknownTicketError: unknown, used or expired ticket, or another principal's.
          UpdateRefused: the client's block was stopped since its draw (nothing changed).
          UpdateOutOfBoundsError: the update's step is beyond the norm bound (nothing changed;
            the ticket stays outstanding).
          RunReleasedError: the run's model was released (nothing changed).
          ValueError: wrong length or non-finite weights (nothing changed; the ticket stays
            usable).
        """
        u = np.asarray(update, dtype=np.float64)
        if u.shape != (self.spec.dim,) or not np.all(np.isfinite(u)):
            raise ValueError(f"an update must be {self.spec.dim} finite float64 weights")
        if self.budget is None:
            raise UnknownTicketError(ticket)
        # Cheap checks first: the spam check's work is spent only on a live ticket.
        self.budget.check_blocks(principal, self.store.ticket_blocks(self.grant_id, principal,
                                                                     ticket))
        if self.norm_bound is not None:
            self._check_bound(principal, ticket, u)
        accepted = True
        if self.spam_check is not None:
            self._sync()
            # Stale draws widen the honest null; only unexpired tickets count.
            accepted = bool(self.spam_check.check(self._mirror, u, in_flight=self.in_flight()))
        placed = self.store.return_update(self.grant_id, principal, ticket, u,
                                          accepted=accepted, passes=self.passes)
        if placed is not None:
            self._mirror_put(*placed, u)
        return accepted

    def in_flight(self) -> int:
        """Draws of other clients whose update may still come back: the run's unexpired tickets
        but the one being returned (an abandoned draw stops counting when its ticket expires)."""
        return max(self.store.outstanding(self.grant_id) - 1, 0) if self.store is not None else 0

    def _check_bound(self, principal: str, ticket: str, u: np.ndarray) -> None:
        base = self.store.drawn_instance(self.grant_id, principal, ticket, self.spec.dim,
                                         known=self._known)
        if base is None:
            reason = ("the ticket has no recorded draw (issued by an older server): draw again "
                      "once it expires")
        else:
            reason = self.norm_bound.violation(base, u)
        if reason is not None:
            with self._lock:
                self._out_of_bounds += 1
            raise UpdateOutOfBoundsError(reason)

    def _known(self, slot: int, version: int) -> Optional[np.ndarray]:
        """Instance ``slot`` at ``version`` from memory (the mirror or a recently overwritten
        one), or None."""
        with self._lock:
            if self._versions.get(slot) == version:
                return self._mirror.slot_vector(slot)
            return self._recent.get((slot, version))

    def _mirror_put(self, slot: int, version: int, weights: np.ndarray) -> None:
        with self._lock:
            old = self._versions.get(slot, -1)
            if version > old:
                if old >= 0:
                    self._recent[(slot, old)] = self._mirror.slot_vector(slot)
                    while len(self._recent) * 8 * self.spec.dim > RECENT_BYTES:
                        self._recent.popitem(last=False)
                self._mirror.replace(slot, weights)
                self._versions[slot] = version
                if version == self._synced + 1:  # no other write came between
                    self._synced = version

    def _sync(self) -> None:
        """Brings the mirror up to the stored instances (only slots whose version moved; nothing
        but the run's version is read while no other process wrote)."""
        run_version = self.store.version(self.grant_id)
        with self._lock:
            if run_version == self._synced:
                return
        current = self.store.instance_versions(self.grant_id)
        with self._lock:
            stale = [s for s, v in current.items() if v > self._versions.get(s, -1)]
        for slot, version, w in self.store.instances(self.grant_id, self.spec.dim, stale):
            self._mirror_put(slot, version, w)
        with self._lock:  # the instances read are at least at run_version
            self._synced = max(self._synced, run_version)

    def average(self) -> Average:
        """The recorded release if the run was released, else the live average."""
        if self.budget is None:
            raise RunReleasedError(f"no grant for this run: {self.refusal}")
        recorded = self._recorded()
        if recorded is not None:
            return Average(decode(recorded, self.spec.dim), True,
                           self.store.run(self.grant_id).version)
        self._sync()
        return Average(self._mirror.average(), False, self.store.run(self.grant_id).version)

    def _recorded(self) -> Optional[bytes]:
        if self._released is None and self.store.run(self.grant_id).released_at is not None \
                and self.ledger is not None:
            from sage_tfx.ledger.releases import digest_bytes
            with self.ledger() as led:
                rec = led.recorded_release(self.grant_id, RELEASE_NAME)
            if rec is not None:
                if rec.value is None or digest_bytes(rec.value) != rec.digest:
                    raise MissingGrantError(f"the recorded release {RELEASE_NAME!r} of grant "
                                            f"{self.grant_id} does not match its digest")
                self._released = rec.value
        return self._released

    def release(self) -> Average:
        """Closes the run and records the average of its final instances against the grant
        (once: a replay, here or in another process, returns the recorded bytes).

        Raises:
          RunReleasedError: the run was denied.
          ReleaseConflictError / PermissionDeniedError: from the ledger.
        """
        from sage_tfx.ledger.releases import release_value_once
        if self.budget is None or self.ledger is None:
            raise RunReleasedError(f"no grant for this run: {self.refusal}" if self.budget is None
                                   else "this service has no ledger to record its release in")
        self.store.close_run(self.grant_id)  # no update lands after this

        def produce() -> bytes:
            rows = self.store.instances(self.grant_id, self.spec.dim)
            return encode(np.stack([w for _, _, w in rows]).mean(axis=0))
        with self.ledger() as led:
            outcome = release_value_once(led, self.grant_id, RELEASE_NAME, produce)
        self._released = outcome.value
        return Average(decode(outcome.value, self.spec.dim), True,
                       self.store.run(self.grant_id).version)

    def refresh(self, ledger) -> list[str]:
        """Stops the clients of blocks retired since the grant (see :meth:`RunBudget.refresh`)."""
        return self.budget.refresh(ledger) if self.budget is not None else []

    def sweep(self) -> int:
        """Deletes the run's expired tickets."""
        return self.store.sweep(self.grant_id) if self.store is not None else 0

    def stats(self) -> dict:
        """Counters of the run (all processes), this process's refusals, its group-commit
        transactions of draws and updates and its spam-check rejections by statistic."""
        with self._lock:
            refused, out_of_bounds = self._refused, self._out_of_bounds
        out = {"draws": 0, "updates": 0, "accepted": 0, "rejected_spam": 0, "refused": refused,
               "out_of_bounds": out_of_bounds,
               "outstanding_tickets": 0, "version": 0, "released": False, "commits": 0}
        if self.store is None:
            return out
        out["commits"] = self.store.commits  # this process's draw/update transactions
        if self.spam_check is not None:
            out["rejected_by"] = self.spam_check.failure_counts()
        run = self.store.run(self.grant_id)
        passes = self.store.passes(self.grant_id).values()
        out.update(draws=sum(d for _, d in passes), updates=sum(u for u, _ in passes),
                   accepted=run.accepted, rejected_spam=run.rejected,
                   outstanding_tickets=self.store.outstanding(self.grant_id),
                   version=run.version, released=run.released_at is not None)
        return out
