"""Budget over time: the ε each block has spent after every arrival step, replayed from the audit
log.

The audit chain records every block arrival (``add_blocks``), charge (``grant``) and refund
(``cancel``) in commit order, so the ledger can redraw Sage's block × time picture (§3.2, Fig. 3)
without any bookkeeping by the caller. One *step* is one ``add_blocks`` transaction (a block
arriving, or a batch registered together); column ``j`` is the state after step ``j`` and every
charge committed before step ``j + 1``. Reservations count from the moment they are charged,
cancelled reservations are refunded at their cancellation: the picture is what the ledger
enforced, not what was released.
"""
from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any, Optional

import numpy as np

from sage_tfx.ledger import accounting
from sage_tfx.ledger.core import Ledger
from sage_tfx.ledger.values import DEFAULT_CONTEXT


@dataclasses.dataclass(frozen=True)
class BudgetHistory:
    """ε spent per block (rows, arrival order) after each arrival step (columns).

    Attributes:
      stream, context: what was replayed.
      block_ids: the blocks, oldest first.
      steps: for each column, the last block id registered by that step.
      epsilon: ``[len(block_ids), len(steps)]``; NaN where a block had not arrived yet. rdp
        streams: dp_accounting's ε at δ_g of the block's RDP curve.
      epsilon_g: the stream's global ε (the colour scale's top).
    """

    stream: str
    context: str
    block_ids: tuple[str, ...]
    steps: tuple[str, ...]
    epsilon: np.ndarray
    epsilon_g: float


@accounting.in_ledger_context
def budget_history(ledger: Ledger, stream: str, context: str = DEFAULT_CONTEXT) -> BudgetHistory:
    """Replays the stream's audit entries into a :class:`BudgetHistory`.

    Raises:
      UnknownStreamError, InvalidRequestError: unknown stream or context.
    """
    s = ledger.stream(stream)
    blocks = ledger.blocks(stream, context)
    by_seq = {b.seq: b.block_id for b in blocks}
    row = {b.block_id: i for i, b in enumerate(blocks)}
    rdp = s.mode == accounting.RDP
    spent: list[Any] = [[0.0] * len(s.orders) if rdp else Decimal(0) for _ in blocks]
    arrived = 0
    columns: list[np.ndarray] = []
    steps: list[str] = []
    charges: dict[str, tuple[list[str], Any]] = {}

    def snapshot() -> None:
        col = np.full(len(blocks), np.nan)
        for i in range(arrived):
            col[i] = (accounting.rdp_epsilon(spent[i], s.orders, s.delta_g) if rdp
                      else float(spent[i]))
        columns.append(col)

    def apply(block_list: list[str], cost: Any, sign: int) -> None:
        for b in block_list:
            i = row[b]
            if rdp:
                spent[i] = [x + sign * c for x, c in zip(spent[i], cost)]
            else:
                spent[i] += sign * cost

    for entry in ledger.audit_log(stream):
        p = entry.payload
        if entry.kind == "add_blocks":
            if steps:
                snapshot()
            arrived = max(arrived,
                          max(row[by_seq[p["first_seq"] + k]] for k in range(p["count"])) + 1)
            steps.append(p["last"])
        elif entry.kind == "grant" and p["context"] == context:
            cost = (accounting.rdp_curve(accounting.event_from_dict(p["event"]), s.orders) if rdp
                    else accounting.exact(p["epsilon"]))
            charges[p["grant_id"]] = (p["blocks"], cost)
            apply(p["blocks"], cost, +1)
        elif entry.kind == "cancel" and p["grant_id"] in charges:
            apply(*charges.pop(p["grant_id"]), -1)
    if steps:
        snapshot()
    matrix = np.column_stack(columns) if columns else np.zeros((len(blocks), 0))
    return BudgetHistory(stream, context, tuple(b.block_id for b in blocks), tuple(steps), matrix,
                         s.epsilon_g)


def plot_budget_heatmap(history: BudgetHistory, *, ax: Optional[Any] = None,
                        title: Optional[str] = None, xlabel: str = "arrival step") -> Any:
    """Draws the block × time heat-map of ``history`` (matplotlib); returns the figure.

    Blank cells: the block had not arrived; the darkest colour: ε_g spent (the block retires).
    """
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 5.5))
    else:
        fig = ax.figure
    im = ax.imshow(history.epsilon, aspect="auto", origin="lower", cmap="magma_r", vmin=0,
                   vmax=history.epsilon_g, interpolation="nearest")
    if len(history.block_ids) <= 40:  # readable labels: the block ids themselves
        ax.set_yticks(range(len(history.block_ids)), history.block_ids, fontsize=7)
        ax.set_xticks(range(len(history.steps)), history.steps, fontsize=7, rotation=90)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("block")
    ax.set_title(title or f"ε spent per block over time, stream {history.stream!r} "
                          f"(ε_g = {history.epsilon_g}); blank = not yet arrived")
    fig.colorbar(im, ax=ax, label="ε spent")
    fig.tight_layout()
    return fig
