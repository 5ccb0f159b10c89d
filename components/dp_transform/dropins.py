"""DP versions of tf.Transform's moment and bucket analyzers: ``dp_mean_and_var``, ``dp_var``,
``dp_scale_to_z_score``, ``dp_bucketize``.

* ``dp_mean_and_var`` / ``dp_var`` release the mean and variance of the values clipped to public
  bounds from ONE bounded release (:class:`sage_tfx.dp.moments.MeanVarQuery`: count, centred sum
  and shifted sum of squares, ε in thirds), noise drawn once inside Beam as every analyzer here.
* ``dp_scale_to_z_score`` is ``tft.scale_to_z_score`` with that mean and variance: ``(x − mean) /
  sqrt(var)``, and ``x − mean`` where the DP variance is 0 (as tft). ``x`` itself is not clipped
  (the bounds clip what the statistics see; a value outside them gets a z-score beyond the
  bounds', as with tft).
* ``dp_bucketize`` is ``tft.bucketize``: boundaries at the ``i/num_buckets`` DP quantiles (one DP
  histogram of ``num_bins`` bins over the public bounds, :func:`analyzers.dp_quantiles`), applied
  with the stock mapper ``tft.apply_buckets`` (bucket ids 0 .. num_buckets − 1; the number of
  buckets annotated as tft does).

Each takes ``epsilon`` (or None: a share by ``weight``, ``budget`` module doc), ``noise`` (tests
only) and ``name``, like the other DP analyzers.
"""
from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf
import tensorflow_transform as tft

from sage_tfx.components.dp_transform import analyzers
from sage_tfx.dp import moments
from sage_tfx.dp.noise import NoiseSource


def dp_mean_and_var(x: Any, lower: float, upper: float, epsilon: Optional[float] = None, *,
                    weight: float = 1.0, noise: Optional[NoiseSource] = None,
                    name: str = "dp_mean_and_var") -> tuple[tf.Tensor, tf.Tensor]:
    """DP (mean, variance) of ``x`` clipped to [lower, upper], from one release (module doc).

    Returns:
      Two float32 scalar constants: the mean in [lower, upper], the variance in [0, h²].

    Raises:
      InvalidPrivacyParameterError: bad ε or bounds; DPBudgetExceededError; MissingGrantError.
    """
    epsilon = analyzers._epsilon(epsilon, weight, name)  # pylint: disable=protected-access
    query = moments.MeanVarQuery(lower, upper, epsilon)
    both = analyzers._release(query, [analyzers._record_values(x)],  # pylint: disable=protected-access
                              [2], name, noise)
    return both[0], both[1]


def dp_var(x: Any, lower: float, upper: float, epsilon: Optional[float] = None, *,
           weight: float = 1.0, noise: Optional[NoiseSource] = None,
           name: str = "dp_var") -> tf.Tensor:
    """DP replacement of ``tft.var``: the variance of :func:`dp_mean_and_var` (its whole ε)."""
    return dp_mean_and_var(x, lower, upper, epsilon, weight=weight, noise=noise, name=name)[1]


def _output_dtype(x: Any, output_dtype: Optional[tf.DType]) -> tf.DType:
    if output_dtype is not None:
        return output_dtype
    return tf.float64 if x.dtype == tf.float64 else tf.float32


def _map_values(x: Any, fn) -> Any:
    if isinstance(x, tf.SparseTensor):
        return tf.SparseTensor(x.indices, fn(x.values), x.dense_shape)
    if isinstance(x, tf.RaggedTensor):
        return x.with_flat_values(fn(x.flat_values))
    return fn(tf.convert_to_tensor(x))


def dp_scale_to_z_score(x: Any, lower: float, upper: float, epsilon: Optional[float] = None, *,
                        weight: float = 1.0, elementwise: bool = False,
                        output_dtype: Optional[tf.DType] = None,
                        noise: Optional[NoiseSource] = None,
                        name: str = "dp_scale_to_z_score") -> Any:
    """DP replacement of ``tft.scale_to_z_score`` (module doc).

    Raises:
      ValueError: ``elementwise=True`` (one DP release per element is not implemented);
      InvalidPrivacyParameterError: bad ε or bounds; DPBudgetExceededError; MissingGrantError.
    """
    if elementwise:
        raise ValueError("dp_scale_to_z_score(elementwise=True) is not implemented: scale each "
                         "column as its own feature")
    dtype = _output_dtype(x, output_dtype)
    mean, var = dp_mean_and_var(x, lower, upper, epsilon, weight=weight, noise=noise, name=name)
    mean, var = tf.cast(mean, dtype), tf.cast(var, dtype)

    def scale(values: tf.Tensor) -> tf.Tensor:
        centred = tf.cast(values, dtype) - mean
        return tf.where(tf.equal(var, 0), centred, centred / tf.sqrt(var))

    return _map_values(x, scale)


def dp_bucketize(x: Any, num_buckets: int, lower: float, upper: float,
                 epsilon: Optional[float] = None, *, weight: float = 1.0, num_bins: int = 100,
                 elementwise: bool = False, noise: Optional[NoiseSource] = None,
                 name: str = "dp_bucketize") -> Any:
    """DP replacement of ``tft.bucketize``: DP quantile boundaries, then ``tft.apply_buckets``.

    Args:
      x: numeric Tensor or SparseTensor (one value per record).
      num_buckets: the number of buckets (>= 2, as tft: an int).
      lower, upper: public bounds the quantiles are searched in.
      epsilon, weight: the analyzer's ε, or its share.
      num_bins: bins of the DP histogram the quantiles are read from (their resolution).

    Returns:
      int64 bucket ids of the structure of ``x``.

    Raises:
      ValueError: ``num_buckets`` < 2 or not an int, ``elementwise=True``;
      InvalidPrivacyParameterError: bad ε, bounds or num_bins; DPBudgetExceededError;
      MissingGrantError.
    """
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 2:
        raise ValueError(f"num_buckets must be an int >= 2, got {num_buckets!r}")
    if elementwise:
        raise ValueError("dp_bucketize(elementwise=True) is not implemented")
    quantiles = [i / num_buckets for i in range(1, num_buckets)]
    boundaries = analyzers.dp_quantiles(x, quantiles, lower, upper, epsilon, weight=weight,
                                        num_bins=num_bins, noise=noise, name=name)
    return tft.apply_buckets(x, tf.reshape(boundaries, [1, -1]))
