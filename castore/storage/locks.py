"""Lock files of local-disk storage: ``<key>.lock`` taken exclusively, owned by its ``flock``.

A writer takes ``<key>.lock`` by creating it (``O_CREAT | O_EXCL``), ``flock``s it, checks
that the name is still its file's (a rival may have cleared it as stale before the ``flock``)
and records ``<pid> <host>`` in it (for messages only). A lock whose ``flock`` nobody holds is
stale: its holder died and the kernel dropped the ``flock`` (see :func:`check_stale`); the
next writer clears it at once. A live holder is waited for at most :data:`LOCK_TIMEOUT`.

A swap that may be deferred (format 3, docs/FORMAT.md 12) does not create a file per lock:
its handle makes one lock file under ``locks/`` the first time (:class:`HandleLockFile`,
``flock``ed for the handle's life, its owner written once) and hard-links it as
``<key>.lock``; the lock is released by unlinking that name. (A swap of a ref expected
absent locks with a new file, which it renames over the ref: a new ref needs one anyway.) A forked child lets go of its
parent's lock file (an at-fork hook) and makes its own. :func:`take_lock` is the one place
a lock is taken; :mod:`castore.storage.local` uses it.
"""

from __future__ import annotations

import fcntl
import os
import time
import weakref
from collections.abc import Callable

from ..errors import InvalidName, RefLocked, StorageError

#: this host's name, recorded in a lock file with the pid (for messages only)
HOST = os.uname().nodename
#: how long a writer waits for a live rival's lock before giving up (a writer holds it for
#: one read, write and fsync: milliseconds)
LOCK_TIMEOUT = 10.0
#: a lock file with no owner written yet is treated as stale after this many seconds
EMPTY_LOCK_GRACE = 5.0
#: seconds a lock file's time may lie ahead of the clock and still be a creator's of just now: one
#: further ahead was made before the clock went back (a reboot after a power loss on a machine
#: without a clock of its own; the file is empty when its owner's line was not yet on disk), and
#: would otherwise look young, so held, until the clock caught up
CLOCK_SLACK = 1.0
#: the folder of the handles' lock files that deferred swaps link as ``<ref>.lock``
#: (docs/FORMAT.md 12), at the root
LOCKS = "locks"


_OWNER: list[bytes] = []  # this process's owner line, made once (forgotten in a forked child)


def _owner() -> bytes:
    """What a lock file made by this process holds: ``<pid> <host>\n``."""
    if not _OWNER:
        _OWNER.append(f"{os.getpid()} {HOST}\n".encode())
    return _OWNER[0]


class HandleLockFile:
    """One storage handle's lock file under ``locks/``, which :func:`take_lock` hard-links as
    ``<key>.lock``: made, ``flock``ed and its owner written the first time it is asked for,
    removed by :meth:`drop` or when this object is collected (in the process that made it)."""

    def __init__(self, root: str) -> None:
        """A lock file to make under ``<root>/locks/`` when first needed."""
        self.root = root
        # (path, fd, the finalizer that removes it)
        self._made: tuple[str, int, weakref.finalize] | None = None
        self.no_links = False  # hard links failed here: every lock is a new file

    def source(self, ensure_dir: Callable[[str], None]) -> str | None:
        """The path of this handle's lock file (made the first time, its folder by
        ``ensure_dir``); None where hard links are not used. Making it also removes the lock
        files there of dead processes. Raises nothing: a failure means no hard links."""
        if self.no_links:
            return None
        if self._made is not None:
            if self._made[2].alive:
                return self._made[0]
            self._made = None  # a forked child: the parent's is not ours
        d = os.path.join(self.root, LOCKS)
        path = os.path.join(d, os.urandom(16).hex())
        try:
            ensure_dir(d)
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except (OSError, StorageError, InvalidName):
            self.no_links = True
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, _owner())
        except OSError:
            _release_lock_file(path, fd, os.getpid())
            self.no_links = True
            return None
        self._made = (path, fd, weakref.finalize(self, _release_lock_file, path, fd, os.getpid()))
        _LINKED.add(self)
        try:
            names = os.listdir(d)
        except OSError:
            names = []
        for name in names:
            if os.path.join(d, name) != path:
                check_stale(os.path.join(d, name), remove=True)
        return path

    def drop(self) -> None:
        """Remove this handle's lock file (a lock linked from it stays). Raises nothing."""
        if self._made is not None:
            self._made[2]()
            self._made = None

    def after_fork_in_child(self) -> None:
        """In a forked child: let go of the parent's lock file (its ``flock`` must die with
        the parent, or a lock the parent leaves would look alive). Raises nothing."""
        if self._made is not None:
            self._made[2].detach()
            try:
                os.close(self._made[1])
            except OSError:
                pass
            self._made = None


