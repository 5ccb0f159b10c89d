"""Named views of the ledger's database rows, and the value objects built from them, so
:mod:`~sage_tfx.ledger.core` reads columns by name rather than by position.

Each ``NamedTuple`` lists the columns of one SELECT in order; where the SELECT is a plain column
list it is built from the fields (``*_SELECT``), so the two cannot drift apart.
"""
from __future__ import annotations

import collections
import dataclasses
import json
from typing import NamedTuple, Optional, Sequence

from sage_tfx.ledger import accounting, budget
from sage_tfx.ledger.values import BlockState, Grant, GrantedBlock, Stream


class StreamRow(NamedTuple):
    """A ``streams`` row (``contexts`` and ``orders`` are JSON lists)."""

    stream: str
    epsilon_g: float
    delta_g: float
    mode: str
    granularity: Optional[str]
    contexts: str
    retire_epsilon: Optional[float]
    orders: str
    created_at: str


class BlockRow(NamedTuple):
    """A block with its budget in one context: ``blocks b JOIN budgets u`` (``BLOCK_SELECT``)."""

    stream: str
    context: str
    block_id: str
    seq: int
    location: str
    start_ts: Optional[str]
    end_ts: Optional[str]
    records: Optional[int]
    status: str
    eps_spent: str
    delta_spent: str
    rdp: Optional[str]
    charges: int


class BudgetRow(NamedTuple):
    """A request-path row of ``LedgerStore.budget_rows`` / ``window_rows``: a block's budget in
    one context (locked on PostgreSQL), its location, and the budget row's ``id``."""

    block_id: str
    seq: int
    status: str
    eps_spent: str
    delta_spent: str
    rdp: Optional[str]
    location: str
    id: int


# A ``grants`` row as a Grant is built from it: the columns are named and ordered as Grant's
# fields (``blocks`` holds a JSON list of block ids, ``event`` a DpEvent's JSON or None).
GrantRow = collections.namedtuple("GrantRow", [f.name for f in dataclasses.fields(Grant)])


STREAM_SELECT = f"SELECT {', '.join(StreamRow._fields)} FROM streams "
GRANT_SELECT = f"SELECT {', '.join(GrantRow._fields)} FROM grants "
_BLOCK_SIDE = {"stream": "b", "block_id": "b", "seq": "b", "location": "b", "start_ts": "b",
               "end_ts": "b", "records": "b"}  # the others are the budget's (u)
BLOCK_SELECT = ("SELECT " + ", ".join(f"{_BLOCK_SIDE.get(c, 'u')}.{c}" for c in BlockRow._fields)
                + " FROM blocks b JOIN budgets u ON u.stream = b.stream"
                " AND u.block_id = b.block_id ")


def stream_of(row: Sequence) -> Stream:
    """The :class:`Stream` of a ``STREAM_SELECT`` row."""
    r = StreamRow._make(row)
    return Stream(r.stream, r.epsilon_g, r.delta_g, r.mode, r.granularity,
                  tuple(json.loads(r.contexts)), r.retire_epsilon, tuple(json.loads(r.orders)),
                  r.created_at)


def block_state(s: Stream, row: Sequence) -> BlockState:
    """The :class:`BlockState` of a ``BLOCK_SELECT`` row (spent budget as the mode reports it)."""
    r = BlockRow._make(row)
    eps, delta = budget.reported(s, r.eps_spent, r.delta_spent, r.rdp, r.charges)
    return BlockState(r.stream, r.context, r.block_id, r.seq, r.location, r.start_ts, r.end_ts,
                      r.records, r.status, eps, delta, r.charges)


def grant_of(row: GrantRow, granted: tuple[GrantedBlock, ...]) -> Grant:
    """The :class:`Grant` of a ``GRANT_SELECT`` row with its blocks (and their locations once
    released)."""
    return Grant(row.grant_id, row.run_id, row.stream, row.context, row.mode, row.epsilon,
                 row.delta, accounting.event_from_json(row.event) if row.event else None,
                 granted, row.status, row.created_at)
