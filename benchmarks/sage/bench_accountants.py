"""Benchmark: DP-SGD accounting by PLD (the default) vs RDP — ε at a given σ, σ for a given ε.

For each setting (the demo's train part and a small grid) prints: σ calibrated by RDP (what the
DP Trainer ran before PLD became the default), the PLD ε of that same run, σ calibrated by PLD
for the same ε (what it runs now), the noise saved, and the seconds each calibration took. Both
ε are upper bounds: RDP by construction, PLD because dp_accounting's discretization is
pessimistic (``sage_tfx.dp.dpsgd.PLD_VALUE_DISCRETIZATION_INTERVAL``). ``--grids`` also prints,
for the demo's run, the PLD ε on coarser and finer grids (pessimistic and optimistic), which
shows how close the reported upper bound is to the true ε. The golden MNIST run (σ = 1.1,
q = 256/60000, 14,062 steps, δ = 1e-5; RDP 2.597) is printed at a fixed σ.

The demo's train part: ``pipelines/sage_demo.py`` with ``flights_plan.make_plan`` (train =
0.6 of the iteration's ε, all of δ = 1e-8) and ``flights_dp_module``'s DP-SGD defaults (batch 256,
2 epochs); ε_train = 0.6 over 8,000 rows is the iteration that trains the delay network on about a
week of flights.

Usage: python benchmarks/sage/bench_accountants.py [--quick] [--grids] [--csv PATH]
Prints numbers; asserts nothing.
"""
from __future__ import annotations

import argparse
import csv
import time

import dp_accounting
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from sage_tfx.dp import dpsgd

DEMO = dict(name="demo train part", epsilon=0.6, delta=1e-8, batch_size=256, num_examples=8000,
            epochs=2)
GRID = [
    dict(name="demo, 2 weeks", epsilon=0.6, delta=1e-8, batch_size=256, num_examples=16000,
         epochs=2),
    dict(name="demo, ε_train 0.3", epsilon=0.3, delta=1e-8, batch_size=256, num_examples=8000,
         epochs=2),
    dict(name="demo, ε_train 1.2", epsilon=1.2, delta=1e-8, batch_size=256, num_examples=8000,
         epochs=2),
    dict(name="Taxi NN (fig567)", epsilon=1.0, delta=1e-6, batch_size=256, num_examples=58000,
         epochs=3),
    dict(name="Criteo NN-C (fig567)", epsilon=0.25, delta=1e-6, batch_size=256,
         num_examples=58000, epochs=5),
    dict(name="small", epsilon=3.0, delta=1e-5, batch_size=64, num_examples=2000, epochs=5),
]
QUICK = [GRID[1], GRID[5]]
GOLDEN = dp_accounting.SelfComposedDpEvent(
    dp_accounting.PoissonSampledDpEvent(256 / 60000, dp_accounting.GaussianDpEvent(1.1)), 14062)
FIELDS = ("setting", "epsilon", "delta", "num_examples", "batch_size", "epochs", "steps",
          "sigma_rdp", "pld_epsilon_at_sigma_rdp", "sigma_pld", "pld_epsilon_at_sigma_pld",
          "rdp_epsilon_at_sigma_pld", "noise_saved_pct", "seconds_rdp", "seconds_pld")


def compare(s: dict) -> dict:
    """RDP- and PLD-calibrated σ of one setting, and each accountant's ε of the other's run."""
    eps, delta = s["epsilon"], s["delta"]
    sizes = (s["batch_size"], s["num_examples"], s["epochs"])
    t0 = time.perf_counter()
    sigma_rdp = dpsgd.calibrate_noise_multiplier(eps, delta, *sizes, accountant=dpsgd.RDP)
    t1 = time.perf_counter()
    sigma_pld = dpsgd.calibrate_noise_multiplier(eps, delta, *sizes, accountant=dpsgd.PLD)
    t2 = time.perf_counter()
    event = lambda sigma: dpsgd.dpsgd_event(sigma, *sizes)  # noqa: E731
    return {
        "setting": s["name"], "epsilon": eps, "delta": delta, "num_examples": s["num_examples"],
        "batch_size": s["batch_size"], "epochs": s["epochs"], "steps": dpsgd.dpsgd_steps(*sizes),
        "sigma_rdp": sigma_rdp,
        "pld_epsilon_at_sigma_rdp": dpsgd.dpsgd_epsilon(event(sigma_rdp), delta, dpsgd.PLD),
        "sigma_pld": sigma_pld,
        "pld_epsilon_at_sigma_pld": dpsgd.dpsgd_epsilon(event(sigma_pld), delta, dpsgd.PLD),
        "rdp_epsilon_at_sigma_pld": dpsgd.dpsgd_epsilon(event(sigma_pld), delta, dpsgd.RDP),
        "noise_saved_pct": 100 * (1 - sigma_pld / sigma_rdp),
        "seconds_rdp": t1 - t0, "seconds_pld": t2 - t1,
    }


