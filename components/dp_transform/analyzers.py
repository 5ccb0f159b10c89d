"""Differentially private tf.Transform analyzers, for use inside a ``preprocessing_fn``.

Sage §3.1, List. 1: a DP training pipeline replaces Transform analyzers (``tft.mean``,
``tft.scale_to_0_1``, a group-by mean) with DP versions and splits the ε that Sage grants the run
across them. Why these analyzers exist at all: a stock Transform analyzer bakes the *exact*
statistic into the saved graph, so adding noise after ``tft.sum`` in the graph is not DP (the
exact value is still in the graph, and each batch would get fresh noise). Here every analyzer is
a ``tft.experimental.ptransform_analyzer`` whose Beam PTransform

1. computes exact additive partial aggregates of each batch (numpy, ``sage_tfx.dp.mechanisms``
   queries),
2. combines them globally, and
3. adds noise (OpenDP, :mod:`sage_tfx.dp.noise`) in one ``Map`` after the global combine,

so the noise is drawn exactly once per Transform run and only the noisy value reaches the
transform graph, as a constant shared by every instance. The queries are the same objects the
numpy reference functions of ``sage_tfx.dp.queries`` run, so for one noise source both give the same
value.

Budget. Every analyzer charges its ε to the active :class:`DPBudget` and raises
:class:`DPBudgetExceededError` before building anything if the charge does not fit. Run a
Transform under a budget by wrapping its ``preprocessing_fn``::

    preprocessing_fn = DPPreprocessingFn(user_preprocessing_fn, epsilon=grant.epsilon)
    ... tft_beam.AnalyzeAndTransformDataset(preprocessing_fn) ...
    event = preprocessing_fn.budget.dp_event()      # what the run spent, for the ledger

The wrapper carries its budget with it: tf.Transform pickles the ``preprocessing_fn`` and traces
it again inside Beam (``CreateSavedModelForAnalyzerInputs``), possibly in worker processes.
``with dp_budget(epsilon) as budget:`` activates a budget for the enclosed code only; it suits
graph construction in tests, or a Transform built and run entirely in the calling thread (Beam's
in-process runner); a trace in another process or thread finds no active budget and fails with
``MissingGrantError``.

tf.Transform traces a ``preprocessing_fn`` several times for one run (five times in TF2 mode,
once with ``force_tf_compat_v1``), each trace in its own graph, while the analyzers of only one
graph run in Beam. A budget therefore accounts spends per trace graph: every trace must spend the
same, and that common spend is what the run costs. One budget accounts for ONE analysis run: use a
fresh ``DPPreprocessingFn`` for every run (running the analysis twice releases twice, and the
budget cannot see that; the Beam counter ``noise_draws`` in :data:`METRICS_NAMESPACE` can).

Common keyword arguments of the analyzers: ``epsilon`` is the analyzer's ε; None (the default)
takes a share of what the analyzers with an explicit ε leave, in proportion to ``weight`` (default
1), fixed by DPTransform's planning trace (``budget`` module doc). ``noise`` is the noise source
the release draws from; None (the default, and the only value components and pipelines use:
``tests/test_layout.py`` forbids seeded noise there) is OpenDP's samplers, safe from Mironov's
floating-point attack. Tests may pass seeded noise (``sage_tfx.dp.noise``) to compare with the
numpy reference (analyzers sharing a seed draw correlated noise, which voids the composition
argument). ``name`` names the analyzer in the graph and in the budget's spends (made unique per
trace).

Privacy assumptions are those of ``sage_tfx.dp.mechanisms``: add-or-remove-one-record adjacency,
one value (and key) per record, public clipping bounds, key domains and bin edges, Laplace noise.
An instance is a record: dense inputs must have shape [batch] or [batch, 1]; for a SparseTensor
(a column with missing values) only the value in column 0 of each row is used, so a record still
contributes at most one value. Group-by keys and values must be dense (fill missing values first).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import apache_beam as beam
import numpy as np
import tensorflow as tf
import tensorflow_transform as tft

from sage_tfx.dp import histograms
from sage_tfx.dp import mechanisms
from sage_tfx.dp import queries
from sage_tfx.dp.noise import NoiseSource
from sage_tfx.components.dp_transform.budget import (DPBudget, DPBudgetExceededError,
                                                     DPPreprocessingFn,
                                                     DPSpend, active_budget, dp_budget)

TensorLike = Union[tf.Tensor, tf.SparseTensor]

# Beam metrics namespace of the analyzers: counter "noise_draws" counts noisy releases (one per
# analyzer per run), so a pipeline result can be checked for "noise drawn exactly once".
METRICS_NAMESPACE = "sage_tfx.dp_transform"
NOISE_DRAWS_COUNTER = "noise_draws"

# --- Beam side: exact aggregate, global combine, noise once -----------------------------------


class _SumAggregates(beam.CombineFn):
    """Adds exact float64 aggregates; an empty input gives the query's zero aggregate."""

    def __init__(self, zero: np.ndarray) -> None:
        super().__init__()
        self._zero = np.asarray(zero, dtype=np.float64)

    def create_accumulator(self) -> np.ndarray:
        return self._zero.copy()

    def add_input(self, accumulator: np.ndarray, element: np.ndarray) -> np.ndarray:
        return accumulator + element

    def merge_accumulators(self, accumulators: Any) -> np.ndarray:
        total = self._zero.copy()
        for acc in accumulators:
            total = total + acc
        return total

    def extract_output(self, accumulator: np.ndarray) -> np.ndarray:
        return accumulator


