"""Whole-store checks and cleanup: ``fsck`` finds damage, ``gc`` removes unreachable objects.

Reachability starts from every ref (session heads, branches, labels, remote-tracking refs,
app and user state) and from the read hint each ref carries (an index written when a
commit closes a segment block is named only by the ref's hint until the next commit names
it). It follows commits (every parent), bodies, state trees and their values, the
scoped-state commits a session commit names, and the index and segments of each commit.

``fsck`` reads every object once, without any cache: reachable objects while walking
(checking that each link names an object of the right kind), the others afterwards, and
re-hashes each. ``gc`` deletes only unreachable objects older than a grace period, so that
a writer that has stored its objects but not yet moved its ref never loses them, and walks
the refs a second time just before deleting, to spare anything a writer made reachable
meanwhile.

In the tenant layout (docs/FORMAT.md 2.1) every function here works on each tenant's store
in turn, the users' before the apps' own: a user's commits name app-state commits of their
app's store, which fsck and gc there count as roots (so a pack never mixes two tenants, and
an app-state commit a user's session names is never collected).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import names
from . import objects as o
from .deletion import cancel, delete_session_refs, finish_hint, written_since
from .entries import stored_problem
from .errors import CastoreError, CorruptRef, IntegrityError, SealedFrameError
from .history import Hint, depth_problem
from .objects import Blob, Commit, Index, Segment, Tree, Value
from .objectstore.packs import Slot
from .objectstore.repack import RepackReport
from .refnames import (
    HEADS,
    META_TIME,
    SessionRefs,
    branches_made_since,
    deleting_since,
    head_segment,
    lost_branch_problem,
    meta_number,
    parse_ref_name,
    session_prefix,
)
from .refs import PREFIX as REFS_PREFIX
from .refs import RefValue, parse
from .store import Store

#: two weeks, as git's default prune age
DEFAULT_GRACE = 14 * 24 * 3600.0
#: a temporary file this old belongs to no running write (a write takes milliseconds)
TEMP_MIN_AGE = 3600.0
#: objects read per batch (one concurrent read on S3)
_BATCH = 256

_KIND_NAMES: dict[type, str] = {
    Commit: "commit", Tree: "tree", Value: "value", Blob: "blob", Index: "index", Segment: "segment",
}
_ANY: tuple[type, ...] = (Commit, Tree, Value, Blob, Index, Segment)


@dataclass
class FsckReport:
    """What ``fsck`` found. ``ok`` is False when anything is damaged.

    Unreachable objects are not damage (a crash or a deleted session leaves them); they
    are listed for ``gc``. ``dangling`` are the unreachable objects no other stored object
    names (the tips of unreachable histories, as git calls them).
    """

    objects: int = 0
    refs: int = 0
    reachable: int = 0
    missing: list[tuple[str, str]] = field(default_factory=list)  # (object id, referenced from)
    corrupt: list[tuple[str, str]] = field(default_factory=list)  # (object id, reason)
    bad_refs: list[tuple[str, str]] = field(default_factory=list)  # (ref, reason)
    unreachable: list[str] = field(default_factory=list)
    dangling: list[str] = field(default_factory=list)
    stale_locks: list[str] = field(default_factory=list)
    stale_temps: list[str] = field(default_factory=list)  # harmless leftovers of cut-short writes
    #: (pack, offset, bytes) of damaged pack records: their objects cannot be read (ObjectStore.damaged_records)
    damaged_records: list[tuple[str, int, int]] = field(default_factory=list)
    #: the folders of erased tenants (an encrypted store's): unreadable by design, deleted by gc
    erased: list[str] = field(default_factory=list)
    #: sessions (``sessions/<app>/<user>/<session>``) whose HEAD names a branch not made yet
    #: and that hold no other ref: never born, as far as anything stored tells (not damage)
    unborn: list[str] = field(default_factory=list)
    #: (session folder, fsck's line) of the sessions whose deletion was interrupted (HEAD
    #: marked deleting, :mod:`castore.deletion`): not damage; ``delete-session`` finishes it
    deleting: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is missing, corrupt or broken (stale locks count as damage)."""
        return not (self.missing or self.corrupt or self.bad_refs or self.stale_locks or self.damaged_records)

    @property
    def damaged(self) -> bool:
        """True when data is missing or corrupt, a pack record is damaged, or a ref is
        broken (stale locks aside)."""
        return bool(self.missing or self.corrupt or self.bad_refs or self.damaged_records)

    def add(self, other: FsckReport, where: str) -> None:
        """Count ``other``, the report of the tenant store at ``where``, into this one (its
        refs, locks and temporary files named with ``where/`` in front)."""
        for f in ("objects", "refs", "reachable"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        for f in ("missing", "corrupt", "unreachable", "dangling"):
            getattr(self, f).extend(getattr(other, f))
        self.bad_refs.extend((f"{where}/{r}", why) for r, why in other.bad_refs)
        self.stale_locks.extend(f"{where}/{k}" for k in other.stale_locks)
        self.unborn.extend(f"{where}/{k}" for k in other.unborn)
        self.deleting.extend((f"{where}/{k}", why) for k, why in other.deleting)
        self.stale_temps.extend(f"{where}/{k}" for k in other.stale_temps)
        self.damaged_records.extend((f"{where}/{p}", off, n) for p, off, n in other.damaged_records)

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
            "dangling": list(self.dangling),
            "stale_locks": list(self.stale_locks),
            "stale_temps": list(self.stale_temps),
            "damaged_records": [{"pack": p, "offset": off, "bytes": n} for p, off, n in self.damaged_records],
            "erased": list(self.erased),
            "unborn": list(self.unborn),
            "deleting": [{"session": k, "reason": why} for k, why in self.deleting],
        }


