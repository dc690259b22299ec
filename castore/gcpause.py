"""Pausing Python's cyclic garbage collector around a bulk read: :class:`gc_paused`.

Its own module, below every layer that reads in bulk (the object store, the history, the
search, usage), so that a search through its index pauses the collector without loading the
object store.
"""

from __future__ import annotations

import gc
import threading

# The collector is one per process: pauses of several threads (an import's, the background
# repack's) are counted, so that one ending does not switch it on under another still going.
_lock = threading.Lock()
_pauses = 0
_was_enabled = False  # whether the collector was on when the first pause still going began


class gc_paused:
    """Pause Python's cyclic garbage collector for a bulk read (a ``with`` block).

    Reading a long path allocates tens of thousands of objects that all stay alive (the
    cache, the path): each allocation burst makes the collector walk every live object
    again, for nothing (decoded objects hold no cycles). Pauses nest, in one thread or
    several: the collector is off from the first pause to the end of the last one, then as it
    was when the first began (a pause taken while it is off leaves it off).
    """

    __slots__ = ()

    def __enter__(self) -> None:
        global _pauses, _was_enabled
        with _lock:
            if _pauses == 0:
                _was_enabled = gc.isenabled()
                gc.disable()
            _pauses += 1

    def __exit__(self, *exc: object) -> None:
        global _pauses
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()


__all__ = ["gc_paused"]
