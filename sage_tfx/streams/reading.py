"""Reading granted blocks back: through a grant only, and only the grant's blocks.

Block files are encrypted, each block with its own data key (:mod:`sage_tfx.streams.blockfiles`).
The ledger hands out the wrapped keys of a *released* grant's blocks to a caller allowed to
charge the grant (:meth:`sage_tfx.ledger.Ledger.grant_keys`); this process unwraps them with its
key-encryption key (``$SAGE_KEY_PROVIDER``) and decrypts those blocks' files, nothing else:

* :func:`granted_files` — every data file of a grant's blocks with what decrypting it takes:
  the *wrapped* key and the KEK's provider spec, never a key in the clear, so the list can be
  handed to Beam workers, which unwrap on their side (:func:`read_granted_file`);
* :func:`read_float_feature` — the values of one feature, for in-process consumers of a grant
  (a DP statistic, a notebook). TFX pipelines read blocks with ``BlockExampleGen``.

A block registered before encryption (plaintext ``part-*.tfrecord.gz``, no key) is still read,
with a warning: ``sage-tfx keys migrate`` encrypts it. A block whose key was destroyed (retired)
is unreadable: its files are noise. TensorFlow is imported when a function that parses runs,
never at import time.
"""
from __future__ import annotations

import dataclasses
import functools
import glob as globlib
import logging
from typing import BinaryIO, Callable, Iterator, Optional

import numpy as np

from sage_tfx.errors import MissingGrantError, RetiredBlockError
from sage_tfx.ledger import keys
from sage_tfx.ledger.blockkeys import WrappedKey
from sage_tfx.ledger.values import RELEASED
from sage_tfx.streams import blockfiles
from sage_tfx.streams.blocks import block_files_glob, encrypted_files_glob

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class GrantedFile:
    """One data file of a granted block and what decrypting it takes (nothing in the clear).

    Attributes:
      path: the file.
      stream, block_id: its block (the associated data of its key and of the file).
      wrapped_key: the block's data key wrapped by the KEK; None for a plaintext block.
      key_provider: the KEK's provider spec (:func:`sage_tfx.ledger.keys.provider`).
    """

    path: str
    stream: str
    block_id: str
    wrapped_key: Optional[bytes] = dataclasses.field(default=None, repr=False)
    key_provider: Optional[str] = None


def granted_files(ledger, grant, *, key_provider: Optional[str] = None,
                  glob: Callable[[str], list] = globlib.glob) -> list[GrantedFile]:
    """The data files of a released grant's blocks, in grant order, with their wrapped keys.

    Args:
      ledger: the ledger that issued the grant (the caller must be allowed to charge it).
      grant: the ledger's record of the grant (its locations are the ones read).
      key_provider: the KEK's spec (default ``$SAGE_KEY_PROVIDER`` or the local key file).
      glob: lists a pattern's files (``tfx.dsl.io.fileio.glob`` for remote storage).

    Raises:
      MissingGrantError: the grant is not released.
      RetiredBlockError: a granted block's key was destroyed (it retired since).
      FileNotFoundError: a granted block with records has no data file.
      PermissionDeniedError: the caller may not charge the grant's (stream, context).
    """
    if grant.status != RELEASED:
        raise MissingGrantError(f"grant {grant.grant_id} is {grant.status}: its blocks' data "
                                "was not released")
    wrapped = ledger.grant_keys(grant.grant_id)
    spec = key_provider or keys.default_spec()
    files: list[GrantedFile] = []
    empty = []
    for block in grant.blocks:
        key = wrapped.get(block.block_id)
        if key is not None:
            found = sorted(glob(encrypted_files_glob(block.location)))
            files += [GrantedFile(p, grant.stream, block.block_id, key.wrapped, spec)
                      for p in found]
        else:  # plaintext first: a block being migrated has both until its key is registered
            found = sorted(glob(block_files_glob(block.location)))
            if not found and glob(encrypted_files_glob(block.location)):
                raise RetiredBlockError(
                    f"block {block.block_id} of stream {grant.stream} has no data key any more: "
                    "it retired and its key was destroyed, so its data is unreadable")
            if found:
                _log.warning("block %s of stream %s is not encrypted (registered without a "
                             "data key): run 'sage-tfx keys migrate'", block.block_id,
                             grant.stream)
            files += [GrantedFile(p, grant.stream, block.block_id) for p in found]
        empty += [] if found else [block]
    if empty:
        states = {b.block_id: b for b in ledger.blocks(grant.stream, grant.context)}
        for b in empty:
            state = states.get(b.block_id)
            if state is not None and state.records == 0:
                continue
            if state is not None and not state.active:
                raise RetiredBlockError(
                    f"granted block {b.block_id} of stream {grant.stream} retired since the "
                    "grant: its key and data files were destroyed")
            raise FileNotFoundError(
                f"granted block {b.block_id} of stream {grant.stream} has no data files "
                f"{encrypted_files_glob(b.location)}")
    return files


@functools.lru_cache(maxsize=16)
def _provider(spec: str) -> keys.KeyProvider:
    return keys.provider(spec, create=False)


@functools.lru_cache(maxsize=1024)
def _data_key(spec: str, stream: str, block_id: str, wrapped: bytes) -> keys.DataKey:
    return WrappedKey(stream, block_id, "", wrapped).unwrap(_provider(spec))


def read_granted_file(f: GrantedFile,
                      opener: Optional[Callable[[str], BinaryIO]] = None) -> Iterator[bytes]:
    """The serialized records of one granted file, decrypted here (a Beam worker: the key is
    unwrapped with this process's KEK, once per block).

    Raises:
      CorruptBlockFileError: the file does not decrypt (altered, truncated, moved).
      InvalidRequestError: the KEK does not open the block's key.
    """
    kwargs = {"opener": opener} if opener is not None else {}
    if f.wrapped_key is None:
        yield from blockfiles.read_block_file(f.path, None, **kwargs)
        return
    dk = _data_key(f.key_provider or keys.default_spec(), f.stream, f.block_id, f.wrapped_key)
    yield from blockfiles.read_block_file(
        f.path, dk, blockfiles.file_aad(f.stream, f.block_id, f.path), **kwargs)


def read_float_feature(ledger, grant, name: Optional[str] = None) -> np.ndarray:
    """Every value of the float (or int) feature ``name`` in a released grant's blocks; absent
    values are skipped.

    Raises:
      TypeError: called the old way, with block locations (blocks are read through a grant).
      MissingGrantError, RetiredBlockError, FileNotFoundError: see :func:`granted_files`.
    """
    if name is None or not hasattr(ledger, "grant_keys"):
        raise TypeError("read_float_feature(ledger, grant, name): blocks are encrypted and read "
                        "through a released grant, not from their locations")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    spec = {name: tf.io.VarLenFeature(tf.float32)}
    out, batch = [], []
    for f in granted_files(ledger, grant):
        for record in read_granted_file(f):
            batch.append(record)
            if len(batch) == 4096:
                out.append(tf.io.parse_example(tf.constant(batch), spec)[name].values.numpy())
                batch = []
    if batch:
        out.append(tf.io.parse_example(tf.constant(batch), spec)[name].values.numpy())
    return np.concatenate(out).astype(np.float64) if out else np.zeros(0)
