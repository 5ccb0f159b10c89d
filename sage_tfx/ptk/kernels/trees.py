"""DP tree featurization PTK (PTK paper Tab. 1 row 2, §4.2): a DP random forest; features are
the trees' leaf label rates (and optionally one-hot leaf ids).

Config (all public, declared at registration, never read from the data):

* ``label``, ``n_labels`` (default 2) — integer class labels in ``range(n_labels)``;
* ``numeric`` — ``{column: [thresholds...]}``: candidate splits ``x <= t`` (NaN goes right);
* ``categorical`` — ``{column: [values...]}``: candidate splits ``x == v`` (a declared domain);
* ``n_trees`` T ≥ 1, ``depth`` D ≥ 1 (complete trees: 2^D leaves), ``features_per_node`` m ≥ 1
  (the random feature subset tried at each node), ``seed`` (the public randomness of the
  feature subsets), ``smoothing`` α > 0 (default 1), ``output`` ``"rates"`` (default),
  ``"onehot"`` or ``"both"``, ``name`` (feature-name prefix, default ``"tree"``).

Algorithm (the DP random-forest recipe the paper describes in §4.2, its ref. [24]): every
node of every tree (1) draws m of the declared features at random (data-independent), (2) scores
every candidate split of them with the gini utility ``u(s) = -Σ_c (n_c - Σ_l n_{c,l}² / n_c)``
(children c, label counts n_{c,l}; 0 for an empty child), and (3) picks one privately with
OpenDP's report-noisy-max with exponential noise (:func:`sage_tfx.dp.noise.noisy_max`, the
exponential-mechanism family). Leaves release their label counts with OpenDP discrete Laplace.

**Deviation from the paper.** The paper cites the large/least-margin mechanism (Chaudhuri, Hsu &
Song 2014), which spends less when the best split wins by a wide margin but needs a private
margin test with its own failure probability; we use the plain exponential-type selection, which
is ε-DP unconditionally (the margin mechanism reduces to it when no margin is found).

**Sensitivity (add/remove one record).** The record falls in one child c of a candidate split.
With ``S = Σ_l n_{c,l}²`` and ``a = n_{c,y}``, ``S/n`` changes by ``(n(2a+1) - S) / (n(n+1))``
∈ (-1, 1], so ``n_c - S/n_c`` changes by a value in [0, 2): every candidate's utility moves by
at most Δ = 2 and all in the same direction (down when a record is added, up when removed). The
selection is therefore *monotonic* and OpenDP's map gives ``ε = Δ / scale``: scale = 2 / ε_level.
(Friedman & Schuster 2010 state Δ = 2 for the gini score; monotonicity halves the noise, and
``tests/ptk/test_ptk_trees_kernel.py`` checks both numerically.) A leaf count table changes by 1
in one cell (L1 sensitivity 1): discrete Laplace scale 1 / ε_level.

**Composition.** The nodes of one level partition the records, so a level costs ε_level
whatever its number of nodes (parallel composition); a tree has D split levels and one leaf
level; trees compose sequentially: ε = T (D + 1) ε_level. The declared event is T·(D+1)
pure-ε events of ε_level each. dp_accounting has no exponential-mechanism event, so each
selection level is declared as ``LaplaceDpEvent(1/ε_level)`` — the same pure ε; the ledger sums
pure ε exactly (basic composition), which holds for any pure-DP mechanism (a PLD accountant
would treat the stand-in as Laplace and could be slightly optimistic under composition, so the
charge is the pure sum ε).

Loss (``eval``): ``(1 - p̂(y|x))²`` ∈ [0, 1] with p̂ the forest's average smoothed leaf rate.
``erm``: the same forest with exact argmax splits and exact leaf counts (the non-private PTK).
"""
from __future__ import annotations

import numpy as np
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.dp import noise as dp_noise
from sage_tfx.errors import InvalidPrivacyParameterError, InvalidRequestError
from sage_tfx.ledger.accounting import check_epsilon
from sage_tfx.ptk.abstraction import PrivacyCharge, concat

GINI_SENSITIVITY = 2.0
OUTPUTS = ("rates", "onehot", "both")


