"""The store: one root URL holding objects and refs for every session of every app and user.

Open one with :func:`castore.open`. A store is created on its first write (a
``castore.json`` with the format number is written then); reading from a URL with no store
behind it raises :class:`~castore.errors.StoreNotFound`.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import handles, names
from .aio import to_thread
from .errors import (
    CastoreError,
    CorruptRef,
    EncryptionError,
    FormatError,
    InvalidName,
    RefConflict,
    SessionNotFound,
    StorageError,
    StoreNotFound,
    TenantErased,
)
from .formats import check_format, check_stored, default_format
from .refs import RefStore, RefValue
from .storage import PreconditionFailed, Storage, open_storage

if TYPE_CHECKING:  # castore.crypto is imported only by an encrypted store (a plain one never loads it)
    from .crypto.encryption import Encryption
    from .crypto.keys import KeyWrapper

    # built on first use (Store.objects, .history, .plumbing, .group_commit), their modules and
    # the object format imported then: a search through a fresh index reads refs and never loads them
    from .groupcommit import GroupCommit, WriteBatch
    from .history import History
    from .listing import SessionInfo
    from .objects import Codec, Commit, ObjectId
    from .objectstore import ObjectStore
    from .plumbing import Plumbing

    # imported where used: a command that reads (grep, log) never loads the redactor or the Session class
    from .redact import Redactor
    from .retry import RetryPolicy
    from .scopes import Changes, ScopePlan
    from .session import Session

CONFIG_KEY = "castore.json"
#: the store layouts (castore.json ``layout``, docs/FORMAT.md 2): ``flat`` keeps every tenant's
#: refs and objects together; ``tenants`` keeps each (app, user)'s under its own prefix
LAYOUTS = ("flat", "tenants")
#: what :meth:`Store.tenant_options` returns: keyword arguments for a tenant's sub-store
TenantOptions = Callable[[str, "str | None"], Mapping[str, Any]]
#: castore.json: whether every write is redacted (:meth:`Store.set_redact`)
REDACT = "redact"
#: castore.json: the redaction key, 64 hex digits (:meth:`Store.redaction_key`)
REDACT_KEY = "redact_key"
#: the folder holding a project's store, as ``.git`` holds a repository
STORE_DIR = ".castore"
DEFAULT_URL = f"./{STORE_DIR}"


def default_url(start: str | None = None) -> str:
    """The store used when none is named, found the way git finds ``.git``.

    ``$CASTORE_STORE`` if set; else, from ``start`` (default: the current directory) up
    to the root, the first folder that holds a store in its ``.castore`` folder, or is
    itself a store folder (one holding ``castore.json``: inside ``.castore``, as git works
    inside ``.git``); else ``./.castore`` (created by the first write). So a command run
    from a subfolder uses the project's store rather than silently starting a new one.
    """
    env = os.environ.get("CASTORE_STORE")
    if env:
        return env
    here = os.path.abspath(start or os.getcwd())
    first = here
    while True:
        candidate = os.path.join(here, STORE_DIR)
        if os.path.isfile(os.path.join(candidate, CONFIG_KEY)):
            return DEFAULT_URL if here == first and start is None else candidate
        if os.path.isfile(os.path.join(here, CONFIG_KEY)):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return DEFAULT_URL if start is None else os.path.join(first, STORE_DIR)
        here = parent


def store_dir(folder: str) -> str:
    """Where ``castore clone URL FOLDER`` puts the store: ``FOLDER/.castore`` (so commands run
    in FOLDER find it), or FOLDER itself when it is a URL (``s3://...``) or a ``.castore`` folder."""
    if "://" in folder or os.path.basename(os.path.normpath(folder)) == STORE_DIR:
        return folder
    return os.path.join(folder, STORE_DIR)


def check_url(url: str) -> None:
    """Refuse a store URL that looks like a mistyped URL (``s3:/bucket``, ``s3:bucket``).

    A scheme followed by ``:`` but not ``://`` would otherwise be taken as a local folder
    named ``s3:``, and writes would land there silently.

    Raises:
        StorageError: the URL looks mistyped.
    """
    m = _MISTYPED.match(url)
    if m and "://" not in url:
        scheme = m.group(1)
        fixed = f"{scheme}://{url[len(scheme) + 1 :].lstrip('/')}"
        raise StorageError(
            f"{url!r} looks like a mistyped URL: did you mean {fixed!r}? (for a local folder, write ./{url})",
            url,
        )


#: the parts of a store built on first use (:meth:`Store.__getattr__`), each by ``Store._new_<name>``
_PARTS = frozenset({"objects", "history", "plumbing", "group_commit"})
_MISTYPED = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")


class Store(handles.Handle):
    """Objects and refs under one root; the factory of :class:`~castore.session.Session`.

    A new store is created in storage format ``format`` (default: 3 on local disk, packs
    with ref swaps journaled in the writer's log; 2, packs, on object storage and memory;
    docs/FORMAT.md);
    an existing store keeps the format its ``castore.json`` names unless ``format`` is
    higher. ``codec``: how objects become ids and stored bytes (:class:`~castore.objects.Codec`;
    an encrypted store's has keys; None: :data:`~castore.objects.PLAIN`). Use as a context
    manager, or call :meth:`close`.

    ``layout`` (a new store; docs/FORMAT.md 2): ``"flat"`` (default) or ``"tenants"``, where
    each (app, user) keeps its refs, packs and loose objects in a complete store of its own
    under ``tenants/<app>/<user>/`` (:meth:`tenant`), so that an S3 policy can confine a
    worker's credentials to one tenant. A tenant-layout store answers the same calls as a
    flat one: a session, a listing or a scope goes to its tenant's store.
    ``tenant_options(app, user)`` returns extra keyword arguments for the constructor of
    each tenant's store (user None: the app's own, holding its app-scoped state).

    Opening reads ``castore.json`` (its format checked by :mod:`castore.formats`) and opens
    the ref store, which replays ref swaps a power loss cut short
    (:func:`castore.refs.recover`) before any ref is read; :attr:`objects`, :attr:`history`,
    :attr:`plumbing` and :attr:`group_commit` are built on first use, their modules imported
    then, so that a reader of refs alone (``castore grep`` through a fresh index) loads none
    of them, nor the object format.

    Raises:
        FormatError: ``format`` or ``layout`` is unknown, the store was written by a newer
            castore, or ``layout`` differs from the existing store's.
    """

    def __init__(self, storage: Storage, *, compress: bool = True, retry: RetryPolicy | None = None,
                 format: int | None = None,  # noqa: A002 - the store's format, as in castore init --format
                 auto_repack: bool | None = None, layout: str | None = None, codec: Codec | None = None,
                 tenant_options: TenantOptions | None = None, encrypted: bool | None = None,
                 master_key: KeyWrapper | bytes | str | None = None, key_store: str | None = None,
                 _tenant_of: tuple[Store, str, str] | None = None) -> None:
        if layout is not None and layout not in LAYOUTS:
            raise FormatError(f"unknown store layout {layout!r}; use one of {', '.join(LAYOUTS)}")
        if auto_repack is not None and not isinstance(auto_repack, bool):  # ("maybe" would repack)
            raise FormatError(f"auto_repack must be true or false, not {auto_repack!r}")
        if encrypted and layout == "flat":
            raise FormatError("an encrypted store has the tenants layout (each tenant's keys seal its own packs)")
        self.storage = storage
        #: an encrypted store's keys (its tenants' codecs); None for a plain store and a tenant's
        self.encryption: Encryption | None = None
        #: a tenant's store whose keys were destroyed (``castore erase``): why it cannot be
        #: read; store-wide work skips it and gc deletes its bytes
        self.erased: TenantErased | None = None
        # a malformed key is refused at once, not at the first write
        self._encrypted, self._key_store = encrypted, key_store
        self._master_key: KeyWrapper | None = None  # None: $CASTORE_MASTER_KEY, read when needed
        if master_key is not None:
            from .crypto.encryption import as_wrapper

            self._master_key = as_wrapper(master_key)
        self.url = storage.url
        #: how :meth:`open` opened the storage (``durable`` and the storage options): what
        #: another process needs to open the same store (``import --jobs``); None when the
        #: store was built on a storage object
        self.open_options: dict[str, Any] | None = None
        self._auto_repack = auto_repack
        self._compress, self._retry, self._layout = compress, retry, layout
        self._tenant_options = tenant_options
        #: a tenant's store: (the root store, app segment, user segment); None for a root
        self._tenant_of = _tenant_of
        self._tenants: dict[tuple[str, str], Store] = {}
        self._tenants_lock = threading.Lock()
        # one init at a time per handle: an encrypted store's first write makes its key store,
        # which a second thread of the same handle must not try to make again
        self._init_lock = threading.Lock()
        self._parts_lock = threading.RLock()  # objects, history, plumbing, group_commit: see __getattr__
        # what the object store is built with (Store.objects, on first use); until then the
        # format it writes and whether it repacks are kept here (_set_format, _set_auto_repack)
        self._codec = codec
        self._format = 1
        self._repacks = auto_repack is not False
        self._repack_own = _tenant_of[0].repack_own if _tenant_of is not None else False
        self.refs = RefStore(storage)  # replays the ref swaps a power loss cut short
        self._config: dict[str, Any] | None = None
        #: this handle's choice about redaction (None: castore.json's "redact" decides)
        self._redact: bool | None = None
        self._redactor: Redactor | None = None  # what _apply_redaction chose
        self._initialized = False
        if _tenant_of is not None:  # the root's castore.json rules: nothing of its own to read
            root = _tenant_of[0]
            self._new_format = root.format
            self._set_format(root.format)
            self._set_auto_repack(root.auto_repack)
            return
        self._new_format = default_format(storage) if format is None else format
        self._set_format(self._new_format)  # refuses an unknown format
        self._load_config()
        self._open_keys()
        if format is not None and self._initialized and self.format < format:
            self.update_config(lambda c: {**c, "format": max(c.get("format", 1), format)})
            self._load_config()

    # -- the parts built on first use --------------------------------------------------
    #: the content-addressed objects of this store (reading one builds it)
    objects: ObjectStore
    #: the commits of this store and the paths between them
    history: History
    #: the one write path: every commit and ref move of this store goes through it
    plumbing: Plumbing
    #: the appends of this handle's sessions in flight together land as one group
    group_commit: GroupCommit

    def __getattr__(self, name: str) -> Any:
        """:attr:`objects`, :attr:`history`, :attr:`plumbing` and :attr:`group_commit`, built on
        first use (their modules imported then; a search through a fresh index never loads
        them), then plain attributes. Two threads asking first get the same one.

        Raises:
            AttributeError: not an attribute of a store.
        """
        if name not in _PARTS or "_parts_lock" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        with self._parts_lock:  # reentrant: the plumbing is built on the history
            got = self.__dict__.get(name)
            if got is None:
                got = self.__dict__[name] = getattr(self, f"_new_{name}")()
        return got

    def _new_objects(self) -> ObjectStore:
        from .objects import PLAIN
        from .objectstore import ObjectStore

        objs = ObjectStore(self.storage, compress=self._compress, format=self._format, auto_repack=self._repacks,
                           codec=self._codec or PLAIN)
        objs.repack_own = self._repack_own
        return objs

    def _built_objects(self) -> ObjectStore | None:
        """The object store if it was built, else None (a question that must not build it)."""
        return self.__dict__.get("objects")

    @property
    def format(self) -> int:
        """The storage format this handle writes (docs/FORMAT.md; :mod:`castore.formats`)."""
        objs = self._built_objects()
        return objs.format if objs is not None else self._format

    def _set_format(self, fmt: int) -> None:
        """Write in format ``fmt`` from now on (the object store's, when it is built).

        Raises:
            FormatError: not a format this castore knows.
        """
        with self._parts_lock:
            self._format = check_format(fmt)
            objs = self._built_objects()
            if objs is not None:
                objs.set_format(fmt)

    @property
    def auto_repack(self) -> bool:
        """Whether writes merge small packs in the background (format 2; docs/FORMAT.md 8)."""
        objs = self._built_objects()
        return objs.auto_repack if objs is not None else self._repacks

    def _set_auto_repack(self, on: bool) -> None:
        with self._parts_lock:
            self._repacks = on
            objs = self._built_objects()
            if objs is not None:
                objs.auto_repack = on

    @property
    def repack_own(self) -> bool:
        """Whether this handle's background repacks merge only the packs it wrote
        (:attr:`ObjectStore.repack_own <castore.objectstore.ObjectStore.repack_own>`; its
        tenants' stores follow it): what writers importing side by side set
        (``import --jobs``), so that each merges its own packs, not all of them each."""
        return self._repack_own

    @repack_own.setter
    def repack_own(self, on: bool) -> None:
        with self._parts_lock:
            self._repack_own = on
            objs = self._built_objects()
            if objs is not None:
                objs.repack_own = on
        with self._tenants_lock:
            tenants = list(self._tenants.values())
        for t in tenants:
            t.repack_own = on

    @property
    def sealed(self) -> bool:
        """Whether this store's objects are sealed under keys (an encrypted store's tenant: its
        codec has a cipher), known without building its object store."""
        return self._codec is not None and self._codec.cipher is not None

    def _new_history(self) -> History:
        from .history import History

        return History(self.objects)

    def _new_plumbing(self) -> Plumbing:
        from .plumbing import Plumbing

        p = Plumbing(self.objects, self.refs, self.history, *([self._retry] if self._retry else []))
        p.redactor = self.redactor
        return p

    def _new_group_commit(self) -> GroupCommit:
        from .groupcommit import GroupCommit

        return GroupCommit(self.plumbing)

    # -- opening -----------------------------------------------------------------------
    @classmethod
    def open(cls, url: str | None = None, *, durable: bool = True, format: int | None = None,  # noqa: A002
             auto_repack: bool | None = None, layout: str | None = None,
             tenant_options: TenantOptions | None = None, encrypted: bool | None = None,
             master_key: KeyWrapper | bytes | str | None = None, key_store: str | None = None,
             **storage_options: Any) -> Store:
        """Open the store at ``url`` (default: ``$CASTORE_STORE`` or ``./.castore``).

        Args:
            url: a path, ``file://``, ``memory://name``, ``s3://bucket/prefix``, or any
                fsspec URL.
            durable: when False, local writes skip fsync (faster; a power loss may lose
                the last appends, never the store's consistency).
            format: the storage format (docs/FORMAT.md) a new store is created with; an
                existing store of a lower format is raised to it. Default for a new store:
                3 on local disk (packs, ref swaps journaled in the writer's log), 2 (packs)
                elsewhere; an existing store keeps its format (1: one file per object).
            auto_repack: format 2: merge small packs in the background of normal writes
                (docs/FORMAT.md, 8). Default: the store's ``auto_repack`` setting in
                castore.json, else True.
            layout: a new store's layout, ``"flat"`` (default) or ``"tenants"`` (see
                :class:`Store`); an existing store keeps its own (naming another is an error).
            tenant_options: see :class:`Store`.
            encrypted: True: a new store is created encrypted (docs/encryption.md: each tenant's
                objects sealed under its own keys, in the tenants layout), and an existing one
                must be. An existing encrypted store is recognised from its ``castore.json``
                whatever this says.
            master_key: the master key of an encrypted store: 32 bytes, base64 text (as
                ``castore key new`` prints), or a :class:`~castore.crypto.keys.KeyWrapper` (a
                KMS hook); default ``$CASTORE_MASTER_KEY``. Without one an encrypted store
                opens, lists its sessions, and refuses to read or write their contents.
            key_store: a new encrypted store's key store URL (default: its own ``keys/``).
            **storage_options: for the backend (``endpoint_url``, ``key``, ``secret``...).

        Raises:
            FormatError: the store was written by a newer castore, or its layout is not ``layout``;
                ``auto_repack`` is neither None nor a bool.
            StorageError: the backend cannot be reached; an option the storage does not take
                (:func:`~castore.storage.open_storage`), or ``durable`` not a bool.
            WrongKey: ``master_key`` is not the encrypted store's.
            EncryptionError: ``encrypted`` and the existing store is not; a malformed key.
        """
        url = url or default_url()
        check_url(url)
        try:
            store = cls(open_storage(url, durable=durable, **storage_options), format=format, auto_repack=auto_repack,
                        layout=layout, tenant_options=tenant_options, encrypted=encrypted, master_key=master_key,
                        key_store=key_store)
            store.open_options = {"durable": durable, **storage_options}
            return store
        except (StorageError, FormatError):
            raise
        except OSError as e:  # e.g. an fsspec backend that connects at once: unknown host, refused
            raise StorageError(f"cannot open store {url}: {e.strerror or e}", url) from e

    def _load_config(self) -> None:
        try:
            raw = self.storage.read(CONFIG_KEY)
        except FileNotFoundError:
            self._config = None
            return
        try:
            cfg = json.loads(raw)
            fmt = check_stored(cfg, self.url)
        except (ValueError, KeyError, TypeError) as e:
            raise FormatError(f"{self.url}/{CONFIG_KEY} is not a castore config ({e})") from e
        layout = cfg.get("layout", "flat")
        if layout not in LAYOUTS:
            raise FormatError(f"store {self.url} has layout {layout!r}, unknown to this castore. Upgrade castore.")
        if self._layout is not None and self._layout != layout:
            raise FormatError(f"store {self.url} has the {layout} layout, not {self._layout}; "
                              "a store's layout is chosen when it is created")
        self._set_format(fmt)
        if self._auto_repack is None:
            self._set_auto_repack(cfg.get("auto_repack", True))
        self._config = cfg
        self._initialized = True
        self._apply_redaction()

    @property
    def exists(self) -> bool:
        """Whether a store has been created at this URL."""
        if self._tenant_of is not None:
            return self._tenant_of[0].exists
        if not self._initialized:
            self._load_config()
        return self._initialized

    def require(self) -> None:
        """Raise :class:`StoreNotFound` when there is no store at this URL."""
        if not self.exists:
            raise StoreNotFound(self.url)

    def init(self, *, like: Store | None = None) -> bool:
        """Create the store if needed; return True if it was created now. A store created
        ``like`` another takes its storage format, and its layout unless this handle was
        opened with one (what a push to a new remote does).

        Raises:
            StorageError: the backend failed.
        """
        if self._tenant_of is not None:  # a tenant's folder is made by its first write
            return self._tenant_of[0].init(like=like)
        if self._initialized:
            return False
        with self._init_lock:
            if self._initialized:
                return False
            return self._create(like)

    def _create(self, like: Store | None) -> bool:
        """Write the store's ``castore.json`` (and an encrypted store's key store) unless a
        rival did first (:meth:`init`); return True if this call created it."""
        fmt, layout = self._new_format, self._layout
        if like is not None:
            fmt, layout = like.format, layout or like.layout
            self._set_format(fmt)
        cfg: dict[str, Any] = {"format": fmt, "created": time.time(), "remotes": {}}
        if layout not in (None, "flat"):
            cfg["layout"] = layout
        enc = None
        if like is not None and like.root.encryption is not None:
            # a copy of an encrypted store (a new remote, a clone): its key store's id and key
            # check, so that the tenant keys shared with it later open with the same master key
            enc = like.root.encryption.replicate(self.storage)
            self._master_key = like.root.encryption.keys.wrapper
        elif self._encrypted or self._master_key is not None or self._key_store is not None:
            from .crypto.encryption import create_store_keys  # (refuses a key for a plain store)

            try:
                enc = create_store_keys(self.storage, self._master_key, self._key_store, encrypted=self._encrypted)
            except EncryptionError:
                if not self.storage.exists(CONFIG_KEY):  # else a rival created the store first
                    raise
        if enc is not None:
            cfg.update(layout="tenants", encryption=enc.settings)
        try:
            self.storage.swap(CONFIG_KEY, json.dumps(cfg, indent=1).encode(), None)
            created = True
        except PreconditionFailed:
            created = False
        if enc is not None:
            enc.close()
        self._load_config()
        self._open_keys()
        return created

    def _open_keys(self) -> None:
        """Open the keys of an encrypted store (:attr:`encryption`) once its config is read
        (refusing a ``key_store`` it does not have: :func:`castore.crypto.args.check_encryption_args`)."""
        if not (self._config and (self._config.get("encryption") is not None or self._encrypted or self._key_store)):
            return
        from .crypto.encryption import open_store_keys

        self.encryption = open_store_keys(self.storage, self._config, self._master_key, encrypted=self._encrypted,
                                          key_store=self._key_store)

    @property
    def config(self) -> dict[str, Any]:
        """The store's configuration (``castore.json``), empty if not created yet."""
        if self._tenant_of is not None:
            return self._tenant_of[0].config
        return dict(self._config or {})

    def update_config(self, change: Any) -> dict[str, Any]:
        """Apply ``change(config) -> config`` by compare-and-swap on ``castore.json``.

        Raises:
            ConfigContended: ``castore.json`` kept changing until the retry policy ran out.
            StorageError: the backend failed.
        """
        if self._tenant_of is not None:
            return self._tenant_of[0].update_config(change)
        self.init()

        def attempt(_: int) -> dict[str, Any]:
            cur = self.storage.read_versioned(CONFIG_KEY)
            if cur is None:
                raise FormatError(f"{self.url}/{CONFIG_KEY} vanished while it was being changed")
            new = change(json.loads(cur.data))
            try:
                self.storage.swap(CONFIG_KEY, json.dumps(new, indent=1).encode(), cur.token)
            except PreconditionFailed as e:
                raise RefConflict(CONFIG_KEY, None, None) from e  # a lost race: retried
            return new

        def give_up(attempts: int, seconds: float) -> Exception:
            return ConfigContended(f"{self.url}/{CONFIG_KEY} kept changing under this writer "
                                   f"({attempts} attempts in {seconds:.1f}s); try again")

        new = self.plumbing.land(CONFIG_KEY, attempt, give_up=give_up)
        self._config = new
        self._apply_redaction()
        return new

    # -- tenants -----------------------------------------------------------------------
    @property
    def layout(self) -> str:
        """``"flat"`` or ``"tenants"`` (docs/FORMAT.md 2); a tenant's own store is flat."""
        if self._tenant_of is not None:
            return "flat"
        if not self._initialized:
            self._load_config()
        if self._config is not None:
            return str(self._config.get("layout", "flat"))
        return self._layout or "flat"

    @property
    def root(self) -> Store:
        """The store this one is a tenant of; itself for a root store."""
        return self._tenant_of[0] if self._tenant_of is not None else self

    @property
    def tenant_segments(self) -> tuple[str, str] | None:
        """(app segment, user segment) of a tenant's store; None for a root store."""
        return (self._tenant_of[1], self._tenant_of[2]) if self._tenant_of is not None else None

    def tenant(self, app: str, user: str | None) -> Store:
        """The store holding the refs and objects of ``app``'s ``user`` (None: the app's own
        scope, its app state): in the tenant layout the store under ``tenants/<app>/<user>/``
        (one handle per tenant, kept until :meth:`close`), else this store itself.

        Raises:
            InvalidName: a bad app or user name.
        """
        return self.root.tenant_at(*names.tenant_segments(app, user))

    def tenant_at(self, app_seg: str, user_seg: str) -> Store:
        """:meth:`tenant` by encoded segments (as listed under ``tenants/``).

        Raises:
            InvalidName: a segment castore does not write.
        """
        from .refnames import real_name, valid_segment

        if self._tenant_of is not None:
            if (app_seg, user_seg) == self._tenant_of[1:]:
                return self
            return self._tenant_of[0].tenant_at(app_seg, user_seg)
        if self._encrypted and self.encryption is None:
            self.init()  # a new encrypted store: its keys first, then its tenants' codecs
        if self.layout != "tenants":
            return self
        got = self._tenants.get((app_seg, user_seg))
        if got is not None:
            return got
        if not valid_segment(app_seg) or not (user_seg == names.APP_SCOPE or valid_segment(user_seg)):
            raise InvalidName(f"{app_seg}/{user_seg}", "not a tenant castore writes", "tenant")
        app = real_name(app_seg, None)
        user = None if user_seg == names.APP_SCOPE else real_name(user_seg, None)
        opts = dict(self._tenant_options(app, user)) if self._tenant_options is not None else {}
        if self.encryption is not None:  # its keys seal the tenant's objects, whatever the options say
            prefix = names.tenant_prefix(app_seg, user_seg)
            opts.update(self.encryption.options(app, user, lambda: bool(self.storage.list_dir(prefix))))
        with self._tenants_lock:
            got = self._tenants.get((app_seg, user_seg))
            if got is None:
                kw: dict[str, Any] = {"compress": self._compress, "retry": self._retry,
                                      "auto_repack": self._auto_repack, **opts}  # the options win
                got = Store(self.storage.child(names.tenant_prefix(app_seg, user_seg)),
                            _tenant_of=(self, app_seg, user_seg), **kw)
                if self.encryption is not None:
                    got.erased = self.encryption.erasure(app, user)
                self._tenants[(app_seg, user_seg)] = got
        return got

    def tenant_keys(self) -> list[tuple[str, str]]:
        """The (app segment, user segment) of every tenant that has written something, sorted
        (an app's own tenant has :data:`~castore.names.APP_SCOPE`); empty in a flat store.

        Raises:
            StorageError: the backend failed.
        """
        from .refnames import valid_segment

        if self.root is not self or self.layout != "tenants":
            return []
        out: list[tuple[str, str]] = []
        for a in self.storage.list_dir(names.TENANTS):
            if valid_segment(a):
                out.extend((a, u) for u in self.storage.list_dir(f"{names.TENANTS}/{a}")
                           if u == names.APP_SCOPE or valid_segment(u))
        return out

    def tenants(self) -> list[tuple[str, str | None]]:
        """The (app, user) of every tenant that has written something (user None: the app's
        own scope); empty in a flat store. A hashed long name reads as its segment.

        Raises:
            StorageError: the backend failed.
        """
        from .refnames import real_name

        return [(real_name(a, None), None if u == names.APP_SCOPE else real_name(u, None))
                for a, u in self.tenant_keys()]

    def stores(self) -> Iterator[Store]:
        """The stores holding data: every tenant's in the tenant layout (an erased tenant's
        excepted: :meth:`erased_stores`), else this one (what store-wide work such as fsck, gc
        or grep loops over).

        Raises:
            StorageError: the backend failed.
        """
        if self.root is self and self.layout == "tenants":
            for a, u in self.tenant_keys():
                t = self.tenant_at(a, u)
                if t.erased is None:
                    yield t
        else:
            yield self

    # -- redaction ---------------------------------------------------------------------
    @property
    def redactor(self) -> Redactor | None:
        """What redacts this handle's writes before they are stored (None: stored as given).

        Set by castore.json's ``"redact": true`` (:meth:`set_redact`) or, for this handle
        alone, by :meth:`redact_writes`; :mod:`castore.redact` says what is found.
        """
        if self._tenant_of is not None:  # the root's castore.json rules
            return self._tenant_of[0].redactor
        return self._redactor

    def redact_writes(self, on: bool = True) -> None:
        """Redact (``on``) or not every write of this handle, whatever castore.json says
        (``castore import --redact``); creates the store's redaction key if it has none.

        Raises:
            FormatError: castore.json holds a redaction key that is not one.
            ConfigContended, StorageError: creating the key failed.
        """
        if self._tenant_of is not None:  # a tenant's writes follow the root's handle
            return self.root.redact_writes(on)
        if on:
            self.redaction_key()
        self._redact = on
        self._apply_redaction()

    def set_redact(self, on: bool) -> None:
        """Set castore.json's ``"redact"``: every handle opened on this store from now on
        redacts every write (library appends, adapters, imports) when ``on``; this one too.

        Raises:
            FormatError, ConfigContended, StorageError.
        """
        self.redaction_key()
        self.update_config(lambda c: {**c, REDACT: bool(on)})

    def redaction_key(self) -> bytes:
        """The store's redaction key (castore.json ``"redact_key"``), created when there is none.

        The key lives in castore.json: read at every open anyway (no request more on object
        storage), created by the compare-and-swap every config change goes through (two
        machines turning redaction on at once end up with one key, so their tags agree), and
        kept with the store it names (a copy of the store keeps its tags linkable). Whoever
        can read castore.json can read the sessions too; with the key one can only test a
        guessed secret against a tag, never read a secret back.

        Raises:
            FormatError: ``"redact_key"`` is not 64 hex digits.
            ConfigContended, StorageError: creating it failed.
        """
        if self._tenant_of is not None:
            return self.root.redaction_key()
        key = self.stored_redaction_key()
        if key is None:
            from .redact import new_key as new_redaction_key

            fresh = new_redaction_key().hex()
            self.update_config(lambda c: c if c.get(REDACT_KEY) else {**c, REDACT_KEY: fresh})
            key = self.stored_redaction_key()
            assert key is not None
        return key

    def stored_redaction_key(self) -> bytes | None:
        """The store's redaction key, None when it has none yet (nothing is written).

        Raises:
            FormatError: ``"redact_key"`` is not 64 hex digits.
        """
        from .redact import KEY_BYTES

        if self._tenant_of is not None:
            return self.root.stored_redaction_key()
        value = (self._config or {}).get(REDACT_KEY)
        if value is None:
            return None
        try:
            key = bytes.fromhex(value) if isinstance(value, str) else b""
        except ValueError:
            key = b""
        if len(key) != KEY_BYTES:
            raise FormatError(f"{self.url}/{CONFIG_KEY}: {REDACT_KEY!r} is not {2 * KEY_BYTES} hex digits")
        return key

    def _apply_redaction(self) -> None:
        """Set the plumbing's redactor from this handle's choice, else from castore.json (and
        the redactor of every tenant's store this handle opened)."""
        on = self._redact if self._redact is not None else bool((self._config or {}).get(REDACT))
        key = self.stored_redaction_key() if on else None
        if key is None:
            self._redactor = None
        elif self._redactor is None or self._redactor.key != key:
            from .redact import Redactor

            self._redactor = Redactor(key)
        # the plumbings built so far (this store's, its tenants'); one built later asks redactor
        for st in [self, *getattr(self, "_tenants", {}).values()]:
            built = vars(st).get("plumbing")
            if built is not None:
                built.redactor = self._redactor

    def erased_stores(self) -> list[Store]:
        """The stores of the tenants whose keys were erased, their bytes still there (until
        gc deletes them); empty in a plain store.

        Raises:
            StorageError: the backend failed.
        """
        if self.root is not self or self.encryption is None:
            return []
        erased = [t for t in (self.tenant_at(a, u) for a, u in self.tenant_keys()) if t.erased is not None]
        return [t for t in erased if t.storage.list("")]  # a folder gc emptied may stay behind, empty

    def batch(self) -> WriteBatch:
        """A write batch: ``with store.batch() as b:`` stages every ref move this thread makes
        (in this store and its tenants' stores) and lands them together, as groups of
        compare-and-swaps (on local disk in format 3: one sync per group instead of one per
        move); ``b.land()`` lands what is staged so far. Reads of refs in this thread see
        what is staged (listings, :meth:`sessions` and :meth:`apps`, show what has landed),
        and a ref read once reads the same until the next landing or this thread's move of it
        (a re-import reads each session's HEAD once); other threads see the store as landed.
        The objects this thread writes are held in memory (readable through this handle) and
        written by each landing, before its refs. Stopped before a landing (kill -9, Ctrl-C),
        nothing of the batch's since is stored and nothing before is lost. See :class:`~castore.groupcommit.WriteBatch`.

        Raises:
            nothing itself; leaving the block or ``land()``: RefConflict (a ref moved under
            the batch: that session's HEAD did not move), RefLocked, StorageError.
        """
        if self.root is not self:
            return self.root.batch()
        from .groupcommit import WriteBatch

        return WriteBatch(lambda: [self.plumbing, *(t.plumbing for t in list(self._tenants.values()))])

    # -- sessions ----------------------------------------------------------------------
    def session(self, app: str, user: str, session_id: str) -> Session:
        """The session with this key (nothing is written before its first append); in the
        tenant layout, on its tenant's store.

        Raises:
            InvalidName: a part of the key is not a valid name.
        """
        home = self.tenant(app, user)
        if home is not self:
            return home.session(app, user, session_id)
        from .session import Session

        return Session(self, app, user, session_id)

    def sessions(self, app: str, user: str | None = None) -> list[SessionInfo]:
        """The sessions of an app (or of one user of it), newest first.

        Reads each session's HEAD and branch ref, never its history.

        Raises:
            InvalidName: a bad app or user name.
            StorageError: the backend failed.
        """
        from .refnames import valid_segment

        app_seg = names.encode(app, "app name")
        if user is not None:
            user_segs = [names.encode(user, "user name")]
            home = self.tenant(app, user)
            if home is not self:
                return home.sessions(app, user)
        elif self.root.layout == "tenants":
            out: list[SessionInfo] = []
            for useg in self.root.storage.list_dir(f"{names.TENANTS}/{app_seg}"):
                if valid_segment(useg):
                    out.extend(self.tenant_at(app_seg, useg).sessions_of(app_seg, [useg]))
            out.sort(key=lambda s: s.updated, reverse=True)
            return out
        else:
            user_segs = self.refs.list_dir(f"sessions/{app_seg}")
        return self.sessions_of(app_seg, user_segs)

    def sessions_of(self, app_seg: str, user_segs: Sequence[str]) -> list[SessionInfo]:
        """:meth:`sessions` of this store's refs for an app's users, by encoded segments
        (:func:`castore.sessionlist.sessions_of`).

        Raises:
            StorageError: the backend failed.
        """
        from .sessionlist import sessions_of

        return sessions_of(self.refs, app_seg, user_segs, lambda: self.objects.codec)

    def session_refs(self, folders: Iterable[str] | None = None
                     ) -> dict[tuple[str, str, str], tuple[str, dict[str, str]]]:
        """Every session's ref folder (``sessions/A/U/S``) and refs (name -> target; HEAD too
        when detached), by ``(app, user, session)``: :meth:`session_refs_and_heads` without
        the branches HEADs are on. Only the sessions of these ref ``folders`` when given.

        Raises:
            IntegrityError, StorageError.
        """
        return {k: (f, refs) for k, (f, refs, _h) in self.session_refs_and_heads(folders).items()}

    def session_refs_and_heads(
            self, folders: Iterable[str] | None = None, lost: dict[tuple[str, str, str], CorruptRef] | None = None,
    ) -> dict[tuple[str, str, str], tuple[str, dict[str, str], str | None]]:
        """Every session's ref folder, refs and the branch segment its HEAD is on, by ``(app,
        user, session)``; the sessions whose HEAD names a lost branch noted in ``lost``
        (:func:`castore.sessionlist.session_refs_and_heads`, which says what is left out).

        Raises:
            IntegrityError, StorageError.
        """
        from .sessionlist import session_refs_and_heads

        return session_refs_and_heads(self.refs, folders, lost)

    def apps(self) -> list[str]:
        """Names of the apps that have sessions.

        Raises:
            StorageError: the backend failed.
        """
        from .refnames import real_name, valid_segment

        if self.root.layout == "tenants":
            return [real_name(a, None) for a in self.root.storage.list_dir(names.TENANTS) if valid_segment(a)]
        return [real_name(a, None) for a in self.refs.list_dir("sessions") if valid_segment(a)]

    def delete_session(self, app: str, user: str, session_id: str) -> None:
        """Delete a session's refs (its objects go at the next ``gc``), HEAD marked deleting
        first (:func:`castore.deletion.delete_session_refs`); finishes a deletion of it that
        was interrupted.

        Raises:
            SessionNotFound: the session does not exist.
            RefContended: rivals kept moving its refs. InvalidName, StorageError.
        """
        from .deletion import delete_session_refs
        from .refnames import session_prefix

        home = self.tenant(app, user)
        if home is not self:
            return home.delete_session(app, user, session_id)
        if not delete_session_refs(self.plumbing, session_prefix(app, user, session_id)):
            raise SessionNotFound((app, user, session_id))

    # -- app- and user-scoped state (castore.scopes) -------------------------------------------
    def scope_head(self, app: str, user: str | None = None) -> str | None:
        """The commit id of the app state (``user=None``) or of a user's state, or None.

        Raises:
            InvalidName, IntegrityError, StorageError.
        """
        from .refnames import scope_ref

        home = self.tenant(app, user)
        if home is not self:
            return home.scope_head(app, user)
        v = self.refs.read(scope_ref(app, user))
        return v.target if v is not None else None

    def update_scope(
        self, app: str, user: str | None, delta: Mapping[str, Any], unset: tuple[str, ...] = (), author: str = ""
    ) -> str:
        """Commit a change to app state (``user=None``) or user state; return the commit id.

        A lost compare-and-swap is retried on the new tip: changes are never lost.

        Raises:
            InvalidName, InvalidEntry, StorageError.
        """
        return self.update_scope_many(app, user, [(delta, unset)], author)[-1]

    def update_scope_many(self, app: str, user: str | None, changes: Changes, author: str = "") -> list[str]:
        """Commit several changes to app or user state as a chain moved by one ref swap.

        Each ``(delta, unset)`` becomes its own commit, so that the state after each change
        can be named (a turn's entries each record the scope state after their own change).

        Returns:
            The commit ids, one per change, in order.

        Raises:
            InvalidName, InvalidEntry, StorageError.
        """
        return self.publish_scope_changes(self.prepare_scope_changes(app, user, changes, author))

    def prepare_scope_changes(self, app: str, user: str | None, changes: Changes, author: str = "") -> ScopePlan:
        """Write the commits of ``changes`` on the scope's current tip, without moving its ref
        (:func:`castore.scopes.prepare`).

        :meth:`publish_scope_changes` moves the ref; until then nothing reads the commits.

        Raises:
            InvalidName, InvalidEntry, StorageError.
        """
        from . import scopes
        from .refnames import scope_ref

        scopes.check_changes(changes, author)
        home = self.tenant(app, user)
        if home is not self:
            return home.prepare_scope_changes(app, user, changes, author)
        self.init()
        return scopes.prepare(self.plumbing, scope_ref(app, user), changes, author)

    def publish_scope_changes(self, plan: ScopePlan) -> list[str]:
        """Move the scope's ref to a prepared chain; if the scope moved meanwhile, write the
        same changes again on its new tip (changes apply after whatever is there;
        :func:`castore.scopes.publish`).

        Returns:
            The commit ids the ref now reaches for the changes, in order.

        Raises:
            RefContended: the scope kept changing (see :class:`~castore.retry.RetryPolicy`).
            StorageError: the backend failed.
        """
        from . import scopes
        from .refnames import parse_ref_name

        p = parse_ref_name(plan.ref) if self.root.layout == "tenants" else None
        home = self if p is None else self.tenant_at(*p.tenant)
        if home is not self:
            return home.publish_scope_changes(plan)
        return scopes.publish(self.plumbing, plan)

    def scope_heads(self, app: str, user: str) -> tuple[str | None, str | None]:
        """The current app-state and user-state commits, read in one batch.

        Raises:
            InvalidName, IntegrityError, StorageError.
        """
        from .refnames import scope_ref

        a, u = scope_ref(app, None), scope_ref(app, user)
        if self.root.layout == "tenants":  # two tenants' stores
            return self.scope_head(app, None), self.scope_head(app, user)
        got = self.refs.read_many([a, u])
        app_v, user_v = got[a], got[u]
        return (app_v.target if app_v else None, user_v.target if user_v else None)

    def scope_states(self, commits: list[str | None]) -> list[dict[str, Any]]:
        """The states of several scope commits (None: empty), read in shared batches.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        from . import scopes

        return scopes.states(self.history, self.objects, commits)

    def scope_pair_states(self, app: str, user: str, app_commit: str | None,
                          user_commit: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """The app state at ``app_commit`` and ``user``'s state at ``user_commit`` (None:
        empty), each read from the store holding it (one shared batch in a flat store).

        Raises:
            InvalidName, ObjectNotFound, IntegrityError, StorageError.
        """
        app_home, user_home = self.tenant(app, None), self.tenant(app, user)
        if app_home is user_home:
            a, u = app_home.scope_states([app_commit, user_commit])
            return a, u
        return app_home.scope_states([app_commit])[0], user_home.scope_states([user_commit])[0]

    def scope_state(self, app: str, user: str | None = None, rev: str | None = None) -> dict[str, Any]:
        """The app state (``user=None``) or a user's state, now or at commit ``rev``.

        Raises:
            InvalidName, ObjectNotFound, IntegrityError, StorageError.
        """
        from . import scopes

        home = self.tenant(app, user)
        if home is not self:
            return home.scope_state(app, user, rev)
        return scopes.state_at(self.history, self.objects, rev or self.scope_head(app, user))

    def scope_log(self, app: str, user: str | None = None) -> list[tuple[str, Commit]]:
        """The history of the app or user state, newest first.

        Raises:
            InvalidName, ObjectNotFound, IntegrityError, StorageError.
        """
        from . import scopes

        home = self.tenant(app, user)
        if home is not self:
            return home.scope_log(app, user)
        return scopes.log(self.history, self.scope_head(app, user))

    def app_state(self, app: str) -> dict[str, Any]:
        """The current app-scoped state (keys without the ``app:`` prefix).

        Raises:
            InvalidName, ObjectNotFound, IntegrityError, StorageError.
        """
        return self.scope_state(app, None)

    def user_state(self, app: str, user: str) -> dict[str, Any]:
        """The current user-scoped state of ``user`` in ``app`` (keys without ``user:``).

        Raises:
            InvalidName, ObjectNotFound, IntegrityError, StorageError.
        """
        return self.scope_state(app, user)

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        """Release the backend's resources (and this handle's pack log), and those of the
        tenants' stores it opened."""
        with self._tenants_lock:
            subs, self._tenants = list(self._tenants.values()), {}
        for sub in subs:
            sub.close()
        if self.encryption is not None:
            self.encryption.close()
        objs = self._built_objects()
        if objs is not None:
            objs.close()
        self.storage.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await to_thread(self.close)

    async def asessions(self, app: str, user: str | None = None) -> list[SessionInfo]:
        """Async twin of :meth:`sessions`."""
        return await to_thread(self.sessions, app, user)

    async def adelete_session(self, app: str, user: str, session_id: str) -> None:
        """Async twin of :meth:`delete_session`."""
        await to_thread(self.delete_session, app, user, session_id)

    async def aapp_state(self, app: str) -> dict[str, Any]:
        """Async twin of :meth:`app_state`."""
        return await to_thread(self.app_state, app)

    async def auser_state(self, app: str, user: str) -> dict[str, Any]:
        """Async twin of :meth:`user_state`."""
        return await to_thread(self.user_state, app, user)

    async def ascope_state(self, app: str, user: str | None = None, rev: str | None = None) -> dict[str, Any]:
        """Async twin of :meth:`scope_state`."""
        return await to_thread(self.scope_state, app, user, rev)

    async def ascope_log(self, app: str, user: str | None = None) -> list[tuple[str, Commit]]:
        """Async twin of :meth:`scope_log`."""
        return await to_thread(self.scope_log, app, user)

    async def aupdate_scope(
        self, app: str, user: str | None, delta: Mapping[str, Any], unset: tuple[str, ...] = (), author: str = ""
    ) -> str:
        """Async twin of :meth:`update_scope`."""
        return await to_thread(self.update_scope, app, user, delta, unset, author)

    def __repr__(self) -> str:
        return f"<castore.Store {self.url}>"


