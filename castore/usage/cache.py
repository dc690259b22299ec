"""Every session's usage rows, read as little as a run can: through the cache of rows, and on a
first run through one store-wide pass of the stored commits, shared with a forked worker.

Counting is cached: the rows read from each session are kept in a local file
(``$CASTORE_USAGE_CACHE``, else ``~/.cache/castore/usage/<digest of the store URL>.json``) with
the refs they were read at and the branch HEAD was on (a checkout moves the rows of the commits
two branches hold); the next run reads again only the sessions whose refs moved (on
local disk the ref-change log tells which, without reading a ref), and ``castore import``
brings an existing cache up to date as it does the search index (:func:`update_if_present`), and so
do ``delete-session``, ``expire`` and a gc's retention (a deleted session's name and models leave it,
and so do the new cache files that runs killed before renaming them left: :func:`_clear_dead_temps`).
The ref-change log names castore's own changes only (its writes of a ref file in place
included, logged before they are made); a ref file edited, removed or rewritten in place by
hand is seen when its session's refs next move, or once the cache is deleted.
The cache is derived data: deleting it loses nothing, and a cache file of another shape
(damaged, edited by hand, another version's) is read as none. An encrypted store is never cached
(its counts and session names would be in the clear): every run reads every session.

A run that reads most of a store's sessions (the first one, with no cache) first decodes every
commit of the store in one pass over its packs (:func:`load_commits`), then walks each path
through them, with no read per commit; a run that reads a few sessions reads their paths one
by one. Where the process may fork (:func:`castore.forked.can_fork`: one thread, two cores),
the pass and the paths are shared with a forked worker (:func:`_start_worker`,
:func:`_read_shared`), each reading a share of the records and the sessions that share holds
whole: the worker starts on its share before the refs are read (which the process reads and
then sends it), and takes the larger share for it. A worker that raises or dies (killed: the
OOM killer) leaves its share to the process, which reads it too: the same report, the cache
saved; a worker whose process dies is killed with it (:mod:`castore.forked`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict, cast

from ..cachedir import kind_folder, store_digest, store_url
from ..errors import InvalidEntry
from ..forked import Forked, WorkerDied
from ..gcpause import gc_paused
from ..objects import json_dumps_sorted, json_loads_as
from .rows import Elsewhere, Key, Row, session_rows

if TYPE_CHECKING:
    from ..errors import CorruptRef
    from ..objects import Commit
    from ..store import Store

#: the version of the cache file (a file of another version is not read)
CACHE_VERSION = 1
#: reading at least this many sessions (and half the store's), every commit is decoded in one
#: store-wide pass first (:func:`load_commits`)
SCAN_MIN_SESSIONS = 64
#: the most commits :func:`load_commits` keeps decoded (a bound on its memory: about 1 KiB each)
SCAN_MAX_COMMITS = 150_000


def cache_path(store: Store) -> str:
    """The file the usage rows of ``store`` are cached in (see the module docstring)."""
    if store.root is not store:  # a tenant's rows: beside the root store's, named by a digest of
        # its folder (segments joined by "-" named tenants a-b/c and a/b-c alike, and two long
        # segments made a name no file system takes)
        folder = "/".join(store.tenant_segments or ())
        return cache_path(store.root) + "." + hashlib.sha256(folder.encode()).hexdigest()[:16]
    got = os.environ.get("CASTORE_USAGE_CACHE")
    if got:
        return got
    return os.path.join(kind_folder("usage"), store_digest(store) + ".json")


class _CachedSession(TypedDict):
    """A session in the cache file: its key, the refs and branch its rows were read at, the rows."""

    key: tuple[str, str, str]
    refs: dict[str, str]
    head: str | None
    rows: list[tuple[str, str, str | None, int | float, int, int, int, int, str]]  # a Row


class _Cache(TypedDict):
    """The cache file (:func:`_save_cache`); a key it does not name is passed over."""

    version: int
    url: str
    mark: str | None
    sessions: dict[str, _CachedSession]


def _load_cache(path: str, url: str) -> dict[str, Any]:
    """The cache at ``path`` if it is one of this version for the store at ``url``, else ``{}``
    (none, unreadable, not a regular file, or of another shape: damaged, edited, another
    version's; the cache is derived data, made again whole). Its shape is checked as it is parsed, before a value of it
    is used. Raises nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a named pipe there: no wait for a writer
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return {}
            doc = json_loads_as(f.read(), _Cache)
    except (OSError, InvalidEntry):
        return {}
    if doc["version"] != CACHE_VERSION or doc["url"] != url:
        return {}
    return cast("dict[str, Any]", doc)


def _save_cache(path: str, doc: dict[str, Any]) -> None:
    """Write the cache whole (a new file, then renamed); a folder that cannot be written is skipped."""
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        _clear_dead_temps(os.path.dirname(path) or ".")
        fd, tmp = tempfile.mkstemp(prefix=f"{_TEMP}{os.getpid()}-", dir=os.path.dirname(path) or ".")
        with os.fdopen(fd, "wb") as f:
            f.write(json_dumps_sorted(doc))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(tmp)


#: the start of a cache file being written, then its writer's process id: ``.usage-<pid>-<random>``
_TEMP = ".usage-"


def _clear_dead_temps(folder: str) -> None:
    """Remove from ``folder`` the new cache files that writers killed before renaming them into place
    left (a SIGKILL, the OOM killer): each is a copy of the rows and names of sessions that may since
    have been deleted. A file of a process still running is left alone (one removed under a
    writer of another PID namespace only costs it that save). Raises nothing."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        pid, sep, _ = name[len(_TEMP):].partition("-")
        if name.startswith(_TEMP) and not (sep and pid.isdigit() and _running(int(pid))):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))


def _running(pid: int) -> bool:
    """Whether process ``pid`` is running (as far as this process can tell)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's
    return True


def all_rows(store: Store, *, cache: bool = True, unreadable: dict[Key, str] | None = None) -> dict[Key, list[Row]]:
    """Every session's rows (:func:`session_rows`), through the cache unless ``cache`` is False
    (a ``memory://`` or an encrypted store is never cached); in the tenants layout, tenant by
    tenant (:meth:`~castore.store.Store.stores`: an erased tenant is left out), each its own cache.

    ``unreadable``: where a session whose objects cannot be read (missing or damaged), or whose
    HEAD names a lost branch (:func:`castore.plumbing.lost_branch_problem`), is noted,
    key -> the error, and left out, instead of stopping at it; a cache is then not saved, so the
    next run reads it again.

    Raises:
        ObjectNotFound, IntegrityError: (without ``unreadable``) a session cannot be read
            (CorruptRef, an IntegrityError: its HEAD's branch is lost).
        StorageError.
    """
    out: dict[Key, list[Row]] = {}
    for st in store.stores():
        out.update(_rows_of(st, cache, unreadable))
    return out


def _readable_rows(store: Store, key: Key, refs: Any, head: Any, unreadable: dict[Key, str] | None,
                   commits: Mapping[str, Commit] | None = None,
                   lost: Mapping[Key, CorruptRef] | None = None) -> list[Row] | None:
    """:func:`session_rows`, or None (noted in ``unreadable``) when the session cannot be read:
    its objects, or the branch its HEAD names, which is lost (``lost``, as
    :meth:`~castore.store.Store.session_refs_and_heads` notes it: its responses would be
    missing from the counts, unsaid)."""
    from ..errors import IntegrityError, ObjectNotFound

    try:
        if lost and key in lost:
            raise lost[key]
        return session_rows(store, key, refs, head, commits)
    except (ObjectNotFound, IntegrityError) as e:
        if unreadable is None:
            raise
        unreadable[key] = str(e)
        return None


def _rows_of(store: Store, cache: bool, unreadable: dict[Key, str] | None = None,
             doc: dict[str, Any] | None = None) -> dict[Key, list[Row]]:
    """The rows of one flat store (a root store, or a tenant's in the tenants layout); ``doc``:
    its cache as :func:`_load_cache` read it already."""
    url = str(getattr(store.storage, "url", "") or "")
    lost: dict[Key, CorruptRef] = {}
    cached = cache and _cacheable(store, url)
    old: dict[str, Any] = {}
    moved: list[str] | None = None
    if cached:
        path = cache_path(store)
        url = store_url(store)
        doc = _load_cache(path, url) if doc is None else doc
        old = doc.get("sessions", {})
    # nothing cached: every session is read, most likely through the store-wide pass, which a
    # worker starts on now, while this process reads the refs (:func:`_start_worker`)
    worker = _start_worker(store, EARLY_SHARES) if not old else None
    with worker or contextlib.nullcontext():
        if cached:
            mark, moved = store.refs.changes_since("sessions", doc.get("mark") if doc else None)
            if moved is not None and not moved:
                return {tuple(v["key"]): v["rows"] for v in old.values()}
        if moved is None:
            fresh = _with_lost(store.session_refs_and_heads(lost=lost), lost)
            sessions: dict[str, Any] = {}
        else:
            folders = {"/".join(parts[:4]) for n in moved if len(parts := n.split("/")) >= 5}
            fresh = _with_lost(store.session_refs_and_heads(folders, lost), lost)
            sessions = {f: v for f, v in old.items() if f not in folders}
        todo = []
        for key, (folder, refs, head) in fresh.items():
            prev = old.get(folder)
            if prev is not None and prev["refs"] == refs and prev["head"] == head and tuple(prev["key"]) == key:
                sessions[folder] = prev
            else:
                todo.append((key, folder, refs, head))
        read = _read_sessions(store, [(key, refs, head) for key, _f, refs, head in todo], len(sessions) + len(todo),
                              unreadable, lost, worker)
    if not cached:
        return {k: v for k, v in read.items() if v is not None}
    failed = False
    for key, folder, refs, head in todo:
        rows = read[key]
        if rows is None:
            failed = True  # no cache saved: its mark would say the session was read
            continue
        sessions[folder] = {"key": list(key), "refs": refs, "head": head, "rows": rows}
    if not failed:
        _save_cache(path, {"version": CACHE_VERSION, "url": url, "mark": mark, "sessions": sessions})
    return {tuple(v["key"]): v["rows"] for v in sessions.values()}


def _with_lost(every: dict[Key, Any], lost: Mapping[Key, CorruptRef]) -> dict[Key, Any]:
    """``every`` (:meth:`~castore.store.Store.session_refs_and_heads`) with the sessions of
    ``lost`` that it leaves out (only HEAD left), so that each is noted as unreadable too."""
    every.update({k: ("", {}, None) for k in lost if k not in every})
    return every


def _scans(todo: int, of: int) -> bool:
    """Whether reading ``todo`` sessions of the ``of`` there are starts with a store-wide pass
    (:func:`load_commits`): at least :data:`SCAN_MIN_SESSIONS`, and half of them."""
    return todo >= SCAN_MIN_SESSIONS and 2 * todo >= of


def load_commits(store: Store, todo: int, of: int) -> dict[str, Commit] | None:
    """Every commit of ``store`` decoded in one pass over what is stored (each pack read whole,
    each record decompressed once, the commits told by their kind tag:
    :meth:`~castore.objectstore.ObjectStore.iter_tagged`), by id (the hash of the bytes
    found), when the ``todo`` sessions about to be read are at least :data:`SCAN_MIN_SESSIONS`
    and half of the ``of`` sessions there are: the paths are then walked through them
    (:func:`session_rows`) with no read per commit. Fewer are cheaper read path by path: None.
    Up to :data:`SCAN_MAX_COMMITS` are decoded (a path beyond them is read as it would be
    without), into one dictionary that is then handed to the store's cache of decoded objects
    once (:meth:`~castore.objectstore.ObjectStore.keep_decoded`: they live as long as the store,
    unless one is larger than it keeps); bytes that do not decode are left out (``fsck``
    reports them).

    Raises:
        StorageError: the backend failed.
    """
    if not _scans(todo, of):
        return None
    with gc_paused():
        out, biggest = _decode_commits(store, SCAN_MAX_COMMITS)
        # they live as long as the store (freeing them is a twentieth of the run, and a
        # process that ends without teardown never does), and a path read later finds them
        store.objects.keep_decoded(out, biggest)
    return out


def _decode_commits(store: Store, limit: int, part: tuple[int, int, int] | None = None,
                    raws: dict[str, bytes] | None = None) -> tuple[dict[str, Commit], int]:
    """:func:`load_commits`' pass (up to ``limit`` commits; ``part``: some shares of what is
    stored, :meth:`~castore.objectstore.ObjectStore.iter_tagged`), and the size of the largest
    commit; the canonical bytes of each commit decoded go into ``raws`` too. The records read
    are not kept for a later read (their commits are). Raises StorageError."""
    from ..errors import IntegrityError
    from ..objects import Commit, decode_many

    digest_many = store.objects.codec.digest_many
    out: dict[str, Commit] = {}
    biggest = 0
    for found in store.objects.iter_tagged(Commit, part, keep=False):
        found = found[:limit - len(out)]
        ids = digest_many(found)
        biggest = max(biggest, max(map(len, found), default=0))
        # commits all: the kind tag the bytes were told by is the one msgspec decodes by
        try:
            out.update(zip(ids, cast("list[Commit]", decode_many(ids, found)), strict=True))
            if raws is not None:
                raws.update(zip(ids, found, strict=True))
        except IntegrityError:  # one does not decode: the others one by one
            for oid, raw in zip(ids, found, strict=True):
                with contextlib.suppress(IntegrityError):
                    out[oid] = cast("Commit", decode_many([oid], [raw])[0])
                    if raws is not None:
                        raws[oid] = raw
        if len(out) >= limit:
            break
    return out, biggest


def _read_sessions(store: Store, todo: list[tuple[Key, Any, Any]], of: int, unreadable: dict[Key, str] | None,
                   lost: Mapping[Key, CorruptRef], worker: Worker | None = None) -> dict[Key, list[Row] | None]:
    """The rows of each session of ``todo`` (``(key, refs, head)``, as
    :meth:`~castore.store.Store.session_refs_and_heads` reads them), of the ``of`` the store
    holds: None where it cannot be read (:func:`_readable_rows`). A first run's store-wide pass
    (:func:`_scans`) is shared with ``worker`` (:func:`_start_worker`) where one was started
    (:func:`_read_shared`); a worker not needed is stopped.

    Raises:
        ObjectNotFound, IntegrityError: (without ``unreadable``) a session cannot be read.
        StorageError.
    """
    done: dict[Key, list[Row]] = {}
    commits: dict[str, Commit] | None
    if _scans(len(todo), of) and (worker is not None or (worker := _start_worker(store, LATE_SHARES)) is not None):
        with worker:
            done, commits = _read_shared(store, todo, lost, worker)
    else:
        if worker is not None:
            worker.stop()  # a store too small for its pass to pay: its work is not wanted
        commits = load_commits(store, len(todo), of)
    return {key: done[key] if key in done else _readable_rows(store, key, refs, head, unreadable, commits, lost)
            for key, refs, head in todo}


class Worker(Forked):
    """A worker of :func:`_start_worker`: its process, and the shares of the stored records
    the process and it decode (``shares``, ``(own, n)``: the process the shares ``0`` to
    ``own - 1`` of ``n``, the worker the rest).

    Raises:
        OSError: the fork failed.
    """

    def __init__(self, work: Callable[[Callable[[], bytes]], bytes], shares: tuple[int, int]) -> None:
        self.shares = shares
        super().__init__(work)


#: the shares of the stored records (:meth:`~castore.objectstore.ObjectStore.iter_tagged`) that
#: a first run's process and its worker decode, ``(own, n)``: the process ``own`` of ``n``, the
#: worker the rest. A worker started before the refs are read takes three of five (it starts on
#: them while the process reads the refs, a tenth of the run); one started after, half.
EARLY_SHARES = (2, 5)
LATE_SHARES = (1, 2)


def _share(shares: tuple[int, int], worker: bool) -> tuple[int, tuple[int, int, int]]:
    """What the worker (``worker``) or the process decodes of the stored records for
    ``shares`` (``(own, n)``, :data:`EARLY_SHARES`): its most commits (its share of
    :data:`SCAN_MAX_COMMITS`) and its part (:meth:`~castore.objectstore.ObjectStore.iter_tagged`'s
    ``part``: the shares ``own`` to ``n - 1`` for the worker, ``0`` to ``own - 1`` for the
    process)."""
    own, n = shares
    if worker:
        return SCAN_MAX_COMMITS * (n - own) // n, (own, n, n)
    return SCAN_MAX_COMMITS * own // n, (0, own, n)


def _start_worker(store: Store, shares: tuple[int, int]) -> Worker | None:
    """A worker forked now (:class:`~castore.forked.Forked`) to decode its share of the stored
    commits (:func:`_decode_commits`; ``shares``: see :data:`EARLY_SHARES`) and then read the
    sessions that share holds whole (:func:`_rows_within`), once :func:`_read_shared` sends it
    which sessions to read; None where none may start (:func:`~castore.forked.can_fork`: one
    thread, two cores; on S3 s3fs's I/O thread runs by then) or the store has fewer than
    :data:`SCAN_MIN_SESSIONS` session folders (their pass would not pay).

    Raises:
        StorageError: the listing of the session folders failed.
        OSError: the fork failed.
    """
    from ..forked import can_fork
    from ..objects import pack, unpack

    if not can_fork() or not _has_sessions(store, SCAN_MIN_SESSIONS):  # no listing where none may start (S3)
        return None
    limit, part = _share(shares, worker=True)

    def work(receive: Callable[[], bytes]) -> bytes:
        raws: dict[str, bytes] = {}
        commits, _ = _decode_commits(store, limit, part, raws)
        doc = unpack(receive())
        todo = [((k[0], k[1], k[2]), refs, head) for k, refs, head in doc["todo"]]
        lost = dict.fromkeys((k[0], k[1], k[2]) for k in doc["lost"])
        seen: set[str] = set()
        rows = _rows_within(store, todo, cast("dict[Key, Any]", lost), commits, seen)
        left = [cid for cid in raws if cid not in seen]
        return pack({"rows": [[list(k), v] for k, v in rows.items()], "left": left, "raws": [raws[c] for c in left]})

    return Worker(work, shares)


def _has_sessions(store: Store, n: int) -> bool:
    """Whether ``store`` has at least ``n`` session folders (``sessions/APP/PROJECT/SESSION``),
    counted from the folders' listings, not their refs. Raises StorageError."""
    if n <= 0:
        return True
    seen = 0
    for app in store.refs.list_dir("sessions"):
        for project in store.refs.list_dir(f"sessions/{app}"):
            seen += len(store.refs.list_dir(f"sessions/{app}/{project}"))
            if seen >= n:
                return True
    return False


def _read_shared(store: Store, todo: list[tuple[Key, Any, Any]], lost: Mapping[Key, CorruptRef],
                 worker: Worker) -> tuple[dict[Key, list[Row]], dict[str, Commit]]:
    """:func:`load_commits`' pass and the rows of ``todo``'s sessions shared with ``worker``
    (:func:`_start_worker`): it is sent ``todo``; each process decodes its share of the stored
    records (:meth:`~castore.objectstore.ObjectStore.iter_tagged`) and reads the sessions its
    share holds whole (:func:`_rows_within`); the worker sends back its rows and the commits
    none of its sessions walked. Returns the rows read (a session that neither share holds
    whole, or that failed, is not there: the caller reads it through the commits returned, the
    process's share and those the worker sent back, kept by the store as
    :func:`load_commits` keeps them). A worker whose work raised, or that ended without its
    answer (a signal: the OOM killer), leaves its share to be read here: the same rows.

    Raises:
        StorageError.
    """
    from ..objects import decode_many, pack, unpack

    worker.send(pack({"todo": [[list(k), refs, head] for k, refs, head in todo], "lost": [list(k) for k in lost]}))
    with gc_paused():
        commits, biggest = _decode_commits(store, *_share(worker.shares, worker=False))
        done = _rows_within(store, todo, lost, commits, set())
        try:
            answer = worker.answer()
        except WorkerDied:  # killed (the OOM killer): its share is read here as well
            answer = None
        if answer is None:  # the worker's pass raised or died: read here, where an error is met
            more, big = _decode_commits(store, *_share(worker.shares, worker=True))
            commits.update(more)
            biggest = max(biggest, big)
        else:
            doc = unpack(answer)
            for k, v in doc["rows"]:
                done.setdefault((k[0], k[1], k[2]), v)  # a session both shares hold: the same rows
            left, raws = doc["left"], doc["raws"]
            commits.update(zip(left, cast("list[Commit]", decode_many(left, raws)), strict=True))
            biggest = max(biggest, max(map(len, raws), default=0))
        store.objects.keep_decoded(commits, biggest)
    return done, commits


def _rows_within(store: Store, todo: list[tuple[Key, Any, Any]], lost: Mapping[Key, CorruptRef],
                 commits: dict[str, Commit], seen: set[str]) -> dict[Key, list[Row]]:
    """The rows of each session of ``todo`` whose paths ``commits`` hold whole (a session of
    ``lost``, or one that fails, is left to be read with every commit at hand, where its error
    is noted); the commits walked go into ``seen``."""
    from ..errors import IntegrityError, ObjectNotFound

    out: dict[Key, list[Row]] = {}
    for key, refs, head in todo:
        if key in lost:
            continue
        walked: set[str] = set()
        try:
            out[key] = session_rows(store, key, refs, head, commits, walked)
        except (Elsewhere, ObjectNotFound, IntegrityError):
            continue
        seen |= walked
    return out


def _cacheable(store: Store, url: str) -> bool:
    """Whether ``store``'s rows may be cached: not a ``memory://`` one, and not an encrypted one
    (the cache would hold its sessions' names and counts in the clear; the rule of the search
    index, :func:`castore.grep.index.indexable`)."""
    from ..grep.index import indexable

    return bool(url) and not url.startswith("memory://") and indexable(store)


def update_if_present(store: Store) -> bool:
    """Bring ``store``'s usage cache up to date if it has one (what an import calls, as it does
    for the search index, so that the next ``castore usage`` reads no session); True if it did.
    A store without a cache is left without one: the first ``castore usage`` makes it, and an
    import that never meets a usage run pays nothing for it. The new cache files of killed runs
    are removed from its folder (:func:`_clear_dead_temps`).

    Raises:
        ObjectNotFound, IntegrityError: a session of the cache cannot be read.
        StorageError.
    """
    done = False
    swept: set[str] = set()
    for st in store.stores():
        url = str(getattr(st.storage, "url", "") or "")
        if _cacheable(st, url):
            path = cache_path(st)
            if os.path.dirname(path) not in swept:  # a killed run's copy goes even where no cache was saved
                swept.add(os.path.dirname(path))
                _clear_dead_temps(os.path.dirname(path) or ".")
            # this store's cache (the file may hold another store's: $CASTORE_USAGE_CACHE)
            doc = _load_cache(path, store_url(st))
            if doc:
                with gc_paused():
                    _rows_of(st, True, None, doc)
                done = True
    return done




__all__ = ["CACHE_VERSION", "EARLY_SHARES", "LATE_SHARES", "SCAN_MAX_COMMITS", "SCAN_MIN_SESSIONS", "Worker",
           "all_rows", "cache_path", "load_commits", "update_if_present"]
