"""Draw-and-Discard learning curves at a deployment's scale (10⁶ updates), in process with numpy.

:func:`~sage_tfx.dnd.eval.simulate.run_curve` runs the real :class:`~sage_tfx.dnd.state.DnDState`
and :func:`~sage_tfx.dnd.client.client_update` one update at a time (~1 ms per update on a loaded
host). Here ``in_flight`` clients draw from the current instances together, each runs Alg. 1 (the
unit's clipping, :func:`~sage_tfx.dnd.client.clip_gradient`'s rule, and the unit's noise at the
config's scale), and their models return into independently, uniformly drawn slots — what the
service does with that many draws outstanding. ``in_flight = 1`` is the sequential algorithm.
Multinomial logistic regression only (the paper's §V model). Noise is seeded numpy (an
experiment, not a release); the gaussian unit's noise has the secure sampler's std
(:meth:`~sage_tfx.dnd.client.ClientConfig.sampler_std`, ≤ 1.6 % above m·Δ₂).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence

import numpy as np

from sage_tfx.dnd.client import ClientConfig
from sage_tfx.dnd.glm import GLMSpec


@dataclasses.dataclass
class BatchedCurve:
    """A learning curve of the batched protocol: loss and accuracy per number of updates."""

    label: str
    updates: list
    train_loss: list
    test_accuracy: list
    noise_std: float
    average: Optional[np.ndarray] = None  # the average of the k instances at the last mark


def _grads(w: np.ndarray, x: np.ndarray, y1h: np.ndarray) -> np.ndarray:
    """Per-client mean gradients: w (B, C, p+1), x (B, n, p+1) with the intercept, y1h (B, n, C)
    → (B, C·(p+1)) in :class:`~sage_tfx.dnd.glm.GLMSpec`'s row-major layout."""
    eta = np.einsum("bnp,bcp->bnc", x, w)
    eta -= eta.max(axis=2, keepdims=True)
    e = np.exp(eta)
    resid = e / e.sum(axis=2, keepdims=True) - y1h
    return np.einsum("bnc,bnp->bcp", resid, x).reshape(len(w), -1) / x.shape[1]


def _clip(g: np.ndarray, cfg: ClientConfig) -> np.ndarray:
    c = cfg.clip
    if cfg.unit == "feature":
        return np.clip(g, -c, c)
    norm = np.sqrt((g * g).sum(axis=1)) if cfg.gaussian else np.abs(g).sum(axis=1)
    return g * np.minimum(1.0, c / np.maximum(norm, 1e-300))[:, None]


def run_batched(spec: GLMSpec, cfg: ClientConfig, k: int, x_train: np.ndarray, y_train: np.ndarray,
                x_test: np.ndarray, y_test: np.ndarray, *, updates: int, marks: Sequence[int],
                clients_of: int = 10, in_flight: int = 8, seed: int = 0,
                label: Optional[str] = None,
                progress: Optional[Callable[[int, float], None]] = None) -> BatchedCurve:
    """Trains k instances with ``updates`` client updates; evaluates the average at ``marks``.

    Clients are disjoint groups of ``clients_of`` training examples, visited pass after pass in a
    fresh random order (as :func:`~sage_tfx.dnd.eval.simulate.run_curve`). ``progress(updates,
    test accuracy)`` is called at every mark (a long curve runs for minutes).
    """
    if spec.family != "multinomial":
        raise ValueError("the batched simulation is for the multinomial model")
    rng = np.random.default_rng(seed)
    n = len(y_train)
    groups = rng.permutation(n)[: n - n % clients_of].reshape(-1, clients_of)
    xt = np.hstack([np.ones((n, 1)), np.asarray(x_train, dtype=np.float64)])
    y1h = np.eye(spec.n_classes)[np.asarray(y_train, dtype=np.int64)]
    private = cfg.private
    std = cfg.sampler_std(spec.dim) if private else 0.0
    if private:
        init_var = cfg.noise_variance
    else:  # §V-A: without client noise, the spread of ε = 1
        extra = {"delta": 1e-6} if cfg.gaussian else {}
        init_var = dataclasses.replace(cfg, epsilon=1.0, **extra).noise_variance
    inst = rng.normal(0.0, math.sqrt(k / 2.0 * init_var), size=(k, spec.dim))
    shape = (spec.n_classes, spec.n_features + 1)
    marks = sorted(set(int(m) for m in marks if 0 < m <= updates))
    curve = BatchedCurve(label or cfg.unit, [], [], [], std)
    order = np.empty(0, dtype=np.int64)
    done = 0
    for mark in marks:
        while done < mark:
            b = min(in_flight, mark - done)
            if order.size < b:
                order = np.concatenate([order, rng.permutation(len(groups))])
            g_idx, order = order[:b], order[b:]
            rows = groups[g_idx]  # (b, clients_of)
            drawn = inst[rng.integers(k, size=b)]
            g = _clip(_grads(drawn.reshape(b, *shape), xt[rows], y1h[rows]), cfg)
            back = drawn - cfg.gamma * g
            if private:
                back += (rng.normal(0.0, std, size=back.shape) if cfg.gaussian
                         else rng.laplace(0.0, cfg.noise_scale, size=back.shape))
            inst[rng.integers(k, size=b)] = back  # later ones win a collision, as in sequence
            done += b
        avg = inst.mean(axis=0)
        curve.updates.append(done)
        curve.train_loss.append(spec.loss(avg, x_train, y_train))
        curve.test_accuracy.append(spec.accuracy(avg, x_test, y_test))
        curve.average = avg
        if progress is not None:
            progress(done, curve.test_accuracy[-1])
    return curve