def _posint(config, name, default=None, lo=1, hi=None):
    v = config.get(name, default)
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo \
            or (hi is not None and v > hi):
        raise InvalidRequestError(f"{name} must be an int in [{lo}, {hi or '∞'}], got {v!r}")
    return int(v)


def check_config(config: dict) -> dict:
    """The validated config as a dict of typed fields, or :class:`InvalidRequestError`."""
    if not isinstance(config, dict) or "label" not in config:
        raise InvalidRequestError("trees config must be a dict with a label")
    numeric = dict(config.get("numeric", {}))
    categorical = dict(config.get("categorical", {}))
    if not numeric and not categorical:
        raise InvalidRequestError("trees config declares no numeric or categorical features")
    for col, thr in numeric.items():
        t = np.asarray(thr, dtype=float) if isinstance(thr, (list, tuple)) else np.zeros(0)
        if t.size == 0 or not np.all(np.isfinite(t)) or np.any(np.diff(t) <= 0):
            raise InvalidRequestError(
                f"numeric feature {col!r}: thresholds must be a non-empty increasing list of "
                "finite "
                f"numbers (declared, public), got {thr!r}")
    for col, dom in categorical.items():
        if not isinstance(dom, (list, tuple)) or not dom or len(set(map(str, dom))) != len(dom):
            raise InvalidRequestError(
                f"categorical feature {col!r}: domain must be a non-empty list of distinct values")
    if set(numeric) & set(categorical):
        raise InvalidRequestError("a column cannot be both numeric and categorical")
    features = list(numeric) + list(categorical)
    smoothing = config.get("smoothing", 1.0)
    if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) \
            or not np.isfinite(smoothing) or smoothing <= 0:
        raise InvalidRequestError(f"smoothing must be a finite number > 0, got {smoothing!r}")
    output = config.get("output", "rates")
    if output not in OUTPUTS:
        raise InvalidRequestError(f"output must be one of {OUTPUTS}, got {output!r}")
    return {"label": str(config["label"]), "n_labels": _posint(config, "n_labels", 2, lo=2),
            "numeric": {c: [float(x) for x in t] for c, t in numeric.items()},
            "categorical": {c: [str(v) for v in d] for c, d in categorical.items()},
            "features": features, "n_trees": _posint(config, "n_trees", 10),
            "depth": _posint(config, "depth", 4, hi=12),
            "m": _posint(config, "features_per_node", min(3, len(features)), hi=len(features)),
            "seed": _posint(config, "seed", 0, lo=0), "smoothing": float(smoothing),
            "output": output, "name": str(config.get("name", "tree"))}


def level_epsilon(epsilon_train: float, config: dict) -> float:
    """ε of one level (a selection level or the leaf level) of one tree: ε / (T (D + 1))."""
    c = check_config(config)
    return check_epsilon(epsilon_train) / (c["n_trees"] * (c["depth"] + 1))


def dp_event(epsilon_train: float, config: dict) -> PrivacyCharge:
    """The :class:`PrivacyCharge` of :func:`train_dp` at ``epsilon_train``: one Laplace event per
    tree level (``n_trees`` × (``depth`` + 1)), self-composed."""
    c = check_config(config)
    eps_l = level_epsilon(epsilon_train, config)
    level = dp_event_lib.LaplaceDpEvent(noise_multiplier=1.0 / eps_l)
    event = dp_event_lib.SelfComposedDpEvent(level, c["n_trees"] * (c["depth"] + 1))
    return PrivacyCharge(event, float(epsilon_train), 0.0)


def _encode(data: dict, c: dict) -> tuple[dict, np.ndarray]:
    """Per feature, a bin index per record: numeric → #thresholds below x (NaN: past the last);
    categorical → domain position (len(domain) when outside it)."""
    if c["label"] not in data:
        raise InvalidRequestError(f"the data has no label column {c['label']!r}")
    y = np.asarray(data[c["label"]])
    if y.dtype.kind == "b" or (y.dtype.kind == "f" and np.all(y == np.round(y))):
        y = y.astype(np.int64)
    if y.dtype.kind not in "iu" or (y.size and (y.min() < 0 or y.max() >= c["n_labels"])):
        raise InvalidRequestError(f"labels must be integers in [0, {c['n_labels']})")
    return _bins(data, c), y.astype(np.int64)


