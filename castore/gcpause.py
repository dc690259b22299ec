"""Pausing Python's cyclic garbage collector around a bulk read: :class:`gc_paused`.

Its own module, below every layer that reads in bulk (the object store, the history, the
search, usage), so that a search through its index pauses the collector without loading the
object store.
"""

from __future__ import annotations

import gc
import os
import threading

# The collector is one per process: pauses of several threads (an import's, the background
# repack's) are all kept, so that one ending does not switch it on under another still going.
# Each is kept by its id with the thread that began it, so that a forked child, which has
# only the thread that forked, keeps that thread's pauses alone (the others' would never end
# there), and so that beginning or ending one is a step that can be taken again: what an
# enter or exit cut short by a KeyboardInterrupt does (see gc_paused).
_lock = threading.Lock()
_pauses: dict[int, int] = {}  # id of a pause going on -> the thread that began it
_was_enabled = False  # whether the collector was on when the first pause still going began


class gc_paused:
    """Pause Python's cyclic garbage collector for a bulk read (a ``with`` block).

    Reading a long path allocates tens of thousands of objects that all stay alive (the
    cache, the path): each allocation burst makes the collector walk every live object
    again, for nothing (decoded objects hold no cycles). Pauses nest, in one thread or
    several: the collector is off from the first pause to the end of the last one, then as it
    was when the first began (a pause taken while it is off leaves it off). In a forked child
    only the forking thread's pauses go on. An instance is one pause: enter it once at a time.

    A KeyboardInterrupt may arrive anywhere CPython runs a signal handler, inside the enter or
    the exit too: an enter it cuts short ends its pause again (no ``with`` block runs, nor
    ``__exit__``), an exit it cuts short is finished, and one that arrives as ``__exit__``
    starts, before any of it ran, is finished when the pause is dropped (``__del__``), so
    the collector is never left off after the last pause, nor on under another.
    """

    __slots__ = ()

    def __enter__(self) -> None:
        global _was_enabled
        # the pause is the thread's that began it, wherever it ends (a generator holding one
        # may be finished by another thread)
        me = threading.get_ident()
        try:
            with _lock:
                if not _pauses:
                    _was_enabled = gc.isenabled()
                _pauses[id(self)] = me
                gc.disable()
        except BaseException:  # (a KeyboardInterrupt) no with block runs, nor __exit__
            _end(self)
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            _end(self)
        except BaseException:  # (a KeyboardInterrupt) the pause ends all the same
            _end(self)
            raise

    def __del__(self) -> None:
        if id(self) in _pauses:  # an interrupt came as __exit__ started: nothing of it ran
            _end(self)


def _end(pause: gc_paused) -> None:
    """End ``pause`` if it goes on, and switch the collector back on if it was the last and
    the collector was on when the first began. Taken again, it changes nothing."""
    with _lock:
        _pauses.pop(id(pause), None)
        if not _pauses and _was_enabled:
            gc.enable()


def _after_fork_in_child() -> None:
    """Keep the forking thread's pauses alone, and a lock no other thread can hold."""
    global _lock
    _lock = threading.Lock()
    me = threading.get_ident()
    had = bool(_pauses)
    for pause, thread in list(_pauses.items()):
        if thread != me:
            del _pauses[pause]
    if had and not _pauses and _was_enabled:
        gc.enable()


os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["gc_paused"]
