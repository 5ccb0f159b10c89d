"""Group commit of a served run's draws and returned updates (:class:`GroupCommit`).

Draws and returned updates that arrive together are written by one committer in one database
transaction, each in its own savepoint, so one fsync (SQLite ``durability=power``) or one WAL
flush (PostgreSQL ``synchronous_commit=on``) makes many of them durable: the first caller that
finds no commit under way becomes the committer and takes everything queued; the others wait
until their own unit is committed and synced, and only then return (so an acknowledged draw or
update survives a power loss, as before). A unit that refuses (unknown ticket, no pass left,
rate limit, released run) is rolled back to its savepoint and refuses alone; a conflict
(deadlock, serialisation failure) re-runs the whole batch (the store's retry); any other failure
of the batch — a statement error, COMMIT, the fsync — fails every unit in it with
:class:`StoreUnavailableError` (HTTP 503, Retry-After): nothing of it is acknowledged, and nothing
of it is visible unless only the fsync after COMMIT failed.

Every unit runs the statements and takes the row locks it took as its own transaction (the
principal's pass and rate rows, the instance row that orders a draw against an overwrite, the run
row), so the guarantees across processes (several ``dnd serve`` processes on one SQLite or
PostgreSQL database) are unchanged; within a batch, units run one after another, each seeing the
ones before it. A batch holds its locks until its commit, so two processes' batches may deadlock
on PostgreSQL: the database detects it and the batch is re-run.

Tickets stay durable too: a ticket's transaction also counts the principal's draw in the rate
window, and its ``dnd_drawn`` record is what the norm bound is measured from; writing it without
fsync would let a power loss forget draws the rate limit had counted.
"""
from __future__ import annotations

import threading
from typing import Callable

from sage_tfx.errors import SageError
from sage_tfx.ledger.store import Store

MAX_BATCH = 128  # units per transaction


class StoreUnavailableError(SageError):
    """The batched transaction that held this draw or update failed: nothing of it was
    acknowledged (HTTP 503; the client may retry)."""


class _Unit:
    __slots__ = ("fn", "done", "ok", "value")

    def __init__(self, fn: Callable):
        self.fn, self.done, self.ok, self.value = fn, False, False, None


class GroupCommit:
    """Writes units (functions of one write transaction's statements) in shared transactions.

    Args:
      store: the write connection.
      lock: held by the committer (and by anything else that uses ``store``).
      q: runs one statement on ``store``.
      refusals: exceptions with which a unit refuses alone (its savepoint is rolled back).
    """

    def __init__(self, store: Store, lock: threading.Lock, q: Callable, refusals: tuple):
        self._st, self._lock, self._q, self._refusals = store, lock, q, refusals
        self._queue: list[_Unit] = []
        self._qlock = threading.Lock()
        self.commits = 0  # transactions committed

    def run(self, fn: Callable):
        """``fn()`` as one unit of a shared transaction; returns (or raises its refusal) once
        that transaction is committed and synced.

        Raises:
          StoreUnavailableError: the transaction failed (nothing of ``fn`` was acknowledged).
        """
        unit = _Unit(fn)
        with self._qlock:
            self._queue.append(unit)
        while not unit.done:
            with self._lock:
                if unit.done:  # another committer took and committed it
                    break
                with self._qlock:
                    batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                self._commit(batch)
        if unit.ok:
            return unit.value
        raise unit.value

    def _commit(self, batch: list[_Unit]) -> None:
        """Writes ``batch`` in one transaction (each unit in a savepoint); marks each unit done
        with its result or error only once the commit (and fsync) succeeded or failed."""
        def txn() -> list:
            out = []
            for unit in batch:
                self._q("SAVEPOINT dnd_unit")
                try:
                    out.append((True, unit.fn()))
                except self._refusals as exc:
                    self._q("ROLLBACK TO SAVEPOINT dnd_unit")
                    out.append((False, exc))
                self._q("RELEASE SAVEPOINT dnd_unit")
            return out
        err = StoreUnavailableError("the store could not commit this draw or update; nothing "
                                    "of it was written: retry")
        outcomes = [(False, err)] * len(batch)  # unless the batch commits (and syncs)
        try:
            outcomes = self._st.write(txn)
            self.commits += 1
        except Exception as exc:
            err.__cause__ = exc
        finally:  # also on KeyboardInterrupt: no waiting unit is left behind
            for unit, (ok, value) in zip(batch, outcomes):
                unit.ok, unit.value, unit.done = ok, value, True