def _aggregate_batch(batch: Sequence[np.ndarray], query: queries.Query) -> np.ndarray:
    return np.asarray(query.aggregate(*batch), dtype=np.float64)


def _release_total(total: np.ndarray, query: queries.Query, noise: Optional[NoiseSource],
                   shape: Sequence[int], name: str) -> np.ndarray:
    beam.metrics.Metrics.counter(METRICS_NAMESPACE, NOISE_DRAWS_COUNTER).inc()
    beam.metrics.Metrics.counter(METRICS_NAMESPACE, f"{NOISE_DRAWS_COUNTER}/{name}").inc()
    value = query.release(total, noise)  # None: OpenDP, drawn here, on the Beam worker
    return np.asarray(value, dtype=np.float32).reshape(shape)


class _DPRelease(beam.PTransform):
    """Exact partial aggregates → global combine → one noisy release (the only noise draw)."""

    def __init__(self, query: queries.Query, noise: Optional[NoiseSource], shape: Sequence[int],
                 name: str) -> None:
        super().__init__()
        self._query = query
        self._noise = noise
        self._shape = tuple(shape)
        self._name = name

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return (pcoll
                | "ExactPartialAggregates" >> beam.Map(_aggregate_batch, self._query)
                | "ExactTotal" >> beam.CombineGlobally(_SumAggregates(self._query.zero()))
                | "AddNoiseOnce" >> beam.Map(_release_total, self._query, self._noise,
                                             self._shape, self._name))


def _check_noise(noise: Optional[NoiseSource]) -> Optional[NoiseSource]:
    return None if noise is None else mechanisms.noise_source(noise)


def _epsilon(epsilon: Optional[float], weight: float, name: str) -> float:
    """``epsilon`` if given, else the analyzer's share of the active budget (budget module doc).
    """
    if epsilon is not None:
        return epsilon  # checked by the query
    share, _ = active_budget().share(name, weight, False, trace=tf.compat.v1.get_default_graph())
    return share


def _release(query: queries.Query, inputs: Sequence[tf.Tensor], shape: Sequence[int],
             name: str, noise: Optional[NoiseSource]) -> tf.Tensor:
    """Charges the active budget, then adds the query as a ptransform analyzer (float32 output)."""
    noise = _check_noise(noise)
    spend = active_budget().spend(name, query.epsilon, query.dp_event(),
                                  trace=tf.compat.v1.get_default_graph())
    (output,) = tft.experimental.ptransform_analyzer(
        inputs=list(inputs),
        ptransform=_DPRelease(query, noise, shape, spend.name),
        output_dtypes=[tf.float32],
        output_shapes=[list(shape)],
        name=spend.name)
    return output


