"""Local-disk storage: plain files under a root folder, with atomic, durable writes.

Writes go to a temporary file in the same folder, are fsynced (when ``durable``), and are
renamed into place; the folder is fsynced after the rename so the new name survives a power
loss. A conditional write (:meth:`LocalStorage.swap`) takes ``<key>.lock`` exclusively
(``O_CREAT | O_EXCL``), checks the current version, writes, renames, and removes the lock.
A lock left behind by a dead process is cleared: the holder holds an ``flock`` on it, which
the kernel drops when the process dies; the pid and host it records are for messages only.
The lock protocol is :mod:`castore.storage.locks`.

The swap log (:mod:`castore.storage.refchanges`): every swap, conditional delete and delete of
a key under ``refs/`` first appends ``<length> <key>\n`` to ``swaps.log`` at the root (after
a header line naming the log by a random id), while it holds the key's lock (one
``O_APPEND`` write, not synced).
:meth:`LocalStorage.swaps_since` reads what was appended since a mark, so that a reader of
derived data (the search index) learns which refs moved without reading them all. Why
nothing is missed: a change lands (rename or unlink) only after its line was appended,
under its lock; a reader that took its mark before reading a ref either finds the line
after its mark next time, or the change was under way while it read, and then
:meth:`LocalStorage.pending_swaps` (the lock files) names it. The log is not synced: a
mark records the boot it was taken in, and after a reboot (a power loss can drop the log's
tail, not a synced ref) everything is read again.

Deferred ref swaps (format 3, docs/FORMAT.md 12): a swap given a ``journal`` (the write path
passes its writer's log) hands the journal a :class:`~castore.storage.base.RefIntent` under
the ref's lock, after the compare; when the journal has made it durable (one ``fdatasync``
of the log, which also covers the append's objects record), the new value is written in
place (a framed ref, when the new frame fits one page: :data:`~.reffiles.INPLACE_MAX`) or
renamed over the ref, with no fsync of file or folder (the framed files' reading and writing
are :mod:`castore.storage.reffiles`). :meth:`LocalStorage.swap_many` does the same for
several refs, their intents journaled at once. Such a swap makes a new ref's folders without
syncing their parents, and the write path's loose objects are written unsynced
(:meth:`LocalStorage.write_unsynced`): the journal syncs them (:meth:`LocalStorage.sync_keys`,
one ``syncfs`` for many) before the intent that needs them. Such a swap's lock is this handle's lock file
under ``locks/`` hard-linked as ``<key>.lock`` (no file made per swap; see
:class:`~castore.storage.locks.HandleLockFile`), except for a ref the swap expects absent:
its lock is a new file, which the new value is written into and which is renamed over the
ref (a new ref needs a new file anyway; docs/FORMAT.md 12). Before the first such swap of a boot,
``journal/<boot id>`` is created durably (the *marker*); while it exists, deletes of refs (and checks after a dead
writer's lock was cleared) are recorded in it, synced, before they land. Opening a store
after a power loss finds the marker of another boot and replays that boot's intents
(:meth:`LocalStorage.recover_refs`); the markers and the replay are in
:mod:`castore.storage.bootmarkers`.
"""

from __future__ import annotations

import builtins
import fcntl
import functools
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from ..errors import CorruptRef, InvalidName, StorageError
from . import refchanges
from .base import (
    UNSETTLED,
    Appender,
    Journal,
    JournalMany,
    PreconditionFailed,
    RefIntent,
    Storage,
    Token,
    Versioned,
    check_key,
)
from .bootmarkers import BootMarkers, frame
from .locks import HandleLockFile, check_stale, owner_size, take_lock, unlock
from .reffiles import (
    INPLACE_MAX,
    REFS,
    Landed,
    as_stored,
    digest,
    exchange,
    file_value,
    is_framed,
    open_locked,
    pwrite_all,
    read_all,
    settle,
    token,
    write_in_place,
)

#: how a temporary file is created (what ``open(path, "wb")`` asks, without a buffered file object)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
#: plain deletes of keys below this folder also take the lock and are logged
_LOGGED_DELETES = REFS
#: how many refs a handle remembers its last framed write of (LocalStorage._landed)
_LANDED_KEPT = 256
#: :meth:`LocalStorage.sync_keys` of at least this many keys (and new folders) syncs the file
#: system at once (one ``syncfs``, a few ``fsync``s' time) rather than each file and folder
#: (about two ``fsync``s each)
SYNCFS_KEYS = 8


@functools.cache
def _syncfs_call() -> Callable[[int], int] | None:
    """libc's ``syncfs``, or None where there is none (not Linux)."""
    import ctypes  # here: a store that only reads never syncs (ctypes costs ~2 ms to import)

    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn
#: how many keys a handle keeps the checked file path of (LocalStorage._path)
_PATHS_KEPT = 4096
#: a new folder is made by plain ``mkdir`` calls when a folder this handle knows is at most this
#: many levels above it (:meth:`LocalStorage._mkdir_below_known`)
_MKDIR_DEPTH = 8
#: how long before a ref read a folder's last change must be for its stamp to be kept
#: (:meth:`LocalStorage.ref_stamps`): longer than any file system's tick (FAT's is 2 s)
SETTLE_NS = 2_000_000_000


_BOOT: list[str] = []  # this boot's id, read once per process (every deferred swap asks)


def _boot_id() -> str:
    """This boot's id (Linux), or "" where there is none (then no swap log is trusted and
    no ref swap is deferred)."""
    if not _BOOT:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
                _BOOT.append(f.read().strip())
        except OSError:
            _BOOT.append("")
    return _BOOT[0]


