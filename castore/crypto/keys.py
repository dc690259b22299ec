"""Master keys, the wrapping of data keys, and the keys a tenant's data key gives.

The key hierarchy of an encrypted store (docs/encryption.md, "Keys"):

* a **master key** (32 random bytes, given as base64 text in ``CASTORE_MASTER_KEY`` or a
  file), or a KMS standing in for one, never stored in the store;
* per app one random 32-byte **app key**, stored only *wrapped* (encrypted and
  authenticated) by the master key, in the key store (:mod:`castore.crypto.keystore`);
* per tenant ``(app, user)`` (``(app, None)``: the app's own scope) one random 32-byte
  **data key**, stored wrapped by its app's key (a :class:`MasterKey` made of the app key);
* from a data key, HKDF-SHA256 derives the tenant's **id key** (keyed blake3 object ids)
  and **encryption key** (AES-256-GCM-SIV of object bodies): :func:`derive_tenant_keys`.

Anything with ``wrap(data_key, context) -> bytes`` and ``unwrap(wrapped, context) -> bytes``
is a :class:`KeyWrapper`: :class:`MasterKey` is the built-in one, and
:class:`CallableWrapper` plugs a KMS in from two functions. ``context`` is associated
data: a wrapped key only unwraps under the context it was wrapped with (the key store binds
its own id and the tenant), so a wrapped key copied to another tenant or key store fails.

``cryptography`` is imported on first use (the optional extra ``castore[crypto]``).
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..errors import CastoreError, EncryptionError, KeyMissing, WrongKey

#: the environment variable :meth:`MasterKey.from_env` reads
MASTER_KEY_ENV = "CASTORE_MASTER_KEY"
#: the environment variable naming a file that holds the master key (read before MASTER_KEY_ENV)
MASTER_KEY_FILE_ENV = "CASTORE_MASTER_KEY_FILE"
KEY_BYTES = 32
NONCE_BYTES = 12
_WRAP_VERSION = b"\x01"
_WRAPPED_BYTES = 1 + NONCE_BYTES + KEY_BYTES + 16
#: HKDF infos: what each derived key is for (a new purpose is a new info, never a reuse)
ID_INFO = b"castore id v1"
ENC_INFO = b"castore enc v1"
_WRAP_INFO = b"castore wrap v1"
_KEY_ID_INFO = b"castore key id v1"


def _crypto() -> Any:
    """The ``cryptography`` primitives this module uses, imported on first use.

    Raises:
        EncryptionError: ``cryptography`` is not installed.
    """
    try:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.ciphers.aead import AESGCMSIV
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    except ImportError as e:
        raise EncryptionError(
            "encrypted stores need the 'cryptography' package: pip install 'castore[crypto]'") from e
    return hashes, AESGCMSIV, HKDF


def hkdf(key: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    """HKDF-SHA256 of ``key`` (no salt: the input is a uniformly random key) for ``info``.

    Raises:
        EncryptionError: ``cryptography`` is not installed.
    """
    hashes, _, HKDF = _crypto()
    return bytes(HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(key))


@runtime_checkable
class KeyWrapper(Protocol):
    """What wraps and unwraps data keys: a master key, or a KMS (the hook).

    ``wrap`` returns opaque bytes (stored as they are, base64 in the key file); ``unwrap``
    returns the data key given to ``wrap`` with the same ``context``, and raises
    :class:`~castore.errors.WrongKey` when ``wrapped`` was not made by this wrapper under
    this context.
    """

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        """Encrypt and authenticate ``data_key``, bound to ``context``."""
        ...

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        """The data key in ``wrapped``; raises WrongKey when it does not authenticate."""
        ...


def key_id_of(wrapper: KeyWrapper) -> str | None:
    """A wrapper's public fingerprint (``key_id``), if it has one: named in WrongKey messages."""
    kid = getattr(wrapper, "key_id", None)
    return kid if isinstance(kid, str) else None


