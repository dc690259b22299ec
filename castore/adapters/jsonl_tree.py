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

Where a line hangs in the tree is the adapter's business; how the lines are placed there and
written (runs, branches, a new session built in memory) is
:class:`~castore.adapters.tree_writer.TreeWriter`'s (:mod:`castore.adapters.tree_writer`).
Only the public :class:`~castore.Session` API is used.

Incremental state (how far the file was read, a digest of the imported prefix, the last
line's place in the tree, a digest of the branch tips it left) is kept in the session's info
under the adapter's key, written once an import has written its lines. An import stopped
before that (kill -9, Ctrl-C) leaves lines beyond the recorded position; the next import
finds the tips changed, reads which lines the session holds (each commit names its line),
and reads the file again from the recorded position, taking a line already stored as it is
instead of writing it twice (:class:`~castore.adapters.tree_writer.TreeWriter`): the position is derived from what is
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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any, ParamSpec, TypeVar

from .. import objects as o
from ..entries import MAX_DEPTH, Event, vouched_event
from ..errors import CastoreError, InvalidEntry
from ..objects import Blob
from ..objectstore import gc_paused
from ..redact import kind_counts, recording

if TYPE_CHECKING:
    from ..entries import LogEntry, Message
    from ..objects import ObjectId
    from ..redact import Redactor
    from ..session import Session, SessionHost
    from ..store import Store

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


def files_under(folder: str, suffixes: str | tuple[str, ...] = "", *, links: bool = False) -> Iterator[str]:
    """The regular files below ``folder`` whose names end with one of ``suffixes`` (any name
    by default), a folder's files by name before its subfolders by name, never a linked file.
    A linked folder is passed over, so that an import reads only what lies under the folder it
    was given, unless ``links``: then it is walked as a folder (Claude Code's folders, which
    dotfiles managers link), each folder once by its real path (a link that loops, or two links
    to one folder), never one that holds the link (:func:`links_back`: a link to ``/`` or to
    a folder above would walk all that holds it). Raises nothing (an unreadable folder is
    passed over, as :func:`os.walk` does)."""
    seen = {os.path.realpath(folder)}
    for root, dirs, files in os.walk(folder, followlinks=links):
        dirs.sort()
        if links:
            dirs[:] = [d for d in dirs if not links_back(sub := os.path.join(root, d)) and first_visit(sub, seen)]
        for fn in sorted(files):
            full = os.path.join(root, fn)
            if fn.endswith(suffixes) and not os.path.islink(full) and os.path.isfile(full):
                yield full


def links_back(folder: str) -> bool:
    """Whether ``folder`` is a symbolic link to a folder that holds it (``/``, the home folder,
    the folder it is in, or one above): followed, it would take in all that folder holds, the
    link's own folder among it (``find -L``'s loop). Raises nothing."""
    if not os.path.islink(folder):
        return False
    real = os.path.realpath(folder)
    at = os.path.realpath(os.path.dirname(folder))
    return at == real or at.startswith(real.rstrip(os.sep) + os.sep)


def first_visit(folder: str, seen: set[str]) -> bool:
    """Whether ``folder``'s real path (its links resolved) is not in ``seen`` yet; it is added.
    Raises nothing."""
    real = os.path.realpath(folder)
    if real in seen:
        return False
    seen.add(real)
    return True


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
