"""The search of :func:`castore.grep.grep` without its index: the store-wide *scan* of a
format-2/3 store and the per-session *walk* of a format-1 store. Both give the same matches
as the index (``tests/test_grep_scan.py``).

The scan (:func:`grep_scan`) reads every stored object once, store-wide (loose objects, then
each pack read whole, record by record: one zstd frame decompressed once, in a worker thread
ahead of the search). A record's content is searched, as bytes, for a *needle*
(:func:`needle`: the pattern's required literal, where the stored bytes of every matching
body must hold it; without one every object is decoded): the codec keeps a string as its
UTF-8 bytes (:func:`castore.objects.string_probe`), so a hit is a candidate, and only the
values holding one are decoded; every filter and the pattern itself then run on the decoded
blocks, so what a needle cannot see (a match
across two fields, a case fold, encrypted reasoning, a signature or an image) is never
reported from the bytes alone. The bytes of every commit, index and segment are kept as
read (found by the record's object sizes, never guessed) and hashed once, in one batch, for
their ids. Once every body that may match is known, the kept commits (as one string) are
searched for a reference to one (:func:`castore.objects.body_marker`; a few bodies by
their ids in one regex), and only those are decoded: a hit that is not a reference is
dropped when its commit does not name that body. Only then are those commits attributed:
each session's branches are read (one batch), each branch's top block followed from its tip
by parent links through the kept commits (every branch a step at a time, each step one
batch), the blocks below by the segments of the index its bottom commit names (each decoded
once, shared by forks, a target found in it by its bytes): a match is there when its bytes
are. Role, kind, tool and time filters are applied there; a tool result whose call is in an
earlier commit is named from its session's earlier calls. A scan that could not keep every
commit (one larger than :data:`_PATH_OBJECT_MAX`, or beyond :data:`_KEEP_PATHS`) looks for
the commits in the records instead, read a second time (no record is kept in memory: a scan
that keeps every commit does not need them), and reads from the store what attribution needs
and it did not keep.

Ids are never taken on trust. A version-2 record stores no ids (docs/FORMAT.md 4): its
16-byte check only says the payload is the one written, and an id is the blake3 of an
object's canonical bytes, so the scan learns an object's id by hashing the bytes it has, and
a match is reported under the id of the very bytes it was found in: the hashing that gives
the ids is also the check that no content is reported under a wrong id. Bytes taken for a
commit, an index or a segment are only ever looked up by an id some commit or ref names.
A pack index's rows would give ids without hashing, but only for sealed packs and at a
lookup per object, which costs more than one batch of hashes (attributing through the
store's reads instead took 1.8 s against 0.3 s at 100,000 entries, ``scripts/bench_grep.py``).

The walk (:func:`grep_walk`, ``scan=False`` forces it) reads each session's refs, the commits
of every branch path, the bodies in batches, each body once.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from .. import objects as o
from ..errors import IntegrityError
from ..history import K
from ..objects import Commit, Index, Segment, Value
from ..objectstore import gc_paused, packs
from ..refnames import parse_ref_name, real_name, session_prefix
from .blocks import blocks, bodies_of, context_entries, time_of
from .filters import glob_any, session_ok
from .match import LineMatch, Match, line_matches, make_match

if TYPE_CHECKING:
    from ..store import Store


def grep_walk(store: Store, rx: re.Pattern[str], limit: int | None, context: int, want_kinds: set[str],
              role_set: set[str] | None, tool_globs: tuple[str, ...] | None, since: float | None,
              until: float | None, app_globs: tuple[str, ...] | None, session_globs: tuple[str, ...] | None
              ) -> Iterator[Match]:
    """:func:`castore.grep.grep` by walking each session's branches (any format): see the
    module docstring.

    Raises:
        StorageError, IntegrityError: the store cannot be read.
    """
    # 1. sessions and the commits of each branch path (commits are small and packed)
    where: dict[str, list[tuple[tuple[str, str, str], str]]] = {}
    plans: list[tuple[tuple[str, str, str], list[tuple[str, Commit]], dict[str, list[str]]]] = []
    for app in sorted(store.apps()):
        if not glob_any(app, app_globs):
            continue
        for si in sorted(store.sessions(app), key=lambda x: (x.user, x.session)):
            key = (si.app, si.user, si.session)
            if si.deleting is not None or not session_ok(key, session_globs, None):  # (being deleted: as deleted)
                continue
            s = store.session(*key)
            tips = dict(s.branches())
            if s.current_branch is None and s.head is not None:
                tips["HEAD"] = s.head
            order: list[tuple[str, Commit]] = []
            paths: dict[str, list[str]] = {}
            local: set[str] = set()
            for bname, tip in tips.items():
                path = store.history.path(tip)
                paths[bname] = [cid for cid, _ in path]
                for cid, c in path:
                    refs = where.setdefault(cid, [])
                    refs.append((key, bname))
                    if cid not in local:
                        local.add(cid)
                        order.append((cid, c))
            order.sort(key=lambda x: x[1].depth)
            plans.append((key, order, paths))
    # 2. bodies, in batches, each once; report each commit once
    found = 0
    for key, order, paths in plans:
        calls: dict[str, str] = {}
        for cid, c, body in bodies_of(store, order):
            when = time_of(c)
            # a commit shared with a session before is reported there (its tool calls still
            # name the tools of this session's results, as in the index)
            in_time = where[cid][0][0] == key and (since is None or when >= since) and (until is None or when < until)
            for role, bkind, tool, text in blocks(body, c.kind, calls):
                if not in_time or bkind not in want_kinds:
                    continue
                if role_set is not None and role not in role_set:
                    continue
                if tool_globs is not None and not glob_any(tool, tool_globs):
                    continue
                if not text or rx.search(text) is None:
                    continue
                lines = line_matches(rx, text)
                if not lines:
                    continue
                refs = where[cid]
                mine = tuple(b for k, b in refs if k == key)
                others: dict[tuple[str, str, str], list[str]] = {}
                for k, b in refs:
                    if k != key:
                        others.setdefault(k, []).append(b)
                before: tuple[tuple[str, str, str], ...] = ()
                after: tuple[tuple[str, str, str], ...] = ()
                if context:
                    before, after = context_entries(store, paths[mine[0]], cid, context)
                yield Match(cid, key, mine, role, bkind, tool, when, lines,
                            tuple((k, tuple(b)) for k, b in others.items()), before, after, context)
                found += 1
                if limit is not None and found >= limit:
                    return


# -- the store-wide scan (format 2) ----------------------------------------------------------
#: characters that JSON or ``repr`` write around or between string values (a needle holding
#: one may come from a tool call's arguments rather than from a string's own bytes)
_STRUCTURAL = frozenset("\"'\\{}[],:")
#: characters of JSON/repr numbers and literals (true, false, null, NaN, Infinity, None)
_TOKEN = frozenset("0123456789.-+eEinfityaruslNoTF".lower())
#: characters that may end an escape sequence (``\\n``, ``\\u001f``, ``\\x1f``)
_ESCAPE_TAIL = frozenset("bfnrtux0123456789abcdef")
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
#: bytes of commits, indexes and segments a scan keeps for attributing (beyond: read from the store)
_KEEP_PATHS = 256 << 20
#: a commit, index or segment larger than this is not taken from a scan (read as usual)
_PATH_OBJECT_MAX = 4 << 20
#: up to this many bodies that may match, commits are found by those bodies' ids (else by a set:
#: at 100,000 commits one regex of 66 ids takes 0.02 s, of 512 ids 0.25 s, the set 0.05 s)
_FEW_BODIES = 100
#: where a stored object's kind tag lies in its canonical bytes (:func:`castore.objects.kind_tag_bytes`)
_T0, _T1 = o.TAG_START, o.TAG_END


def _required_literal(rx: re.Pattern[str]) -> str | None:
    """The longest run of plain characters every match of ``rx`` contains, or None."""
    from re import _parser  # type: ignore[attr-defined]

    try:
        tree = _parser.parse(rx.pattern, rx.flags)
    except Exception:  # noqa: BLE001 - the pattern compiled; a parser quirk only costs the prefilter
        return None
    best = ""
    run: list[str] = []

    def flush() -> None:
        nonlocal best
        if len(run) > len(best):
            best = "".join(run)
        run.clear()

    def walk(items: Any) -> None:
        for op, av in items:
            name = str(op)
            if name == "LITERAL":
                run.append(chr(av))
            elif name == "AT":
                continue  # zero-width: the characters on either side are still adjacent
            elif name == "SUBPATTERN" and not av[1] and not av[2]:
                walk(av[3])
            elif name in _REPEATS and av[0] >= 1:
                flush()
                walk(av[2])
                flush()
            else:
                flush()

    walk(tree)
    flush()
    return best or None


def needle(rx: re.Pattern[str]) -> tuple[bytes, bool] | None:
    """A byte string that the stored bytes of every body with a match of ``rx`` contain, and
    whether to look for it in lower-cased bytes (what :func:`castore.objects.string_probe`
    searches for); None when there is none to rely on.

    A block's text is a string of the body (stored as its UTF-8 bytes), strings joined by a
    newline, or a tool call's name and its arguments as JSON. So a needle is taken from the
    pattern's required literal only when it has no whitespace and no JSON punctuation, is
    not made of number or literal characters alone, and has lost the leading characters an
    escape sequence could end with; case-insensitively, only when it is ASCII.
    """
    lit = _required_literal(rx)
    if not lit or any(c in _STRUCTURAL or c.isspace() or ord(c) < 0x20 for c in lit):
        return None
    if all(c.lower() in _TOKEN for c in lit):
        return None
    i = 0
    while i < len(lit) and lit[i].lower() in _ESCAPE_TAIL:
        i += 1
    lit = lit[i:]
    if not lit:
        return None
    if rx.flags & re.IGNORECASE:
        return (lit.lower().encode(), True) if lit.isascii() else None
    return lit.encode("utf-8"), False


def _holding(hay: bytes, nrx: re.Pattern[bytes], m: re.Match[bytes] | None, spans: list[tuple[int, int]]
             ) -> list[int]:
    """The numbers of the objects (``spans``) that hold a match of ``nrx`` in ``hay`` whole,
    from its first match ``m`` on."""
    starts = [s for s, _ in spans]
    out: list[int] = []
    while m is not None:
        i = bisect.bisect_right(starts, m.start()) - 1
        if i >= 0 and m.end() <= sum(spans[i]):
            out.append(i)
            m = nrx.search(hay, sum(spans[i]))
        else:
            m = nrx.search(hay, m.start() + 1)
    return out


class _Scan:
    """What one pass over every stored object found: the bodies that may match (by raw id),
    the commits naming them (``(id, commit)``) and the bytes of every commit, index and
    segment by id (``paths``)."""

    def __init__(self, store: Store, rx: re.Pattern[str]) -> None:
        self.store = store
        self.rx = rx
        self.needle = needle(rx)
        self.nrx = o.string_probe(*self.needle) if self.needle is not None else None
        self.bodies: dict[bytes, Any] = {}
        self.commits: dict[str, Commit] = {}
        self.canonical: dict[str, bytes] = {}  # the commits' bytes
        # a body reference is the marker and 32 bytes; only the marker is consumed (it cannot
        # overlap itself), so bytes that merely look like one never hide the next
        self.marker = re.compile(re.escape(o.body_marker()) + b"(?=(.{32}))", re.DOTALL)
        # the kind tags of a value, a commit, an index and a segment (at TAG_START:TAG_END)
        tag = o.kind_tag_bytes
        self.value_tag, self.commit_tag, index_tag, segment_tag = tag(Value), tag(Commit), tag(Index), tag(Segment)
        self.path_tags = frozenset((self.commit_tag, index_tag, segment_tag))
        self.kept = 0
        self.found: list[bytes] = []  # the bytes of every commit, index and segment, as read
        #: whether ``found`` holds every commit of every unit read (none too large, the budget
        #: not spent): then the commits naming a body are looked for there alone
        self.complete = True
        self.paths: dict[str, bytes] = {}  # ``found`` by id, once hashed

    def run(self) -> None:
        """Read every stored object once (twice only when some commit could not be kept):
        first the bodies that may match, then the commits naming them."""
        for content, is_record in self.store.objects.iter_contents():
            self._unit(content, is_record)
        if not self.bodies:
            return
        # every id is the hash of the bytes it names: bytes taken for an object that is not
        # one are never asked for
        self.paths = dict(zip(self.store.objects.codec.digest_many(self.found), self.found, strict=True))
        # the commits are looked for once every body is known (a commit may be stored before its
        # body: sync can do that): a few bodies by their ids, in C; many, by every body reference
        # and a set
        marker = o.body_marker()
        if len(self.bodies) <= _FEW_BODIES:
            few = re.compile(re.escape(marker) + b"(?=" + b"|".join(re.escape(b) for b in self.bodies) + b")")

            def hits(content: bytes) -> list[int]:
                return [m.start() for m in few.finditer(content)]
        else:
            bodies = self.bodies

            def hits(content: bytes) -> list[int]:
                return [m.start() for m in self.marker.finditer(content) if m.group(1) in bodies]
        if self.complete:
            self._commits_kept(hits)
            return
        for content, is_record in self.store.objects.iter_contents():
            at = hits(content)
            if at:
                self._commits_in(content, is_record, at)

    def _unit(self, content: bytes, is_record: bool) -> None:
        """Keep what ``content`` holds of paths and of bodies that may match."""
        spans = packs.content_spans(content) if is_record else [(0, len(content))]
        if spans is None:
            return
        # the bytes of commits, indexes and segments are kept as read: the paths that
        # attribute the matches then read none of them again
        if self.kept < _KEEP_PATHS:
            tags = self.path_tags
            got = [content[a:a + n] for a, n in spans if content[a + _T0:a + _T1] in tags]
            if got:
                if max(map(len, got)) > _PATH_OBJECT_MAX:
                    got = [x for x in got if len(x) <= _PATH_OBJECT_MAX]
                    self.complete = False
                self.found.extend(got)
                self.kept += sum(map(len, got))
        else:
            self.complete = False
        if self.needle is None or self.nrx is None:
            self._keep_bodies(content, spans, range(len(spans)))
        else:
            hay = content.lower() if self.needle[1] else content
            m = self.nrx.search(hay)
            if m is not None:
                self._keep_bodies(content, spans, _holding(hay, self.nrx, m, spans))

    def _keep_bodies(self, content: bytes, spans: list[tuple[int, int]], picked: Iterable[int]) -> None:
        """Decode the objects ``picked`` (by number) of ``content`` and keep the values."""
        # only values can be bodies: a segment holding a hit (its copies of bodies) is not decoded
        tag = self.value_tag
        raws = [content[a:a + n] for a, n in (spans[i] for i in picked) if content[a + _T0:a + _T1] == tag]
        if not raws:
            return
        # hashed for their ids and decoded here, not through the store's cache: a common word
        # makes most bodies candidates, and the scan keeps what it needs of them itself
        ids = self.store.objects.codec.digest_many(raws)
        for oid, obj in zip(ids, o.decode_many(ids, raws), strict=True):
            if isinstance(obj, Value):
                self.bodies[o.raw_id(oid)] = obj.value

    def _commits_kept(self, hits: Callable[[bytes], list[int]]) -> None:
        """Decode the kept commits that hold a body reference ``hits`` finds (searched as one
        string: a reference is inside one commit, and a hit that is not one is dropped when the
        commit does not name that body)."""
        tag = self.commit_tag
        ids = [oid for oid, raw in self.paths.items() if raw[_T0:_T1] == tag]
        raws = [self.paths[oid] for oid in ids]
        ends = list(accumulate(map(len, raws)))
        picked = list(dict.fromkeys(bisect.bisect_right(ends, at) for at in hits(b"".join(raws))))
        self._adopt([ids[i] for i in picked], [raws[i] for i in picked])

    def _commits_in(self, content: bytes, is_record: bool, hits: list[int]) -> None:
        """Decode the commits of ``content`` that hold a body reference at one of ``hits``."""
        spans = packs.content_spans(content) if is_record else [(0, len(content))]
        if spans is None:
            return
        starts = [s for s, _ in spans]
        # only commits: the copies of commits in a segment are not decoded
        tag = self.commit_tag
        picked = [i for i in dict.fromkeys(bisect.bisect_right(starts, at) - 1 for at in hits)
                  if content[spans[i][0] + _T0:spans[i][0] + _T1] == tag]
        raws = [content[spans[i][0]:sum(spans[i])] for i in picked]
        self._adopt(self.store.objects.codec.digest_many(raws), raws)

    def _adopt(self, ids: Sequence[str], raws: Sequence[bytes]) -> None:
        """Keep the commits ``raws`` (by their ``ids``) that name a body that may match."""
        for oid, obj, raw in zip(ids, o.decode_many(ids, raws), raws, strict=True):
            if isinstance(obj, Commit) and obj.body is not None and obj.body in self.bodies:
                self.commits[oid] = obj
                self.canonical[oid] = raw


class _Paths:
    """The commits, indexes and segments a scan found, by id (each id the hash of the bytes it
    names: the bytes taken for an object that is not one are never asked for), decoded when
    asked for; one not kept (beyond :data:`_KEEP_PATHS` or :data:`_PATH_OBJECT_MAX`) is read
    from the store, verified there. :meth:`held` tells which of the matching commits
    (``targets``, id: depth, and the same by their bytes) a path holds."""

    def __init__(self, store: Store, found: dict[str, bytes], targets: dict[str, int], by_bytes: dict[bytes, str]
                 ) -> None:
        self.store = store
        self.targets, self.by_bytes = targets, by_bytes
        self.shallowest = min(targets.values(), default=0)
        self.blocks = sorted({d // K for d in targets.values()})  # the blocks that hold a target
        self.canonical = found
        self.decoded: dict[str, Any] = {}
        self.members: dict[str, list[str] | None] = {}  # a segment's targets (None: not the block's)
        self.sizes = frozenset(map(len, by_bytes))

    def get(self, oid: str) -> Any:
        """The object ``oid`` (None when it is missing)."""
        obj = self.decoded.get(oid)
        if obj is None:
            raw = self.canonical.get(oid)
            if raw is not None:
                obj = o.decode(oid, raw)
            else:
                if not self.decoded:
                    self.store.objects.refresh()  # the pack map first: a cold handle looks loose
                obj = self.store.objects.get_many([oid], missing_ok=True).get(oid)
            self.decoded[oid] = obj
        return obj

    def commit(self, oid: str) -> Commit:
        """The commit ``oid``.

        Raises:
            ObjectNotFound: it is missing.
            IntegrityError: it is not a commit.
        """
        c = self.get(oid)
        if c is None:
            raise self.store.objects.missing_error(oid)  # not found, or in a damaged pack record
        if not isinstance(c, Commit):
            raise IntegrityError(oid, "expected a commit")
        return c

    def commits(self, oids: list[str]) -> list[Commit]:
        """The commits ``oids``, in order (those kept by the scan decoded in one batch).

        Raises:
            ObjectNotFound: one is missing.
            IntegrityError: one is not a commit.
        """
        decoded = self.decoded
        got = [decoded.get(x) for x in oids]
        fresh = [i for i, c in enumerate(got) if c is None]
        if fresh:
            ids = [oids[i] for i in fresh]
            raws = [self.canonical.get(x) for x in ids]
            if None in raws:
                objs = [self.get(x) for x in ids]  # some from the store
            else:
                objs = o.decode_many(ids, raws)  # type: ignore[arg-type]
                decoded.update(zip(ids, objs, strict=True))
            for i, obj in zip(fresh, objs, strict=True):
                got[i] = obj
        out: list[Commit] = []
        for x, c in zip(oids, got, strict=True):
            if not isinstance(c, Commit):
                raise self.store.objects.missing_error(x) if c is None else IntegrityError(x, "expected a commit")
            out.append(c)
        return out

    def held(self, tips: list[str]) -> list[list[str]]:
        """For each of ``tips``, the commits of ``targets`` (id: depth; by their bytes in
        ``by_bytes``) on the first-parent path ending there: its top block by its parent links
        (every path a step at a time, each step one batch), the blocks below by the segments
        of the index its bottom commit names.

        Raises:
            ObjectNotFound, IntegrityError: a commit of a path is missing or not a commit.
        """
        targets, shallowest = self.targets, self.shallowest
        outs: list[list[str]] = [[tip] if tip in targets else [] for tip in tips]
        cs = self.commits(tips)
        # the top blocks: up to K - 1 parent links from each tip
        on = [i for i, c in enumerate(cs) if c.depth % K != 0 and c.parents and c.depth > shallowest]
        while on:
            ids = [cs[i].parents[0].hex() for i in on]
            for i, cid, c in zip(on, ids, self.commits(ids), strict=True):
                cs[i] = c
                if cid in targets:
                    outs[i].append(cid)
            on = [i for i in on if (c := cs[i]).depth % K != 0 and c.parents and c.depth > shallowest]
        for out, c in zip(outs, cs, strict=True):
            if c.depth > shallowest and c.parents:
                self._below(c, out)
        return outs

    def _below(self, c: Commit, out: list[str]) -> None:
        """Add to ``out`` the targets on the path below ``c``, the bottom commit of a top block."""
        targets = self.targets
        idx = self.get(o.hex_id(c.index)) if c.index is not None else None
        segs = [o.hex_id(x) for x in idx.segments] if isinstance(idx, Index) else []
        below = self.blocks
        for blk in reversed(below[:bisect.bisect_left(below, c.depth // K)]):
            members = self._segment(segs[blk], blk) if blk < len(segs) else None
            if members is not None:
                out.extend(members)
                continue
            # not a segment of this block: walk down to it from the lowest commit read
            while c.depth > blk * K and c.parents:
                cid = o.hex_id(c.parents[0])
                c = self.commit(cid)
                if cid in targets and blk * K <= c.depth < blk * K + K:
                    out.append(cid)

    def _segment(self, sid: str, blk: int) -> list[str] | None:
        """The targets segment ``sid`` holds when it is the segment of block ``blk``."""
        if sid not in self.members:
            seg = self.get(sid)
            self.decoded.pop(sid, None)  # its copies are not kept: what it holds is
            if isinstance(seg, Segment) and seg.start == blk * K:
                # by length first: hashing every copy for a set would cost as much as the decoding
                by_bytes, sizes = self.by_bytes, self.sizes
                self.members[sid] = [by_bytes[x] for x in seg.objects if len(x) in sizes and x in by_bytes]
            else:
                self.members[sid] = None
        return self.members[sid]


class _Calls(dict[str, str]):
    """A tool-call map that notes a lookup it could not answer (a result whose call is in an
    earlier commit of its session)."""

    missed = False

    def get(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self.missed = True
        return super().get(key, default)


def _session_tips(store: Store, app_globs: tuple[str, ...] | None, session_globs: tuple[str, ...] | None
                  ) -> list[tuple[tuple[str, str, str], list[tuple[str, str, dict[str, Any]]]]]:
    """The sessions a search covers, in session order, each with its branches (name, tip and
    ref metadata; ``HEAD`` when detached), as :meth:`Session.branches` names them: the
    current branch as :meth:`Store.sessions` read it, the others in one batch."""
    infos = []
    for app in sorted(store.apps()):
        if not glob_any(app, app_globs):
            continue
        for si in sorted(store.sessions(app), key=lambda x: (x.user, x.session)):
            if si.deleting is None and session_ok((si.app, si.user, si.session), session_globs, None):
                infos.append(si)
    if not infos:
        return []
    current = {session_prefix(si.app, si.user, si.session): si for si in infos if si.branch is not None}
    parsed: dict[str, Any] = {}
    heads: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {}
    for n in store.refs.list("sessions"):
        p = parse_ref_name(n)
        if p is None or p.kind != "branch" or p.name is None or p.session_prefix is None:
            continue
        cur = current.get(p.session_prefix)
        if cur is not None and cur.head is not None and cur.branch is not None \
                and real_name(p.name, None) == cur.branch:
            heads.setdefault(p.session_prefix, {})[cur.branch] = (cur.head, {})  # read by sessions() already
        else:
            parsed[n] = p
    for n, v in store.refs.read_many(list(parsed)).items():
        p = parsed[n]
        if v is not None and v.symbolic is None:
            heads.setdefault(p.session_prefix, {})[real_name(p.name, v.meta)] = (v.target, dict(v.meta))
    out = []
    for si in infos:
        got = heads.get(session_prefix(si.app, si.user, si.session), {})
        tips = [(b, t, m) for b, (t, m) in sorted(got.items())]
        if si.branch is None and si.head is not None:
            tips.append(("HEAD", si.head, {}))
        out.append(((si.app, si.user, si.session), tips))
    return out


def _calls_before(store: Store, tips: list[tuple[str, str, dict[str, Any]]], cid: str) -> dict[str, str]:
    """The tool calls a session's commits before ``cid`` made (in the order the walk reads
    them), for naming the tool of a result whose call is not in its own body."""
    seen: set[str] = set()
    order: list[tuple[str, Commit]] = []
    for _, tip, _ in tips:
        for x, c in store.history.path(tip):
            if x not in seen:
                seen.add(x)
                order.append((x, c))
    order.sort(key=lambda x: x[1].depth)
    calls: dict[str, str] = {}
    for x, c, body in bodies_of(store, order):
        if x == cid:
            break
        for _ in blocks(body, c.kind, calls):
            pass
    return calls


def grep_scan(store: Store, rx: re.Pattern[str], keep: Any, limit: int | None, context: int,
               want_kinds: set[str], role_set: set[str] | None, since: float | None, until: float | None,
               app_globs: tuple[str, ...] | None, session_globs: tuple[str, ...] | None) -> Iterator[Match]:
    """:func:`castore.grep.grep` by one pass over every stored object (format 2): see the module docstring.

    Raises:
        StorageError, IntegrityError: the store cannot be read.
    """
    # everything is found before the first match is given out: a pass that keeps hundreds of
    # thousands of objects alive (the caches, the bodies), each burst of allocations a walk of
    # all of them by the cyclic collector, for nothing
    with gc_paused():
        out, sessions = _scan_matches(store, rx, keep, context, want_kinds, role_set, since, until, app_globs,
                                      session_globs)
    for n, ((sn, _, bn, _), m) in enumerate(out):
        if limit is not None and n >= limit:
            return
        if context:
            before, after = context_entries(store, store.history.path_ids(sessions[sn][1][bn][1]), m.commit, context)
            m = replace(m, before=before, after=after)
        yield m


def _scan_matches(store: Store, rx: re.Pattern[str], keep: Any, context: int, want_kinds: set[str],
                  role_set: set[str] | None, since: float | None, until: float | None,
                  app_globs: tuple[str, ...] | None, session_globs: tuple[str, ...] | None
                  ) -> tuple[list[tuple[tuple[int, int, int, int], Match]],
                             list[tuple[tuple[str, str, str], list[tuple[str, str, dict[str, Any]]]]]]:
    """The matches of :func:`grep_scan` in their order, with their sort keys, and the sessions."""
    scan = _Scan(store, rx)
    scan.run()
    # 1. the blocks that match, before knowing where their commits are
    found: dict[str, list[tuple[int, str, str, str | None, tuple[LineMatch, ...], bool]]] = {}
    timed = since is not None or until is not None
    for cid, c in scan.commits.items():
        assert c.body is not None
        if timed:
            when = time_of(c)
            if (since is not None and when < since) or (until is not None and when >= until):
                continue
        calls = _Calls()
        for j, (role, bkind, tool, text) in enumerate(blocks(scan.bodies[c.body], c.kind, calls)):
            missed, calls.missed = calls.missed, False
            if bkind not in want_kinds or (role_set is not None and role not in role_set):
                continue
            if not text or rx.search(text) is None:
                continue
            lines = line_matches(rx, text)
            if lines:
                found.setdefault(cid, []).append((j, role, bkind, tool, lines, missed and tool is None))
    if not found:
        return [], []
    # 2. where those commits are: the branches whose path holds them
    targets = {cid: scan.commits[cid].depth for cid in found}
    sessions = _session_tips(store, app_globs, session_globs)
    where: dict[str, list[tuple[int, str, int]]] = {}  # commit -> (session number, branch, branch number)
    known = _Paths(store, scan.paths, targets, {scan.canonical[x]: x for x in targets})
    shallowest = known.shallowest
    asked: list[tuple[int, str, int]] = []
    tip_ids: list[str] = []
    for sn, (_, tips) in enumerate(sessions):
        for bn, (bname, tip, meta) in enumerate(tips):
            length = meta.get("length")
            top = int(length) - 1 if isinstance(length, int) and not isinstance(length, bool) else None
            if top is None or top >= shallowest:
                asked.append((sn, bname, bn))
                tip_ids.append(tip)
    for ref, on_path in zip(asked, known.held(tip_ids), strict=True):
        for x in on_path:
            where.setdefault(x, []).append(ref)
    for held in where.values():
        held.sort(key=lambda r: (r[0], r[2]))  # session order, then branch order, as the walk lists them
    # 3. each commit reported once, with the first session holding it, in the walk's order
    out: list[tuple[tuple[int, int, int, int], Match]] = []  # (session, depth, branch, block), match
    calls_of: dict[tuple[int, str], dict[str, str]] = {}
    for cid, blks in found.items():
        refs = where.get(cid)
        if not refs:
            continue
        sn = refs[0][0]
        key, tips = sessions[sn]
        c = scan.commits[cid]
        mine = tuple(b for s, b, _ in refs if s == sn)
        others: dict[tuple[str, str, str], list[str]] = {}
        for s, b, _ in refs:
            if s != sn:
                others.setdefault(sessions[s][0], []).append(b)
        first_branch = min(bn for s, _, bn in refs if s == sn)
        when = time_of(c)
        for j, role, bkind, tool, lines, unnamed in blks:
            if unnamed:
                if (sn, cid) not in calls_of:
                    calls_of[(sn, cid)] = _calls_before(store, tips, cid)
                assert c.body is not None
                named = list(blocks(scan.bodies[c.body], c.kind, dict(calls_of[(sn, cid)])))
                tool = named[j][2]
            if not keep(key, role, bkind, tool, when):
                continue
            out.append(((sn, c.depth, first_branch, j),
                        Match(cid, key, mine, role, bkind, tool, when, lines,
                              tuple((k, tuple(b)) for k, b in others.items()), context=context) if others
                        else make_match(cid, key, mine, role, bkind, tool, when, lines, context)))
    out.sort(key=lambda x: x[0])
    return out, sessions


__all__ = ["grep_scan", "grep_walk", "needle"]