class MasterKey:
    """A 32-byte master key that wraps data keys with AES-256-GCM-SIV.

    The AEAD key is HKDF-derived from the master key (info ``castore wrap v1``), and so is
    the public :attr:`key_id` (16 hex digits), which names the key in messages without
    revealing it. A wrapped key is ``0x01 nonce:12 ciphertext:32 tag:16`` (61 bytes), the
    nonce fresh from ``os.urandom`` for every wrap; the associated data is the ``context``.
    """

    __slots__ = ("_aead", "key_id")

    def __init__(self, key: bytes) -> None:
        """Use ``key`` (32 bytes) as the master key; prefer the ``from_*`` constructors.

        Raises:
            EncryptionError: ``key`` is not 32 bytes, or ``cryptography`` is not installed.
        """
        if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
            n = len(key) if isinstance(key, bytes | bytearray) else type(key).__name__
            raise EncryptionError(f"a master key is {KEY_BYTES} bytes, not {n}")
        _, AESGCMSIV, _ = _crypto()
        self._aead = AESGCMSIV(hkdf(bytes(key), _WRAP_INFO))
        #: a public fingerprint of the key (HKDF output: it reveals nothing of the key)
        self.key_id: str = hkdf(bytes(key), _KEY_ID_INFO, 8).hex()

    @staticmethod
    def new() -> str:
        """A fresh master key (32 bytes from ``os.urandom``) as base64 text, as
        ``castore key new`` prints it and :meth:`from_text` reads it."""
        return base64.b64encode(os.urandom(KEY_BYTES)).decode("ascii")

    @classmethod
    def from_bytes(cls, key: bytes) -> MasterKey:
        """The master key ``key`` (32 raw bytes).

        Raises:
            EncryptionError: not 32 bytes.
        """
        return cls(key)

    @classmethod
    def from_text(cls, text: str, source: str = "the master key") -> MasterKey:
        """The master key written as base64 text (surrounding white space ignored).

        Args:
            source: what the text came from, for the error message.

        Raises:
            EncryptionError: not base64, or not 32 bytes once decoded.
        """
        try:
            raw = base64.b64decode(text.strip().encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError, ValueError) as e:
            raise EncryptionError(f"{source} is not base64 text (make one with `castore key new`)") from e
        if len(raw) != KEY_BYTES:
            raise EncryptionError(
                f"{source} decodes to {len(raw)} bytes, not {KEY_BYTES} (make one with `castore key new`)")
        return cls(raw)

    @classmethod
    def from_env(cls, var: str = MASTER_KEY_ENV) -> MasterKey:
        """The master key in the environment variable ``var`` (base64 of 32 bytes).

        Raises:
            KeyMissing: ``var`` is not set (or empty).
            EncryptionError: its value is not base64 of 32 bytes.
        """
        text = os.environ.get(var, "")
        if not text.strip():
            raise KeyMissing(f"no master key: set {var} (base64 of 32 bytes, `castore key new` makes one)")
        return cls.from_text(text, f"${var}")

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> MasterKey:
        """The master key in the file ``path`` (base64 text, as ``castore key new`` prints).

        Raises:
            KeyMissing: the file does not exist.
            EncryptionError: it cannot be read, or does not hold base64 of 32 bytes.
        """
        try:
            with open(path, "rb") as f:
                data = f.read(4096)
        except FileNotFoundError as e:
            raise KeyMissing(f"no master key file {os.fspath(path)!r}") from e
        except OSError as e:
            raise EncryptionError(f"cannot read the master key file {os.fspath(path)!r}: {e.strerror}") from e
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError as e:
            raise EncryptionError(f"the master key file {os.fspath(path)!r} is not base64 text") from e
        return cls.from_text(text, f"the master key file {os.fspath(path)!r}")

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        """Wrap ``data_key`` (32 bytes) bound to ``context``; see the class docstring.

        Raises:
            EncryptionError: ``data_key`` is not 32 bytes.
        """
        if len(data_key) != KEY_BYTES:
            raise EncryptionError(f"a data key is {KEY_BYTES} bytes, not {len(data_key)}")
        nonce = os.urandom(NONCE_BYTES)
        return _WRAP_VERSION + nonce + self._aead.encrypt(nonce, bytes(data_key), bytes(context))

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        """The data key ``wrapped`` holds.

        Raises:
            WrongKey: ``wrapped`` was made by another key or under another context, or is
                damaged (AEAD authentication failed), or is not a wrapped key at all.
        """
        from cryptography.exceptions import InvalidTag

        if len(wrapped) != _WRAPPED_BYTES or wrapped[:1] != _WRAP_VERSION:
            raise WrongKey(f"not a key wrapped by a castore master key ({len(wrapped)} bytes)")
        nonce = wrapped[1 : 1 + NONCE_BYTES]
        try:
            return bytes(self._aead.decrypt(nonce, wrapped[1 + NONCE_BYTES :], bytes(context)))
        except InvalidTag as e:
            raise WrongKey(f"the master key {self.key_id} does not open this wrapped key") from e

    def __repr__(self) -> str:  # never the key itself
        return f"MasterKey(key_id={self.key_id!r})"


def _call_hook(fn: Callable[[bytes, bytes], bytes], what: str, data: bytes, context: bytes) -> object:
    """``fn(data, context)``: a CastoreError (WrongKey) passes, any other failure becomes an
    EncryptionError chained to it."""
    try:
        return fn(bytes(data), bytes(context))
    except CastoreError:
        raise
    except Exception as e:
        raise EncryptionError(f"the key wrapper failed to {what} a key: {type(e).__name__}: {e}") from e


