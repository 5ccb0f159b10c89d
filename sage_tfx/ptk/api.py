"""The PTK store's HTTP request bodies as typed pydantic models (the OpenAPI schema clients see).

Every number is finite; integers are JSON integers (no bool, string or float is coerced into
one); strings, lists and objects are bounded; unknown fields are refused (so an old-style
``train_dp_fn`` / ``dp_event_fn`` code reference never reaches the store); a window is flat
columns of numbers or strings. A body that does not fit is a 422 before any handler runs.
"""
from __future__ import annotations

from typing import Annotated, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sage_tfx.ptk.registry import NAME_PATTERN
from sage_tfx.ptk.store import MAX_MENU, PTK_ID_PATTERN

MAX_INT = 2 ** 53  # integers a JSON client can send exactly
MAX_COLUMNS = 256
MAX_RECORDS = 1_000_000
MAX_DOMAIN = 100_000

Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Int = Annotated[int, Field(strict=True, ge=-MAX_INT, le=MAX_INT)]
Text = Annotated[str, Field(max_length=1024)]
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
Scalar = Union[Annotated[bool, Field(strict=True)], Int, Finite, Text, None]
ConfigValue = Union[Scalar, Annotated[list[Scalar], Field(max_length=MAX_DOMAIN)],
                    Annotated[list[Annotated[list[Union[Int, Finite]], Field(max_length=1024)]],
                              Field(max_length=1024)]]
Config = Annotated[dict[Name, ConfigValue], Field(max_length=64)]
Tau = Annotated[float, Field(strict=True, gt=0, le=1, allow_inf_nan=False)]
TypeName = Annotated[str, Field(pattern=NAME_PATTERN, max_length=64)]
PTKId = Annotated[str, Field(pattern=PTK_ID_PATTERN, max_length=64)]
Column = Annotated[list[Union[Int, Finite, Text]], Field(min_length=1, max_length=MAX_RECORDS)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MenuEntry(_Body):
    """One developer-supplied profile point: ``n`` samples reach the target at ``epsilon``."""

    epsilon: Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]
    n: Annotated[int, Field(strict=True, ge=1, le=MAX_INT)]


class RegisterRequest(_Body):
    """Register a PTK of a type the operator registered (``GET /ptk-types`` lists them)."""

    ptk_type: TypeName
    tau: Tau
    train_frequency: Annotated[int, Field(strict=True, ge=1, le=100_000)] = 1
    config: Config = {}
    name: Annotated[str, Field(max_length=128)] = ""
    menu: Optional[Annotated[list[MenuEntry], Field(min_length=1, max_length=MAX_MENU)]] = None
    ptk_id: Optional[PTKId] = None


class ConfigUpdate(_Body):
    """Body of a PTK configuration update."""

    config: Config


class TauUpdate(_Body):
    """Body of a performance-target (τ) update."""

    tau: Tau


class Subscription(_Body):
    """Body of a subscription: the http(s) endpoint notified of new versions."""

    endpoint: Annotated[str, Field(pattern=r"^https?://[^\s]+$", max_length=2048)]


class Window(_Body):
    """The next window's records as flat columns (every column one number or string per
    record, all of one kind and one length)."""

    columns: Annotated[dict[Name, Column], Field(min_length=1, max_length=MAX_COLUMNS)]
    user_key: Optional[Name] = None
    window_index: Optional[Annotated[int, Field(strict=True, ge=0, le=2 ** 31)]] = None

    @model_validator(mode="after")
    def _flat_columns(self):
        lengths = {len(v) for v in self.columns.values()}
        if len(lengths) != 1:
            raise ValueError(f"columns must have one length, got {sorted(lengths)}")
        for name, values in self.columns.items():
            kinds = {isinstance(v, str) for v in values}
            if len(kinds) != 1:
                raise ValueError(f"column {name!r} mixes numbers and strings")
        if self.user_key is not None and self.user_key not in self.columns:
            raise ValueError(f"user_key {self.user_key!r} is not a column")
        return self
