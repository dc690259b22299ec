"""The shared engine of the coding-agent archives (Claude Code, Codex): JSONL files kept byte
for byte, imported incrementally, as a tree of commits.

Every line of a file becomes one commit (an :class:`~castore.entries.Event`) whose metadata
names the line's position in the file (``o``) and a blob holding its exact bytes (``raw``);
export writes those blobs back in file order, so the file comes back byte for byte whatever
the line holds (unknown types, key order, spacing, lines that are not JSON). The body of a
commit is what castore understands of the line (a message), so that ``log``, ``context``,
the HTML view and ``grep`` work on archived sessions as on any other. A line is parsed once
(:func:`parse_vouched`: msgspec where it gives what ``json.loads`` gives), its blob encoded
once (:func:`encode_blob`: named in the entry, stored by the writer), and an entry made of
a line whose values need no check (:func:`~castore.entries.vouched_event`) is not checked
again value by value when appended.

Where a line hangs in the tree is the adapter's business (:class:`TreeWriter` takes a parent
line per line); the writer groups lines that follow each other into one run, starts a branch
where a line's parent is not a branch tip, and checks out the branch of the line the agent
was on last. A session that had commits gets each run as one ``append_many``; a session new
with the import (a first import, most of its lines) is built in memory by the session's
:class:`~castore.plumbing.Tree` (the same commits, made by the rule every append follows)
and its branches move once per landing of the write batch and once at the file's end,
not once per run. Only the public :class:`~castore.Session` API is used.

Incremental state (how far the file was read, a digest of the imported prefix, the last
line's place in the tree, a digest of the branch tips it left) is kept in the session's info
under the adapter's key, written once an import has written its lines. An import stopped
before that (kill -9, Ctrl-C) leaves lines beyond the recorded position; the next import
finds the tips changed, reads which lines the session holds (each commit names its line),
and reads the file again from the recorded position, taking a line already stored as it is
instead of writing it twice (:class:`TreeWriter`): the position is derived from what is
stored, so an import can stop at any moment and the next one finishes it, byte for byte.
A file that did not grow past its recorded position, whose session's branches still have the
recorded digest, is done with its stat, its prefix digest and a listing of the branches
(:func:`settled_head`): nothing is read of the session's history.

Commits castore makes on top of an imported session (an agent continuing it through the
library) are no line of the file: export writes them after the file's bytes as lines of the
vendor's format (:func:`appended` finds them; each adapter renders them), each line naming
its commit. When an import meets such a line naming a commit the session holds, it keeps the
line's bytes and records it (``adopted``: line number -> commit, blob) instead of adding a
copy, so that exporting, letting the agent go on, and importing again gives one history.

An import of many files runs in write batches (:func:`import_batched`, over
:meth:`castore.Store.batch`): the ref moves of :data:`BATCH_FILES` files (or of
:data:`BATCH_BYTES` read) land together, one sync for the lot, instead of each file's appends,
branches and position landing one by one. Stopped part-way, the files of the batch under way
are as if not imported yet, and the next import does them (the recovery above still holds for
a landing stopped half-way: a session's position moves only once its branches did).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import hashlib
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any, NamedTuple, ParamSpec, Protocol, TypeVar

from .. import objects as o
from ..entries import MAX_DEPTH, Event, Prepared, body_of, check_value, prepare, vouched_event
from ..errors import BranchError, CastoreError, CorruptRef, InvalidEntry, RefConflict
from ..groupcommit import land_due, landing_due
from ..objects import Blob
from ..objectstore import gc_paused
from ..redact import kind_counts, recording
from ..session import NEW_BRANCH

if TYPE_CHECKING:
    from ..entries import LogEntry, Message
    from ..objects import ObjectId
    from ..plumbing import Tree
    from ..redact import Redactor
    from ..session import Session, SessionHost
    from ..store import Store

#: flush a run of lines once its raw bytes add up to this much
RUN_BYTES = 8 << 20
#: the digest of an imported prefix covers its length and its first and last WINDOW bytes
WINDOW = 64 << 10
#: how branches are named: 2, by what made them (``main`` the path to the newest leaf); 1, ``line-<n>``
LAYOUT = 2
#: an import lands its ref moves (:func:`import_batched`) after this many files, or once the
#: files it read since add up to BATCH_BYTES, or every :data:`~castore.groupcommit.LAND_EVERY`
#: seconds (between files and between runs of lines of one file)
BATCH_FILES = 1024
BATCH_BYTES = 64 << 20
#: an import runs with Python's cyclic collector paused and collects the young generations
#: itself after this many files (:func:`import_batched`)
COLLECT_EVERY = 1024

_T = TypeVar("_T")


def import_batched(store: Store, items: Iterable[_T], each: Callable[[_T], int]) -> None:
    """Call ``each`` on every item (a file to import; it returns the bytes it read) inside one
    write batch of ``store`` (:meth:`castore.Store.batch`), landed after every
    :data:`BATCH_FILES` items or :data:`BATCH_BYTES` read, when due
    (:func:`~castore.groupcommit.land_due`: also between the runs of lines :class:`TreeWriter`
    appends), and at the end (also when ``each`` raises an ordinary exception: the files
    before it stay imported).

    Python's cyclic collector is paused meanwhile, the last landing too, and the young
    generations are collected every :data:`COLLECT_EVERY` files: left on, it walked everything
    the import keeps alive (the batch's staged refs and written lines, the caches) again each
    time they grew, a quarter of a 200 MB import's time. What a file leaves behind is freed
    when the file is done (an importer makes no reference cycle); the collection is for a
    cycle that escapes that, and walks only what is still alive.

    Raises:
        what ``each`` raises; RefConflict (another writer moved a session's ref meanwhile:
        that session's position did not move, the next import goes on from it), RefLocked,
        StorageError.
    """
    with gc_paused(), store.batch() as batch:
        files = size = done = 0
        for item in items:
            size += each(item)
            files += 1
            done += 1
            if done % COLLECT_EVERY == 0:
                gc.collect(1)
            if files >= BATCH_FILES or size >= BATCH_BYTES or batch.due():
                batch.land()
                files = size = 0


def layout_of(state: Mapping[str, Any]) -> int:
    """The branch layout a session's import state says (1 for one imported before layouts
    were recorded, :data:`LAYOUT` for a new one)."""
    v = state.get("layout")
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    return 1 if state.get("path") else LAYOUT


class ArchiveError(CastoreError, ValueError):
    """A coding-agent session file or tree cannot be imported or exported.

    Attributes:
        path: the file or folder at fault.
        reason: what is wrong.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def files_under(folder: str, suffixes: str | tuple[str, ...] = "") -> Iterator[str]:
    """The regular files below ``folder`` whose names end with one of ``suffixes`` (any name
    by default), a folder's files by name before its subfolders by name, never through a
    symbolic link: a linked folder or file is passed over, so that an import reads only
    what lies under the folder it was given. Raises nothing (an unreadable folder is
    passed over, as :func:`os.walk` does)."""
    for root, dirs, files in os.walk(folder):  # followlinks=False: no linked folder is entered
        dirs.sort()
        for fn in sorted(files):
            full = os.path.join(root, fn)
            if fn.endswith(suffixes) and not os.path.islink(full) and os.path.isfile(full):
                yield full


@dataclass
class FileResult:
    """What importing one file did.

    Attributes:
        path: the file read.
        session: the session's ``(app, user, session)``.
        lines: lines imported by this call (0: nothing new).
        total: lines of the file now in the archive.
        offset: bytes of the file now in the archive.
        branches: branches created by this call.
        head: the commit HEAD is on (the line the agent was on last).
        torn: bytes at the end left for next time (a line still being written).
        notes: what was noticed (a changed prefix, lines that are not JSON).
        sidechains: the ids of the sessions that got lines of subagents kept inside this
            file (Claude Code's old layout).
        redacted: how many secrets of each kind were replaced before they were stored
            (``{"aws-access-key": 2}``: two keys, however often each appears; empty unless
            the store redacts writes), the file's subagents kept inside it too.
    """

    path: str
    session: tuple[str, str, str]
    lines: int = 0
    total: int = 0
    offset: int = 0
    branches: list[str] = field(default_factory=list)
    head: str | None = None
    torn: int = 0
    notes: list[str] = field(default_factory=list)
    sidechains: list[str] = field(default_factory=list)
    redacted: dict[str, int] = field(default_factory=dict)


_P = ParamSpec("_P")


def counts_redactions(run: Callable[_P, FileResult]) -> Callable[_P, FileResult]:
    """Decorator of an import of one file: its :class:`FileResult` says what the store's
    redactor replaced while it ran (:attr:`FileResult.redacted`, never the secrets)."""

    @functools.wraps(run)
    def counted(*args: _P.args, **kwargs: _P.kwargs) -> FileResult:
        with recording() as found:
            res = run(*args, **kwargs)
        res.redacted = kind_counts(found)
        return res

    return counted


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a dict, else an empty one (for fields of untrusted JSON)."""
    return value if isinstance(value, dict) else {}


def parse_time(ts: Any) -> float | None:
    """Seconds since the epoch of an ISO 8601 timestamp, or None."""
    if not isinstance(ts, str):
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def prefix_digest(f: IO[bytes], length: int) -> str:
    """A digest of the file's first ``length`` bytes: its length, first and last WINDOW bytes.

    Reading the whole prefix again at every poll would make following a long session
    quadratic; an agent only appends, and a rewrite shows in the first or last bytes.
    """
    h = hashlib.sha256(str(length).encode() + b"\0")
    f.seek(0)
    h.update(f.read(min(length, WINDOW)))
    if length > WINDOW:
        f.seek(max(WINDOW, length - WINDOW))
        h.update(f.read(length - max(WINDOW, length - WINDOW)))
    return h.hexdigest()


#: what :func:`parse_line` returns for a line that is not JSON
NOT_JSON: Any = object()


def parse_line(raw: bytes | str) -> Any:
    """The JSON value of a line as ``json.loads`` gives it, or :data:`NOT_JSON` (also for a
    line nested deeper than Python's recursion limit: such a line is kept as it is, as any
    other non-JSON line)."""
    return parse_vouched(raw)[0]


def parse_vouched(raw: bytes | str) -> tuple[Any, bool]:
    """:func:`parse_line`, and whether the value is vouched for: every number in it finite,
    every key a string, nested no deeper than :data:`~castore.entries.MAX_DEPTH` (what
    :func:`~castore.entries.check_value` would find of it and of any part of it), so that
    an entry built of it can be made by :func:`~castore.entries.vouched_event`.

    msgspec's decoder gives what ``json.loads`` gives wherever it accepts the text, twice as
    fast; it refuses what only ``json.loads`` takes (``NaN``, ``Infinity``, numbers beyond a
    float, lone surrogates, a byte-order mark), which then ``json.loads`` parses, unvouched.
    """
    try:
        value = o.json_loads(raw)
    except (ValueError, RecursionError):  # InvalidEntry is a ValueError
        import json

        try:
            return json.loads(raw), False
        except (ValueError, RecursionError):
            return NOT_JSON, False
    # no more containers in the text than MAX_DEPTH: none can nest deeper
    if isinstance(raw, bytes):
        return value, raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH
    return value, raw.count("[") + raw.count("{") <= MAX_DEPTH


def line_event(author: str, message: Message | None, meta: dict[str, Any], vouched: bool) -> Event:
    """The entry of an archived line: made by :func:`~castore.entries.vouched_event` when
    ``vouched`` (:func:`parse_vouched` said so of the line, and the adapter built ``author``
    (a string), ``message`` and ``meta`` of the line's values and of its own strings and
    numbers, nesting none of the line's values deeper than the line does), else an
    :class:`~castore.entries.Event` checked in full.

    Raises:
        InvalidEntry: (not vouched) an author that is not a string, meta with a key that is not.
    """
    if vouched:
        return vouched_event(author, message, meta)
    return Event(author=author, message=message, meta=meta)


def tips_digest(branches: Mapping[str, str]) -> str:
    """A short digest of a session's branch tips: what an import records, so that the next
    one sees whether lines were written after the recorded position (an interrupted import)."""
    h = hashlib.sha256()
    for name, tip in sorted(branches.items()):
        h.update(f"{name}\0{tip}\n".encode())
    return h.hexdigest()[:32]


def settled_head(session: Session, tips: Any) -> tuple[bool, ObjectId | None]:
    """Whether ``session``'s branches are as the last finished import left them (their
    :func:`tips_digest` is ``tips``, the digest it recorded), and HEAD's commit when they are.

    A file with nothing after its recorded position then has nothing to do: no line to read,
    none an interrupted import left behind, no branch to lay out. Branches moved since (an
    interrupted import's lines, a user's ``castore branch``) are not settled: the import goes
    its whole way and :class:`TreeWriter` finds what changed.

    Raises:
        CorruptRef, IntegrityError, StorageError.
    """
    branches = session.branches()
    if not branches or tips != tips_digest(branches):
        return False, None
    current = session.current_branch
    return True, branches[current] if current in branches else session.head


def stored_lines(session: Session, key: str) -> dict[int, tuple[str, str, str | None]]:
    """Line number -> ``(commit, raw blob id, parent commit)`` of the lines a session holds of
    its own file (metadata under ``key``; a line naming another file, ``f``, is a forked
    parent's).

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
    """
    out: dict[int, tuple[str, str, str | None]] = {}
    for le in session.log(all_branches=True) if session.branches() else ():
        m = le.meta.get(key)
        if isinstance(m, dict) and isinstance(m.get("o"), int) and isinstance(m.get("raw"), str) \
                and m.get("f", session.id) == session.id:
            out.setdefault(m["o"], (le.id, m["raw"], le.parents[0] if le.parents else None))
    return out


class LineChanged(ArchiveError):
    """A line the session holds from an interrupted import is not the file's line at that place
    (the file was rewritten since)."""


def read_lines(f: IO[bytes], offset: int, redactor: Redactor | None = None) -> Iterator[tuple[int, bytes]]:
    """Yield ``(end offset, line bytes with its newline)`` for each complete line after ``offset``.

    A last line without a newline is yielded only when it parses as JSON (a file that simply
    does not end with a newline); otherwise it is a line the agent is still writing, and is
    left for next time. When the line before ``offset`` had no newline and the file now has
    one there, that newline ends the line before (what :func:`joined` writes after it when
    lines follow), not a line of its own.
    With a ``redactor`` (the store's, :attr:`castore.Store.redactor`) each line comes
    redacted: an importer sees, stores and exports the redacted bytes and never the original
    (offsets stay the file's own).
    """
    pos = offset + newline_after(f, offset)
    f.seek(pos)
    while True:
        raw = f.readline()
        if not raw:
            return
        if not raw.endswith(b"\n") and parse_line(raw) is NOT_JSON:
            return
        pos += len(raw)
        yield pos, (raw if redactor is None else redactor.raw(raw))


def newline_after(f: IO[bytes], offset: int) -> bool:
    """Whether the line ending at ``offset`` had no newline and the file now holds one there
    (it arrived after that line was imported): :func:`read_lines` skips it as the line's."""
    if not offset:
        return False
    f.seek(offset - 1)
    two = f.read(2)
    return len(two) == 2 and two[:1] != b"\n" and two[1:] == b"\n"


#: the archive state's flag (under the adapter's key): the file's last stored line has no newline
#: but the file has one after it, which arrived later with nothing after it; the export writes it
NEWLINE = "newline"


def record_newline(session: Session, key: str, info: Mapping[str, Any], f: IO[bytes], offset: int) -> int:
    """Record in ``session``'s info (under ``key``, the archive state whose position is ``offset``)
    a newline that arrived after the last stored line with no line after it (:data:`NEWLINE`,
    the position past it and its digest), so that the export is byte for byte and the next
    import starts past it; returns the position now (``offset`` when there is none).

    Raises:
        RefConflict: a rival import recorded its position meanwhile (a lost race, ``expect``).
        StorageError, OSError.
    """
    if not newline_after(f, offset):
        return offset
    c = {**as_dict(info.get(key)), "offset": offset + 1, "digest": prefix_digest(f, offset + 1), NEWLINE: True}
    session.set_info({**info, key: c}, expect=info)
    return offset + 1


def stored_bytes(store: SessionHost, raw: bytes) -> bytes:
    """``raw`` as the store keeps it: redacted when the store redacts writes (text only)."""
    r = store.plumbing.redactor
    return raw if r is None else r.data(raw)


def joined(*parts: Iterable[bytes], end: bool = False) -> Iterator[bytes]:
    """The lines of ``parts`` in order, with a newline after a line that has none when another
    line follows it (a file that did not end with a newline, and lines castore wrote after it),
    so that the result stays JSONL; :func:`read_lines` takes that newline back as the line's.
    A line that is only ``\r\n`` is that line's ending (a file of CRLF lines whose last line was
    imported before its ending arrived), so nothing goes before it. With ``end`` (the state's
    :data:`NEWLINE`) the last line gets its newline too."""
    last = b"\n"
    for part in parts:
        for line in part:
            if not line:
                continue
            if not last.endswith(b"\n") and line != b"\r\n":
                yield b"\n"
            yield line
            last = line
    if end and not last.endswith(b"\n"):
        yield b"\n"


def put_blobs(store: SessionHost, raws: list[bytes], read: bool = False) -> list[str]:
    """Store each bytes as a blob (content-addressed: a line seen before costs nothing),
    redacted when the store redacts writes (:func:`stored_bytes`), unless ``read``: lines
    :func:`read_lines` gave, redacted already. Where ref swaps are journaled (format 3 on
    local disk) they are made durable by the next swap's intent, as an append's objects are
    (the commits that name them land with it)."""
    encode = store.objects.codec.encode
    return put_encoded_blobs(store, [encode(Blob(data=r if read else stored_bytes(store, r))) for r in raws])


def put_encoded_blobs(store: SessionHost, encoded: list[tuple[str, bytes]]) -> list[str]:
    """Store blobs encoded already (:func:`encode_blob`), as :func:`put_blobs` does; return their ids."""
    store.objects.put_encoded(encoded, sync=not store.objects.defers_refs)
    return [oid for oid, _ in encoded]


def read_blobs(store: SessionHost, oids: list[str]) -> dict[str, bytes]:
    """The bytes of blobs, by id.

    Raises:
        ObjectNotFound, IntegrityError, InvalidEntry: an id that is not a blob.
    """
    got = store.objects.get_canonical_many(list(dict.fromkeys(oids)))
    out = {}
    for oid, canonical in got.items():
        b = o.decode(oid, canonical)
        if not isinstance(b, Blob):
            raise InvalidEntry(f"object {oid} is not a blob")
        out[oid] = b.data
    return out


class Node(Protocol):
    """A commit as :func:`branch_layout` reads it: its id, its parents and its metadata (a
    :class:`~castore.entries.LogEntry`, or a :class:`Written` commit of this import)."""

    @property
    def id(self) -> str: ...
    @property
    def parents(self) -> tuple[str, ...]: ...
    @property
    def meta(self) -> Mapping[str, Any]: ...


class Written(NamedTuple):
    """A commit a :class:`TreeWriter` appended: its id, its parent (none for the root) and
    the metadata it was given (what :func:`branch_layout` reads of it)."""

    id: str
    parents: tuple[str, ...]
    meta: Mapping[str, Any]


@dataclass(slots=True)
class _Pending:
    n: int
    raw: bytes
    entry: Event
    active: bool
    blob: tuple[str, bytes]


def _storable(entry: Event) -> Event:
    """``entry``, or ``entry`` without its message when castore cannot store that (a line's
    content nested deeper than entries may be, a number msgpack cannot hold): the line's raw
    bytes keep it all."""
    try:
        body = body_of(entry) or {}
        for k, v in body.items():
            check_value(v, k)
        o.pack(body)
    except InvalidEntry:
        return dataclasses.replace(entry, message=None)
    return entry


class TreeWriter:
    """Appends lines to a session as a tree through the public Session API.

    ``add(n, parent, ...)`` names each line by its ordinal ``n`` and its parent by ordinal
    (None: a root, only for the very first line). Lines whose parent is the previous line
    are appended together; a line whose parent is a branch tip extends that branch; any other
    parent starts a branch ``<kind>-<n>``, the kind being the ``fork`` the adapter wrote in
    the line's metadata (``rewind``, ``rollback``; ``fork`` when it says none). Appends go to
    the branch they extend without checking it out (``append_many(branch=...)``). In a session
    with no branches when the writer is made, the runs are built in memory instead
    (:meth:`castore.Session.tree`) and the branches land where the write batch lands: just
    before a landing that is due between runs (:func:`~castore.groupcommit.landing_due`) and
    at :meth:`finish` (stopped before, the file is imported again by the next import, from
    what landed).
    :meth:`finish` makes ``main`` the path to the last line the agent was on (HEAD on it) and
    names every other leaf's branch by :func:`branch_layout`. A session imported before
    branches had these names (``layout`` 1: branches ``line-<n>``, HEAD on the branch the
    agent was on) keeps them: new branches are ``line-<n>`` and HEAD follows the agent as it
    did. Each commit takes its line's time (``time`` in
    the entry's meta); a line without one takes the time of the line before it, and a line
    before any line with a time takes 0.0 (the epoch: unknown), never the clock's, so that the
    same file gives the same commits wherever and whenever it is imported.

    With ``meta_key`` (the adapter's metadata key) and ``tips`` (the digest the last finished
    import recorded, :meth:`branch_digest`), a line an interrupted import already stored is taken as
    it is, not written again. The writer keeps the session's branches as it moves them (it
    lists them once, when made, and again only after laying them out), so that the digest it
    records costs no listing.

    With ``keep``, a session that had no commits before keeps what this writer appended in
    :attr:`written` (``(commit, entry, raw line)`` in order; None for a session that had
    commits): the session's whole log, for an adapter that looks through it after the
    import without reading it back. Of such a session the writer keeps the tree it made
    (:attr:`tree`: ids, parents, metadata), so that :meth:`finish` lays the branches out
    without reading the session's log back.

    Raises (when made):
        CorruptRef: the session's HEAD names a branch that was lost
            (:meth:`castore.Session.lost_branch`): the import would start a new root on that
            name and hide the loss from fsck, as an append would (nothing is written).
    """

    def __init__(self, session: Session, known: dict[int, str], key: str, last_time: float | None = None, *,
                 meta_key: str | None = None, tips: Any = None, layout: int = LAYOUT, keep: bool = False) -> None:
        self.session = session
        self.key = key
        self.meta_key = meta_key
        self.layout = layout
        self.cid: dict[int, str] = dict(known)  # ordinal -> commit
        branches = session.branches()  # (an import may have stopped before the session's HEAD was made)
        #: lines written by an import that stopped before recording its position (found when
        #: the branch tips are not the ``tips`` digest the last finished import recorded)
        self.stored: dict[int, tuple[str, str, str | None]] = {}
        self.active_commit: str | None = None  # the last active line, when it was stored before
        self.resuming = meta_key is not None and bool(branches) and tips != tips_digest(branches)
        if self.resuming:
            assert meta_key is not None
            self.stored = stored_lines(session, meta_key)
        self.written: list[tuple[str, Event, bytes]] | None = [] if keep and not branches else None
        #: for a session that had no commits before: every commit appended, with its parent
        #: (the session's whole tree, for :meth:`_lay_out`); None for a session that had commits
        self.tree: list[Written] | None = [] if not branches else None
        self.tips: dict[str, str] = {}
        for name, tip in branches.items():
            self.tips.setdefault(tip, name)
        #: the session's branches as this writer leaves them (it and :meth:`_lay_out` are the
        #: only ones to move them during the import: in a write batch, the staged refs are
        #: what every read sees), for :meth:`branch_digest`
        self.branches = dict(branches)
        #: whether the session's HEAD is stored (an append makes it)
        self.exists = session.exists()
        #: a session with no branches yet: its commits are built in memory and its branches
        #: moved once per landing (:meth:`_publish`), not appended run by run
        self.build: Tree | None = session.tree() if not branches else None
        #: the branch HEAD is to be made on at the next :meth:`_publish` (the session had none)
        self.head_on: str | None = None
        self.current = session.current_branch if self.exists else "main"
        if self.exists and self.current is not None and self.current not in branches \
                and (lost := session.lost_branch()) is not None:
            # not a new root on the lost branch's name (append refuses it too): nothing written yet
            raise CorruptRef(session.refs.head, lost)
        self.active = self.current
        self.run: list[_Pending] = []
        self.run_parent: int | None = None
        self.run_bytes = 0
        self.created: list[str] = []
        self.active_cid: str | None = None  # the commit of the last active line written
        self.labels: list[tuple[int, str]] = []
        #: the time of the last line that had one (for the lines after it that have none)
        self.last_time = last_time
        self._times: list[float | None] = []

    def add(self, n: int, parent: int | None, raw: bytes, entry: Event, active: bool,
            blob: tuple[str, bytes] | None = None) -> None:
        """Queue line ``n`` after line ``parent``; ``active``: a line the agent's HEAD follows;
        ``blob``: the line's blob as :func:`encode_blob` gives it, when the caller made it.

        Raises:
            LineChanged: the session holds another line ``n`` (written by an interrupted
                import of a file rewritten since).
        """
        when = entry.meta.get("time")
        if isinstance(when, (int, float)) and not isinstance(when, bool):
            self.last_time = float(when)
        if blob is None:
            blob = encode_blob(raw, self.session.store.objects.codec)
        hit = self.stored.get(n)
        if hit is not None:
            if hit[1] != blob[0]:
                raise LineChanged(self.key, f"line {n + 1} is not the one an interrupted import stored "
                                            "(file rewritten?)")
            self.flush()
            self.cid[n] = hit[0]
            if active:
                self.active_commit = hit[0]
            return
        if self.run and (parent != self.run[-1].n or self.run_bytes >= RUN_BYTES):
            self.flush()
        if not self.run:
            self.run_parent = parent
        self.run.append(_Pending(n, raw, entry, active, blob))
        self._times.append(self.last_time if self.last_time is not None else 0.0)
        self.run_bytes += len(raw)

    def label(self, n: int, name: str) -> None:
        """Put label ``name`` on line ``n`` at :meth:`finish` (a bad name is skipped)."""
        self.labels.append((n, name))

    def flush(self) -> None:
        """Append the queued run (in a session new with this writer: build it in memory, and
        move the branches first when the write batch is about to land).

        Raises:
            ArchiveError: the run starts a second root in a session that has one.
            RefConflict: a branch moved since it was read. StorageError.
        """
        if not self.run:
            return
        s = self.session
        put_encoded_blobs(s.store, [p.blob for p in self.run])
        parent = self.cid[self.run_parent] if self.run_parent is not None else None
        expect = parent
        if parent is None:
            # a root already: in a session new with this writer, one it built (no ref names
            # it yet); else what the session's HEAD names
            rooted = bool(self.tree) if self.build is not None else self.exists and s.head is not None
            if rooted:
                raise ArchiveError(self.key, "a second root line: cannot start a new tree in a session")
            branch = self.current or "main"
            if branch not in self.branches:  # another import of the file may be making it
                expect = NEW_BRANCH
        else:
            got = self.tips.get(parent)
            if got is None:
                branch = self._new_name(self.run[0])
                # a branch an import stopped before its lines made is taken as it is
                if self.build is None and (not self.resuming or self.branches.get(branch) != parent):
                    self._branch(branch, parent)
                self.created.append(branch)
            else:
                branch = got
        if self.build is not None:
            if parent is None and not self.exists:
                self.head_on = branch
            ids = self.build.extend(parent, [self._prepared(p, t) for p, t in zip(self.run, self._times, strict=True)])
        else:
            try:
                ids = s.append_many([p.entry for p in self.run], expect=expect, branch=branch, times=self._times)
            except InvalidEntry:  # nothing was written: a body castore cannot store (nested too deep)
                for p in self.run:
                    p.entry = _storable(p.entry)
                ids = s.append_many([p.entry for p in self.run], expect=expect, branch=branch, times=self._times)
        if parent is not None:
            self.tips.pop(parent, None)
        self.tips[ids[-1]] = branch
        self.branches[branch] = ids[-1]
        self.exists = True
        written, tree, cids = self.written, self.tree, self.cid
        active_cid = None
        before = parent
        for p, cid in zip(self.run, ids, strict=True):
            if written is not None:
                written.append((cid, p.entry, p.raw))
            if tree is not None:
                tree.append(Written(cid, (before,) if before is not None else (), p.entry.meta))
            cids[p.n] = cid
            if self.resuming:  # where each line hangs, for :meth:`_owner`
                self.stored.setdefault(p.n, (cid, "", before))
            if p.active:
                active_cid = cid
            before = cid
        if active_cid is not None:
            self.active, self.active_commit = branch, None
            self.active_cid = active_cid
        self.run, self.run_bytes, self._times = [], 0, []
        if self.build is not None and landing_due():
            self._publish()
        land_due()  # a long file's runs land as they go when the import runs in a write batch

    def _prepared(self, p: _Pending, when: float | None) -> Prepared:
        """The line's entry checked and split (:func:`~castore.entries.prepare`), without its
        message when castore cannot store that (:func:`_storable`)."""
        try:
            return prepare(p.entry, at=when)
        except InvalidEntry:
            p.entry = _storable(p.entry)
            return prepare(p.entry, at=when)

    def _publish(self) -> None:
        """Move the branches this writer built in memory (a session new with it) to their
        tips, at once, and make HEAD if the session had none (:meth:`~castore.plumbing.Tree.publish`)."""
        assert self.build is not None
        self.build.publish(self.branches, self.head_on)
        self.head_on = None

    def _branch(self, name: str, at: str) -> None:
        """Make branch ``name`` at ``at``; one another import of the file made meanwhile is a
        lost race (RefConflict: that import goes again, from what is stored), not an error."""
        try:
            self.session.branch(name, at=at)
        except BranchError as e:
            if name in self.branches or name not in self.session.branches():
                raise
            raise RefConflict(self.session.refs.branch(name), None, self.session.branches()[name],
                              f"branch {name!r} of {self.key} was made by another import meanwhile") from e

    def _new_name(self, first: _Pending) -> str:
        """The name of a branch starting at line ``first`` (``line-<n>`` in a layout 1 session)."""
        if self.layout < 2:
            return f"line-{first.n}"
        return f"{fork_kind(first.entry.meta, self.meta_key) or 'fork'}-{first.n}"

    def finish(self) -> str | None:
        """Flush, put the labels, check out the branch the agent was on; return HEAD's commit."""
        self.flush()
        s = self.session
        if self.build is not None:
            self._publish()
        if not self.cid:
            return None
        if self.active_commit is not None:
            self.active = self._owner(self.active_commit) or self.active
            self.active_cid = self.active_commit
        for n, name in self.labels:
            if n in self.cid:
                try:
                    s.label(name, at=self.cid[n], force=True)
                except CastoreError:
                    pass  # a summary that is not a valid label name stays in the line itself
        if self.layout >= 2 and (self.resuming or self.active != "main"):
            self._lay_out()
            return s.head
        _, on, head = s.head_state()
        want = "main" if self.layout >= 2 else self.active
        if want and want != on:
            s.checkout(want)
            return s.head
        return head

    def _lay_out(self) -> None:
        """Name the session's branches as :func:`branch_layout` says and check out ``main``.

        Each leaf gets its new name before an old one is moved or deleted, and a moved branch's
        old tip goes to the reflog: stopped at any point, nothing is lost, and the next import
        (which finds the tips changed) lays the names out again.
        """
        s = self.session
        branches = s.branches()
        before = set(branches) - set(self.created)
        # with no active line this run, the agent is where the last import left main: HEAD may
        # be on a user's checkout (``castore checkout``), which is no line of the agent's
        active = self.active_cid or branches.get("main") or branches.get(self.active or "main") or s.head
        if active is None:
            return
        adopted = {cid: n for n, cid in self.cid.items()}
        if self.meta_key is not None:
            adopted.update({cid: n for n, _, cid in adopted_rows(s.info, self.meta_key)})
        # a session new with this writer holds what it wrote, and nothing else: not read back
        tree: Sequence[Node] = self.tree if self.tree is not None else s.log(all_branches=True)
        want = branch_layout(tree, active, self.meta_key, adopted)
        for name, tip in want.items():
            if name != "main" and branches.get(name) != tip and s.current_branch != name:
                s.branch(name, at=tip, force=True)
        if branches.get("main") != want["main"]:
            if s.current_branch == "main":
                s.reset(want["main"])
            else:
                s.branch("main", at=want["main"], force=True)
        if s.current_branch != "main":
            s.checkout("main")
            now = s.branches()
            for name, tip in want.items():  # the one HEAD was on before
                if now.get(name) != tip:
                    s.branch(name, at=tip, force=True)
        for name in s.branches():
            if name not in want and _LAID_OUT.fullmatch(name):
                try:
                    s.delete_branch(name)  # refused (kept) when its tip is on no other branch
                except CastoreError:
                    pass
        self.branches = s.branches()
        self.created[:] = [name for name in self.branches if name not in before]

    def _owner(self, cid: str) -> str | None:
        """The branch a stored line was appended to: the one whose own segment (from its tip
        down to its first line, ``n`` of ``line-<n>``; the root for another name) holds it."""
        o_of = {v[0]: o for o, v in self.stored.items()}
        parent_of = {v[0]: v[2] for v in self.stored.values()}
        for name, tip in self.session.branches().items():
            m = _LAID_OUT.fullmatch(name)
            start = int(m.group(1)) if m and m.group(1) else -1
            c: str | None = tip
            while c is not None and c in o_of:
                if c == cid:
                    return name
                if o_of[c] == start:
                    break
                c = parent_of[c]
        return None

    def branch_digest(self) -> str | None:
        """The digest of the session's branch tips, to record with the import's position (of
        the branches as this writer left them: no listing again), None for a session not stored
        (neither its HEAD nor a branch: a rival import may have landed the branches and not yet
        the HEAD when this writer opened, and then this writer adds no line of its own)."""
        return tips_digest(self.branches) if self.exists or self.branches else None


#: the names :func:`branch_layout` gives (and ``line-<n>``, layout 1's): the branches an import may rename
_LAID_OUT = re.compile(r"(?:rewind|rollback|checkpoint|fork|line)-(?:(\d+)|c[0-9a-f]{8})(?:-[0-9a-f]{8})?")


def fork_kind(meta: Mapping[str, Any], key: str | None) -> str | None:
    """The kind of alternative a line starts (``rewind``, ``rollback``), as its adapter marked it."""
    m = meta.get(key) if key is not None else None
    k = m.get("fork") if isinstance(m, Mapping) else None
    return k if isinstance(k, str) and k.isidentifier() else None


def branch_layout(log: Sequence[Node], active: str, key: str | None,
                  lines: Mapping[str, int] | None = None) -> dict[str, str]:
    """The branch names of an imported session's tree: name -> tip.

    ``main`` is the path through ``active`` (the last line the agent was on) to its newest
    leaf. Every other leaf, newest first, names the part of its path that no branch named
    before holds: ``<kind>-<n>``, ``n`` the line that part starts at (``c<commit>`` for a
    commit castore made that no file holds), ``kind`` the ``fork``
    its adapter marked on that line or on a sibling of it (the other side of the same fork:
    a rewind's original prompt is on the ``rewind`` branch as its new prompt would be),
    else ``fork``.

    Args:
        log: the session's commits on every branch (:class:`~castore.entries.LogEntry`, or
            what :class:`TreeWriter` appended: :class:`Written`).
        active: the commit of the line the agent was on last.
        key: the adapter's metadata key (``o``: line number, ``fork``: kind).
        lines: commit -> line of castore's own commits found again in the file (``adopted``).

    Raises:
        ArchiveError: ``active`` is not in ``log``.
    """
    parent: dict[str, str | None] = {le.id: (le.parents[0] if le.parents else None) for le in log}
    if active not in parent:
        raise ArchiveError(active, "not a commit of the session")
    line: dict[str, Any] = {le.id: as_dict(le.meta.get(key or "")).get("o", (lines or {}).get(le.id)) for le in log}
    kind: dict[str, str | None] = {le.id: fork_kind(le.meta, key) for le in log}
    children: dict[str | None, list[str]] = {}
    for le in log:
        children.setdefault(parent[le.id], []).append(le.id)

    def order(cid: str) -> tuple[int, str]:
        o_ = line[cid]
        return (o_ if isinstance(o_, int) else -1, cid)

    tip = active
    while children.get(tip):
        tip = max(children[tip], key=order)
    out = {"main": tip}
    named: set[str] = set()
    c: str | None = tip
    while c is not None and c not in named:
        named.add(c)
        c = parent[c]
    for leaf in sorted((cid for cid in parent if not children.get(cid) and cid not in named), key=order,
                       reverse=True):
        start, c = leaf, leaf
        while c is not None and c not in named:
            named.add(c)
            start, c = c, parent[c]
        k = kind[start] or next((kind[x] for x in children.get(parent[start], ()) if kind[x]), None) or "fork"
        o_ = line[start]
        name = f"{k}-{o_}" if isinstance(o_, int) else f"{k}-c{start[:8]}"
        out[name if name not in out else f"{name}-{start[:8]}"] = leaf
    return out


def meta_of(n: int, raw_id: str, when: float | None, **extra: Any) -> dict[str, Any]:
    """The commit metadata of an archived line."""
    m: dict[str, Any] = {"o": n, "raw": raw_id}
    m.update({k: v for k, v in extra.items() if v is not None})
    return m


def blob_id(raw: bytes, codec: o.Codec = o.PLAIN) -> str:
    """The id the blob of these bytes has under ``codec`` (the store's). Raises nothing."""
    return codec.encode(Blob(data=raw))[0]


def encode_blob(raw: bytes, codec: o.Codec = o.PLAIN) -> tuple[str, bytes]:
    """The id and canonical bytes of the blob of these bytes under ``codec`` (the store's):
    for an importer that names a line's blob in its entry and then stores it, encoding it
    once. Raises nothing."""
    return codec.encode(Blob(data=raw))


def archived_rows(session: Session, key: str, file: str | None = None,
                  log: list[LogEntry] | None = None) -> list[tuple[int, str, str]]:
    """``(line number, raw blob id, commit)`` of a session's archived lines, in file order.

    The lines of castore's own commits that an import found again in the file (written by
    an export, recorded in the session's info under ``key``, ``adopted``) are among them,
    named by their commit.

    Args:
        session: the session.
        key: the adapter's metadata key.
        file: only lines whose metadata names this file (``f``); a fork shares commits
            of its parent's file, which are not its own lines.
        log: the session's log on every branch, when the caller has read it already.

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
    """
    rows: list[tuple[int, str, str]] = []
    for le in log if log is not None else session.log(all_branches=True):
        m = le.meta.get(key)
        if isinstance(m, dict) and isinstance(m.get("o"), int) and isinstance(m.get("raw"), str) \
                and (file is None or m.get("f") == file):
            rows.append((m["o"], m["raw"], le.id))
    if file is None or file == session.id:
        rows.extend(adopted_rows(session.info, key))
    rows.sort()
    return rows


def adopted_rows(info: dict[str, Any], key: str) -> list[tuple[int, str, str]]:
    """``(line number, raw blob id, commit)`` of the lines of a file that are castore's own
    commits written out by an export (kept in the session's info under ``key``)."""
    out = []
    for o_, v in as_dict(as_dict(info.get(key)).get("adopted")).items():
        if isinstance(v, list) and len(v) >= 2 and isinstance(v[0], str) and isinstance(v[1], str):
            try:
                out.append((int(o_), v[1], v[0]))
            except ValueError:
                continue
    return out


def appended(log: list[LogEntry], key: str, rows: list[tuple[int, str, str]]) -> list[LogEntry]:
    """The entries of ``log`` that are no line of the file: commits castore made on top of an
    imported session, parents before children (by depth, then time)."""
    lines = {cid for _, _, cid in rows}
    out = [le for le in log if le.id not in lines
           and not (isinstance(le.meta.get(key), dict) and isinstance(le.meta[key].get("o"), int))]
    out.sort(key=lambda le: (le.depth, le.time, le.id))
    return out


def appended_on_head(session: Session, key: str, rows: list[tuple[int, str, str]]) -> list[LogEntry]:
    """The entries on the path to HEAD that are no line of the file (castore's own commits,
    oldest first): what an export writes after a file that is one line of turns."""
    if session.head is None:
        return []
    lines = {cid for _, _, cid in rows}
    return [le for le in session.entries("HEAD") if le.id not in lines
            and not (isinstance(le.meta.get(key), dict) and isinstance(le.meta[key].get("o"), int))]


def archived_sessions(store: Store, app: str, key: str) -> Iterator[Session]:
    """The sessions of ``app`` whose info holds an archived file under ``key`` (its ``path``)."""
    if app not in store.apps():
        return
    for si in store.sessions(app):
        if isinstance(si.info.get(key), dict) and isinstance(si.info[key].get("path"), str):
            yield store.session(si.app, si.user, si.session)


def export_lines(session: Session, key: str, file: str | None = None, also: Sequence[Session] = (),
                 rows: list[tuple[int, str, str]] | None = None) -> Iterator[bytes]:
    """The archived lines of a session (metadata under ``key``), in file order, as bytes.

    ``also``: sessions holding more lines of the same file (numbered in the same file), merged
    in by their place in it. ``rows``: the session's rows when the caller has them.

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
    """
    rows = list(rows) if rows is not None else archived_rows(session, key, file)
    for other in also:
        if other.exists():
            rows.extend(archived_rows(other, key))
    rows.sort()
    for i in range(0, len(rows), 512):
        chunk = rows[i:i + 512]
        data = read_blobs(session.store, [r for _, r, _ in chunk])
        for _, r, _ in chunk:
            yield data[r]


def check_reachable(session: Session, key: str, also: Sequence[Session] = ()) -> None:
    """Refuse to export a session whose archived lines no ref reaches: its HEAD names a branch
    that is not there (a ref lost or deleted) while its info (under ``key``) counts lines
    imported. Its file would be written empty, over the agent's own when restoring in place.
    Lines of its file that other sessions hold (``also``: a Claude file's subagent chains;
    their entries' ``o``) are not its own: a file of such lines only has no commit of its own.

    Raises:
        ArchiveError: one line naming the session and what to run.
        ObjectNotFound, IntegrityError, StorageError.
    """
    c = session.info.get(key)
    if session.head is not None or not isinstance(c, dict) or not isinstance(c.get("lines"), int):
        return
    held = {as_dict(le.meta.get(key)).get("o") for o in also if o.exists() for le in o.log(all_branches=True)}
    if c["lines"] > len(held - {None}):
        raise ArchiveError("/".join(session.key), f"{c['lines']} archived lines but no commit on HEAD's path "
                                                  "(its branch is missing?): not written; `castore fsck` and "
                                                  "`castore branch` say more")


def own_commits(session: Session) -> set[str]:
    """The ids of every commit of a session (empty for a new one): what a line's mark of a
    castore commit is checked against before the line is taken as that commit.

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
    """
    return {le.id for le in session.log(all_branches=True)} if session.exists() else set()


def entry_text(le: LogEntry) -> str:
    """A one-piece text of an entry that is no message (a compaction's summary, else its fields)."""
    import dataclasses
    import json

    e = le.entry
    summary = getattr(e, "summary", None)
    if isinstance(summary, str):
        return summary
    try:
        return json.dumps(dataclasses.asdict(e), ensure_ascii=False, default=str)
    except TypeError:
        return str(e)


def iso_time(t: float) -> str:
    """``t`` (seconds since the epoch) as the agents write times: ``2026-01-02T10:00:00.000Z``."""
    from datetime import UTC

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(t * 1000) % 1000:03d}Z"


def safe_join(root: str, rel: str) -> str:
    """``root/rel`` for a relative path that stays inside ``root``.

    Raises:
        ArchiveError: ``rel`` is absolute, empty, or has a ``..``, ``.`` or empty part.
    """
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in parts) or "\0" in rel:
        raise ArchiveError(rel, "not a safe relative path: refusing to write outside the destination")
    out = os.path.join(root, *parts)
    if os.path.commonpath([os.path.abspath(root), os.path.abspath(out)]) != os.path.abspath(root):
        raise ArchiveError(rel, "not a safe relative path: refusing to write outside the destination")
    return out
