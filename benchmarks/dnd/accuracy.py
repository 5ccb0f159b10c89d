"""Draw-and-Discard under model-level local DP: accuracy against the number of updates, the
vector sampler's speed, and the per-feature runs checked by two independent code paths.

    .venv/bin/python benchmarks/dnd/accuracy.py                   # 1M updates (tens of minutes)
    .venv/bin/python benchmarks/dnd/accuracy.py --updates 100000  # shorter
    .venv/bin/python benchmarks/dnd/accuracy.py --only sampler    # one section

Data: scikit-learn digits (the offline MNIST stand-in of ``figs_2_3_4.py``: 1,257 training and
540 test images, multinomial logistic regression, 650 weights). Writes CSVs and
``accuracy_vs_updates.png`` to benchmarks/results/dnd/.
"""
import argparse
import math
import os
import time

import numpy as np

from sage_tfx.dnd import laplace as laplace_noise
from sage_tfx.dnd import noise as vector_noise
from sage_tfx.dnd.client import ClientConfig
from sage_tfx.dnd.eval import digits
from sage_tfx.dnd.eval.batched import run_batched
from sage_tfx.dnd.eval.simulate import RunConfig, run_curve
from sage_tfx.dp import noise as opendp_noise
from sage_tfx.reporting import write_csv

OUT = "benchmarks/results/dnd"


def _per_weight(fn, values, repeat=3):
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        fn(values)
        best = min(best, time.perf_counter() - t)
    return best / values.size * 1e6


def sampler(rows_out):
    """µs per weight: OpenDP's vector Gaussian / Laplace vs the CDT vector sampler and the
    discrete Laplace vector sampler (same sizes, same run)."""
    cfg = ClientConfig(0.001, epsilon=8.0, unit="gaussian", delta=1e-6, l2_norm_clip=3.0)
    m, sens = cfg.noise_multiplier, cfg.l2_sensitivity
    rng = np.random.default_rng(0)
    small = rng.normal(size=2000) * 0.01
    opendp_noise.gaussian(small[:10], cfg.noise_scale)  # build the measurements first
    opendp_noise.laplace(small[:10], cfg.noise_scale)
    od_gauss = _per_weight(lambda v: opendp_noise.gaussian(v, cfg.noise_scale), small, 2)
    od_lap = _per_weight(lambda v: opendp_noise.laplace(v, cfg.noise_scale), small, 2)
    rows = [{"sampler": "opendp make_gaussian (vector)", "weights": 2000,
             "us_per_weight": od_gauss},
            {"sampler": "opendp make_laplace (vector)", "weights": 2000,
             "us_per_weight": od_lap}]
    for d in (7850, 50000):
        x = rng.normal(size=d) * 0.01
        t = time.perf_counter()
        vector_noise.gaussian_vector(x, m, sens, max_extra_delta=1e-9)
        first = (time.perf_counter() - t) * 1e3
        us = _per_weight(lambda v: vector_noise.gaussian_vector(v, m, sens, max_extra_delta=1e-9),
                         x)
        rows.append({"sampler": "dnd.noise.gaussian_vector (CDT)", "weights": d,
                     "us_per_weight": us,
                     "first_call_ms": first, "table_entries": vector_noise.table_size(m, sens, d),
                     "speedup_vs_opendp_gaussian": od_gauss / us})
    rows += laplace_rows(rng)
    for r in rows:
        print("  " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in r.items()), flush=True)
    rows_out += rows


def laplace_rows(rng, sizes=(650, 7850, 50000)):
    """The L1 units' noise: OpenDP's Laplace (the old path, one call on the vector: ~100 µs per
    weight) against ``dnd.laplace.laplace_vector`` on the same vector, at each size in one run."""
    cfg = ClientConfig(0.002, 10.0, 8.0, "model")
    rows = []
    for d in sizes:
        x = rng.normal(size=d) * 0.01
        sens, eps = cfg.l1_sensitivity(d), cfg.update_epsilon(d)
        opendp_noise.laplace(x[:10], cfg.noise_scale)   # build the measurement first
        t = time.perf_counter()
        laplace_noise.laplace_vector(x, sens, eps)
        first = (time.perf_counter() - t) * 1e3
        fast = _per_weight(lambda v: laplace_noise.laplace_vector(v, sens, eps), x, 5)
        print(f"  laplace {d} weights: vector sampler {fast:.3g} us/weight; OpenDP ...",
              flush=True)
        od = _per_weight(lambda v: opendp_noise.laplace(v, cfg.noise_scale), x,
                         2 if d < 10000 else 1)
        rows.append({"sampler": "opendp make_laplace (vector)", "weights": d,
                     "us_per_weight": od})
        rows.append({"sampler": "dnd.laplace.laplace_vector (discrete Laplace)", "weights": d,
                     "us_per_weight": fast, "first_call_ms": first,
                     "table_entries": laplace_noise.laplace_grid(sens, eps, d).period,
                     "speedup_vs_opendp_laplace": od / fast})
    return rows


