"""The search index of :func:`castore.grep.grep`: derived data, rebuildable, kept fresh.

The index is a local cache of every searchable block of a store (its text, and the commit,
session, branches, role, kind, tool and time it belongs to), so that a search reads one
compressed text file (the chunks its filters let through) instead of every object; it is
smaller than the store it indexes. It lives outside the store, in
``$CASTORE_GREP_INDEX`` or ``~/.cache/castore/grep/<digest of the store URL>/``; deleting
it loses nothing (the next search rebuilds it), and a file that fails its check is not
trusted: the index is rebuilt. Each file's size, CRC-32, modification time (ns) and inode
are recorded in ``state.json`` when it is written; a search compares the size and the
``fstat`` of each file it opens, and reads the whole file for its CRC only when the
modification time or inode differ (a file written, copied or replaced since; a CRC of
every text file would cost a search more than its search of the text).

Freshness: the index records the refs of every session it covers and a *mark* of the
store's ref changes (:meth:`castore.refs.RefStore.changes_since`; local disk logs them). A
search asks which refs moved since the mark (one ``stat`` and one read of the log's tail
when nothing did), re-reads only the sessions those refs belong to, re-extracts
the sessions whose refs really moved (imported, appended, branched, deleted) and keeps the
others. Where the storage keeps no log (S3, memory), or cannot tell (a reboot since, a
replaced log), every session's refs are read (one listing and one batch read) and compared.
The log names castore's own changes only: a ref folder or a branch file removed by hand is
not in it. So each session keeps the *stamp* of its ref folder from when its refs were read
(:meth:`castore.refs.RefStore.folder_stamps`: on local disk the time of its ``heads/``, one
``stat``), and a search compares the stamps of the sessions it found
(:meth:`Index.moved_unlogged`): a changed one is read again, the index updated, and the
search made again, so that no line of a gone session or branch is reported. A file system's
times tick coarsely (a few ms on Linux, 2 s on FAT): a file removed in the tick of the folder's
last change leaves its time as it was. So a folder changed less than two seconds before its
refs were read (or since) is stamped *unsettled*, which no stamp equals: the next search
(not the one that read it) reads its refs again. castore's own
writes of a ref file in place (a deferred swap, docs/FORMAT.md 12: no rename, the folder's
entries unchanged) are logged before they are made, so the mark sees them. A ref file a hand
rewrites in place is in neither the log nor the stamp: its session is read again when its
refs next move, or when the index is rebuilt (delete the index folder).

Segments: the blocks are kept in at most two *segments*, each written once and never
changed (new files, then ``state.json`` replaced): the *base*, and a *delta* holding the
sessions extracted since the base was written. An update extracts only the sessions that
moved, into a new delta (with the sessions of the old delta that did not move, copied);
their blocks in the base are left there, dead (no live session's range covers them). When
the dead blocks and the delta together pass a quarter of the base (:data:`COMPACT`), the
update writes one new base instead, copying every live session. When a session is gone
(deleted), the update builds the whole index again from the store, into new files (the old
ones removed): the text and names of a deleted session do not outlive it here. A session's blocks are
in one segment, contiguous per part, root to tip; each segment holds its sessions in
session order. Writers take ``lock`` (``flock``) and look at ``state.json`` again once
they hold it; readers take no lock (they open the files ``state.json`` names, trying
again if an update removed them meanwhile).

Blocks are kept in two *parts* per segment: ``main`` (text, thinking, tool calls: what a
search reads by default) and ``res`` (tool results, most of the text, read only when
asked). The text is kept once, in its own case, compressed in *chunks* of blocks, each with a
small trigram filter, so that a search for a plain string decompresses only the chunks that
may hold it. Per segment ``G`` and part ``P``:

* ``G.P.z``: the chunks, one after the other, each a zstd frame as
  :func:`castore.objects.frame_block` makes it (at zstd level 9, shortest match 6), of its
  blocks' text (UTF-8, each followed by ``\x1e``, a record separator; a text may hold the
  character too: a block is found by its offset, ``G.P.col``, never by the separator; before
  version 13 it was replaced by a space, and a search through the index matched a space there);
  a chunk is closed once it holds :data:`~castore.grep.files.CHUNK`
  bytes (a block is never split);
* ``G.P.flt``: per chunk two bitmaps of :data:`~castore.grep.files.FILTER_BITS` bits. The
  first: for each word of its text lower-cased by ``bytes.lower()`` (a run of non-blanks, as
  ``bytes.split()`` cuts it, the separator between blocks cutting it too), a bit per trigram of
  the word (its 3 bytes as a little-endian number, times 2654435761, shifted right by 13,
  modulo the bits). A plain string's runs of non-blanks each lie within one word of the text,
  so a chunk that lacks a bit of one of their trigrams cannot hold it. The second: the same
  bits of its *cased* words alone (those ``bytes.lower()`` changes). A lower-case ASCII string
  whose runs of non-blanks are three bytes or more, none of whose bits the second bitmap has,
  is in the chunk in no other case: a case-insensitive search finds it in the text as it is,
  without lowering the chunk;
* ``G.P.off``: little-endian int64: per chunk its offset in ``P.z`` (and one past the last),
  then its first block (and the block count), then its flags (1: a block holds a character
  that a case-insensitive ASCII pattern may match though ``bytes.lower()`` leaves it: such a
  chunk is searched whatever its filter says; 2: every block is ASCII with no control character
  but line break and tab, printed as it is);
* ``G.P.rec``: little-endian int32, 10 columns of one value per block (column after column):
  commit number, session number, block number within the commit, kind (0 text, 1 thinking,
  2 tool call, 3 tool result), role, tool (string numbers; -1: none), branch-set number, the
  block's place within its session (both parts counted, root to tip), flags (1: the text is
  ASCII), and the byte offset of the block's text in its chunk; ``G.P.time``: float64 per
  block.

``G.commits`` holds the 32-byte ids of the commits first numbered in segment ``G`` (commit
numbers run on across the segments, in order; a segment written from others keeps their
numbers); ``state.json`` the version, the store URL, the ref-change mark, the strings and
branch sets, the segments (their block and commit counts and files), and per session number
``[app, user, session, segment, first block and blocks in main, the same in res, ref folder,
its stamp]`` (a gone session: no segment), and ``lost``: the sessions whose HEAD names a lost branch, as the update
that last read their refs found them (a search reports them; an index written before the key
knows none until their refs move); ``rN.refs`` (named in ``state.json``, a new file per update) each live
session's ref folder and refs, read only when something moved: a search of an index nothing
moved since reads ``state.json`` and the files of the parts it searches, nothing else.

An index whose folder cannot be written (read-only, on a read-only mount, another user's, a full
disk) is built or updated in the process's memory and searched there, saving nothing, when the
caller gives a list to note why in (:func:`open_index`'s ``unsaved``; a search always does): the
same matches, at the cost of reading the store.

The files of a segment (its parts as loaded or built, their writing and their checks) and
the commit numbering of an update are in :mod:`castore.grep.files`. A process keeps the chunks
it decompressed (and their lower case), up to :data:`~castore.grep.files.CACHE_BYTES`, known by
the file they come from: a library user's next search decompresses nothing it read before. A
process that searches once (``castore grep``, :func:`~castore.grep.files.keep_chunks`) keeps only
what its search reads again: the blocks found, or the chunks they are many of (a count: only the
blocks it cannot count unread, the non-ASCII ones of a case-insensitive word).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from ..cachedir import kind_folder, store_digest, store_url
from ..errors import CastoreError
from .blocks import blocks, bodies_of, time_of
from .files import KINDS, PARTS, SEP, Numbers, Part, Segment, load_segment, open_file, stat_of, write_file
from .filters import compile_regex

if TYPE_CHECKING:
    from ..errors import CorruptRef
    from ..store import Store

VERSION = 13
#: the share of the base that dead blocks and the delta may reach before an update writes a
#: new base (see the module docstring)
COMPACT = 0.25
_SESSIONS = "sessions"
#: what anchors a pattern to the start or end of the text it searches
_ANCHORS = ("^", "$", "\\A", "\\Z")

Key = tuple[str, str, str]


class IndexError_(CastoreError, OSError):
    """The search index cannot be written (its folder is not writable)."""


def indexable(store: Store) -> bool:
    """Whether ``store`` may have a search index: not an encrypted one (its codec seals frames),
    whose index would hold the text of every session in the clear; grep scans such a store,
    opening its objects in memory, and writes nothing. Raises nothing."""
    return not store.sealed


def index_dir(store: Store) -> str:
    """The folder of ``store``'s index (:mod:`castore.cachedir`; ``$CASTORE_GREP_INDEX`` in place
    of the kind's folder)."""
    return os.path.join(os.environ.get("CASTORE_GREP_INDEX") or kind_folder("grep"), store_digest(store))


