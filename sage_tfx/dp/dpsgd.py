"""Privacy accounting of DP-SGD (Abadi et al., CCS 2016), the algorithm of Sage's NN and LG
pipelines.

Sage (SOSP '19, Tab. 1) trains its neural networks and logistic regression with DP-SGD [2, 35]. This
module turns DP-SGD hyper-parameters into a dp_accounting ``DpEvent`` (what the ledger charges in
``rdp`` mode), an ε at a given δ (what it charges in ``basic`` mode), and back: the smallest noise
multiplier meeting an (ε, δ) target.

Assumptions, stated once for every number this module returns:

* **Sampling.** Each step is accounted as a *Poisson-sampled* Gaussian mechanism with sampling
  probability ``q = batch_size / num_examples`` (every example joins each batch independently with
  probability q), and that is what :func:`sage_tfx.dp.keras_dpsgd.train_dp_keras`
  (``keras_dpsgd.poisson_batches``) and the DP Trainer (Poisson step assignment in Beam,
  ``sage_tfx.dp.poisson_batching``) run; the noisy sum is divided by the *expected* batch size.
  Shuffled fixed-size batches, which TF Privacy #483 reports accounted as Poisson, are no longer
  used for DP training.
* **Steps.** ``ceil(epochs * num_examples / batch_size)`` steps are accounted. A trainer that drops
  the last partial batch of each epoch runs ``epochs * floor(num_examples / batch_size)`` steps,
  never more, so the accounting is conservative for it.
* **Adjacency.** Add-or-remove-one example (dp_accounting's default ``ADD_OR_REMOVE_ONE``), with
  one example per microbatch: each step adds ``N(0, (noise_multiplier * l2_norm_clip)^2)`` to the
  sum of per-example gradients clipped to ``l2_norm_clip``.

This module imports no TensorFlow.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction
from typing import Any, Callable

import dp_accounting
import numpy as np
from dp_accounting import dp_event as dp_event_lib
from scipy import optimize

from sage_tfx.ledger.accounting import check_delta, check_epsilon, check_positive
from sage_tfx.errors import InvalidPrivacyParameterError

RDP = "rdp"
PLD = "pld"
ACCOUNTANTS = (RDP, PLD)
DEFAULT_ACCOUNTANT = PLD

# Width of the PLD's privacy-loss grid (dp_accounting's default). The discretization is
# pessimistic, so a coarser grid only makes ε larger (still an upper bound). At the demo's train
# part (63 steps, q = 0.032, σ = 2.65, δ = 1e-8) 1e-4 gives ε within 3e-6 of a 1e-5 grid in 0.4 s
# instead of 2.6 s (benchmarks/sage/bench_accountants.py).
PLD_VALUE_DISCRETIZATION_INTERVAL = 1e-4
# Calibration first searches σ on a 10× coarser grid (evaluations ~7× faster), then refines on
# the real grid next to it; the coarse σ is only a starting point, checked on the real grid.
_COARSE_PLD_INTERVAL = 1e-3

POISSON_SAMPLING = (
    "Poisson sampling with q = batch_size / num_examples, as accounted: every example joins "
    "every step independently with probability q; noisy sum divided by the expected batch size"
)
ADD_OR_REMOVE_ONE = "add_or_remove_one"

# Search range for calibration. Below 1e-3 the sampled Gaussian gives no meaningful privacy; above
# 1e4 the model sees only noise. Targets outside the range are reported, never clamped.
_MIN_NOISE_MULTIPLIER = 1e-3
_MAX_NOISE_MULTIPLIER = 1e4


def _check_count(value: Any, name: str) -> int:
    """Returns ``value`` as an int if it is a whole number ≥ 1 (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidPrivacyParameterError(f"{name} must be an integer, got {value!r}")
    if value < 1:
        raise InvalidPrivacyParameterError(f"{name} must be ≥ 1, got {value!r}")
    return int(value)


def check_accountant(accountant: Any) -> str:
    """Returns ``accountant`` if it names a supported accountant (``"rdp"`` or ``"pld"``).

    Raises:
      InvalidPrivacyParameterError: any other value.
    """
    if accountant not in ACCOUNTANTS:
        raise InvalidPrivacyParameterError(
            f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    return accountant


def make_accountant(accountant: str = DEFAULT_ACCOUNTANT) -> dp_accounting.PrivacyAccountant:
    """A fresh dp_accounting accountant: ``"pld"`` (the default) or ``"rdp"`` (default orders).

    Both use add-or-remove-one adjacency. The PLD accountant's grid is
    :data:`PLD_VALUE_DISCRETIZATION_INTERVAL` and its discretization pessimistic (dp_accounting
    builds Gaussian and sampled-Gaussian PLDs with ``pessimistic_estimate=True``), so its ε is an
    upper bound like RDP's, only tighter.

    Raises:
      InvalidPrivacyParameterError: unknown accountant name.
    """
    check_accountant(accountant)
    return _make_accountant(accountant, PLD_VALUE_DISCRETIZATION_INTERVAL)


def _make_accountant(accountant: str, interval: float) -> dp_accounting.PrivacyAccountant:
    if accountant == RDP:
        return dp_accounting.rdp.RdpAccountant()
    return dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=interval)


def _check_sampling(batch_size: Any, num_examples: Any, epochs: Any) -> tuple[int, int, float]:
    batch_size = _check_count(batch_size, "batch_size")
    num_examples = _check_count(num_examples, "num_examples")
    if batch_size > num_examples:
        raise InvalidPrivacyParameterError(
            f"batch_size ({batch_size}) must not exceed num_examples ({num_examples}): the "
            "sampling probability batch_size / num_examples would exceed 1")
    epochs = check_positive(epochs, "epochs")
    return batch_size, num_examples, epochs


def dpsgd_steps(batch_size: int, num_examples: int, epochs: float) -> int:
    """Number of accounted DP-SGD steps: ``ceil(epochs * num_examples / batch_size)``.

    A float ``epochs`` is read as the decimal number its repr shows, so ``epochs=0.1`` is exactly
    one tenth (no spurious extra step from binary rounding).

    Raises:
      InvalidPrivacyParameterError: non-positive or non-integer sizes, batch_size > num_examples.
    """
    batch_size, num_examples, epochs = _check_sampling(batch_size, num_examples, epochs)
    return _steps(batch_size, num_examples, epochs)


def _steps(batch_size: int, num_examples: int, epochs: float) -> int:
    return math.ceil(Fraction(repr(float(epochs))) * num_examples / batch_size)


def _event(noise_multiplier: float, batch_size: int, num_examples: int,
           steps: int) -> dp_event_lib.DpEvent:
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            sampling_probability=batch_size / num_examples,
            event=dp_accounting.GaussianDpEvent(noise_multiplier)),
        steps)


