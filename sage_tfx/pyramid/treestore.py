"""Tree (dyadic) aggregation inside a :class:`~sage_tfx.pyramid.windows.PyramidStore`.

A count spec with ``aggregation="tree"`` and ``levels=L`` makes the store keep, instead of one
noisy table per window, noisy tables of the dyadic **nodes** ``(ℓ, j)`` = windows
``[j·2^ℓ, (j+1)·2^ℓ)`` for ``ℓ = 0 .. L`` (Chan, Shi & Song 2011; Pyramid §V, Fig. 7):

* **Sealing** window ``w`` adds its exact count tables to the ``L + 1`` nodes holding it. A
  node is noised and released when it is *complete* — when ``w`` is its last window, or when a
  later window is sealed (the windows between were skipped: they hold nothing). Level 0 (the
  window's leaf) thus completes at every seal. Until then a node's exact partial sum (non-DP) is
  kept encrypted under its own data key (wrapped in the ledger's database, like a hot window's,
  :mod:`sage_tfx.pyramid.hot`) in ``tree/acc/``, and its key is destroyed when the node is
  released or dropped. Partial nodes are never read.
* **Cost.** Each window's data is in exactly ``L + 1`` nodes, one per level. The allocation is
  the spec's budget split over levels: every node's tables get the noise of one of ``L + 1``
  releases that together cost the spec's (ε, δ) (:func:`~sage_tfx.pyramid.plan.plan_window`
  with ``repeat = L + 1``: ε / (L + 1) per node with Laplace; σ calibrated so that ``L + 1``
  Gaussian releases compose to (ε, δ) with dp_accounting's RDP accountant). The window's own
  ledger charge, made at its seal exactly like a flat window's (run id
  ``pyramid-<stream>-<spec digest>-w<id>``), pays for all ``L + 1`` nodes up front: ``(ε, δ)``
  on a basic stream, the ``L + 1``-fold composed DpEvent on an rdp stream. So per block the
  charge is ``(L + 1) ×`` the per-node cost, never less than what runs (a node dropped by
  retention before it completes is paid for and never released).
* **Release once, ledger-wide.** Several stores (directories, processes) may seal one tree
  (stream, spec) on one ledger; each node has one release on the whole ledger. Before a
  store releases node ``(ℓ, j)`` it *claims* it in the ``pyramid_tree_nodes`` table of the
  ledger's database (:func:`claimed_node`; primary key (tree, ℓ, j): the first claim wins,
  across processes and machines) with the windows it summed and the grant of the seal that
  completes it, and records the tables under that grant as ``pyramid/tree/<spec digest>/<ℓ>/<j>``
  (:func:`node_release_name`). A store whose windows of the node are the claim's replays the
  recorded bytes and draws no noise; any other store leaves the node out and reads its
  children. A store claims a node only if it summed every window of the node that any store
  sealed (a window is sealed once its leaf is claimed). Since a window is in one node per
  level, a window's data is then in at most ``L + 1`` releases, whatever the stores do.
* **Which store may seal a new window.** So that every charged window ends up in its ``L + 1``
  releases (spend = charge), a seal that would charge a window for a node it can never be in
  is refused with :class:`TreeWindowError` *before* the charge (the hot window stays open;
  :meth:`~sage_tfx.pyramid.windows.PyramidStore.discard_window` ends it): a window is *late*
  when a node holding it is already claimed (e.g. released by another store that sealed a
  later window), and a store may add a window to a node only if it holds every window of the
  node that another store sealed (it sealed them too, fresh or as a replay). The check, the
  charge and the node claims of one seal run under the ledger lease
  ``pyramid/tree/<stream>/<spec digest>`` (:func:`guard`), so seals of one tree are serialized
  across stores; the claims alone already keep each node released once should a lease expire.
  A replay of a window whose leaf is released is never refused (no new charge). A window
  charged but not sealed (a gate's grant not yet used, a seal that died after its charge) holds
  nothing back; if other windows complete its nodes meanwhile, its seal is refused and its
  charge stays unspent (charged more than spent, never less).
* **Reading.** The live windows ``[a, b]`` are the sum of the complete nodes of
  :func:`~sage_tfx.pyramid.tree.dyadic_cover` (at most ``2L + 1`` of them when the retention is
  ≤ ``2^L``); a node this store could not release is replaced by its children, an interval
  with no sealed window counts as exact zeros. Noise variance of a cell is the sum over the
  nodes read.
* **Retention** drops the nodes (and partial sums) holding a window before the oldest live one:
  they can never be in a range of retained windows.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import uuid
from typing import Iterator, Optional

import numpy as np

from sage_tfx.errors import InvalidRequestError
from sage_tfx.ledger import keys
from sage_tfx.ledger.values import now
from sage_tfx.pyramid import hot as hot_lib
from sage_tfx.pyramid.featurize import CountSpec, key_kinds
from sage_tfx.pyramid.plan import NoisePlan
from sage_tfx.pyramid.sealing import PRIOR, _noised, release_once
from sage_tfx.pyramid.tree import dyadic_cover, exact_tables, tree_levels

__all__ = ["TreeWindowError", "node_release_name", "node_span", "node_path", "check_retention",
           "claimed_node", "guard", "check_window", "seal_nodes", "cover_nodes", "drop_before",
           "cleanup"]

LEASE_TTL = 300.0   # seconds a seal may hold its tree's lease (a dead holder frees it then)
_CLAIMS = """CREATE TABLE IF NOT EXISTS pyramid_tree_nodes (
    tree TEXT NOT NULL, ell {int} NOT NULL, j {int} NOT NULL, windows TEXT NOT NULL,
    grant_id TEXT NOT NULL, store_id TEXT NOT NULL, created_at TEXT NOT NULL,
    PRIMARY KEY (tree, ell, j))"""


class TreeWindowError(InvalidRequestError):
    """A tree store may not seal this window: a node holding it was already released, or
    another store sealed windows of its nodes that this store does not hold (nothing charged)."""


def node_release_name(spec: CountSpec, ell: int, j: int) -> str:
    """The ledger release name of node ``(ℓ, j)``'s tables."""
    return f"pyramid/tree/{spec.digest()}/{int(ell)}/{int(j)}"


