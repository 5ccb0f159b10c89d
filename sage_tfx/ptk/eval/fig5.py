"""The PTK paper's Fig. 5 protocol, for any ptklib kernel: does a model that consumes PTK features
trained on a *source* dataset need less *target* data, and what does DP cost against a
non-private PTK?

API
---
``run_fig5(dataset, source, target_train, target_test, *, label, kernel, kernel_config,
base_features, model_factory, metric, fractions, epsilons, seeds, kernel_name=None,
noise_factory=SeededNoise) -> list[dict]``

* ``source`` / ``target_train`` / ``target_test`` — dicts of equal-length numpy columns (the
  record batches a PTK consumes). The PTK is trained on all of ``source``; the downstream model
  on a fraction of ``target_train``; the metric is measured on all of ``target_test``.
* ``kernel`` — a kernel module or its import path (``"sage_tfx.ptk.kernels.counts"``) defining
  ``train_dp(batches, eps, prev_state, prev_config, *, config, noise)``, ``featurize(batch,
  state, config=...) -> {name: column}`` and, for the non-private variant, ``erm(batches, *,
  config)``; ``kernel_config`` is its (public) config.
* ``base_features(columns) -> 2-D float array`` — the raw features every variant gets (the PTK
  variants get the PTK columns appended, as in §6.2 "count features in addition to all of the
  raw features").
* ``model_factory(seed) -> estimator`` — a fresh scikit-learn estimator (a Pipeline is fine).
* ``metric`` — ``"log_loss"``, ``"auc"``, ``"accuracy"`` (classification, ``label`` integer
  classes) or ``"mse"``, ``"mae"`` (regression). :data:`LOWER_IS_BETTER` says which way is better.
* ``fractions`` — fractions of ``target_train`` in (0, 1]; per seed the subsets are nested
  prefixes of one seeded permutation.
* ``epsilons`` — the ε of the DP PTK (``train_dp``); one DP PTK per (ε, seed), trained with
  ``noise_factory(seed)`` (:class:`~sage_tfx.dp.noise.SeededNoise` by default: an experiment
  must be reproducible; pass ``lambda s: sage_tfx.dp.noise.SECURE`` for OpenDP noise).

Returns one row per (variant, ε, fraction, seed): ``{"dataset", "kernel", "variant", "eps",
"fraction", "n_train", "metric", "value", "seed"}``, with ``variant`` in ``{"no_ptk",
"dp_ptk", "nonprivate_ptk"}`` and ``eps`` NaN except for ``dp_ptk``. A fit that cannot run
(a subset with a single class) gives ``value`` NaN. :func:`summarize`, :func:`write_csv` and
:func:`plot` turn rows into Fig. 5-style tables and plots (loss vs fraction, one line per
variant / ε).
"""
from __future__ import annotations

import csv
import importlib
import math
from typing import Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidRequestError
from sage_tfx.ptk.abstraction import batches_of

VARIANTS = ("no_ptk", "dp_ptk", "nonprivate_ptk")
LOWER_IS_BETTER = {"log_loss": True, "auc": False, "accuracy": False, "mse": True, "mae": True}
FIELDS = ("dataset", "kernel", "variant", "eps", "fraction", "n_train", "metric", "value", "seed")


def _module(kernel):
    if isinstance(kernel, str):
        try:
            return importlib.import_module(kernel)
        except ImportError as exc:
            raise InvalidRequestError(f"cannot import kernel module {kernel!r}: {exc}") from exc
    return kernel


def _n(columns: Mapping[str, np.ndarray]) -> int:
    lengths = {len(np.asarray(v)) for v in columns.values()}
    if len(lengths) != 1:
        raise InvalidRequestError(f"columns must be non-empty and of equal length, got {lengths}")
    return lengths.pop()