@dataclass
class GcReport:
    """What ``gc`` deleted (or would delete, in a dry run)."""

    deleted: list[str] = field(default_factory=list)
    kept_young: int = 0
    bytes_freed: int = 0
    dry_run: bool = False
    locks_cleared: list[str] = field(default_factory=list)
    temps_cleared: list[str] = field(default_factory=list)
    #: reflog entries dropped by the store's "reflog_expire" setting (per session)
    reflog_expired: int = 0
    #: sessions deleted by the store's "retention" setting
    expired: ExpireReport | None = None
    #: the folders of erased tenants whose every byte was deleted (would be, in a dry run)
    erased: list[str] = field(default_factory=list)

    def add(self, other: GcReport, where: str) -> None:
        """Count ``other``, the report of the tenant store at ``where``, into this one."""
        self.deleted.extend(other.deleted)
        self.kept_young += other.kept_young
        self.bytes_freed += other.bytes_freed
        self.locks_cleared.extend(f"{where}/{k}" for k in other.locks_cleared)
        self.temps_cleared.extend(f"{where}/{k}" for k in other.temps_cleared)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {"deleted": len(self.deleted), "kept_in_grace": self.kept_young,
                "bytes_freed": self.bytes_freed, "dry_run": self.dry_run, "ids": list(self.deleted),
                "locks_cleared": list(self.locks_cleared), "temps_cleared": list(self.temps_cleared),
                "reflog_expired": self.reflog_expired,
                "sessions_expired": self.expired.to_dict()["expired"] if self.expired else [],
                "erased_tenants": list(self.erased)}


# -- walking -------------------------------------------------------------------------------
_Todo = tuple[str, str, tuple[type, ...]]  # (object id, referenced from, kinds allowed there)


def _tenants(store: Store) -> list[Store] | None:
    """The tenants' stores of a tenant-layout root, the users' before the apps' own; None
    for a flat store (or one tenant's)."""
    if store.root is not store or store.layout != "tenants":
        return None
    return sorted(store.stores(), key=lambda t: (t.tenant_segments or ("", ""))[1] == names.APP_SCOPE)


def _where(store: Store) -> str:
    """A tenant store's folder (``tenants/<app>/<user>``), for reports."""
    return names.tenant_prefix(*(store.tenant_segments or ("", "")))


class _AppScopes:
    """The app-state commits that users' commits name, per app segment: fsck and gc of the
    app's own store count them as roots (they live there, not in the users' stores)."""

    def __init__(self) -> None:
        self.named: dict[str, set[str]] = {}

    def foreign(self, store: Store) -> set[str] | None:
        """Where a user's store records the app-state ids it names (None: follow them)."""
        seg = store.tenant_segments
        if seg is None or seg[1] == names.APP_SCOPE:
            return None
        return self.named.setdefault(seg[0], set())

    def roots(self, store: Store) -> list[_Todo]:
        """The ids named into an app's own store by its users' commits."""
        seg = store.tenant_segments
        if seg is None or seg[1] != names.APP_SCOPE:
            return []
        return [(x, "a user's commit (app state)", (Commit,)) for x in sorted(self.named.get(seg[0], ()))]


def _roots(store: Store, report: FsckReport | None) -> list[_Todo]:
    """The ids every ref names (its commit and its read hint); bad refs go to ``report``."""
    out: list[_Todo] = []
    keys = store.storage.list(REFS_PREFIX)
    got = store.storage.read_many(keys)
    keyset = set(keys)
    _read_branches_made_since(keys, got, keyset, store)
    for key in keys:
        name = key[len(REFS_PREFIX) + 1:]
        raw = got.get(key)
        if raw is None:
            continue  # deleted since the listing
        try:
            value = parse(name, raw)
        except IntegrityError as e:
            if report is None:
                raise
            report.bad_refs.append((name, e.reason))
            continue
        if report is not None:
            report.refs += 1
            problem = _ref_problem(name, value, keyset)
            if problem is not None:
                report.bad_refs.append((name, problem))
            elif name.endswith("/HEAD") and deleting_since(value) is not None:
                report.deleting.append((name[:-5], finish_hint(name, value)))
            elif value.symbolic is not None and name.endswith("/HEAD") \
                    and f"{REFS_PREFIX}/{name[:-4]}{HEADS}/{head_segment(value)}" not in keyset:
                report.unborn.append(name[:-5])  # never born, as far as the refs tell
        # lines an import keeps, its side files (in the info: sealed in an encrypted store)
        out.extend((b, f"ref {name} (meta)", _ANY) for b in store.objects.codec.meta_links(value.meta))
        if value.symbolic is not None:
            continue
        out.append((value.target, f"ref {name}", (Commit,)))
        hint = Hint.from_meta(value.meta)
        if hint is not None:
            # The next append extends these without checking: they must stay.
            if hint.index:
                out.append((hint.index, f"ref {name} (read hint)", (Index,)))
            out.extend((t, f"ref {name} (read hint)", (Commit,)) for t in hint.tail)
    return out


