"""Raw hot-window rows as bytes and back, with no pickle: numpy arrays and typed JSON in an npz.

A hot window's rows are client data, so their serialization must not run code when it is read
(a pickle would, and the files of a hot window sit in a directory other processes can write).
Columns of a numpy integer, unsigned or bool dtype are stored as themselves; every other
column (object, string, category, nullable extension types) as one JSON list, in which JSON
itself tells ``str``, ``int``, ``float``, ``bool`` and ``None`` apart (so ``True`` and ``1``,
which count as different keys, stay different) and ``bytes`` are tagged ``{"b64": ...}``. The
container is an ``.npz`` read with ``allow_pickle=False``. Other value types are refused.
"""
from __future__ import annotations

import base64
import io
import json
import math

import numpy as np
import pandas as pd

from sage_tfx.errors import InvalidRequestError

__all__ = ["encode_frame", "decode_frame"]

_FORMAT = "sage-tfx/pyramid-rows/1"


def _json_value(v, column: str):
    if v is None or v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if math.isnan(v) else float(v)   # NaN and None are one "missing" key
    if isinstance(v, str):
        return str(v)
    if isinstance(v, (bytes, np.bytes_)):
        return {"b64": base64.b64encode(bytes(v)).decode("ascii")}
    raise InvalidRequestError(
        f"column {column!r} holds a {type(v).__name__} value: observations hold str, bytes, "
        "int, bool, float or missing values")


def _from_json(v):
    return base64.b64decode(v["b64"]) if isinstance(v, dict) else v


def encode_frame(frame: pd.DataFrame) -> bytes:
    """The rows of ``frame`` (index dropped) as bytes :func:`decode_frame` reads back.

    Raises:
      InvalidRequestError: a value of a type other than str, bytes, int, bool, float or missing.
    """
    arrays, columns = {}, []
    for i, name in enumerate(frame.columns):
        col = frame[name]
        native = isinstance(col.dtype, np.dtype) and col.dtype.kind in "iub"
        if native:
            arrays[f"c{i}"] = col.to_numpy()
        else:
            values = col.tolist()
            if pd.api.types.infer_dtype(values, skipna=False) != "string":
                values = [_json_value(v, str(name)) for v in values]
            text = json.dumps(values, ensure_ascii=False, allow_nan=False)
            arrays[f"c{i}"] = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        columns.append({"name": str(name), "dtype": str(col.dtype), "native": native})
    meta = {"format": _FORMAT, "columns": columns, "rows": len(frame)}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def decode_frame(data: bytes) -> pd.DataFrame:
    """The frame :func:`encode_frame` wrote (never unpickles anything)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        meta = json.loads(z["meta"].tobytes().decode("utf-8"))
        if meta.get("format") != _FORMAT:
            raise InvalidRequestError(f"not a Pyramid rows file: {meta.get('format')!r}")
        out = {}
        for i, c in enumerate(meta["columns"]):
            raw = z[f"c{i}"]
            if c["native"]:
                out[c["name"]] = pd.Series(raw, dtype=raw.dtype)
                continue
            values = [_from_json(v) for v in json.loads(raw.tobytes().decode("utf-8"))]
            col = pd.Series(values, dtype=object)
            out[c["name"]] = col if c["dtype"] == "object" else col.astype(c["dtype"])
    frame = pd.DataFrame(out, columns=[c["name"] for c in meta["columns"]])
    if len(frame) != meta["rows"]:
        raise InvalidRequestError("a Pyramid rows file lost rows")
    return frame
