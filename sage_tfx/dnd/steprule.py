"""The gaussian unit's step γ and clip C₂ chosen before any update, from what the server knows.

An update of the gaussian unit is ``w − γ·clip(G) + N(0, (2mγC₂)²)`` per weight. While the clip
is active (‖G‖ ≥ C₂) the step is γC₂ along G/‖G‖ and the noise std 2m·γC₂: the update depends on
γ and C₂ only through their product η = γC₂, its noise-to-step ratio 2m√d is fixed by the noise
multiplier m and the number of weights d, and a clip *above* the clients' gradient norms only
adds noise for steps that are never taken (C₂ = 2 against gradients of ≈ 1.2 on MNIST: noise
sized for steps 1.7× longer than the ones sent). So:

* **C₂** = :data:`L2_NORM_CLIP` = 0.25, a public constant below the per-client gradient norms
  (N_c = 10 examples, features in [0, 1]) on every data set measured — digits, leaf shapes and the
  review's MNIST (≈ 1.2 after one epoch); ``benchmarks/dnd/steprule.py`` prints the fraction of
  clipped clients, and that accuracy is flat in C₂ ≤ 0.5 at equal η.
* **η** by the fixed-horizon SGD rule (Zinkevich 2003; Nemirovski et al. 2009: a constant step
  η = D/(G√L) over L steps of root-mean-square norm G reaches the best bound on the distance D to
  the optimum), applied to one instance's lineage: T updates over k instances extend each lineage
  by L = T/k steps (each update extends the drawn instance's lineage by one; the k lineages share
  them), and an update's squared norm is η²(1 + 4m²d), so

      γ·C₂ = η = D / √((T/k)·(1 + 4m²d))

  with D = :data:`STEP_DISTANCE`, the one constant, fitted on digits (the best η of a grid at
  10⁶ updates) and checked on a second data set with 4× the weights, leaf shapes, where the rule
  sits at the lower edge of the best range (1–4× its η; ``benchmarks/results/dnd/REPORT.md``,
  "Choosing γ and C₂").

Everything the rule reads is public and fixed before the first update: d, m (from ε, δ), k and the
run's planned number of updates T (what the grant pays for: passes × clients). Nothing here is a
privacy parameter: the charge depends on ε, δ only, whatever γ and C₂ are.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from sage_tfx.dnd.client import ClientConfig, gaussian_noise_multiplier
from sage_tfx.ledger import accounting

L2_NORM_CLIP = 0.25
STEP_DISTANCE = 26.0


@dataclasses.dataclass(frozen=True)
class Step:
    """γ and C₂ of a gaussian run, and the step η = γC₂ they make."""

    gamma: float
    l2_norm_clip: float

    @property
    def eta(self) -> float:
        """η = γC₂: the step's length while the clip is active."""
        return self.gamma * self.l2_norm_clip


def _whole(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def step_size(dim: int, noise_multiplier: float, k: int, updates: int, *,
              distance: float = STEP_DISTANCE) -> float:
    """η = D / √((T/k)(1 + 4m²d)): the module's rule for γ·C₂.

    Raises:
      ValueError: dim, k or updates not integers ≥ 1; InvalidPrivacyParameterError: m or D not
        finite and > 0.
    """
    d, k, t = _whole(dim, "dim"), _whole(k, "k"), _whole(updates, "updates")
    m = accounting.check_positive(noise_multiplier, "noise_multiplier")
    dist = accounting.check_positive(distance, "distance")
    return dist / math.sqrt((t / k) * (1.0 + 4.0 * m * m * d))


def gaussian_step(dim: int, noise_multiplier: float, k: int, updates: int, *,
                  gamma: Optional[float] = None, l2_norm_clip: Optional[float] = None) -> Step:
    """γ and C₂ by the rule, keeping whichever of the two the user set: C₂ defaults to
    :data:`L2_NORM_CLIP`, γ to η/C₂ (if both are set they are returned as they are)."""
    clip = L2_NORM_CLIP if l2_norm_clip is None else accounting.check_positive(
        l2_norm_clip, "l2_norm_clip")
    if gamma is None:
        gamma = step_size(dim, noise_multiplier, k, updates) / clip
    return Step(accounting.check_positive(gamma, "gamma"), clip)


def gaussian_config(*, epsilon: float, delta: float, dim: int, k: int, updates: int,
                    gamma: Optional[float] = None,
                    l2_norm_clip: Optional[float] = None) -> ClientConfig:
    """A gaussian-unit :class:`ClientConfig` whose γ and C₂ not given come from the rule."""
    m = gaussian_noise_multiplier(float(accounting.check_epsilon(epsilon)),
                                  float(accounting.check_delta(delta, allow_zero=False)))
    step = gaussian_step(dim, m, k, updates, gamma=gamma, l2_norm_clip=l2_norm_clip)
    return ClientConfig(step.gamma, epsilon=float(epsilon), unit="gaussian", delta=float(delta),
                        l2_norm_clip=step.l2_norm_clip)


__all__ = ["L2_NORM_CLIP", "STEP_DISTANCE", "Step", "step_size", "gaussian_step",
           "gaussian_config"]
