"""The key store: every tenant's wrapped data key, the key check, and the erasure records.

A key store lives under ``keys/`` of the store's own storage by default, or at a URL of its
own (``key_store`` in the store's encryption settings). Keeping the keys apart from the
data is what makes two things possible: a backup (or a pushed remote) of the data alone is
ciphertext that nobody can read without the key store, and erasing a tenant (deleting its
few key files) reaches every copy of its data, wherever the copies went, as long as the key
store itself was not copied with them.

Keys: the master key (or KMS) wraps one random **app key** per app; an app key wraps the
**data key** of each of the app's tenants (its users, and the app's own scope). So erasing a
whole app deletes one file whatever its number of users (its users' data keys can no longer
be opened by anyone), a rotation rewraps one file per app, and a KMS is called once per app
a process opens, not once per user.

Layout (every file small, JSON)::

    keystore.json                      format, id, the key check (see below), the master key's id
    tenants/<app-seg>.key              an app's key, wrapped by the master key
    tenants/<app-seg>/<user-seg>.key   a tenant's data key, wrapped by its app's key; @app: the app's scope
    erased/<app-seg>.json              the whole app was erased (every user and the app's scope)
    erased/<app-seg>/<user-seg>.json   one user was erased

Segments are :func:`castore.names.tenant_segments`, so a tenant's key file sits beside the
same ``<app-seg>/<user-seg>`` path its data has in the tenant layout. Tenant keys live under
``tenants/`` (not straight under the root) so that no app name can collide with
``erased`` or ``keystore.json``.

**The key check.** ``keystore.json`` holds a random 32-byte value wrapped by the master key
under the context ``castore/keystore/v1 NUL <id>``. Opening with a master key unwraps it:
failure is :class:`~castore.errors.WrongKey` (a wrong master key, said at open, not at the
first read); success followed by a missing tenant key file is
:class:`~castore.errors.KeyMissing` (or :class:`~castore.errors.TenantErased` when an
erasure record names the tenant).

**Contexts** (the associated data of each wrapping): an app key is wrapped under
``castore/appkey/v1 NUL <id> NUL <app-seg>``, a data key under ``castore/key/v1 NUL <id> NUL
<app-seg>/<user-seg>``: a key file copied to another tenant, app or key store does not
unwrap.

**Creation is race-safe.** A key file is created with a compare-and-swap that expects no
file (:meth:`~castore.storage.Storage.swap` with ``expect=None``); the loser of a race reads
the winner's key, so every writer of a tenant uses the same key.

**Erasure** writes its record first (created if absent; the first record is kept), then
deletes one key file: the user's data key, or the app's key. A crash in between leaves a
record that already refuses the tenant, and running the erasure again finishes it. An
app's erasure leaves its users' key files, which nothing can open any more, to
:meth:`KeyStore.sweep`. A key created concurrently with an erasure is deleted by its
creator, who checks the records again after creating it.

**Rotation** rewraps every app key, then the key check, under a new wrapper, each by
compare-and-swap; data and data keys are untouched. A rotation cut short can be run again
with the same two keys: keys already under the new one are left as they are.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import EncryptionError, KeyMissing, StorageError, TenantErased, WrongKey
from ..names import encode, tenant_segments
from ..storage import PreconditionFailed, Storage, open_storage
from .keys import KeyWrapper, MasterKey, TenantKeys, derive_tenant_keys, key_id_of, new_data_key

#: where the keys live in the store's own storage when no key store URL is given
DEFAULT_PREFIX = "keys/"
FORMAT = 1
STORE_FILE = "keystore.json"
TENANTS = "tenants/"
ERASED = "erased/"
KEY_SUFFIX = ".key"
#: the key of a store's encryption settings in its ``castore.json`` (holding :attr:`KeyStore.config`)
CONFIG_KEY = "encryption"
_CHECK_CONTEXT = b"castore/keystore/v1\0"
_KEY_CONTEXT = b"castore/key/v1\0"
_APP_CONTEXT = b"castore/appkey/v1\0"
_ALGORITHMS = {"wrap": "AES-256-GCM-SIV", "derive": "HKDF-SHA256"}


@dataclass(frozen=True)
class Erasure:
    """A record that a tenant's keys were destroyed.

    Attributes:
        app: the app.
        user: the user (None: the whole app, every user and the app's own scope).
        at: when, ISO 8601 UTC.
        by: who, when known.
        keys: how many key files the erasure deleted.
    """

    app: str
    user: str | None
    at: str
    by: str | None = None
    keys: int = 0

    def error(self) -> TenantErased:
        """The error a read of the erased tenant raises."""
        return TenantErased(self.app, self.user, self.at, self.by)


def _covered(path: str, erasures: Iterable[Erasure]) -> bool:
    """Whether key file ``path`` (``tenants/<app-seg>[/<user-seg>].key``) is one of a tenant
    that ``erasures`` erased."""
    for e in erasures:
        app_seg = encode(e.app, "app name")
        if (path == f"{TENANTS}{_tag(e.app, e.user)}{KEY_SUFFIX}" if e.user is not None
                else path == f"{TENANTS}{app_seg}{KEY_SUFFIX}" or path.startswith(f"{TENANTS}{app_seg}/")):
            return True
    return False


def _tag(app: str, user: str | None) -> str:
    """``<app-seg>/<user-seg>``: a tenant's path, in its key file name and wrapping context."""
    return "/".join(tenant_segments(app, user))


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: object, where: str) -> bytes:
    try:
        if not isinstance(text, str):
            raise ValueError("not a string")
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, binascii.Error, UnicodeEncodeError) as e:
        raise EncryptionError(f"{where} is damaged: its wrapped key is not base64") from e


