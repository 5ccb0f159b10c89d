"""k independent partitions of the privacy units into n chunks by a keyed hash (DP bagging §4).

The paper draws k random balanced partitions and slices them by ``|D|/n``. Slicing an index by
position is not stable under neighbouring datasets: when |D| crosses a multiple of n every chunk
boundary moves (and leftovers are dropped), so adding one unit can change every teacher. Here a
unit's chunk in partition i is ``H(salt, i, unit) mod n`` for a keyed hash H (BLAKE2b keyed by the
salt, then a SplitMix64 finaliser per partition). A unit's chunks depend on that unit alone, so
adding or removing one unit changes the training set of exactly k teachers — one per partition —
which is the neighbourhood the privacy analysis assumes. Chunks are balanced in expectation
(multinomial sizes), not exactly: exact balance is what makes the positional split unstable.

The privacy unit is a declared key (a user id for user-level streams): every row of one unit
lands in the same chunk of every partition.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from sage_tfx.errors import InvalidRequestError

__all__ = ["chunk_assignment", "unit_digests", "check_shape"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def check_shape(k, n) -> tuple[int, int]:
    """k partitions and n chunks per partition: integers >= 1 (bool is not an integer here)."""
    for name, v in (("k (partitions)", k), ("n (teachers per partition)", n)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < 1:
            raise InvalidRequestError(f"{name} must be an integer >= 1, got {v!r}")
    return int(k), int(n)


def _unit_bytes(u) -> bytes:
    if isinstance(u, (bytes, bytearray)):
        return b"b:" + bytes(u)
    if isinstance(u, (bool, np.bool_)):
        raise InvalidRequestError("a privacy unit id must be an int, str or bytes, not a bool")
    if isinstance(u, (int, np.integer)):
        return b"i:" + str(int(u)).encode()
    if isinstance(u, str):
        return b"s:" + u.encode("utf-8")
    raise InvalidRequestError(
        f"a privacy unit id must be an int, str or bytes, got {type(u).__name__}")


def unit_digests(units: Sequence, salt: bytes) -> np.ndarray:
    """64-bit keyed BLAKE2b digest of each unit id (uint64 array)."""
    if not isinstance(salt, (bytes, bytearray)) or not 1 <= len(salt) <= 64:
        raise InvalidRequestError("salt must be 1..64 bytes")
    out = np.empty(len(units), dtype=np.uint64)
    for idx, u in enumerate(units):
        d = hashlib.blake2b(_unit_bytes(u), key=bytes(salt), digest_size=8).digest()
        out[idx] = int.from_bytes(d, "little")
    return out


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def chunk_assignment(units: Sequence, *, k: int, n: int, salt: bytes) -> np.ndarray:
    """Chunk of every unit in each of the k partitions: int32 array [len(units), k] in [0, n).

    Repeated ids (several rows of one unit) get identical rows. Memory is O(N·k) integers; the
    dense one-hot [N, k, n] membership is never built.
    """
    k, n = check_shape(k, n)
    digests = unit_digests(units, salt)
    out = np.empty((len(units), k), dtype=np.int32)
    with np.errstate(over="ignore"):
        for i in range(k):
            key = _splitmix(np.array([i + 1], dtype=np.uint64))[0]
            out[:, i] = (_splitmix(digests ^ key) % np.uint64(n)).astype(np.int32)
    return out
