"""Ref files on local disk as their bytes lie: plain, or framed and written in place.

A ref that a deferred swap (format 3, docs/FORMAT.md 12) wrote is *framed*
(:func:`~castore.storage.bootmarkers.frame`: a header that checks the value), so that a later
deferred swap may overwrite it in place (one ``pwrite`` of at most :data:`INPLACE_MAX`
bytes, no rename) and a reader can tell a write in place it met from a whole value. This
module reads such files (:func:`settle` reads again a ref caught mid-write,
:func:`file_value` takes one as it lies), opens one under its lock for a write in place
(:func:`open_locked`) and writes it (:func:`write_in_place`). The lock, the compare and
the journal are :class:`~castore.storage.local.LocalStorage`'s.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import CorruptRef, StorageError
from .base import Token, Versioned
from .bootmarkers import INPLACE_MAGIC, frame, framed_token, unframe

try:  # hashlib's own blake2b, without importing OpenSSL's _hashlib (import time of a local store)
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - a Python built without _blake2
    from hashlib import blake2b

#: keys below this folder are refs: a framed file there is read as its value
REFS = "refs/"
#: how many times a reader reads again a ref written in place that failed its check while
#: its lock exists (a write under way), before calling it torn
_TORN_READS = 64
#: the most bytes a ref is written in place with (docs/FORMAT.md 12): one page, since the
#: kernel checks for a fatal signal before copying each page of a write, so a writer killed
#: (SIGKILL) during a write of two pages can leave the first written and not the second:
#: a torn ref in the same boot, which readers cannot repair
INPLACE_MAX = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_READ_CHUNK = 1 << 16


def token(data: bytes) -> Token:
    """The token of a value on local disk: its 16-byte blake2b digest, in hex. Raises nothing."""
    return blake2b(data, digest_size=16).hexdigest()


def digest(data: bytes) -> bytes:
    """The 16-byte blake2b digest of ``data``: its :func:`token` unhexed, and what the header
    of its frame holds (:func:`~castore.storage.bootmarkers.frame`). Raises nothing."""
    return blake2b(data, digest_size=16).digest()


class Landed(NamedTuple):
    """What a handle last wrote as a framed ref: the file's bytes, the value and its token.
    A file read back byte for byte equal to ``framed`` holds ``value`` (its check passed
    when it was made), so its check need not be computed again."""

    framed: bytes
    value: bytes
    token: Token


def read_all(fd: int) -> bytes:
    """The bytes of the open regular file ``fd`` from its offset to its end: one ``read`` for
    a small file (a short read of a regular file is its end).

    Raises:
        OSError: the read failed (IsADirectoryError for a folder).
    """
    chunk = os.read(fd, _READ_CHUNK)
    if len(chunk) < _READ_CHUNK:
        return chunk
    parts = [chunk]
    while chunk:
        chunk = os.read(fd, _READ_CHUNK)
        parts.append(chunk)
    return b"".join(parts)


def is_framed(key: str, data: bytes) -> bool:
    """Whether ``data``, the file of ``key``, is a ref written in place (framed). Raises nothing."""
    return data.startswith(INPLACE_MAGIC) and key.startswith(REFS)


def as_stored(key: str, data: bytes) -> bytes:
    """The bytes to store for ``data`` at ``key``: a ref value that starts with the header of
    a ref written in place (none that castore writes) is framed too, so that it reads back
    as itself. Raises nothing."""
    return frame(data) if is_framed(key, data) else data


def settle(key: str, data: bytes, lock: str, reread: Callable[[], bytes]) -> bytes:
    """The value of the ref file ``key`` written in place, whose bytes were ``data``
    (``reread`` reads the file again; ``lock`` is its lock file).

    A read that met a write in place fails the check: it is read again while the ref's
    lock exists (briefly), and once more after the lock went (the write may have ended
    between the read and the look at the lock).

    Raises:
        CorruptRef: the file still fails its check (a power loss cut its write short and
            no recovery has run yet, or it was damaged).
        FileNotFoundError, StorageError: from ``reread``.
    """
    delay, unlocked = 0.0001, 0
    for _ in range(_TORN_READS):
        value = unframe(data)
        if value is not None:
            return value
        if os.path.exists(lock):
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
        else:
            unlocked += 1
            if unlocked > 1:
                break
        data = reread()
        if not data.startswith(INPLACE_MAGIC):
            return data  # replaced meanwhile by a rename (a durable swap)
    raise CorruptRef(key[len(REFS):], "torn: its write in place was cut short (a power loss?) "
                     "and no recovery has replaced it; open the store with castore to replay "
                     "the writers' logs, or delete the ref")


def file_value(key: str, data: bytes) -> bytes:
    """What the file of ``key`` holding ``data`` holds, with no wait: the value of a framed
    ref that passes its check, else the bytes as they are (header included). Raises nothing."""
    if is_framed(key, data):
        value = unframe(data)
        return data if value is None else value
    return data


def open_locked(key: str, path: str, read_locked: Callable[[str], Versioned | None],
                url: str, landed: Landed | None = None) -> tuple[Versioned | None, int | None, int]:
    """Under the lock of the ref ``key`` (file ``path``), before a swap that may be
    deferred: what ``read_locked`` gives, and the file itself, left open for writing, when
    it is framed (only such a file is written in place: a plain file read mid-overwrite
    could not be told from a whole one; None when it is not framed, is missing or cannot be
    opened for writing), and its size. ``landed``: what this handle last wrote there; a
    file that still holds exactly those bytes is not checked again.

    Raises:
        StorageError: the file cannot be read (names ``key`` and ``url``).
    """
    try:
        ref = os.open(path, os.O_RDWR)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None, None, 0
    except OSError:
        return read_locked(key), None, 0  # not writable here: the swap renames
    try:
        raw = read_all(ref)
    except OSError as e:
        os.close(ref)
        if isinstance(e, IsADirectoryError):
            return None, None, 0
        raise StorageError(f"cannot read {key}: {e.strerror or e}", url) from e
    if landed is not None and raw == landed.framed:
        return Versioned(landed.value, landed.token), ref, len(raw)
    if not raw.startswith(INPLACE_MAGIC):
        os.close(ref)
        return Versioned(raw, token(raw)), None, len(raw)
    # no write in place is under way (the lock is ours): a file failing its check is
    # torn, compared as it lies (read_ref_file)
    value = unframe(raw)
    return (Versioned(raw, token(raw)) if value is None else Versioned(value, framed_token(raw))), \
        ref, len(raw)


#: renameat2's flag that swaps two names atomically (linux/fs.h), and the dirfd of "relative
#: to the working folder" (paths here are absolute)
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_RENAMEAT2: list[Any] = []  # [libc's renameat2, or None where there is none], found at first use


def _renameat2() -> Any:
    if not _RENAMEAT2:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                fn = ctypes.CDLL(None, use_errno=True).renameat2
                fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
                fn.restype = ctypes.c_int
            except (ImportError, OSError, AttributeError):
                fn = None
        _RENAMEAT2.append(fn)
    return _RENAMEAT2[0]


def exchange(src: str, dst: str) -> bool:
    """Swap the files at ``src`` and ``dst`` in one step (``renameat2`` with
    ``RENAME_EXCHANGE``): a reader of ``dst`` finds the old file or the new one, as with a
    rename; ``src`` then names the old file. False, with nothing changed, where this system
    or file system has no such call.

    Unlike a rename over ``dst``, it does not make ext4 start writing ``src``'s data at once
    (``auto_da_alloc``), and the old file, written the same way a moment before, is freed
    before its blocks were allocated: a ref too long to be written in place costs ~30 us
    instead of ~100 (docs/FORMAT.md 12; the deferred swap's intent is what keeps it durable).

    Raises:
        OSError: the exchange failed (``dst`` or ``src`` missing: FileNotFoundError).
    """
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_EXCHANGE) == 0:
        return True
    import ctypes

    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False  # not on this file system (or kernel)
    raise OSError(err, os.strerror(err), dst)


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Write all of ``data`` into file ``fd`` at ``offset``: a ``pwrite`` that ends short (the
    file reached the disk's end or the process's file-size limit) is carried on, so that the
    error comes (ENOSPC, EFBIG) rather than a file cut short taken as written.

    Raises:
        OSError: a write failed, or wrote nothing.
    """
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view, offset = view[n:], offset + n


def write_in_place(ref: int, data: bytes, size: int) -> None:
    """Write the framed ``data`` (at most :data:`INPLACE_MAX` bytes) over the open ref file
    ``ref`` of ``size`` bytes, at offset 0, cut to its length if it shrank, and close
    ``ref``. One page at offset 0: a kill cannot cut it.

    Raises:
        OSError: the write failed (``ref`` is left open for the caller to close).
    """
    pwrite_all(ref, data, 0)
    if len(data) < size:  # else the write itself set the size
        os.ftruncate(ref, len(data))
    os.close(ref)
