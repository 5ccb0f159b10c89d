"""Block keys: the wrapped data keys of encrypted blocks, handed out through grants and destroyed
when the blocks retire (crypto-shredding).

The splitter encrypts every block with its own data key (:mod:`sage_tfx.streams.blockfiles`);
the ledger keeps that key only wrapped by the key-encryption key (KEK,
:mod:`~sage_tfx.ledger.keys`), one ``block_keys`` row per block, inserted in the transaction that
registers the block (``BlockSpec.wrapped_key``): a block never exists without its key, and a
registration that fails leaves no key behind.

**Through a grant only.** :meth:`BlockKeyMixin.grant_keys` returns the wrapped keys of a
*released* grant's blocks, and no other, to a caller allowed to charge the grant's (stream,
context) — the check a request makes. The reader unwraps them with the KEK, which the platform
holds (the pipeline image, a KMS), never the ledger, and decrypts only those blocks' files. Every
hand-out is in the audit log.

**Retirement destroys the key.** A block's key row is deleted once the block is retired in every
context of its stream:

* retired by the operator (``retire_block``): in the retirement's own transaction;
* retired by budget exhaustion inside a grant's transaction: the grants that paid for it must
  still read it, so the key is kept while a grant that holds the block is reserved or was
  released less than the *hold* ago (default 24 h, ``$SAGE_KEY_HOLD_SECONDS``), and destroyed by
  the next write that checks (``add_blocks`` and ``retire_block`` always, ``grant_keys`` at most
  once a minute per stream) or by ``sage-tfx keys shred``. A reservation released after the
  hold finds the key gone.

The delete makes the bytes go: SQLite deletes under ``PRAGMA secure_delete`` (freed cells and
pages are zeroed) and then checkpoints the WAL with TRUNCATE (the old pages, key and all, leave
the WAL file); PostgreSQL VACUUMs ``block_keys`` after the delete. The block's local files are
deleted as well (a path, not a URI). From then on the key is in neither the files nor the
database nor a backup of both taken afterwards, whoever holds the KEK.

**A backup taken before the retirement** still holds the wrapped key: with the KEK of that time
(and a copy of the files) it decrypts the block. So may freed disk blocks and PostgreSQL WAL
segments until they are overwritten. :func:`rotate_kek` (``sage-tfx keys rotate``) ends all of
them: a new KEK version wraps every live key again and the old versions are destroyed, after
which no wrapped key made before the rotation opens. Rotate at least as often as backups expire.
"""
from __future__ import annotations

import dataclasses
import datetime
import fnmatch
import json
import logging
import math
import os
import time
from typing import Callable, Optional, Sequence

from sage_tfx.errors import (GrantStateError, InvalidRequestError, RetiredBlockError,
                             UnknownBlockError)
from sage_tfx.ledger import access, keys
from sage_tfx.ledger.values import ACTIVE, RELEASED, RESERVED, RETIRED, now

DEFAULT_HOLD_SECONDS = 24 * 3600.0
HOLD_ENV = "SAGE_KEY_HOLD_SECONDS"
# A key hand-out looks for keys due to be destroyed at most this often per stream (the look
# scans the stream's live keys and its recent grants); imports and retirements always look.
CHECK_EVERY_SECONDS = 60.0
_CHECK_LEASE = "sage/keys/shred-check/"
# The data files of a block directory that retirement deletes (local storage): plaintext files
# of the layout before encryption and encrypted ones. sage_tfx.streams.blocks names them (the
# ledger does not import the streams layer; a test keeps the two in step).
BLOCK_FILE_PATTERNS = ("part-*.tfrecord.gz", "part-*.tfrecord.gz.tink")
_CHUNK = 500
_log = logging.getLogger(__name__)
# Other holders of KEK-wrapped keys (e.g. a system's hot windows): the name of the table they
# live in -> fn(ledger, kek) that re-wraps them under the KEK's current version and returns how
# many it re-wrapped.
_REWRAPPERS: dict[str, Callable] = {}