def _score(metric: str, model, x: np.ndarray, y: np.ndarray) -> float:
    from sklearn import metrics as skm
    if metric == "log_loss":
        return float(skm.log_loss(y, model.predict_proba(x), labels=model.classes_))
    if metric == "auc":
        p = model.predict_proba(x)
        return float(skm.roc_auc_score(y, p[:, 1]) if p.shape[1] == 2 else
                     skm.roc_auc_score(y, p, multi_class="ovr", labels=model.classes_))
    if metric == "accuracy":
        return float(skm.accuracy_score(y, model.predict(x)))
    if metric == "mse":
        return float(skm.mean_squared_error(y, model.predict(x)))
    return float(skm.mean_absolute_error(y, model.predict(x)))


def _ptk_matrix(kernel, state, columns, config) -> np.ndarray:
    feats = kernel.featurize(columns, state, config=config)
    if not feats:
        return np.zeros((_n(columns), 0))
    return np.column_stack([np.asarray(feats[k], dtype=float) for k in sorted(feats)])


def run_fig5(dataset: str, source: Mapping, target_train: Mapping, target_test: Mapping, *,
             label: str, kernel, kernel_config: dict,
             base_features: Callable[[Mapping], np.ndarray],
             model_factory: Callable[[int], object], metric: str = "log_loss",
             fractions: Sequence[float] = (0.05, 0.1, 0.25, 0.5, 1.0),
             epsilons: Sequence[float] = (0.1, 1.0), seeds: Sequence[int] = (0,),
             kernel_name: Optional[str] = None,
             noise_factory: Callable[[int], object] = SeededNoise, threads: int = 1) -> list:
    """Runs the Fig. 5 protocol (see the module docstring) and returns its rows. Model fits
    use at most ``threads`` OpenMP / BLAS threads (threadpoolctl): on a shared machine
    oversubscribed OpenMP threads make histogram gradient boosting many times slower."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=threads):
        return _run_fig5(dataset, source, target_train, target_test, label, kernel, kernel_config,
                         base_features, model_factory, metric, fractions, epsilons, seeds,
                         kernel_name, noise_factory)


def _run_fig5(dataset, source, target_train, target_test, label, kernel, kernel_config,
              base_features, model_factory, metric, fractions, epsilons, seeds, kernel_name,
              noise_factory) -> list:
    if metric not in LOWER_IS_BETTER:
        raise InvalidRequestError(
            f"metric must be one of {sorted(LOWER_IS_BETTER)}, got {metric!r}")
    fractions = [float(f) for f in fractions]
    if not fractions or any(not (0 < f <= 1) for f in fractions):
        raise InvalidRequestError(f"fractions must lie in (0, 1], got {fractions!r}")
    if any(not (isinstance(e, (int, float)) and math.isfinite(e) and e > 0) for e in epsilons):
        raise InvalidRequestError(f"epsilons must be finite and > 0, got {list(epsilons)!r}")
    if not seeds:
        raise InvalidRequestError("give at least one seed")
    for name, cols in (("source", source), ("target_train", target_train),
                       ("target_test", target_test)):
        if label not in cols:
            raise InvalidRequestError(f"{name} has no label column {label!r}")
        _n(cols)
    mod = _module(kernel)
    kname = kernel_name or getattr(mod, "__name__", str(kernel)).rsplit(".", 1)[-1]
    y_tr, y_te = np.asarray(target_train[label]), np.asarray(target_test[label])
    base_tr = np.asarray(base_features(target_train), dtype=float).reshape(len(y_tr), -1)
    base_te = np.asarray(base_features(target_test), dtype=float).reshape(len(y_te), -1)

    states = []   # (variant, eps, seed or None, state)
    if hasattr(mod, "erm"):
        states.append(("nonprivate_ptk", math.nan, None,
                       mod.erm(batches_of(source), config=kernel_config)))
    for seed in seeds:
        for eps in epsilons:
            states.append(("dp_ptk", float(eps), seed, mod.train_dp(
                batches_of(source), float(eps), None, None, config=kernel_config,
                noise=noise_factory(seed))))
    feats = [(variant, eps, s_seed,
              np.hstack([base_tr, _ptk_matrix(mod, st, target_train, kernel_config)]),
              np.hstack([base_te, _ptk_matrix(mod, st, target_test, kernel_config)]))
             for variant, eps, s_seed, st in states]
    feats.insert(0, ("no_ptk", math.nan, None, base_tr, base_te))

    rows = []
    for seed in seeds:
        order = np.random.default_rng(seed).permutation(len(y_tr))
        for frac in fractions:
            idx = order[:max(1, int(math.ceil(frac * len(y_tr))))]
            for variant, eps, s_seed, x_tr, x_te in feats:
                if s_seed is not None and s_seed != seed:
                    continue
                value = math.nan
                if metric in ("mse", "mae") or len(np.unique(y_tr[idx])) > 1:
                    model = model_factory(seed)
                    model.fit(x_tr[idx], y_tr[idx])
                    value = _score(metric, model, x_te, y_te)
                rows.append({"dataset": dataset, "kernel": kname, "variant": variant, "eps": eps,
                             "fraction": frac, "n_train": int(len(idx)), "metric": metric,
                             "value": value, "seed": int(seed)})
    return rows


def summarize(rows: Iterable[dict]) -> list:
    """Mean, std and count of ``value`` per (dataset, kernel, variant, eps, fraction, metric)."""
    groups: dict = {}
    for r in rows:
        eps = r["eps"]
        key = (r["dataset"], r["kernel"], r["variant"],
               None if eps is None or (isinstance(eps, float) and math.isnan(eps)) else eps,
               r["fraction"], r["metric"])
        groups.setdefault(key, []).append(float(r["value"]))
    out = []
    for (ds, k, v, eps, frac, metric), vals in sorted(
            groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        arr = np.asarray([x for x in vals if not math.isnan(x)])
        out.append({"dataset": ds, "kernel": k, "variant": v,
                    "eps": math.nan if eps is None else eps, "fraction": frac, "metric": metric,
                    "mean": float(arr.mean()) if arr.size else math.nan,
                    "std": float(arr.std()) if arr.size else math.nan, "n": int(arr.size)})
    return out


def write_csv(rows: Sequence[dict], path: str) -> None:
    """Writes rows (of :func:`run_fig5` or :func:`summarize`) to ``path``."""
    if not rows:
        raise InvalidRequestError("no rows to write")
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def plot(rows: Sequence[dict], path: str, title: str = "") -> None:
    """Fig. 5-style PNG: one panel per kernel, metric vs target fraction, one line per variant /
    ε (mean over seeds, ±1 std band)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    summary = summarize(rows)
    kernels = sorted({r["kernel"] for r in summary})
    fig, axes = plt.subplots(1, len(kernels), figsize=(5 * len(kernels), 3.8), squeeze=False)
    for ax, k in zip(axes[0], kernels):
        mine = [r for r in summary if r["kernel"] == k]
        lines: dict = {}
        for r in mine:
            tag = {"no_ptk": "No PTK", "nonprivate_ptk": "NP PTK"}.get(
                r["variant"], f"PTK ε={r['eps']:g}")
            lines.setdefault(tag, []).append((r["fraction"], r["mean"], r["std"]))
        for tag, pts in sorted(lines.items()):
            pts.sort()
            f, m, s = (np.asarray(c, dtype=float) for c in zip(*pts))
            ax.plot(f, m, marker="o", label=tag)
            ax.fill_between(f, m - s, m + s, alpha=0.15)
        ax.set_xscale("log")
        ax.set_xlabel("fraction of target training data")
        ax.set_ylabel(mine[0]["metric"] if mine else "")
        ax.set_title(f"{title} {k}".strip())
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_and_write(dataset: str, task: dict, kernels: Mapping[str, tuple], *, out_dir: str,
                  stem: str, **kw) -> list:
    """Runs :func:`run_fig5` for each ``{name: (kernel, config)}`` on ``task`` (a dict with
    ``source``, ``target_train``, ``target_test``, ``label``, ``base_features``; see
    :mod:`sage_tfx.ptk.eval.fig5_data`), and writes ``<stem>.csv`` (all rows),
    ``<stem>_summary.csv``, ``<stem>_headline.csv`` (:func:`headline`) and ``<stem>.png`` under
    ``out_dir``. ``kw`` go to :func:`run_fig5`."""
    import os
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for name, (kernel, config) in kernels.items():
        rows += run_fig5(dataset, task["source"], task["target_train"], task["target_test"],
                         label=task["label"], kernel=kernel, kernel_config=config,
                         base_features=task["base_features"], kernel_name=name, **kw)
    write_csv(rows, os.path.join(out_dir, f"{stem}.csv"))
    write_csv(summarize(rows), os.path.join(out_dir, f"{stem}_summary.csv"))
    write_csv(headline(rows), os.path.join(out_dir, f"{stem}_headline.csv"))
    plot(rows, os.path.join(out_dir, f"{stem}.png"), dataset)
    return rows


