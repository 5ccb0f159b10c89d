"""The spam check of §III-D4, calibrated so that honest updates pass.

The paper accepts a returned model if every weight lies within μ ± 3s of the k instances'
per-weight mean μ and standard deviation s. With thousands of weights that rejects nearly every
honest update: s has only k − 1 degrees of freedom and the Laplace noise has heavy tails, so some
weight out of thousands is almost surely beyond 3s (:func:`paper_rule` keeps the rule for
comparison).

:class:`SpamCheck` instead tests three statistics of z = (u − μ)/s against their null
distribution *given the current instances*: the number of weights with |z| > ``z`` (catches
scaled models), max |z| (catches a few wildly changed weights) and the mean z (catches a small
shift of every weight). Under the null an honest update is
u = B_j − γ·clip(G) + noise with j uniform (Laplace(b), or N(0, σ²) for the gaussian unit);
ignoring the small gradient step, every weight's exceedance probability is a closed-form Laplace
or normal tail, so the null is exact: a mixture over j of
Poisson-binomial counts, bounded by binomials (Hoeffding 1956), a product form for the max and a
Student-t prediction band (CLT over the d weights) for the mean, widened by the largest honest
gradient step.
Each statistic gets a third of ``false_reject``. Thresholds are recomputed every
``recalibrate_every`` checks, O(k·d) each.

The check reads only the update and the server's instances (both already DP outputs): it is
post-processing and costs no budget.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import concurrent.futures.process
import dataclasses
import logging
import math
import multiprocessing
import threading
from typing import Optional

import numpy as np

from sage_tfx.dnd.spam_null import (CALIBRATION_WEIGHTS, COPY_CHECK_MIN_WEIGHTS, COUNT_WEIGHTS,
                                    NOISES, Thresholds, calibrate, count_limit, noise_variance)

__all__ = ["z_scores", "paper_rule", "SpamCheck", "Calibration", "NormBound", "Thresholds",
           "calibrate", "count_limit", "noise_variance", "NOISES", "CALIBRATION_WEIGHTS",
           "COUNT_WEIGHTS", "COPY_CHECK_MIN_WEIGHTS", "LAG_LIMIT", "NORM_FALSE_REJECT"]


def z_scores(instances: np.ndarray, update: np.ndarray) -> np.ndarray:
    """(u − μ)/s per weight, with the instances' mean and standard deviation (ddof = 1)."""
    mu = instances.mean(axis=0)
    sd = instances.std(axis=0, ddof=1)
    if np.any(sd <= 0):
        raise ValueError("instances with zero spread: initialise them with (k/2)σ² (Theorem 1)")
    return (np.asarray(update) - mu) / sd


def paper_rule(instances: np.ndarray, update: np.ndarray, z: float = 3.0) -> bool:
    """§III-D4 as written: pass iff every weight is within μ ± z·s."""
    return bool(np.all(np.abs(z_scores(instances, update)) <= z))


LAG_LIMIT = 1  # recalibration periods a background check may lag before it waits for the next
LAG_WAIT_SECONDS = 10.0


def _fraction(in_flight: int, k: int) -> float:
    """The share of k instances that draws in flight may have replaced."""
    return min(1.0, in_flight / k) if k else 0.0


@dataclasses.dataclass(frozen=True)
class Calibration:
    """One calibration of a :class:`SpamCheck`: its thresholds, the weights its per-check count
    limit samples, the share of instances that may be replaced before the next one, the key
    it is valid for (the check's parameters — noise, scale, z, level, step bounds — and the
    instances' shape k × d) and the draws in flight it allows for."""

    thresholds: Thresholds
    columns: np.ndarray
    stale_fraction: float
    key: tuple
    in_flight: int = 0  # the draws in flight its null allows for


