"""The two accountants of DP bagging: ``fixed_queries`` (formally DP) and ``paper`` (Alg. 1).

One query: Laplace noise of scale b = k/λ on each of the C vote counts, then argmax (§4).

**Theorem 1's constant.** The paper says the ℓ1-sensitivity of the count vector n_c(x) is k and
concludes 2λ-DP. Removing a unit retrains k teachers; each may move its vote from one class to
another, which lowers one count by 1 *and* raises another by 1, so the ℓ1 change is up to 2k
(ℓ∞ change k). The Laplace mechanism on the whole vector with ℓ1-sensitivity 2k and scale k/λ is
2k/(k/λ) = 2λ-DP, and argmax is post-processing: the theorem's ε = 2λ holds, its proof's
"sensitivity k" does not (with sensitivity k the same argument would give λ). We charge 2λ.

**As a dp_accounting event** a query is ``LaplaceDpEvent(noise_multiplier = b / Δ1 = 1/(2λ))``.
That event describes a scalar Laplace mechanism of sensitivity 1; the vector mechanism whose
ℓ1 change Δ1 is split over several coordinates is dominated by the scalar one with the whole Δ1
(checked against dp_accounting's PLD in ``tests/bagging/test_accounting.py``). The noise is
OpenDP's continuous Laplace (``sage_tfx.dp.noise.laplace``), not the discrete Laplace on integer
counts: dp_accounting has no discrete Laplace event, and the integer-grid discrete Laplace has
*more* privacy loss than ``LaplaceDpEvent`` says (its boundary atoms carry the full ±ε loss), so
charging ``LaplaceDpEvent`` for it would under-charge (also checked in the tests).

**fixed_queries** (default). The number of labels p is chosen before any vote, from the grant
alone: the largest p with ε(SelfComposed(query, p), δ) ≤ ε_grant for the chosen accountant (RDP
or PLD). Exactly that event is charged.

**paper** (reproduction only, *not* formally DP). Alg. 1's personalised moments accountant: per
unit u, α(l; u) += 2λ² m(x; u)² l(l+1) with m(x; u) = max_c {1 − n_c(x; u)} (Theorem 4; Theorem 5
for an added unit "∗"), ε̂ = min_l (max_u α(l; u) + log(1/δ)) / l (Theorem 3 with Eq. 1), and
queries are answered while ε̂ < ε. The number of answered queries is a function of the private
data and the student reveals it; §4.4 itself concedes a private stopping rule is missing. A run in
this mode is charged the whole grant and needs an explicit non-DP opt-in
(``BaggingConfig(accept_not_differentially_private=True)``). Where the paper is inconsistent we
do the following:

* min/max order: Eq. 2 with Eq. 1/4 gives min_l max_u; Alg. 1 line 24 writes max_u min_l (which is
  smaller in general). Here α(l; u) = S(u)·2λ² l(l+1) with S(u) = Σ_queries m(x; u)², a product of
  a per-unit factor and a per-order factor, so the two orders coincide; we compute min_l with
  max_u S(u).
* stopping: Alg. 1 checks ε̂ < ε *before* each query, so the last answered query pushes ε̂ past ε.
  :meth:`PersonalisedMomentsAccountant.answer` stops *before* crossing instead: a query is
  answered only if ε̂ after it is still ≤ ε, so the query that would cross is never answered
  (``reproduce_alg1=True`` and ``trajectory`` keep Alg. 1's count, which is what Table 2 counts).
  ε̂ itself is data-dependent and never paid for: it is not written into any report or log of a
  run (the reproduction in ``sage_tfx.bagging.eval`` computes it on its stand-in data only).
* "∗" (Theorem 5): a unit added to D joins one chunk per partition; the paper fixes those chunks
  "without loss of generality" (Alg. 1 line 4: I(∗) = {(n, 1), …, (n, k)}, with the roles of n
  and k swapped relative to §4). It is not without loss of generality: the chunk a new unit joins
  is not the analyst's choice, and the worst case is the maximum over all chunk choices, which is
  m(∗) = 1 as soon as each partition has one teacher outside some class. We follow the paper
  (last chunk of each partition) for the stopping rule and also report ε̂ with the worst-case ∗.
* Alg. 1 line 3 says "n partitions ... of n disjoint subsets": k partitions of n chunks is meant.
* multiclass m: m(x; u) = 1 − min_c n_c(x; u) is the personal ℓ1 change divided by 2k for any C
  (the worst retraining moves all of T(u) to the least-voted class), so Theorem 4 holds for C > 2;
  Remark (ii)'s lower bound 1 − 1/C follows.
"""
from __future__ import annotations

import math

import numpy as np

from sage_tfx.errors import InvalidPrivacyParameterError

