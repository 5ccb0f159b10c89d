"""The client side of Draw-and-Discard (Alg. 1): one clipped gradient step plus Laplace noise.

    B^{t+1} = B^t − γ·clip(G) + Laplace(0, 2γC/ε) per weight,   G = (1/N_c) Σ (Ŷᵢ − Yᵢ) X̃ᵢ

**The privacy unit.** The paper clips every coordinate of G to [−1, 1] and adds Laplace(2γ/ε) to
every weight. That is ε-DP *per feature* (§IV, §VII): the update's L1 sensitivity is 2γ·d for a
model of d weights, so the whole update is (d·ε)-DP. Here:

* ``unit="model"`` (default): G is clipped in L1 to C (``l1_norm_clip``); two clients' clipped
  gradients differ by at most 2C in L1, so the update has L1 sensitivity 2γC and Laplace scale
  2γC/ε makes the whole update ε-DP. Charged: ε per update.
* ``unit="feature"``: the paper's mode, every coordinate clipped to [−C, C] (C = 1 in the paper),
  the same per-weight scale 2γC/ε; ε holds per weight only, and what is charged is what it really
  costs, d·ε per update.

The adjacency is one client's whole local data set (its N_c examples may all change): local DP
against the channel listener (adversary I). The per-weight noise variance is 2·(2γC/ε)² = 8γ²C²/ε²
in both modes. Noise comes from OpenDP (:mod:`sage_tfx.dp.noise`), fresh per update; a seeded
source may be passed for experiments only.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.dp import noise as noise_lib
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.dnd.glm import GLMSpec
from sage_tfx.ledger import accounting

UNITS = ("model", "feature")


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """What every client of a run does (Alg. 1 parameters).

    Attributes:
      gamma: learning rate γ > 0.
      l1_norm_clip: C > 0: the L1 bound of the clipped gradient (model unit) or the per-coordinate
        bound (feature unit; the paper's 1).
      epsilon: ε per unit (per update for ``model``, per weight for ``feature``); ``None`` runs
        without noise, for non-private experiments only (such a run cannot be charged or served).
      unit: ``"model"`` or ``"feature"`` (see the module docstring).
    """

    gamma: float
    l1_norm_clip: float = 1.0
    epsilon: Optional[float] = 1.0
    unit: str = "model"

    def __post_init__(self):
        accounting.check_positive(self.gamma, "gamma")
        accounting.check_positive(self.l1_norm_clip, "l1_norm_clip")
        if self.epsilon is not None:
            accounting.check_epsilon(self.epsilon)
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {self.unit!r}")

    @property
    def private(self) -> bool:
        return self.epsilon is not None

    @property
    def sensitivity_per_weight(self) -> float:
        """2γC: the largest change of one weight between adjacent clients."""
        return 2.0 * self.gamma * self.l1_norm_clip

    def l1_sensitivity(self, dim: int) -> float:
        """L1 sensitivity of the whole update: 2γC (model) or 2γC·d (feature)."""
        return self.sensitivity_per_weight * (dim if self.unit == "feature" else 1)

    @property
    def noise_scale(self) -> float:
        """Laplace scale b = 2γC/ε per weight."""
        if self.epsilon is None:
            raise InvalidPrivacyParameterError("a run without noise has no noise scale")
        return self.sensitivity_per_weight / self.epsilon

    @property
    def noise_variance(self) -> float:
        """σ² = 2b² = 8γ²C²/ε², per weight."""
        return 2.0 * self.noise_scale ** 2

    def update_epsilon(self, dim: int) -> float:
        """ε of one whole update against adversary I: what the ledger is charged per update."""
        if self.epsilon is None:
            raise InvalidPrivacyParameterError(
                "a run without noise is not differentially private and cannot be charged")
        return self.epsilon * (dim if self.unit == "feature" else 1)

    def update_event(self, dim: int) -> dp_event_lib.LaplaceDpEvent:
        """One update as a dp_accounting event: Laplace with noise_multiplier = b / Δ₁."""
        return dp_event_lib.LaplaceDpEvent(
            noise_multiplier=self.noise_scale / self.l1_sensitivity(dim))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ClientConfig":
        return cls(float(d["gamma"]), float(d["l1_norm_clip"]),
                   None if d.get("epsilon") is None else float(d["epsilon"]), d["unit"])


def clip_gradient(g: np.ndarray, config: ClientConfig) -> np.ndarray:
    """L1 clipping to C (model unit) or per-coordinate clipping to [−C, C] (feature unit)."""
    c = config.l1_norm_clip
    if config.unit == "feature":
        return np.clip(g, -c, c)
    norm = float(np.abs(g).sum())
    return g if norm <= c else g * (c / norm)


def client_update(spec: GLMSpec, weights: np.ndarray, x: np.ndarray, y: np.ndarray,
                  config: ClientConfig, *, noise: Optional[noise_lib.NoiseSource] = None
                  ) -> np.ndarray:
    """Alg. 1 on one client's N_c examples: the whole updated model, to send back.

    Args:
      spec: the model.
      weights: the drawn instance B^t.
      x: the client's features, already normalised to [0, 1]
      (:class:`~sage_tfx.dnd.glm.FeatureBounds`). y: the client's responses (normalised to [0, 1]
      for linear models). config: γ, C, ε, unit.
      noise: noise source; OpenDP (:data:`sage_tfx.dp.noise.SECURE`) unless a seeded one is given
        for an experiment.
    Raises:
      ValueError: no examples (a client with N_c = 0 does not request a model), features outside
        [0, 1], or shapes that do not match the spec.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError("a client needs at least one example (N_c > 0) to request an update")
    if np.any(x < 0.0) or np.any(x > 1.0) or not np.all(np.isfinite(x)):
        raise ValueError("features must be normalised to [0, 1] before the update (Alg. 1)")
    w = np.asarray(weights, dtype=np.float64)
    g = clip_gradient(spec.gradient(w, x, y), config)
    stepped = w - config.gamma * g
    if not config.private:
        return stepped
    return np.asarray((noise or noise_lib.SECURE).laplace(stepped, config.noise_scale))


def check_update_matches_ledger_epsilon(config: ClientConfig, dim: int) -> float:
    """ε that OpenDP's privacy map gives for the sampler at this scale and sensitivity.

    Used to assert that the ε charged per update is the ε the sampler delivers.
    """
    eps = noise_lib.laplace_epsilon(config.noise_scale, config.l1_sensitivity(dim))
    if not math.isclose(eps, config.update_epsilon(dim), rel_tol=1e-9):
        raise InvalidPrivacyParameterError(
            f"OpenDP's map gives ε={eps} for this update, the ledger would be charged "
            f"{config.update_epsilon(dim)}")
    return eps
