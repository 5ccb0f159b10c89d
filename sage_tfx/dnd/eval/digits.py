"""Figs. 2–4 of the paper (§V-A, §V-B) on scikit-learn's digits, an offline MNIST stand-in.

MNIST has 60,000 training images (784 pixels) and the paper runs 20 passes of N_c = 10 clients
(120,000 updates) at γ = 0.001. Digits has 1,257 training images (64 pixels, 8×8) after a 70/30
split, so a run is ``passes`` × 125 updates; to make comparable progress we use more passes and a
larger γ (both recorded in the results). Multi-class logistic regression (650 weights), pixels
scaled to [0, 1] by their schema bound 16.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional


from sage_tfx.dnd.client import ClientConfig
from sage_tfx.dnd.eval.simulate import Curve, RunConfig, run_curve
from sage_tfx.dnd.glm import GLMSpec

SPEC = GLMSpec("multinomial", 64, 10)


def load(seed: int = 0):
    """(x_train, y_train, x_test, y_test): digits scaled by the schema bound 16, 70/30 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x / 16.0, y, test_size=0.3, random_state=seed,
                                          stratify=y)
    return xtr, ytr, xte, yte


@dataclasses.dataclass(frozen=True)
class Setting:
    """The digits experiment's protocol settings (step size, passes, clients, curve points)."""

    gamma: float = 0.05
    passes: int = 40
    clients_of: int = 10
    points: int = 20
    unit: str = "feature"  # the paper's per-coordinate clip for the noise-free panels


def _client(s: Setting, epsilon: Optional[float], unit: Optional[str] = None,
            gamma: Optional[float] = None, clip: float = 1.0) -> ClientConfig:
    return ClientConfig(gamma or s.gamma, clip, epsilon, unit or s.unit)


def fig2_k(s: Setting, ks=(1, 5, 10, 20, 50, 100)) -> list[RunConfig]:
    """Column 1: no client noise, k instances."""
    return [RunConfig(f"k={k}", k, _client(s, None)) for k in ks]


def fig2_batching(s: Setting, ks=(10, 20), batches=(10, 100, 1000)) -> list[RunConfig]:
    """Column 2: k instances vs a single model averaging N_s returned models."""
    runs = [RunConfig(f"k={k}", k, _client(s, None)) for k in ks]
    runs += [RunConfig(f"N_s={n}", 1, _client(s, None), "server_batch", batch_size=n)
             for n in batches]
    return runs


def fig2_epsilon(s: Setting, unit: str,
                 epsilons=(None, math.log(32), math.log(16), math.log(8), math.log(3)),
                 clip: float = 1.0) -> list[RunConfig]:
    """Column 3: k = 10 with client noise at several ε (per weight for ``feature``, per update
    for ``model``, whose L1 clip is ``clip``)."""
    return [RunConfig("no noise" if e is None else f"eps=log({round(math.exp(e))})", 10,
                      _client(s, e, unit, clip=clip)) for e in epsilons]


def strategies(s: Setting, k: int, gamma: Optional[float] = None) -> list[RunConfig]:
    """Figs. 3–4: Draw-and-Discard vs 1/k accept, same-instance replace, and the averaging
    variants, no client noise; k = 1 is server-side training."""
    c = _client(s, None, gamma=gamma)
    return [
        RunConfig("server (k=1)", 1, c),
        RunConfig("draw and discard", k, c),
        RunConfig("1/k update accept", k, c, "accept_1_over_k"),
        RunConfig("same instance replace", k, c, "same_instance"),
        RunConfig("draw and discard + averaging", k, c, average_on_replace=True),
        RunConfig("same instance + averaging", k, c, "same_instance", average_on_replace=True),
    ]


def run_all(runs: list[RunConfig], s: Setting, data, seed: int = 0) -> list[Curve]:
    """One learning curve per run configuration on the digits data."""
    xtr, ytr, xte, yte = data
    return [run_curve(SPEC, r, xtr, ytr, xte, yte, clients_of=s.clients_of, passes=s.passes,
                      points=s.points, seed=seed) for r in runs]


def plot_panels(panels: list[tuple[str, list[Curve]]], path: str, title: str) -> None:
    """One column per panel: training loss (top) and test accuracy (bottom) vs samples."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 6.5), squeeze=False)
    for col, (name, curves) in enumerate(panels):
        for c in curves:
            axes[0, col].plot(c.samples, c.train_loss, label=c.label)
            axes[1, col].plot(c.samples, c.test_accuracy, label=c.label)
        axes[0, col].set_title(name)
        axes[0, col].set_ylabel("training loss (averaged model)")
        axes[1, col].set_ylabel("test accuracy")
        axes[1, col].set_xlabel("examples ingested")
        axes[1, col].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def final_rows(figure: str, panel: str, curves: list[Curve]) -> list[dict]:
    """One summary row per curve: final and mid-run loss and accuracy."""
    return [{"figure": figure, "panel": panel, "config": c.label, "updates": c.updates,
             "samples": c.samples[-1], "final_train_loss": c.train_loss[-1],
             "final_test_accuracy": c.test_accuracy[-1],
             "mid_test_accuracy": c.test_accuracy[len(c.test_accuracy) // 4]} for c in curves]
