"""Keys for encrypted blocks: a data key per block, wrapped by a pluggable key-encryption key.

Envelope encryption with Google's Tink (chosen over hand-framing AES-GCM from ``cryptography``:
Tink's streaming AEAD ``AES256_GCM_HKDF_1MB`` is a vetted segmented format — per-segment keys
and nonces derived by HKDF, reordering and truncation detected — so a block file is encrypted
and decrypted as a stream without any framing of ours, and Tink's keyset encryption and KMS
integrations are the envelope step a cloud KMS or Vault plugs into):

* a **data key** (:class:`DataKey`) is a Tink streaming-AEAD keyset, one per block (or per hot
  window); it encrypts the block's files, with the block's identity as associated data;
* a **key-encryption key** (KEK) comes from a :class:`KeyProvider`: a local Tink AEAD keyset
  file by default (``file:/path``, created 0600), or any object that exposes Tink's ``Aead``
  (``encrypt`` / ``decrypt`` with associated data) — a cloud KMS or Vault client;
* the ledger stores only the *wrapped* data key (``block_keys``); deleting that row destroys
  the block: without it the files are noise, whoever holds the files, the database and the KEK
  (:mod:`~sage_tfx.ledger.blockkeys`: grants, retirement, rotation).

Choose the provider with ``$SAGE_KEY_PROVIDER`` (default ``file:~/.config/sage-tfx/kek.json``).
"""
from __future__ import annotations

import abc
import hashlib
import io
import os
from typing import Callable, Optional

from sage_tfx.errors import InvalidRequestError

PROVIDER_ENV = "SAGE_KEY_PROVIDER"
_STREAMING_TEMPLATE = "AES256_GCM_HKDF_1MB"
_registered: dict[str, Callable[[str], "KeyProvider"]] = {}


def _tink():
    """Tink with the AEAD and streaming-AEAD primitives registered (imported on first use)."""
    import tink
    from tink import aead, streaming_aead
    aead.register()
    streaming_aead.register()
    return tink


class KeyProvider(abc.ABC):
    """A key-encryption key: wraps and unwraps data keys. Never hands its key material out.

    Rotation (``sage-tfx keys rotate``): :meth:`rotate` makes a new version the one that wraps
    while older versions still unwrap; once every wrapped key is re-wrapped,
    :meth:`destroy_previous` destroys the older versions, and with them every copy of a wrapped
    key made before the rotation (database backups included). A KMS or Vault provider maps these
    onto its own key versions, or leaves them unimplemented (then rotate in the key service).
    """

    #: A stable id of the KEK, recorded beside every key it wrapped.
    key_id: str

    @abc.abstractmethod
    def aead(self):
        """The KEK as a Tink ``Aead`` primitive (``encrypt(plaintext, aad)``, ``decrypt``)."""

    def version(self) -> str:
        """The id of the version that wraps now ("" for a provider with a single version)."""
        return ""

    @property
    def kek_id(self) -> str:
        """``key_id#version``: what the ledger records beside a key wrapped now."""
        v = self.version()
        return f"{self.key_id}#{v}" if v else self.key_id

    def rotate(self) -> None:
        """Makes a new version the one that wraps; older versions still unwrap."""
        raise InvalidRequestError(f"KEK {self.key_id} is not rotated from here: rotate it in "
                                  "its key service, then re-wrap with 'sage-tfx keys rotate'")

    def previous_versions(self) -> int:
        """How many versions other than the current one still unwrap."""
        return 0

    def destroy_previous(self) -> None:
        """Destroys every version but the current one (keys wrapped by them never open again)."""
        raise InvalidRequestError(f"KEK {self.key_id}: destroy old versions in its key service")


