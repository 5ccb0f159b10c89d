"""``sage-tfx keys migrate``: encrypt the blocks of a ledger written before block encryption.

For every block of every stream (or of one), in block order, under the ledger lease
``sage/keys/migrate`` (two migrations never race):

* **active** in some context and registered without a key, with plaintext files
  ``part-*.tfrecord.gz``: a new data key encrypts every file byte for byte into
  ``part-*.tfrecord.gz.tink`` (written under a temporary name, fsynced, renamed); then its
  wrapped key is registered (one ledger transaction); then each encrypted file is checked to
  decrypt to its plaintext, and the plaintext is deleted. A reader finds the plaintext while the
  block has no key and the ciphertext once it has one: a block is never without a readable form;
* **active with a key and plaintext left over** (a crash after the registration): the check and
  the deletion are finished;
* **retired in every context**: its plaintext is deleted by :meth:`Ledger.shred_keys`, under the
  same hold as a key (a grant that exhausted the block still reads it).

Idempotent and resumable: after a crash anywhere, the next run finishes the job (an encryption
that was cut short left temporary or unregistered files, which are written again under a new
key). Blocks stored at a URI (``gs://...``) or without plaintext files are reported, not touched.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import sys
from typing import Optional

from sage_tfx.errors import SageError
from sage_tfx.ledger import access, keys
from sage_tfx.ledger.blockkeys import ShredReport
from sage_tfx.streams import blockfiles
from sage_tfx.streams.blocks import block_files_glob

LEASE = "sage/keys/migrate"


class MigrationError(SageError, RuntimeError):
    """A block's encrypted files do not decrypt to its plaintext: the plaintext was kept."""


@dataclasses.dataclass(frozen=True)
class MigrationReport:
    """What a migration did.

    Attributes:
      encrypted: (stream, block id) encrypted and registered by this run.
      finished: (stream, block id) whose leftover plaintext this run deleted (after a crash).
      skipped: (stream, block id, why) left alone (remote storage, no plaintext files).
      shred: the deletion of retired blocks' plaintext (and keys), with the blocks still held.
    """

    encrypted: tuple[tuple[str, str], ...]
    finished: tuple[tuple[str, str], ...]
    skipped: tuple[tuple[str, str, str], ...]
    shred: ShredReport


def _digest(f, size: int = 1 << 20) -> str:
    h = hashlib.sha256()
    while True:
        chunk = f.read(size)
        if not chunk:
            return h.hexdigest()
        h.update(chunk)


def _check_and_remove(stream: str, block_id: str, plain: list[str], dk: keys.DataKey) -> None:
    """Deletes each plaintext file once its encrypted form decrypts to the same bytes."""
    for path in plain:
        enc = blockfiles.encrypted_name(path)
        try:
            with open(enc, "rb") as f, dk.decrypting(f, blockfiles.file_aad(
                    stream, block_id, enc)) as d:
                got = _digest(d)
        except Exception as e:  # missing file, or it does not decrypt under the registered key
            raise MigrationError(f"{enc} does not decrypt with block {block_id}'s registered key "
                                 f"({e}); its plaintext {path} was kept") from e
        with open(path, "rb") as f:
            want = _digest(f)
        if got != want:
            raise MigrationError(f"{enc} does not decrypt to {path}; the plaintext was kept")
        os.remove(path)


def _log(verbose: bool, message: str) -> None:
    if verbose:
        print(f"[sage-tfx keys migrate] {message}", file=sys.stderr, flush=True)


def migrate_ledger(ledger, *, stream: Optional[str] = None, key_provider: Optional[str] = None,
                   hold: Optional[float] = None, verbose: bool = True) -> MigrationReport:
    """Encrypts every active plaintext block and deletes retired blocks' plaintext.

    Args:
      ledger: an open ledger; the caller must be an admin.
      stream: one stream, or every stream.
      key_provider: the KEK's spec (default ``$SAGE_KEY_PROVIDER`` or the local key file).
      hold: the key hold of :meth:`Ledger.shred_keys` for retired blocks.
      verbose: progress on stderr (a line per 100 blocks encrypted; the summary is the
        returned report).

    Raises:
      MigrationError: an encrypted file does not decrypt to its plaintext (kept).
      PermissionDeniedError: the caller is not an admin.
    """
    ledger.authorize(access.CONFIGURE)  # before the key file is opened (or created)
    kek = keys.provider(key_provider)
    encrypted, finished, skipped = [], [], []
    names = [stream] if stream else [s.name for s in ledger.streams()]
    with ledger.lease(LEASE, ttl=300, wait=600) as lease:
        for name in names:
            s = ledger.stream(name)
            keyed = {k.block_id: k for k in ledger.block_keys(name)}
            states = [ledger.blocks(name, c) for c in s.contexts]
            for per_context in zip(*states):
                b = per_context[0]
                if not any(x.active for x in per_context):
                    continue  # retired everywhere: shred_keys below deletes its data
                if "://" in b.location:
                    skipped.append((name, b.block_id, "stored at a URI"))
                    continue
                plain = sorted(glob.glob(block_files_glob(b.location)))
                if b.block_id in keyed:
                    if plain:
                        _check_and_remove(name, b.block_id, plain,
                                          keyed[b.block_id].unwrap(kek))
                        finished.append((name, b.block_id))
                    continue
                if not plain:
                    skipped.append((name, b.block_id, "no plaintext block files"))
                    continue
                dk, kek_id, wrapped = blockfiles.new_block_key(kek, name, b.block_id)
                for path in plain:
                    enc = blockfiles.encrypted_name(path)
                    blockfiles.encrypt_file(path, enc, dk,
                                            blockfiles.file_aad(name, b.block_id, enc))
                ledger.add_block_key(name, b.block_id, kek_id=kek_id, wrapped=wrapped)
                _check_and_remove(name, b.block_id, plain, dk)
                encrypted.append((name, b.block_id))
                lease.renew()
                if len(encrypted) % 100 == 0:
                    _log(verbose, f"encrypted {len(encrypted)} blocks")
    shred = ledger.shred_keys(stream, hold=hold)
    return MigrationReport(tuple(encrypted), tuple(finished), tuple(skipped), shred)
