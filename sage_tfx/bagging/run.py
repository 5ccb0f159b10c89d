"""One DP bagging run: validate, partition, train (or reuse) teachers, label, train the student.

This is the library call behind the ``DPBaggingTrainer`` component and the notebook; the caller
has already charged the ledger (:func:`plan_labels` gives the data-independent charge first).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from sage_tfx.bagging import accounting as acc
from sage_tfx.bagging.cache import TeacherCache, cache_key
from sage_tfx.bagging.labelling import MODES, LabellingResult, label_public, train_student
from sage_tfx.bagging.partition import check_shape, chunk_assignment
from sage_tfx.bagging.teachers import TEACHER_KINDS, train_teachers
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError

__all__ = ["BaggingConfig", "BaggingResult", "plan_labels", "labels_from_grant", "fit_dp_bagging",
           "LabelPlan"]


@dataclasses.dataclass(frozen=True)
class BaggingConfig:
    """k partitions × n teachers, λ, the accounting mode and the teacher type."""
    k: int
    n: int
    lam: float
    mode: str = "fixed_queries"
    accountant: str = "rdp"
    teacher: str = "logistic"
    l2: float = 1.0
    max_order: int = acc.DEFAULT_MAX_ORDER

    def __post_init__(self):
        check_shape(self.k, self.n)
        acc.check_lambda(self.lam)
        if self.mode not in MODES:
            raise InvalidRequestError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.accountant not in acc.ACCOUNTANTS:
            raise InvalidPrivacyParameterError(f"accountant must be one of {acc.ACCOUNTANTS}")
        if self.teacher not in TEACHER_KINDS:
            raise InvalidRequestError(f"teacher must be one of {TEACHER_KINDS}")


@dataclasses.dataclass(frozen=True)
class LabelPlan:
    """What a run will spend, fixed before any private data is read."""
    queries: Optional[int]       # fixed_queries: p; paper: None (data-dependent)
    epsilon: float
    delta: float
    event: object                # DpEvent to charge (fixed_queries), None in paper mode
    formally_dp: bool


def plan_labels(config: BaggingConfig, *, epsilon: float, delta: float, public_size: int) -> LabelPlan:
    """The charge of a run, from the grant and public facts only (Sage: charge before release).

    fixed_queries: p = min(largest p with ε(p) ≤ ε, public_size) and its composed event; paper
    mode: the whole (ε, δ) grant (basic streams only: no DpEvent describes a data-dependent stop).
    """
    epsilon, delta = acc._check_eps_delta(epsilon, delta)
    if public_size < 1:
        raise InvalidRequestError("no public data to label")
    if config.mode == "paper":
        return LabelPlan(None, epsilon, delta, None, False)
    p = min(acc.max_queries(epsilon, delta, lam=config.lam, accountant=config.accountant,
                            limit=public_size), public_size)
    return LabelPlan(p, acc.epsilon_of(p, lam=config.lam, delta=delta, accountant=config.accountant),
                     delta, acc.queries_event(config.lam, p), True)


@dataclasses.dataclass(frozen=True)
class BaggingResult:
    student: object
    labelling: LabellingResult
    teachers_cached: bool


def fit_dp_bagging(X: np.ndarray, y: np.ndarray, units: Sequence, X_public: np.ndarray, *,
                   config: BaggingConfig, epsilon: float, delta: float, salt: bytes,
                   public_declared: bool, n_classes: int = 2, noise=None,
                   cache: Optional[TeacherCache] = None, cache_id: Optional[dict] = None,
                   ) -> BaggingResult:
    """Teachers on the private window, noisy labels on the public points, the student.

    Args:
      X, y, units: private features (scaled from public or schema statistics), labels, and each
        row's privacy unit id (a declared key; several rows may share one unit).
      X_public: public features, in a public order; ``public_declared`` must be True (the caller
        vouches that the ledger marks the source public, or the user declared it so).
      cache, cache_id: reuse teachers of the same window (``cache_id`` = stream and block ids);
        labelling starts at the cache's public cursor so every purchase labels fresh points.
    Raises:
      InvalidRequestError: public data not declared public or empty, empty window, n larger than
        the number of units, bad shapes. InvalidPrivacyParameterError: bad ε, δ, λ.
    """
    if public_declared is not True:
        raise InvalidRequestError("the public data is not declared public; refusing to label it")
    X_public = np.asarray(X_public, dtype=np.float64)
    if X_public.ndim != 2 or len(X_public) == 0:
        raise InvalidRequestError("no public data to label")
    acc._check_eps_delta(epsilon, delta)
    if len(units) == 0 or len(X) == 0:
        raise InvalidRequestError("the private window is empty")
    uniq, inverse = np.unique(np.asarray(units), return_inverse=True)
    if config.n > len(uniq):
        raise InvalidRequestError(f"n = {config.n} teachers per partition but only {len(uniq)} "
                                  "privacy units in the window")
    unit_chunks = chunk_assignment(list(uniq.tolist()), k=config.k, n=config.n, salt=salt)

    def train():
        return train_teachers(X, np.asarray(y), unit_chunks[inverse], n=config.n, kind=config.teacher,
                              n_classes=n_classes, l2=config.l2)

    start = 0
    if cache is not None:
        key = cache_key(stream=str((cache_id or {}).get("stream")), blocks=(cache_id or {}).get("blocks", []),
                        k=config.k, n=config.n, salt=salt, kind=config.teacher,
                        settings={"l2": config.l2, "n_classes": n_classes})
        before = cache.trained
        ensemble = cache.get_or_train(key, train)
        cached = cache.trained == before
        start = cache.public_cursor(key)
    else:
        ensemble, cached = train(), False
    pool = X_public[start:]
    if len(pool) == 0:
        raise InvalidRequestError("every public point of this window has been labelled already")
    result = label_public(ensemble, pool, epsilon=epsilon, delta=delta, lam=config.lam,
                          mode=config.mode, accountant=config.accountant, unit_chunks=unit_chunks,
                          noise=noise, max_order=config.max_order)
    result = dataclasses.replace(result, public_index=result.public_index + start)
    if cache is not None:
        cache.advance(key, result.queries)
    student = train_student(pool[:result.queries], result.labels, l2=config.l2, n_classes=n_classes)
    return BaggingResult(student, result, cached)


def labels_from_grant(config: BaggingConfig, *, epsilon: Optional[float], delta: Optional[float],
                      event, public_size: int, report_delta: Optional[float] = None) -> LabelPlan:
    """What a granted run may spend, re-derived from the charge itself (never more).

    * rdp grant (a DpEvent): fixed_queries only; the event must be exactly
      ``SelfComposed(Laplace(1/(2λ)), p)`` for this config's λ, and p ≤ public_size. ε is
      reported at ``report_delta`` (the stream's δ_g).
    * basic grant (ε, δ): fixed_queries answers p = min(largest p with ε(p) ≤ ε, public_size)
      (so a grant made from :func:`plan_labels` gives back the same p); paper mode spends the
      whole grant.

    Raises:
      InvalidRequestError: the charge does not describe this run (wrong λ, paper mode on an
        rdp grant, p beyond the public set, no public data).
    """
    import dp_accounting

    if public_size < 1:
        raise InvalidRequestError("no public data to label")
    if event is not None:
        if config.mode != "fixed_queries":
            raise InvalidRequestError("paper mode has a data-dependent cost that no DpEvent "
                                      "describes: run it on a basic-mode stream")
        ok = (isinstance(event, dp_accounting.SelfComposedDpEvent)
              and isinstance(event.event, dp_accounting.LaplaceDpEvent)
              and event == acc.queries_event(config.lam, int(event.count)))
        if not ok:
            raise InvalidRequestError(f"the grant charged {event}, which is not "
                                      f"SelfComposed(LaplaceDpEvent({1 / (2 * config.lam)}), p) "
                                      f"for lambda = {config.lam}")
        p = int(event.count)
        if p > public_size:
            raise InvalidRequestError(f"the grant pays for {p} labels but only {public_size} "
                                      "public points exist")
        if report_delta is None:
            raise InvalidRequestError("an rdp grant needs the delta to report epsilon at")
        eps = acc.epsilon_of(p, lam=config.lam, delta=report_delta, accountant=config.accountant)
        return LabelPlan(p, eps, float(report_delta), event, True)
    return plan_labels(config, epsilon=epsilon, delta=delta, public_size=public_size)
