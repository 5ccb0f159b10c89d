"""DP mean and variance from one bounded release (for a DP ``tft.scale_to_z_score``).

``tft.scale_to_z_score`` centres and scales a feature by its exact mean and variance, which are
not DP. :class:`MeanVarQuery` releases both from one bounded release: the values clipped to the
public ``[lower, upper]`` and centred on its midpoint m (half-width h), one Laplace vector of

* the count (sensitivity 1),
* the centred sum Σ(x − m) (sensitivity h),
* the shifted centred sum of squares Σ((x − m)² − h²/2) (each term in [−h²/2, h²/2]:
  sensitivity h²/2, half that of the unshifted sum),

with ε split in three equal shares (``split_budget``: the shares add up to ε exactly). Then, as
post-processing: n = max(noisy count, 1), mean = m + clip(S₁/n, −h, h) and
var = clip((S₂ + n·h²/2)/n − (S₁/n)², 0, h²). The whole release is ε-DP (basic composition of the
three Laplace mechanisms; its DpEvent composes their LaplaceDpEvents).

Assumptions as :mod:`sage_tfx.dp.queries`: add-or-remove-one-record adjacency, one value per
record, public bounds, NaN values dropped. This module imports no TensorFlow.
"""
from __future__ import annotations

import dataclasses

import dp_accounting
import numpy as np

from sage_tfx.dp.mechanisms import ArrayLike, LaplaceMechanism, Value, split_budget
from sage_tfx.dp.noise import NoiseSource
from sage_tfx.dp.queries import DPRelease, MeanQuery, record_values

__all__ = ["MeanVarQuery", "dp_mean_and_var"]


@dataclasses.dataclass(frozen=True)
class MeanVarQuery(MeanQuery):
    """Mean and variance of values clipped to [lower, upper], from one ε-DP release (module doc).

    The fields and their checks are :class:`~sage_tfx.dp.queries.MeanQuery`'s; the aggregate,
    the release and the event are its own.
    """

    @property
    def midpoint(self) -> float:
        """The centre m of the bounds."""
        return (self.lower + self.upper) / 2.0

    @property
    def half_width(self) -> float:
        """h = (upper − lower) / 2."""
        return (self.upper - self.lower) / 2.0

    @property
    def mechanisms(self) -> tuple[LaplaceMechanism, LaplaceMechanism, LaplaceMechanism]:
        """The Laplace mechanisms of the count, the centred sum and the shifted sum of squares."""
        shares = split_budget(self.epsilon, 0.0, [1, 1, 1])
        h = self.half_width
        return (LaplaceMechanism(shares[0].epsilon, 1.0),
                LaplaceMechanism(shares[1].epsilon, h),
                LaplaceMechanism(shares[2].epsilon, h * h / 2.0))

    def zero(self) -> np.ndarray:
        """Zero (count, centred sum, shifted sum of squares)."""
        return np.zeros(3)

    def aggregate(self, *columns: np.ndarray) -> np.ndarray:
        """The exact count, centred sum and shifted centred sum of squares of the clipped values."""
        x = record_values(columns[0])
        centred = np.clip(x[~np.isnan(x)], self.lower, self.upper) - self.midpoint
        shift = self.half_width ** 2 / 2.0
        return np.array([float(centred.size), centred.sum(), (centred ** 2 - shift).sum()])

    def noisy_aggregates(self, total: np.ndarray, noise: NoiseSource | None = None) -> np.ndarray:
        """The three Laplace channels of the release (before post-processing)."""
        return np.array([float(m.add_noise(float(t), noise))
                         for m, t in zip(self.mechanisms, np.asarray(total, dtype=np.float64))])

    def finish(self, noisy: np.ndarray) -> np.ndarray:
        """[mean, variance] from the noisy channels (post-processing, see module doc)."""
        h = self.half_width
        n = max(float(noisy[0]), 1.0)
        centred_mean = float(np.clip(noisy[1] / n, -h, h))
        second = (float(noisy[2]) + n * h * h / 2.0) / n
        var = float(np.clip(second - centred_mean ** 2, 0.0, h * h))
        return np.array([self.midpoint + centred_mean, var])

    def release(self, total: np.ndarray, noise: NoiseSource | None = None) -> Value:
        """[mean, variance], noise drawn once per channel."""
        return self.finish(self.noisy_aggregates(total, noise))

    def dp_event(self) -> dp_accounting.DpEvent:
        """The composition of the three channels' Laplace events."""
        return dp_accounting.ComposedDpEvent([m.dp_event() for m in self.mechanisms])


def dp_mean_and_var(x: ArrayLike, lower: float, upper: float, epsilon: float, *,
                    noise: NoiseSource | None = None) -> DPRelease:
    """DP [mean, variance] of ``x`` clipped to [lower, upper] (:class:`MeanVarQuery`).

    Raises:
      InvalidPrivacyParameterError: bad ε or bounds.
    """
    return MeanVarQuery(lower, upper, epsilon).run(x, noise=noise)
