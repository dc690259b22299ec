"""The store: one root URL holding objects and refs for every session of every app and user.

Open one with :func:`castore.open`. A store is created on its first write (a
``castore.json`` with the format number is written then); reading from a URL with no store
behind it raises :class:`~castore.errors.StoreNotFound`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import names
from . import objects as o
from .aio import to_thread
from .errors import (
    FormatError,
    IntegrityError,
    RefConflict,
    SessionNotFound,
    StoreNotFound,
)
from .history import History
from .objects import Commit, ObjectId
from .objectstore import DEFAULT_FORMAT, STORE_FORMAT, ObjectStore
from .refs import RefStore, RefValue
from .refs import parse as parse_ref
from .state import StateWriter, read_state, read_states
from .storage import Storage, open_storage

CONFIG_KEY = "castore.json"
DEFAULT_URL = "./.castore"


@dataclass(frozen=True)
class ScopePlan:
    """App or user state changes written as commits, waiting for their ref to move."""

    ref: str
    base: RefValue | None
    changes: tuple[tuple[dict[str, Any], tuple[str, ...]], ...]
    author: str
    ids: tuple[str, ...]


@dataclass(frozen=True)
class SessionInfo:
    """A session as listed: its key, where its leaf is, and when it last changed."""

    app: str
    user: str
    session: str
    head: str | None
    branch: str | None
    updated: float
    entries: int
    info: Mapping[str, Any]


def default_url() -> str:
    """``$CASTORE_STORE``, or ``./.castore``."""
    return os.environ.get("CASTORE_STORE") or DEFAULT_URL


class Store:
    """Objects and refs under one root; the factory of :class:`~castore.session.Session`.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, storage: Storage, *, compress: bool = True, format: int | None = None) -> None:  # noqa: A002
        self.storage = storage
        self.url = storage.url
        self.objects = ObjectStore(storage, compress=compress)
        self.refs = RefStore(storage)
        self.history = History(self.objects)
        self._config: dict[str, Any] | None = None
        self._initialized = False
        self._new_format = DEFAULT_FORMAT if format is None else format
        self.objects.set_format(self._new_format)  # refuses an unknown format
        self._load_config()
        if format is not None and self._initialized and self.objects.format < format:
            self.update_config(lambda c: {**c, "format": max(c.get("format", 1), format)})
            self._load_config()

    # -- opening -----------------------------------------------------------------------
    @classmethod
    def open(cls, url: str | None = None, *, durable: bool = True, format: int | None = None,  # noqa: A002
             **storage_options: Any) -> Store:
        """Open the store at ``url`` (default: ``$CASTORE_STORE`` or ``./.castore``).

        Args:
            url: a path, ``file://``, ``memory://name``, ``s3://bucket/prefix``, or any
                fsspec URL.
            durable: when False, local writes skip fsync (faster; a power loss may lose
                the last appends, never the store's consistency).
            format: the storage format (docs/FORMAT.md) a new store is created with; an
                existing store of a lower format is raised to it (2: packs). Default: 1.
            **storage_options: for the backend (``endpoint_url``, ``key``, ``secret``...).

        Raises:
            FormatError: the store was written by a newer castore.
            StorageError: the backend cannot be reached.
        """
        return cls(open_storage(url or default_url(), durable=durable, **storage_options), format=format)

    def _load_config(self) -> None:
        try:
            raw = self.storage.read(CONFIG_KEY)
        except FileNotFoundError:
            self._config = None
            return
        try:
            cfg = json.loads(raw)
            fmt = cfg["format"]
        except (ValueError, KeyError, TypeError) as e:
            raise FormatError(f"{self.url}/{CONFIG_KEY} is not a castore config ({e})") from e
        if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt > STORE_FORMAT or fmt < 1:
            raise FormatError(
                f"store {self.url} has format {fmt!r}; this castore reads format {STORE_FORMAT} and older. "
                "Upgrade castore.",
                found=fmt,
                supported=STORE_FORMAT,
            )
        self.objects.set_format(fmt)
        self._config = cfg
        self._initialized = True

    @property
    def exists(self) -> bool:
        """Whether a store has been created at this URL."""
        if not self._initialized:
            self._load_config()
        return self._initialized

    def require(self) -> None:
        """Raise :class:`StoreNotFound` when there is no store at this URL."""
        if not self.exists:
            raise StoreNotFound(self.url)

    def init(self) -> bool:
        """Create the store if needed; return True if it was created now.

        Raises:
            StorageError: the backend failed.
        """
        if self._initialized:
            return False
        cfg = {"format": self._new_format, "created": time.time(), "remotes": {}}
        from .storage import PreconditionFailed

        try:
            self.storage.swap(CONFIG_KEY, json.dumps(cfg, indent=1).encode(), None)
            created = True
        except PreconditionFailed:
            created = False
        self._load_config()
        return created

    @property
    def config(self) -> dict[str, Any]:
        """The store's configuration (``castore.json``), empty if not created yet."""
        return dict(self._config or {})

    def update_config(self, change: Any) -> dict[str, Any]:
        """Apply ``change(config) -> config`` by compare-and-swap on ``castore.json``.

        Raises:
            StorageError: the backend failed.
        """
        from .storage import PreconditionFailed

        self.init()
        for _ in range(20):
            cur = self.storage.read_versioned(CONFIG_KEY)
            assert cur is not None
            new = change(json.loads(cur.data))
            try:
                self.storage.swap(CONFIG_KEY, json.dumps(new, indent=1).encode(), cur.token)
            except PreconditionFailed:
                continue
            self._config = new
            return new
        raise RefConflict(CONFIG_KEY, None, None, "castore.json kept changing; try again")

    # -- sessions ----------------------------------------------------------------------
    def session(self, app: str, user: str, session_id: str) -> Session:
        """The session with this key (nothing is written before its first append).

        Raises:
            InvalidName: a part of the key is not a valid name.
        """
        from .session import Session

        return Session(self, app, user, session_id)

    def sessions(self, app: str, user: str | None = None) -> list[SessionInfo]:
        """The sessions of an app (or of one user of it), newest first.

        Reads each session's HEAD and branch ref, never its history.

        Raises:
            InvalidName: a bad app or user name.
            StorageError: the backend failed.
        """
        app_seg = names.encode(app, "app name")
        if user is not None:
            user_segs = [names.encode(user, "user name")]
        else:
            user_segs = self.refs.list_dir(f"sessions/{app_seg}")
        heads: list[str] = []
        for useg in user_segs:
            for sseg in self.refs.list_dir(f"sessions/{app_seg}/{useg}"):
                heads.append(f"sessions/{app_seg}/{useg}/{sseg}/HEAD")
        got = self._read_refs_skipping_damage(heads)
        branch_refs = {}
        for h, v in got.items():
            if v is not None and v.symbolic:
                branch_refs[h] = h.rsplit("/", 1)[0] + "/" + v.symbolic
        tips = self._read_refs_skipping_damage(list(branch_refs.values()))
        out: list[SessionInfo] = []
        for h, v in got.items():
            if v is None:
                continue
            _, aseg, useg, sseg, _ = h.split("/")
            nm = v.meta.get("names", {})
            tipv = tips.get(branch_refs[h]) if h in branch_refs else v
            head = tipv.target if tipv is not None and not tipv.symbolic else None
            branch = v.symbolic.split("/", 1)[1] if v.symbolic else None
            if branch is not None and names.is_hashed(branch):
                branch = (tipv.meta.get("name") if tipv else None) or branch
            elif branch is not None:
                branch = names.decode(branch)
            meta = tipv.meta if tipv is not None else {}
            out.append(
                SessionInfo(
                    app=nm.get("app") or _decode(aseg),
                    user=nm.get("user") or _decode(useg),
                    session=nm.get("session") or _decode(sseg),
                    head=head,
                    branch=branch,
                    updated=float(meta.get("t", v.meta.get("t", 0.0))),
                    entries=int(meta.get("n", 0)),
                    info=v.meta.get("info", {}),
                )
            )
        out.sort(key=lambda s: s.updated, reverse=True)
        return out

    def _read_refs_skipping_damage(self, refs: list[str]) -> dict[str, RefValue | None]:
        """Read refs in one batch; a garbage ref reads as absent (``fsck`` reports it), so
        one damaged session does not hide the others from a listing."""
        got = self.storage.read_many([f"refs/{r}" for r in refs])
        out: dict[str, RefValue | None] = {}
        for r in refs:
            raw = got.get(f"refs/{r}")
            try:
                out[r] = parse_ref(r, raw) if raw is not None else None
            except IntegrityError:
                out[r] = None
        return out

    def apps(self) -> list[str]:
        """Names of the apps that have sessions.

        Raises:
            StorageError: the backend failed.
        """
        return [_decode(a) for a in self.refs.list_dir("sessions")]

    def delete_session(self, app: str, user: str, session_id: str) -> None:
        """Delete a session's refs (its objects go at the next ``gc``).

        Raises:
            SessionNotFound: the session does not exist.
            InvalidName, StorageError.
        """
        prefix = "sessions/" + names.encode_key(app, user, session_id)
        found = self.refs.list(prefix)
        if not found:
            raise SessionNotFound((app, user, session_id))
        for name in sorted(found, key=lambda n: n.endswith("/HEAD")):
            self.refs.delete(name)

    # -- app- and user-scoped state ----------------------------------------------------------
    def _scope_ref(self, app: str, user: str | None) -> str:
        base = f"state/{names.encode(app, 'app name')}"
        return f"{base}/app" if user is None else f"{base}/users/{names.encode(user, 'user name')}"

    def scope_head(self, app: str, user: str | None = None) -> str | None:
        """The commit id of the app state (``user=None``) or of a user's state, or None.

        Raises:
            InvalidName, IntegrityError, StorageError.
        """
        v = self.refs.read(self._scope_ref(app, user))
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

    def update_scope_many(
        self,
        app: str,
        user: str | None,
        changes: Sequence[tuple[Mapping[str, Any], tuple[str, ...]]],
        author: str = "",
    ) -> list[str]:
        """Commit several changes to app or user state as a chain moved by one ref swap.

        Each ``(delta, unset)`` becomes its own commit, so that the state after each change
        can be named (a turn's entries each record the scope state after their own change).

        Returns:
            The commit ids, one per change, in order.

        Raises:
            InvalidName, InvalidEntry, StorageError.
        """
        return self.publish_scope_changes(self.prepare_scope_changes(app, user, changes, author))

    def prepare_scope_changes(
        self,
        app: str,
        user: str | None,
        changes: Sequence[tuple[Mapping[str, Any], tuple[str, ...]]],
        author: str = "",
    ) -> ScopePlan:
        """Write the commits of ``changes`` on the scope's current tip, without moving its ref.

        :meth:`publish_scope_changes` moves the ref; until then nothing reads the commits.

        Raises:
            InvalidName, InvalidEntry, StorageError.
        """
        self.init()
        ref = self._scope_ref(app, user)
        return self._scope_chain(ref, self.refs.read(ref), changes, author)

    def _scope_chain(self, ref: str, cur: RefValue | None,
                     changes: Sequence[tuple[Mapping[str, Any], tuple[str, ...]]], author: str) -> ScopePlan:
        parent = self.history.commit(cur.target) if cur is not None else None
        writer = StateWriter(self.objects)
        tip, tree = (cur.target if cur else None), (parent.state if parent else None)
        depth = parent.depth + 1 if parent else 0
        ids: list[str] = []
        now = time.time()
        for delta, unset in changes:
            tree = writer.apply(tree, delta, tuple(unset))
            commit = Commit(
                kind="state",
                parents=(o.raw_id(tip),) if tip else (),
                state=tree,
                delta=dict(delta),
                unset=tuple(unset),
                author=author,
                time=now,
                depth=depth,
            )
            cid, canonical = o.encode(commit)
            writer.pending[cid] = canonical
            self.objects.cache(cid, commit)
            ids.append(cid)
            tip, depth = cid, depth + 1
        self.objects.put_encoded(writer.pending.items())
        return ScopePlan(ref, cur, tuple((dict(d), tuple(u)) for d, u in changes), author, tuple(ids))

    def publish_scope_changes(self, plan: ScopePlan) -> list[str]:
        """Move the scope's ref to a prepared chain; if the scope moved meanwhile, write the
        same changes again on its new tip (changes apply after whatever is there).

        Returns:
            The commit ids the ref now reaches for the changes, in order.

        Raises:
            StorageError: the backend failed.
        """
        while True:
            try:
                self.refs.swap(plan.ref, plan.ids[-1], plan.base, {"t": time.time()})
                return list(plan.ids)
            except RefConflict:
                plan = self._scope_chain(plan.ref, self.refs.read(plan.ref), plan.changes, plan.author)

    def scope_heads(self, app: str, user: str) -> tuple[str | None, str | None]:
        """The current app-state and user-state commits, read in one batch.

        Raises:
            InvalidName, IntegrityError, StorageError.
        """
        a, u = self._scope_ref(app, None), self._scope_ref(app, user)
        got = self.refs.read_many([a, u])
        return (got[a].target if got[a] else None, got[u].target if got[u] else None)  # type: ignore[union-attr]

    def scope_states(self, commits: list[str | None]) -> list[dict[str, Any]]:
        """The states of several scope commits (None: empty), read in shared batches.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        wanted = [c for c in commits if c is not None]
        got = self.history.commits(wanted) if wanted else {}
        trees = read_states(self.objects, [got[c].state if c is not None else None for c in commits])
        return [t if c is not None else {} for c, t in zip(commits, trees, strict=True)]

    def scope_state(self, app: str, user: str | None = None, rev: str | None = None) -> dict[str, Any]:
        """The app state (``user=None``) or a user's state, now or at commit ``rev``.

        Raises:
            InvalidName, ObjectNotFound, IntegrityError, StorageError.
        """
        cid = rev or self.scope_head(app, user)
        if cid is None:
            return {}
        return read_state(self.objects, self.history.commit(cid).state)

    def scope_log(self, app: str, user: str | None = None) -> list[tuple[str, Commit]]:
        """The history of the app or user state, newest first.

        Raises:
            InvalidName, ObjectNotFound, IntegrityError, StorageError.
        """
        head = self.scope_head(app, user)
        if head is None:
            return []
        return list(reversed(self.history._walk_all(head)))  # noqa: SLF001 - scope chains are short

    def app_state(self, app: str) -> dict[str, Any]:
        """The current app-scoped state (keys without the ``app:`` prefix)."""
        return self.scope_state(app, None)

    def user_state(self, app: str, user: str) -> dict[str, Any]:
        """The current user-scoped state of ``user`` in ``app`` (keys without ``user:``)."""
        return self.scope_state(app, user)

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        """Release the backend's resources (and this handle's pack log)."""
        self.objects.close()
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


def _decode(seg: str) -> str:
    try:
        return names.decode(seg)
    except Exception:  # noqa: BLE001 - a hashed or foreign segment is shown as is
        return seg


def open(url: str | None = None, *, durable: bool = True, format: int | None = None,  # noqa: A001,A002
         **storage_options: Any) -> Store:
    """Open the store at ``url``; see :meth:`Store.open`."""
    return Store.open(url, durable=durable, format=format, **storage_options)


from .session import Session  # noqa: E402  (circular: Session needs Store's type only)

__all__ = ["Store", "SessionInfo", "open", "default_url", "ObjectId", "RefValue", "Session"]
