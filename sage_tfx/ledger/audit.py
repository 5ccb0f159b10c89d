"""The audit log: a hash chain over every grant, denial, retirement and configuration change.

Each entry's hash covers the previous entry's hash, its sequence number, time, stream, kind and
payload; the ledger head row stores the last (seq, hash), so deleting the newest entries is
detected as well as editing or removing any other. Entries are appended inside the write
transaction that makes the change they record, so an entry exists iff its change committed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Optional

from sage_tfx.ledger.values import now

GENESIS_HASH = "0" * 64


@dataclasses.dataclass(frozen=True)
class AuditEntry:
    seq: int
    ts: str
    stream: Optional[str]
    kind: str
    payload: dict
    prev_hash: str
    hash: str


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """Result of verifying the audit hash chain."""

    ok: bool
    entries: int
    first_bad_seq: Optional[int] = None
    message: str = ""


def entry_hash(prev_hash: str, seq: int, ts: str, stream: Optional[str], kind: str,
               payload_text: str) -> str:
    """SHA-256 of one entry, chained to ``prev_hash``."""
    material = json.dumps([prev_hash, seq, ts, stream, kind, payload_text], separators=(",", ":"))
    return hashlib.sha256(material.encode()).hexdigest()


def append(store, stream: Optional[str], kind: str, payload: dict) -> None:
    """Appends one entry to the chain; call inside the write transaction of the change it records."""
    seq, prev = store.q("SELECT audit_seq, audit_hash FROM ledger_head WHERE id = 1").fetchone()
    seq += 1
    ts = now()
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    digest = entry_hash(prev, seq, ts, stream, kind, text)
    store.q("INSERT INTO audit (seq, ts, stream, kind, payload, prev_hash, hash) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)", (seq, ts, stream, kind, text, prev, digest))
    store.q("UPDATE ledger_head SET audit_seq = ?, audit_hash = ? WHERE id = 1", (seq, digest))


def read(store, stream: Optional[str] = None, limit: Optional[int] = None) -> list[AuditEntry]:
    """Audit entries, oldest first (the last ``limit`` if given)."""
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


def verify(store) -> AuditReport:
    """Recomputes the hash chain from the first entry to the head; reports the first break."""
    prev = GENESIS_HASH
    n = 0
    cur = store.q("SELECT seq, ts, stream, kind, payload, prev_hash, hash FROM audit ORDER BY seq")
    for seq, ts, stream, kind, payload, prev_hash, digest in cur:
        n += 1
        if seq != n:
            return AuditReport(False, n - 1, seq, f"entry {n} is missing (found seq {seq})")
        if prev_hash != prev or entry_hash(prev, seq, ts, stream, kind, payload) != digest:
            return AuditReport(False, n - 1, seq, f"entry {seq} does not match its hash chain")
        prev = digest
    head_seq, head_hash = store.q(
        "SELECT audit_seq, audit_hash FROM ledger_head WHERE id = 1").fetchone()
    if head_seq != n or head_hash != prev:
        return AuditReport(False, n, n + 1,
                           f"chain ends at entry {n} but the head records entry {head_seq}")
    return AuditReport(True, n, None, f"{n} entries, chain intact")
