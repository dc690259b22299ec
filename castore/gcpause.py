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
# repack's) are counted, so that one ending does not switch it on under another still going.
# They are counted by thread, so that a forked child, which has only the thread that forked,
# keeps that thread's pauses alone (the others' would never end there).
_lock = threading.Lock()
_pauses: dict[int, int] = {}  # thread id -> the pauses it has going
_was_enabled = False  # whether the collector was on when the first pause still going began


class gc_paused:
    """Pause Python's cyclic garbage collector for a bulk read (a ``with`` block).

    Reading a long path allocates tens of thousands of objects that all stay alive (the
    cache, the path): each allocation burst makes the collector walk every live object
    again, for nothing (decoded objects hold no cycles). Pauses nest, in one thread or
    several: the collector is off from the first pause to the end of the last one, then as it
    was when the first began (a pause taken while it is off leaves it off). In a forked child
    only the forking thread's pauses go on.
    """

    __slots__ = ("_owner",)

    def __enter__(self) -> None:
        global _was_enabled
        # the pause is the thread's that began it, wherever it ends (a generator holding one
        # may be finished by another thread)
        me = self._owner = threading.get_ident()
        with _lock:
            if not _pauses:
                _was_enabled = gc.isenabled()
                gc.disable()
            _pauses[me] = _pauses.get(me, 0) + 1

    def __exit__(self, *exc: object) -> None:
        owner = self._owner
        with _lock:
            left = _pauses.pop(owner, 0) - 1  # (none: its thread was not the one that forked)
            if left > 0:
                _pauses[owner] = left
            elif not _pauses and _was_enabled:
                gc.enable()


def _after_fork_in_child() -> None:
    """Keep the forking thread's pauses alone, and a lock no other thread can hold."""
    global _lock
    _lock = threading.Lock()
    mine = _pauses.get(threading.get_ident())
    had = bool(_pauses)
    _pauses.clear()
    if mine:
        _pauses[threading.get_ident()] = mine
    elif had and _was_enabled:
        gc.enable()


os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["gc_paused"]