def _read_branches_made_since(keys: list[str], got: dict[str, bytes | None], keyset: set[str], store: Store) -> None:
    """Add to the refs listed (``keys``, ``keyset``) and read (``got``) the branches the HEADs
    read name that the listing lacked and that a read now finds (:func:`branches_made_since`)."""
    heads: dict[str, RefValue | None] = {}
    for key in keys:
        if key.endswith("/HEAD") and (raw := got.get(key)) is not None:
            try:
                heads[key] = parse(key[len(REFS_PREFIX) + 1:], raw)
            except IntegrityError:
                continue  # reported by the caller
    late = branches_made_since(heads, keyset)
    for key, raw in store.storage.read_many(late).items() if late else ():
        if raw is not None:
            keys.append(key)
            keyset.add(key)
            got[key] = raw


def _ref_problem(name: str, value: RefValue, keys: set[str]) -> str | None:
    """What is wrong with a ref that parses: a name castore never writes, a HEAD that names
    no branch, or a HEAD whose branch is lost (:func:`castore.refnames.lost_branch_problem`)."""
    if parse_ref_name(name) is None:
        return "not a ref name castore writes (a foreign or hostile key)"
    if value.symbolic is None:
        return None
    try:
        seg = head_segment(value)
    except CorruptRef as e:
        return e.reason
    return lost_branch_problem(name.rsplit("/", 1)[0], seg, value, keys)


def _links(obj: Any, foreign: set[str] | None = None) -> Iterator[tuple[str, tuple[type, ...]]]:
    """The ids an object names, each with the kinds of object allowed there; with
    ``foreign`` (a user's tenant store), app-state ids go there instead (another store's)."""
    if isinstance(obj, Commit):
        yield from ((o.hex_id(p), (Commit,)) for p in obj.parents)
        if obj.body is not None:
            yield o.hex_id(obj.body), (Value, Blob)
        if obj.state is not None:
            yield o.hex_id(obj.state), (Tree,)
        if obj.index is not None:
            yield o.hex_id(obj.index), (Index,)
        for scope, s in obj.scopes.items():
            if foreign is not None and scope == "app":
                foreign.add(o.hex_id(s))
            else:
                yield o.hex_id(s), (Commit,)
        yield from ((b, _ANY) for b in o.meta_links(obj.meta))  # an archived line's bytes
    elif isinstance(obj, Tree):
        yield from ((o.hex_id(r), (Value, Blob)) for r in obj.refs.values())
        yield from ((o.hex_id(r), (Tree,)) for r in obj.sub.values())
    elif isinstance(obj, Index):
        yield from ((o.hex_id(s), (Segment,)) for s in obj.segments)
    # A segment holds copies of commits and bodies that are reachable on their own.


def _load(store: Store, oids: list[str]) -> dict[str, Any]:
    """Read, verify and decode objects (loose or packed), bypassing every cache.

    Returns a dict from id to the decoded object, to None (missing), or to the
    IntegrityError met (a :class:`~castore.errors.DamagedPack` naming the pack record of a
    packed one).
    """
    got = store.objects.read_stored_many(oids)
    out: dict[str, Any] = {}
    for oid in oids:
        stored = got.get(oid)
        if stored is None:
            out[oid] = store.objects.damage(oid)  # stored, in a record that does not open: corrupt
            continue
        try:
            canonical = store.objects.codec.from_stored(oid, stored)
        except IntegrityError as e:
            # a packed one: its record named (a sealed frame that does not open says why itself)
            out[oid] = e if isinstance(e, SealedFrameError) else store.objects.damage(oid, e.reason) or e
            continue
        try:
            out[oid] = o.decode(oid, canonical)
        except IntegrityError as e:
            out[oid] = e  # whole bytes that are not an object: the object, not its record
    return out


