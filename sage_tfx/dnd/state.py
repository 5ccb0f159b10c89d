"""The server side of Draw-and-Discard (Alg. 2): k model instances, draw and discard.

A request draws one instance uniformly; the returned model overwrites an instance drawn uniformly
and *independently* of the draw (§III-C); prediction averages the k instances. The paper's
alternatives (§V-B, Figs. 3–4) are strategies of the same state:

* ``draw_discard`` — Alg. 2 (default);
* ``same_instance`` — the returned model overwrites the instance that was drawn;
* ``accept_1_over_k`` — a single model that accepts each returned model with probability 1/k;
* ``server_batch`` — a single model replaced by the mean of every ``batch_size`` returned models
  (server-side batching, N_s);

and ``average_on_replace`` averages the returned model with the instance it overwrites.

Slots hold immutable arrays: a replacement swaps one reference under a lock, a draw hands out a
copy, so no reader ever sees a half-written instance. Server coins come from the operating
system's CSPRNG (:class:`secrets.SystemRandom`); a seeded ``random.Random`` is injectable for
tests and experiments only. Which slot a draw or a discard used is never returned: a draw returns
an opaque :class:`Ticket` (it remembers its slot only for ``same_instance``, which needs it).
"""
from __future__ import annotations

import dataclasses
import random
import secrets
import threading
from typing import Callable, Optional

import numpy as np

STRATEGIES = ("draw_discard", "same_instance", "accept_1_over_k", "server_batch")


def stationary_variance(k: int, noise_variance: float) -> float:
    """Theorem 1: the expected spread (ddof = 1) of the k instances, (k/2)·σ²."""
    return k / 2.0 * noise_variance


