"""The tumbling training window 𝒯 (PTK paper §5.1) and the DP PTK trainer (§5.4).

:meth:`WindowRunner.advance` holds the store's window lease (``ptk/<stream>/windows`` in the
ledger's database: one advancing process at a time, whatever its store directory; a holder
that dies is taken over at once on its machine, after the lease's heartbeat elsewhere), closes the
open window, splits the next one on a window × user-hash block scheme, registers the blocks
with the ledger, then trains every due PTK with its allocated (ε_i, n_i):

* block ids are ``w000007.p003`` (profile buckets, the first ``profile_share`` of the hash
  space) and ``w000007.t041`` (train buckets); a record's bucket is a salted SHA-256 of its user
  key (or, without one, of its values); block files are encrypted with the window's data key
  (:mod:`~sage_tfx.ptk.windowfiles`);
* the window trains under the plan current at its ingest (recorded with the window), so a
  resumed run charges exactly the partitions the first one did;
* partition k of the plan takes the next run of train blocks holding N_k records (partitions are
  disjoint block sets: parallel composition), and PTK i of partition k reads the first whole
  blocks of its partition holding at least n_i records (block record counts are public ledger
  metadata; a positional prefix inside a block would turn one added record into a replaced one);
* a partition run is ONE ledger charge of the exact-decimal sum of its due PTKs' (ε_i, δ_i) to
  all of the partition's blocks, with the run id ``ptk.w<w>.plan<seq>.p<k>``;
* each PTK's new state is released once against that grant (``ptk/train/<ptk_id>/w<w>``,
  :func:`~sage_tfx.ledger.releases.release_value_once`) before it goes to the lake and to the
  subscribers. A replay — a retry, a restart, another process or store directory — gets the
  grant back and the recorded state byte for byte, and draws no noise;
* a PTK of the plan the window's columns do not fit (:func:`unfit_reason`: e.g. a PTK
  registered before the first window, naming a column the windows lack) is skipped in that
  window, uncharged, and never stops the others; the window is refused only when it breaks a
  PTK that the store's columns (the newest window's) fit;
* closing a window first finishes its training (so a run that crashed between its charge and
  its release is released from the recorded grant), then destroys the window's key and files.
"""
from __future__ import annotations

import json
from decimal import Decimal
from typing import Optional

import numpy as np

from sage_tfx.dp.noise import SeededNoise
from sage_tfx.errors import InvalidRequestError, SageError
from sage_tfx.ledger import BlockSpec
from sage_tfx.ledger.releases import release_value_once
from sage_tfx.ptk.abstraction import (KERNEL_INPUT_ERRORS, batches_of, canonical_json,
                                      hash_positions, record_keys)
from sage_tfx.ptk.allocator import dec
from sage_tfx.ptk.registry import UnknownPTKTypeError
from sage_tfx.ptk.results import Trained, WindowResult
from sage_tfx.ptk.windowfiles import WindowFiles

LEASE_TTL = 300.0  # seconds; renewed after every PTK trained (the holder's progress deadline)
LEASE_HEARTBEAT = 15.0  # seconds a holder that died keeps the lease (its heartbeat stopped)
LEASE_WAIT = 900.0


def exact_float(x: Decimal) -> float:
    """``x`` as a float that represents it exactly; raises InvalidRequestError, never rounds."""
    f = float(x)
    if Decimal(repr(f)) != x:
        raise InvalidRequestError(f"the charge {x} has no exact float form; refusing to round it")
    return f


def check_columns(columns, user_key) -> dict:
    """A window: a non-empty dict of equal-length 1-D columns (numbers or strings)."""
    if not isinstance(columns, dict) or not columns:
        raise InvalidRequestError("a window is a non-empty dict of equal-length columns")
    out = {}
    for name, values in columns.items():
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(f"a column name is a non-empty string, got {name!r}")
        arr = np.asarray(values)
        if arr.ndim != 1:
            raise InvalidRequestError(f"column {name!r} must be flat (one value per record), "
                                      f"got shape {arr.shape}")
        if arr.dtype.kind not in "biufU":
            if not all(isinstance(v, str) for v in arr.tolist()):
                raise InvalidRequestError(f"column {name!r} must hold numbers or strings only")
            arr = arr.astype(str)
        out[name] = arr
    lengths = {len(v) for v in out.values()}
    if len(lengths) != 1 or 0 in lengths:
        raise InvalidRequestError(f"window columns must have one non-zero length: {lengths}")
    if user_key is not None and (not isinstance(user_key, str) or user_key not in out):
        raise InvalidRequestError(f"user key column {user_key!r} is not in the window")
    return out


