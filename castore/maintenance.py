"""Whole-store checks and cleanup: ``fsck`` finds damage, ``gc`` removes unreachable objects.

Reachability starts from every ref (session heads, branches, labels, remote-tracking refs,
app and user state) and follows commits (every parent), bodies, state trees and their
values, the scoped-state commits a session commit names, and the index and segments of each
commit. ``gc`` deletes only unreachable objects older than a grace period, so that a writer
that has stored its objects but not yet moved its ref never loses them.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from . import objects as o
from .errors import CastoreError, IntegrityError, ObjectNotFound
from .objects import Commit, Index, Segment, Tree
from .refs import parse
from .store import Store

DEFAULT_GRACE = 14 * 24 * 3600.0
_BATCH = 256


@dataclass
class FsckReport:
    """What ``fsck`` found. ``ok`` is False when anything is damaged.

    Unreachable objects are not damage (a crash or a deleted session leaves them); they
    are listed for ``gc``.
    """

    objects: int = 0
    refs: int = 0
    reachable: int = 0
    missing: list[tuple[str, str]] = field(default_factory=list)  # (object id, referenced from)
    corrupt: list[tuple[str, str]] = field(default_factory=list)  # (object id, reason)
    bad_refs: list[tuple[str, str]] = field(default_factory=list)  # (ref, reason)
    unreachable: list[str] = field(default_factory=list)
    stale_locks: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is missing, corrupt or broken (stale locks count as damage)."""
        return not (self.missing or self.corrupt or self.bad_refs or self.stale_locks)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {
            "ok": self.ok,
            "objects": self.objects,
            "refs": self.refs,
            "reachable": self.reachable,
            "missing": [{"id": a, "from": b} for a, b in self.missing],
            "corrupt": [{"id": a, "reason": b} for a, b in self.corrupt],
            "bad_refs": [{"ref": a, "reason": b} for a, b in self.bad_refs],
            "unreachable": list(self.unreachable),
            "stale_locks": list(self.stale_locks),
        }


@dataclass
class GcReport:
    """What ``gc`` deleted (or would delete, in a dry run)."""

    deleted: list[str] = field(default_factory=list)
    kept_young: int = 0
    bytes_freed: int = 0
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {"deleted": len(self.deleted), "kept_in_grace": self.kept_young,
                "bytes_freed": self.bytes_freed, "dry_run": self.dry_run, "ids": list(self.deleted)}


def _ref_tips(store: Store, report: FsckReport | None) -> list[tuple[str, str]]:
    """(ref name, commit id) for every direct ref; bad refs go to ``report``."""
    out = []
    for key in store.storage.list("refs"):
        name = key[len("refs/"):]
        try:
            raw = store.storage.read(key)
            value = parse(name, raw)
        except (IntegrityError, FileNotFoundError) as e:
            if report is not None:
                report.bad_refs.append((name, str(e)))
            continue
        if report is not None:
            report.refs += 1
        if value.symbolic is None:
            out.append((name, value.target))
    return out


def reachable(store: Store, report: FsckReport | None = None,
              progress: Callable[[int], None] | None = None) -> set[str]:
    """Every object id reachable from the store's refs.

    Missing or corrupt objects met on the way are recorded in ``report`` (when given)
    and otherwise raise.

    Raises:
        ObjectNotFound, IntegrityError: when ``report`` is None and damage is found.
        StorageError: the backend failed.
    """
    seen: set[str] = set()
    todo: list[tuple[str, str]] = [(cid, f"ref {name}") for name, cid in _ref_tips(store, report)]
    while todo:
        batch, todo = todo[:_BATCH], todo[_BATCH:]
        fresh = [(oid, src) for oid, src in batch if oid not in seen]
        if not fresh:
            continue
        for oid, _ in fresh:
            seen.add(oid)
        got: dict[str, Any] = {}
        for oid, src in fresh:
            try:
                got[oid] = store.objects.get(oid)
            except ObjectNotFound:
                if report is None:
                    raise
                report.missing.append((oid, src))
            except IntegrityError as e:
                if report is None:
                    raise
                report.corrupt.append((oid, e.reason))
        for oid, obj in got.items():
            todo.extend((child, oid) for child in _children(obj) if child not in seen)
        if progress is not None:
            progress(len(seen))
    return seen


