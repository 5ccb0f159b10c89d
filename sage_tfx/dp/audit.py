"""Black-box privacy audits: empirical lower bounds on ε from adjacent inputs (numpy only).

A mechanism M claims (ε, δ)-DP. For adjacent inputs a, b and any output event E,
``P[M(a) ∈ E] ≤ e^ε · P[M(b) ∈ E] + δ``. Running M many times on a and on b and bounding both
probabilities with Clopper–Pearson intervals gives, with confidence ``1 − alpha``,

    ε ≥ ln((p̲_a − δ) / p̄_b)

(p̲_a the lower bound on P[M(a) ∈ E], p̄_b the upper bound on P[M(b) ∈ E]). A *correct* mechanism
keeps this below its claimed ε except with probability ≤ alpha; a broken one (a sensitivity
halved, noise drawn at the wrong scale, a floating-point leak) pushes it above. This is the
StatDP / DP-Sniper recipe (Ding et al. 2018; Bichsel et al. 2021): :func:`audit_mechanism` picks
the event (a threshold on a scalar statistic of the output, in either direction) on one half of
the runs and certifies it on the other half, so choosing the event costs no confidence.

Threshold audits must certify an event of probability ~δ to say anything about an (ε, δ)
claim; for the Gaussian mechanism at δ = 10⁻⁵ that takes ≳ 10⁵ runs per input.
:func:`gaussian_shift_audit` instead estimates the hockey-stick divergence of an
input-plus-Gaussian-noise mechanism through its one parameter μ = shift / σ (confidence bounds
on both), and reads ε at δ off dp_accounting's privacy-loss distribution: a few thousand runs
catch a halved sensitivity. It assumes Gaussian outputs with a common σ (a normality test is
reported); the threshold audit stays the assumption-free check.

:func:`textbook_laplace_reachable` is the floating-point attack of Mironov (CCS 2012) against
numpy's Laplace sampler: it decides whether a double ``y`` is an output ``x + Laplace(scale)`` of
numpy's textbook sampler at input ``x`` by inverting the sampler and checking the neighbouring
grid points of its uniform draw exactly. Outputs at one input are mostly unreachable from an
adjacent input, whatever ε is claimed.

Privacy audits give lower bounds only: passing one is evidence, not a proof. This module imports
no TensorFlow.

Two audits of trained models complete the black-box tester:

* :func:`membership_inference` — the loss-threshold membership-inference attack of TF Privacy's
  ``privacy_tests.membership_inference_attack`` (``AttackType.THRESHOLD_ATTACK``: a lower loss
  means "member"; AUC and attacker advantage ``max |TPR − FPR|`` on train vs held-out). The
  pinned ``tensorflow-privacy`` 0.9.0 wheel ships without ``privacy_tests`` (its old
  ``privacy/membership_inference_attack/*`` shims import the missing package and fail;
  tensorflow/privacy#555). The 0.8.12 wheel on PyPI still has it, but installing it means
  downgrading the pinned 0.9.0 (and a second copy of one distribution cannot be installed), so
  this function computes what 0.8.12's ``_run_threshold_attack`` and ``RocCurve`` compute, with
  the same scikit-learn calls: ``roc_curve(1 for train / 0 for held-out, −loss)``, AUC of that
  curve, advantage ``max |TPR − FPR|``. (Its ε lower bounds and slicing are not reproduced.)
  The report is computed from the private training data and is *not* DP: it is an audit for the
  data owner, never a release.
* :func:`one_run_epsilon_lower_bound` — auditing in one training run (Steinke, Nasr & Jagielski,
  NeurIPS 2023, Thm. 3.1 / Alg. 1): m canaries, each inserted independently with probability 1/2;
  after training, the auditor guesses "in" for the k lowest-loss canaries and "out" for the k
  highest. For an ε-DP training run the number of correct guesses among the r = 2k made is
  stochastically dominated by Binomial(r, e^ε / (1 + e^ε)); the largest ε that this tail
  rejects at level β is a lower bound on ε with confidence 1 − β. δ is ignored (the pure-ε form
  of the theorem); for DP-SGD's small δ this can only make the bound larger, i.e. the check
  "bound below the charged ε" is conservative.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import numpy as np
from scipy import stats

from sage_tfx.errors import InvalidPrivacyParameterError

__all__ = ["AuditResult", "GaussianShiftAudit", "MembershipInference", "audit_mechanism",
           "clopper_pearson", "epsilon_lower_bound", "gaussian_shift_audit",
           "membership_inference", "one_run_audit",
           "one_run_epsilon_lower_bound",
           "textbook_laplace_reachable"]

_TWO53 = 9007199254740992.0


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """Exact two-sided ``1 − alpha`` confidence interval of a binomial proportion.

    Raises:
      ValueError: trials < 1, successes outside [0, trials], alpha outside (0, 1).
    """
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, trials >= 1; got {successes}/{trials}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    lo = 0.0 if successes == 0 else float(stats.beta.ppf(alpha / 2, successes,
                                                         trials - successes + 1))
    hi = 1.0 if successes == trials else float(stats.beta.ppf(1 - alpha / 2, successes + 1,
                                                              trials - successes))
    return lo, hi


def epsilon_lower_bound(hits_a: int, runs_a: int, hits_b: int, runs_b: int, *,
                        delta: float = 0.0, alpha: float = 0.05) -> float:
    """ε lower bound ``ln((p̲_a − δ) / p̄_b)`` holding with confidence ``1 − alpha`` (≥ 0).

    Each proportion gets a Clopper–Pearson interval at ``alpha / 2`` (one side of each is used),
    so the bound holds with probability ≥ 1 − alpha.
    """
    if not 0.0 <= delta < 1.0:
        raise InvalidPrivacyParameterError(f"delta must lie in [0, 1), got {delta!r}")
    p_a, _ = clopper_pearson(hits_a, runs_a, alpha)
    _, p_b = clopper_pearson(hits_b, runs_b, alpha)
    if p_a - delta <= 0.0:
        return 0.0
    return max(0.0, math.log((p_a - delta) / p_b))


class _LowerBound:
    """An empirical lower bound on ε next to the claimed ε (mixin of the audit results)."""

    claimed_epsilon: float
    epsilon_lower_bound: float

    @property
    def passed(self) -> bool:
        """True iff the empirical lower bound stays at or below the claimed ε."""
        return self.epsilon_lower_bound <= self.claimed_epsilon

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "passed": self.passed}


@dataclasses.dataclass(frozen=True)
class AuditResult(_LowerBound):
    """One black-box audit of a mechanism on one pair of adjacent inputs.

    Attributes:
      claimed_epsilon: the ε the mechanism (its DpEvent) claims.
      epsilon_lower_bound: certified lower bound on the true ε (confidence 1 − alpha).
      event: the certified event, e.g. ``"stat(a) >= 3.2"``.
      hits_a, hits_b, runs: the event's counts on the certification half.
      alpha: the confidence parameter.
    """

    claimed_epsilon: float
    epsilon_lower_bound: float
    event: str
    hits_a: int
    hits_b: int
    runs: int
    alpha: float


def _threshold_events(sel_a: np.ndarray, sel_b: np.ndarray, num_thresholds: int,
                      min_fraction: float, alpha: float) -> tuple[bool, str, float]:
    """The (direction, side, threshold) with the largest ε lower bound on the selection half
    (a confidence bound, not the plug-in ratio, so that rare tail events with noisy counts are
    not preferred); ``side`` says which of a / b the event favours."""
    pooled = np.concatenate([sel_a, sel_b])
    thresholds = np.unique(np.quantile(pooled, np.linspace(0.01, 0.99, num_thresholds)))
    n_a, n_b = sel_a.size, sel_b.size
    sorted_a, sorted_b = np.sort(sel_a), np.sort(sel_b)
    # counts of y >= t and y <= t, for every threshold at once
    ge_a = n_a - np.searchsorted(sorted_a, thresholds, side="left")
    ge_b = n_b - np.searchsorted(sorted_b, thresholds, side="left")
    le_a = np.searchsorted(sorted_a, thresholds, side="right")
    le_b = np.searchsorted(sorted_b, thresholds, side="right")
    candidates = []  # (upper, side, k_favoured, n_favoured, k_other, n_other)
    for upper, k_a, k_b in ((True, ge_a, ge_b), (False, le_a, le_b)):
        candidates.append((upper, "a", k_a, n_a, k_b, n_b))
        candidates.append((upper, "b", k_b, n_b, k_a, n_a))
    best = (-math.inf, True, "a", float(thresholds[0]))
    for upper, side, k_x, n_x, k_y, n_y in candidates:
        # the ε lower bound of epsilon_lower_bound, vectorised over thresholds
        p_x = np.where(k_x > 0, stats.beta.ppf(alpha / 2, np.maximum(k_x, 1), n_x - k_x + 1), 0.0)
        p_y = np.where(k_y < n_y, stats.beta.ppf(1 - alpha / 2, k_y + 1,
                                                 np.maximum(n_y - k_y, 1)), 1.0)
        with np.errstate(divide="ignore"):
            loss = np.where((k_x >= min_fraction * min(n_a, n_b)) & (p_x > 0),
                            np.log(np.maximum(p_x, 1e-300) / p_y), -np.inf)
        i = int(np.argmax(loss))
        if loss[i] > best[0]:
            best = (float(loss[i]), upper, side, float(thresholds[i]))
    return best[1], best[2], best[3]


def audit_mechanism(release: Callable[[Any, int], np.ndarray], input_a: Any, input_b: Any, *,
                    claimed_epsilon: float, runs: int, delta: float = 0.0, alpha: float = 0.05,
                    statistic: Optional[Callable[[np.ndarray], np.ndarray]] = None,
                    num_thresholds: int = 40, min_fraction: float = 0.01) -> AuditResult:
    """Black-box ε audit of ``release`` on adjacent inputs (StatDP / DP-Sniper style).

    Args:
      release: ``release(x, n)`` → n independent outputs of the mechanism on input x (shape
        ``(n,)`` or ``(n, ...)``).
      input_a, input_b: adjacent inputs.
      claimed_epsilon: the ε the mechanism claims (reported next to the bound).
      runs: outputs drawn per input; half select the event, half certify it.
      delta: the claimed δ (the bound subtracts it).
      alpha: 1 − confidence of the lower bound.
      statistic: maps the ``(n, ...)`` outputs to n scalars (default: the first coordinate).
      num_thresholds: candidate thresholds (quantiles of the pooled selection outputs).
      min_fraction: an event must hold on at least this fraction of the selection runs of the
        input it favours (tiny events estimate the loss too noisily to be worth certifying).

    Returns:
      The :class:`AuditResult` (``passed`` iff the bound is ≤ the claimed ε).
    """
    if runs < 4:
        raise ValueError(f"runs must be >= 4, got {runs!r}")

    def scalars(x: Any) -> np.ndarray:
        out = np.asarray(release(x, runs))
        if statistic is not None:
            return np.asarray(statistic(out), dtype=np.float64).reshape(runs)
        return out.reshape(runs, -1)[:, 0].astype(np.float64)

    out_a, out_b = scalars(input_a), scalars(input_b)
    half = runs // 2
    upper, side, t = _threshold_events(out_a[:half], out_b[:half], num_thresholds, min_fraction,
                                       alpha)
    cert_a, cert_b = out_a[half:], out_b[half:]
    hit_a = int(np.sum(cert_a >= t) if upper else np.sum(cert_a <= t))
    hit_b = int(np.sum(cert_b >= t) if upper else np.sum(cert_b <= t))
    if side == "b":
        hit_a, hit_b = hit_b, hit_a
    bound = epsilon_lower_bound(hit_a, cert_a.size, hit_b, cert_b.size, delta=delta, alpha=alpha)
    event = f"stat({side}) {'>=' if upper else '<='} {t:.6g}"
    return AuditResult(float(claimed_epsilon), bound, event, hit_a, hit_b, int(cert_a.size),
                       float(alpha))


@dataclasses.dataclass(frozen=True)
class GaussianShiftAudit(_LowerBound):
    """Result of :func:`gaussian_shift_audit` (confidence 1 − alpha).

    Attributes:
      claimed_epsilon, delta: the (ε, δ) the mechanism claims.
      epsilon_lower_bound: ε at ``delta`` of a Gaussian mechanism with ``mu_lower_bound``.
      mu_lower_bound: lower bound on |mean(a) − mean(b)| / σ (the sensitivity-to-noise ratio).
      sigma_upper_bound: upper bound on the noise std.
      runs: outputs per input.
      normality_pvalue: D'Agostino–Pearson test of the centred outputs (small: the outputs are
        not Gaussian and the bound does not apply).
    """

    claimed_epsilon: float
    delta: float
    epsilon_lower_bound: float
    mu_lower_bound: float
    sigma_upper_bound: float
    runs: int
    alpha: float
    normality_pvalue: float


def gaussian_shift_audit(release: Callable[[Any, int], np.ndarray], input_a: Any, input_b: Any,
                         *, claimed_epsilon: float, delta: float, runs: int,
                         alpha: float = 0.05) -> GaussianShiftAudit:
    """(ε, δ) audit of a mechanism that outputs its input plus Gaussian noise (hockey-stick).

    For ``M(x) = f(x) + N(0, σ²)`` the whole (ε, δ) curve is that of the Gaussian mechanism with
    ``μ = |f(a) − f(b)| / σ`` (Balle & Wang 2018): ``δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)``, the
    hockey-stick divergence between the two output distributions. Threshold audits
    (:func:`audit_mechanism`) must certify a tail event of probability ~δ, which needs ≳ 10⁵
    runs to see a halved sensitivity at δ = 10⁻⁵; estimating μ needs only ~10³. From the outputs
    at a and b: an upper bound σ̄ on σ (χ² interval of the pooled variance, confidence
    1 − alpha/2) and a lower bound on |f(a) − f(b)| (normal interval with σ̄, 1 − alpha/2) give
    ``μ̲ ≤ μ``; the returned ε is the Gaussian mechanism's ε at ``delta`` for μ̲, from
    dp_accounting's optimistic privacy-loss distribution (never above the exact ε). If the
    outputs are Gaussian with a common σ (checked and reported, ``normality_pvalue``), the true
    ε at ``delta`` is at least the bound with confidence ≥ 1 − alpha.

    Args:
      release: ``release(x, n)`` → n independent scalar outputs at input x.
      input_a, input_b: adjacent inputs.
      claimed_epsilon, delta: the mechanism's claim.
      runs: outputs per input, ≥ 10.
      alpha: 1 − confidence.
    """
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    if runs < 10:
        raise ValueError(f"runs must be >= 10, got {runs!r}")
    if not 0.0 < delta < 1.0:
        raise InvalidPrivacyParameterError(f"delta must lie in (0, 1), got {delta!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    out_a = np.asarray(release(input_a, runs), dtype=np.float64).reshape(runs)
    out_b = np.asarray(release(input_b, runs), dtype=np.float64).reshape(runs)
    dof = 2 * runs - 2
    pooled = (np.var(out_a, ddof=1) + np.var(out_b, ddof=1)) / 2.0
    sigma_hi = math.sqrt(dof * pooled / stats.chi2.ppf(alpha / 2, dof))
    half_width = stats.norm.ppf(1 - alpha / 4) * sigma_hi * math.sqrt(2.0 / runs)
    mu_lo = max(0.0, abs(out_a.mean() - out_b.mean()) - half_width) / sigma_hi
    eps = 0.0
    if mu_lo > 0.0:
        eps = pld_lib.from_gaussian_mechanism(
            1.0 / mu_lo, sensitivity=1.0, pessimistic_estimate=False,
            use_connect_dots=False).get_epsilon_for_delta(delta)
    centred = np.concatenate([out_a - out_a.mean(), out_b - out_b.mean()])
    return GaussianShiftAudit(float(claimed_epsilon), float(delta), max(0.0, float(eps)),
                              float(mu_lo), float(sigma_hi), int(runs), float(alpha),
                              float(stats.normaltest(centred).pvalue))


def _numpy_laplace(u: float, loc: float, scale: float) -> float:
    """numpy ``Generator.laplace(loc, scale)`` for the uniform draw ``u`` (its C code, in doubles).
    """
    if u >= 0.5:
        return loc - scale * math.log(2.0 - u - u)
    return loc + scale * math.log(u + u)


def textbook_laplace_reachable(y: float, x: float, scale: float, width: int = 8) -> bool:
    """Whether ``y`` is an output ``x + Laplace(scale)`` of numpy's textbook sampler.

    numpy draws ``u = k / 2**53`` and returns ``x ± scale·log(2u)`` (in doubles); ``x + draw`` is
    the same double (``fl(x + fl(d)) = fl(x + d)`` here is how the old mechanisms added noise).
    Inverts the sampler for ``k`` and checks ``k ± width`` exactly: Mironov's test of the set of
    reachable outputs.
    """
    d = (y - x) / scale
    u = math.exp(d) / 2.0 if d <= 0 else (2.0 - math.exp(-d)) / 2.0
    k0 = int(round(u * _TWO53))
    for k in range(max(1, k0 - width), min(int(_TWO53) - 1, k0 + width) + 1):
        if _numpy_laplace(k * (1.0 / _TWO53), x, scale) == y:
            return True
    return False


@dataclasses.dataclass(frozen=True)
class MembershipInference:
    """The loss-threshold attack on train vs held-out examples (not DP: an audit, never released).

    Attributes:
      auc: ROC AUC of "member" scored by the negated loss (0.5: no better than chance).
      attacker_advantage: ``max |TPR − FPR|`` over thresholds (Yeom et al. 2018; TF Privacy's
        ``RocCurve.get_attacker_advantage``).
      num_train, num_heldout: examples attacked on each side.
    """

    auc: float
    attacker_advantage: float
    num_train: int
    num_heldout: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the attack result, marked as not a DP claim."""
        return {**dataclasses.asdict(self),
                "attack": ("loss threshold: TF Privacy 0.8.12 THRESHOLD_ATTACK's ROC, AUC and "
                           "advantage, computed with scikit-learn (0.9.0 lacks privacy_tests)"),
                "differentially_private": False}


