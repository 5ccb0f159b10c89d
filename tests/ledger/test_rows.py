"""The named rows of ``sage_tfx.ledger.rows`` match the SELECTs they read."""
import re

from sage_tfx.ledger import rows, store


def _columns(select: str) -> list[str]:
    """Column names of ``SELECT a.x, y, ... FROM`` (table prefixes dropped)."""
    listed = re.match(r"SELECT (.+?) FROM", select, re.S).group(1)
    return [c.strip().split(".")[-1] for c in listed.split(",")]


def test_the_plain_selects_list_the_fields_in_order():
    assert _columns(rows.STREAM_SELECT) == list(rows.StreamRow._fields)
    assert _columns(rows.GRANT_SELECT) == list(rows.GrantRow._fields)
    assert _columns(rows.BLOCK_SELECT) == list(rows.BlockRow._fields)
    assert "JOIN budgets u ON u.stream = b.stream AND u.block_id = b.block_id" in (
        rows.BLOCK_SELECT)


def test_the_request_path_rows_match_budget_row():
    """``Store.budget_rows`` / ``window_rows`` select (block_id, seq, status, eps, delta, rdp,
    location, id): BudgetRow names them in that order."""
    assert store.LOCATION in store.BUDGET_ROWS  # an expression (with commas): named here
    listed = _columns(store.BUDGET_ROWS.replace(store.LOCATION, "location"))
    assert listed == list(rows.BudgetRow._fields)
