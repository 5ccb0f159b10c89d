"""Release once: a grant buys one release of each named output, recorded before it is published.

The ledger charges a run before any data is read (Sage §3.2), but a charge is only worth what it
pays for if the run's noisy output is released *once*: a retried pod, a restarted server or a
second process that reuses the grant and draws fresh noise publishes a second, independent
release — averaging the two cuts the noise. So every noise-drawing path records what it releases
against its grant and a release name (``"dp_transform/analyzers"``, ``"pyramid/seal/w3"``, ...)
*before* it publishes it:

* the bytes themselves when small (``value``: at most :data:`MAX_VALUE_BYTES`), or
* their SHA-256 digest and durable ``location`` (a directory tree, digested as a deterministic
  tar stream by :func:`tree_digest`).

A replay of the same run finds the record and returns the recorded release byte for byte
without drawing new noise (:func:`release_value_once`, :func:`release_tree_once`). Recording a
*different* release under a name that has one raises :class:`~sage_tfx.errors.ReleaseConflictError`
naming the first. Two processes that race both compute, but only the first record is ever
published: the loser discards its own output unpublished and returns the winner's.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
from typing import Callable, Iterator, Optional

from sage_tfx.errors import (GrantStateError, InvalidRequestError, MissingGrantError,
                             PermissionDeniedError, ReleaseConflictError)
from sage_tfx.ledger.values import RELEASED, now

MAX_VALUE_BYTES = 64 * 1024 * 1024
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/\-]{0,255}$")
_COLS = ("SELECT grant_id, name, stream, context, run_id, digest, size, location, value, "
         "principal, created_at FROM releases ")


@dataclasses.dataclass(frozen=True)
class Release:
    """One recorded release of a grant: its digest and its bytes (``value``) or ``location``."""

    grant_id: str
    name: str
    stream: str
    context: str
    run_id: str
    digest: str
    size: int
    location: Optional[str]
    value: Optional[bytes]
    principal: str
    created_at: str


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a release-once call published: the release, its bytes, and whether it was replayed."""

    release: Release
    value: Optional[bytes]
    replayed: bool


def check_release_name(name) -> str:
    """Returns ``name`` if it is 1-256 characters of letters, digits, '_', '.', ':', '/', '-'."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidRequestError(
            "a release name must be 1-256 characters of letters, digits, '_', '.', ':', '/' or "
            f"'-' starting with a letter or digit, got {name!r}")
    return name


def digest_bytes(data: bytes) -> str:
    """SHA-256 hex digest of ``data`` (a release's digest)."""
    return hashlib.sha256(data).hexdigest()


def _release(row) -> Release:
    value = bytes(row[8]) if row[8] is not None else None
    return Release(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], value,
                   row[9], row[10])


