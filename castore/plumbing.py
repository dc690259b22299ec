"""Plumbing: the one write path. Commit batches, read hints, ref moves, landing.

Every writer of castore (sessions, app and user state, sync, the adapters) goes through
this module to build commits on a tip and move a ref. The refs' names and their metadata
keys are :mod:`castore.refnames`'s. This module owns two things:

* **Building.** A :class:`Batch` builds commits on a tip (depth, segment index, state
  tree, read hint) and collects every object they need; :meth:`Plumbing.write` stores a
  batch with one call to the object store. A :class:`Tree` builds a session's new history
  run after run on batches it keeps, and moves its branches at once (a first import).
* **Landing.** :meth:`Plumbing.land` runs one compare-and-swap attempt until it wins, under
  a :class:`~castore.retry.RetryPolicy` (:mod:`castore.retry`, the one retry loop: jittered
  exponential backoff, a cap on attempts and on total time, then
  :class:`~castore.retry.RefContended`; a ref lock that cannot be taken is raised at once,
  not retried). The calls of several
  threads in flight together land as one group (one object write, one swap per ref):
  :mod:`castore.groupcommit`, beside this module.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from . import objects as o
from .entries import is_vouched, prepare, vouched_body
from .errors import (
    BranchError,
    CastoreError,
    CorruptRef,
    InvalidEntry,
    RefConflict,
    RefNotFound,
    SessionDeleting,
    StorageError,
)
from .history import NO_BODY, Hint, History, K
from .objects import Blob, Commit, ObjectId, Value
from .objectstore import ObjectStore
from .refnames import (
    META_BORN,
    META_LENGTH,
    META_TIME,
    REFLOG_KIND,
    SessionRefs,
    carried_meta,
    deleting_since,
    name_meta,
)
from .refs import RefStore, RefValue
from .retry import DEFAULT_RETRY, RefContended, RetryPolicy, retry
from .state import StateWriter

if TYPE_CHECKING:  # a store that redacts sets one (castore.store imports the redactor then)
    from .redact import Redactor

T = TypeVar("T")


#: how many refs a :class:`Plumbing` keeps the last written value of (least recently used
#: go first; a ref not kept costs one read before its next write)
KEPT_REFS = 4096



def tip_meta(hint: Hint, when: float, depth: int, codec: o.Codec | None = None, **extra: Any) -> dict[str, Any]:
    """The metadata of a ref naming a commit at ``depth``: its read hint (what is not to be
    read in clear sealed by ``codec``), the time and the path length (what
    ``store.sessions()`` lists without reading history), and ``extra``."""
    return {**hint.to_meta(codec), META_TIME: when, META_LENGTH: depth + 1, **extra}


class NoSuchRef(BranchError, RefNotFound):
    """A branch or label asked for by name does not exist (a :class:`BranchError` and a
    :class:`~castore.errors.RefNotFound`, whose ``ref`` is the missing ref's name)."""

    def __init__(self, ref: str, message: str) -> None:
        CastoreError.__init__(self, message)
        self.ref = ref

    def __str__(self) -> str:
        return str(self.args[0])


# -- building commits -----------------------------------------------------------------------------
Make = Callable[[tuple[bytes, ...], int, "bytes | None"], Commit]


class Batch:
    """Commits built on one tip and every object they need, not yet written.

    Each commit gets its parent (the previous tip), depth, segment index and, when it
    closes a block of :data:`~castore.history.K` commits, the block's segment and the next
    index. :meth:`Plumbing.write` stores everything in one call; :meth:`ref_meta` is the
    metadata for the ref that will name the new tip.
    """

    def __init__(self, plumbing: Plumbing, tip: str | None, hint: Hint | None = None,
                 extra: Mapping[ObjectId, bytes] | None = None) -> None:
        self.plumbing = plumbing
        self.objs = plumbing.objects
        self.history = plumbing.history
        self.pending: dict[ObjectId, bytes] = dict(extra or {})
        self.state_writer = StateWriter(self.objs)
        self.state_writer.pending = self.pending  # one batch: tree nodes go with the commits
        self.tip = tip
        self._tip_raw = o.raw_id(tip) if tip else None  # what the next commit names as its parent
        self.ids: list[ObjectId] = []
        self.last: Commit | None = None
        if tip is not None:
            parent = self.history.commit(tip)
            self.hint = hint if hint is not None else Hint()
            self.depth = parent.depth + 1
            self.state: bytes | None = parent.state
            self.scopes: dict[str, bytes] = dict(parent.scopes)
        else:
            self.hint, self.depth, self.state, self.scopes = Hint(), 0, None, {}

    def include(self, encoded: Mapping[str, bytes]) -> None:
        """Add objects already encoded elsewhere (an adapter's values) to the batch."""
        self.pending.update(cast(Mapping[ObjectId, bytes], encoded))

    def clean(self, obj: Any) -> Any:
        """``obj`` as this store keeps it: with the plumbing's :attr:`~Plumbing.redactor` set,
        a :class:`~castore.objects.Value` with its strings redacted and a text
        :class:`~castore.objects.Blob` with its bytes redacted (the one place where what a
        writer gives becomes what is stored: every entry body, state value and blob of every
        writer passes here); anything else as it is."""
        r = self.plumbing.redactor
        if r is None:
            return obj
        if isinstance(obj, Value):
            v = r.value(obj.value)
            return obj if v is obj.value else Value(v)
        if isinstance(obj, Blob):
            d = r.data(obj.data)
            return obj if d is obj.data else Blob(data=d)
        if isinstance(obj, dict):
            return r.value(obj)
        return obj

    def add(self, obj: Any) -> ObjectId:
        """Encode an object into the batch (redacted first: :meth:`clean`); return its id.

        Raises:
            InvalidEntry: it cannot be encoded.
        """
        return self._add(obj)[0]

    def _add(self, obj: Any) -> tuple[ObjectId, Any]:
        """:meth:`add`, and the object as it is stored (after :meth:`clean`)."""
        oid, _, kept = self._add_raw(obj)
        return oid, kept

    def _add_raw(self, obj: Any) -> tuple[ObjectId, bytes, Any]:
        """:meth:`_add`, with the id's raw bytes: ``(id, raw id, object as stored)``."""
        kept = self.clean(obj) if self.plumbing.redactor is not None else obj
        oid, raw, canonical = self.objs.codec.encode_raw(kept)
        self.pending[oid] = canonical
        return oid, raw, kept

    def commit(self, make: Make, body: Any = NO_BODY, typed: Any = None) -> ObjectId:
        """Add the commit ``make(parents, depth, index)`` on the batch's tip; return its id.
        ``body``: the value its body object holds, when the caller has it (not decoded again);
        ``typed``: the typed entry a reader rebuilds from the commit and that body, when the
        caller has it (not rebuilt for the path's facts).

        Raises:
            InvalidEntry: it cannot be encoded.
            ObjectNotFound, IntegrityError, StorageError: closing a block read the block.
        """
        tip = self._tip_raw
        index = self.hint.index
        commit = make((tip,) if tip is not None else (), self.depth, o.raw_id(index) if index else None)
        cid, raw, canonical = self.objs.codec.encode_raw(commit)
        self.pending[cid] = canonical
        self.objs.cache(cid, commit)
        self.hint, extra = self.history.advance(self.hint, cid, commit, self.pending, body, typed)
        if extra:  # (a block closed: its segment and index)
            self.pending.update(extra)
        self.ids.append(cid)
        self.tip, self._tip_raw, self.depth, self.last = cid, raw, self.depth + 1, commit
        self.state = commit.state
        if commit.scopes or self.scopes:
            self.scopes = dict(commit.scopes)
        return cid

    def entry(self, kind: str, body: Any, *, delta: Mapping[str, Any], unset: tuple[str, ...],
              author: str, when: float, meta: Mapping[str, Any],
              scopes: Mapping[str, bytes] | None = None, typed: Any = None) -> ObjectId:
        """Add a session entry: its body, its state change applied to the tip's tree.
        ``typed``: the entry ``body`` was taken from (:func:`~castore.entries.prepare`'s), used
        as the stored entry when the body is stored as given (not redacted).

        Raises:
            InvalidEntry: the body or a state value cannot be encoded.
            ObjectNotFound, IntegrityError, StorageError: the base tree could not be read.
        """
        value: Value | None = None
        body_id = None
        if body is not None:
            _, body_id, value = self._add_raw(Value(body))
        if self.plumbing.redactor is not None:
            delta_: dict[str, Any] = self.clean(dict(delta)) if delta else {}
            meta_: dict[str, Any] = self.clean(dict(meta))
        else:
            delta_, meta_ = dict(delta) if delta else {}, dict(meta)
        state = self.state_writer.apply(self.state, delta_, unset) if delta_ or unset else self.state
        merged = {**self.scopes, **scopes} if scopes else self.scopes

        def make(parents: tuple[bytes, ...], depth: int, index: bytes | None) -> Commit:
            return Commit(kind=kind, parents=parents, body=body_id, state=state, delta=delta_,
                          unset=tuple(unset), scopes=merged, author=author, time=when, meta=meta_,
                          depth=depth, index=index)

        stored = value.value if value is not None else None
        return self.commit(make, stored, typed if stored is body else None)

    def record(self, kind: str, *, state: bytes | None, author: str, when: float,
               meta: Mapping[str, Any]) -> ObjectId:
        """Add a commit of a writer's own ``kind`` (an adapter's checkpoint, its task writes):
        no body, the state tree ``state`` (its objects added with :meth:`include`), provenance.

        Raises:
            InvalidEntry: it cannot be encoded.
            ObjectNotFound, IntegrityError, StorageError: closing a block read the block.
        """
        def make(parents: tuple[bytes, ...], depth: int, index: bytes | None) -> Commit:
            return Commit(kind=kind, parents=parents, state=state, author=author, time=when, meta=dict(meta),
                          depth=depth, index=index)

        return self.commit(make)

    def again(self, commit: Commit, meta: Mapping[str, Any]) -> ObjectId:
        """Add ``commit`` again on the batch's tip (history rewritten: its kind, body, state,
        author and time), with ``meta``.

        Raises:
            InvalidEntry, ObjectNotFound, IntegrityError, StorageError: as :meth:`commit`.
        """
        def make(parents: tuple[bytes, ...], depth: int, index: bytes | None) -> Commit:
            return Commit(kind=commit.kind, parents=parents, body=commit.body, state=commit.state,
                          delta=commit.delta, unset=commit.unset, scopes=commit.scopes, author=commit.author,
                          time=commit.time, meta=dict(meta), depth=depth, index=index)

        return self.commit(make)

    def ref_meta(self, **extra: Any) -> dict[str, Any]:
        """Metadata for a ref naming the batch's tip: read hint, time, path length, ``extra``."""
        assert self.last is not None, "an empty batch names no tip"
        return tip_meta(self.hint, self.last.time, self.last.depth, self.objs.codec, **extra)

    def take(self) -> dict[ObjectId, bytes]:
        """Hand over the pending objects (the batch keeps building on its tip)."""
        out, self.pending = self.pending, {}
        self.state_writer.pending = self.pending
        return out


class Tree:
    """The commits of a session's new history, built in memory run after run and its refs
    moved at once (:meth:`publish`): a first import's write path, where each run of lines
    would otherwise be an append of its own (the tip read, a batch made, the ref staged).

    A run extends a commit this tree built (or starts the root): the run that continues a
    tip goes on in that tip's :class:`Batch` (its read hint kept, nothing read), one that
    forks from further back starts a batch there. Each commit is made by
    :meth:`Batch.entry`, the rule every append follows (same ids); the objects of a run go
    to the store when it ends (:meth:`Plumbing.write_many`: held in memory in a write
    batch, written before any ref at its landing). No ref names them before :meth:`publish`.

    Args:
        plumbing: the store's write path.
        refs: the session's ref names.
        first_head: what makes HEAD on a branch (by name) once the session's first branches
            landed, given that branch as landed (:func:`castore.deletion.first_commit_head`,
            the rule of every writer of a session's first branch).
    """

    def __init__(self, plumbing: Plumbing, refs: SessionRefs,
                 first_head: Callable[[str], Callable[[RefValue], RefValue | None]]) -> None:
        self.plumbing = plumbing
        self.refs = refs
        self._first_head = first_head
        self._on: dict[str, Batch] = {}  # tip -> the batch that built it (and goes on from it)
        self._published: dict[str, str] = {}  # branch -> the tip last published

    def run(self, parent: str | None) -> Batch:
        """The batch a run of commits on ``parent`` is built in (None: the root; else a commit
        of this tree): the one that built ``parent`` when it is a tip (its read hint kept,
        nothing read), else a new one there. The run's commits are made by :meth:`commit`
        and the run ended by :meth:`end`.

        Raises:
            ObjectNotFound, IntegrityError, StorageError: (a fork) reading the parent's block.
        """
        batch = self._on.pop(parent, None) if parent is not None else None
        return batch if batch is not None else self.plumbing.batch(parent)

    @staticmethod
    def commit(batch: Batch, entry: Any, when: float) -> ObjectId:
        """Build the commit of ``entry`` at ``when`` on ``batch``'s tip; return its id.

        A :func:`~castore.entries.vouched_event` is split by
        :func:`~castore.entries.vouched_body` and its commit built at once: the encode of its
        body and commit is the check that they can be stored (an entry that fails it adds no
        commit), not an encode of each beforehand as :func:`~castore.entries.prepare` does
        for an append, whose batch other writers may share. Any other entry is prepared.

        Raises:
            InvalidEntry: the entry cannot be stored, or it changes app or user state.
            ObjectNotFound, IntegrityError, StorageError: closing a block read the block.
        """
        if is_vouched(entry):
            return batch.entry("event", vouched_body(entry, when), delta={}, unset=(), author=entry.author,
                               when=when, meta=entry.meta, typed=entry)
        p = prepare(entry, at=when)
        if p.app_delta or p.app_unset or p.user_delta or p.user_unset:
            raise InvalidEntry("a tree's entries change no app or user state")
        return batch.entry(p.kind, p.body, delta=p.delta, unset=p.unset, author=p.author, when=when, meta=p.meta,
                           typed=p.entry)

    def end(self, batch: Batch) -> None:
        """End a run (:meth:`run`): its objects go to the store (:meth:`Plumbing.write_many`:
        held in memory in a write batch, written before any ref at its landing), and its
        batch goes on from its tip. No ref names them before :meth:`publish`.

        Raises:
            StorageError.
        """
        self.plumbing.write_many([batch])
        assert batch.tip is not None
        self._on[batch.tip] = batch

    def extend(self, parent: str | None, entries: Sequence[Any], times: Sequence[float]) -> list[ObjectId]:
        """Build a commit per entry on ``parent`` (None: the root; else a commit of this
        tree), each on the one before, entry ``i`` at ``times[i]``, as one run (:meth:`run`,
        :meth:`commit`, :meth:`end`); return their ids.

        Raises:
            InvalidEntry: an entry cannot be encoded, or it changes app or user state (nothing
                of the run is written; the commits before it in the run stay in memory, named
                by no ref).
            ObjectNotFound, IntegrityError, StorageError: (a fork) reading the parent's block.
        """
        batch = self.run(parent)
        ids = [self.commit(batch, e, when) for e, when in zip(entries, times, strict=True)]
        self.end(batch)
        return ids

    def publish(self, branches: Mapping[str, str], head: str | None = None) -> None:
        """Move every branch of ``branches`` (name -> a tip this tree built) whose tip is not
        the one it last published, from that one (a branch not published yet must not
        exist), all at once (:meth:`Plumbing.swap_many`); then, with ``head``, make HEAD on
        that branch (left as it is when another writer made it first), as a first append does.

        Raises:
            RefConflict: a branch moved (or was made) by another writer; the others moved. Or
                the session was deleted whole between the branches' move and HEAD's (HEAD would
                name a branch gone: it is deleted again; a new attempt starts the session anew).
            SessionDeleting: HEAD was found marked by a deletion under way or interrupted (the
                branch HEAD was to name is deleted again).
            KeyError: a tip this tree did not build. InvalidName, RefLocked, StorageError.
        """
        moves: list[tuple[str, str, RefValue | None, Mapping[str, Any]]] = []
        names_ = []
        for name, tip in branches.items():
            last = self._published.get(name)
            if last == tip:
                continue
            ref = self.refs.branch(name)
            expect = self.plumbing.read_for_write(ref) if last is not None else None
            if last is not None and (expect is None or expect.target != last):
                raise RefConflict(ref, last, expect.target if expect is not None else None)
            moves.append((ref, tip, expect, self._on[tip].ref_meta(**name_meta(ref, name))))
            names_.append(name)
        lost = None
        landed: dict[str, RefValue] = {}
        for name, (_, tip, _, _), new in zip(names_, moves, self.plumbing.swap_many(moves) if moves else [],
                                            strict=True):
            if isinstance(new, Exception):
                lost = lost or new
            else:
                self._published[name], landed[name] = tip, new
        if lost is not None:
            raise lost
        if head is None:
            return
        on = landed.get(head) or self.plumbing.refs.read(self.refs.branch(head))
        if on is None:
            raise RefConflict(self.refs.branch(head), self._published.pop(head, None), None)
        try:
            self._first_head(head)(on)
        except SessionDeleting as e:
            if not e.finished:
                raise
            # a deletion ran whole since the branches moved: a lost race, which a new attempt
            # (the import's retry) takes up by starting the session anew
            raise RefConflict(on.name, self._published.pop(head, None), None) from e


class Plumbing:
    """The write path over one store's objects and refs; see the module docstring.

    Args:
        objects, refs, history: the store's layers.
        policy: the default :class:`RetryPolicy` of every landing.
    """

    def __init__(self, objects: ObjectStore, refs: RefStore, history: History,
                 policy: RetryPolicy = DEFAULT_RETRY) -> None:
        self.objects = objects
        self.refs = refs
        self.history = history
        self.policy = policy
        #: when set, every entry body, state value, entry metadata and text blob written
        #: through a :class:`Batch` is redacted first (:meth:`Batch.clean`)
        self.redactor: Redactor | None = None
        # ref -> the value this handle last wrote (or read to write on): see read_for_write
        self._kept: OrderedDict[str, RefValue] = OrderedDict()
        self._kept_lock = threading.Lock()

    # -- the refs this handle wrote ----------------------------------------------------------
    def read_for_write(self, ref: str, fresh: bool = False) -> RefValue | None:
        """The value of ``ref`` to build a write on, with no request when this handle kept it.

        The value kept is the one this handle's last :meth:`swap` of ``ref`` wrote (or the
        last one read here). A steady-state writer so moves a ref with one conditional
        write and no read before it (on S3: If-Match the ETag of its own last write). Nothing
        is weakened: the compare-and-swap still checks the kept token against the ref as it
        is, a lost one makes :meth:`swap` forget the value, and the retry of the landing
        reads afresh (``fresh=True``, or simply because nothing is kept any more).

        Raises:
            IntegrityError: the ref file is garbage. StorageError.
        """
        if not fresh:
            with self._kept_lock:
                kept = self._kept.get(ref)
                if kept is not None:
                    self._kept.move_to_end(ref)
            if kept is not None:
                return kept
        value = self.refs.read(ref)
        self._keep(ref, value)
        return value

    def _keep(self, ref: str, value: RefValue | None) -> None:
        with self._kept_lock:
            if value is None or value.token is None:
                self._kept.pop(ref, None)
            else:
                self._kept[ref] = value
                self._kept.move_to_end(ref)
                while len(self._kept) > KEPT_REFS:  # a handle writing many sessions: memory stays bounded
                    self._kept.popitem(last=False)

    def forget(self, ref: str | None = None) -> None:
        """Drop the kept value of ``ref`` (of every ref when None): the next write reads it."""
        with self._kept_lock:
            if ref is None:
                self._kept.clear()
            else:
                self._kept.pop(ref, None)

    def touch(self, ref: str, policy: RetryPolicy | None = None) -> None:
        """Rewrite ``ref`` as it is (same target and metadata, a new write id), so that any
        handle that kept its value (:meth:`read_for_write`) loses its next compare-and-swap
        and reads again. Called after HEAD left the branch ``ref``: a writer that kept
        HEAD's old value learns of the move at its next append. Retried until it lands (a
        rival's write meanwhile may be one that kept the old HEAD). A missing ref or a
        symbolic one is left alone.

        Raises:
            RefContended, RefLocked, StorageError.
        """
        def attempt(_n: int) -> None:
            cur = self.refs.read(ref)
            if cur is None or cur.symbolic is not None:
                return
            self.swap(ref, cur.target, cur, carried_meta(cur))

        self.land(ref, attempt, policy)

    # -- hints -----------------------------------------------------------------------------
    def hint(self, tip: str, tipref: RefValue | None) -> tuple[Hint, dict[ObjectId, bytes]]:
        """The read hint for extending ``tip``: the ref's own when it fits the tip's commit
        (right block length, last id, index), else rebuilt from the tip's block.

        Also returns objects to write (a rebuilt segment and index when the tip closes a block).

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        hint = Hint.from_meta(tipref.meta, self.objects.codec) if tipref is not None and tipref.target == tip else None
        if hint is not None:
            c = self.history.commit(tip)
            ix = o.hex_id(c.index) if c.index else None
            if hint.tail and hint.tail[-1] == tip and len(hint.tail) == c.depth % K + 1 and hint.index == ix:
                return hint, {}
            if not hint.tail and (c.depth + 1) % K == 0 and hint.index:
                return hint, {}
        return self.history.hint_for(tip)

    def hint_at(self, cid: str, tips: Iterable[tuple[str, Hint | None]]) -> tuple[Hint, dict[ObjectId, bytes]]:
        """The read hint for a new ref at ``cid``, reading its path through a tip that reaches it.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        return self.history.hint_at(cid, list(tips))

    def ref_meta_at(self, cid: str, tips: Iterable[tuple[str, Hint | None]] = (),
                    tipref: RefValue | None = None, **extra: Any) -> dict[str, Any]:
        """Metadata for a new ref at the existing commit ``cid`` (hint, time, length, ``extra``);
        writes the segment and index a hint may need first.

        The time is the commit's own, as an append stamps it (:meth:`Batch.ref_meta`), never
        the time the ref moved: ``store.sessions()`` lists a session by its newest entry, the
        same whenever an importer moved a branch onto a commit it had written.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        if tipref is not None and tipref.target == cid:
            hint, objs = self.hint(cid, tipref)
        else:
            hint, objs = self.hint_at(cid, tips)
        self.write(objs)
        c = self.history.commit(cid)
        return tip_meta(hint, c.time, c.depth, self.objects.codec, **extra)

    # -- batches ---------------------------------------------------------------------------
    def batch(self, tip: str | None, tipref: RefValue | None = None, hint: Hint | None = None) -> Batch:
        """A new batch of commits on ``tip`` (None: a root), its hint checked against ``tipref``;
        ``hint``: the tip's read hint when the writer knows it (it wrote the tip: no check).

        Raises:
            ObjectNotFound, IntegrityError, StorageError: reading the tip failed.
        """
        if tip is None:
            return Batch(self, None)
        if hint is not None:
            return Batch(self, tip, hint)
        hint, extra = self.hint(tip, tipref)
        return Batch(self, tip, hint, extra)

    def write(self, pending: Mapping[ObjectId, bytes] | Batch) -> int:
        """Store a batch's objects (or ``(id, bytes)`` pairs) with one call; return bytes written.

        The packs a batch's objects went into are added to its read hint (``pk``), so a
        cold reader of the ref loads them without listing ``packs/`` (docs/FORMAT.md, 6).

        Raises:
            StorageError: the backend failed.
        """
        if isinstance(pending, Batch):
            return self.write_many([pending])
        return self.objects.put_encoded(pending.items()) if pending else 0

    def write_many(self, batches: Sequence[Batch]) -> int:
        """Store the objects of several batches with one call (one pack record, one sync: a
        group commit of appends to several refs); return bytes written. Each batch's read
        hint names the packs the objects went into, as :meth:`write` does for one.

        Raises:
            StorageError: the backend failed (no ref may move to these batches).
        """
        items: dict[ObjectId, bytes] = {}
        for b in batches:
            items.update(b.take())
        if not items:
            return 0
        self.objects.written_packs()  # drop names from writes outside batches (sync, repack)
        # format 3: the record is synced by the intent of the swap that names it (one
        # fdatasync per append, docs/FORMAT.md 12)
        n = self.objects.put_encoded(items.items(), sync=not self.objects.defers_refs)
        # the ref naming a batch's tip names the packs its tail is in (read hint "pk")
        written = self.objects.written_packs()
        for b in batches:
            b.hint = b.hint.with_packs(written, self.objects.live_packs)
        return n

    def mark_born(self, refs: SessionRefs, branch: str) -> RefValue | None:
        """Put the born mark (:data:`META_BORN`) on the HEAD of ``refs``, made by ``set_info``
        before the first commit on ``branch`` landed, unless it has it or names another branch by
        then; a rival's write of HEAD meanwhile (a ``set_info``) is read and the mark added to it.
        HEAD moving for longer, or naming no branch, leaves it without the mark (the session is
        then judged as a HEAD written before the mark existed), as does HEAD's deleting mark (the
        caller decides: :class:`castore.Session` takes its commit back).

        Returns:
            HEAD as last read or written (None: there is none).

        Raises:
            StorageError.
        """

        def attempt(_: int) -> RefValue | None:
            head = self.refs.read(refs.head)
            if head is None or head.meta.get(META_BORN) or deleting_since(head) is not None \
                    or head.symbolic is None or refs.branch_ref_of(head) != branch:
                return head  # marked, on another branch (whatever put it there marked it), or deleting
            return self.swap(refs.head, head.target, head, {**carried_meta(head), META_BORN: True})

        try:
            return self.land(refs.head, attempt)
        except (RefContended, CorruptRef):
            return self.refs.read(refs.head)

    # -- the reflog ------------------------------------------------------------------------
    def record_move(self, refs: SessionRefs, ref: str, old: str, new: str | None, why: str,
                    policy: RetryPolicy | None = None) -> ObjectId:
        """Record that ``ref`` moved from ``old`` to ``new`` (None: deleted) in the session's
        reflog, keeping ``old`` reachable (``gc`` keeps it; ``castore reflog`` lists it).

        A reflog entry is a commit of kind ``reflog`` on the reflog chain whose second parent
        is the overwritten tip. Only moves that overwrite history are recorded (forced
        branch moves, resets, forced pulls and pushes): a normal append costs nothing more.

        Raises:
            RefContended, RefLocked, StorageError.
        """
        when = time.time()
        meta = {"ref": ref, "old": old, "new": new, "why": why}

        def attempt(_n: int) -> ObjectId:
            cur = self.refs.read(refs.reflog)
            batch = self.batch(cur.target if cur else None, cur)
            if cur is None:  # a root, so that every entry's first parent is the entry before
                batch.commit(lambda parents, depth, index: Commit(kind=REFLOG_KIND, time=when, depth=depth))

            def make(parents: tuple[bytes, ...], depth: int, index: bytes | None) -> Commit:
                return Commit(kind=REFLOG_KIND, parents=(*parents, o.raw_id(old)), time=when, meta=meta,
                              depth=depth, index=index)

            cid = batch.commit(make)
            self.write(batch)
            self.swap(refs.reflog, cid, cur, batch.ref_meta())
            return cid

        return self.land(refs.reflog, attempt, policy)

    def expire_reflog(self, refs: SessionRefs, cutoff: float, dry_run: bool = False,
                      policy: RetryPolicy | None = None) -> int:
        """Drop the session's reflog entries recorded before the POSIX time ``cutoff`` (git's
        ``reflog expire``): the entries kept are written again as a new chain (same times,
        moves and overwritten tips) and the reflog ref is swapped to it, or deleted when none
        is kept, by compare-and-swap (a move recorded meanwhile makes it look again). What
        only the dropped entries kept becomes unreachable, for ``gc``. Returns how many
        entries were (with ``dry_run``: would be) dropped.

        Raises:
            RefContended, RefLocked, ObjectNotFound, IntegrityError, StorageError.
        """
        def attempt(_n: int) -> int:
            cur = self.refs.read(refs.reflog)
            if cur is None:
                return 0
            entries = [c for _, c in self.reflog(refs)]
            keep = [c for c in entries if c.time is not None and c.time >= cutoff]
            if dry_run or len(keep) == len(entries):
                return len(entries) - len(keep)
            if not keep:
                self.delete(refs.reflog, cur)
                return len(entries)
            batch = self.batch(None)
            first = keep[-1].time
            batch.commit(lambda parents, depth, index: Commit(kind=REFLOG_KIND, time=first, depth=depth))
            for c in reversed(keep):  # oldest first, each on the one before
                def make(parents: tuple[bytes, ...], depth: int, index: bytes | None, c: Commit = c) -> Commit:
                    return Commit(kind=REFLOG_KIND, parents=(*parents, c.parents[1]), time=c.time, meta=c.meta,
                                  depth=depth, index=index)
                cid = batch.commit(make)
            self.write(batch)
            self.swap(refs.reflog, cid, cur, batch.ref_meta())
            return len(entries) - len(keep)

        return self.land(refs.reflog, attempt, policy)

    def reflog(self, refs: SessionRefs, limit: int | None = None) -> list[tuple[ObjectId, Commit]]:
        """The session's recorded ref moves, newest first (see :meth:`record_move`).

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        cur = self.refs.read(refs.reflog)
        if cur is None:
            return []
        path = self.history.path(cur.target, Hint.from_meta(cur.meta))
        out = [(ObjectId(cid), c) for cid, c in reversed(path) if c.kind == REFLOG_KIND and len(c.parents) > 1]
        return out[:limit] if limit else out

    # -- landing ---------------------------------------------------------------------------
    def land(self, what: str, attempt: Callable[[int], T], policy: RetryPolicy | None = None,
             final: Callable[[RefConflict], bool] | None = None,
             give_up: Callable[[int, float], Exception] | None = None) -> T:
        """Run ``attempt`` under the retry policy; see :func:`retry`.

        Raises:
            RefContended, RefLocked, and what ``attempt`` raises.
        """
        return retry(what, attempt, policy or self.policy, final, give_up)

    def swap(self, ref: str, target: str, expect: RefValue | None, meta: Mapping[str, Any]) -> RefValue:
        """One compare-and-swap of ``ref`` (the only ref move of castore's writers).

        The value written is kept for this handle's next write (:meth:`read_for_write`);
        a lost swap, or one whose outcome is unknown, forgets it. On local disk in format 3
        the swap's intent goes into this handle's log with the batch's objects, synced
        once, and the ref is renamed into place unsynced (docs/FORMAT.md, 12).

        Raises:
            RefConflict: ``ref`` no longer holds ``expect``.
            InvalidEntry: a bad target. StorageError.
        """
        journal = self.objects.journal if self.objects.defers_refs else None
        try:
            new = self.refs.swap(ref, target, expect, meta, journal)
        except (RefConflict, StorageError):
            self.forget(ref)
            raise
        finally:
            if journal is not None:
                self.objects.settle()
        self._keep(ref, new)
        return new

    def swap_many(self, moves: Sequence[tuple[str, str, RefValue | None, Mapping[str, Any]]]
                  ) -> list[RefValue | Exception]:
        """:meth:`swap` each ``(ref, target, expect, meta)`` (distinct refs) at once: on local
        disk in format 3 every ref is locked and compared, their intents go into this
        handle's log with one sync, then each is written (docs/FORMAT.md, 12). Returns per
        move, in order, the new value or what :meth:`swap` would have raised for it alone
        (``RefConflict``, ``StorageError``; the others land regardless).

        Raises:
            InvalidEntry: a bad target (nothing moved). RefLocked, StorageError: the
                backend failed before any ref moved.
        """
        journal = self.objects.journal_many if self.objects.defers_refs else None
        try:
            out = self.refs.swap_many(moves, journal)
        except (RefConflict, StorageError):
            for ref, *_ in moves:
                self.forget(ref)
            raise
        finally:
            if journal is not None:
                self.objects.settle()
        for (ref, *_), new in zip(moves, out, strict=True):
            self._keep(ref, None if isinstance(new, Exception) else new)
        return out

    def set(self, ref: str, target: str, meta_for: Callable[[RefValue | None], Mapping[str, Any]],
            policy: RetryPolicy | None = None, keep: Iterable[str] = ()) -> RefValue:
        """Move ``ref`` to ``target`` whatever it holds now (re-read on each lost race).

        Args:
            meta_for: the metadata to write, given the current value.
            keep: metadata keys of the current value to carry over.

        Raises:
            RefContended, RefLocked, InvalidEntry, StorageError.
        """
        def attempt(_: int) -> RefValue:
            cur = self.refs.read(ref)
            meta = dict(meta_for(cur))
            if cur is not None:
                meta.update({k: cur.meta[k] for k in keep if k in cur.meta and k not in meta})
            return self.swap(ref, target, cur, meta)

        return self.land(ref, attempt, policy)

    def delete(self, ref: str, expect: RefValue | None = None) -> None:
        """Delete ``ref`` (only if it still holds ``expect``, when given).

        Raises:
            RefConflict: it changed since ``expect`` was read. StorageError.
        """
        self.forget(ref)
        self.refs.delete(ref, expect)


__all__ = [
    "Batch",
    "NoSuchRef",
    "Plumbing",
    "Tree",
    "tip_meta",
]