def open(url: str | None = None, *, durable: bool = True, format: int | None = None,  # noqa: A001,A002 - as io.open
         auto_repack: bool | None = None, layout: str | None = None, tenant_options: TenantOptions | None = None,
         encrypted: bool | None = None, master_key: KeyWrapper | bytes | str | None = None,
         key_store: str | None = None, **storage_options: Any) -> Store:
    """Open the store at ``url`` (default: see :func:`default_url`); see :meth:`Store.open`.

    Raises:
        StorageError: the URL looks mistyped (``s3:/bucket``) or the backend cannot be reached.
        FormatError: the store was written by a newer castore, or its layout is not ``layout``.
        WrongKey, EncryptionError: see :meth:`Store.open`.
    """
    return Store.open(url, durable=durable, format=format, auto_repack=auto_repack, layout=layout,
                      tenant_options=tenant_options, encrypted=encrypted, master_key=master_key,
                      key_store=key_store, **storage_options)


class ConfigContended(CastoreError):
    """``castore.json`` kept changing under a writer until the retry policy ran out."""


__all__ = ["Store", "SessionInfo", "ScopePlan", "open", "default_url", "store_dir", "STORE_DIR", "check_url",
           "ObjectId", "RefValue"]


def __getattr__(name: str) -> Any:
    """``castore.store.ScopePlan``, which is :mod:`castore.scopes`', ``ObjectId``,
    :mod:`castore.objects`', and ``SessionInfo``, :mod:`castore.listing`'s, imported when asked for."""
    if name == "SessionInfo":
        from .listing import SessionInfo

        return SessionInfo
    if name == "ScopePlan":
        from .scopes import ScopePlan

        return ScopePlan
    if name == "ObjectId":
        from .objects import ObjectId

        return ObjectId
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

