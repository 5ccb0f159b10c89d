"""Aggregating the grid's rows into Tables 1–2 beside the paper's numbers, and the plots."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from sage_tfx.bagging.eval.grid import PAPER_TABLE1, PAPER_TABLE2

__all__ = ["aggregate", "table1_markdown", "table2_markdown", "plot"]

METRICS = ("accuracy", "auroc", "auprc")
VOTE_ACCOUNTANTS = ("laplace-best", "gumbel-best", "gaussian-best")   # grid.py's vote rows


def aggregate(rows) -> dict:
    """(method, n, k, ε, δ, accountant) -> mean labels and metrics over seeds (and the seed count).
    """
    groups = defaultdict(list)
    for r in rows:
        key = (r["method"], int(r["n"]), int(r["k"]), float(r["epsilon"]), float(r["delta"]),
               r.get("accountant", "") or "")
        groups[key].append(r)
    out = {}
    for key, rs in groups.items():
        out[key] = {m: float(np.mean([float(r[m]) for r in rs])) for m in ("labels",) + METRICS}
        out[key]["seeds"] = len(rs)
    return out


def _fmt(x, digits=4):
    return "–" if x is None else (f"{x:.{digits}f}".lstrip("0") if x < 1 else f"{x:,.0f}")


def _lines(agg, epsilons):
    """(label, key builder) for every line of the tables."""
    lines = []
    deltas = sorted({k[4] for k in agg if k[5] == "paper"})
    ns = sorted({k[1] for k in agg if k[1]})
    ks = sorted({k[2] for k in agg if k[2] > 1})
    for d in deltas:
        for n in ns:
            for k in ks:
                lines.append((f"DPBag paper acct δ={d:g}", "DPBag", n, k, d, "paper"))
        for n in ns:
            for k in ks:
                lines.append((f"DPBag- (SAA count) δ={d:g}", "DPBag-", n, k, d, "paper"))
        for n in ns:
            lines.append((f"SAA paper acct δ={d:g}", "SAA", n, 1, d, "paper"))
    fixed_d = sorted({k[4] for k in agg if k[0].endswith("-fixed")})
    for d in fixed_d:
        for acct in ("rdp", "pld"):
            for n in ns:
                for k in ks:
                    lines.append(
                        (f"DPBag fixed_queries {acct.upper()} δ={d:g}",
                         "DPBag-fixed", n, k, d, acct))
            for n in ns:
                lines.append(
                    (f"SAA fixed_queries {acct.upper()} δ={d:g}", "SAA-fixed", n, 1, d, acct))
    for acct in VOTE_ACCOUNTANTS:
        for d in sorted({k[4] for k in agg if k[5] == acct}):
            name = acct.split("-")[0].capitalize()
            for n in ns:
                for k in ks:
                    lines.append((f"DPBag fixed {name} best δ={d:g}", "DPBag-fixed", n, k, d, acct))
            for n in ns:
                lines.append((f"SAA fixed {name} best δ={d:g}", "SAA-fixed", n, 1, d, acct))
    lines.append(("NPB (non-private)", "NPB", 0, 0, 0.0, ""))
    return lines


def _shows_paper(label, method, acct) -> bool:
    """The paper's number beside: its own method at δ = 1e-3 (the δ its counts reproduce at),
    NPB, and the vote mechanisms' rows (what replaces the paper's method)."""
    return acct in VOTE_ACCOUNTANTS or method == "NPB" or (
        "δ=0.001" in label and "fixed" not in label)


def _paper_key(method, n, k):
    base = {"DPBag": "DPBag", "DPBag-": "DPBag-", "SAA": "SAA", "NPB": "NPB"}.get(method)
    return (base, n, k) if base else None


def table1_markdown(agg, epsilons) -> str:
    """Table 1 (accuracy, AUROC, AUPRC) as markdown."""
    head = "| model | n | k | " + " | ".join(
        f"{m} ε={e:g}" for m in METRICS for e in epsilons) + " |"
    out = [head, "|" + "---|" * (3 + len(METRICS) * len(epsilons))]
    for label, method, n, k, d, acct in _lines(agg, epsilons):
        vals = []
        for mi, m in enumerate(METRICS):
            for e in epsilons:
                row = agg.get((method, n, k, float(e), d, acct))
                ours = row[m] if row else None
                base = method.replace("-fixed", "") if acct in VOTE_ACCOUNTANTS else method
                paper = PAPER_TABLE1.get(_paper_key(base, n, k) or ("", 0, 0))
                pv = paper[mi][list(epsilons).index(e)] if paper and e in (1, 3, 5) else None
                vals.append(_fmt(ours) + (
                    f" ({_fmt(pv)})" if pv is not None and _shows_paper(label, method, acct)
                    else ""))
        if any(v != "–" for v in vals):
            out.append(f"| {label} | {n or '–'} | {k or '–'} | " + " | ".join(vals) + " |")
    return "\n".join(out)


def table2_markdown(agg, epsilons) -> str:
    """Table 2 (labels bought per ε) as markdown."""
    out = ["| model | n | k | " + " | ".join(f"labels ε={e:g} (paper)" for e in epsilons) + " |",
           "|" + "---|" * (3 + len(epsilons))]
    for label, method, n, k, d, acct in _lines(agg, epsilons):
        if method == "NPB":
            continue
        vals = []
        for e in epsilons:
            row = agg.get((method, n, k, float(e), d, acct))
            paper = PAPER_TABLE2.get((method.replace("-fixed", ""), n, k), {}).get(int(e)) \
                if method in ("DPBag", "SAA") or acct in VOTE_ACCOUNTANTS else None
            vals.append(
                ("–" if row is None else f"{row['labels']:,.0f}") + (
                    f" ({paper:,})" if paper else ""))
        if any(v != "–" for v in vals):
            out.append(f"| {label} | {n} | {k} | " + " | ".join(vals) + " |")
    return "\n".join(out)


def plot(agg, epsilons, path):
    """Plots the grid's metrics against ε to ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    series = [("DPBag paper δ=1e-5", "DPBag", 250, 100, 1e-5, "paper"),
              ("DPBag paper δ=1e-3", "DPBag", 250, 100, 1e-3, "paper"),
              ("DPBag fixed RDP", "DPBag-fixed", 250, 100, 1e-5, "rdp"),
              ("DPBag fixed PLD", "DPBag-fixed", 250, 100, 1e-5, "pld"),
              ("SAA paper δ=1e-5", "SAA", 250, 1, 1e-5, "paper"),
              ("SAA fixed PLD", "SAA-fixed", 250, 1, 1e-5, "pld"),
              ("DPBag fixed Gumbel best", "DPBag-fixed", 250, 100, 1e-5, "gumbel-best"),
              ("DPBag fixed Gaussian best", "DPBag-fixed", 250, 100, 1e-5, "gaussian-best"),
              ("NPB", "NPB", 0, 0, 0.0, "")]
    for ax, m in zip(axes, ("labels",) + METRICS):
        for label, method, n, k, d, acct in series:
            ys = [agg.get((method, n, k, float(e), d, acct), {}).get(m) for e in epsilons]
            if all(y is not None for y in ys) and not (m == "labels" and method == "NPB"):
                ax.plot(epsilons, ys, marker="o", label=label)
        ax.set_xlabel("ε")
        ax.set_title(m + (" (n=250, k=100; SAA k=1)" if m == "labels" else ""))
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
