"""Block data files: gzip TFRecords of ``tf.train.Example``, encrypted with the block's data key.

A block file's plaintext is exactly a gzip TFRecord file (TensorFlow's framing: the length, the
masked CRC-32C of the length, the data, the masked CRC-32C of the data), so a decrypted block
file is what TensorFlow's TFRecord reader reads. On disk that plaintext lies under Tink's
streaming AEAD (``AES256_GCM_HKDF_1MB``, :mod:`sage_tfx.ledger.keys` says why Tink) with the
block's own data key and the associated data ``"<stream>/<block_id>/<file name>"``: a file
renamed, moved to another block, truncated or altered does not decrypt. Compression comes
before encryption (ciphertext does not compress). The data key itself is stored only wrapped by
the key-encryption key, in the ledger's ``block_keys`` (associated data ``"<stream>/<block_id>"``),
and handed out through grants (:mod:`sage_tfx.streams.reading`).

Without the key a block file is indistinguishable from random bytes: neither gzip nor
TensorFlow's TFRecord reader reads a record from it, and no field value appears in it.

Pure Python (zlib, google-crc32c, Tink), no TensorFlow: the splitter's Beam workers write with
:func:`write_block_file`, readers use :func:`read_block_file`, ``sage-tfx keys migrate`` uses
:func:`encrypt_file`.
"""
from __future__ import annotations

import gzip
import os
import struct
import uuid
from typing import BinaryIO, Callable, Iterable, Iterator, Optional

from sage_tfx.errors import SageError
from sage_tfx.ledger import keys
from sage_tfx.streams.blocks import ENCRYPTED_SUFFIX

# zlib's default level, as TensorFlow's TFRecordWriter (Python's gzip defaults to a slow 9).
COMPRESSION_LEVEL = 6
_CHUNK = 1 << 20
_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8


class CorruptBlockFileError(SageError, ValueError):
    """A block file's TFRecord framing is broken (a truncated or corrupted plaintext file)."""


def _open_binary(path: str) -> BinaryIO:
    return open(path, "rb")


def _crc32c(data: bytes) -> int:
    import google_crc32c  # C implementation; imported on first use
    return google_crc32c.value(data)


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    crc = _crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One record in TFRecord framing."""
    length = struct.pack("<Q", len(record))
    return length + _CRC.pack(masked_crc(length)) + record + _CRC.pack(masked_crc(record))


def key_aad(stream: str, block_id: str) -> bytes:
    """Associated data of a block's wrapped data key."""
    return keys.aad_for(stream, block_id)


def file_aad(stream: str, block_id: str, name: str) -> bytes:
    """Associated data of one encrypted file of a block (its base name)."""
    return keys.aad_for(stream, block_id, os.path.basename(name))


def encrypted_name(plain_name: str) -> str:
    """The encrypted file's name for a plaintext block file name."""
    return plain_name + ENCRYPTED_SUFFIX


def new_block_key(kek: keys.KeyProvider, stream: str, block_id: str
                  ) -> tuple[keys.DataKey, str, bytes]:
    """A fresh data key for a block: (the key, the KEK id, the key wrapped by the KEK)."""
    dk = keys.DataKey.new()
    kek_id = kek.kek_id  # read before wrapping: a rotation in between leaves a stale id, not a
    return dk, kek_id, dk.wrap(kek, key_aad(stream, block_id))  # key under an unrecorded KEK


def _tmp_name(path: str) -> str:
    return f"{path}.{uuid.uuid4().hex[:12]}.tmp"


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Sink:
    """A binary file the Tink stream may close: the bytes are flushed (and fsynced) first."""

    def __init__(self, f: BinaryIO, sync: bool):
        self._f, self._sync = f, sync

    def write(self, data) -> int:
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            if self._sync:
                os.fsync(self._f.fileno())
            self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def writable(self) -> bool:
        return True


def _encrypted_writer(path: str, dk: keys.DataKey, aad: bytes, sync: bool):
    return dk.encrypting(_Sink(open(path, "wb"), sync), aad)


