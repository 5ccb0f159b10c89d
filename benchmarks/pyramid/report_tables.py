"""Markdown tables of benchmarks/results/pyramid/*.csv (pasted into REPORT.md)."""
import os

import pandas as pd

OUT = os.path.join(os.path.dirname(__file__), "..", "results", "pyramid")


def pct(x):
    return f"{(x - 1) * 100:+.1f} %"


def main():
    d = pd.read_csv(os.path.join(OUT, "figs_4_5_6.csv"), dtype={"fig": str})
    f4 = d[d.fig == "4"].pivot_table(index="fraction", columns="model", values="normalized")
    f5 = d[d.fig == "5"].pivot_table(index="fraction", columns="model", values="normalized")
    f5.columns = [f"{c}, ε=1" for c in f5.columns]
    t = f4.join(f5, how="left")
    t.index = [f"{100 * i:g} % ({int(d[d.fraction == i].n_hot.iloc[0])} rows)" for i in t.index]
    print("### Figs. 4 and 5: log loss vs the baseline (raw LR on all data), by hot-window size\n")
    print(t.apply(lambda c: c.map(lambda v: pct(v) if pd.notna(v) else "")).to_markdown())
    g = d[d.fig.isin(["6a", "6c"])]
    t6 = g.pivot_table(index=["model", "sketch", "weights"], columns="epsilon", values="normalized")
    print("\n### Fig. 6: 1 % hot window, by ε (weights: none = even split, exact = non-private "
          "quantile weights, dp = ε-DP weights)\n")
    print(t6.apply(lambda c: c.map(pct)).to_markdown())
    path = os.path.join(OUT, "count_selection.csv")
    if os.path.exists(path):
        c = pd.read_csv(path)
        tc = c.pivot_table(index=["groups"], columns=["model", "epsilon"], values="normalized")
        print("\n### Count selection (§V.D)\n")
        print(tc.apply(lambda col: col.map(pct)).to_markdown())
    path = os.path.join(OUT, "latency.csv")
    if os.path.exists(path):
        print("\n### Fig. 9: featurization latency\n")
        print(pd.read_csv(path).round(3).to_markdown(index=False))


if __name__ == "__main__":
    main()
