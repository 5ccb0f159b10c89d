"""Figs. 2–4 of Draw-and-Discard on sklearn digits; writes PNGs and a CSV to
benchmarks/results/dnd/.

    .venv/bin/python benchmarks/dnd/figs_2_3_4.py            # full (several minutes)
    .venv/bin/python benchmarks/dnd/figs_2_3_4.py --quick    # smoke run
"""
import argparse
import dataclasses
import os
import time

from sage_tfx.dnd.eval import digits
from sage_tfx.reporting import write_csv

OUT = "benchmarks/results/dnd"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--gamma", type=float, default=0.05)
    p.add_argument("--passes", type=int, default=40)
    a = p.parse_args()
    s = digits.Setting(gamma=a.gamma, passes=3 if a.quick else a.passes,
                       points=4 if a.quick else 20)
    data = digits.load()
    os.makedirs(OUT, exist_ok=True)
    rows = []
    t0 = time.time()
    fig2 = [("k instances (no noise)", digits.fig2_k(s)),
            ("k vs server batching N_s (no noise)", digits.fig2_batching(s)),
            ("epsilon per weight (paper's unit), k=10", digits.fig2_epsilon(s, "feature")),
            ("epsilon per update (model unit, C=1), k=10", digits.fig2_epsilon(s, "model")),
            ("epsilon per update (model unit, C=10), k=10",
             digits.fig2_epsilon(s, "model", clip=10.0))]
    panels = []
    for name, runs in fig2:
        curves = digits.run_all(runs, s, data)
        panels.append((name, curves))
        rows += digits.final_rows("2", name, curves)
        print(f"[{time.time() - t0:6.0f}s] fig 2: {name}", flush=True)
    digits.plot_panels(panels, f"{OUT}/fig2_digits.png",
                       f"Fig. 2 on digits (gamma={s.gamma}, N_c=10, {s.passes} passes)")
    panels = []
    for k in (20,):
        name = f"strategies, k={k}, gamma={s.gamma}"
        curves = digits.run_all(digits.strategies(s, k), s, data)
        panels.append((name, curves))
        rows += digits.final_rows("3", name, curves)
        print(f"[{time.time() - t0:6.0f}s] fig 3: {name}", flush=True)
    digits.plot_panels(panels, f"{OUT}/fig3_digits.png", "Fig. 3 on digits: update strategies")
    panels = []
    for k in (5, 20, 50):
        g = s.gamma / 10
        name = f"strategies, k={k}, gamma={g:g}"
        curves = digits.run_all(digits.strategies(s, k, gamma=g), s, data)
        panels.append((name, curves))
        rows += digits.final_rows("4", name, curves)
        print(f"[{time.time() - t0:6.0f}s] fig 4: {name}", flush=True)
    digits.plot_panels(panels, f"{OUT}/fig4_digits.png",
                       "Fig. 4 on digits: strategies across k at gamma/10")
    for r in rows:
        r.update(dataclasses.asdict(s))
    write_csv(f"{OUT}/figs_2_3_4.csv", rows)
    print(f"wrote {OUT}/fig2_digits.png, fig3_digits.png, fig4_digits.png, figs_2_3_4.csv")


if __name__ == "__main__":
    main()
