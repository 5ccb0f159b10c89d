"""Profile runs: the DP profiler (Fig. 3, :mod:`~sage_tfx.ptk.profiler`) charged to the open
window's profile blocks and released once.

A profile run has a run id (``ptk.profile.<ptk_id>`` for a registration) and is recorded in the
lake's ``ptk_profiles`` before it is charged. Its result — the menu's (ε_j, δ_j, n_j) and
outcomes — is released against its grant as ``ptk/profile/<run id>``
(:func:`~sage_tfx.ledger.releases.release_value_once`): a replay of the run (a retried
registration with the same PTK id, a restart, another process) gets the grant and the recorded
menu back, and reads no data and draws no noise. A run that crashed between its charge and its
release is finished from its recorded grant when its window closes (:meth:`ProfileRuns.
finish_pending`), while the window's data still exists. The charge, the read and the release
all happen under the window lease, so no window closes under a running profile.
"""
from __future__ import annotations

import json
from decimal import Decimal
from typing import Union

from sage_tfx.errors import InvalidRequestError, RetiredBlockError, SageError
from sage_tfx.ledger.releases import release_value_once
from sage_tfx.ptk import profiler
from sage_tfx.ptk.abstraction import KERNEL_INPUT_ERRORS, PTKType, canonical_json
from sage_tfx.ptk.allocator import dec
from sage_tfx.ptk.registry import UnknownPTKTypeError
from sage_tfx.ptk.windowfiles import window_of
from sage_tfx.ptk.windows import exact_float


class ProfileRuns:
    """Charged profile runs of a store, each released once (see the module docstring)."""

    def __init__(self, store):
        self.store = store

    def spec(self, ptype: PTKType, config: dict, tau: float) -> dict:
        """Everything a profile run depends on (recorded with it; a replay must match)."""
        cfg = self.store.cfg
        return {"ptk_type": ptype.name, "config": config, "tau": tau,
                "menu": [e for e in cfg.menu if e <= cfg.epsilon_g],
                "profile_epsilon": cfg.profile_epsilon, "profile_n_max": cfg.profile_n_max}

    @staticmethod
    def params(spec: dict) -> profiler.ProfileParams:
        """The profiler parameters recorded in a profile run's ``spec``."""
        return profiler.ProfileParams(spec["profile_epsilon"], spec["profile_n_max"], spec["tau"])

    def run(self, ptk_id: str, ptype: PTKType, config: dict, tau: float,
            run_id: str) -> Union[tuple, str]:
        """Profiles the menu (charged first, released once); returns (options, record), or the
        reason nothing was charged."""
        store = self.store
        spec = self.spec(ptype, config, tau)
        params = self.params(spec)
        cost, delta = profiler.profile_cost(ptype, config, spec["menu"], params)
        row = store.lake.profile_run(run_id)
        if row is not None and row["spec"] != json.loads(json.dumps(spec)):
            raise InvalidRequestError(
                f"profile run {run_id} was recorded for another PTK type, config or target")
        with store.windows.lease():
            grant = store.ledger.grant_for_run(store.cfg.stream, run_id)
            if grant is None:
                w = store.windows.current()
                if w is None:
                    return ("no training window is open: the profiler reads the open window's "
                            "profile set")
                store.lake.add_profile_run(run_id, ptk_id, spec, w)
                need = params.records_needed(ptype.has_erm) * len(spec["menu"])
                grant = self._charge(w, run_id, cost, delta, need)
                if isinstance(grant, str):
                    store.lake.set_profile_status(run_id, "refused")
                    return grant
            entries = json.loads(self._release(grant, ptype, spec, params))
            store.lake.set_profile_status(run_id, "released")
        if "failed" in entries:
            return f"profiling failed ({entries['failed']}) after its charge; the charge stands"
        options = [(e["epsilon"], e["delta"], e["n"]) for e in entries if e["n"] is not None]
        record = {"epsilon": str(cost), "delta": delta, "grant_id": grant.grant_id,
                  "window": window_of(grant.block_ids[0]), "m": params.m, "T": params.T,
                  "run_id": run_id,
                  "entries": [{"epsilon": e["epsilon"], "n": e["n"], "outcome": e["outcome"]}
                              for e in entries]}
        return options, record

    def _charge(self, w: int, run_id: str, cost: Decimal, delta: float, need: int):
        """Charges ``cost`` to the smallest run of the window's profile blocks that can take it
        and holds ``need`` records; returns the grant, or a reason (nothing charged)."""
        store = self.store
        info = store.lake.window(w)
        cap = dec(store.cfg.epsilon_g)
        states = {b.block_id: b for b in store.ledger.blocks(store.cfg.stream)
                  if b.block_id.startswith(f"w{w:06d}.p")}
        # profiles of different PTKs then use disjoint blocks when they can
        pblocks, have = [], 0
        for b, kind, r in info["blocks"]:
            st = states.get(b)
            if kind != "p" or st is None or not st.active or r == 0 \
                    or dec(st.epsilon_spent) + cost > cap:
                continue
            pblocks.append(b)
            have += r
            if have >= need:
                break
        if have < need:
            return (f"window {w}'s profile set has {have} records with eps={cost} of budget "
                    f"left; profiling the menu needs {need} (raise profile_share, lower "
                    "profile_n_max, or register after the next window boundary)")
        try:
            d = store.ledger.request(store.cfg.stream, run_id=run_id, blocks=pblocks,
                                     epsilon=exact_float(cost), delta=delta)
        except RetiredBlockError as exc:
            return f"the profile set of window {w} has no budget left: {exc}"
        if not d.granted:
            return f"the ledger denied the profile charge (eps={cost}): {d.reason}"
        return d.grant

    def _release(self, grant, ptype: PTKType, spec: dict, params) -> bytes:
        """The run's released menu: the recorded one, or profiled now and recorded first."""
        store = self.store

        def produce() -> bytes:
            data = store.windows.files.read(window_of(grant.block_ids[0]),
                                            zip(grant.block_ids, grant.locations))
            try:
                entries = profiler.profile_menu(ptype, spec["config"], data, spec["menu"],
                                                params, store.noise)
            except (SageError, *KERNEL_INPUT_ERRORS) as exc:
                return canonical_json({"failed": type(exc).__name__})
            return canonical_json([{"epsilon": e.epsilon, "delta": e.delta, "n": e.n,
                                    "outcome": e.outcome} for e in entries])

        return release_value_once(store.ledger, grant.grant_id, f"ptk/profile/{grant.run_id}",
                                  produce).value

    def finish_pending(self, w: int) -> list[str]:
        """Releases every profile run of window ``w`` that was charged but never released (its
        process crashed), from the recorded grant; call under the window lease before the
        window's data is destroyed. Returns the run ids finished."""
        store, done = self.store, []
        for row in store.lake.pending_profiles(w):
            grant = store.ledger.grant_for_run(store.cfg.stream, row["run_id"])
            if grant is None:  # crashed before its charge: nothing to release
                store.lake.set_profile_status(row["run_id"], "abandoned")
                continue
            spec = row["spec"]
            try:
                ptype = store.registry.get(spec["ptk_type"])
            except UnknownPTKTypeError:
                continue  # only a process that knows the type can finish it
            self._release(grant, ptype, spec, self.params(spec))
            store.lake.set_profile_status(row["run_id"], "released")
            done.append(row["run_id"])
        return done
