"""An encrypted store's keys at work: the codec of every tenant, and what sync shares of them.

:class:`Encryption` joins the key store (:mod:`castore.crypto.keystore`) to the object
format (:class:`castore.objects.Codec`): a tenant ``(app, user)``'s codec makes keyed
blake3 ids with the tenant's id key and seals every frame with AES-256-GCM-SIV under its
encryption key (:class:`~castore.crypto.aead.AeadCipher`), binding each sealed frame to the
tenant's ``<app-seg>/<user-seg>`` path. A :class:`~castore.store.Store` holds one
:class:`Encryption` when its ``castore.json`` has ``"encryption"`` settings, and gives
each tenant's store its codec (docs/encryption.md).

A tenant that was erased still gets a codec, one that opens and seals nothing: its refs can
be listed (ref names stay readable, docs/FORMAT.md "Encrypted stores"), and every read or
write of its objects raises :class:`~castore.errors.TenantErased`, saying what was erased and
when, until gc removes its bytes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import EncryptionError, FormatError, KeyMissing, TenantErased
from ..names import tenant_segments
from ..objects import Codec
from ..storage import Storage
from .aead import AeadCipher
from .args import check_encryption_args, refuse_plain_creation
from .keys import MASTER_KEY_ENV, MASTER_KEY_FILE_ENV, KeyWrapper, MasterKey, TenantKeys, environment_key
from .keystore import CONFIG_KEY, KeyStore

#: what castore.json's ``encryption`` settings name, besides the key store's own fields
ALGORITHMS = {"cipher": "AES-256-GCM-SIV", "ids": "blake3-keyed", "kdf": "HKDF-SHA256"}

__all__ = ["ALGORITHMS", "CONFIG_KEY", "Encryption", "as_wrapper", "create_store_keys", "open_store_keys"]


class _Refusing:
    """The cipher of an erased tenant, or of a store opened without its master key: nothing
    seals, nothing opens; each use raises why."""

    def __init__(self, error: TenantErased | KeyMissing) -> None:
        self.error = error

    def seal(self, plaintext: bytes, ad: bytes) -> bytes:
        raise self.error

    def open(self, sealed: bytes, ad: bytes) -> bytes:
        raise self.error


class Encryption:
    """The keys of one encrypted store, as codecs per tenant (kept per handle).

    Use :meth:`create` for a new store and :meth:`open` for an existing one.
    """

    def __init__(self, keys: KeyStore) -> None:
        self.keys = keys
        self._codecs: dict[tuple[str, str | None], Codec] = {}
        self._erased: dict[tuple[str, str | None], TenantErased] = {}
        self._lock = threading.Lock()

    # -- opening -----------------------------------------------------------------------
    @classmethod
    def create(cls, store_storage: Storage, wrapper: KeyWrapper, *, key_store: str | None = None,
               storage_options: dict[str, Any] | None = None) -> Encryption:
        """Make the key store of a new encrypted store (under its ``keys/``, or at ``key_store``).

        Raises:
            EncryptionError: a key store already exists there.
            StorageError: the storage failed.
        """
        return cls(KeyStore.create(store_storage, wrapper, url=key_store, storage_options=storage_options))

    @classmethod
    def open(cls, store_storage: Storage, settings: dict[str, Any], wrapper: KeyWrapper | None, *,
             storage_options: dict[str, Any] | None = None) -> Encryption:
        """Open the keys of an existing encrypted store (``settings``: its ``castore.json``
        ``encryption`` entry) and check ``wrapper`` against them.

        Raises:
            KeyMissing: no master key was given, or the key store is not there.
            WrongKey: ``wrapper`` is not the store's master key.
            EncryptionError: the settings name an algorithm this castore does not know, or
                the key store is damaged or belongs to another store.
            StorageError: the storage failed.
        """
        for k, v in ALGORITHMS.items():
            if settings.get(k, v) != v:
                raise EncryptionError(f"the store is encrypted with {k} {settings.get(k)!r}; this castore knows "
                                      f"{v} only. Upgrade castore.")
        return cls(KeyStore.open(store_storage, settings, wrapper, storage_options=storage_options))

    def replicate(self, store_storage: Storage) -> Encryption:
        """The keys of a new copy of this store at ``store_storage`` (see
        :meth:`KeyStore.replicate <castore.crypto.keystore.KeyStore.replicate>`): the same key
        store id, so the tenant keys :meth:`share` copies there open with the same master key.

        Raises:
            EncryptionError: ``store_storage`` holds another store's key store.
            StorageError: a storage failed.
        """
        return Encryption(self.keys.replicate(store_storage))

    @property
    def settings(self) -> dict[str, Any]:
        """What the store keeps in ``castore.json`` under ``encryption`` to open these keys."""
        return {**ALGORITHMS, **self.keys.config}

    def close(self) -> None:
        """Forget the keys held by this handle and close a separate key store."""
        with self._lock:
            self._codecs.clear()
            self._erased.clear()
        self.keys.close()

    # -- codecs ------------------------------------------------------------------------
    def codec(self, app: str, user: str | None, holds_data: Callable[[], bool] | None = None) -> Codec:
        """The codec of tenant ``(app, user)`` (``user`` None: the app's scope), its keys made
        on first use; an erased tenant's codec refuses every seal and open, and so does the
        codec of a tenant whose key is missing while ``holds_data()`` says its data is there
        (a lost key file: a new key would never open that data, and would stand in the way of
        the old key restored from a backup).

        Raises:
            KeyMissing: no master key was given.
            WrongKey: the tenant's key files do not open with the master key.
            InvalidName: a bad app or user name.
            EncryptionError: a key file is damaged.
            StorageError: the key store cannot be read.
        """
        got = self._codecs.get((app, user))
        if got is not None:
            return got
        tag = "/".join(tenant_segments(app, user)).encode()
        try:
            keys = self._keys_of(app, user, holds_data)
            codec = Codec(id_key=keys.id_key, cipher=AeadCipher(keys.enc_key), tenant=tag)
        except TenantErased as e:
            self._erased[(app, user)] = e
            codec = Codec(id_key=os.urandom(32), cipher=_Refusing(e), tenant=tag)
        except KeyMissing as e:
            # listing needs no key (names are readable); a read or a write of objects does
            codec = Codec(id_key=os.urandom(32), cipher=_Refusing(e), tenant=tag)
        with self._lock:
            return self._codecs.setdefault((app, user), codec)

    def _keys_of(self, app: str, user: str | None, holds_data: Callable[[], bool] | None) -> TenantKeys:
        if holds_data is None or self.keys.wrapper is None:
            return self.keys.tenant_keys(app, user, create=True)
        try:
            return self.keys.tenant_keys(app, user)
        except KeyMissing as e:
            if not holds_data():
                return self.keys.tenant_keys(app, user, create=True)  # a new tenant
            try:  # a rival may have made it meanwhile: a key is stored before any data it seals
                return self.keys.tenant_keys(app, user)
            except KeyMissing:
                raise KeyMissing(f"{e}, yet the tenant holds data: its key file was lost (restore it from a "
                                 "backup of the key store); castore makes a key only for a tenant that holds "
                                 "nothing") from e

    def erasure(self, app: str, user: str | None) -> TenantErased | None:
        """Why tenant ``(app, user)`` cannot be read when it was erased (known once its codec
        was made, :meth:`codec`), else None."""
        return self._erased.get((app, user))

    def options(self, app: str, user: str | None, holds_data: Callable[[], bool] | None = None) -> dict[str, Any]:
        """Keyword arguments for tenant ``(app, user)``'s store: its codec (see :meth:`codec`)."""
        return {"codec": self.codec(app, user, holds_data)}

    # -- sharing with a copy -------------------------------------------------------------
    def share(self, dst: Encryption, tenants: Iterable[tuple[str, str]] | None) -> None:
        """Give the copy ``dst`` (a remote of this store) the wrapped keys of ``tenants`` (their
        (app segment, user segment); None: every tenant) and every erasure recorded here:
        keys cross wrapped, never in clear; an erasure reaches the copy by deleting its keys
        there too.

        Raises:
            EncryptionError: ``dst`` has another key store (it is not a copy of this store),
                or holds another key for one of the tenants.
            StorageError: a storage failed.
        """
        self.keys.share(dst.keys, tenants)
        dst.forget_codecs()

    def forget_codecs(self) -> None:
        """Drop the codecs this handle made (after an erasure: they are made again, refusing)."""
        with self._lock:
            self._codecs.clear()
            self._erased.clear()


def share_keys(src: Encryption | None, dst: Encryption | None, tenants: list[tuple[str, str]],
               named: tuple[str, str | None] | None, src_url: str, dst_url: str) -> list[tuple[str, str]]:
    """Before a sync from the store of ``src`` to the store of ``dst`` (docs/encryption.md,
    "Copies"), give ``dst`` the wrapped keys of ``tenants`` (their ``(app segment, user
    segment)``) and ``src``'s erasures before any tenant of ``dst`` is opened: their objects
    then cross sealed, as stored, and open there with the same master key.

    Args:
        named: the (app, user) a selection named, or None (every tenant, or an app's).

    Returns:
        The tenants to sync: ``tenants``, less those a selection named that ``src`` has no
        key for (it holds nothing of theirs; opening one would make it a key, and ``dst``
        another of its own: the two could never sync that tenant again).

    Raises:
        EncryptionError: one store is encrypted and the other is not, or they were
            encrypted separately (another key store).
        TenantErased: ``named`` was erased in either store.
        StorageError: a storage failed.
    """
    if src is None or dst is None:
        plain, sealed = (src_url, dst_url) if src is None else (dst_url, src_url)
        raise EncryptionError(f"{sealed} is encrypted and {plain} is not: sessions cannot be copied "
                              "between them (`castore encrypt DEST` makes an encrypted copy of a plain store)")
    if named is not None:
        tenants = src.keys.holding(tenants)
    src.share(dst, tenants)
    if named is not None:
        for side in (src, dst):
            erasure = side.keys.erased(*named)
            if erasure is not None:
                raise erasure.error()
    return tenants


def as_wrapper(master_key: KeyWrapper | bytes | str | None) -> KeyWrapper | None:
    """The wrapper a store is opened with: ``master_key`` as given (32 raw bytes, base64 text,
    or a :class:`~castore.crypto.keys.KeyWrapper` such as a KMS hook), else the environment's
    (:func:`~castore.crypto.keys.environment_key`), else None.

    Raises:
        KeyMissing: the file ``$CASTORE_MASTER_KEY_FILE`` names is not there.
        EncryptionError: the key given is not 32 bytes, or not base64 of 32 bytes.
    """
    if master_key is None:
        return environment_key()
    if isinstance(master_key, bytes | bytearray):
        return MasterKey.from_bytes(bytes(master_key))
    if isinstance(master_key, str):
        return MasterKey.from_text(master_key, "master_key")
    return master_key


def open_store_keys(store_storage: Storage, config: dict[str, Any], master_key: KeyWrapper | bytes | str | None,
                    *, encrypted: bool | None = None, key_store: str | None = None) -> Encryption | None:
    """The keys of the existing store whose ``castore.json`` is ``config``; None when it is
    not encrypted. Without a master key the keys open all the same: names and erasures can
    be listed, and every tenant's codec raises KeyMissing on first use.

    Raises:
        EncryptionError: ``encrypted`` is True and the store is not encrypted, or its
            settings are damaged or name an algorithm this castore does not know; a
            ``key_store`` given that is not the store's (:func:`~castore.crypto.args.check_encryption_args`).
        WrongKey: the master key given is not the store's.
        KeyMissing: the key store is not there.
        StorageError: the storage failed.
    """
    check_encryption_args(store_storage.url, config, key_store)
    settings = config.get(CONFIG_KEY)
    if settings is None:
        if encrypted:
            raise EncryptionError(f"the store at {store_storage.url} is not encrypted; `castore encrypt DEST` "
                                  "writes an encrypted copy of it")
        return None
    if not isinstance(settings, dict):
        raise EncryptionError(f"the encryption settings of {store_storage.url}/castore.json are damaged")
    return Encryption.open(store_storage, settings, as_wrapper(master_key))


def create_store_keys(store_storage: Storage, master_key: KeyWrapper | bytes | str | None,
                      key_store: str | None = None, *, encrypted: bool | None = True) -> Encryption:
    """The key store of a new encrypted store (see :meth:`Encryption.create`).

    A key store already there (a rival creating the same store at the same moment, or a
    creation cut short) is opened instead, so that every creator uses the same keys.

    Raises:
        EncryptionError: ``encrypted`` is not True (a key was given for a new store that
            would be plain: :func:`~castore.crypto.args.refuse_plain_creation`).
        KeyMissing: no master key was given (nor in the environment).
        WrongKey: a key store is already there, made with another master key.
        EncryptionError: the key given is malformed, or a damaged key store is there.
        StorageError: the storage failed.
    """
    if not encrypted:
        refuse_plain_creation(store_storage.url, master_key is not None, key_store)
    wrapper = as_wrapper(master_key)
    if wrapper is None:
        raise KeyMissing(f"creating an encrypted store at {store_storage.url} needs a master key: make one with "
                         f"`castore key new` and give it with --master-key-file, ${MASTER_KEY_FILE_ENV}, "
                         f"${MASTER_KEY_ENV} or master_key=")
    try:
        return Encryption.create(store_storage, wrapper, key_store=key_store)
    except KeyMissing:
        raise
    except EncryptionError as made_elsewhere:
        # a key store is there already: a rival creating the same store at the same moment
        # (another thread or process), or a creation cut short before castore.json was
        # written. Both writers then use that one key store (if the key opens it).
        try:
            return Encryption.open(store_storage, {"key_store": key_store} if key_store else {}, wrapper)
        except (KeyMissing, FormatError):
            raise made_elsewhere from None
