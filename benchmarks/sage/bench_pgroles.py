"""What PostgreSQL login roles cost the request path: request latency as the ledger's owner on a
ledger without login roles, as the owner once a login role exists (the guard triggers are
installed), and as a pipeline principal's login role (row-level security, guard triggers).

    .venv/bin/python benchmarks/sage/bench_pgroles.py [--requests 400] [--blocks 10]

Starts a throw-away PostgreSQL server (sage_tfx.ledger.pgserver); prints median and p90
latency per configuration, requests interleaved so that machine load hits all alike.
"""
import argparse
import random
import statistics
import time
import urllib.parse
import uuid

from sage_tfx.ledger import BlockSpec, open_ledger, pgserver


def _ledger(base: str, n_blocks: int) -> str:
    url = pgserver.create_database(base, "b" + uuid.uuid4().hex[:10])
    with open_ledger(url) as led:
        led.create_stream("s", epsilon_g=1e9, delta_g=0.5)
        led.add_blocks("s", [BlockSpec(f"b{i}", f"/d/{i}") for i in range(n_blocks)])
    return url


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--blocks", type=int, default=10, help="blocks per request")
    args = ap.parse_args()
    with pgserver.local_postgres() as base:
        plain = _ledger(base, 2000)
        guarded = _ledger(base, 2000)
        role = "bench_" + uuid.uuid4().hex[:8]
        with open_ledger(guarded) as led:
            token = led.add_principal("root", ["admin"])
        with open_ledger(guarded, token=token) as led:
            led.add_principal("etl", ["pipeline"], pg_role=role, create_pg_role=True)
            led.bind("etl", "s", "default")
        parts = urllib.parse.urlsplit(guarded)
        as_role = parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}").geturl()
        conns = {"owner, no login roles": open_ledger(plain),
                 "owner, login roles exist": open_ledger(guarded, token=token),
                 "pipeline login role": open_ledger(as_role)}
        rnd = random.Random(7)
        times = {k: [] for k in conns}
        for i in range(args.requests):
            for name, led in conns.items():
                start = rnd.randrange(0, 2000 - args.blocks)
                t0 = time.perf_counter()
                d = led.request("s", run_id=f"{name[:5].strip()}-{i}", epsilon=0.001,
                                blocks=[f"b{j}" for j in range(start, start + args.blocks)])
                times[name].append(time.perf_counter() - t0)
                assert d.granted
        print(f"{args.requests} requests of {args.blocks} blocks each, per configuration")
        for name, ts in times.items():
            ts.sort()
            print(f"  {name:<26} median {statistics.median(ts) * 1e3:6.2f} ms   "
                  f"p90 {ts[int(0.9 * len(ts))] * 1e3:6.2f} ms")
        for led in conns.values():
            led.close()


if __name__ == "__main__":
    main()
