"""Windowed DP count tables on the ledger: hot window, sealing, retention, roll-over deletion.

Pyramid §III.B.1/§III.B.3 on sage-tfx's ledger. A :class:`PyramidStore` keeps, for one stream
and one :class:`~sage_tfx.pyramid.featurize.CountSpec`:

* one **hot window** (``hot/w<id>/`` under ``state_dir``): the raw observations of the current
  window (exposed to training, as in the paper) and any non-DP artifact derived from them
  (:meth:`PyramidStore.hot_artifact_path`: featurized training sets, exact statistics, models);
* **sealed windows** (``sealed/w<id>.npz``): the DP count sketches of closed windows. The
  featurization is the sum of the live sealed windows; a sealed window is never updated again.

:meth:`PyramidStore.seal` closes the hot window. In order, and only if every step before it
succeeded: (1) one ledger charge for the window's blocks with the idempotent run id
``pyramid-<stream>-<spec digest>-w<id>`` covering exactly what is released from the window (the
count tables, ε of the spec, plus the noise-weight selection if it runs on this window);
(2) the counts, with OpenDP discrete Laplace noise of scale ``h k / ε_i`` in every cell of table
``i`` (:mod:`sage_tfx.dp.counts`); (3) the sealed file; (4) deletion of the hot window's raw
data and non-DP artifacts; (5) retention: windows older than the newest ``retention`` sealed
ones are dropped (file deleted) and the retrain callbacks run (§III.B.3: "drops the oldest
window and invokes retraining of all models").

**Accounting mode.** On a basic stream the charge is ``(ε, 0)`` and the cells get OpenDP discrete
Laplace noise. On an rdp stream the charge is the DpEvent of the mechanism that runs:
``ComposedDpEvent`` of one :func:`~sage_tfx.dp.counts.table_event` per table (each row of a
table one Laplace mechanism of L1 sensitivity ``k``), and the cells get OpenDP *continuous*
Laplace noise of that scale (raised by the few ulps OpenDP's own map needs): the mechanism the
``LaplaceDpEvent`` describes, since dp_accounting has no discrete-Laplace event (see
``table_event``). Noise-weight selection (exponential-mechanism quantiles, no dp_accounting
event) is refused on rdp streams.

Bad input (a window already sealed, a window outside the retention horizon, a second hot
window, unknown or non-categorical features) raises a ``ValueError`` subclass and changes
nothing. A denied ledger charge raises :class:`BudgetDeniedError` and leaves the hot window open.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from typing import Any, Callable, Optional, Sequence

import dp_accounting
import numpy as np
import pandas as pd

from sage_tfx.dp import noise as dp_noise
from sage_tfx.dp.counts import noise_scales, table_epsilons, table_event
from sage_tfx.dp.mechanisms import secure_laplace_scale
from sage_tfx.errors import InvalidRequestError, SageError
from sage_tfx.ledger import accounting
from sage_tfx.pyramid.featurize import CountSpec, Featurization, check_frame, group_keys
from sage_tfx.pyramid.weights import select_noise_weights

__all__ = ["PyramidStore", "SealResult", "WindowSealedError", "RetentionError",
           "BudgetDeniedError", "discrete_laplace_variance", "PRIOR", "pyramid_run_id",
           "window_event"]

PRIOR = "__prior__"


class WindowSealedError(InvalidRequestError):
    """The window is already sealed: its table is final and its data is gone."""


class RetentionError(InvalidRequestError):
    """The window lies outside the retention horizon (or before the newest sealed window)."""


class BudgetDeniedError(SageError):
    """The ledger refused the window's charge; nothing was released and the window stays open."""


def pyramid_run_id(stream: str, spec: CountSpec, window: int) -> str:
    """The idempotent ledger run id of one window's tables: (stream, count spec, window)."""
    return f"pyramid-{stream}-{spec.digest()}-w{int(window)}"


