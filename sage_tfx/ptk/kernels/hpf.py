"""DP hierarchical Poisson factorization PTK (PTK paper Tab. 1 row 3, §4.2): user (and item)
embeddings from interaction counts.

Config (all public, declared at registration, never read from the data):

* ``user`` / ``item`` — columns; ``users`` — the declared user domain (the account registry);
  ``items`` — either ``{"domain": [...]}`` or ``{"hash_width": w}`` (keyed hashing into ``w``
  item buckets, power of two). Records outside the domains are not counted.
* ``k`` (latent dimensions, default 8), ``iterations`` (default 60), ``seed`` (public
  initialisation randomness), ``threshold`` (default 1.0: noisy cells at or below
  ``threshold × noise scale`` are read as 0 — post-processing), hyper-parameters ``a, a1, b1, c,
  c1, d1`` (Gopalan, Hofman & Blei 2015; defaults 0.3, 0.3, 1, 0.3, 0.3, 1), ``name``.

Mechanism (add/remove-one neighbours, one record = one interaction row): the user × item count
matrix over the declared domains changes in exactly one cell by 1, so its L1 sensitivity is 1
(:class:`~sage_tfx.dp.counts.DomainTable` with the item as the "label"); every cell gets OpenDP's
discrete Laplace noise of scale ``1/ε``: ``ε``-DP, declared ``LaplaceDpEvent(1/ε)`` charged
``(ε, 0)``. Hierarchical Poisson factorization (coordinate-ascent variational inference,
Gopalan et al. 2015) then runs on the thresholded noisy counts; the user embeddings ``E[θ_u]``
and item embeddings ``E[β_i]`` are post-processing of the DP matrix.

**Approximation relative to the paper.** The paper trains HPF with DP stochastic variational
inference and a moments accountant. We release the count matrix once (input perturbation,
as in Schein et al.'s locally private count models) and fit HPF non-privately on it, treating
the noisy counts as data (no noise-aware likelihood); items are coarsened into declared
groups or hash buckets so the noise mass over the dense matrix stays bounded. **Privacy gap in
the paper:** a user embedding is computed from that user's own records, so releasing per-user
embeddings from DP-SVI on the *global* (item) parameters alone would not be DP for the user's
records; here every released number is post-processing of the noisy matrix, so the embeddings
are covered.

Loss (``eval``): for a test interaction (u, i), ``-log p(i | u) / log |items|`` clipped to
[0, 1], with ``p(i | u) = θ_u·β_i / Σ_j θ_u·β_j`` (the Poisson model's conditional item
distribution; 1 = no better than uniform, unknown user or item = 1). ``erm``: HPF on exact counts.
"""
from __future__ import annotations

import numpy as np
from dp_accounting import dp_event as dp_event_lib
from scipy.special import digamma

from sage_tfx.dp import counts as dp_counts
from sage_tfx.dp import noise as dp_noise
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger.accounting import check_epsilon
from sage_tfx.ptk.abstraction import PrivacyCharge, concat

HYPER = {"a": 0.3, "a1": 0.3, "b1": 1.0, "c": 0.3, "c1": 0.3, "d1": 1.0}