def _walk(store: Store, report: FsckReport | None,
          progress: Callable[[int], None] | None = None, scopes: _AppScopes | None = None) -> set[str]:
    """Every reachable id; with ``report``, damage is recorded there instead of raised."""
    seen: set[str] = set()
    bodies: dict[str, Commit] = {}  # body id -> a commit naming it (fsck checks the pair)
    depths: dict[str, tuple[int, str | None]] = {}  # commit -> its depth, its first parent
    scopes = scopes or _AppScopes()
    foreign = scopes.foreign(store)
    todo: deque[_Todo] = deque(_roots(store, report) + scopes.roots(store))
    while todo:
        batch: dict[str, _Todo] = {}
        while todo and len(batch) < _BATCH:
            item = todo.popleft()
            if item[0] not in seen and item[0] not in batch:
                batch[item[0]] = item
        if not batch:
            break
        seen.update(batch)
        for oid, obj in _load(store, list(batch)).items():
            _, src, kinds = batch[oid]
            if obj is None:
                obj = _load(store, [oid])[oid]  # look again: it may have landed since
            if obj is None:
                if report is None:
                    raise store.objects.missing_error(oid)  # naming a damaged record when there is one
                report.missing.append((oid, src))
                continue
            if isinstance(obj, IntegrityError):
                if report is None:
                    raise obj
                report.corrupt.append((oid, obj.reason))
                continue
            if not isinstance(obj, kinds):
                found, wanted = _KIND_NAMES[type(obj)], " or ".join(_KIND_NAMES[k] for k in kinds)
                if report is None:
                    raise IntegrityError(oid, f"is a {found} where {src} needs a {wanted}")
                if src.startswith("ref ") and not src.endswith("(read hint)"):
                    report.bad_refs.append((src[4:], f"names {oid}, a {found}, not a {wanted}"))
                else:
                    report.corrupt.append((oid, f"is a {found} where {src} needs a {wanted}"))
            if report is not None:
                _check_stored(oid, obj, bodies, report)
                if isinstance(obj, Commit):
                    depths[oid] = (obj.depth, o.hex_id(obj.parents[0]) if obj.parents else None)
            todo.extend((child, oid, k) for child, k in _links(obj, foreign) if child not in seen)
        if progress is not None:
            progress(len(seen))
    if report is not None:
        _check_depths(depths, report)
    return seen


def _check_depths(depths: dict[str, tuple[int, str | None]], report: FsckReport) -> None:
    """Report each commit whose depth is not its first parent's + 1 (a root's: 0): sync and
    every reader of a path go by depth."""
    for oid, (depth, parent) in depths.items():
        up = depths.get(parent) if parent is not None else None
        if parent is not None and up is None:
            continue  # the parent is missing or not a commit: reported as such
        problem = depth_problem(depth, parent is not None, up[0] if up is not None else None)
        if problem is not None:
            report.corrupt.append((oid, problem))


def _check_stored(oid: str, obj: Any, bodies: dict[str, Commit], report: FsckReport) -> None:
    """Report a commit, or a body with its commit, that holds what an append refuses
    (wrong field types, non-finite numbers, nesting too deep): readers tolerate them."""
    problem = None
    if isinstance(obj, Commit):
        if obj.body is not None:
            bodies[o.hex_id(obj.body)] = obj
        problem = stored_problem(obj)
    elif isinstance(obj, Value) and oid in bodies:
        problem = stored_problem(bodies.pop(oid), obj.value, has_body=True)
    if problem is not None:
        report.corrupt.append((oid, problem))


def reachable(store: Store, report: FsckReport | None = None,
              progress: Callable[[int], None] | None = None) -> set[str]:
    """Every object id reachable from the store's refs and their read hints.

    Missing or corrupt objects met on the way are recorded in ``report`` (when given)
    and otherwise raise.

    Raises:
        ObjectNotFound: a reachable object is missing (when ``report`` is None).
        IntegrityError: a reachable object or ref is corrupt (when ``report`` is None).
        StorageError: the backend failed.
    """
    tenants = _tenants(store)
    if tenants is None:
        return _walk(store, report, progress)
    scopes, out = _AppScopes(), set()
    for t in tenants:
        out |= _walk(t, report, progress, scopes)
    return out


# -- fsck ----------------------------------------------------------------------------------
def fsck(store: Store, progress: Callable[[str, int], None] | None = None) -> FsckReport:
    """Check the whole store: refs parse and name commits, every reachable object is present
    and of the kind its link needs, every stored object re-hashes to its id, no stale locks.

    A session's HEAD that names a branch that does not exist is a bad ref when the session
    shows it had history (another branch, a label, a remote-tracking branch, a reflog): its
    branch was deleted or lost, and its commits would otherwise count as unreachable. A session holding nothing but its
    HEAD is never born as far as the store tells (``unborn``, not damage): ``set_info``
    before the first append leaves exactly that. An object in a damaged pack record is
    ``corrupt`` (the reason names the pack and the record), not missing, and the record is
    in ``damaged_records``.

    Args:
        store: the store to check (only read, never changed).
        progress: called with (phase, count) as the check goes: "reachable", "verified".

    Raises:
        StoreNotFound: no store at this URL.
        StorageError: the backend failed.
    """
    store.require()
    tenants = _tenants(store)
    if tenants is None:
        return _fsck(store, progress, _AppScopes())
    report, scopes = FsckReport(), _AppScopes()
    for t in tenants:
        report.add(_fsck(t, progress, scopes), _where(t))
    report.erased = [_where(t) for t in store.erased_stores()]
    return report


def _fsck(store: Store, progress: Callable[[str, int], None] | None, scopes: _AppScopes) -> FsckReport:
    report = FsckReport()
    live = _walk(store, report, (lambda n: progress("reachable", n)) if progress else None, scopes)
    report.reachable = len(live)
    present = list(store.objects.iter_ids())
    report.objects = len(present)
    unreachable: list[str] = sorted(set(present) - live)
    named: set[str] = set()
    for i in range(0, len(unreachable), _BATCH):
        chunk = unreachable[i:i + _BATCH]
        for oid, obj in _load(store, chunk).items():
            if isinstance(obj, IntegrityError):
                report.corrupt.append((oid, obj.reason))
            elif obj is not None:
                named.update(child for child, _ in _links(obj, set()))
        if progress is not None:
            progress("verified", i + len(chunk))
    report.unreachable = unreachable
    report.dangling = [x for x in unreachable if x not in named]
    report.damaged_records = store.objects.damaged_records()
    report.stale_locks = stale_locks(store)
    report.stale_temps = stale_temps(store)
    return report