def dpsgd_event(noise_multiplier: float, batch_size: int, num_examples: int,
                epochs: float) -> dp_event_lib.DpEvent:
    """The DpEvent of a DP-SGD run (Abadi et al. 2016): a Poisson-sampled Gaussian, self-composed.

    ``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(noise_multiplier)), steps)`` with
    ``q = batch_size / num_examples`` and ``steps = ceil(epochs * num_examples / batch_size)``.
    Poisson sampling, as :func:`sage_tfx.dp.keras_dpsgd.train_dp_keras` runs it (module docstring).

    Args:
      noise_multiplier: Noise std divided by ``l2_norm_clip`` (TF Privacy's meaning), > 0.
      batch_size: Expected examples per step, 1 ≤ batch_size ≤ num_examples.
      num_examples: Number of training examples (n).
      epochs: Passes over the data, > 0 (may be fractional).

    Returns:
      The dp_accounting event, ready for ``PrivacyAccountant.compose`` or the ledger.

    Raises:
      InvalidPrivacyParameterError: a non-finite or non-positive value, non-integer sizes, or
        batch_size > num_examples.
    """
    noise_multiplier = check_positive(noise_multiplier, "noise_multiplier")
    batch_size, num_examples, epochs = _check_sampling(batch_size, num_examples, epochs)
    return _event(noise_multiplier, batch_size, num_examples,
                  _steps(batch_size, num_examples, epochs))


@functools.lru_cache(maxsize=256)
def _cached_epsilon(event: dp_event_lib.DpEvent, delta: float, accountant: str,
                    interval: float) -> float:
    return float(_make_accountant(accountant, interval).compose(event).get_epsilon(delta))


