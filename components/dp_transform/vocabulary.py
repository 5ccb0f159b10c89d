"""DP vocabularies by partition selection: ``dp_vocabulary``, ``dp_compute_and_apply_vocabulary``.

``tft.vocabulary`` writes every distinct value of a feature, ordered by exact frequency, into the
transform graph: not DP (a value held by one record is in it). Here the vocabulary is a DP
partition selection (:mod:`sage_tfx.dp.partition_selection`; Desfontaines et al., PoPETs 2022):

1. on the Beam workers, each batch's records are bounded to ``max_partitions_contributed`` (m)
   distinct tokens each (a uniform sample of a record's tokens when it has more; a dense
   ``[batch]`` feature has one per record) and counted exactly: the number of records holding
   each token;
2. the counts are combined globally;
3. one ``Map`` releases them once: OpenDP's Laplace thresholding keeps the tokens whose noisy
   count passes the threshold calibrated to the analyzer's (ε, δ), with their noisy counts; the
   kept tokens are ordered by noisy count (ties: reverse lexicographic, as tft), cut to ``top_k``
   and ``frequency_threshold`` (post-processing of the noisy counts), and written as the
   vocabulary file (an asset of the transform graph, like tft's).

As ``tft.vocabulary``, ``text`` vocabularies drop empty tokens and tokens with ``\\n`` / ``\\r``;
integer features are written as decimal strings; an empty vocabulary holds tft's dummy token, so
the lookup table initializes. Frequencies count *records* holding a token (tft counts
occurrences; for one token per record they agree). ``store_frequency`` writes the noisy counts,
rounded (post-processing). Not supported (refused with a message): ``weights``, ``labels``
(mutual information), coverage arms (``key_fn``), ``reserved_tokens``, ``fingerprint_shuffle``,
``file_format='tfrecord_gzip'``.

Budget: the analyzer spends (ε, δ) of the active budget (``budget`` module doc): explicit
``epsilon`` and ``delta`` together, or neither (a share by ``weight``; δ is shared among the DP
vocabularies). The charge is basic (ε, δ): an rdp plan cannot pay for it.
"""
from __future__ import annotations

import os
import re
import uuid
from collections import Counter
from typing import Any, Optional, Sequence

import apache_beam as beam
import numpy as np
import tensorflow as tf
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
from tensorflow_transform import analyzers as tft_analyzers

from sage_tfx.components.dp_transform import analyzers as dp_analyzers
from sage_tfx.components.dp_transform.budget import active_budget
from sage_tfx.dp import partition_selection
from sage_tfx.dp.noise import NoiseSource

# tft drops these tokens from text vocabularies (tft.analyzers' filter regex).
_TEXT_UNSAFE = re.compile(rb"^$|[\n\r]")
# tft's entry of an empty vocabulary (``get_empy_vocabulary_dummy_value``).
_EMPTY_STRING_ENTRY = tft_analyzers.get_empy_vocabulary_dummy_value(tf.string)[1]
_EMPTY_INT_ENTRY = tft_analyzers.get_empy_vocabulary_dummy_value(tf.int64)[1]

_UNSUPPORTED = ("weights", "labels", "key_fn", "coverage_top_k", "coverage_frequency_threshold",
                "reserved_tokens", "use_adjusted_mutual_info", "min_diff_from_avg")


class _SumCounts(beam.CombineFn):
    """Adds exact token counts (``Counter`` s)."""

    def create_accumulator(self) -> Counter:
        return Counter()

    def add_input(self, accumulator: Counter, element: Counter) -> Counter:
        accumulator.update(element)
        return accumulator

    def merge_accumulators(self, accumulators: Any) -> Counter:
        total: Counter = Counter()
        for acc in accumulators:
            total.update(acc)
        return total

    def extract_output(self, accumulator: Counter) -> Counter:
        return accumulator


def _token(value: Any, is_string: bool) -> bytes:
    return bytes(value) if is_string else str(int(value)).encode("ascii")


def _batch_counts(batch: Sequence[np.ndarray], max_partitions: int, is_string: bool,
                  text: bool) -> Counter:
    """Exact per-token record counts of one batch, each record bounded to m distinct tokens."""
    values, rows = batch
    per_record: dict = {}
    for value, row in zip(values.tolist(), rows.tolist()):
        token = _token(value, is_string)
        if text and is_string and _TEXT_UNSAFE.search(token):
            continue
        per_record.setdefault(row, []).append(token)
    return partition_selection.bounded_counts(per_record.values(), max_partitions)


