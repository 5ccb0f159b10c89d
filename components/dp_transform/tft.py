"""``tensorflow_transform`` with DP analyzers under tft's own names: a conversion that is a rename.

A TFX user's ``preprocessing_fn`` becomes DP by changing its import and adding the privacy
parameters of its analyzers, not its logic::

    # import tensorflow_transform as tft
    from sage_tfx.components.dp_transform import tft

    outputs["fare_xf"] = tft.scale_to_z_score(fare, lower=0.0, upper=200.0)       # + bounds
    outputs["company_xf"] = tft.compute_and_apply_vocabulary(company, top_k=1000,
                                                             num_oov_buckets=10)  # unchanged
    outputs["lat_xf"] = tft.bucketize(lat, 10, lower=41.6, upper=42.1)            # + bounds
    outputs["hour_xf"] = tft.apply_buckets(hour, [[6, 12, 18]])                   # a mapper

Rules:

* **DP analyzers** — ``mean``, ``var``, ``sum``, ``size``, ``min``, ``max``, ``quantiles``,
  ``scale_to_z_score``, ``scale_to_0_1``, ``bucketize`` take the stock arguments plus public
  bounds ``lower=`` / ``upper=`` (``size`` needs none); ``vocabulary`` and
  ``compute_and_apply_vocabulary`` need none (DP partition selection; ``max_partitions_contributed``
  bounds the distinct tokens counted per record, default 1). Their ε is a share of the plan's
  ``transform`` part by ``share=`` (relative weight, default 1), or ``dp_epsilon=`` (and, for the
  vocabularies, ``dp_delta=``) given explicitly; the vocabularies share the part's δ (a plan that
  converts a vocabulary needs ``PlanPart("transform", epsilon, delta)``).
* **Without its bounds**, a numeric analyzer is the stock tft one: DPTransform's audit then allows
  it on a feature declared in ``public_features`` and refuses it on any other, listing every such
  analyzer, its features and the bounds it needs, in one message before anything is charged.
* **Everything else** (``apply_buckets``, ``apply_vocabulary``, ``hash_strings``,
  ``sparse_tensor_to_dense_with_shape``, ``experimental`` ...) is tft's own: mappers pass through
  unchanged, and a stock analyzer reached through one is audited like any other.

The analyzers are those of :mod:`~sage_tfx.components.dp_transform.analyzers`,
:mod:`~sage_tfx.components.dp_transform.dropins` and
:mod:`~sage_tfx.components.dp_transform.vocabulary`: exact partial aggregates in Beam, noise once
per analyzer after the global combine, spends charged to the run's budget.
"""
from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf
import tensorflow_transform as _tft

from sage_tfx.components.dp_transform import analyzers as _dp
from sage_tfx.components.dp_transform import dropins as _dropins
from sage_tfx.components.dp_transform import vocabulary as _vocabulary

# The names this module defines; every other attribute is tensorflow_transform's.
DP_ANALYZERS = ("mean", "var", "sum", "size", "min", "max", "quantiles", "scale_to_z_score",
                "scale_to_0_1", "bucketize", "vocabulary", "compute_and_apply_vocabulary")


def __getattr__(name: str) -> Any:  # PEP 562: tft's mappers and the rest pass through
    return getattr(_tft, name)


def _bounded(what: str, lower: Optional[float], upper: Optional[float]) -> bool:
    """True for the DP path (both bounds), False for the stock one (neither)."""
    if (lower is None) != (upper is None):
        raise ValueError(f"tft.{what}: give both public bounds lower= and upper= (the DP "
                         f"analyzer), or neither (the stock analyzer, public features only)")
    return lower is not None


def _scalar_only(what: str, reduce_instance_dims: bool) -> None:
    if not reduce_instance_dims:
        raise ValueError(f"tft.{what}(reduce_instance_dims=False) has no DP version here: one "
                         "DP statistic per element is not implemented")


def _cast(value: tf.Tensor, output_dtype: Optional[tf.DType]) -> tf.Tensor:
    return tf.cast(value, output_dtype) if output_dtype is not None else value


def _no_approximation(what: str, epsilon: Optional[float], weights: Any) -> None:
    if epsilon is not None:
        raise ValueError(f"tft.{what}: the stock approximation error epsilon={epsilon!r} does not "
                         "apply to DP quantiles (a DP histogram): set num_bins=, and the privacy "
                         "share with share= or dp_epsilon=")
    if weights is not None:
        raise ValueError(f"tft.{what}: weights have no DP version here")


