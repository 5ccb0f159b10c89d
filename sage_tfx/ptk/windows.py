"""The tumbling training window 𝒯 (PTK paper §5.1) and the DP PTK trainer (§5.4).

:meth:`WindowRunner.advance` closes the open window (its raw block files are deleted: minimal
exposure), splits the next window on a window × user-hash block scheme and registers the blocks
with the ledger, then trains every due PTK with its allocated (ε_i, n_i):

* block ids are ``w000007.p003`` (profile buckets, the first ``profile_share`` of the hash
  space) and ``w000007.t041`` (train buckets); a record's bucket is a salted SHA-256 of its user
  key (or, without one, of its values);
* partition k of the plan takes the next run of train blocks holding N_k records (partitions are
  disjoint block sets: parallel composition), and PTK i of partition k reads the first whole
  blocks of its partition holding at least n_i records (block record counts are public ledger
  metadata; a positional prefix inside a block would turn one added record into a replaced one);
* a partition run is ONE ledger charge of the exact-decimal sum of its due PTKs' (ε_i, δ_i) to
  all of the partition's blocks, with the idempotent run id ``ptk.w<w>.plan<seq>.p<k>``: a
  replayed window gets the same grant back and stores no second version;
* each new state goes to the lake with its lineage and is queued for every subscriber.
"""
from __future__ import annotations

import os
from decimal import Decimal
from typing import Optional

import numpy as np

from sage_tfx.errors import InvalidRequestError, RetiredBlockError
from sage_tfx.ledger import BlockSpec
from sage_tfx.ptk.abstraction import (PTKType, batches_of, concat, hash_positions,
                                      record_keys)
from sage_tfx.ptk.allocator import dec


def _exact_float(x: Decimal) -> float:
    f = float(x)
    if Decimal(repr(f)) != x:
        raise InvalidRequestError(f"the charge {x} has no exact float form; refusing to round it")
    return f


