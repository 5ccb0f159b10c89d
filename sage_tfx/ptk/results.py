"""What the PTK store returns, as frozen dataclasses (like the ledger's ``Grant`` and ``Release``).

Rows of the lake (:class:`PTKRecord`, :class:`PTKVersion`, :class:`ProfileRun`,
:class:`WindowInfo`, :class:`OutboxEntry`) and results of the API (:class:`Lineage`,
:class:`Trained`, :class:`Delivery`, :class:`WindowResult`, :class:`ProfileNeed`); the plan is
an :class:`~sage_tfx.ptk.allocator.Allocation`. Lists become tuples; JSON objects (a config, a
DP state, a profile record) stay dicts. ``to_dict()`` is the JSON form the HTTP service and the
CLI send: the same keys as before these types existed (a field that is None and absent from
that form, such as ``Trained.skipped`` on a trained PTK, is left out).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional


def _frozen(x: Any) -> Any:
    return tuple(_frozen(v) for v in x) if isinstance(x, list) else x


def plain(x: Any) -> Any:
    """``x`` in JSON form: results via ``to_dict()``, tuples as lists."""
    if hasattr(x, "to_dict"):
        return x.to_dict()
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    return x


@dataclasses.dataclass(frozen=True)
class _Result:

    def __post_init__(self):
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _frozen(getattr(self, f.name)))

    @classmethod
    def from_row(cls, row: dict):
        """From a dict with (at least) every field's key; other keys are ignored."""
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls)})

    def to_dict(self) -> dict:
        """The JSON form (tuples as lists; fields that default to None left out while None)."""
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)
                if not (f.default is None and getattr(self, f.name) is None)}


@dataclasses.dataclass(frozen=True)
class PTKRecord(_Result):
    """A PTK in the registry: its type, config, target τ, frequency, status and menu
    ``((ε, δ, n), ...)``, and the profile record (how the menu was found)."""

    ptk_id: str
    name: str
    ptk_type: Optional[str]
    train_dp_ref: str
    eval_ref: str
    dp_event_ref: str
    erm_ref: Optional[str]
    config: dict
    tau: float
    train_frequency: int
    status: str
    menu: tuple
    profile: Optional[dict]
    registered_window: Optional[int]
    created_at: str
    updated_at: str


@dataclasses.dataclass(frozen=True)
class Lineage(_Result):
    """Where a version came from: window, blocks, charged ε/δ/event, grant and run ids."""

    ptk_id: str
    version: int
    window_index: int
    blocks: tuple
    epsilon: float
    delta: float
    event: str
    grant_id: str
    run_id: str
    stream: str
    n_used: int
    partition_index: int
    oldest_window: int
    newest_window: int


@dataclasses.dataclass(frozen=True)
class PTKVersion(Lineage):
    """One trained version of a PTK: its lineage, DP state and config."""

    state: Any
    config: dict
    created_at: str


@dataclasses.dataclass(frozen=True)
class ProfileRun(_Result):
    """A profile run recorded before its charge (status pending, released, refused, ...)."""

    run_id: str
    ptk_id: str
    spec: dict
    window_index: int
    status: str
    created_at: str


@dataclasses.dataclass(frozen=True)
class WindowInfo(_Result):
    """A training window: its block files, blocks ``((block id, "p" | "t", records), ...)``,
    the plan it trains under, its columns (``schema``: ``((name, "number" | "string"), ...)``)
    and the PTKs of the plan they do not fit (``unfit``: id -> why; None before windows
    recorded them)."""

    window_index: int
    status: str
    files: tuple
    blocks: tuple
    records: int
    plan_seq: Optional[int]
    opened_at: str
    closed_at: Optional[str]
    schema: Optional[tuple] = None
    unfit: Optional[dict] = None


@dataclasses.dataclass(frozen=True)
class OutboxEntry(_Result):
    """A notification of a version to one subscriber endpoint, and how its delivery went."""

    ptk_id: str
    version: int
    endpoint: str
    attempts: int
    status: str
    last_error: Optional[str]


@dataclasses.dataclass(frozen=True)
class Delivery(_Result):
    """One delivery attempt of a notification: delivered, pending (retried) or failed."""

    ptk_id: str
    version: int
    endpoint: str
    status: str
    error: Optional[str]


@dataclasses.dataclass(frozen=True)
class Trained(_Result):
    """One due PTK of a window run: the version trained (``version``, ``n_used`` records for
    its allocated ``n`` at ``epsilon``, under ``grant_id``), or why it was ``skipped``."""

    ptk_id: str
    version: Optional[int] = None
    n_used: Optional[int] = None
    n: Optional[int] = None
    epsilon: Optional[float] = None
    grant_id: Optional[str] = None
    skipped: Optional[str] = None

    @property
    def trained(self) -> bool:
        """True when the PTK trained in this window (``skipped`` says why not)."""
        return self.skipped is None


@dataclasses.dataclass(frozen=True)
class WindowResult(_Result):
    """A window boundary: the window opened, what its run trained, the notifications sent."""

    window: int
    trained: tuple[Trained, ...]
    delivered: tuple[Delivery, ...]


@dataclasses.dataclass(frozen=True)
class ProfileNeed(_Result):
    """What one profiled registration with target ``tau`` needs (Fig. 3): records per menu
    entry, the profile set and the window holding it, and the ε charged to the profile
    blocks."""

    tau: float
    m: int
    T: int  # noqa: N815 - the paper's name
    per_entry: int
    profile_records: int
    window_records: int
    epsilon: float
