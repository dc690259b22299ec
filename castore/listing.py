"""What a listing of sessions gives for each: :class:`SessionInfo` (:meth:`castore.Store.sessions`).

Its own module, loaded by the first listing: a frozen dataclass compiles its methods from
generated source when its module loads (about a millisecond), which every ``castore`` command
that opens a store would otherwise pay, a search included. ``castore.store.SessionInfo`` and
``castore.SessionInfo`` name it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SessionInfo:
    """A session as listed: its key, where its leaf is, and when it last changed; ``problem``:
    what ``castore status`` and fsck say of a session whose HEAD or its branch is damaged or
    lost (HEAD naming no branch of the session, a garbage branch ref, a branch lost though the
    session had history), None for a healthy (or never-born) session. (A garbage HEAD is left
    out of the listing, as before: fsck reports it.) ``deleting``: when a deletion of the
    session began that has not finished (its HEAD carries the deleting mark,
    :func:`castore.refnames.deleting_since`: interrupted, or under way), None otherwise; such a
    session is listed, with what is left of it, so that its deletion can be finished
    (:func:`castore.deletion.finish_line`)."""

    app: str
    user: str
    session: str
    head: str | None
    branch: str | None
    updated: float
    entries: int
    info: Mapping[str, Any]
    problem: str | None = None
    deleting: float | None = None


__all__ = ["SessionInfo"]
