"""Teachers: one model per (partition, chunk), and their votes as integer counts (DP bagging §4).

Two teacher types: ``"logistic"`` (L2-regularised logistic regression, binary; the paper's main
teacher) and ``"tree"`` (a scikit-learn decision tree, any number of classes; the paper's
supplementary GBM stands in as a shallow tree here, which keeps 10^4 teachers cheap).

The n logistic teachers of one partition are fitted together by Newton's method on the exact
objective of ``sklearn.linear_model.LogisticRegression(C=1/l2, fit_intercept=False)`` on the
features with a constant column (intercept penalised, as liblinear does): one sparse chunk
indicator turns the n per-chunk gradients and Hessians into two matrix products, ~50x faster than
n separate scikit-learn fits (``tests/bagging`` checks equality with scikit-learn).

Memory: predictions are produced per batch of public points as uint8 class ids [B, k, n] and
reduced straight into int32 counts [P, C]; nothing of shape [N, k, n] (private points × teachers)
is ever built, in any dtype.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator, Optional

import numpy as np

from sage_tfx.bagging.partition import check_shape
from sage_tfx.errors import InvalidRequestError

__all__ = ["TeacherEnsemble", "train_teachers", "vote_counts", "TEACHER_KINDS"]

TEACHER_KINDS = ("logistic", "tree")
# Cap on the float64 logits of one prediction batch (B × k·n values, ~32 MB).
_BATCH_VALUES = 4_000_000


@dataclasses.dataclass(frozen=True)
class TeacherEnsemble:
    """The k·n teachers. ``coef`` [k, n, d+1] (last column: intercept) for logistic teachers,
    ``trees`` (k·n fitted estimators, partition-major) for tree teachers."""
    kind: str
    k: int
    n: int
    n_classes: int
    n_features: int
    coef: Optional[np.ndarray] = None
    trees: Optional[tuple] = None

    def batch_size(self) -> int:
        """Public points labelled per batch, so votes of k × n teachers fit in memory."""
        return max(1, _BATCH_VALUES // (self.k * self.n))

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Every teacher's class for every row of ``X``: uint8 [B, k, n]."""
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise InvalidRequestError(
                f"expected features of shape [B, {self.n_features}], got {X.shape}")
        if self.kind == "logistic":
            W = self.coef.reshape(self.k * self.n, -1)
            z = X @ W[:, :-1].T + W[:, -1]
            return (z > 0).astype(np.uint8).reshape(len(X), self.k, self.n)
        out = np.empty((len(X), self.k * self.n), dtype=np.uint8)
        for t, tree in enumerate(self.trees):
            out[:, t] = tree if isinstance(tree, (int, np.integer)) else tree.predict(X)
        return out.reshape(len(X), self.k, self.n)

    def predict_batches(self, X: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """(start row, predictions [B, k, n]) over ``X`` in memory-bounded batches."""
        b = self.batch_size()
        for start in range(0, len(X), b):
            yield start, self.predict(X[start:start + b])


def _check_training(X, y, chunks, n, n_classes):
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    chunks = np.asarray(chunks)
    if X.ndim != 2 or len(X) == 0:
        raise InvalidRequestError("the private window is empty: no rows to train teachers on")
    if y.shape != (len(X),) or chunks.ndim != 2 or len(chunks) != len(X):
        raise InvalidRequestError("features, labels and chunk assignment disagree in length")
    if not np.all(np.isfinite(X)):
        raise InvalidRequestError("features must be finite")
    if y.dtype.kind not in "iub" or y.min() < 0 or y.max() >= n_classes:
        raise InvalidRequestError(f"labels must be integers in [0, {n_classes})")
    if chunks.min() < 0 or chunks.max() >= n:
        raise InvalidRequestError("chunk ids out of range [0, n)")
    return X, y.astype(np.int64), chunks


def _fit_logistic_partition(X1, y, chunk, n, l2, max_iter=50, tol=1e-10):
    """Newton's method for the n chunks of one partition at once, on a padded [n, m, d] layout
    (m = largest chunk; padded rows have weight 0), so each step is a few batched matmuls."""
    from scipy.special import expit

    N, d = X1.shape
    order = np.argsort(chunk, kind="stable")
    sizes = np.bincount(chunk, minlength=n)
    m = max(1, int(sizes.max()))
    slot = np.arange(N) - np.repeat(np.cumsum(sizes) - sizes, sizes)   # position inside its chunk
    Xp = np.zeros((n, m, d))
    Xp[chunk[order], slot] = X1[order]
    yp = np.zeros((n, m))
    yp[chunk[order], slot] = y[order]
    mask = np.zeros((n, m))
    mask[chunk[order], slot] = 1.0
    W = np.zeros((n, d))
    reg = l2 * np.eye(d)
    for _ in range(max_iter):
        p = expit(np.einsum("cmd,cd->cm", Xp, W))
        g = np.einsum("cmd,cm->cd", Xp, (p - yp) * mask) + l2 * W
        H = np.matmul(Xp.transpose(0, 2, 1) * (p * (1 - p) * mask)[:, None, :], Xp) + reg
        step = np.linalg.solve(H, g[..., None])[..., 0]
        W -= step
        if np.max(np.abs(step)) < tol:
            break
    return W


def train_teachers(X: np.ndarray, y: np.ndarray, chunks: np.ndarray, *, n: int,
                   kind: str = "logistic", n_classes: int = 2, l2: float = 1.0,
                   max_depth: int = 3) -> TeacherEnsemble:
    """Trains one teacher per (partition i, chunk j) on the rows with ``chunks[:, i] == j``.

    Args:
      X: private features [N, d], scaled with public or schema statistics only.
      y: integer labels [N].
      chunks: :func:`~sage_tfx.bagging.partition.chunk_assignment` of each row's unit [N, k].
      n: chunks per partition.
      kind: ``"logistic"`` (binary) or ``"tree"``.
      l2: L2 penalty of the logistic teachers (scikit-learn's ``1/C``).
    """
    if kind not in TEACHER_KINDS:
        raise InvalidRequestError(f"teacher kind must be one of {TEACHER_KINDS}, got {kind!r}")
    k, n = check_shape(np.asarray(chunks).shape[1] if np.ndim(chunks) == 2 else 0, n)
    X, y, chunks = _check_training(X, y, chunks, n, n_classes)
    if kind == "logistic":
        if n_classes != 2:
            raise InvalidRequestError(
                "logistic teachers are binary; use kind='tree' for more classes")
        from threadpoolctl import threadpool_limits

        X1 = np.hstack([X, np.ones((len(X), 1))])
        # Thousands of tiny batched solves: a multi-threaded BLAS only adds synchronisation
        # (measured 40x slower on a loaded 2-core machine), so the fit runs single-threaded.
        with threadpool_limits(limits=1, user_api="blas"):
            coef = np.stack([_fit_logistic_partition(X1, y, chunks[:, i], n, l2) for i in range(k)])
        return TeacherEnsemble("logistic", k, n, 2, X.shape[1], coef=coef)
    from sklearn.tree import DecisionTreeClassifier

    trees = []
    for i in range(k):
        order = np.argsort(chunks[:, i], kind="stable")
        bounds = np.searchsorted(chunks[order, i], np.arange(n + 1))
        for j in range(n):
            rows = order[bounds[j]:bounds[j + 1]]
            labels = np.unique(y[rows])
            if len(labels) <= 1:   # empty or single-class chunk: a constant teacher
                trees.append(int(labels[0]) if len(labels) else 0)
                continue
            trees.append(
                DecisionTreeClassifier(max_depth=max_depth, random_state=0).fit(X[rows], y[rows]))
    return TeacherEnsemble("tree", k, n, n_classes, X.shape[1], trees=tuple(trees))


def vote_counts(ensemble: TeacherEnsemble, X_public: np.ndarray) -> np.ndarray:
    """n_c(x) = number of teachers voting c, for every public point: int32 [P, C]."""
    X_public = np.asarray(X_public, dtype=np.float64)
    counts = np.zeros((len(X_public), ensemble.n_classes), dtype=np.int32)
    for start, pred in ensemble.predict_batches(X_public):
        for c in range(ensemble.n_classes):
            counts[start:start + len(pred), c] = (pred == c).sum(axis=(1, 2))
    return counts
