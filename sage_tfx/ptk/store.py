"""The Sage PTK store (PTK paper §4.1 API, §5 architecture) on the block ledger.

``PTKStore`` keeps the paper's names: :meth:`register_ptk` (→ id or REJECT), :meth:`deregister_ptk`,
:meth:`update_ptk_config`, :meth:`update_ptk_performance_target`, :meth:`subscribe_to_ptk`,
:meth:`notify_new_ptk_state`. Data arrives as tumbling windows (:meth:`advance_window`, in
:mod:`sage_tfx.ptk.windows`): each window is split into blocks on a time × user-hash scheme,
a profile set (the first ``profile_buckets`` hash buckets) and a train set; the profiler
charges the profile blocks, the allocator's partitions take disjoint runs of train blocks, and
every partition is one ledger charge. Bad input raises a ``ValueError`` subclass and writes
nothing; an infeasible workload is a :class:`Reject` with the reason.
"""
from __future__ import annotations

import dataclasses
import math
import uuid
from typing import Optional, Sequence

from sage_tfx.dp import noise as dp_noise
from sage_tfx.errors import InvalidRequestError, UnknownStreamError
from sage_tfx.ledger import open_ledger
from sage_tfx.ptk import allocator, profiler
from sage_tfx.ptk.abstraction import (PTK, PerformanceTargetError, PTKType, UnknownPTKError)
from sage_tfx.ptk.lake import Lake, now
from sage_tfx.ptk.notify import Notifier, check_endpoint
from sage_tfx.ptk.windows import WindowRunner

@dataclasses.dataclass(frozen=True)
class Reject:
    """``register_ptk``'s REJECT (and a refused update): why, and the plan that stays."""

    reason: str
    ptk_id: Optional[str] = None

    def __bool__(self) -> bool:
        return False

@dataclasses.dataclass(frozen=True)
class StoreConfig:
    """The administrator's settings: global (ℰ, Δ), N_max, block scheme, profiler, menu."""

    stream: str = "ptk"
    epsilon_g: float = 1.0
    delta_g: float = 1e-6
    n_max: int = 1_000_000
    train_buckets: int = 64
    profile_buckets: int = 8
    profile_share: float = 0.25
    menu: tuple = (0.01, 0.05, 0.1, 0.2, 0.5, 1.0)
    profile_epsilon: float = 0.05
    profile_n_max: int = 4096
    k_max: int = 8
    solve_time_limit: float = 60.0

    def __post_init__(self):
        if not 0 < self.profile_share < 1:
            raise InvalidRequestError(f"profile_share must lie in (0, 1), got {self.profile_share}")
        if self.train_buckets < 1 or self.profile_buckets < 1:
            raise InvalidRequestError("a window needs at least one train and one profile bucket")
        t = profiler.ProfileParams(self.profile_epsilon, self.profile_n_max, 1.0).T
        if allocator.dec(self.profile_epsilon) * (t + 1) > allocator.dec(self.epsilon_g):
            raise InvalidRequestError(
                f"the profiler's validation set takes (T + 1) * eps = {t + 1} * "
                f"{self.profile_epsilon} > epsilon_g = {self.epsilon_g}: lower profile_epsilon")

def check_tau(tau) -> float:
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 < tau <= 1:
        raise PerformanceTargetError(f"the performance target tau must lie in (0, 1], got {tau!r}")
    return float(tau)

def check_frequency(freq) -> int:
    if isinstance(freq, bool) or not isinstance(freq, int) or freq < 1:
        raise InvalidRequestError(f"train_frequency must be a positive integer (windows), got "
                                  f"{freq!r}")
    return freq

