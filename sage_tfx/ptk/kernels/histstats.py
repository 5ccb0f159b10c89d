"""DP historical statistics PTK (PTK paper Tab. 1 row 5: aggregates with Laplace noise).

Config (all public, declared at registration): ``key`` (column name), ``domain`` (the list of
key values; records with other keys are dropped, so the domain leaks nothing), ``value`` (column),
``lower`` < ``upper`` (clipping bounds) and optionally ``carry`` in [0, 1) (weight of the previous
window's state, post-processing of earlier DP outputs), ``backoff`` >= 0 (the prior weight of the
featurizer's back-off, default 10 records) and ``name`` (the feature prefix).

Features (:func:`featurize`, post-processing of the DP state): ``<name>_count`` — the key's noisy
count (floored at 0; 0 for a key outside the domain) — and ``<name>_mean`` — the key's DP mean
shrunk towards the DP global mean g = Σ c⁺·m / Σ c⁺ with weight ``backoff``:
(c⁺·m + backoff·g) / (c⁺ + backoff). A rare key (few, noisy records) thus backs off to g, and an
unseen key (outside the domain) gets g exactly.

Privacy (add/remove-one neighbours, one record = one row): a record changes one key's count by 1
and that key's centred clipped sum by at most (upper - lower) / 2. Half of ``epsilon_train`` goes
to the counts (discrete Laplace, scale 2/ε, OpenDP) and half to the sums (Laplace, scale
(upper - lower)/ε, OpenDP), so ``train_dp`` is ε-DP by basic composition; the declared event is
``Composed([Laplace(2/ε), Laplace(2/ε)])`` in dp_accounting's sensitivity-1 convention.

Loss: ((f(key) - clip(value)) / (upper - lower))² ∈ [0, 1]; the exact ERM is the per-key clipped
mean, which the profiler uses for its lower bound.
"""
from __future__ import annotations

import numpy as np
from dp_accounting import dp_event as dp_event_lib

from sage_tfx.dp import noise as dp_noise
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ptk.abstraction import PrivacyCharge, concat
from sage_tfx.ptk.kernels._common import check_epsilon, require_columns


