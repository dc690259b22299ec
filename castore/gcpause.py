"""Pausing Python's cyclic garbage collector around a bulk read: :class:`gc_paused`.

Its own module, below every layer that reads in bulk (the object store, the history, the
search, usage), so that a search through its index pauses the collector without loading the
object store.
"""

from __future__ import annotations

import gc


class gc_paused:
    """Pause Python's cyclic garbage collector for a bulk read (a ``with`` block).

    Reading a long path allocates tens of thousands of objects that all stay alive (the
    cache, the path): each allocation burst makes the collector walk every live object
    again, for nothing (decoded objects hold no cycles). A pause nested in another, or
    taken while the collector is off, leaves it as it was.
    """

    __slots__ = ("was",)

    def __enter__(self) -> None:
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.was:
            gc.enable()


__all__ = ["gc_paused"]
