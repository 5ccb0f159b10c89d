"""Count specs and count featurization: label rates P(l | x) from summed windowed sketches.

A :class:`CountSpec` names what is counted (feature groups, label, sketch) and at what privacy
cost; a :class:`Featurization` is the sum of the live sealed windows' tables (what Pyramid's
application servers cache, §IV) and maps raw rows to count features.

Features per group ``g`` (in :meth:`Featurization.feature_names` order): ``P(l | x_g)`` for
labels ``1 .. L-1`` and ``log1p(n̂(x_g))``. Rates back off to the (noisy) label prior when the
estimated variance of the rate is above ``max_variance`` (§III.B.1: "we estimate the variance of
our probability estimate and, if it is too high, featurize with a default probability"). The
variance estimate is binomial sampling variance plus the propagated variance of the sketch
noise: ``p̃(1-p̃)/n̂ + σ² Σ_l p̃_l² / n̂²`` with σ² the summed noise variance of one label cell and
``p̃ = (c + prior) / (n̂ + 1)`` (one pseudo-observation of the prior, so that a key seen once,
whose raw rate is 0 or 1, is not taken as certain).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd

from sage_tfx.dp.counts import (COUNT_MEDIAN, HASH_BLAKE2B, SKETCH_KINDS, CountSketch,
                                check_depth, check_hash_family, check_width, key_hashes)
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError
from sage_tfx.ledger.accounting import check_epsilon

__all__ = ["CountSpec", "Featurization", "UnknownFeatureError", "NonCategoricalError",
           "KeyKindError", "group_keys", "check_frame", "check_max_variance", "key_kinds",
           "MAX_CACHED_KEYS", "LAPLACE", "GAUSSIAN", "MECHANISMS", "FLAT", "TREE", "AGGREGATIONS"]

LAPLACE, GAUSSIAN = "laplace", "gaussian"
MECHANISMS = (LAPLACE, GAUSSIAN)
FLAT, TREE = "flat", "tree"
AGGREGATIONS = (FLAT, TREE)
MAX_CACHED_KEYS = 2 ** 15   # default bound of the featurizer's key-hash memo, per table


class UnknownFeatureError(InvalidRequestError):
    """A count spec or a frame names a feature that is not a column of the data."""


class NonCategoricalError(InvalidRequestError):
    """A counted column is not categorical (floats must be binned before counting)."""


class KeyKindError(InvalidRequestError):
    """Keys served are of another kind than the keys counted (e.g. ``"7"`` against ``7``):
    they hash to other cells, so every one of them would fall back to the prior."""


def check_max_variance(v: Any) -> float:
    """``v`` as a float if it is a finite number >= 0, else InvalidRequestError."""
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
            or not np.isfinite(float(v)) or float(v) < 0:
        raise InvalidRequestError(f"max_variance must be a finite number >= 0, got {v!r}")
    return float(v)


def _kind(v: Any, family: str) -> Optional[str]:
    """The kind of a key value as the hash family encodes it (None: a missing value)."""
    if v is None or (isinstance(v, (float, np.floating)) and v != v):
        return None
    if isinstance(v, (bool, np.bool_)):
        return "bool" if family == HASH_BLAKE2B else "int"
    if isinstance(v, (int, np.integer)):
        return "int"
    if isinstance(v, (float, np.floating)):
        return "int" if float(v).is_integer() else "float"
    if isinstance(v, (bytes, np.bytes_)):
        return "bytes" if family == HASH_BLAKE2B else "str"
    return "str"


def key_kinds(frame: pd.DataFrame, features: Sequence[str], family: str = HASH_BLAKE2B
              ) -> dict[str, list[str]]:
    """Per feature, the sorted kinds of its values (``int``, ``str``, ...; missing values none):
    keys of different kinds encode, so hash, differently (:func:`~sage_tfx.dp.counts.encode_key`).
    """
    out = {}
    for f in features:
        col = frame[f]
        if col.dtype.kind in "iu":
            kinds = {"int"} if len(col) else set()
        elif col.dtype.kind == "b":
            kinds = {_kind(True, family)} if len(col) else set()
        else:
            kinds = {_kind(v, family) for v in col.values} - {None}
        out[f] = sorted(kinds)
    return out


def _groups(groups: Any) -> tuple[tuple[str, ...], ...]:
    out = []
    for g in groups:
        g = (g,) if isinstance(g, str) else tuple(g)
        if not g or not all(isinstance(f, str) and f for f in g) or len(set(g)) != len(g):
            raise InvalidRequestError(
                f"a feature group is a non-empty tuple of distinct names: {g!r}")
        out.append(g)
    if not out or len(set(out)) != len(out):
        raise InvalidRequestError(f"need distinct, non-empty feature groups, got {groups!r}")
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class CountSpec:
    """What one stream's count tables count, and the ε each window's tables cost.

    Args:
      groups: feature groups; a string is a single feature, a tuple a feature combination.
      label: the label column (integer classes in ``[0, n_labels)``).
      n_labels: label cardinality.
      kind: ``"count_median"`` (default, unbiased under noise) or ``"count_min"``.
      depth, width: sketch rows ``h`` and columns (a power of two).
      epsilon: ε of one window's tables together (split over the tables and the label prior).
      k: number of observations hidden together (group privacy; noise ∝ k / ε).
      salt: hashing salt, part of the spec so every process hashes alike.
      hash_family: ``"blake2b"`` (default) or ``"tf_siphash"``, which a TF graph computes too:
        needed to featurize inside the graph (:mod:`sage_tfx.pyramid.graph`).
      mechanism: ``"laplace"`` (default; pure ε-DP, ``delta`` 0) or ``"gaussian"`` (discrete
        Gaussian noise calibrated to (``epsilon``, ``delta``), :mod:`sage_tfx.pyramid.plan`).
      delta: δ of one window's tables: 0 for Laplace, in (0, 1) for Gaussian.
      aggregation: ``"flat"`` (default: one noisy table per window, summed) or ``"tree"``
        (dyadic nodes over windows, :mod:`sage_tfx.pyramid.treestore`): a window's (ε, δ) is
        split over the ``levels + 1`` nodes it is in, and a range of windows is read from at
        most ``2 levels + 1`` complete nodes.
      levels: the tree's top level ``L`` (nodes of ``1 .. 2^L`` windows); required with
        ``"tree"`` (a store's retention ``R`` needs ``L = ⌈log2 R⌉``), None with ``"flat"``.
    """

    groups: tuple
    label: str
    n_labels: int = 2
    kind: str = COUNT_MEDIAN
    depth: int = 5
    width: int = 2 ** 16
    epsilon: float = 1.0
    k: int = 1
    salt: str = "sage-tfx-pyramid"
    hash_family: str = HASH_BLAKE2B
    mechanism: str = LAPLACE
    delta: float = 0.0
    aggregation: str = FLAT
    levels: Optional[int] = None

    def __post_init__(self):
        object.__setattr__(self, "groups", _groups(self.groups))
        if not isinstance(self.label, str) or not self.label:
            raise InvalidRequestError(f"label must be a column name, got {self.label!r}")
        if any(self.label in g for g in self.groups):
            raise InvalidRequestError(f"the label {self.label!r} cannot be a counted feature")
        if self.kind not in SKETCH_KINDS:
            raise InvalidRequestError(f"kind must be one of {SKETCH_KINDS}, got {self.kind!r}")
        check_depth(self.depth)
        check_width(self.width)
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise InvalidRequestError(f"k must be an int >= 1, got {self.k!r}")
        if isinstance(self.n_labels, bool) or not isinstance(self.n_labels,
                                                             int) or self.n_labels < 2:
            raise InvalidRequestError(f"n_labels must be an int >= 2, got {self.n_labels!r}")
        if not isinstance(self.salt, str) or not self.salt:
            raise InvalidRequestError("salt must be a non-empty string")
        check_hash_family(self.hash_family)
        if self.mechanism not in MECHANISMS:
            raise InvalidRequestError(f"mechanism must be one of {MECHANISMS}, got "
                                      f"{self.mechanism!r}")
        d = self.delta
        if isinstance(d, bool) or not isinstance(d, (int, float, np.integer, np.floating)) \
                or not np.isfinite(float(d)) or \
                not (float(d) == 0.0 if self.mechanism == LAPLACE else 0.0 < float(d) < 1.0):
            raise InvalidPrivacyParameterError(
                f"delta must be 0 for the Laplace tables and in (0, 1) for the Gaussian ones, "
                f"got {d!r} ({self.mechanism})")
        object.__setattr__(self, "delta", float(d))
        if self.aggregation not in AGGREGATIONS:
            raise InvalidRequestError(f"aggregation must be one of {AGGREGATIONS}, got "
                                      f"{self.aggregation!r}")
        lv = self.levels
        if self.aggregation == FLAT and lv is not None:
            raise InvalidRequestError(f"levels is for aggregation='tree' only, got {lv!r}")
        if self.aggregation == TREE and (isinstance(lv, bool) or not isinstance(
                lv, (int, np.integer)) or not 0 <= int(lv) <= 30):
            raise InvalidRequestError(
                f"aggregation='tree' needs levels, an int in [0, 30], got {lv!r}")
        if lv is not None:
            object.__setattr__(self, "levels", int(lv))

    @property
    def nodes_per_window(self) -> int:
        """Noisy releases a window's data is in: ``levels + 1`` tree nodes, or 1 (flat)."""
        return 1 if self.aggregation == FLAT else self.levels + 1

    @property
    def features(self) -> tuple[str, ...]:
        """Every feature some group counts, each once, in order of first use."""
        return tuple(dict.fromkeys(f for g in self.groups for f in g))

    @property
    def n_tables(self) -> int:
        """Tables an observation is counted in: one per group plus the label prior."""
        return len(self.groups) + 1

    def group_name(self, group: tuple[str, ...]) -> str:
        """The group's table name: its features joined by ``*`` (e.g. ``origin*dest``)."""
        return "*".join(group)

    def group_salt(self, group: tuple[str, ...]) -> bytes:
        """The 32-byte hash salt of the group's sketch, derived from the spec's salt and name."""
        return hashlib.blake2b(f"{self.salt}\0{self.group_name(group)}".encode(),
                               digest_size=32).digest()

    def to_json(self) -> dict:
        """The spec as JSON-able data (:meth:`from_json` reads it back)."""
        d = dataclasses.asdict(self)
        d["groups"] = [list(g) for g in self.groups]
        if d["hash_family"] == HASH_BLAKE2B:   # the default is left out: digests, run ids and
            del d["hash_family"]               # stores of earlier specs stay valid
        if d["mechanism"] == LAPLACE:          # likewise
            del d["mechanism"], d["delta"]
        if d["aggregation"] == FLAT:           # likewise
            del d["aggregation"], d["levels"]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "CountSpec":
        """The spec :meth:`to_json` wrote."""
        return cls(**{**d, "groups": tuple(tuple(g) for g in d["groups"])})

    def digest(self) -> str:
        """Short stable id of the spec (part of every ledger run id)."""
        text = json.dumps(self.to_json(), sort_keys=True)
        return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()

    def new_sketch(self, group: tuple[str, ...]) -> CountSketch:
        """An empty count sketch of the group, with the spec's shape, labels and hashing."""
        return CountSketch(self.kind, self.depth, self.width, self.n_labels, self.group_salt(group),
                           self.hash_family)


def check_frame(frame: Any, features: Sequence[str], label: Optional[str] = None,
                n_labels: int = 2) -> None:
    """Raises if ``frame`` lacks a feature, has a non-categorical one, or a bad label."""
    if not isinstance(frame, pd.DataFrame):
        raise InvalidRequestError(f"observations must be a pandas DataFrame, got {type(frame)}")
    missing = [f for f in features if f not in frame.columns]
    if missing:
        raise UnknownFeatureError(f"unknown feature(s) {missing}; columns: {list(frame.columns)}")
    for f in features:
        col = frame[f]
        kind = col.dtype.kind
        first = next((v for v in col.values if v is not None and v == v), "") \
            if kind == "O" else ""
        if kind in "fcmM" or isinstance(first, float):
            raise NonCategoricalError(
                f"column {f!r} ({frame[f].dtype}) is not categorical: bin it first")
    if label is not None:
        if label not in frame.columns:
            raise UnknownFeatureError(f"unknown label column {label!r}")
        lab = frame[label].to_numpy()
        if lab.dtype.kind not in "iub" or (len(lab) and (lab.min() < 0 or lab.max() >= n_labels)):
            raise InvalidRequestError(
                f"label {label!r} must hold integer classes in [0, {n_labels})")


def group_keys(frame: pd.DataFrame, group: tuple[str, ...]) -> list:
    """The key of every row for ``group``: the value, or a tuple of values."""
    if len(group) == 1:
        return frame[group[0]].tolist()
    return list(zip(*(frame[f].tolist() for f in group)))


def _memo_key(key: Any):
    """The hash memo's key of a feature key: the value, with bools told apart from the equal
    ints (``True == 1`` in Python, but the two encode, so hash, differently)."""
    if isinstance(key, tuple):
        return tuple(map(_memo_key, key))
    return (key, True) if isinstance(key, (bool, np.bool_)) else key


class Featurization:
    """Summed count tables of the live windows, ready to featurize (a cacheable snapshot).

    Args:
      spec: the count spec.
      cells: group name → summed ``depth × width × n_labels`` cells.
      prior: summed noisy label counts (length ``n_labels``).
      noise_var: group name → summed noise variance of one cell (σ² above); ``"__prior__"`` too.
      windows: ids of the windows summed.
      max_variance: back-off threshold on the estimated variance of a rate (finite, >= 0).
      kinds: feature → kinds of the keys counted (:func:`key_kinds`, summed windows); serving
        keys of another kind raise :class:`KeyKindError` instead of silently backing off.
        None (or a feature absent): not checked.
      max_cached_keys: bound of the key-hash memo per table (it is emptied when full).
    """

    def __init__(self, spec: CountSpec, cells: dict, prior: np.ndarray, noise_var: dict,
                 windows: Sequence[int] = (), max_variance: float = 0.01,
                 kinds: Optional[dict] = None, max_cached_keys: int = MAX_CACHED_KEYS):
        self.max_variance = check_max_variance(max_variance)
        if isinstance(max_cached_keys, bool) or not isinstance(max_cached_keys, int) \
                or max_cached_keys < 0:
            raise InvalidRequestError(
                f"max_cached_keys must be an int >= 0, got {max_cached_keys!r}")
        self.max_cached_keys = max_cached_keys
        self.kinds = None if kinds is None else {f: sorted(v) for f, v in kinds.items()}
        self.spec = spec
        self.cells = cells
        self.prior_counts = np.asarray(prior, dtype=np.float64)
        self.noise_var = dict(noise_var)
        self.windows = tuple(windows)
        self._hash_cache: dict[str, dict] = {}

    @property
    def prior(self) -> np.ndarray:
        """Label distribution from the noisy prior counts (uniform if they are not positive)."""
        c = np.clip(self.prior_counts, 0, None)
        return c / c.sum() if c.sum() > 0 else np.full(self.spec.n_labels, 1.0 / self.spec.n_labels)

    def feature_names(self) -> list[str]:
        """Names of the count features, per group: ``<group>__p<l>`` for each label l >= 1, then
        ``<group>__logn``."""
        names = []
        for g in self.spec.groups:
            name = self.spec.group_name(g)
            names += [f"{name}__p{l}" for l in range(1, self.spec.n_labels)] + [f"{name}__logn"]
        return names

    def _hashes(self, group, keys, cache: bool):
        salt, fam = self.spec.group_salt(group), self.spec.hash_family
        if not cache:
            return key_hashes(keys, salt, self.spec.depth, self.spec.width, fam)
        memo = self._hash_cache.setdefault(self.spec.group_name(group), {})
        mkeys = [_memo_key(k) for k in keys]
        first = dict(zip(mkeys, keys))
        miss = [m for m in first if m not in memo]
        if len(memo) + len(miss) > self.max_cached_keys:
            memo.clear()                  # bounded: emptied when full
            if len(first) > self.max_cached_keys:
                return key_hashes(keys, salt, self.spec.depth, self.spec.width, fam)
            miss = list(first)
        if miss:
            b, s = key_hashes([first[m] for m in miss], salt, self.spec.depth, self.spec.width,
                              fam)
            for i, m in enumerate(miss):
                memo[m] = (b[i], s[i])
        pairs = [memo[m] for m in mkeys]
        return np.array([p[0] for p in pairs]).reshape(len(keys), -1), \
            np.array([p[1] for p in pairs]).reshape(len(keys), -1)

    def counts(self, group: tuple[str, ...], keys: Sequence[Any], cache: bool = True) -> np.ndarray:
        """Estimated ``len(keys) × n_labels`` counts of ``group`` (noisy, may be negative)."""
        b, s = self._hashes(group, keys, cache)
        if self.spec.kind != COUNT_MEDIAN:
            s = np.ones_like(s)
        return CountSketch.estimate_cells(self.cells[self.spec.group_name(group)], b, s,
                                          self.spec.kind)

    def rates(self, est: np.ndarray, noise_var: float) -> tuple[np.ndarray, np.ndarray]:
        """(rates with back-off, estimated totals) from estimated per-label counts."""
        c = np.clip(est, 0, None)
        n = c.sum(axis=1)
        prior = self.prior
        with np.errstate(invalid="ignore", divide="ignore"):
            p = c / n[:, None]
            # The binomial variance uses the rate shrunk by one pseudo-observation toward the
            # prior: a key seen once (p = 0 or 1) must not look certain.
            ps = (c + prior) / (n[:, None] + 1.0)
            var = (ps * (1 - ps)).max(axis=1) / n + noise_var * (ps ** 2).sum(axis=1) / n ** 2
        bad = ~(n > 0) | ~np.isfinite(var) | (var > self.max_variance)
        p[bad] = prior
        return p, n

    def check_kinds(self, frame: pd.DataFrame) -> None:
        """Raises :class:`KeyKindError` if a feature's keys are of a kind never counted."""
        if not self.kinds:
            return
        served = key_kinds(frame, [f for f in self.spec.features if self.kinds.get(f)],
                           self.spec.hash_family)
        bad = {f: (self.kinds[f], sorted(set(k) - set(self.kinds[f])))
               for f, k in served.items() if set(k) - set(self.kinds[f])}
        if bad:
            raise KeyKindError("keys of another kind than counted (they would all fall back to "
                               "the prior; cast them): " + "; ".join(
                                   f"{f!r} counted {c}, served {s}" for f, (c, s) in bad.items()))

    def featurize(self, frame: pd.DataFrame, cache: bool = True) -> np.ndarray:
        """``len(frame) × len(feature_names())`` float32 count features.

        Raises:
          KeyKindError: a feature's keys are of another kind than the keys counted.
        """
        check_frame(frame, self.spec.features)
        self.check_kinds(frame)
        cols = []
        for g in self.spec.groups:
            est = self.counts(g, group_keys(frame, g), cache)
            p, n = self.rates(est, self.noise_var.get(self.spec.group_name(g), 0.0))
            cols += [p[:, 1:], np.log1p(n)[:, None]]
        return np.hstack(cols).astype(np.float32) if cols else np.zeros((len(frame), 0), np.float32)

    # -- persistence (the snapshot artifact) --

    def save(self, path: str) -> None:
        """Writes the featurization (noisy cells, prior, spec, noise variances) as a ``.npz``
        that :meth:`load` reads."""
        arrays = {f"cells__{k}": v for k, v in self.cells.items()}
        meta = {"spec": self.spec.to_json(), "noise_var": self.noise_var,
                "windows": list(self.windows), "max_variance": self.max_variance,
                "kinds": self.kinds}
        np.savez_compressed(path, prior=self.prior_counts, meta=np.array(json.dumps(meta)),
                            **arrays)

    @classmethod
    def load(cls, path: str) -> "Featurization":
        """The featurization :meth:`save` wrote to ``path`` (no pickled objects are read)."""
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            cells = {k[len("cells__"):]: z[k] for k in z.files if k.startswith("cells__")}
            prior = z["prior"]
        return cls(CountSpec.from_json(meta["spec"]), cells, prior, meta["noise_var"],
                   meta["windows"], meta["max_variance"], kinds=meta.get("kinds"))
