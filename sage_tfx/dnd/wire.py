"""The compact binary encoding of a returned update (``application/x-sage-dnd-update``).

A body is a 28-byte little-endian header followed by the weights::

    offset  size  field
    0       4     magic b"DNDU"
    4       1     version (1)
    5       1     dtype: 4 = float32, 8 = float64 (the item size in bytes)
    6       2     reserved, 0
    8       4     count: the number of weights (uint32; must be the model's dim)
    12      16    the ticket (its 32 hex digits as 16 bytes; must be the URL's ticket)
    28      ...   count little-endian IEEE-754 numbers of that dtype

float32 halves the body (a returned model carries noise far larger than float32's rounding,
≈ 6·10⁻⁸ relative); float64 is exact. The server parses it with ``numpy.frombuffer`` after
checking every header field and the exact length, then refuses non-finite weights and weights
beyond ±``limit``: all of these are :class:`WireFormatError` (HTTP 422), never a server error.
The header makes a body self-describing (a truncated, padded, mistyped or misdirected body is
refused by its length, dtype or ticket). Draws answer in the same format with the drawn
instance as float64 when the client accepts it.
"""
from __future__ import annotations

import struct

import numpy as np

from sage_tfx.errors import InvalidRequestError

__all__ = ["UPDATE_TYPE", "HEADER", "MAGIC", "VERSION", "DTYPES", "WireFormatError",
           "encode_update", "decode_update"]

UPDATE_TYPE = "application/x-sage-dnd-update"
MAGIC = b"DNDU"
VERSION = 1
HEADER = struct.Struct("<4sBBHI16s")
DTYPES = {4: np.dtype("<f4"), 8: np.dtype("<f8")}
_NAMES = {"float32": 4, "f4": 4, "<f4": 4, "float64": 8, "f8": 8, "<f8": 8}


class WireFormatError(InvalidRequestError):
    """A malformed binary update (bad header, length, dtype, ticket or weights)."""


def _ticket_bytes(ticket: str) -> bytes:
    try:
        raw = bytes.fromhex(ticket)
    except (TypeError, ValueError):
        raw = b""
    if len(raw) != 16:
        raise WireFormatError("a ticket is 32 hex digits")
    return raw


def encode_update(ticket: str, weights, dtype: str = "float32") -> bytes:
    """The body of an update (or a drawn instance) for ``ticket``: header + little-endian
    ``dtype`` ("float32" or "float64") weights."""
    size = _NAMES.get(str(dtype))
    if size is None:
        raise WireFormatError(f"dtype must be float32 or float64, got {dtype!r}")
    w = np.ascontiguousarray(weights, dtype=DTYPES[size])
    if w.ndim != 1:
        raise WireFormatError("weights must be a vector")
    return HEADER.pack(MAGIC, VERSION, size, 0, w.size, _ticket_bytes(ticket)) + w.tobytes()


def decode_update(body: bytes, *, dim: int, ticket: str, limit: float = 1e100) -> np.ndarray:
    """The float64 weights of a body for ``ticket`` and a ``dim``-weight model.

    Raises:
      WireFormatError: short body, wrong magic, version, dtype, reserved bits, count, length or
        ticket; a NaN, an infinity or a weight beyond ±``limit``.
    """
    if len(body) < HEADER.size:
        raise WireFormatError(f"a binary update starts with a {HEADER.size}-byte header")
    magic, version, size, reserved, count, raw = HEADER.unpack_from(body)
    if magic != MAGIC or version != VERSION or reserved != 0:
        raise WireFormatError(f"not a version-{VERSION} {UPDATE_TYPE} body")
    if size not in DTYPES:
        raise WireFormatError(f"dtype code {size}: only 4 (float32) and 8 (float64)")
    if count != dim:
        raise WireFormatError(f"the body holds {count} weights; the model has {dim}")
    if len(body) != HEADER.size + size * count:
        raise WireFormatError(f"expected {HEADER.size + size * count} bytes ({count} "
                              f"{DTYPES[size].name} after the header), got {len(body)}")
    if raw != _ticket_bytes(ticket):
        raise WireFormatError("the body is for another ticket")
    u = np.frombuffer(body, dtype=DTYPES[size], count=count, offset=HEADER.size)
    u = u.astype(np.float64)
    if not np.all(np.isfinite(u)) or float(np.max(np.abs(u), initial=0.0)) > limit:
        raise WireFormatError(f"weights must be finite and within ±{limit:g}")
    return u
