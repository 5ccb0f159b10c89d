"""Per-label count tables and DP count sketches (count-min, count-median), with their sensitivity.

The count kernel shared by count featurization (:mod:`sage_tfx.pyramid`) and any other system
that keeps per-key, per-label counts. A *key* is the value of one categorical feature or of a
feature group (a tuple of values); a *label* is an index in ``range(n_labels)``.

* :class:`CountTable` — exact counts in a dict. Never released with noise: its key set is data
  dependent, so noising only the observed keys would reveal which keys occur. Use it for non-DP
  baselines and for hot-window statistics that are deleted at roll-over.
* :class:`DomainTable` — a ``len(domain) × n_labels`` integer array over a public, declared
  key domain (keys outside it are dropped, so the cell set leaks nothing); one observation
  changes one cell by 1, so its L1 sensitivity is 1 (a sketch of depth 1 without collisions).
* :class:`CountSketch` — an ``h × width × n_labels`` integer array (Cormode & Muthukrishnan's
  count-min sketch, or Charikar et al.'s count-median / count sketch, Pyramid §III.B.2). Every
  cell exists whatever the data, so noise in every cell makes the whole array differentially
  private.

**Sensitivity (add/remove one observation).** An observation with label ``l`` updates, in each
of a table's ``h`` rows, exactly one cell of label column ``l``, by +1 (count-min) or by its
sign ±1 (count-median). The other ``n_labels - 1`` columns are untouched, so the L1 change of
one table is exactly ``h`` (not ``h · n_labels``). An observation is counted once in each of the
``n`` tables it belongs to, so the L1 change of all tables together is ``n · h``; hiding any
group of ``k`` observations multiplies it by ``k`` (:func:`l1_sensitivity`). Integer cells get
OpenDP's discrete Laplace noise of scale ``h k / ε_i`` in table ``i``; the release is
``Σ ε_i``-DP by sequential composition (:func:`table_epsilons`), which with an even split
``ε_i = ε / n`` is the paper's ``b = n h k / ε``.

**Hashing** is stable across processes, restarts and machines (never Python's ``hash()``, which
is randomised per process), in one of two families (``hash_family``):

* ``"blake2b"`` (default): keyed BLAKE2b over :func:`encode_key`, salted per sketch. One 64-byte
  digest per key gives the ``h ≤ 8`` row buckets and signs. Python only.
* ``"tf_siphash"``: TensorFlow's keyed SipHash-2-4 (``tf.strings.to_hash_bucket_strong``) over
  :func:`encode_key_text`, one key ``(k0, k1)`` per row derived from the salt
  (:func:`siphash_keys`). A TF graph computes the same buckets from raw ``tf.Example`` values, so
  a served model can featurize in-graph (:mod:`sage_tfx.pyramid.graph`); the count-building
  side calls the same TF op eagerly, so both sides agree by construction.

This module imports no TensorFlow at import time (the ``"tf_siphash"`` family imports it when
it hashes).
"""
from __future__ import annotations

import hashlib
import math
from typing import Any, Iterable, Optional, Sequence

import dp_accounting
import numpy as np

from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError
from sage_tfx.ledger.accounting import check_epsilon

COUNT_MIN = "count_min"
COUNT_MEDIAN = "count_median"
SKETCH_KINDS = (COUNT_MIN, COUNT_MEDIAN)
MAX_DEPTH = 8            # 64-byte digest = 8 rows × (bucket: 7 bytes, sign: 1 byte)
HASH_BLAKE2B = "blake2b"
HASH_TF_SIPHASH = "tf_siphash"
HASH_FAMILIES = (HASH_BLAKE2B, HASH_TF_SIPHASH)

__all__ = ["COUNT_MIN", "COUNT_MEDIAN", "SKETCH_KINDS", "encode_key", "key_hashes",
           "CountTable", "DomainTable", "CountSketch", "l1_sensitivity",
           "table_epsilons", "noise_scales",
           "check_width", "check_depth", "HASH_BLAKE2B", "HASH_TF_SIPHASH", "HASH_FAMILIES",
           "check_hash_family", "encode_key_text", "siphash_keys", "table_event"]


def check_hash_family(family: Any) -> str:
    """Returns ``family`` if it is one of :data:`HASH_FAMILIES`, else raises InvalidRequestError."""
    if family not in HASH_FAMILIES:
        raise InvalidRequestError(f"hash family must be one of {HASH_FAMILIES}, got {family!r}")
    return family


