"""Noisy plurality labelling of public points and the student (DP bagging §4, §4.4, Alg. 1).

Only the labels (and the student trained on them) leave this module's callers; vote counts, noisy
counts, teachers and the paper's data-dependent ε̂ (per unit or overall) are never logged or
returned in a report: nothing pays for them.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from sage_tfx.bagging import accounting as acc
from sage_tfx.bagging import votes as votes_lib
from sage_tfx.bagging.teachers import TeacherEnsemble
from sage_tfx.errors import InvalidRequestError

__all__ = ["MODES", "NON_DP_OPT_IN", "check_non_dp_opt_in", "noisy_counts", "noisy_argmax",
           "LabellingResult", "fixed_labels", "label_public", "train_student"]

MODES = ("fixed_queries", "paper")


def noisy_counts(counts: np.ndarray, *, k: int, lam: float, noise=None) -> np.ndarray:
    """n_c(x) + Y_c with Y_c i.i.d. Lap(k/λ), per row of ``counts`` [P, C] (never returned to
    users).

    ``noise`` defaults to OpenDP's continuous Laplace (``sage_tfx.dp.noise.laplace``), which is
    what ``LaplaceDpEvent`` accounts for; a ``SeededNoise`` is for experiments only.
    """
    from sage_tfx.dp import noise as noise_lib

    lam = acc.check_lambda(lam)
    counts = np.asarray(counts)
    if counts.ndim != 2 or counts.shape[1] < 2:
        raise InvalidRequestError("counts must be [P, C] with C >= 2 classes")
    if len(counts) == 0:
        return np.zeros(counts.shape)
    src = noise if noise is not None else noise_lib.SECURE
    return np.asarray(src.laplace(counts.astype(np.float64), k / lam), dtype=np.float64)


def noisy_argmax(counts: np.ndarray, *, k: int, lam: float, noise=None) -> np.ndarray:
    """argmax_c (n_c(x) + Y_c), Y_c i.i.d. Lap(k/λ): 2λ-DP per query (Theorem 1, ℓ1 change 2k)."""
    noisy = noisy_counts(counts, k=k, lam=lam, noise=noise)
    return np.asarray(np.argmax(noisy, axis=1), dtype=np.int64)


@dataclasses.dataclass(frozen=True)
class LabellingResult:
    """Labels of the first ``queries`` public points, and what they cost.

    ``epsilon``/``delta`` is the guarantee (fixed_queries: the accountant's ε of the composed
    event) or, in paper mode, the grant that was charged whole: that mode is not formally DP
    (``formally_dp`` False) and its data-dependent ε̂ is not kept.
    """
    labels: np.ndarray
    public_index: np.ndarray
    queries: int
    mode: str
    accountant: Optional[str]
    epsilon: float
    delta: float
    lam: float
    noise_scale: float
    per_query_epsilon: float
    formally_dp: bool
    event: object = None
    votes: str = "laplace"           # the vote mechanism (sage_tfx.bagging.votes)
    bound: Optional[str] = None      # fixed_queries: the bound that gave ε (pure / rdp / pld)
    rho: Optional[float] = None      # per-query zCDP ρ (Gumbel, Gaussian votes)

    def report(self) -> dict:
        """JSON-able privacy report: public, data-independent figures only.

        No votes and no ε̂. In paper mode the number of answered queries depends on the private
        data, so it is not reported either (``queries`` is None): the mode is flagged
        ``not_differentially_private`` and states its stopping rule instead.
        """
        from sage_tfx.ledger.accounting import event_to_json
        import json
        out = {
            "queries": self.queries if self.formally_dp else None, "mode": self.mode,
            "accountant": self.accountant, "epsilon": self.epsilon, "delta": self.delta,
            "lambda": self.lam, "noise_scale": self.noise_scale,
            "per_query_epsilon": self.per_query_epsilon, "formally_dp": self.formally_dp,
            "not_differentially_private": not self.formally_dp,
            "event": json.loads(event_to_json(self.event)) if self.event is not None else None,
            "vote_mechanism": self.votes, "bound": self.bound, "per_query_rho": self.rho,
        }
        if not self.formally_dp:
            out["stopping_rule"] = PAPER_STOPPING_RULE
        return out

    @classmethod
    def from_report(cls, labels, public_start: int, report: dict) -> "LabellingResult":
        """The result a recorded release describes (its labels, range start and report)."""
        from sage_tfx.ledger.accounting import event_from_dict
        labels = np.asarray(labels, dtype=np.int64)
        event = event_from_dict(report["event"]) if report.get("event") is not None else None
        return cls(labels, np.arange(public_start, public_start + len(labels)), len(labels),
                   report["mode"], report["accountant"], report["epsilon"], report["delta"],
                   report["lambda"], report["noise_scale"], report["per_query_epsilon"],
                   report["formally_dp"], event=event,
                   votes=report.get("vote_mechanism", "laplace"),
                   bound=report.get("bound"), rho=report.get("per_query_rho"))


PAPER_STOPPING_RULE = ("Alg. 1's personalised moments accountant (paper's fixed added unit); a "
                       "query is answered only while the data-dependent epsilon-hat after it "
                       "stays <= epsilon. The number answered depends on the private data and "
                       "is not reported; the whole grant was charged; not differentially private.")

NON_DP_OPT_IN = "accept_not_differentially_private"


def check_non_dp_opt_in(mode: str, accepted) -> bool:
    """Paper mode runs only with ``accept_not_differentially_private=True``, and only it.

    Raises:
      InvalidRequestError: paper mode without the opt-in, the opt-in without paper mode, or an
        opt-in that is not a bool.
    """
    if not isinstance(accepted, bool):
        raise InvalidRequestError(f"{NON_DP_OPT_IN} must be True or False, got {accepted!r}")
    if mode == "paper" and not accepted:
        raise InvalidRequestError(
            "mode='paper' (the paper's data-dependent accountant) is NOT differentially private: "
            "how many labels it answers depends on the private data. Use the default "
            f"mode='fixed_queries', or opt in explicitly with {NON_DP_OPT_IN}=True (recorded on "
            "the model; DPModelValidator never blesses such a model)")
    if mode != "paper" and accepted:
        raise InvalidRequestError(f"{NON_DP_OPT_IN}=True applies to mode='paper' only; "
                                  f"mode={mode!r} is differentially private")
    return accepted


def label_public(ensemble: TeacherEnsemble, X_public: np.ndarray, *, epsilon: float,
                 delta: float, lam: float, mode: str = "fixed_queries", accountant: str = "best",
                 votes: str = "laplace",
                 unit_chunks: Optional[np.ndarray] = None, noise=None,
                 max_order: int = acc.DEFAULT_MAX_ORDER, max_labels: Optional[int] = None,
                 accept_not_differentially_private: bool = False) -> LabellingResult:
    """Labels public points in order with the noisy plurality of all k·n teachers.

    Args:
      ensemble: the teachers.
      X_public: public features [P, d] (declared public by the caller; in a known, public order).
      epsilon, delta: the grant.
      lam: λ; noise Lap(k/λ) per count, 2λ-DP per query.
      mode: ``"fixed_queries"`` (p fixed from the grant, formally DP) or ``"paper"`` (Alg. 1's
        data-dependent stopping, before the query that would cross ε; reproduction only, not
        formally DP: needs ``accept_not_differentially_private=True``).
      accountant: ``"best"``, ``"pure"``, ``"rdp"``, ``"pld"`` or ``"br"`` (fixed_queries;
        ``sage_tfx.bagging.votes``).
      votes: ``"laplace"``, ``"gumbel"`` or ``"gaussian"`` noisy-max (fixed_queries; paper mode
        is Laplace only).
      unit_chunks: chunk of each privacy unit [U, k] (paper mode's per-unit accountant).
      max_labels: answer at most this many (a public number); defaults to all public points.
    """
    if mode not in MODES:
        raise InvalidRequestError(f"mode must be one of {MODES}, got {mode!r}")
    check_non_dp_opt_in(mode, accept_not_differentially_private)
    lam = acc.check_lambda(lam)
    if mode == "paper":
        epsilon, delta = acc._check_eps_delta(epsilon, delta)
        if votes != "laplace":
            raise InvalidRequestError("paper mode accounts Laplace votes only")
    else:
        epsilon, delta = votes_lib.check_eps_delta(epsilon, delta)
    X_public = np.asarray(X_public, dtype=np.float64)
    if X_public.ndim != 2 or len(X_public) == 0:
        raise InvalidRequestError("no public data to label")
    cap = len(X_public) if max_labels is None else min(int(max_labels), len(X_public))
    common = dict(lam=lam, noise_scale=ensemble.k / lam, per_query_epsilon=2 * lam, delta=delta)
    if mode == "fixed_queries":
        mech = votes_lib.mechanism(votes, k=ensemble.k, lam=lam)
        p, eps, bound = votes_lib.max_queries(mech, epsilon, delta, accountant=accountant,
                                              limit=cap)
        return fixed_labels(_counts(ensemble, X_public[:p]), k=ensemble.k, lam=lam,
                            accountant=accountant, epsilon=eps, delta=delta, noise=noise,
                            votes=votes, bound=bound)
    if unit_chunks is None:
        raise InvalidRequestError("paper mode needs the chunk assignment of every privacy unit")
    pma = acc.PersonalisedMomentsAccountant(unit_chunks, n=ensemble.n, lam=lam, delta=delta,
                                            max_order=max_order)
    labels, answered = [], 0
    for start, pred in ensemble.predict_batches(X_public[:cap]):
        a = pma.answer(pred, epsilon, ensemble.n_classes)
        if a:
            counts = np.stack(
                [(pred[:a] == c).sum(axis=(1, 2)) for c in range(ensemble.n_classes)], 1)
            labels.append(noisy_argmax(counts, k=ensemble.k, lam=lam, noise=noise))
            answered += a
        if a < len(pred):
            break
    labels = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
    return LabellingResult(labels, np.arange(answered), answered, mode, None, epsilon,
                           formally_dp=False, **common)


def fixed_labels(counts: np.ndarray, *, k: int, lam: float, accountant: str, epsilon: float,
                 delta: float, noise=None, votes: str = "laplace",
                 bound: Optional[str] = None) -> LabellingResult:
    """fixed_queries: the noisy argmax of every row of ``counts`` (p = its rows, fixed before
    any vote) under the vote mechanism ``votes``, reported as its composed event
    ``SelfComposed(query, p)`` at (ε, δ) with the bound that gave ε."""
    mech = votes_lib.mechanism(votes, k=k, lam=lam)
    p = len(counts)
    labels = votes_lib.draw_labels(np.asarray(counts).reshape(p, -1), mech, noise=noise) \
        if p else np.zeros(0, np.int64)
    return LabellingResult(labels, np.arange(p), p, "fixed_queries", accountant, float(epsilon),
                           float(delta), mech.lam, mech.noise_scale, mech.pure_epsilon, True,
                           event=votes_lib.queries_event(mech, p), votes=votes, bound=bound,
                           rho=mech.rho)


def _counts(ensemble, X):
    from sage_tfx.bagging.teachers import vote_counts
    return vote_counts(ensemble, X) if len(X) else np.zeros((0, ensemble.n_classes), np.int32)


def train_student(X_labelled: np.ndarray, labels: np.ndarray, *, l2: float = 1.0,
                  n_classes: int = 2):
    """The student: scikit-learn logistic regression on the privately labelled public points.

    With fewer than two distinct labels it is a constant classifier (still a function of the
    private labels only). Returns the fitted estimator or a ``ConstantStudent``.
    """
    labels = np.asarray(labels)
    if len(labels) == 0 or len(np.unique(labels)) < 2:
        c = int(labels[0]) if len(labels) else 0
        return ConstantStudent(c, n_classes)
    from sklearn.linear_model import LogisticRegression
    return LogisticRegression(C=1.0 / l2, max_iter=1000).fit(X_labelled, labels)


@dataclasses.dataclass(frozen=True)
class ConstantStudent:
    """The student when the private labels hold fewer than two classes: always ``label``."""

    label: int
    n_classes: int

    def predict(self, X):
        """``label`` for every row of ``X``."""
        return np.full(len(X), self.label, dtype=np.int64)

    def predict_proba(self, X):
        """Probability 1 on ``label`` for every row of ``X`` (``n_classes`` columns)."""
        out = np.zeros((len(X), self.n_classes))
        out[:, self.label] = 1.0
        return out

    @property
    def coef_(self):
        """None: a constant student has no coefficients (scikit-learn's attribute name)."""
        return None
