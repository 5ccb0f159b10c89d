"""Input checks shared by the numpy DP regressions (features, labels, public bounds)."""
from __future__ import annotations

from typing import Any

import numpy as np


def check_features(features: Any,
                   labels: Any | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Returns float64 copies of a finite (n, d) feature matrix and (n,) label vector, n, d ≥ 1.

    Raises:
      ValueError: wrong shapes, mismatched lengths, empty, or NaN / infinite values.
    """
    x = np.array(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"features must be a non-empty (n, d) matrix, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("features contain NaN or infinite values")
    if labels is None:
        return x, None
    y = np.array(labels, dtype=np.float64)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.shape != (x.shape[0],):
        raise ValueError(f"labels must have shape ({x.shape[0]},), got {y.shape}")
    if not np.all(np.isfinite(y)):
        raise ValueError("labels contain NaN or infinite values")
    return x, y


def clip_rows(features: np.ndarray, bound: float) -> np.ndarray:
    """Scales every row with L2 norm above ``bound`` down to norm ``bound`` (others unchanged)."""
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    return features * np.minimum(1.0, bound / np.maximum(norms, np.finfo(np.float64).tiny))