# -- locks ---------------------------------------------------------------------------------
def stale_locks(store: Store) -> list[str]:
    """Lock files that no live process holds (local disk only; empty elsewhere).

    A writer killed while it held a ref's lock leaves the file behind; the next writer of
    that ref clears it, and so does :func:`gc`.

    Raises:
        StorageError: the backend failed.
    """
    find = getattr(store.storage, "stale_locks", None)
    return sorted(find("")) if find is not None else []


def clear_stale_locks(store: Store) -> list[str]:
    """Remove the stale locks :func:`stale_locks` finds; return what was removed.

    Raises:
        StorageError: the backend failed.
    """
    clear = getattr(store.storage, "clear_stale_locks", None)
    return sorted(clear("")) if clear is not None else []


def stale_temps(store: Store) -> list[str]:
    """Temporary files older than :data:`TEMP_MIN_AGE` (local disk only; empty elsewhere).

    A writer killed between writing an object's temporary file and renaming it leaves the
    file behind. Nothing reads it; :func:`gc` removes it.

    Raises:
        StorageError: the backend failed.
    """
    find = getattr(store.storage, "stale_temps", None)
    return sorted(find(TEMP_MIN_AGE)) if find is not None else []


def clear_stale_temps(store: Store) -> list[str]:
    """Remove the temporary files :func:`stale_temps` finds; return what was removed.

    Raises:
        StorageError: the backend failed.
    """
    clear = getattr(store.storage, "clear_stale_temps", None)
    return sorted(clear(TEMP_MIN_AGE)) if clear is not None else []


