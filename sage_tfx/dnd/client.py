"""The client side of Draw-and-Discard (Alg. 1): one clipped gradient step plus noise.

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
* ``unit="gaussian"``: G is clipped in L2 to C₂ (``l2_norm_clip``), so the update has L2
  sensitivity Δ₂ = 2γC₂, and N(0, (m·Δ₂)²) is added per weight with the noise multiplier m of
  ``GaussianDpEvent(m)`` calibrated to (ε, δ) per update (the paper's §IV-B/§VII suggestion;
  Flower's ``LocalDpMod``). Client gradients are spread over many weights (at MNIST scale L1 ≈ 133
  but L2 ≈ 3 at 7,850 weights), so the noise per weight is an order of magnitude below the
  L1/Laplace unit's at the same ε. Charged: (ε, δ) per update (basic streams) or
  ``GaussianDpEvent(m)`` (rdp streams). m is the analytic Gaussian's (Balle & Wang 2018) at
  ε − SAMPLER_EPSILON and δ·(1 − SAMPLER_DELTA_SHARE), checked with dp_accounting's PLD accountant;
  the ε remainder covers the discrete Gaussian's (ε, δ) term. The sampler
  (:mod:`sage_tfx.dnd.noise`) draws the discrete Gaussian exactly, full support, so its Rényi
  divergence is ``GaussianDpEvent(m)``'s at every order: the rdp charge is proved for it. γ and
  C₂ may come from the step rule (:mod:`sage_tfx.dnd.steprule`).

The adjacency is one client's whole local data set (its N_c examples may all change): local DP
against the channel listener (adversary I). The per-weight noise variance is 2·(2γC/ε)² = 8γ²C²/ε²
in the Laplace units and (2γC₂m)² in the Gaussian one (the float-safe samplers add ≤ 1.8 % to the
std, :meth:`ClientConfig.sampler_std`). Laplace noise comes from
:func:`sage_tfx.dnd.laplace.laplace_vector` (a discrete Laplace on a power-of-two grid, proved
ε-DP for the whole update at the charged ε, ~100× faster per weight than OpenDP's per-weight call,
which stays the reference), Gaussian noise from :func:`sage_tfx.dnd.noise.gaussian_vector` (a
float-safe discrete Gaussian, ~1,000× faster), fresh per update; a seeded source may be passed
for experiments only.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import numpy as np
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.dp import noise as noise_lib
from sage_tfx.dp.mechanisms import analytic_gaussian_sigma
from sage_tfx.errors import InvalidPrivacyParameterError
from sage_tfx.dnd import laplace as laplace_noise
from sage_tfx.dnd import noise as vector_noise
from sage_tfx.dnd.glm import GLMSpec
from sage_tfx.ledger import accounting

UNITS = ("model", "feature", "gaussian")
GAUSSIAN = "gaussian"


def pld_epsilon(noise_multiplier: float, delta: float) -> float:
    """ε at δ of ``GaussianDpEvent(noise_multiplier)`` by dp_accounting's PLD accountant."""
    from dp_accounting.pld import pld_privacy_accountant
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_event_lib.GaussianDpEvent(noise_multiplier))
    return float(acc.get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def gaussian_noise_multiplier(epsilon: float, delta: float) -> float:
    """m such that one ``GaussianDpEvent(m)`` release, through the float-safe sampler, is (ε, δ)-DP.

    The analytic Gaussian's m at ε − SAMPLER_EPSILON and δ·(1 − SAMPLER_DELTA_SHARE), raised
    until dp_accounting's PLD accountant agrees (its discretisation is pessimistic).
    """
    eps = accounting.check_epsilon(epsilon)
    dlt = accounting.check_delta(delta, allow_zero=False)
    eps_m = eps - vector_noise.SAMPLER_EPSILON
    if eps_m <= 0:
        raise InvalidPrivacyParameterError(
            f"epsilon must exceed the sampler's {vector_noise.SAMPLER_EPSILON}, got {epsilon!r}")
    delta_m = dlt * (1.0 - vector_noise.SAMPLER_DELTA_SHARE)
    m = analytic_gaussian_sigma(eps_m, delta_m) * (1.0 + 1e-7)
    while pld_epsilon(m, delta_m) > eps_m:
        m *= 1.0 + 1e-6
    return m


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """What every client of a run does (Alg. 1 parameters).

    Attributes:
      gamma: learning rate γ > 0.
      l1_norm_clip: C > 0: the L1 bound of the clipped gradient (model unit) or the per-coordinate
        bound (feature unit; the paper's 1). Not used by the gaussian unit.
      epsilon: ε per unit (per update for ``model`` and ``gaussian``, per weight for
        ``feature``); ``None`` runs without noise, for non-private experiments only (such a run
        cannot be charged or served).
      unit: ``"model"``, ``"feature"`` or ``"gaussian"`` (see the module docstring).
      delta: δ per update, in (0, 1): the gaussian unit only (required there).
      l2_norm_clip: C₂ > 0, the L2 bound of the clipped gradient: the gaussian unit only
        (required there).
    """

    gamma: float
    l1_norm_clip: float = 1.0
    epsilon: Optional[float] = 1.0
    unit: str = "model"
    delta: Optional[float] = None
    l2_norm_clip: Optional[float] = None

    def __post_init__(self):
        accounting.check_positive(self.gamma, "gamma")
        accounting.check_positive(self.l1_norm_clip, "l1_norm_clip")
        if self.epsilon is not None:
            accounting.check_epsilon(self.epsilon)
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {self.unit!r}")
        if self.unit == GAUSSIAN:
            if self.l2_norm_clip is None:
                raise InvalidPrivacyParameterError("the gaussian unit needs l2_norm_clip")
            accounting.check_positive(self.l2_norm_clip, "l2_norm_clip")
            if self.epsilon is not None:
                if self.delta is None:
                    raise InvalidPrivacyParameterError("the gaussian unit needs delta per update")
                accounting.check_delta(self.delta, allow_zero=False)
        elif self.delta is not None or self.l2_norm_clip is not None:
            raise InvalidPrivacyParameterError(
                f"delta and l2_norm_clip belong to the gaussian unit, not {self.unit!r}")

    @property
    def gaussian(self) -> bool:
        """True for the gaussian unit (an L2-clipped update with Gaussian noise)."""
        return self.unit == GAUSSIAN

    @property
    def clip(self) -> float:
        """The clip C of the unit: L1 (model), per coordinate (feature) or L2 (gaussian)."""
        return float(self.l2_norm_clip) if self.gaussian else self.l1_norm_clip

    @property
    def private(self) -> bool:
        """True if updates are noised (``epsilon`` is set)."""
        return self.epsilon is not None

    @property
    def sensitivity_per_weight(self) -> float:
        """2γC: the largest change of one weight between adjacent clients."""
        return 2.0 * self.gamma * self.clip

    def l1_sensitivity(self, dim: int) -> float:
        """L1 sensitivity of the whole update: 2γC (model) or 2γC·d (feature)."""
        if self.gaussian:
            raise InvalidPrivacyParameterError("the gaussian unit is calibrated to L2 sensitivity")
        return self.sensitivity_per_weight * (dim if self.unit == "feature" else 1)

    @property
    def l2_sensitivity(self) -> float:
        """Δ₂ = 2γC₂: L2 sensitivity of the whole update (gaussian unit)."""
        if not self.gaussian:
            raise InvalidPrivacyParameterError(f"the {self.unit} unit has no L2 calibration")
        return self.sensitivity_per_weight

    @property
    def noise_multiplier(self) -> float:
        """m of ``GaussianDpEvent(m)`` (gaussian unit): σ = m·Δ₂."""
        if self.epsilon is None or not self.gaussian:
            raise InvalidPrivacyParameterError(
                "only a private gaussian unit has a noise multiplier")
        return gaussian_noise_multiplier(float(self.epsilon), float(self.delta))

    @property
    def noise_scale(self) -> float:
        """Laplace scale b = 2γC/ε per weight, or the Gaussian's σ = m·2γC₂ (gaussian unit; the
        float-safe sampler adds at most 1.6 % more, :meth:`sampler_std`)."""
        if self.epsilon is None:
            raise InvalidPrivacyParameterError("a run without noise has no noise scale")
        if self.gaussian:
            return self.noise_multiplier * self.l2_sensitivity
        return self.sensitivity_per_weight / self.epsilon

    @property
    def noise_kind(self) -> str:
        """``gaussian`` or ``laplace``: the noise each update carries."""
        return "gaussian" if self.gaussian else "laplace"

    @property
    def noise_variance(self) -> float:
        """Per weight: 2b² = 8γ²C²/ε² (Laplace units) or σ² (gaussian unit)."""
        return (1.0 if self.gaussian else 2.0) * self.noise_scale ** 2

    def sampler_std(self, dim: int) -> float:
        """Per-weight noise std of the secure sampler for a ``dim``-weight model."""
        if self.gaussian:
            return vector_noise.noise_std(self.noise_multiplier, self.l2_sensitivity, dim)
        return laplace_noise.noise_std(self.l1_sensitivity(dim), self.update_epsilon(dim), dim)

    def update_epsilon(self, dim: int) -> float:
        """ε of one whole update against adversary I: what the ledger is charged per update."""
        if self.epsilon is None:
            raise InvalidPrivacyParameterError(
                "a run without noise is not differentially private and cannot be charged")
        return self.epsilon * (dim if self.unit == "feature" else 1)

    def update_delta(self, dim: int) -> float:
        """δ of one whole update: the gaussian unit's δ, 0 for the (pure) Laplace units."""
        self.update_epsilon(dim)
        return float(self.delta) if self.gaussian else 0.0

    def update_event(self, dim: int) -> dp_event_lib.DpEvent:
        """One update as a dp_accounting event: ``LaplaceDpEvent(b / Δ₁)`` or
        ``GaussianDpEvent(m)`` (gaussian unit)."""
        if self.gaussian:
            return dp_event_lib.GaussianDpEvent(noise_multiplier=self.noise_multiplier)
        return dp_event_lib.LaplaceDpEvent(
            noise_multiplier=self.noise_scale / self.l1_sensitivity(dim))

    def to_dict(self) -> dict:
        """A JSON-able dict of the configuration."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ClientConfig":
        """Inverse of :meth:`to_dict`."""
        def opt(key):
            return None if d.get(key) is None else float(d[key])
        return cls(float(d["gamma"]), float(d["l1_norm_clip"]), opt("epsilon"), d["unit"],
                   opt("delta"), opt("l2_norm_clip"))


def clip_gradient(g: np.ndarray, config: ClientConfig) -> np.ndarray:
    """L1 clipping to C (model unit), per-coordinate clipping to [−C, C] (feature unit) or L2
    clipping to C₂ (gaussian unit)."""
    c = config.clip
    if config.unit == "feature":
        return np.clip(g, -c, c)
    norm = float(np.sqrt(np.dot(g, g))) if config.gaussian else float(np.abs(g).sum())
    return g if norm <= c else g * (c / norm)


def add_noise(stepped: np.ndarray, config: ClientConfig,
              noise: Optional[noise_lib.NoiseSource] = None) -> np.ndarray:
    """The stepped model plus the unit's noise: the float-safe vector samplers (discrete Gaussian
    or discrete Laplace, ε-DP at the update's charged ε), unless a seeded source is given for an
    experiment."""
    if config.gaussian:
        if noise is None:
            return vector_noise.gaussian_vector(
                stepped, config.noise_multiplier, config.l2_sensitivity,
                max_extra_delta=float(config.delta) * vector_noise.SAMPLER_DELTA_SHARE)
        return np.asarray(noise.gaussian(stepped, config.noise_scale))
    if noise is None:
        dim = int(np.size(stepped))
        return laplace_noise.laplace_vector(stepped, config.l1_sensitivity(dim),
                                            config.update_epsilon(dim))
    return np.asarray(noise.laplace(stepped, config.noise_scale))


def client_update(spec: GLMSpec, weights: np.ndarray, x: np.ndarray, y: np.ndarray,
                  config: ClientConfig, *, noise: Optional[noise_lib.NoiseSource] = None
                  ) -> np.ndarray:
    """Alg. 1 on one client's N_c examples: the whole updated model, to send back.

    Args:
      spec: the model.
      weights: the drawn instance B^t.
      x: the client's features, already normalised to [0, 1]
        (:class:`~sage_tfx.dnd.glm.FeatureBounds`).
      y: the client's responses (normalised to [0, 1] for linear models).
      config: γ, C, ε, unit (and δ, C₂ for the gaussian unit).
      noise: noise source; the float-safe samplers (:mod:`sage_tfx.dnd.laplace`'s Laplace,
        :mod:`sage_tfx.dnd.noise`'s Gaussian) unless a seeded one is given for an experiment.
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
    return add_noise(stepped, config, noise)


def check_update_matches_ledger_epsilon(config: ClientConfig, dim: int) -> float:
    """ε that the Laplace sampler's proved bound (Laplace units) or dp_accounting's PLD
    accountant plus the sampler's share (gaussian unit) gives for one update; refuses one above
    what the ledger is charged per update.

    Used to assert that the ε charged per update is the ε the sampler delivers.
    """
    if config.gaussian:
        delta = float(config.delta)
        if vector_noise.sampler_delta(config.noise_multiplier, config.l2_sensitivity, dim) \
                > delta * vector_noise.SAMPLER_DELTA_SHARE:
            raise InvalidPrivacyParameterError(
                f"the Gaussian sampler's tails need more than its share of delta={delta} at {dim} "
                "weights")
        eps = pld_epsilon(config.noise_multiplier, delta * (1 - vector_noise.SAMPLER_DELTA_SHARE)) \
            + vector_noise.SAMPLER_EPSILON
        if eps > float(config.epsilon):
            raise InvalidPrivacyParameterError(
                f"dp_accounting gives ε={eps} for this update, the ledger would be charged "
                f"{config.epsilon}")
        return eps
    charged = config.update_epsilon(dim)
    eps = laplace_noise.sampler_epsilon(config.l1_sensitivity(dim), charged, dim)
    if eps > charged:  # pragma: no cover - laplace_grid calibrates below the charge
        raise InvalidPrivacyParameterError(
            f"the Laplace sampler delivers ε={eps} for this update, the ledger would be charged "
            f"{charged}")
    return eps
