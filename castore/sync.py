"""Push, pull and clone sessions between two stores (local disk <-> S3 is the common case).

Like git, only what the other side lacks is sent, and refs move last, by compare-and-swap:

1. **Plan.** For each selected ref (branches, labels, the app- and user-state refs) read the
   source tip and the destination tip (with its version token). Commits carry their depth
   on the first-parent path and the path is packed in segments (:mod:`castore.history`), so
   "is the remote tip an ancestor of ours?" is one lookup in our own path, and the new
   commits are the top of that path: reading them costs a few batched reads whatever the
   session's length. Nothing on the destination is listed except the refs of the
   selection; no object is probed.
2. **Objects.** The new commits, their bodies, the parts of their state trees that differ
   from the parent's tree (compared by id), the segments their blocks complete and the
   indexes they name are copied as stored bytes, verified. The source is read a pack at a
   time. Into a format-2 store they are written as one pack per :data:`PACK_BYTES` (one
   PUT on S3), bodies over 4 KB loose so that they stay shared; into a format-1 store,
   one file per object, in concurrent batches (docs/FORMAT.md, section 13).
3. **Refs.** Each ref is swapped against the value read in step 1. A long history is
   checkpointed: after each batch the ref moves to the newest commit whose history is
   complete, so an interrupted push leaves the remote consistent and a resumed one sends
   only the rest. A non-fast-forward is refused (naming the branch and both tips) unless
   forced; a pull that finds both sides moved keeps the remote tip as
   ``remotes/<remote>/<branch>`` in the session's folder.

Remotes, the other stores a store names, are :mod:`castore.remotes`' (``add_remote`` and the
rest are named here too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from . import names
from . import objects as o
from .deletion import finish_hint, first_commit_head, head_key, stranded
from .errors import (
    CastoreError,
    IntegrityError,
    RefConflict,
    SealedFrameError,
    SessionDeleting,
)
from .history import BlockPath, Hint, K, merge_depth
from .objects import Commit, Index, Tree
from .plumbing import tip_meta
from .refnames import (
    DELETING_KEYS,
    META_BORN,
    META_NAMES,
    REMOTES,
    SESSIONS,
    STATE,
    RefName,
    SessionRefs,
    branches_made_since,
    carried_meta,
    deleting_since,
    head_problem,
    parse_ref_name,
    real_name,
    scope_ref,
    session_prefix,
)
from .refs import SYMBOLIC, RefValue
from .remotes import add_remote, check_remote_name, list_remotes, open_remote, remove_remote
from .store import Store

#: objects read per batch (one concurrent read); into a format-1 store, also one write
#: batch per BATCH objects (each object its own file)
BATCH = 1024
#: into a format-2 store, objects are written as one pack of about this many stored bytes
#: (one PUT); refs move to the newest complete commit after each pack
PACK_BYTES = 8 << 20
#: threads for reading and swapping refs
REF_THREADS = 16

Selection = Any  # None (all) | app | (app,) | (app, user) | (app, user, session)


class Refusal(NamedTuple):
    """A ref that was not updated: its name, why, and both tips (None: absent)."""

    ref: str
    reason: str
    local: str | None
    remote: str | None


@dataclass
class SyncReport:
    """What a push or pull did.

    Attributes:
        objects_sent: objects copied to the destination.
        bytes_sent: their stored (compressed) size.
        packs_sent: packs written on the destination (format 2: a few per push; each is
            one PUT on S3, one record of the writer's log on local disk).
        loose_sent: objects written as their own file (format 1: all of them; format 2:
            bodies and state values over 4 KB, which stay shared across sessions).
        refs_updated: destination refs created or moved (stored ref names).
        refs_refused: refs left alone, with the reason and both tips.
        refs_kept_as_remote: (pull) ``remotes/<remote>/<branch>`` refs written because
            both sides had moved.
        refs_up_to_date: refs that already matched.
        refs_forced: ``(ref, old tip, new tip)`` of every ref a ``force`` overwrote; in a
            session, the old tip is kept in the destination's reflog (``castore reflog``).
        refs_skipped: ref names found on the source (or the destination) that are not
            refs castore writes (``..``, foreign characters, extra levels), each with the
            reason; they were not read, copied or joined into any path. And the HEAD of each
            source session whose deletion was interrupted after its branch went
            (:func:`castore.deletion.stranded`): nothing of it was copied.
        tenants_erased: (encrypted stores) the tenants (``tenants/<app>/<user>``) skipped
            because they were erased on either side: nothing of theirs was read or sent.
    """

    objects_sent: int = 0
    bytes_sent: int = 0
    packs_sent: int = 0
    loose_sent: int = 0
    refs_updated: list[str] = field(default_factory=list)
    refs_refused: list[Refusal] = field(default_factory=list)
    refs_kept_as_remote: list[str] = field(default_factory=list)
    refs_up_to_date: int = 0
    refs_forced: list[tuple[str, str, str]] = field(default_factory=list)
    refs_skipped: list[tuple[str, str]] = field(default_factory=list)
    tenants_erased: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no ref was refused."""
        return not self.refs_refused

    def add(self, other: SyncReport) -> None:
        """Count ``other`` (another tenant's sync) into this report."""
        for f in ("objects_sent", "bytes_sent", "packs_sent", "loose_sent", "refs_up_to_date"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        for f in ("refs_updated", "refs_refused", "refs_kept_as_remote", "refs_forced", "refs_skipped",
                  "tenants_erased"):
            getattr(self, f).extend(getattr(other, f))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {
            "objects_sent": self.objects_sent,
            "bytes_sent": self.bytes_sent,
            "packs_sent": self.packs_sent,
            "loose_sent": self.loose_sent,
            "refs_updated": list(self.refs_updated),
            "refs_refused": [r._asdict() for r in self.refs_refused],
            "refs_kept_as_remote": list(self.refs_kept_as_remote),
            "refs_up_to_date": self.refs_up_to_date,
            "refs_forced": [list(x) for x in self.refs_forced],
            "refs_skipped": [list(x) for x in self.refs_skipped],
            "tenants_erased": list(self.tenants_erased),
        }


@dataclass(frozen=True)
class SyncProgress:
    """Passed to the ``progress`` callback after planning and after each batch."""

    objects_done: int
    objects_total: int
    bytes_done: int
    refs_done: int = 0


ProgressFn = Callable[[SyncProgress], None]


# -- selection --------------------------------------------------------------------------
def _selection(sel: Selection) -> tuple[str, list[str] | None, str | None]:
    """(session ref prefix, fixed scope ref names or None, scope prefix to list or None)."""
    if sel is None:
        return SESSIONS, None, STATE
    if isinstance(sel, str):
        sel = (sel,)
    if not isinstance(sel, tuple) or not 1 <= len(sel) <= 3:
        raise CastoreError(f"bad selection {sel!r}: give an app, (app, user), (app, user, session) or None for all")
    app = names.encode(sel[0], "app name")
    if len(sel) == 1:
        return f"{SESSIONS}/{app}", None, f"{STATE}/{app}"
    scopes = [scope_ref(sel[0], None), scope_ref(sel[0], sel[1])]
    if len(sel) == 2:
        return f"{SESSIONS}/{names.encode_key(sel[0], sel[1])}", scopes, None
    return session_prefix(sel[0], sel[1], sel[2]), scopes, None


def describe(ref: str, meta: Mapping[str, Any] | None = None) -> str:
    """A ref name as a person reads it: ``branch 'main' of session app/user/s1``."""
    p = parse_ref_name(ref)
    if p is None:
        return ref
    if p.session is not None:
        key = "/".join(real_name(x, None) for x in (p.app, p.user or "", p.session))
        name = real_name(p.name, meta) if p.name else ""
        if p.kind == "branch":
            return f"branch {name!r} of session {key}"
        if p.kind == "label":
            return f"label {name!r} of session {key}"
        return f"{ref.split('/', 4)[4]} of session {key}"
    where = f" (remote {real_name(p.remote, None)!r})" if p.remote else ""
    if p.kind == "app-state":
        return f"app state of {real_name(p.app, None)!r}{where}"
    return f"user state of {real_name(p.user or '', None)!r} in {real_name(p.app, None)!r}{where}"


# -- the plan -----------------------------------------------------------------------------
@dataclass
class _Update:
    """One ref swap on the destination: set ``ref`` to ``target`` with ``meta``."""

    ref: str
    target: str
    meta: dict[str, Any]
    final: bool = True
    force: bool = False
    kept: bool = False  # a remotes/... ref written because both sides moved
    display: str = ""


@dataclass
class _Step:
    objects: list[str]
    updates: list[_Update]


class _Sync:
    def __init__(self, src: Store, dst: Store, *, force: bool, pull_remote: str | None,
                 progress: ProgressFn | None, only_scopes: set[str] | None = None) -> None:
        self.src, self.dst = src, dst
        #: one tenant's sync: the scope refs it may send (another tenant's go on their own)
        self.only_scopes = only_scopes
        self.force = force
        self.pull_remote = pull_remote  # set for a pull: the name of the remote we read
        self.progress = progress
        self.report = SyncReport()
        self.steps: list[_Step] = []
        self.dst_values: dict[str, RefValue | None] = {}
        self.scope_needs: dict[str, set[str]] = {}  # scope ref -> scope commits named by new commits
        self.depth_cache: dict[str, int] = {}
        self.pool = ThreadPoolExecutor(REF_THREADS)
        self._failed: set[str] = set()
        self.near = dst if pull_remote is not None else None
        self._total = 0
        self._pending: dict[str, bytes] = {}  # stored bytes read, not yet written
        self._pending_bytes = 0
        self._sent: set[str] = set()  # ids written to the destination by this sync

    @staticmethod
    def _path_of(store: Store, tip: str, meta: Mapping[str, Any] | None, near: Store | None = None) -> BlockPath:
        return BlockPath(store.objects, tip, meta, near.objects if near is not None else None)

    # reading refs --------------------------------------------------------------------
    def _read_dst(self, refs: Iterable[str]) -> None:
        todo = [r for r in refs if r not in self.dst_values]
        for r, v in zip(todo, self.pool.map(self.dst.refs.read, todo), strict=True):
            self.dst_values[r] = v

    def _depths(self, cids: Iterable[str]) -> None:
        """Learn the depth of commits (from the source if it has them, else the destination)."""
        todo = [c for c in dict.fromkeys(cids) if c not in self.depth_cache]
        if not todo:
            return
        first, second = (self.dst, self.src) if self.near is not None else (self.src, self.dst)
        got = first.objects.get_many(todo, missing_ok=True)
        rest = [c for c in todo if not isinstance(got.get(c), Commit)]
        if rest:
            got.update(second.objects.get_many(rest, missing_ok=True))
        for c in todo:
            obj = got.get(c)
            if isinstance(obj, Commit):
                self.depth_cache[c] = obj.depth

    def _src_objects(self, ids: Iterable[str]) -> dict[str, Any]:
        """Objects of the source, read from the local side first when pulling."""
        ids = list(dict.fromkeys(ids))
        got: dict[str, Any] = {}
        if self.near is not None:
            got = self.near.objects.get_many(ids, missing_ok=True)
        rest = [i for i in ids if i not in got]
        if rest:
            got.update(self.src.objects.get_many(rest))
        return got

    # planning --------------------------------------------------------------------------
    def plan(self, sel: tuple[str, list[str] | None, str | None]) -> None:
        prefix, scope_refs, scope_prefix = sel
        src_parsed = self._valid(self.src.refs.list(prefix), "the source")
        src_names = [p.ref for p in src_parsed if not _is_tracking(p)]
        src_vals = self.src.refs.read_many(src_names)
        # a branch made after the listing that a HEAD read names (checkout -b, a first append)
        # travels with it, rather than the session being refused as one whose branch was lost
        late = branches_made_since(src_vals, set(src_names))
        got = {r: v for r, v in (self.src.refs.read_many(late) if late else {}).items() if v is not None}
        src_parsed += [p for r in got if (p := parse_ref_name(r)) is not None]
        src_vals.update(got)
        dst_parsed = self._valid(self.dst.refs.list(prefix), "the destination")
        dst_names = {p.ref for p in dst_parsed}
        sessions: dict[str, list[str]] = {}
        for p in src_parsed:
            if p.session_prefix is not None and not _is_tracking(p):  # a reflog only tells of history
                sessions.setdefault(p.session_prefix, []).append(p.ref)
        # Only refs that exist on the destination, in sessions the source has, are read
        # (with their tokens, for the compare-and-swap).
        self._read_dst([p.ref for p in dst_parsed if p.session_prefix in sessions
                        and (not _is_tracking(p) or self.pull_remote)])
        self._read_dst(late := branches_made_since({n: self.dst_values.get(n) for n in dst_names}, dst_names))
        dst_names.update(r for r in late if self.dst_values.get(r) is not None)  # (as on the source side)
        for n in src_vals:  # (the names listed, and the branches read since)
            self.dst_values.setdefault(n, None)
        for sprefix, refs in sorted(sessions.items()):
            self._plan_session(sprefix, refs, src_vals, dst_names)
        # Scope refs: the selection's, and every one that new session commits need.
        if scope_refs is None:
            listed = self._valid(self.src.refs.list(scope_prefix or STATE), "the source")
            scope_refs = [p.ref for p in listed if not _is_tracking(p) and p.session is None]
        wanted = sorted(r for r in set(scope_refs) | set(self.scope_needs)
                        if self.only_scopes is None or r in self.only_scopes)
        src_scope = self.src.refs.read_many(wanted)
        self._read_dst(wanted)
        scope_steps_start = len(self.steps)
        for ref in wanted:
            v = src_scope.get(ref)
            if v is None or v.symbolic:
                continue
            self._plan_ref(ref, v, [], kind="scope", extra_tips=self.scope_needs.get(ref, set()))
        # Scope objects must land before the session commits that name them.
        self.steps = self.steps[scope_steps_start:] + self.steps[:scope_steps_start]

    def _valid(self, listed: list[str], side: str) -> list[RefName]:
        """The listed names that parse as refs castore writes; the others are reported, never used."""
        out = []
        for n in listed:
            p = parse_ref_name(n)
            if p is None:
                if not n.endswith(".lock"):
                    self.report.refs_skipped.append(
                        (n, f"not a castore ref name (found on {side}): skipped, nothing read or written"))
                continue
            out.append(p)
        return out

    def _plan_session(self, sprefix: str, refs: list[str], src_vals: Mapping[str, RefValue | None],
                      dst_names: set[str]) -> None:
        dst_direct = [n for n in dst_names if n.startswith(sprefix + "/") and n != SessionRefs(sprefix).reflog]
        candidates = [v.target for n in dst_direct if (v := self.dst_values.get(n)) is not None and not v.symbolic]
        head_name = f"{sprefix}/HEAD"
        head = src_vals.get(head_name)
        # A source session's other refs alone would land as a session without HEAD or the lost
        # commits; into a destination session, a lost branch would come back at the source's
        # (older) tip, leaving the commits only it held to gc: fsck calls either sound. Nothing
        # of such a session travels.
        reflog = SessionRefs(sprefix).reflog  # (dst_direct with it: no second pass over dst_names)
        dst_refs = [*dst_direct, *([reflog] if reflog in dst_names else [])]
        for why in (self._head_problem(sprefix, head, refs, self.pull_remote is not None),
                    self._head_problem(sprefix, self.dst_values.get(head_name), dst_refs, self.pull_remote is None,
                                       into=True)):
            if why is not None:
                self.report.refs_refused.append(Refusal(head_name, why, None, None))
                return
        if (left := stranded(sprefix, head, refs)) is not None:  # the rest would land without HEAD
            self.report.refs_skipped.append((head_name, f"{describe(head_name)}: {left}; nothing of it was copied"))
            return
        kinds = {r: p.kind for r in refs if (p := parse_ref_name(r)) is not None}
        ordered = sorted((r for r in refs if kinds.get(r) in ("branch", "label")), key=lambda r: kinds[r] != "branch")
        for ref in ordered:
            v = src_vals.get(ref)
            if v is None or v.symbolic:
                continue
            kind = kinds[ref]
            self._plan_ref(ref, v, candidates, kind=kind)
        if head is not None and self.dst_values.get(head_name) is None:
            meta = carried_meta(head)
            meta[META_NAMES] = _names_from_key(sprefix, meta.get(META_NAMES))
            if head.symbolic is None:  # a detached HEAD: its commit must travel too
                self._plan_ref(head_name, head, candidates, kind="head")
            else:
                # the blobs HEAD's info names (a fork's copied lines, side files) travel with it
                links: list[str] = [*self.src.objects.codec.meta_links(meta)]
                self.steps.append(_Step(links, [_Update(head_name, head.target, meta, display=describe(head_name))]))

    @staticmethod
    def _head_problem(sprefix: str, head: RefValue | None, refs: list[str], remote: bool,
                      into: bool = False) -> str | None:
        """Why a session's symbolic ``head`` (its ``refs`` listed, on the ``remote`` side or here)
        stops the session: it names no branch of this session, or a branch that was lost
        (:func:`castore.plumbing.head_problem`), or (``into``: the destination's HEAD) it carries
        the deleting mark: a deletion there is under way or was interrupted, and the session's
        refs would come back under the mark, for its finishing to delete (refused as git refuses
        a ref it finds locked; the line names the command that finishes the deletion,
        :func:`castore.deletion.finish_hint`). None when it is sound or never born."""
        if into and head is not None and deleting_since(head) is not None:
            problem: str | None = finish_hint(head.name, head)
        else:
            problem = head_problem(sprefix, head, refs)
        where = "in the remote" if remote else "here"
        return None if problem is None else \
            f"{describe(f'{sprefix}/HEAD')} ({where}): {problem}; nothing of this session was copied"

    def _plan_ref(self, ref: str, src_v: RefValue, candidates: list[str], kind: str,
                  extra_tips: set[str] | None = None) -> None:
        src_tip = src_v.target
        dst_v = self.dst_values.get(ref)
        dst_tip = dst_v.target if dst_v is not None and not dst_v.symbolic else None
        display = describe(ref)
        meta = carried_meta(src_v)
        if dst_tip == src_tip:
            self.report.refs_up_to_date += 1
            for t in (extra_tips or set()) - {src_tip}:
                self._send_chain(ref, t, None, [src_tip], kind)
            return
        chain = self._path_of(self.src, src_tip, src_v.meta, self.near)
        known = [c for c in dict.fromkeys(([dst_tip] if dst_tip else []) + candidates)]
        self._depths(known)
        update_ref, force_it, kept = ref, False, False
        if dst_tip is not None and kind == "label":
            # A label names one commit for good: a different one on the other side is a
            # conflict whichever way the commits are related.
            if not self.force:
                self._refuse(ref, display, src_tip, dst_tip, "the label names another commit there")
                return
            force_it = True
        elif dst_tip is not None:
            dd = self.depth_cache.get(dst_tip)
            ff = dd is not None and chain.contains(dst_tip, dd)
            if not ff:
                behind = self._contains(dst_tip, dst_v, src_tip)
                if behind and self.pull_remote is not None:
                    self.report.refs_up_to_date += 1  # our side has more: nothing to take
                    return
                if self.force:
                    force_it = True
                elif self.pull_remote is not None and kind in ("branch", "scope"):
                    update_ref, kept = _tracking_ref(ref, self.pull_remote), True
                else:
                    why = ("the remote is ahead (it has commits this side lacks)" if behind
                           else "histories diverged")
                    self._refuse(ref, display, src_tip, dst_tip, why)
                    # Session commits sent now may name these state commits: send them anyway.
                    for t in extra_tips or ():
                        self._send_chain(ref, t, None, known, kind)
                    return
        if kept:
            self._read_dst([update_ref])
            cur = self.dst_values.get(update_ref)
            if cur is not None and cur.target == src_tip:
                self.report.refs_up_to_date += 1
                return
        self._send_chain(update_ref, src_tip, chain, known, kind, meta=meta, force=force_it or kept,
                         kept=kept, display=display)
        for t in (extra_tips or set()) - {src_tip}:
            self._send_chain(ref, t, None, known + [src_tip], kind)

    def _refuse(self, ref: str, display: str, src_tip: str, dst_tip: str, why: str) -> None:
        pulling = self.pull_remote is not None
        local, remote = (dst_tip, src_tip) if pulling else (src_tip, dst_tip)
        self.report.refs_refused.append(Refusal(ref, _refusal(display, src_tip, dst_tip, why, pulling),
                                                local, remote))

    def _contains(self, dst_tip: str, dst_v: RefValue | None, src_tip: str) -> bool:
        """Whether ``src_tip`` is on the destination's path to ``dst_tip``."""
        self._depths([src_tip])
        sd = self.depth_cache.get(src_tip)
        if sd is None:
            return False
        other = self._path_of(self.dst, dst_tip, dst_v.meta if dst_v else None)
        return other.contains(src_tip, sd)

    def _base_depth(self, chain: BlockPath, known: list[str]) -> int:
        """The deepest commit of ``chain`` whose whole history the destination has (-1: none)."""
        best = -1
        diverged = []
        for t in known:
            d = self.depth_cache.get(t)
            if d is None:
                continue
            if chain.contains(t, d):
                best = max(best, d)
            else:
                diverged.append(t)
        for t in diverged:
            # Reading the other path is only needed when histories forked; a binary search
            # over both paths costs a few block reads each.
            if self.depth_cache[t] <= best:
                continue
            try:
                other = self._path_of(self.dst, t, self._dst_meta_for(t))
            except (o.IntegrityError, KeyError):
                continue
            best = max(best, merge_depth(chain.id_at, other.id_at, chain.depth, other.depth))
        return best

    def _dst_meta_for(self, tip: str) -> Mapping[str, Any] | None:
        for v in self.dst_values.values():
            if v is not None and v.target == tip:
                return v.meta
        return None

    def _send_chain(self, ref: str, tip: str, chain: BlockPath | None, known: list[str], kind: str,
                    meta: dict[str, Any] | None = None, force: bool = False, kept: bool = False,
                    display: str = "") -> None:
        """Plan the objects of ``tip``'s path the destination lacks, then (if ``meta`` is
        given) the swap of ``ref``; long histories get checkpoint swaps on the way."""
        if chain is None:
            chain = self._path_of(self.src, tip, None, self.near)
        self._depths(known)
        base = self._base_depth(chain, known)
        new = chain.range(base + 1, chain.depth) if base < chain.depth else []
        if not new:
            if meta is not None:
                self.steps.append(_Step([], [_Update(ref, tip, meta, force=force, kept=kept, display=display)]))
            return
        base_commit = chain.commit_at(base)[1] if base >= 0 else None
        owners = self._closure(chain, new, base_commit, meta)
        if kind != "scope":
            for _, c in new:
                for scope, raw in c.scopes.items():
                    sref = self._scope_ref_of(ref, scope)
                    if sref:
                        self.scope_needs.setdefault(sref, set()).add(o.hex_id(raw))
        # Group the objects by the commit that first needs them; cut into checkpoints.
        per_commit: list[list[str]] = [[] for _ in new]
        for oid, i in owners.items():
            per_commit[i].append(oid)
        piece: list[str] = []
        for i, (cid, c) in enumerate(new):
            piece.extend(per_commit[i])
            last = i == len(new) - 1
            updates: list[_Update] = []
            if last and meta is not None:
                updates.append(_Update(ref, tip, meta, force=force, kept=kept, display=display))
            elif len(piece) >= BATCH and meta is not None and (c.depth + 1) % K != 0:
                updates.append(_Update(ref, cid, self._checkpoint_meta(chain, c), final=False,
                                       force=force, kept=kept, display=display))
                force = False  # later checkpoints extend this one
            if updates or last:
                self.steps.append(_Step(piece, updates))
                piece = []

    def _checkpoint_meta(self, chain: BlockPath, c: Commit) -> dict[str, Any]:
        start = (c.depth // K) * K
        tail = [cid for cid, _ in chain.range(start, c.depth)]
        return tip_meta(Hint(o.hex_id(c.index) if c.index else None, tail), c.time, c.depth)

    @staticmethod
    def _scope_ref_of(ref: str, scope: str) -> str | None:
        p = parse_ref_name(ref)
        if p is None or p.session is None:
            return None
        return f"{STATE}/{p.app}/app" if scope == "app" else f"{STATE}/{p.app}/users/{p.user}"

    def _closure(self, chain: BlockPath, new: list[tuple[str, Commit]], base: Commit | None,
                 meta: Mapping[str, Any] | None) -> dict[str, int]:
        """Every object the new commits add, mapped to the position of the first commit needing it."""
        owners: dict[str, int] = {}

        def own(oid: str, i: int) -> None:
            if owners.get(oid, i + 1) > i:
                owners[oid] = i

        pairs: list[tuple[int, str, str | None]] = []
        prev_state = base.state if base is not None else None
        known_index = {o.hex_id(base.index)} if base is not None and base.index else set()
        for i, (cid, c) in enumerate(new):
            own(cid, i)
            if c.body is not None:
                own(o.hex_id(c.body), i)
            for b in o.meta_links(c.meta):  # an archived line's bytes
                own(b, i)
            if c.state is not None and c.state != prev_state:
                pairs.append((i, o.hex_id(c.state), o.hex_id(prev_state) if prev_state else None))
            prev_state = c.state
            if c.index is not None and o.hex_id(c.index) not in known_index:
                own(o.hex_id(c.index), i)
            if (c.depth + 1) % K == 0:
                sid = chain.segment_for_block(c.depth // K)
                if sid is None:
                    sid = self._segment_from_next_index(new, i)
                if sid is not None:
                    own(sid, i)
        hint = Hint.from_meta(meta) if meta else None
        if hint is not None and hint.index and hint.index not in known_index:
            own(hint.index, len(new) - 1)
        for oid, i in self._tree_diff(pairs).items():
            own(oid, i)
        return owners

    def _segment_from_next_index(self, new: list[tuple[str, Commit]], i: int) -> str | None:
        # The segment of a block is listed last by the index the next block's commits name.
        raw = new[i + 1][1].index if i + 1 < len(new) else None
        if raw is not None:
            iid = o.hex_id(raw)
            idx = self._src_objects([iid])[iid]
            if isinstance(idx, Index) and idx.segments:
                return o.hex_id(idx.segments[-1])
        return None

    def _tree_diff(self, pairs: list[tuple[int, str, str | None]]) -> dict[str, int]:
        """Trees and values of the new states that their parent states lack, compared by id."""
        out: dict[str, int] = {}
        level = sorted(pairs)
        while level:
            need = {n for _, n, _ in level} | {x for _, _, x in level if x}
            got = self._src_objects(need)
            nxt: list[tuple[int, str, str | None]] = []
            for i, new_id, old_id in level:
                if out.get(new_id, i + 1) <= i:
                    continue
                out[new_id] = i
                nt = got[new_id]
                ot = got.get(old_id) if old_id else None
                if not isinstance(nt, Tree) or (ot is not None and not isinstance(ot, Tree)):
                    raise IntegrityError(new_id, "expected a state tree")
                old_vals = set(ot.refs.values()) if ot is not None else set()
                for raw in nt.refs.values():
                    if raw not in old_vals:
                        vid = o.hex_id(raw)
                        if out.get(vid, i + 1) > i:
                            out[vid] = i
                for b, raw in nt.sub.items():
                    if ot is not None and ot.sub:
                        old_child = ot.sub.get(b)
                        if old_child == raw:
                            continue
                        nxt.append((i, o.hex_id(raw), o.hex_id(old_child) if old_child else None))
                    else:  # the old tree was flat: compare the child with it, key by key
                        nxt.append((i, o.hex_id(raw), old_id))
            level = sorted(nxt)
        return out

    # executing -------------------------------------------------------------------------
    def run(self) -> SyncReport:
        seen: set[str] = set()
        total = 0
        for step in self.steps:
            fresh = [x for x in dict.fromkeys(step.objects) if x not in seen]
            seen.update(fresh)
            step.objects = fresh
            total += len(fresh)
        self._total = total
        self._tick()
        packed = self.dst.objects.format >= 2
        buffer: list[str] = []
        ready: list[_Update] = []
        for step in self.steps:
            buffer.extend(step.objects)
            ready.extend(step.updates)
            if len(buffer) >= BATCH:
                self._read(buffer)
                buffer = []
                if not packed or self._pending_bytes >= PACK_BYTES:
                    # every object the ready updates name is written: they may move now
                    self._flush()
                    self._apply(ready)
                    ready = []
        self._read(buffer)
        self._flush()
        self._apply(ready)
        self.pool.shutdown()
        return self.report

    def _tick(self) -> None:
        if self.progress is not None:
            self.progress(SyncProgress(self.report.objects_sent, self._total, self.report.bytes_sent,
                                       len(self.report.refs_updated)))

    def _read(self, ids: list[str]) -> None:
        """Read the stored bytes of ``ids`` from the source (a pack at a time) into the
        pending set; into a format-1 store, write each batch at once."""
        for i in range(0, len(ids), BATCH):
            got = self.src.objects.read_stored_packed(ids[i : i + BATCH])
            self._pending.update(got)
            self._pending_bytes += sum(len(v) for v in got.values())
            if self.dst.objects.format < 2:
                self._flush()

    def _flush(self) -> None:
        """Write the pending objects: into a format-2 store, as one pack (plus the large
        bodies, loose); into a format-1 store, one file each."""
        if not self._pending:
            return
        items, self._pending, self._pending_bytes = self._pending, {}, 0
        packed, loose = self.dst.objects.put_stored_packed(items)
        self.report.packs_sent += 1 if packed else 0
        self.report.loose_sent += loose
        self._sent.update(items)
        self.report.objects_sent += len(items)
        self.report.bytes_sent += sum(len(v) for v in items.values())
        self._tick()

    def _apply(self, updates: list[_Update]) -> None:
        if not updates:
            return
        last: dict[str, _Update] = {}
        for u in updates:  # a later checkpoint of a ref supersedes an earlier one
            last.pop(u.ref, None)
            last[u.ref] = u
        direct = [u for u in last.values() if not u.target.startswith(SYMBOLIC)]
        symbolic = [u for u in last.values() if u.target.startswith(SYMBOLIC)]
        direct = self._held(direct)
        for group in (direct, symbolic):
            futures = [self.pool.submit(self._swap, u) for u in group]
            # Let every swap finish before reporting a failure: none may land after we return.
            errors = [e for f in futures if (e := f.exception()) is not None]
            if errors:
                raise errors[0]
        self._tick()

    def _held(self, updates: list[_Update]) -> list[_Update]:
        """The updates whose target the destination holds; the others are refused, never
        swapped: a ref must not name a commit that is not there. What this sync wrote is
        held; any other target (one the plan took to be there already) is looked up."""
        unsure = {u.target for u in updates if u.target not in self._sent}
        absent = {t for t in unsure if not self.dst.objects.contains(t)}
        if not absent:
            return updates
        for u in updates:
            if u.target in absent:
                self._failed.add(u.ref)
                cur = self.dst_values.get(u.ref)
                there = cur.target if cur is not None else None
                self.report.refs_refused.append(Refusal(
                    u.ref,
                    f"{u.display or describe(u.ref)}: commit {_short(u.target)} is not in the destination "
                    "and was not copied (a damaged store on either side: run `castore fsck`); the ref was not moved",
                    *((there, u.target) if self.pull_remote else (u.target, there))))
        return [u for u in updates if u.target not in absent]

    def _keep_overwritten(self, ref: str, old: str, new: str) -> None:
        """Before a forced swap: keep the tip it overwrites in the session's reflog."""
        refs = _session_refs(ref)
        if refs is not None:
            why = f"{'pull' if self.pull_remote is not None else 'push'} --force"
            self.dst.plumbing.record_move(refs, ref, old, new, why)
        self.report.refs_forced.append((ref, old, new))

    def _swap(self, u: _Update) -> None:
        if u.ref in self._failed:
            return
        cur = self.dst_values.get(u.ref)
        if u.target.startswith(SYMBOLIC):
            # HEAD is only created, never moved, and only once its branch is there.
            # (planned only when it names a branch of its session: _head_problem)
            branch = SessionRefs(u.ref.rsplit("/", 1)[0]).branch_ref_of(RefValue(u.ref, u.target, u.meta))
            landed = self.dst_values.get(branch)
            if landed is None:
                return
            # (born: its branch is there, whether or not the other side's HEAD says so; never a
            # deletion under way there: the copy is not being deleted, castore.deletion)
            meta = {**{k: v for k, v in u.meta.items() if k not in DELETING_KEYS}, META_BORN: True}
            try:  # the rule of every writer of a session's first branch: a deletion there may race it
                made = first_commit_head(self.dst.plumbing, head_key(u.ref, meta), landed, u.target, meta, False)
            except SessionDeleting as e:
                self._failed.add(u.ref)
                self.report.refs_refused.append(Refusal(u.ref, f"{describe(u.ref)}: {e}", None, None))
                return
            if made is not None:
                self.dst_values[u.ref] = made
                self.report.refs_updated.append(u.ref)
            return
        try:
            if u.force and not u.kept and cur is not None and not cur.symbolic and cur.target != u.target:
                self._keep_overwritten(u.ref, cur.target, u.target)
            self.dst_values[u.ref] = self.dst.plumbing.swap(u.ref, u.target, cur, u.meta)
        except RefConflict as e:
            if e.actual == u.target and u.final:
                self.report.refs_up_to_date += 1
                return
            self._failed.add(u.ref)
            mine = u.target if u.final else None
            local, remote = (e.actual, mine) if self.pull_remote else (mine, e.actual)
            where = "locally" if self.pull_remote else "on the remote"
            self.report.refs_refused.append(Refusal(
                u.ref,
                f"{u.display or describe(u.ref)} changed {where} during the sync "
                f"(expected {_short(cur.target if cur else None)}, found {_short(e.actual)}); "
                "nothing was overwritten: run the command again",
                local, remote))
            return
        if u.final:
            (self.report.refs_kept_as_remote if u.kept else self.report.refs_updated).append(u.ref)


def _names_from_key(sprefix: str, claimed: Any) -> dict[str, str]:
    """A pulled HEAD's ``names``, rebuilt from its key: a claimed name is kept only where
    the key's segment is a digest (it cannot be decoded) and the name hashes to it."""
    claimed = claimed if isinstance(claimed, dict) else {}
    segs = sprefix.split("/")[1:4]
    return {part: real_name(seg, {"name": claimed.get(part)}) for part, seg in zip(("app", "user", "session"), segs,
                                                                                  strict=True)}


def _session_refs(ref: str) -> SessionRefs | None:
    p = parse_ref_name(ref)
    return SessionRefs(p.session_prefix) if p is not None and p.session_prefix is not None else None


def _short(cid: str | None) -> str:
    return cid[:12] if cid else "(absent)"


#: how the reason of every refusal for a non-fast-forward starts (see :func:`both_ways`)
_NON_FF = "non-fast-forward"


def _refusal(display: str, src_tip: str, dst_tip: str, why: str, pulling: bool) -> str:
    here, there = ("remote", "local") if pulling else ("local", "remote")
    hint = "use --force to overwrite" if pulling else "pull first, or use --force to overwrite the remote"
    return (f"{_NON_FF}: {display}: {why} ({here} tip {_short(src_tip)}, {there} tip "
            f"{_short(dst_tip)}); {hint}")


def _is_tracking(ref: RefName) -> bool:
    return ref.remote is not None


def _tracking_ref(ref: str, remote: str) -> str:
    """Where a pull keeps a remote tip that diverged from ours."""
    seg = names.encode(remote, "remote name")
    p = parse_ref_name(ref)
    assert p is not None and p.remote is None, ref  # only names that parsed are planned
    if p.session_prefix is not None:  # sessions/a/u/s/heads/<branch> -> sessions/a/u/s/remotes/<r>/<branch>
        return f"{p.session_prefix}/{REMOTES}/{seg}/{p.name}"
    rest = "app" if p.kind == "app-state" else f"users/{p.user}"
    return f"{STATE}/{p.app}/{REMOTES}/{seg}/{rest}"  # state/a/remotes/<r>/app|users/u


def _sync(src: Store, dst: Store, sessions: Selection, force: bool, progress: ProgressFn | None,
          pull_remote: str | None) -> SyncReport:
    src.require()
    planned = _selection(sessions)
    if not dst.exists:
        # A new destination takes the source's storage format (a format-2 store pushed to
        # a new bucket stays packed; a format-1 one stays loose) and layout.
        dst.init(like=src)
    dst.init()
    if src.layout == dst.layout == "flat":
        return _sync_pair(src, dst, planned, None, force, progress, pull_remote)
    # The tenant layout (docs/FORMAT.md 2.1): each tenant syncs on its own, the apps' own
    # first (their state is named by the users' commits); a flat side stands for every one.
    tenants = _tenants(src, sessions)
    if src.root.encryption is not None or dst.root.encryption is not None:
        from .crypto.encryption import share_keys  # here: a plain store's sync never loads castore.crypto

        named = (sessions[0], sessions[1]) if isinstance(sessions, tuple) and len(sessions) >= 2 else None
        tenants = share_keys(src.root.encryption, dst.root.encryption, tenants, named, src.url, dst.url)
    report = SyncReport()
    for a, u in tenants:
        st, dt = src.tenant_at(a, u), dst.tenant_at(a, u)
        if st.erased is not None or dt.erased is not None:
            # store-wide work skips an erased tenant (its erasure went over with the keys)
            report.tenants_erased.append(names.tenant_prefix(a, u))
            continue
        scopes = [f"{STATE}/{a}/app" if u == names.APP_SCOPE else f"{STATE}/{a}/users/{u}"]
        prefix = planned[0] if isinstance(sessions, tuple) and len(sessions) == 3 else f"{SESSIONS}/{a}/{u}"
        report.add(_sync_pair(st, dt, (prefix, scopes, None), set(scopes), force, progress, pull_remote))
    return report


def _tenants(src: Store, sel: Selection) -> list[tuple[str, str]]:
    """The (app, user) segments of the tenants of a selection, each app's own tenant first."""
    sel = (sel,) if isinstance(sel, str) else sel
    if sel is not None and len(sel) >= 2:
        a, u = names.tenant_segments(sel[0], sel[1])
        return [(a, names.APP_SCOPE), (a, u)]
    if src.layout == "tenants":
        keys = src.tenant_keys()
    else:
        parsed = [parse_ref_name(r) for r in src.refs.list(SESSIONS) + src.refs.list(STATE)]
        keys = sorted({(p.app, p.user or names.APP_SCOPE) for p in parsed if p is not None})
    if sel is not None:
        keys = [k for k in keys if k[0] == names.encode(sel[0], "app name")]
    return sorted(keys, key=lambda k: k[1] != names.APP_SCOPE)


def _sync_pair(src: Store, dst: Store, planned: tuple[str, list[str] | None, str | None],
               only_scopes: set[str] | None, force: bool, progress: ProgressFn | None,
               pull_remote: str | None) -> SyncReport:
    if not src.objects.codec.compatible(dst.objects.codec):
        # stored frames are copied as they are: another codec would neither find them under
        # its ids nor open them (and a plain store would be handed an encrypted one's objects)
        raise SealedFrameError(f"{src.url} -> {dst.url}", "the two stores have different codecs (keys or "
                               "tenant): open both with the same keys to copy between them")
    if src.objects.format >= 2:
        # Map the source's packs up front: one listing, instead of a probe of the loose
        # files for each object the plan reads first.
        src.objects.refresh()
    job = _Sync(src, dst, force=force, pull_remote=pull_remote, progress=progress, only_scopes=only_scopes)
    try:
        job.plan(planned)
        return job.run()
    finally:
        job.pool.shutdown()


def push(src: Store, dst: Store, sessions: Selection = None, force: bool = False,
         progress: ProgressFn | None = None) -> SyncReport:
    """Send sessions from ``src`` to ``dst``: objects it lacks, then refs by compare-and-swap.

    Args:
        src: the store to read.
        dst: the store to update (created on the first push).
        sessions: ``None`` for every session, an app name, ``(app, user)``, or
            ``(app, user, session)``. The app- and user-state refs of the selection go too.
        force: overwrite refs that are not fast-forwards (their old commits stay as
            unreachable objects until ``gc``).
        progress: called with a :class:`SyncProgress` after planning and each batch.

    Returns:
        A :class:`SyncReport`; refused refs are in ``refs_refused`` (nothing raises for them),
        among them the HEAD of a session whose HEAD names no branch of its own or a lost one
        (:func:`castore.plumbing.lost_branch_problem`), in ``src`` or in ``dst``: nothing of
        that session is copied.

    Raises:
        StoreNotFound: ``src`` has no store.
        InvalidName: a bad name in ``sessions``.
        ObjectNotFound, IntegrityError: ``src`` is damaged.
        SealedFrameError: (an IntegrityError) the two stores have different codecs (an
            encrypted store and a plain one, or other keys or tenant): nothing is sent.
        TenantErased: ``sessions`` names a user (or an app) erased on either side; an
            erased tenant that was not named is skipped (``tenants_erased``).
        StorageError: a backend failed (what was sent stays; refs point only at complete
            histories, and pushing again sends only the rest).
    """
    return _sync(src, dst, sessions, force, progress, None)


def pull(src: Store, dst: Store, sessions: Selection = None, force: bool = False,
         progress: ProgressFn | None = None, remote_name: str = "origin") -> SyncReport:
    """Bring sessions from the remote ``src`` into the local ``dst``.

    Like :func:`push` in the other direction, except that a branch (or app/user state)
    that moved on both sides is not refused: the remote tip is kept in the local store as
    ``remotes/<remote_name>/<branch>`` (listed in ``refs_kept_as_remote``) and the local
    branch is left as it was. A branch where the local side is ahead is left alone.
    With ``force``, local refs are overwritten by the remote ones instead.

    Raises:
        see :func:`push`.
    """
    check_remote_name(remote_name)
    return _sync(src, dst, sessions, force, progress, remote_name)


def clone(url: str, dest: str, selection: Selection = None, *, remote_name: str = "origin",
          progress: ProgressFn | None = None, master_key: Any = None, **options: Any) -> SyncReport:
    """Create a store at ``dest`` holding the selected sessions of the store at ``url``.

    ``url`` is recorded as remote ``remote_name`` (with ``options``) in the new store. The
    copy of an encrypted store is encrypted with the same keys (``master_key``: as
    :meth:`Store.open <castore.store.Store.open>` takes it; never recorded).

    Raises:
        CastoreError: ``dest`` already holds a store.
        StoreNotFound: there is no store at ``url``.
        WrongKey, KeyMissing: ``url`` is encrypted and ``master_key`` does not open it.
        StorageError, FormatError, InvalidName.
    """
    with Store.open(url, master_key=master_key, **options) as remote:
        remote.require()
        local = Store.open(dest, format=remote.objects.format, layout=remote.layout, master_key=master_key)
        if local.exists:
            raise CastoreError(f"{local.url} already holds a castore store; pull into it instead")
        with local:
            local.init(like=remote)
            add_remote(local, remote_name, url, options)
            return pull(remote, local, selection, progress=progress, remote_name=remote_name)


# -- both ways ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Diverged:
    """A ref that moved on both sides since they last matched: left as it was on both.

    Attributes:
        ref: the stored ref name (``sessions/<app>/<user>/<session>/heads/<branch>``...).
        kind: ``branch``, ``label``, ``app-state`` or ``user-state``.
        session: ``(app, user, session)`` for a session's ref, else None.
        app, user: the app (and user) the ref belongs to (``user`` None for app state).
        name: the branch or label name (None for app/user state).
        local, remote: the two tips.
        kept_as: the revision under which the local store keeps the remote tip
            (``remotes/<remote>/<branch>``), when the pull kept it; None otherwise.
    """

    ref: str
    kind: str
    session: tuple[str, str, str] | None
    app: str
    user: str | None
    name: str | None
    local: str | None
    remote: str | None
    kept_as: str | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {"ref": self.ref, "kind": self.kind, "session": list(self.session) if self.session else None,
                "app": self.app, "user": self.user, "name": self.name, "local": self.local,
                "remote": self.remote, "kept_as": self.kept_as}


@dataclass
class BothWaysReport:
    """What :func:`both_ways` did: the pull's report, the push's, and what diverged.

    Attributes:
        remote: the remote's name.
        pulled: the pull's report (empty when the remote held no store yet).
        pushed: the push's report.
        diverged: the refs that moved on both sides, one each, never overwritten.
        remote_created: the remote held no store: this sync made it.
    """

    remote: str
    pulled: SyncReport
    pushed: SyncReport
    diverged: list[Diverged] = field(default_factory=list)
    remote_created: bool = False

    @property
    def refused(self) -> list[Refusal]:
        """Refusals that are not divergences (a ref that moved during the sync, a commit missing)."""
        mine = {d.ref for d in self.diverged}  # (a session refused by both halves: once)
        return list({(r.ref, r.reason): r for r in (*self.pulled.refs_refused, *self.pushed.refs_refused)
                     if r.ref not in mine}.values())

    @property
    def ok(self) -> bool:
        """True when nothing diverged and nothing was refused: both sides now match."""
        return not self.diverged and not self.refused

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {"remote": self.remote, "remote_created": self.remote_created, "ok": self.ok,
                "pulled": self.pulled.to_dict(), "pushed": self.pushed.to_dict(),
                "diverged": [d.to_dict() for d in self.diverged],
                "refused": [r._asdict() for r in self.refused]}


def both_ways(local: Store, remote: Store, sessions: Selection = None, *, remote_name: str = "origin",
              progress: ProgressFn | None = None) -> BothWaysReport:
    """Pull then push: afterwards both stores hold every selected session, where nothing diverged.

    Each side's new commits reach the other by fast-forward. A branch that moved on both
    sides is overwritten on neither: the pull keeps the remote tip locally as
    ``remotes/<remote_name>/<branch>`` and the push refuses the branch; it is listed once
    in ``diverged``. A remote without a store is created by the push; a local store
    without one is created by the pull.

    Args:
        local: this machine's store.
        remote: the shared store (an S3 bucket, another folder).
        sessions: as :func:`push` (default: every session, with app and user state).
        remote_name: the name the local store knows the remote by.
        progress: as :func:`push`, called through both halves.

    Raises:
        StoreNotFound: neither side holds a store.
        InvalidName, ObjectNotFound, IntegrityError, StorageError: as :func:`push` and :func:`pull`.
    """
    created = not remote.exists
    pulled = SyncReport() if created else pull(remote, local, sessions, progress=progress, remote_name=remote_name)
    pushed = push(local, remote, sessions, progress=progress)
    refused = {r.ref: r for r in (*pushed.refs_refused, *pulled.refs_refused) if r.reason.startswith(_NON_FF)}
    # Where this pull (or an earlier one) keeps the remote tip of a diverged branch.
    tracking = {ref: _tracking_ref(ref, remote_name) for ref in refused
                if (p := parse_ref_name(ref)) is not None and p.kind == "branch"}
    kept = {t: _home(local, t).refs.read(t) for t in tracking.values()}
    out = []
    for ref, r in refused.items():
        k = kept.get(tracking.get(ref, ""))
        out.append(_diverged(r, remote_name, k is not None and k.target == r.remote))
    return BothWaysReport(remote_name, pulled, pushed, out, created)


def _home(store: Store, ref: str) -> Store:
    """The store holding ``ref`` (a parsed name): its tenant's, in the tenant layout."""
    p = parse_ref_name(ref)
    return store if p is None else store.tenant_at(p.app, p.user or names.APP_SCOPE)


def _diverged(r: Refusal, remote_name: str, kept: bool) -> Diverged:
    p = parse_ref_name(r.ref)
    if p is None:  # only parsed names are planned
        return Diverged(r.ref, "ref", None, "", None, None, r.local, r.remote, None)
    app, user = real_name(p.app, None), real_name(p.user, None) if p.user else None
    sess = real_name(p.session, None) if p.session else None
    name = real_name(p.name, None) if p.name else None
    kept_as = f"{REMOTES}/{remote_name}/{name}" if kept and name is not None else None
    return Diverged(r.ref, p.kind, (app, user or "", sess) if sess is not None else None, app, user, name,
                    r.local, r.remote, kept_as)


__all__ = ["push", "pull", "clone", "both_ways", "BothWaysReport", "Diverged", "SyncReport", "SyncProgress", "Refusal",
           "add_remote", "remove_remote", "list_remotes", "open_remote", "describe", "BATCH"]