def _children(obj: Any) -> Iterable[str]:
    if isinstance(obj, Commit):
        yield from (o.hex_id(p) for p in obj.parents)
        for ref in (obj.body, obj.state, obj.index):
            if ref is not None:
                yield o.hex_id(ref)
        yield from (o.hex_id(s) for s in obj.scopes.values())
    elif isinstance(obj, Tree):
        yield from (o.hex_id(r) for r in obj.refs.values())
        yield from (o.hex_id(r) for r in obj.sub.values())
    elif isinstance(obj, Index):
        yield from (o.hex_id(s) for s in obj.segments)
    elif isinstance(obj, Segment):
        # A segment holds copies; the originals are reachable from the commits themselves.
        return


def fsck(store: Store, progress: Callable[[str, int], None] | None = None) -> FsckReport:
    """Check the whole store: refs parse and point at commits, every reachable object is
    present, every stored object re-hashes to its id, no stale locks.

    Raises:
        StoreNotFound: no store at this URL.
        StorageError: the backend failed.
    """
    store.require()
    report = FsckReport()
    live = reachable(store, report, (lambda n: progress("reachable", n)) if progress else None)
    report.reachable = len(live)
    present = list(store.objects.iter_ids())
    report.objects = len(present)
    corrupt_ids = {oid for oid, _ in report.corrupt}
    for i in range(0, len(present), _BATCH):
        chunk = present[i:i + _BATCH]
        got = store.storage.read_many([_key(x) for x in chunk])
        for oid in chunk:
            stored = got.get(_key(oid))
            if stored is None:
                continue  # deleted meanwhile
            try:
                o.decode(oid, o.from_stored(oid, stored))
            except IntegrityError as e:
                if oid not in corrupt_ids:
                    report.corrupt.append((oid, e.reason))
                    corrupt_ids.add(oid)
        if progress is not None:
            progress("verified", i + len(chunk))
    report.unreachable = sorted(set(present) - live)
    list_locks = getattr(store.storage, "list_locks", None)
    if list_locks is not None:
        report.stale_locks = [lock for lock in list_locks("refs") if _lock_is_stale(store, lock)]
    return report


def _lock_is_stale(store: Store, lock: str) -> bool:
    """A lock file no live process holds (local disk only; its next writer clears it)."""
    root = getattr(store.storage, "root", None)
    if root is None:
        return False
    path = os.path.join(root, *lock.split("/"))
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # held by a live writer
        return True
    finally:
        os.close(fd)


def _key(oid: str) -> str:
    from .objectstore import object_key

    return object_key(oid)


def parse_duration(text: str) -> float:
    """Parse ``2w``, ``3d``, ``12h``, ``30m``, ``45s`` or plain seconds into seconds.

    Raises:
        CastoreError: not a duration.
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    t = text.strip().lower()
    try:
        if t and t[-1] in units:
            return float(t[:-1]) * units[t[-1]]
        return float(t)
    except ValueError:
        raise CastoreError(f"not a duration: {text!r} (use e.g. 2w, 3d, 12h, 30m, 0)") from None


def gc(store: Store, grace: float = DEFAULT_GRACE, dry_run: bool = False) -> GcReport:
    """Delete objects unreachable from every ref and older than ``grace`` seconds.

    Deleting a session and then running ``gc`` removes the content only that session held;
    content shared with other sessions stays.

    Raises:
        CastoreError: the store has damage that makes reachability unsure (missing or
            corrupt reachable objects, or unreadable refs): run fsck.
        StoreNotFound, StorageError.
    """
    store.require()
    report = FsckReport()
    live = reachable(store, report)
    if report.missing or report.corrupt or report.bad_refs:
        raise CastoreError(
            f"gc refused: the store is damaged ({len(report.missing)} missing, {len(report.corrupt)} corrupt, "
            f"{len(report.bad_refs)} bad refs); run `castore fsck`"
        )
    now = time.time()
    out = GcReport(dry_run=dry_run)
    for oid in store.objects.iter_ids():
        if oid in live:
            continue
        mtime = store.objects.mtime(oid)
        if mtime is not None and now - mtime < grace:
            out.kept_young += 1
            continue
        # Re-check just before deleting: a ref may have appeared since the walk.
        out.deleted.append(oid)
    if out.deleted and not dry_run:
        # A writer may have made some of them reachable while we walked: walk again and
        # spare anything that is now reachable.
        live2 = reachable(store)
        doomed = [x for x in out.deleted if x not in live2]
        out.deleted = doomed
        for oid in doomed:
            try:
                out.bytes_freed += len(store.storage.read(_key(oid)))
            except FileNotFoundError:
                continue
            store.objects.delete(oid)
    elif dry_run:
        for oid in out.deleted:
            try:
                out.bytes_freed += len(store.storage.read(_key(oid)))
            except FileNotFoundError:
                pass
    return out