class PTKStore:
    def __init__(self, url: str, data_root: str, config: StoreConfig = StoreConfig(), *,
                 noise=None, notifier: Optional[Notifier] = None):
        self.url, self.cfg = url, config
        self.ledger = open_ledger(url)
        try:
            self.ledger.stream(config.stream)
        except UnknownStreamError:
            self.ledger.create_stream(config.stream, epsilon_g=config.epsilon_g,
                                      delta_g=config.delta_g, mode="basic",
                                      granularity="ptk:window x user-hash")
        self.lake = Lake(url)
        self.noise = noise or dp_noise.SECURE
        self.notifier = notifier or Notifier(self.lake)
        self.windows = WindowRunner(self, data_root)

    def close(self) -> None:
        self.notifier.close()
        self.lake.close()
        self.ledger.close()

    # --- helpers --------------------------------------------------------------------------
    def _ptk_type(self, rec: dict) -> PTKType:
        return PTKType(rec["train_dp_ref"], rec["eval_ref"], rec["dp_event_ref"], rec["erm_ref"])

    def _require(self, ptk_id: str) -> dict:
        rec = self.lake.ptk(ptk_id) if isinstance(ptk_id, str) else None
        if rec is None or rec["status"] != "active":
            raise UnknownPTKError(f"no registered PTK {ptk_id!r}")
        return rec

    def _menus(self, override: Optional[dict] = None, drop: Sequence[str] = ()) -> dict:
        menus = {r["ptk_id"]: [allocator.Option(*o) for o in r["menu"]]
                 for r in self.lake.ptks() if r["ptk_id"] not in drop}
        menus.update(override or {})
        return menus

    def _allocate(self, menus: dict) -> allocator.Allocation:
        c = self.cfg
        return allocator.allocate(menus, epsilon_g=c.epsilon_g, delta_g=c.delta_g,
                                  n_max=c.n_max, k_max=c.k_max, time_limit=c.solve_time_limit)

    def _profile(self, ptk_type: PTKType, config: dict, tau: float, run_id: str):
        """Profiles the menu on the open window's profile blocks, charged first; returns
        (options, profile record) or a Reject."""
        params = profiler.ProfileParams(self.cfg.profile_epsilon, self.cfg.profile_n_max, tau)
        menu = [e for e in self.cfg.menu if e <= self.cfg.epsilon_g]
        cost, delta = profiler.profile_cost(ptk_type, config, menu, params)
        data = self.windows.read_profile_set(
            run_id, cost, delta, params.records_needed(ptk_type.erm_ref is not None) * len(menu))
        if isinstance(data, str):
            return Reject(data)
        entries = profiler.profile_menu(ptk_type, config, data["columns"], menu, params,
                                        self.noise)
        options = [(e.epsilon, e.delta, e.n) for e in entries if e.n is not None]
        record = {"epsilon": str(cost), "delta": delta, "grant_id": data["grant_id"],
                  "window": data["window"], "m": params.m, "T": params.T,
                  "entries": [{"epsilon": e.epsilon, "n": e.n, "outcome": e.outcome}
                              for e in entries]}
        return options, record

    def _replan(self, menus: dict) -> allocator.Allocation:
        plan = self._allocate(menus)
        if plan.feasible:
            self.lake.save_plan(plan.to_dict())
        return plan

    # --- the API (Fig. 1) -----------------------------------------------------------------
    def register_ptk(self, train_dp_fn: str, eval_fn: str, train_frequency: int = 1, *,
                     config: Optional[dict] = None, tau: float, name: str = "",
                     dp_event_fn: Optional[str] = None, erm_fn: Optional[str] = None,
                     menu: Optional[Sequence[tuple]] = None):
        """Registers a PTK type by reference; returns its id, or a :class:`Reject`.

        ``menu`` is an optional developer-supplied profile ``[(epsilon, n), ...]`` (§5.2: "a PTK
        developer could provide a profiling procedure"); without it the DP profiler runs on the
        open window's profile set and is charged to the ledger first.
        """
        ptk_type = PTKType.resolve(train_dp_fn, eval_fn, dp_event_fn, erm_fn)
        tau = check_tau(tau)
        freq = check_frequency(train_frequency)
        config = dict(config or {})
        for eps in (self.cfg.menu if menu is None else [m[0] for m in menu]):
            ptk_type.charge(eps, config)  # validates config and the declared event
        ptk_id = f"ptk-{uuid.uuid4().hex[:12]}"
        if menu is not None:
            options = [(float(e), ptk_type.charge(e, config).delta, int(n)) for e, n in menu]
            profile = {"supplied": True}
        else:
            got = self._profile(ptk_type, config, tau, f"ptk.profile.{ptk_id}")
            if isinstance(got, Reject):
                return Reject(f"profiling refused: {got.reason}")
            options, profile = got
        if not options:
            return Reject(f"the profiler found no (epsilon, n) in the menu reaching tau={tau}: "
                          f"{profile}")
        plan = self._replan(self._menus({ptk_id: [allocator.Option(*o) for o in options]}))
        if not plan.feasible:
            return Reject(plan.reason)
        self.lake.insert_ptk({
            "ptk_id": ptk_id, "name": name or ptk_id, "train_dp_ref": ptk_type.train_dp_ref,
            "eval_ref": ptk_type.eval_ref, "dp_event_ref": ptk_type.dp_event_ref,
            "erm_ref": ptk_type.erm_ref, "config": config, "tau": tau, "train_frequency": freq,
            "status": "active", "menu": options, "profile": profile,
            "registered_window": self.windows.current(), "created_at": now(),
            "updated_at": now()})
        return ptk_id

    def deregister_ptk(self, ptk_id: str) -> allocator.Allocation:
        self._require(ptk_id)
        plan = self._replan(self._menus(drop=[ptk_id]))
        self.lake.update_ptk(ptk_id, status="deregistered")
        return plan

    def _update(self, ptk_id: str, config: dict, tau: float):
        rec = self._require(ptk_id)
        ptk_type = self._ptk_type(rec)
        if rec["profile"] and rec["profile"].get("supplied"):
            raise InvalidRequestError(
                f"{ptk_id} has a developer-supplied profile; register a new PTK for a new "
                "config or target")
        for eps in self.cfg.menu:
            ptk_type.charge(eps, config)
        got = self._profile(ptk_type, config, tau, f"ptk.profile.{ptk_id}.{uuid.uuid4().hex[:8]}")
        if isinstance(got, Reject):
            return got
        options, profile = got
        if not options:
            return Reject(f"no (epsilon, n) reaches tau={tau}", ptk_id)
        plan = self._replan(self._menus({ptk_id: [allocator.Option(*o) for o in options]}))
        if not plan.feasible:
            return Reject(plan.reason, ptk_id)
        self.lake.update_ptk(ptk_id, config=config, tau=tau, menu=options, profile=profile)
        return plan

    def update_ptk_config(self, ptk_id: str, new_config: dict):
        """Re-profiles and re-allocates; a Reject leaves the old config and plan in force."""
        if not isinstance(new_config, dict):
            raise InvalidRequestError(f"a PTK config is a dict, got {type(new_config).__name__}")
        return self._update(ptk_id, dict(new_config), self._require(ptk_id)["tau"])

    def update_ptk_performance_target(self, ptk_id: str, new_tau: float):
        tau = check_tau(new_tau)
        return self._update(ptk_id, self._require(ptk_id)["config"], tau)

    def subscribe_to_ptk(self, ptk_id: str, rpc_endpoint: str) -> None:
        self._require(ptk_id)
        self.notifier.probe(check_endpoint(rpc_endpoint), ptk_id)
        self.lake.subscribe(ptk_id, rpc_endpoint)

    def notify_new_ptk_state(self, ptk_id: str) -> list[dict]:
        """Queues the newest version for every subscriber and delivers pending notifications."""
        self._require(ptk_id)
        latest = self.lake.version(ptk_id)
        if latest is not None:
            self.lake.enqueue(ptk_id, latest["version"])
        return self.notifier.deliver()

    # --- reading --------------------------------------------------------------------------
    def plan(self) -> Optional[dict]:
        return self.lake.plan()[1]

    def get_ptk(self, ptk_id: str, version: Optional[int] = None) -> PTK:
        rec = self.lake.ptk(ptk_id) if isinstance(ptk_id, str) else None
        if rec is None:
            raise UnknownPTKError(f"no PTK {ptk_id!r}")
        v = self.lake.version(ptk_id, version)
        if v is None:
            if version is not None:
                raise UnknownPTKError(f"PTK {ptk_id!r} has no version {version}")
            return PTK(ptk_id, None, rec["config"], rec["tau"], None, None, 0)
        return PTK(ptk_id, v["state"], v["config"], rec["tau"], v["oldest_window"],
                   v["newest_window"], v["version"])

    def lineage(self, ptk_id: str, version: Optional[int] = None) -> dict:
        v = self.lake.version(ptk_id, version) if isinstance(ptk_id, str) else None
        if v is None:
            raise UnknownPTKError(f"PTK {ptk_id!r} has no such version")
        return {k: v[k] for k in ("ptk_id", "version", "window_index", "blocks", "epsilon",
                                  "delta", "event", "grant_id", "run_id", "stream", "n_used",
                                  "partition_index", "oldest_window", "newest_window")}

    def advance_window(self, columns: dict, *, user_key: Optional[str] = None,
                       window_index: Optional[int] = None) -> dict:
        """Closes the open window, ingests the next one and trains every due PTK on it."""
        return self.windows.advance(columns, user_key=user_key, window_index=window_index)

    def recommended_window_records(self) -> Optional[int]:
        """The window size whose train share holds the plan's 𝒩 (§5.1's recommendation)."""
        plan = self.plan()
        if not plan:
            return None
        return int(math.ceil(plan["total"] / (1 - self.cfg.profile_share)))
