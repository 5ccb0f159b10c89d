"""Generalized linear models as flat weight vectors: the models Draw-and-Discard trains.

Draw-and-Discard §III-A: E(Y) = g⁻¹(b₀ + b₁X₁ + … + b_pX_p). A model is one float64 vector
(what the server stores k times and a client updates), laid out as

* binary families (``logistic``, ``linear``, ``poisson``): ``[b₀, b₁, …, b_p]`` (p + 1 weights);
* ``multinomial`` (the paper's multi-class logistic regression of §V): ``n_classes`` rows of
  ``[b₀, b₁, …, b_p]``, row-major (n_classes · (p + 1) weights).

The gradient of the mean negative log-likelihood on N examples is (1/N) Σ (Ŷᵢ − Yᵢ) X̃ᵢ for every
family (X̃ = [1, X]; for multinomial, Ŷ is the softmax and Y the one-hot label). Features are
normalised to [0, 1] with public bounds (:class:`FeatureBounds`, from the schema), never from the
raw data. No TensorFlow here.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

FAMILIES = ("logistic", "linear", "poisson", "multinomial")


@dataclasses.dataclass(frozen=True)
class GLMSpec:
    """A GLM's shape.

    Attributes:
      family: ``logistic`` (binary), ``linear`` (identity link), ``poisson`` (log link) or
        ``multinomial`` (softmax over ``n_classes``).
      n_features: p, the number of features (the intercept is added).
      n_classes: number of classes (``multinomial`` only; 1 otherwise).
    """

    family: str
    n_features: int
    n_classes: int = 1

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        if isinstance(self.n_features, bool) or not isinstance(self.n_features, int) \
                or self.n_features < 1:
            raise ValueError(f"n_features must be an integer >= 1, got {self.n_features!r}")
        if self.family == "multinomial":
            if not isinstance(self.n_classes, int) or self.n_classes < 2:
                raise ValueError(f"multinomial needs n_classes >= 2, got {self.n_classes!r}")
        elif self.n_classes != 1:
            raise ValueError(f"{self.family} has one output; n_classes must be 1")

    @property
    def dim(self) -> int:
        """Number of weights in the flat vector."""
        return self.n_classes * (self.n_features + 1)

    def to_dict(self) -> dict:
        """A JSON-able dict of the model specification."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GLMSpec":
        """Inverse of :meth:`to_dict`."""
        return cls(d["family"], int(d["n_features"]), int(d.get("n_classes", 1)))

    # -- model algebra --

    def _design(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise ValueError(f"features must be (n, {self.n_features}), got {x.shape}")
        return np.hstack([np.ones((x.shape[0], 1)), x])

    def _check_weights(self, w: np.ndarray) -> np.ndarray:
        w = np.asarray(w, dtype=np.float64)
        if w.shape != (self.dim,):
            raise ValueError(f"weights must have shape ({self.dim},), got {w.shape}")
        return w

    def linear_predictor(self, w: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The linear predictor x·w (one column per class for the multinomial family)."""
        w = self._check_weights(w)
        xt = self._design(x)
        if self.family == "multinomial":
            return xt @ w.reshape(self.n_classes, -1).T
        return xt @ w

    def predict(self, w: np.ndarray, x: np.ndarray) -> np.ndarray:
        """E(Y | X): probabilities (logistic; (n, classes) for multinomial), means otherwise."""
        eta = self.linear_predictor(w, x)
        return _inverse_link(self.family, eta)

    def gradient(self, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """(1/N) Σ (Ŷ − Y) X̃ of the negative log-likelihood, as a flat vector (Eq. 3)."""
        xt = self._design(x)
        if xt.shape[0] == 0:
            raise ValueError("a gradient needs at least one example")
        yhat = self.predict(w, x)
        target = self._target(y, xt.shape[0])
        resid = yhat - target
        if self.family == "multinomial":
            return (resid.T @ xt).ravel() / xt.shape[0]
        return (resid @ xt) / xt.shape[0]

    def _target(self, y: np.ndarray, n: int) -> np.ndarray:
        y = np.asarray(y)
        if y.shape != (n,):
            raise ValueError(f"labels must have shape ({n},), got {y.shape}")
        if self.family == "multinomial":
            yi = y.astype(np.int64)
            if np.any(yi != y) or yi.min() < 0 or yi.max() >= self.n_classes:
                raise ValueError(f"multinomial labels must be integers in [0, {self.n_classes})")
            return np.eye(self.n_classes)[yi]
        return y.astype(np.float64)

    def loss(self, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        """Mean negative log-likelihood (cross-entropy / squared error / Poisson deviance)."""
        eta = self.linear_predictor(w, x)
        y = np.asarray(y)
        if self.family == "logistic":
            return float(np.mean(np.logaddexp(0.0, eta) - y * eta))
        if self.family == "linear":
            return float(np.mean(0.5 * (eta - y) ** 2))
        if self.family == "poisson":
            return float(np.mean(np.exp(np.minimum(eta, 50.0)) - y * eta))
        z = eta - eta.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return float(-np.mean(logp[np.arange(len(y)), np.asarray(y, dtype=np.int64)]))

    def accuracy(self, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        """Classification accuracy (logistic at 0.5, multinomial argmax)."""
        p = self.predict(w, x)
        if self.family == "multinomial":
            return float(np.mean(np.argmax(p, axis=1) == np.asarray(y)))
        if self.family != "logistic":
            raise ValueError("accuracy is defined for logistic and multinomial models")
        return float(np.mean((p >= 0.5) == (np.asarray(y) >= 0.5)))


def _inverse_link(family: str, eta: np.ndarray) -> np.ndarray:
    if family == "logistic":
        return 0.5 * (1.0 + np.tanh(0.5 * eta))  # overflow-free sigmoid
    if family == "linear":
        return eta
    if family == "poisson":
        # exp overflows past ~709; the gradient is clipped afterwards anyway, so capping the
        # mean keeps it finite without changing any gradient that survives clipping unchanged.
        return np.exp(np.minimum(eta, 50.0))
    z = eta - eta.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


@dataclasses.dataclass(frozen=True)
class FeatureBounds:
    """Public per-feature bounds (from the schema) mapping raw features into [0, 1] (Alg. 1).

    Values outside [lower, upper] are clipped to the bound: the map is fixed before any data is
    seen, so it costs no privacy. Bounds must come from the schema or from a DP min/max charged to
    the ledger, never from the raw data.
    """

    lower: tuple[float, ...]
    upper: tuple[float, ...]

    def __post_init__(self):
        lo, hi = np.asarray(self.lower, float), np.asarray(self.upper, float)
        if lo.shape != hi.shape or lo.ndim != 1 or not lo.size:
            raise ValueError("lower and upper must be equal-length non-empty sequences")
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(hi > lo)):
            raise ValueError("bounds must be finite with upper > lower for every feature")

    @classmethod
    def of(cls, lower: Sequence[float], upper: Sequence[float]) -> "FeatureBounds":
        """Bounds from sequences of per-feature lower and upper values."""
        return cls(tuple(float(v) for v in lower), tuple(float(v) for v in upper))

    def normalize(self, x: np.ndarray) -> np.ndarray:
        """Features scaled to [0, 1] by the bounds (values outside are clipped)."""
        x = np.asarray(x, dtype=np.float64)
        lo, hi = np.asarray(self.lower), np.asarray(self.upper)
        if x.ndim != 2 or x.shape[1] != lo.size:
            raise ValueError(f"features must be (n, {lo.size}), got {x.shape}")
        return np.clip((x - lo) / (hi - lo), 0.0, 1.0)