# --- TF side: one value per record ------------------------------------------------------------


def _record_values(x: TensorLike, what: str = "x") -> tf.Tensor:
    """A 1-D numeric tensor with at most one value per record (see module doc)."""
    if isinstance(x, tf.RaggedTensor):
        raise TypeError(f"{what}: RaggedTensor inputs are not supported; densify them first")
    if isinstance(x, tf.SparseTensor):
        if not (x.dtype.is_floating or x.dtype.is_integer):
            raise TypeError(f"{what} must be numeric, got {x.dtype}")
        if x.shape.rank is not None and x.shape.rank != 2:
            raise ValueError(f"{what}: SparseTensor must have rank 2, got {x.shape}")
        return tf.boolean_mask(x.values, tf.equal(x.indices[:, 1], 0))
    x = tf.convert_to_tensor(x)
    if not (x.dtype.is_floating or x.dtype.is_integer):
        raise TypeError(f"{what} must be numeric, got {x.dtype}")
    return _flatten_one_per_record(x, what)


def _flatten_one_per_record(x: tf.Tensor, what: str) -> tf.Tensor:
    rank = x.shape.rank
    if rank == 1:
        return x
    if rank == 2 and x.shape[1] == 1:
        return tf.reshape(x, [-1])
    raise ValueError(f"{what} must have shape [batch] or [batch, 1] (one value per record), "
                     f"got {x.shape}")


def _record_keys(keys: tf.Tensor, key_domain: tuple[Any, ...]) -> tf.Tensor:
    """A 1-D key tensor matching the domain's kind (int64 or string)."""
    if isinstance(keys, (tf.SparseTensor, tf.RaggedTensor)):
        raise TypeError("group-by keys must be a dense Tensor; fill missing keys first "
                        "(e.g. tf.sparse.to_dense with a default outside the key domain)")
    keys = _flatten_one_per_record(tf.convert_to_tensor(keys), "keys")
    if isinstance(key_domain[0], int):
        if not keys.dtype.is_integer:
            raise TypeError(f"the key domain holds ints but keys are {keys.dtype}")
        return tf.cast(keys, tf.int64)
    if keys.dtype != tf.string:
        raise TypeError(f"the key domain holds strings but keys are {keys.dtype}")
    return keys


def _dense_values(values: tf.Tensor, what: str = "values") -> tf.Tensor:
    if isinstance(values, (tf.SparseTensor, tf.RaggedTensor)):
        raise TypeError(f"group-by {what} must be a dense Tensor; fill missing values first")
    return _record_values(values, what)


# --- analyzers --------------------------------------------------------------------------------


def dp_count(x: TensorLike, epsilon: Optional[float] = None, *, weight: float = 1.0,
             noise: Optional[NoiseSource] = None, name: str = "dp_count") -> tf.Tensor:
    """DP number of records (rows of ``x``; for a SparseTensor, rows with a value).

    Args:
      x: any dense tensor with a batch dimension, or a rank-2 SparseTensor.
      epsilon: ε charged to the active budget (Laplace, sensitivity 1).
      noise: noise source, for tests only; None (default) is OpenDP.
      name: analyzer name (in the graph and in the budget's spends).

    Returns:
      A float32 scalar, the same constant for every instance.

    Raises:
      InvalidPrivacyParameterError: bad ε; DPBudgetExceededError: ε does not fit the budget;
      MissingGrantError: no active budget.
    """
    epsilon = _epsilon(epsilon, weight, name)
    query = queries.CountQuery(epsilon)
    if isinstance(x, tf.SparseTensor):
        present = _record_values(x, "x")
    else:
        present = tf.convert_to_tensor(x)
        if present.shape.rank == 0:
            raise ValueError("x must have a batch dimension")
        present = tf.zeros(tf.shape(present)[:1], tf.float32)
    return _release(query, [present], [], name, noise)