def _bins(data: dict, c: dict) -> dict:
    out = {}
    for col in c["features"]:
        if col not in data:
            raise InvalidRequestError(f"the data has no feature column {col!r}")
        if col in c["numeric"]:
            x = np.asarray(data[col], dtype=float)
            b = np.searchsorted(np.asarray(c["numeric"][col]), x, side="left")
            out[col] = np.where(np.isnan(x), len(c["numeric"][col]), b)
        else:
            index = {v: i for i, v in enumerate(c["categorical"][col])}
            dom = len(index)
            out[col] = np.array([index.get(str(v), dom) for v in np.asarray(data[col]).tolist()],
                                dtype=np.int64)
    return out


def _n_candidates(col: str, c: dict) -> int:
    return len(c["numeric"][col]) if col in c["numeric"] else len(c["categorical"][col])


def _goes_left(col: str, j: int, bins: np.ndarray, c: dict) -> np.ndarray:
    return bins <= j if col in c["numeric"] else bins == j


def _gini_part(counts: np.ndarray) -> np.ndarray:
    """``n - Σ_l n_l² / n`` per row of a label-count matrix (0 for an empty row)."""
    n = counts.sum(axis=-1)
    sq = (counts.astype(float) ** 2).sum(axis=-1)
    return n - np.divide(sq, n, out=np.zeros_like(sq, dtype=float), where=n > 0)


def split_utilities(col: str, bins: np.ndarray, y: np.ndarray, c: dict) -> np.ndarray:
    """Gini utility of every candidate split of ``col`` on the node's records."""
    L, k = c["n_labels"], _n_candidates(col, c)
    table = np.zeros((k + 1, L))
    np.add.at(table, (bins, y), 1)
    total = table.sum(axis=0)
    left = np.cumsum(table, axis=0)[:k] if col in c["numeric"] else table[:k]
    return -(_gini_part(left) + _gini_part(total[None, :] - left))


def _grow(bins: dict, y: np.ndarray, c: dict, eps_level, noise) -> dict:
    """The forest; ``eps_level`` None = non-private (exact argmax, exact leaf counts)."""
    rng = np.random.default_rng(c["seed"])
    D, L = c["depth"], c["n_labels"]
    trees = []
    scale = None if eps_level is None else GINI_SENSITIVITY / eps_level
    for _ in range(c["n_trees"]):
        node = np.zeros(len(y), dtype=np.int64)       # heap index of each record's node
        splits = []
        for level in range(D):
            for i in range(2 ** level - 1, 2 ** (level + 1) - 1):
                feats = list(rng.choice(c["features"], size=c["m"], replace=False))
                mine = node == i
                cand, scores = [], []
                for col in feats:
                    u = split_utilities(col, bins[col][mine], y[mine], c)
                    cand += [(col, j) for j in range(len(u))]
                    scores.append(u)
                s = np.concatenate(scores)
                pick = int(np.argmax(s)) if scale is None else noise.noisy_max(
                    s, scale, monotonic=True)
                col, j = cand[pick]
                splits.append([str(col), int(j)])
                go_left = _goes_left(col, j, bins[col], c)
                node = np.where(mine, np.where(go_left, 2 * i + 1, 2 * i + 2), node)
        leaf = node - (2 ** D - 1)
        counts = np.zeros((2 ** D, L), dtype=np.int64)
        np.add.at(counts, (leaf, y), 1)
        if eps_level is not None:
            counts = np.asarray(noise.discrete_laplace(counts, 1.0 / eps_level), dtype=np.int64)
        trees.append({"splits": splits, "leaf_counts": counts.tolist()})
    return trees


def _state(trees: list, c: dict) -> dict:
    totals = np.maximum(np.asarray(trees[0]["leaf_counts"], dtype=float), 0).sum(axis=0)
    prior = np.maximum(totals, 1e-3)
    return {"trees": trees, "prior": (prior / prior.sum()).tolist()}