def membership_inference(loss_train: Any, loss_heldout: Any) -> MembershipInference:
    """AUC and attacker advantage of the loss-threshold membership-inference attack.

    Raises:
      ValueError: an empty side, or a non-finite loss.
    """
    from sklearn import metrics  # pylint: disable=import-outside-toplevel
    train = np.asarray(loss_train, dtype=np.float64).ravel()
    heldout = np.asarray(loss_heldout, dtype=np.float64).ravel()
    if train.size == 0 or heldout.size == 0:
        raise ValueError("membership inference needs train and held-out examples")
    if not (np.all(np.isfinite(train)) and np.all(np.isfinite(heldout))):
        raise ValueError("per-example losses must be finite")
    labels = np.concatenate([np.ones(train.size), np.zeros(heldout.size)])
    scores = -np.concatenate([train, heldout])
    fpr, tpr, _ = metrics.roc_curve(labels, scores)
    return MembershipInference(float(metrics.auc(fpr, tpr)), float(np.max(np.abs(tpr - fpr))),
                               int(train.size), int(heldout.size))


def one_run_epsilon_lower_bound(correct: int, guesses: int, beta: float = 0.05) -> float:
    """Largest ε with ``P[Binomial(guesses, e^ε/(1+e^ε)) ≥ correct] ≤ beta`` (0 if none).

    Steinke, Nasr & Jagielski (2023), Thm. 3.1: with confidence 1 − β the training run is not
    ε'-DP for any ε' below the returned value.
    """
    if guesses < 1 or not 0 <= correct <= guesses:
        raise ValueError(f"need 0 <= correct <= guesses, guesses >= 1; got {correct}/{guesses}")
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must lie in (0, 1), got {beta!r}")

    def tail(eps: float) -> float:  # P[Bin(r, p_eps) >= correct], increasing in eps
        return float(stats.binom.sf(correct - 1, guesses, 1.0 / (1.0 + math.exp(-eps))))

    if tail(0.0) > beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while tail(hi) <= beta:
        lo, hi = hi, 2.0 * hi
        if hi > 100.0:
            return lo
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if tail(mid) <= beta:
            lo = mid
        else:
            hi = mid
    return lo


