"""The ``dnd_*`` tables of a served Draw-and-Discard run (their schema) and the errors and
rate limit of :mod:`sage_tfx.dnd.runstore`, which re-exports them."""
from __future__ import annotations

import dataclasses

from sage_tfx.dnd.budget import UpdateRefused
from sage_tfx.errors import InvalidRequestError, SageError

MAX_TTL = 86400.0


class UnknownTicketError(KeyError):
    """A discard with a ticket that was never issued, already used, expired, or drawn by
    another principal."""


class RunReleasedError(SageError):
    """The run's model was released: it takes no more draws or updates (HTTP 409)."""


class RateLimitedError(UpdateRefused):
    """The principal drew its ``limit`` updates of the current rate window (HTTP 429);
    ``retry_after`` seconds until the next window."""

    def __init__(self, message: str, retry_after: float):
        super().__init__(message)
        self.retry_after = float(retry_after)


@dataclasses.dataclass(frozen=True)
class RateLimit:
    """At most ``draws`` draws (so updates) per principal in every aligned window of ``seconds``
    (windows start at multiples of ``seconds`` of the database clock): at most 2·draws in any
    interval of ``seconds``, and draws·⌈T/seconds⌉ + draws over T seconds."""

    draws: int
    seconds: float

    def __post_init__(self):
        if isinstance(self.draws, bool) or not isinstance(self.draws, int) or self.draws < 1:
            raise InvalidRequestError(f"the rate limit must be >= 1 draw per window, got "
                                      f"{self.draws!r}")
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float)) \
                or not 0 < self.seconds <= MAX_TTL:
            raise InvalidRequestError(f"the rate window must be in (0, {MAX_TTL:g}] seconds, "
                                      f"got {self.seconds!r}")


def _tables(b) -> list[str]:
    i, blob = b.bigint, b.blob
    return [
        f"""CREATE TABLE IF NOT EXISTS dnd_runs (
            grant_id TEXT PRIMARY KEY, stream TEXT NOT NULL, run_id TEXT NOT NULL,
            settings TEXT NOT NULL, k {i} NOT NULL, dim {i} NOT NULL, passes {i} NOT NULL,
            version {i} NOT NULL, accepted {i} NOT NULL, rejected {i} NOT NULL,
            released_at TEXT, created_at TEXT NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS dnd_instances (
            grant_id TEXT NOT NULL, slot {i} NOT NULL, version {i} NOT NULL,
            weights {blob} NOT NULL, PRIMARY KEY (grant_id, slot))""",
        f"""CREATE TABLE IF NOT EXISTS dnd_versions (
            grant_id TEXT NOT NULL, version {i} NOT NULL, slot {i} NOT NULL,
            digest TEXT NOT NULL, created_at TEXT NOT NULL, PRIMARY KEY (grant_id, version))""",
        f"""CREATE TABLE IF NOT EXISTS dnd_passes (
            grant_id TEXT NOT NULL, principal TEXT NOT NULL, used {i} NOT NULL,
            draws {i} NOT NULL, PRIMARY KEY (grant_id, principal))""",
        f"""CREATE TABLE IF NOT EXISTS dnd_tickets (
            grant_id TEXT NOT NULL, ticket_sha256 TEXT NOT NULL, principal TEXT NOT NULL,
            blocks TEXT NOT NULL, issued_at {b.real} NOT NULL, expires_at {b.real} NOT NULL,
            PRIMARY KEY (grant_id, ticket_sha256))""",
        "CREATE INDEX IF NOT EXISTS dnd_tickets_principal ON dnd_tickets "
        "(grant_id, principal, expires_at)",
        "CREATE INDEX IF NOT EXISTS dnd_tickets_expiry ON dnd_tickets (grant_id, expires_at)",
        f"""CREATE TABLE IF NOT EXISTS dnd_drawn (
            grant_id TEXT NOT NULL, ticket_sha256 TEXT NOT NULL, slot {i} NOT NULL,
            version {i} NOT NULL, PRIMARY KEY (grant_id, ticket_sha256))""",
        "CREATE INDEX IF NOT EXISTS dnd_drawn_slot ON dnd_drawn (grant_id, slot, version)",
        f"""CREATE TABLE IF NOT EXISTS dnd_retired (
            grant_id TEXT NOT NULL, slot {i} NOT NULL, version {i} NOT NULL,
            weights {blob} NOT NULL, PRIMARY KEY (grant_id, slot, version))""",
        f"""CREATE TABLE IF NOT EXISTS dnd_rate (
            grant_id TEXT NOT NULL, principal TEXT NOT NULL, window_start {b.real} NOT NULL,
            draws {i} NOT NULL, PRIMARY KEY (grant_id, principal))""",
    ]