def node_span(ell: int, j: int) -> tuple[int, int]:
    """First and last window of node ``(ℓ, j)``."""
    return j << ell, ((j + 1) << ell) - 1


def _key(ell: int, j: int) -> str:
    return f"{ell}/{j}"


def _parse(key: str) -> tuple[int, int]:
    ell, j = key.split("/")
    return int(ell), int(j)


def check_retention(spec: CountSpec, retention: int) -> None:
    """A tree store's top level must fit its retention: ``2^(L-1) < retention ≤ 2^L``. Larger
    ranges would need more than ``2L + 1`` nodes; a larger ``L`` would charge every window for
    top-level nodes that never fit in the retained range, so are never released."""
    need = tree_levels(retention)
    if spec.levels != need:
        raise InvalidRequestError(
            f"a tree of levels={spec.levels} does not fit retention {retention}: use levels="
            f"{need} (ranges of up to 2^levels windows, read from <= 2 levels + 1 nodes; a "
            "larger top level is charged but never fits the retained range)")


def node_path(state_dir: str, ell: int, j: int) -> str:
    """The file of tree node (ℓ, j) in a store's ``state_dir``."""
    return os.path.join(state_dir, "tree", "nodes", f"l{ell}-j{j}.npz")


def _acc_path(state_dir: str, name: str) -> str:
    return os.path.join(state_dir, "tree", "acc", name)


def _aad(store_id: str, acc_id: str) -> bytes:
    return keys.aad_for("pyramid-tree", store_id, acc_id)


def _tables_bytes(tables: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{f"t__{k}": v for k, v in tables.items()})
    return buf.getvalue()