def _epsilon(event: dp_event_lib.DpEvent, delta: float, accountant: str,
             interval: float = PLD_VALUE_DISCRETIZATION_INTERVAL) -> float:
    """ε of ``event`` at ``delta`` (PLD: on the grid ``interval``), cached by the event's value
    when it is hashable (a PLD evaluation of a long run takes about a second, and the trainer
    computes the same event's ε when planning and again when verifying; a ComposedDpEvent holds
    a list and is not cached)."""
    try:
        hash(event)
    except TypeError:
        return float(_make_accountant(accountant, interval).compose(event).get_epsilon(delta))
    return _cached_epsilon(event, float(delta), accountant, float(interval))


def dpsgd_epsilon(event: dp_event_lib.DpEvent, delta: float,
                  accountant: str = DEFAULT_ACCOUNTANT) -> float:
    """ε at ``delta`` of ``event`` (e.g. from :func:`dpsgd_event`), add-or-remove-one adjacency.

    Args:
      event: A dp_accounting DpEvent the chosen accountant supports.
      delta: Target δ in (0, 1).
      accountant: ``"pld"`` (default; privacy loss distributions, Koskela et al. 2020 /
        Doroshenko et al. 2022; pessimistic, so an upper bound, and tighter) or ``"rdp"``
        (Mironov 2017; dp_accounting default orders).

    Returns:
      ε such that the event is (ε, delta)-DP according to the accountant.

    Raises:
      InvalidPrivacyParameterError: bad delta, unknown accountant, not a DpEvent, or an event the
        accountant cannot account.
    """
    delta = check_delta(delta, allow_zero=False)
    check_accountant(accountant)
    if not isinstance(event, dp_event_lib.DpEvent):
        raise InvalidPrivacyParameterError(f"expected a dp_accounting DpEvent, got {event!r}")
    acct = make_accountant(accountant)
    if not acct.supports(event):
        raise InvalidPrivacyParameterError(
            f"the {accountant} accountant cannot account {type(event).__name__}: {event}")
    return _epsilon(event, delta, accountant)


