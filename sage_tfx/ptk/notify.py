"""Subscriber notifications: HTTP callbacks from the lake's outbox, with retries, at-least-once.

A notification is ``POST endpoint`` with JSON ``{"ptk_id", "version", "window", "grant_id",
"epsilon", "delta"}``. An outbox row is marked delivered only after a 2xx answer, so a crash
between the POST and the mark re-sends it: delivery is at-least-once, and receivers de-duplicate
on ``(ptk_id, version)``. A failing endpoint is retried ``attempts`` times with exponential
backoff per :meth:`Notifier.deliver` call; rows stay pending until ``max_attempts`` in total, then
are marked failed (kept, with the last error).
"""
from __future__ import annotations

import time
from typing import Optional
from urllib.parse import urlparse

import httpx

from sage_tfx.ptk.abstraction import SubscriberError


def check_endpoint(endpoint: str) -> str:
    """``endpoint`` if it is an http(s) URL with a host; raises SubscriberError otherwise."""
    try:
        u = urlparse(endpoint) if isinstance(endpoint, str) else None
        if u is not None:
            httpx.URL(endpoint)  # what the notifier will send to must parse the same way
    except (ValueError, httpx.InvalidURL):
        u = None
    if u is None or u.scheme not in ("http", "https") or not u.hostname:
        raise SubscriberError(f"a subscriber endpoint must be an http(s) URL, got "
                              f"{str(endpoint)[:200]!r}")
    return endpoint


class Notifier:
    """Delivers the lake's outbox of new-version notifications over HTTP, with retries."""

    def __init__(self, lake, *, attempts: int = 3, max_attempts: int = 10, backoff: float = 0.05,
                 timeout: float = 5.0):
        self.lake = lake
        self.attempts, self.max_attempts = attempts, max_attempts
        self.backoff, self.timeout = backoff, timeout
        self.client = httpx.Client(timeout=timeout)

    def close(self) -> None:
        """Closes the HTTP client."""
        self.client.close()

    def _post(self, endpoint: str, body: dict) -> Optional[str]:
        """POSTs with retries; returns None on success, else the last error."""
        error = None
        for attempt in range(self.attempts):
            try:
                r = self.client.post(endpoint, json=body)
                if 200 <= r.status_code < 300:
                    return None
                error = f"HTTP {r.status_code}"
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                error = f"{type(exc).__name__}: {exc}"
            if attempt + 1 < self.attempts:
                time.sleep(self.backoff * 2 ** attempt)
        return error

    def probe(self, endpoint: str, ptk_id: str) -> None:
        """Checks that a new subscriber answers (a ``{"probe": true}`` POST); else raises."""
        error = self._post(check_endpoint(endpoint), {"probe": True, "ptk_id": ptk_id})
        if error is not None:
            raise SubscriberError(f"subscriber endpoint {endpoint} does not answer: {error}")

    def deliver(self) -> list[dict]:
        """Sends every pending outbox row once (with in-call retries); returns what happened."""
        done = []
        for ptk_id, version, endpoint, attempts in self.lake.pending():
            v = self.lake.version(ptk_id, version)
            body = {"ptk_id": ptk_id, "version": version, "window": v["window_index"],
                    "grant_id": v["grant_id"], "epsilon": v["epsilon"], "delta": v["delta"]}
            error = self._post(endpoint, body)
            status = "delivered" if error is None else (
                "failed" if attempts + 1 >= self.max_attempts else "pending")
            self.lake.mark(ptk_id, version, endpoint, status, error)
            done.append({"ptk_id": ptk_id, "version": version, "endpoint": endpoint,
                         "status": status, "error": error})
        return done