def refuse_file(root: str, url: str) -> None:
    """Refuse a store root that is a file or lies below one: no store can be read or made
    there, and "no store here, create one" would send people to an init that fails.

    Raises:
        StorageError: naming the file.
    """
    up = root
    while True:
        try:  # one stat a step: a folder made between two checks (isdir, then exists) is no file
            if stat.S_ISDIR(os.stat(up).st_mode):
                return
        except (FileNotFoundError, NotADirectoryError):
            if (parent := os.path.dirname(up)) == up:
                return
            up = parent
            continue
        except OSError:
            return  # unreadable: opening the store says why
        raise StorageError(f"{up} is a file, not a folder: a castore store is a folder", url)


class LocalStorage(Storage):
    """Files under ``root``; see the module docstring."""

    def __init__(self, root: str, durable: bool = True) -> None:
        self.root = root
        self.url = root
        self.durable = durable
        self._made_dirs: set[str] = set()
        self._unsynced_dirs: builtins.list[str] = []  # made, their parents not synced yet
        self._real_root: str | None = None
        self._markers = BootMarkers(self, root, self._ensure_dir, self._fsync_dir)
        #: test hook (simulated power loss): when a list, every rename made without a sync
        #: is recorded as (path, the bytes it replaced or None); a folder sync drops its own
        self.unsynced: builtins.list[tuple[str, bytes | None]] | None = None
        self._lock_file = HandleLockFile(root)  # linked as <ref>.lock by deferred swaps
        #: key -> what this handle's last deferred swap wrote there (a framed file): the next
        #: swap that reads back those very bytes skips their check (open_locked)
        self._landed: dict[str, Landed] = {}
        self._paths: dict[str, str] = {}  # key -> its file (checked keys only)
        self._no_exchange = False  # renameat2's RENAME_EXCHANGE failed here: renames only

    # -- helpers -------------------------------------------------------------------
    def _path(self, key: str, prefix: bool = False) -> str:
        """The file of ``key`` below the root; a key that could leave the root is refused.

        Raises:
            InvalidName: see :func:`~castore.storage.base.check_key`.
        """
        keep = not prefix and type(key) is str
        if keep:
            # the keys a writer touches on every append (its refs, its log) come back: their
            # check and join are kept (bounded)
            path = self._paths.get(key)
            if path is not None:
                return path
        checked = check_key(key, prefix)
        path = os.path.join(self.root, *checked.split("/")) if checked else self.root
        if keep:
            if len(self._paths) >= _PATHS_KEPT:
                self._paths.clear()
            self._paths[key] = path
        return path

    def _check_inside(self, d: str) -> None:
        """Refuse to write or delete below ``d`` when a symlink takes it outside the root.

        Checked once per folder and handle (with :meth:`_ensure_dir`'s cache), so cheap.

        Raises:
            InvalidName: naming the folder (relative to the root) and where it leads.
        """
        if self._real_root is None:
            self._real_root = os.path.realpath(self.root)
        real = os.path.realpath(d)
        if real != self._real_root and not real.startswith(self._real_root + os.sep):
            rel = os.path.relpath(d, self.root).replace(os.sep, "/")
            raise InvalidName(rel, f"a symlink takes it to {real}, outside the store", "storage folder")

    def _ensure_dir(self, d: str, sync: bool = True) -> None:
        if d in self._made_dirs:
            return
        made, done = self._mkdir_below_known(d)
        if not done:
            self._check_inside(d)
            missing = []
            up = d
            while not os.path.isdir(up) and os.path.dirname(up) != up:
                missing.append(up)
                up = os.path.dirname(up)
            try:
                os.makedirs(d, exist_ok=True)
            except OSError as e:
                raise StorageError(f"cannot create folder {d}: {e.strerror}", self.url) from e
            made.extend(reversed(missing))
            if up != d and up not in self._made_dirs and len(up) >= len(self.root):
                # the folder that was there: the next new folder under it is one mkdir
                self._check_inside(up)
                self._made_dirs.add(up)
        # A new folder's name lives in its parent: sync the parents, top down, or a crash
        # could take the folder (and every file synced into it) away. Not ``sync``: later,
        # by whatever makes the files written into it durable (_sync_made_dirs)
        if sync or not self.durable:
            for m in made:
                self._fsync_dir(os.path.dirname(m) or ".")
        else:
            self._unsynced_dirs.extend(made)
        self._made_dirs.update(made)
        self._made_dirs.add(d)

    def _mkdir_below_known(self, d: str) -> tuple[builtins.list[str], bool]:
        """Make ``d`` and its missing parents with one ``mkdir`` each, top down, below the
        nearest folder this handle made or checked (a folder made here inside one that is
        inside the root is inside too: no ``realpath``, no walk of ``stat`` calls; an import
        lands thousands of new ref folders). Returns the folders made, and whether ``d`` is
        one of them: False when no such folder is near, or a ``mkdir`` on the way failed (a
        folder there already, which may be a symlink, or one pruned meanwhile): the caller
        then checks and makes the rest the full way."""
        chain: builtins.list[str] = []
        up = d
        while up not in self._made_dirs:
            parent = os.path.dirname(up)
            if len(chain) >= _MKDIR_DEPTH or parent == up:
                return [], False
            chain.append(up)
            up = parent
        made: builtins.list[str] = []
        for p in reversed(chain):
            try:
                os.mkdir(p)
            except OSError:
                return made, False
            made.append(p)
        return made, True

    def _ensure_dir_unsynced(self, d: str) -> None:
        self._ensure_dir(d, sync=False)

    def _sync_made_dirs(self) -> None:
        """Sync the parents of the folders made without it, top down."""
        made, self._unsynced_dirs = self._unsynced_dirs, []
        done: set[str] = set()
        for m in sorted(made, key=len):
            parent = os.path.dirname(m) or "."
            if parent not in done and os.path.isdir(parent):
                done.add(parent)
                self._fsync_dir(parent)

    def _fsync_dir(self, d: str) -> None:
        if not self.durable:
            return
        if self.unsynced:
            self.unsynced[:] = [(p, old) for p, old in self.unsynced if os.path.dirname(p) != d]
        try:
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise StorageError(f"cannot sync folder {d}: {e.strerror or e}", self.url) from e

    def _write_file(self, path: str, data: bytes, sync: bool = True, swap: bool = False) -> None:
        """Write ``data`` to a temporary file beside ``path`` (synced when durable, unless
        not ``sync``) and rename it into place. With ``swap`` (an unsynced write over a
        regular file at ``path`` whose lock the caller holds), the two are exchanged
        instead and the old file, now at the temporary name, removed
        (:func:`~castore.storage.reffiles.exchange`: what a reader sees is the same).

        A folder that vanished meanwhile (another handle pruned it after deleting its last
        file) is made again, once. The caller syncs the folder.

        Raises:
            StorageError: the write failed.
        """
        d = os.path.dirname(path)
        self._ensure_dir(d, sync)
        for attempt in (0, 1):
            tmp = f"{path}.tmp-{os.urandom(16).hex()}"
            try:
                # (os.open, not open(): no buffered file object for a few hundred bytes of a ref)
                fd = os.open(tmp, _NEW_FILE, 0o666)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    if self.durable and sync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                if swap and not self._no_exchange:
                    try:
                        swapped = exchange(tmp, path)
                    except OSError:
                        swapped = None  # the rename below says what is wrong, if anything
                    if swapped:
                        self._discard(tmp)  # the old file (a kill here leaves it as a stale temporary)
                        return
                    if swapped is False:
                        self._no_exchange = True
                os.replace(tmp, path)
                return
            except FileNotFoundError as e:
                if attempt == 0:
                    self._made_dirs.discard(d)
                    self._ensure_dir(d, sync)
                    continue
                self._discard(tmp)
                raise StorageError(f"cannot write {path}: {e.strerror or e}", self.url) from e
            except OSError as e:
                self._discard(tmp)
                raise StorageError(f"cannot write {path}: {e.strerror or e}", self.url) from e

    @staticmethod
    def _discard(tmp: str) -> None:
        try:
            os.unlink(tmp)
        except OSError:
            pass

    def _atomic_write(self, path: str, data: bytes) -> None:
        self._write_file(path, data)
        self._fsync_dir(os.path.dirname(path))

    # -- plain reads and writes ------------------------------------------------------
    def read(self, key: str) -> bytes:
        """Return the bytes at ``key``; see :meth:`Storage.read`. A ref written in place is
        read without its header; one caught mid-write is read again.

        Raises:
            FileNotFoundError: nothing is stored there.
            CorruptRef: a ref written in place is torn (see :func:`~castore.storage.reffiles.settle`).
            StorageError: the read failed.
        """
        data = self._read_file(key)
        if is_framed(key, data):
            return settle(key, data, self._path(key) + ".lock", lambda: self._read_file(key))
        return data

    def _read_file(self, key: str, path: str | None = None) -> bytes:
        """The bytes of the file of ``key`` (at ``path`` when the caller has it) as they are."""
        try:
            fd = os.open(path or self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise FileNotFoundError(key) from None
        except OSError as e:
            raise StorageError(f"cannot read {key}: {e.strerror or e}", self.url) from e
        try:
            return read_all(fd)
        except IsADirectoryError:
            raise FileNotFoundError(key) from None
        except OSError as e:
            raise StorageError(f"cannot read {key}: {e.strerror or e}", self.url) from e
        finally:
            os.close(fd)

    def write(self, key: str, data: bytes) -> None:
        """Atomically replace ``key``; see :meth:`Storage.write`."""
        self._atomic_write(self._path(key), as_stored(key, data))

    def write_many(self, items: Mapping[str, bytes]) -> None:
        """Write several keys, then sync each touched folder once."""
        dirs: set[str] = set()
        paths = [(self._path(k), as_stored(k, v)) for k, v in items.items()]  # refuse a bad key before writing any
        for path, v in paths:
            self._write_file(path, v)
            dirs.add(os.path.dirname(path))
        self._sync_written_dirs(dirs, items)

    def write_unsynced(self, items: Mapping[str, bytes]) -> bool:
        """Write several keys with no sync of file or folder (a new folder's name included):
        :meth:`sync_keys` of these keys makes them durable; see :meth:`Storage.write_unsynced`."""
        if not self.durable:
            self.write_many(items)
            return True
        paths = [(self._path(k), as_stored(k, v)) for k, v in items.items()]  # refuse a bad key before writing any
        for path, v in paths:
            self._write_file(path, v, sync=False)
        return True

    def exists(self, key: str) -> bool:
        """Whether a file is stored at ``key``."""
        return os.path.isfile(self._path(key))

    def mtime(self, key: str) -> float | None:
        """Modification time of ``key``, or None when missing.

        Raises:
            StorageError: the file cannot be read.
        """
        try:
            return os.stat(self._path(key)).st_mtime
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise StorageError(f"cannot stat {key}: {e.strerror or e}", self.url) from e

    # -- locks and conditional writes --------------------------------------------------
    def _lock(self, path: str, link: bool = False, defer: bool = False) -> int:
        """Take ``<path>.lock`` (see :func:`~castore.storage.locks.take_lock`); with ``link``
        (a swap that may be deferred, of a ref that exists) by linking this handle's lock
        file under ``locks/``, and -1 is returned. ``defer`` (implied by ``link``): the swap
        may be deferred, so a new folder's parent is not synced. A stale lock cleared on the
        way is followed by :meth:`_check_after_dead_writer`.

        Raises:
            RefLocked: a live process held the lock for the whole wait.
            StorageError: the lock file cannot be created.
        """
        # a swap that may be deferred leaves a new folder's name unsynced: the intent the
        # journal keeps durable brings the ref back, and a swap that is not deferred, or the
        # sync of the refs before their intents go (sync_keys), syncs it
        return take_lock(path, self._lock_file if link else None,
                         self._ensure_dir_unsynced if link or defer else self._ensure_dir, self._remake_dir,
                         self._check_after_dead_writer, self.url)

    def _remake_dir(self, d: str) -> None:
        self._made_dirs.discard(d)
        self._ensure_dir(d)

    def after_fork_in_child(self) -> None:
        """In a forked child: let go of the parent's lock file (its ``flock`` must die with
        the parent, or a lock the parent leaves would look alive)."""
        self._lock_file.after_fork_in_child()

    def child(self, prefix: str) -> LocalStorage:
        """A LocalStorage rooted at the folder ``prefix`` (its own locks, journal and swap log).

        Raises:
            InvalidName: ``prefix`` is not a valid key.
        """
        return LocalStorage(self._path(check_key(prefix)), durable=self.durable)

    def close(self) -> None:
        """Remove this handle's lock file under ``locks/``, if it made one."""
        self._lock_file.drop()

    def _check_after_dead_writer(self, path: str) -> None:
        """Under the lock of a ref whose previous holder died: record that the ref holds what
        it holds now, so that a swap the dead writer journaled but never landed is not rolled
        forward by a recovery after a later reboot (docs/FORMAT.md, 12)."""
        key = os.path.relpath(path, self.root).replace(os.sep, "/")
        boot = _boot_id()
        if not (self.durable and boot and key.startswith(_LOGGED_DELETES) and self._markers.has(boot)):
            return
        current = self.read_ref_file(key)
        held = current.token if current is not None else None
        self._markers.record(boot, RefIntent(key, held, held, None, boot, time.monotonic_ns()))

    def stale_locks(self, prefix: str = "") -> list[str]:
        """Lock files below ``prefix`` that no live process holds (keys relative to the root).

        A writer killed while holding a lock leaves its file behind; the next writer of
        that key clears it (and so does :meth:`clear_stale_locks`).
        """
        return [k for k in self.list_locks(prefix) if check_stale(self._path(k), remove=False)]

    def clear_stale_locks(self, prefix: str = "") -> list[str]:
        """Remove the lock files :meth:`stale_locks` finds; return their keys. A ref's is
        cleared by taking the lock as a writer would, which records that the ref holds what
        it holds (so that a recovery does not roll forward the dead writer's swap)."""
        out = []
        for k in self.list_locks(prefix):
            lock = self._path(k)
            if k.startswith(_LOGGED_DELETES) and self.durable and check_stale(lock, remove=False) is True:
                path = lock[:-len(".lock")]
                unlock(path, self._lock(path))
                out.append(k)
            elif check_stale(lock, remove=True) is True:
                out.append(k)
        return out

    def read_versioned(self, key: str) -> Versioned | None:
        """Read ``key`` with its token (a digest of its bytes, of the value only for a ref
        written in place); None when missing.

        Raises:
            CorruptRef: a ref written in place is torn (see :meth:`read`).
            StorageError: the read failed.
        """
        try:
            data = self.read(key)
        except FileNotFoundError:
            return None
        return Versioned(data, token(data))

    def read_ref_file(self, key: str) -> Versioned | None:
        """``key`` with its token as its file holds it now, with no wait: a ref written in
        place that fails its check gives its bytes as they are (header included) and their
        digest. Under the ref's lock (no write in place under way) and in a recovery.

        Raises:
            StorageError: the read failed.
        """
        try:
            data = self._read_file(key)
        except FileNotFoundError:
            return None
        data = file_value(key, data)
        return Versioned(data, token(data))

    def _read_locked(self, key: str) -> Versioned | None:
        """What a swap or delete compares, under the key's lock: :meth:`read_versioned`, and
        for a torn ref written in place (a power loss; the replay then replaces it) the file
        as it lies (:meth:`read_ref_file`)."""
        try:
            return self.read_versioned(key)
        except CorruptRef:
            return self.read_ref_file(key)

    def swap(self, key: str, data: bytes, expect: Token | None, journal: Journal | None = None) -> Token:
        """Replace ``key`` under its lock if its token is ``expect``; see :meth:`Storage.swap`.

        With ``journal`` (a durable ref under ``refs/``), the change is deferred when the
        journal keeps its intent durable: the boot's marker is made sure of, the journal
        called, and the ref written with no sync, in place over a ref already written so
        (with a header that checks the value, see :func:`~castore.storage.bootmarkers.frame`),
        else renamed into place with that header (see the module docstring).

        Raises:
            PreconditionFailed: ``key``'s token is not ``expect``. RefLocked: a live process
                held the lock for the whole wait. StorageError.
        """
        path = self._path(key)
        may_defer = journal is not None and self.durable and key.startswith(_LOGGED_DELETES)
        # -1: a linked lock (see _lock); a ref expected absent is locked with a new file,
        # which becomes the ref (_land_locked): a new ref needs a new file anyway
        fd = self._lock(path, link=may_defer and expect is not None, defer=may_defer)
        dg = digest(data)
        new = dg.hex()
        deferred = False
        ref: int | None = None  # the ref file, open for a write in place (a framed one)
        size = 0  # its size as read
        try:
            if may_defer:
                current, ref, size = open_locked(key, path, self._read_locked, self.url, self._landed.get(key))
            else:
                current = self._read_locked(key)
            if (current.token if current else None) != expect:
                raise PreconditionFailed(key, expect)
            if may_defer:
                assert journal is not None
                # called even where the change cannot be deferred (no boot id): its sync is
                # what makes the append's objects record durable
                boot = _boot_id()
                if boot:
                    self._markers.ensure(boot)
                deferred = journal(RefIntent(key, expect, new, data, boot, time.monotonic_ns())) and bool(boot)
        except BaseException:
            if ref is not None:
                os.close(ref)
            unlock(path, fd)
            raise
        self._land_locked(key, path, fd, data, current, ref, size, deferred, dg)
        return new

    def swap_many(self, items: Sequence[tuple[str, bytes, Token | None]],
                  journal: JournalMany | None = None) -> builtins.list[Token | Exception]:
        """:meth:`swap` each ``(key, data, expect)``; see :meth:`Storage.swap_many`.

        With ``journal`` and two or more durable refs: every ref's lock is taken (in key
        order, so that two such calls cannot wait on each other) and compared, then the
        intents of those that passed go to the journal at once (one sync for all), then each
        ref is written as :meth:`swap` writes it and its lock released. An item whose compare
        fails gets its :class:`PreconditionFailed` and its lock back at once; a write that
        fails after the journal took the intents gets its :class:`StorageError` (the others
        still land). Otherwise one :meth:`swap` after the other.

        Raises:
            RefLocked: a live process held one of the locks for the whole wait (none landed).
            StorageError: a ref cannot be read or the journal failed (none landed).
        """
        keys = [key for key, _, _ in items]
        if journal is None or not self.durable or len(items) < 2 or len(set(keys)) < len(keys) \
                or not all(k.startswith(_LOGGED_DELETES) for k in keys):
            return super().swap_many(items, journal)
        out: builtins.list[Token | Exception | None] = [None] * len(items)
        held: builtins.list[tuple[int, str, int, Versioned | None, int | None, int]] = []
        try:
            for i in sorted(range(len(items)), key=keys.__getitem__):
                key, _, expect = items[i]
                path = self._path(key)
                fd = self._lock(path, link=expect is not None, defer=True)  # (as in swap)
                try:
                    current, ref, size = open_locked(key, path, self._read_locked, self.url,
                                                     self._landed.get(key))
                except BaseException:
                    unlock(path, fd)
                    raise
                if (current.token if current else None) != expect:
                    if ref is not None:
                        os.close(ref)
                    unlock(path, fd)
                    out[i] = PreconditionFailed(key, expect)
                    continue
                held.append((i, path, fd, current, ref, size))
            deferred = False
            if held:
                boot = _boot_id()
                if boot:
                    self._markers.ensure(boot)
                digests = {i: digest(items[i][1]) for i, *_ in held}
                intents = [RefIntent(keys[i], items[i][2], digests[i].hex(), items[i][1], boot, time.monotonic_ns())
                           for i, *_ in held]
                deferred = journal(intents) and bool(boot)
        except BaseException:
            for _, path, fd, _, ref, _ in held:
                if ref is not None:
                    os.close(ref)
                unlock(path, fd)
            raise
        if held:
            try:  # one line per ref, with one write: every lock is held
                refchanges.log_swaps(self.root, [keys[i] for i, *_ in held], self.url)
            except StorageError as e:
                for i, path, fd, _, ref, _ in held:
                    if ref is not None:
                        os.close(ref)
                    unlock(path, fd)
                    out[i] = e
                held = []
        for n, (i, path, fd, current, ref, size) in enumerate(held):
            try:
                self._land_locked(keys[i], path, fd, items[i][1], current, ref, size, deferred, digests[i],
                                  logged=True)
                out[i] = digests[i].hex()
            except StorageError as e:
                out[i] = e
            except BaseException:
                for _, path2, fd2, _, ref2, _ in held[n + 1:]:  # interrupted: let go of the rest
                    if ref2 is not None:
                        os.close(ref2)
                    unlock(path2, fd2)
                raise
        return [r for r in out if r is not None]

    def _land_locked(self, key: str, path: str, fd: int, data: bytes, current: Versioned | None,
                     ref: int | None, size: int, deferred: bool, dg: bytes, logged: bool = False) -> None:
        """Write ``data`` as the ref ``key`` (file ``path``) whose lock :meth:`swap` holds
        (``fd``: the lock file, -1 a linked lock) and whose compare passed (``current``: what
        it held; ``ref``, ``size``: the framed file left open by
        :func:`~castore.storage.reffiles.open_locked`),
        then release the lock. ``deferred``: the journal keeps the intent durable, so the
        write is not synced (in place over a framed file, else a framed file renamed).
        ``dg``: the :func:`~castore.storage.reffiles.digest` of ``data``. ``logged``: the
        swap log has the key already (:meth:`swap_many` logs its keys at once).

        Raises:
            StorageError: the swap log or the ref cannot be written (the lock is released).
        """
        try:
            if not logged:
                refchanges.log_swap(self.root, key, self.url)
            # framed when deferred, so that a later swap may write it in place and a reader
            # can tell a write in place it met
            stored = frame(data, dg) if deferred else as_stored(key, data)
            self._landed.pop(key, None)
            try:
                if deferred and ref is not None and len(stored) <= INPLACE_MAX:
                    # the intent in the log holds the whole value: a power loss that tears
                    # this write is replayed; renaming over the ref would make ext4
                    # (auto_da_alloc) start writing its data at once. One page at offset 0:
                    # a kill cannot cut it (INPLACE_MAX)
                    write_in_place(ref, stored, size)
                    ref = None
                    self._keep_landed(key, Landed(stored, data, dg.hex()))
                    unlock(path, fd)
                    if self.unsynced is not None:
                        self.unsynced.append((path, current.data if current is not None else None))
                    return
                if fd < 0:  # a linked lock: a temporary file is renamed, then the lock unlinked
                    # (exchanged with the ref, when deferred over a framed ref held open here)
                    self._write_file(path, stored, sync=not deferred, swap=deferred and ref is not None)
                    if deferred:
                        self._keep_landed(key, Landed(stored, data, dg.hex()))
                else:
                    # As git does: the new content goes into the lock file itself, which is then
                    # renamed over the ref; the rename is the commit and releases the lock at once.
                    # (The lock file holds its owner's line: a value at least as long covers it.)
                    if len(stored) < owner_size():
                        os.ftruncate(fd, 0)
                    pwrite_all(fd, stored, 0)  # (short at a full disk: its error, not a cut ref)
                    if self.durable and not deferred:
                        os.fsync(fd)
                    os.replace(path + ".lock", path)
                    if deferred:
                        self._keep_landed(key, Landed(stored, data, dg.hex()))
            except StorageError:
                raise  # (_write_file's, naming the file already)
            except OSError as e:
                raise StorageError(f"cannot write {key}: {e.strerror or e}", self.url) from e
        except BaseException:
            if ref is not None:
                os.close(ref)
            unlock(path, fd)
            raise
        if ref is not None:
            os.close(ref)
        if fd < 0:
            unlock(path, fd)
        else:
            os.close(fd)
        if not deferred:
            if self._unsynced_dirs:
                self._sync_made_dirs()
            self._fsync_dir(os.path.dirname(path))
        elif self.unsynced is not None:
            self.unsynced.append((path, current.data if current is not None else None))

    def _keep_landed(self, key: str, landed: Landed) -> None:
        """Remember ``landed`` as this handle's last write of ``key`` (a bounded number)."""
        if len(self._landed) >= _LANDED_KEPT:
            self._landed.pop(next(iter(self._landed)), None)
        self._landed[key] = landed

    # -- deferred swaps: recovery (bootmarkers.py) -------------------------------------------
    def recover_refs(self, intents_of: Callable[[str], builtins.list[RefIntent]]) -> int:
        """Replay the deferred swaps of every other boot that left a marker; see
        :meth:`Storage.recover_refs`, :meth:`~castore.storage.bootmarkers.BootMarkers.recover`
        and docs/FORMAT.md, 12. One listing when there is none.

        Raises:
            StorageError: a file cannot be read or written (the marker is kept).
        """
        return self._markers.recover(_boot_id(), intents_of)

    def sync_keys(self, keys: Iterable[str]) -> None:
        """Sync the files of ``keys`` (those that exist) and their folders; see
        :meth:`Storage.sync_keys`.

        Raises:
            StorageError: a sync failed.
        """
        if not self.durable:
            return
        keys = builtins.list(keys)
        if len(keys) + len(self._unsynced_dirs) >= SYNCFS_KEYS and self._syncfs():
            return
        dirs: set[str] = set()
        if self._unsynced_dirs:
            self._sync_made_dirs()
        for key in keys:
            path = self._path(key)
            dirs.add(os.path.dirname(path))
            try:
                fd = os.open(path, os.O_RDONLY)
            except (FileNotFoundError, NotADirectoryError):
                continue  # deleted since: a delete syncs its folder
            except OSError as e:
                raise StorageError(f"cannot sync {key}: {e.strerror or e}", self.url) from e
            try:
                os.fsync(fd)
            except OSError as e:
                raise StorageError(f"cannot sync {key}: {e.strerror or e}", self.url) from e
            finally:
                os.close(fd)
        for d in sorted(dirs):
            if os.path.isdir(d):
                self._fsync_dir(d)

    def _syncfs(self) -> bool:
        """Sync the whole file system the store is on with one ``syncfs`` (Linux): every
        file and folder written, as an ``fsync`` of each would; False where there is none."""
        fn = _syncfs_call()
        if fn is None:
            return False
        made = self._unsynced_dirs
        self._unsynced_dirs = []
        fd = os.open(self.root, os.O_RDONLY)
        try:
            if fn(fd) != 0:
                self._unsynced_dirs = made + self._unsynced_dirs
                import ctypes  # loaded by _syncfs_call

                err = ctypes.get_errno()
                raise StorageError(f"cannot sync the store's file system: {os.strerror(err)}", self.url)
        finally:
            os.close(fd)
        if self.unsynced:
            self.unsynced.clear()
        return True

    def delete(self, key: str, expect: Token | None = None) -> None:
        """Delete ``key`` (under its lock when ``expect`` is given).

        Raises:
            PreconditionFailed: ``key``'s token is not ``expect``. StorageError: the file cannot be deleted.
        """
        path = self._path(key)
        if os.path.dirname(path) not in self._made_dirs:
            self._check_inside(os.path.dirname(path))
        if expect is None and not key.startswith(_LOGGED_DELETES):
            try:
                os.unlink(path)
            except FileNotFoundError:
                return
            except OSError as e:
                raise StorageError(f"cannot delete {key}: {e.strerror}", self.url) from e
            self._prune_dirs(os.path.dirname(path))
            return
        if expect is None and not os.path.lexists(path):
            return
        fd = self._lock(path)
        try:
            current = self._read_locked(key)
            if expect is not None and (current is None or current.token != expect):
                raise PreconditionFailed(key, expect)
            if current is not None:
                boot = _boot_id()
                if self.durable and boot and key.startswith(_LOGGED_DELETES) and self._markers.has(boot):
                    # a deferred swap of this boot may have created the ref: without this
                    # record a recovery would replay that swap over the delete
                    self._markers.record(boot, RefIntent(key, current.token, None, None, boot, time.monotonic_ns()))
                refchanges.log_swap(self.root, key, self.url)
                try:
                    os.unlink(path)
                except OSError as e:
                    raise StorageError(f"cannot delete {key}: {e.strerror}", self.url) from e
                self._fsync_dir(os.path.dirname(path))
        finally:
            unlock(path, fd)
        self._prune_dirs(os.path.dirname(path))

    def swaps_since(self, mark: str | None) -> tuple[str, builtins.list[str] | None] | None:
        """The keys logged since ``mark``; see :func:`~castore.storage.refchanges.swaps_since`."""
        return refchanges.swaps_since(self.root, _boot_id(), mark, self.url)

    def compact_ref_logs(self, intents_of: Callable[[str], builtins.list[RefIntent]]) -> None:
        """Rotate ``swaps.log`` and drop from this boot's marker the records no replay needs
        (:func:`~castore.storage.refchanges.rotate`, :meth:`BootMarkers.compact`); the markers
        of other boots are replayed and removed when a store is opened."""
        refchanges.rotate(self.root, self.url)
        boot = _boot_id()
        if boot:
            self._markers.compact(boot, intents_of)

    def ref_stamps(self, folders: Sequence[str], settled: int | None = None) -> builtins.list[int]:
        """The modification time (ns) of each folder's ``heads/`` (-1 where there is none): a
        branch file made, renamed in or removed there changes it, by castore (whose changes
        :meth:`swaps_since` tells too) or by hand (which it cannot); so does removing the
        whole folder. One ``stat`` a folder; a ref written in place changes nothing (it is
        logged). With ``settled`` (see :meth:`Storage.ref_stamps`), a time less than
        :data:`SETTLE_NS` before it, or after it, gives :data:`UNSETTLED`: a file system's times
        tick coarsely (a few ms on Linux, 2 s on FAT), so a file removed in the tick of the
        folder's last change would leave its time as the stamp read."""
        out = []
        stat, root = os.stat, os.path.join(self.root, "")  # (keys are /-separated, as POSIX paths)
        recent = settled - SETTLE_NS if settled is not None else None
        for f in folders:
            try:
                t = stat(root + check_key(f"{f}/heads")).st_mtime_ns
            except OSError:
                t = -1
            out.append(UNSETTLED if recent is not None and t >= recent else t)
        return out

    def pending_swaps(self, prefix: str) -> builtins.list[str]:
        """Keys below ``prefix`` whose lock file exists (a swap under way or abandoned)."""
        return [k[:-len(".lock")] for k in self.list_locks(prefix)]

    def _prune_dirs(self, d: str) -> None:
        """Remove empty folders up to the root (as git does for refs)."""
        while os.path.abspath(d) != os.path.abspath(self.root) and d.startswith(self.root):
            try:
                os.rmdir(d)
            except OSError:
                return
            self._made_dirs.discard(d)
            d = os.path.dirname(d)

    # -- listing ---------------------------------------------------------------------
    def list(self, prefix: str) -> list[str]:
        """Every key below ``prefix``, skipping temporary files and locks."""
        return sorted(k for k, f in self._files_below(prefix) if ".tmp-" not in f and not f.endswith(".lock"))

    def _files_below(self, prefix: str) -> Iterator[tuple[str, str]]:
        """``(key, file name)`` of every file below ``prefix`` (as :func:`os.walk` finds them: a
        folder that cannot be read is skipped, a symlink to a folder is not followed), each key
        built as the walk goes down rather than taken relative to the root per folder."""
        base = self._path(prefix, prefix=True)
        top = check_key(prefix, prefix=True)  # the folder's key, as the path was made from it
        todo = [(base, top + "/" if top else "")]
        while todo:
            path, rel = todo.pop()
            try:
                entries = os.scandir(path)
            except OSError:
                continue
            with entries:
                for e in entries:
                    try:
                        folder = e.is_dir()
                    except OSError:
                        folder = False
                    if not folder:
                        yield rel + e.name, e.name
                    elif not e.is_symlink():
                        todo.append((e.path, rel + e.name + "/"))

    def list_dir(self, prefix: str) -> builtins.list[str]:
        """Immediate children of ``prefix`` (files and folders), skipping temporaries.

        Raises:
            StorageError: the folder cannot be listed.
        """
        try:
            names = os.listdir(self._path(prefix, prefix=True))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise StorageError(f"cannot list {prefix}: {e.strerror}", self.url) from e
        return sorted(n for n in names if ".tmp-" not in n and not n.endswith(".lock"))

    def stale_temps(self, min_age: float) -> builtins.list[str]:
        """Temporary files (``*.tmp-*``) last changed over ``min_age`` seconds ago: writes
        that a crash cut short before their rename. Paths are relative to the root."""
        now, out = time.time(), []
        for dirpath, _dirs, files in os.walk(self.root):
            for f in files:
                if ".tmp-" not in f:
                    continue
                path = os.path.join(dirpath, f)
                try:
                    if now - os.stat(path).st_mtime > min_age:
                        out.append(os.path.relpath(path, self.root).replace(os.sep, "/"))
                except FileNotFoundError:
                    continue  # renamed or removed meanwhile
        return sorted(out)

    def clear_stale_temps(self, min_age: float) -> builtins.list[str]:
        """Remove what :meth:`stale_temps` finds; return what was removed.

        Raises:
            StorageError: a file cannot be removed.
        """
        removed = []
        for rel in self.stale_temps(min_age):
            try:
                os.unlink(os.path.join(self.root, *rel.split("/")))
                removed.append(rel)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise StorageError(f"cannot remove {rel}: {e.strerror or e}", self.url) from e
        return removed

    def list_locks(self, prefix: str) -> builtins.list[str]:
        """Lock files below ``prefix`` (for fsck), relative to the root."""
        return [k for k, f in self._files_below(prefix) if f.endswith(".lock")]

    # -- format 2: ranged reads, append-only logs, age-checked deletes ------------------
    def _sync_written_dirs(self, dirs: set[str], items: Mapping[str, bytes]) -> None:
        """Sync each folder written into; one that vanished meanwhile (gc pruned it after
        deleting its last file, our file with it) is made again and its files rewritten."""
        for d in dirs:
            for attempt in range(3):
                if os.path.isdir(d):
                    try:
                        self._fsync_dir(d)
                        break
                    except StorageError as e:
                        if not isinstance(e.__cause__, FileNotFoundError) or attempt == 2:
                            raise
                if attempt == 2:
                    raise StorageError(f"cannot sync folder {d}: it keeps vanishing (a gc running?)", self.url)
                self._made_dirs.discard(d)
                for k, v in items.items():
                    path = self._path(k)
                    if os.path.dirname(path) == d:
                        self._write_file(path, as_stored(k, v))

    def read_range(self, key: str, offset: int, size: int) -> bytes:
        """``size`` bytes of ``key`` from ``offset``; see :meth:`Storage.read_range`.

        Raises:
            FileNotFoundError: no such key. StorageError: the file cannot be read.
        """
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(key) from None
        except OSError as e:
            raise StorageError(f"cannot read {key}: {e.strerror or e}", self.url) from e
        try:
            return os.pread(fd, size, offset)
        except OSError as e:
            raise StorageError(f"cannot read {key}: {e.strerror or e}", self.url) from e
        finally:
            os.close(fd)

    def open_appender(self, key: str) -> Appender | None:
        """Create ``key`` (it must not exist) as a log held under an exclusive ``flock``."""
        return _LocalAppender(self, key, self._create_log(key))

    def _create_log(self, key: str) -> int:
        """Create ``key`` with ``O_EXCL`` for appending, take its exclusive ``flock`` and
        sync its folder; return the open descriptor.

        Raises:
            StorageError: the file exists or cannot be created.
        """
        path = self._path(key)
        d = os.path.dirname(path)
        fd: int | None = None
        for attempt in (0, 1):
            self._ensure_dir(d)
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_APPEND, 0o644)
                break
            except FileNotFoundError as e:
                self._made_dirs.discard(d)  # pruned by a gc since we made it: make it again
                if attempt:
                    raise StorageError(f"cannot create {key}: {e.strerror or e}", self.url) from e
            except OSError as e:
                raise StorageError(f"cannot create {key}: {e.strerror or e}", self.url) from e
        assert fd is not None
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._fsync_dir(os.path.dirname(path))  # the log's name survives a crash
        return fd

    def is_held(self, key: str) -> bool:
        """Whether a live writer holds the ``flock`` of the log at ``key``."""
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing drops our shared lock
        return False

    def delete_if_older(self, key: str, cutoff: float) -> bool:
        """Delete ``key`` if last written before ``cutoff``, atomically against writers.

        The file is first renamed aside, then its age is read there: a writer that rewrote
        (freshened) it before the rename makes it young, and it is renamed back (the bytes
        are the same: a content-addressed file); a writer after the rename finds no file
        and writes a new one, which this call never touches.

        Raises:
            StorageError: the file cannot be renamed aside or deleted.
        """
        path = self._path(key)
        aside = f"{path}.tmp-gc-{os.urandom(8).hex()}"
        try:
            os.rename(path, aside)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as e:
            raise StorageError(f"cannot delete {key}: {e.strerror or e}", self.url) from e
        try:
            young = os.stat(aside).st_mtime >= cutoff
            if young:
                os.replace(aside, path)
                return False
            os.unlink(aside)
        except OSError as e:
            raise StorageError(f"cannot delete {key}: {e.strerror or e}", self.url) from e
        self._prune_dirs(os.path.dirname(path))
        return True

    def restore_aside(self) -> builtins.list[str]:
        """Put back the files :meth:`delete_if_older` had renamed aside when its process died
        (their real name is missing; a file already back there wins). Returns their keys.

        Raises:
            StorageError: a file cannot be put back.
        """
        restored = []
        for dirpath, _dirs, files in os.walk(self.root):
            for f in files:
                real, sep, _ = f.partition(".tmp-gc-")
                if not sep:
                    continue
                aside, path = os.path.join(dirpath, f), os.path.join(dirpath, real)
                try:
                    if os.path.exists(path):
                        os.unlink(aside)
                    else:
                        os.rename(aside, path)
                        restored.append(os.path.relpath(path, self.root).replace(os.sep, "/"))
                except FileNotFoundError:
                    continue
                except OSError as e:
                    raise StorageError(f"cannot restore {aside}: {e.strerror or e}", self.url) from e
        return sorted(restored)