def _read_acc(store, p: dict) -> dict:
    with open(_acc_path(store.state_dir, p["file"]), "rb") as f:
        data = f.read()
    try:
        plain = store._keys.get(p["acc_id"]).decrypt(data, _aad(store.store_id, p["acc_id"]))
    except InvalidRequestError:
        raise
    except Exception as e:  # Tink raises its own error types on tampering
        raise InvalidRequestError(f"tree partial sum {p['file']} does not decrypt: {e}") from e
    with np.load(io.BytesIO(plain), allow_pickle=False) as z:
        return {k[len("t__"):]: z[k] for k in z.files}


def _write_acc(store, p: dict, tables: dict, window: int) -> dict:
    """A new encrypted file of a node's partial sum (the old one stays until the manifest no
    longer names it, so a crash never leaves a sum counted twice)."""
    acc_id = p.get("acc_id") or uuid.uuid4().hex
    if not p.get("acc_id"):
        store._keys.create(acc_id, window)
    name = f"{acc_id}-w{window}.enc"
    path = _acc_path(store.state_dir, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = store._keys.get(acc_id).encrypt(_tables_bytes(tables), _aad(store.store_id, acc_id))
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return {**p, "acc_id": acc_id, "file": name}


def cleanup(store, trash: list) -> list[str]:
    """Ends partial sums once the manifest no longer names them: each key first (None: kept,
    the node's sum continues in a newer file), then the file. Returns the deleted paths."""
    deleted = []
    for acc_id, name in trash:
        if acc_id is not None:
            store._keys.destroy(acc_id)
        path = _acc_path(store.state_dir, name)
        if os.path.exists(path):
            os.remove(path)
            deleted.append(path)
    return deleted


def _node_bytes(tables: dict, spec: CountSpec, plan: NoisePlan, noise, meta: dict) -> bytes:
    """The node's noisy tables (the only place a node's noise is drawn), as ``.npz`` bytes in
    the format of a flat window's tables."""
    names = [spec.group_name(g) for g in spec.groups] + [PRIOR]
    noisy = {n: _noised(tables[n], plan, i, noise) for i, n in enumerate(names)}
    meta = dict(meta, noise_var={n: plan.variance(i) for i, n in enumerate(names)},
                mechanism=plan.mechanism, epsilons=plan.shares.tolist(),
                scales=plan.scales.tolist())
    buf = io.BytesIO()
    np.savez_compressed(buf, prior=noisy.pop(PRIOR),
                        meta=np.array(json.dumps(meta, sort_keys=True)),
                        **{f"cells__{k}": v for k, v in noisy.items()})
    return buf.getvalue()


def _dropped(start: int, first_live: int, ell: int, j: int) -> bool:
    """Whether node ``(ℓ, j)`` holds a window this store sealed and retention dropped (the
    store's windows ``[start, first_live)``): such a node is never released nor read here. A
    node that merely starts before the store's first window is not dropped."""
    s, e = node_span(ell, j)
    return start < first_live and s < first_live and e >= start


def _tree(store) -> str:
    return f"{store.stream}/{store.spec.digest()}"


def claimed_node(store, ell: int, j: int) -> Optional[dict]:
    """The ledger-wide claim of node ``(ℓ, j)`` of the store's tree: ``{"windows", "grant_id",
    "store_id"}``, or None while no store has released it."""
    with hot_lib.ledger_db(store.ledger.url, _CLAIMS) as db:
        row = db.q("SELECT windows, grant_id, store_id FROM pyramid_tree_nodes WHERE tree = ? "
                   "AND ell = ? AND j = ?", (_tree(store), int(ell), int(j))).fetchone()
    return None if row is None else {"windows": json.loads(row[0]), "grant_id": row[1],
                                     "store_id": row[2]}


def _claim_node(store, ell: int, j: int, windows: list, grant_id: str) -> dict:
    """Claims node ``(ℓ, j)`` for ``windows`` under ``grant_id``; returns the claim that holds
    (the first one: another store's if it claimed first)."""
    with hot_lib.ledger_db(store.ledger.url, _CLAIMS) as db:
        db.q("INSERT INTO pyramid_tree_nodes (tree, ell, j, windows, grant_id, store_id, "
             "created_at) VALUES (?,?,?,?,?,?,?) ON CONFLICT (tree, ell, j) DO NOTHING",
             (_tree(store), int(ell), int(j), json.dumps([int(v) for v in windows]), grant_id,
              store.store_id, now()))
    return claimed_node(store, ell, j)


def _sealed(store, ell: int, j: int) -> set[int]:
    """The windows of node ``(ℓ, j)`` that some store sealed on the ledger (leaf claimed)."""
    lo, hi = node_span(ell, j)
    with hot_lib.ledger_db(store.ledger.url, _CLAIMS) as db:
        rows = db.q("SELECT j FROM pyramid_tree_nodes WHERE tree = ? AND ell = 0 AND j >= ? "
                    "AND j <= ?", (_tree(store), lo, hi)).fetchall()
    return {int(r[0]) for r in rows}


def _lease_name(store) -> str:
    return f"pyramid/tree/{_tree(store)}"


@contextlib.contextmanager
def guard(store, m: dict, hot: dict) -> Iterator[None]:
    """Holds the tree's ledger lease around a seal's check, charge and node releases, after
    :func:`check_window` passed (a store without a ledger: nothing to guard)."""
    if store.ledger is None:
        yield
        return
    with store.ledger.lease(_lease_name(store), ttl=LEASE_TTL, wait=store._lock.wait):
        check_window(store, m, hot)
        yield


def check_window(store, m: dict, hot: dict) -> None:
    """Raises :class:`TreeWindowError` if sealing the hot window would charge it for a node it
    can never be released in (see the module docstring); a replay passes."""
    spec, w = store.spec, int(hot["window"])
    if claimed_node(store, 0, w) is not None:
        return                         # a replay: the leaf is released, nothing new is charged
    t = m.get("tree") or {}
    pending = t.get("pending", {})
    first_live = sorted(set(m["live"]) | {w})[-store.retention:][0]
    start = w if t.get("start") is None else int(t["start"])
    for ell in range(spec.levels + 1):
        j = w >> ell
        claim = claimed_node(store, ell, j)
        if claim is not None:
            raise TreeWindowError(
                f"window {w} comes too late for this tree: node {ell}/{j} holding it was "
                f"released with windows {claim['windows']} (by store {claim['store_id']}), so "
                f"window {w} could never be in it; seal a later window instead")
        if _dropped(start, first_live, ell, j):
            continue                   # holds a window this store drops: never released here
        held = set(pending.get(_key(ell, j), {}).get("windows", ()))
        missing = sorted(_sealed(store, ell, j) - held - {w})
        if missing:
            raise TreeWindowError(
                f"window {w} cannot join node {ell}/{j} in this store: windows {missing} of it "
                "were sealed by another store and not here, so no store would hold the whole "
                "node to release it; seal this window from the store that sealed them")


def _node_claim(store, ell: int, j: int, windows: list, grant_id: str) -> Optional[dict]:
    """The claim under which this store releases node ``(ℓ, j)`` of ``windows``, or None: the
    node was released with other windows, or a window of it sealed elsewhere is not summed
    here."""
    claim = claimed_node(store, ell, j)
    if claim is None:
        if _sealed(store, ell, j) - set(windows):
            return None
        claim = _claim_node(store, ell, j, windows, grant_id)
    return claim if claim["windows"] == [int(v) for v in windows] else None


def seal_nodes(store, m: dict, hot: dict, plan: NoisePlan, grant_id: Optional[str],
               run_id: str, first_live: int) -> tuple[bool, list]:
    """Adds the hot window to its nodes and releases the nodes it completes (see the module
    docstring); updates ``m["tree"]``. Returns ``(replayed, trash)``: replayed if every node
    released here was the ledger's recorded one; ``trash`` for :func:`cleanup` once the caller
    has written the manifest."""
    spec, w = store.spec, int(hot["window"])
    t = m.setdefault("tree", {"start": None, "pending": {}, "nodes": {}})
    if t.get("start") is None:
        t["start"] = w
    start = int(t["start"])
    frame = store._read_hot(hot)
    exact = exact_tables(frame, spec)
    kinds = key_kinds(frame, spec.features, spec.hash_family)
    completing, pending = [], {}
    for key, p in t["pending"].items():             # nodes before w: the windows between
        ell, j = _parse(key)                         # were skipped, so they are complete
        if node_span(ell, j)[1] < w:
            completing.append((ell, j, _read_acc(store, p), p["windows"], p["kinds"]))
    for ell in range(spec.levels + 1):
        j = w >> ell
        p = t["pending"].get(_key(ell, j))
        tables = dict(exact) if p is None else {
            n: v + exact[n] for n, v in _read_acc(store, p).items()}
        windows = ([] if p is None else p["windows"]) + [w]
        kd = {f: sorted(set(kinds[f]) | set(() if p is None else p["kinds"].get(f, ())))
              for f in spec.features}
        if node_span(ell, j)[1] == w:
            completing.append((ell, j, tables, windows, kd))
        elif not _dropped(start, first_live, ell, j):
            base = p or {"windows": [], "kinds": {}}
            pending[_key(ell, j)] = ({**base, "windows": windows, "kinds": kd}, tables)
    replayed, released_any = True, False
    for ell, j, tables, windows, kd in sorted(completing, key=lambda c: (c[0], c[1])):
        if _dropped(start, first_live, ell, j):
            continue                                  # holds a dropped window: never read
        name, path = node_release_name(spec, ell, j), node_path(store.state_dir, ell, j)
        meta = {"node": [ell, j], "windows": windows, "run_id": run_id, "epsilon": plan.epsilon,
                "kinds": kd}
        if grant_id is None:                          # offline: the only store of its tree
            node_grant = None
            data, rep = _node_bytes(tables, spec, plan, store.noise, meta), False
        else:
            claim = _node_claim(store, ell, j, windows, grant_id)
            if claim is None:
                continue                              # not whole here: read from its children
            node_grant = claim["grant_id"]
            data, rep = release_once(store.ledger, node_grant, name, lambda: _node_bytes(
                tables, spec, plan, store.noise, meta), path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(f"{path}.tmp", "wb") as f:
            f.write(data)
        os.replace(f"{path}.tmp", path)
        t["nodes"][_key(ell, j)] = {"grant": node_grant, "windows": windows}
        replayed, released_any = replayed and rep, True
    # partial sums are written after the releases: a failed release leaves no new key or file
    pending = {k: _write_acc(store, p, tables, w) for k, (p, tables) in pending.items()}
    live_ids = {p["acc_id"] for p in pending.values()}
    trash = [(None if p["acc_id"] in live_ids else p["acc_id"], p["file"])
             for p in t["pending"].values()]      # superseded or ended partial sums
    t["pending"] = pending
    return replayed and released_any, trash


def drop_before(store, m: dict, first_live: int) -> tuple[list[str], list]:
    """Retention: deletes the nodes holding a window this store dropped (sealed before
    ``first_live``) and returns ``(deleted paths, trash)``: their partial sums, for
    :func:`cleanup`."""
    t, deleted, trash = m.get("tree"), [], []
    if not t:
        return deleted, trash
    start = int(t["start"])
    for key in [k for k in t["nodes"] if _dropped(start, first_live, *_parse(k))]:
        path = node_path(store.state_dir, *_parse(key))
        if os.path.exists(path):
            os.remove(path)
            deleted.append(path)
        del t["nodes"][key]
    for key in [k for k in t["pending"] if _dropped(start, first_live, *_parse(k))]:
        p = t["pending"].pop(key)
        trash.append((p["acc_id"], p["file"]))
    return deleted, trash


def cover_nodes(store, m: dict) -> list[tuple[int, int]]:
    """The released nodes whose sum is the live windows: the dyadic cover of ``[a, b]``, a node
    this store has not released replaced by its children, empty intervals left out."""
    live, t = m["live"], m.get("tree") or {"nodes": {}}
    out: list[tuple[int, int]] = []

    def take(ell: int, j: int) -> None:
        s, e = node_span(ell, j)
        if _key(ell, j) in t["nodes"]:
            out.append((ell, j))
        elif any(s <= v <= e for v in live):
            if ell == 0:
                raise InvalidRequestError(f"live window {j} has no released tree leaf")
            take(ell - 1, 2 * j)
            take(ell - 1, 2 * j + 1)

    if live:
        for ell, j in dyadic_cover(int(live[0]), int(live[-1]), store.spec.levels):
            take(ell, j)
    return out


def seal_window(store, m: dict, hot: dict, plan: NoisePlan, grant_id: Optional[str],
                run_id: str, event):
    """:meth:`PyramidStore.seal`'s tree part, after the charge: nodes, retention, manifest."""
    from sage_tfx.pyramid.windows import SealResult
    w = int(hot["window"])
    live = sorted(set(m["live"]) | {w})
    dropped = tuple(live[:-store.retention]) if len(live) > store.retention else ()
    live = live[-store.retention:]
    replayed, trash = seal_nodes(store, m, hot, plan, grant_id, run_id, live[0])
    deleted, more = drop_before(store, m, live[0])
    deleted += store._destroy_hot(hot)
    m.update(live=live, newest=w if m["newest"] is None else max(int(m["newest"]), w), hot=None)
    store._write(m)
    deleted += cleanup(store, trash + more)
    store._cached = None
    for cb in store._retrain_callbacks if dropped else ():
        cb(dropped)
    return SealResult(w, run_id, plan.epsilon, tuple(plan.shares.tolist()),
                      tuple(plan.scales.tolist()), grant_id, dropped, tuple(deleted),
                      bool(dropped), None, event, replayed)


def restore_nodes(store, window: int):
    """:meth:`PyramidStore.restore` of a tree store's live window: the missing node files of the
    live range re-materialized from the ledger (the grants the manifest names); no noise, no
    charge. A window the store never sealed is sealed again instead (recorded nodes replay)."""
    from sage_tfx.pyramid.plan import plan_window
    from sage_tfx.pyramid.windows import SealResult
    with store._lock.held():
        m = store._read()
        if window not in m["live"]:
            raise InvalidRequestError(f"window {window} is not live in this tree store: seal it "
                                      "(its recorded nodes are replayed, no new noise)")
        for ell, j in cover_nodes(store, m):
            path = node_path(store.state_dir, ell, j)
            if os.path.exists(path):
                continue
            gid = m["tree"]["nodes"][_key(ell, j)]["grant"]
            rec = None if gid is None else store.ledger.recorded_release(
                gid, node_release_name(store.spec, ell, j))
            if rec is None:
                raise InvalidRequestError(f"node {ell}/{j} is lost and has no recorded release")
            data, _ = release_once(store.ledger, gid, rec.name, _never, path)
            with open(path, "wb") as f:
                f.write(data)
        rdp = store._rdp_mode()
        plan = plan_window(store.spec, rdp=rdp)
        g = store.ledger.grant_for_run(store.stream, store.run_id(window))
        store._cached = None
        return SealResult(window, store.run_id(window), plan.epsilon, tuple(plan.shares.tolist()),
                          tuple(plan.scales.tolist()), g and g.grant_id, (), (), False,
                          event=plan.event if rdp else None, replayed=True)


def _never() -> bytes:
    raise AssertionError("a recorded release is never produced again")
