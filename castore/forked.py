"""Work done in a forked child process, its answer sent back through a pipe: a second core for
a pass that would otherwise run on one (``castore usage``'s first run reads part of the packs
in one).

A child is forked only from a process that runs one thread (:func:`can_fork`): a thread pool
or an I/O thread of the parent (s3fs's) does not exist in the child, which would wait on it
forever, and a lock another thread held stays held there. The child runs a function that
returns bytes, writes them to the pipe and leaves with ``os._exit``: no ``atexit`` handler,
no buffered output of the parent written twice, no teardown. The child may start before the
parent knows all it needs (the refs it walks): it asks for it when it gets there, and the
parent sends it once it has it (:meth:`Forked.send`), through a second pipe. A child does not
outlive its parent: on Linux the kernel kills it when the parent ends, however it ends
(:func:`_die_with_parent`); a parent that dies leaves no orphan reading on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import struct
import threading
from collections.abc import Callable
from types import TracebackType
from typing import BinaryIO

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
    """``work(receive)`` run in a forked child from the moment this is made, its bytes
    collected by :meth:`answer`; in the child, ``receive()`` waits for the bytes the parent
    sends with :meth:`send` (and raises EOFError when the parent sent none: it does not want
    the answer). Use it as a context manager: leaving it before the answer kills the child
    (nothing it did is kept).

    Raises:
        OSError: the fork or a pipe failed (out of processes or descriptors).
    """

    def __init__(self, work: Callable[[Callable[[], bytes]], bytes]) -> None:
        parent = os.getpid()
        r, w = os.pipe()  # the answer, child to parent
        try:
            ask, tell = os.pipe()  # what the parent sends, parent to child
        except OSError:
            os.close(r)
            os.close(w)
            raise
        try:
            pid = os.fork()
        except OSError:
            for fd in (r, w, ask, tell):
                os.close(fd)
            raise
        if pid == 0:  # the child: answer, then leave without running anything of the parent's
            status = _RAISED
            try:
                _die_with_parent(parent)
                os.close(r)
                os.close(tell)
                data = work(lambda: _read_message(ask))
                with os.fdopen(w, "wb") as out:
                    _write_frame(out, data)
                status = 0
            except BaseException:  # noqa: BLE001  # the parent does the work again and sees the error
                pass
            finally:
                os._exit(status)
        os.close(w)
        os.close(ask)
        self._pid: int | None = pid
        self._r = r
        self._tell = tell
        self._sender: threading.Thread | None = None

    def send(self, data: bytes) -> None:
        """Give the child ``data`` (what its ``receive()`` returns), once, without waiting for
        it to read them: a thread writes them while this process goes on. Raises nothing (a
        child gone before it read them answers as it ends)."""
        tell, self._tell = self._tell, -1
        if tell < 0:
            return
        self._sender = threading.Thread(target=_write_message, args=(tell, data), daemon=True)
        self._sender.start()

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
        self._stop_sending()
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
        self.stop()

    def stop(self) -> None:
        """Kill the child unless it answered already (its work is not wanted; nothing it did is
        kept). Raises nothing."""
        if self._r >= 0:
            os.close(self._r)
            self._r = -1
        if self._pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            os.waitpid(self._pid, 0)
            self._pid = None
        self._stop_sending()

    def _stop_sending(self) -> None:
        """Close this end of the pipe to the child (the child has ended: a write still under way
        fails and ends)."""
        if self._tell >= 0:
            os.close(self._tell)
            self._tell = -1
        if self._sender is not None:
            self._sender.join()
            self._sender = None


#: prctl's option that names the signal a process gets when its parent ends (linux/prctl.h)
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """In a child just forked by ``parent`` (a pid): have the kernel send it SIGKILL when the
    parent ends (Linux's ``prctl(PR_SET_PDEATHSIG)``; a no-op where there is none), and leave
    at once if the parent ended before that was set (the child was handed to another process).
    The signal comes when the thread that forked ends: :func:`can_fork` has it the only one.
    Raises nothing (it may end the process)."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):  # not Linux (no prctl), or no ctypes
        return
    if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0 and os.getppid() != parent:
        os._exit(_RAISED)


def _write_frame(out: BinaryIO, data: bytes) -> None:
    """Write ``data`` to ``out`` as a frame: its length (:data:`_LENGTH`), then the bytes (what
    :meth:`Forked.answer` and :func:`_read_message` read). Raises OSError."""
    out.write(_LENGTH.pack(len(data)))
    out.write(data)


def _write_message(fd: int, data: bytes) -> None:
    """Write ``data`` as a frame to ``fd`` and close it; a reader gone ends it quietly."""
    with contextlib.suppress(OSError), os.fdopen(fd, "wb") as out:
        _write_frame(out, data)


def _read_message(fd: int) -> bytes:
    """The bytes :func:`_write_message` wrote to the other end of ``fd`` (waiting for them).

    Raises:
        EOFError: the writer closed it without writing them whole.
    """
    with os.fdopen(fd, "rb") as f:
        head = f.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            raise EOFError("nothing was sent")
        (n,) = _LENGTH.unpack(head)
        data = f.read(n)
    if len(data) < n:
        raise EOFError("a message cut short")
    return data