def check_config(config: dict) -> dict:
    """The declared config's typed fields, or :class:`InvalidRequestError`."""
    if not isinstance(config, dict):
        raise InvalidRequestError("hpf config must be a dict")
    try:
        user, item, users, items = (str(config["user"]), str(config["item"]),
                                    list(config["users"]), dict(config["items"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequestError(f"hpf config needs user, item, users, items: {exc!r}") from exc
    if not users or len(set(map(str, users))) != len(users):
        raise InvalidRequestError("users must be a non-empty list of distinct ids")
    if ("domain" in items) == ("hash_width" in items):
        raise InvalidRequestError(f"items: give exactly one of domain or hash_width, got {items!r}")
    if "domain" in items and (not isinstance(items["domain"], (list, tuple)) or not items["domain"]
                              or len(set(map(str, items["domain"]))) != len(items["domain"])):
        raise InvalidRequestError("items domain must be a non-empty list of distinct values")
    n_items = len(items["domain"]) if "domain" in items else dp_counts.check_width(
        items["hash_width"])
    out = {"user": user, "item": item, "users": [str(u) for u in users], "items": items,
           "n_items": n_items, "name": str(config.get("name", "hpf"))}
    for key, default, lo in (("k", 8, 1), ("iterations", 60, 1), ("seed", 0, 0)):
        v = config.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise InvalidRequestError(f"{key} must be an int >= {lo}, got {v!r}")
        out[key] = int(v)
    for key, default in list(HYPER.items()) + [("threshold", 1.0)]:
        v = config.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) \
                or v < 0 or (v == 0 and key != "threshold"):
            raise InvalidRequestError(f"{key} must be a finite number > 0, got {v!r}")
        out[key] = float(v)
    return out


def item_index(values, c: dict) -> np.ndarray:
    """Column of each item in the count matrix, -1 outside the declared domain."""
    items = c["items"]
    if "domain" in items:
        index = {str(v): j for j, v in enumerate(items["domain"])}
        return np.array([index.get(str(v), -1) for v in values], dtype=np.int64)
    return dp_counts.key_hashes([str(v) for v in values], b"ptk-hpf-items", 1,
                                c["n_items"])[0][:, 0]


def _matrix(batches, c: dict) -> dp_counts.DomainTable:
    table = dp_counts.DomainTable(c["users"], c["n_items"])
    data = concat(batches)
    if not data:
        return table
    for col in (c["user"], c["item"]):
        if col not in data:
            raise InvalidRequestError(f"the data has no column {col!r}")
    j = item_index(np.asarray(data[c["item"]]).tolist(), c)
    keep = j >= 0
    users = [str(u) for u in np.asarray(data[c["user"]])[keep].tolist()]
    table.add(users, j[keep])
    return table


def dp_event(epsilon_train: float, config: dict) -> PrivacyCharge:
    """The :class:`PrivacyCharge` of :func:`train_dp` at ``epsilon_train``: Laplace with noise
    multiplier 1/ε on the interaction counts."""
    check_config(config)
    eps = check_epsilon(epsilon_train)
    return PrivacyCharge(dp_event_lib.LaplaceDpEvent(noise_multiplier=1.0 / eps), eps, 0.0)


def fit_hpf(y: np.ndarray, c: dict) -> tuple[np.ndarray, np.ndarray]:
    """CAVI for HPF (Gopalan et al. 2015, Fig. 5) on a dense non-negative count matrix;
    returns ``E[θ]`` (users × k) and ``E[β]`` (items × k)."""
    rng = np.random.default_rng(c["seed"])
    n_u, n_i, k = y.shape[0], y.shape[1], c["k"]
    a, a1, b1, cc, c1, d1 = (c[h] for h in ("a", "a1", "b1", "c", "c1", "d1"))
    g_shp = a + rng.uniform(0, 0.01, (n_u, k))
    g_rte = a1 / b1 + rng.uniform(0, 0.01, (n_u, k))
    l_shp = cc + rng.uniform(0, 0.01, (n_i, k))
    l_rte = c1 / d1 + rng.uniform(0, 0.01, (n_i, k))
    k_shp, t_shp = a1 + k * a, c1 + k * cc
    k_rte = a1 / b1 + (g_shp / g_rte).sum(axis=1)
    t_rte = c1 / d1 + (l_shp / l_rte).sum(axis=1)
    for _ in range(c["iterations"]):
        lu = digamma(g_shp) - np.log(g_rte)                          # users × k
        li = digamma(l_shp) - np.log(l_rte)                          # items × k
        logphi = lu[:, None, :] + li[None, :, :]
        logphi -= logphi.max(axis=2, keepdims=True)
        phi = np.exp(logphi)
        phi /= phi.sum(axis=2, keepdims=True)
        yphi = y[:, :, None] * phi
        g_shp = a + yphi.sum(axis=1)
        g_rte = (k_shp / k_rte)[:, None] + (l_shp / l_rte).sum(axis=0)[None, :]
        k_rte = a1 / b1 + (g_shp / g_rte).sum(axis=1)
        l_shp = cc + yphi.sum(axis=0)
        l_rte = (t_shp / t_rte)[:, None] + (g_shp / g_rte).sum(axis=0)[None, :]
        t_rte = c1 / d1 + (l_shp / l_rte).sum(axis=1)
    return g_shp / g_rte, l_shp / l_rte


def _state(counts: np.ndarray, y: np.ndarray, c: dict) -> dict:
    theta, beta = fit_hpf(y, c)
    return {"users": c["users"], "counts": np.asarray(counts).tolist(),
            "theta": theta.tolist(), "beta": beta.tolist()}


def train_dp(trainset_iter, epsilon_train, prev_state, prev_config, *, config, noise=None):
    """A new DP state from the window's training batches at ``epsilon_train`` (noise from
    ``noise``, OpenDP by default; ``prev_state`` / ``prev_config``: the previous version's)."""
    noise = noise or dp_noise.SECURE
    c = check_config(config)
    scale = 1.0 / check_epsilon(epsilon_train)
    table = _matrix(trainset_iter, c)
    table.add_noise(scale, noise)
    noisy = table.cells
    y = np.where(noisy > c["threshold"] * scale, noisy, 0).astype(float)
    return _state(noisy, y, c)


def erm(trainset_iter, *, config):
    """The same model trained without privacy: the profiler's non-private reference."""
    c = check_config(config)
    counts = _matrix(trainset_iter, c).cells
    return _state(counts, counts.astype(float), c)


def _user_rows(values, state) -> np.ndarray:
    index = {u: r for r, u in enumerate(state["users"])}
    return np.array([index.get(str(u), -1) for u in values], dtype=np.int64)


def eval(testset_iter, state, *, config):  # noqa: A001 - the paper's name
    """Per-example losses in [0, 1] of ``state`` on the test batches (the profiler's metric)."""
    c = check_config(config)
    data = concat(testset_iter)
    if not data:
        return np.zeros(0)
    rows = _user_rows(np.asarray(data[c["user"]]).tolist(), state)
    cols = item_index(np.asarray(data[c["item"]]).tolist(), c)
    theta, beta = np.asarray(state["theta"]), np.asarray(state["beta"])
    rate = theta @ beta.T                                       # users × items
    p = rate / np.maximum(rate.sum(axis=1, keepdims=True), 1e-300)
    loss = np.ones(len(rows))
    ok = (rows >= 0) & (cols >= 0)
    pu = np.maximum(p[rows[ok], cols[ok]], 1e-300)
    loss[ok] = -np.log(pu) / np.log(c["n_items"])
    return np.clip(loss, 0.0, 1.0)


def featurize(batch, state, config) -> dict:
    """``<name>_u<k>`` — the user's embedding as shares ``E[θ_uk] / Σ_k E[θ_uk]`` — and
    ``<name>_act`` — ``log Σ_k E[θ_uk]`` (activity); an undeclared user gets the mean user."""
    c = check_config(config)
    theta = np.asarray(state["theta"], dtype=float)
    rows = _user_rows(np.asarray(batch[c["user"]]).tolist(), state)
    padded = np.vstack([theta, theta.mean(axis=0, keepdims=True)])
    t = padded[rows]
    total = t.sum(axis=1)
    out = {f"{c['name']}_u{k}": t[:, k] / total for k in range(t.shape[1])}
    out[f"{c['name']}_act"] = np.log(total)
    return out