def dp_sum(x: TensorLike, lower: float, upper: float, epsilon: Optional[float] = None, *,
           weight: float = 1.0, noise: Optional[NoiseSource] = None,
           name: str = "dp_sum") -> tf.Tensor:
    """DP sum of ``x`` clipped to the public bounds [lower, upper] (NaN values are ignored).

    Laplace noise of sensitivity max(|lower|, |upper|).

    Returns:
      A float32 scalar constant.

    Raises:
      InvalidPrivacyParameterError: bad ε or bounds; DPBudgetExceededError; MissingGrantError.
    """
    epsilon = _epsilon(epsilon, weight, name)
    query = queries.SumQuery(lower, upper, epsilon)
    return _release(query, [_record_values(x)], [], name, noise)


def dp_mean(x: TensorLike, lower: float, upper: float, epsilon: Optional[float] = None, *,
            weight: float = 1.0, noise: Optional[NoiseSource] = None,
            name: str = "dp_mean") -> tf.Tensor:
    """DP mean of ``x`` clipped to [lower, upper]: noisy sum / noisy count (Sage List. 1).

    ε is split in half between the (midpoint-centered) sum and the count.

    Returns:
      A float32 scalar constant in [lower, upper].

    Raises:
      InvalidPrivacyParameterError: bad ε or bounds; DPBudgetExceededError; MissingGrantError.
    """
    epsilon = _epsilon(epsilon, weight, name)
    query = queries.MeanQuery(lower, upper, epsilon)
    return _release(query, [_record_values(x)], [], name, noise)


def dp_group_by_count(keys: tf.Tensor, key_domain: Sequence[Any],
                      epsilon: Optional[float] = None, *, weight: float = 1.0,
                      noise: Optional[NoiseSource] = None,
                      name: str = "dp_group_by_count") -> tf.Tensor:
    """DP number of records per key of the public ``key_domain`` (parallel composition).

    Keys outside the domain are dropped; every domain key is released, even without records.

    Args:
      keys: dense int or string tensor, one key per record.
      key_domain: the public keys (all ints or all strings), in output order.
      epsilon: ε charged to the active budget (vector Laplace, L1 sensitivity 1).

    Returns:
      A float32 vector of shape [len(key_domain)].

    Raises:
      InvalidPrivacyParameterError: bad ε or domain; DPBudgetExceededError; MissingGrantError.
    """
    epsilon = _epsilon(epsilon, weight, name)
    query = queries.GroupByCountQuery(tuple(key_domain), epsilon)
    return _release(query, [_record_keys(keys, query.key_domain)], [len(query.key_domain)],
                    name, noise)


def dp_group_by_sum(keys: tf.Tensor, values: tf.Tensor, key_domain: Sequence[Any], lower: float,
                    upper: float, epsilon: Optional[float] = None, *, weight: float = 1.0,
                    noise: Optional[NoiseSource] = None,
                    name: str = "dp_group_by_sum") -> tf.Tensor:
    """DP sum per key of the public ``key_domain`` of values clipped to [lower, upper].

    Returns:
      A float32 vector of shape [len(key_domain)].

    Raises:
      InvalidPrivacyParameterError: bad ε, bounds or domain; DPBudgetExceededError;
      MissingGrantError.
    """
    epsilon = _epsilon(epsilon, weight, name)
    query = queries.GroupBySumQuery(tuple(key_domain), lower, upper, epsilon)
    return _release(query, [_record_keys(keys, query.key_domain), _dense_values(values)],
                    [len(query.key_domain)], name, noise)


def dp_group_by_mean_per_key(keys: tf.Tensor, values: tf.Tensor, key_domain: Sequence[Any],
                             lower: float, upper: float, epsilon: Optional[float] = None, *,
                             weight: float = 1.0, noise: Optional[NoiseSource] = None,
                             name: str = "dp_group_by_mean") -> tf.Tensor:
    """DP mean per key of the public ``key_domain`` of values clipped to [lower, upper].

    Sage List. 1 ``dp_group_by_mean`` before its final gather: per-key noisy (centered) sums
    divided by per-key noisy counts, ε split in half between the two vectors.

    Returns:
      A float32 vector of shape [len(key_domain)], each entry in [lower, upper].

    Raises:
      InvalidPrivacyParameterError: bad ε, bounds or domain; DPBudgetExceededError;
      MissingGrantError.
    """
    epsilon = _epsilon(epsilon, weight, name)
    query = queries.GroupByMeanQuery(tuple(key_domain), lower, upper, epsilon)
    return _release(query, [_record_keys(keys, query.key_domain), _dense_values(values)],
                    [len(query.key_domain)], name, noise)