def check_config(config: dict) -> tuple:
    """The declared config's typed fields, or :class:`InvalidRequestError`."""
    try:
        key, value, domain = config["key"], config["value"], list(config["domain"])
        lower, upper = float(config["lower"]), float(config["upper"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRequestError(f"histstats config needs key, value, domain, lower, upper: {exc}")
    try:
        carry = float(config.get("carry", 0.0))
        backoff = float(config.get("backoff", 10.0))
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"histstats: carry and backoff must be numbers: {exc}") from exc
    if not domain or not np.isfinite([lower, upper]).all() or not lower < upper \
            or not 0.0 <= carry < 1.0 or not (np.isfinite(backoff) and backoff >= 0):
        raise InvalidRequestError(f"bad histstats config {config!r}")
    if len(set(map(str, domain))) != len(domain):
        raise InvalidRequestError("histstats: the declared key domain has duplicate values")
    return key, value, domain, lower, upper, carry


def _table(batches, config):
    key, value, domain, lower, upper, _ = check_config(config)
    data = concat(batches)
    if not data:
        return np.zeros(len(domain), dtype=np.int64), np.zeros(len(domain)), domain, lower, upper
    require_columns(data, [key, value], "histstats")
    keys = np.asarray(data[key]).astype(str)
    vals = np.clip(np.asarray(data[value], dtype=float), lower, upper)
    ok = np.isfinite(np.asarray(data[value], dtype=float))
    index = {str(k): i for i, k in enumerate(domain)}
    idx = np.array([index.get(k, -1) for k in keys], dtype=np.int64)
    keep = (idx >= 0) & ok
    counts = np.bincount(idx[keep], minlength=len(domain)).astype(np.int64)
    centre = (lower + upper) / 2.0
    sums = np.bincount(idx[keep], weights=vals[keep] - centre, minlength=len(domain))
    return counts, sums, domain, lower, upper


def dp_event(epsilon_train: float, config: dict) -> PrivacyCharge:
    """The :class:`PrivacyCharge` of :func:`train_dp` at ``epsilon_train``: two Laplace halves
    (counts and clipped sums), composed."""
    check_config(config)
    epsilon_train = check_epsilon(epsilon_train)
    half = dp_event_lib.LaplaceDpEvent(noise_multiplier=2.0 / epsilon_train)
    return PrivacyCharge(dp_event_lib.ComposedDpEvent([half, half]), epsilon_train, 0.0)


def train_dp(trainset_iter, epsilon_train, prev_state, prev_config, *, config, noise=None):
    """A new DP state from the window's training batches at ``epsilon_train`` (noise from
    ``noise``, OpenDP by default; ``prev_state`` / ``prev_config``: the previous version's)."""
    noise = noise or dp_noise.SECURE
    epsilon_train = check_epsilon(epsilon_train)
    counts, sums, domain, lower, upper = _table(trainset_iter, config)
    carry = check_config(config)[5]
    centre = (lower + upper) / 2.0
    noisy_counts = np.asarray(noise.discrete_laplace(counts, 2.0 / epsilon_train), dtype=float)
    noisy_sums = np.asarray(noise.laplace(sums, (upper - lower) / epsilon_train), dtype=float)
    denom = np.maximum(noisy_counts, 1.0)
    means = np.clip(centre + noisy_sums / denom, lower, upper)
    if prev_state is not None and carry > 0 and prev_state.get("domain") == [
        str(d) for d in domain]:
        means = carry * np.asarray(prev_state["means"]) + (1 - carry) * means
        noisy_counts = carry * np.asarray(prev_state["counts"]) + (1 - carry) * noisy_counts
    return {"domain": [str(d) for d in domain], "counts": noisy_counts.tolist(),
            "means": means.tolist()}


def erm(trainset_iter, *, config):
    """The same model trained without privacy: the profiler's non-private reference."""
    counts, sums, domain, lower, upper = _table(trainset_iter, config)
    means = (lower + upper) / 2.0 + sums / np.maximum(counts, 1)
    return {"domain": [str(d) for d in domain], "counts": counts.astype(float).tolist(),
            "means": means.tolist()}


def eval(testset_iter, state, *, config):  # noqa: A001 - the paper's name
    """Per-example losses in [0, 1] of ``state`` on the test batches (the profiler's metric)."""
    key, value, domain, lower, upper, _ = check_config(config)
    data = concat(testset_iter)
    if not data:
        return np.zeros(0)
    index = {k: i for i, k in enumerate(state["domain"])}
    keys = np.asarray(data[key]).astype(str)
    raw = np.asarray(data[value], dtype=float)
    idx = np.array([index.get(k, -1) for k in keys], dtype=np.int64)
    keep = (idx >= 0) & np.isfinite(raw)
    pred = np.asarray(state["means"], dtype=float)[idx[keep]]
    return ((pred - np.clip(raw[keep], lower, upper)) / (upper - lower)) ** 2


def featurize(batch, state, config) -> dict:
    """Adds ``<name>_count`` and ``<name>_mean`` (with back-off, see the module docstring) from a
    pinned state."""
    key, value, _, lower, upper, _ = check_config(config)
    backoff = float(config.get("backoff", 10.0))
    require_columns(batch, [key], "histstats")
    name = config.get("name", f"{key}_{value}")
    counts = np.maximum(np.asarray(state["counts"], dtype=float), 0.0)
    means = np.asarray(state["means"], dtype=float)
    total = counts.sum()
    prior = float(counts @ means / total) if total > 0 else (lower + upper) / 2.0
    shrunk = (counts * means + backoff * prior) / np.maximum(counts + backoff, 1e-12) \
        if backoff > 0 else means
    index = {k: i for i, k in enumerate(state["domain"])}
    idx = np.array([index.get(str(k), -1) for k in np.asarray(batch[key])], dtype=np.int64)
    return {f"{name}_count": np.append(counts, 0.0)[idx],
            f"{name}_mean": np.append(shrunk, prior)[idx]}
