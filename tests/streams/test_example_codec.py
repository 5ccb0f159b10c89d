"""tf.train.Example serialization without TensorFlow: golden bytes (fast) and TF cross-check (slow).
"""

import math
import random
import struct

import pytest

from sage_tfx.streams import example_codec
from sage_tfx.streams.example_codec import ExampleEncoder, encode_example

# Produced by tf.train.Example(...).SerializeToString() with TF 2.15.1.
GOLDEN = [
    ({"a": -1}, {"a": "int"},
     b"\n\x15\n\x13\n\x01a\x12\x0e\x1a\x0c\n\n\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"),
    ({"x": 0.5}, {"x": "float"}, b"\n\x0f\n\r\n\x01x\x12\x08\x12\x06\n\x04\x00\x00\x00?"),
    ({"s": "é"}, {"s": "string"}, b"\n\r\n\x0b\n\x01s\x12\x06\n\x04\n\x02\xc3\xa9"),
    ({"t": 1357035300}, {"t": "int"},
     b"\n\x10\n\x0e\n\x01t\x12\t\x1a\x07\n\x05\xa4\xee\x8a\x87\x05"),
]


@pytest.mark.parametrize("values, types, expected", GOLDEN)
def test_golden_bytes(values, types, expected):
    assert encode_example(values, types) == expected


def test_none_values_are_absent_and_empty_example_is_empty():
    types = {"a": "int", "b": "string"}
    assert encode_example({"a": None, "b": None}, types) == b""
    assert encode_example({"a": -1, "b": None}, types) == GOLDEN[0][2]


def test_entries_join_to_the_record():
    enc = ExampleEncoder({"a": "int", "x": "float"})
    assert enc.join([enc.entry("a", -1)]) == GOLDEN[0][2]
    assert enc.encode({"a": -1, "x": 0.5}) == enc.join([enc.entry("a", -1), enc.entry("x", 0.5)])


@pytest.mark.parametrize("type_, value", [("int", 2 ** 63), ("int", -(2 ** 63) - 1)])
def test_int_out_of_range(type_, value):
    with pytest.raises(ValueError, match="int64"):
        example_codec.encode_feature(type_, value)


def test_unknown_type():
    with pytest.raises(ValueError):
        ExampleEncoder({"a": "double"})
    with pytest.raises(ValueError):
        example_codec.encode_feature("double", 1.0)


def test_float_beyond_float32_is_infinite():
    feature = example_codec.encode_feature("float", -1e300)
    assert struct.unpack("<f", feature[-4:])[0] == -math.inf


@pytest.mark.slow
def test_matches_tensorflow_parser():
    """Random records: TF parses our bytes into exactly the values we encoded."""
    import numpy as np
    import tensorflow as tf

    rng = random.Random(11)
    types = {"i": "int", "f": "float", "s": "string", "b": "string", "long name ü": "int"}
    ints = [0, 1, -1, 127, 128, 2 ** 31, -(2 ** 31), 2 ** 63 - 1, -(2 ** 63), 1357035300]
    floats = [0.0, -0.0, 0.5, 1e-45, 3.4e38, 1e39, -1e39, float("nan"), float("inf"), 1357000200.5]
    for _ in range(500):
        values = {
            "i": rng.choice(ints + [rng.randint(-(2 ** 63), 2 ** 63 - 1)]),
            "f": rng.choice(floats + [rng.uniform(-1e6, 1e6)]),
            "s": rng.choice(["", "a", "é漢字", "x" * 300, "comma, \"quote\"\nnewline"]),
            "b": rng.choice([None, b"\x00\xff", b""]),
            "long name ü": rng.choice([None, rng.randint(-5, 5)]),
        }
        serialized = encode_example(values, types)
        parsed = tf.train.Example.FromString(serialized)
        expected = tf.train.Example()
        for name, value in values.items():
            if value is None:
                continue
            feature = expected.features.feature[name]
            if types[name] == "int":
                feature.int64_list.value.append(value)
            elif types[name] == "float":
                feature.float_list.value.append(
                    float(np.float32(value)) if abs(value) < 3.5e38 or math.isnan(value)
                    else math.copysign(math.inf, value))
            else:
                feature.bytes_list.value.append(value.encode() if isinstance(value, str) else value)
        # Same bytes as TF's own serializer, up to map-entry order.
        assert len(serialized) == len(parsed.SerializeToString())
        if math.isnan(values["f"]):  # NaN != NaN: compare it apart
            assert math.isnan(parsed.features.feature["f"].float_list.value[0])
            del parsed.features.feature["f"], expected.features.feature["f"]
        assert parsed == expected