def window_event(spec: CountSpec, weights: Optional[Sequence[float]] = None
                 ) -> dp_accounting.DpEvent:
    """The DpEvent one window's tables cost on an rdp stream (what :meth:`PyramidStore.seal`
    charges there, and what a pipeline's gate must charge): one
    :func:`~sage_tfx.dp.counts.table_event` per group table (depth rows) and one for the label
    prior (one row), at the ε shares of ``weights`` (even split if None)."""
    eps = table_epsilons(spec.epsilon, weights, n_tables=spec.n_tables)
    depths = [spec.depth] * len(spec.groups) + [1]
    return dp_accounting.ComposedDpEvent([table_event(float(e), d) for e, d in zip(eps, depths)])


def discrete_laplace_variance(scale: float) -> float:
    """Variance of discrete Laplace P(z) ∝ exp(-|z|/scale): 2 e^{-1/s} / (1 - e^{-1/s})²."""
    q = math.exp(-1.0 / scale)
    return 2.0 * q / (1.0 - q) ** 2


def _variance(scale: float, continuous: bool) -> float:
    """Noise variance of one cell: Laplace 2 s², or the discrete Laplace's."""
    return 2.0 * scale ** 2 if continuous else discrete_laplace_variance(scale)


@dataclasses.dataclass(frozen=True)
class SealResult:
    """What :meth:`PyramidStore.seal` did."""

    window: int
    run_id: str
    epsilon_charged: float
    table_epsilons: tuple[float, ...]
    noise_scales: tuple[float, ...]
    grant_id: Optional[str]
    dropped: tuple[int, ...]
    deleted: tuple[str, ...]
    retrain: bool
    next_weights: Optional[tuple[float, ...]] = None
    event: Optional[dp_accounting.DpEvent] = None     # the charge on an rdp stream