__all__ = ["ACCOUNTANTS", "check_lambda", "per_query_epsilon", "query_event", "queries_event",
           "epsilon_of", "max_queries", "moments_epsilon", "PersonalisedMomentsAccountant"]

ACCOUNTANTS = ("rdp", "pld")
DEFAULT_MAX_ORDER = 32


def check_lambda(lam) -> float:
    """λ (the noisy argmax's noise parameter) as a float.

    Raises:
      InvalidPrivacyParameterError: λ is not a finite number > 0.
    """
    if isinstance(lam, bool) or not isinstance(lam, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(lam)) or float(lam) <= 0:
        raise InvalidPrivacyParameterError(
            f"noise parameter lambda must be finite and > 0, got {lam!r}")
    return float(lam)


def _check_eps_delta(epsilon, delta):
    from sage_tfx.ledger.accounting import check_delta, check_epsilon
    check_epsilon(epsilon)
    check_delta(delta)
    if not 0 < float(epsilon) < math.inf or not 0 < float(delta) < 1:
        raise InvalidPrivacyParameterError(
            f"need 0 < epsilon < inf and 0 < delta < 1, got ({epsilon}, {delta})")
    return float(epsilon), float(delta)


def per_query_epsilon(lam: float) -> float:
    """Pure ε of one noisy-argmax query: 2λ (Theorem 1 with ℓ1-sensitivity 2k)."""
    return 2.0 * check_lambda(lam)


def query_event(lam: float):
    """dp_accounting event of one query: Laplace with noise_multiplier b/Δ1 = (k/λ)/(2k)."""
    import dp_accounting
    return dp_accounting.LaplaceDpEvent(noise_multiplier=1.0 / (2.0 * check_lambda(lam)))


def queries_event(lam: float, queries: int):
    """dp_accounting event of ``queries`` noisy-argmax queries: :func:`query_event` self-composed.

    Raises:
      InvalidPrivacyParameterError: ``queries`` is not an integer >= 0, or λ is invalid.
    """
    import dp_accounting
    if isinstance(queries, bool) or not isinstance(queries, (int, np.integer)) or queries < 0:
        raise InvalidPrivacyParameterError(f"queries must be an integer >= 0, got {queries!r}")
    return dp_accounting.SelfComposedDpEvent(query_event(lam), int(queries))


def _accountant(name: str):
    import dp_accounting
    if name == "rdp":
        return dp_accounting.rdp.RdpAccountant()
    if name == "pld":
        return dp_accounting.pld.PLDAccountant()
    raise InvalidPrivacyParameterError(f"accountant must be one of {ACCOUNTANTS}, got {name!r}")


def epsilon_of(queries: int, *, lam: float, delta: float, accountant: str = "rdp") -> float:
    """ε at δ of ``queries`` composed queries, by dp_accounting's RDP or PLD accountant."""
    acc = _accountant(accountant)
    if queries == 0:
        return 0.0
    acc.compose(queries_event(lam, queries))
    return float(acc.get_epsilon(delta))


def max_queries(epsilon: float, delta: float, *, lam: float, accountant: str = "rdp",
                limit: int = 10_000_000) -> int:
    """Largest p ≤ limit with ε(p) ≤ ``epsilon`` (data-independent: the grant decides p)."""
    epsilon, delta = _check_eps_delta(epsilon, delta)
    lam = check_lambda(lam)
    # noqa: E731
    fits = lambda p: epsilon_of(p, lam=lam, delta=delta, accountant=accountant) <= epsilon
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        if fits(limit):
            return limit
        hi = limit
    while hi - lo > 1:   # invariant: fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def moments_epsilon(S, *, lam: float, delta: float, max_order: int = DEFAULT_MAX_ORDER):
    """ε̂ = min_{l=1..L} (2λ² l(l+1) S + log(1/δ)) / l for an accumulated S = Σ m² (Theorem 3)."""
    S = np.asarray(S, dtype=np.float64)
    orders = np.arange(1, max_order + 1, dtype=np.float64)
    vals = (2.0 * lam * lam * orders * (orders + 1) * S[..., None] + math.log(1.0 / delta)) / orders
    return vals.min(axis=-1)