class ReleaseMixin:
    """The release records of :class:`~sage_tfx.ledger.core.Ledger` (needs ``self._store``)."""

    def record_release(self, grant_id: str, name: str, *, value: Optional[bytes] = None,
                       digest: Optional[str] = None, location: Optional[str] = None) -> Release:
        """Records the release ``name`` of a released grant, or returns the identical record.

        Give ``value`` (the bytes, at most 64 MiB) or ``digest`` and ``location``.

        Raises:
          InvalidRequestError: bad name or arguments, or an unknown grant.
          GrantStateError: the grant is not released (a reservation or cancelled).
          ReleaseConflictError: a different release is recorded under this grant and name.
          PermissionDeniedError: the caller may not charge the grant's (stream, context), or is
            not the principal that made the grant (nor an admin).
        """
        from sage_tfx.ledger import access
        check_release_name(name)
        if value is not None:
            if not isinstance(value, (bytes, bytearray)) or digest is not None or location:
                raise InvalidRequestError("give value (bytes) or digest and location, not both")
            if len(value) > MAX_VALUE_BYTES:
                raise InvalidRequestError(
                    f"a value release holds at most {MAX_VALUE_BYTES} bytes, got {len(value)}: "
                    "record a digest and a durable location instead")
            value = bytes(value)
            digest, size = digest_bytes(value), len(value)
        else:
            if not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
                raise InvalidRequestError(f"digest must be a SHA-256 hex digest, got {digest!r}")
            if not isinstance(location, str) or not location:
                raise InvalidRequestError("a release without a value needs its durable location")
            size = -1
        st = self._store

        def txn() -> Release:
            g = st.q("SELECT stream, context, run_id, status, principal FROM grants WHERE "
                     "grant_id = ?", (grant_id,)).fetchone()
            if g is None:
                raise InvalidRequestError(f"unknown grant {grant_id!r}")
            self.authorize(access.CHARGE, stream=g[0], context=g[1])
            if g[4] not in (None, st.principal) and not self.principal.has(access.ADMIN):
                raise PermissionDeniedError(
                    f"grant {grant_id} was made by principal {g[4]!r}: only it (or an admin) "
                    f"records its releases, not {st.principal!r}")
            if g[3] != RELEASED:
                raise GrantStateError(f"grant {grant_id} is {g[3]}: only a released grant's "
                                      "output can be released")
            row = st.q(_COLS + "WHERE grant_id = ? AND name = ?", (grant_id, name)).fetchone()
            if row is not None:
                first = _release(row)
                if first.digest != digest:
                    raise ReleaseConflictError(
                        f"grant {grant_id} already released {name!r} (sha256 {first.digest[:16]}…, "
                        f"{first.created_at}, by {first.principal}): one charge buys one "
                        "release; a replay returns that one, a new release needs a new grant")
                return first
            ts = now()
            st.q("INSERT INTO releases (grant_id, name, stream, context, run_id, digest, size, "
                 "location, value, principal, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                 (grant_id, name, g[0], g[1], g[2], digest, size, location, value,
                  st.principal, ts))
            st.audit(g[0], "record_release", {"grant_id": grant_id, "name": name,
                                              "digest": digest, "size": size,
                                              "location": location})
            return Release(grant_id, name, g[0], g[1], g[2], digest, size, location, value,
                           st.principal, ts)

        return st.write(txn)

    def recorded_release(self, grant_id: str, name: str) -> Optional[Release]:
        """The release recorded under ``grant_id`` and ``name``, or None.

        Raises:
          PermissionDeniedError: the caller may not read the grant's (stream, context).
        """
        row = self._store.read(lambda: self._store.q(
            _COLS + "WHERE grant_id = ? AND name = ?", (grant_id, name)).fetchone())
        if row is None:
            return None
        rec = _release(row)
        self._authorize_read(rec)
        return rec

    def releases(self, grant_id: str) -> list[Release]:
        """Every release recorded under a grant, oldest first."""
        rows = self._store.read(lambda: self._store.q(
            _COLS + "WHERE grant_id = ? ORDER BY created_at, name", (grant_id,)).fetchall())
        out = [_release(r) for r in rows]
        for rec in out[:1]:  # one grant: one (stream, context)
            self._authorize_read(rec)
        return out

    def _authorize_read(self, rec: Release) -> None:
        from sage_tfx.ledger import access
        self.authorize(access.READ, stream=rec.stream, context=rec.context)


def release_value_once(ledger, grant_id: str, name: str,
                       produce: Callable[[], bytes]) -> Outcome:
    """The bytes released under (grant, name): recorded ones, or ``produce()``'s, recorded first.

    ``produce`` (which draws the noise) is called only when nothing is recorded yet. If another
    process recorded first meanwhile, its release is returned and ours is never published.
    """
    check_release_name(name)
    first = ledger.recorded_release(grant_id, name)
    if first is not None:
        return Outcome(first, _value_of(first), True)
    value = produce()
    if not isinstance(value, (bytes, bytearray)):
        raise InvalidRequestError(f"the release {name!r} must be produced as bytes, got "
                                  f"{type(value).__name__}")
    try:
        rec = ledger.record_release(grant_id, name, value=bytes(value))
    except ReleaseConflictError:  # another process published first: ours is discarded
        rec = ledger.recorded_release(grant_id, name)
        return Outcome(rec, _value_of(rec), True)
    return Outcome(rec, rec.value, False)


def _value_of(rec: Release) -> bytes:
    if rec.value is None:
        raise MissingGrantError(f"release {rec.name!r} of grant {rec.grant_id} was recorded as "
                                f"files at {rec.location}, not as a value")
    if digest_bytes(rec.value) != rec.digest:
        raise MissingGrantError(f"the recorded release {rec.name!r} of grant {rec.grant_id} does "
                                "not match its digest: the ledger's copy was altered")
    return rec.value


# -- plan parts: one spender each --

PART_CLAIM_PREFIX = "part/"
WHOLE_GRANT = "grant"  # the one "part" of a grant charged without a privacy plan


def part_release_name(part: str, output: str) -> str:
    """The release name of ``output`` spent from plan part ``part``: ``"<part>/<output>"``.

    Releases are keyed by the plan part they spend, not by the component that spends it
    (``"train/model"``, ``"transform/transform_graph"``, ``"validate/validation"``), so two
    components under one part meet on one name as well as on the part's claim.
    """
    return check_release_name(f"{part}/{output}")


def _claim_value(part: str, spender: str) -> bytes:
    return json.dumps({"part": part, "spender": spender}, sort_keys=True,
                      separators=(",", ":")).encode("ascii")