# -- gc ------------------------------------------------------------------------------------
def parse_duration(text: str) -> float:
    """Parse ``2w``, ``3d``, ``12h``, ``30m``, ``45s`` or plain seconds into seconds.

    Raises:
        CastoreError: not a duration (or negative).
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise CastoreError(f"not a duration: {text!r} (use e.g. 2w, 3d, 12h, 30m, 0)")
    return value


def gc(store: Store, grace: float = DEFAULT_GRACE, dry_run: bool = False,
       progress: Callable[[str, int], None] | None = None) -> GcReport:
    """Delete objects unreachable from every ref and older than ``grace`` seconds.

    Deleting a session and then running ``gc`` removes the content only that session held;
    content shared with other sessions stays. Objects whose age the backend cannot tell
    are kept unless ``grace`` is 0. Loose objects are deleted one by one, each age checked
    again right before its deletion (atomically on local disk); a pack older than the grace
    period that holds unreachable objects is rewritten with only its reachable ones (a pack
    a live writer still appends to is never touched). Stale ref locks and temporary files
    over an hour old are cleared too (not in a dry run), and so are the names of deleted
    sessions in the logs of ref changes and in the search index (:func:`forget_deleted`).
    In an encrypted store, every byte of an erased tenant (whose keys ``castore erase``
    destroyed) is deleted, whatever its age: nobody can read or write it any more.
    First, the store's settings in ``castore.json`` are applied: ``"retention"`` deletes the
    sessions not updated for that long (:func:`expire_sessions`), ``"reflog_expire"`` drops
    older reflog entries (:func:`expire_reflogs`); a dry run only reports them.

    The grace period is a guarantee for writers (docs/FORMAT.md, 9.1) as long as it is
    longer than a writer takes between storing its objects and moving its ref; ``grace=0``
    means no writer is running.

    Args:
        store: the store to clean.
        grace: spare unreachable objects written less than this many seconds ago (a
            writer may be about to make them reachable).
        dry_run: only report what would be deleted.
        progress: called with (phase, count): "reachable", "deleted".

    gc refuses to run while the store has damage that makes reachability unsure, as git's
    gc stops at a broken ref: a reachable object missing or corrupt, a damaged pack
    record (whatever it held; its pack stays whole), a ref that does not parse, or a
    session's HEAD naming a branch that was deleted or lost (:func:`fsck` says which): the
    commits that branch held would look unreachable. Recreate the branch or check out another one, then run gc again.

    Raises:
        CastoreError: the store has damage that makes reachability unsure (missing or
            corrupt reachable objects, unreadable refs, a HEAD whose branch is lost, a damaged
            pack record): the message names the first bad ref and the first damaged record
            (what it held, and to restore its file), and fsck, which lists all of it.
        StoreNotFound, StorageError.
    """
    if not grace >= 0:
        raise CastoreError(f"the grace period must not be negative ({grace})")
    store.require()
    out = GcReport(dry_run=dry_run)
    reflog_age, retention = expiry_settings(store)
    if retention is not None:
        out.expired = expire_sessions(store, retention, dry_run=dry_run)
    if reflog_age is not None:
        out.reflog_expired = sum(expire_reflogs(store, reflog_age, dry_run=dry_run).values())
    tenants = _tenants(store)
    if tenants is None:
        _collect(store, grace, dry_run, progress, out, _AppScopes())
    else:
        scopes = _AppScopes()
        for t in tenants:
            one = GcReport(dry_run=dry_run)
            _collect(t, grace, dry_run, progress, one, scopes)
            out.add(one, _where(t))
        _drop_erased(store, dry_run, out)
        if not dry_run:
            forget_deleted(store)  # the search index of the whole store
    return out


def _drop_erased(store: Store, dry_run: bool, out: GcReport) -> None:
    """Delete every byte of the erased tenants of an encrypted store: refs first (so that no
    listing names a session whose objects are going), then packs and loose objects. Nobody
    can read or write them any more (their keys are destroyed), so no grace period applies."""
    for t in store.erased_stores():
        out.erased.append(_where(t))
        if dry_run:
            continue
        keys = t.storage.list("")
        t.storage.delete_many([k for k in keys if k.startswith("refs/")])
        t.storage.delete_many([k for k in keys if not k.startswith("refs/")])


def _collect(store: Store, grace: float, dry_run: bool, progress: Callable[[str, int], None] | None,
             out: GcReport, scopes: _AppScopes) -> None:
    """gc's deletion of the unreachable objects of one (flat or tenant) store into ``out``."""
    restore = getattr(store.storage, "restore_aside", None)
    if restore is not None and not dry_run:
        restore()  # a gc killed mid-delete left an object renamed aside: put it back first
    if not dry_run:
        # this handle's own log is held like any live writer's and would be spared: seal it
        # (the next append opens a new log), so what a delete_session on this handle left
        # unreachable is collected as format 1 collected it
        store.objects.close()
    report = FsckReport()
    live = _walk(store, report, (lambda n: progress("reachable", n)) if progress else None, scopes)
    report.damaged_records = store.objects.damaged_records()  # a pack holding one stays whole
    if report.damaged:
        first = (f"{report.bad_refs[0][0]}: {report.bad_refs[0][1]}; " if report.bad_refs else "")
        if report.damaged_records:
            first += (f"{store.objects.damage_text(*report.damaged_records[0])}: gc rewrites and deletes nothing "
                      "while a pack holds damage; restore that file from a backup or another copy of the store "
                      "(nothing else in it is affected), then ")
        raise CastoreError(
            f"gc refused: the store is damaged ({len(report.missing)} missing, {len(report.corrupt)} corrupt, "
            f"{len(report.bad_refs)} bad refs, {len(report.damaged_records)} damaged pack records); "
            f"{first}run `castore fsck`, which lists all of it"
        )
    now = time.time()
    # grace 0: everything unreachable goes, whatever its age (no writer is running)
    cutoff = now - grace if grace > 0 else float("inf")
    objs = store.objects
    candidates = []
    for oid in list(objs.iter_loose_ids()):
        if oid in live:
            continue
        mtime = objs.mtime(oid)
        if grace > 0 and (mtime is None or mtime >= cutoff):
            out.kept_young += 1
            continue
        candidates.append(oid)
    doomed_packs: list[str] = []
    born: dict[str, float] = {}  # unreachable objects of doomed packs -> when first written
    for name in objs.pack_names():
        contents = objs.pack_contents(name)
        dead = [x for x in contents if x not in live]
        if not dead:
            continue
        mtime, _sealed, held = objs.pack_info(name)
        # a repacked pack's ages say when its objects were first written (docs/FORMAT.md, 8)
        ages = objs.pack_ages(name)
        when = {x: ages.of(x, contents[x].offset) if ages is not None else mtime for x in dead}
        when = {x: mtime if t is None else t for x, t in when.items()}
        if held or (grace > 0 and all(t is None or t >= cutoff for t in when.values())):
            out.kept_young += len(dead)
            continue
        doomed_packs.append(name)
        # an age unknown: kept unless grace is 0
        born.update((x, t if t is not None else (-float("inf") if grace == 0 else now)) for x, t in when.items())
    if (candidates or doomed_packs) and not dry_run:
        # A writer may have made some of them reachable while we walked: walk again and
        # spare anything that is reachable now.
        live = live | _walk(store, None, None, scopes)
        candidates = [x for x in candidates if x not in live]
    for oid in candidates:
        stored = objs.read_stored_many([oid]).get(oid)
        if stored is None:
            continue  # deleted meanwhile (another gc)
        if not dry_run and not objs.delete_if_older(oid, cutoff):
            out.kept_young += 1  # freshened by a writer since we looked
            continue
        out.deleted.append(oid)
        out.bytes_freed += len(stored)
        if progress is not None:
            progress("deleted", len(out.deleted))
    if doomed_packs:
        _gc_packs(store, doomed_packs, live, out, cutoff, born)
    if not dry_run:
        out.locks_cleared = clear_stale_locks(store)
        out.temps_cleared = clear_stale_temps(store)
        forget_deleted(store)


