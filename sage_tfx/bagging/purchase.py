"""A purchase of noisy labels under a grant: the public cursor in the ledger, and release once.

A purchase asks a window's teachers for the noisy labels of a range of public points, paid for by
one grant. Callers retry, restart and run purchases side by side; two rules keep one charge to
one release and keep purchases apart (issue: three concurrent purchases once labelled the same
points, and a repeated purchase under one grant drew fresh noisy votes).

* **The public cursor is a ledger counter** (``bagging/cursor/<window key>``,
  :meth:`~sage_tfx.ledger.core.Ledger.next_range`: one atomic update in the ledger's database, so
  it holds across threads, processes and machines). A purchase reserves its range *before* any
  vote, of a data-independent size: the p labels the grant pays for (``fixed_queries``), or
  ``max_labels`` public points (default: the rest of the public set) in paper mode, whose
  data-dependent answer count must not show in the cursor. Two purchases never share a point.
* **Release once** (:mod:`sage_tfx.ledger.releases`). The labels, their range and the privacy
  report are recorded against the grant under :data:`LABELS_RELEASE` before they are returned.
  A replay (the same process, a new process, another cache directory, a concurrent twin) gets
  the recorded bytes back: no vote, no noise, no private data read, no cursor moved, no charge.
  Another request under the same grant (another λ, window or public set) is refused with
  ``ReleaseConflictError`` naming the first. When two processes race, both may reserve a range
  and vote, but only the first record is ever published; the loser's range stays unused.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Callable, Optional

import numpy as np

from sage_tfx.bagging.cache import cache_key
from sage_tfx.bagging.labelling import LabellingResult
from sage_tfx.errors import InvalidRequestError, MissingGrantError, ReleaseConflictError

__all__ = ["LABELS_RELEASE", "MODEL_RELEASE", "Purchase", "cursor_name", "public_digest",
           "purchase_request", "reservation", "recorded_purchase", "buy_labels"]

LABELS_RELEASE = "bagging/labels"      # a purchase's labels, range and report
MODEL_RELEASE = "bagging/model"        # DPBaggingTrainer's model directory (student + report)
_CURSOR_PREFIX = "bagging/cursor/"
_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Purchase:
    """What a purchase released: labels of public points ``public_start, …`` and the report."""

    labels: np.ndarray
    public_start: int
    report: dict
    replayed: bool
    digest: str

    @property
    def public_index(self) -> np.ndarray:
        """Indices of the labelled public points: ``public_start`` onwards, one per label."""
        return np.arange(self.public_start, self.public_start + len(self.labels))

    def labelling(self) -> LabellingResult:
        """The purchase as a :class:`LabellingResult` (labels, public range, report)."""
        return LabellingResult.from_report(self.labels, self.public_start, self.report)


def public_digest(X_public) -> str:
    """SHA-256 of the (scaled) public features, shape included: which public set was labelled."""
    X = np.ascontiguousarray(np.asarray(X_public, dtype=np.float64))
    h = hashlib.sha256(json.dumps(list(X.shape)).encode())
    h.update(X.tobytes())
    return h.hexdigest()


def cursor_name(*, stream: str, blocks, config, salt: bytes, settings: dict) -> str:
    """The ledger counter of a window's public cursor (one per window and teacher set)."""
    return _CURSOR_PREFIX + cache_key(stream=stream, blocks=blocks, k=config.k, n=config.n,
                                      salt=salt, kind=config.teacher, settings=settings)


def purchase_request(config, *, stream: str, blocks, salt: bytes, X_public, settings: dict,
                     max_labels: Optional[int]) -> dict:
    """The public description of a purchase; a replay must ask for exactly the same."""
    return {"k": config.k, "n": config.n, "lambda": float(config.lam), "mode": config.mode,
            "accountant": config.accountant, "vote_mechanism": config.votes,
            "teacher": config.teacher, "l2": float(config.l2),
            "not_differentially_private": bool(config.accept_not_differentially_private),
            "stream": stream, "blocks": sorted(blocks),
            "salt_sha256": hashlib.sha256(salt).hexdigest(), "settings": settings,
            "public_sha256": public_digest(X_public), "public_size": int(len(X_public)),
            "max_labels": max_labels}