def calibration_of(settings: tuple, instances: np.ndarray, in_flight: int,
                   hint: Optional[float]) -> Calibration:
    """:meth:`SpamCheck.calibration` as a function of the check's settings
    (:meth:`SpamCheck._settings`), so another process can run it."""
    (noise_scale, z, false_reject, step_l1, step_linf, step_l2, tail_shift, noise, every,
     key) = settings
    k = len(instances)
    # Up to recalibrate_every replacements among k slots before the next calibration.
    stale = min(1.0, every / k)
    sd = instances.std(axis=0, ddof=1)
    d = sd.size
    # |mean_i Δᵢ/sᵢ| ≤ min(L1 bound / (d·min s), L∞ bound · mean(1/s)).
    bounds = [math.inf]
    if step_l1 > 0:
        bounds.append(step_l1 / (d * float(sd.min())))
    if step_linf > 0:
        bounds.append(step_linf * float(np.mean(1.0 / sd)))
    if step_l2 > 0:  # Cauchy–Schwarz: |Σ Δᵢ/sᵢ| ≤ ‖Δ‖₂ ‖1/s‖₂
        bounds.append(step_l2 * float(np.sqrt(np.sum(1.0 / sd ** 2))) / d)
    step = min(bounds) if len(bounds) > 1 else 0.0
    columns = (np.arange(d) if d <= COUNT_WEIGHTS else np.sort(
        np.random.default_rng().choice(d, COUNT_WEIGHTS, replace=False)))
    t = calibrate(instances, noise_scale, z=z, false_reject=false_reject, max_step=step,
                  tail_shift=tail_shift, stale_fraction=stale,
                  in_flight_fraction=_fraction(in_flight, k), noise=noise, max_z_hint=hint)
    return Calibration(t, columns, stale, key, int(in_flight))


_POOL = None  # the process that runs background calibrations off this process's GIL
_POOL_LOCK = threading.Lock()


def _calibration_process():
    """The shared one-process pool of background calibrations (started on first use; spawned,
    never forked from this threaded process)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return _POOL


@atexit.register
def _stop_calibration_process(wait: bool = True) -> None:
    """Forgets the pool and shuts it down (at exit, while the interpreter is whole; without
    waiting once it broke)."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.shutdown(wait=wait, cancel_futures=True)


