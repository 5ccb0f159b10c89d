"""The ledger's value objects: streams, blocks, grants, decisions and window policies.

Immutable (frozen dataclasses) and free of storage: :mod:`sage_tfx.ledger.core` builds them from
database rows. Names follow Sage §3.2: a *stream* is split into *blocks*, a *request* over blocks
(explicit, or a :class:`Window`) yields a *decision*, and a granted decision carries a *grant*.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import re
from decimal import Decimal
from typing import Any, NamedTuple, Optional

from dp_accounting import dp_event as dp_event_lib

from sage_tfx.errors import GrantStateError, InvalidRequestError
from sage_tfx.ledger import accounting
from sage_tfx.ledger.names import DEFAULT_CONTEXT  # noqa: F401  (defined there)

ACTIVE = "active"
RETIRED = "retired"
RESERVED = "reserved"
RELEASED = "released"
CANCELLED = "cancelled"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")


def now() -> str:
    """The current UTC time as ISO-8601 with microseconds (the ledger's timestamps)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")


def check_name(kind: str, name: Any) -> str:
    """Returns ``name`` if it is a valid stream / context / block / run id; else raises."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidRequestError(
            f"{kind} must be 1-128 characters of letters, digits, '_', '.', ':' or '-' "
            f"starting with a letter or digit, got {name!r}")
    return name


@dataclasses.dataclass(frozen=True, eq=False)
class Stream:
    """A stream's configuration: global cap, accounting mode, block granularity, contexts."""

    name: str
    epsilon_g: float
    delta_g: float
    mode: str
    granularity: str
    contexts: tuple[str, ...]
    retire_epsilon: float
    orders: tuple[float, ...]
    created_at: str = ""

    @functools.cached_property
    def caps(self) -> tuple[float, ...]:
        """Per-order caps of the RDP filter (empty in basic mode)."""
        if self.mode != accounting.RDP:
            return ()
        return accounting.rdp_caps(self.epsilon_g, self.delta_g, self.orders)

    @functools.cached_property
    def exact_caps(self) -> tuple[Decimal, Decimal]:
        """(ε_g, δ_g) as exact decimals, for basic-mode sums."""
        return accounting.exact(self.epsilon_g), accounting.exact(self.delta_g)


@dataclasses.dataclass(frozen=True)
class BlockSpec:
    """A block to register: its id, storage location and half-open [start, end) description.

    An encrypted block also carries its data key, wrapped by the key-encryption key
    (``wrapped_key``) and that KEK's id (``kek_id``): both are registered with the block, in the
    same transaction (:mod:`sage_tfx.ledger.blockkeys`).
    """

    block_id: str
    location: str
    start: Optional[str] = None
    end: Optional[str] = None
    records: Optional[int] = None
    wrapped_key: Optional[bytes] = dataclasses.field(default=None, repr=False)
    kek_id: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class BlockState:
    """A block's budget state in one context."""

    stream: str
    context: str
    block_id: str
    seq: int
    location: str
    start: Optional[str]
    end: Optional[str]
    records: Optional[int]
    status: str
    epsilon_spent: float
    delta_spent: float
    charges: int

    @property
    def active(self) -> bool:
        """True if the block can still be granted."""
        return self.status == ACTIVE


class GrantedBlock(NamedTuple):
    """A block of a grant; ``location`` is None until the grant is released."""

    block_id: str
    location: Optional[str]


@dataclasses.dataclass(frozen=True)
class Grant:
    """The ledger's permission for one run to read ``blocks`` at the charged privacy cost."""

    grant_id: str
    run_id: str
    stream: str
    context: str
    mode: str
    epsilon: Optional[float]
    delta: Optional[float]
    event: Optional[dp_event_lib.DpEvent]
    blocks: tuple[GrantedBlock, ...]
    status: str
    created_at: str

    @property
    def block_ids(self) -> tuple[str, ...]:
        """The granted block ids, in grant order."""
        return tuple(b.block_id for b in self.blocks)

    @property
    def locations(self) -> tuple[str, ...]:
        """Storage locations of the granted blocks.

        Raises:
          GrantStateError: the grant was not released, so it carries no locations.
        """
        if self.status != RELEASED:
            raise GrantStateError(f"grant {self.grant_id} is {self.status}: no data released")
        return tuple(b.location for b in self.blocks)  # type: ignore[misc]

    def to_dict(self) -> dict:
        """A JSON-able dict of the grant (the event serialized by the ledger's accounting)."""
        return {
            "grant_id": self.grant_id, "run_id": self.run_id, "stream": self.stream,
            "context": self.context, "mode": self.mode, "epsilon": self.epsilon,
            "delta": self.delta,
            "event": accounting.event_to_dict(self.event) if self.event is not None else None,
            "blocks": [[b.block_id, b.location] for b in self.blocks],
            "status": self.status, "created_at": self.created_at,
        }

    def to_json(self) -> str:
        """Canonical JSON of the grant (sorted keys)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "Grant":
        """Inverse of :meth:`to_dict`."""
        return cls(
            grant_id=d["grant_id"], run_id=d["run_id"], stream=d["stream"],
            context=d["context"], mode=d["mode"], epsilon=d["epsilon"], delta=d["delta"],
            event=accounting.event_from_dict(d["event"]) if d.get("event") else None,
            blocks=tuple(GrantedBlock(b, loc) for b, loc in d["blocks"]),
            status=d["status"], created_at=d["created_at"])

    @classmethod
    def from_json(cls, text: str) -> "Grant":
        """Inverse of :meth:`to_json`."""
        return cls.from_dict(json.loads(text))


@dataclasses.dataclass(frozen=True)
class Decision:
    """The outcome of a request: a grant, or a denial with its reason."""

    granted: bool
    grant: Optional[Grant] = None
    reason: str = ""
    replayed: bool = False


@dataclasses.dataclass(frozen=True)
class Window:
    """A window policy: the ``last`` most recent blocks that have budget left for the charge.

    ``min_blocks`` (default: ``last``) is how many must qualify for the request to be granted.
    """

    last: int
    min_blocks: Optional[int] = None

    def __post_init__(self):
        if isinstance(self.last, bool) or not isinstance(self.last, int) or self.last < 1:
            raise InvalidRequestError(f"Window.last must be an integer ≥ 1, got {self.last!r}")
        if self.min_blocks is not None and (
                isinstance(self.min_blocks, bool) or not isinstance(self.min_blocks, int)
                or not 1 <= self.min_blocks <= self.last):
            raise InvalidRequestError(
                f"Window.min_blocks must be an integer in [1, last], got {self.min_blocks!r}")

    @property
    def required(self) -> int:
        """The fewest blocks the window needs (``min_blocks``, else ``last``)."""
        return self.last if self.min_blocks is None else self.min_blocks

