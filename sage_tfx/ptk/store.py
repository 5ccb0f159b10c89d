"""The Sage PTK store (PTK paper §4.1 API, §5 architecture) on the block ledger.

``PTKStore`` keeps the paper's names: :meth:`register_ptk` (→ id or REJECT), :meth:`deregister_ptk`,
:meth:`update_ptk_config`, :meth:`update_ptk_performance_target`, :meth:`subscribe_to_ptk`,
:meth:`notify_new_ptk_state`. A PTK is registered by the *name* of a type in the operator's
registry (:mod:`sage_tfx.ptk.registry`), never by code reference. Data arrives as tumbling
windows (:meth:`advance_window`, in :mod:`sage_tfx.ptk.windows`): each window is split into
blocks on a time × user-hash scheme, a profile set (the first ``profile_buckets`` hash buckets)
and a train set; the profiler charges the profile blocks (:mod:`sage_tfx.ptk.profiles`), the
allocator's partitions take disjoint runs of train blocks, and every partition is one ledger
charge. Bad input raises a ``ValueError`` subclass and writes nothing; an infeasible workload is
a :class:`Reject` with the reason.

Several processes may share one store (one ledger database): a registry change and its new plan
commit in one transaction guarded by the plan's sequence number (a process whose plan went stale
re-plans), windows advance under an exclusive lease, and every noisy output is released once
against its grant, so a retried or concurrent call returns the recorded output.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import time
import uuid
from typing import Callable, Optional, Sequence

from sage_tfx.dp import noise as dp_noise
from sage_tfx.errors import InvalidRequestError, LeaseTimeoutError, UnknownStreamError
from sage_tfx.ledger import open_ledger
from sage_tfx.ptk import allocator, profiler
from sage_tfx.ptk.abstraction import (PTK, PerformanceTargetError, PTKType, UnknownPTKError,
                                      canonical_json)
from sage_tfx.ptk.lake import Lake, now
from sage_tfx.ptk.notify import Notifier, check_endpoint
from sage_tfx.ptk.profiles import ProfileRuns
from sage_tfx.ptk.registry import TypeRegistry, default_registry
from sage_tfx.ptk.results import Delivery, Lineage, ProfileNeed, PTKRecord, WindowResult
from sage_tfx.ptk.windows import WindowRunner, unfit_reason

PTK_ID_PATTERN = r"^ptk-[A-Za-z0-9_-]{1,60}$"
COMMIT_WAIT = 120.0  # seconds a registry change keeps re-planning while others commit
MAX_MENU = 64

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
    # profiler defaults sized so one profiled registration at tau = 0.1 fits a window of about
    # 100 K records (profile_need / describe_profile_need print it for any tau)
    profile_share: float = 0.4
    menu: tuple = (0.01, 0.05, 0.1, 0.2, 0.5)
    profile_epsilon: float = 0.05
    profile_n_max: int = 1024
    k_max: int = 8
    solve_time_limit: float = 25.0  # one budget for the whole allocation (all K)

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

    def profile_need(self, tau: float, with_erm: bool = True) -> ProfileNeed:
        """What one profiled registration with target ``tau`` needs: Fig. 3's records per menu
        entry (m + S_n and, with an exact ERM, S'_n), the profile set for the whole menu, the
        window whose profile share holds it, and the ε it charges the profile blocks (for a
        PTK type that charges its menu ε as ε)."""
        params = profiler.ProfileParams(self.profile_epsilon, self.profile_n_max, tau)
        menu = [e for e in self.menu if e <= self.epsilon_g]
        per_entry = params.records_needed(with_erm)
        return ProfileNeed(tau, params.m, params.T, per_entry, per_entry * len(menu),
                           int(math.ceil(per_entry * len(menu) / self.profile_share)),
                           max(max(menu), self.profile_epsilon * (params.T + 1)))

    def describe_profile_need(self, taus: Sequence[float]) -> str:
        """Readable text of how many profile records each τ needs."""
        lines = [f"profiler: n_max = {self.profile_n_max}, epsilon_profile = "
                 f"{self.profile_epsilon}, menu = {list(self.menu)}, profile share = "
                 f"{self.profile_share}"]
        for tau in taus:
            n = self.profile_need(check_tau(tau))
            lines.append(f"  tau = {tau:g}: m = {n.m:,}, {n.per_entry:,} records per "
                         f"budget, {n.profile_records:,} profile records, a window of "
                         f"{n.window_records:,} records; charges eps = {n.epsilon:.3g} "
                         "to the profile blocks")
        return "\n".join(lines)

def check_tau(tau) -> float:
    """``tau`` as a float in (0, 1]; raises PerformanceTargetError otherwise."""
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 < tau <= 1:
        raise PerformanceTargetError(f"the performance target tau must lie in (0, 1], got {tau!r}")
    return float(tau)

def check_frequency(freq) -> int:
    """``freq`` as a positive int; raises InvalidRequestError otherwise."""
    if isinstance(freq, bool) or not isinstance(freq, int) or freq < 1:
        raise InvalidRequestError(f"train_frequency must be a positive integer (windows), got "
                                  f"{freq!r}")
    return freq

def check_config(config) -> dict:
    """A PTK config: a JSON object with string keys (the kernel checks its contents)."""
    if config is None:
        return {}
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise InvalidRequestError(f"a PTK config is a dict with string keys, got "
                                  f"{type(config).__name__}")
    canonical_json(config)  # it goes to the lake
    return dict(config)

def check_menu(menu) -> Optional[list]:
    """A developer-supplied profile: [(epsilon > 0 finite, n >= 1 integer), ...]."""
    if menu is None:
        return None
    if isinstance(menu, (str, bytes, dict)) or not isinstance(menu, Sequence) \
            or not 0 < len(menu) <= MAX_MENU:
        raise InvalidRequestError(f"a menu is a list of 1-{MAX_MENU} (epsilon, n) pairs")
    out = []
    for entry in menu:
        if isinstance(entry, (str, bytes)) or not isinstance(entry, Sequence) or len(entry) != 2:
            raise InvalidRequestError(f"a menu entry is an (epsilon, n) pair, got {entry!r}")
        eps, n = entry
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) \
                or not math.isfinite(eps) or eps <= 0:
            raise InvalidRequestError(f"a menu epsilon must be finite and > 0, got {eps!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidRequestError(f"a menu n must be an integer >= 1, got {n!r}")
        out.append((float(eps), n))
    return out

def check_ptk_id(ptk_id) -> str:
    """``ptk_id`` if it matches the PTK id pattern; raises InvalidRequestError otherwise."""
    if not isinstance(ptk_id, str) or not re.match(PTK_ID_PATTERN, ptk_id):
        raise InvalidRequestError(f"a PTK id matches {PTK_ID_PATTERN}, got {ptk_id!r}")
    return ptk_id

class PTKStore:
    """The PTK store over one ledger (``url``) and a data directory (see the module docstring).

    Opens its own ledger and lake connections; :meth:`close` releases them.
    """

    def __init__(self, url: str, data_root: str, config: StoreConfig = StoreConfig(), *,
                 noise=None, notifier: Optional[Notifier] = None,
                 registry: Optional[TypeRegistry] = None, key_provider=None):
        self.url, self.cfg = url, config
        self.registry = registry or default_registry()
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
        self.windows = WindowRunner(self, data_root, key_provider)
        self.profiles = ProfileRuns(self)

    def close(self) -> None:
        """Stops the notifier and closes the lake and the ledger."""
        self.notifier.close()
        self.lake.close()
        self.ledger.close()

    # --- helpers --------------------------------------------------------------------------
    def _require(self, ptk_id: str) -> PTKRecord:
        rec = self.lake.ptk(ptk_id) if isinstance(ptk_id, str) else None
        if rec is None or rec.status != "active":
            raise UnknownPTKError(f"no registered PTK {str(ptk_id)[:80]!r}")
        return rec

    def _menus(self, override: Optional[dict] = None, drop: Sequence[str] = ()) -> dict:
        menus = {r.ptk_id: [allocator.Option(*o) for o in r.menu]
                 for r in self.lake.ptks() if r.ptk_id not in drop}
        menus.update({k: [allocator.Option(*o) for o in v] for k, v in (override or {}).items()})
        return menus

    def _check_fits(self, ptype: PTKType, config: dict, epsilons: Sequence[float]) -> None:
        """Refuses a config that cannot train on the store's columns (the newest window's) at
        any of ``epsilons`` (:func:`~sage_tfx.ptk.windows.unfit_reason`); before the first
        window there are no columns to check, and the first window skips what does not fit."""
        schema = self.lake.schema()
        why = None if schema is None else unfit_reason(ptype, config, schema, epsilons)
        if why is not None:
            raise InvalidRequestError(
                f"a {ptype.name} PTK with this config cannot train on the store's columns "
                f"({', '.join(f'{n}: {k}' for n, k in schema)}) {why}")

    def _allocate(self, menus: dict, previous: Optional[allocator.Allocation] = None,
                  floor: int = 0) -> allocator.Allocation:
        c = self.cfg
        return allocator.allocate(menus, epsilon_g=c.epsilon_g, delta_g=c.delta_g,
                                  n_max=c.n_max, k_max=c.k_max, time_limit=c.solve_time_limit,
                                  previous=previous, floor=floor)

    def _commit(self, compute: Callable[[int], tuple], change: Callable[[], None]):
        """Re-plans with ``compute(seq) -> (result, plan dict or None)`` (``seq``: the plan
        being replaced) and applies ``change`` with the new plan in one transaction,
        re-planning while other processes commit first. A None plan (infeasible) changes
        nothing. Returns ``result``."""
        deadline = time.monotonic() + COMMIT_WAIT
        while True:
            seq = self.lake.plan_seq()
            result, plan = compute(seq)  # reads the registry after the sequence: a change between
            if plan is None:          # the two moves the sequence, and the commit re-plans
                return result
            if self.lake.commit_plan(seq, plan, change) is not None:
                return result
            if time.monotonic() > deadline:
                raise LeaseTimeoutError("the PTK plan kept changing under other processes for "
                                        f"{COMMIT_WAIT:g} s; nothing was changed")

    def _plan_with(self, seq: int, override: Optional[dict] = None, drop: Sequence[str] = (),
                   grow: bool = False):
        """Allocates the registry with ``override`` / ``drop`` applied, starting from plan
        ``seq`` (the committed plan the change replaces). ``grow``: the change only adds the
        PTKs in ``override`` — then the plan's proven lower bound still bounds the new optimum
        (adding PTKs never lowers it), provided the plan was made for exactly the registry
        read now under the same (ℰ, Δ, N_max, k_max); the commit re-plans if the registry
        moved past ``seq`` meanwhile."""
        menus = self._menus(override, drop)
        previous = self.lake.plan(seq)[1] if seq else None
        floor, c = 0, self.cfg
        if grow and previous is not None:
            planned = {a.ptk_id for p in previous.partitions for a in p.members}
            added = set(override or ())
            same = (previous.epsilon_g, previous.delta_g, previous.n_max, previous.k_max) == (
                c.epsilon_g, c.delta_g, c.n_max, c.k_max)
            if same and not planned & added and planned == set(menus) - added:
                floor = previous.lower_bound
        plan = self._allocate(menus, previous, floor)
        return plan, (plan.to_dict() if plan.feasible else None)

    # --- the API (Fig. 1) -----------------------------------------------------------------
    def register_ptk(self, ptk_type: str, train_frequency: int = 1, *,
                     config: Optional[dict] = None, tau: float, name: str = "",
                     menu: Optional[Sequence[tuple]] = None, ptk_id: Optional[str] = None):
        """Registers a PTK of the registered type ``ptk_type``; returns its id, or a
        :class:`Reject`.

        ``menu`` is an optional developer-supplied profile ``[(epsilon, n), ...]`` (§5.2: "a PTK
        developer could provide a profiling procedure"); without it the DP profiler runs on the
        open window's profile set and is charged to the ledger first. ``ptk_id`` (optional,
        ``ptk-...``) makes the call idempotent: a retry with the same id and arguments returns
        the same id, with the recorded profile, and charges nothing again.
        """
        ptype = self.registry.get(ptk_type)  # a registered name only: nothing is imported
        tau = check_tau(tau)
        freq = check_frequency(train_frequency)
        config = check_config(config)
        menu = check_menu(menu)
        if not isinstance(name, str) or len(name) > 128:
            raise InvalidRequestError("a PTK name is a string of at most 128 characters")
        epsilons = self.cfg.menu if menu is None else [e for e, _ in menu]
        ptype.check(config, epsilons)
        ptk_id = check_ptk_id(ptk_id) if ptk_id is not None else f"ptk-{uuid.uuid4().hex[:12]}"
        prior = self.lake.ptk(ptk_id)
        if prior is not None:
            return self._replayed(prior, ptype, config, tau, freq, menu)
        self._check_fits(ptype, config, epsilons)  # before the profiler charges anything
        if menu is not None:
            options = [(e, ptype.charge(e, config).delta, n) for e, n in menu]
            profile = {"supplied": True}
        else:
            got = self.profiles.run(ptk_id, ptype, config, tau, f"ptk.profile.{ptk_id}")
            if isinstance(got, str):
                return Reject(f"profiling refused: {got}")
            options, profile = got
        if not options:
            return Reject(f"the profiler found no (epsilon, n) in the menu reaching tau={tau}: "
                          f"{profile}")
        rec = {"ptk_id": ptk_id, "name": name or ptk_id, "ptk_type": ptype.name,
               **ptype.references(), "config": config, "tau": tau, "train_frequency": freq,
               "status": "active", "menu": options, "profile": profile,
               "created_at": now(), "updated_at": now()}

        def insert():
            if self.lake.ptk(ptk_id) is None:  # a concurrent replay may have inserted it
                self.lake.insert_ptk(dict(rec, registered_window=self.windows.current()))

        plan = self._commit(lambda seq: self._plan_with(seq, {ptk_id: options}, grow=True),
                            insert)
        return ptk_id if plan.feasible else Reject(plan.reason)

    def _replayed(self, prior: PTKRecord, ptype: PTKType, config: dict, tau: float, freq: int,
                  menu: Optional[list]):
        supplied = bool((prior.profile or {}).get("supplied"))
        same_menu = (not supplied) if menu is None else (
            supplied and [[o[0], o[2]] for o in prior.menu] == [list(m) for m in menu])
        same = (prior.ptk_type == ptype.name and prior.config == config
                and prior.tau == tau and prior.train_frequency == freq and same_menu)
        if not same or prior.status != "active":
            raise InvalidRequestError(
                f"PTK id {prior.ptk_id} is {prior.status} with another type, config, "
                "target or frequency: choose a new id")
        return prior.ptk_id

    def deregister_ptk(self, ptk_id: str) -> allocator.Allocation:
        """Marks the PTK deregistered and re-allocates the others; returns the new allocation.

        Raises:
          UnknownPTKError: no such PTK.
        """
        self._require(ptk_id)

        def compute(seq):
            plan, as_dict = self._plan_with(seq, drop=[ptk_id])
            _, cur = self.lake.plan()
            if as_dict is None and cur is not None:  # a solver time-out: keep the current plan
                parts = [dataclasses.replace(p, members=tuple(  # without the PTK
                    m for m in p.members if m.ptk_id != ptk_id)) for p in cur.partitions]
                # its sizes and bound were the larger workload's: nothing is proven for this one
                as_dict = dataclasses.replace(
                    cur, partitions=tuple(p for p in parts if p.members), optimal=False,
                    gap=1.0, lower_bound=0, proof="").to_dict()
            return plan, as_dict

        def drop():
            self._require(ptk_id)
            self.lake.update_ptk(ptk_id, status="deregistered")

        return self._commit(compute, drop)

    def _update(self, ptk_id: str, config: dict, tau: float):
        rec = self._require(ptk_id)
        ptk_type = self.registry.get(rec.ptk_type)
        if rec.profile and rec.profile.get("supplied"):
            raise InvalidRequestError(
                f"{ptk_id} has a developer-supplied profile; register a new PTK for a new "
                "config or target")
        ptk_type.check(config, self.cfg.menu)
        self._check_fits(ptk_type, config, self.cfg.menu)
        key = hashlib.sha256(canonical_json({"config": config, "tau": tau})).hexdigest()[:12]
        got = self.profiles.run(ptk_id, ptk_type, config, tau, f"ptk.profile.{ptk_id}.{key}")
        if isinstance(got, str):
            return Reject(got, ptk_id)
        options, profile = got
        if not options:
            return Reject(f"no (epsilon, n) reaches tau={tau}", ptk_id)

        def update():
            self._require(ptk_id)
            self.lake.update_ptk(ptk_id, config=config, tau=tau, menu=options, profile=profile)

        plan = self._commit(lambda seq: self._plan_with(seq, {ptk_id: options}), update)
        return plan if plan.feasible else Reject(plan.reason, ptk_id)

    def update_ptk_config(self, ptk_id: str, new_config: dict):
        """Re-profiles and re-allocates; a Reject leaves the old config and plan in force."""
        if not isinstance(new_config, dict):
            raise InvalidRequestError(f"a PTK config is a dict, got {type(new_config).__name__}")
        return self._update(ptk_id, check_config(new_config), self._require(ptk_id).tau)

    def update_ptk_performance_target(self, ptk_id: str, new_tau: float):
        """Re-profiles at the new target τ and re-allocates; a Reject keeps the old one."""
        tau = check_tau(new_tau)
        return self._update(ptk_id, self._require(ptk_id).config, tau)

    def subscribe_to_ptk(self, ptk_id: str, rpc_endpoint: str) -> None:
        """Registers an endpoint (probed first) to be notified of the PTK's new versions."""
        self._require(ptk_id)
        self.notifier.probe(check_endpoint(rpc_endpoint), ptk_id)
        self.lake.subscribe(ptk_id, rpc_endpoint)

    def notify_new_ptk_state(self, ptk_id: str) -> list[Delivery]:
        """Queues the newest version for every subscriber and delivers pending notifications."""
        self._require(ptk_id)
        latest = self.lake.version(ptk_id)
        if latest is not None:
            self.lake.enqueue(ptk_id, latest.version)
        return self.notifier.deliver()

    # --- reading --------------------------------------------------------------------------
    def plan(self) -> Optional[allocator.Allocation]:
        """The allocator's current plan as stored in the lake, or None before any PTK."""
        return self.lake.plan()[1]

    def get_ptk(self, ptk_id: str, version: Optional[int] = None) -> PTK:
        """The PTK's newest (or given) version; state None until it was first trained.

        Raises:
          UnknownPTKError: no such PTK, or no such version.
        """
        rec = self.lake.ptk(ptk_id) if isinstance(ptk_id, str) else None
        if rec is None:
            raise UnknownPTKError(f"no PTK {ptk_id!r}")
        v = self.lake.version(ptk_id, version)
        if v is None:
            if version is not None:
                raise UnknownPTKError(f"PTK {ptk_id!r} has no version {version}")
            return PTK(ptk_id, None, rec.config, rec.tau, None, None, 0)
        return PTK(ptk_id, v.state, v.config, rec.tau, v.oldest_window, v.newest_window,
                   v.version)

    def lineage(self, ptk_id: str, version: Optional[int] = None) -> Lineage:
        """Where a version came from: window, blocks, charged ε/δ/event, grant and run ids.

        Raises:
          UnknownPTKError: no such PTK version.
        """
        v = self.lake.version(ptk_id, version) if isinstance(ptk_id, str) else None
        if v is None:
            raise UnknownPTKError(f"PTK {ptk_id!r} has no such version")
        return Lineage.from_row(vars(v))

    def advance_window(self, columns: dict, *, user_key: Optional[str] = None,
                       window_index: Optional[int] = None) -> WindowResult:
        """Closes the open window, ingests the next one and trains every due PTK on it."""
        return self.windows.advance(columns, user_key=user_key, window_index=window_index)