class PersonalisedMomentsAccountant:
    """Alg. 1 lines 14–24: one accumulator per privacy unit plus the added unit ∗.

    Keeps S(u) = Σ m(x; u)² (float64 [U]); never materialises per-teacher membership.
    """

    def __init__(self, unit_chunks: np.ndarray, *, n: int, lam: float, delta: float,
                 max_order: int = DEFAULT_MAX_ORDER):
        self.unit_chunks = np.asarray(unit_chunks, dtype=np.int64)
        self.k = self.unit_chunks.shape[1]
        self.n = n
        self.lam = check_lambda(lam)
        self.delta = float(delta)
        self.max_order = max_order
        self.S = np.zeros(len(self.unit_chunks))
        self.S_star = 0.0          # the paper's fixed ∗ chunks (last chunk of each partition)
        self.S_star_worst = 0.0    # worst case over the chunks an added unit could join

    def _m_squared(self, pred: np.ndarray, n_classes: int):
        """m(x; u)² for a batch of queries: [B, U], plus the two ∗ variants [B]."""
        B = len(pred)
        if n_classes == 2:     # one count suffices: n_0 = k - n_1
            ones = np.zeros((B, len(self.S)), dtype=np.int32)
            for i in range(self.k):
                ones += pred[:, i, :][:, self.unit_chunks[:, i]]
            least = np.minimum(ones, self.k - ones)
        else:
            counts = np.zeros((n_classes, B, len(self.S)), dtype=np.int32)
            for i in range(self.k):
                g = pred[:, i, :][:, self.unit_chunks[:, i]]        # [B, U] class ids
                for c in range(n_classes):
                    counts[c] += (g == c)
            least = counts.min(axis=0)
        m = 1.0 - least / self.k
        star = pred[:, :, self.n - 1]
        m_star = 1.0 - np.stack([(star == c).sum(1) for c in range(n_classes)]).min(0) / self.k
        unanimous = np.stack([(pred == c).all(axis=2).sum(1) for c in range(n_classes)])
        m_worst = 1.0 - unanimous.min(0) / self.k
        return m * m, m_star ** 2, m_worst ** 2

    def epsilon_hat(self, S_max=None) -> float:
        """ε at the accountant's δ from the largest accumulated S (every unit and the fixed ∗
        unit), or from ``S_max`` when given (Alg. 1's moments bound, ``moments_epsilon``)."""
        S_max = max(self.S.max(initial=0.0), self.S_star) if S_max is None else S_max
        return float(
            moments_epsilon(S_max, lam=self.lam, delta=self.delta, max_order=self.max_order))

    def epsilon_hat_worst_star(self) -> float:
        """:meth:`epsilon_hat` with the added unit ∗ in the worst chunks it could join."""
        return self.epsilon_hat(max(self.S.max(initial=0.0), self.S_star_worst))

    def _advance(self, pred: np.ndarray, n_classes: int):
        """Running S after each query of ``pred`` without committing: (per-unit S [B, U],
        fixed-∗ S [B], worst-∗ increments [B])."""
        m2, m2_star, m2_worst = self._m_squared(pred, n_classes)
        return self.S[None, :] + np.cumsum(m2, axis=0), self.S_star + np.cumsum(m2_star), m2_worst

    def _commit(self, cum, cum_star, m2_worst, a):
        if a:
            self.S = cum[a - 1].copy()
            self.S_star = float(cum_star[a - 1])
            self.S_star_worst += float(m2_worst[:a].sum())

    def _step(self) -> int:
        return max(1, 4_000_000 // max(1, len(self.S)))

    def answer(self, pred: np.ndarray, epsilon: float, n_classes: int, *,
               reproduce_alg1: bool = False) -> int:
        """Answers the batch's queries in order; returns how many were answered.

        A query is answered only if ε̂ *after* it is ≤ ε: the query that would cross ε is not
        answered, and nothing after it. ``reproduce_alg1=True`` is Alg. 1's rule instead (answer
        while ε̂ *before* the query is < ε, so the last answer crosses ε), for the reproduction.
        """
        answered = 0
        for s in range(0, len(pred), self._step()):
            cum, cum_star, m2_worst = self._advance(pred[s:s + self._step()], n_classes)
            after = np.maximum(cum.max(axis=1), cum_star)
            if reproduce_alg1:
                before = np.concatenate([[max(self.S.max(initial=0.0), self.S_star)], after[:-1]])
                ok = moments_epsilon(before, lam=self.lam, delta=self.delta,
                                     max_order=self.max_order) < epsilon
            else:
                ok = moments_epsilon(after, lam=self.lam, delta=self.delta,
                                     max_order=self.max_order) <= epsilon
            a = int(np.argmin(ok)) if not ok.all() else len(ok)
            self._commit(cum, cum_star, m2_worst, a)
            answered += a
            if a < len(ok):
                break
        return answered

    def trajectory(self, pred: np.ndarray, n_classes: int) -> np.ndarray:
        """Consumes every query of ``pred``; returns max(max_u S(u), S(∗)) after each one.

        ε̂ is increasing in that maximum, so one pass gives Alg. 1's answer count for any
        (ε, δ): the number of queries q whose running maximum *before* q has ε̂ < ε.
        """
        out = []
        for s in range(0, len(pred), self._step()):
            cum, cum_star, m2_worst = self._advance(pred[s:s + self._step()], n_classes)
            out.append(np.maximum(cum.max(axis=1), cum_star))
            self._commit(cum, cum_star, m2_worst, len(cum))
        return np.concatenate(out) if out else np.zeros(0)
