"""The noisy votes of DP bagging and what each costs: Laplace, Gumbel and Gaussian noisy-max.

One query labels one public point with the noisy plurality of the k·n teachers' votes. Removing or
adding a privacy unit retrains k teachers (one per partition); each may move its vote from one
class to another, so the count vector n_c(x) changes by at most k in ℓ∞, 2k in ℓ1 and √2·k in ℓ2.

* ``laplace`` (Theorem 1; the default): Lap(b = k/λ) on every count, then argmax. 2λ-DP
  (ℓ1 change 2k); in dp_accounting ``LaplaceDpEvent(1/(2λ))`` (``accounting.query_event``).
* ``gumbel``: argmax of the counts plus Gumbel(β = k/λ) noise — the exponential mechanism with
  utility sensitivity k, drawn by OpenDP's ``make_noisy_max`` under zero-concentrated divergence
  (exactly, on the integer counts: ``sage_tfx.dp.noise.gumbel_max``). It is 2λ-DP and 2λ-bounded
  range, hence ρ = (2λ)²/8 = λ²/2-zCDP (Cesar & Rogers 2021; OpenDP's own map gives this ρ and is
  what we use) — a quarter of the Laplace vote's ρ = (2λ)²/2 at the same noise scale.
  dp_accounting 0.4.3 has no zCDP event; ρ-zCDP is exactly the RDP curve ρ·α, which is the curve
  of ``GaussianDpEvent(noise_multiplier = 1/√(2ρ))``, so that is the event charged and composed
  by the RDP bound. It says nothing about the PLD: a ρ-zCDP mechanism need not be dominated by the
  Gaussian of the same ρ, so the PLD bound of a Gumbel vote is dp_accounting's PLD of a pure
  2λ-DP mechanism (``from_privacy_parameters``), the worst case of every 2λ-DP mechanism.
  **Never account a Gumbel run's event with a Gaussian PLD.** Its own bound ``br`` is the optimal
  composition of 2λ-bounded-range mechanisms (Dong, Durfee & Rogers 2020; the worst-case pair is
  a randomised response with losses {t − 2λ, t}, maximised over t on a finite grid where the
  maximum is attained exactly; ``sage_tfx.bagging.bounded_range``), checked against
  dp_accounting's PLD of that pair. It needs the votes to be non-adaptive, which they are (the
  public points and teachers are fixed before the first vote).
* ``gaussian`` (PATE's GNMax): N(0, σ²) with σ = √2·k/λ on every count (OpenDP's
  ``make_gaussian``, ``sage_tfx.dp.noise.gaussian``), then argmax. ℓ2 change √2·k, so the query
  is ``GaussianDpEvent(σ/(√2·k)) = GaussianDpEvent(1/λ)``, ρ = λ²/2 (the noise multiplier is
  taken from OpenDP's ρ map, which accounts for its float grid). RDP and PLD are the Gaussian's;
  there is no pure-DP bound, so a δ = 0 grant buys no Gaussian vote.

**Bounds.** ``pure``: basic composition, p·ε_q ≤ ε (valid at every δ ≥ 0, including 0); ``rdp``:
dp_accounting's RDP accountant on ``SelfComposed(query, p)``; ``pld``: dp_accounting's PLD
(Laplace: the event's PLD; Gumbel: the pure-DP PLD above; Gaussian: the event's PLD); ``br``:
the bounded-range composition above (Gumbel only).
Accountant ``best`` answers the largest p any of them allows; the report names the bound
that gives the smallest ε at that p (the one that "won"). The number p depends on the grant and
the configuration only, never on data.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from sage_tfx.bagging import accounting as acc
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError

__all__ = ["VOTES", "BOUNDS", "ACCOUNTANTS", "VoteMechanism", "check_votes", "check_eps_delta",
           "mechanism", "queries_event", "epsilon_of", "best_epsilon", "max_queries",
           "draw_labels"]

VOTES = ("laplace", "gumbel", "gaussian")
BOUNDS = ("pure", "rdp", "pld", "br")
ACCOUNTANTS = ("best",) + BOUNDS
PLD_DISCRETIZATION = 1e-4
# ``br`` costs O(p) per evaluation: beyond this many votes (a public set far larger than any
# bagging run's) it says nothing and ``best`` uses the other bounds — a fixed rule, so p stays a
# function of the grant and the configuration only
BR_MAX_QUERIES = 200_000


def check_votes(votes) -> str:
    """``votes`` if it is a known vote mechanism; raises InvalidRequestError otherwise."""
    if votes not in VOTES:
        raise InvalidRequestError(f"votes must be one of {VOTES}, got {votes!r}")
    return votes


def check_accountant(accountant) -> str:
    """``accountant`` if it is known; raises InvalidPrivacyParameterError otherwise."""
    if accountant not in ACCOUNTANTS:
        raise InvalidPrivacyParameterError(
            f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    return accountant


def check_eps_delta(epsilon, delta):
    """(ε, δ) of a grant: 0 < ε < ∞ and 0 ≤ δ < 1 (δ = 0 is a pure-DP grant)."""
    from sage_tfx.ledger.accounting import check_delta, check_epsilon
    check_epsilon(epsilon)
    check_delta(delta)
    if not 0 < float(epsilon) < math.inf or not 0 <= float(delta) < 1:
        raise InvalidPrivacyParameterError(
            f"need 0 < epsilon < inf and 0 <= delta < 1, got ({epsilon}, {delta})")
    return float(epsilon), float(delta)


@dataclasses.dataclass(frozen=True)
class VoteMechanism:
    """One vote: its noise, and its per-query cost (pure ε or None, zCDP ρ or None, DpEvent)."""
    votes: str
    k: int
    lam: float
    noise_scale: float                  # Laplace b, Gumbel β, Gaussian σ (per count)
    pure_epsilon: Optional[float]       # per query; None: no pure-DP bound (Gaussian)
    rho: Optional[float]                # per query zCDP; None for Laplace (accounted exactly)
    event: object                       # per-query dp_accounting DpEvent (what a query charges)


def mechanism(votes: str, *, k: int, lam: float) -> VoteMechanism:
    """The vote ``votes`` of k partitions at noise parameter λ."""
    import dp_accounting

    from sage_tfx.dp import noise as noise_lib

    check_votes(votes)
    lam = acc.check_lambda(lam)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InvalidRequestError(f"k must be an integer >= 1, got {k!r}")
    k = int(k)
    if votes == "laplace":
        return VoteMechanism(votes, k, lam, k / lam, 2 * lam, None, acc.query_event(lam))
    if votes == "gumbel":
        beta = k / lam
        rho = noise_lib.gumbel_max_rho(beta, k)
        return VoteMechanism(votes, k, lam, beta, 2 * k / beta, rho,
                             dp_accounting.GaussianDpEvent(1.0 / math.sqrt(2.0 * rho)))
    sigma = math.sqrt(2.0) * k / lam
    rho = noise_lib.gaussian_rho(sigma, math.sqrt(2.0) * k)
    return VoteMechanism(votes, k, lam, sigma, None, rho,
                         dp_accounting.GaussianDpEvent(1.0 / math.sqrt(2.0 * rho)))


def queries_event(mech: VoteMechanism, queries: int):
    """The composed event of ``queries`` votes: what a run of p labels charges."""
    import dp_accounting
    if isinstance(queries, bool) or not isinstance(queries, (int, np.integer)) or queries < 0:
        raise InvalidPrivacyParameterError(f"queries must be an integer >= 0, got {queries!r}")
    return dp_accounting.SelfComposedDpEvent(mech.event, int(queries))


def epsilon_of(mech: VoteMechanism, queries: int, delta: float, bound: str) -> float:
    """ε at δ of ``queries`` votes by one bound (``math.inf`` where the bound says nothing)."""
    import dp_accounting
    from dp_accounting.pld import common as pld_common
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    if bound not in BOUNDS:
        raise InvalidPrivacyParameterError(f"bound must be one of {BOUNDS}, got {bound!r}")
    if queries == 0:
        return 0.0
    if bound == "pure":
        return math.inf if mech.pure_epsilon is None else queries * mech.pure_epsilon
    if delta == 0:      # RDP and PLD of these mechanisms give no finite ε at δ = 0 beyond pure
        return math.inf
    if bound == "br":
        from sage_tfx.bagging import bounded_range
        return math.inf if mech.votes != "gumbel" or queries > BR_MAX_QUERIES else \
            bounded_range.epsilon(mech.pure_epsilon, int(queries), delta)
    if bound == "rdp":
        a = dp_accounting.rdp.RdpAccountant()
        a.compose(queries_event(mech, queries))
        return float(a.get_epsilon(delta))
    if mech.votes == "gumbel":
        one = pld_lib.from_privacy_parameters(
            pld_common.DifferentialPrivacyParameters(mech.pure_epsilon, 0.0),
            value_discretization_interval=PLD_DISCRETIZATION)
        return float(one.self_compose(int(queries)).get_epsilon_for_delta(delta))
    a = dp_accounting.pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    a.compose(queries_event(mech, queries))
    return float(a.get_epsilon(delta))


def _bounds(accountant: str, mech: VoteMechanism = None):
    """The bounds an accountant tries. ``best`` on Gumbel votes skips the pure-DP PLD: every
    2λ-BR mechanism is 2λ-DP, so the optimal BR composition (``br``) is never above the optimal
    2λ-DP composition, which dp_accounting's pessimistic PLD bounds from above (beyond
    ``BR_MAX_QUERIES`` votes neither is tried: pure and RDP decide)."""
    if check_accountant(accountant) != "best":
        return (accountant,)
    return tuple(b for b in BOUNDS if not (mech is not None and mech.votes == "gumbel"
                                           and b == "pld"))


def best_epsilon(mech: VoteMechanism, queries: int, delta: float,
                 accountant: str = "best") -> tuple[float, str]:
    """(smallest ε at δ over the accountant's bounds, the bound that gives it)."""
    vals = [(epsilon_of(mech, queries, delta, b), b) for b in _bounds(accountant, mech)]
    eps, bound = min(vals, key=lambda v: v[0])
    return eps, bound


def _max_for(mech, bound, epsilon, delta, lo, limit) -> int:
    """Largest p in [lo, limit] with ε_bound(p) ≤ ε, or ``lo`` if none beyond it (lo fits or
    is 0)."""
    fits = lambda p: epsilon_of(mech, p, delta, bound) <= epsilon  # noqa: E731
    if bound == "br":
        if mech.votes != "gumbel" or delta == 0:
            return lo
        from sage_tfx.bagging import bounded_range
        fits = lambda p: bounded_range.delta(mech.pure_epsilon, p, epsilon) <= delta  # noqa: E731
        limit = min(limit, BR_MAX_QUERIES)
    if lo >= limit or not fits(lo + 1):
        return lo
    if bound == "pure":
        p = min(int(epsilon // mech.pure_epsilon), limit)
        while p > lo and not fits(p):
            p -= 1
        while p < limit and fits(p + 1):
            p += 1
        return p
    lo, step = lo + 1, 1
    while lo + step <= limit and fits(lo + step):
        lo, step = lo + step, step * 2
    hi = min(lo + step, limit + 1)       # fits(lo); hi does not fit, or is beyond the limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def max_queries(mech: VoteMechanism, epsilon: float, delta: float, *, accountant: str = "best",
                limit: int = 10_000_000) -> tuple[int, float, str]:
    """(p, ε(p), bound): the most votes whose ε at δ fits ``epsilon`` by some bound of the
    accountant (0 when none fits one vote), capped at ``limit``; data-independent."""
    epsilon, delta = check_eps_delta(epsilon, delta)
    p = 0
    for bound in _bounds(accountant, mech):   # each bound only has to beat the best so far
        p = _max_for(mech, bound, epsilon, delta, p, int(limit))
    if p == 0:
        return 0, 0.0, _bounds(accountant, mech)[0]
    eps, bound = best_epsilon(mech, p, delta, accountant)
    if bound == "br" and eps > epsilon:     # only the bisection's tolerance: p was admitted by
        eps = epsilon                       # bounded_range.delta(p, ε) ≤ δ at the grant's ε
    return p, eps, bound


def draw_labels(counts: np.ndarray, mech: VoteMechanism, *, noise=None) -> np.ndarray:
    """The noisy argmax of every row of ``counts`` [P, C] under ``mech`` (OpenDP by default;
    a ``SeededNoise`` for experiments only)."""
    from sage_tfx.dp import noise as noise_lib

    counts = np.asarray(counts)
    if counts.ndim != 2 or counts.shape[1] < 2:
        raise InvalidRequestError("counts must be [P, C] with C >= 2 classes")
    if len(counts) == 0:
        return np.zeros(0, dtype=np.int64)
    src = noise if noise is not None else noise_lib.SECURE
    if mech.votes == "gumbel":
        return np.asarray(src.gumbel_max(counts.astype(np.int64), mech.noise_scale), dtype=np.int64)
    draw = src.laplace if mech.votes == "laplace" else src.gaussian
    noisy = np.asarray(draw(counts.astype(np.float64), mech.noise_scale), dtype=np.float64)
    return np.asarray(np.argmax(noisy, axis=1), dtype=np.int64)
