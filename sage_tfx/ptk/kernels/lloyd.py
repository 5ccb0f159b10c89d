"""DP Lloyd (k-means) clustering PTK (PTK paper Tab. 1 row 6; Blum, Dwork, McSherry & Nissim,
PODS 2005 "SuLQ", as evaluated by Su et al., CODASPY 2016). Features are the distances to the
DP centroids and the id of the nearest one.

Config (all public, declared at registration, never read from the data): ``columns`` (numeric),
``lower`` / ``upper`` (per-column clipping bounds, ``lower < upper``), ``k`` (clusters),
``iterations`` T (default 5), ``seed`` (the public initialisation: ``k`` points drawn uniformly in
the box; an explicit ``init`` list of ``k`` points in the box overrides it, and a previous
window's state of the same shape is used first), ``count_share`` in (0, 1) (the share of each
iteration's budget spent on the counts, default 0.5), ``min_count`` (a cluster whose noisy count
is below it keeps its previous centroid, default 1), and an optional ``name``.

Rows with a missing value are dropped (whether a row is kept depends on that row alone); every
kept row is clipped to the box and mapped to u = (x - lower) / (upper - lower) ∈ [0, 1]^d, and
clustering runs in that unit box.

Privacy (add/remove-one neighbours, one record = one row). In each iteration a record falls in
exactly one cluster, so it changes the vector of cluster counts by 1 in L1 and the vector of
per-cluster *centred* sums Σ (u - ½) by ‖u - ½‖₁ ≤ d/2 in L1. Iteration t releases
counts + discreteLaplace(1/ε_c) (OpenDP, integer counts) and sums + Laplace((d/2)/ε_s) (OpenDP),
with ε_c = count_share·ε/T and ε_s = (1 - count_share)·ε/T; the assignment step of the next
iteration only uses the released centroids (post-processing). By basic composition over T
iterations ``train_dp`` is ε-DP. The declared event is
``SelfComposed(Composed([Laplace(1/ε_c), Laplace(1/ε_s)]), T)`` in dp_accounting's
sensitivity-1 convention; :func:`noise_multipliers` rounds the two multipliers up (by ulps) until
the exact decimal sum T·(ε_c + ε_s) is at most ε, and ``train_dp`` draws with those same
multipliers, so the noise that runs is the noise that was charged.

Loss (``eval``, the paper's "loss on training set"): the squared distance of u to its nearest
centroid divided by d, in [0, 1]. There is no ``erm``: the exact k-means minimiser is NP-hard and
non-private Lloyd only finds a local optimum, which is not the lower bound the profiler needs, so
the profiler runs without one. :func:`train_nonprivate` is the non-private twin (same
initialisation, same iterations, no noise) used by the evaluation.
"""
from __future__ import annotations

from decimal import Decimal

import numpy as np
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.dp import noise as dp_noise
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ptk.abstraction import PrivacyCharge, concat
from sage_tfx.ptk.kernels._common import check_epsilon, numeric_matrix

KERNEL = "lloyd"


