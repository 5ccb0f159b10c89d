"""Load generation against a ledger: many writer processes issuing overlapping requests.

Used by the concurrency/crash tests and by ``benchmarks/sage/bench_ledger.py``. Each writer is a
separate OS process with its own connection, as pipelines on different machines would be.

Workloads (every request asks for ``blocks_per_request`` blocks):

* ``random``: explicit contiguous ranges at random positions (writers overlap now and then);
* ``disjoint``: explicit ranges inside the writer's own slice of the stream (never overlap);
* ``window``: ``Window(last=blocks_per_request)``, the newest blocks: every writer asks for the
  same blocks (fully overlapping).
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import random
import resource
import signal
import time
from typing import Optional

from sage_tfx.errors import RetiredBlockError
from sage_tfx.ledger import BlockSpec, Window, open_ledger

WORKLOADS = ("random", "disjoint", "window")


@dataclasses.dataclass(frozen=True)
class WriterPlan:
    """What one writer process does."""

    url: str
    stream: str
    writer: int
    requests: int
    num_blocks: int
    blocks_per_request: int
    epsilon: float
    delta: float = 0.0
    seed: int = 0
    kill_before_commit_at: Optional[int] = None  # SIGKILL itself inside this request's txn
    workload: str = "random"
    writers: int = 1  # how many writers share the stream (slices of the disjoint workload)
    start_at: Optional[float] = None  # time.time() to start at (all writers together)
    duration: Optional[float] = None  # stop issuing requests this many seconds after start_at
    ack_path: Optional[str] = None  # append "run_id grant_id" here once a grant is acknowledged


@dataclasses.dataclass(frozen=True)
class WriterResult:
    """One writer process's results: grants, denials, latencies and peak memory."""

    writer: int
    granted: list  # (run_id, grant_id, block_ids, epsilon)
    denied: int
    latencies: list  # seconds per request
    maxrss_kb: int = 0  # peak resident memory of the writer process


def setup_stream(url: str, stream: str, num_blocks: int, *, epsilon_g: float = 1.0,
                 delta_g: float = 1e-6, mode: str = "basic") -> None:
    """Creates a stream with ``num_blocks`` blocks (added in chunks, one transaction each)."""
    led = open_ledger(url)
    try:
        led.create_stream(stream, epsilon_g=epsilon_g, delta_g=delta_g, mode=mode)
        chunk = 10_000
        for start in range(0, num_blocks, chunk):
            led.add_blocks(stream, [BlockSpec(f"b{i:07d}", f"/blocks/{stream}/b{i:07d}")
                                    for i in range(start, min(num_blocks, start + chunk))])
    finally:
        led.close()


def run_writer(plan: WriterPlan) -> WriterResult:
    """Issues ``plan.requests`` requests (or requests for ``plan.duration`` seconds)."""
    if plan.workload not in WORKLOADS:
        raise ValueError(f"unknown workload {plan.workload!r}; choose from {WORKLOADS}")
    rng = random.Random(plan.seed * 1000 + plan.writer)
    led = open_ledger(plan.url)
    granted, denied, latencies = [], 0, []
    lo, hi = 0, plan.num_blocks
    if plan.workload == "disjoint":
        width = plan.num_blocks // plan.writers
        lo, hi = plan.writer * width, (plan.writer + 1) * width
        if hi - lo < plan.blocks_per_request:
            raise ValueError(f"{plan.writers} disjoint slices of {plan.num_blocks} blocks are "
                             f"narrower than {plan.blocks_per_request} blocks")
    if plan.start_at is not None:
        time.sleep(max(0.0, plan.start_at - time.time()))
    stop = None if plan.duration is None else (plan.start_at or time.time()) + plan.duration
    # Unbuffered appends: an acknowledgement written here survives this process's SIGKILL.
    ack_fd = (os.open(plan.ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
              if plan.ack_path else None)
    try:
        for i in range(plan.requests):
            if stop is not None and time.time() >= stop:
                break
            if plan.kill_before_commit_at == i:
                led._store.before_commit = lambda: os.kill(os.getpid(), signal.SIGKILL)
            run_id = f"w{plan.writer}-s{plan.seed}-r{i}"
            if plan.workload == "window":
                where: dict = {"window": Window(last=plan.blocks_per_request)}
            else:
                first = rng.randrange(lo, hi - plan.blocks_per_request + 1)
                where = {"blocks": [f"b{k:07d}" for k in
                                    range(first, first + plan.blocks_per_request)]}
            t0 = time.perf_counter()
            try:
                d = led.request(plan.stream, run_id=run_id, epsilon=plan.epsilon,
                                delta=plan.delta, **where)
            except RetiredBlockError:  # another writer used the block up first
                latencies.append(time.perf_counter() - t0)
                denied += 1
                continue
            latencies.append(time.perf_counter() - t0)
            if d.granted:
                granted.append((run_id, d.grant.grant_id, d.grant.block_ids, plan.epsilon))
                if ack_fd is not None:
                    os.write(ack_fd, f"{run_id} {d.grant.grant_id}\n".encode())
            else:
                denied += 1
    finally:
        led.close()
        if ack_fd is not None:
            os.close(ack_fd)
    return WriterResult(plan.writer, granted, denied, latencies,
                        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _child(plan: WriterPlan, queue) -> None:
    queue.put(run_writer(plan))


def run_writers(plans: list[WriterPlan], timeout: float = 600.0) -> list[Optional[WriterResult]]:
    """Runs each plan in its own process; a process that died yields None."""
    # fork: children inherit the imported modules (spawn would re-import dp_accounting and
    # SciPy in each of 16 processes). Children open their own database connections.
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(p, queue)) for p in plans]
    for p in procs:
        p.start()
    results: dict[int, WriterResult] = {}
    deadline = time.time() + timeout
    alive = set(range(len(procs)))
    while alive and time.time() < deadline:
        try:
            r = queue.get(timeout=0.2)
            results[r.writer] = r
        except Exception:  # queue.Empty
            pass
        for k in list(alive):
            if not procs[k].is_alive() and plans[k].writer not in results:
                # Drain anything it put before exiting.
                try:
                    while True:
                        r = queue.get(timeout=0.5)
                        results[r.writer] = r
                except Exception:
                    pass
                if plans[k].writer not in results:
                    alive.discard(k)
            elif plans[k].writer in results:
                alive.discard(k)
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    return [results.get(p.writer) for p in plans]