def forget_deleted(store: Store) -> None:
    """Make sure no file castore keeps beside the objects names what was deleted: the
    storage's logs of ref changes are compacted (local disk: ``swaps.log`` rotated, the boot
    marker's needless records dropped) and the search index, where there is one, is brought
    up to date (a deleted session's text and names leave it). ``gc`` calls it.

    Raises:
        StorageError: the backend failed.
        IndexError_: the search index cannot be written.
    """
    from .grep.index import update_if_present  # the index is only needed where there is one

    for t in _tenants(store) or [store]:
        t.objects.compact_ref_logs()
    update_if_present(store)


def _gc_packs(store: Store, names: list[str], live: set[str], out: GcReport, cutoff: float,
              born: dict[str, float]) -> None:
    """Rewrite the packs ``names`` with only their reachable objects and the unreachable
    ones ``born`` (when first written) after ``cutoff`` (one new pack, whose ages keep those
    times), then delete them, the age of a pack without ages re-checked against ``cutoff``
    right before. The new pack is complete and durable before anything is deleted."""
    objs = store.objects
    keep: dict[str, bytes] = {}
    dead: dict[str, int] = {}
    aged = {name for name in names if objs.pack_ages(name) is not None}
    for name in names:
        for oid, loc in objs.pack_contents(name).items():
            if oid in live or born.get(oid, cutoff) >= cutoff:
                if oid not in keep:
                    frame = objs.read_frame(name, loc)
                    objs.codec.from_stored(oid, frame)  # never carry damage into a new pack
                    keep[oid] = frame
            else:
                dead[oid] = loc.length if isinstance(loc, Slot) else loc.size
    if out.dry_run:
        out.deleted.extend(sorted(dead))
        out.bytes_freed += sum(dead.values())
        return
    if keep:
        # write order: neighbours compress together; the unreachable kept keep their age
        objs.write_pack(list(keep.items()), {x: born[x] for x in keep if x in born})
    for name in names:
        # a pack with ages is a repack's (no writer writes it again): its own time says nothing
        if not objs.delete_pack(name, None if name in aged else cutoff):
            # written again since we looked: it stays, and so do its objects
            for oid in objs.pack_contents(name):
                dead.pop(oid, None)
    out.deleted.extend(sorted(dead))
    out.bytes_freed += sum(dead.values())


# -- expiry: reflog entries and whole sessions ----------------------------------------------
#: ``castore.json`` keys gc applies: drop reflog entries, and delete sessions, older than this
REFLOG_EXPIRE_KEY = "reflog_expire"
RETENTION_KEY = "retention"


@dataclass
class ExpireReport:
    """What :func:`expire_sessions` deleted (or would delete, in a dry run)."""

    sessions: list[tuple[str, str, str, float]] = field(default_factory=list)  # app, user, session, updated
    dry_run: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {"expired": [{"app": a, "user": u, "session": s, "updated": t} for a, u, s, t in self.sessions],
                "dry_run": self.dry_run}


def expire_reflogs(store: Store, older_than: float, dry_run: bool = False,
                   now: float | None = None) -> dict[tuple[str, str, str], int]:
    """Drop every session's reflog entries recorded over ``older_than`` seconds ago (git's
    ``reflog expire --all``; :meth:`~castore.plumbing.Plumbing.expire_reflog`); what only
    they kept goes at the next ``gc``. Returns the entries dropped per session (``dry_run``:
    that would be), sessions with none left out.

    Raises:
        CastoreError: ``older_than`` is negative.
        StoreNotFound, StorageError, IntegrityError.
    """
    if not older_than >= 0:
        raise CastoreError(f"the age must not be negative ({older_than})")
    store.require()
    cutoff = (time.time() if now is None else now) - older_than
    out: dict[tuple[str, str, str], int] = {}
    for t in _tenants(store) or [store]:
        for name in t.refs.list("sessions"):
            p = parse_ref_name(name)
            if p is None or p.kind != "reflog" or p.session_prefix is None:
                continue
            n = t.plumbing.expire_reflog(SessionRefs(p.session_prefix), cutoff, dry_run)
            if n:
                out[(p.app, p.user or "", p.session or "")] = n
    return out


def _last_change(store: Store, prefix: str) -> tuple[float | None, dict[str, RefValue]]:
    """When the session whose ref folder is ``prefix`` last changed (the newest time its
    refs record, a commit's own time where a ref records none), and its refs as read; None
    when no time can be told (the session is then never expired)."""
    names_ = [n for n in store.refs.list(prefix) if parse_ref_name(n) is not None]
    refs = {n: v for n, v in store.refs.read_many(names_).items() if v is not None}
    times: list[float] = []
    for n, v in refs.items():
        if v.symbolic is not None or n.endswith("/reflog"):
            continue
        t = meta_number(v.meta.get(META_TIME))
        if t is None:
            t = meta_number(store.history.commit(v.target).time)
        if t is not None:
            times.append(t)
    return (max(times) if times else None), refs