def check_width(width: Any) -> int:
    """Returns ``width`` if it is an int power of two ≥ 2, else raises InvalidRequestError."""
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 2 \
            or (int(width) & (int(width) - 1)):
        raise InvalidRequestError(f"sketch width must be a power of two >= 2, got {width!r}")
    return int(width)


def check_depth(depth: Any) -> int:
    """Returns ``depth`` if it is an int in [1, 8], else raises InvalidRequestError."""
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) \
            or not 1 <= depth <= MAX_DEPTH:
        raise InvalidRequestError(f"sketch depth must be an int in [1, {MAX_DEPTH}], got {depth!r}")
    return int(depth)


def encode_key(key: Any) -> bytes:
    """Canonical bytes of a key: a scalar or a tuple of scalars (a feature group).

    Type-tagged so ``1``, ``1.0``, ``"1"`` and ``("1",)`` hash differently and identically in
    every process. NaN / None encode as one "missing" value.
    """
    if isinstance(key, tuple):
        return b"T" + b"".join(len(p).to_bytes(4, "big") + p for p in map(encode_key, key))
    if key is None or (isinstance(key, float) and math.isnan(key)):
        return b"N"
    if isinstance(key, (bool, np.bool_)):
        return b"B1" if key else b"B0"
    if isinstance(key, (int, np.integer)):
        return b"I" + str(int(key)).encode()
    if isinstance(key, (float, np.floating)):
        f = float(key)
        return (b"I" + str(int(f)).encode()) if f.is_integer() else b"F" + repr(f).encode()
    if isinstance(key, bytes):
        return b"Y" + key
    return b"S" + str(key).encode("utf-8")


def encode_key_text(key: Any) -> bytes:
    """Canonical bytes of a key that a TF graph can also build from ``tf.Example`` values.

    ``tf.Example`` knows only int64, float and bytes lists, so this encoding (of the
    ``"tf_siphash"`` family) has one tag per kind it can carry: ``b"I<decimal>"`` for integers
    (bools and integer-valued floats included), ``b"S<bytes>"`` for strings (UTF-8) and bytes
    alike, ``b"N"`` for a missing value (None / NaN), and ``b"T" + Σ b"<len>:" + part`` for a
    tuple (a feature group; decimal byte lengths keep it unambiguous). Other floats are refused:
    bin them first.
    """
    if isinstance(key, tuple):
        return b"T" + b"".join(str(len(p)).encode() + b":" + p for p in map(encode_key_text, key))
    if key is None or (isinstance(key, float) and math.isnan(key)):
        return b"N"
    if isinstance(key, (bool, np.bool_, int, np.integer)):
        return b"I" + str(int(key)).encode()
    if isinstance(key, (float, np.floating)):
        if not float(key).is_integer():
            raise InvalidRequestError(f"cannot hash the non-integer float {key!r}: bin it first")
        return b"I" + str(int(key)).encode()
    if isinstance(key, (bytes, np.bytes_)):
        return b"S" + bytes(key)
    return b"S" + str(key).encode("utf-8")


def siphash_keys(salt: bytes, depth: int) -> list[tuple[int, int]]:
    """The SipHash key ``(k0, k1)`` of each of ``depth`` rows under ``salt`` (signed int64s, the
    type of ``tf.strings.to_hash_bucket_strong``'s ``key`` attribute): keyed BLAKE2b of the row
    index, so rows hash independently and every process derives the same keys."""
    depth = check_depth(depth)
    out = []
    for r in range(depth):
        d = hashlib.blake2b(bytes([r]), digest_size=16, key=bytes(salt)[:64]).digest()
        out.append((int.from_bytes(d[:8], "big", signed=True),
                    int.from_bytes(d[8:], "big", signed=True)))
    return out


