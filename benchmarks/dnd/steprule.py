"""The gaussian unit's γ and C₂: the step rule (``sage_tfx.dnd.steprule``) against README's old
values (γ = 0.002, C₂ = 2) and a grid around the rule, on two offline data sets, several seeds.

    .venv/bin/python benchmarks/dnd/steprule.py                       # 10⁶ updates, 3 seeds
    .venv/bin/python benchmarks/dnd/steprule.py --updates 100000 --seeds 1 --datasets digits

ε = 8, δ = 10⁻⁶ per update, k = 10, N_c = 10, 16 clients in flight (``run_batched``; seeded
noise at the secure sampler's std). Seed 0 runs the whole grid (η = γC₂ at ¼, ½, 2 and 4 × the
rule's; C₂ = 0.5 and 1 at the rule's η; no noise), the other seeds the rule and the old values.
Also printed: the fraction of clients whose gradient at the final model is clipped at C₂, and
the per-client ε of the run by dp_accounting's RDP accountant. Writes
benchmarks/results/dnd/steprule.csv (``--csv``: another name).
"""
import argparse
import math
import os
import time

import numpy as np

from sage_tfx.dnd.budget import client_epsilon
from sage_tfx.dnd.client import ClientConfig
from sage_tfx.dnd.eval import digits, leaf
from sage_tfx.dnd.eval.batched import run_batched
from sage_tfx.dnd.steprule import gaussian_step, step_size
from sage_tfx.reporting import write_csv

OUT = "benchmarks/results/dnd"
EPSILON, DELTA, K, CLIENTS_OF = 8.0, 1e-6, 10, 10


def _data(name):
    if name == "digits":
        return (*digits.load(), digits.SPEC)
    return leaf.load()


def _configs(dim, m, updates, full):
    rule = gaussian_step(dim, m, K, updates)
    out = [("rule", rule.gamma, rule.l2_norm_clip), ("README (0.002, 2)", 0.002, 2.0)]
    if full:
        for f in (0.25, 0.5, 2.0, 4.0):
            out.append((f"rule eta x{f:g}", rule.gamma * f, rule.l2_norm_clip))
        for clip in (0.5, 1.0):
            out.append((f"rule eta, C2={clip:g}", rule.eta / clip, clip))
        out.append(("no noise", rule.gamma, rule.l2_norm_clip))
    return out


def _clipped(spec, w, x, y, clip):
    """Fraction of the training clients (groups of CLIENTS_OF) with ‖G(w)‖₂ ≥ C₂, and the median."""
    n = len(y) - len(y) % CLIENTS_OF
    norms = np.array([np.linalg.norm(spec.gradient(w, x[i:i + CLIENTS_OF], y[i:i + CLIENTS_OF]))
                      for i in range(0, n, CLIENTS_OF)])
    return float(np.mean(norms >= clip)), float(np.median(norms))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--updates", type=int, default=1_000_000)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--only", nargs="+", help="run only the configurations with these labels")
    p.add_argument("--datasets", nargs="+", default=["digits", "leaf"])
    p.add_argument("--in-flight", type=int, default=16)
    p.add_argument("--csv", default="steprule.csv", help="file name under " + OUT)
    p.add_argument("--grid", choices=("seed0", "none"), default="seed0",
                   help="the grid around the rule on seed 0 (default), or only rule and README")
    a = p.parse_args()
    os.makedirs(OUT, exist_ok=True)
    rows = []
    t0 = time.time()
    for name in a.datasets:
        xtr, ytr, xte, yte, spec = _data(name)
        probe = ClientConfig(1.0, epsilon=EPSILON, unit="gaussian", delta=DELTA, l2_norm_clip=1.0)
        m = probe.noise_multiplier
        clients = len(ytr) // CLIENTS_OF
        passes = math.ceil(a.updates / clients)
        eps_client = client_epsilon(probe, spec.dim, passes, DELTA)
        eta = step_size(spec.dim, m, K, a.updates)
        print(f"{name}: d={spec.dim}, m={m:.4f}, rule eta={eta:.3g}, {clients} clients, "
              f"{passes} passes each: per-client eps {eps_client:.0f} at delta={DELTA} (RDP; "
              f"per update {EPSILON})", flush=True)
        for seed in range(a.first_seed, a.first_seed + a.seeds):
            for label, gamma, clip in _configs(spec.dim, m, a.updates,
                                                seed == 0 and a.grid == "seed0"):
                if a.only and label not in a.only:
                    continue
                private = label != "no noise"
                cfg = ClientConfig(gamma, epsilon=EPSILON if private else None, unit="gaussian",
                                   delta=DELTA if private else None, l2_norm_clip=clip)
                c = run_batched(spec, cfg, K, xtr, ytr, xte, yte, updates=a.updates,
                                marks=[a.updates // 10, a.updates], in_flight=a.in_flight,
                                seed=seed, label=label)
                frac, med = _clipped(spec, c.average, xtr, ytr, clip)
                row = {"dataset": name, "dim": spec.dim, "seed": seed, "config": label,
                       "gamma": gamma, "l2_norm_clip": clip, "eta": gamma * clip,
                       "updates": a.updates, "test_accuracy": c.test_accuracy[-1],
                       "test_accuracy_tenth": c.test_accuracy[0],
                       "train_loss": c.train_loss[-1], "clipped_at_end": frac,
                       "median_grad_norm_at_end": med, "noise_std": c.noise_std,
                       "client_epsilon": eps_client if private else None}
                rows.append(row)
                print(f"  [{time.time() - t0:5.0f}s] seed {seed} {label:22s} gamma={gamma:.4g} "
                      f"C2={clip:g} eta={gamma * clip:.3g}: acc {c.test_accuracy[-1]:.3f} "
                      f"(at {a.updates // 10:,}: {c.test_accuracy[0]:.3f}), loss "
                      f"{c.train_loss[-1]:.3f}, clipped {frac:.2f} (median norm {med:.2f})",
                      flush=True)
                write_csv(f"{OUT}/{a.csv}", rows)
    print("mean over seeds:")
    for name in a.datasets:
        for label in ("rule", "README (0.002, 2)"):
            v = [r["test_accuracy"] for r in rows if r["dataset"] == name and r["config"] == label]
            if v:
                print(f"  {name} {label}: {np.mean(v):.3f} (min {min(v):.3f}, max {max(v):.3f}, "
                      f"{len(v)} seeds)")
    print(f"wrote {OUT}/{a.csv}")


if __name__ == "__main__":
    main()