def _load_json(data: bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise EncryptionError(f"{where} is damaged: not JSON ({e})") from e
    if not isinstance(doc, dict):
        raise EncryptionError(f"{where} is damaged: not a JSON object")
    fmt = doc.get("format")
    if fmt != FORMAT:
        raise EncryptionError(f"{where} has key store format {fmt!r}; this castore reads {FORMAT}")
    return doc


def _under(doc: dict[str, Any], wrapper: KeyWrapper) -> bool:
    """Whether a file says it is wrapped by ``wrapper`` (by its key id; False when unknown)."""
    kid = key_id_of(wrapper)
    return kid is not None and doc.get("key_id") == kid


def _dump(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, indent=1, sort_keys=True).encode()


class KeyStore:
    """The wrapped data keys of an encrypted store's tenants; see the module docstring.

    Open one with :meth:`create` (a new encrypted store) or :meth:`open` (an existing one).
    A key store opened without a wrapper (``wrapper=None``) can erase tenants and list
    erasures, which need no key; getting a tenant's keys then raises KeyMissing.
    """

    def __init__(self, storage: Storage, prefix: str, ident: str, wrapper: KeyWrapper | None,
                 owned: bool = False) -> None:
        """Use the key store ``ident`` under ``prefix`` of ``storage``; prefer :meth:`open`.

        Args:
            owned: close ``storage`` with the key store (it was opened for it).
        """
        self.storage = storage
        self.prefix = prefix
        #: the key store's random id (bound into every wrapping context)
        self.id = ident
        self.wrapper = wrapper
        self._owned = owned
        self._keys: dict[str, TenantKeys] = {}
        self._app_keys: dict[str, MasterKey] = {}

    # -- opening ----------------------------------------------------------------------
    @staticmethod
    def _place(store_storage: Storage, url: str | None,
               storage_options: dict[str, Any] | None) -> tuple[Storage, str, bool]:
        if url is None:
            return store_storage, DEFAULT_PREFIX, False
        return open_storage(url, **(storage_options or {})), "", True

    @classmethod
    def create(cls, store_storage: Storage, wrapper: KeyWrapper, *, url: str | None = None,
               storage_options: dict[str, Any] | None = None) -> KeyStore:
        """Make a new, empty key store for a new encrypted store.

        Args:
            store_storage: the storage of the store the keys are for (the key store goes
                under its ``keys/`` unless ``url`` is given).
            wrapper: the master key (or KMS) that wraps every data key.
            url: a separate place for the key store (its root holds ``keystore.json``).
            storage_options: options for opening ``url``.

        Returns:
            The key store; its :attr:`config` is what the store keeps in its settings to
            open it again.

        Raises:
            EncryptionError: a key store already exists there.
            StorageError: the storage failed.
        """
        storage, prefix, owned = cls._place(store_storage, url, storage_options)
        ident = os.urandom(16).hex()
        doc = {"format": FORMAT, "id": ident, "created": _now(), "key_id": key_id_of(wrapper),
               "check": _b64(wrapper.wrap(new_data_key(), _CHECK_CONTEXT + ident.encode())), **_ALGORITHMS}
        try:
            storage.swap(prefix + STORE_FILE, _dump(doc), None)
        except PreconditionFailed as e:
            if owned:
                storage.close()
            raise EncryptionError(f"a key store already exists at {storage.url}/{prefix}{STORE_FILE}") from e
        ks = cls(storage, prefix, ident, wrapper, owned)
        ks._url = url
        return ks

    @classmethod
    def open(cls, store_storage: Storage, config: dict[str, Any], wrapper: KeyWrapper | None, *,
             storage_options: dict[str, Any] | None = None) -> KeyStore:
        """Open the key store of an encrypted store and check the master key against it.

        Args:
            store_storage: the storage of the store the keys are for.
            config: the store's encryption settings, as :attr:`config` gave them at
                creation (``{"key_store_id": ..., "key_store": url}``, the URL only for a
                separate key store).
            wrapper: the master key or KMS; None to erase and list erasures only.
            storage_options: options for opening a separate key store's URL.

        Raises:
            KeyMissing: there is no key store there.
            WrongKey: ``wrapper`` is not the key the key store was made with.
            EncryptionError: the key store is damaged, or belongs to another store.
            StorageError: the storage failed.
        """
        url = config.get("key_store")
        if url is not None and not isinstance(url, str):
            raise EncryptionError(f"the store's key_store setting is not a URL: {url!r}")
        storage, prefix, owned = cls._place(store_storage, url, storage_options)
        try:
            where = f"{storage.url}/{prefix}{STORE_FILE}"
            try:
                raw = storage.read(prefix + STORE_FILE)
            except FileNotFoundError as e:
                raise KeyMissing(f"no key store at {storage.url}/{prefix} (the store's keys are missing"
                                 " or kept elsewhere: give the key store URL)") from e
            doc = _load_json(raw, where)
            ident = doc.get("id")
            if not isinstance(ident, str) or not ident:
                raise EncryptionError(f"{where} is damaged: no id")
            expected = config.get("key_store_id")
            if expected is not None and expected != ident:
                raise EncryptionError(f"the key store at {storage.url}/{prefix} belongs to another store"
                                      f" (its id is {ident}, the store's keys are {expected})")
            ks = cls(storage, prefix, ident, wrapper, owned)
            ks._url = url
            if wrapper is not None:
                ks._check(doc, where)
        except BaseException:
            if owned:
                storage.close()
            raise
        return ks

    @classmethod
    def of_store(cls, store_storage: Storage, store_config: dict[str, Any], wrapper: KeyWrapper | None, *,
                 storage_options: dict[str, Any] | None = None) -> KeyStore:
        """Open the key store of the store whose storage and ``castore.json`` these are: its
        encryption settings are ``store_config["encryption"]`` (see :meth:`open`).

        Raises:
            EncryptionError: the store is not encrypted; else as :meth:`open`.
        """
        settings = store_config.get(CONFIG_KEY)
        if not isinstance(settings, dict):
            raise EncryptionError(f"the store at {store_storage.url} is not encrypted (it has no keys)")
        return cls.open(store_storage, settings, wrapper, storage_options=storage_options)

    def replicate(self, store_storage: Storage) -> KeyStore:
        """Start the key store of a copy of this store (a new remote, a clone) under the
        ``keys/`` of ``store_storage``: the same id and key check, no tenant key yet
        (:meth:`share` copies them). A copy already started is opened.

        Raises:
            EncryptionError: ``store_storage`` holds the key store of another store.
            StorageError: a storage failed.
        """
        raw = self.storage.read(self.prefix + STORE_FILE)
        try:
            store_storage.swap(DEFAULT_PREFIX + STORE_FILE, raw, None)
        except PreconditionFailed:
            pass
        return KeyStore.open(store_storage, {"key_store_id": self.id}, self.wrapper)

    _url: str | None = None

    @property
    def config(self) -> dict[str, Any]:
        """What a store keeps in its settings to open this key store: its id, and its URL
        when it is not under the store's own ``keys/``."""
        out: dict[str, Any] = {"key_store_id": self.id}
        if self._url is not None:
            out["key_store"] = self._url
        return out

    def close(self) -> None:
        """Close the key store's storage if it was opened for it (a separate URL)."""
        self._keys.clear()
        self._app_keys.clear()
        if self._owned:
            self.storage.close()

    def __enter__(self) -> KeyStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KeyStore({self.storage.url}/{self.prefix}, id={self.id})"

    # -- the key check ------------------------------------------------------------------
    def _need_wrapper(self) -> KeyWrapper:
        if self.wrapper is None:
            raise KeyMissing("no master key given (set CASTORE_MASTER_KEY or pass a master key file)")
        return self.wrapper

    def _check(self, doc: dict[str, Any], where: str) -> None:
        wrapper = self._need_wrapper()
        try:
            wrapper.unwrap(_unb64(doc.get("check"), where), _CHECK_CONTEXT + self.id.encode())
        except WrongKey as e:
            theirs = doc.get("key_id")
            ours = key_id_of(wrapper)
            ids = f" (its key is {theirs}, the key given is {ours})" if theirs and ours else ""
            raise WrongKey(f"wrong master key for the key store at {self.storage.url}/{self.prefix}{ids}") from e

    def check(self) -> None:
        """Check the wrapper this key store was opened with against its key check.

        Raises:
            KeyMissing: no wrapper was given, or the key store is gone.
            WrongKey: the wrapper is not the key store's key.
            EncryptionError: the key store is damaged.
            StorageError: the storage failed.
        """
        where = f"{self.storage.url}/{self.prefix}{STORE_FILE}"
        try:
            raw = self.storage.read(self.prefix + STORE_FILE)
        except FileNotFoundError as e:
            raise KeyMissing(f"no key store at {self.storage.url}/{self.prefix}") from e
        self._check(_load_json(raw, where), where)

    # -- tenant keys ----------------------------------------------------------------------
    def _app_path(self, app_seg: str) -> str:
        return f"{self.prefix}{TENANTS}{app_seg}{KEY_SUFFIX}"

    def _key_path(self, tag: str) -> str:
        return f"{self.prefix}{TENANTS}{tag}{KEY_SUFFIX}"

    def _erasure_paths(self, app: str, user: str | None) -> list[str]:
        app_seg = encode(app, "app name")
        paths = [f"{self.prefix}{ERASED}{app_seg}.json"]
        if user is not None:
            paths.append(f"{self.prefix}{ERASED}{_tag(app, user)}.json")
        return paths

    def _context(self, kind: bytes, tag: str) -> bytes:
        return kind + self.id.encode() + b"\0" + tag.encode()

    def _erasure_in(self, found: dict[str, bytes | None], paths: Iterable[str]) -> Erasure | None:
        for path in paths:
            raw = found.get(path)
            if raw is not None:
                return self._parse_erasure(raw, path)
        return None

    def _parse_erasure(self, raw: bytes, path: str) -> Erasure:
        doc = _load_json(raw, f"{self.storage.url}/{path}")
        try:
            return Erasure(app=doc["app"], user=doc.get("user"), at=doc["at"], by=doc.get("by"),
                           keys=int(doc.get("keys", 0)))
        except (KeyError, TypeError, ValueError) as e:
            raise EncryptionError(f"{self.storage.url}/{path} is damaged: not an erasure record") from e

    def _unwrap_file(self, raw: bytes, path: str, context: bytes, wrapper: KeyWrapper, by: str) -> bytes:
        doc = _load_json(raw, f"{self.storage.url}/{path}")
        try:
            return wrapper.unwrap(_unb64(doc.get("wrapped"), f"{self.storage.url}/{path}"), context)
        except WrongKey as e:
            raise WrongKey(f"the key in {self.storage.url}/{path} does not open with {by} (a wrong key, or"
                           " a key file that was damaged or moved from another tenant or key store)") from e

    def tenant_keys(self, app: str, user: str | None, create: bool = False) -> TenantKeys:
        """The id and encryption keys of tenant ``(app, user)`` (``user`` None: the app's scope).

        One concurrent read (the tenant's key file, its app's key file, the erasure records
        that could cover it); the keys are then kept in this handle.

        Args:
            create: make the tenant's data key (and its app's key) if it has none
                (race-safe: with rival creators, every one gets the key stored first).

        Raises:
            TenantErased: the tenant (or its whole app) was erased.
            KeyMissing: no master key was given, or the tenant has no key and ``create``
                is False.
            WrongKey: its key files do not open with the master key.
            InvalidName: ``app`` or ``user`` is not a valid name.
            EncryptionError: a key file is damaged.
            StorageError: the storage failed.
        """
        tag = _tag(app, user)
        cached = self._keys.get(tag)
        if cached is not None:
            return cached
        wrapper = self._need_wrapper()
        app_seg = tag.split("/", 1)[0]
        path, app_path = self._key_path(tag), self._app_path(app_seg)
        erased_paths = self._erasure_paths(app, user)
        found = self.storage.read_many([path, app_path, *erased_paths])
        erasure = self._erasure_in(found, erased_paths)
        if erasure is not None:
            raise erasure.error()
        raw = found.get(path)
        if raw is None and not create:
            who = f"app {app!r}" if user is None else f"user {user!r} of app {app!r}"
            raise KeyMissing(f"no data key for {who} in the key store at {self.storage.url}/{self.prefix} "
                             f"({self.storage.url}/{path} is not there)")
        app_key = self._app_keys.get(app_seg)
        if app_key is None:
            app_raw = found.get(app_path)
            if app_raw is None:
                if raw is not None:
                    raise EncryptionError(f"{self.storage.url}/{app_path} is missing: the keys of app {app!r}"
                                          " cannot be opened; the file was lost (restore it from a backup of"
                                          " the key store): castore never makes it again, as a new one would"
                                          " not open the keys it wrapped")
                app_raw = self._create(app_path, app, None, wrapper, self._context(_APP_CONTEXT, app_seg),
                                       erased_paths[:1])
            by = f"the master key {key_id_of(wrapper) or ''}".rstrip()
            app_key = MasterKey(self._unwrap_file(app_raw, app_path, self._context(_APP_CONTEXT, app_seg),
                                                  wrapper, by))
            self._app_keys[app_seg] = app_key
        if raw is None:
            raw = self._create(path, app, user, app_key, self._context(_KEY_CONTEXT, tag), erased_paths)
        keys = derive_tenant_keys(self._unwrap_file(raw, path, self._context(_KEY_CONTEXT, tag), app_key,
                                                    f"the key of app {app!r}"))
        self._keys[tag] = keys
        return keys

    def _create(self, path: str, app: str, user: str | None, wrapper: KeyWrapper, context: bytes,
                erased_paths: list[str]) -> bytes:
        """Store a new key at ``path`` (wrapped by ``wrapper`` under ``context``) unless one
        is there; return what is stored."""
        doc = {"format": FORMAT, "app": app, "user": user, "created": _now(), "key_id": key_id_of(wrapper),
               "wrapped": _b64(wrapper.wrap(new_data_key(), context))}
        token: str | None = None
        try:
            token = self.storage.swap(path, _dump(doc), None)
        except PreconditionFailed:
            pass  # a rival created it first: use theirs
        except StorageError:
            # the write may have landed with its answer lost: what is stored decides
            if self.storage.read_versioned(path) is None:
                raise
        stored = self.storage.read_versioned(path)
        # an erasure that ran while this key was being made did not delete it: look again
        erasure = self._erasure_in(self.storage.read_many(erased_paths), erased_paths)
        if erasure is not None:
            if token is not None:
                self.storage.delete(path)
            raise erasure.error()
        if stored is None:
            raise EncryptionError(f"{self.storage.url}/{path} vanished while it was being created")
        return stored.data

    # -- erasure --------------------------------------------------------------------------
    def erase(self, app: str, user: str | None = None, *, by: str | None = None) -> list[Erasure]:
        """Destroy the keys of ``app``'s ``user`` (its data key), or with ``user`` None of the
        whole app (its app key, which every data key of the app is wrapped by), and record
        the erasure.

        The record is written first and kept (an erasure of an already erased tenant keeps
        the first record and deletes any key file left). Either way one key file is deleted,
        whatever the number of users and the size of their data; after an app's erasure its
        users' key files, which nothing can open any more, are left for :meth:`sweep`.

        Returns:
            The erasure records that now cover the tenant (the new one, or the earlier one).

        Raises:
            InvalidName: ``app`` or ``user`` is not a valid name.
            StorageError: the storage failed (run the erasure again: it is idempotent).
        """
        app_seg = encode(app, "app name")
        if user is None:
            doomed = self._app_path(app_seg)
            record_path = f"{self.prefix}{ERASED}{app_seg}.json"
            folder = f"{self.prefix}{TENANTS}{app_seg}/"
            n = sum(1 for k in self.storage.list(folder) if k.endswith(KEY_SUFFIX))
            self._app_keys.pop(app_seg, None)
            drop = [t for t in self._keys if t.startswith(app_seg + "/")]
        else:
            tag = _tag(app, user)
            doomed = self._key_path(tag)
            record_path = f"{self.prefix}{ERASED}{tag}.json"
            n = int(self.storage.exists(doomed))
            drop = [tag]
        record = Erasure(app=app, user=user, at=_now(), by=by, keys=n)
        try:
            self.storage.swap(record_path, _dump({"format": FORMAT, **asdict(record)}), None)
        except PreconditionFailed:
            record = self._parse_erasure(self.storage.read(record_path), record_path)
        self.storage.delete(doomed)
        for t in drop:
            self._keys.pop(t, None)
        return [record]

    def sweep(self) -> int:
        """Delete the key files of erased apps' users (nothing can open them since their app
        key was deleted): tidiness, not security.

        Returns:
            How many files were deleted.

        Raises:
            StorageError: the storage failed.
        """
        base = self.prefix + TENANTS
        keys = self.storage.list(base)
        apps = {k[len(base) : -len(KEY_SUFFIX)] for k in keys if "/" not in k[len(base) :]}
        erased = {p[len(self.prefix + ERASED) : -len(".json")] for p in self.storage.list(self.prefix + ERASED)
                  if "/" not in p[len(self.prefix + ERASED) :]}
        doomed = [k for k in keys if "/" in k[len(base) :]
                  and (seg := k[len(base) :].split("/", 1)[0]) not in apps and seg in erased]
        self.storage.delete_many(doomed)
        return len(doomed)

    def has_keys(self, app: str, user: str | None) -> bool:
        """Whether ``app``'s ``user`` has a data key here (``user`` None: whether ``app`` has
        its app key); no key is made or opened.

        Raises:
            InvalidName: ``app`` or ``user`` is not a valid name.
            StorageError: the storage failed.
        """
        path = self._app_path(encode(app, "app name")) if user is None else self._key_path(_tag(app, user))
        return self.storage.read_many([path]).get(path) is not None

    def holding(self, tenants: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """Those of ``tenants`` (their ``(app segment, user segment)``) that have a data key
        here, in one concurrent read; no key is made or opened.

        Raises:
            StorageError: the storage failed.
        """
        paths = {t: self._key_path(f"{t[0]}/{t[1]}") for t in tenants}
        found = self.storage.read_many(paths.values())
        return [t for t, p in paths.items() if found.get(p) is not None]

    def erased(self, app: str, user: str | None) -> Erasure | None:
        """The erasure that covers tenant ``(app, user)`` (its own or its app's), or None.

        Raises:
            InvalidName: ``app`` or ``user`` is not a valid name.
            EncryptionError: a record is damaged.
            StorageError: the storage failed.
        """
        paths = self._erasure_paths(app, user)
        return self._erasure_in(self.storage.read_many(paths), paths)

    def erasures(self) -> list[Erasure]:
        """Every erasure recorded, oldest first.

        Raises:
            EncryptionError: a record is damaged.
            StorageError: the storage failed.
        """
        paths = [p for p in self.storage.list(self.prefix + ERASED) if p.endswith(".json")]
        found = self.storage.read_many(paths)
        out = [self._parse_erasure(raw, p) for p, raw in found.items() if raw is not None]
        return sorted(out, key=lambda e: (e.at, e.app, e.user or ""))

    # -- copies ---------------------------------------------------------------------------
    def share(self, dst: KeyStore, tenants: Iterable[tuple[str, str]] | None = None) -> int:
        """Copy to ``dst`` (the key store of a copy of this store: a remote, a clone) the
        wrapped keys of ``tenants`` (their ``(app segment, user segment)`` as
        :func:`castore.names.tenant_segments` makes them; None: every tenant) and every
        erasure record, byte for
        byte, then delete in ``dst`` the key files its erasure records cover. Keys cross
        wrapped only; an erasure made here reaches the copy the next time it is shared.

        Returns:
            How many files were written to ``dst`` (keys and records).

        Raises:
            EncryptionError: ``dst`` is another key store (another id: its contexts differ,
                so nothing copied would open there), or holds another key for a tenant.
            StorageError: a storage failed (share again: it is idempotent).
        """
        if dst.id != self.id:
            raise EncryptionError(f"the key store at {dst.storage.url}/{dst.prefix} is not a copy of the one at "
                                  f"{self.storage.url}/{self.prefix} (ids {dst.id} and {self.id}): the two stores "
                                  "were encrypted separately; push to a new, empty store instead")
        base = self.prefix + TENANTS
        if tenants is None:
            paths = [k[len(self.prefix):] for k in self.storage.list(base) if k.endswith(KEY_SUFFIX)]
        else:
            paths = []
            for app_seg, user_seg in tenants:
                paths += [f"{TENANTS}{app_seg}{KEY_SUFFIX}", f"{TENANTS}{app_seg}/{user_seg}{KEY_SUFFIX}"]
        paths += [k[len(self.prefix):] for k in self.storage.list(self.prefix + ERASED) if k.endswith(".json")]
        paths = sorted(set(paths))
        mine = self.storage.read_many([self.prefix + p for p in paths])
        theirs = dst.storage.read_many([dst.prefix + p for p in paths])
        written = 0
        erasures: list[Erasure] | None = None
        for p in paths:  # sorted: the erasure records (erased/) before the keys (tenants/)
            if erasures is None and not p.startswith(ERASED):
                erasures = dst.erasures()  # the copy's own and those just given
            if erasures is not None and _covered(p, erasures):
                continue  # an erased tenant's key never lands there, not even until the sweep below
            raw, have = mine.get(self.prefix + p), theirs.get(dst.prefix + p)
            if raw is None or have == raw:
                continue
            if have is not None:
                if p.startswith(ERASED):
                    continue  # the copy recorded its own erasure of the tenant first: keep it
                raise EncryptionError(f"{dst.storage.url}/{dst.prefix}{p} holds another key than "
                                      f"{self.storage.url}/{self.prefix}{p}: the copy made its own key for this "
                                      "tenant (it wrote to it before receiving the key); its data and this store's "
                                      "cannot be merged")
            try:
                dst.storage.swap(dst.prefix + p, raw, None)
                written += 1
            except PreconditionFailed:
                pass  # a rival share wrote it meanwhile (the same bytes, or checked next time)
        dst.drop_erased(erasures)
        return written

    def drop_erased(self, erasures: list[Erasure] | None = None) -> int:
        """Delete the key files that this key store's erasure records cover (those a copy
        received before the erasure reached it), and forget them in this handle.

        Args:
            erasures: the records, when just read (:meth:`erasures`); None: read them.

        Returns:
            How many key files were deleted.

        Raises:
            EncryptionError: a record is damaged.
            StorageError: the storage failed.
        """
        doomed = []
        for e in self.erasures() if erasures is None else erasures:
            doomed.append(self._app_path(encode(e.app, "app name")) if e.user is None
                          else self._key_path(_tag(e.app, e.user)))
            self.forget(e.app, e.user)
        present = [k for k, v in self.storage.read_many(doomed).items() if v is not None]
        self.storage.delete_many(present)
        return len(present)

    def forget(self, app: str, user: str | None) -> None:
        """Drop the keys this handle keeps of ``app``'s ``user`` (None: of the whole app)."""
        app_seg = encode(app, "app name")
        if user is None:
            self._app_keys.pop(app_seg, None)
            for t in [t for t in self._keys if t.startswith(app_seg + "/")]:
                self._keys.pop(t, None)
        else:
            self._keys.pop(_tag(app, user), None)

    # -- rotation -------------------------------------------------------------------------
    def _app_key_files(self) -> list[str]:
        base = self.prefix + TENANTS
        return [k for k in self.storage.list(base) if k.endswith(KEY_SUFFIX) and "/" not in k[len(base) :]]

    def tenants(self) -> list[tuple[str, str | None]]:
        """Every tenant that has a data key, as ``(app, user)`` (user None: an app's scope),
        erased apps' leftovers excepted.

        Raises:
            EncryptionError: a key file is damaged.
            StorageError: the storage failed.
        """
        base = self.prefix + TENANTS
        keys = self.storage.list(base)
        apps = {k[len(base) : -len(KEY_SUFFIX)] for k in keys if "/" not in k[len(base) :]}
        paths = [k for k in keys if k.endswith(KEY_SUFFIX) and k[len(base) :].split("/", 1)[0] in apps
                 and "/" in k[len(base) :]]
        out = []
        for path, raw in self.storage.read_many(paths).items():
            if raw is not None:
                doc = _load_json(raw, f"{self.storage.url}/{path}")
                out.append((str(doc.get("app")), doc.get("user")))
        return sorted(out, key=lambda t: (t[0], t[1] is not None, t[1] or ""))

    def _rewrap(self, path: str, context: bytes, old: KeyWrapper, new: KeyWrapper, field: str) -> bool:
        """Rewrap the value in ``field`` of the file ``path`` from ``old`` to ``new``, by
        compare-and-swap; False when it needed none (already under ``new``, or gone)."""
        where = f"{self.storage.url}/{path}"
        while True:
            cur = self.storage.read_versioned(path)
            if cur is None:
                return False  # erased meanwhile
            doc = _load_json(cur.data, where)
            if _under(doc, new):
                return False
            wrapped = _unb64(doc.get(field), where)
            try:
                key = old.unwrap(wrapped, context)
            except WrongKey:
                new.unwrap(wrapped, context)  # already rotated (a rerun); WrongKey if neither
                return False
            doc.update({field: _b64(new.wrap(key, context)), "key_id": key_id_of(new)})
            try:
                self.storage.swap(path, _dump(doc), cur.token)
                return True
            except PreconditionFailed:
                continue  # a rival rotation or creation: read again

    def rotate(self, new: KeyWrapper) -> int:
        """Rewrap every app key and the key check under ``new``; no data is read or written,
        and no tenant's data key changes (they are wrapped by their app's key).

        Afterwards the old master key fails with WrongKey and ``new`` opens everything. A
        rotation cut short (a crash, a failed request) is finished by running it again with
        the same keys: key files already under ``new`` are left alone. Writers that keep
        the old key open while the rotation runs may create app keys under it after it
        passed: run the rotation when no writer runs, or run it again.

        Returns:
            How many app keys were rewrapped.

        Raises:
            KeyMissing: the key store was opened without a wrapper.
            WrongKey: a key file opens with neither the old nor the new key.
            EncryptionError: a key file is damaged, or ``new`` failed.
            StorageError: the storage failed (run it again to finish).
        """
        old = self._need_wrapper()
        base = self.prefix + TENANTS
        n = 0
        for _ in range(2):  # the second pass rewraps app keys created while the first one ran
            for path in self._app_key_files():
                context = self._context(_APP_CONTEXT, path[len(base) : -len(KEY_SUFFIX)])
                n += self._rewrap(path, context, old, new, "wrapped")
        self._rewrap(self.prefix + STORE_FILE, _CHECK_CONTEXT + self.id.encode(), old, new, "check")
        self.wrapper = new
        return n
