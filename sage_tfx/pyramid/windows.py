"""Windowed DP count tables on the ledger: hot window, sealing, retention, roll-over deletion.

Pyramid §III.B.1/§III.B.3 on sage-tfx's ledger. A :class:`PyramidStore` keeps, for one stream
and one :class:`~sage_tfx.pyramid.featurize.CountSpec`:

* one **hot window** (``hot/w<id>/`` under ``state_dir``): the raw observations of the current
  window (exposed to training, as in the paper), encrypted at rest with the window's own data
  key, whose wrapped copy lives in the ledger's database (:mod:`sage_tfx.pyramid.hot`), and any
  non-DP artifact derived from them (:meth:`PyramidStore.hot_artifact_path`: featurized training
  sets, exact statistics, models — written by the caller, not encrypted by the store);
* **sealed windows** (``sealed/w<id>.npz``): the DP count sketches of closed windows. The
  featurization is the sum of the live sealed windows; a sealed window is never updated again.

:meth:`PyramidStore.seal` closes the hot window. In order, and only if every step before it
succeeded: (1) one ledger charge for the window's blocks with the idempotent run id
``pyramid-<stream>-<spec digest>-w<id>`` covering exactly what is released from the window (the
count tables, ε of the spec, plus the noise-weight selection if it runs on this window), or
a gate's grant for that run id; (2) **release once**: if the grant already recorded the
window's tables (release ``pyramid/seal/<spec digest>/w<id>``), those bytes; otherwise the
counts with OpenDP discrete Laplace noise of scale ``h k / ε_i`` in every cell of table ``i``
(:mod:`sage_tfx.dp.counts`), recorded against the grant before anything is published
(:mod:`sage_tfx.pyramid.sealing`); (3) the sealed file, a copy of the recorded release;
(4) destruction of the hot window's key, then deletion of its raw data and non-DP artifacts;
(5) retention: windows older than the newest ``retention`` sealed ones are dropped (file
deleted) and the retrain callbacks run (§III.B.3: "drops the oldest window and invokes
retraining of all models"). A replay — a retried call, a restarted process, another store
directory, a concurrent process — thus publishes the recorded tables byte for byte and never
draws new noise; :meth:`PyramidStore.restore` re-materializes a window from the ledger alone.

**Processes.** Every call that changes the store holds an exclusive lock on its directory and
re-reads the manifest under it, so several processes share one store: part files have unique
names and retention drops windows whichever process sealed them.

**Tree.** A spec with ``aggregation="tree"`` keeps dyadic nodes over windows instead of one
table per window (:mod:`sage_tfx.pyramid.treestore`): same charge per window, each node
released once on the whole ledger (whichever store seals), the live windows read from at most
``2L + 1`` complete nodes; a seal that would charge a window for a node it can never be in
raises :class:`TreeWindowError` before the charge.

**Weights.** A replay returns the recorded tables only if they were drawn with this seal's
split of ε over the tables; a re-seal with other noise weights raises ``ReleaseConflictError``.

**Mechanism.** A spec with ``mechanism="gaussian"`` gets OpenDP discrete Gaussian noise
calibrated with dp_accounting to its (ε, δ) instead (:mod:`sage_tfx.pyramid.plan`), charged
``(ε, δ)`` on a basic stream and its Gaussian DpEvent on an rdp stream. What follows describes
the Laplace tables (the default).

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
nothing. A denied ledger charge — no budget left, or the window's blocks retired because their
budget is spent — raises :class:`BudgetDeniedError` and leaves the hot window open:
:meth:`PyramidStore.discard_window` then deletes its raw data with no release. Blocks an
administrator retired with budget left raise the ledger's ``RetiredBlockError``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from typing import Any, Callable, Optional, Sequence

import dp_accounting
import numpy as np
import pandas as pd

from sage_tfx.dp import noise as dp_noise
from sage_tfx.dp.counts import table_epsilons
from sage_tfx.errors import InvalidRequestError, RetiredBlockError, SageError
from sage_tfx.ledger import accounting
from sage_tfx.pyramid import hot as hot_lib
from sage_tfx.pyramid import treestore
from sage_tfx.pyramid.featurize import (TREE, CountSpec, Featurization, check_frame,
                                        check_max_variance)
from sage_tfx.pyramid.plan import plan_window, window_event
from sage_tfx.pyramid.sealing import (PRIOR, check_grant, check_replay, discrete_laplace_variance,
                                      draw_tables, read_meta, release_name, release_once,
                                      retired_is_spent)
from sage_tfx.pyramid.treestore import TreeWindowError

__all__ = ["PyramidStore", "SealResult", "WindowSealedError", "RetentionError",
           "BudgetDeniedError", "TreeWindowError", "discrete_laplace_variance", "PRIOR",
           "pyramid_run_id", "window_event", "release_name"]

_PART_SUFFIX = ".rows"


class WindowSealedError(InvalidRequestError):
    """The window is already sealed: its table is final and its data is gone."""


class RetentionError(InvalidRequestError):
    """The window lies outside the retention horizon (or before the newest sealed window)."""


class BudgetDeniedError(SageError):
    """The ledger refused the window's charge; nothing was released and the window stays open."""


