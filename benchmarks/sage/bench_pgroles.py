"""What PostgreSQL login roles cost the request path: request latency as the ledger's owner on a
ledger without login roles, as the owner once a login role exists (the guard triggers are
installed), and as a pipeline principal's login role (row-level security, guard triggers).

    .venv/bin/python benchmarks/sage/bench_pgroles.py [--requests 400] [--blocks 10]

Starts a throw-away PostgreSQL server (sage_tfx.ledger.pgserver); prints median and p90
latency per configuration, requests interleaved so that machine load hits all alike, and the
server-side time of one ``sage_request`` call (the basic-mode request function) inside a
transaction that is rolled back: no commit, no fsync, only the work the roles add.
"""
import argparse
import json
import random
import statistics
import time
import urllib.parse
import uuid

from sage_tfx.ledger import BlockSpec, open_ledger, pgrequest, pgserver


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
        print("server time of one sage_request call (rolled back), per configuration")
        for name, led in conns.items():
            ts = []
            for i in range(args.requests):
                start = rnd.randrange(0, 2000 - args.blocks)
                tail = json.dumps({"context": "default", "delta": 0.0, "epsilon": 0.001,
                                   "event": None, "grant_id": "g", "principal": led.principal.name,
                                   "run_id": "x", "status": "released"}, sort_keys=True)
                params = ("s", "default", f"srv-{i}",
                          [f"b{j}" for j in range(start, start + args.blocks)], None, None, None,
                          "0.001", "0", "1000000000", "0.5", "0.000001", uuid.uuid4().hex, "{}",
                          0.001, 0.0, "released", "t", "t", "," + tail[1:].split(",", 1)[1],
                          led.principal.name)
                conn = led._store.conn
                conn.execute("BEGIN")
                t0 = time.perf_counter()
                outcome = conn.execute(pgrequest._SELECT, params).fetchone()[0]
                ts.append(time.perf_counter() - t0)
                conn.execute("ROLLBACK")
                assert outcome == "granted", outcome
            ts.sort()
            print(f"  {name:<26} median {statistics.median(ts) * 1e3:6.3f} ms   "
                  f"p90 {ts[int(0.9 * len(ts))] * 1e3:6.3f} ms")
        for led in conns.values():
            led.close()


if __name__ == "__main__":
    main()