def expire_sessions(store: Store, older_than: float, app: str | None = None, dry_run: bool = False,
                    now: float | None = None) -> ExpireReport:
    """Delete the sessions (of ``app``, or of every app) not updated for ``older_than``
    seconds: no branch, label or HEAD of theirs moved since (retention; ``castore expire``).
    Their content goes at the next ``gc``, as with ``delete-session``. Each ref is deleted
    only if it still holds what was read (compare-and-swap): a session a writer updates
    meanwhile is kept (its current branch is deleted first, so a write in between stops the
    deletion before anything else goes; a writer that reads HEAD once it is marked deleting
    is refused, :class:`~castore.errors.SessionDeleting`). A session whose HEAD is damaged (a lost branch:
    :attr:`~castore.listing.SessionInfo.problem`) is kept: the refs left cannot tell when it
    last changed (an old label would make a session written to today look idle), and
    deleting it would hide the damage from fsck and leave the lost commits to gc. A session
    whose deletion was interrupted (HEAD marked deleting, :mod:`castore.deletion`) is
    finished whatever its age, unless a ref of it was written since the mark
    (:func:`castore.deletion.written_since`): its mark is then taken off and it is kept. The
    deletion itself is :func:`castore.deletion.delete_session_refs`.

    Raises:
        CastoreError: ``older_than`` is negative.
        InvalidName: a bad app name.
        StoreNotFound, StorageError, IntegrityError.
    """
    if not older_than >= 0:
        raise CastoreError(f"the age must not be negative ({older_than})")
    store.require()
    cutoff = (time.time() if now is None else now) - older_than
    report = ExpireReport(dry_run=dry_run)
    for a in [app] if app is not None else store.apps():
        for info in store.sessions(a):
            if info.problem is not None:
                continue
            home = store.tenant(info.app, info.user)
            prefix = session_prefix(info.app, info.user, info.session)
            when, refs = _last_change(home, prefix)
            head = refs.get(f"{prefix}/HEAD")
            marked = deleting_since(head)
            if head is not None and marked is not None:  # a deletion interrupted: finish it unless written to since
                if written_since(head, refs, when):
                    if not dry_run:
                        cancel(home.plumbing, prefix)
                    continue
            elif when is None or when >= cutoff:
                continue
            if not dry_run and not delete_session_refs(home.plumbing, prefix, refs):
                continue
            last = when if when is not None else marked  # a deletion left no branch: when it began
            report.sessions.append((info.app, info.user, info.session, last if last is not None else 0.0))
    return report


def expiry_settings(store: Store) -> tuple[float | None, float | None]:
    """``(reflog expiry, retention)`` in seconds from ``castore.json`` (``"reflog_expire"``,
    ``"retention"``: durations such as ``"90d"``), None where unset.

    Raises:
        CastoreError: a setting is not a duration.
    """
    cfg = store.config
    out: list[float | None] = []
    for key in (REFLOG_EXPIRE_KEY, RETENTION_KEY):
        value = cfg.get(key)
        if value is None:
            out.append(None)
            continue
        try:
            out.append(parse_duration(str(value)))
        except CastoreError:
            raise CastoreError(f"castore.json: {key} is not a duration: {value!r} (use e.g. 90d, 2w)") from None
    return out[0], out[1]


# -- repack --------------------------------------------------------------------------------
#: a log nobody holds is merged only when it has not changed for this long (its writer may
#: be between creating it and taking its lock)
LOG_IDLE = 60.0


def repack(store: Store, all_packs: bool = False, loose: bool = True) -> RepackReport:
    """Merge packs and small loose objects into one new pack, then delete what was merged
    (:meth:`ObjectStore.repack <castore.objectstore.ObjectStore.repack>`, which says what
    is chosen; logs count as idle after :data:`LOG_IDLE` seconds).

    Raises the store to format 2 first (docs/FORMAT.md, 8). Reachability does not matter
    here: every merged object is in the new pack before its old copy is deleted, so a kill
    at any point loses nothing.

    Raises:
        IntegrityError: a merged object is corrupt (nothing is deleted).
        StoreNotFound, StorageError.
    """
    store.require()
    if store.objects.format < 2:
        store.update_config(lambda c: {**c, "format": max(2, c.get("format", 1))})
        store.objects.set_format(2)
    tenants = _tenants(store)
    if tenants is None:
        return store.objects.repack(all_packs=all_packs, loose=loose, idle=LOG_IDLE)
    out = RepackReport()
    for t in tenants:  # one pack per tenant: never two tenants' objects in one
        t.objects.set_format(store.objects.format)
        one = t.objects.repack(all_packs=all_packs, loose=loose, idle=LOG_IDLE)
        out.packs_merged.extend(f"{_where(t)}/{p}" for p in one.packs_merged)
        out.loose_packed += one.loose_packed
        out.objects += one.objects
        out.bytes_written += one.bytes_written
        if one.new_pack is not None:
            out.new_pack = f"{_where(t)}/{one.new_pack}"
    return out

__all__ = ["FsckReport", "GcReport", "RepackReport", "fsck", "gc", "repack", "reachable", "stale_locks",
           "clear_stale_locks", "stale_temps", "clear_stale_temps", "TEMP_MIN_AGE",
           "parse_duration", "DEFAULT_GRACE", "forget_deleted", "ExpireReport", "expire_reflogs",
           "expire_sessions", "expiry_settings", "REFLOG_EXPIRE_KEY", "RETENTION_KEY"]