def grid_sensitivity(s: dict, sigma: float) -> list[tuple[float, float, float, float]]:
    """(grid, pessimistic ε, optimistic ε, seconds) of the run at σ on several PLD grids."""
    q = s["batch_size"] / s["num_examples"]
    steps = dpsgd.dpsgd_steps(s["batch_size"], s["num_examples"], s["epochs"])
    out = []
    for interval in (1e-3, 1e-4, 1e-5):
        t0 = time.perf_counter()
        values = [pld_lib.from_gaussian_mechanism(
            sigma, sampling_prob=q, pessimistic_estimate=pess, use_connect_dots=pess,
            value_discretization_interval=interval).self_compose(steps).get_epsilon_for_delta(
                s["delta"]) for pess in (True, False)]
        out.append((interval, values[0], values[1], time.perf_counter() - t0))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two small settings only")
    ap.add_argument("--grids", action="store_true", help="PLD grid sensitivity at the demo")
    ap.add_argument("--csv", default=None, help="write the comparison rows here")
    args = ap.parse_args(argv)
    settings = QUICK if args.quick else [DEMO] + GRID
    print(f"PLD grid {dpsgd.PLD_VALUE_DISCRETIZATION_INTERVAL:g} (pessimistic: ε is an upper "
          "bound); RDP: dp_accounting default orders")
    print(f"{'setting':<22} {'ε':>5} {'δ':>6} {'n':>6} {'T':>5} | {'σ RDP':>7} "
          f"{'ε PLD@σ RDP':>11} | {'σ PLD':>7} {'ε PLD':>7} {'ε RDP':>7} | {'σ −%':>5} "
          f"{'s RDP':>6} {'s PLD':>6}")
    rows = []
    for s in settings:
        r = compare(s)
        rows.append(r)
        print(f"{r['setting']:<22} {r['epsilon']:>5g} {r['delta']:>6g} {r['num_examples']:>6} "
              f"{r['steps']:>5} | {r['sigma_rdp']:>7.4f} {r['pld_epsilon_at_sigma_rdp']:>11.4f} | "
              f"{r['sigma_pld']:>7.4f} {r['pld_epsilon_at_sigma_pld']:>7.4f} "
              f"{r['rdp_epsilon_at_sigma_pld']:>7.4f} | {r['noise_saved_pct']:>5.1f} "
              f"{r['seconds_rdp']:>6.2f} {r['seconds_pld']:>6.2f}", flush=True)
    print(f"golden MNIST run at σ = 1.1: RDP ε = {dpsgd.dpsgd_epsilon(GOLDEN, 1e-5, 'rdp'):.4f}, "
          f"PLD ε = {dpsgd.dpsgd_epsilon(GOLDEN, 1e-5, 'pld'):.4f}")
    if args.grids:
        sigma = rows[0]["sigma_rdp"] if rows[0]["setting"] == DEMO["name"] else 2.65
        print(f"PLD grid sensitivity, demo run at σ = {sigma:.4f}: grid, pessimistic ε "
              "(upper bound), optimistic ε (lower estimate), seconds")
        for interval, pess, opt, secs in grid_sensitivity(DEMO, sigma):
            print(f"  {interval:g}: {pess:.6f}  {opt:.6f}  {secs:.2f} s")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, FIELDS)
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