def environment_key() -> MasterKey | None:
    """The master key the environment gives: the one in the file ``$CASTORE_MASTER_KEY_FILE``
    names, else the one in ``$CASTORE_MASTER_KEY``; None when neither is set (an empty value is
    not set). Read only when an encrypted store needs a key: the environment may hold a key
    meant for other stores, so it is never a reason to refuse a plain one.

    Raises:
        KeyMissing: the file ``$CASTORE_MASTER_KEY_FILE`` names is not there.
        EncryptionError: the key is not base64 of 32 bytes, or the file cannot be read.
    """
    path = os.environ.get(MASTER_KEY_FILE_ENV, "")
    if path:
        return MasterKey.from_file(path)
    if os.environ.get(MASTER_KEY_ENV, "").strip():
        return MasterKey.from_env()
    return None


def master_key(path: str | os.PathLike[str] | None = None) -> MasterKey:
    """The master key in the file ``path``, else the environment's (:func:`environment_key`).

    Raises:
        KeyMissing: no file there, or (no ``path``) neither variable is set.
        EncryptionError: the key is not base64 of 32 bytes.
    """
    if path is not None:
        return MasterKey.from_file(path)
    key = environment_key()
    if key is None:
        raise KeyMissing(f"no master key: give --master-key-file, or set ${MASTER_KEY_FILE_ENV} (a file) or "
                         f"${MASTER_KEY_ENV} (base64 of 32 bytes; `castore key new` makes one)")
    return key


class CallableWrapper:
    """A :class:`KeyWrapper` made of two functions: how a KMS is plugged in without a subclass.

    Example::

        kms = boto3.client("kms")
        wrapper = CallableWrapper(
            wrap=lambda key, ctx: kms.encrypt(KeyId=ARN, Plaintext=key,
                                              EncryptionContext={"castore": ctx.hex()})["CiphertextBlob"],
            unwrap=lambda blob, ctx: kms.decrypt(CiphertextBlob=blob,
                                                 EncryptionContext={"castore": ctx.hex()})["Plaintext"],
            key_id=ARN)

    ``unwrap`` should raise :class:`~castore.errors.WrongKey` for a blob it cannot open (or
    return a key of the wrong length, which is reported so); any other exception from either
    function (a KMS that cannot be reached, a denied request) becomes an
    :class:`~castore.errors.EncryptionError` with the original as ``__cause__``.
    """

    def __init__(self, wrap: Callable[[bytes, bytes], bytes], unwrap: Callable[[bytes, bytes], bytes],
                 key_id: str | None = None) -> None:
        """Wrap with ``wrap(data_key, context)``, unwrap with ``unwrap(wrapped, context)``;
        ``key_id`` names the wrapping key in messages (never a secret)."""
        self._wrap = wrap
        self._unwrap = unwrap
        self.key_id = key_id

    def wrap(self, data_key: bytes, context: bytes) -> bytes:
        """``wrap(data_key, context)`` of the hook.

        Raises:
            EncryptionError: the hook failed or returned something that is not bytes.
        """
        out = _call_hook(self._wrap, "wrap", data_key, context)
        if not isinstance(out, bytes | bytearray) or not out:
            raise EncryptionError(f"the key wrapper returned {type(out).__name__}, not wrapped bytes")
        return bytes(out)

    def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
        """``unwrap(wrapped, context)`` of the hook.

        Raises:
            WrongKey: the hook raised it, or returned a key that is not 32 bytes.
            EncryptionError: the hook failed otherwise.
        """
        out = _call_hook(self._unwrap, "unwrap", wrapped, context)
        if not isinstance(out, bytes | bytearray) or len(out) != KEY_BYTES:
            raise WrongKey("the key wrapper did not return a 32-byte key")
        return bytes(out)

    def __repr__(self) -> str:
        return f"CallableWrapper(key_id={self.key_id!r})"


@dataclass(frozen=True, repr=False)
class TenantKeys:
    """The keys of one tenant, derived from its data key.

    Attributes:
        id_key: the key of its object ids (keyed blake3).
        enc_key: the key of its sealed frames (AES-256-GCM-SIV).
    """

    id_key: bytes
    enc_key: bytes

    def __repr__(self) -> str:  # never the keys themselves
        return "TenantKeys(...)"


def derive_tenant_keys(data_key: bytes) -> TenantKeys:
    """A tenant's id and encryption keys: HKDF-SHA256 of its data key with the infos
    ``castore id v1`` and ``castore enc v1``.

    Raises:
        EncryptionError: ``data_key`` is not 32 bytes, or ``cryptography`` is not installed.
    """
    if len(data_key) != KEY_BYTES:
        raise EncryptionError(f"a data key is {KEY_BYTES} bytes, not {len(data_key)}")
    return TenantKeys(hkdf(data_key, ID_INFO), hkdf(data_key, ENC_INFO))


def new_data_key() -> bytes:
    """A fresh random data key (32 bytes from ``os.urandom``)."""
    return os.urandom(KEY_BYTES)