def print_summary(rows: Sequence[dict]) -> None:
    """One line per (kernel, variant, ε): the mean metric at each fraction."""
    summary = summarize(rows)
    fracs = sorted({r["fraction"] for r in summary})
    print("kernel  variant          eps   " + "  ".join(f"{f:>8g}" for f in fracs))
    lines: dict = {}
    for r in summary:
        lines.setdefault((r["kernel"], r["variant"], r["eps"]), {})[r["fraction"]] = r["mean"]
    for (k, v, e), vals in lines.items():
        print(f"{k:7s} {v:16s} {e:5g} " + "  ".join(f"{vals.get(f, math.nan):8.4f}" for f in fracs))
    for h in headline(rows):
        print(f"{h['kernel']} eps={h['eps']:g}: DP PTK vs no PTK "
              f"{100 * h['improvement_small']:+.2f} % at {h['smallest_fraction']:g}, "
              f"{100 * h['improvement_full']:+.2f} % at {h['largest_fraction']:g}; "
              f"{100 * h['np_gap_full']:.2f} % worse than non-private; "
              f"matches the no-PTK best at fraction {h['match_fraction']}")


def headline(rows: Sequence[dict]) -> list:
    """The paper's Fig. 5 statements per (dataset, kernel, ε), from the mean over seeds:

    * ``improvement_small`` / ``improvement_full`` — relative improvement of the DP PTK over no
      PTK (positive = better, in the metric's direction) at the smallest fraction and at 1.0;
    * ``np_gap_full`` — relative gap of the DP PTK to the non-private PTK at the largest fraction;
    * ``match_fraction`` — the smallest fraction at which the DP PTK is at least as good as no
      PTK's best value over all fractions (None if never): "matches the no-PTK best with x %".
    """
    summary = summarize(rows)
    out = []
    keys = sorted({(r["dataset"], r["kernel"], r["eps"]) for r in summary
                   if r["variant"] == "dp_ptk"})
    for ds, k, eps in keys:
        mine = [r for r in summary if r["dataset"] == ds and r["kernel"] == k]
        lower = LOWER_IS_BETTER[mine[0]["metric"]]
        sign = 1.0 if lower else -1.0
        line = {v: {r["fraction"]: r["mean"] for r in mine if r["variant"] == v
                    and (v != "dp_ptk" or r["eps"] == eps)} for v in VARIANTS}
        fr = sorted(line["no_ptk"])
        best_no = min(sign * v for v in line["no_ptk"].values()) * sign

        def rel(a, b):  # improvement of a over b, positive = better
            return sign * (b - a) / abs(b)
        match = next((f for f in fr if sign * line["dp_ptk"][f] <= sign * best_no), None)
        out.append({"dataset": ds, "kernel": k, "eps": eps, "metric": mine[0]["metric"],
                    "smallest_fraction": fr[0], "largest_fraction": fr[-1],
                    "improvement_small": rel(line["dp_ptk"][fr[0]], line["no_ptk"][fr[0]]),
                    "improvement_full": rel(line["dp_ptk"][fr[-1]], line["no_ptk"][fr[-1]]),
                    "np_gap_full": -rel(line["dp_ptk"][fr[-1]], line["nonprivate_ptk"][fr[-1]]),
                    "match_fraction": match})
    return out
