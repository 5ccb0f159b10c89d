"""A bounded asyncio client simulator for the Draw-and-Discard service (127.0.0.1 only).

``concurrency`` workers share a pool of clients, each a bearer token the ledger issued to a
``client`` principal (the server keys passes by principal); each update is a draw, a local
update and a discard with one client's token over one keep-alive HTTP connection (httpx). The run is
bounded by ``updates`` and by ``timeout`` seconds. Every accepted update's SHA-256 is recorded, so a
test can check that every slot of the server is an initial instance or an accepted update (no lost
or torn instances).
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import time
import urllib.parse
from typing import Callable, Sequence

import numpy as np

from sage_tfx.dnd.server import BINARY, TICKET_HEADER, decode, encode
from sage_tfx.dnd.wire import UPDATE_TYPE, decode_update, encode_update

MAX_UPDATES = 1_000_000
LOCAL_HOSTS = ("127.0.0.1", "localhost")
# How a client sends its update: raw float64 bytes, the framed encoding with float32 or float64
# weights (sage_tfx.dnd.wire), or JSON.
ENCODINGS = ("raw", "framed32", "framed64", "json")


@dataclasses.dataclass
class SimulationResult:
    """What a simulated client load did: updates, refusals, errors, time and latencies."""

    updates: int            # completed draw + discard round trips
    accepted: int
    refused: int            # draws the server refused (budget)
    errors: int             # updates lost to transport errors (connection dropped)
    seconds: float
    latencies: list         # seconds per completed update (draw + local step + discard)
    accepted_hashes: set

    @property
    def updates_per_second(self) -> float:
        """Completed updates per second of wall time."""
        return self.updates / self.seconds if self.seconds > 0 else 0.0

    def latency_quantile(self, q: float) -> float:
        """The ``q`` quantile of the update latencies in seconds (NaN if none completed)."""
        return float(np.quantile(self.latencies, q)) if self.latencies else float("nan")


def weights_hash(w: np.ndarray) -> str:
    """SHA-256 hex digest of a weight vector's wire encoding."""
    return hashlib.sha256(encode(w)).hexdigest()


def _check_local(base_url: str) -> None:
    host = urllib.parse.urlparse(base_url).hostname
    if host not in LOCAL_HOSTS:
        raise ValueError(f"the simulator only talks to 127.0.0.1, not {host!r}")


def bearer(token: str) -> dict:
    """The HTTP header that authenticates with ``token``."""
    return {"authorization": f"Bearer {token}"}


async def simulate(base_url: str, *, updates: int, tokens: Sequence[str], concurrency: int = 16,
                   make_update: Callable[[np.ndarray], np.ndarray], timeout: float = 60.0,
                   stop_on_refusal: bool = True, encoding: str = "raw") -> SimulationResult:
    """Runs at most ``updates`` updates against the service at ``base_url``.

    Args:
      tokens: the clients' bearer tokens, used round-robin (one per update: draw and discard).
      make_update: the client's local step on a drawn instance (e.g. Alg. 1 on its examples).
      stop_on_refusal: a worker stops at its first refusal (a stopped client), else skips on.
      encoding: one of :data:`ENCODINGS` (draws and updates).
    """
    import httpx
    _check_local(base_url)
    if not 1 <= updates <= MAX_UPDATES or not 1 <= concurrency <= 512:
        raise ValueError(f"bounded load only: 1 <= updates <= {MAX_UPDATES}, concurrency <= 512")
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
    if not tokens:
        raise ValueError("the simulator needs at least one client token")
    spec = httpx.get(f"{base_url}/v1/spec", headers=bearer(tokens[0]), timeout=10).json()
    dim = spec["dim"]
    ids = list(tokens)
    next_job = iter(range(updates))
    result = SimulationResult(0, 0, 0, 0, 0.0, [], set())
    deadline = time.perf_counter() + timeout
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def worker(client: "httpx.AsyncClient") -> None:
        for job in next_job:
            if time.perf_counter() > deadline:
                return
            token = ids[job % len(ids)]
            t0 = time.perf_counter()
            try:
                accepted, u = await one_update(client, token)
            except httpx.TransportError:
                result.errors += 1
                continue
            if accepted is None:
                if stop_on_refusal:
                    return
                continue
            result.latencies.append(time.perf_counter() - t0)
            result.updates += 1
            if accepted:
                result.accepted += 1
                result.accepted_hashes.add(weights_hash(u))

    async def one_update(client, token):
        """(accepted, update), or (None, None) if the draw was refused."""
        r = await client.post("/v1/draw", headers={"accept": kind, **bearer(token)})
        if r.status_code in (403, 409):
            result.refused += 1
            return None, None
        r.raise_for_status()
        ticket, w = received(r)
        u = np.asarray(make_update(w), dtype=np.float64)
        body, u = sent(u, ticket)
        r = await client.post(f"/v1/discard/{ticket}", content=body,
                              headers={"content-type": kind, **bearer(token)})
        r.raise_for_status()
        return bool(r.json()["accepted"]), u

    kind = {"raw": BINARY, "json": "application/json"}.get(encoding, UPDATE_TYPE)

    def received(r) -> tuple:
        """The ticket and the drawn instance of a draw's answer."""
        if encoding == "json":
            j = r.json()
            return j["ticket"], np.asarray(j["weights"], dtype=np.float64)
        ticket = r.headers[TICKET_HEADER]
        if encoding == "raw":
            return ticket, decode(r.content, dim)
        return ticket, decode_update(r.content, dim=dim, ticket=ticket)

    def sent(u: np.ndarray, ticket: str) -> tuple:
        """The body and the weights the server will read from it."""
        if encoding == "json":
            return json.dumps({"weights": u.tolist()}).encode(), u
        if encoding == "raw":
            return encode(u), u
        dtype = "float32" if encoding == "framed32" else "float64"
        body = encode_update(ticket, u, dtype)
        return body, decode_update(body, dim=dim, ticket=ticket)

    start = time.perf_counter()
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    result.seconds = time.perf_counter() - start
    return result