def _configs(gamma, k, clip):
    g = dict(unit="gaussian", l2_norm_clip=clip)
    return [
        (f"gaussian eps=8 delta=1e-6 (C2={clip})",
         ClientConfig(gamma, epsilon=8.0, delta=1e-6, **g)),
        (f"gaussian eps=4 delta=1e-6 (C2={clip})",
         ClientConfig(gamma, epsilon=4.0, delta=1e-6, **g)),
        (f"gaussian eps=1 delta=1e-6 (C2={clip})",
         ClientConfig(gamma, epsilon=1.0, delta=1e-6, **g)),
        ("laplace model unit eps=8 (L1 C=10)", ClientConfig(gamma, 10.0, 8.0, "model")),
        ("no noise", ClientConfig(gamma, epsilon=None, **g)),
    ]


def accuracy(a, rows_out):
    xtr, ytr, xte, yte = digits.load()
    marks = sorted({int(v) for v in np.geomspace(1000, a.updates, 16)})
    curves = []
    t0 = time.time()
    for label, cfg in _configs(a.gamma, a.k, a.clip):
        c = run_batched(digits.SPEC, cfg, a.k, xtr, ytr, xte, yte, updates=a.updates, marks=marks,
                        in_flight=a.in_flight, seed=a.seed, label=label)
        curves.append(c)
        print(f"  [{time.time() - t0:5.0f}s] {label}: noise std/weight {c.noise_std:.4g}, "
              f"accuracy {' '.join(f'{v:.3f}' for v in c.test_accuracy[-4:])} "
              f"(last at {c.updates[-1]:,} updates), loss {c.train_loss[-1]:.3f}", flush=True)
        for u, l, acc in zip(c.updates, c.train_loss, c.test_accuracy):
            rows_out.append({"config": label, "updates": u, "train_loss": l, "test_accuracy": acc,
                             "noise_std": c.noise_std, "gamma": a.gamma, "k": a.k,
                             "in_flight": a.in_flight, "seed": a.seed})
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2))
    for c in curves:
        ax[0].plot(c.updates, c.test_accuracy, label=c.label, marker=".")
        ax[1].plot(c.updates, c.train_loss, label=c.label, marker=".")
    for x in ax:
        x.set_xscale("log")
        x.set_xlabel("client updates")
        x.grid(alpha=0.3)
    ax[0].axhline(0.8, color="grey", lw=0.8, ls="--")
    ax[0].set_ylabel("test accuracy (average of k instances)")
    ax[1].set_ylabel("training loss")
    ax[1].set_yscale("log")
    ax[0].legend(fontsize=7)
    fig.suptitle(f"Draw-and-Discard on digits (650 weights), k={a.k}, gamma={a.gamma}, "
                 f"N_c=10, {a.in_flight} clients in flight")
    fig.tight_layout()
    fig.savefig(f"{OUT}/accuracy_vs_updates.png", dpi=110)
    plt.close(fig)


def gap(a, rows_out):
    """The paper's per-feature unit at log 32 and log 16 (figs_2_3_4's setting), by the real
    DnDState/client_update path and by the batched numpy path (in_flight = 1), over seeds."""
    data = digits.load()
    s = digits.Setting()
    for eps in (math.log(32), math.log(16)):
        cfg = ClientConfig(s.gamma, 1.0, eps, "feature")
        for seed in range(a.seeds):
            real = run_curve(digits.SPEC, RunConfig("real", 10, cfg), *data, passes=s.passes,
                             points=4, seed=seed)
            alt = run_batched(digits.SPEC, cfg, 10, *data, updates=real.updates,
                              marks=[real.updates], in_flight=1, seed=seed)
            rows_out.append({"epsilon_per_weight": eps, "seed": seed, "updates": real.updates,
                             "loss_dndstate": real.train_loss[-1],
                             "loss_batched": alt.train_loss[-1],
                             "acc_dndstate": real.test_accuracy[-1],
                             "acc_batched": alt.test_accuracy[-1]})
        mine = [r for r in rows_out if r["epsilon_per_weight"] == eps]
        for key in ("loss_dndstate", "loss_batched"):
            v = np.array([r[key] for r in mine])
            print(f"  eps=log({round(math.exp(eps))}) {key}: mean {v.mean():.3f} "
                  f"sd {v.std(ddof=1):.3f}"
                  f" over {len(v)} seeds", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--updates", type=int, default=1_000_000)
    p.add_argument("--gamma", type=float, default=0.002)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--clip", type=float, default=2.0, help="L2 clip C2 of the gaussian runs")
    p.add_argument("--in-flight", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, default=5, help="seeds of the per-feature check")
    p.add_argument("--only", choices=("sampler", "accuracy", "gap"))
    a = p.parse_args()
    os.makedirs(OUT, exist_ok=True)
    for name, fn in (("sampler", sampler), ("accuracy", accuracy), ("gap", gap)):
        if a.only in (None, name):
            print(f"{name}:", flush=True)
            rows = []
            if name == "sampler":
                fn(rows)
            else:
                fn(a, rows)
            out = {"sampler": "sampler_speed.csv", "accuracy": "accuracy_vs_updates.csv",
                   "gap": "feature_unit_seeds.csv"}[name]
            write_csv(f"{OUT}/{out}", [dict(r) for r in rows])
            print(f"  wrote {OUT}/{out}", flush=True)


if __name__ == "__main__":
    main()