class LocalKeyFile(KeyProvider):
    """A KEK kept in a local Tink AEAD keyset file (JSON, mode 0600): the embedded default.

    Anyone who can read the file and the ledger's database can unwrap live data keys, so keep
    it outside the block storage and the database's backups (the default lies in the user's
    configuration directory). :meth:`rotate` adds a new primary key (older keys still unwrap);
    :meth:`destroy_previous` then removes the older keys, overwriting the replaced file in place.
    The version (``kek_id``) is re-read whenever the file changes, so a process that outlives a
    rotation wraps with the new version, never with a destroyed one.
    """

    def __init__(self, path: str, create: bool = True):
        self.path = os.path.abspath(os.path.expanduser(path))
        self.key_id = "file:" + self.path
        self._loaded = None  # (file stamp, Aead, primary key id, number of keys)
        if not os.path.exists(self.path):
            if not create:
                raise InvalidRequestError(f"no key-encryption key file at {self.path}")
            self._write(self._new_handle())

    @staticmethod
    def _new_handle():
        tink = _tink()
        from tink import aead
        return tink.new_keyset_handle(aead.aead_key_templates.AES256_GCM)

    def _read(self):
        tink = _tink()
        from tink import secret_key_access
        with open(self.path, encoding="utf-8") as f:
            return tink.json_proto_keyset_format.parse(f.read(), secret_key_access.TOKEN)

    def _state(self):
        """(Aead, primary key id, key count) of the file as it is now, read in one go.

        Re-read whenever the file changed (a rotation by another process), so a key is never
        wrapped by a version the ledger would not record, nor by one that was destroyed.
        """
        from tink import aead
        st = os.stat(self.path)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._loaded is None or self._loaded[0] != stamp:
            handle = self._read()
            info = handle.keyset_info()
            self._loaded = (stamp, handle.primitive(aead.Aead), info.primary_key_id,
                            len(info.key_info))
        return self._loaded[1:]

    def _write(self, handle, replace: bool = False) -> None:
        """Writes the keyset 0600 via a temporary file; a new file never replaces a KEK that
        another process created meanwhile (``replace`` is for rotation)."""
        tink = _tink()
        from tink import secret_key_access
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        text = tink.json_proto_keyset_format.serialize(handle, secret_key_access.TOKEN)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            # The replaced keyset's bytes are overwritten in place after the rename (its inode
            # stays open), so a destroyed version is not left whole in the file system's free
            # blocks (a copy-on-write file system or an SSD's remapping may still keep one).
            old = os.open(self.path, os.O_RDWR) if os.path.exists(self.path) else None
            try:
                os.replace(tmp, self.path)
                if old is not None:
                    size = os.fstat(old).st_size
                    os.pwrite(old, b"\0" * size, 0)
                    os.fsync(old)
            finally:
                if old is not None:
                    os.close(old)
        else:
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                pass
            os.remove(tmp)
        self._loaded = None

    def aead(self):
        """The Tink AEAD of the current key-encryption key."""
        return self._state()[0]

    def version(self) -> str:
        """The current KEK version, as a string."""
        return str(self._state()[1])

    def previous_versions(self) -> int:
        """Number of earlier KEK versions still kept in the file."""
        return self._state()[2] - 1

    def rotate(self) -> None:
        """Adds a new primary key: new wraps use it, keys wrapped before still unwrap."""
        import json

        tink = _tink()
        from tink import secret_key_access
        fmt = tink.json_proto_keyset_format
        keyset = json.loads(fmt.serialize(self._read(), secret_key_access.TOKEN))
        fresh = json.loads(fmt.serialize(self._new_handle(), secret_key_access.TOKEN))
        if {k["keyId"] for k in keyset["key"]} & {k["keyId"] for k in fresh["key"]}:
            return self.rotate()  # a 32-bit key id collided: draw another key
        keyset["key"] += fresh["key"]
        keyset["primaryKeyId"] = fresh["primaryKeyId"]
        self._write(fmt.parse(json.dumps(keyset), secret_key_access.TOKEN), replace=True)

    def destroy_previous(self) -> None:
        """Keeps only the primary key: keys wrapped by the others never open again."""
        import json

        tink = _tink()
        from tink import secret_key_access
        fmt = tink.json_proto_keyset_format
        keyset = json.loads(fmt.serialize(self._read(), secret_key_access.TOKEN))
        keyset["key"] = [k for k in keyset["key"] if k["keyId"] == keyset["primaryKeyId"]]
        self._write(fmt.parse(json.dumps(keyset), secret_key_access.TOKEN), replace=True)


def register_provider(scheme: str, factory: Callable[[str], KeyProvider]) -> None:
    """Makes ``<scheme>:...`` provider specs build with ``factory(spec)`` (a KMS, Vault)."""
    if not scheme.isidentifier() or scheme == "file":
        raise InvalidRequestError(f"bad provider scheme {scheme!r}")
    _registered[scheme] = factory