class PyramidStore:
    """Windowed DP count tables of one stream and one count spec (see the module docstring).

    Args:
      spec: what is counted and at what ε per window.
      state_dir: directory of the store (manifest, hot window, sealed windows).
      retention: number of sealed windows kept live (the retention horizon).
      ledger, stream: the ledger and stream charged at every seal. ``ledger=None`` charges
        nothing and is for offline experiments only (the evaluation in ``pyramid/eval``).
      noise: noise source; OpenDP (:data:`sage_tfx.dp.noise.SECURE`) unless an experiment
        passes :class:`~sage_tfx.dp.noise.SeededNoise`.
      max_variance: back-off threshold of the featurization.
    """

    def __init__(self, spec: CountSpec, state_dir: str, *, retention: int, ledger=None,
                 stream: Optional[str] = None, noise=None, max_variance: float = 0.01):
        if not isinstance(spec, CountSpec):
            raise InvalidRequestError("spec must be a CountSpec")
        if isinstance(retention, bool) or not isinstance(retention, int) or retention < 1:
            raise InvalidRequestError(f"retention must be an int >= 1 window, got {retention!r}")
        if (ledger is None) != (stream is None):
            raise InvalidRequestError("give both ledger and stream, or neither")
        if ledger is not None:
            ledger.stream(stream)  # raises UnknownStreamError
        self.spec, self.retention, self.ledger, self.stream = spec, retention, ledger, stream
        self.noise = noise if noise is not None else dp_noise.SECURE
        self.max_variance = float(max_variance)
        self.state_dir = os.path.abspath(state_dir)
        self._manifest_path = os.path.join(self.state_dir, "manifest.json")
        self._retrain_callbacks: list[Callable[[tuple], Any]] = []
        self._cached: Optional[Featurization] = None
        if os.path.exists(self._manifest_path):
            with open(self._manifest_path) as f:
                self._m = json.load(f)
            if self._m["spec"] != spec.to_json():
                raise InvalidRequestError(f"{state_dir} holds a store of a different count spec")
        else:
            os.makedirs(os.path.join(self.state_dir, "sealed"), exist_ok=True)
            self._m = {"spec": spec.to_json(), "hot": None, "live": [], "newest": None,
                       "next_weights": None}
            self._save_manifest()

    # -- state --

    def _save_manifest(self) -> None:
        tmp = self._manifest_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self._m, f, indent=1, sort_keys=True)
        os.replace(tmp, self._manifest_path)

    @property
    def live_windows(self) -> tuple[int, ...]:
        return tuple(self._m["live"])

    @property
    def hot_window(self) -> Optional[int]:
        return None if self._m["hot"] is None else int(self._m["hot"]["window"])

    @property
    def next_weights(self) -> Optional[tuple[float, ...]]:
        w = self._m["next_weights"]
        return None if w is None else tuple(w)

    def run_id(self, window: int) -> str:
        return pyramid_run_id(self.stream or "offline", self.spec, window)

    def _hot_dir(self, window: int) -> str:
        return os.path.join(self.state_dir, "hot", f"w{int(window)}")

    def _sealed_path(self, window: int) -> str:
        return os.path.join(self.state_dir, "sealed", f"w{int(window)}.npz")

    def on_retrain(self, callback: Callable[[tuple], Any]) -> None:
        """Registers ``callback(dropped_windows)``, called when windows leave retention."""
        self._retrain_callbacks.append(callback)

    # -- the hot window --

    def open_window(self, window: int, blocks: Sequence[str] = ()) -> None:
        """Opens ``window`` as the hot window over ledger ``blocks`` (required with a ledger)."""
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
            raise InvalidRequestError(f"window must be an int >= 0, got {window!r}")
        window = int(window)
        if os.path.exists(self._sealed_path(window)) or window in self._m["live"]:
            raise WindowSealedError(f"window {window} is already sealed")
        newest = self._m["newest"]
        if newest is not None and window <= newest:
            horizon = newest - self.retention
            raise (WindowSealedError if window > horizon else RetentionError)(
                f"window {window} is not after the newest sealed window {newest}"
                + (f" (retention horizon: windows > {horizon})" if window <= horizon else ""))
        if self._m["hot"] is not None:
            raise InvalidRequestError(f"window {self._m['hot']['window']} is still hot: seal it first")
        blocks = [str(b) for b in blocks]
        if self.ledger is not None and not blocks:
            raise InvalidRequestError("a window on the ledger needs its block ids")
        os.makedirs(self._hot_dir(window), exist_ok=True)
        self._m["hot"] = {"window": window, "blocks": blocks, "parts": 0}
        self._save_manifest()

    def _need_hot(self) -> dict:
        if self._m["hot"] is None:
            raise InvalidRequestError("no hot window: open one first")
        return self._m["hot"]

    def observe(self, frame: pd.DataFrame) -> None:
        """Adds observations to the hot window (raw store)."""
        hot = self._need_hot()
        check_frame(frame, self.spec.features, self.spec.label, self.spec.n_labels)
        cols = list(self.spec.features) + [self.spec.label]
        path = os.path.join(self._hot_dir(hot["window"]), f"raw-{hot['parts']:05d}.pkl")
        frame[cols].reset_index(drop=True).to_pickle(path)
        hot["parts"] += 1
        self._save_manifest()

    def hot_frame(self) -> pd.DataFrame:
        """The hot window's raw observations (for training on count features)."""
        hot = self._need_hot()
        d = self._hot_dir(hot["window"])
        parts = [pd.read_pickle(os.path.join(d, f)) for f in sorted(os.listdir(d))
                 if f.startswith("raw-")]
        cols = list(self.spec.features) + [self.spec.label]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)

    def hot_artifact_path(self, name: str) -> str:
        """A path for a non-DP artifact of the hot window; deleted when the window is sealed."""
        if not name or os.sep in name or name.startswith("."):
            raise InvalidRequestError(f"artifact name must be a plain file name, got {name!r}")
        return os.path.join(self._hot_dir(self._need_hot()["window"]), f"artifact-{name}")

    # -- sealing --

    def seal(self, *, weights: Optional[Sequence[float]] = None,
             weight_epsilon: Optional[float] = None, weight_quantile: float = 0.1,
             max_count: Optional[int] = None, grant=None) -> SealResult:
        """Closes the hot window (see the module docstring for the steps and their order).

        Args:
          weights: noise weights, one per table (groups, then the prior); default: the weights
            selected at an earlier seal, else an even split.
          weight_epsilon: if given, also select ε-DP noise weights for the next windows from this
            window's data (charged here, on top of ``spec.epsilon``).
          weight_quantile, max_count: quantile and public bound of the weight selection.
          grant: a released ledger grant that already paid for this window (e.g. from the
            ``SageGate`` of a pipeline): it must be this window's run id, stream, blocks and ε,
            and the ledger must hold it as released. No second charge is made.
        """
        hot = self._need_hot()
        window = int(hot["window"])
        if weights is None and self._m["next_weights"] is not None:
            weights = self._m["next_weights"]
        eps_tables = table_epsilons(self.spec.epsilon, weights, n_tables=self.spec.n_tables)
        if weight_epsilon is not None and (max_count is None or not 0 < weight_quantile < 1):
            raise InvalidRequestError("weight selection needs max_count (a public bound) and a "
                                      f"quantile in (0, 1), got {max_count!r}, {weight_quantile!r}")
        eps_total = self.spec.epsilon + (0.0 if weight_epsilon is None else
                                         float(table_epsilons(weight_epsilon, n_tables=1)[0]))
        rdp = self._rdp_mode()
        depths = [self.spec.depth] * len(self.spec.groups) + [1]      # groups, then the prior
        event = None
        if rdp:
            if weight_epsilon is not None:
                raise InvalidRequestError(
                    "noise-weight selection has no dp_accounting event: not available on an "
                    "rdp stream (give weights, or use a basic stream)")
            event = window_event(self.spec, weights)
            scales = np.array([secure_laplace_scale(float(e) / d, self.spec.k)
                               for e, d in zip(eps_tables, depths)])
        else:
            scales = np.append(noise_scales(eps_tables[:-1], self.spec.depth, self.spec.k),
                               noise_scales(eps_tables[-1:], 1, self.spec.k))
        frame = self.hot_frame()
        run_id = self.run_id(window)
        grant_id = None
        if grant is not None:
            grant_id = self._check_grant(grant, run_id, hot["blocks"], eps_total, event)
        elif self.ledger is not None:
            cost = {"event": event} if rdp else {"epsilon": eps_total, "delta": 0.0}
            decision = self.ledger.request(self.stream, run_id=run_id, blocks=hot["blocks"],
                                           **cost)
            if not decision.granted:
                raise BudgetDeniedError(f"ledger refused window {window}: {decision.reason}")
            if decision.replayed:
                raise InvalidRequestError(
                    f"run {run_id} was already charged but its table is not sealed here; "
                    "refusing to draw fresh noise for a release already paid for")
            grant_id = decision.grant.grant_id
        labels = frame[self.spec.label].to_numpy().astype(np.int64)
        arrays, noise_var = {}, {}
        for g, scale in zip(self.spec.groups, scales[:-1]):
            sketch = self.spec.new_sketch(g)
            sketch.add(group_keys(frame, g), labels)
            if rdp:
                sketch.add_laplace_noise(float(scale), self.noise)
            else:
                sketch.add_noise(float(scale), self.noise)
            arrays[f"cells__{self.spec.group_name(g)}"] = sketch.cells
            noise_var[self.spec.group_name(g)] = _variance(float(scale), rdp)
        counts = np.bincount(labels, minlength=self.spec.n_labels)
        prior = np.asarray(self.noise.laplace(counts, float(scales[-1])) if rdp else
                           self.noise.discrete_laplace(counts, float(scales[-1])))
        noise_var[PRIOR] = _variance(float(scales[-1]), rdp)
        next_weights = None
        if weight_epsilon is not None:
            next_weights = select_noise_weights(frame, self.spec, weight_epsilon,
                                                quantile=weight_quantile, max_count=max_count)
        meta = {"window": window, "run_id": run_id, "noise_var": noise_var,
                "mechanism": "laplace" if rdp else "discrete_laplace",
                "epsilons": eps_tables.tolist(), "scales": scales.tolist()}
        tmp = self._sealed_path(window) + ".tmp.npz"
        np.savez(tmp, prior=prior, meta=np.array(json.dumps(meta)), **arrays)
        os.replace(tmp, self._sealed_path(window))
        deleted = self._delete_hot(window)
        live = sorted(self._m["live"] + [window])
        dropped = tuple(live[:-self.retention]) if len(live) > self.retention else ()
        for w in dropped:
            os.remove(self._sealed_path(w))
            deleted.append(self._sealed_path(w))
        self._m.update(hot=None, live=live[-self.retention:], newest=window)
        if next_weights is not None:
            self._m["next_weights"] = [float(v) for v in next_weights]
        self._save_manifest()
        self._cached = None
        for cb in self._retrain_callbacks if dropped else ():
            cb(dropped)
        return SealResult(window, run_id, eps_total, tuple(eps_tables.tolist()),
                          tuple(scales.tolist()), grant_id, dropped, tuple(deleted), bool(dropped),
                          None if next_weights is None else tuple(next_weights.tolist()), event)

    def _rdp_mode(self) -> bool:
        if self.ledger is None:
            return False
        return self.ledger.stream(self.stream).mode == accounting.RDP

    def _check_grant(self, grant, run_id: str, blocks: Sequence[str], epsilon: float,
                     event=None) -> str:
        if self.ledger is None:
            raise InvalidRequestError("a grant can only be used by a store on a ledger")
        from sage_tfx.ledger import RELEASED
        recorded = self.ledger.grant(grant.grant_id)
        problems = []
        if recorded.status != RELEASED:
            problems.append(f"status {recorded.status}")
        if recorded.run_id != run_id:
            problems.append(f"run id {recorded.run_id!r} is not {run_id!r}")
        if recorded.stream != self.stream:
            problems.append(f"stream {recorded.stream!r}")
        if sorted(b.block_id for b in recorded.blocks) != sorted(blocks):
            problems.append("blocks differ from the window's")
        if event is not None:
            if recorded.event is None or \
                    accounting.event_to_json(recorded.event) != accounting.event_to_json(event):
                problems.append(f"event {recorded.event} is not the tables' {event}")
        elif recorded.epsilon is None or not math.isclose(recorded.epsilon, epsilon, rel_tol=1e-12) \
                or (recorded.delta or 0.0) != 0.0:
            problems.append(f"cost ({recorded.epsilon}, {recorded.delta}) is not ({epsilon}, 0)")
        if problems:
            raise InvalidRequestError(f"grant {grant.grant_id} does not pay for this window: "
                                      + "; ".join(problems))
        return recorded.grant_id

    def _delete_hot(self, window: int) -> list[str]:
        d = self._hot_dir(window)
        deleted = [os.path.join(d, f) for f in sorted(os.listdir(d))] if os.path.isdir(d) else []
        shutil.rmtree(d, ignore_errors=False) if os.path.isdir(d) else None
        return deleted

    # -- featurization --

    def _load_sum(self) -> Featurization:
        cells: dict = {}
        prior = np.zeros(self.spec.n_labels)
        noise_var: dict = {}
        for w in self._m["live"]:
            with np.load(self._sealed_path(w), allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                for k in z.files:
                    if k.startswith("cells__"):
                        name = k[len("cells__"):]
                        cells[name] = cells[name] + z[k] if name in cells else z[k].copy()
                prior = prior + z["prior"]
            for name, v in meta["noise_var"].items():
                noise_var[name] = noise_var.get(name, 0.0) + v
        if not cells:
            for g in self.spec.groups:
                cells[self.spec.group_name(g)] = self.spec.new_sketch(g).cells
        return Featurization(self.spec, cells, prior, noise_var, self._m["live"], self.max_variance)

    def featurization(self, cache: bool = True) -> Featurization:
        """The sum of the live windows' tables; cached until the next seal unless ``cache=False``
        (then re-read from disk, as a server without a local snapshot would)."""
        if not cache:
            return self._load_sum()
        if self._cached is None:
            self._cached = self._load_sum()
        return self._cached