def _siphash_hashes(encoded: list[bytes], salt: bytes, depth: int, width: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Unique keys' buckets and signs with TF's keyed SipHash-2-4: row ``r`` hashes into
    ``2 · width`` buckets under key ``siphash_keys(salt)[r]``; bit 0 is the sign (1 → +1), the
    bits above it the bucket. The graph side (:mod:`sage_tfx.pyramid.graph`) does the same."""
    if not encoded:
        return np.zeros((0, depth), np.int64), np.zeros((0, depth), np.int64)
    import tensorflow as tf  # the "tf_siphash" family only
    t = tf.constant(encoded, dtype=tf.string)
    hs = np.stack([tf.strings.to_hash_bucket_strong(t, 2 * width, key=list(k)).numpy()
                   for k in siphash_keys(salt, depth)], axis=1).astype(np.int64)
    return hs >> 1, np.where(hs & 1, 1, -1).astype(np.int64)


def key_hashes(keys: Sequence[Any], salt: bytes, depth: int, width: int,
               family: str = HASH_BLAKE2B) -> tuple[np.ndarray, np.ndarray]:
    """Buckets (``len(keys) × depth`` in [0, width)) and signs (±1) of keys under ``salt``.

    Each distinct key is hashed once. ``"blake2b"``: keyed BLAKE2b, 64-byte digest; row ``r``
    uses digest bytes ``8r .. 8r+6`` for its bucket and the low bit of byte ``8r+7`` for its
    sign. ``"tf_siphash"``: see :func:`_siphash_hashes`.
    """
    depth, width = check_depth(depth), check_width(width)
    if check_hash_family(family) == HASH_TF_SIPHASH:
        memo_t: dict[bytes, int] = {}
        idx = np.array([memo_t.setdefault(encode_key_text(k), len(memo_t)) for k in keys],
                       dtype=np.int64)
        ub, us = _siphash_hashes(list(memo_t), salt, depth, width)
        return ub[idx].reshape(len(keys), depth), us[idx].reshape(len(keys), depth)
    salt = bytes(salt)[:64]
    n = len(keys)
    buckets = np.empty((n, depth), dtype=np.int64)
    signs = np.empty((n, depth), dtype=np.int64)
    memo: dict[bytes, int] = {}
    digests: list[bytes] = []
    index = np.empty(n, dtype=np.int64)
    for i, key in enumerate(keys):
        enc = encode_key(key)
        j = memo.get(enc)
        if j is None:
            j = memo[enc] = len(digests)
            digests.append(hashlib.blake2b(enc, digest_size=64, key=salt).digest())
        index[i] = j
    raw = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(len(digests), 8, 8) \
        if digests else np.zeros((0, 8, 8), dtype=np.uint8)
    word = np.zeros((raw.shape[0], 8), dtype=np.uint64)
    for b in range(7):
        word = (word << np.uint64(8)) | raw[:, :, b].astype(np.uint64)
    uniq_b = (word % np.uint64(width)).astype(np.int64)[:, :depth]
    uniq_s = np.where(raw[:, :depth, 7] & 1, 1, -1).astype(np.int64)
    buckets[:] = uniq_b[index]
    signs[:] = uniq_s[index]
    return buckets, signs


def _labels(labels: Any, n_labels: int, n: int) -> np.ndarray:
    lab = np.asarray(labels)
    if lab.shape != (n,):
        raise InvalidRequestError(f"need one label per key: {n} keys, labels of shape {lab.shape}")
    if lab.dtype.kind not in "iub":
        raise InvalidRequestError(f"labels must be integer class indices, got dtype {lab.dtype}")
    if n and (lab.min() < 0 or lab.max() >= n_labels):
        raise InvalidRequestError(f"labels must lie in [0, {n_labels}), got range "
                                  f"[{lab.min()}, {lab.max()}]")
    return lab.astype(np.int64)


def _check_n_labels(n_labels: Any) -> int:
    if isinstance(n_labels, bool) or not isinstance(n_labels, (int, np.integer)) or n_labels < 2:
        raise InvalidRequestError(f"n_labels must be an int >= 2, got {n_labels!r}")
    return int(n_labels)


class CountTable:
    """Exact per-key, per-label counts (a dict). Non-DP: never released with noise."""

    def __init__(self, n_labels: int):
        self.n_labels = _check_n_labels(n_labels)
        self.counts: dict[bytes, np.ndarray] = {}

    def add(self, keys: Sequence[Any], labels: Any) -> None:
        """Counts each (key, label) pair."""
        lab = _labels(labels, self.n_labels, len(keys))
        for key, l in zip(keys, lab):
            enc = encode_key(key)
            row = self.counts.get(enc)
            if row is None:
                row = self.counts[enc] = np.zeros(self.n_labels, dtype=np.int64)
            row[l] += 1

    def estimate(self, keys: Sequence[Any]) -> np.ndarray:
        """``len(keys) × n_labels`` float counts (0 for unseen keys)."""
        zero = np.zeros(self.n_labels, dtype=np.int64)
        return np.array([self.counts.get(encode_key(k), zero) for k in keys],
                        dtype=np.float64).reshape(len(keys), self.n_labels)

    def key_totals(self) -> np.ndarray:
        """Total count of every observed key (for quantiles and statistics)."""
        return np.array([int(r.sum()) for r in self.counts.values()], dtype=np.int64)


class DomainTable:
    """Per-label counts over a public, declared key domain: ``len(domain) × n_labels`` cells.

    Every cell exists whatever the data (the domain is declared, never read from the data), so
    noise in every cell makes the array DP; keys outside the domain are not counted. One
    observation changes exactly one cell by +1: L1 sensitivity 1.
    """

    l1_sensitivity = 1

    def __init__(self, domain: Sequence[Any], n_labels: int):
        self.n_labels = _check_n_labels(n_labels)
        self.domain = list(domain)
        if not self.domain:
            raise InvalidRequestError("a declared key domain must not be empty")
        self.index = {encode_key(k): i for i, k in enumerate(self.domain)}
        if len(self.index) != len(self.domain):
            raise InvalidRequestError("a declared key domain must not repeat a key")
        self.cells = np.zeros((len(self.domain), self.n_labels), dtype=np.int64)

    def positions(self, keys: Sequence[Any]) -> np.ndarray:
        """Row of each key in the domain, -1 for keys outside it."""
        return np.array([self.index.get(encode_key(k), -1) for k in keys], dtype=np.int64)

    def add(self, keys: Sequence[Any], labels: Any) -> None:
        """Counts each (key, label) pair whose key is in the domain (others are dropped)."""
        lab = _labels(labels, self.n_labels, len(keys))
        pos = self.positions(keys)
        keep = pos >= 0
        np.add.at(self.cells, (pos[keep], lab[keep]), 1)

    def add_noise(self, scale: float, noise) -> None:
        """Adds independent integer (discrete) Laplace noise of ``scale`` to every cell."""
        self.cells = np.asarray(noise.discrete_laplace(self.cells, scale), dtype=np.int64)

    def estimate(self, keys: Sequence[Any]) -> np.ndarray:
        """``len(keys) × n_labels`` float counts (0 for keys outside the domain)."""
        pos = self.positions(keys)
        padded = np.vstack([self.cells, np.zeros((1, self.n_labels), dtype=np.int64)])
        return padded[pos].astype(np.float64)


class CountSketch:
    """A count-min or count-median sketch of per-label counts, ``depth × width × n_labels``.

    Args:
      kind: ``"count_min"`` (unsigned updates, min estimator) or ``"count_median"`` (signed
        updates, median of signed cells: unbiased, so robust to symmetric noise, §III.B.2).
      depth: rows ``h`` (hash functions), 1..8; the paper uses 5.
      width: columns per row, a power of two.
      n_labels: label cardinality.
      salt: hashing salt (bytes); the same salt gives the same buckets in every process.
      hash_family: ``"blake2b"`` (default) or ``"tf_siphash"`` (computable inside a TF graph).
    """

    def __init__(self, kind: str, depth: int, width: int, n_labels: int, salt: bytes,
                 hash_family: str = HASH_BLAKE2B):
        if kind not in SKETCH_KINDS:
            raise InvalidRequestError(f"sketch kind must be one of {SKETCH_KINDS}, got {kind!r}")
        self.kind = kind
        self.depth = check_depth(depth)
        self.width = check_width(width)
        self.n_labels = _check_n_labels(n_labels)
        if not isinstance(salt, (bytes, bytearray)) or not salt:
            raise InvalidRequestError("salt must be non-empty bytes")
        self.salt = bytes(salt)
        self.hash_family = check_hash_family(hash_family)
        self.cells = np.zeros((self.depth, self.width, self.n_labels), dtype=np.int64)

    @property
    def l1_sensitivity(self) -> int:
        """L1 change of :attr:`cells` when one observation is added or removed: ``depth``."""
        return self.depth

    def _hash(self, keys: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        b, s = key_hashes(keys, self.salt, self.depth, self.width, self.hash_family)
        return b, (s if self.kind == COUNT_MEDIAN else np.ones_like(s))

    def add(self, keys: Sequence[Any], labels: Any, *, hashed=None) -> None:
        """Counts each ``(key, label)`` once: +sign in one cell per row, label column only."""
        lab = _labels(labels, self.n_labels, len(keys))
        b, s = hashed if hashed is not None else self._hash(keys)
        for r in range(self.depth):
            np.add.at(self.cells[r], (b[:, r], lab), s[:, r])

    def add_noise(self, scale: float, noise) -> None:
        """Adds independent integer (discrete) Laplace noise of ``scale`` to every cell."""
        self.cells = np.asarray(noise.discrete_laplace(self.cells, scale), dtype=np.int64)

    def add_laplace_noise(self, scale: float, noise) -> None:
        """Adds independent continuous Laplace noise of ``scale`` to every cell (float cells):
        the mechanism :func:`table_event` describes, for RDP accounting."""
        self.cells = np.asarray(noise.laplace(self.cells, scale), dtype=np.float64)

    def estimate(self, keys: Sequence[Any], *, hashed=None) -> np.ndarray:
        """``len(keys) × n_labels`` float estimates: min (count-min) or median of signed cells."""
        b, s = hashed if hashed is not None else self._hash(keys)
        return self.estimate_cells(self.cells, b, s, self.kind)

    @staticmethod
    def estimate_cells(cells: np.ndarray, buckets: np.ndarray, signs: np.ndarray,
                       kind: str) -> np.ndarray:
        """Count estimates from sketch ``cells``: the minimum or median over the rows."""
        rows = np.arange(cells.shape[0])
        vals = cells[rows[None, :], buckets] * signs[:, :, None]        # n × depth × labels
        if kind == COUNT_MIN:
            return vals.min(axis=1).astype(np.float64)
        return np.median(vals, axis=1).astype(np.float64)

    def merge(self, other: "CountSketch") -> "CountSketch":
        """Cell-wise sum with a sketch of the same shape, kind and salt (a new sketch)."""
        if (other.kind, other.depth, other.width, other.n_labels, other.salt, other.hash_family) \
                != (self.kind, self.depth, self.width, self.n_labels, self.salt, self.hash_family):
            raise InvalidRequestError(
                "only sketches of the same kind, shape, salt and hash family can be summed")
        out = CountSketch(self.kind, self.depth, self.width, self.n_labels, self.salt,
                          self.hash_family)
        out.cells = self.cells + other.cells
        return out


def l1_sensitivity(n_tables: int, depth: int, k: int = 1) -> int:
    """L1 sensitivity of ``n_tables`` sketches of ``depth`` rows to any ``k`` observations."""
    for name, v in (("n_tables", n_tables), ("depth", depth), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise InvalidRequestError(f"{name} must be an int >= 1, got {v!r}")
    return int(n_tables) * int(depth) * int(k)


def table_epsilons(epsilon: float, weights: Optional[Sequence[float]] = None,
                   n_tables: Optional[int] = None) -> np.ndarray:
    """Splits ``epsilon`` over tables so that the shares sum to ``epsilon`` (composition).

    ``weights`` are *noise* weights (Pyramid §III.B.2: "less noise to low-count features"): table
    ``i`` gets ``ε_i = ε · (1/w_i) / Σ_j 1/w_j``, so its noise scale ``h k / ε_i`` is proportional
    to ``w_i``. With no weights the split is even (``ε / n_tables``).
    """
    epsilon = check_epsilon(epsilon)
    if weights is None:
        if n_tables is None:
            raise InvalidRequestError("give weights or n_tables")
        l1_sensitivity(n_tables, 1)
        return np.full(int(n_tables), epsilon / int(n_tables))
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0 or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise InvalidPrivacyParameterError(f"noise weights must be finite and > 0, got {weights!r}")
    if n_tables is not None and int(n_tables) != w.size:
        raise InvalidRequestError(f"{w.size} weights for {n_tables} tables")
    inv = 1.0 / w
    return epsilon * inv / inv.sum()


def table_event(epsilon: float, depth: int) -> dp_accounting.DpEvent:
    """The dp_accounting event of one table released with *continuous* Laplace noise of scale
    ``depth · k / epsilon`` per cell, for neighbours that differ in ``k`` observations.

    Each of the ``depth`` rows is a disjoint set of cells whose L1 change is at most ``k``, so a
    row is one Laplace mechanism with noise multiplier ``scale / k = depth / epsilon``; the rows'
    noise is independent: ``SelfComposedDpEvent(LaplaceDpEvent(depth / epsilon), depth)`` (its
    pure ε is ``epsilon``; its RDP is lower than one Laplace of L1 sensitivity ``depth · k``).

    Charge it for *continuous* Laplace cells (:meth:`CountSketch.add_laplace_noise`), the
    mechanism it describes exactly. dp_accounting has no discrete-Laplace event; numerically,
    a unit shift of a discrete Laplace has a Rényi divergence at or below the continuous one's of
    the same scale at the orders we checked, but that is not a library guarantee, so an RDP
    charge runs the continuous mechanism rather than lean on it.
    """
    epsilon = check_epsilon(epsilon)
    depth = check_depth(depth)
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.LaplaceDpEvent(noise_multiplier=depth / epsilon), depth)


def noise_scales(epsilons: Iterable[float], depth: int, k: int = 1) -> np.ndarray:
    """Discrete Laplace scale of each table: ``depth · k / ε_i`` (the table's L1 sensitivity to
    ``k`` observations over its ε share)."""
    eps = np.asarray([check_epsilon(e) for e in epsilons], dtype=np.float64)
    return l1_sensitivity(1, depth, k) / eps