class _DPVocabularyRelease(tft_beam.experimental.PTransformAnalyzer):
    """Bounded exact counts → global combine → one partition selection, written as a vocabulary.
    """

    def __init__(self, selection: partition_selection.PartitionSelection,
                 noise: Optional[NoiseSource], name: str, vocab_filename: str, *,
                 top_k: Optional[int], frequency_threshold: Optional[float],
                 store_frequency: bool, is_string: bool) -> None:
        super().__init__()
        self._query = selection  # the audit compares it with the budget's charge
        self._noise = noise
        self._name = name
        self._vocab_filename = vocab_filename
        self._top_k = top_k
        self._frequency_threshold = frequency_threshold
        self._store_frequency = store_frequency
        self._is_string = is_string

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return (pcoll
                | "BoundedExactCounts" >> beam.Map(
                    _batch_counts, self._query.max_partitions_contributed, self._is_string, True)
                | "ExactCounts" >> beam.CombineGlobally(_SumCounts())
                | "SelectPartitionsOnce" >> beam.Map(_release_vocabulary, self,
                                                     self.base_temp_dir))


def _release_vocabulary(counts: Counter, release: _DPVocabularyRelease, temp_dir: str) -> bytes:
    beam.metrics.Metrics.counter(dp_analyzers.METRICS_NAMESPACE,
                                 dp_analyzers.NOISE_DRAWS_COUNTER).inc()
    beam.metrics.Metrics.counter(dp_analyzers.METRICS_NAMESPACE,
                                 f"{dp_analyzers.NOISE_DRAWS_COUNTER}/{release._name}").inc()
    noisy = release._query.release(counts, release._noise)  # None: OpenDP, drawn here
    kept = partition_selection.order_and_filter(
        noisy, top_k=release._top_k, frequency_threshold=release._frequency_threshold)
    if not kept:
        kept = [(_EMPTY_STRING_ENTRY if release._is_string else _EMPTY_INT_ENTRY, 1.0)]
    directory = os.path.join(temp_dir, "dp_vocabulary", uuid.uuid4().hex)
    tf.io.gfile.makedirs(directory)
    path = os.path.join(directory, release._vocab_filename)
    with tf.io.gfile.GFile(path, "wb") as f:
        for token, count in kept:
            prefix = f"{int(round(count))} ".encode("ascii") if release._store_frequency else b""
            f.write(prefix + token + b"\n")
    return path.encode("utf-8")


