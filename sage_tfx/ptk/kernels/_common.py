"""Checks shared by the ptklib kernels: the training budget and the declared input columns."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import accounting


def check_epsilon(epsilon_train) -> float:
    """``epsilon_train`` as a float (the ledger's check: a finite number > 0, never clamped)."""
    return accounting.check_epsilon(epsilon_train, "epsilon_train")


def require_columns(batch: Mapping, columns: Sequence[str], kernel: str) -> None:
    """Raises :class:`InvalidRequestError` naming the declared columns a batch lacks."""
    missing = [c for c in columns if c not in batch]
    if missing:
        raise InvalidRequestError(
            f"{kernel}: the batch lacks the declared column(s) {missing}; it has {sorted(batch)}")


def numeric_matrix(batch: Mapping, columns: Sequence[str], kernel: str) -> np.ndarray:
    """The declared numeric columns of a batch as an (n, d) float matrix (NaN kept)."""
    require_columns(batch, columns, kernel)
    try:
        return np.column_stack([np.asarray(batch[c], dtype=float) for c in columns]) \
            if len(columns) else np.zeros((0, 0))
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"{kernel}: the declared columns must be numeric: {exc}") \
            from exc
