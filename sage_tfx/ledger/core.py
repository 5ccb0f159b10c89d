"""The block ledger: per-block privacy budgets, grants and a hash-chained audit log.

Sage §3.2 (Sage Access Control) and §4 (block composition, Theorem 4.3). A stream is split into
disjoint blocks; every block has its own budget under the stream's global (ε_g, δ_g). A run asks
for blocks (a list, or a window such as "the last 30 blocks") and a privacy cost; the ledger
charges *every* requested block or *none*, in one database transaction, and only after that
transaction commits are block locations handed out (**charge before release**). A grant whose
data was released stays charged for ever; only a reservation that never released data can be
cancelled. A repeated run id returns the same grant without charging twice.

Budget state per (stream, context, block) is cached in ``budgets`` for speed; it is always
derivable from the grants (``check_consistency`` recomputes it). Contexts (§3.2) are separate
budget lists for non-colluding consumers configured by the operator. Storage and transactions
live in :mod:`~sage_tfx.ledger.store`, the mode-dependent arithmetic in
:mod:`~sage_tfx.ledger.budget`, the hash chain in :mod:`~sage_tfx.ledger.audit`.
"""
from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any, Optional, Sequence

from dp_accounting import dp_event as dp_event_lib

from sage_tfx.errors import (AccountingModeError, GrantStateError, InvalidRequestError,
                             RetiredBlockError, UnknownBlockError, UnknownStreamError)
from sage_tfx.ledger import access, accounting, budget, pgrequest, pgroles, rows, secrets
from sage_tfx.ledger.access import AccessMixin
from sage_tfx.ledger.auditing import AuditMixin
from sage_tfx.ledger.blockkeys import BlockKeyMixin
from sage_tfx.ledger.leases import LeaseMixin
from sage_tfx.ledger.releases import ReleaseMixin
from sage_tfx.ledger.store import Store
from sage_tfx.ledger.values import (ACTIVE, CANCELLED, DEFAULT_CONTEXT, RELEASED, RESERVED, RETIRED,
                                    BlockSpec, BlockState, Decision, Grant, GrantedBlock, Stream,
                                    Window, check_name, now)


class _MorePages(Exception):
    """A window needs to look further back than the rows it locked: rerun with ``page`` rows."""

    def __init__(self, page: int):
        super().__init__(page)
        self.page = page