def write_block_file(path: str, records: Iterable[bytes], dk: keys.DataKey, aad: bytes, *,
                     sync: bool = False) -> int:
    """Writes records as an encrypted gzip TFRecord file; returns how many.

    Writes a temporary file of its own (``<path>.<random>.tmp``) and renames it, so the file is
    complete or absent and two attempts at one block (a retried Beam bundle) never write into
    each other. ``sync`` fsyncs the file and its directory before returning.
    """
    tmp = _tmp_name(path)
    n = 0
    with _encrypted_writer(tmp, dk, aad, sync) as enc:
        with gzip.GzipFile(filename="", fileobj=enc, mode="wb", compresslevel=COMPRESSION_LEVEL,
                           mtime=0) as gz:
            buf = []
            size = 0
            for record in records:
                buf.append(frame(record))
                size += len(record) + 16
                n += 1
                if size >= _CHUNK:
                    gz.write(b"".join(buf))
                    buf, size = [], 0
            gz.write(b"".join(buf))
    os.replace(tmp, path)
    if sync:
        _fsync_dir(path)
    return n


def encrypt_file(src: str, dst: str, dk: keys.DataKey, aad: bytes) -> None:
    """Encrypts a plaintext block file byte for byte into ``dst`` (fsynced, complete or absent)."""
    tmp = _tmp_name(dst)
    with open(src, "rb") as f, _encrypted_writer(tmp, dk, aad, True) as enc:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            enc.write(chunk)
    os.replace(tmp, dst)
    _fsync_dir(dst)


def iter_tfrecords(stream: BinaryIO, *, check_crc: bool = True) -> Iterator[bytes]:
    """The records of an (uncompressed) TFRecord byte stream.

    ``check_crc=False`` skips TFRecord's CRCs where the bytes are already authenticated (an
    AEAD-decrypted stream: every 1 MB segment is checked before a byte of it is returned).

    Raises:
      CorruptBlockFileError: truncated framing or a CRC mismatch.
    """
    buf, pos = b"", 0
    while True:
        if len(buf) - pos < _HEADER.size:
            buf, pos = _refill(stream, buf, pos, _HEADER.size)
            if len(buf) == 0:
                return
            if len(buf) < _HEADER.size:
                raise CorruptBlockFileError("truncated TFRecord header")
        length, length_crc = _HEADER.unpack_from(buf, pos)
        if check_crc and masked_crc(buf[pos:pos + 8]) != length_crc:
            raise CorruptBlockFileError("TFRecord length CRC mismatch")
        need = _HEADER.size + length + 4
        if len(buf) - pos < need:
            buf, pos = _refill(stream, buf, pos, need)
            if len(buf) < need:
                raise CorruptBlockFileError("truncated TFRecord")
        start = pos + _HEADER.size
        record = buf[start:start + length]
        if check_crc and masked_crc(record) != _CRC.unpack_from(buf, start + length)[0]:
            raise CorruptBlockFileError("TFRecord data CRC mismatch")
        pos += need
        yield record


def _refill(stream: BinaryIO, buf: bytes, pos: int, need: int) -> tuple[bytes, int]:
    """``buf[pos:]`` extended from ``stream`` to at least ``need`` bytes (fewer at its end)."""
    parts = [buf[pos:]]
    have = len(parts[0])
    while have < need:
        chunk = stream.read(max(_CHUNK, need - have))
        if not chunk:
            break
        parts.append(chunk)
        have += len(chunk)
    return b"".join(parts), 0


def read_block_file(path: str, dk: Optional[keys.DataKey], aad: bytes = b"", *,
                    opener: Callable[[str], BinaryIO] = _open_binary) -> Iterator[bytes]:
    """The records of one block file: encrypted with ``dk`` (and ``aad``), or plaintext if
    ``dk`` is None (the layout before encryption; CRCs checked). ``opener`` opens the path for
    reading (e.g. ``tf.io.gfile.GFile`` for remote storage).

    Raises:
      CorruptBlockFileError: the file does not decrypt under this key and associated data
        (altered, truncated, renamed or another block's), or its framing is broken.
    """
    import tink

    with opener(path) as f:
        if dk is None:
            with gzip.GzipFile(fileobj=f, mode="rb") as gz:
                yield from iter_tfrecords(gz, check_crc=True)
            return
        try:
            with dk.decrypting(f, aad) as plain, gzip.GzipFile(fileobj=plain, mode="rb") as gz:
                yield from iter_tfrecords(gz, check_crc=False)
        except tink.TinkError as e:
            raise CorruptBlockFileError(
                f"{path} does not decrypt with its block's key: the file was altered, truncated, "
                f"renamed or belongs to another block ({e})") from e