def dp_group_by_mean(keys: tf.Tensor, values: tf.Tensor, key_domain: Sequence[Any],
                     lower: float, upper: float, epsilon: Optional[float] = None, *,
                     weight: float = 1.0, default_value: Optional[float] = None,
                     noise: Optional[NoiseSource] = None,
                     name: str = "dp_group_by_mean") -> tf.Tensor:
    """Each instance's key's DP mean value: Sage List. 1 ``dp_group_by_mean``.

    E.g. the mean speed of rides in the ride's hour of day:
    ``dp_group_by_mean(inputs["hour"], speed, range(24), 0.0, 1.0, epsilon)``.

    Args:
      keys: dense int or string tensor, one key per record.
      values: dense numeric tensor aligned with ``keys``.
      key_domain: the public keys.
      lower, upper: public clipping bounds of ``values``.
      epsilon: ε charged to the active budget.
      default_value: the feature for keys outside the domain; default (lower + upper) / 2.
      noise: noise source, for tests only; None (default) is OpenDP.
      name: analyzer name.

    Returns:
      A float32 tensor of the shape of ``keys``.

    Raises:
      InvalidPrivacyParameterError: bad ε, bounds or domain; DPBudgetExceededError;
      MissingGrantError.
    """
    epsilon = _epsilon(epsilon, weight, name)
    query = queries.GroupByMeanQuery(tuple(key_domain), lower, upper, epsilon)
    if default_value is None:
        default_value = (query.lower + query.upper) / 2.0
    keys_tensor = tf.convert_to_tensor(keys) if not isinstance(
        keys, (tf.SparseTensor, tf.RaggedTensor)) else keys
    flat_keys = _record_keys(keys_tensor, query.key_domain)
    means = _release(query, [flat_keys, _dense_values(values)], [len(query.key_domain)], name,
                     noise)
    domain = tf.constant(list(query.key_domain),
                         dtype=tf.int64 if isinstance(query.key_domain[0], int) else tf.string)
    matches = tf.equal(tf.expand_dims(flat_keys, 1), tf.expand_dims(domain, 0))
    in_domain = tf.reduce_any(matches, axis=1)
    index = tf.argmax(tf.cast(matches, tf.int32), axis=1)
    per_record = tf.where(in_domain, tf.gather(means, index),
                          tf.constant(default_value, tf.float32))
    return tf.reshape(per_record, tf.shape(keys_tensor))


def dp_histogram(x: TensorLike, bin_edges: Sequence[float], epsilon: Optional[float] = None, *,
                 weight: float = 1.0, noise: Optional[NoiseSource] = None,
                 name: str = "dp_histogram") -> tf.Tensor:
    """DP counts per public bin [e_i, e_{i+1}) (last bin closed; outside values clipped in).

    Returns:
      A float32 vector of shape [len(bin_edges) - 1].

    Raises:
      InvalidPrivacyParameterError: bad ε or edges; DPBudgetExceededError; MissingGrantError.
    """
    epsilon = _epsilon(epsilon, weight, name)
    query = histograms.HistogramQuery(histograms.check_bin_edges(bin_edges), epsilon)
    return _release(query, [_record_values(x)], [len(query.bin_edges) - 1], name, noise)


def dp_min_max(x: TensorLike, lower: float, upper: float, epsilon: Optional[float] = None, *,
               weight: float = 1.0, num_bins: int = 100, failure_probability: float = 0.05,
               noise: Optional[NoiseSource] = None,
               name: str = "dp_min_max") -> tuple[tf.Tensor, tf.Tensor]:
    """DP approximate (min, max) of ``x`` clipped to [lower, upper], from a DP histogram.

    See ``sage_tfx.dp.histograms.MinMaxQuery``: ``lower <= min < max <= upper``, exact to a bin
    width where the data near the extremes is dense enough to beat the noise threshold.

    Returns:
      Two float32 scalar constants.

    Raises:
      InvalidPrivacyParameterError: bad ε, bounds, num_bins or failure_probability;
      DPBudgetExceededError; MissingGrantError.
    """
    epsilon = _epsilon(epsilon, weight, name)
    query = histograms.MinMaxQuery(lower, upper, epsilon, num_bins, failure_probability)
    both = _release(query, [_record_values(x)], [2], name, noise)
    return both[0], both[1]