class WindowRunner:
    def __init__(self, store, data_root: str):
        self.store = store
        self.data_root = os.path.abspath(data_root)

    @property
    def lake(self):
        return self.store.lake

    def current(self) -> Optional[int]:
        open_ = self.lake.open_windows()
        return open_[-1] if open_ else None

    # --- ingest ---------------------------------------------------------------------------
    def _ingest(self, w: int, columns: dict, user_key: Optional[str]) -> None:
        cfg = self.store.cfg
        n = len(next(iter(columns.values())))
        # the user hash: the user key, or without one the record's own values (never its
        # position, so adding a record moves no other record to another block)
        keys = (np.asarray(columns[user_key]).astype(str).tolist() if user_key
                else record_keys(columns))
        u = hash_positions(keys, f"{cfg.stream}")
        ps = cfg.profile_share
        prof = u < ps
        bucket = np.where(prof, np.floor(u / ps * cfg.profile_buckets),
                          np.floor((u - ps) / (1 - ps) * cfg.train_buckets)).astype(int)
        folder = os.path.join(self.data_root, cfg.stream, f"w{w:06d}")
        os.makedirs(folder, exist_ok=True)
        specs, files, blocks = [], [], []
        for kind, count in (("p", cfg.profile_buckets), ("t", cfg.train_buckets)):
            for b in range(count):
                sel = (prof if kind == "p" else ~prof) & (bucket == b)
                block_id = f"w{w:06d}.{kind}{b:03d}"
                path = os.path.join(folder, f"{block_id}.npz")
                np.savez(path, **{k: np.asarray(v)[sel] if np.asarray(v).dtype != object
                                  else np.asarray(v)[sel].astype(str)
                                  for k, v in columns.items()})
                specs.append(BlockSpec(block_id, location=path, records=int(sel.sum())))
                files.append(path)
                blocks.append([block_id, kind, int(sel.sum())])
        self.store.ledger.add_blocks(cfg.stream, specs)
        self.lake.open_window(w, files, blocks, n)

    def advance(self, columns: dict, *, user_key: Optional[str] = None,
                window_index: Optional[int] = None) -> dict:
        if not isinstance(columns, dict) or not columns:
            raise InvalidRequestError("a window is a non-empty dict of equal-length columns")
        lengths = {len(np.asarray(v)) for v in columns.values()}
        if len(lengths) != 1 or 0 in lengths:
            raise InvalidRequestError(f"window columns must have one non-zero length: {lengths}")
        if user_key is not None and user_key not in columns:
            raise InvalidRequestError(f"user key column {user_key!r} is not in the window")
        last = self.lake.last_window()
        w = (0 if last is None else last + 1) if window_index is None else window_index
        if not isinstance(w, int) or (last is not None and w <= last) or w < 0:
            raise InvalidRequestError(f"window index must be a new index after {last}, got {w!r}")
        for old in self.lake.open_windows():
            self.lake.close_window(old)
        self._ingest(w, columns, user_key)
        trained = self.train(w)
        delivered = self.store.notifier.deliver()
        return {"window": w, "trained": trained, "delivered": delivered}

    def close(self) -> None:
        """Closes the open window (deletes its raw data) without opening a new one."""
        for old in self.lake.open_windows():
            self.lake.close_window(old)

    # --- profile set ----------------------------------------------------------------------
    def read_profile_set(self, run_id: str, cost: Decimal, delta: float, need: int):
        """Charges ``cost`` to the open window's profile blocks, then reads them. Returns the
        data, or a reason string (nothing charged when the window cannot hold the profile)."""
        w = self.current()
        if w is None:
            return "no training window is open: the profiler reads the open window's profile set"
        info = self.lake.window(w)
        cap = dec(self.store.cfg.epsilon_g)
        states = {b.block_id: b for b in self.store.ledger.blocks(self.store.cfg.stream)
                  if b.block_id.startswith(f"w{w:06d}.p")}
        # the smallest run of profile blocks that can still take the whole charge and holds
        # enough records (profiles of different PTKs then use disjoint blocks when they can)
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
            d = self.store.ledger.request(self.store.cfg.stream, run_id=run_id, blocks=pblocks,
                                          epsilon=_exact_float(cost), delta=delta)
        except RetiredBlockError as exc:
            return f"the profile set of window {w} has no budget left: {exc}"
        if not d.granted:
            return f"the ledger denied the profile charge (eps={cost}): {d.reason}"
        data = concat(dict(np.load(p, allow_pickle=False)) for p in d.grant.locations)
        return {"columns": data, "grant_id": d.grant.grant_id, "window": w}

    # --- training -------------------------------------------------------------------------
    def train(self, w: int) -> list[dict]:
        seq, plan = self.lake.plan()
        if not plan or not plan["partitions"]:
            return []
        info = self.lake.window(w)
        tblocks = [(b, r) for b, kind, r in info["blocks"] if kind == "t"]
        active = {r["ptk_id"]: r for r in self.lake.ptks()}
        out, cursor = [], 0
        for part in plan["partitions"]:
            blocks, held = [], 0
            while held < part["size"] and cursor < len(tblocks):
                blocks.append(tblocks[cursor])
                held += tblocks[cursor][1]
                cursor += 1
            due = [m for m in part["members"] if m["ptk_id"] in active and (
                (w - (active[m["ptk_id"]]["registered_window"] or 0))
                % active[m["ptk_id"]]["train_frequency"] == 0)]
            if not due:
                continue
            if not blocks or held == 0:
                out += [{"ptk_id": m["ptk_id"], "skipped": "no train data left in the window"}
                        for m in due]
                continue
            out += self._run_partition(w, seq, part["index"], blocks, due, active)
        return out

    def _run_partition(self, w, seq, k, blocks, due, active) -> list[dict]:
        store = self.store
        eps = sum((dec(m["epsilon"]) for m in due), Decimal(0))
        dlt = sum((dec(m["delta"]) for m in due), Decimal(0))
        if eps > dec(store.cfg.epsilon_g) or dlt > dec(store.cfg.delta_g):
            raise InvalidRequestError(f"partition {k} of plan {seq} over-spends: {eps}, {dlt}")
        run_id = f"ptk.w{w}.plan{seq}.p{k}"
        d = store.ledger.request(store.cfg.stream, run_id=run_id, blocks=[b for b, _ in blocks],
                                 epsilon=_exact_float(eps), delta=_exact_float(dlt))
        if not d.granted:
            return [{"ptk_id": m["ptk_id"], "skipped": f"denied: {d.reason}"} for m in due]
        grant = d.grant
        locations = dict(zip(grant.block_ids, grant.locations))
        out = []
        for m in sorted(due, key=lambda m: m["n"]):
            rec = active[m["ptk_id"]]
            done = self.lake.version_for_window(m["ptk_id"], w)
            if done is not None:  # a replayed run: the stored release stands, nothing is retrained
                out.append({"ptk_id": m["ptk_id"], "version": done["version"],
                            "n_used": done["n_used"], "n": m["n"], "epsilon": m["epsilon"],
                            "grant_id": done["grant_id"]})
                continue
            mine, held = [], 0
            for b, r in blocks:
                if held >= m["n"]:
                    break
                mine.append(b)
                held += r
            # whole blocks, never a positional prefix: adding or removing a record then changes
            # one block's content only, which is the neighbouring relation train_dp assumes
            data = concat(dict(np.load(locations[b], allow_pickle=False)) for b in mine)
            n_used = len(next(iter(data.values()))) if data else 0
            ptype = PTKType(rec["train_dp_ref"], rec["eval_ref"], rec["dp_event_ref"],
                            rec["erm_ref"])
            charge = ptype.charge(m["epsilon"], rec["config"])
            prev = self.lake.version(m["ptk_id"])
            state = ptype.train_dp(batches_of(data), m["epsilon"],
                                   prev["state"] if prev else None,
                                   prev["config"] if prev else None,
                                   config=rec["config"], noise=store.noise)
            v = self.lake.add_version({
                "ptk_id": m["ptk_id"], "window_index": w, "state": state,
                "config": rec["config"], "epsilon": m["epsilon"], "delta": charge.delta,
                "event": repr(charge.event), "grant_id": grant.grant_id, "run_id": run_id,
                "stream": store.cfg.stream, "blocks": mine, "n_used": n_used,
                "partition_index": k, "oldest_window": prev["oldest_window"] if prev else w,
                "newest_window": w})
            self.lake.enqueue(m["ptk_id"], v["version"])
            out.append({"ptk_id": m["ptk_id"], "version": v["version"], "n_used": n_used,
                        "n": m["n"], "epsilon": m["epsilon"], "grant_id": grant.grant_id})
        return out