def column_schema(columns: dict) -> list:
    """The public schema of checked window columns: ``[[name, "number" | "string"], ...]``."""
    return [[k, "number" if v.dtype.kind in "biuf" else "string"] for k, v in sorted(
        columns.items())]


def unfit_reason(ptype, config: dict, schema: list, epsilons) -> Optional[str]:
    """Why a PTK of ``ptype`` with ``config`` cannot train on windows of ``schema`` at one of
    ``epsilons``, or None when it can.

    ``train_dp`` runs on two made-up records with the schema's column names and kinds (zeros,
    empty strings) at every ε, and its state must be finite JSON: a config that names a column
    the windows lack, or whose noise scale is not finite (bounds of ±1e308), fails here. The
    outcome depends on public things only (the schema, the config, ε), never on window data,
    and is discarded.
    """
    fake = {name: (np.zeros(2) if kind == "number" else np.array(["", ""]))
            for name, kind in schema}
    for eps in sorted(set(epsilons)):
        try:
            state = ptype.train_dp(batches_of(fake), eps, None, None, config=config,
                                   noise=SeededNoise(0))
            json.dumps(state, allow_nan=False)
        except (SageError, *KERNEL_INPUT_ERRORS) as exc:
            # ValueError also covers a state with NaN or infinity (allow_nan=False)
            return f"at epsilon={eps:g}: {type(exc).__name__}: {exc}"
    return None


def _release_name(ptk_id: str, w: int) -> str:
    return f"ptk/train/{ptk_id}/w{w}"


