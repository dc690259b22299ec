"""What holds an open store refuses to be pickled, with a clear error: :class:`Handle`.

A :class:`~castore.store.Store`, a :class:`~castore.session.Session` and the adapters' savers
and session services hold storage, locks, threads and, when encrypted, a tenant's keys.
Pickled (sent to another process: ``multiprocessing``, a task queue), one failed on whichever
part refused first ("cannot pickle '_thread.lock' object"), or would carry keys into the
pickle; each now raises :class:`~castore.errors.NotPicklable`, which says what to send
instead (the store's URL, a session's key) to open it again there. ``copy.copy`` still makes
a shallow copy (a saver's ``with_allowlist`` does). What a listing or a read returns
(messages, log entries, :class:`~castore.listing.SessionInfo`, errors) is plain data and
pickles.
"""

from __future__ import annotations

from typing import Any

from .errors import NotPicklable


class Handle:
    """A base of what holds an open store: pickling it (and ``copy.deepcopy``) raises
    :class:`~castore.errors.NotPicklable`; ``copy.copy`` copies its attributes."""

    __slots__ = ()

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Raises:
        NotPicklable: always (see the module docstring)."""
        raise NotPicklable(type(self).__name__)

    def __copy__(self) -> Any:
        """A shallow copy (its attributes shared), as ``copy.copy`` made before. Raises nothing."""
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new


__all__ = ["Handle"]