def check_hold(hold) -> float:
    """A hold in seconds (finite, >= 0). Raises InvalidRequestError."""
    if isinstance(hold, bool) or not isinstance(hold, (int, float)) or not math.isfinite(hold) \
            or hold < 0:
        raise InvalidRequestError(f"a key hold is a finite number of seconds >= 0, got {hold!r}")
    return float(hold)


def default_hold(environ=os.environ) -> float:
    """``$SAGE_KEY_HOLD_SECONDS``, else 24 hours."""
    text = environ.get(HOLD_ENV)
    if not text:
        return DEFAULT_HOLD_SECONDS
    try:
        return check_hold(float(text))
    except ValueError:
        raise InvalidRequestError(f"${HOLD_ENV} must be seconds >= 0, got {text!r}") from None


def register_rewrapper(table: str, fn: Callable) -> None:
    """Makes :func:`rotate_kek` also re-wrap the keys of ``table`` (a table of the ledger's
    database with ``kek_id`` and ``wrapped`` columns) with ``fn(ledger, kek) -> int``."""
    _REWRAPPERS[table] = fn


def rewrap_table(ledger, kek: keys.KeyProvider, table: str, key_columns: Sequence[str],
                 aad: Callable[[dict], bytes], columns: Sequence[str] = ()) -> int:
    """Re-wraps the keys of a system's table (``kek_id``, ``wrapped`` and ``key_columns``) under
    the KEK's current version; returns how many. ``aad(row)`` gives a row's associated data from
    its ``key_columns`` and ``columns``. For :func:`register_rewrapper`.

    Raises:
      InvalidRequestError: a key did not open (nothing of that row changes).
    """
    from sage_tfx.ledger import schema
    ledger.authorize(access.CONFIGURE)
    st = ledger._store
    if not schema.columns(st, table):
        return 0  # this ledger's database never held the system's table
    names = list(key_columns) + [c for c in columns if c not in key_columns]
    rows = st.q(f"SELECT {', '.join(names)}, wrapped FROM {table} WHERE kek_id <> ?",
                (kek.kek_id,)).fetchall()
    where = " AND ".join(f"{c} = ?" for c in key_columns)
    done = 0
    for row in rows:
        values, old = dict(zip(names, row[:-1])), row[-1]
        text = isinstance(old, str)  # a table may keep the wrapped key as text
        dk = keys.DataKey.unwrap(kek, old.encode("utf-8") if text else bytes(old), aad(values))
        new = dk.wrap(kek, aad(values))

        def txn(values=values, old=old, new=new.decode("utf-8") if text else new):
            if st.kind == "sqlite":
                st.q("PRAGMA secure_delete = ON")
            n = st.q(f"UPDATE {table} SET kek_id = ?, wrapped = ? WHERE {where} AND wrapped = ?",
                     (kek.kek_id, new, *[values[c] for c in key_columns], old)).rowcount
            if n:
                st.audit(None, "rewrap_keys", {"count": n, "kek_id": kek.kek_id, "table": table})
            return n

        done += st.write(txn)
    return done


