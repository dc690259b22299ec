"""Work done in a forked child process, its answer sent back through a pipe: a second core for
a pass that would otherwise run on one (``castore usage``'s first run reads half the packs in
one).

A child is forked only from a process that runs one thread (:func:`can_fork`): a thread pool
or an I/O thread of the parent (s3fs's) does not exist in the child, which would wait on it
forever, and a lock another thread held stays held there. The child runs a function that
returns bytes, writes them to the pipe and leaves with ``os._exit``: no ``atexit`` handler,
no buffered output of the parent written twice, no teardown.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import threading
from collections.abc import Callable
from types import TracebackType

from .errors import CastoreError

#: the length of an answer, before its bytes
_LENGTH = struct.Struct("<Q")
#: the exit status of a child whose work raised (it wrote nothing)
_RAISED = 3


class WorkerDied(CastoreError, RuntimeError):
    """A forked worker ended without giving its answer (killed, or out of memory)."""


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether a :class:`Forked` child may start now and pay: the platform forks, this process
    runs one thread, and it may run on two cores or more. Raises nothing."""
    return hasattr(os, "fork") and threading.active_count() == 1 and cores() >= 2


class Forked:
    """``work()`` run in a forked child from the moment this is made, its bytes collected by
    :meth:`answer`. Use it as a context manager: leaving it before the answer kills the child
    (nothing it did is kept).

    Raises:
        OSError: the fork or the pipe failed (out of processes or descriptors).
    """

    def __init__(self, work: Callable[[], bytes]) -> None:
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            raise
        if pid == 0:  # the child: answer, then leave without running anything of the parent's
            status = _RAISED
            try:
                os.close(r)
                data = work()
                with os.fdopen(w, "wb") as out:
                    out.write(_LENGTH.pack(len(data)))
                    out.write(data)
                status = 0
            except BaseException:  # noqa: BLE001  # the parent does the work again and sees the error
                pass
            finally:
                os._exit(status)
        os.close(w)
        self._pid: int | None = pid
        self._r = r

    def answer(self) -> bytes | None:
        """The bytes ``work`` returned in the child (waiting for it), or None when it raised:
        the caller does that work itself, where the error can be handled.

        Raises:
            WorkerDied: the child ended without answering (a signal, or a short answer).
        """
        chunks = []
        with os.fdopen(self._r, "rb", closefd=True) as f:
            self._r = -1
            while chunk := f.read(1 << 20):
                chunks.append(chunk)
        pid, self._pid = self._pid, None
        _, status = os.waitpid(pid, 0) if pid is not None else (0, 0)
        data = b"".join(chunks)
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _RAISED and not data:
            return None
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and len(data) >= _LENGTH.size \
                and _LENGTH.unpack_from(data)[0] == len(data) - _LENGTH.size:
            return data[_LENGTH.size:]
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else \
            f"exit status {os.waitstatus_to_exitcode(status)}"
        raise WorkerDied(f"a worker process ({pid}) ended without its answer ({how}, {len(data)} bytes read); "
                         "nothing of it was kept: run the command again")

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._r >= 0:
            os.close(self._r)
            self._r = -1
        if self._pid is not None:  # left before the answer: the child's work is not wanted
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            os.waitpid(self._pid, 0)
            self._pid = None
