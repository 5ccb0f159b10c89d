"""Plots of benchmarks/results/pyramid/figs_4_5_6.csv (called by figs_4_5_6.py)."""
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def plot(df: pd.DataFrame, out: str) -> None:
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    ax = axes[0]
    for model, g in df[df.fig == "4"].groupby("model"):
        ax.plot(g.fraction * 100, g.normalized, marker="o", label=model)
    ax.set(xscale="log", title="Fig. 4: no noise", xlabel="% of training data (hot window)",
           ylabel="log loss / baseline")
    ax = axes[1]
    g5 = df[df.fig == "5"].groupby(["model", "fraction"]).normalized.mean().reset_index()
    for model, g in g5.groupby("model"):
        ax.plot(g.fraction * 100, g.normalized, marker="o", label=f"{model}, ε=1 (DP weights)")
    for model, g in df[(df.fig == "4") & (df.model != "raw lr")].groupby("model"):
        ax.plot(g.fraction * 100, g.normalized, ls=":", label=f"{model}, no noise")
    ax.set(xscale="log", title="Fig. 5: ε = 1, k = 1", xlabel="% of training data")
    ax = axes[2]
    g6 = df[(df.fig == "6a")].groupby(
        ["model", "weights", "epsilon"]).normalized.mean().reset_index()
    for (model, w), g in g6.groupby(["model", "weights"]):
        ax.plot(g.epsilon, g.normalized, marker="o", label=f"{model}, weights={w}")
    ax.set(xscale="log", title="Fig. 6(a): weighted noise, 1 % data", xlabel="ε")
    ax = axes[3]
    sub = df[(df.fig.isin(["6a", "6c"])) & (df.weights.isin(["none", "dp"]))]
    g6c = sub.groupby(["model", "sketch", "weights", "epsilon"]).normalized.mean().reset_index()
    for (model, sk, w), g in g6c.groupby(["model", "sketch", "weights"]):
        ax.plot(g.epsilon, g.normalized, marker="o", label=f"{model}, {sk}, w={w}")
    ax.set(xscale="log", title="Fig. 6(c): count-median vs count-min", xlabel="ε")
    for ax in axes:
        ax.axhline(1.0, color="k", lw=0.5)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "figs_4_5_6.png"), dpi=110)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..",
                                                             "results", "pyramid")
    plot(pd.read_csv(os.path.join(out, "figs_4_5_6.csv")), out)
