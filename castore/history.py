"""Reading paths of the commit DAG in a few round trips, and parsing revisions.

Walking parents one commit at a time costs one dependent read per commit: fine on local
disk, slow on S3. So every :data:`K` commits along a path the writer also stores a
:class:`~castore.objects.Segment` (those K commits and their bodies, as canonical bytes)
and an :class:`~castore.objects.Index` listing the path's segments from the root. Each
commit names the index that covers its path below its own block; the branch ref carries a
*hint* (that index and the ids of the commits of the current, unfinished block). Reading a
path is then: the ref, the index and the tail commits at once, the segments at once, the
bodies at once, whatever the path's length. Hints are checked against the parent links
and ignored when they do not fit, so a stale or missing hint only costs speed.

A reader of most of a store's paths may decode every stored commit in one pass over the
packs first (:meth:`History.load_commits`); a path read without a hint is then walked
through the decoded commits by its parent links, with no read at all. (``castore usage``'s
first run keeps the commits of such a pass itself and walks them the same way:
:func:`castore.usage.load_commits`.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import objects as o
from .entries import Record, entry_from
from .errors import CastoreError, IntegrityError, ObjectNotFound, RevisionNotFound, SealedFrameError
from .gcpause import gc_paused
from .objects import Commit, Index, ObjectId, Segment
from .objectstore import ObjectStore
from .objectstore import packs as pk
from .pathfacts import PathFacts

_new = object.__new__

#: commits per segment
K = 64
#: bodies larger than this are not copied into segments (they are read on their own)
SEGMENT_BODY_MAX = 16384
#: at most this many pack names in a hint (one per append of the tail, and the index's)
MAX_HINT_PACKS = K + 1
#: the read hint's keys in ref metadata: the tail's commit ids, the segment index below them,
#: the packs that hold them (format 2), and the facts about the path (sealed in an encrypted store)
HINT_TAIL = "tl"
HINT_INDEX = "ix"
HINT_PACKS = "pk"
HINT_FACTS = "cx"

_ID_LENGTH = {64}
#: what :meth:`History.advance` is given for a commit's body when its caller does not have it
NO_BODY: Any = object()
#: the commit kinds whose entries can contribute a message or set the model (PathFacts)
_FACT_KINDS = frozenset({"message", "event", "branch_summary", "model_change", "compaction"})


def _all_hex_ids(items: list[Any]) -> bool:
    """Whether every item is a full 64-character lowercase hex id (:func:`objects.is_hex_id`
    of each, checked in C over their join: a writer checks its hint's tail, up to K ids, at
    every append)."""
    try:
        joined = "".join(items)  # TypeError: not all strings
        raw = bytes.fromhex(joined)  # ValueError: not hex
    except (TypeError, ValueError):
        return False
    # fromhex also takes upper case and skips whitespace: neither is in an id
    return len(raw) * 2 == len(joined) and joined == joined.lower() and set(map(len, items)) <= _ID_LENGTH


@dataclass(repr=False, eq=False)
class Hint(Record):
    """What a reader of the path ending at a tip needs besides the tip: see the module doc.

    ``packs`` (``pk`` in the metadata, format 2) names the packs that hold the tail's
    commits and the index, oldest first: a cold reader loads exactly those instead of
    listing ``packs/`` (docs/FORMAT.md, 6). It is only a hint too: a pack repacked away
    since costs the listing it saves.
    """

    index: str | None = None
    tail: list[str] = field(default_factory=list)
    packs: list[str] = field(default_factory=list)
    #: what a budgeted context needs to know about the whole path (``cx``: see
    #: :class:`~castore.context.PathFacts`); None when not known
    facts: PathFacts | None = None
    __hash__ = None  # type: ignore[assignment]  # mutable, as a dataclass with eq: not hashable

    def to_meta(self, codec: o.Codec | None = None) -> dict[str, Any]:
        """The hint as ref metadata; ``codec`` (an encrypted store's) seals the facts, which
        name the session's model, provider and thinking level (:meth:`Codec.seal_meta
        <castore.objects.Codec.seal_meta>`)."""
        d: dict[str, Any] = {HINT_TAIL: list(self.tail)}
        if self.index:
            d[HINT_INDEX] = self.index
        if self.packs:
            d[HINT_PACKS] = list(self.packs[-MAX_HINT_PACKS:])
        facts = self.facts.to_meta() if self.facts is not None else None
        if facts is not None:
            d[HINT_FACTS] = codec.seal_meta(facts, HINT_FACTS) if codec is not None else facts
        return d

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], codec: o.Codec | None = None) -> Hint | None:
        """Read a hint from ref metadata; None when absent or malformed. Sealed facts are
        opened with ``codec``; without it (or with another key) they are not known."""
        tail = meta.get(HINT_TAIL)
        ix = meta.get(HINT_INDEX)
        if not isinstance(tail, list) or not _all_hex_ids(tail):
            return None
        if ix is not None and not (isinstance(ix, str) and o.is_hex_id(ix)):
            return None
        names = meta.get(HINT_PACKS)
        if not isinstance(names, list) or not all(isinstance(n, str) and pk.is_pack_name(n) for n in names):
            names = []  # a bad pack list costs a listing, not the hint
        facts = meta.get(HINT_FACTS)
        if codec is not None:
            try:
                facts = codec.open_meta(facts, HINT_FACTS)
            except SealedFrameError:
                facts = None  # only a hint: a context finds the facts on its path
        return cls(ix, list(tail), list(names[-MAX_HINT_PACKS:]), PathFacts.from_meta(facts))

    def with_packs(self, names: Sequence[str],
                   live: Callable[[Sequence[str]], list[str]] | None = None) -> Hint:
        """This hint with ``names`` added to its packs (each once, oldest first); ``live``
        maps the whole list to the packs that hold those objects now (after a repack)."""
        out = [n for n in self.packs if n not in names] + list(dict.fromkeys(names))
        if live is not None:
            out = live(out)
        return Hint(self.index, list(self.tail), out[-MAX_HINT_PACKS:], self.facts)


def load_hinted(objs: ObjectStore, hint: Hint, want: Sequence[str], near: ObjectStore | None = None) -> None:
    """Load the packs ``hint`` names into ``objs`` when some of ``want`` is known neither
    there nor in ``near``, so that reading them lists no folder (a cold reader on S3).
    Missing packs (repacked away) are skipped: the reads then fall back to a listing.

    Raises:
        StorageError: the backend failed.
    """
    if hint.packs and not all(objs.knows(x) or (near is not None and near.knows(x)) for x in want):
        objs.load_packs(hint.packs)


class History:
    """Commit reading over an object store: single commits, whole paths, ancestry."""

    def __init__(self, objs: ObjectStore) -> None:
        self.objs = objs

    def commit(self, cid: str) -> Commit:
        """Read one commit.

        Raises:
            ObjectNotFound: no such object.
            RevisionNotFound: the object is not a commit.
            IntegrityError, StorageError.
        """
        obj = self.objs.get(cid)
        if not isinstance(obj, Commit):
            raise RevisionNotFound(cid, f"object is a {type(obj).__name__.lower()}, not a commit")
        return obj

    def commits(self, cids: Sequence[str]) -> dict[str, Commit]:
        """Read several commits in one batch.

        Raises:
            ObjectNotFound, IntegrityError, StorageError; RevisionNotFound for a non-commit.
        """
        out: dict[str, Commit] = {}
        for cid, obj in self.objs.get_many(cids).items():
            if not isinstance(obj, Commit):
                raise RevisionNotFound(cid, "not a commit")
            out[cid] = obj
        return out

    # -- paths -------------------------------------------------------------------------
    def path(self, tip: str, hint: Hint | None = None) -> list[tuple[str, Commit]]:
        """The first-parent path from the root to ``tip``, root first.

        Raises:
            ObjectNotFound: a commit on the path is missing.
            IntegrityError, StorageError.
        """
        # The collector is paused meanwhile: a long path allocates tens of thousands of
        # objects that all stay alive (gc_paused).
        with gc_paused():
            # A hint with no tail says the tip closed a block: its index ends with the tip.
            if hint is not None and ((hint.tail and hint.tail[-1] == tip) or (not hint.tail and hint.index)):
                got = self._path_from_hint(tip, hint)
                if got and got[-1][0] == tip:
                    return got
            return self._path_by_walking(tip)

    def load_hinted(self, hint: Hint, want: Sequence[str]) -> None:
        """Load the packs ``hint`` names when some of ``want`` is not known here yet, so that
        reading them lists no folder (a cold reader on S3). Missing packs are skipped.

        Raises:
            StorageError: the backend failed.
        """
        load_hinted(self.objs, hint, want)

    def _path_from_hint(self, tip: str, hint: Hint) -> list[tuple[str, Commit]] | None:
        want = list(hint.tail) + ([hint.index] if hint.index else [])
        self.load_hinted(hint, want)
        got = self.objs.get_many(want, missing_ok=True)
        tail = _commits(got, hint.tail)
        if tail is None:
            return None
        below: list[tuple[str, Commit]] = []
        if hint.index:
            idx = got.get(hint.index)
            if not isinstance(idx, Index):
                return None
            below = self._segments(idx)
        full = below + tail
        return full if is_chain(full) else None

    def load_commits(self) -> int:
        """Decode every stored commit in one store-wide pass
        (:meth:`~castore.objectstore.ObjectStore.load_all`), so that the paths read next are
        walked through decoded commits: no read per commit, no index, no segment. What a reader
        of most of a store's paths may call first; a reader of a few paths should not (the
        pass reads the whole store). Returns how many
        commits it decoded.

        Raises:
            StorageError: the backend failed.
        """
        return self.objs.load_all(Commit)

    def _path_by_walking(self, tip: str) -> list[tuple[str, Commit]]:
        """The path to ``tip`` by its parent links down to the first commit of the tip's block,
        and on while the parent is decoded already (:meth:`load_commits`: then the whole path,
        with no read), then the segments of the index that commit names; the slow, sure
        :meth:`walk` when they do not fit."""
        c = self.commit(tip)
        tail = [(tip, c)]
        decoded = self.objs.decoded
        while c.parents:
            pid = o.hex_id(c.parents[0])
            p = decoded(pid)
            if type(p) is not Commit:
                if c.depth % K == 0:
                    break  # the first commit of a block: the index it names holds the rest
                p = self.commit(pid)
            c = p
            tail.append((pid, c))
        tail.reverse()
        below: list[tuple[str, Commit]] = []
        if c.parents and c.index is not None:
            idx = self.objs.get(o.hex_id(c.index))
            if not isinstance(idx, Index):
                raise IntegrityError(o.hex_id(c.index), "expected an index")
            below = self._segments(idx)
        full = below + tail
        if not is_chain(full):
            # An index that does not fit its commit: fall back to the slow, sure walk.
            return self.walk(tip)
        return full

    def walk(self, tip: str) -> list[tuple[str, Commit]]:
        """The path root -> ``tip`` by its parent links, one read per commit.

        Raises:
            ObjectNotFound, StorageError; IntegrityError: a depth is not its parent's + 1.
        """
        out: list[tuple[str, Commit]] = []
        cid: str | None = tip
        while cid is not None:
            c = self.commit(cid)
            if out:
                check_depth(*out[-1], c)
            out.append((cid, c))
            cid = o.hex_id(c.parents[0]) if c.parents else None
        check_depth(*out[-1])
        out.reverse()
        return out

    def _segments(self, idx: Index) -> list[tuple[str, Commit]]:
        seg_ids = [o.hex_id(s) for s in idx.segments]
        segs = self.objs.get_many(seg_ids)
        held: list[bytes] = []
        for sid in seg_ids:
            seg = segs[sid]
            if not isinstance(seg, Segment):
                raise IntegrityError(sid, "expected a segment")
            held.extend(seg.objects)
        # one bulk adoption for the whole path: a Python loop per object is what reading costs
        return [pair for pair in self.objs.adopt_canonical_many(held)  # type: ignore[misc]  # the filter keeps commits
                if type(pair[1]) is Commit]

    def path_ids(self, tip: str, hint: Hint | None = None) -> list[str]:
        """Ids of the path root -> tip.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        return [cid for cid, _ in self.path(tip, hint)]

    def is_ancestor(self, a: str, b: str, hint: Hint | None = None) -> bool:
        """Whether commit ``a`` is on the first-parent path of ``b`` (or is ``b``).

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        if a == b:
            return True
        ca, cb = self.commit(a), self.commit(b)
        if ca.depth >= cb.depth:
            return False
        path = self.path(b, hint)
        return ca.depth < len(path) and path[ca.depth][0] == a

    def merge_base(self, a: str, b: str) -> str | None:
        """The deepest commit on both first-parent paths, or None (unrelated roots).

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        pa, pb = self.path_ids(a), self.path_ids(b)
        base = None
        for x, y in zip(pa, pb, strict=False):
            if x != y:
                break
            base = x
        return base

    # -- writing hints and segments ------------------------------------------------------
    def path_backwards(self, tip: str, hint: Hint | None, batch: int = 4) -> Iterator[list[tuple[str, Commit]]]:
        """Yield ever longer suffixes of the path root -> ``tip`` (each oldest first).

        The first suffix is the tip's unfinished block; each next one adds ``batch`` more
        segments, read in one round trip, so a reader that needs only the recent part of
        a long path (a context after a compaction) stops early. The last suffix yielded is
        the whole path. Without a usable hint, the whole path is the only suffix.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        usable = hint is not None and ((hint.tail and hint.tail[-1] == tip) or (not hint.tail and hint.index))
        if not usable:
            yield self.path(tip, hint)
            return
        assert hint is not None
        want = list(hint.tail) + ([hint.index] if hint.index else [])
        self.load_hinted(hint, want)
        got = self.objs.get_many(want, missing_ok=True)
        suffix = _commits(got, hint.tail)
        idx = got.get(hint.index) if hint.index else Index()
        if suffix is None or not isinstance(idx, Index) \
                or not is_chain(suffix, start=suffix[0][1].depth if suffix else 0):
            yield self.path(tip, hint)
            return
        segs = list(idx.segments)
        if suffix:
            yield suffix
        i = len(segs)
        while i > 0:
            j = max(0, i - batch)
            loaded = self._segments(Index(segments=tuple(segs[j:i])))
            # the new segments must be a chain that the suffix continues (checked where they
            # meet: the suffix was checked before, and a whole check per step is quadratic)
            meets = (suffix[0][1].parents[:1] == (o.raw_id(loaded[-1][0]),)) if suffix and loaded \
                else bool(loaded) and loaded[-1][0] == tip
            if not meets or not is_chain(loaded, start=j * K):
                yield self.path(tip, hint)
                return
            suffix = loaded + suffix
            i = j
            yield suffix

    def path_via(self, cid: str, tips: list[tuple[str, Hint | None]]) -> list[tuple[str, Commit]]:
        """The path root -> ``cid``, read as a prefix of a tip's path when one reaches it.

        Time travel usually targets a commit on some branch. That branch's tip has a hint,
        so its path costs a few batched reads; the commit's own path is then a prefix of
        it, instead of a walk of up to K-1 parents, one dependent read each (slow on S3).

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        c = self.commit(cid)
        for tip, hint in tips:
            if hint is None:
                continue
            if tip == cid:
                return self.path(tip, hint)
            p = self.path(tip, hint)
            if len(p) > c.depth and p[c.depth][0] == cid:
                return p[: c.depth + 1]
        return self.path(cid)

    def hint_from_path(self, path: list[tuple[str, Commit]]) -> tuple[Hint, dict[ObjectId, bytes]]:
        """The hint for a ref at the end of ``path`` (a full root -> tip path), without reads
        beyond what a closing block needs; also return objects to write (see :meth:`hint_for`).

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        return self._hint_from_block(path[(path[-1][1].depth // K) * K:])

    def _hint_from_block(self, block: list[tuple[str, Commit]]) -> tuple[Hint, dict[ObjectId, bytes]]:
        # block: the commits of a path from its tip's block start to the tip, checked as a chain
        tip, c = block[-1]
        first = block[0][1]
        hint = Hint(o.hex_id(first.index) if first.index else None, [x for x, _ in block[:-1]])
        return self.advance(hint, tip, c)

    def hint_at(self, cid: str, tips: Sequence[tuple[str, Hint | None]]) -> tuple[Hint, dict[ObjectId, bytes]]:
        """The hint for a new ref at the existing commit ``cid`` (a fork or a branch at the
        middle of a path); also return objects to write (see :meth:`hint_for`).

        Only ``cid``'s own block is read: through the first tip in ``tips`` whose path
        reaches ``cid``, that block is the tip's hint tail or one segment of the tip's index
        (:class:`BlockPath`: a few batched reads, checked link by link, whatever the path's
        length). With no such tip, ``cid``'s parents are walked back to its block's start.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        c = self.commit(cid)
        start = (c.depth // K) * K
        path = self.block_path_via(cid, c, tips)
        if path is not None:
            try:
                return self._hint_from_block(path.range(start, c.depth))
            except (ObjectNotFound, IntegrityError):
                pass  # the tip's path is damaged there: the walk below
        return self.hint_for(cid)

    def block_path_via(self, cid: str, c: Commit, tips: Sequence[tuple[str, Hint | None]]) -> BlockPath | None:
        """The :class:`BlockPath` of the first tip in ``tips`` whose path reaches commit
        ``cid`` (``c``), read through its hint (a few batched reads, whatever the path's
        length); None when none does (tips whose path is damaged are passed over).

        Raises:
            StorageError.
        """
        for tip, hint in tips:
            if hint is None:
                continue
            try:
                path = BlockPath(self.objs, tip, hint.to_meta())
                if path.depth >= c.depth and path.id_at(c.depth) == cid:
                    return path
            except (ObjectNotFound, IntegrityError):
                continue  # a tip whose path is damaged: another tip
        return None

    def hint_for(self, tip: str) -> tuple[Hint, dict[ObjectId, bytes]]:
        """Compute the hint for ``tip`` by reading its block; also return objects to write.

        When ``tip`` closes a block, the block's segment and the next index are rebuilt
        (content-addressed: identical to any earlier copy).

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        c = self.commit(tip)
        block_start = (c.depth // K) * K
        tail = [tip]
        cur = c
        while cur.depth > block_start and cur.parents:
            pid = o.hex_id(cur.parents[0])
            cur = self.commit(pid)
            tail.append(pid)
        tail.reverse()
        hint = Hint(o.hex_id(cur.index) if cur.index else None, tail[:-1])
        return self.advance(hint, tip, c)

    def advance(self, hint: Hint, cid: str, commit: Commit,
                pending: Mapping[ObjectId, bytes] | None = None,
                body: Any = NO_BODY, typed: Any = None) -> tuple[Hint, dict[ObjectId, bytes]]:
        """The hint after appending ``cid`` to the path ``hint`` describes.

        Returns the new hint and any segment and index objects to write (by id).
        ``pending`` holds canonical bytes not written yet (the block's new commits and
        bodies, when a batch closes a block): they are taken from there, not read.
        ``body``: the value of the commit's body object when the caller has it (its writer),
        which is then not decoded again; ``typed``: the typed entry a reader rebuilds from
        the commit and that body (:func:`~castore.entries.entry_from`), when the writer has it.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        tail = hint.tail + [cid]
        facts = self._facts_after(hint.facts if commit.depth else PathFacts(), cid, commit, pending, body, typed)
        if (commit.depth + 1) % K != 0:
            # the fields __init__ would set, once per commit built (a third of __init__'s cost)
            out = _new(Hint)
            out.__dict__.update(index=hint.index, tail=tail, packs=list(hint.packs) if hint.packs else [],
                                facts=facts)
            return out, {}
        # The block is full: pack it into a segment and extend the index.
        commits = self.commits(tail)
        bodies = [o.hex_id(c.body) for c in commits.values() if c.body is not None]
        wanted = tail + bodies
        canon = {k: pending[ObjectId(k)] for k in wanted if pending is not None and k in pending}
        rest = [k for k in wanted if k not in canon]
        if rest:
            canon.update(self.objs.get_canonical_many(rest))
        parts: list[bytes] = []
        for t in tail:
            parts.append(canon[t])
            b = commits[t].body
            if b is not None and len(canon[o.hex_id(b)]) <= SEGMENT_BODY_MAX:
                parts.append(canon[o.hex_id(b)])
        new: dict[ObjectId, bytes] = {}
        sid, sbytes = self.objs.codec.encode(Segment(start=commit.depth + 1 - K, objects=tuple(parts)))
        new[sid] = sbytes
        prev: tuple[bytes, ...] = ()
        if hint.index:
            idx = self.objs.get(hint.index)
            if not isinstance(idx, Index):
                raise IntegrityError(hint.index, "expected an index")
            prev = idx.segments
        index = Index(segments=prev + (o.raw_id(sid),))
        iid, ibytes = self.objs.codec.encode(index)
        new[iid] = ibytes
        # A batch that crosses two block boundaries reads this index before it is stored.
        self.objs.cache(iid, index)
        return Hint(iid, [], facts=facts), new

    def _facts_after(self, facts: PathFacts | None, cid: str, commit: Commit,
                     pending: Mapping[ObjectId, bytes] | None, body: Any = NO_BODY,
                     typed: Any = None) -> PathFacts | None:
        """The path facts once ``commit`` is appended (None: not known without reading the path)."""
        if facts is None or facts.depth != commit.depth - 1:
            return None
        if commit.kind not in _FACT_KINDS:
            return facts.after(None, commit.depth)  # contributes neither a message nor settings
        if typed is not None:
            return facts.after(typed, commit.depth)
        try:
            if body is NO_BODY:
                body = self._body_value(commit.body, pending)
            entry = entry_from(commit.kind, body, commit.author, commit.delta, commit.meta)
        except CastoreError:
            return None  # an entry a reader cannot type: it reads the whole path
        return facts.after(entry, commit.depth)

    def _body_value(self, raw: bytes | None, pending: Mapping[ObjectId, bytes] | None) -> Any:
        """The value of a commit's body object (None: no body, or not a value)."""
        if raw is None:
            return None
        bid = o.hex_id(raw)
        canon = pending.get(ObjectId(bid)) if pending is not None else None
        obj = o.decode(bid, canon) if canon is not None else self.objs.get(bid)
        return obj.value if isinstance(obj, o.Value) else None


class BlockPath:
    """The first-parent path ending at a tip, loaded lazily by depth, a block at a time.

    What sync needs to compare two stores' paths without reading either whole: the commit
    at any depth (a segment read per block), the segment of any block, containment and the
    merge depth (:func:`merge_depth`). The ref's hint is checked like any hint
    (:func:`hint_tail`) and ignored when it does not fit.

    Args:
        objs: the store the path is read from.
        tip: the path's last commit.
        meta: the metadata of a ref naming ``tip`` (its read hint), if any.
        near: a store to read first (on a pull, the local store already holds most of a
            remote path's commits, with the same ids and bytes).

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
    """

    def __init__(self, objs: ObjectStore, tip: str, meta: Mapping[str, Any] | None = None,
                 near: ObjectStore | None = None) -> None:
        self.objs = objs
        self.near = near
        self.tip = tip
        self.at_depth: dict[int, tuple[str, Commit]] = {}
        self.segments: Sequence[str] | None = None  # segment ids from the root, when known
        self.index_id: str | None = None  # the index those segments come from
        hint = Hint.from_meta(meta) if meta else None
        #: whether the ref's hint fitted the tip (and was used)
        self.hinted = True
        if hint is not None and hint.tail and hint.tail[-1] == tip and self._load_hint(hint):
            pass
        elif hint is not None and not hint.tail and hint.index and self._load_closed(hint):
            pass
        else:
            self.hinted = False
            self._load_by_walking()
        self.depth = max(self.at_depth)

    # loading the top block
    def _get_many(self, ids: list[str]) -> dict[str, Any]:
        got: dict[str, Any] = {}
        if self.near is not None:
            got = self.near.get_many(ids, missing_ok=True)
        rest = [i for i in ids if i not in got]
        if rest:
            got.update(self.objs.get_many(rest, missing_ok=True))
        return got

    def _load_hint(self, hint: Hint) -> bool:
        want = hint.tail + ([hint.index] if hint.index else [])
        load_hinted(self.objs, hint, want, self.near)
        got = self._get_many(want)
        tail = hint_tail(hint, got)
        if tail is None:
            return False
        idx = got.get(hint.index) if hint.index else None
        start = tail[0][1].depth
        # the tail's depth must be what the index below it holds (a root's: 0), or the
        # walk checks it commit by commit
        if (len(idx.segments) * K if isinstance(idx, Index) else 0) != start:
            return False
        for cid, c in tail:
            self.at_depth[c.depth] = (cid, c)
        self._use_index(hint.index, idx if isinstance(idx, Index) else None)
        return True

    def _load_closed(self, hint: Hint) -> bool:
        # A tip that closes a block: its ref hint names the index that holds its block.
        assert hint.index is not None
        index_id = hint.index
        load_hinted(self.objs, hint, [self.tip, index_id], self.near)
        got = self._get_many([self.tip, index_id])
        c, idx = got.get(self.tip), got.get(index_id)
        if not isinstance(c, Commit) or not isinstance(idx, Index) or (c.depth + 1) % K or \
                len(idx.segments) != (c.depth + 1) // K:
            return False
        self._use_index(index_id, idx)
        try:  # the hint is only a hint: check that its last segment ends at the tip
            self.load(c.depth, c.depth)
        except (IntegrityError, ObjectNotFound):
            self.at_depth.clear()
            return False
        if self.at_depth.get(c.depth, ("",))[0] != self.tip:
            self.at_depth.clear()
            return False
        return True

    def _load_by_walking(self) -> None:
        # Down to the first block start that names an index (the root, in a history
        # without one), each depth checked against the parent's: nothing is ever sized
        # by a depth a commit claims.
        cid = self.tip
        c = self._commit(cid)
        self.at_depth[c.depth] = (cid, c)
        while c.parents and (c.depth % K != 0 or c.index is None):
            cid, c = self._parent(cid, c)
        check_depth(cid, c)
        if c.index is not None and c.parents:
            iid = o.hex_id(c.index)
            idx = self._get_many([iid]).get(iid)
            if not isinstance(idx, Index):
                raise IntegrityError(iid, "expected an index")
            if len(idx.segments) * K != c.depth:
                raise IntegrityError(cid, f"claims depth {c.depth} but its index holds "
                                          f"{len(idx.segments) * K} commits below it")
            self._use_index(iid, idx)

    def _parent(self, cid: str, c: Commit) -> tuple[str, Commit]:
        """The first parent of ``cid``, recorded at its depth, checked to be ``c``'s - 1."""
        pid = o.hex_id(c.parents[0])
        p = self._commit(pid)
        check_depth(cid, c, p)
        self.at_depth[p.depth] = (pid, p)
        return pid, p

    def _use_index(self, iid: str | None, idx: Index | None) -> None:
        self.index_id = iid
        self.segments = _HexIds(idx.segments) if idx is not None else []

    def _commit(self, cid: str) -> Commit:
        c = self._get_many([cid]).get(cid)
        if c is None:
            raise self.objs.missing_error(cid)  # not found, or in a damaged pack record
        if not isinstance(c, Commit):
            raise IntegrityError(cid, "expected a commit")
        return c

    # reading
    def commit_at(self, d: int) -> tuple[str, Commit]:
        """The commit at depth ``d`` of this path."""
        if d not in self.at_depth:
            self.load(d, d)
        return self.at_depth[d]

    def id_at(self, d: int) -> str:
        """The commit id at depth ``d`` (0 <= d <= depth)."""
        return self.commit_at(d)[0]

    def load(self, lo: int, hi: int) -> None:
        """Make every commit at depths ``lo..hi`` available (few batched reads).

        Raises:
            ObjectNotFound: a segment or commit is missing. IntegrityError: a segment or
                commit is not what the path's layout says. StorageError.
        """
        missing = [d for d in range(max(lo, 0), hi + 1) if d not in self.at_depth]
        if not missing:
            return
        segs = self.segments or []
        blocks = sorted({d // K for d in missing})
        if blocks[-1] < len(segs):
            ids = [segs[b] for b in blocks]
            got = self._get_many(ids)
            for b, sid in zip(blocks, ids, strict=True):
                seg = got.get(sid)
                if seg is None:
                    raise self.objs.missing_error(sid)  # not found, or in a damaged pack record
                if not isinstance(seg, Segment) or seg.start != b * K:
                    raise IntegrityError(sid, f"expected the segment of commits {b * K}..{b * K + K - 1}")
                run = [(oid, c) for oid, c in self.objs.adopt_canonical_many(seg.objects) if isinstance(c, Commit)]
                if len(run) != K or not is_chain(run, start=b * K):
                    raise IntegrityError(sid, "segment does not hold a run of K commits")
                for rid, rc in run:
                    had = self.at_depth.setdefault(rc.depth, (rid, rc))
                    if had[0] != rid:
                        raise IntegrityError(sid, f"segment disagrees with commit {had[0][:12]} at depth {rc.depth}")
            # inside a segment the run is a chain: check where each block meets its neighbours
            self._verify_links([d for b in blocks for d in (b * K - 1, b * K + K - 1)])
            return
        # No segments for these depths: walk parents down from the lowest loaded commit.
        low = min(self.at_depth)
        cid, c = self.at_depth[low]
        while c.depth > missing[0]:
            if not c.parents:
                raise IntegrityError(cid, f"commit at depth {c.depth} has no parent")
            cid, c = self._parent(cid, c)

    def _verify_links(self, depths: Sequence[int]) -> None:
        for d in depths:
            held = self.at_depth.get(d)
            if held is None:
                continue
            cid = held[0]
            up = self.at_depth.get(d + 1)
            if up is not None and (not up[1].parents or o.hex_id(up[1].parents[0]) != cid):
                raise IntegrityError(up[0], "segment and commit parents disagree")

    def range(self, lo: int, hi: int) -> list[tuple[str, Commit]]:
        """Commits at depths ``lo..hi``, oldest first."""
        self.load(lo, hi)
        return [self.at_depth[d] for d in range(lo, hi + 1)]

    def contains(self, cid: str, depth: int) -> bool:
        """Whether commit ``cid`` (at ``depth``) is on this path."""
        return 0 <= depth <= self.depth and self.id_at(depth) == cid

    def segment_for_block(self, b: int) -> str | None:
        """The id of the segment of block ``b``, when the path's index has it."""
        segs = self.segments or []
        return segs[b] if b < len(segs) else None


class _HexIds(Sequence[str]):
    """Raw ids read as hex ids one at a time (a reader of a long path's index turns into hex
    only the few segment ids it reads, not all of them)."""

    def __init__(self, raw: Sequence[bytes]) -> None:
        self._raw = raw

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [o.hex_id(r) for r in self._raw[i]]
        return o.hex_id(self._raw[i])


def hint_tail(hint: Hint, got: Mapping[str, Any]) -> list[tuple[str, Commit]] | None:
    """The hint's tail commits (read into ``got``) when they can be the top block of a path:
    all commits, the first at a block boundary, each the first parent of the next, and the
    hint's index (when named) an index. None when the hint does not fit.
    """
    run = _commits(got, hint.tail)
    if not run:
        return None
    if run[0][1].depth % K != 0 or not is_chain(run, start=run[0][1].depth):
        return None
    if hint.index and not isinstance(got.get(hint.index), Index):
        return None
    return run


def depth_problem(depth: int, has_parent: bool, parent_depth: int | None = None) -> str | None:
    """What is wrong with a commit's ``depth`` (None: nothing), given whether it has a
    parent and its first parent's depth when known: a depth must be the parent's + 1, a
    root's 0. Every path is read by depth; one that does not count the path makes a
    reader skip commits or look past the path's end."""
    if parent_depth is not None:
        if depth != parent_depth + 1:
            return f"claims depth {depth} but its first parent is at depth {parent_depth}: expected {parent_depth + 1}"
    elif not has_parent and depth != 0:
        return f"a root commit (no parent) that claims depth {depth}: expected 0"
    elif has_parent and depth <= 0:
        return f"claims depth {depth} but has a parent"
    return None


def check_depth(cid: str, c: Commit, parent: Commit | None = None) -> None:
    """Check commit ``cid``'s depth against its first parent ``parent`` (None: against
    having parents at all), as :func:`depth_problem` says.

    Raises:
        IntegrityError: the depth does not count the path.
    """
    problem = depth_problem(c.depth, bool(c.parents), parent.depth if parent is not None else None)
    if problem is not None:
        raise IntegrityError(cid, problem)


def _commits(got: Mapping[str, Any], ids: Sequence[str]) -> list[tuple[str, Commit]] | None:
    """``[(id, commit)]`` for ``ids`` from ``got``; None when one is missing or not a commit."""
    out = []
    for cid in ids:
        c = got.get(cid)
        if not isinstance(c, Commit):
            return None
        out.append((cid, c))
    return out


def merge_depth(id_at_a: Callable[[int], str], id_at_b: Callable[[int], str], depth_a: int, depth_b: int) -> int:
    """The depth of the deepest commit on two first-parent paths (-1: unrelated roots).

    A binary search: paths that share a commit share every commit below it.
    ``id_at_x(d)`` is the id at depth ``d`` of path x, whose tip is at ``depth_x``.
    """
    lo, hi = -1, min(depth_a, depth_b)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if id_at_a(mid) == id_at_b(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def is_chain(path: Sequence[tuple[str, Commit]], start: int = 0) -> bool:
    """Whether ``path`` is a first-parent chain whose first commit has depth ``start``
    (a root when ``start`` is 0)."""
    prev: str | None = None
    for i, (cid, c) in enumerate(path, start):
        if c.depth != i:
            return False
        if prev is None:
            if start == 0 and c.parents:
                return False
        elif not c.parents or c.parents[0].hex() != prev:
            return False
        prev = cid
    return True


__all__ = ["BlockPath", "History", "Hint", "K", "hint_tail", "is_chain", "merge_depth",
           "check_depth", "depth_problem", "ObjectNotFound"]