_LINKED: weakref.WeakSet[HandleLockFile] = weakref.WeakSet()  # lock files made under locks/


def _release_lock_file(path: str, fd: int, pid: int) -> None:
    """Remove a handle's lock file under ``locks/`` and close it (in the process that made it)."""
    if os.getpid() != pid:
        return
    try:
        os.unlink(path)
    except OSError:
        pass
    try:
        os.close(fd)
    except OSError:
        pass


def _forget_linked_locks_in_child() -> None:
    _OWNER.clear()
    for lock_file in list(_LINKED):
        lock_file.after_fork_in_child()


os.register_at_fork(after_in_child=_forget_linked_locks_in_child)


def take_lock(path: str, linked: HandleLockFile | None, ensure_dir: Callable[[str], None],
              remake_dir: Callable[[str], None], after_cleared: Callable[[str], None], url: str) -> int:
    """Take ``<path>.lock``: create it exclusively, ``flock`` it, record the owner; return
    its descriptor. With ``linked`` (a swap that may be deferred), the lock is that handle's
    lock file hard-linked as ``<path>.lock`` (its ``flock`` held and its owner written
    once): no file is made per lock. Returns -1 then (the link is not renamed over the ref:
    the caller writes the ref in place or renames a temporary file, then calls
    :func:`unlock`).

    ``ensure_dir`` makes a folder (cached), ``remake_dir`` makes one again that vanished (a
    handle pruned it); ``after_cleared(path)`` runs under the lock when a stale lock was
    cleared to take it (the lock is released if it raises). A lock whose ``flock`` nobody
    holds is stale and cleared at once (see :func:`check_stale`); a live holder is waited
    for at most :data:`LOCK_TIMEOUT`.

    Raises:
        RefLocked: a live process held the lock for the whole wait (names the lock file,
            its owner and what to do); not a lost race, so not worth retrying at once.
        StorageError: the lock file cannot be created (a read-only or unwritable folder,
            a file system without locks).
    """
    lock = path + ".lock"
    ensure_dir(os.path.dirname(path))
    source = linked.source(ensure_dir) if linked is not None else None
    deadline = time.monotonic() + LOCK_TIMEOUT
    delay = 0.0005
    remade = 0
    cleared = False
    while True:
        try:
            if source is not None:
                os.link(source, lock)
                fd = -1
            else:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if check_stale(lock, remove=True) is not False:  # removed (or vanished)
                cleared = True
                continue
            if time.monotonic() > deadline:
                raise RefLocked(path, None, None, held_message(lock)) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
            continue
        except FileNotFoundError as e:
            # The folder was pruned by another handle after its last file went: make it
            # again, a few times; a folder that never holds a file (``/proc``) is not
            # worth spinning on.
            if remade >= 5:
                raise StorageError(f"cannot create lock file {lock}: {e.strerror or e}", url) from e
            remade += 1
            if linked is not None and source is not None and not os.path.exists(source):
                linked.drop()  # removed by hand: make another
                source = linked.source(ensure_dir)
                continue
            remake_dir(os.path.dirname(path))
            continue
        except OSError as e:
            if linked is not None and source is not None:
                # no hard links here (another file system under the root, FUSE...): lock
                # files are made per lock, as before
                linked.no_links = True
                linked.drop()
                source = None
                continue
            raise StorageError(f"cannot create lock file {lock}: {e.strerror or e}", url) from e
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as e:
                unlock(path, fd)
                raise StorageError(f"cannot lock {lock}: {e.strerror or e}", url) from e
            if not _still_named(lock, fd):
                # a rival took the file for stale before it was locked (an empty one: its
                # time ahead of the clock, or old) and cleared it: it is not the lock any more
                os.close(fd)
                continue
            try:
                os.write(fd, _owner())
            except OSError as e:
                unlock(path, fd)
                raise StorageError(f"cannot lock {lock}: {e.strerror or e}", url) from e
        if cleared:
            try:
                after_cleared(path)
            except BaseException:
                unlock(path, fd)
                raise
        return fd