def other_wrapped_keys(ledger) -> dict[str, int]:
    """Tables of the ledger's database other than ``block_keys`` that hold KEK-wrapped keys
    (``kek_id`` and ``wrapped`` columns, e.g. a system's hot windows): table -> rows."""
    from sage_tfx.ledger import schema
    st = ledger._store
    if st.kind == "sqlite":
        names = st.q("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    else:
        names = st.q("SELECT table_name FROM information_schema.tables WHERE "
                     "table_schema = current_schema()").fetchall()
    out = {}
    for (table,) in names:
        if table != "block_keys" and {"kek_id", "wrapped"} <= set(schema.columns(st, table)):
            count = st.q(f'SELECT count(*) FROM "{table}"').fetchone()[0]
            if count:
                out[table] = count
    return out


@dataclasses.dataclass(frozen=True)
class WrappedKey:
    """A block's data key as the ledger stores it: wrapped by the KEK ``kek_id``."""

    stream: str
    block_id: str
    kek_id: str
    wrapped: bytes = dataclasses.field(repr=False)

    @property
    def aad(self) -> bytes:
        """The associated data the key was wrapped with."""
        return keys.aad_for(self.stream, self.block_id)

    def unwrap(self, kek: keys.KeyProvider) -> keys.DataKey:
        """The data key. Raises InvalidRequestError if the KEK does not open it."""
        try:
            return keys.DataKey.unwrap(kek, self.wrapped, self.aad)
        except InvalidRequestError as e:
            raise InvalidRequestError(
                f"the data key of block {self.block_id} of stream {self.stream} was wrapped by "
                f"{self.kek_id} and does not open with this process's KEK {kek.key_id} "
                f"(set ${keys.PROVIDER_ENV}): {e}") from e


@dataclasses.dataclass(frozen=True)
class ShredReport:
    """What a shred did: (stream, block) whose key it destroyed, (stream, block) retired
    everywhere but still held by a grant, block files deleted, database wiped (None: nothing
    was destroyed, so there was nothing to wipe)."""

    shredded: tuple[tuple[str, str], ...]
    held: tuple[tuple[str, str], ...]
    files_removed: int
    wiped: Optional[bool]


def remove_block_files(location: str) -> int:
    """Deletes a local block directory's data files (and the directory once empty); returns how
    many. A URI location (``gs://...``) is left alone: delete it with the storage's own tools."""
    if not isinstance(location, str) or "://" in location or not os.path.isdir(location):
        return 0
    removed = 0
    for name in os.listdir(location):
        if any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, p + ".*.tmp")
               for p in BLOCK_FILE_PATTERNS):
            os.remove(os.path.join(location, name))
            removed += 1
    try:
        os.rmdir(location)
    except OSError:
        pass  # something else lives there: not ours to delete
    return removed


def _key(row) -> WrappedKey:
    return WrappedKey(row[0], row[1], row[2], bytes(row[3]))