def default_spec(environ=os.environ) -> str:
    """``$SAGE_KEY_PROVIDER``, else the local key file in the user's configuration directory."""
    if environ.get(PROVIDER_ENV):
        return environ[PROVIDER_ENV]
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return "file:" + os.path.join(base, "sage-tfx", "kek.json")


def provider(spec: Optional[str] = None, *, create: bool = True) -> KeyProvider:
    """The key provider a spec names (default: :func:`default_spec`).

    ``file:/path`` is the local key file, created if missing unless ``create`` is False (a Beam
    worker or a reader must never make a KEK of its own: what it wrapped would open nowhere
    else); other schemes come from :func:`register_provider` (operator code, never a string
    from a client).
    """
    spec = spec or default_spec()
    scheme, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise InvalidRequestError(f"a key provider spec is 'scheme:...', got {spec!r}")
    if scheme == "file":
        return LocalKeyFile(rest, create=create)
    if scheme in _registered:
        return _registered[scheme](spec)
    raise InvalidRequestError(f"unknown key provider scheme {scheme!r} in {spec!r}: use "
                              f"file:/path or one of {sorted(_registered) or 'none registered'}")


class _Kept(io.BytesIO):
    """A BytesIO that Tink's encrypting stream may close without losing the bytes."""

    def close(self) -> None:  # noqa: D401 - keep the buffer readable after the stream closes
        pass


class DataKey:
    """A block's data key: a Tink streaming-AEAD keyset (never written anywhere unwrapped)."""

    def __init__(self, handle):
        self._handle = handle
        from tink import streaming_aead
        self._primitive = handle.primitive(streaming_aead.StreamingAead)

    @classmethod
    def new(cls) -> "DataKey":
        """A fresh data key (streaming AEAD AES256_GCM_HKDF_1MB)."""
        tink = _tink()
        from tink import streaming_aead
        return cls(tink.new_keyset_handle(
            getattr(streaming_aead.streaming_aead_key_templates, _STREAMING_TEMPLATE)))

    def wrap(self, kek: KeyProvider, aad: bytes) -> bytes:
        """The keyset encrypted under the KEK, bound to ``aad`` (e.g. ``b"stream/block"``)."""
        tink = _tink()
        return tink.json_proto_keyset_format.serialize_encrypted(
            self._handle, kek.aead(), aad).encode("utf-8")

    @classmethod
    def unwrap(cls, kek: KeyProvider, wrapped: bytes, aad: bytes) -> "DataKey":
        """The data key ``wrap`` produced. Raises InvalidRequestError if it does not open."""
        tink = _tink()
        try:
            return cls(tink.json_proto_keyset_format.parse_encrypted(
                bytes(wrapped).decode("utf-8"), kek.aead(), aad))
        except tink.TinkError as e:
            raise InvalidRequestError(
                f"the data key does not open with KEK {kek.key_id} for {aad!r}: {e}") from e

    def encrypting(self, fileobj, aad: bytes):
        """A writable stream that encrypts into ``fileobj`` (close it to finish)."""
        return self._primitive.new_encrypting_stream(fileobj, aad)

    def decrypting(self, fileobj, aad: bytes):
        """A readable stream of the plaintext of ``fileobj`` (raises on tampering)."""
        return self._primitive.new_decrypting_stream(fileobj, aad)

    def encrypt(self, plaintext: bytes, aad: bytes) -> bytes:
        """``plaintext`` encrypted with this key, bound to ``aad``."""
        out = _Kept()
        with self.encrypting(out, aad) as w:
            w.write(plaintext)
        return out.getvalue()

    def decrypt(self, ciphertext: bytes, aad: bytes) -> bytes:
        """Inverse of :meth:`encrypt`. Raises if the ciphertext or ``aad`` does not match."""
        with self.decrypting(io.BytesIO(ciphertext), aad) as r:
            return r.read()


def aad_for(*parts: str) -> bytes:
    """Associated data naming what a key or file belongs to (``stream``, ``block``, file)."""
    return "/".join(parts).encode("utf-8")


def fingerprint(wrapped: bytes) -> str:
    """A short, non-secret id of a wrapped key (for logs and audit entries)."""
    return hashlib.sha256(bytes(wrapped)).hexdigest()[:16]