def check_config(config: dict) -> dict:
    """The validated config as a dict of numpy values; raises :class:`InvalidRequestError`."""
    try:
        cols = [str(c) for c in config["columns"]]
        lower = np.asarray(config["lower"], dtype=float)
        upper = np.asarray(config["upper"], dtype=float)
        k = config["k"]
        iterations = config.get("iterations", 5)
        share = float(config.get("count_share", 0.5))
        min_count = float(config.get("min_count", 1))
        seed = config.get("seed", 0)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequestError(f"lloyd config needs columns, lower, upper, k: {exc}") from exc
    d = len(cols)
    if not d or len(set(cols)) != d or lower.shape != (d,) or upper.shape != (d,) \
            or not np.all(np.isfinite(lower)) or not np.all(np.isfinite(upper)) \
            or not np.all(lower < upper):
        raise InvalidRequestError(
            "lloyd: declare distinct columns and finite per-column bounds lower < upper: "
            f"{config!r}")
    for name, v in (("k", k), ("iterations", iterations), ("seed", seed)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < (0 if name == "seed"
                                                                                else 1):
            raise InvalidRequestError(
                f"lloyd: {name} must be an integer >= {0 if name == 'seed' else 1}, got {v!r}")
    if not 0.0 < share < 1.0 or not np.isfinite(min_count) or min_count < 0:
        raise InvalidRequestError(
            f"lloyd: count_share must lie in (0, 1) and min_count be >= 0, got {share}, "
            f"{min_count}")
    init = None
    if config.get("init") is not None:
        init = np.asarray(config["init"], dtype=float)
        if init.shape != (int(k), d) or not np.all(np.isfinite(init)) or np.any(init < lower) \
                or np.any(init > upper):
            raise InvalidRequestError(f"lloyd: init must be {k} points inside the declared box")
    return {"columns": cols, "lower": lower, "upper": upper, "k": int(k),
            "iterations": int(iterations), "count_share": share, "min_count": min_count,
            "seed": int(seed), "init": init}


def noise_multipliers(epsilon_train: float, config: dict) -> tuple[float, float]:
    """(count, sum) Laplace noise multipliers per iteration, sensitivity-1 convention: 1/ε_c and
    1/ε_s, each rounded up by ulps until T·(1/m_c + 1/m_s) ≤ ε exactly in decimal arithmetic."""
    eps = check_epsilon(epsilon_train)
    c = check_config(config)
    t, share = c["iterations"], c["count_share"]
    m_c, m_s = t / (share * eps), t / ((1.0 - share) * eps)
    budget = Decimal(repr(eps))
    while t * (1 / Decimal(repr(m_c)) + 1 / Decimal(repr(m_s))) > budget:
        m_c, m_s = float(np.nextafter(m_c, np.inf)), float(np.nextafter(m_s, np.inf))
    return m_c, m_s


def dp_event(epsilon_train: float, config: dict) -> PrivacyCharge:
    """The :class:`PrivacyCharge` of :func:`train_dp` at ``epsilon_train``: per iteration a Laplace
    count and a Laplace sum, self-composed over the iterations."""
    m_c, m_s = noise_multipliers(epsilon_train, config)
    per_iteration = dp_event_lib.ComposedDpEvent([dp_event_lib.LaplaceDpEvent(m_c),
                                                 dp_event_lib.LaplaceDpEvent(m_s)])
    return PrivacyCharge(dp_event_lib.SelfComposedDpEvent(per_iteration,
                                                          check_config(config)["iterations"]),
                         float(epsilon_train), 0.0)


def sum_sensitivity(config: dict) -> float:
    """L1 sensitivity of the per-cluster centred sums in the unit box: d / 2."""
    return len(check_config(config)["columns"]) / 2.0


def _unit_rows(batches, c: dict) -> np.ndarray:
    data = concat(batches)
    if not data:
        return np.zeros((0, len(c["columns"])))
    x = numeric_matrix(data, c["columns"], KERNEL)
    x = x[np.all(np.isfinite(x), axis=1)]
    return (np.clip(x, c["lower"], c["upper"]) - c["lower"]) / (c["upper"] - c["lower"])


def _to_unit(points, c: dict) -> np.ndarray:
    return (np.asarray(points, dtype=float) - c["lower"]) / (c["upper"] - c["lower"])


def _initial(c: dict, prev_state) -> np.ndarray:
    """Public starting centroids in the unit box: the previous state, ``init``, or seeded."""
    if prev_state is not None and prev_state.get("columns") == c["columns"] \
            and np.shape(prev_state.get("centroids")) == (c["k"], len(c["columns"])):
        return np.clip(_to_unit(prev_state["centroids"], c), 0.0, 1.0)
    if c["init"] is not None:
        return _to_unit(c["init"], c)
    return np.random.default_rng(c["seed"]).uniform(size=(c["k"], len(c["columns"])))


def _assign(u: np.ndarray, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d2 = ((u[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2)
    return np.argmin(d2, axis=1), d2


def _lloyd(u: np.ndarray, c: dict, prev_state, step) -> tuple[np.ndarray, np.ndarray]:
    """T Lloyd iterations from the public start; ``step(counts, centred_sums)`` returns the
    (possibly noisy) counts and sums to update with."""
    cent = _initial(c, prev_state)
    counts = np.zeros(c["k"])
    for _ in range(c["iterations"]):
        assign, _ = _assign(u, cent)
        raw_counts = np.bincount(assign, minlength=c["k"]).astype(np.int64)
        sums = np.zeros_like(cent)
        np.add.at(sums, assign, u - 0.5)
        counts, sums = step(raw_counts, sums)
        ok = counts >= max(c["min_count"], 1e-12)
        cent = np.where(ok[:, None],
                        np.clip(0.5 + sums / np.where(ok, counts, 1.0)[:, None], 0.0, 1.0), cent)
    return cent, counts


def _state(cent: np.ndarray, counts: np.ndarray, c: dict) -> dict:
    raw = c["lower"] + cent * (c["upper"] - c["lower"])
    return {"columns": c["columns"], "centroids": raw.tolist(),
            "counts": np.asarray(counts, dtype=float).tolist()}


def train_dp(trainset_iter, epsilon_train, prev_state, prev_config, *, config, noise=None):
    """A new DP state from the window's training batches at ``epsilon_train`` (noise from
    ``noise``, OpenDP by default; ``prev_state`` / ``prev_config``: the previous version's)."""
    noise = noise or dp_noise.SECURE
    m_c, m_s = noise_multipliers(epsilon_train, config)
    c = check_config(config)
    sens = sum_sensitivity(config)
    u = _unit_rows(trainset_iter, c)

    def step(counts, sums):
        noisy_counts = np.asarray(noise.discrete_laplace(counts, m_c), dtype=float)
        noisy_sums = np.asarray(noise.laplace(sums, m_s * sens), dtype=float)
        return noisy_counts, noisy_sums
    return _state(*_lloyd(u, c, prev_state, step), c)


def train_nonprivate(trainset_iter, *, config, prev_state=None) -> dict:
    """Non-private Lloyd with the same start and iterations (the "NP PTK" baseline)."""
    c = check_config(config)
    return _state(*_lloyd(_unit_rows(trainset_iter, c), c, prev_state,
                          lambda counts, sums: (counts.astype(float), sums)), c)


def eval(testset_iter, state, *, config):  # noqa: A001 - the paper's name
    """Per-example losses in [0, 1] of ``state`` on the test batches (the profiler's metric)."""
    c = check_config(config)
    u = _unit_rows(testset_iter, c)
    if not len(u):
        return np.zeros(0)
    _, d2 = _assign(u, _to_unit(state["centroids"], c))
    return np.clip(d2.min(axis=1) / len(c["columns"]), 0.0, 1.0)


def featurize(batch, state, config) -> dict:
    """``<name>_d0..d{k-1}`` (distance to each centroid in the unit box) and ``<name>_cluster``
    (the nearest centroid's id). A missing value is replaced by the middle of its declared range
    (public) so every record gets features."""
    c = check_config(config)
    x = numeric_matrix(batch, c["columns"], KERNEL)
    x = np.where(np.isfinite(x), x, (c["lower"] + c["upper"]) / 2.0)
    u = (np.clip(x, c["lower"], c["upper"]) - c["lower"]) / (c["upper"] - c["lower"])
    assign, d2 = _assign(u, _to_unit(state["centroids"], c))
    name = config.get("name", "km")
    out = {f"{name}_d{j}": np.sqrt(d2[:, j]) for j in range(d2.shape[1])}
    out[f"{name}_cluster"] = assign.astype(float)
    return out