@dataclasses.dataclass(frozen=True)
class OneRunAudit:
    """Result of :func:`one_run_audit`: guesses, correct guesses and the ε lower bound."""

    num_canaries: int
    included: int
    guesses: int
    correct: int
    epsilon_lower_bound: float
    beta: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the audit."""
        return dataclasses.asdict(self)


def one_run_audit(train_and_score: Callable[[np.ndarray], np.ndarray], num_canaries: int,
                  guesses_per_side: int, *, beta: float = 0.05,
                  rng: Optional[np.random.Generator] = None) -> OneRunAudit:
    """Auditing in one training run (Steinke, Nasr & Jagielski 2023, Alg. 1).

    Args:
      train_and_score: given the boolean inclusion mask of the canaries, trains ONE model on the
        data plus the included canaries and returns a loss per canary (all of them).
      num_canaries: m.
      guesses_per_side: k: "in" for the k lowest losses, "out" for the k highest (2k ≤ m).
      beta: 1 − confidence of the bound.
      rng: draws the inclusion mask (fresh OS entropy by default).
    """
    if not 1 <= 2 * guesses_per_side <= num_canaries:
        raise ValueError(f"need 1 <= 2 * guesses_per_side <= num_canaries, got "
                         f"{guesses_per_side}, {num_canaries}")
    gen = np.random.default_rng() if rng is None else rng
    include = gen.random(num_canaries) < 0.5
    losses = np.asarray(train_and_score(include.copy()), dtype=np.float64).reshape(num_canaries)
    order = np.argsort(losses, kind="stable")
    k = guesses_per_side
    correct = int(include[order[:k]].sum() + (~include[order[-k:]]).sum())
    return OneRunAudit(num_canaries, int(include.sum()), 2 * k, correct,
                       one_run_epsilon_lower_bound(correct, 2 * k, beta), float(beta))