def _still_named(lock: str, fd: int) -> bool:
    """Whether ``lock`` still names the file open as ``fd``. Raises nothing."""
    try:
        return os.stat(lock).st_ino == os.fstat(fd).st_ino
    except OSError:
        return False


def owner_size() -> int:
    """The size of a lock file :func:`take_lock` made in this process (its owner's line): a
    value written over it from offset 0 that is at least as long leaves none of it behind.
    Raises nothing."""
    return len(_owner())


def unlock(path: str, fd: int) -> None:
    """Release the lock :func:`take_lock` took on ``path``: unlink ``<path>.lock`` and close
    ``fd`` (none for a linked lock, -1).

    Raises:
        OSError: the lock file cannot be unlinked (``fd`` is closed all the same).
    """
    try:
        os.unlink(path + ".lock")
    finally:
        if fd >= 0:
            os.close(fd)


def check_stale(lock: str, remove: bool) -> bool | None:
    """Whether no live process holds ``lock``; with ``remove``, delete it if so.

    Ownership is the ``flock``, never the recorded pid (a restarted container reuses pid 1,
    and another host's pids mean nothing here): a writer holds an exclusive ``flock`` from
    just after creating the lock file until the file is gone, and the kernel drops it when
    the writer dies. Only a writer caught between creating the file and locking it holds
    no ``flock``, and it has written nothing yet, so a young empty file is not stale (one
    whose time is ahead of the clock by more than :data:`CLOCK_SLACK` is not young: the clock
    went back since it was made). Clearing such a file while its creator is in fact about to
    lock it costs that creator a retry, never the lock: :func:`take_lock` checks, once it holds
    the ``flock``, that the name is still its file's.
    Returns None when the file vanished.

    Raises:
        OSError: the lock file cannot be read, locked or removed.
    """
    try:
        fd = os.open(lock, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live process holds it
        st = os.fstat(fd)
        try:
            if os.stat(lock).st_ino != st.st_ino:
                return None  # replaced meanwhile
        except FileNotFoundError:
            return None
        if st.st_size == 0 and -CLOCK_SLACK < time.time() - st.st_mtime < EMPTY_LOCK_GRACE:
            return False  # its creator may be about to flock it
        if remove:
            os.unlink(lock)
        return True
    finally:
        os.close(fd)


#: at most this many bytes of a lock file's owner line are shown (escaped) in a message
OWNER_SHOWN = 64


def held_message(lock: str) -> str:
    """What a writer says when a live process kept ``lock`` for the whole wait: the lock
    file, its recorded owner and what to do. Raises nothing.

    The owner line is what any process (or damage) wrote there: it is named as a process
    only when it reads as castore writes it (``<pid> <host>``, printable ASCII); anything
    else is shown escaped, at most :data:`OWNER_SHOWN` bytes of it, never raw (a message is
    printed to terminals and logs)."""
    try:
        with open(lock, "rb") as f:
            raw = f.read(200)
    except OSError:
        raw = b""
    owner = raw.split(b"\n", 1)[0].split(b" ")
    if (len(owner) == 2 and owner[0].isdigit() and len(owner[0]) <= 10 and 0 < len(owner[1]) <= 255
            and owner[1].isascii() and owner[1].decode().isprintable()):
        who = f"process {owner[0].decode()} on {owner[1].decode()}"
    elif raw.strip():
        who = f"another process (its owner line is not castore's: '{escaped(raw, OWNER_SHOWN)}')"
    else:
        who = "another process"
    return (f"{lock} is held by {who}, which still holds its lock after {LOCK_TIMEOUT:g}s; "
            "wait for that writer to finish or stop it (a lock of a dead process is cleared "
            "by the next writer and by `castore gc`)")


def escaped(raw: bytes, limit: int) -> str:
    """At most ``limit`` bytes of ``raw`` as printable ASCII: other bytes as ``\\xNN``
    escapes, and ``...`` when more followed. Raises nothing."""
    text = raw[:limit].decode("ascii", "backslashreplace")
    shown = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    return shown + ("..." if len(raw) > limit else "")