def mean(x: Any, reduce_instance_dims: bool = True, name: Optional[str] = None,
         output_dtype: Optional[tf.DType] = None, *, lower: Optional[float] = None,
         upper: Optional[float] = None, share: float = 1.0,
         dp_epsilon: Optional[float] = None) -> Any:
    """``tft.mean``; DP (``dp_mean``) with public ``lower``/``upper``."""
    if not _bounded("mean", lower, upper):
        return _tft.mean(x, reduce_instance_dims, name, output_dtype)
    _scalar_only("mean", reduce_instance_dims)
    return _cast(_dp.dp_mean(x, lower, upper, dp_epsilon, weight=share, name=name or "mean"),
                 output_dtype)


def var(x: Any, reduce_instance_dims: bool = True, name: Optional[str] = None,
        output_dtype: Optional[tf.DType] = None, *, lower: Optional[float] = None,
        upper: Optional[float] = None, share: float = 1.0,
        dp_epsilon: Optional[float] = None) -> Any:
    """``tft.var``; DP (``dp_var``: one bounded release) with public ``lower``/``upper``."""
    if not _bounded("var", lower, upper):
        return _tft.var(x, reduce_instance_dims, name, output_dtype)
    _scalar_only("var", reduce_instance_dims)
    return _cast(_dropins.dp_var(x, lower, upper, dp_epsilon, weight=share, name=name or "var"),
                 output_dtype)


def sum(x: Any, reduce_instance_dims: bool = True, name: Optional[str] = None, *,  # noqa: A001
        lower: Optional[float] = None, upper: Optional[float] = None, share: float = 1.0,
        dp_epsilon: Optional[float] = None) -> Any:
    """``tft.sum``; DP (``dp_sum``) with public ``lower``/``upper``."""
    if not _bounded("sum", lower, upper):
        return _tft.sum(x, reduce_instance_dims, name)
    _scalar_only("sum", reduce_instance_dims)
    return _dp.dp_sum(x, lower, upper, dp_epsilon, weight=share, name=name or "sum")


def size(x: Any, reduce_instance_dims: bool = True, name: Optional[str] = None, *,
         share: float = 1.0, dp_epsilon: Optional[float] = None) -> Any:
    """``tft.size`` as a DP count of records (``dp_count``; needs no bounds)."""
    _scalar_only("size", reduce_instance_dims)
    return _dp.dp_count(x, dp_epsilon, weight=share, name=name or "size")


def _min_max(what: str, index: int, x: Any, reduce_instance_dims: bool, name: Optional[str],
             lower: Optional[float], upper: Optional[float], share: float,
             dp_epsilon: Optional[float]) -> Any:
    if not _bounded(what, lower, upper):
        return getattr(_tft, what)(x, reduce_instance_dims, name)
    _scalar_only(what, reduce_instance_dims)
    return _dp.dp_min_max(x, lower, upper, dp_epsilon, weight=share, name=name or what)[index]


def min(x: Any, reduce_instance_dims: bool = True, name: Optional[str] = None, *,  # noqa: A001
        lower: Optional[float] = None, upper: Optional[float] = None, share: float = 1.0,
        dp_epsilon: Optional[float] = None) -> Any:
    """``tft.min``; DP (``dp_min_max``, its own release) with public ``lower``/``upper``."""
    return _min_max("min", 0, x, reduce_instance_dims, name, lower, upper, share, dp_epsilon)


def max(x: Any, reduce_instance_dims: bool = True, name: Optional[str] = None, *,  # noqa: A001
        lower: Optional[float] = None, upper: Optional[float] = None, share: float = 1.0,
        dp_epsilon: Optional[float] = None) -> Any:
    """``tft.max``; DP (``dp_min_max``, its own release) with public ``lower``/``upper``."""
    return _min_max("max", 1, x, reduce_instance_dims, name, lower, upper, share, dp_epsilon)


def quantiles(x: Any, num_buckets: int, epsilon: Optional[float] = None, weights: Any = None,
              reduce_instance_dims: bool = True, name: Optional[str] = None, *,
              lower: Optional[float] = None, upper: Optional[float] = None, num_bins: int = 100,
              share: float = 1.0, dp_epsilon: Optional[float] = None) -> Any:
    """``tft.quantiles`` (boundaries of shape [1, num_buckets − 1]); DP with public bounds."""
    if not _bounded("quantiles", lower, upper):
        return _tft.quantiles(x, num_buckets, epsilon, weights, reduce_instance_dims, name)
    _no_approximation("quantiles", epsilon, weights)
    _scalar_only("quantiles", reduce_instance_dims)
    qs = [i / num_buckets for i in range(1, num_buckets)]
    out = _dp.dp_quantiles(x, qs, lower, upper, dp_epsilon, weight=share, num_bins=num_bins,
                           name=name or "quantiles")
    return tf.reshape(out, [1, -1])


