"""What poisoning still passes the D&D server's checks under the gaussian unit: the norm bound
(:class:`sage_tfx.dnd.spam.NormBound`) and the calibrated spam check, alone and together, and the
largest influence an attacker keeps per update and per rate-limit window.

    .venv/bin/python benchmarks/dnd/poisoning.py                 # ~1-3 minutes
    .venv/bin/python benchmarks/dnd/poisoning.py --trials 100    # shorter

Data: scikit-learn digits (650 weights, multinomial logistic regression), gaussian unit at
ε = 8, δ = 1e-6 per update, C₂ = 2, γ = 0.002, k = 10 (the settings of ``accuracy.py``). The
instances are trained by ``--train`` honest updates (seeded noise), then every attack is applied
``--trials`` times to fresh client updates from the secure sampler, each on a uniformly drawn
instance. Writes benchmarks/results/dnd/poisoning.csv.
"""
import argparse
import math
import os
import random
import time

import numpy as np

from sage_tfx.dnd import DnDState, SpamCheck, initial_instances
from sage_tfx.dnd.client import ClientConfig, add_noise, clip_gradient, client_update
from sage_tfx.dnd.eval import digits
from sage_tfx.dnd.spam import NormBound
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.reporting import write_csv

OUT = "benchmarks/results/dnd"


def _flipped(spec, w, x, y, cfg, boost):
    """A label-flipped client (labels 9 − y) whose clipped step is boosted ``boost`` times,
    plus the honest noise: what a crude poisoner sends."""
    g = clip_gradient(spec.gradient(w, x, 9 - y), cfg)
    return add_noise(w - boost * cfg.gamma * g, cfg)


def _directed(spec, w, x, y, cfg, length):
    """No noise at all: the label-flipped step stretched to L2 ``length`` (the whole bound spent
    on one direction)."""
    g = clip_gradient(spec.gradient(w, x, 9 - y), cfg)
    return w - length * g / np.linalg.norm(g)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--train", type=int, default=20000)
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--gamma", type=float, default=0.002)
    p.add_argument("--clip", type=float, default=2.0)
    p.add_argument("--epsilon", type=float, default=8.0)
    p.add_argument("--rate-limit", type=int, default=60, help="R draws per client per window")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    t0 = time.monotonic()
    spec = digits.SPEC
    cfg = ClientConfig(a.gamma, epsilon=a.epsilon, unit="gaussian", delta=1e-6,
                       l2_norm_clip=a.clip)
    xtr, ytr, _, _ = digits.load(a.seed)
    rng = np.random.default_rng(a.seed)
    state = DnDState(initial_instances(np.zeros(spec.dim), a.k, cfg.noise_variance, rng),
                     rng=random.Random(a.seed))
    noise = SeededNoise(a.seed)
    for _ in range(a.train):
        idx = rng.choice(len(ytr), 10, replace=False)
        t, w = state.draw()
        state.discard(t, client_update(spec, w, xtr[idx], ytr[idx], cfg, noise=noise))
    inst = state.instances_view()
    sd = inst.std(axis=0, ddof=1)
    bound = NormBound.for_config(cfg, spec.dim)
    check = SpamCheck.for_config(cfg)
    sigma = cfg.sampler_std(spec.dim)
    step = cfg.gamma * cfg.clip
    # The largest boost of a directed step that still fits under the bound with a typical
    # noise norm (σ√d): an attacker who keeps the noise (so the spam check sees honest spread).
    boost_max = math.sqrt(max(bound.limit ** 2 - sigma ** 2 * spec.dim, 0.0)) / step

    def honest(w, x, y):
        return client_update(spec, w, x, y, cfg)
    attacks = {
        "honest": honest,
        "push 10 weights by +10 s": lambda w, x, y: honest(w, x, y) + np.where(
            np.arange(spec.dim) < 10, 10 * sd, 0.0),
        "label-flipped x10": lambda w, x, y: _flipped(spec, w, x, y, cfg, 10),
        "label-flipped x100": lambda w, x, y: _flipped(spec, w, x, y, cfg, 100),
        f"label-flipped x{boost_max:.0f} (largest under the bound)":
            lambda w, x, y: _flipped(spec, w, x, y, cfg, boost_max),
        "label-flipped, no noise, stretched to 0.99 x the bound":
            lambda w, x, y: _directed(spec, w, x, y, cfg, 0.99 * bound.limit),
        "label-flipped, no noise, stretched to 0.5 x the bound":
            lambda w, x, y: _directed(spec, w, x, y, cfg, 0.5 * bound.limit),
    }
    rows = []
    for name, attack in attacks.items():
        in_bound = spam_ok = both = 0
        moved = []
        for _ in range(a.trials):
            j = int(rng.integers(a.k))
            idx = rng.choice(len(ytr), 10, replace=False)
            u = attack(inst[j], xtr[idx], ytr[idx])
            b_ok = bound.violation(inst[j], u) is None
            s_ok = bool(check(inst, u))
            in_bound += b_ok
            spam_ok += s_ok
            both += b_ok and s_ok
            moved.append(bound.measure(inst[j], u))
        rows.append({"attack": name, "trials": a.trials,
                     "pass_norm_bound": in_bound / a.trials, "pass_spam_check": spam_ok / a.trials,
                     "pass_both": both / a.trials, "median_l2_step": float(np.median(moved)),
                     "norm_bound": bound.limit})
        print(rows[-1], flush=True)
    # Influence: an accepted update overwrites one of k instances; what its sender chooses is
    # u − B_j, at most the bound in L2, so it moves the average (the prediction model) by at most
    # bound/k beyond what the honest client at that draw would have; over a window, R accepted
    # updates per principal.
    for d in (spec.dim, 7850, 50000):
        b = NormBound.for_config(cfg, d)
        rows.append({"attack": f"influence bound at {d} weights", "trials": 0,
                     "norm_bound": b.limit, "honest_step_l2": step,
                     "bound_over_honest_step": b.limit / step,
                     "per_update_on_average_l2": b.limit / a.k,
                     "per_window_on_average_l2": a.rate_limit * b.limit / a.k,
                     "rate_limit": a.rate_limit, "k": a.k})
        print(rows[-1], flush=True)
    os.makedirs(OUT, exist_ok=True)
    write_csv(f"{OUT}/poisoning.csv", rows)
    print(f"sigma per weight {sigma:.5g}, norm bound {bound.limit:.5g} (step {bound.step:.3g} + "
          f"noise {bound.noise:.5g}), boost that fits {boost_max:.1f}; "
          f"{time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
