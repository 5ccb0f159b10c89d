"""The audit log: hash chains over every grant, denial, retirement and configuration change.

Each entry's hash covers the previous entry's hash in its chain, its sequence number, time,
stream, kind and payload. Entries carry one global sequence number (``seq``), and belong to one
of the ledger's chains; every chain's head row (``ledger_head``, one row per chain) stores the
chain's last (seq, hash), so deleting the newest entries is detected as well as editing or
removing any other. Entries are appended inside the write transaction that makes the change they
record, so an entry exists iff its change committed.

**Ordering.** SQLite has one writer at a time and one chain (chain 1); its ``seq`` is contiguous.
PostgreSQL writers append to any chain whose head row is free (``FOR UPDATE SKIP LOCKED``), so
grants on different blocks never wait for one another on the audit. ``seq`` comes from a
sequence drawn *after* the writer holds its row locks on the blocks and its chain head, so:

* within a chain, ``seq`` increases along the links (the head is held until commit);
* two transactions that touch a common block are ordered by ``seq`` as they committed (the second
  draws its ``seq`` only after the first released the block's lock);

so ordering all entries by ``seq`` is a total order that agrees with every chain and with every
block's history, and :func:`verify` checks both. ``seq`` may have gaps on PostgreSQL (a rolled
back transaction consumes its number); a missing entry is still detected by its chain's links.

What the database holds can be rewritten consistently by whoever controls it, or rolled back to
an older copy: :mod:`~sage_tfx.ledger.anchor` writes chain heads outside it and checks them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Optional

GENESIS_HASH = "0" * 64


@dataclasses.dataclass(frozen=True)
class AuditEntry:
    """One hash-chained audit log entry."""

    seq: int
    ts: str
    stream: Optional[str]
    kind: str
    payload: dict
    prev_hash: str
    hash: str


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """Result of verifying the audit hash chains."""

    ok: bool
    entries: int
    first_bad_seq: Optional[int] = None
    message: str = ""


def entry_hash(prev_hash: str, seq: int, ts: str, stream: Optional[str], kind: str,
               payload_text: str) -> str:
    """SHA-256 of one entry, chained to ``prev_hash``."""
    material = json.dumps([prev_hash, seq, ts, stream, kind, payload_text], separators=(",", ":"))
    return hashlib.sha256(material.encode()).hexdigest()


def payload_text(payload: dict) -> str:
    """The canonical text of a payload, as stored and hashed."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def link(head: tuple[int, str], seqs: list[int], ts: str,
         entries: list[tuple[Optional[str], str, str]]) -> list[tuple]:
    """Chains ``entries`` ``(stream, kind, payload_text)`` after ``head`` (last seq, last hash).

    Returns the audit rows ``(seq, ts, stream, kind, payload, prev_hash, hash)``.
    """
    prev = head[1]
    rows = []
    for seq, (stream, kind, text) in zip(seqs, entries):
        digest = entry_hash(prev, seq, ts, stream, kind, text)
        rows.append((seq, ts, stream, kind, text, prev, digest))
        prev = digest
    return rows


def read(store, stream: Optional[str] = None, limit: Optional[int] = None) -> list[AuditEntry]:
    """Audit entries in ``seq`` order (the last ``limit`` if given)."""
    sql = "SELECT seq, ts, stream, kind, payload, prev_hash, hash FROM audit"
    params: list = []
    if stream is not None:
        sql += " WHERE stream = ?"
        params.append(stream)
    sql += " ORDER BY seq DESC" if limit else " ORDER BY seq"
    if limit:
        sql += " LIMIT ?"
        params.append(int(limit))
    rows = store.q(sql, params).fetchall()
    if limit:
        rows.reverse()
    return [AuditEntry(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6]) for r in rows]


def heads(store) -> dict[int, tuple[int, str]]:
    """Every chain's head: chain -> (last seq, last hash); (0, GENESIS_HASH) for an empty chain."""
    return {int(c): (int(s), h) for c, s, h in store.q(
        "SELECT id, audit_seq, audit_hash FROM ledger_head ORDER BY id").fetchall()}


def verify(store, contiguous: bool) -> AuditReport:
    """Recomputes every chain from genesis to its head; reports the first break.

    Call inside one read snapshot. ``contiguous``: ``seq`` must run 1, 2, 3, ... (one chain).
    """
    head_rows = heads(store)
    tips = {c: (0, GENESIS_HASH) for c in head_rows}
    n = 0
    last_seq = 0
    cur = store.q("SELECT seq, ts, stream, kind, payload, prev_hash, hash, chain FROM audit "
                  "ORDER BY seq")
    for seq, ts, stream, kind, payload, prev_hash, digest, chain in cur:
        n += 1
        if contiguous and seq != last_seq + 1:
            return AuditReport(False, n - 1, seq, f"entry {last_seq + 1} is missing "
                                                  f"(found seq {seq})")
        last_seq = seq
        if chain not in tips:
            return AuditReport(False, n - 1, seq, f"entry {seq} names unknown chain {chain}")
        if prev_hash != tips[chain][1] or entry_hash(prev_hash, seq, ts, stream, kind,
                                                     payload) != digest:
            return AuditReport(False, n - 1, seq, f"entry {seq} does not match its hash chain")
        tips[chain] = (seq, digest)
    for chain, head in head_rows.items():
        if tips[chain] != head:
            return AuditReport(False, n, tips[chain][0] + 1,
                               f"chain {chain} ends at entry {tips[chain][0]} but its head "
                               f"records entry {head[0]}")
    return AuditReport(True, n, None, f"{n} entries in {len(head_rows)} chain(s), intact")