def scale_to_z_score(x: Any, elementwise: bool = False, name: Optional[str] = None,
                     output_dtype: Optional[tf.DType] = None, *, lower: Optional[float] = None,
                     upper: Optional[float] = None, share: float = 1.0,
                     dp_epsilon: Optional[float] = None) -> Any:
    """``tft.scale_to_z_score``; DP (``dp_scale_to_z_score``) with public ``lower``/``upper``."""
    if not _bounded("scale_to_z_score", lower, upper):
        return _tft.scale_to_z_score(x, elementwise, name, output_dtype)
    return _dropins.dp_scale_to_z_score(x, lower, upper, dp_epsilon, weight=share,
                                        elementwise=elementwise, output_dtype=output_dtype,
                                        name=name or "scale_to_z_score")


def scale_to_0_1(x: Any, elementwise: bool = False, name: Optional[str] = None, *,
                 lower: Optional[float] = None, upper: Optional[float] = None,
                 share: float = 1.0, dp_epsilon: Optional[float] = None) -> Any:
    """``tft.scale_to_0_1``; DP (``dp_scale_to_0_1``) with public ``lower``/``upper``."""
    if not _bounded("scale_to_0_1", lower, upper):
        return _tft.scale_to_0_1(x, elementwise, name)
    if elementwise:
        raise ValueError("tft.scale_to_0_1(elementwise=True) has no DP version here")
    return _dp.dp_scale_to_0_1(x, lower, upper, dp_epsilon, weight=share,
                               name=name or "scale_to_0_1")


def bucketize(x: Any, num_buckets: int, epsilon: Optional[float] = None, weights: Any = None,
              elementwise: bool = False, name: Optional[str] = None, *,
              lower: Optional[float] = None, upper: Optional[float] = None, num_bins: int = 100,
              share: float = 1.0, dp_epsilon: Optional[float] = None) -> Any:
    """``tft.bucketize``; DP (``dp_bucketize``: DP quantiles) with public ``lower``/``upper``."""
    if not _bounded("bucketize", lower, upper):
        return _tft.bucketize(x, num_buckets, epsilon, weights, elementwise, name)
    _no_approximation("bucketize", epsilon, weights)
    return _dropins.dp_bucketize(x, num_buckets, lower, upper, dp_epsilon, weight=share,
                                 num_bins=num_bins, elementwise=elementwise,
                                 name=name or "bucketize")


def vocabulary(x: Any, *, top_k: Optional[int] = None,
               frequency_threshold: Optional[float] = None, vocab_filename: Optional[str] = None,
               store_frequency: bool = False, fingerprint_shuffle: bool = False,
               file_format: str = "text", name: Optional[str] = None,
               max_partitions_contributed: int = 1, share: float = 1.0,
               dp_epsilon: Optional[float] = None, dp_delta: Optional[float] = None,
               **unsupported: Any) -> Any:
    """``tft.vocabulary`` as DP partition selection (``dp_vocabulary``)."""
    return _vocabulary.dp_vocabulary(
        x, epsilon=dp_epsilon, delta=dp_delta, weight=share,
        max_partitions_contributed=max_partitions_contributed, top_k=top_k,
        frequency_threshold=frequency_threshold, vocab_filename=vocab_filename,
        store_frequency=store_frequency, fingerprint_shuffle=fingerprint_shuffle,
        file_format=file_format, name=name or "vocabulary", **unsupported)


def compute_and_apply_vocabulary(x: Any, *, default_value: Any = -1, top_k: Optional[int] = None,
                                 frequency_threshold: Optional[float] = None,
                                 num_oov_buckets: int = 0, vocab_filename: Optional[str] = None,
                                 file_format: str = "text", name: Optional[str] = None,
                                 max_partitions_contributed: int = 1, share: float = 1.0,
                                 dp_epsilon: Optional[float] = None,
                                 dp_delta: Optional[float] = None, **unsupported: Any) -> Any:
    """``tft.compute_and_apply_vocabulary`` with a DP vocabulary (then tft's own lookup)."""
    return _vocabulary.dp_compute_and_apply_vocabulary(
        x, default_value=default_value, top_k=top_k, frequency_threshold=frequency_threshold,
        num_oov_buckets=num_oov_buckets, vocab_filename=vocab_filename, epsilon=dp_epsilon,
        delta=dp_delta, weight=share, max_partitions_contributed=max_partitions_contributed,
        file_format=file_format, name=name or "compute_and_apply_vocabulary", **unsupported)