def _claimed_by(rec: Release) -> Optional[str]:
    try:
        spender = json.loads(_value_of(rec)).get("spender")
    except (ValueError, AttributeError, MissingGrantError):
        return None
    return spender if isinstance(spender, str) else None


def _part_conflict(grant_id: str, part: str, spender: str, rec: Release) -> ReleaseConflictError:
    first = _claimed_by(rec) or "another spender"
    return ReleaseConflictError(
        f"plan part {part!r} of grant {grant_id} is spent by {first} "
        f"(claimed {rec.created_at} by principal {rec.principal}): {spender} may not spend it "
        "again. One charge pays for one spender per plan part; give the second stage a part of "
        "its own in the privacy plan, or a grant of its own")


def check_part_claim(ledger, grant_id: str, part: str, spender: str) -> None:
    """Raises ReleaseConflictError if another spender claimed ``part`` of the grant (read only).

    Call it before reading any data; :func:`claim_part` is what records the claim.
    """
    rec = ledger.recorded_release(grant_id, check_release_name(PART_CLAIM_PREFIX + part))
    if rec is not None and _claimed_by(rec) != spender:
        raise _part_conflict(grant_id, part, spender, rec)


def claim_part(ledger, grant_id: str, part: str, spender: str) -> Release:
    """Records that ``spender`` (a component type, e.g. ``"DPTrainer"``) spends plan part ``part``
    of the grant, before its first release under that part; the claim of the same spender
    is returned again.

    The claim is a release record (``"part/<part>"``), so the first writer wins across
    processes and machines: a second spender of any kind fails here, before it publishes.

    Raises:
      ReleaseConflictError: another spender claimed the part.
    """
    name = check_release_name(PART_CLAIM_PREFIX + part)
    value = _claim_value(part, spender)
    try:  # the same spender's claim has the same bytes: record_release returns it
        return ledger.record_release(grant_id, name, value=value)
    except ReleaseConflictError:
        raise _part_conflict(grant_id, part, spender,
                             ledger.recorded_release(grant_id, name)) from None


# -- directory trees --

