"""DP feature statistics of a dataset split: what TFDV's ``DatasetFeatureStatistics`` holds, DP.

Stock TFX validates data with StatisticsGen → SchemaGen → ExampleValidator, whose statistics are
exact. This module computes the same quantities with differential privacy, for the
``DPStatisticsGen`` component (``components/dp_statistics_gen``), which writes them as TFDV
protos so the stock SchemaGen and ExampleValidator run on them unchanged.

Declared, never read from the data (public parameters): the features, their kind and type,
numeric bounds ``[lower, upper]`` and bins, categorical domains, and ``max_values``, the bound on
the values one example contributes to a feature (its valency; values past it are dropped).

Released per split, each by one Laplace mechanism drawn once (OpenDP, :mod:`sage_tfx.dp.noise`):

=================== ======================================================== ==============
query               exact aggregate                                           L1 sensitivity
=================== ======================================================== ==============
``num_examples``    number of examples                                        1
``<f>:valency``     examples with 0, 1, …, K values of f (K = max_values)      1
``<f>:values``      numeric: values per public bin, plus one cell of zeros    K
``<f>:sum``         numeric: Σ (clip(x, lower, upper) − midpoint)              K·h
``<f>:squares``     numeric: Σ (clip(x, lower, upper) − midpoint)²             K·h²
``<f>:domain``      categorical with a public domain: examples per value      K
=================== ======================================================== ==============

(h = (upper − lower)/2.) A categorical feature without a domain gets its values from a DP
vocabulary by partition selection (:mod:`sage_tfx.dp.partition_selection`: Laplace noise on the
number of examples holding each value, a value kept only above a threshold that hides any one
example's values; (ε, δ)-DP, so the part needs δ > 0; its noisy counts are the top values).

Privacy. Adjacency is add/remove one example. Within a split the queries compose sequentially:
the part's ε is split evenly over them (:func:`~sage_tfx.dp.mechanisms.split_budget`, never
more than the total) and its δ over the vocabularies. Splits are disjoint sets of examples (the
deterministic per-record hash partition of BlockExampleGen), so each split is released with the
whole part by parallel composition. ``StatisticsConfig.dp_event(ε)`` is the split's exact
DpEvent when no vocabulary is selected.

Post-processing (free, and stated because stock consumers read it): TFDV stores counts as
integers, so noisy counts are rounded, and negative ones become 0. A count is "non-zero" only
above a threshold ``τ = b·ln(cells / 2β)`` (b the noise scale, ``β = failure_probability``):
then an empty cell of a histogram passes with probability ≤ β. This decides presence (a feature
missing in fewer than about τ examples is reported as always present: otherwise noise alone would
make SchemaGen infer an optional feature and ExampleValidator report a dropped column), the min
and max number of values, min/max of numeric values (bin edges), ``num_zeros`` and which domain
values are listed. Quantiles and the median are interpolated in the noisy histogram; mean and
standard deviation come from the noisy sums over the DP number of values. The categorical
``unique`` is the number of values released (a DP lower estimate: rare values are not seen).

This module imports no TensorFlow.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
from typing import Any, Mapping, Optional, Sequence, Union

import dp_accounting
import numpy as np

from sage_tfx.dp.mechanisms import LaplaceMechanism, check_bounds, split_budget
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError
from sage_tfx.ledger.accounting import check_delta, check_epsilon

NUMERIC = "numeric"
CATEGORICAL = "categorical"
INT = "int"
FLOAT = "float"
DTYPES = (INT, FLOAT)
NUM_EXAMPLES = "num_examples"
DEFAULT_FAILURE_PROBABILITY = 1e-3
DEFAULT_NUM_QUANTILES = 10  # TFDV's num_quantiles_histogram_buckets
DEFAULT_NUM_TOP_VALUES = 20  # TFDV's num_top_values
RANK_HISTOGRAM_BUCKETS = 1000  # TFDV's num_rank_histogram_buckets


def _check_int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise InvalidRequestError(f"{name} must be an int >= {lo}, got {value!r}")
    return int(value)


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or ":" in name:
        raise InvalidRequestError(f"a feature name must be a non-empty string without ':', got "
                                  f"{name!r}")
    return name


@dataclasses.dataclass(frozen=True)
class NumericFeature:
    """A numeric feature (int64 or float values): public bounds, bins and valency bound.

    Values are clipped to [lower, upper]; NaN values count as absent; an example's values past
    the first ``max_values`` are dropped.
    """

    name: str
    lower: float
    upper: float
    dtype: str = FLOAT
    num_bins: int = 10
    max_values: int = 1

    def __post_init__(self) -> None:
        _check_name(self.name)
        lower, upper = check_bounds(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        if self.dtype not in DTYPES:
            raise InvalidRequestError(f"dtype of {self.name!r} must be one of {DTYPES}, got "
                                      f"{self.dtype!r}")
        object.__setattr__(self, "num_bins", _check_int("num_bins", self.num_bins, 1))
        object.__setattr__(self, "max_values", _check_int("max_values", self.max_values, 1))

    kind = NUMERIC

    @property
    def bin_edges(self) -> tuple[float, ...]:
        """The public bin edges, evenly spaced over [lower, upper]."""
        return tuple(float(e) for e in np.linspace(self.lower, self.upper, self.num_bins + 1))

    @property
    def half_range(self) -> float:
        """h = (upper − lower) / 2: the largest |clip(x) − midpoint|."""
        return (self.upper - self.lower) / 2.0

    def queries(self) -> tuple[tuple[str, float, int], ...]:
        """(key, L1 sensitivity, cells) of each Laplace query on this feature."""
        k, h = float(self.max_values), self.half_range
        return ((f"{self.name}:valency", 1.0, self.max_values + 1),
                (f"{self.name}:values", k, self.num_bins + 1),
                (f"{self.name}:sum", k * h, 1),
                (f"{self.name}:squares", k * h * h, 1))

    def to_dict(self) -> dict:
        """A JSON-able dict (:func:`feature_from_dict` reads it back)."""
        return {"kind": NUMERIC, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class CategoricalFeature:
    """A categorical feature (bytes values): a public ``domain``, or None for a DP vocabulary
    selected from the data (partition selection). An example counts once per distinct value
    among its first ``max_values`` values; values outside a declared domain are not counted."""

    name: str
    domain: Optional[tuple[str, ...]] = None
    max_values: int = 1

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.domain is not None:
            if isinstance(self.domain, (str, bytes)):
                raise InvalidRequestError(f"domain of {self.name!r} must be a list of strings")
            domain = tuple(self.domain)
            if not domain or not all(isinstance(v, str) for v in domain) \
                    or len(set(domain)) != len(domain):
                raise InvalidRequestError(f"domain of {self.name!r} must be distinct strings, "
                                          f"at least one, got {self.domain!r}")
            object.__setattr__(self, "domain", domain)
        object.__setattr__(self, "max_values", _check_int("max_values", self.max_values, 1))

    kind = CATEGORICAL

    @property
    def selects_vocabulary(self) -> bool:
        """True if the values are selected from the data (no public domain): needs δ > 0."""
        return self.domain is None

    def queries(self) -> tuple[tuple[str, float, int], ...]:
        """(key, L1 sensitivity, cells) of each Laplace query on this feature (a vocabulary is
        selected separately)."""
        out = [(f"{self.name}:valency", 1.0, self.max_values + 1)]
        if self.domain is not None:
            out.append((f"{self.name}:domain", float(self.max_values), len(self.domain)))
        return tuple(out)

    def to_dict(self) -> dict:
        """A JSON-able dict (:func:`feature_from_dict` reads it back)."""
        return {"kind": CATEGORICAL, "name": self.name,
                "domain": list(self.domain) if self.domain is not None else None,
                "max_values": self.max_values}


Feature = Union[NumericFeature, CategoricalFeature]


def feature_from_dict(d: Mapping[str, Any]) -> Feature:
    """Inverse of ``to_dict`` of either feature kind.

    Raises:
      InvalidRequestError: an unknown kind or field.
    """
    if not isinstance(d, Mapping):
        raise InvalidRequestError(f"a feature must be a dict, got {d!r}")
    fields = dict(d)
    kind = fields.pop("kind", None)
    cls = {NUMERIC: NumericFeature, CATEGORICAL: CategoricalFeature}.get(kind)
    if cls is None:
        raise InvalidRequestError(f"feature kind must be {NUMERIC!r} or {CATEGORICAL!r}, got "
                                  f"{kind!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    if not set(fields) <= names or "name" not in fields:
        raise InvalidRequestError(f"a {kind} feature has fields {sorted(names)}, got "
                                  f"{sorted(fields)}")
    if fields.get("domain") is not None:
        fields["domain"] = tuple(fields["domain"])
    return cls(**fields)


def threshold(scale: float, cells: int, failure_probability: float) -> float:
    """τ = scale·ln(cells / 2β): an empty cell's Laplace(scale) noise exceeds τ in one of
    ``cells`` cells with probability ≤ β (union bound on ½·exp(−τ/scale))."""
    return scale * max(0.0, math.log(cells / (2.0 * failure_probability)))


@dataclasses.dataclass(frozen=True)
class QueryBudget:
    """One Laplace query of a split: its ε share, sensitivity, sampler scale and threshold."""

    key: str
    epsilon: float
    sensitivity: float
    cells: int
    scale: float
    threshold: float

    @property
    def mechanism(self) -> LaplaceMechanism:
        """The Laplace mechanism of this share (OpenDP's sampler at :attr:`scale`)."""
        return LaplaceMechanism(self.epsilon, self.sensitivity)


@dataclasses.dataclass(frozen=True)
class VocabularyBudget:
    """The partition selection of one categorical feature: (ε, δ) and the contribution bound."""

    feature: str
    epsilon: float
    delta: float
    max_values: int


@dataclasses.dataclass(frozen=True)
class StatisticsBudget:
    """How a split's statistics spend the part's (ε, δ)."""

    epsilon: float
    delta: float
    queries: tuple[QueryBudget, ...]
    vocabularies: tuple[VocabularyBudget, ...]

    def query(self, key: str) -> QueryBudget:
        """The budget of the query ``key``."""
        return next(q for q in self.queries if q.key == key)

    def to_dict(self) -> dict:
        """A JSON-able description (``dp_statistics.json``)."""
        return {"epsilon": self.epsilon, "delta": self.delta,
                "composition": "sequential within a split, parallel across splits",
                "adjacency": "add/remove one example",
                "queries": [dataclasses.asdict(q) for q in self.queries],
                "vocabularies": [dataclasses.asdict(v) for v in self.vocabularies]}


@dataclasses.dataclass(frozen=True)
class StatisticsConfig:
    """The declared features and the post-processing parameters of a DP statistics release."""

    features: tuple[Feature, ...]
    failure_probability: float = DEFAULT_FAILURE_PROBABILITY
    num_quantiles: int = DEFAULT_NUM_QUANTILES
    num_top_values: int = DEFAULT_NUM_TOP_VALUES

    def __post_init__(self) -> None:
        features = tuple(self.features)
        if not all(isinstance(f, (NumericFeature, CategoricalFeature)) for f in features):
            raise InvalidRequestError("features must be NumericFeature / CategoricalFeature")
        names = [f.name for f in features]
        if len(set(names)) != len(names):
            raise InvalidRequestError(f"feature names must be distinct: {names}")
        object.__setattr__(self, "features", features)
        beta = self.failure_probability
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) \
                or not 0.0 < float(beta) < 1.0:
            raise InvalidPrivacyParameterError(
                f"failure_probability must lie in (0, 1), got {self.failure_probability!r}")
        object.__setattr__(self, "failure_probability", float(beta))
        object.__setattr__(self, "num_quantiles",
                           _check_int("num_quantiles", self.num_quantiles, 1))
        object.__setattr__(self, "num_top_values",
                           _check_int("num_top_values", self.num_top_values, 1))

    def laplace_queries(self) -> tuple[tuple[str, float, int], ...]:
        """(key, L1 sensitivity, cells) of every Laplace query of a split, in release order."""
        out = [(NUM_EXAMPLES, 1.0, 1)]
        for f in self.features:
            out.extend(f.queries())
        return tuple(out)

    @property
    def vocabulary_features(self) -> tuple[CategoricalFeature, ...]:
        """The categorical features without a domain (their values by partition selection)."""
        return tuple(f for f in self.features
                     if isinstance(f, CategoricalFeature) and f.selects_vocabulary)

    def budget(self, epsilon: float, delta: float = 0.0) -> StatisticsBudget:
        """The split's shares of the part's (ε, δ): ε evenly over the Laplace queries and the
        vocabularies, δ evenly over the vocabularies (shares never add up to more).

        Raises:
          InvalidPrivacyParameterError: bad ε or δ, or δ = 0 with a vocabulary to select.
        """
        epsilon, delta = check_epsilon(epsilon), check_delta(delta)
        laplace, vocab = self.laplace_queries(), self.vocabulary_features
        if vocab and delta <= 0:
            raise InvalidPrivacyParameterError(
                f"features {[f.name for f in vocab]} have no public domain: their vocabulary is "
                "selected from the data by partition selection, which is (epsilon, delta)-DP; "
                "give the statistics part a delta > 0, or declare each feature's domain")
        shares = split_budget(epsilon, 0.0, [1.0] * (len(laplace) + len(vocab)))
        queries = []
        for (key, sensitivity, cells), share in zip(laplace, shares):
            scale = LaplaceMechanism(share.epsilon, sensitivity).sampler_scale
            queries.append(QueryBudget(key, share.epsilon, sensitivity, cells, scale,
                                       threshold(scale, cells, self.failure_probability)))
        deltas = ([s.delta for s in split_budget(1.0, delta, [1.0] * len(vocab))]  # δ only
                  if vocab else [])
        vocabularies = tuple(VocabularyBudget(f.name, s.epsilon, d, f.max_values)
                             for f, s, d in zip(vocab, shares[len(laplace):], deltas))
        return StatisticsBudget(epsilon, delta, tuple(queries), vocabularies)

    def dp_event(self, epsilon: float) -> dp_accounting.DpEvent:
        """The DpEvent of one split's release at ε: the composed Laplace events.

        Raises:
          InvalidRequestError: a vocabulary to select (partition selection has no RDP event).
        """
        if self.vocabulary_features:
            raise InvalidRequestError(
                "partition selection is (epsilon, delta)-DP with no DpEvent the rdp ledger can "
                "compose: declare a domain for every categorical feature on an rdp stream")
        return dp_accounting.ComposedDpEvent(
            [q.mechanism.dp_event() for q in self.budget(epsilon).queries])

    def to_dict(self) -> dict:
        """A JSON-able dict (:meth:`from_dict` reads it back)."""
        return {"features": [f.to_dict() for f in self.features],
                "failure_probability": self.failure_probability,
                "num_quantiles": self.num_quantiles, "num_top_values": self.num_top_values}

    def to_json(self) -> str:
        """Canonical JSON of :meth:`to_dict` (sorted keys)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StatisticsConfig":
        """Inverse of :meth:`to_dict`.

        Raises:
          InvalidRequestError, InvalidPrivacyParameterError: a malformed configuration.
        """
        if not isinstance(d, Mapping) or "features" not in d:
            raise InvalidRequestError(f"not a statistics configuration: {d!r}")
        extra = set(d) - {"features", "failure_probability", "num_quantiles", "num_top_values"}
        if extra:
            raise InvalidRequestError(f"unknown statistics configuration fields {sorted(extra)}")
        return cls(tuple(feature_from_dict(f) for f in d["features"]),
                   **{k: v for k, v in d.items() if k != "features"})

    @classmethod
    def from_json(cls, text: str) -> "StatisticsConfig":
        """Inverse of :meth:`to_json` (InvalidRequestError on text that is not JSON)."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as e:
            raise InvalidRequestError(f"statistics configuration is not JSON: {e}") from e
        return cls.from_dict(data)

    # --- exact aggregates (additive over disjoint batches) ----------------------------------

    def zero(self) -> dict[str, np.ndarray]:
        """The aggregate of no examples."""
        return {key: np.zeros(cells) for key, _, cells in self.laplace_queries()}

    def aggregate(self, rows: Sequence[Mapping[str, Sequence[Any]]]
                  ) -> tuple[dict[str, np.ndarray], dict[str, collections.Counter]]:
        """Exact aggregates of a batch of examples: {key: counts or sums} and, per vocabulary
        feature, a Counter of examples per value. Both add up over disjoint batches.

        Args:
          rows: one mapping per example from feature name to its values: floats for numeric
            features, bytes for categorical ones (values of another kind are already dropped).
        """
        totals = {NUM_EXAMPLES: np.array([float(len(rows))])}
        vocab: dict[str, collections.Counter] = {}
        for f in self.features:
            lists = [row.get(f.name) or () for row in rows]
            if isinstance(f, NumericFeature):
                totals.update(_numeric_aggregate(f, lists))
            else:
                agg, counter = _categorical_aggregate(f, lists)
                totals.update(agg)
                if counter is not None:
                    vocab[f.name] = counter
        return totals, vocab