def pyramid_run_id(stream: str, spec: CountSpec, window: int) -> str:
    """The idempotent ledger run id of one window's tables: (stream, count spec, window)."""
    return f"pyramid-{stream}-{spec.digest()}-w{int(window)}"


@dataclasses.dataclass(frozen=True)
class SealResult:
    """What :meth:`PyramidStore.seal` (or :meth:`PyramidStore.restore`) published."""

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
    replayed: bool = False                             # the grant's recorded tables, no new noise


class PyramidStore:
    """Windowed DP count tables of one stream and one count spec (see the module docstring).

    Args:
      spec: what is counted and at what ε per window.
      state_dir: directory of the store (manifest, hot window, sealed windows).
      retention: number of sealed windows kept live (the retention horizon).
      ledger, stream: the ledger and stream charged at every seal. ``ledger=None`` charges
        nothing and is for offline experiments only (the evaluation in ``pyramid/eval``); the
        hot window's key then lives in this process's memory.
      noise: noise source; OpenDP (:data:`sage_tfx.dp.noise.SECURE`) unless an experiment
        passes :class:`~sage_tfx.dp.noise.SeededNoise`.
      max_variance: back-off threshold of the featurization.
      key_provider: the key-encryption key of hot-window keys (a ``KeyProvider`` or a provider
        spec; default ``$SAGE_KEY_PROVIDER``, see :mod:`sage_tfx.ledger.keys`).
      lock_wait: seconds to wait for another process's lock on the directory.
    """

    def __init__(self, spec: CountSpec, state_dir: str, *, retention: int, ledger=None,
                 stream: Optional[str] = None, noise=None, max_variance: float = 0.01,
                 key_provider=None, lock_wait: float = 600.0):
        if not isinstance(spec, CountSpec):
            raise InvalidRequestError("spec must be a CountSpec")
        if isinstance(retention, bool) or not isinstance(retention, int) or retention < 1:
            raise InvalidRequestError(f"retention must be an int >= 1 window, got {retention!r}")
        if (ledger is None) != (stream is None):
            raise InvalidRequestError("give both ledger and stream, or neither")
        max_variance = check_max_variance(max_variance)
        if spec.aggregation == TREE:
            treestore.check_retention(spec, retention)
        if ledger is not None:
            ledger.stream(stream)  # raises UnknownStreamError
        self.spec, self.retention, self.ledger, self.stream = spec, retention, ledger, stream
        self.noise = noise if noise is not None else dp_noise.SECURE
        self.max_variance = max_variance
        self.state_dir = os.path.abspath(state_dir)
        self._manifest_path = os.path.join(self.state_dir, "manifest.json")
        self._retrain_callbacks: list[Callable[[tuple], Any]] = []
        self._cached: Optional[Featurization] = None
        self._cached_live: Optional[tuple] = None
        self._lock = hot_lib.DirLock(self.state_dir, lock_wait)
        m = self._read() if os.path.exists(self._manifest_path) else None
        if m is not None and m["spec"] != spec.to_json():
            raise InvalidRequestError(f"{state_dir} holds a store of a different count spec")
        if m is None or "store_id" not in m:    # new, or written before stores had ids
            os.makedirs(os.path.join(self.state_dir, "sealed"), exist_ok=True)
            with self._lock.held():
                m = self._read() if os.path.exists(self._manifest_path) else {
                    "spec": spec.to_json(), "hot": None, "live": [], "newest": None,
                    "next_weights": None}
                if "store_id" not in m:
                    m["store_id"] = uuid.uuid4().hex
                    self._write(m)
        if m["spec"] != spec.to_json():
            raise InvalidRequestError(f"{state_dir} holds a store of a different count spec")
        self.store_id = m["store_id"]
        self._keys = hot_lib.HotKeys(ledger, self.store_id, stream or "offline", key_provider)

    # -- state (the manifest on disk is the truth; changes happen under the directory lock) --

    def _read(self) -> dict:
        with open(self._manifest_path) as f:
            return json.load(f)

    def _write(self, m: dict) -> None:
        tmp = f"{self._manifest_path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(m, f, indent=1, sort_keys=True)
        os.replace(tmp, self._manifest_path)

    @property
    def live_windows(self) -> tuple[int, ...]:
        """The sealed windows kept live (within the retention horizon), oldest first."""
        return tuple(self._read()["live"])

    @property
    def hot_window(self) -> Optional[int]:
        """The open (hot) window's number, or None when no window is open."""
        hot = self._read()["hot"]
        return None if hot is None else int(hot["window"])

    @property
    def next_weights(self) -> Optional[tuple[float, ...]]:
        """Noise weights the last seal selected for the next one (used when a seal gives none),
        or None."""
        w = self._read()["next_weights"]
        return None if w is None else tuple(w)

    def run_id(self, window: int) -> str:
        """The ledger run id of ``window``'s seal (:func:`pyramid_run_id`)."""
        return pyramid_run_id(self.stream or "offline", self.spec, window)

    def release_name(self, window: int) -> str:
        """The ledger release name of ``window``'s tables (a tree store: its leaf node's)."""
        if self.tree:
            return treestore.node_release_name(self.spec, 0, window)
        return release_name(self.spec, window)

    @property
    def tree(self) -> bool:
        """Whether the spec aggregates windows in a dyadic tree."""
        return self.spec.aggregation == TREE

    def _hot_dir(self, window: int) -> str:
        return os.path.join(self.state_dir, "hot", f"w{int(window)}")

    def sealed_path(self, window: int) -> str:
        """The sealed tables of ``window`` in this store (a copy of the recorded release; a tree
        store: its leaf node's)."""
        if self.tree:
            return treestore.node_path(self.state_dir, 0, window)
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
        if isinstance(blocks, str):
            raise InvalidRequestError("blocks must be a list of block ids, not a string")
        blocks = [str(b) for b in blocks]
        if self.ledger is not None and not blocks:
            raise InvalidRequestError("a window on the ledger needs its block ids")
        with self._lock.held():
            m = self._read()
            if os.path.exists(self.sealed_path(window)) or window in m["live"]:
                raise WindowSealedError(f"window {window} is already sealed")
            newest = m["newest"]
            if newest is not None and window <= newest:
                horizon = newest - self.retention
                raise (WindowSealedError if window > horizon else RetentionError)(
                    f"window {window} is not after the newest sealed window {newest}"
                    + (f" (retention horizon: windows > {horizon})" if window <= horizon else ""))
            if m["hot"] is not None:
                raise InvalidRequestError(f"window {m['hot']['window']} is still hot: seal it "
                                          "or discard it first")
            if self.ledger is not None:
                from sage_tfx.ledger import DEFAULT_CONTEXT, access
                self.ledger.authorize(access.CHARGE, stream=self.stream, context=DEFAULT_CONTEXT)
            hot_id = uuid.uuid4().hex
            self._keys.create(hot_id, window)
            shutil.rmtree(self._hot_dir(window), ignore_errors=True)  # leftovers of a crash
            os.makedirs(self._hot_dir(window))
            m["hot"] = {"window": window, "blocks": blocks, "parts": 0, "hot_id": hot_id}
            self._write(m)

    @staticmethod
    def _need_hot(m: dict) -> dict:
        if m["hot"] is None:
            raise InvalidRequestError("no hot window: open one first")
        return m["hot"]

    def _hot_key(self, hot: dict):
        if not hot.get("hot_id"):
            raise InvalidRequestError(
                f"hot window {hot['window']} was written in plaintext by an older version: it is "
                "not read; discard_window() deletes it")
        return self._keys.get(hot["hot_id"])

    def observe(self, frame: pd.DataFrame) -> None:
        """Adds observations to the hot window (encrypted at rest, one part file per call)."""
        check_frame(frame, self.spec.features, self.spec.label, self.spec.n_labels)
        cols = list(self.spec.features) + [self.spec.label]
        with self._lock.held():
            m = self._read()
            hot = self._need_hot(m)
            dk = self._hot_key(hot)
            seq = int(hot["parts"])
            # The sequence number comes from the manifest read under the lock; the random
            # suffix keeps a name unique even across a crash between the file and the manifest.
            name = f"raw-{seq:06d}-{uuid.uuid4().hex[:12]}{_PART_SUFFIX}"
            hot_lib.write_part(os.path.join(self._hot_dir(hot["window"]), name),
                               frame[cols].reset_index(drop=True), dk, self.store_id,
                               hot["hot_id"])
            hot["parts"] = seq + 1
            self._write(m)

    def _read_hot(self, hot: dict) -> pd.DataFrame:
        d = self._hot_dir(hot["window"])
        names = sorted(os.listdir(d)) if os.path.isdir(d) else []
        dk = self._hot_key(hot)
        parts = [hot_lib.read_part(os.path.join(d, f), dk, self.store_id, hot["hot_id"])
                 for f in names if f.startswith("raw-") and f.endswith(_PART_SUFFIX)]
        cols = list(self.spec.features) + [self.spec.label]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)

    def hot_frame(self) -> pd.DataFrame:
        """The hot window's raw observations (for training on count features)."""
        with self._lock.held():
            return self._read_hot(self._need_hot(self._read()))

    def hot_artifact_path(self, name: str) -> str:
        """A path for a non-DP artifact of the hot window; deleted when the window is sealed
        or discarded. The store does not encrypt what the caller writes there."""
        if not name or os.sep in name or name.startswith("."):
            raise InvalidRequestError(f"artifact name must be a plain file name, got {name!r}")
        return os.path.join(self._hot_dir(self._need_hot(self._read())["window"]),
                            f"artifact-{name}")

    def discard_window(self) -> tuple[str, ...]:
        """Deletes the hot window — its key first, then its raw data and non-DP artifacts —
        without any release and without touching the ledger; returns the deleted paths.
        Afterwards :meth:`open_window` opens the next window (e.g. after a denied seal)."""
        with self._lock.held():
            m = self._read()
            hot = self._need_hot(m)
            deleted = self._destroy_hot(hot)
            m["hot"] = None
            self._write(m)
        return tuple(deleted)

    def _destroy_hot(self, hot: dict) -> list[str]:
        if hot.get("hot_id"):
            self._keys.destroy(hot["hot_id"])
        d = self._hot_dir(hot["window"])
        if not os.path.isdir(d):
            return []
        deleted = [os.path.join(d, f) for f in sorted(os.listdir(d))]
        shutil.rmtree(d)
        return deleted

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
        Returns:
          What was published; ``replayed`` if the grant's recorded tables were (no new noise).
        Raises:
          BudgetDeniedError: the ledger refused the charge (the hot window stays open).
        """
        with self._lock.held():
            m = self._read()
            hot = self._need_hot(m)
            window = int(hot["window"])
            if weights is None and m["next_weights"] is not None:
                weights = m["next_weights"]
            if self.tree and (weights is not None or weight_epsilon is not None):
                raise InvalidRequestError("a tree store splits ε evenly over its tables: noise "
                                          "weights (and their selection) are flat-only")
            if weight_epsilon is not None and (max_count is None or not 0 < weight_quantile < 1):
                raise InvalidRequestError(
                    "weight selection needs max_count (a public bound) and a quantile in (0, 1), "
                    f"got {max_count!r}, {weight_quantile!r}")
            rdp = self._rdp_mode()
            if rdp and weight_epsilon is not None:
                raise InvalidRequestError(
                    "noise-weight selection has no dp_accounting event: not available on an "
                    "rdp stream (give weights, or use a basic stream)")
            plan = plan_window(self.spec, weights, rdp=rdp)
            eps_total = plan.epsilon + (0.0 if weight_epsilon is None else
                                        float(table_epsilons(weight_epsilon, n_tables=1)[0]))
            event = plan.event if rdp else None
            run_id = self.run_id(window)
            if grant is not None and self.ledger is None:
                raise InvalidRequestError("a grant can only be used by a store on a ledger")

            def paid() -> Optional[str]:   # the window's grant: the gate's, or charged here
                if grant is not None:
                    return check_grant(self.ledger, grant, run_id=run_id, stream=self.stream,
                                       blocks=hot["blocks"], epsilon=eps_total, event=event,
                                       delta=plan.delta)
                if self.ledger is not None:
                    return self._charge(window, run_id, hot["blocks"], eps_total, event,
                                        plan.delta)
                return None

            if self.tree:   # checked, charged and released under the tree's ledger lease
                with treestore.guard(self, m, hot):
                    return treestore.seal_window(self, m, hot, plan, paid(), run_id, event)
            grant_id = paid()
            meta = {"window": window, "run_id": run_id, "epsilon": eps_total,
                    "epsilons": plan.shares.tolist(), "scales": plan.scales.tolist()}
            if plan.delta:
                meta["delta"] = plan.delta

            def produce() -> bytes:        # the only place this window's noise is drawn
                return draw_tables(self._read_hot(hot), self.spec, plan,
                                   noise=self.noise, meta=meta, weight_epsilon=weight_epsilon,
                                   weight_quantile=weight_quantile, max_count=max_count)

            if grant_id is None:
                data, replayed = produce(), False
            else:
                data, replayed = release_once(self.ledger, grant_id, self.release_name(window),
                                              produce, self.sealed_path(window))
                if replayed:
                    check_replay(data, plan, window)
            return self._publish(m, window, data, grant_id, replayed, event)

    def _charge(self, window: int, run_id: str, blocks: Sequence[str], eps_total: float,
                event, delta: float = 0.0) -> str:
        cost = {"event": event} if event is not None else {"epsilon": eps_total, "delta": delta}
        try:
            decision = self.ledger.request(self.stream, run_id=run_id, blocks=list(blocks),
                                           **cost)
        except RetiredBlockError as e:
            if retired_is_spent(self.ledger, self.stream, blocks, eps_total, event):
                raise BudgetDeniedError(f"ledger refused window {window}: its blocks are retired "
                                        f"because their budget is spent ({e})") from e
            raise
        if not decision.granted:
            raise BudgetDeniedError(f"ledger refused window {window}: {decision.reason}")
        return decision.grant.grant_id

    def _publish(self, m: dict, window: int, data: bytes, grant_id: Optional[str],
                 replayed: bool, event) -> SealResult:
        """Writes the released tables, ends the window's hot data, applies retention."""
        meta = read_meta(data)
        path = self.sealed_path(window)
        if not (os.path.exists(path) and open(path, "rb").read() == data):
            tmp = os.path.join(os.path.dirname(path), f".w{window}.{os.getpid()}.tmp")
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        hot = m["hot"]
        deleted = self._destroy_hot(hot) if hot and int(hot["window"]) == window else []
        live = sorted(set(m["live"]) | {window})
        dropped = tuple(live[:-self.retention]) if len(live) > self.retention else ()
        for w in dropped:
            if os.path.exists(self.sealed_path(w)):
                os.remove(self.sealed_path(w))
                deleted.append(self.sealed_path(w))
        newest = window if m["newest"] is None else max(int(m["newest"]), window)
        m.update(live=live[-self.retention:], newest=newest)
        if hot and int(hot["window"]) == window:
            m["hot"] = None
        next_weights = meta.get("next_weights")
        if next_weights is not None and window == newest:
            m["next_weights"] = [float(v) for v in next_weights]
        self._write(m)
        self._cached = None
        for cb in self._retrain_callbacks if dropped else ():
            cb(dropped)
        eps = meta.get("epsilon", float(sum(meta["epsilons"])))
        return SealResult(window, meta["run_id"], float(eps), tuple(meta["epsilons"]),
                          tuple(meta["scales"]), grant_id, dropped, tuple(deleted), bool(dropped),
                          None if next_weights is None else tuple(next_weights), event, replayed)

    def restore(self, window: int, grant=None) -> SealResult:
        """Re-materializes ``window``'s tables from the ledger's recorded release (no noise, no
        charge): for a store that lost its files, another store directory, or a retried
        pipeline node. ``grant`` defaults to the ledger's grant of the window's run id.

        Raises:
          InvalidRequestError: no ledger, the window was never charged, its grant released no
            tables (seal it), or the grant pays for another window.
          RetentionError: the window lies before this store's retention horizon.
          MissingGrantError: the release was recorded by location and its file is gone.
        """
        if self.ledger is None:
            raise InvalidRequestError("only a store on a ledger can restore a window")
        window = int(window)
        run_id = self.run_id(window)
        if self.tree:
            return treestore.restore_nodes(self, window)
        with self._lock.held():
            m = self._read()
            if grant is None:
                grant = self.ledger.grant_for_run(self.stream, run_id)
                if grant is None:
                    raise InvalidRequestError(f"window {window} was never charged ({run_id})")
            grant_id = check_grant(self.ledger, grant, run_id=run_id, stream=self.stream,
                                   blocks=None, epsilon=None)
            name, path = self.release_name(window), self.sealed_path(window)

            def legacy() -> bytes:
                # Sealed before releases were recorded: this store's file becomes the release.
                if window not in m["live"] or not os.path.exists(path):
                    raise InvalidRequestError(f"grant {grant_id} has released no tables for "
                                              f"window {window}: seal the window")
                with open(path, "rb") as f:
                    return f.read()

            newest = m["newest"]
            if window not in m["live"] and newest is not None and \
                    window <= int(newest) - self.retention:
                raise RetentionError(f"window {window} lies before the retention horizon "
                                     f"(windows > {int(newest) - self.retention})")
            data, _ = release_once(self.ledger, grant_id, name, legacy, path)
            return self._publish(m, window, data, grant_id, True, self.ledger.grant(grant_id).event)

    def _rdp_mode(self) -> bool:
        if self.ledger is None:
            return False
        return self.ledger.stream(self.stream).mode == accounting.RDP

    # -- featurization --

    def _paths(self, m: dict) -> list[str]:
        if self.tree:
            return [treestore.node_path(self.state_dir, ell, j)
                    for ell, j in treestore.cover_nodes(self, m)]
        return [self.sealed_path(w) for w in m["live"]]

    def _load_sum(self, live: Sequence[int], paths: Sequence[str]) -> Featurization:
        cells: dict = {}
        prior = np.zeros(self.spec.n_labels)
        noise_var: dict = {}
        kinds: Optional[dict] = {}
        for path in paths:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                if kinds is not None and "kinds" in meta:
                    for f, v in meta["kinds"].items():
                        kinds[f] = sorted(set(kinds.get(f, ())) | set(v))
                else:       # a window sealed before kinds were recorded: not checked
                    kinds = None
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
        return Featurization(self.spec, cells, prior, noise_var, live, self.max_variance,
                             kinds=kinds or None)

    def featurization(self, cache: bool = True) -> Featurization:
        """The sum of the live windows' tables; cached until the live windows change unless
        ``cache=False`` (then re-read from disk, as a server without a local snapshot would).
        A live window whose file is gone is restored from the ledger first."""
        m = self._read()
        live, paths = tuple(m["live"]), self._paths(m)
        missing = [p for p in paths if not os.path.exists(p)]
        if missing and self.ledger is not None and live:
            if self.tree:
                self.restore(live[-1])
            for w in () if self.tree else live:
                if not os.path.exists(self.sealed_path(w)):
                    self.restore(w)
            m = self._read()
            live, paths = tuple(m["live"]), self._paths(m)
        if not cache:
            return self._load_sum(live, paths)
        if self._cached is None or self._cached_live != live:
            self._cached, self._cached_live = self._load_sum(live, paths), live
        return self._cached