class WindowRunner:
    """The tumbling window 𝒯: ingests windows, plans and trains the due PTKs on them."""

    def __init__(self, store, data_root: str, key_provider=None):
        self.store = store
        self.files = WindowFiles(store.lake, store.cfg.stream, data_root, key_provider)
        self.data_root = self.files.data_root
        # a holder that dies (kill -9) blocks the others for at most lease_heartbeat seconds
        # (on its own machine not at all), a live one that stalls for lease_ttl + heartbeat
        self.lease_ttl, self.lease_wait = LEASE_TTL, LEASE_WAIT
        self.lease_heartbeat = LEASE_HEARTBEAT

    @property
    def lake(self):
        """The store's lake."""
        return self.store.lake

    def current(self) -> Optional[int]:
        """The index of the open window, or None."""
        open_ = self.lake.open_windows()
        return open_[-1] if open_ else None

    def lease(self):
        """The exclusive lease every window change and every read of window data holds."""
        return self.store.ledger.lease(f"ptk/{self.store.cfg.stream}/windows",
                                       ttl=self.lease_ttl, wait=self.lease_wait,
                                       heartbeat=min(self.lease_heartbeat, self.lease_ttl))

    # --- ingest ---------------------------------------------------------------------------
    def _ingest(self, w: int, columns: dict, user_key: Optional[str], plan_seq: int,
                unfit: Optional[dict] = None) -> None:
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
        specs, files, blocks = [], [], []
        for kind, count in (("p", cfg.profile_buckets), ("t", cfg.train_buckets)):
            for b in range(count):
                sel = (prof if kind == "p" else ~prof) & (bucket == b)
                block_id = f"w{w:06d}.{kind}{b:03d}"
                path = self.files.write_block(w, block_id, {k: v[sel] for k, v in columns.items()})
                specs.append(BlockSpec(block_id, location=path, records=int(sel.sum())))
                files.append(path)
                blocks.append([block_id, kind, int(sel.sum())])
        self.store.ledger.add_blocks(cfg.stream, specs)
        self.lake.open_window(w, files, blocks, n, plan_seq, column_schema(columns), unfit)

    def probe(self, columns: dict, plan_seq: int) -> dict:
        """The PTKs of plan ``plan_seq`` that cannot train on ``columns`` (id -> why): they are
        skipped in this window (not charged) and the others train.

        Raises:
          InvalidRequestError: the window's columns break a PTK that the store's columns (the
            newest window's, :func:`unfit_reason`) fit: the window, not the PTK, is at fault,
            and nothing changes.
        """
        schema, before = column_schema(columns), self.lake.schema()
        plan = self.lake.plan(plan_seq)[1] if plan_seq else None
        unfit = {}
        for pid in sorted({m.ptk_id for p in (plan.partitions if plan else ())
                           for m in p.members}):
            rec = self.lake.ptk(pid)
            try:
                ptype = self.store.registry.get(rec.ptk_type if rec else None)
            except UnknownPTKTypeError:
                continue  # not trained here (reported by the run)
            epsilons = [o[0] for o in rec.menu]
            why = unfit_reason(ptype, rec.config, schema, epsilons)
            if why is None:
                continue
            if before not in (None, schema) and unfit_reason(ptype, rec.config, before,
                                                             epsilons) is None:
                raise InvalidRequestError(
                    f"the window's columns do not fit PTK {pid} ({rec.ptk_type}), which the "
                    f"store's columns fit: {why}")
            unfit[pid] = why
        return unfit

    def advance(self, columns: dict, *, user_key: Optional[str] = None,
                window_index: Optional[int] = None) -> WindowResult:
        """Ingests ``columns`` as the next window (closing open ones), trains the PTKs due in it.

        Returns the :class:`WindowResult` (the window, what trained, the notifications sent; a
        PTK the window's columns do not fit is skipped with the reason, uncharged). Bad
        columns, a non-integer ``window_index`` or columns that break a PTK the store's
        columns fit (:meth:`probe`) raise :class:`InvalidRequestError` before anything changes.
        """
        columns = check_columns(columns, user_key)
        if window_index is not None and (isinstance(window_index, bool)
                                         or not isinstance(window_index, int)):
            raise InvalidRequestError(f"window index must be an integer, got {window_index!r}")
        with self.lease() as held:
            last = self.lake.last_window()
            w = (0 if last is None else last + 1) if window_index is None else window_index
            if (last is not None and w <= last) or w < 0:
                raise InvalidRequestError(
                    f"window index must be a new index after {last}, got {w!r}")
            plan_seq = self.lake.plan_seq()
            unfit = self.probe(columns, plan_seq)
            for old in self.lake.open_windows():
                self.close_window(old, held)
            self._ingest(w, columns, user_key, plan_seq, unfit)
            trained = self.train(w, held)
        delivered = self.store.notifier.deliver()
        return WindowResult(w, trained, delivered)

    def close_window(self, w: int, held=None) -> None:
        """Finishes the window's training and pending profiles (releases from recorded grants),
        then destroys its key and raw files. Call under the window lease."""
        self.train(w, held)
        self.store.profiles.finish_pending(w)
        self.lake.close_window(w)
        self.files.forget(w)

    def close(self) -> None:
        """Closes the open window (deletes its raw data) without opening a new one."""
        with self.lease() as held:
            for old in self.lake.open_windows():
                self.close_window(old, held)

    # --- training -------------------------------------------------------------------------
    def train(self, w: int, held=None) -> list[Trained]:
        """Trains (or finishes training) window ``w`` under the plan it was ingested with."""
        info = self.lake.window(w)
        # plan 0: no PTK when the window arrived; None: a window of a lake that predates
        # recorded plans, trained when it arrived — neither trains (again) now
        if info is None or info.status != "open" or not info.plan_seq:
            return []
        seq, plan = self.lake.plan(info.plan_seq)
        if not plan or not plan.partitions:
            return []
        tblocks = [(b, r) for b, kind, r in info.blocks if kind == "t"]
        known = {r.ptk_id: r for r in self.lake.ptks(status=None)}
        unfit = info.unfit or {}  # fixed at ingest: a resumed run charges what the first did
        out, cursor = [], 0
        for part in plan.partitions:
            blocks, held_records = [], 0
            while held_records < part.size and cursor < len(tblocks):
                blocks.append(tblocks[cursor])
                held_records += tblocks[cursor][1]
                cursor += 1
            due = [m for m in part.members if m.ptk_id in known and (
                (w - (known[m.ptk_id].registered_window or 0))
                % known[m.ptk_id].train_frequency == 0)]
            out += [Trained(m.ptk_id, skipped=f"the window's columns do not fit it "
                            f"({unfit[m.ptk_id]}); not charged") for m in due if m.ptk_id in unfit]
            due = [m for m in due if m.ptk_id not in unfit]
            if not due:
                continue
            if not blocks or held_records == 0:
                out += [Trained(m.ptk_id, skipped="no train data left in the window")
                        for m in due]
                continue
            out += self._run_partition(w, seq, part.index, blocks, due, known, held)
        return out

    def _grant(self, w, seq, k, blocks, due):
        """The partition's grant: the recorded one (a replay), or a new charge. Returns
        (grant, None) or (None, denial reason)."""
        store = self.store
        run_id = f"ptk.w{w}.plan{seq}.p{k}"
        grant = store.ledger.grant_for_run(store.cfg.stream, run_id)
        if grant is not None:
            return grant, None
        eps = sum((dec(m.epsilon) for m in due), Decimal(0))
        dlt = sum((dec(m.delta) for m in due), Decimal(0))
        if eps > dec(store.cfg.epsilon_g) or dlt > dec(store.cfg.delta_g):
            raise InvalidRequestError(f"partition {k} of plan {seq} over-spends: {eps}, {dlt}")
        d = store.ledger.request(store.cfg.stream, run_id=run_id, blocks=[b for b, _ in blocks],
                                 epsilon=exact_float(eps), delta=exact_float(dlt))
        return (d.grant, None) if d.granted else (None, d.reason)

    def _run_partition(self, w, seq, k, blocks, due, known, held) -> list[Trained]:
        store = self.store
        grant, denied = self._grant(w, seq, k, blocks, due)
        if grant is None:
            return [Trained(m.ptk_id, skipped=f"denied: {denied}") for m in due]
        locations = dict(zip(grant.block_ids, grant.locations))
        out = []
        for m in sorted(due, key=lambda m: m.n):
            pid, rec = m.ptk_id, known[m.ptk_id]
            done = self.lake.version_for_window(pid, w)
            if done is not None:  # a replayed run: the stored release stands
                out.append(Trained(pid, done.version, done.n_used, m.n, m.epsilon, done.grant_id))
                continue
            try:
                ptype = store.registry.get(rec.ptk_type)
            except UnknownPTKTypeError as exc:
                out.append(Trained(pid, skipped=f"not trained here: {exc}"))
                continue
            mine, n_used = [], 0
            for b, r in blocks:
                if n_used >= m.n:
                    break
                mine.append(b)
                n_used += r
            # whole blocks, never a positional prefix: adding or removing a record then changes
            # one block's content only, which is the neighbouring relation train_dp assumes
            prev = self.lake.version(pid)
            charge = ptype.charge(m.epsilon, rec.config)

            def produce(ptype=ptype, mine=mine, prev=prev, rec=rec, eps=m.epsilon):
                data = self.files.read(w, [(b, locations[b]) for b in mine])
                try:
                    state = ptype.train_dp(batches_of(data), eps,
                                           prev.state if prev else None,
                                           prev.config if prev else None,
                                           config=rec.config, noise=store.noise)
                except (SageError, *KERNEL_INPUT_ERRORS) as exc:
                    # released as a failure (its class only): the charge stays accounted for
                    # and the window can close; the schema probe makes this rare
                    return canonical_json({"failed": type(exc).__name__})
                return canonical_json({"state": state})

            got = json.loads(release_value_once(store.ledger, grant.grant_id,
                                                _release_name(pid, w), produce).value)
            if held is not None:
                held.renew()
            if "failed" in got:
                out.append(Trained(pid, skipped=f"training failed ({got['failed']}); "
                                   "the charge stands"))
                continue
            v = self.lake.add_version({
                "ptk_id": pid, "window_index": w,
                "state_json": canonical_json(got["state"]).decode("utf-8"),
                "config": rec.config, "epsilon": m.epsilon, "delta": charge.delta,
                "event": repr(charge.event), "grant_id": grant.grant_id, "run_id": grant.run_id,
                "stream": store.cfg.stream, "blocks": mine, "n_used": n_used,
                "partition_index": k, "oldest_window": prev.oldest_window if prev else w,
                "newest_window": w})
            self.lake.enqueue(pid, v.version)
            out.append(Trained(pid, v.version, n_used, m.n, m.epsilon, grant.grant_id))
        return out
