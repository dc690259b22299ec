"""The swap log of local-disk storage: ``swaps.log`` at the root, one line per ref change.

Every swap, conditional delete and delete of a key under ``refs/`` first appends
``<length> <key>\n`` (:func:`log_swap`, after a header line naming the log by a random id),
while it holds the key's lock (one ``O_APPEND`` write, not synced). :func:`swaps_since`
reads what was appended since a mark; why nothing is missed is in the docstring of
:mod:`castore.storage.local`, which calls both.

The log stays bounded: once it passes :data:`ROTATE_BYTES`, the writer that appended the
line past it replaces it by a new, empty log (:func:`rotate`, a new random id), and ``gc``
rotates it too (a deleted session's names must not outlive it here). A reader's mark into a
rotated log names another log id: it cannot tell (None), never a wrong "nothing moved". A
writer that appended to the old log after the rotation still held its key's lock when the
reader took its new mark, and a reader that cannot tell asks for those locks
(:meth:`~castore.refs.RefStore.changes_since`), so its change is read all the same.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

from ..errors import StorageError

#: the swap log, at the root
SWAP_LOG = "swaps.log"
_LOG_HEADER = "castore swap log "
#: a log this long is replaced by an empty one (about 20,000 ref changes: a reader that
#: cannot tell reads every ref once per rotation)
ROTATE_BYTES = 1 << 20


def log_swap(root: str, key: str, url: str) -> None:
    """Append ``key`` to the swap log at ``root`` (called under the key's lock, before the
    change lands); see :func:`log_swaps`.

    Raises:
        StorageError: the log cannot be written (the change is then not made).
    """
    log_swaps(root, (key,), url)


def log_swaps(root: str, keys: Sequence[str], url: str) -> None:
    """Append ``keys`` to the swap log at ``root`` with one write (called under every key's
    lock, before any of the changes lands: a :meth:`~castore.storage.local.LocalStorage.
    swap_many`).

    A new log starts with a header naming it by a random id, made whole and then linked
    into place (never over another), so that a reader's mark cannot be mistaken for a
    mark of a later log in a reused inode. A log past :data:`ROTATE_BYTES` is then rotated.

    Raises:
        StorageError: the log cannot be written (the change is then not made).
    """
    path = os.path.join(root, SWAP_LOG)
    line = b"".join(f"{len(key.encode())} {key}\n".encode() for key in keys)
    try:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except FileNotFoundError:
            tmp = f"{path}.tmp-{os.urandom(16).hex()}"
            with open(tmp, "xb") as f:
                f.write(f"{_LOG_HEADER}{os.urandom(16).hex()}\n".encode())
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # a rival made it first: append to theirs
            finally:
                os.unlink(tmp)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line)
            full = os.fstat(fd).st_size > ROTATE_BYTES
        finally:
            os.close(fd)
    except OSError as e:
        raise StorageError(f"cannot record the change of {', '.join(keys)} in {SWAP_LOG}: {e.strerror or e}",
                           url) from e
    if full:
        rotate(root, url)


def rotate(root: str, url: str) -> None:
    """Replace the swap log at ``root`` by an empty one with a new id (see the module
    docstring for why no reader misses a change); nothing when there is no log.

    Raises:
        StorageError: the new log cannot be written.
    """
    path = os.path.join(root, SWAP_LOG)
    if not os.path.exists(path):
        return
    tmp = f"{path}.tmp-{os.urandom(16).hex()}"
    try:
        with open(tmp, "xb") as f:
            f.write(f"{_LOG_HEADER}{os.urandom(16).hex()}\n".encode())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StorageError(f"cannot rotate {SWAP_LOG}: {e.strerror or e}", url) from e


def swaps_since(root: str, boot: str, mark: str | None, url: str) -> tuple[str, list[str] | None] | None:
    """The keys logged in the swap log at ``root`` since ``mark`` (``BOOT:LOG ID:OFFSET``),
    ``boot`` being this boot's id ("" where there is none: None then); see
    :meth:`~castore.storage.base.Storage.swaps_since`.

    Raises:
        StorageError: the log cannot be read (names it and ``url``).
    """
    if not boot:
        return None
    try:
        fd = os.open(os.path.join(root, SWAP_LOG), os.O_RDONLY)
    except FileNotFoundError:
        absent = f"{boot}:-:0"
        return absent, ([] if mark == absent else None)
    except OSError as e:
        raise StorageError(f"cannot read {SWAP_LOG}: {e.strerror or e}", url) from e
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 64, 0)
        nl = head.find(b"\n")
        if not head.startswith(_LOG_HEADER.encode()) or nl < 0:
            return f"{boot}:?:0", None  # not a log this castore wrote: never trusted
        log_id = head[len(_LOG_HEADER):nl].decode("ascii", "replace")
        now = f"{boot}:{log_id}:{size}"
        old = (mark or "").split(":")
        if len(old) != 3 or old[0] != boot or old[1] != log_id or not old[2].isdigit() \
                or not nl < int(old[2]) <= size:
            return now, None
        start = int(old[2])
        data = os.pread(fd, size - start, start)
    except OSError as e:
        raise StorageError(f"cannot read {SWAP_LOG}: {e.strerror or e}", url) from e
    finally:
        os.close(fd)
    end = data.rfind(b"\n") + 1  # a line still being written is read next time
    keys: list[str] = []
    for line in data[:end].split(b"\n")[:-1]:
        n, _, key = line.partition(b" ")
        if not n.isdigit() or int(n) != len(key):
            return now, None  # a torn line (a failed write) with another after it: read everything
        keys.append(key.decode("utf-8", "replace"))
    return f"{boot}:{log_id}:{start + end}", keys