class _LocalAppender(Appender):
    """A log file created with ``O_EXCL``, written with ``O_APPEND`` and one ``fdatasync``
    per append, under an exclusive ``flock`` held until :meth:`close` (or the process dies)."""

    def __init__(self, storage: LocalStorage, key: str, fd: int) -> None:
        """Wrap ``fd``, the log at ``key`` as :meth:`LocalStorage._create_log` opened it."""
        self.storage = storage
        self.key = key
        self._fd: int | None = fd
        self.size = 0
        self._dirty = False  # appended without a sync since the last one

    def append(self, data: bytes, sync: bool = True) -> int:
        """Append ``data`` (durably unless ``sync`` is False); see :meth:`Appender.append`."""
        if self._fd is None:
            raise StorageError(f"{self.key}: the log is closed", self.storage.url)
        at = self.size
        try:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            if self.storage.durable and sync:
                os.fdatasync(self._fd)
            self._dirty = not sync
            gone = os.fstat(self._fd).st_nlink == 0
        except OSError as e:
            self.close()
            raise StorageError(f"cannot append to {self.key}: {e.strerror or e}", self.storage.url) from e
        if gone:
            # a gc or repack removed the log (it only takes logs idle for longer than its grace):
            # what was just written is in no file any more, so this append must not count
            self.close()
            raise StorageError(f"cannot append to {self.key}: it was removed meanwhile (gc or repack); "
                               "nothing was stored, try again", self.storage.url)
        self.size = at + len(data)
        return at

    def sync(self) -> None:
        """Make the appends so far durable; see :meth:`Appender.sync`."""
        if self._fd is None or not self._dirty:
            return
        try:
            if self.storage.durable:
                os.fdatasync(self._fd)
        except OSError as e:
            self.close()
            raise StorageError(f"cannot sync {self.key}: {e.strerror or e}", self.storage.url) from e
        self._dirty = False

    def close(self) -> None:
        """Release the log and its ``flock``."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