def train_dp(trainset_iter, epsilon_train, prev_state, prev_config, *, config, noise=None):
    """A new DP state from the window's training batches at ``epsilon_train`` (noise from
    ``noise``, OpenDP by default; ``prev_state`` / ``prev_config``: the previous version's)."""
    noise = noise or dp_noise.SECURE
    c = check_config(config)
    eps_level = level_epsilon(epsilon_train, config)
    if not np.isfinite(GINI_SENSITIVITY / eps_level):
        raise InvalidPrivacyParameterError(f"epsilon {epsilon_train!r} too small for this forest")
    data = concat(trainset_iter)
    if not data:
        raise InvalidRequestError("train_dp needs a non-empty training window")
    bins, y = _encode(data, c)
    return _state(_grow(bins, y, c, eps_level, noise), c)


def erm(trainset_iter, *, config):
    """The same model trained without privacy: the profiler's non-private reference."""
    c = check_config(config)
    data = concat(trainset_iter)
    if not data:
        raise InvalidRequestError("erm needs a non-empty training set")
    bins, y = _encode(data, c)
    return _state(_grow(bins, y, c, None, None), c)


def leaves(columns: dict, state: dict, config: dict) -> np.ndarray:
    """``n × T`` leaf index of every record in every tree."""
    c = check_config(config)
    bins = _bins(columns, c)
    n, D = len(next(iter(bins.values()))), c["depth"]
    out = np.zeros((n, len(state["trees"])), dtype=np.int64)
    for t, tree in enumerate(state["trees"]):
        node = np.zeros(n, dtype=np.int64)
        for _ in range(D):
            col = np.array([tree["splits"][i][0] for i in node])
            j = np.array([tree["splits"][i][1] for i in node])
            left = np.zeros(n, dtype=bool)
            for name in set(col.tolist()):
                sel = col == name
                left[sel] = _goes_left(name, j[sel], bins[name][sel], c)
            node = np.where(left, 2 * node + 1, 2 * node + 2)
        out[:, t] = node - (2 ** D - 1)
    return out


def leaf_rates(columns: dict, state: dict, config: dict) -> np.ndarray:
    """``n × T × n_labels`` smoothed label rates of each record's leaf in each tree."""
    c = check_config(config)
    lv = leaves(columns, state, config)
    prior = np.asarray(state["prior"], dtype=float)
    out = np.zeros(lv.shape + (c["n_labels"],))
    for t, tree in enumerate(state["trees"]):
        counts = np.maximum(np.asarray(tree["leaf_counts"], dtype=float), 0)
        rates = (counts + c["smoothing"] * prior) / (counts.sum(axis=1, keepdims=True)
                                                     + c["smoothing"])
        out[:, t, :] = rates[lv[:, t]]
    return out


def eval(testset_iter, state, *, config):  # noqa: A001 - the paper's name
    """Per-example losses in [0, 1] of ``state`` on the test batches (the profiler's metric)."""
    c = check_config(config)
    data = concat(testset_iter)
    if not data:
        return np.zeros(0)
    _, y = _encode(data, c)
    p = leaf_rates(data, state, config).mean(axis=1)
    return np.clip((1.0 - p[np.arange(len(y)), y]) ** 2, 0.0, 1.0)


def featurize(batch, state, config) -> dict:
    """``<name><t>_rate<l>`` (labels 1..L-1) per tree and/or ``<name><t>_leaf<k>`` one-hot."""
    c = check_config(config)
    out = {}
    if c["output"] in ("rates", "both"):
        rates = leaf_rates(batch, state, config)
        for t in range(rates.shape[1]):
            for lab in range(1, c["n_labels"]):
                out[f"{c['name']}{t}_rate{lab}"] = rates[:, t, lab]
    if c["output"] in ("onehot", "both"):
        lv = leaves(batch, state, config)
        for t in range(lv.shape[1]):
            for k in range(2 ** c["depth"]):
                out[f"{c['name']}{t}_leaf{k}"] = (lv[:, t] == k).astype(float)
    return out
