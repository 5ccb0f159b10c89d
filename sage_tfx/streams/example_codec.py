"""Serializes ``tf.train.Example`` records without TensorFlow.

The splitter writes every CSV row as an Example. Building the protobuf objects cost about as much
as the rest of the split together (tens of microseconds per row here, even with the cpp protobuf
implementation), and needed TensorFlow in every reader. The wire format of Example is small and
frozen, so it is encoded here by hand; the slow test suite checks the bytes against TensorFlow's
own parser.

Wire format (tensorflow/core/example/{example,feature}.proto)::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }   // entry { string key = 1; Feature value = 2;
    } Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                             Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }
"""

from __future__ import annotations

import math
import struct
from typing import Callable, Mapping, Sequence, Union

# Value types of a feature: int -> int64_list, float -> float_list (float32), string -> bytes_list.
INT, FLOAT, STRING = "int", "float", "string"
SCHEMA_TYPES = (INT, FLOAT, STRING)

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
_UINT64_MASK = (1 << 64) - 1
_pack_float32 = struct.Struct("<f").pack

Value = Union[int, float, str, bytes]


def _varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _int_feature(value: int) -> bytes:
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"{value} is outside int64")
    # A negative int64 is the varint of its two's complement (10 bytes).
    payload = _varint(value & _UINT64_MASK)
    # Feature.int64_list (tag 0x1a) { value (tag 0x0a, packed) }; payload <= 10 bytes.
    return b"\x1a" + bytes((len(payload) + 2, 0x0A, len(payload))) + payload


def _float_feature(value: float) -> bytes:
    try:
        packed = _pack_float32(value)
    except OverflowError:  # beyond float32 range: protobuf stores +-inf, and so do we
        packed = _pack_float32(math.copysign(math.inf, value))
    # Feature.float_list (tag 0x12, 6 bytes) { value (tag 0x0a, packed, 4 bytes) }.
    return b"\x12\x06\x0a\x04" + packed


def _bytes_feature(value: Union[str, bytes]) -> bytes:
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    # Feature.bytes_list (tag 0x0a) { value (tag 0x0a) }.
    inner = b"\x0a" + _varint(len(data)) + data
    return b"\x0a" + _varint(len(inner)) + inner


_FEATURE_ENCODERS: dict[str, Callable[[Value], bytes]] = {
    INT: _int_feature, FLOAT: _float_feature, STRING: _bytes_feature}


def encode_feature(type_: str, value: Value) -> bytes:
    """Serialized ``tf.train.Feature`` holding one value of a schema type.

    Raises:
      ValueError: an unknown type, or an int outside int64.
    """
    if type_ not in _FEATURE_ENCODERS:
        raise ValueError(f"type must be one of {SCHEMA_TYPES}, got {type_!r}")
    return _FEATURE_ENCODERS[type_](value)


class ExampleEncoder:
    """Serializes records with a fixed schema as ``tf.train.Example`` (one value per feature).

    Args:
      types: feature name -> "int" | "float" | "string".

    Raises:
      ValueError: an unknown type.
    """

    def __init__(self, types: Mapping[str, str]):
        bad = {k: v for k, v in types.items() if v not in SCHEMA_TYPES}
        if bad:
            raise ValueError(f"types must be one of {SCHEMA_TYPES}, got {bad}")
        self._fields = {}
        for name, type_ in types.items():
            key = name.encode("utf-8")
            # The map entry's key field (tag 0x0a) is the same for every record: build it once.
            self._fields[name] = (_FEATURE_ENCODERS[type_], b"\x0a" + _varint(len(key)) + key)

    def entry(self, name: str, value: Value) -> bytes:
        """One feature as a serialized ``Features.feature`` map entry; see ``join``.

        Entries of repeated values can be memoized by the caller: a record is just the
        concatenation of its entries.

        Raises:
          KeyError: a name not in the schema.
          ValueError: an int outside int64.
        """
        encode, key_field = self._fields[name]
        feature = encode(value)
        entry = key_field + b"\x12" + _varint(len(feature)) + feature
        return b"\x0a" + _varint(len(entry)) + entry

    @staticmethod
    def join(entries: Sequence[bytes]) -> bytes:
        """The serialized Example made of map entries from ``entry`` (each name at most once)."""
        if not entries:
            return b""  # an Example with no features serializes to nothing
        body = b"".join(entries)
        return b"\x0a" + _varint(len(body)) + body

    def encode(self, values: Mapping[str, Union[Value, None]]) -> bytes:
        """The serialized Example; None values are left out (absent features).

        Raises:
          KeyError: a name not in the schema.
          ValueError: an int outside int64.
        """
        return self.join([self.entry(name, value) for name, value in values.items()
                          if value is not None])


def encode_example(values: Mapping[str, Union[Value, None]], types: Mapping[str, str]) -> bytes:
    """Serialized ``tf.train.Example`` of one record (see ``ExampleEncoder``)."""
    return ExampleEncoder(types).encode(values)