def _extract(store: Store, key: Key) -> Iterator[tuple[str, str, str, str | None, float, tuple[str, ...], int, str]]:
    """Every searchable block of one session, each commit once, root to tip: ``(commit, role,
    kind, tool, time, branches, block number within the commit, text)``."""
    s = store.session(*key)
    tips = dict(s.branches())
    if s.current_branch is None and s.head is not None:
        tips["HEAD"] = s.head
    member: dict[str, list[str]] = {}
    order: list[tuple[str, Any]] = []
    for bname, tip in tips.items():
        for cid, c in store.history.path(tip):
            if cid not in member:
                member[cid] = []
                order.append((cid, c))
            member[cid].append(bname)
    order.sort(key=lambda x: x[1].depth)
    calls: dict[str, str] = {}
    for cid, c, body in bodies_of(store, order):
        for j, (role, kind, tool, text) in enumerate(blocks(body, c.kind, calls)):
            if text:
                yield cid, role, kind, tool, time_of(c), tuple(member[cid]), j, text


def _changes(store: Store, mark: str | None, lost: dict[str, list[str]], also: set[str] | frozenset[str] = frozenset()
             ) -> tuple[str | None, dict[Key, tuple[str, dict[str, str]]], set[str] | None]:
    """What moved since ``mark`` (:meth:`castore.refs.RefStore.changes_since`), and the folders
    ``also`` (changed unlogged): ``(new mark, refs read, folders read)``; folders None when every
    session's refs were read (no usable mark, or a storage that cannot tell). The sessions read
    whose HEAD names a lost branch go into ``lost`` (folder -> ``[app, user, session, fsck's line]``)."""
    new, names = store.refs.changes_since(_SESSIONS, mark)
    folders = None if names is None else {*also, *("/".join(p[:4]) for n in names if len(p := n.split("/")) >= 5)}
    if folders is not None and not folders:
        return new, {}, set()
    found: dict[Key, CorruptRef] = {}
    read = store.session_refs_and_heads(folders, found)
    lost.update({"/".join(e.ref.split("/")[:4]): [*k, str(e)] for k, e in found.items()})  # (HEAD, or a branch)
    return new, {k: (f, refs) for k, (f, refs, _h) in read.items()}, folders