def _token_values_and_rows(x: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """Flat token values and the record (row) each belongs to."""
    if isinstance(x, tf.SparseTensor):
        return x.values, x.indices[:, 0]
    if isinstance(x, tf.RaggedTensor):
        return x.flat_values, _ragged_rows(x)
    x = tf.convert_to_tensor(x)
    if x.shape.rank == 0:
        raise ValueError("x must have a batch dimension")
    flat = tf.reshape(x, [tf.shape(x)[0], -1])
    rows = tf.repeat(tf.range(tf.shape(flat, out_type=tf.int64)[0]), tf.shape(flat)[1])
    return tf.reshape(flat, [-1]), rows


def _ragged_rows(x: tf.RaggedTensor) -> tf.Tensor:
    """The outermost row of every flat value of a RaggedTensor."""
    rows = x.nested_value_rowids()
    out = rows[-1]
    for level in reversed(rows[:-1]):
        out = tf.gather(level, out)
    return out


def _check_unsupported(kwargs: dict) -> None:
    given = sorted(k for k in _UNSUPPORTED
                   if kwargs.get(k) is not None and kwargs.get(k) is not False)
    if given:
        raise ValueError(f"dp_vocabulary has no DP version of {given} (weights need a bound, "
                         "labels a DP mutual information, coverage and reserved tokens are not "
                         "implemented): leave them out, or declare the feature public and use "
                         "tft.vocabulary")


def dp_vocabulary(x: Any, *, epsilon: Optional[float] = None, delta: Optional[float] = None,
                  weight: float = 1.0, max_partitions_contributed: int = 1,
                  top_k: Optional[int] = None, frequency_threshold: Optional[float] = None,
                  vocab_filename: Optional[str] = None, store_frequency: bool = False,
                  fingerprint_shuffle: bool = False, file_format: str = "text",
                  noise: Optional[NoiseSource] = None, name: Optional[str] = None,
                  **unsupported: Any) -> tf.Tensor:
    """DP replacement of ``tft.vocabulary``: DP partition selection (module doc).

    Args:
      x: string or integer Tensor, SparseTensor or RaggedTensor; each row is one record.
      epsilon, delta: the release's (ε, δ), both or neither (then a share by ``weight``).
      weight: the analyzer's relative share when ``epsilon`` is None.
      max_partitions_contributed: m, the most distinct tokens counted per record.
      top_k, frequency_threshold, vocab_filename, store_frequency: as ``tft.vocabulary``
        (``frequency_threshold`` applies to the noisy record counts).
      noise: noise source, for tests only; None (default) is OpenDP.
      name: analyzer name (default ``dp_vocabulary``).

    Returns:
      The vocabulary file's path (a string scalar), as ``tft.vocabulary``.

    Raises:
      ValueError: an unsupported tft argument, a bad ``top_k`` / ``frequency_threshold``, a
        non-categorical dtype, ``file_format`` other than text, ``fingerprint_shuffle``.
      InvalidPrivacyParameterError: bad ε, δ or m; DPBudgetExceededError: no δ in the budget, or
        more than it holds; MissingGrantError: no active budget.
    """
    _check_unsupported(unsupported)
    unknown = sorted(set(unsupported) - set(_UNSUPPORTED))
    if unknown:
        raise TypeError(f"dp_vocabulary got unexpected arguments {unknown}")
    if file_format != "text" or fingerprint_shuffle:
        raise ValueError("dp_vocabulary writes text vocabularies in noisy-frequency order "
                         "(file_format='text', fingerprint_shuffle=False)")
    partition_selection.order_and_filter({}, top_k=top_k, frequency_threshold=frequency_threshold)
    if x.dtype != tf.string and not x.dtype.is_integer:
        raise ValueError(f"expected tf.string or integer but got {x.dtype!r}")
    if (epsilon is None) != (delta is None):
        raise ValueError("give dp_vocabulary both epsilon and delta, or neither (a share)")
    name = name or "dp_vocabulary"
    graph = tf.compat.v1.get_default_graph()
    budget = active_budget()
    if epsilon is None:
        epsilon, delta = budget.share(name, weight, True, trace=graph)
    selection = partition_selection.PartitionSelection(epsilon, delta, max_partitions_contributed)
    noise = dp_analyzers._check_noise(noise)  # pylint: disable=protected-access
    with tf.compat.v1.name_scope(name):
        filename = tft_analyzers._get_vocab_filename(  # pylint: disable=protected-access
            vocab_filename, store_frequency)
    spend = budget.spend(name, selection.epsilon, selection.dp_event(), trace=graph,
                         delta=selection.delta)
    values, rows = _token_values_and_rows(x)
    (path,) = tft.experimental.ptransform_analyzer(
        inputs=[values, tf.cast(rows, tf.int64)],
        ptransform=_DPVocabularyRelease(
            selection, noise, spend.name, filename, top_k=top_k,
            frequency_threshold=frequency_threshold, store_frequency=store_frequency,
            is_string=x.dtype == tf.string),
        output_dtypes=[tf.string], output_shapes=[[]],
        output_asset_default_values=[_EMPTY_STRING_ENTRY if x.dtype == tf.string
                                     else _EMPTY_INT_ENTRY],
        name=spend.name)
    tft_analyzers.register_vocab(filename, vocabulary_key=vocab_filename)
    return path


def dp_compute_and_apply_vocabulary(x: Any, *, default_value: Any = -1,
                                    top_k: Optional[int] = None,
                                    frequency_threshold: Optional[float] = None,
                                    num_oov_buckets: int = 0,
                                    vocab_filename: Optional[str] = None,
                                    epsilon: Optional[float] = None,
                                    delta: Optional[float] = None, weight: float = 1.0,
                                    max_partitions_contributed: int = 1,
                                    file_format: str = "text",
                                    noise: Optional[NoiseSource] = None,
                                    name: Optional[str] = None, **unsupported: Any) -> Any:
    """DP replacement of ``tft.compute_and_apply_vocabulary``: :func:`dp_vocabulary`, then the
    stock ``tft.apply_vocabulary`` (a mapper: each token's id, OOV tokens hashed into
    ``num_oov_buckets`` buckets or given ``default_value``, as tft).

    Raises:
      as :func:`dp_vocabulary`.
    """
    name = name or "dp_compute_and_apply_vocabulary"
    path = dp_vocabulary(x, epsilon=epsilon, delta=delta, weight=weight,
                         max_partitions_contributed=max_partitions_contributed, top_k=top_k,
                         frequency_threshold=frequency_threshold, vocab_filename=vocab_filename,
                         file_format=file_format, noise=noise, name=name, **unsupported)
    return tft.apply_vocabulary(x, path, default_value=default_value,
                                num_oov_buckets=num_oov_buckets, file_format=file_format)


DP_RELEASE_TYPES = (dp_analyzers._DPRelease, _DPVocabularyRelease)  # pylint: disable=protected-access
