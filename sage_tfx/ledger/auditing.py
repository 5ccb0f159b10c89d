"""The audit side of :class:`~sage_tfx.ledger.core.Ledger`: the log, its chains, consistency.

Read by admins and auditors (:mod:`~sage_tfx.ledger.access`); ``check_consistency`` recomputes
every block's budget from the grants and checks every released output against its grant.
"""
from __future__ import annotations

from typing import Optional

from sage_tfx.ledger import access, audit, budget, releases
from sage_tfx.ledger.audit import AuditEntry, AuditReport
from sage_tfx.ledger.values import RELEASED, Stream


class AuditMixin:
    """Audit log, verification and consistency (needs ``self._store``, ``self.stream``)."""

    def audit_log(self, stream: Optional[str] = None,
                  limit: Optional[int] = None) -> list[AuditEntry]:
        """Audit entries, oldest first (the last ``limit`` if given)."""
        self.authorize(access.AUDIT)
        return audit.read(self._store, stream, limit)

    def verify_audit(self) -> AuditReport:
        """Recomputes the hash chain from the first entry to the head; reports the first break."""
        self.authorize(access.AUDIT)
        return self._store.read_snapshot(
            lambda: audit.verify(self._store, contiguous=self._store.kind == "sqlite"))

    def audit_heads(self) -> dict[int, tuple[int, str]]:
        """Every audit chain's head, read on one snapshot: chain -> (last seq, last hash)."""
        self.authorize(access.AUDIT)
        return self._store.read_snapshot(lambda: audit.heads(self._store))

    def check_access(self) -> list[str]:
        """Problems with the principals and bindings tables: a change that did not go through
        the library, seen by the access digests of the audit log (empty list: none;
        :func:`~sage_tfx.ledger.access.access_problems`)."""
        self.authorize(access.AUDIT)
        return self._store.read_snapshot(lambda: access.access_problems(self._store))

    def check_consistency(self, stream: str) -> list[str]:
        """Problems found by recomputing every block's budget from grants (empty list: none).

        Checks: cached budget == derived budget; no block above its cap; every budget row has
        its block and that block's location; every non-cancelled grant has an audit entry.
        """
        self.authorize(access.AUDIT)
        s = self.stream(stream)
        return self._store.read_snapshot(lambda: self._problems(s))

    def _problems(self, s: Stream) -> list[str]:
        stream = s.name
        problems = []
        for context in s.contexts:
            rows = self._q("SELECT block_id, eps_spent, delta_spent, rdp, charges FROM budgets "
                           "WHERE stream = ? AND context = ?", (stream, context)).fetchall()
            derived = self._derived_states(s, context)
            for block_id, e, d, rdp, charges in rows:
                problems += budget.problems(s, f"{context}/{block_id}", (e, d, rdp, charges),
                                            derived.get(block_id) or budget.fresh(s))
        for b, loc, mine in self._q(  # blocks.location is NOT NULL: None = no block
                "SELECT u.block_id, b.location, u.location FROM budgets u LEFT JOIN blocks b ON "
                "b.stream = u.stream AND b.block_id = u.block_id WHERE u.stream = ? AND "
                "(b.block_id "
                "IS NULL OR u.location <> b.location)", (stream,)).fetchall():
            problems.append(f"budget row of {b} has no block" if loc is None else
                            f"budget row of {b} has location {mine!r}, its block {loc!r}")
        log = self.audit_log(stream)
        audited = {e.payload["grant_id"] for e in log if e.kind == "grant"}
        status = dict(self._q("SELECT grant_id, status FROM grants WHERE stream = ?",
                              (stream,)).fetchall())
        for gid in status:
            if gid not in audited:
                problems.append(f"grant {gid} has no audit entry")
        return problems + self._release_problems(stream, log, status)

    def _release_problems(self, stream: str, log: list[AuditEntry], status: dict) -> list[str]:
        """Every recorded release: its grant released, its audit entry, its bytes' digest."""
        logged = {(e.payload["grant_id"], e.payload["name"]): e.payload["digest"]
                  for e in log if e.kind == "record_release"}
        problems = []
        for gid, name, digest, value in self._q(
                "SELECT grant_id, name, digest, value FROM releases WHERE stream = ?",
                (stream,)).fetchall():
            where = f"release {name!r} of grant {gid}"
            if status.get(gid) != RELEASED:
                problems.append(f"{where}: the grant is {status.get(gid) or 'missing'}")
            if logged.get((gid, name)) != digest:
                problems.append(f"{where}: digest differs from its audit entry")
            if value is not None and releases.digest_bytes(bytes(value)) != digest:
                problems.append(f"{where}: recorded bytes do not match the digest")
        return problems