def _tree_members(root: str) -> Iterator[tuple[str, str]]:
    """(path, archive name) of every file and directory under ``root``, in a fixed order."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        for name in sorted(dirnames) + sorted(filenames):
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                raise InvalidRequestError(f"a released tree may not hold links: {path}")
            yield path, os.path.normpath(os.path.join(rel, name))


def _write_tree(root: str, fileobj) -> None:
    """A deterministic tar stream of ``root``: sorted names, no times, owners or modes."""
    with tarfile.open(fileobj=fileobj, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path, arcname in _tree_members(root):
            info = tarfile.TarInfo(arcname)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if os.path.isdir(path):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = os.path.getsize(path), 0o644
                with open(path, "rb") as f:
                    tar.addfile(info, f)


class _Hasher(io.RawIOBase):
    def __init__(self):
        self.h = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.h.update(b)
        return len(b)


def tree_digest(root: str) -> str:
    """SHA-256 of the deterministic tar stream of a directory tree (names and contents)."""
    hasher = _Hasher()
    _write_tree(root, hasher)
    return hasher.h.hexdigest()


def tree_bytes(root: str) -> bytes:
    """The deterministic tar stream of a directory tree (what :func:`tree_digest` hashes)."""
    buf = io.BytesIO()
    _write_tree(root, buf)
    return buf.getvalue()


def _clear(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def materialize(rec: Release, out_dir: str) -> None:
    """Writes a recorded tree release into ``out_dir`` (replacing it), verified by its digest.

    Raises:
      MissingGrantError: the recorded bytes or location no longer match the digest, or the
        location is gone: the release cannot be reproduced, and it is never re-drawn.
    """
    if rec.value is not None:
        data = _value_of(rec)
        _clear(out_dir)
        _extract(data, out_dir)
        return
    src = os.path.abspath(rec.location)
    if os.path.abspath(out_dir) == src:
        if not os.path.isdir(src):
            _finish_rename(rec, src)
        if not os.path.isdir(src) or tree_digest(src) != rec.digest:
            raise MissingGrantError(
                f"release {rec.name!r} of grant {rec.grant_id} was recorded at {rec.location}, "
                "which is gone or altered: it cannot be released again, and it is never re-drawn")
        return
    if not os.path.isdir(src):
        _finish_rename(rec, src)
    _clear(out_dir)
    if os.path.isdir(src):  # copy first, then check the copy: the source may change meanwhile
        shutil.copytree(src, out_dir, symlinks=True)
    if not os.path.isdir(out_dir) or tree_digest(out_dir) != rec.digest:
        _clear(out_dir)
        raise MissingGrantError(
            f"release {rec.name!r} of grant {rec.grant_id} was recorded at {rec.location}, which "
            "is gone or altered: it cannot be released again, and it is never re-drawn")


def _extract(data: bytes, out_dir: str) -> None:
    """Writes a recorded tree into a new directory ``out_dir``.

    Only what :func:`_write_tree` makes is accepted — regular files and directories under
    normalized relative names — and every file is created new without following links, so
    recorded bytes (which the ledger's database holds, not this process) cannot write outside
    ``out_dir`` or through a link, whatever tarfile's own filters would let through.
    """
    root = os.path.realpath(out_dir)
    os.makedirs(root)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            name = os.path.normpath(member.name)
            parts = name.split(os.sep)
            if (os.path.isabs(member.name) or name in (".", "") or ".." in parts
                    or not (member.isreg() or member.isdir())):
                raise MissingGrantError(
                    f"the recorded tree holds {member.name!r} ({member.type!r}): a released tree "
                    "holds only files and directories under relative names; refusing it")
            path = os.path.join(root, name)
            parent = os.path.dirname(path)
            if os.path.realpath(parent) != parent:  # a directory made by a link: refuse
                raise MissingGrantError(f"the recorded tree's {member.name!r} leaves its root")
            if member.isdir():
                os.makedirs(path, exist_ok=True)
                continue
            os.makedirs(parent, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f, tar.extractfile(member) as src:
                shutil.copyfileobj(src, f)


def _staging_prefix(location: str) -> str:
    return os.path.join(os.path.dirname(location), f".sage-release-{os.path.basename(location)}-")


def _finish_rename(rec: Release, location: str) -> None:
    """A large release is recorded before its staging directory is renamed to ``location``; a
    process that stopped in between left the staging directory: finish the rename (if the
    staging tree is the recorded one)."""
    parent, prefix = os.path.dirname(location), os.path.basename(_staging_prefix(location))
    if not os.path.isdir(parent):
        return
    for name in sorted(os.listdir(parent)):
        staging = os.path.join(parent, name)
        if name.startswith(prefix) and os.path.isdir(staging) and \
                tree_digest(staging) == rec.digest:
            os.replace(staging, location)
            return


def release_tree_once(ledger, grant_id: str, name: str, out_dir: str,
                      produce_into: Callable[[str], None], *,
                      max_inline: int = MAX_VALUE_BYTES) -> Outcome:
    """A directory output (a model, a transform graph) released once under (grant, name).

    Replays materialize the recorded tree into ``out_dir``. Otherwise ``produce_into(staging)``
    writes the output into a fresh directory beside ``out_dir``; a tree of at most
    ``max_inline`` bytes is recorded as its bytes (reproducible anywhere), a larger one by digest
    with ``out_dir`` as its durable location. ``out_dir`` is filled only after the record.
    """
    check_release_name(name)
    first = ledger.recorded_release(grant_id, name)
    if first is not None:
        materialize(first, out_dir)
        return Outcome(first, None, True)
    out_dir = os.path.abspath(out_dir)
    os.makedirs(os.path.dirname(out_dir), exist_ok=True)
    # The staging directory sits beside out_dir, named after it, so a process that stopped
    # between recording a large release and renaming it can be finished (_finish_rename).
    staging = tempfile.mkdtemp(prefix=os.path.basename(_staging_prefix(out_dir)),
                               dir=os.path.dirname(out_dir))
    recorded = False
    try:
        produce_into(staging)
        digest = tree_digest(staging)
        inline = None
        if max_inline > 0:
            inline = tree_bytes(staging)
            if len(inline) > max_inline:
                inline = None
        try:
            # Recorded first, published (moved into out_dir) only after: nothing unrecorded
            # is ever left where an output is read, whatever fails in between.
            rec = (ledger.record_release(grant_id, name, value=inline) if inline is not None
                   else ledger.record_release(grant_id, name, digest=digest, location=out_dir))
            recorded = True
        except ReleaseConflictError:  # another process published first: ours is discarded
            rec = ledger.recorded_release(grant_id, name)
            shutil.rmtree(staging)
            staging = None
            materialize(rec, out_dir)
            return Outcome(rec, None, True)
        _clear(out_dir)
        os.replace(staging, out_dir)
        staging = None
        return Outcome(rec, None, False)
    finally:
        # An unrecorded draw is deleted; a recorded one whose move was interrupted stays, for
        # the replay to finish (_finish_rename).
        if staging is not None and not recorded and os.path.isdir(staging):
            shutil.rmtree(staging)