def _folder_of(key: list[Any] | tuple[Any, ...]) -> str:
    """The ref folder of session ``key`` when its names need no encoding (most): a row keeps
    its folder only when it is another (:meth:`Index._set_sessions`)."""
    return f"{_SESSIONS}/{key[0]}/{key[1]}/{key[2]}"


#: the columns of a hit as :func:`hits` gives them (after its place and its part)
HIT_COLS = (0, 2, 3, 4, 5, 6, 8)


def hits(runs: list[tuple[Part, list[int]]]) -> Iterable[tuple[Any, ...]]:
    """One session's hits (its runs, as :meth:`Index.find_blocks` gives them) in order, root to
    tip: ``(place, part, commit, block, kind, role, tool, branch set, flags, time, block number
    in the part)`` each, the numbers read column by column in C; both parts merged by place."""
    out: list[Any] = []
    for p, idx in runs:
        if len(idx) == 1:
            i = idx[0]
            got: Any = [((p.cols[7][i], p, *(p.cols[c][i] for c in HIT_COLS), p.time[i], i))]
        else:
            get = itemgetter(*idx)
            got = zip(get(p.cols[7]), itertools.repeat(p), *(get(p.cols[c]) for c in HIT_COLS), get(p.time),
                      idx, strict=False)
        if len(runs) == 1:
            return got
        out.extend(got)
    out.sort(key=itemgetter(0))
    return out


def _literal(rx: re.Pattern[str]) -> str | None:
    """The plain string ``rx`` matches, when its pattern is one (no regex syntax at all)."""
    p = rx.pattern
    if not p or any(ch in p for ch in "\\.^$*+?{}[]|()") or rx.flags & re.VERBOSE:
        return None
    return p


def search_plan(rx: re.Pattern[str]) -> tuple[re.Pattern[str], bool, str | None]:
    """How :meth:`Index.find_blocks` runs ``rx`` (with no anchor): the pattern it searches with,
    whether over the lowered text (``P.low``), and the plain string that pattern is, if it is one.

    A case-insensitive ASCII pattern with no backslash runs case-sensitively, lowered, over the
    lowered text (Python's case-insensitive search is many times slower).
    """
    prx, lowered = rx, False
    if rx.flags & re.IGNORECASE and "\\" not in rx.pattern and rx.pattern.isascii():
        try:
            prx, lowered = compile_regex(rx.pattern.lower(), rx.flags & ~re.IGNORECASE), True
        except re.error:
            pass
    return prx, lowered, (_literal(prx) if not prx.flags & re.IGNORECASE else None)


def _hits(p: Part, rx: re.Pattern[str], want: set[int] | None, counting: bool) -> list[int]:
    """The blocks of part ``p`` (of these kind numbers) with a match of ``rx``, in increasing order
    (see :meth:`Index.find_blocks`): a superset of them where the search is lowered (the caller
    matches each block found again with ``rx``); ``counting``: as :meth:`Part.find_plain`'s.

    Raises:
        ValueError: the part is damaged.
    """
    kinds = p.cols[3]
    if any(a in rx.pattern for a in _ANCHORS):
        # an anchor means the start or end of a block (or line), not of a chunk: each block is
        # searched on its own
        got = p.find_regex(rx, False, False)
    else:
        prx, lowered, lit = search_plan(rx)
        if lit is not None and SEP not in lit:
            got = p.find_plain(lit.encode("utf-8"), lowered, counting)
        else:
            # a lookaround may see across the separator between two blocks: no chunk at once
            got = p.find_regex(prx, lowered, "(?" not in prx.pattern)
    return got if want is None else [i for i in got if kinds[i] in want]