class Ledger(AccessMixin, ReleaseMixin, LeaseMixin, AuditMixin, BlockKeyMixin):
    """A connection to a block ledger. Not thread-safe: open one per thread or process.

    ``url`` may be a reference (``env:NAME``, ``file:/path``; :mod:`~sage_tfx.ledger.secrets`),
    resolved only here. ``token`` authenticates the caller once the ledger has principals
    (default: ``$SAGE_LEDGER_TOKEN`` or the file ``$SAGE_LEDGER_TOKEN_FILE``).
    """

    def __init__(self, url: str, token: Optional[str] = None):
        self.url = url
        self.redacted_url = secrets.redact(secrets.resolve(url))
        self._store = Store(secrets.resolve(url))
        try:
            token = secrets.resolve(token, "token") if token else access.token_from_env()
            self.principal = self._store.read(lambda: access.identify(self._store, token))
        except BaseException:
            self._store.close()
            raise
        self._store.principal = self.principal.name
        self._streams: dict[str, Stream] = {}

    def close(self) -> None:
        """Closes the ledger's database connection."""
        self._store.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def _for_update(self) -> str:
        """Row-lock suffix of a SELECT (PostgreSQL; SQLite transactions are serial)."""
        return " FOR UPDATE" if self._store.kind == "postgresql" else ""

    @property
    def backend(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._store.kind

    def _q(self, sql: str, params: Sequence = ()) -> Any:
        return self._store.q(sql, params)

    def _audit(self, stream: Optional[str], kind: str, payload: dict) -> None:
        self._store.audit(stream, kind, payload)

    # -- streams --

    def create_stream(self, name: str, *, epsilon_g: float, delta_g: float,
                      mode: str = accounting.BASIC, granularity: str = "",
                      contexts: Sequence[str] = (DEFAULT_CONTEXT,),
                      retire_epsilon: Optional[float] = None,
                      orders: Sequence[float] = accounting.DEFAULT_RDP_ORDERS) -> Stream:
        """Creates a stream with global cap (ε_g, δ_g).

        Args:
          name: stream name.
          epsilon_g: global ε of every block.
          delta_g: global δ of every block (> 0 in rdp mode, where it pays for the conversion).
          mode: "basic" (Σε, Σδ) or "rdp" (DpEvents, per-order RDP filter).
          granularity: block scheme description, e.g. "time:timestamp:day".
          contexts: names of the non-colluding contexts, each with its own budget list.
          retire_epsilon: a block retires once an ε=retire_epsilon pure-DP charge no longer fits
            (default ε_g / 1000).
          orders: RDP order grid (rdp mode).
        Raises:
          InvalidPrivacyParameterError, InvalidRequestError: bad configuration or name taken.
        """
        check_name("stream name", name)
        self.authorize(access.CONFIGURE)
        epsilon_g = accounting.check_epsilon(epsilon_g, "epsilon_g")
        if mode not in accounting.MODES:
            raise AccountingModeError(f"mode must be one of {accounting.MODES}, got {mode!r}")
        delta_g = accounting.check_delta(delta_g, "delta_g", allow_zero=(mode == accounting.BASIC))
        contexts = tuple(contexts)
        if not contexts or len(set(contexts)) != len(contexts):
            raise InvalidRequestError(f"contexts must be distinct and non-empty: {contexts!r}")
        for c in contexts:
            check_name("context", c)
        retire_epsilon = accounting.check_epsilon(
            epsilon_g / 1000.0 if retire_epsilon is None else retire_epsilon, "retire_epsilon")
        if retire_epsilon > epsilon_g:
            raise InvalidRequestError(
                f"retire_epsilon {retire_epsilon} exceeds epsilon_g {epsilon_g}")
        orders = accounting.check_orders(orders)
        stream = Stream(name, epsilon_g, delta_g, mode, str(granularity), contexts,
                        retire_epsilon, orders if mode == accounting.RDP else (), now())

        def txn():
            if self._q("SELECT 1 FROM streams WHERE stream = ?", (name,)).fetchone():
                raise InvalidRequestError(f"stream {name!r} already exists")
            self._q("INSERT INTO streams (stream, epsilon_g, delta_g, mode, granularity, contexts,"
                    " retire_epsilon, orders, next_seq, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (name, epsilon_g, delta_g, mode, stream.granularity, json.dumps(contexts),
                     retire_epsilon, json.dumps(stream.orders), 0, stream.created_at))
            self._audit(name, "create_stream", {
                "epsilon_g": epsilon_g, "delta_g": delta_g, "mode": mode,
                "granularity": stream.granularity, "contexts": list(contexts),
                "retire_epsilon": retire_epsilon, "orders": list(stream.orders)})
            return stream

        return self._store.write(txn)

    def stream(self, name: str) -> Stream:
        """The stream's configuration. Raises UnknownStreamError."""
        if name in self._streams:
            return self._streams[name]
        row = self._store.read(lambda: self._q(
            rows.STREAM_SELECT + "WHERE stream = ?", (name,)).fetchone())
        if row is None:
            raise UnknownStreamError(f"unknown stream {name!r}")
        stream = rows.stream_of(row)
        self._streams[name] = stream  # configuration is immutable once created
        return stream

    def streams(self) -> list[Stream]:
        """Every stream of the ledger, by name."""
        names = [r[0] for r in self._q("SELECT stream FROM streams ORDER BY stream").fetchall()]
        return [self.stream(n) for n in names]

    def _context(self, stream: Stream, context: str) -> str:
        if context not in stream.contexts:
            raise InvalidRequestError(
                f"context {context!r} is not configured for stream {stream.name!r} "
                f"(configured: {', '.join(stream.contexts)})")
        return context

    # -- blocks --

    def add_block(self, stream: str, block_id: str, *, location: str,
                  start: Optional[str] = None, end: Optional[str] = None,
                  records: Optional[int] = None) -> BlockState:
        """Registers one new block with a full budget in every context."""
        self.add_blocks(stream, [BlockSpec(block_id, location, start, end, records)])
        return self.block(stream, block_id)

    def add_blocks(self, stream: str, specs: Sequence[BlockSpec]) -> int:
        """Registers new blocks (in the given order) in one transaction; returns how many.

        Raises:
          UnknownStreamError, InvalidRequestError: unknown stream, duplicate or malformed block.
        """
        self.authorize(access.CONFIGURE)
        s = self.stream(stream)
        specs = list(specs)
        if not specs:
            raise InvalidRequestError("no blocks to add")
        seen = set()
        for spec in specs:
            check_name("block id", spec.block_id)
            if spec.block_id in seen:
                raise InvalidRequestError(f"block {spec.block_id!r} listed twice")
            seen.add(spec.block_id)
            if not isinstance(spec.location, str) or not spec.location:
                raise InvalidRequestError(f"block {spec.block_id!r} needs a storage location")
            if spec.records is not None and (not isinstance(spec.records, int) or spec.records < 0):
                raise InvalidRequestError(
                    f"block {spec.block_id!r}: bad record count {spec.records!r}")

        def txn():
            next_seq = self._q("SELECT next_seq FROM streams WHERE stream = ?" + self._for_update,
                               (stream,)).fetchone()[0]
            dup = self._store.existing(stream, [spec.block_id for spec in specs])
            if dup:
                raise InvalidRequestError(f"block {dup!r} already exists in stream {stream!r}")
            ts = now()
            self._store.bulk_insert(
                "blocks", ("stream", "block_id", "seq", "location", "start_ts", "end_ts",
                           "records", "created_at"),
                [(stream, sp.block_id, next_seq + k, sp.location, sp.start, sp.end, sp.records,
                  ts) for k, sp in enumerate(specs)])
            self._store.add_budgets(stream, s.contexts, next_seq, len(specs), budget.zero_curve(s))
            self._q("UPDATE streams SET next_seq = ? WHERE stream = ?",
                    (next_seq + len(specs), stream))
            self._insert_block_keys(stream, specs, ts)  # encrypted blocks' keys, with the blocks
            digest = hashlib.sha256(json.dumps(
                [[sp.block_id, sp.location, sp.start, sp.end, sp.records] for sp in specs]
            ).encode()).hexdigest()
            self._audit(stream, "add_blocks", {
                "count": len(specs), "first": specs[0].block_id, "last": specs[-1].block_id,
                "first_seq": next_seq, "blocks_sha256": digest})
            return len(specs)

        added = self._store.write(txn)
        self._finish_shred()
        if len(specs) >= 1000:
            self._store.analyze()
        return added

    def blocks(self, stream: str, context: str = DEFAULT_CONTEXT) -> list[BlockState]:
        """Every block of the stream with its budget state in ``context``, oldest first.

        In rdp mode ``epsilon_spent`` is the block's ε at δ_g as dp_accounting converts its RDP
        curve, and ``delta_spent`` is δ_g once anything was charged.
        """
        s = self.stream(stream)
        self._context(s, context)
        self.authorize(access.READ, stream=stream, context=context)
        found = self._q(rows.BLOCK_SELECT + "WHERE b.stream = ? AND u.context = ? ORDER BY b.seq",
                        (stream, context)).fetchall()
        return [rows.block_state(s, r) for r in found]

    def block(self, stream: str, block_id: str, context: str = DEFAULT_CONTEXT) -> BlockState:
        """The budget state of one block in ``context``. Raises UnknownBlockError."""
        s = self.stream(stream)
        self._context(s, context)
        self.authorize(access.READ, stream=stream, context=context)
        row = self._q(rows.BLOCK_SELECT + "WHERE b.stream = ? AND u.context = ? AND b.block_id = ?",
                      (stream, context, block_id)).fetchone()
        if row is None:
            raise UnknownBlockError(f"unknown block {block_id!r} in stream {stream!r}")
        return rows.block_state(s, row)

    def remaining(self, stream: str, block_id: str, context: str = DEFAULT_CONTEXT) -> dict:
        """What is left of a block's budget: (ε, δ) in basic mode, per-order headroom in rdp."""
        s = self.stream(stream)
        self._context(s, context)
        self.authorize(access.READ, stream=stream, context=context)
        row = self._q("SELECT eps_spent, delta_spent, rdp FROM budgets WHERE stream = ? AND "
                      "context = ? AND block_id = ?", (stream, context, block_id)).fetchone()
        if row is None:
            raise UnknownBlockError(f"unknown block {block_id!r} in stream {stream!r}")
        eps_spent, delta_spent, rdp = row
        return budget.remaining(s, eps_spent, delta_spent, rdp)

    def retire_block(self, stream: str, block_id: str, reason: str,
                     context: Optional[str] = None) -> None:
        """Retires a block for good (in one context, or all): it will never be charged again.
        Retired in every context, its data key and local files are destroyed (blockkeys)."""
        self.authorize(access.CONFIGURE)
        s = self.stream(stream)
        contexts = s.contexts if context is None else (self._context(s, context),)

        def txn():
            if not self._q("SELECT context FROM budgets WHERE stream = ? AND block_id = ? "
                           "ORDER BY context" + self._for_update, (stream, block_id)).fetchall():
                raise UnknownBlockError(f"unknown block {block_id!r} in stream {stream!r}")
            for c in contexts:
                self._q("UPDATE budgets SET status = ? WHERE stream = ? AND context = ? AND "
                        "block_id = ?", (RETIRED, stream, c, block_id))
                self._audit(stream, "retire", {"block": block_id, "context": c, "reason": reason})
            self._shred_retired(stream, block_id)  # retired everywhere: its key is destroyed

        self._store.write(txn)
        self._finish_shred()

    # -- requests --

    def _normalize_cost(self, s: Stream, epsilon, delta, event):
        """Validates the cost against the stream's mode; returns (eps, delta, event, event_json)."""
        if s.mode == accounting.BASIC:
            if event is not None:
                raise AccountingModeError(
                    f"stream {s.name!r} uses basic accounting: charge (epsilon, delta), not a "
                    "DpEvent")
            if epsilon is None:
                raise InvalidRequestError("a basic-mode request needs epsilon (and delta)")
            eps = accounting.check_epsilon(epsilon)
            dlt = accounting.check_delta(0.0 if delta is None else delta)
            return eps, dlt, None, None
        if epsilon is not None or delta is not None:
            raise AccountingModeError(
                f"stream {s.name!r} uses rdp accounting: charge a dp_accounting DpEvent "
                "(e.g. GaussianDpEvent, LaplaceDpEvent, PoissonSampledDpEvent), not (epsilon, "
                "delta)")
        if event is None:
            raise InvalidRequestError("an rdp-mode request needs a DpEvent")
        accounting.check_event(event)
        return None, None, event, accounting.event_to_json(event)

    def request(self, stream: str, *, run_id: str, blocks: Optional[Sequence[str]] = None,
                window: Optional[Window] = None, epsilon: Optional[float] = None,
                delta: Optional[float] = None, event: Optional[dp_event_lib.DpEvent] = None,
                context: str = DEFAULT_CONTEXT, release: bool = True) -> Decision:
        """Charges a run's privacy cost to every requested block, or to none.

        Args:
          stream: the stream.
          run_id: the run's id; a repeated id with the same request returns the same grant.
          blocks: explicit block ids (exactly one of ``blocks`` / ``window``).
          window: a window policy, resolved to concrete blocks at charge time.
          epsilon, delta: the cost in basic mode.
          event: the cost as a dp_accounting DpEvent in rdp mode.
          context: the budget list to charge.
          release: release the data in the same transaction (default). With False the grant is
            a reservation without locations; call :meth:`release` or :meth:`cancel` later.
        Returns:
          A Decision: granted with a Grant, or denied with a reason (recorded in the audit log).
        Raises:
          ValueError subclasses for bad input (nothing is written): unknown stream/block/context,
          retired block, bad privacy parameters, mode mismatch, empty request, run id reused for a
          different request.
        """
        s = self.stream(stream)
        check_name("run id", run_id)
        self._context(s, context)
        self.authorize(access.CHARGE, stream=stream, context=context)
        eps, dlt, event, event_json = self._normalize_cost(s, epsilon, delta, event)
        if (blocks is None) == (window is None):
            raise InvalidRequestError("give exactly one of blocks=[...] or window=Window(...)")
        if blocks is not None:
            if isinstance(blocks, str):
                raise InvalidRequestError("blocks must be a list of block ids, not a string")
            blocks = list(blocks)
            if not blocks:
                raise InvalidRequestError("empty request: no blocks")
            if len(set(blocks)) != len(blocks):
                raise InvalidRequestError("a block is listed twice in the request")
        elif not isinstance(window, Window):
            raise InvalidRequestError(f"window must be a Window, got {window!r}")
        request_text = json.dumps({
            "blocks": blocks,
            "window": {"last": window.last, "min_blocks": window.min_blocks} if window else None,
            "epsilon": eps, "delta": dlt, "event": json.loads(event_json) if event_json else None,
            "context": context}, sort_keys=True)
        charge = accounting.rdp_curve(event, s.orders) if event is not None else None
        # Basic-mode sums run on exact decimals of the values the caller gave.
        dec_e, dec_d = (accounting.exact(eps),
                        accounting.exact(dlt)) if eps is not None else (None, None)

        if self._store.kind == "postgresql" and event is None:  # one server-side call
            made = pgrequest.request(self._store, s, run_id, context, blocks, window, (eps, dlt),
                                     request_text, release)
            if made is not None:
                return Decision(True, made)

        def txn(page: int) -> Decision:
            # Queued together (one round trip on PostgreSQL): the run-id check, the budget rows
            # (locked in ascending seq on PostgreSQL), the head of an audit chain.
            prior_cur = self._q("SELECT grant_id, request FROM grants WHERE stream = ? AND "
                                "run_id = ?", (stream, run_id))
            rows_cur = (self._store.budget_rows(stream, context, blocks) if blocks is not None
                        else self._store.window_rows(stream, context, ACTIVE, page))
            self._store.reserve_audit()
            prior = prior_cur.fetchone()
            found = [rows.BudgetRow._make(r) for r in rows_cur.fetchall()]
            if prior is not None:
                prior_id, prior_request = prior
                if prior_request != request_text:
                    raise InvalidRequestError(
                        f"run id {run_id!r} already has grant {prior_id} for a different request")
                pgrequest.flush_wal(self._store)  # its first attempt may have lost the session
                return Decision(True, self._load_grant(prior_id), replayed=True)
            if blocks is not None:
                states = {r.block_id: r for r in found}
                missing = [b for b in blocks if b not in states]
                if missing:
                    raise UnknownBlockError(
                        f"unknown block(s) in stream {stream!r}: {', '.join(missing[:10])}")
                retired = [b for b in blocks if states[b].status != ACTIVE]
                if retired:
                    raise RetiredBlockError(
                        f"retired block(s) in stream {stream!r}, context {context!r}: "
                        f"{', '.join(retired[:10])}")
                chosen = [states[b] for b in blocks]
                short = [r for r in chosen if not self._fits(s, r, dec_e, dec_d, charge)]
                if short:
                    reason = budget.shortfall(
                        s, [(r.block_id, r.eps_spent, r.delta_spent) for r in short], dec_e, dec_d)
                    return self._deny(s, run_id, context, request_text, reason)
            else:
                # The most recent active blocks that fit; rows were active when chosen, and are
                # re-checked now that they are locked.
                chosen = []
                for r in reversed(found):
                    if r.status == ACTIVE and self._fits(s, r, dec_e, dec_d, charge):
                        chosen.append(r)
                        if len(chosen) == window.last:
                            break
                if len(chosen) < window.last and len(found) == page:
                    raise _MorePages(page * 4)  # older blocks may fit: look further back
                if len(chosen) < window.required:
                    reason = (f"window last={window.last}: only {len(chosen)} block(s) have budget "
                              f"left for this charge, {window.required} required")
                    return self._deny(s, run_id, context, request_text, reason)
                chosen.sort(key=lambda r: r.seq)
            return Decision(True, self._charge(s, run_id, context, request_text, chosen,
                                               (eps, dlt), (dec_e, dec_d), event_json, charge,
                                               release))

        page = window.last + 8 if window is not None else 0
        while True:
            try:
                # Idempotent by its run id: after a lost session the retry finds the grant.
                return self._store.write(lambda: txn(page), pipeline=True, idempotent=True)
            except _MorePages as more:
                page = more.page

    @staticmethod
    def _fits(s: Stream, row: rows.BudgetRow, eps, dlt, charge) -> bool:
        return budget.fits(s, row.eps_spent, row.delta_spent, row.rdp, eps, dlt, charge)

    def _deny(self, s: Stream, run_id: str, context: str, request_text: str,
              reason: str) -> Decision:
        self._audit(s.name, "deny", {"run_id": run_id, "context": context,
                                     "request": json.loads(request_text), "reason": reason})
        return Decision(False, None, reason)

    def _charge(self, s: Stream, run_id, context, request_text, chosen: list[rows.BudgetRow],
                cost, dec_cost, event_json, charge, release: bool) -> Grant:
        eps, dlt = cost
        grant_id = uuid.uuid4().hex
        ts = now()
        block_ids = [r.block_id for r in chosen]
        updates, retired = [], []
        probe = budget.retire_probe(s)
        for r in chosen:
            new_e, new_d, new_rdp, still = budget.after_charge(s, r.eps_spent, r.delta_spent, r.rdp,
                                                               dec_cost, charge, probe)
            updates.append((new_e, new_d, new_rdp, r.id))
            if not still:
                retired.append(r)
        self._store.update_budgets(updates)
        status = RELEASED if release else RESERVED
        self._q("INSERT INTO grants (grant_id, stream, context, run_id, request, mode, epsilon, "
                "delta, event, blocks, status, created_at, released_at, principal) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (grant_id, s.name, context, run_id, request_text, s.mode, eps, dlt, event_json,
                 json.dumps(block_ids), status, ts, ts if release else None, self._store.principal))
        self._audit(s.name, "grant", {
            "grant_id": grant_id, "run_id": run_id, "context": context, "blocks": block_ids,
            "epsilon": eps, "delta": dlt,
            "event": json.loads(event_json) if event_json else None, "status": status})
        for r in retired:
            self._q("UPDATE budgets SET status = ? WHERE id = ?", (RETIRED, r.id))
            self._audit(s.name, "retire", {"block": r.block_id, "context": context,
                                           "reason": "budget exhausted", "grant_id": grant_id})
        return Grant(grant_id, run_id, s.name, context, s.mode, eps, dlt,
                     accounting.event_from_json(event_json) if event_json else None,
                     tuple(GrantedBlock(r.block_id, r.location if release else None)
                           for r in chosen), status, ts)

    # -- grants --

    def _load_grant(self, grant_id: str) -> Grant:
        row = self._q(rows.GRANT_SELECT + "WHERE grant_id = ?", (grant_id,)).fetchone()
        if row is None:
            raise InvalidRequestError(f"unknown grant {grant_id!r}")
        row = rows.GrantRow._make(row)
        ids = json.loads(row.blocks)
        if row.status == RELEASED:
            locs = {}
            for k in range(0, len(ids), 500):
                chunk = ids[k:k + 500]
                locs.update(self._q(
                    "SELECT block_id, location FROM blocks WHERE stream = ? AND block_id IN "
                    f"({','.join('?' * len(chunk))})", [row.stream] + chunk).fetchall())
            granted = tuple(GrantedBlock(b, locs[b]) for b in ids)
        else:
            granted = tuple(GrantedBlock(b, None) for b in ids)
        return rows.grant_of(row, granted)

    def grant(self, grant_id: str) -> Grant:
        """The grant with this id. Raises InvalidRequestError if there is none."""
        g = self._load_grant(grant_id)
        self.authorize(access.READ, stream=g.stream, context=g.context)
        return g

    def grant_for_run(self, stream: str, run_id: str) -> Optional[Grant]:
        """The grant made for ``run_id`` on ``stream``, or None (what a replay finds)."""
        row = self._q("SELECT grant_id FROM grants WHERE stream = ? AND run_id = ?",
                      (stream, run_id)).fetchone()
        return self.grant(row[0]) if row else None  # the one column

    def grants(self, stream: str) -> list[Grant]:
        """Every grant of the stream (an auditor's or admin's view), oldest first."""
        self.authorize(access.AUDIT)
        ids = [r[0] for r in self._q("SELECT grant_id FROM grants WHERE stream = ? "
                                     "ORDER BY created_at", (stream,)).fetchall()]
        return [self._load_grant(g) for g in ids]

    def release(self, grant_id: str) -> Grant:
        """Releases a reserved grant's data: only now are block locations handed out."""
        def txn():
            row = self._q("SELECT status, stream, context FROM grants WHERE grant_id = ?" +
                          self._for_update, (grant_id,)).fetchone()
            if row is None:
                raise InvalidRequestError(f"unknown grant {grant_id!r}")
            status, stream, context = row
            self.authorize(access.CHARGE, stream=stream, context=context)
            if status == CANCELLED:
                raise GrantStateError(f"grant {grant_id} was cancelled; request a new one")
            if status == RESERVED:
                self._q("UPDATE grants SET status = ?, released_at = ? WHERE grant_id = ?",
                        (RELEASED, now(), grant_id))
                self._audit(stream, "release", {"grant_id": grant_id})
            return self._load_grant(grant_id)

        return self._store.write(txn)

    def cancel(self, grant_id: str) -> Grant:
        """Cancels a reservation that never released data and refunds its charge.

        A block the reservation retired stays retired (the conservative choice).

        Raises:
          GrantStateError: the grant released data (never refunded) or is already cancelled.
        """
        def txn():
            row = self._q("SELECT stream, context, blocks FROM grants WHERE grant_id = ?",
                          (grant_id,)).fetchone()
            if row is None:
                raise InvalidRequestError(f"unknown grant {grant_id!r}")
            stream, context, blocks_json = row
            blocks = json.loads(blocks_json)
            self.authorize(access.CHARGE, stream=stream, context=context)
            # Lock order as in request: the blocks (ascending seq), then the grant row.
            self._store.budget_rows(stream, context, blocks).fetchall()
            status = self._q("SELECT status FROM grants WHERE grant_id = ?" + self._for_update,
                             (grant_id,)).fetchone()[0]
            if status != RESERVED:
                raise GrantStateError(
                    f"grant {grant_id} is {status}: only a reservation that never released data "
                    "can be cancelled; released data stays charged")
            s = self.stream(stream)
            derived = self._derived_states(s, context, without=grant_id)
            states = [budget.stored(s, derived.get(b) or budget.fresh(s)) for b in blocks]
            if self._store.kind == "postgresql":  # checked by the server (pgroles.refund)
                pgroles.refund(self._store, grant_id, json.dumps(
                    [dict(zip(("block", "eps", "delta", "rdp", "charges"), (b,) + st))
                     for b, st in zip(blocks, states)]))
            else:
                self._q("UPDATE grants SET status = ? WHERE grant_id = ?", (CANCELLED, grant_id))
                self._store.many("UPDATE budgets SET eps_spent = ?, delta_spent = ?, rdp = ?, "
                                 "charges = ? WHERE stream = ? AND context = ? AND block_id = ?",
                                 [st + (stream, context, b) for b, st in zip(blocks, states)])
            self._audit(stream, "cancel", {"grant_id": grant_id, "blocks": blocks})
            return self._load_grant(grant_id)

        return self._store.write(txn)

    def _derived_states(self, s: Stream, context: str,
                        without: str = "") -> dict[str, budget.Derived]:
        """Every charged block's (ε, δ, RDP curve, charges) recomputed from non-cancelled grants
        (other than ``without``)."""
        return budget.derive(s, self._q(
            "SELECT epsilon, delta, event, blocks FROM grants WHERE stream = ? AND context = ? "
            "AND status <> ? AND grant_id <> ? ORDER BY created_at, grant_id",
            (s.name, context, CANCELLED, without)))

def open_ledger(url: str, token: Optional[str] = None) -> Ledger:
    """Opens (creating if needed) the ledger at a database URL.

    ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or
    ``postgresql://user@host:port/dbname``, or a reference to one (``env:NAME``,
    ``file:/path``). ``token``: the caller's credential once the ledger has principals.

    Raises:
      AuthenticationError: the ledger has principals and no valid token was given.
    """
    return Ledger(url, token)
