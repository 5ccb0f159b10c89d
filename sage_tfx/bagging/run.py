"""One DP bagging run: validate, partition, train (or reuse) teachers, label, train the student.

This is the library call behind the notebook (``DPBaggingTrainer`` runs the same purchase with a
Beam teacher flow); the caller has already charged the ledger (:func:`plan_labels` gives the
data-independent charge first). Under a grant the purchase is released once and its public
range comes from the ledger's cursor (``sage_tfx.bagging.purchase``).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from sage_tfx.bagging import accounting as acc
from sage_tfx.bagging import purchase as purchase_lib
from sage_tfx.bagging import votes as votes_lib
from sage_tfx.bagging.cache import TeacherCache, cache_key
from sage_tfx.bagging.labelling import (MODES, LabellingResult, check_non_dp_opt_in, fixed_labels,
                                        label_public, train_student)
from sage_tfx.bagging.partition import check_shape, chunk_assignment
from sage_tfx.bagging.teachers import TEACHER_KINDS, train_teachers, vote_counts
from sage_tfx.errors import GrantStateError, GrantTooSmallError, InvalidRequestError
from sage_tfx.ledger.values import RELEASED

__all__ = ["BaggingConfig", "BaggingResult", "plan_labels", "labels_from_grant", "fit_dp_bagging",
           "LabelPlan", "ledger_rdp_epsilon"]


@dataclasses.dataclass(frozen=True)
class BaggingConfig:
    """k partitions × n teachers, λ, the vote mechanism, the accounting mode and the teacher.

    ``votes``: ``laplace`` (Theorem 1), ``gumbel`` (exponential mechanism, bounded range) or
    ``gaussian`` (GNMax); ``accountant``: ``best`` (the most labels of the pure-DP, RDP, PLD and,
    for Gumbel, bounded-range bounds) or one of them (``sage_tfx.bagging.votes``).
    """
    k: int
    n: int
    lam: float
    mode: str = "fixed_queries"
    accountant: str = "best"
    teacher: str = "logistic"
    l2: float = 1.0
    max_order: int = acc.DEFAULT_MAX_ORDER
    # Paper mode is not differentially private: it runs only with this explicit opt-in, which is
    # recorded on the model (and DPModelValidator refuses to bless such a model).
    accept_not_differentially_private: bool = False
    votes: str = "laplace"

    def __post_init__(self):
        check_shape(self.k, self.n)
        acc.check_lambda(self.lam)
        if self.mode not in MODES:
            raise InvalidRequestError(f"mode must be one of {MODES}, got {self.mode!r}")
        check_non_dp_opt_in(self.mode, self.accept_not_differentially_private)
        votes_lib.check_accountant(self.accountant)
        votes_lib.check_votes(self.votes)
        if self.mode == "paper" and self.votes != "laplace":
            raise InvalidRequestError(
                "paper mode (Alg. 1's accountant) accounts Laplace votes only")
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
    bound: Optional[str] = None  # fixed_queries: the bound that gave ε (pure / rdp / pld)


def plan_labels(config: BaggingConfig, *, epsilon: float, delta: float,
                public_size: int, rdp_orders: Optional[Sequence[float]] = None) -> LabelPlan:
    """The charge of a run, from the grant and public facts only (Sage: charge before release).

    fixed_queries: p = min(largest p with ε(p) ≤ ε by the config's accountant, public_size) and
    its composed event (δ = 0 is a pure-DP grant: only the pure bound counts); paper mode: the
    whole (ε, δ) grant, δ > 0 (basic streams only: no DpEvent describes a data-dependent stop).

    ``rdp_orders`` (the order grid of an ``rdp`` stream, e.g. ``accounting.DEFAULT_RDP_ORDERS``):
    the event will be composed by the ledger's RDP curves, whatever the config's accountant
    says, so p is the largest p ≤ public_size whose event's RDP ε at δ on that grid (the
    ledger's conversion, :func:`sage_tfx.ledger.accounting.rdp_epsilon`: what a block reports
    spent) is ≤ ε; the plan's bound is ``"rdp"``. The Gumbel ``br`` and the PLD bounds allow
    15-27 % more votes at the same ε, but their event's RDP ε is then above ε.

    Raises:
      GrantTooSmallError: the grant buys not one label (no run with a constant student).
    """
    if config.mode == "paper":
        epsilon, delta = acc._check_eps_delta(epsilon, delta)
    else:
        epsilon, delta = votes_lib.check_eps_delta(epsilon, delta)
    if public_size < 1:
        raise InvalidRequestError("no public data to label")
    if config.mode == "paper":
        return LabelPlan(None, epsilon, delta, None, False)
    mech = votes_lib.mechanism(config.votes, k=config.k, lam=config.lam)
    if rdp_orders is not None:
        return _plan_rdp(config, mech, epsilon, delta, public_size, rdp_orders)
    p, eps, bound = votes_lib.max_queries(mech, epsilon, delta, accountant=config.accountant,
                                          limit=public_size)
    if p == 0:
        _refuse_no_label(config, mech, epsilon, delta)
    return LabelPlan(p, eps, delta, votes_lib.queries_event(mech, p), True, bound=bound)


def ledger_rdp_epsilon(mech, queries: int, delta: float, orders: Sequence[float]) -> float:
    """ε at δ of ``queries`` votes as an rdp stream with these orders reports it (its RDP curve
    of the composed event, dp_accounting's conversion)."""
    from sage_tfx.ledger import accounting as ledger_acc
    if queries == 0:
        return 0.0
    curve = ledger_acc.rdp_curve(votes_lib.queries_event(mech, queries), orders)
    return ledger_acc.rdp_epsilon(curve, orders, delta)


def _plan_rdp(config, mech, epsilon, delta, public_size, orders) -> LabelPlan:
    """:func:`plan_labels` on an rdp stream: the largest p whose RDP ε on ``orders`` fits ε."""
    from sage_tfx.ledger import accounting as ledger_acc
    orders = ledger_acc.check_orders(orders)
    if delta == 0:
        raise InvalidRequestError("an rdp stream composes votes by RDP, which gives no finite "
                                  "epsilon at delta = 0: plan with the stream's delta_g")
    fits = lambda p: ledger_rdp_epsilon(mech, p, delta, orders) <= epsilon  # noqa: E731
    if not fits(1):
        raise GrantTooSmallError(
            f"a grant of (epsilon = {epsilon:g}, delta = {delta:g}) on an rdp stream buys no "
            f"label with {config.votes} votes at lambda = {config.lam:g}: one vote's RDP "
            f"epsilon is {ledger_rdp_epsilon(mech, 1, delta, orders):.6g}. Refusing rather "
            "than training a constant student: grant more, lower lambda, or choose other votes")
    lo, hi = 1, 2                     # invariant: fits(lo); hi does not fit or is past the cap
    while hi <= public_size and fits(hi):
        lo, hi = hi, 2 * hi
    hi = min(hi, public_size + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return LabelPlan(lo, ledger_rdp_epsilon(mech, lo, delta, orders), delta,
                     votes_lib.queries_event(mech, lo), True, bound="rdp")


def _refuse_no_label(config, mech, epsilon, delta):
    one, bound = votes_lib.best_epsilon(mech, 1, delta, config.accountant)
    need = (f"one vote costs epsilon = {one:.6g} at delta = {delta:g} ({bound} bound)"
            if one < float("inf") else f"no bound gives a finite epsilon at delta = {delta:g} "
            "(Gaussian votes have no pure-DP bound: a delta = 0 grant buys none)")
    raise GrantTooSmallError(
        f"a grant of (epsilon = {epsilon:g}, delta = {delta:g}) buys no label with "
        f"{config.votes} votes at lambda = {config.lam:g} (accountant {config.accountant!r}): "
        f"{need}. Refusing rather than training a constant student: grant more, lower lambda, "
        "or choose other votes")


@dataclasses.dataclass(frozen=True)
class BaggingResult:
    """The student, the labels it was trained on (as released) and the released report."""
    student: object
    labelling: LabellingResult
    teachers_cached: bool
    replayed: bool = False
    report: Optional[dict] = None


def fit_dp_bagging(X: np.ndarray, y: np.ndarray, units: Sequence, X_public: np.ndarray, *,
                   config: BaggingConfig, salt: bytes, public_declared: bool,
                   epsilon: Optional[float] = None, delta: Optional[float] = None,
                   ledger=None, grant_id: Optional[str] = None, n_classes: int = 2, noise=None,
                   cache: Optional[TeacherCache] = None, cache_id: Optional[dict] = None,
                   max_labels: Optional[int] = None) -> BaggingResult:
    """Teachers on the private window, noisy labels on the public points, the student.

    Under a grant (``ledger`` and ``grant_id``): the grant decides what is spent
    (:func:`labels_from_grant`), the public range comes from the ledger's cursor of this window,
    and the labels and report are released once: a repeated call with the same grant (in any
    process) returns the recorded labels without reading private data or drawing noise, and the
    student is retrained from them. Without a ledger nothing is charged or recorded (experiments
    only): ``epsilon``/``delta`` size the run and labelling starts at public point 0.

    Args:
      X, y, units: private features (scaled from public or schema statistics), labels, and each
        row's privacy unit id (a declared key; several rows may share one unit).
      X_public: public features, in a public order; ``public_declared`` must be True (the caller
        vouches that the ledger marks the source public, or the user declared it so).
      cache, cache_id: reuse teachers of the same window (``cache_id`` = stream and block ids;
        under a grant it is the grant's window).
      max_labels: paper mode only: public points the purchase reserves (default: all left).
    Raises:
      InvalidRequestError: public data not declared public or empty, empty window, n larger than
        the number of units, bad shapes, no public points left, ε/δ given with a grant.
      InvalidPrivacyParameterError: bad ε, δ, λ. GrantStateError: the grant is not released.
      ReleaseConflictError: the grant already bought labels for another request.
    """
    if public_declared is not True:
        raise InvalidRequestError("the public data is not declared public; refusing to label it")
    X_public = np.asarray(X_public, dtype=np.float64)
    if X_public.ndim != 2 or len(X_public) == 0:
        raise InvalidRequestError("no public data to label")
    if len(units) == 0 or len(X) == 0:
        raise InvalidRequestError("the private window is empty")
    plan, window = _plan_of(config, ledger, grant_id, epsilon, delta, len(X_public), cache_id)
    reserve = purchase_lib.reservation(plan.queries, public_size=len(X_public),
                                       max_labels=max_labels)
    settings = {"l2": config.l2, "n_classes": n_classes}
    key = cache_key(stream=str(window.get("stream")), blocks=window.get("blocks", []),
                    k=config.k, n=config.n, salt=salt, kind=config.teacher, settings=settings)
    cached = False

    def label(start: int, stop: int) -> LabellingResult:
        nonlocal cached
        uniq, inverse = np.unique(np.asarray(units), return_inverse=True)
        if config.n > len(uniq):
            raise InvalidRequestError(f"n = {config.n} teachers per partition but only "
                                      f"{len(uniq)} privacy units in the window")
        unit_chunks = chunk_assignment(list(uniq.tolist()), k=config.k, n=config.n, salt=salt)

        def train():
            return train_teachers(X, np.asarray(y), unit_chunks[inverse], n=config.n,
                                  kind=config.teacher, n_classes=n_classes, l2=config.l2)

        if cache is not None:
            before = cache.trained
            ensemble = cache.get_or_train(
                key, train, window=(str(window.get("stream")), window.get("blocks", [])))
            cached = cache.trained == before
        else:
            ensemble = train()
        pool = X_public[start:stop]
        if plan.formally_dp:
            return fixed_labels(vote_counts(ensemble, pool), k=config.k, lam=config.lam,
                                accountant=config.accountant, epsilon=plan.epsilon,
                                delta=plan.delta, noise=noise, votes=config.votes,
                                bound=plan.bound)
        return label_public(ensemble, pool, epsilon=plan.epsilon, delta=plan.delta,
                            lam=config.lam, mode="paper", unit_chunks=unit_chunks, noise=noise,
                            max_order=config.max_order, accept_not_differentially_private=True)

    if ledger is None:
        stop = min(reserve, len(X_public))
        result = label(0, stop)
        bought = purchase_lib.Purchase(result.labels, 0, {**result.report(), "public_start": 0,
                                                          "public_reserved": stop}, False, "")
    else:
        request = purchase_lib.purchase_request(
            config, stream=window["stream"], blocks=window["blocks"], salt=salt,
            X_public=X_public, settings=settings, max_labels=max_labels)
        cursor = purchase_lib.cursor_name(stream=window["stream"], blocks=window["blocks"],
                                          config=config, salt=salt, settings=settings)
        bought = purchase_lib.buy_labels(ledger, grant_id, request=request, cursor=cursor,
                                         reserve=reserve, exact=plan.formally_dp,
                                         public_size=len(X_public), label=label)
    student = train_student(X_public[bought.public_index], bought.labels, l2=config.l2,
                            n_classes=n_classes)
    return BaggingResult(student, bought.labelling(), cached, bought.replayed, bought.report)


def _plan_of(config, ledger, grant_id, epsilon, delta, public_size, cache_id):
    """(LabelPlan, window) of a run: from the ledger's grant, or from (ε, δ) without a ledger."""
    if (ledger is None) != (grant_id is None):
        raise InvalidRequestError("give both ledger and grant_id (a purchase under a grant), or "
                                  "neither (an experiment that charges and records nothing)")
    if ledger is None:
        return (plan_labels(config, epsilon=epsilon, delta=delta, public_size=public_size),
                dict(cache_id or {}))
    if epsilon is not None or delta is not None:
        raise InvalidRequestError("under a grant the ledger's charge decides what is spent: "
                                  "do not pass epsilon or delta")
    grant = ledger.grant(grant_id)
    if grant.status != RELEASED:
        raise GrantStateError(
            f"grant {grant_id} is {grant.status}: only a released grant buys labels")
    window = {"stream": grant.stream, "blocks": sorted(grant.block_ids)}
    if cache_id is not None and {"stream": cache_id.get("stream"),
                                 "blocks": sorted(cache_id.get("blocks", []))} != window:
        raise InvalidRequestError(f"cache_id {cache_id} is not the grant's window {window}")
    report_delta = float(ledger.stream(grant.stream).delta_g) if grant.event is not None else None
    plan = labels_from_grant(config, epsilon=grant.epsilon, delta=grant.delta, event=grant.event,
                             public_size=public_size, report_delta=report_delta)
    return plan, window


def labels_from_grant(config: BaggingConfig, *, epsilon: Optional[float], delta: Optional[float],
                      event, public_size: int, report_delta: Optional[float] = None) -> LabelPlan:
    """What a granted run may spend, re-derived from the charge itself (never more).

    * rdp grant (a DpEvent): fixed_queries only; the event must be exactly
      ``SelfComposed(query, p)`` of this config's votes, k and λ (``votes.queries_event``), and
      p ≤ public_size. ε is reported at ``report_delta`` (the stream's δ_g) by the config's
      accountant.
    * basic grant (ε, δ): fixed_queries answers p = min(largest p with ε(p) ≤ ε, public_size)
      (so a grant made from :func:`plan_labels` gives back the same p); δ = 0 grants count the
      pure-DP bound only; paper mode spends the whole grant.

    Raises:
      InvalidRequestError: the charge does not describe this run (wrong votes or λ, paper mode
        on an rdp grant, p beyond the public set, no public data).
      GrantTooSmallError: the grant buys not one label.
    """
    import dp_accounting

    if public_size < 1:
        raise InvalidRequestError("no public data to label")
    if event is not None:
        if config.mode != "fixed_queries":
            raise InvalidRequestError("paper mode has a data-dependent cost that no DpEvent "
                                      "describes: run it on a basic-mode stream")
        mech = votes_lib.mechanism(config.votes, k=config.k, lam=config.lam)
        ok = (isinstance(event, dp_accounting.SelfComposedDpEvent)
              and event == votes_lib.queries_event(mech, int(event.count)))
        if not ok:
            raise InvalidRequestError(f"the grant charged {event}, which is not "
                                      f"SelfComposed({mech.event}, p): the {config.votes} vote "
                                      f"for k = {config.k}, lambda = {config.lam}")
        p = int(event.count)
        if p < 1:
            raise GrantTooSmallError(f"the grant charged {event}: zero votes buy no label; "
                                     "refusing rather than training a constant student")
        if p > public_size:
            raise InvalidRequestError(f"the grant pays for {p} labels but only {public_size} "
                                      "public points exist")
        if report_delta is None:
            raise InvalidRequestError("an rdp grant needs the delta to report epsilon at")
        eps, bound = votes_lib.best_epsilon(mech, p, float(report_delta), config.accountant)
        return LabelPlan(p, eps, float(report_delta), event, True, bound=bound)
    return plan_labels(config, epsilon=epsilon, delta=delta, public_size=public_size)