def _numeric_aggregate(f: NumericFeature, lists: Sequence[Sequence[Any]]) -> dict:
    k = f.max_values
    lengths = np.fromiter((len(v) for v in lists), dtype=np.int64, count=len(lists))
    x = np.fromiter((float(v) for vs in lists for v in vs), dtype=np.float64,
                    count=int(lengths.sum()))
    rows = np.repeat(np.arange(len(lists)), lengths)
    keep = ~np.isnan(x)
    x, rows = x[keep], rows[keep]
    position = np.arange(rows.size) - np.searchsorted(rows, rows, side="left")
    take = position < k
    x, rows = x[take], rows[take]
    valency = np.bincount(np.bincount(rows, minlength=len(lists)), minlength=k + 1)
    zero = x == 0.0
    clipped = np.clip(x[~zero], f.lower, f.upper)
    edges = np.asarray(f.bin_edges)
    bins = np.clip(np.searchsorted(edges, clipped, side="right") - 1, 0, f.num_bins - 1)
    values = np.append(np.bincount(bins, minlength=f.num_bins), zero.sum()).astype(np.float64)
    centered = np.clip(x, f.lower, f.upper) - (f.lower + f.upper) / 2.0
    return {f"{f.name}:valency": valency[:k + 1].astype(np.float64),
            f"{f.name}:values": values,
            f"{f.name}:sum": np.array([centered.sum()]),
            f"{f.name}:squares": np.array([np.square(centered).sum()])}


def _categorical_aggregate(f: CategoricalFeature, lists: Sequence[Sequence[Any]]):
    k = f.max_values
    valency = np.zeros(k + 1)
    index = {v.encode("utf-8"): i for i, v in enumerate(f.domain)} if f.domain else None
    domain = np.zeros(len(f.domain)) if f.domain else None
    counter = collections.Counter() if f.domain is None else None
    for values in lists:
        first = list(values[:k])
        valency[len(first)] += 1
        for v in dict.fromkeys(first):
            if counter is not None:
                counter[v] += 1
            elif v in index:
                domain[index[v]] += 1
    out = {f"{f.name}:valency": valency}
    if domain is not None:
        out[f"{f.name}:domain"] = domain
    return out, counter
