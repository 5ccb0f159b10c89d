"""The value checks behind the DP Trainer's allow-lists: what a setting in a configuration may be.

A model's, loss's or optimizer's configuration (``architecture.py``, ``objectives.py``) holds
settings, never data: scalars, short strings, short numeric lists, and serialized objects of
allowed stock classes. Every refusal names where it was found and why.
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterable

from sage_tfx.errors import InvalidRequestError

MAX_NUMERIC_LIST = 64     # shapes, axes, bucket boundaries; longer lists hold data, not settings
MAX_STRING = 128
_STRING_RE = re.compile(r"^[\w.,:/\->\[\] ]*$")


class ArchitectureError(InvalidRequestError):
    """A model, loss or optimizer configuration the DP Trainer will not build."""


def fail(path: str, why: str) -> ArchitectureError:
    return ArchitectureError(f"the model_fn's model at {path}: {why}")


def is_ref(value: Any) -> bool:
    """A functional-config tensor reference: [layer name, node index, tensor index(, kwargs)]."""
    return (isinstance(value, list) and len(value) in (3, 4) and isinstance(value[0], str)
            and isinstance(value[1], int) and isinstance(value[2], int)
            and (len(value) == 3 or isinstance(value[3], dict)))


def check_scalar(path: str, value: Any) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise fail(path, f"non-finite number {value!r}")
        return
    if isinstance(value, str):
        if len(value) > MAX_STRING or not _STRING_RE.match(value):
            raise fail(path, f"the string {value[:40]!r}… is not a setting (at most "
                              f"{MAX_STRING} characters of letters, digits and ._,:/->[] )")
        return
    raise fail(path, f"unexpected value of type {type(value).__name__}")


def check_plain(path: str, value: Any) -> None:
    """A configuration value made of scalars, short numeric lists and dicts of those."""
    if isinstance(value, dict):
        if "class_name" in value:
            raise fail(path, f"serialized object {value.get('class_name')!r} where a setting "
                              "was expected")
        for k, v in value.items():
            if not isinstance(k, str):
                raise fail(path, "non-string key")
            check_scalar(f"{path}.{k}", k)
            check_plain(f"{path}.{k}", v)
        return
    if isinstance(value, (list, tuple)):
        flat = list(flatten(value))
        if sum(1 for v in flat if isinstance(v, (int, float)) and not isinstance(v, bool)) \
                > MAX_NUMERIC_LIST:
            raise fail(path, f"a list of more than {MAX_NUMERIC_LIST} numbers is data, not a "
                              "setting: constants computed from data belong in the DP Transform")
        for i, v in enumerate(value):
            check_plain(f"{path}[{i}]", v)
        return
    check_scalar(path, value)


def flatten(value: Any) -> Iterable[Any]:
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from flatten(v)
    else:
        yield value


def check_object(path: str, value: Any, allowed: frozenset, what: str) -> None:
    """A serialized Keras object ({class_name, config}) of an allowed stock class, or None."""
    if value is None:
        return
    if not isinstance(value, dict) or not isinstance(value.get("class_name"), str):
        raise fail(path, f"expected a serialized {what}, got {value!r}")
    name = value["class_name"]
    if name not in allowed or value.get("registered_name") not in (None, name):
        raise fail(path, f"{what} {value.get('registered_name') or name!r} is not a stock Keras "
                          f"{what} (allowed: {sorted(allowed)})")
    config = value.get("config") or {}
    if name == "Constant":
        v = config.get("value")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise fail(path, "a Constant initializer may hold one number, not an array")
    for k, v in config.items():
        check_plain(f"{path}.{k}", v)


def numbers(value: Any) -> int:
    """How many numbers a call argument holds (tensor references' indices not counted)."""
    if is_ref(value):
        return numbers(value[3]) if len(value) == 4 else 0
    if isinstance(value, dict):
        return sum(numbers(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(numbers(v) for v in value)
    return int(isinstance(value, (int, float)) and not isinstance(value, bool))
