"""Count featurization PTK (PTK paper Tab. 1 row 1, §4.2): DP per-label contingency tables of
declared categorical features; features are smoothed label rates with back-off to the prior.

Config (all public, declared at registration, never read from the data):

* ``label`` — the label column, integer class indices in ``range(n_labels)``;
* ``n_labels`` — label cardinality (default 2);
* ``features`` — ``{column: spec}``, one table per column. A spec is either
  ``{"domain": [values...]}`` (a :class:`~sage_tfx.dp.counts.DomainTable`: values outside the
  domain are not counted) or ``{"hash_width": w, "hash_depth": h}`` (a count-min
  :class:`~sage_tfx.dp.counts.CountSketch` of ``h`` rows of ``w`` buckets, salted per column);
* ``smoothing`` — α > 0, pseudo-counts of the prior (default 1.0);
* ``accumulate`` — add the previous window's DP tables when their layout matches (the paper sums
  DP counts across windows, §6.2; post-processing of earlier DP outputs). Default False.

Privacy (add/remove-one neighbours, one record = one row). The shared count core
(:mod:`sage_tfx.dp.counts`) gives each table's L1 sensitivity: a record with label ``l`` changes,
in table ``i``, one cell of label column ``l`` per row, so ``Δ_i = h_i`` (1 for a domain table,
``hash_depth`` for a sketch). ``ε`` is split evenly over the ``n`` tables (``ε_i = ε / n``,
:func:`~sage_tfx.dp.counts.table_epsilons`); every cell of table ``i`` gets OpenDP's discrete
Laplace noise of scale ``Δ_i / ε_i`` (:func:`~sage_tfx.dp.counts.noise_scales`), which is
``ε_i``-DP for the integer table; by sequential composition the release is ``Σ ε_i = ε``-DP.
The declared event is ``Composed([Laplace(1/ε_i)] * n)`` in dp_accounting's sensitivity-1
convention (noise multiplier = scale / sensitivity), charged ``(ε, 0)``.

The label prior is the column sums of the first table's noisy cells (post-processing: no extra
charge), normalised after clipping at a small positive floor. A key's feature for label ``l`` is
``(max(c_l, 0) + α p_l) / (Σ_l max(c_l, 0) + α)`` — the prior for unseen / out-of-domain keys.

Loss (``eval``, the paper's "error from true value"): per example, the mean over features of
``(1 - r̂_f(y | x_f))²`` ∈ [0, 1] (a Brier-type error of the predicted label rate). ``erm`` is the
same procedure on exact counts (the non-private PTK).
"""
from __future__ import annotations

import numpy as np
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.dp import counts as dp_counts
from sage_tfx.dp import noise as dp_noise
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ptk.abstraction import PrivacyCharge, concat

PRIOR_FLOOR = 1e-3