class SpamCheck:
    """The calibrated check, as the ``spam_check`` callable of
    :class:`~sage_tfx.dnd.state.DnDState`.

    Args:
      noise_scale: the Laplace scale b (or Gaussian std σ) of honest updates
        (``ClientConfig.noise_scale``).
      z: the |z| threshold of the count statistic.
      false_reject: target probability of rejecting an honest update (split over the two tests).
      recalibrate_every: checks between recalibrations against the live instances (default k:
        then every calibrated instance may have been replaced once, and the tails assume an update
        may carry two generations of noise).
      step_l1, step_linf: bounds of the honest gradient step γ·clip(G) in L1 and per weight (an
        L1-clipped step moves Σ|Δᵢ| ≤ γC, a per-coordinate one each |Δᵢ| ≤ γC); they widen the
        mean-z band so an honest step never fails it. :meth:`for_config` sets them.
      tail_shift: per-weight shift at which the count and max tails are evaluated (worst case of
        the step). :meth:`for_config` uses γC for the feature unit, where every weight may move by
        γC (up to ε/2 noise scales); for the model unit it uses 0: the whole step is ≤ γC in L1,
        ε/2 noise scales spread over all weights, and the measured honest pass rate is what
        ``tests/dnd/test_spam.py`` checks.
      step_l2: bound of the honest step in L2 (gaussian unit: γC₂).
      noise: ``"laplace"`` or ``"gaussian"``, the honest clients' noise.
      background: recalibrate in a background thread, never in a check (the server's mode). A
        check then uses the cached :class:`Calibration` for its key; a recalibration is started
        once half of ``recalibrate_every`` checks have passed since the last one (so the new
        thresholds are normally in place before ``recalibrate_every`` replacements, which is
        what their stale fraction assumes), and checks keep the previous thresholds until it is
        installed — unless they have served ``LAG_LIMIT`` × ``recalibrate_every`` checks (what
        their stale fraction assumes, as in line), when a check waits (at most
        ``LAG_WAIT_SECONDS``) for the running recalibration. Only a check without any
        calibration for its key (call :meth:`prime` at start-up) calibrates in line. The
        decision for given thresholds is the same either way (:meth:`decide`), and checks may
        run in parallel threads.
      process: with ``background``, the background thread hands the calibration to a separate
        process (one per server process, shared, spawned on first use) and waits for it, so
        the O(k·d) work does not compete with the checks for this process's GIL (the server's
        mode: 80 → 106 updates/s at 50,000 weights when the calibrations were taken out).

    Draws in flight: a calibration allows for the most draws in flight that checks saw since
    the previous one began (:attr:`Calibration.in_flight`). A check that sees more (clients
    arriving after start-up) recalibrates first — in line, or in the background and waits for
    it: thresholds primed with no draw in flight rejected 5 of the first 60 honest updates of
    16 concurrent clients at 50,000 weights.
    """

    def __init__(self, noise_scale: float, *, z: float = 3.0, false_reject: float = 0.005,
                 recalibrate_every: Optional[int] = None, step_l1: float = 0.0,
                 step_linf: float = 0.0, tail_shift: float = 0.0, step_l2: float = 0.0,
                 noise: str = "laplace", background: bool = False, process: bool = False):
        if not noise_scale > 0 or not math.isfinite(noise_scale):
            raise ValueError("the spam check needs the (finite, > 0) noise scale of honest updates")
        if noise not in NOISES:
            raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
        self.noise = noise
        self.step_l2 = float(step_l2)
        if recalibrate_every is not None and (not isinstance(recalibrate_every, int)
                                              or recalibrate_every < 1):
            raise ValueError("recalibrate_every must be an integer >= 1 (or None: every k)")
        self.noise_scale = float(noise_scale)
        self.z = float(z)
        self.false_reject = float(false_reject)
        self.recalibrate_every = recalibrate_every
        self.step_l1 = float(step_l1)
        self.step_linf = float(step_linf)
        self.tail_shift = float(tail_shift)
        self.background = bool(background)
        self.process = bool(process) and self.background
        # rejections per statistic
        self.failures = {"count": 0, "max": 0, "mean": 0, "copy": 0, "degenerate": 0}
        # Draws handed out but not yet returned (a caller may set it, or pass in_flight to
        # check()): their instances may be replaced before the update comes back.
        self.in_flight = 0
        self.calibrations = 0  # calibrations installed (in line or in the background)
        self._cal: Optional[Calibration] = None
        self._since = 0
        self._state = threading.Condition()  # _cal, _since, _pending, the counters
        self._pending = False
        self._peak = 0  # the most draws in flight a check saw since the last calibration began
        self._executor = None

    def failure_counts(self) -> dict[str, int]:
        """A copy of the rejections so far by the statistic that failed."""
        with self._state:
            return dict(self.failures)

    @property
    def stale_fraction(self) -> float:
        """The share of instances the installed thresholds allow to be replaced since."""
        return self._cal.stale_fraction if self._cal is not None else 0.0

    def key(self, k: int, d: int) -> tuple:
        """What a calibration depends on besides the instances' values."""
        return (self.noise, self.noise_scale, self.z, self.false_reject, self.step_l1,
                self.step_linf, self.step_l2, self.tail_shift, self._every(k), int(k), int(d))

    def calibration(self, instances: np.ndarray, in_flight: Optional[int] = None) -> Calibration:
        """A calibration against these (k, d) instances, O(k·d); installs nothing."""
        instances = np.asarray(instances)
        k, d = instances.shape
        in_flight = self.in_flight if in_flight is None else in_flight
        return calibration_of(self._settings(k, d), instances, in_flight, self._hint(k, d))

    def _settings(self, k: int, d: int) -> tuple:
        """What :func:`calibration_of` needs of this check (picklable)."""
        return (self.noise_scale, self.z, self.false_reject, self.step_l1, self.step_linf,
                self.step_l2, self.tail_shift, self.noise, self._every(k), self.key(k, d))

    def _hint(self, k: int, d: int) -> Optional[float]:
        """The installed max threshold, which starts the next search (the result does not
        depend on it)."""
        prev = self._cal
        return prev.thresholds.max_z if prev is not None and prev.key == self.key(k, d) else None

    def install(self, cal: Calibration) -> None:
        """Makes ``cal`` the thresholds of the next checks (and restarts the count to the next
        recalibration)."""
        with self._state:
            self._cal, self._since = cal, 0
            self._state.notify_all()
            self.calibrations += 1

    def prime(self, instances, in_flight: Optional[int] = None) -> Calibration:
        """Calibrates now against ``instances`` (an array or a DnDState) and installs it."""
        if not isinstance(instances, np.ndarray):
            instances = instances.instances_view()
        cal = self.calibration(instances, in_flight)
        self.install(cal)
        return cal

    def thresholds(self, instances: np.ndarray) -> Thresholds:
        """The thresholds for these instances (recomputed every ``recalibrate_every`` checks)."""
        k, d = np.shape(instances)
        if self._cal is None or self._cal.key != self.key(k, d) \
                or self._since >= self._every(k):
            self.install(self.calibration(instances))
        return self._cal.thresholds

    def __call__(self, instances, update: np.ndarray) -> bool:
        """True if ``update`` passes, against a (k, d) array or a :class:`DnDState` (whose running
        moments make a check O(d); its instances are read only to recalibrate)."""
        return self.check(instances, update)

    def check(self, instances, update: np.ndarray, in_flight: Optional[int] = None) -> bool:
        """:meth:`__call__` with the number of draws in flight (default ``self.in_flight``)."""
        in_flight = self.in_flight if in_flight is None else int(in_flight)
        u = np.asarray(update, dtype=np.float64)
        if isinstance(instances, np.ndarray):
            inst = instances
            mu, sd = inst.mean(axis=0), inst.std(axis=0, ddof=1)
        else:
            inst = None
            mu, sd = instances.moments()
        if np.any(sd <= 0):
            # Collapsed instances (only a run without client noise, or copies, can do this): no
            # null to test against, and Lemma 1's worst case; refuse rather than fail.
            with self._state:
                self.failures["degenerate"] += 1
            return False
        cal = self._current(instances, in_flight)
        columns = (inst[:, cal.columns] if inst is not None
                   else instances.columns(cal.columns))
        failed = self.decide(cal, columns, mu, sd, u, in_flight)
        with self._state:
            for name in failed:
                self.failures[name] += 1
        return not failed

    def _current(self, instances, in_flight: int) -> Calibration:
        """The calibration a check uses; recalibrates in line (not background, or none cached
        for the key) or starts a background recalibration when one is due."""
        k = len(instances) if isinstance(instances, np.ndarray) else instances.k
        d = instances.shape[1] if isinstance(instances, np.ndarray) else instances.dim
        every = self._every(k)
        with self._state:
            cal = self._cal
            cached = cal is not None and cal.key == self.key(k, d)
            self._peak = max(self._peak, in_flight)
            # More draws in flight than the thresholds allow for (e.g. clients arriving after
            # start-up): their null is too narrow now, so recalibrate for the peak and wait.
            wider = cached and in_flight > cal.in_flight
            if cached and self.background:
                start = (self._since >= max(1, every // 2) or wider) and not self._pending
                self._pending = self._pending or start
                if start:
                    self._start_background(instances, self._peak)
                    self._peak = in_flight
                if self._pending and (wider or self._since >= LAG_LIMIT * every):
                    # The thresholds have served as many checks as their null assumes (as in
                    # line), or too few draws in flight: wait for the running recalibration.
                    self._state.wait_for(lambda: not self._pending, timeout=LAG_WAIT_SECONDS)
                    cal = self._cal
                self._since += 1
                return cal
            inline = not cached or self._since >= every or wider
            peak = self._peak
            if inline:
                self._peak = in_flight
        if inline:
            arr = instances if isinstance(instances, np.ndarray) else instances.instances_view()
            cal = self.calibration(arr, peak)
            self.install(cal)
        with self._state:
            self._since += 1
        return cal

    def _start_background(self, instances, in_flight: int) -> None:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="spam-calibrate")
        snapshot = instances.copy() if isinstance(instances, np.ndarray) else instances

        def job() -> None:
            try:
                arr = snapshot if isinstance(snapshot, np.ndarray) else snapshot.instances_view()
                if self.process:
                    k, d = arr.shape
                    self.install(_calibration_process().submit(
                        calibration_of, self._settings(k, d), arr, in_flight,
                        self._hint(k, d)).result())
                else:
                    self.install(self.calibration(arr, in_flight))
            except Exception as exc:  # keep the previous thresholds; try again at the next due
                if isinstance(exc, concurrent.futures.process.BrokenProcessPool):
                    _stop_calibration_process(wait=False)
                logging.getLogger(__name__).warning(
                    "spam check: background recalibration failed (%s: %s)",
                    type(exc).__name__, exc)
            finally:
                with self._state:
                    self._pending = False
                    self._state.notify_all()
        self._executor.submit(job)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Waits until no background recalibration is pending (tests, shutdown)."""
        with self._state:
            return self._state.wait_for(lambda: not self._pending, timeout=timeout)

    def decide(self, cal: Calibration, columns: np.ndarray, mu: np.ndarray, sd: np.ndarray,
               u: np.ndarray, in_flight: int) -> list[str]:
        """The statistics ``u`` fails under calibration ``cal`` (empty: accepted), given the
        instances' moments ``mu``, ``sd`` and their values at ``cal.columns``."""
        t, idx = cal.thresholds, cal.columns
        # A returned model carries fresh noise on every weight, so it is never almost equal to an
        # instance: mean |u − B_j| ≈ b (Laplace; 0.8σ for Gaussian; sd ≤ b/√m on the m sampled
        # weights). A copy (or near copy) of an instance adds no noise and would shrink the
        # spread towards Lemma 1's worst case; reject it.
        if columns.shape[1] >= COPY_CHECK_MIN_WEIGHTS:
            gap = np.min(np.mean(np.abs(columns - u[idx]), axis=1))
            if float(gap) < 0.5 * self.noise_scale:
                return ["copy"]
        # The count limit moves with every replacement (one of k instances changes μ and s), so
        # it is recomputed on every check from the current moments, on a fixed weight sample.
        limit = count_limit(columns - mu[idx], sd[idx], mu.size,
                            self.noise_scale, z=self.z, alpha=self.false_reject / 3.0,
                            tail_shift=self.tail_shift, stale_fraction=cal.stale_fraction,
                            in_flight_fraction=_fraction(in_flight, columns.shape[0]),
                            noise=self.noise)
        zs = (u - mu) / sd
        mean_z = float(zs.mean())
        zs = np.abs(zs)
        return [name for name, ok in (("count", np.count_nonzero(zs > self.z) <= limit),
                                      ("max", zs.max() <= t.max_z),
                                      ("mean", t.mean_z_low <= mean_z <= t.mean_z_high))
                if not ok]

    def _every(self, k: int) -> int:
        return self.recalibrate_every if self.recalibrate_every is not None else k

    @classmethod
    def for_config(cls, config, **kwargs) -> "SpamCheck":
        """The check for honest updates of a :class:`~sage_tfx.dnd.client.ClientConfig`."""
        step = config.gamma * config.clip
        if config.gaussian:
            # The float-safe sampler adds up to 1/GRID_FRACTION more noise than σ: the null
            # takes the widest (an update with σ exactly is only narrower).
            from sage_tfx.dnd.noise import GRID_FRACTION
            return cls(config.noise_scale * (1.0 + 1.0 / GRID_FRACTION), step_l2=step,
                       step_linf=step, noise="gaussian", **kwargs)
        # The Laplace sampler's scale is at most max_scale_ratio above b: the null takes the widest.
        from sage_tfx.dnd.laplace import max_scale_ratio
        scale = config.noise_scale * max_scale_ratio(config.epsilon)
        if config.unit == "feature":
            return cls(scale, step_linf=step, tail_shift=step, **kwargs)
        return cls(scale, step_l1=step, step_linf=step, **kwargs)


NORM_FALSE_REJECT = 1e-6  # the norm bound's tail: P(an honest update exceeds it) ≤ this


@dataclasses.dataclass(frozen=True)
class NormBound:
    """The largest step an honest update can take from the instance it was drawn from, checked
    by the server before the spam check (cheap: one norm of u − B_j, O(d)).

    An honest update is u = B_j − γ·clip(G) + noise, so ‖u − B_j‖ ≤ ‖γ·clip(G)‖ + ‖noise‖:

    * gaussian unit (L2): the step is ≤ γC₂ in L2; the sampler's noise is g·(q − x/g + z) with
      z a discrete Gaussian of std σ/g (s ≥ 1024, indistinguishable from the continuous one in
      double precision) and a rounding of ≤ g/2 per weight (≤ g√d/2 ≤ Δ₂/128 in L2). For
      X ~ N(0, σ²I_d), ‖X‖ is 1-Lipschitz in X/σ with E‖X‖ ≤ σ√d, so
      P(‖X‖ > σ(√d + t)) ≤ exp(−t²/2) (Gaussian concentration): t = √(2 ln(1/α)).
      Limit: γC₂ + σ(√d + t) + g√d/2, σ the sampler's std (:meth:`ClientConfig.sampler_std`).
    * model unit (L1): the step is ≤ γC in L1; the noise's L1 norm is a sum of d |Laplace(b)|,
      Gamma(d, b) exactly: its (1 − α) quantile. Feature unit: the step is ≤ γC per weight,
      γC·d in L1, plus the same quantile. The sampler (:mod:`sage_tfx.dnd.laplace`) adds
      g·(q − x/g + z), z discrete Laplace of scale t = T/ln 2 steps: P(|z| ≥ m) =
      2pᵐ/(1 + p) ≤ e^(−(m−1)/t), so |z| ≤ |L| + 1 stochastically with L ~ Laplace(t), and the
      rounding adds ≤ g/2 per weight: the quantile of Gamma(d, g·t) plus 1.5·d·g.

    And every weight (L∞): the step moves one weight by at most γC (model unit: L1 ≤ γC;
    feature unit: γC per weight) or γC₂ (gaussian). One weight's noise g·(q − x/g + z) is at most
    g/2 + g·|z|. Laplace sampler: P(|z| ≥ m) ≤ e^(−(m−1)/t), so with probability ≥ 1 − α' no
    weight of d has |noise| > g·(t·ln(d/α') + 1.5) (union bound). Gaussian sampler: z is a
    discrete Gaussian of parameter σ/g, sub-Gaussian with that parameter (Canonne, Kamath and
    Steinke 2020, Cor. 9), P(|z| ≥ m) ≤ 2e^(−m²g²/2σ²), so no weight has
    |noise| > σ·√(2 ln(2d/α')) + g/2 but with probability ≤ α'. Limit: that step plus that
    noise, α' = α/2. The spread-relative spam check can be widened by the
    attacker: one accepted update that pushes a few weights far raises the instances' spread
    there, after which the same push passes the check (measured at 50,000 weights in
    ``benchmarks/results/dnd/REPORT.md``); the L∞ limit does not depend on the instances.

    α = :data:`NORM_FALSE_REJECT` (10⁻⁶): the share of honest updates refused, α/2 for the norm
    and α/2 for L∞. The bound is public (it follows from the run's published parameters); it caps
    what one accepted update can move any instance by, which the statistical check alone does not
    (a model scaled far from the instances fails it, but one shifted by a few noise norms in a few
    weights may pass).
    """

    norm: str  # "l2" or "l1"
    limit: float
    step: float  # the honest step's bound in that norm
    noise: float  # the noise's norm bound at level alpha / 2
    alpha: float
    linf_limit: float  # the largest honest move of one weight (at level alpha / 2)
    linf_step: float
    linf_noise: float

    @classmethod
    def for_config(cls, config, dim: int, alpha: float = NORM_FALSE_REJECT) -> "NormBound":
        """The bound of a private :class:`~sage_tfx.dnd.client.ClientConfig` at ``dim`` weights."""
        from scipy import stats
        if not 0 < alpha < 1:
            raise ValueError("alpha must be in (0, 1)")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        half = alpha / 2.0
        if config.gaussian:
            from sage_tfx.dnd.noise import sampler_grid
            grid = sampler_grid(config.noise_multiplier, config.l2_sensitivity, dim)
            sigma = grid.sigma
            t = math.sqrt(2.0 * math.log(1.0 / half))
            noise = sigma * (math.sqrt(dim) + t) + 0.5 * grid.step * math.sqrt(dim)
            step = config.gamma * config.clip
            linf_noise = (sigma * math.sqrt(2.0 * math.log(2.0 * dim / half))
                          + 0.5 * grid.step) * (1.0 + 1e-9)
            return cls("l2", step + noise, step, noise, alpha, step + linf_noise, step,
                       linf_noise)
        from sage_tfx.dnd.laplace import laplace_grid
        grid = laplace_grid(config.l1_sensitivity(dim), config.update_epsilon(dim), dim)
        t = grid.period / math.log(2.0)
        noise = (float(stats.gamma.isf(half, dim, scale=grid.step * t)) * (1.0 + 1e-6)
                 + 1.5 * dim * grid.step)
        step = config.gamma * config.clip * (dim if config.unit == "feature" else 1)
        linf_step = config.gamma * config.clip
        linf_noise = grid.step * (t * math.log(dim / half) + 1.5) * (1.0 + 1e-9)
        return cls("l1", step + noise, step, noise, alpha, linf_step + linf_noise, linf_step,
                   linf_noise)

    def measure(self, base: np.ndarray, update: np.ndarray) -> float:
        """‖update − base‖ in this bound's norm."""
        diff = np.asarray(update, dtype=np.float64) - np.asarray(base, dtype=np.float64)
        return self._size(diff, np.abs(diff))

    def _size(self, diff: np.ndarray, mag: np.ndarray) -> float:
        """The norm of ``diff`` (``mag`` = |diff|)."""
        return float(np.sqrt(np.dot(diff, diff))) if self.norm == "l2" else float(mag.sum())

    def violation(self, base: np.ndarray, update: np.ndarray) -> Optional[str]:
        """None if the update's step is within the bound in its norm and in every weight, else
        the reason (for a 4xx answer)."""
        diff = np.asarray(update, dtype=np.float64) - np.asarray(base, dtype=np.float64)
        mag = np.abs(diff)
        size = self._size(diff, mag)
        if size > self.limit:
            return (f"the update moves {size:.6g} in {self.norm.upper()} from the drawn "
                    f"instance; an honest update moves at most {self.limit:.6g} (step "
                    f"{self.step:.6g} + noise {self.noise:.6g}, exceeded by honest noise with "
                    f"probability ≤ {self.alpha / 2:g})")
        worst = int(mag.argmax())
        top = float(mag[worst])
        if top > self.linf_limit:
            return (f"the update moves weight {worst} by {top:.6g} from the "
                    f"drawn instance; an honest update moves no weight by more than "
                    f"{self.linf_limit:.6g} (step {self.linf_step:.6g} + noise "
                    f"{self.linf_noise:.6g}, exceeded by honest noise with probability ≤ "
                    f"{self.alpha / 2:g})")
        return None