def calibrate_gaussian_noise(make_event: Callable[[float], dp_event_lib.DpEvent], epsilon: float,
                             delta: float, accountant: str = DEFAULT_ACCOUNTANT,
                             tol: float = 1e-5,
                             upper: float | None = None) -> float:
    """Smallest noise multiplier σ (within ``tol``) whose event ``make_event(σ)`` is (ε, δ)-DP.

    Brent's method (as ``dp_accounting.calibrate_dp_mechanism``, on cached ε evaluations) in an
    explicit bracket, found by doubling / shrinking from σ = 1 (or from ``upper``), so the search
    never evaluates σ = 0. The
    result is checked again: its ε at δ is ≤ ``epsilon``, never above (the tolerance only errs
    towards more noise). ``make_event`` must give an ε that decreases as σ grows.

    Args:
      make_event: σ -> DpEvent.
      epsilon: Target ε, finite and > 0.
      delta: Target δ in (0, 1).
      accountant: ``"pld"`` (default) or ``"rdp"``.
      tol: Absolute tolerance on σ, > 0.
      upper: Optional σ believed to meet the target; the bracket is then searched just below it,
        which saves slow PLD evaluations at small σ. Ignored if it does not meet the target.
        With ``accountant="pld"`` and no hint, the RDP answer starts a search on a 10× coarser
        PLD grid, whose answer starts the search on the real grid (RDP's ε is above PLD's in
        practice and fast; coarse-grid evaluations are ~7× faster). Only the real grid's ε
        decides the result.

    Returns:
      σ with ``epsilon(make_event(σ), delta) <= epsilon``; σ - 2·tol typically exceeds the target.

    Raises:
      InvalidPrivacyParameterError: bad arguments, or a target that needs σ outside
        [1e-3, 1e4] (ε too small to be reachable with useful noise, or so large σ < 1e-3 suffices).
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=False)
    check_accountant(accountant)
    tol = check_positive(tol, "tol")
    close = False
    if upper is None and accountant == PLD:
        # RDP's ε is (in practice) above PLD's and fast to compute: its σ is a near, cheap
        # upper end for a PLD search on the coarse grid, whose σ in turn starts the search on
        # the real grid just below it. Both are checked below like any hint.
        rdp_sigma = _calibrate(make_event, epsilon, delta, RDP, 1e-3, None, False,
                               PLD_VALUE_DISCRETIZATION_INTERVAL)
        upper = _calibrate(make_event, epsilon, delta, PLD, 1e-4, rdp_sigma, False,
                           _COARSE_PLD_INTERVAL)
        close = _epsilon(make_event(upper), delta, PLD) <= epsilon
        if not close:  # the coarse grid's answer misses on the real one: start from RDP's
            upper = rdp_sigma
    return _calibrate(make_event, epsilon, delta, accountant, tol, upper, close,
                      PLD_VALUE_DISCRETIZATION_INTERVAL)


def _calibrate(make_event: Callable[[float], dp_event_lib.DpEvent], epsilon: float,
               delta: float, accountant: str, tol: float, upper: float | None, close: bool,
               interval: float) -> float:
    """:func:`calibrate_gaussian_noise` on checked arguments, PLD on the grid ``interval``;
    ``close``: ``upper`` is believed within about 1 % of the answer."""

    def eps_at(sigma: float) -> float:
        return _epsilon(make_event(sigma), delta, accountant, interval)

    shrink = 0.5
    if upper is not None and _MIN_NOISE_MULTIPLIER <= upper <= _MAX_NOISE_MULTIPLIER and (
            eps_at(upper) <= epsilon):
        hi, shrink = float(upper), (0.99 if close else 0.9)
    else:
        hi = 1.0
        while eps_at(hi) > epsilon:
            hi *= 2.0
            if hi > _MAX_NOISE_MULTIPLIER:
                raise InvalidPrivacyParameterError(
                    f"epsilon={epsilon} at delta={delta} needs noise_multiplier > "
                    f"{_MAX_NOISE_MULTIPLIER}: the budget is too small for this run")
    lo = hi * shrink
    while eps_at(lo) <= epsilon:
        shrink = min(shrink, 0.9)  # a close start that was not close: widen the steps
        hi, lo = lo, lo * shrink
        if lo < _MIN_NOISE_MULTIPLIER:
            raise InvalidPrivacyParameterError(
                f"epsilon={epsilon} at delta={delta} is met by noise_multiplier < "
                f"{_MIN_NOISE_MULTIPLIER}: the target gives no meaningful privacy")
    # Brent's method needs finite values at both ends of the bracket.
    while not math.isfinite(eps_at(lo)):
        lo = (lo + hi) / 2.0

    # Brent's method on the cached ε (what dp_accounting.calibrate_dp_mechanism does, without
    # evaluating the bracket's ends again): then step to the private side of the root.
    sigma, result = optimize.brentq(lambda x: eps_at(x) - epsilon, lo, hi, xtol=tol,
                                    full_output=True)
    sigma = float(sigma)
    if not result.converged:
        raise RuntimeError(f"noise calibration did not converge in [{lo}, {hi}]")
    if not eps_at(sigma) <= epsilon:
        sigma = min(sigma + tol, hi)
    if not eps_at(sigma) <= epsilon:  # hi meets the target, so this never happens
        raise RuntimeError(f"calibration returned noise_multiplier={sigma} above epsilon={epsilon}")
    return sigma


@functools.lru_cache(maxsize=512)
def calibrated_noise(make_event: Callable[[float], dp_event_lib.DpEvent], epsilon: float,
                     delta: float, accountant: str) -> tuple[float, float]:
    """``(σ, ε achieved at δ)`` of :func:`calibrate_gaussian_noise` (tol 1e-6), cached.

    For mechanisms calibrated once per privacy level (AdaSSP, output perturbation): PLD
    evaluations take seconds and a pipeline reuses its budget. ``make_event`` must be hashable
    (a module-level function or a DpEvent class); arguments are checked by the callee.
    """
    sigma = calibrate_gaussian_noise(make_event, epsilon, delta, accountant, tol=1e-6)
    return sigma, dpsgd_epsilon(make_event(sigma), delta, accountant)


def calibrate_noise_multiplier(epsilon: float, delta: float, batch_size: int, num_examples: int,
                               epochs: float, accountant: str = DEFAULT_ACCOUNTANT,
                               tol: float = 1e-5) -> float:
    """Smallest DP-SGD noise multiplier (within ``tol``) that makes the run (ε, δ)-DP.

    The run is :func:`dpsgd_event` (Poisson sampling assumed, see module docstring). The returned
    σ satisfies ``dpsgd_epsilon(dpsgd_event(σ, ...), delta, accountant) <= epsilon``: the tolerance
    is only ever spent on the side of more noise.

    Args:
      epsilon: Target ε, finite and > 0.
      delta: Target δ in (0, 1).
      batch_size: Expected examples per step, 1 ≤ batch_size ≤ num_examples.
      num_examples: Number of training examples — the real count the trainer will read.
      epochs: Passes over the data, > 0.
      accountant: ``"pld"`` (default: tighter ε, hence less noise; slower: 0.3–4 s per ε
        evaluation, more at small σ; a calibration takes about ten) or ``"rdp"``.
      tol: Absolute tolerance on σ.

    Returns:
      The noise multiplier σ.

    Raises:
      InvalidPrivacyParameterError: any invalid argument, or an unreachable target.
    """
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=False)
    check_accountant(accountant)
    batch_size, num_examples, epochs = _check_sampling(batch_size, num_examples, epochs)
    steps = _steps(batch_size, num_examples, epochs)

    def make_event(sigma: float) -> dp_event_lib.DpEvent:
        return _event(sigma, batch_size, num_examples, steps)

    return calibrate_gaussian_noise(make_event, epsilon, delta, accountant, tol)


@dataclasses.dataclass(frozen=True)
class DPGuarantee:
    """What a DP-SGD training run guarantees, with the assumptions next to the number.

    Attributes:
      epsilon: ε of the run at ``delta`` by ``accountant`` (≤ the requested target, if any).
      delta: δ.
      accountant: ``"rdp"`` or ``"pld"``.
      sampling: The sampling behind ε (Poisson, accounted and run).
      neighboring_relation: Adjacency of the guarantee (add or remove one example).
      num_examples: Training examples n the sampling probability is computed from.
      batch_size: Batch size (expected batch size under Poisson sampling).
      epochs: Passes over the data.
      steps: Accounted steps, ``ceil(epochs * n / batch_size)``.
      noise_multiplier: Noise std / ``l2_norm_clip`` on the summed clipped gradients.
      l2_norm_clip: Per-example gradient L2 clipping norm.
    """

    epsilon: float
    delta: float
    accountant: str
    sampling: str
    neighboring_relation: str
    num_examples: int
    batch_size: int
    epochs: float
    steps: int
    noise_multiplier: float
    l2_norm_clip: float

    @property
    def event(self) -> dp_event_lib.DpEvent:
        """The DpEvent the guarantee was computed from (what the ledger charges in rdp mode)."""
        return dpsgd_event(self.noise_multiplier, self.batch_size, self.num_examples, self.epochs)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the fields."""
        return dataclasses.asdict(self)


def dpsgd_guarantee(noise_multiplier: float, batch_size: int, num_examples: int, epochs: float,
                    delta: float, l2_norm_clip: float,
                    accountant: str = DEFAULT_ACCOUNTANT) -> DPGuarantee:
    """The :class:`DPGuarantee` of a DP-SGD run with the given hyper-parameters.

    Raises:
      InvalidPrivacyParameterError: any invalid argument (see :func:`dpsgd_event`).
    """
    l2_norm_clip = check_positive(l2_norm_clip, "l2_norm_clip")
    event = dpsgd_event(noise_multiplier, batch_size, num_examples, epochs)
    return DPGuarantee(
        epsilon=dpsgd_epsilon(event, delta, accountant),
        delta=float(delta),
        accountant=accountant,
        sampling=POISSON_SAMPLING,
        neighboring_relation=ADD_OR_REMOVE_ONE,
        num_examples=int(num_examples),
        batch_size=int(batch_size),
        epochs=float(epochs),
        steps=_steps(int(batch_size), int(num_examples), float(epochs)),
        noise_multiplier=float(noise_multiplier),
        l2_norm_clip=l2_norm_clip,
    )