class BlockKeyMixin:
    """Block keys of :class:`~sage_tfx.ledger.core.Ledger` (needs ``self._store``)."""

    # -- registration (inside add_blocks' transaction) --

    def _insert_block_keys(self, stream: str, specs: Sequence, ts: str) -> None:
        """Inserts the wrapped keys of encrypted blocks being registered, then destroys due keys."""
        rows = []
        for sp in specs:
            if sp.wrapped_key is None and sp.kek_id is None:
                continue
            if not isinstance(sp.wrapped_key, (bytes, bytearray)) or not sp.wrapped_key \
                    or not isinstance(sp.kek_id, str) or not sp.kek_id:
                raise InvalidRequestError(f"block {sp.block_id!r}: an encrypted block needs its "
                                          "wrapped_key (bytes) and kek_id")
            rows.append((stream, sp.block_id, sp.kek_id, bytes(sp.wrapped_key), ts))
        if rows:
            self._store.bulk_insert("block_keys", ("stream", "block_id", "kek_id", "wrapped",
                                                   "created_at"), rows)
            self._store.audit(stream, "block_keys", {
                "count": len(rows), "first": rows[0][1], "last": rows[-1][1],
                "kek_ids": sorted({r[2] for r in rows})})
        self._shred_due(stream)

    def add_block_key(self, stream: str, block_id: str, *, kek_id: str,
                      wrapped: bytes) -> WrappedKey:
        """Registers the data key of a block registered without one (``sage-tfx keys migrate``).

        Raises:
          UnknownBlockError: no such block.
          RetiredBlockError: the block is retired everywhere (its data is deleted, not encrypted).
          InvalidRequestError: bad arguments, or the block has a key already.
        """
        self.authorize(access.CONFIGURE)
        if not isinstance(wrapped, (bytes, bytearray)) or not wrapped or not kek_id:
            raise InvalidRequestError("a block key needs wrapped bytes and a kek_id")
        key = WrappedKey(stream, block_id, kek_id, bytes(wrapped))
        st = self._store

        def txn():
            status = [r[0] for r in st.q("SELECT status FROM budgets WHERE stream = ? AND "
                                         "block_id = ?", (stream, block_id)).fetchall()]
            if not status:
                raise UnknownBlockError(f"unknown block {block_id!r} in stream {stream!r}")
            if ACTIVE not in status:
                raise RetiredBlockError(f"block {block_id} of stream {stream} is retired "
                                        "everywhere: its data is deleted, not encrypted")
            if st.q("SELECT 1 FROM block_keys WHERE stream = ? AND block_id = ?",
                    (stream, block_id)).fetchone():
                raise InvalidRequestError(f"block {block_id} of stream {stream} has a key")
            st.q("INSERT INTO block_keys (stream, block_id, kek_id, wrapped, created_at) "
                 "VALUES (?,?,?,?,?)", (stream, block_id, kek_id, key.wrapped, now()))
            st.audit(stream, "block_key", {"block": block_id, "kek_id": kek_id,
                                           "key": keys.fingerprint(key.wrapped)})
            return key

        return st.write(txn)

    # -- hand-out --

    def grant_keys(self, grant_id: str) -> dict[str, Optional[WrappedKey]]:
        """The wrapped data keys of a released grant's blocks: block id -> key, or None for a
        block registered without one (plaintext, or its key destroyed).

        A PostgreSQL login role (:mod:`~sage_tfx.ledger.pgroles`) may not read ``block_keys``:
        the server hands it the keys through ``sage_grant_keys``, which makes the same checks,
        and it leaves the destruction of due keys to the ledger's owner.

        Raises:
          InvalidRequestError: unknown grant.
          GrantStateError: the grant is not released (a reservation or cancelled).
          PermissionDeniedError: the caller may not charge the grant's (stream, context).
        """
        st = self._store

        def txn():
            row = st.q("SELECT stream, context, status, blocks FROM grants WHERE grant_id = ?",
                       (grant_id,)).fetchone()
            if row is None:
                raise InvalidRequestError(f"unknown grant {grant_id!r}")
            stream, context, status = row[0], row[1], row[2]
            self.authorize(access.CHARGE, stream=stream, context=context)
            if status != RELEASED:
                raise GrantStateError(f"grant {grant_id} is {status}: only a released grant's "
                                      "blocks can be decrypted")
            ids = json.loads(row[3])
            if getattr(st, "restricted", False):
                from sage_tfx.ledger import pgroles
                found = {r[0]: WrappedKey(stream, r[0], r[1], r[2])
                         for r in pgroles.grant_keys(st, grant_id)}
            else:
                self._shred_due(stream, throttle=True)
                found = {k.block_id: k for k in self._keys_of(stream, ids)}
            st.audit(stream, "grant_keys", {"grant_id": grant_id, "context": context,
                                            "blocks": len(ids), "keys": len(found)})
            return {b: found.get(b) for b in ids}

        out = st.write(txn)
        self._finish_shred()
        return out

    def _keys_of(self, stream: str, block_ids: Sequence[str]) -> list[WrappedKey]:
        out = []
        for k in range(0, len(block_ids), _CHUNK):
            chunk = list(block_ids[k:k + _CHUNK])
            out += [_key(r) for r in self._store.q(
                "SELECT stream, block_id, kek_id, wrapped FROM block_keys WHERE stream = ? AND "
                f"block_id IN ({','.join('?' * len(chunk))})", [stream] + chunk).fetchall()]
        return out

    def block_keys(self, stream: Optional[str] = None) -> list[WrappedKey]:
        """Every live block key (of one stream, or all), for rotation and audits."""
        self.authorize(access.CONFIGURE)
        sql = "SELECT stream, block_id, kek_id, wrapped FROM block_keys "
        rows = (self._store.q(sql + "WHERE stream = ? ORDER BY block_id", (stream,)) if stream
                else self._store.q(sql + "ORDER BY stream, block_id"))
        return [_key(r) for r in rows.fetchall()]

    # -- destruction --

    def _retired_everywhere(self, stream: str, keyed: bool) -> list[tuple[str, str]]:
        """(block id, location) of the stream's blocks retired in every context: with a key row
        only (``keyed``, cheap: one probe per live key), or all of them."""
        contexts = self.stream(stream).contexts
        joins = "".join(
            f" JOIN budgets u{i} ON u{i}.stream = b.stream AND u{i}.context = ? AND "
            f"u{i}.block_id = b.block_id AND u{i}.status = ?" for i in range(len(contexts)))
        params = [p for c in contexts for p in (c, RETIRED)]
        if keyed:
            sql = ("SELECT b.block_id, b.location FROM block_keys k JOIN blocks b ON "
                   "b.stream = k.stream AND b.block_id = k.block_id" + joins +
                   " WHERE k.stream = ?")
        else:
            sql = "SELECT b.block_id, b.location FROM blocks b" + joins + " WHERE b.stream = ?"
        return [(r[0], r[1]) for r in self._store.q(sql, params + [stream]).fetchall()]

    def _held(self, stream: str, hold: float) -> set[str]:
        """Blocks of grants that are reserved or were released less than ``hold`` seconds ago."""
        cutoff = (datetime.datetime.now(datetime.timezone.utc)
                  - datetime.timedelta(seconds=hold)).isoformat(timespec="microseconds")
        held: set[str] = set()
        for (blocks,) in self._store.q(
                "SELECT blocks FROM grants WHERE stream = ? AND (status = ? OR (status = ? AND "
                "released_at > ?))", (stream, RESERVED, RELEASED, cutoff)).fetchall():
            held.update(json.loads(blocks))
        return held

    def _shred_due(self, stream: str, hold: Optional[float] = None, sweep: bool = False,
                   throttle: bool = False) -> tuple[list[str], list[str]]:
        """Inside a write: destroys the keys of the stream's blocks retired everywhere and no
        longer held by a grant; returns (shredded, held). ``sweep`` also schedules the deletion
        of the files of such blocks that have no key (plaintext, or files left behind);
        ``throttle`` skips the look if one was made less than CHECK_EVERY_SECONDS ago."""
        st = self._store
        if not sweep and st.q("SELECT 1 FROM block_keys WHERE stream = ? LIMIT 1",
                              (stream,)).fetchone() is None:
            return [], []
        if throttle and not self._check_due(stream):
            return [], []
        candidates = self._retired_everywhere(stream, keyed=not sweep)
        if not candidates:
            return [], []
        held = self._held(stream, default_hold() if hold is None else hold)
        due = [(b, loc) for b, loc in candidates if b not in held]
        destroyed = self._destroy_keys(stream, due, "retired; no grant holds it")
        return destroyed, sorted(b for b, _ in candidates if b in held)

    def _check_due(self, stream: str) -> bool:
        """Whether the stream's periodic look for due keys should run now (and book the next)."""
        st, t = self._store, time.time()
        row = st.q("SELECT expires_at FROM leases WHERE name = ?",
                   (_CHECK_LEASE + stream,)).fetchone()
        if row is not None and row[0] > t:
            return False
        st.q("INSERT INTO leases (name, holder, expires_at, acquired_at) VALUES (?,?,?,?) "
             "ON CONFLICT (name) DO UPDATE SET expires_at = excluded.expires_at, "
             "acquired_at = excluded.acquired_at",
             (_CHECK_LEASE + stream, "ledger", t + CHECK_EVERY_SECONDS, now()))
        return True

    def _shred_retired(self, stream: str, block_id: str) -> None:
        """Inside ``retire_block``'s transaction: the key goes at once if the block is now
        retired in every context (the operator's retirement does not wait for a hold)."""
        st = self._store
        status = [r[0] for r in st.q("SELECT status FROM budgets WHERE stream = ? AND "
                                     "block_id = ?", (stream, block_id)).fetchall()]
        if status and ACTIVE not in status:
            loc = st.q("SELECT location FROM blocks WHERE stream = ? AND block_id = ?",
                       (stream, block_id)).fetchone()[0]
            self._destroy_keys(stream, [(block_id, loc)], "retired by the operator")
        self._shred_due(stream)

    def _destroy_keys(self, stream: str, blocks: Sequence[tuple[str, str]],
                      reason: str) -> list[str]:
        """Deletes the key rows of ``blocks`` (zeroing the freed bytes) and schedules the wipe of
        the database's logs and the deletion of their files, both after the commit. Returns
        the blocks whose key was deleted."""
        if not blocks:
            return []
        st = self._store
        destroyed = []
        if st.kind == "sqlite":
            st.q("PRAGMA secure_delete = ON")
        pending = self.__dict__.setdefault("_shred_pending", {})
        for k in range(0, len(blocks), _CHUNK):
            chunk = [b for b, _ in blocks[k:k + _CHUNK]]
            gone = {r[0] for r in st.q(
                f"SELECT block_id FROM block_keys WHERE stream = ? AND block_id IN "
                f"({','.join('?' * len(chunk))})", [stream] + chunk).fetchall()}
            if gone:
                st.q(f"DELETE FROM block_keys WHERE stream = ? AND block_id IN "
                     f"({','.join('?' * len(gone))})", [stream] + sorted(gone))
            for b in sorted(gone):
                st.audit(stream, "shred", {"block": b, "reason": reason})
            destroyed += sorted(gone)
        for b, loc in blocks:
            pending[(stream, b)] = loc
        return destroyed

    def _finish_shred(self) -> tuple[Optional[bool], int]:
        """After a commit that destroyed keys: wipes the database's copies of the deleted bytes
        and deletes the blocks' local files; returns (wiped, files removed), wiped None when
        nothing was destroyed."""
        pending = self.__dict__.pop("_shred_pending", {})
        if not pending:
            return None, 0
        st = self._store
        wiped = self._wipe()
        removed = 0
        for (stream, block_id), location in sorted(pending.items()):
            # Only what a committed transaction destroyed: no key row, retired in every context.
            if st.q("SELECT 1 FROM block_keys WHERE stream = ? AND block_id = ?",
                    (stream, block_id)).fetchone():
                continue
            if st.q("SELECT 1 FROM budgets WHERE stream = ? AND block_id = ? AND status = ?",
                    (stream, block_id, ACTIVE)).fetchone():
                continue
            try:
                removed += remove_block_files(location)
            except OSError as e:  # e.g. a reader's read-only mount: the key is gone already
                _log.warning("could not delete the files of retired block %s/%s at %s (%s); "
                             "'sage-tfx keys shred' deletes them later", stream, block_id,
                             location, e)
        return wiped, removed

    def _wipe(self) -> bool:
        """SQLite: checkpoint the WAL into the database and truncate it; PostgreSQL: VACUUM
        ``block_keys``. False if readers kept the WAL from being truncated (retried ~5 s)."""
        st = self._store
        if st.kind != "sqlite":
            st.conn.execute("VACUUM block_keys")
            return True
        st.conn.execute("PRAGMA busy_timeout = 500")  # a long reader must not stall this caller
        try:
            for _ in range(10):
                busy = st.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
                if not busy:
                    return True
                time.sleep(0.05)
            return False
        finally:
            st.conn.execute("PRAGMA busy_timeout = 120000")

    def shred_keys(self, stream: Optional[str] = None, *,
                   hold: Optional[float] = None) -> ShredReport:
        """Destroys the keys of every block retired everywhere that no grant holds any more,
        and deletes the local files of all such blocks (``sage-tfx keys shred``).

        Args:
          stream: one stream, or every stream.
          hold: seconds a released grant keeps its blocks' keys (default :func:`default_hold`).
        """
        self.authorize(access.CONFIGURE)
        hold = default_hold() if hold is None else check_hold(hold)
        shredded, held = [], []
        for name in [stream] if stream else [s.name for s in self.streams()]:
            done, kept = self._store.write(lambda n=name: self._shred_due(n, hold, sweep=True))
            shredded += [(name, b) for b in done]
            held += [(name, b) for b in kept]
        wiped, removed = self._finish_shred()
        return ShredReport(tuple(shredded), tuple(held), removed, wiped)

    # -- rotation --

    def rewrap_block_keys(self, kek: keys.KeyProvider, batch: int = 256
                          ) -> tuple[int, list[tuple[str, str]]]:
        """Re-wraps every key not wrapped by the KEK's current version; returns (re-wrapped,
        [(stream, block id) that did not open]). The old wrapped bytes are wiped as on a shred."""
        self.authorize(access.CONFIGURE)
        st = self._store
        target = kek.kek_id
        todo = st.q("SELECT stream, block_id FROM block_keys WHERE kek_id <> ? ORDER BY stream, "
                    "block_id", (target,)).fetchall()
        done, failed = 0, []
        for k in range(0, len(todo), batch):
            updates = []
            by_stream: dict[str, list[str]] = {}
            for s, b in todo[k:k + batch]:
                by_stream.setdefault(s, []).append(b)
            for s, ids in by_stream.items():
                for key in self._keys_of(s, ids):
                    try:
                        dk = key.unwrap(kek)
                    except InvalidRequestError:
                        failed.append((key.stream, key.block_id))
                        continue
                    updates.append((target, dk.wrap(kek, key.aad), key.stream, key.block_id,
                                    key.wrapped))

            def txn(updates=updates):
                if st.kind == "sqlite":
                    st.q("PRAGMA secure_delete = ON")
                n = 0
                for u in updates:  # unless a shred or another rotation changed the row meanwhile
                    n += st.q("UPDATE block_keys SET kek_id = ?, wrapped = ? WHERE stream = ? "
                              "AND block_id = ? AND wrapped = ?", u).rowcount
                if n:
                    st.audit(None, "rewrap_keys", {"count": n, "kek_id": target})
                return n

            done += st.write(txn) if updates else 0
        if done:
            self._wipe()
        return done, failed