def initial_instances(b0: np.ndarray, k: int, noise_variance: float,
                      rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """k instances drawn from N(b⁰, (k/2)σ²) per weight (§III-C a, Theorem 1's stationary spread).

    All-equal instances are Lemma 1's worst case for adversary II and make the spam check's
    standard deviations zero, so the spread is not optional: ``noise_variance`` must be > 0 (for a
    run without client noise, pass the σ² of ε = 1, as §V-A does).
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if not noise_variance > 0 or not np.isfinite(noise_variance):
        raise ValueError(f"noise_variance must be finite and > 0, got {noise_variance!r}")
    b0 = np.asarray(b0, dtype=np.float64)
    if b0.ndim != 1:
        raise ValueError("b0 must be a flat weight vector")
    if rng is None:  # spread only, not a privacy mechanism; seeded from the OS for independence
        rng = np.random.default_rng(secrets.randbits(128))
    sd = np.sqrt(stationary_variance(k, noise_variance))
    return b0[None, :] + rng.normal(0.0, sd, size=(k, b0.size))


@dataclasses.dataclass(eq=False)
class Ticket:
    """An outstanding draw. Opaque to clients; ``_slot`` is kept only for ``same_instance``."""

    _slot: Optional[int] = None


class DnDState:
    """k model instances under one of the strategies above. Thread-safe.

    Args:
      instances: (k, d) initial instances (see :func:`initial_instances`).
      strategy: one of :data:`STRATEGIES`.
      average_on_replace: average the returned model with the instance it overwrites.
      accept_k: k of ``accept_1_over_k`` (the state then holds one model).
      batch_size: N_s of ``server_batch`` (the state then holds one model).
      spam_check: ``f(state, update (d,)) -> bool`` (True = pass), e.g. a
        :class:`~sage_tfx.dnd.spam.SpamCheck`; rejected updates are dropped and counted.
      rng: server coins; ``secrets.SystemRandom()`` unless a seeded ``random.Random`` is injected
        by a test or experiment.
    """

    def __init__(self, instances: np.ndarray, *, strategy: str = "draw_discard",
                 average_on_replace: bool = False, accept_k: Optional[int] = None,
                 batch_size: Optional[int] = None,
                 spam_check: Optional[Callable[[np.ndarray, np.ndarray], bool]] = None,
                 rng: Optional[random.Random] = None):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        inst = np.array(instances, dtype=np.float64)
        if inst.ndim != 2 or inst.shape[0] < 1 or inst.shape[1] < 1:
            raise ValueError("instances must be a (k, d) array with k, d >= 1")
        if strategy == "accept_1_over_k":
            if not isinstance(accept_k, int) or accept_k < 1:
                raise ValueError("accept_1_over_k needs accept_k >= 1")
        if strategy == "server_batch":
            if not isinstance(batch_size, int) or batch_size < 1:
                raise ValueError("server_batch needs batch_size >= 1")
        if strategy in ("accept_1_over_k", "server_batch") and inst.shape[0] != 1:
            raise ValueError(f"{strategy} holds a single model: pass instances of shape (1, d)")
        self.strategy = strategy
        self.average_on_replace = bool(average_on_replace)
        self.accept_k = accept_k
        self.batch_size = batch_size
        self.spam_check = spam_check
        self._rng = rng if rng is not None else secrets.SystemRandom()
        self._slots = [row.copy() for row in inst]
        for s in self._slots:
            s.setflags(write=False)
        # Running Σ B and Σ B² over the slots: the spam check's μ and s in O(d) per update.
        self._sum = inst.sum(axis=0)
        self._sumsq = (inst ** 2).sum(axis=0)
        self._puts = 0
        self._batch: list[np.ndarray] = []
        self._lock = threading.Lock()
        self.accepted = 0
        self.rejected = 0  # by the spam check
        self.dropped = 0   # by the strategy (1/k accept)

    @property
    def k(self) -> int:
        """Number of model instances."""
        return len(self._slots)

    @property
    def dim(self) -> int:
        """Number of weights per instance."""
        return self._slots[0].size

    def draw(self) -> tuple[Ticket, np.ndarray]:
        """A uniformly drawn instance (a copy) and the ticket to return the update with."""
        slot, vector = self.draw_slot()
        return Ticket(slot if self.strategy == "same_instance" else None), vector

    def draw_slot(self) -> tuple[int, np.ndarray]:
        """A uniformly drawn slot and a copy of its instance (the server keeps the slot to
        measure the returned update's step against it)."""
        with self._lock:
            slot = self._rng.randrange(len(self._slots))
            vector = self._slots[slot]
        return slot, vector.copy()

    def slot_vector(self, slot: int) -> np.ndarray:
        """The instance in ``slot`` itself (read-only: a later replace swaps in another array)."""
        with self._lock:
            return self._slots[slot]

    def discard(self, ticket: Ticket, update: np.ndarray) -> bool:
        """Puts a returned model back; returns whether it was accepted (spam check and strategy).

        The replaced slot is drawn uniformly and independently of the draw (``draw_discard``).
        """
        u = np.array(update, dtype=np.float64)
        if u.shape != (self.dim,) or not np.all(np.isfinite(u)):
            raise ValueError(f"an update must be {self.dim} finite numbers")
        if self.spam_check is not None and not self.spam_check(self, u):
            with self._lock:
                self.rejected += 1
            return False
        with self._lock:
            if self.strategy == "accept_1_over_k" and self._rng.random() >= 1.0 / self.accept_k:
                self.dropped += 1
                return False
            if self.strategy == "server_batch":
                self._batch.append(u)
                self.accepted += 1
                if len(self._batch) >= self.batch_size:
                    self._put(0, np.mean(self._batch, axis=0))
                    self._batch = []
                return True
            if self.strategy == "same_instance":
                if ticket._slot is None:
                    raise ValueError("same_instance needs the ticket of this state's draw")
                slot = ticket._slot
            else:
                slot = self._rng.randrange(len(self._slots))
            if self.average_on_replace:
                u = 0.5 * (u + self._slots[slot])
            self._put(slot, u)
            self.accepted += 1
            return True

    def replace(self, slot: int, vector: np.ndarray) -> None:
        """Overwrites one slot with ``vector``: keeps this state a mirror of instances held
        elsewhere (a served run's, in the ledger's database: :mod:`~sage_tfx.dnd.service`)."""
        v = np.asarray(vector, dtype=np.float64)
        if v.shape != (self.dim,) or not np.all(np.isfinite(v)):
            raise ValueError(f"an instance must be {self.dim} finite numbers")
        if not 0 <= slot < self.k:
            raise ValueError(f"slot must be in [0, {self.k}), got {slot!r}")
        with self._lock:
            self._put(slot, v)

    def _put(self, slot: int, vector: np.ndarray) -> None:
        v = np.array(vector, dtype=np.float64)
        v.setflags(write=False)
        old = self._slots[slot]
        self._slots[slot] = v  # one reference swap: atomic for readers
        self._puts += 1
        if self._puts % 1000 == 0:  # re-derive the running sums exactly now and then
            stacked = np.stack(self._slots)
            self._sum, self._sumsq = stacked.sum(axis=0), (stacked ** 2).sum(axis=0)
        else:
            self._sum = self._sum + (v - old)
            self._sumsq = self._sumsq + (v * v - old * old)

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-weight mean and standard deviation (ddof = 1) of the instances, in O(d)."""
        with self._lock:
            total, sq, k = self._sum, self._sumsq, len(self._slots)
        mean = total / k
        if k < 2:
            return mean, np.zeros_like(mean)
        var = np.maximum(sq - k * mean * mean, 0.0) / (k - 1)
        return mean, np.sqrt(var)

    def instances_view(self) -> np.ndarray:
        """The k instances as a fresh (k, d) array (server-internal: spam check, tests)."""
        with self._lock:
            refs = list(self._slots)
        return np.stack(refs)

    def columns(self, idx: np.ndarray) -> np.ndarray:
        """The k instances restricted to weights ``idx``, as a (k, len(idx)) array."""
        with self._lock:
            refs = list(self._slots)
        return np.stack([r[idx] for r in refs])

    def average(self) -> np.ndarray:
        """The prediction model: the mean of the k instances."""
        return self.instances_view().mean(axis=0)

    def spread(self) -> float:
        """Mean over weights of the across-instance variance (ddof = 1); Theorem 1's quantity."""
        if self.k < 2:
            raise ValueError("spread needs k >= 2")
        return float(np.mean(np.var(self.instances_view(), axis=0, ddof=1)))