def reservation(queries: Optional[int], *, public_size: int, max_labels: Optional[int]) -> int:
    """How many public points a purchase reserves, from public facts only.

    fixed_queries (``queries`` = p from the grant): exactly p, and ``max_labels`` must be unset;
    paper mode (``queries`` None): ``max_labels``, default the whole public set.
    """
    if max_labels is not None and (isinstance(max_labels, bool) or not isinstance(
            max_labels, (int, np.integer)) or max_labels < 1):
        raise InvalidRequestError(f"max_labels must be an integer >= 1, got {max_labels!r}")
    if queries is not None:
        if max_labels is not None:
            raise InvalidRequestError("max_labels applies to paper mode only: in fixed_queries "
                                      "the grant decides how many labels are bought")
        return int(queries)
    return int(public_size if max_labels is None else max_labels)


def _encode(request: dict, start: int, reserved: int, result: LabellingResult) -> bytes:
    report = {**result.report(), "public_start": int(start), "public_reserved": int(reserved)}
    doc = {"format": _FORMAT, "request": request, "public_start": int(start),
           "labels": [int(v) for v in result.labels], "report": report}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _decode(grant_id: str, name: str, value: bytes, request: dict, *, replayed: bool,
            digest: str) -> Purchase:
    doc = json.loads(value)
    if doc.get("format") != _FORMAT:
        raise InvalidRequestError(f"release {name!r} of grant {grant_id} is not a label purchase")
    first = doc["request"]
    if first != request:
        diff = sorted(k for k in set(first) | set(request) if first.get(k) != request.get(k))
        raise ReleaseConflictError(
            f"grant {grant_id} already bought labels ({name!r}, sha256 {digest[:16]}…) for "
            f"another request (differs in {diff}): one charge buys one release; a replay must ask "
            "for the same purchase, a new purchase needs a new grant")
    return Purchase(np.asarray(doc["labels"], dtype=np.int64), int(doc["public_start"]),
                    doc["report"], replayed, digest)


def recorded_purchase(ledger, grant_id: str, request: dict,
                      name: str = LABELS_RELEASE) -> Optional[Purchase]:
    """The purchase recorded under (grant, ``name``), or None; checked against ``request``.

    Raises:
      ReleaseConflictError: the grant bought labels for another request.
    """
    from sage_tfx.ledger.releases import digest_bytes
    rec = ledger.recorded_release(grant_id, name)
    if rec is None:
        return None
    if rec.value is None or digest_bytes(rec.value) != rec.digest:
        raise MissingGrantError(f"the recorded release {name!r} of grant {grant_id} is not the "
                                "purchase it names (no bytes, or bytes that do not match the "
                                "digest): it cannot be replayed, and it is never re-drawn")
    return _decode(grant_id, name, rec.value, request, replayed=True, digest=rec.digest)


def buy_labels(ledger, grant_id: str, *, request: dict, cursor: str, reserve: int,
               exact: bool, public_size: int, label: Callable[[int, int], LabellingResult],
               name: str = LABELS_RELEASE) -> Purchase:
    """The labels released under (grant, ``name``): recorded ones, or a new purchase, recorded.

    Args:
      ledger: the ledger that charged ``grant_id`` (released).
      request: :func:`purchase_request`; stored with the release and compared on replay.
      cursor: :func:`cursor_name` of the window.
      reserve: :func:`reservation`: public points taken from the cursor before any vote.
      exact: the purchase needs all ``reserve`` points (fixed_queries) rather than at least one.
      label: ``label(start, stop)`` trains or loads the teachers and draws the noisy labels of
        public points [start, stop); called only when nothing is recorded.

    Raises:
      InvalidRequestError: the cursor has too few public points left (checked before anything
        moves, and again on the reserved range).
      ReleaseConflictError: the grant already bought labels for another request.
    """
    from sage_tfx.ledger.releases import release_value_once

    first = recorded_purchase(ledger, grant_id, request, name)
    if first is not None:
        return first
    need = reserve if exact else 1
    if ledger.counter(cursor) + need > public_size:
        raise InvalidRequestError(
            f"this purchase needs {need} unlabelled public points but only "
            f"{max(0, public_size - ledger.counter(cursor))} of {public_size} are left for this "
            "window: every public point is labelled once")

    def produce() -> bytes:
        start = ledger.next_range(cursor, reserve)
        stop = min(start + reserve, public_size)
        if stop - start < need:
            raise InvalidRequestError(
                f"another purchase took the public points first: {max(0, stop - start)} of the "
                f"{need} needed are left for this window")
        result = label(start, stop)
        if exact and result.queries != reserve:
            raise InvalidRequestError(f"labelled {result.queries} points where the grant pays "
                                      f"for {reserve}: refusing to release")
        return _encode(request, start, stop - start, result)

    outcome = release_value_once(ledger, grant_id, name, produce)
    return _decode(grant_id, name, outcome.value, request, replayed=outcome.replayed,
                   digest=outcome.release.digest)