class Index:
    """An open, fresh index of one store (see the module docstring)."""

    def __init__(self, store: Store, folder: str | None = None, unsaved: list[str] | None = None) -> None:
        if not indexable(store):
            raise IndexError_("an encrypted store has no search index (it would hold its text in the clear)")
        self.store = store
        self.folder = folder or index_dir(store)
        #: per session number: ``[app, user, session, segment name or None, first block in main,
        #: blocks in main, first block in res, blocks in res, ref folder ("": ``sessions/APP/USER/SESSION``
        #: as named), its stamp]`` (the stamp:
        #: :meth:`castore.refs.RefStore.folder_stamps` when its refs were read, None if not told)
        self.rows: list[list[Any]] = []
        self._sessions: list[dict[str, Any]] | None = None
        self._refs_file: tuple[str, list[int]] | None = None
        self.mark: str | None = None
        #: the sessions whose HEAD names a lost branch, as the last update that read their refs
        #: found them: folder -> ``[app, user, session, fsck's line]``
        self.lost: dict[str, list[str]] = {}
        self.strings: list[str] = []
        self.branch_sets: list[tuple[str, ...]] = []
        self.segments: list[dict[str, Any]] = []
        self.segs: list[Segment] = []
        self.rebuilt: list[Key] = []
        self._commits: Any = None
        self._stat: tuple[int, int, int] | None = None  # state.json's as loaded
        self._stamps: dict[str, int] = {}  # folder -> stamp, of the refs the last plan read
        self._held = False  # the writers' lock
        #: where why the index could not be saved is noted (None: IndexError_ is raised instead)
        self.unsaved = unsaved
        #: the index is kept in memory only: its folder could not be written (see :meth:`_cannot_save`)
        self._in_memory = False

    # -- reading --------------------------------------------------------------------------
    def _load(self) -> bool:
        """Read ``state.json`` and open every file it names; False when there is no usable index.
        A file an update removed meanwhile: ``state.json`` is read again (a few times)."""
        for _ in range(3):
            try:
                return self._load_once()
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError, IndexError):
                return False
        return False

    def _load_once(self) -> bool:
        path = os.path.join(self.folder, "state.json")
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            state = json.loads(f.read())
        if state.get("version") != VERSION or state.get("url") != store_url(self.store):
            return False
        self._stat = (st.st_ino, st.st_mtime_ns, st.st_size)
        self.rows = state["sessions"]
        if type(self.rows) is not list or not set(map(type, self.rows)) <= {list} \
                or not set(map(len, self.rows)) <= {10}:
            raise ValueError("sessions are not rows")
        self._refs_file = (state["refs"][0], state["refs"][1]) if state.get("refs") else None
        self._sessions = None
        self.mark = state["mark"]
        self.lost = state.get("lost") or {}  # (an index written before it: none known)
        if type(self.lost) is not dict or not all(type(v) is list and len(v) == 4 for v in self.lost.values()):
            raise ValueError("lost branches are not rows")
        self.strings = list(state["strings"])
        self.branch_sets = [tuple(b) for b in state["branch_sets"]]
        self.segments = state["segments"]
        self.segs = []
        self._commits = None
        base = 0
        for g in self.segments:
            self.segs.append(load_segment(self.folder, g, base))
            base += g["commits"]
        return True

    @property
    def commits(self) -> Any:
        """The 32-byte ids of every commit number, in order (every segment's, joined)."""
        if self._commits is None:
            self._commits = self.segs[0].commits if len(self.segs) == 1 else b"".join(
                bytes(s.commits) for s in self.segs)
        return self._commits

    def key(self, session: int) -> Key:
        """The key of session number ``session``."""
        r = self.rows[session]
        return (r[0], r[1], r[2])

    @property
    def sessions(self) -> list[dict[str, Any]]:
        """Every session as a dict: ``key``, ``folder``, ``refs``, ``seg``, ``at`` and ``n`` (per
        part), the refs read from their file on first use (an update's business: a search of an
        index that nothing moved since does not read them).

        Raises:
            ValueError: the refs file does not match its check.
            OSError: it cannot be read.
        """
        if self._sessions is None:
            refs: list[Any] = [None] * len(self.rows)
            if self._refs_file is not None:
                refs = json.loads(bytes(open_file(self.folder, *self._refs_file)))
                if len(refs) != len(self.rows):
                    raise ValueError("the refs do not agree with the sessions")
            self._sessions = [
                {"key": r[:3], "seg": r[3], "at": {"main": r[4], "res": r[6]}, "n": {"main": r[5], "res": r[7]},
                 "folder": f[0] if f else "", "refs": f[1] if f else None, "stamp": r[9]}
                for r, f in zip(self.rows, refs, strict=True)]
        return self._sessions

    def lost_branches(self) -> list[tuple[Key, str]]:
        """``(key, fsck's line)`` of each session whose HEAD names a lost branch
        (:func:`castore.plumbing.lost_branch_problem`), as the last update that read its refs found it."""
        return [((v[0], v[1], v[2]), v[3]) for v in self.lost.values()]

    def find_blocks(self, rx: re.Pattern[str], kinds: set[str] | None = None, *, counting: bool = False
                    ) -> list[list[tuple[Part, list[int]]]]:
        """The blocks (of these kinds) with a match of ``rx``, per session in session order: the
        session's runs of ``(part, block numbers)``, one per part searched that has any (root to
        tip within each; :func:`hits` gives them merged in order). Blocks no live session covers
        (dead) are left out.

        A case-insensitive ASCII pattern with no backslash runs case-sensitively, lowered, over
        the lowered text (Python's case-insensitive search is many times slower), and a
        pattern with no regex syntax runs as a plain string search; a pattern with an anchor
        (``^``, ``$``, ``\\A``, ``\\Z``) runs block by block. The caller matches the blocks
        found again with ``rx`` itself (``counting``: only those a count cannot count unread, as
        :meth:`castore.grep.files.Part.find_plain` says; the others are not kept to be read again).

        Raises:
            ValueError: a part is damaged (the caller rebuilds the index).
        """
        names = [name for name, held in PARTS.items() if kinds is None or kinds & set(held)]
        want = None if kinds is None else {i for i, k in enumerate(KINDS) if k in kinds}
        runs: dict[int, list[tuple[Part, list[int]]]] = {}  # session -> its runs
        lo, rows = bisect.bisect_left, self.rows
        # the segments each part of which some live session has blocks in (a part with none is not read)
        live = {name: {r[3] for r in rows if r[5 if name == "main" else 7]} for name in names}
        for seg in self.segs:
            for name in names:
                if seg.name not in live[name]:
                    continue
                p = seg.parts[name]
                held = PARTS[name]
                got = _hits(p, rx, None if want is None or set(held) <= kinds else want,  # type: ignore[operator]
                            counting)
                # the hits by run: a block's session is in its record, and the session's blocks
                # are one range of its segment's part (a block of that session outside it is dead,
                # a copy an update left): one look per session with a hit, not per session
                owner, at_col = p.cols[1], (4 if name == "main" else 6)
                i, n = 0, len(got)
                while i < n:
                    b = got[i]
                    si = owner[b]
                    if not 0 <= si < len(rows):
                        raise ValueError(f"index part {seg.name}.{name}: block {b} names no session")
                    r = rows[si]
                    at, end = r[at_col], r[at_col] + r[at_col + 1]
                    if r[3] == seg.name and at <= b < end:
                        j = lo(got, end, i)
                        runs.setdefault(si, []).append((p, got[i:j]))
                    else:  # a dead block
                        j = i + 1
                    i = j
        return [runs[si] for si in sorted(runs, key=self.key)]

    # -- keeping it fresh ----------------------------------------------------------------
    def refresh(self, check: bool = True, also: set[str] | frozenset[str] = frozenset()) -> Index:
        """Load the index and bring it up to date with the store's refs (extracting what moved).

        Args:
            check: ask the store what moved (False: trust an index that loads, as the last
                import or search left it; build one only when there is none).
            also: ref folders to read again whatever the ref-change log says (changed unlogged:
                :meth:`moved_unlogged`).

        Raises:
            IndexError_: the index folder cannot be written.
            StorageError, IntegrityError: the store cannot be read.
        """
        loaded = self._load()
        if loaded and not check:
            return self
        plan = self._plan(loaded, also)
        if plan is None:
            return self
        with self._locked():
            if not self._in_memory and self._stat != stat_of(os.path.join(self.folder, "state.json")):
                # another writer updated the index meanwhile: look again from what it wrote
                loaded = self._load()
                plan = self._plan(loaded, also)
                if plan is None:
                    return self
            mark, keys, current = plan
            if not loaded:
                self._write(keys, current, mark, full=True, old=False)
                return self
            try:
                self._update(keys, current, mark)
            except ValueError:  # a damaged part: everything from the store
                self._write(keys, current, mark, full=True, old=False)
        return self

    def _plan(self, loaded: bool, also: set[str] | frozenset[str] = frozenset()
              ) -> tuple[str | None, list[Key], dict[Key, tuple[str, dict[str, str]]]] | None:
        """What an update needs: ``(mark, keys, current refs)``, or None when the index is fresh
        (only a new mark, and the stamps of the folders read, to save: saved here)."""
        lost: dict[str, list[str]] = {}
        began = time.time_ns()  # a folder changed since (or a tick before) is stamped unsettled
        mark, read, folders = _changes(self.store, self.mark if loaded else None, lost, also)
        read_folders = sorted(f for f, _ in read.values())
        stamps = self.store.refs.folder_stamps(read_folders, began) if read_folders else None
        self._stamps = dict(zip(read_folders, stamps, strict=True)) if stamps else {}
        if folders is not None and loaded:
            lost = {**{f: v for f, v in self.lost.items() if f not in folders}, **lost}
        self.lost = lost
        if loaded and folders is not None and not folders:  # nothing moved: no session looked at
            self._save_mark(mark)
            return None
        try:
            old = {tuple(s["key"]): s for s in self.sessions if s.get("seg") is not None} if loaded else {}
        except (OSError, ValueError):  # the refs cannot be read: everything again
            loaded, old = False, {}
        if folders is None:
            current = dict(read)
        else:
            current = {k: (s["folder"], s["refs"]) for k, s in old.items() if s["folder"] not in folders}
            current.update(read)
        keys = sorted(current)
        same = loaded and len(old) == len(keys) and all(k in old and old[k]["refs"] == current[k][1] for k in keys)
        if not same:
            return mark, keys, current
        self._save_mark(mark)
        return None

    def _save_mark(self, mark: str | None) -> None:
        """Save a new mark of the ref changes and new stamps of the folders read (nothing else
        moved), unless another writer saved a state meanwhile."""
        stamped = [(r, s) for r in self.rows if (s := self._stamps.get(r[8] or _folder_of(r))) is not None
                   and r[9] != s] if self._stamps else []
        if mark != self.mark or stamped:
            with self._locked():
                if self._in_memory or self._stat == stat_of(os.path.join(self.folder, "state.json")):
                    self.mark = mark
                    for r, stamp in stamped:
                        r[9] = stamp
                    self._save_state()

    def moved_unlogged(self, runs: list[list[tuple[Part, list[int]]]]) -> bool:
        """Whether a session of ``runs`` (what :meth:`find_blocks` found) had its refs changed
        where the ref-change log does not tell (a folder or a branch file removed by hand: its
        stamp, :meth:`castore.refs.RefStore.folder_stamps`, is not the one recorded when its refs
        were read, or that one was unsettled: taken within a tick of the folder's change); if so
        those sessions' refs are read again and the index brought up to date, and True when that
        changed what it holds (the caller searches again). Two ``stat`` calls per session found,
        on local disk only.

        Raises:
            IndexError_, StorageError, IntegrityError: as :meth:`refresh`.
        """
        rows = [self.rows[p.cols[1][idx[0]]] for (p, idx), *_ in runs]
        folders = [r[8] or _folder_of(r) for r in rows]
        stamps = self.store.refs.folder_stamps(folders) if rows else None
        # (not those the update before this search read: they are as it found them, their
        # stamp unsettled when they changed within a tick of it, for the next search to look again)
        moved = {f for f, r, s in zip(folders, rows, stamps or (), strict=False) if s != r[9] and f not in self._stamps}
        if not moved:
            return False
        written = [g["name"] for g in self.segments]
        self.refresh(also=moved)
        return [g["name"] for g in self.segments] != written  # an update writes a new segment

    def rebuild(self) -> Index:
        """Build the index again from the store alone (what a damaged index file calls for).

        Raises:
            IndexError_, StorageError, IntegrityError.
        """
        self.lost = {}
        mark, read, _ = _changes(self.store, None, self.lost)
        with self._locked():
            self._write(sorted(read), read, mark, full=True, old=False)
        return self

    def _locked(self) -> Any:
        """The writers' lock of the index folder (made if need be), as a context manager; taken
        again inside itself it is already held (``flock`` on a second descriptor would wait for
        the first).

        Raises:
            IndexError_: the folder cannot be made or locked (unless :attr:`unsaved` is given).
        """
        @contextlib.contextmanager
        def held() -> Iterator[None]:
            if self._held or self._in_memory:
                yield
                return
            try:
                os.makedirs(self.folder, exist_ok=True)
                fd = os.open(os.path.join(self.folder, "lock"), os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as e:
                self._cannot_save(e)  # no lock to take: nothing will be written
                yield
                return
            import fcntl  # here: a search of an index nothing moved since takes no lock

            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._held = True
                yield
            finally:
                self._held = False
                os.close(fd)

        return held()

    def _update(self, keys: list[Key], current: dict[Key, tuple[str, dict[str, str]]], mark: str | None) -> None:
        """Write a new delta, or a new base when the dead blocks and the delta would pass
        :data:`COMPACT` of the base (see the module docstring); when a session is gone
        (deleted), a new index built from the store alone, so that none of its text or names
        stays."""
        old = {tuple(s["key"]): s for s in self.sessions if s.get("seg") is not None}
        if any(k not in current for k in old):
            # a deleted session: nothing of it may stay (its blocks, its names in the state,
            # its branch sets, its strings), so everything is built again from the store
            self._write(keys, current, mark, full=True, old=False)
            return
        moved = {k for k in old if k not in current or old[k]["refs"] != current[k][1]}
        base = self.segments[0]
        size = sum(base["n"].values())
        live = sum(sum(s["n"].values()) for k, s in old.items() if s["seg"] == base["name"] and k not in moved)
        rest = sum(sum(s["n"].values()) for k, s in old.items() if s["seg"] != base["name"] or k in moved)
        full = len(self.segments) == 0 or (size - live) + rest > COMPACT * size
        self._write(keys, current, mark, full=full, old=True)

    def _write(self, keys: list[Key], current: dict[Key, tuple[str, dict[str, str]]], mark: str | None, *,
               full: bool, old: bool) -> None:
        """Write one segment and the new state: with ``full`` a new base holding every session
        of ``current`` (else a delta holding the sessions outside the base), each copied from the
        index where its refs did not move (``old``: the loaded index may be used), else extracted
        from the store. Session numbers, commit numbers and strings stay as they were (a gone
        session keeps its number, with no blocks), so copied records hold."""
        if old:
            sessions = [dict(x) for x in self.sessions]
            strings = {x: i for i, x in enumerate(self.strings)}
            bsets = {x: i for i, x in enumerate(self.branch_sets)}
            kept_segs = [] if full else self.segs[:1]
            segments = [] if full else self.segments[:1]
            commits = Numbers([seg.commits for seg in self.segs])
            first = sum(g["commits"] for g in segments)  # the new segment's commits start here
        else:
            sessions, strings, bsets, kept_segs, segments, commits, first = [], {}, {}, [], [], Numbers([]), 0
        by_name = {s.name: s for s in self.segs} if old else {}
        number = {tuple(x["key"]): i for i, x in enumerate(sessions) if x.get("seg") is not None}
        for key in keys:
            if key not in number:
                number[key] = len(sessions)
                sessions.append({"key": list(key), "folder": "", "refs": None, "seg": None, "stamp": None,
                                 "at": dict.fromkeys(PARTS, 0), "n": dict.fromkeys(PARTS, 0)})
        name = self._new_name()
        built = {pname: Part(pname).begin() for pname in PARTS}
        self.rebuilt = []
        kept_names = {s.name for s in kept_segs}
        for key in keys:  # session order: each segment holds its sessions in order
            si = number[key]
            x = sessions[si]
            folder, refs = current[key]
            if x.get("seg") in kept_names and x["refs"] == refs:
                continue  # stays in the base, where it is
            src = by_name.get(x.get("seg") or "") if old and x["refs"] == refs else None
            at = {pname: built[pname].n for pname in PARTS}
            n = dict.fromkeys(PARTS, 0)
            if src is not None:
                for pname in PARTS:
                    a = x["at"][pname]
                    built[pname].copy(src.parts[pname], a, a + x["n"][pname])
                    n[pname] = x["n"][pname]
            else:
                self.rebuilt.append(key)
                was = by_name.get(x.get("seg") or "") if old else None
                if was is not None:  # its commits from before keep their numbers
                    for pname in PARTS:
                        a = x["at"][pname]
                        commits.hint(was.parts[pname].cols[0][a:a + x["n"][pname]])
                place = 0
                for cid, role, kind, tool, when, branches, blk, text in _extract(self.store, key):
                    pname = "res" if kind == "tool_result" else "main"
                    cn = commits.number(bytes.fromhex(cid))
                    rn = strings.setdefault(role, len(strings))
                    tn = strings.setdefault(tool, len(strings)) if tool is not None else -1
                    bn = bsets.setdefault(branches, len(bsets))
                    built[pname].add((cn, si, blk, KINDS.index(kind), rn, tn, bn, place), when,
                                     text)
                    place += 1
                    n[pname] += 1
            x.update(folder=folder, refs=refs, seg=name, at=at, n=n)
        for x in sessions:
            if tuple(x["key"]) not in current:
                x.update(seg=None, refs=None, at=dict.fromkeys(PARTS, 0), n=dict.fromkeys(PARTS, 0))
        files: dict[str, bytes] = {"commits": commits.table(first)}
        for p in built.values():
            files.update(p.files())
        record: dict[str, list[int]] = {}
        if not self._in_memory:
            try:
                os.makedirs(self.folder, exist_ok=True)
                for k, v in files.items():
                    record[k] = write_file(self.folder, f"{name}.{k}", v)
            except OSError as e:
                for k in record:  # (a full disk: what was written is of no use)
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.folder, f"{name}.{k}"))
                self._cannot_save(e)
        segments = [*segments, {"name": name, "n": {pname: built[pname].n for pname in PARTS},
                                "commits": len(files["commits"]) // 32, "files": record}]
        seg = Segment(name, first)
        seg.commits, seg.parts = files["commits"], built
        if not self._in_memory:
            for pname, p in built.items():  # known in the process's cache as a loaded part is
                p.ident = (self.folder, f"{name}.{pname}.z", *record[f"{pname}.z"])
        self._set_sessions(sessions)
        self.mark, self.strings = mark, list(strings)
        self.branch_sets = list(bsets)
        self.segments, self.segs = segments, [*kept_segs, seg]
        self._commits = None
        self._save_state()
        if not self._in_memory:
            self._remove_unused()

    def _new_name(self) -> str:
        """A name for a new segment: one more than the last in the state (a file of that name left
        by a writer that stopped before saving its state is replaced)."""
        last = max((int(g["name"][1:]) for g in self.segments if g["name"][1:].isdigit()), default=0)
        return f"g{last + 1}"

    def _remove_unused(self) -> None:
        """Remove every file of the folder the state does not name (best effort, under the writers'
        lock): the segments and refs an update replaced, what a writer that stopped before saving
        its state left, and the files of an index of an older version."""
        keep = {"state.json", "lock"}
        keep.update(f"{g['name']}.{k}" for g in self.segments for k in g["files"])
        if self._refs_file is not None:
            keep.add(self._refs_file[0])
        try:
            entries = os.listdir(self.folder)
        except OSError:
            return
        for f in entries:
            if f not in keep:
                try:
                    os.unlink(os.path.join(self.folder, f))
                except OSError:
                    pass

    def _set_sessions(self, sessions: list[dict[str, Any]]) -> None:
        """Take ``sessions`` (as :attr:`sessions` gives them) and write their refs to a new file.

        Raises:
            IndexError_: it cannot be written (unless :attr:`unsaved` is given).
        """
        self.rows = [[*x["key"], x["seg"], x["at"]["main"], x["n"]["main"], x["at"]["res"], x["n"]["res"],
                      "" if x["seg"] is None or x["folder"] == _folder_of(x["key"]) else x["folder"],
                      self._stamps.get(x["folder"], x.get("stamp")) if x["seg"] is not None else None]
                     for x in sessions]
        last = self._refs_file[0] if self._refs_file else "r0.refs"
        name = f"r{int(last[1:].split('.')[0]) + 1}.refs"
        self._sessions = sessions
        if self._in_memory:
            return
        data = json.dumps([[x["folder"], x["refs"]] if x["seg"] is not None else None for x in sessions]).encode()
        try:
            self._refs_file = (name, write_file(self.folder, name, data))
        except OSError as e:
            self._cannot_save(e)

    def _save_state(self) -> None:
        """Write ``state.json`` (nothing when the index is kept in memory).

        Raises:
            IndexError_: it cannot be written (unless :attr:`unsaved` is given).
        """
        if self._in_memory:
            return
        try:
            write_file(self.folder, "state.json", json.dumps({
                "version": VERSION, "url": store_url(self.store), "mark": self.mark, "strings": self.strings,
                "branch_sets": [list(b) for b in self.branch_sets], "segments": self.segments,
                "refs": list(self._refs_file) if self._refs_file else None, "sessions": self.rows,
                "lost": self.lost}).encode())
        except OSError as e:
            self._cannot_save(e)
            return
        self._stat = stat_of(os.path.join(self.folder, "state.json"))

    def _cannot_save(self, e: OSError) -> None:
        """Writing to the index folder failed with ``e`` (a folder that is read-only, on a read-only
        mount, of another user, a full disk): from here on the index is kept in this process's
        memory only, and why is noted in :attr:`unsaved` (what the search reads is what a saved
        index would hold; the next search builds or updates it again).

        Raises:
            IndexError_: :attr:`unsaved` is None (the caller wants the index saved).
        """
        why = f"cannot write the search index in {self.folder}: {e}"
        if self.unsaved is None:
            raise IndexError_(why) from e
        if not self._in_memory:
            self._in_memory = True
            self.unsaved.append(why)


def open_index(store: Store, folder: str | None = None, *, check: bool = True,
               unsaved: list[str] | None = None) -> Index:
    """The fresh index of ``store`` (built or updated as needed; see :meth:`Index.refresh`).
    ``unsaved``: where the index notes why it could not be saved, when its folder cannot be
    written, and is then built or updated in this process's memory only (None: raise IndexError_).

    Raises:
        IndexError_: the index folder cannot be written (``unsaved`` None).
        StorageError, IntegrityError: the store cannot be read.
    """
    return Index(store, folder, unsaved).refresh(check)


def update_if_present(store: Store) -> bool:
    """Bring ``store``'s index up to date if it has one (what an import calls); True if it did.

    Raises:
        IndexError_, StorageError, IntegrityError.
    """
    if not indexable(store) or not os.path.exists(os.path.join(index_dir(store), "state.json")):
        return False
    open_index(store)
    return True


__all__ = ["COMPACT", "HIT_COLS", "Index", "IndexError_", "hits", "index_dir", "indexable", "open_index",
           "search_plan"]
