"""Tables 1–2's grid on the stand-in data: DPBag (paper accountant), DPBag fixed-queries (RDP,
PLD), DPBag- (bagged teachers, SAA's label count), SAA (k = 1) and the non-private baseline;
with the vote mechanisms of ``sage_tfx.bagging.votes`` (Laplace, Gumbel, Gaussian noisy-max under
the ``best`` accountant, accountant column ``<votes>-best``) at both δ of the paper.

Per seed: one split, one teacher ensemble per (n, k) (teachers do not depend on ε), the exact
vote counts of every public point, and one pass of the paper's personalised accountant over the
public points (its answer count for any (ε, δ) follows from the running maximum, see
``PersonalisedMomentsAccountant.trajectory``). Labels are the noisy argmax of the first p counts
(``SeededNoise``: experiments must be reproducible), the student a logistic regression on them;
metrics on the held-out test set. λ = 2/n throughout, as in §5.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

import numpy as np

from sage_tfx.bagging import accounting as acc
from sage_tfx.bagging.eval.data import Split, split_dataset
from sage_tfx.bagging.labelling import noisy_argmax, train_student
from sage_tfx.bagging.partition import chunk_assignment
from sage_tfx.bagging.teachers import train_teachers, vote_counts

__all__ = ["GridConfig", "run_grid", "paper_answer_count", "metrics",
           "PAPER_TABLE2", "PAPER_TABLE1"]

# Table 2 of the paper (labels answered), keyed (method, n, k) -> {ε: labels}.
PAPER_TABLE2 = {
    ("DPBag", 100, 50): {1: 74, 3: 593, 5: 1487}, ("DPBag", 100, 100): {1: 76, 3: 609, 5: 1538},
    ("DPBag", 250, 50): {1: 468, 3: 3785, 5: 6380}, ("DPBag", 250, 100): {1: 507, 3: 4044, 5: 6805},
    ("SAA", 250, 1): {1: 264, 3: 2108, 5: 5269},
}
# Table 1 (accuracy, AUROC, AUPRC at ε = 1, 3, 5), keyed (method, n, k).
PAPER_TABLE1 = {
    ("DPBag", 100, 50): ((.5639, .6085, .6154), (.5547, .6326, .6453), (.4793, .5530, .5656)),
    ("DPBag", 100, 100): ((.5667, .6050, .6142), (.5626, .6295, .6448), (.4895, .5496, .5652)),
    ("DPBag", 250, 50): ((.5888, .6061, .6099), (.5954, .6320, .6391), (.5161, .5526, .5607)),
    ("DPBag", 250, 100): ((.5986, .6077, .6091), (.6096, .6373, .6398), (.5289, .5542, .5644)),
    ("DPBag-", 100, 50): ((.5614, .6019, .6128), (.5544, .6288, .6429), (.4792, .5411, .5612)),
    ("DPBag-", 100, 100): ((.5596, .6007, .6108), (.5609, .6174, .6354), (.4767, .5338, .5525)),
    ("DPBag-", 250, 50): ((.5855, .6051, .6086), (.5896, .6295, .6366), (.5093, .5498, .5565)),
    ("DPBag-", 250, 100): ((.5875, .6061, .6110), (.5884, .6321, .6407), (.5103, .5518, .5615)),
    ("SAA", 250, 1): ((.5798, .6019, .6024), (.5778, .6284, .6356), (.5023, .5496, .5559)),
    ("NPB", 0, 0): ((.6527,) * 3, (.6992,) * 3, (.6281,) * 3),
}


@dataclasses.dataclass(frozen=True)
class GridConfig:
    """The reproduction grid: ε, n, k, δ, seeds and the teacher."""

    epsilons: tuple = (1.0, 3.0, 5.0)
    ns: tuple = (100, 250)
    ks: tuple = (1, 50, 100)
    delta: float = 1e-5              # §5's stated δ
    paper_deltas: tuple = (1e-5, 1e-3)   # 1e-3 is the δ that reproduces Table 2's SAA counts
    seeds: tuple = (0, 1, 2)
    teacher: str = "logistic"
    max_order: int = acc.DEFAULT_MAX_ORDER
    plans: Optional[dict] = None   # vote_plans(cfg), when computed beforehand
    votes: tuple = ("laplace", "gumbel", "gaussian")   # fixed_queries with the best accountant
    votes_only: bool = False      # only the rows of ``votes`` (no paper accountant, no NPB)


def metrics(student, X_test, y_test) -> dict:
    """Accuracy, AUROC and AUPRC of ``student`` on the test set."""
    from sklearn.metrics import accuracy_score, average_precision_score, roc_auc_score

    proba = student.predict_proba(X_test)[:, 1]
    auroc = roc_auc_score(y_test, proba) if len(np.unique(proba)) > 1 else 0.5
    return {"accuracy": float(accuracy_score(y_test, (proba > 0.5).astype(int))),
            "auroc": float(auroc), "auprc": float(average_precision_score(y_test, proba))}


def paper_answer_count(running_max: np.ndarray, *, epsilon: float, delta: float, lam: float,
                       max_order: int) -> int:
    """Alg. 1's answer count from the running maximum of S: queries answered while ε̂ < ε."""
    before = np.concatenate([[0.0], running_max[:-1]])
    ok = acc.moments_epsilon(before, lam=lam, delta=delta, max_order=max_order) < epsilon
    return int(np.argmin(ok)) if not ok.all() else len(ok)