def check_config(config: dict) -> tuple:
    """(label, n_labels, features, smoothing, accumulate) or :class:`InvalidRequestError`."""
    if not isinstance(config, dict):
        raise InvalidRequestError(f"counts config must be a dict, got {type(config).__name__}")
    try:
        label, features = str(config["label"]), dict(config["features"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequestError(f"counts config needs label and features: {exc!r}") from exc
    n_labels = config.get("n_labels", 2)
    if isinstance(n_labels, bool) or not isinstance(n_labels, int) or n_labels < 2:
        raise InvalidRequestError(f"n_labels must be an int >= 2, got {n_labels!r}")
    smoothing = config.get("smoothing", 1.0)
    if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) \
            or not np.isfinite(smoothing) or smoothing <= 0:
        raise InvalidRequestError(f"smoothing must be a finite number > 0, got {smoothing!r}")
    if not features:
        raise InvalidRequestError("counts config declares no features")
    for col, spec in features.items():
        if not isinstance(spec, dict) or ("domain" in spec) == ("hash_width" in spec):
            raise InvalidRequestError(
                f"feature {col!r}: give exactly one of a declared 'domain' or 'hash_width' "
                f"(+ 'hash_depth'), got {spec!r}")
        if "domain" in spec:
            if not isinstance(spec["domain"], (list, tuple)) or not spec["domain"]:
                raise InvalidRequestError(f"feature {col!r}: domain must be a non-empty list")
        else:
            dp_counts.check_width(spec["hash_width"])
            dp_counts.check_depth(spec.get("hash_depth", 1))
    return label, n_labels, features, float(smoothing), bool(config.get("accumulate", False))


def _new_table(col: str, spec: dict, n_labels: int):
    if "domain" in spec:
        return dp_counts.DomainTable(spec["domain"], n_labels)
    return dp_counts.CountSketch(dp_counts.COUNT_MIN, spec.get("hash_depth", 1),
                                 spec["hash_width"], n_labels, f"ptk-counts:{col}".encode())


def _labels_of(data: dict, label: str, n_labels: int) -> np.ndarray:
    if label not in data:
        raise InvalidRequestError(f"the training data has no label column {label!r}")
    y = np.asarray(data[label])
    if y.dtype.kind == "b":
        y = y.astype(np.int64)
    if y.dtype.kind == "f" and np.all(y == np.round(y)):
        y = y.astype(np.int64)
    return y


def _tables(batches, config) -> dict:
    label, n_labels, features, _, _ = check_config(config)
    tables = {col: _new_table(col, spec, n_labels) for col, spec in features.items()}
    data = concat(batches)
    if not data:
        return tables
    y = _labels_of(data, label, n_labels)
    for col, table in tables.items():
        if col not in data:
            raise InvalidRequestError(f"the training data has no feature column {col!r}")
        table.add(list(np.asarray(data[col]).tolist()), y)
    return tables


def noise_plan(epsilon_train: float, config: dict) -> dict:
    """``{column: (l1_sensitivity, epsilon_share, discrete_laplace_scale)}`` for ``epsilon_train``.
    """
    _, n_labels, features, _, _ = check_config(config)
    shares = dp_counts.table_epsilons(epsilon_train, n_tables=len(features))
    plan = {}
    for (col, spec), eps_i in zip(features.items(), shares):
        depth = 1 if "domain" in spec else dp_counts.check_depth(spec.get("hash_depth", 1))
        plan[col] = (depth, float(eps_i), float(dp_counts.noise_scales([eps_i], depth)[0]))
    return plan


def dp_event(epsilon_train: float, config: dict) -> PrivacyCharge:
    """The :class:`PrivacyCharge` of :func:`train_dp` at ``epsilon_train``: one Laplace event per
    table (:func:`noise_plan`), composed."""
    plan = noise_plan(epsilon_train, config)
    events = [dp_event_lib.LaplaceDpEvent(noise_multiplier=scale / sens)
              for sens, _, scale in plan.values()]
    return PrivacyCharge(dp_event_lib.ComposedDpEvent(events), float(epsilon_train), 0.0)


def _state(tables: dict, config: dict) -> dict:
    _, n_labels, _, _, _ = check_config(config)
    first = next(iter(tables.values()))
    cells = np.asarray(first.cells, dtype=float)
    totals = cells.reshape(-1, n_labels) if cells.ndim == 2 else cells[0]
    prior = np.maximum(totals.sum(axis=0), PRIOR_FLOOR)
    return {"tables": {c: np.asarray(t.cells).tolist() for c, t in tables.items()},
            "prior": (prior / prior.sum()).tolist()}


def train_dp(trainset_iter, epsilon_train, prev_state, prev_config, *, config, noise=None):
    """A new DP state from the window's training batches at ``epsilon_train`` (noise from
    ``noise``, OpenDP by default; ``prev_state`` / ``prev_config``: the previous version's)."""
    noise = noise or dp_noise.SECURE
    plan = noise_plan(epsilon_train, config)
    tables = _tables(trainset_iter, config)
    for col, table in tables.items():
        table.add_noise(plan[col][2], noise)
    if check_config(config)[4] and prev_state is not None and prev_config == config:
        for col, table in tables.items():
            table.cells = table.cells + np.asarray(prev_state["tables"][col], dtype=np.int64)
    return _state(tables, config)


def erm(trainset_iter, *, config):
    """The same model trained without privacy: the profiler's non-private reference."""
    return _state(_tables(trainset_iter, config), config)


def label_rates(keys, col: str, state: dict, config: dict) -> np.ndarray:
    """``len(keys) × n_labels`` smoothed label rates of ``keys`` in column ``col``'s table."""
    _, n_labels, features, alpha, _ = check_config(config)
    table = _new_table(col, features[col], n_labels)
    table.cells = np.asarray(state["tables"][col], dtype=np.int64)
    counts = np.maximum(table.estimate(list(keys)), 0.0)
    prior = np.asarray(state["prior"], dtype=float)
    return (counts + alpha * prior) / (counts.sum(axis=1, keepdims=True) + alpha)


def eval(testset_iter, state, *, config):  # noqa: A001 - the paper's name
    """Per-example losses in [0, 1] of ``state`` on the test batches (the profiler's metric)."""
    label, n_labels, features, _, _ = check_config(config)
    data = concat(testset_iter)
    if not data:
        return np.zeros(0)
    y = _labels_of(data, label, n_labels)
    losses = np.zeros(len(y))
    for col in features:
        rates = label_rates(np.asarray(data[col]).tolist(), col, state, config)
        losses += (1.0 - rates[np.arange(len(y)), y]) ** 2
    return np.clip(losses / len(features), 0.0, 1.0)


def featurize(batch, state, config) -> dict:
    """Adds ``<name>_<col>_rate<l>`` (labels 1..L-1) and ``<name>_<col>_logn`` (log of 1 + the
    key's clipped noisy total) per declared feature column, from a pinned state."""
    _, n_labels, features, _, _ = check_config(config)
    name = config.get("name", "cnt")
    out = {}
    for col in features:
        keys = np.asarray(batch[col]).tolist()
        rates = label_rates(keys, col, state, config)
        for lab in range(1, n_labels):
            out[f"{name}_{col}_rate{lab}"] = rates[:, lab]
        table = _new_table(col, features[col], n_labels)
        table.cells = np.asarray(state["tables"][col], dtype=np.int64)
        out[f"{name}_{col}_logn"] = np.log1p(np.maximum(table.estimate(keys), 0).sum(axis=1))
    return out
