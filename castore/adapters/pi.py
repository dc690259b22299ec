"""Import and export Pi coding-agent sessions (JSONL, format v3; v1 and v2 are upgraded).

One Pi entry becomes one commit whose parent is the commit of its ``parentId``. The
header becomes the session's metadata (``session.info["pi"]["header"]``), the last entry
in file order becomes HEAD (on branch ``main``, Pi's leaf), every other childless entry
gets a branch ``pi-<entry id>``, and Pi labels become castore labels (their entries are
kept too). Entry types map to castore entries:

======================  ==========================================================
Pi                      castore
======================  ==========================================================
``message``             :class:`~castore.entries.Message` (the Pi message as is)
``custom_message``      :class:`~castore.entries.Message` with role ``custom``
``compaction``          :class:`~castore.entries.Compaction` (``first_kept``: a commit)
``branch_summary``      :class:`~castore.entries.BranchSummary`
``model_change``        :class:`~castore.entries.ModelChange` (model, provider)
``thinking_level_change`` :class:`~castore.entries.ModelChange` (thinking level)
``custom``              :class:`~castore.entries.Custom`
``label``               an entry of kind ``label``, and a castore label
``session_info``        an entry of kind ``session_info``; the name goes to ``info``
anything else           :class:`~castore.entries.Custom` of type ``pi.<type>``
======================  ==========================================================

The session's title (``info["name"]``, see :func:`castore.views.session_title`) is its
latest ``session_info`` name; a session without one is titled by its first user message,
as Pi's ``/resume`` list shows it (cut by :func:`castore.views.prompt_title`). A session
imported before titles gets its title on its next import that finds new lines (its file
is read from the start until the first user message).

So :meth:`castore.Session.context` gives the messages Pi's ``buildSessionContext`` would
send. Per-call details (entry id, parent id, time, a message's ``timestamp`` and
``usage``) go on the commit's metadata, so that identical content is stored once. Inline
images of at least :data:`IMAGE_MIN` base64 characters become blobs (the same screenshot
twice is stored once) and are inlined again on export. Export gives back every entry with
the same fields and values; when an entry cannot be rebuilt exactly from its castore form,
its fields are kept verbatim on the commit.

v1 files (no ids) get ids as Pi's migration gives them, except that the ids are derived
from the session id and the entry's position rather than random, so that importing the
same file twice gives the same commits; so do the lines a v1 file gains later (an older Pi
going on with it), continuing from the lines imported before. When Pi itself rewrites a v1
or v2 file (as v3, with random ids, when it opens it), the rewritten file is imported as
``<session>.v2``, which a session id or prefix then means
(:func:`castore.porcelain.newest_version`); both are exported byte for byte.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any

from .. import names
from .. import objects as o
from ..entries import (
    BranchSummary,
    Compaction,
    Custom,
    Event,
    Message,
    ModelChange,
    body_of,
)
from ..errors import BranchError, CastoreError, InvalidEntry, InvalidName, RefConflict, RefNotFound, SessionExists
from ..objects import Blob
from ..redact import kind_counts, recording
from ..views import TITLE_KEY, prompt_title
from .detect import refuse_other
from .jsonl_tree import (
    ArchiveError,
    archived_sessions,
    as_dict,
    files_under,
    import_batched,
    prefix_digest,
    put_blobs,
    read_blobs,
)
from .pi_entries import (
    BLOB_KEY,
    IMAGE_MIN,
    LINKS,
    extract_images,
    inline_blobs,
    inline_images,
    keep_id,
    read_blob,
    to_castore,
    to_pi,
)

if TYPE_CHECKING:
    from ..objects import ObjectId
    from ..session import LogEntry, Session
    from ..store import Store

#: write pending objects once they add up to this many bytes
BATCH_BYTES = 8 << 20
#: the file's bytes are kept in blobs of about this size (export writes them back as they were)
SEGMENT = 4 << 20
CURRENT_VERSION = 3
#: the key of an entry written for a castore commit (its id): an import takes the line as that commit
MARK = "castoreCommit"


class PiImportError(CastoreError, ValueError):
    """A Pi session file cannot be imported.

    Attributes:
        path: the file.
        line: the 1-based line number at fault (None: the file as a whole).
        reason: what is wrong.
    """

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


@dataclass
class ImportResult:
    """What :func:`import_session` did.

    Attributes:
        key: the session's ``(app, user, session)``.
        head: the commit of the last entry (Pi's leaf), or None for a file with no entries.
        entries: commits written (one per entry).
        branches: branch name -> tip commit (``main`` is the leaf's).
        labels: label name -> commit.
        skipped: ``(line number, reason)`` for each line left out (``skip_bad_lines``) and
            each label that could not become a castore label.
        blobs: image blobs referenced (repeats counted once per entry).
        upgraded_from: the file's version when it was older than v3, else None.
        bytes_written: stored bytes of the objects written.
        path: the file read.
        total: entries of the file now in the archive.
        offset: bytes of the file now in the archive.
        torn: bytes at the end left for next time (a line still being written; ``resume``).
        notes: what was noticed (a file rewritten since the last import).
        redacted: how many secrets of each kind were replaced before they were stored
            (``{"aws-access-key": 2}``: two keys, however often each appears; empty unless
            the store redacts writes).
    """

    key: tuple[str, str, str]
    head: str | None = None
    entries: int = 0
    branches: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    blobs: int = 0
    upgraded_from: int | None = None
    bytes_written: int = 0
    path: str = ""
    total: int = 0
    offset: int = 0
    torn: int = 0
    notes: list[str] = field(default_factory=list)
    redacted: dict[str, int] = field(default_factory=dict)

    @property
    def lines(self) -> int:
        """Entries imported by this call (what a follow loop counts)."""
        return self.entries


# -- reading lines -------------------------------------------------------------------------
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _Lines:
    """The non-blank lines of a file from ``offset``, parsed: ``(line number, object)``,
    streaming; ``end`` is the offset after the last line read (bad and blank lines included).
    With ``wait_torn``, a last line without a newline that is not JSON is a line the agent is
    still writing: it is left for next time (not read, ``end`` stays before it)."""

    def __init__(self, f: IO[bytes], path: str, skip_bad: bool, skipped: list[tuple[int, str]], offset: int = 0,
                 n: int = 0, wait_torn: bool = False) -> None:
        self.f, self.path, self.skip_bad, self.skipped = f, path, skip_bad, skipped
        self.read: list[bytes] = []  # every line consumed (blank and bad ones too), as read
        self.end, self.n, self.wait_torn = offset, n, wait_torn
        self.raw = b""  # the last line yielded, as read
        f.seek(offset)

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        for raw in iter(self.f.readline, b""):
            n = self.n + 1
            try:
                try:  # msgspec: json.loads's value wherever it takes the text (jsonl_tree.parse_vouched)
                    value = o.json_loads(raw)
                except (ValueError, RecursionError):  # not JSON to msgspec: blank, or json.loads decides
                    text = raw.decode("utf-8")
                    if not text.strip():
                        self.n, self.end = n, self.end + len(raw)
                        self.read.append(raw)
                        continue
                    value = json.loads(text, parse_constant=_reject_constant)
                if not isinstance(value, dict):
                    raise ValueError(f"a JSON {type(value).__name__}, not an object")
            except (UnicodeDecodeError, ValueError, RecursionError) as e:  # nested too deep: not JSON to us
                if self.wait_torn and not raw.endswith(b"\n"):
                    return
                torn = "" if raw.endswith(b"\n") else " (torn last line?)"
                reason = f"not a JSON object{torn}: {e}"
                if not self.skip_bad:
                    raise PiImportError(self.path, n, reason + " (use skip_bad_lines / --skip-bad-lines to skip it)"
                                        ) from e
                self.skipped.append((n, reason))
                self.n, self.end = n, self.end + len(raw)
                self.read.append(raw)
                continue
            self.n, self.end = n, self.end + len(raw)
            self.raw = raw
            self.read.append(raw)
            yield n, value


def _version(header: dict[str, Any]) -> int:
    v = header.get("version")
    if isinstance(v, bool) or v is None:
        return 1
    try:
        return int(float(v))
    except (TypeError, ValueError):
        return 1


def _time(ts: Any) -> float:
    if not isinstance(ts, str):
        return 0.0
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _prompt(e: dict[str, Any]) -> str | None:
    """The title a user message gives (Pi's session list: its text blocks joined by spaces), else None."""
    m = e.get("message")
    if e.get("type") != "message" or not isinstance(m, dict) or m.get("role") != "user":
        return None
    content = m.get("content")
    if isinstance(content, list):
        content = " ".join(b["text"] for b in content
                           if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str))
    return prompt_title(content) if isinstance(content, str) else None


def _first_prompt(f: IO[bytes], start: int, end: int) -> str | None:
    """The title of the first user message between two offsets of a file (lines that are not
    JSON objects are passed over)."""
    f.seek(start)
    while f.tell() < end:
        raw = f.readline()
        if not raw:
            break
        try:
            e = json.loads(raw)
        except ValueError:
            continue
        title = _prompt(e) if isinstance(e, dict) else None
        if title is not None:
            return title
    return None


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(t * 1000) % 1000:03d}Z"


# -- import --------------------------------------------------------------------------------
class _Writer:
    """Builds commits with explicit parents through the store's plumbing; writes their
    objects in batches of about :data:`BATCH_BYTES` (one object store call each)."""

    def __init__(self, store: Store) -> None:
        self.plumbing = store.plumbing
        self.batch = self.plumbing.batch(None)
        self.size = 0
        self.written = 0

    def _grew(self, before: int) -> None:
        pending = self.batch.pending
        new = len(pending) - before
        self.size += sum(len(v) for v in itertools.islice(reversed(pending.values()), new))
        if self.size >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        self.written += self.plumbing.write(self.batch)
        self.size = 0

    def putread_blob(self, data: bytes) -> str:
        before = len(self.batch.pending)
        oid = self.batch.add(Blob(data=data))
        self._grew(before)
        return oid

    def commit(self, kind: str, body: Any, author: str, meta: dict[str, Any], when: float,
               parent: tuple[str, int] | None) -> tuple[str, int]:
        """Write one commit after ``parent`` (``(commit id, depth)``); return its own."""
        if parent is None or parent[0] != self.batch.tip:
            # a root, or a branch: the next batch builds on that parent (its block is stored first)
            self.flush()
            self.batch = self.plumbing.batch(parent[0] if parent else None)
        before = len(self.batch.pending)
        cid = self.batch.entry(kind, body, delta={}, unset=(), author=author, when=when, meta=meta)
        self._grew(before)
        return cid, self.batch.depth - 1

def _new_id(seed: str, n: int, taken: set[str] | dict[str, Any]) -> str:
    for attempt in range(100):
        h = hashlib.sha256(f"{seed}\x00{n}\x00{attempt}".encode()).hexdigest()
        if h[:8] not in taken:
            return h[:8]
    return hashlib.sha256(f"{seed}\x00{n}".encode()).hexdigest()[:32]


def import_session(store: Store, path: str | os.PathLike[str] | IO[bytes], app: str = "pi", user: str = "local",
                   session_id: str | None = None, skip_bad_lines: bool = False, *,
                   resume: bool = False, wait_torn: bool = False) -> ImportResult:
    """Import a Pi session file into a castore session (a new one, or with ``resume`` the
    one an earlier import of the file made, brought up to date).

    The file is read line by line (memory stays bounded by the longest line plus one
    batch of objects); objects are written in batches, and refs only at the end, so a
    failure leaves no ref pointing at a partial import (and the next import writes the
    same commits again: nothing is stored twice).

    With ``resume``, an existing session continues from where the last import stopped (the
    position and a digest of the bytes before it are kept in its info): only new lines are
    read, a torn last line waits for the next import, entries castore wrote into the file
    (:func:`export_session` marks them with :data:`MARK`) are taken as the commits they came
    from, and the refs come out as an import of the whole file would make them. A file whose
    imported part changed (Pi rewrites v1 and v2 files when it opens them) is imported again
    as a new session ``<session>.v2`` (``.v3``, ...), once, leaving the archived one as it was.

    Args:
        store: the store to write to.
        path: the ``.jsonl`` file (a path, or a binary file object).
        app, user: the session key's app and user.
        session_id: the session id (default: the header's ``id``).
        skip_bad_lines: skip lines that are not JSON objects, and report them in
            :attr:`ImportResult.skipped`, instead of failing.
        resume: continue an existing session instead of refusing it.
        wait_torn: a last line without a newline that is not JSON is being written: leave it
            for the next import (:attr:`ImportResult.torn`) instead of failing on it; so is
            a file with no header yet (empty, or its header torn): nothing is imported, and
            the result names the file's name as its session.

    Returns:
        An :class:`ImportResult`.

    Raises:
        PiImportError: (a ``ValueError``) the header is missing or invalid, or a line is
            not a JSON object (naming its line number), or an entry cannot be stored.
        ArchiveError: (a ``ValueError``) the file is another agent's (nothing is written).
        SessionExists: the target session already exists, without ``resume`` (nothing is written).
        InvalidName, StorageError, OSError: a bad key, a backend failure, an unreadable file.
    """
    if isinstance(path, (str, os.PathLike)):
        name = os.fspath(path)
        refuse_other(name, "pi")
        with open(name, "rb") as f:
            return _import(store, f, name, app, user, session_id, skip_bad_lines, resume, wait_torn)
    return _import(store, path, getattr(path, "name", "<stream>"), app, user, session_id, skip_bad_lines, resume,
                   wait_torn)


@dataclass
class _Tree:
    """What the refs are made from: each imported entry's commit and place (loaded from the
    session on resume, then grown by the import)."""

    ids: dict[str, tuple[str, int]] = field(default_factory=dict)  # Pi id -> (commit id, depth)
    pi_of: dict[str, str] = field(default_factory=dict)  # commit id -> Pi id
    parent_of: dict[str, str | None] = field(default_factory=dict)
    has_children: set[str] = field(default_factory=set)
    order: dict[str, int] = field(default_factory=dict)  # commit -> ordinal (file order)
    last: tuple[str, int] | None = None

    def add(self, eid: str, cid: str, depth: int, parent: str | None, ordinal: int) -> None:
        self.ids[eid] = (cid, depth)
        self.pi_of[cid] = eid
        self.parent_of[cid] = parent
        if parent is not None:
            self.has_children.add(parent)
        self.order[cid] = ordinal
        self.last = (cid, depth)

    def descends(self, cid: str, ancestor: str) -> bool:
        c: str | None = cid
        while c is not None:
            if c == ancestor:
                return True
            c = self.parent_of.get(c)
        return False


def _load_tree(session: Session, adopted: dict[str, Any]) -> tuple[_Tree, dict[str, LogEntry]]:
    """The tree of a session's imported entries (and of castore's own entries a former import
    took back from the file, ``adopted``: ordinal -> [commit, blob, Pi id])."""
    t = _Tree()
    log: dict[str, LogEntry] = {le.id: le for le in session.log(all_branches=True)}
    rows: list[tuple[int, str, str]] = []
    for le in log.values():
        if _imported(le) and isinstance(le.meta["pi"].get("id"), str):
            rows.append((le.meta["o"], le.id, le.meta["pi"]["id"]))
    for key, v in adopted.items():
        if isinstance(v, list) and len(v) == 3 and v[0] in log and str(key).isdigit():
            rows.append((int(key), v[0], v[2]))
    for o_, cid, eid in sorted(rows):
        le = log[cid]
        t.add(eid, cid, le.depth, le.parents[0] if le.parents else None, o_)
    for le in log.values():  # castore's own entries are children too
        if le.parents:
            t.has_children.add(le.parents[0])
            t.parent_of.setdefault(le.id, le.parents[0])
    return t, log


def _import(store: Store, f: IO[bytes], name: str, app: str, user: str, session_id: str | None,
            skip_bad: bool, resume: bool = False, wait_torn: bool = False) -> ImportResult:
    """:func:`_import_file`, its result saying what the store's redactor replaced meanwhile."""
    with recording() as found:
        res = _import_file(store, f, name, app, user, session_id, skip_bad, resume, wait_torn)
    res.redacted = kind_counts(found)
    return res


def _import_file(store: Store, f: IO[bytes], name: str, app: str, user: str, session_id: str | None,
                 skip_bad: bool, resume: bool = False, wait_torn: bool = False) -> ImportResult:
    store = store.tenant(app, user)  # its tenant's store, in the tenant layout (docs/tenants.md)
    skipped: list[tuple[int, str]] = []
    head_lines = _Lines(f, name, skip_bad, skipped, wait_torn=wait_torn)
    first = next(iter(head_lines), None)
    if first is None and wait_torn:  # a file Pi has just made, its header not written whole yet:
        # nothing to import before it is (no session id yet: the result names the file's)
        return ImportResult((app, user, _pending_id(name)), path=name, torn=os.fstat(f.fileno()).st_size)
    if first is None:
        raise PiImportError(name, None, "empty file: no Pi session header")
    n0, header = first
    if header.get("type") != "session" or not isinstance(header.get("id"), str):
        raise PiImportError(name, n0, "the first line is not a Pi session header (type 'session' with an id)")
    version = _version(header)
    if version < CURRENT_VERSION:
        header["version"] = CURRENT_VERSION
    session = store.session(app, user, session_id or header["id"])
    state: dict[str, Any] = {}
    read: dict[str, Any] = {}  # the info as read: its position is compared when this one's is recorded
    if session.exists():
        if not resume:
            raise SessionExists(session.key)
        read = session.info
        state = as_dict(read.get("pi"))
        offset = state.get("offset")
        if isinstance(offset, int) and (os.fstat(f.fileno()).st_size < offset
                                        or prefix_digest(f, offset) != state.get("digest")):
            return _next_version(store, f, name, app, user, session, skip_bad, wait_torn,
                                 f"the first {offset} bytes changed since the last import (file rewritten?)")
    store.init()
    result = ImportResult(session.key, skipped=skipped, upgraded_from=version if version < CURRENT_VERSION else None,
                          path=name)
    if isinstance(state.get("offset"), int) and os.fstat(f.fileno()).st_size == state["offset"]:
        result.total, result.offset, result.head = int(state.get("entries", 0)), state["offset"], session.head
        return result  # nothing new (following: the common case, one stat and one header read)
    adopted: dict[str, Any] = dict(as_dict(state.get("adopted")))
    # following a session Pi goes on with: the tree is read from the session only when a line
    # names an entry before the last one (a branch, a label, a compaction), or castore's own
    resumed = isinstance(state.get("offset"), int)  # else: a new session, or one imported before positions
    last = state.get("last")
    # (a v1 file going on needs the ids its earlier entries got: the tree is read at once)
    lazy = resumed and version >= 2 and isinstance(last, list) and len(last) == 4 \
        and session.branches().get("main") == last[1]
    tree, log = _load_tree(session, adopted) if state and not lazy else (_Tree(), {})
    if lazy:
        assert isinstance(last, list)
        tree.add(str(last[0]), str(last[1]), int(last[2]), None, int(last[3]))
    new_adds: list[tuple[str, str, int, str | None, int]] = []
    loaded = not lazy
    known = len(tree.order)
    start: int = state["offset"] if resumed else head_lines.end
    n_start = int(state.get("lines", head_lines.n)) if resumed else head_lines.n
    # a session imported before titles: its first user message is looked for once, in the
    # lines imported then (every later import sees the lines it adds)
    title: str | None = None
    if state and not state.get("titled") and not isinstance(session.info.get(TITLE_KEY), str):
        title = _first_prompt(f, head_lines.end, start)
    lines = _Lines(f, name, skip_bad, skipped, start, n_start, wait_torn=wait_torn)
    w = _Writer(store)
    by_index: list[str | None] = [None]  # v1: entry index (header = 0) -> assigned id
    labels: dict[str, tuple[int, int, str | None]] = {}  # target -> (ordinal, line, label)
    session_name: str | None = None
    prev_id: str | None = None
    ordinal = int(state.get("entries", known)) if state else 0
    if version < 2 and resumed:  # ids go on from the lines imported before, as for the whole file
        by_index += [tree.pi_of[c] for c, _ in sorted(tree.order.items(), key=lambda kv: kv[1])]
        prev_id = by_index[-1]
    blobs = 0

    def put(data: bytes) -> str:
        nonlocal blobs
        blobs += 1
        return w.putread_blob(data)

    # the file's bytes, kept as blobs of up to SEGMENT bytes, so that export gives them back
    # exactly (`keep`: no line skipped; `exact`: and every line read as it is, no migration)
    keep = not state or isinstance(state.get("segments"), list)
    exact = keep and version == CURRENT_VERSION and bool(state.get("exact", not state))
    segments: list[str] = list(state.get("segments", [])) if keep else []
    if keep and not resumed:
        lines.read = head_lines.read

    def keep_bytes(final: bool) -> None:
        if keep and lines.read and (final or sum(map(len, lines.read)) >= SEGMENT):
            segments.append(w.putread_blob(b"".join(lines.read)))
            lines.read = []

    for n, e in lines:
        if len(lines.read) >= 256:
            keep_bytes(False)
        if version < 2:  # Pi's v1 -> v2 migration: ids, parent links, compaction index -> id
            e["id"] = _new_id(header["id"], len(by_index) - 1, tree.ids)
            e["parentId"] = prev_id
            prev_id = e["id"]
            by_index.append(e["id"])
            if e.get("type") == "compaction" and "firstKeptEntryIndex" in e:
                idx = e["firstKeptEntryIndex"]
                if isinstance(idx, int) and not isinstance(idx, bool):
                    target = by_index[idx] if 0 <= idx < len(by_index) else None
                    if target is not None:
                        e["firstKeptEntryId"] = target
                    del e["firstKeptEntryIndex"]
        if version < 3 and e.get("type") == "message" and isinstance(e.get("message"), dict) \
                and e["message"].get("role") == "hookMessage":
            e["message"]["role"] = "custom"
        eid = e.get("id")
        if not isinstance(eid, str):
            reason = "entry has no string id"
            if not skip_bad:
                raise PiImportError(name, n, reason)
            skipped.append((n, reason))
            continue
        if not loaded and (e.get("parentId") is None or MARK in e or any(
                isinstance(e.get(k), str) and e[k] not in tree.ids for k in LINKS)):
            tree, log = _load_tree(session, adopted)
            for args in new_adds:
                tree.add(*args)
            loaded = True
        if eid in tree.ids and state:  # stored by an import that stopped before recording its place
            continue
        pid = e.get("parentId")
        parent = tree.ids.get(pid) if isinstance(pid, str) and pid != eid else None
        mark = e.get(MARK)
        if state and isinstance(mark, str) and mark in log and not _imported(log[mark]):
            # castore's own entry, as export wrote it: the line is that commit
            # (the id put_blobs gives: the blob as stored, redacted when the store redacts)
            adopted[str(ordinal)] = [mark, put_blobs(store, [lines.raw])[0], eid]
            new_adds.append((eid, mark, log[mark].depth, log[mark].parents[0] if log[mark].parents else None, ordinal))
            tree.add(*new_adds[-1])
            ordinal += 1
            result.entries += 1
            continue
        try:
            kind, body, author, meta = to_castore(e, tree.ids)
            meta["o"] = ordinal
            if body is not None:
                images: list[str] = []
                body = extract_images(body, lambda data, ids=images: keep_id(ids, put(data)))
                if images:  # named in the commit's metadata, so that gc keeps them and sync sends them
                    meta[BLOB_KEY] = sorted(set(images))
            if "raw" in meta:
                meta["raw"] = extract_images(meta["raw"], put)
            cid, depth = w.commit(kind, body, author, meta, _time(e.get("timestamp")), parent)
        except InvalidEntry as err:
            raise PiImportError(name, n, f"entry cannot be stored: {err}") from err
        new_adds.append((eid, cid, depth, parent[0] if parent else None, ordinal))
        tree.add(*new_adds[-1])
        ordinal += 1
        result.entries += 1
        if e.get("type") == "label" and isinstance(e.get("targetId"), str):
            lab = e.get("label")
            labels[e["targetId"]] = (ordinal - 1, n, lab if isinstance(lab, str) and lab else None)
        elif e.get("type") == "session_info" and isinstance(e.get("name"), str) and e["name"].strip():
            session_name = e["name"].strip()
        elif title is None:
            title = _prompt(e)
    exact, keep = exact and not skipped, keep and not skipped
    keep_bytes(True)
    w.flush()
    result.blobs = blobs
    result.torn = max(0, os.fstat(f.fileno()).st_size - lines.end) if wait_torn else 0
    result.total, result.offset = ordinal, lines.end
    if state and not result.entries and lines.end == start:
        result.head = session.head
        return result
    set_by_pi: dict[str, str] = {k: v for k, v in as_dict(state.get("labels")).items() if isinstance(v, str)}
    if result.entries or not state:
        _set_refs(session, tree, labels, result, whole=loaded, set_by_pi=set_by_pi)
    else:
        result.head = session.head
    info: dict[str, Any] = dict(session.info) if state else {}
    info["pi"] = {**state, "header": state.get("header", header), "offset": lines.end, "lines": lines.n,
                  "entries": ordinal, "digest": prefix_digest(f, lines.end), "path": name, "exact": exact,
                  "last": [tree.pi_of[tree.last[0]], tree.last[0], tree.last[1], tree.order[tree.last[0]]]
                  if tree.last is not None else None,
                  "titled": True, **({"segments": segments} if keep else {}),
                  **({"labels": set_by_pi} if set_by_pi else {}),
                  **({"adopted": adopted} if adopted else {})}
    if session_name is not None:  # Pi's own name wins, the latest one
        info[TITLE_KEY] = session_name
    elif title is not None and not isinstance(info.get(TITLE_KEY), str):
        info[TITLE_KEY] = title
    session.set_info(info, expect=read)  # a rival that recorded its position meanwhile stored these lines: a lost race
    result.bytes_written = w.written
    return result


def _set_refs(session: Session, tree: _Tree, labels: dict[str, tuple[int, int, str | None]],
              result: ImportResult, whole: bool = True, set_by_pi: dict[str, str] | None = None) -> None:
    """Side branches ``pi-<leaf id>``, ``main`` on the last entry (Pi's leaf), labels: as an
    import of the whole file makes them. A castore entry ``main`` held that the new entries do
    not follow keeps a branch ``castore-<commit>``; a side branch whose leaf got children goes.
    ``whole`` False: the new entries went on from ``main``'s tip, one after the other (the
    tree holds only them): only ``main`` moves. ``set_by_pi``: Pi entry id -> the castore
    label an earlier import made for it (updated here): a later Pi label entry that clears or
    renames that entry's label removes it, as Pi does (a label castore's user made is left)."""
    if tree.last is None:
        return
    last = tree.last[0]
    have = session.branches()
    want: dict[str, str] = {}
    for cid, _ in sorted(tree.order.items(), key=lambda kv: kv[1]) if whole else ():
        if cid not in tree.has_children and cid != last:
            want[f"pi-{tree.pi_of[cid]}"] = cid
    old_main = have.get("main")
    if whole and old_main is not None and old_main not in tree.order and not tree.descends(last, old_main):
        want[f"castore-{old_main[:12]}"] = old_main  # castore's own entries, left behind by the agent
    for name, tip in have.items():
        if name.startswith("pi-") and name not in want and tip in tree.has_children \
                and session.current_branch != name:
            session.delete_branch(name, force=True)
    for name, cid in want.items():
        if have.get(name) != cid:
            result.branches[name] = _branch(session, name, cid, force=name in have)
    if old_main != last:
        if session.exists() and session.current_branch == "main":
            session.reset(last)
        else:
            _branch(session, "main", last, force=old_main is not None)
    result.branches["main"] = last
    result.head = last
    set_by_pi = {} if set_by_pi is None else set_by_pi
    had = session.labels() if set_by_pi else {}
    for target, (_, line, lab) in sorted(labels.items(), key=lambda kv: kv[1][0]):
        if target not in tree.ids:
            continue
        old = set_by_pi.pop(target, None)
        if old is not None and old != lab and had.get(old) == tree.ids[target][0]:
            try:
                session.delete_label(old)  # Pi cleared or renamed it since the import that made it
            except RefNotFound:
                pass  # a rival import of the file removed it first
        if lab is None:
            continue
        try:
            result.labels[lab] = session.label(lab, at=tree.ids[target][0], force=True)
            set_by_pi[target] = lab
        except InvalidName as err:
            result.skipped.append((line, f"label {lab!r} on {target} not kept as a castore label: {err}"))


def _branch(session: Session, name: str, cid: str, force: bool) -> str:
    """Put branch ``name`` at ``cid``; one that must be new (``force`` False) and that a rival
    import of the same file made meanwhile is a lost race, as
    :data:`~castore.session.NEW_BRANCH` makes it for the tree writer's imports: at the same
    commit (the same lines, the same ids) nothing is left to do; elsewhere :class:`RefConflict`
    is raised, and the import runs again from what is stored
    (:data:`~castore.adapters.import_jobs.IMPORT_RETRY`)."""
    try:
        return session.branch(name, at=cid, force=force)
    except BranchError:
        if force:
            raise
        got = session.branches().get(name)
        if got == cid:
            return cid
        if got is None:
            raise
        raise RefConflict(session.refs.branch(name), None, got) from None


def _pending_id(name: str) -> str:
    """A name for the session of file ``name`` before its header says its id: the file's name
    (Pi's ``<time>_<id>.jsonl``), where that is a valid name. Raises nothing."""
    stem = os.path.basename(name).removesuffix(".jsonl")
    try:
        return names.validate(stem)
    except InvalidName:
        return "-"


def _next_version(store: Store, f: IO[bytes], name: str, app: str, user: str, session: Session, skip_bad: bool,
                  wait_torn: bool, why: str) -> ImportResult:
    """Continue the newest version ``<session>.vN`` of a rewritten file, or, when ``session``
    (whose archived part changed) is the newest, import the file as the next one (a rewritten
    file gives one new version, once)."""
    from ..porcelain import file_version  # (here: the import of a session loads no porcelain)

    base, version = file_version(session.id)
    k = version + 1
    while store.session(app, user, f"{base}.v{k}").exists():
        k += 1
    if k - 1 > version:
        return _import(store, f, name, app, user, f"{base}.v{k - 1}", skip_bad, True, wait_torn)
    out = _import(store, f, name, app, user, f"{base}.v{k}", skip_bad, True, wait_torn)
    out.notes.insert(0, f"{why}: archived entries kept, the file imported again as {base}.v{k}")
    return out


def find_files(path: str | os.PathLike[str]) -> list[str]:
    """The Pi session files at ``path``: one file, or every ``.jsonl`` under a folder such as
    ``~/.pi/agent/sessions`` (one folder per working directory); of Pi's own folder (``~/.pi``,
    ``~/.pi/agent``), its ``sessions`` folder only.

    Raises:
        ArchiveError: nothing there, or no ``.jsonl`` file.
    """
    p = os.path.abspath(os.fspath(path))
    if os.path.isfile(p):
        return [p]
    if not os.path.isdir(p):
        raise ArchiveError(p, "no such file or folder")
    for own in ("agent/sessions", "sessions"):  # ~/.pi, ~/.pi/agent: their settings are no sessions
        if os.path.isdir(os.path.join(p, own)):
            p = os.path.join(p, own)
            break
    out = list(files_under(p, ".jsonl"))
    if not out:
        raise ArchiveError(p, "no Pi session file (*.jsonl) here")
    return out


def import_pi(store: Store, path: str | os.PathLike[str], *, app: str = "pi", user: str = "local",
              skip_bad_lines: bool = False, wait_torn: bool = True, jobs: int | None = 1) -> list[ImportResult]:
    """Import (or bring up to date) Pi sessions: a file, or a folder such as ``~/.pi/agent/sessions``.

    One session per file (``app/user/<header id>``), each continued from where the last import
    stopped (:func:`import_session` with ``resume``); a file deleted upstream stays in the archive.
    ``wait_torn``: a last line still being written (no newline, not JSON), or a header not
    written yet (a file Pi has just made), waits for the next import (else it is a bad line,
    as :func:`import_session` says). ``jobs``: worker processes
    to spread the files over, the files of one session id (its versions) in one (None: as many
    as pay, :func:`~castore.adapters.import_jobs.default_jobs`); the results are the same
    (:mod:`castore.adapters.import_jobs`).

    Raises:
        ArchiveError: no session file at ``path``, or another agent's sessions there.
        ImportJobError: ``jobs`` below 1, a worker that died.
        PiImportError, InvalidName, StorageError, OSError: as :func:`import_session`.
    """
    from .import_jobs import import_files

    refuse_other(path, "pi")
    files = find_files(path)
    return import_files(store, "pi", files, [_header_id(fn) for fn in files], jobs=jobs, app=app, user=user,
                        skip_bad_lines=skip_bad_lines, wait_torn=wait_torn)


def _header_id(fn: str) -> str:
    """The session id a Pi file's header names (the file's path when it names none): the
    files of one session are imported by one process."""
    try:
        with open(fn, "rb") as f:
            header = json.loads(f.readline())
    except (OSError, ValueError):
        return fn
    sid = header.get("id") if isinstance(header, dict) else None
    return f"id:{sid}" if isinstance(sid, str) else fn


def import_sources(store: Store, files: list[str], *, app: str = "pi", user: str = "local",
                   skip_bad_lines: bool = False, wait_torn: bool = True,
                   out: list[ImportResult] | None = None) -> list[ImportResult]:
    """Import Pi session files as :func:`import_pi` does, in one write batch; ``out`` gets
    each file's result as it is done.

    Raises:
        as :func:`import_pi`.
    """
    results: list[ImportResult] = [] if out is None else out

    def one(fn: str) -> int:
        with open(fn, "rb") as f:
            results.append(_import(store, f, fn, app, user, None, skip_bad_lines, True, wait_torn))
            return f.tell()

    import_batched(store, files, one)
    return results


# -- export --------------------------------------------------------------------------------
def _raw_body(le: LogEntry) -> Any:
    e = le.entry
    if le.kind in ("message", "event", "compaction", "branch_summary", "model_change", "custom"):
        return body_of(e)
    return e.data if isinstance(e, Custom) else None


def export_session(session: Session, rev: str = "HEAD", *, out: str | os.PathLike[str] | IO[str],
                   whole: bool = True) -> int:
    """Write a session as a Pi v3 JSONL file; return the number of lines written.

    Args:
        session: the session.
        rev: the leaf: written last, so that Pi resumes there (when it has no children).
        out: a path, or a text file object to write to.
        whole: every entry reachable from the session's refs (True), or only the path
            from the root to ``rev`` (as Pi's ``/fork`` writes).

    Raises:
        SessionNotFound, RevisionNotFound, AmbiguousRevision, ObjectNotFound,
        IntegrityError, StorageError, OSError.
    """
    if isinstance(out, (str, os.PathLike)):
        with open(out, "w", encoding="utf-8", newline="\n") as f:
            return _export(session, rev, f, whole)
    return _export(session, rev, out, whole)


def archive_path(session: Session) -> str:
    """Where an archived Pi session's file goes under a sessions folder, as Pi lays it out:
    ``--<cwd, its separators as dashes>--/<the file's name>`` (the cwd from the file's header).

    Raises:
        ArchiveError: the session is not an archived Pi file.
    """
    from ..porcelain import file_version  # (here: the import of a session loads no porcelain)

    pi = as_dict(session.info.get("pi"))
    if not isinstance(pi.get("path"), str):
        raise ArchiveError("/".join(session.key), "not an archived Pi session file (export it alone: "
                           "castore export pi -s APP/USER/SESSION -o FILE)")
    cwd = as_dict(pi.get("header")).get("cwd")
    cwd = cwd if isinstance(cwd, str) else ""
    name = os.path.basename(pi["path"].replace("\\", "/"))
    folder = "--" + (cwd[1:] if cwd[:1] in ("/", "\\") else cwd).translate(str.maketrans("/\\:", "---")) + "--"
    return f"{folder}/{name if name.endswith('.jsonl') else file_version(session.id)[0] + '.jsonl'}"


def export_pi(store: Store, dest: str | os.PathLike[str], *, app: str = "pi",
              sessions: list[Session] | None = None) -> list[str]:
    """Write archived Pi sessions back under ``dest`` (the ``~/.pi/agent/sessions`` layout,
    :func:`archive_path`), each file byte for byte as it was imported.

    Entries castore appended to a session follow the file's bytes as Pi entries marked with
    :data:`MARK` (:func:`export_session`; importing the file again takes them as those
    commits). A v1 or v2 file comes back as it was read when castore appended nothing to it,
    else upgraded to v3, as Pi rewrites it when it opens it; so does a file imported with
    lines skipped, or before castore kept the bytes of v1 and v2 files. Of several versions of
    one file (``SESSION.v2``: Pi rewrote it), the newest is written.

    Returns:
        The files written, relative to ``dest``.

    Raises:
        FilesKept: files under ``dest`` hold what the archive's copy lacks: left as they were, the
            others written (:mod:`castore.adapters.export_files`).
        ArchiveError: a session is not an archived Pi file, or its path would leave ``dest``.
        ObjectNotFound, IntegrityError, StorageError, OSError.
    """
    from ..porcelain import file_version  # (here: the import of a session loads no porcelain)

    root = os.fspath(dest)
    chosen: dict[str, tuple[int, Session]] = {}
    for s in sessions if sessions is not None else list(archived_sessions(store, app, "pi")):
        rel = archive_path(s)
        v = file_version(s.id)[1]
        if rel not in chosen or chosen[rel][0] < v:
            chosen[rel] = (v, s)
    from .export_files import ExportWriter

    writer = ExportWriter(root)
    for rel, (_, s) in sorted(chosen.items()):
        pi = as_dict(s.info.get("pi"))
        segments = pi.get("segments")
        if not pi.get("exact") and isinstance(segments, list) and not _has_own(s):
            data = read_blobs(s.store, segments)
            writer.write(rel, [data[oid] for oid in segments])
        else:
            writer.write_with(rel, functools.partial(_export_to, s))
    return writer.done()


def _export_to(session: Session, path: str) -> None:
    export_session(session, out=path)


def _has_own(session: Session) -> bool:
    """Whether a session holds entries made in castore (not read from its file)."""
    adopted = {v[0] for v in as_dict(as_dict(session.info.get("pi")).get("adopted")).values()
               if isinstance(v, list) and v}
    return any(not _imported(le) and le.id not in adopted for le in session.log(all_branches=True))


def _export(session: Session, rev: str, f: IO[str], whole: bool) -> int:
    leaf = session.resolve(rev)
    entries = session.log(all_branches=True) if whole else session.entries(rev)
    by_id = {le.id: le for le in entries}
    if leaf not in by_id:  # a commit no ref reaches (detached): add its path
        for le in session.entries(leaf):
            by_id.setdefault(le.id, le)
    info = session.info
    adopted = {v[0]: (int(o_), v[1]) for o_, v in as_dict(as_dict(info.get("pi")).get("adopted")).items()
               if isinstance(v, list) and len(v) == 3 and str(o_).isdigit()}
    ordered = sorted(by_id.values(), key=lambda le: (0, le.meta["o"], 0.0, 0) if _imported(le)
                     else (0, adopted[le.id][0], 0.0, 0) if le.id in adopted else (1, 0, le.time, le.depth))
    ordered = _parents_first(ordered, by_id)
    children = {p for le in ordered for p in le.parents}
    moved = bool(ordered) and ordered[-1].id != leaf and leaf not in children
    if moved:
        ordered = [le for le in ordered if le.id != leaf] + [by_id[leaf]]
    header = (info.get("pi") or {}).get("header") if isinstance(info.get("pi"), dict) else None
    if not isinstance(header, dict):
        first = min((le.time for le in ordered), default=0.0)
        header = {"type": "session", "version": CURRENT_VERSION, "id": session.id, "timestamp": _iso(first), "cwd": ""}
    pi_ids: dict[str, str] = {}
    pi = as_dict(info.get("pi"))
    if whole and not moved and pi.get("exact") and isinstance(pi.get("segments"), list):
        # the file as it was read, byte for byte; then the entries castore made since
        data = read_blobs(session.store, pi["segments"])
        text = "".join(data[oid].decode("utf-8") for oid in pi["segments"])
        f.write(text)
        lines = text.count("\n")
        if text and not text.endswith("\n"):
            f.write("\n")
            lines += 1
        ordered_native = []
        for le in ordered:
            if _imported(le):
                pi_ids[le.id] = le.meta["pi"].get("id", le.id[:8])
            elif le.id in adopted:
                pi_ids[le.id] = str(as_dict(pi.get("adopted")).get(str(adopted[le.id][0]), [""] * 3)[2])
            else:
                ordered_native.append(le)
        return lines + _write_native(session, ordered_native, pi_ids, f)
    f.write(_dumps(header))
    lines = 1

    def blob(oid: str) -> bytes:
        return read_blob(session.store, oid)

    for le in ordered:
        if le.id in adopted:  # castore's own entry, as the file holds it
            raw = read_blobs(session.store, [adopted[le.id][1]])[adopted[le.id][1]].decode("utf-8")
            got = json.loads(raw)
            pi_ids[le.id] = got.get("id", le.id[:8]) if isinstance(got, dict) else le.id[:8]
            f.write(raw if raw.endswith("\n") else raw + "\n")
            lines += 1
            continue
        if _imported(le):
            meta = dict(le.meta)
            if "raw" in meta:
                meta["raw"] = inline_blobs(meta["raw"], blob)
            entry = to_pi(inline_blobs(_raw_body(le), blob), meta)
            pi_ids[le.id] = entry.get("id", le.id[:8])
            f.write(_dumps(entry))
            lines += 1
            continue
        lines += _write_native(session, [le], pi_ids, f)
    return lines


def _write_native(session: Session, entries: list[LogEntry], pi_ids: dict[str, str], f: IO[str]) -> int:
    """Write Pi entries for commits made in castore (each marked with :data:`MARK`); the number of lines."""
    taken = set(pi_ids.values())
    n = 0
    for le in entries:
        parent = pi_ids.get(le.parents[0]) if le.parents else None
        for entry in _native(le, parent, pi_ids, taken):
            entry[MARK] = le.id
            f.write(_dumps(inline_blobs(entry, lambda oid: read_blob(session.store, oid))))
            n += 1
    return n


def _imported(le: LogEntry) -> bool:
    return isinstance(le.meta.get("pi"), dict) and isinstance(le.meta.get("o"), int)


def _parents_first(ordered: list[LogEntry], by_id: dict[ObjectId, LogEntry]) -> list[LogEntry]:
    out: list[LogEntry] = []
    done: set[str] = set()
    for le in ordered:
        stack = [le]
        while stack:
            cur = stack[-1]
            todo = [p for p in cur.parents[:1] if p in by_id and p not in done]
            if todo:
                stack.append(by_id[todo[0]])
                continue
            stack.pop()
            if cur.id not in done:
                done.add(cur.id)
                out.append(cur)
    return out


def _native(le: LogEntry, parent: str | None, pi_ids: dict[str, str], taken: set[str]) -> list[dict[str, Any]]:
    """Pi entries for a commit made in castore (not imported)."""
    out: list[dict[str, Any]] = []

    def base(t: str) -> dict[str, Any]:
        n = 8
        while le.id[:n] in taken:
            n += 2
        pid = le.id[:n] if not out else f"{le.id[:n]}{len(out)}"
        taken.add(pid)
        prev = out[-1]["id"] if out else parent
        pi_ids[le.id] = pid
        return {"type": t, "id": pid, "parentId": prev, "timestamp": _iso(le.time)}

    e = le.entry
    ms = int(le.time * 1000)
    if isinstance(e, (Message, Event)):
        m = e if isinstance(e, Message) else e.message
        if m is not None:
            msg = m.to_dict()
            msg.setdefault("timestamp", ms)
            out.append({**base("message"), "message": msg})
        else:
            assert isinstance(e, Event)
            out.append({**base("custom"), "customType": "castore.event",
                        "data": o.to_builtins({"author": e.author, "state_delta": e.state_delta, "meta": e.meta})})
    elif isinstance(e, Compaction):
        d = {**base("compaction"), "summary": e.summary,
             "firstKeptEntryId": pi_ids.get(e.first_kept or "", ""), "tokensBefore": e.tokens_before}
        if e.details is not None:
            d["details"] = e.details
        out.append(d)
    elif isinstance(e, BranchSummary):
        d = {**base("branch_summary"), "fromId": pi_ids.get(e.from_id or "", "root"), "summary": e.summary}
        if e.details is not None:
            d["details"] = e.details
        out.append(d)
    elif isinstance(e, ModelChange):
        if e.model is not None:
            out.append({**base("model_change"), "provider": e.provider or "", "modelId": e.model})
        if e.thinking_level is not None:
            out.append({**base("thinking_level_change"), "thinkingLevel": e.thinking_level})
    elif isinstance(e, Custom):
        d = {**base("custom"), "customType": e.type if le.kind == "custom" else f"castore.{le.kind}"}
        if e.data is not None:
            d["data"] = o.to_builtins(e.data)
        out.append(d)
    return out


def _dumps(entry: dict[str, Any]) -> str:
    return json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n"


__all__ = ["import_session", "import_pi", "find_files", "export_session", "export_pi", "archive_path", "inline_images",
           "ImportResult", "PiImportError", "IMAGE_MIN", "BLOB_KEY", "MARK"]
