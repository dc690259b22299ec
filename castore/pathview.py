"""A session handle's view of the path it reads: entries by depth, read from the tip down
only as far as a call needs, and kept between calls.

What an agent reads every turn (the budgeted context, the newest entries, ``log -n``)
lies at the end of a path that may hold a hundred thousand entries. A :class:`PathView`
reads a path through :class:`~castore.history.BlockPath` (the tip's block from the ref's
read hint, then whole segments, by depth), so a read costs what it touches. The view is
kept by the handle, keyed by its tip; when the ref names another tip the view is carried
over (:meth:`PathView.moved`):

- the new tip descends from the view's tip (this handle or another process appended):
  the new path's commit at the old tip's depth is read (its block: one read at most) and,
  when it is the old tip, everything read below it is kept; the path facts roll forward
  over the new entries;
- the new tip is on the view's path (a reset back): the prefix is kept;
- anything else (a checkout of another branch, a rewrite): a new view.

Every commit a view holds was checked like any path read (hashes on read, parent links
between neighbours), so keeping them costs no trust. The facts a budgeted context needs
about the whole path (:class:`~castore.context.PathFacts`) come from the ref's read hint
when the writer kept them there, or from one read of the whole path, then roll forward.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from . import objects as o
from .entries import LogEntry, entry_from
from .errors import IntegrityError, ObjectNotFound
from .gcpause import gc_paused
from .history import BlockPath, Hint, History
from .objects import Commit, ObjectId, Value
from .objectstore import ObjectStore
from .pathfacts import PathFacts, facts_of

_HANDOVER = threading.Lock()
#: a view rolls its facts forward over at most this many new entries (more: computed again)
ROLL_MAX = 4096


def log_entries(objs: ObjectStore, path: Sequence[tuple[str, Commit]]) -> list[LogEntry]:
    """The entries of ``path`` (commit pairs), their bodies read in one batch.

    Raises:
        ObjectNotFound, IntegrityError, StorageError; InvalidEntry for an unreadable message.
    """
    bodies = [o.hex_id(c.body) for _, c in path if c.body is not None]
    got = objs.get_many(bodies)
    out = []
    for cid, c in path:
        body = value_of(got[o.hex_id(c.body)]) if c.body is not None else None
        out.append(log_entry(cid, c, body))
    return out


def log_entry(cid: str, c: Commit, body: Any) -> LogEntry:
    """The :class:`LogEntry` of commit ``cid`` whose body value is ``body``."""
    return LogEntry(
        id=ObjectId(cid), kind=c.kind, entry=entry_from(c.kind, body, c.author, c.delta, c.meta),
        parents=tuple(ObjectId(o.hex_id(p)) for p in c.parents), author=c.author, time=c.time,
        meta=c.meta, delta=c.delta, unset=c.unset, depth=c.depth,
    )


def value_of(obj: object) -> Any:
    """The value a body object holds (a body is a :class:`Value`; anything else holds none)."""
    return obj.value if isinstance(obj, Value) else None


class PathView:
    """The first-parent path ending at ``tip``, read lazily by depth and kept.

    Args:
        objs: the store the path is read from.
        tip: the path's last commit.
        meta: the metadata of the ref naming ``tip`` (its read hint), if any.

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
    """

    def __init__(self, objs: ObjectStore, tip: str, meta: Mapping[str, Any] | None = None) -> None:
        self.objs = objs
        self.tip = tip
        self.meta = meta
        self.blocks = BlockPath(objs, tip, meta)
        self.depth = self.blocks.depth
        hint = Hint.from_meta(meta, objs.codec) if meta else None
        # facts only from a hint that fits this tip (the one its writer kept with it)
        self.facts: PathFacts | None = hint.facts if hint is not None and self.blocks.hinted \
            and hint.facts is not None and hint.facts.depth == self.depth else None
        self.whole = False  # every commit of the path is held
        self.handed = False  # a view of a longer path took over the commits read here

    # reading
    def pairs(self, lo: int, hi: int) -> list[tuple[str, Commit]]:
        """The commits at depths ``lo..hi`` (clipped to the path), oldest first.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        lo, hi = max(lo, 0), min(hi, self.depth)
        if lo > hi:
            return []
        with gc_paused():
            return self.blocks.range(lo, hi)

    def entries(self, lo: int, hi: int) -> list[LogEntry]:
        """The entries at depths ``lo..hi`` (clipped to the path), oldest first.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        with gc_paused():
            return log_entries(self.objs, self.pairs(lo, hi))

    def path(self) -> list[tuple[str, Commit]]:
        """The whole path, root first (read once, then kept).

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        if self.whole or len(self.blocks.at_depth) > self.depth // 2:
            out = self.pairs(0, self.depth)
        else:  # most of it unread: all segments in one bulk read (History.path), then kept
            hint = Hint.from_meta(self.meta, self.objs.codec) if self.meta else None
            out = History(self.objs).path(self.tip, hint)
            have = self.blocks.at_depth
            for pair in out:
                have.setdefault(pair[1].depth, pair)
        self.whole = True
        return out

    def adopt(self, path: Sequence[tuple[str, Commit]]) -> None:
        """Keep ``path``, the whole path of this view's tip as read elsewhere (checked there)."""
        if path and path[-1][0] == self.tip and path[0][1].depth == 0 and len(path) == self.depth + 1:
            have = self.blocks.at_depth
            for pair in path:
                have.setdefault(pair[1].depth, pair)
            self.whole = True

    def path_facts(self) -> PathFacts:
        """The :class:`PathFacts` of the path: kept, or computed from the whole path once.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        if self.facts is None:
            self.facts = facts_of(self.entries(0, self.depth))
            self.whole = True
        return self.facts

    # following the ref
    def moved(self, tip: str, meta: Mapping[str, Any] | None) -> PathView:
        """The view of the path ending at ``tip`` (the ref's new value), keeping what this
        view read when the two paths share it (see the module doc).

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        if tip == self.tip:
            return self  # the same path (a new hint for it, after a repack, changes nothing read)
        new = PathView(self.objs, tip, meta)
        try:
            if new.depth >= self.depth and new.blocks.id_at(self.depth) == self.tip:
                keep = self.depth
            elif new.depth < self.depth and self.blocks.id_at(new.depth) == tip:
                keep = new.depth
            else:
                return new
        except (ObjectNotFound, IntegrityError):
            return new  # one of the two paths is damaged here: read the new one afresh
        return new.kept_from(self, keep)

    def kept_from(self, old: PathView, keep: int) -> PathView:
        """This view, given what ``old`` read at depths up to ``keep`` (both paths hold
        ``old``'s commit at depth ``keep``, so they share everything below it)."""
        with _HANDOVER:
            handover = keep == old.depth and not old.handed
            old.handed = old.handed or handover
        if handover:
            # The old path is a prefix of this one: take its commits over whole (no copy of a
            # long path per append), with what this view read above it. Only one view takes
            # them over: two threads that saw two different new tips must not mix their paths.
            have = old.blocks.at_depth
            have.update((d, pair) for d, pair in self.blocks.at_depth.items() if d > keep)
            self.blocks.at_depth = have
        else:
            have = self.blocks.at_depth
            for d, pair in old.blocks.at_depth.items():
                if d <= keep:
                    have.setdefault(d, pair)
        self.whole = old.whole
        if self.facts is None and old.facts is not None and keep == old.depth \
                and self.depth - old.depth <= ROLL_MAX:
            facts: PathFacts | None = old.facts
            for le in self.entries(old.depth + 1, self.depth):
                facts = facts.after(le.entry, le.depth) if facts is not None else None
            self.facts = facts
        return self


__all__ = ["PathView", "log_entries", "log_entry", "value_of"]
