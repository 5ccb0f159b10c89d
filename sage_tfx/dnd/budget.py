"""Draw-and-Discard under the ledger: a training run is granted over its window, then enforced.

A stream's clients live in user-bucket blocks (:class:`~sage_tfx.streams.HashBucketScheme` on the
client id), so the clients of one block are disjoint from every other block's and one update
touches one block (parallel composition). A client whose examples span several blocks (e.g. time
windows) must have every one of them granted, and the run's charge lands on each.

A run in which every client sends at most ``passes`` updates costs each block

* ``passes × ε_update`` (basic streams), ε_update = :meth:`ClientConfig.update_epsilon`, and
  ``passes × δ_update`` for the gaussian unit (basic composition), or
* ``SelfComposedDpEvent(e, passes)`` (rdp streams) with e = ``LaplaceDpEvent(b / Δ₁)`` or, for the
  gaussian unit, ``GaussianDpEvent(m)`` (:meth:`ClientConfig.update_event`; the RDP of the exact
  discrete-Gaussian sampler that runs, :mod:`sage_tfx.dnd.noise`),

charged *before* the server accepts its first update (:func:`request_run`). The server then admits
a draw only through :class:`RunBudget`: the client's blocks must be in the grant and still usable,
and the client must have passes left. The adversary II/III figures of :mod:`~sage_tfx.dnd.theory`
are expectations over server coins: reported, never charged.
"""
from __future__ import annotations

import threading
from typing import Optional, Sequence

from dp_accounting import dp_event as dp_event_lib

from sage_tfx.dnd.client import ClientConfig
from sage_tfx.errors import MissingGrantError, SageError
from sage_tfx.ledger import DEFAULT_CONTEXT, Decision, Grant, Ledger, Window, accounting


class UpdateRefused(SageError):
    """The server refuses a client: no grant, block not granted or stopped, or passes used up."""


def _check_passes(passes: int) -> int:
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"passes must be an integer >= 1, got {passes!r}")
    return passes


def run_event(config: ClientConfig, dim: int, passes: int) -> dp_event_lib.DpEvent:
    """The rdp-mode cost of a run: ``passes`` Laplace (or Gaussian) updates per client, composed."""
    event = config.update_event(dim)
    passes = _check_passes(passes)
    return event if passes == 1 else dp_event_lib.SelfComposedDpEvent(event, passes)


def run_epsilon(config: ClientConfig, dim: int, passes: int) -> float:
    """The basic-mode ε of a run: ``passes × ε_update``."""
    return _check_passes(passes) * config.update_epsilon(dim)


def run_delta(config: ClientConfig, dim: int, passes: int) -> float:
    """The basic-mode δ of a run: ``passes × δ_update`` (0 for the pure Laplace units)."""
    return _check_passes(passes) * config.update_delta(dim)


def client_epsilon(config: ClientConfig, dim: int, passes: int, delta: float) -> float:
    """The privacy loss of one client over a whole run: ε at ``delta`` of ``passes`` composed
    updates (:func:`run_event`) by dp_accounting's RDP accountant (its default orders; the
    Laplace units' pure ε composes to at most ``passes × ε_update``, which is returned if
    smaller). What a run of T updates over n clients implies per client, beside the per-update ε:
    passes = ⌈T/n⌉ (10⁶ updates over 400 clients at ε = 8, δ = 10⁻⁶ per update: ≈ 3,360)."""
    from dp_accounting.rdp import rdp_privacy_accountant
    dlt = accounting.check_delta(delta, allow_zero=False)
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(run_event(config, dim, passes))
    eps = float(acc.get_epsilon(dlt))
    return eps if config.gaussian else min(eps, run_epsilon(config, dim, passes))


def request_run(ledger: Ledger, stream: str, *, run_id: str, config: ClientConfig, dim: int,
                passes: int, window: Optional[Window] = None,
                blocks: Optional[Sequence[str]] = None,
                context: str = DEFAULT_CONTEXT) -> Decision:
    """Charges a Draw-and-Discard run to its blocks (all or none) before any update is accepted."""
    mode = ledger.stream(stream).mode
    if mode == accounting.BASIC:
        cost = dict(epsilon=run_epsilon(config, dim, passes), delta=run_delta(config, dim, passes))
    else:
        cost = dict(event=run_event(config, dim, passes))
    return ledger.request(stream, run_id=run_id, window=window, blocks=blocks, context=context,
                          **cost)