def _fixed_counts(cfg: GridConfig, n: int, public_size: int) -> dict:
    out = {}
    for name in acc.ACCOUNTANTS:
        for eps in cfg.epsilons:
            out[(name, eps)] = min(acc.max_queries(eps, cfg.delta, lam=2.0 / n, accountant=name,
                                                   limit=public_size), public_size)
    return out


PLAN_LIMIT = 10_000       # above every public set; p = min(plan, public size) as with limit=P


def vote_plans(cfg: GridConfig, *, log=None) -> dict:
    """"votes/n/k/ε/δ" -> labels a grant buys with the ``best`` accountant (data-independent,
    capped at ``PLAN_LIMIT``); computed once for every seed (``--plans`` of the benchmark)."""
    from sage_tfx.bagging import votes as V

    out = {}
    for votes in cfg.votes:
        for n in cfg.ns:
            for k in cfg.ks:
                mech = V.mechanism(votes, k=k, lam=2.0 / n)
                for eps in cfg.epsilons:
                    for delta in cfg.paper_deltas:
                        key = f"{votes}/{n}/{k}/{eps:g}/{delta:g}"
                        out[key] = V.max_queries(mech, eps, delta, accountant="best",
                                                 limit=PLAN_LIMIT)[0]
                        if log:
                            log(f"plan {key}: {out[key]} labels")
    return out


def run_grid(cfg: GridConfig = GridConfig(), *, log: Optional[Callable[[str], None]] = None,
             data=None) -> list[dict]:
    """One row per (seed, method, n, k, ε, δ) with labels answered and the student's metrics."""
    from sage_tfx.bagging import votes as V
    from sage_tfx.dp.noise import SeededNoise
    from sklearn.linear_model import LogisticRegression

    log = log or (lambda s: None)
    rows = []
    for seed in cfg.seeds:
        split: Split = split_dataset(seed, data)
        noise = SeededNoise((20_000 if cfg.votes_only else 10_000) + seed)
        npb = LogisticRegression(max_iter=1000).fit(split.X, split.y)
        for eps in () if cfg.votes_only else cfg.epsilons:
            rows.append(
                dict(seed=seed, method="NPB", n=0, k=0, epsilon=eps, delta=0.0, labels=len(split.y),
                             **metrics(npb, split.X_test, split.y_test)))
        uniq, inverse = np.unique(split.units, return_inverse=True)
        P = len(split.X_public)
        plans = cfg.plans if cfg.plans is not None else vote_plans(cfg, log=log)
        for n in cfg.ns:
            lam = 2.0 / n
            fixed = {} if cfg.votes_only else _fixed_counts(cfg, n, P)
            saa_paper = {}
            for k in sorted(cfg.ks):
                t0 = time.time()
                chunks = chunk_assignment(uniq.tolist(), k=k, n=n, salt=f"grid-{seed}".encode())
                ens = train_teachers(split.X, split.y, chunks[inverse], n=n, kind=cfg.teacher)
                counts = vote_counts(ens, split.X_public)
                if not cfg.votes_only:
                    pma = acc.PersonalisedMomentsAccountant(chunks, n=n, lam=lam, delta=cfg.delta,
                                                            max_order=cfg.max_order)
                    running = np.concatenate([pma.trajectory(pred, 2)
                                              for _, pred in ens.predict_batches(split.X_public)])
                log(f"seed {seed} n={n} k={k}: teachers, votes and accountant in "
                    f"{time.time() - t0:.1f}s")

                def emit(method, p, eps, delta, accountant=None, votes=None, **extra):
                    labels = (noisy_argmax(counts[:p], k=k, lam=lam, noise=noise) if votes is None
                              else V.draw_labels(counts[:p], V.mechanism(votes, k=k, lam=lam),
                                                 noise=noise))
                    student = train_student(split.X_public[:p], labels)
                    rows.append(dict(seed=seed, method=method, n=n, k=k, epsilon=eps, delta=delta,
                                     accountant=accountant or "", labels=p,
                                     label_accuracy=float(
                                         (labels == split.y_public[:p]).mean()) if p else float(
                                             "nan"),
                                     **metrics(student, split.X_test, split.y_test), **extra))

                for eps in cfg.epsilons:
                    method = "SAA-fixed" if k == 1 else "DPBag-fixed"
                    for votes in cfg.votes:
                        for delta in cfg.paper_deltas:
                            p = min(plans[f"{votes}/{n}/{k}/{eps:g}/{delta:g}"], P)
                            emit(method, p, eps, delta, f"{votes}-best", votes=votes)
                    if cfg.votes_only:
                        continue
                    for delta in cfg.paper_deltas:
                        p = paper_answer_count(running, epsilon=eps, delta=delta, lam=lam,
                                               max_order=cfg.max_order)
                        hat = float(acc.moments_epsilon(running[p - 1], lam=lam, delta=delta,
                                                        max_order=cfg.max_order)) if p else 0.0
                        if k == 1:
                            saa_paper[(eps, delta)] = p
                            emit("SAA", p, eps, delta, "paper", epsilon_hat=hat)
                        else:
                            emit("DPBag", p, eps, delta, "paper", epsilon_hat=hat)
                            if (eps, delta) in saa_paper:
                                emit("DPBag-", saa_paper[(eps, delta)], eps, delta, "paper")
                    for name in acc.ACCOUNTANTS:
                        emit(method, fixed[(name, eps)], eps, cfg.delta, name)
    return rows