def rotate_kek(ledger, kek: keys.KeyProvider, *, destroy: bool = True) -> dict:
    """``sage-tfx keys rotate``: a new KEK version, every live key re-wrapped, the old versions
    destroyed. Resumable: a run that stopped before the destruction is finished by the next one
    (which then re-wraps and destroys, without adding another version).

    Raises:
      InvalidRequestError: a key did not open (the old versions are then kept), or the provider
        does not rotate from here.
    """
    ledger.authorize(access.CONFIGURE)  # before the key provider changes
    resumed = kek.previous_versions() > 0
    if not resumed:
        kek.rotate()
    rewrapped, failed = ledger.rewrap_block_keys(kek)
    others = {name: fn(ledger, kek) for name, fn in sorted(_REWRAPPERS.items())}
    if not failed:  # once more, right before the destruction: a split that wrapped meanwhile
        more, failed = ledger.rewrap_block_keys(kek)
        rewrapped += more
    if failed:
        raise InvalidRequestError(
            f"{len(failed)} block key(s) do not open with KEK {kek.key_id}, e.g. {failed[:5]}: "
            "the previous KEK versions were kept (nothing is destroyed while a key needs them)")
    unhandled = {t: n for t, n in other_wrapped_keys(ledger).items() if t not in _REWRAPPERS}
    if destroy and unhandled:
        raise InvalidRequestError(
            f"{rewrapped} block key(s) were re-wrapped, but {unhandled} hold keys wrapped by "
            "this KEK that nothing here re-wraps: the previous versions were kept. Run again "
            "once those keys are gone (e.g. hot windows sealed), or register a rewrapper for "
            "them (blockkeys.register_rewrapper)")
    if destroy:
        kek.destroy_previous()
    return {"kek_id": kek.kek_id, "rewrapped": rewrapped, "resumed": resumed, "others": others,
            "destroyed": destroy}