class RunBudget:
    """What a granted run allows, enforced on every draw. Thread-safe.

    Args:
      grant: the released grant of the run.
      config: the clients' configuration (its per-update cost must be what the grant paid for).
      dim: number of model weights.
      passes: updates each client may send.
    Raises:
      MissingGrantError: the grant is not released or does not pay for ``passes`` updates.
    """

    def __init__(self, grant: Grant, config: ClientConfig, dim: int, passes: int):
        if grant.status != "released":
            raise MissingGrantError(f"grant {grant.grant_id} is {grant.status}, not released")
        self.passes = _check_passes(passes)
        if grant.event is None:
            need = run_epsilon(config, dim, passes)
            need_delta = run_delta(config, dim, passes)
            if grant.epsilon is None or grant.epsilon < need or (grant.delta or 0.0) < need_delta:
                raise MissingGrantError(
                    f"grant {grant.grant_id} pays epsilon={grant.epsilon}, delta={grant.delta}; "
                    f"the run costs epsilon={need}, delta={need_delta}")
        else:
            need_json = accounting.event_to_json(run_event(config, dim, passes))
            if accounting.event_to_json(grant.event) != need_json:
                raise MissingGrantError(
                    f"grant {grant.grant_id} pays {accounting.event_to_json(grant.event)}, "
                    f"the run costs {need_json}")
        self.grant = grant
        self.blocks = frozenset(grant.block_ids)
        self._stopped: dict[str, str] = {}
        self._used: dict[str, int] = {}
        self._lock = threading.Lock()

    def check_blocks(self, client_id: str, blocks: Sequence[str]) -> None:
        """Refuses a client whose data lies in a block outside the grant or stopped.

        Raises:
          UpdateRefused: no block, a block outside the grant (retired, out of budget, or outside
            the window when the run was granted), or a stopped block.
        """
        if not blocks:
            raise UpdateRefused(f"client {client_id!r} names no block")
        outside = [b for b in blocks if b not in self.blocks]
        if outside:
            raise UpdateRefused(f"block(s) {', '.join(outside[:10])} not granted to run "
                                f"{self.grant.run_id} (retired, out of budget or outside its "
                                "window)")
        with self._lock:
            stopped = [f"{b} ({self._stopped[b]})" for b in blocks if b in self._stopped]
        if stopped:
            raise UpdateRefused(f"block(s) stopped: {', '.join(stopped)}")

    def admit(self, client_id: str, blocks: Sequence[str]) -> int:
        """Admits one draw of ``client_id`` (whose data lies in ``blocks``); returns passes left.

        The passes are counted in this object (one process: DnDTrainer's in-process protocol);
        a served run counts them in the ledger's database (:mod:`~sage_tfx.dnd.runstore`).

        Raises:
          UpdateRefused: a block outside the grant or stopped (:meth:`check_blocks`), or no
            passes left.
        """
        self.check_blocks(client_id, blocks)
        with self._lock:
            used = self._used.get(client_id, 0)
            if used >= self.passes:
                raise UpdateRefused(f"client {client_id!r} has used its {self.passes} update(s) "
                                    f"of run {self.grant.run_id}")
            self._used[client_id] = used + 1
            return self.passes - used - 1

    def stop(self, block_id: str, reason: str) -> None:
        """Stops every client of a block from here on."""
        with self._lock:
            self._stopped[block_id] = reason

    def refresh(self, ledger: Ledger) -> list[str]:
        """Stops the clients of granted blocks retired since the grant; returns their ids.

        A block that this very grant exhausted stays usable: the run's updates were paid for.
        Reads the ledger's audit log: ``ledger``'s principal needs the admin or auditor role.
        """
        stopped = []
        for entry in ledger.audit_log(self.grant.stream):
            p = entry.payload
            if entry.kind != "retire" or p.get("block") not in self.blocks:
                continue
            if p.get("context") != self.grant.context or p.get("grant_id") == self.grant.grant_id:
                continue
            if p["block"] not in self._stopped:
                self.stop(p["block"], f"retired: {p.get('reason', '')}")
                stopped.append(p["block"])
        return stopped

    @property
    def used(self) -> int:
        """Draws admitted so far."""
        with self._lock:
            return sum(self._used.values())