def dp_scale_to_0_1(x: TensorLike, lower: float, upper: float, epsilon: Optional[float] = None, *,
                    weight: float = 1.0, num_bins: int = 100, failure_probability: float = 0.05,
                    noise: Optional[NoiseSource] = None,
                    name: str = "dp_scale_to_0_1") -> TensorLike:
    """DP replacement of ``tft.scale_to_0_1``: scales ``x`` with a DP (min, max), clipping.

    ``tft.scale_to_0_1`` uses the exact min and max, which are not DP. Here the min and max come
    from :func:`dp_min_max`; values outside them are clipped, so outputs lie in [0, 1].

    Returns:
      float32 of the structure of ``x`` (a SparseTensor's values are scaled).

    Raises:
      InvalidPrivacyParameterError: bad ε, bounds or histogram parameters;
      DPBudgetExceededError; MissingGrantError.
    """
    low, high = dp_min_max(x, lower, upper, epsilon, weight=weight, num_bins=num_bins,
                           failure_probability=failure_probability, noise=noise, name=name)

    def scale(values: tf.Tensor) -> tf.Tensor:
        values = tf.cast(values, tf.float32)
        return (tf.clip_by_value(values, low, high) - low) / (high - low)

    if isinstance(x, tf.SparseTensor):
        return tf.SparseTensor(x.indices, scale(x.values), x.dense_shape)
    return scale(tf.convert_to_tensor(x))


def dp_quantiles(x: TensorLike, quantiles: Sequence[float], lower: float, upper: float,
                 epsilon: Optional[float] = None, *, weight: float = 1.0, num_bins: int = 100,
                 noise: Optional[NoiseSource] = None,
                 name: str = "dp_quantiles") -> tf.Tensor:
    """DP quantiles of ``x`` clipped to [lower, upper], all from one DP histogram (ε once).

    Returns:
      A float32 vector of shape [len(quantiles)], non-decreasing.

    Raises:
      InvalidPrivacyParameterError: bad ε, bounds or num_bins; ValueError: bad quantiles;
      DPBudgetExceededError; MissingGrantError.
    """
    epsilon = _epsilon(epsilon, weight, name)
    query = histograms.QuantilesQuery(tuple(quantiles), lower, upper, epsilon, num_bins)
    return _release(query, [_record_values(x)], [len(query.quantiles)], name, noise)


# The analyzers built on these (``dropins``, ``vocabulary``) are re-exported lazily (they import
# this module): with the budget API (defined in ``budget``), this is the one module a
# ``preprocessing_fn`` of dp_* analyzers imports.
_REEXPORTS = {
    "dp_mean_and_var": "dropins", "dp_var": "dropins", "dp_scale_to_z_score": "dropins",
    "dp_bucketize": "dropins", "dp_vocabulary": "vocabulary",
    "dp_compute_and_apply_vocabulary": "vocabulary",
}


def __getattr__(name: str) -> Any:  # PEP 562
    if name in _REEXPORTS:
        import importlib
        module = importlib.import_module(f"sage_tfx.components.dp_transform.{_REEXPORTS[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DPBudget", "DPBudgetExceededError", "DPPreprocessingFn", "DPSpend", "METRICS_NAMESPACE",
    "NOISE_DRAWS_COUNTER", "active_budget", "dp_budget", "dp_count", "dp_group_by_count",
    "dp_group_by_mean", "dp_group_by_mean_per_key", "dp_group_by_sum", "dp_histogram",
    "dp_mean", "dp_min_max", "dp_quantiles", "dp_scale_to_0_1", "dp_sum", *_REEXPORTS,
]
