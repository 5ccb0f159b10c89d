"""Sequential Draw-and-Discard training runs for the paper's §V experiments (numpy, seeded).

Clients are disjoint groups of N_c training examples; a pass visits every client once in a
random order; each visit is Alg. 1 on a drawn instance, returned under the chosen strategy. The
curves record, against the number of examples ingested (the paper's x-axis), the training loss
and the test accuracy of the averaged model. Noise is seeded
(:class:`~sage_tfx.dp.noise.SeededNoise`): these are reproducible experiments, not releases.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Optional

import numpy as np

from sage_tfx.dnd.client import ClientConfig, client_update
from sage_tfx.dnd.glm import GLMSpec
from sage_tfx.dnd.state import DnDState, initial_instances
from sage_tfx.dp.noise import SeededNoise


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One curve of a figure.

    Attributes:
      label: legend text.
      k: instances (``draw_discard`` / ``same_instance``); the 1/k of ``accept_1_over_k``.
      strategy: a :data:`~sage_tfx.dnd.state.STRATEGIES` entry.
      average_on_replace: the §V-B averaging variant.
      batch_size: N_s of ``server_batch``.
      client: γ, C, ε, unit of Alg. 1 (``epsilon=None``: no client noise).
    """

    label: str
    k: int
    client: ClientConfig
    strategy: str = "draw_discard"
    average_on_replace: bool = False
    batch_size: Optional[int] = None


@dataclasses.dataclass
class Curve:
    """A learning curve: training loss and test accuracy per number of samples."""

    label: str
    samples: list
    train_loss: list
    test_accuracy: list
    updates: int = 0


def _init_variance(client: ClientConfig) -> float:
    """§V-A: σ² of the client noise; without client noise, the σ² of ε = 1."""
    if client.private:
        return client.noise_variance
    return dataclasses.replace(client, epsilon=1.0).noise_variance


def run_curve(spec: GLMSpec, run: RunConfig, x_train: np.ndarray, y_train: np.ndarray,
              x_test: np.ndarray, y_test: np.ndarray, *, clients_of: int = 10, passes: int = 20,
              points: int = 40, seed: int = 0) -> Curve:
    """Trains one configuration; returns its curve (``points`` evaluations over the run)."""
    rng = np.random.default_rng(seed)
    n = len(y_train)
    order = rng.permutation(n)
    groups = [order[i:i + clients_of] for i in range(0, n - clients_of + 1, clients_of)]
    single = run.strategy in ("accept_1_over_k", "server_batch")
    k_slots = 1 if single else run.k
    sigma2 = _init_variance(run.client)
    inst = initial_instances(np.zeros(spec.dim), k_slots, sigma2, rng) if k_slots > 1 \
        else np.zeros((1, spec.dim))
    state = DnDState(inst, strategy=run.strategy, average_on_replace=run.average_on_replace,
                     accept_k=run.k if run.strategy == "accept_1_over_k" else None,
                     batch_size=run.batch_size, rng=random.Random(seed))
    noise = SeededNoise(seed + 1)
    total = passes * len(groups)
    marks = set(np.linspace(0, total, points + 1).astype(int)[1:])
    curve = Curve(run.label, [], [], [])
    step = 0
    for _ in range(passes):
        for gi in rng.permutation(len(groups)):
            g = groups[gi]
            ticket, w = state.draw()
            state.discard(ticket, client_update(spec, w, x_train[g], y_train[g], run.client,
                                                noise=noise))
            step += 1
            if step in marks:
                avg = state.average()
                curve.samples.append(step * clients_of)
                curve.train_loss.append(spec.loss(avg, x_train, y_train))
                curve.test_accuracy.append(spec.accuracy(avg, x_test, y_test))
    curve.updates = step
    return curve
