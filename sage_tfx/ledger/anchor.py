"""Audit anchors: the audit chains' heads written outside the database they protect.

The hash chains of :mod:`~sage_tfx.ledger.audit` live in the ledger's own database, so whoever
can write that database can rewrite history consistently (edit an entry and re-hash everything
after it), cut the newest entries off and move the head back, or restore an older copy of the
whole database. None of that breaks the chains. An *anchor* is a line appended to a file kept
elsewhere (another disk, another machine, a WORM bucket) holding every chain's head (last seq
and hash) at one moment; :func:`verify_anchors` then checks, on one snapshot of the ledger, that

* every chain still verifies from genesis to its head (:meth:`Ledger.verify_audit`);
* every anchored entry is still there with the anchored hash (a rewritten entry, or one replaced
  after a rollback, has another hash: the hash of an entry covers every entry before it);
* no chain's head is older than an anchored entry (a truncated tail, or a rollback to a copy
  taken before the anchor).

Each anchor line also carries the SHA-256 of the line before it, so editing, dropping or
reordering lines inside the file is detected; with a key file every line carries an HMAC-SHA256
and a forger without the key cannot write a line that verifies. What happened after the last
anchor is protected by the chains only: anchor often (the demo pipeline anchors after every
step). Dropping trailing lines of the anchor file is the file store's to prevent (append-only
storage), which is why it must live outside the database's trust domain.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import hmac
import json
import os
from typing import Optional

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import audit
from sage_tfx.ledger.values import now

ANCHOR_VERSION = 1
_FIRST_PREV = "0" * 64


@dataclasses.dataclass(frozen=True)
class AnchorReport:
    """Result of checking a ledger against an anchor file."""

    ok: bool
    anchors: int
    problems: tuple[str, ...]
    message: str


def read_key(path: str) -> bytes:
    """The HMAC key in a key file (its raw bytes; at least 16 of them)."""
    try:
        with open(path, "rb") as f:
            key = f.read()
    except OSError as exc:
        raise InvalidRequestError(f"cannot read anchor key file {path!r}: {exc}") from exc
    if len(key.strip()) < 16:
        raise InvalidRequestError(f"anchor key file {path!r} holds {len(key.strip())} bytes; "
                                  "use at least 16 random bytes")
    return key


def _canonical(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def _mac(key: bytes, record: dict) -> str:
    body = {k: v for k, v in record.items() if k != "mac"}
    return hmac.new(key, _canonical(body), hashlib.sha256).hexdigest()


def write_anchor(ledger, path: str, key: Optional[bytes] = None) -> dict:
    """Appends the ledger's current chain heads to the anchor file at ``path``; returns the record.

    The file is opened for appending only, locked while the line is written, and fsynced.
    """
    heads = ledger.audit_heads()
    record = {"v": ANCHOR_VERSION, "ts": now(), "backend": ledger.backend,
              "chains": len(heads), "entries": max((s for s, _ in heads.values()), default=0),
              "heads": {str(c): [s, h] for c, (s, h) in sorted(heads.items()) if s > 0}}
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with open(path, "rb") as f:
            lines = f.read().splitlines()
        record["prev"] = hashlib.sha256(lines[-1]).hexdigest() if lines else _FIRST_PREV
        if key is not None:
            record["mac"] = _mac(key, record)
        os.write(fd, _canonical(record) + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    return record


def _read_anchors(path: str, key: Optional[bytes], problems: list) -> list[tuple[int, dict]]:
    """The anchor file's records ``(line number, record)``, checking its line links and MACs."""
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise InvalidRequestError(f"cannot read anchor file {path!r}: {exc}") from exc
    out = []
    prev = _FIRST_PREV
    for n, line in enumerate(lines, start=1):
        try:
            rec = json.loads(line)
            heads = {int(c): (int(v[0]), str(v[1])) for c, v in rec["heads"].items()}
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            problems.append(f"anchor line {n} is not an anchor record")
            prev = hashlib.sha256(line).hexdigest()
            continue
        if rec.get("prev") != prev:
            problems.append(f"anchor line {n} does not follow line {n - 1}: the anchor file was "
                            "edited (a line changed, removed or moved)")
        if key is not None and not hmac.compare_digest(str(rec.get("mac", "")), _mac(key, rec)):
            problems.append(f"anchor line {n} has no valid HMAC under the key")
        prev = hashlib.sha256(line).hexdigest()
        out.append((n, {**rec, "heads": heads}))
    return out


def verify_anchors(ledger, path: str, key: Optional[bytes] = None) -> AnchorReport:
    """Checks the ledger's audit chains against every anchor in the file (see module docs)."""
    problems: list[str] = []
    anchors = _read_anchors(path, key, problems)
    last: dict[int, int] = {}
    for n, rec in anchors:
        for c, (seq, _) in rec["heads"].items():
            if seq < last.get(c, 0):
                problems.append(f"anchor line {n}: chain {c} went back from entry {last[c]} to "
                                f"{seq}")
            last[c] = max(seq, last.get(c, 0))
    seqs = sorted({seq for _, rec in anchors for seq, _ in rec["heads"].values()})
    store = ledger._store

    def snapshot():
        chains = audit.verify(store, contiguous=store.kind == "sqlite")
        found: dict[int, tuple[int, str]] = {}
        for k in range(0, len(seqs), 500):
            chunk = seqs[k:k + 500]
            found.update({int(r[0]): (int(r[1]), r[2]) for r in store.q(
                f"SELECT seq, chain, hash FROM audit WHERE seq IN ({','.join('?' * len(chunk))})",
                chunk).fetchall()})
        return chains, audit.heads(store), found

    chains, heads, found = store.read_snapshot(snapshot)
    if not chains.ok:
        problems.append(f"audit chain broken: {chains.message}")
    reported: set = set()
    for n, rec in anchors:
        for c, (seq, digest) in sorted(rec["heads"].items()):
            head_seq = heads.get(c, (0, ""))[0]
            if c not in heads or head_seq < seq:
                msg = (f"chain {c} ends at entry {head_seq}, before entry {seq} anchored on line "
                       f"{n} ({rec.get('ts')}): the tail was truncated or the database rolled "
                       "back to an older copy")
            elif seq not in found:
                msg = f"entry {seq} anchored on line {n} is missing"
            elif found[seq] != (c, digest):
                msg = (f"entry {seq} differs from its anchor on line {n} ({rec.get('ts')}): "
                       "history up to it was rewritten or replaced")
            else:
                continue
            if (c, seq) not in reported:
                reported.add((c, seq))
                problems.append(msg)
    ok = not problems
    message = (f"{len(anchors)} anchor(s) checked: the ledger holds every anchored head"
               if ok else f"{len(problems)} problem(s) against {len(anchors)} anchor(s)")
    if key is None and any("mac" in rec for _, rec in anchors):
        message += " (the lines carry HMACs, not checked: no key given)"
    return AnchorReport(ok, len(anchors), tuple(problems), message)
