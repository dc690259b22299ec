"""Where the lines of an archived file go in a session's tree, and how they are written: the
:class:`TreeWriter` of the coding-agent archives (Claude Code, Codex, Gemini CLI), over the
shared engine :mod:`castore.adapters.jsonl_tree`.

Where a line hangs in the tree is the adapter's business (:class:`TreeWriter` takes a parent
line per line); the writer groups lines that follow each other into one run, starts a branch
where a line's parent is not a branch tip, and checks out the branch of the line the agent
was on last. A session that had commits gets each run as one ``append_many``; a session new
with the import (a first import, most of its lines) is built in memory by the session's
:class:`~castore.plumbing.Tree` (the same commits, made by the rule every append follows)
and its branches move once per landing of the write batch and once at the file's end,
not once per run. An import stopped part-way is finished by the next: the writer takes a
line the session already holds (each commit names its line) as it is instead of writing it
twice. :func:`branch_layout` names the branches of a finished tree (``main`` the path to the
newest leaf, the others by what made them).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from .. import objects as o
from ..entries import Event, body_of, check_value
from ..errors import BranchError, CastoreError, CorruptRef, InvalidEntry, RefConflict
from ..groupcommit import land_due, landing_due
from ..session import NEW_BRANCH
from .jsonl_tree import (
    LAYOUT,
    ArchiveError,
    LineChanged,
    adopted_rows,
    as_dict,
    encode_blob,
    put_encoded_blobs,
    stored_lines,
    tips_digest,
)

if TYPE_CHECKING:
    from ..plumbing import Batch, Tree
    from ..session import Session

#: flush a run of lines once its raw bytes add up to this much
RUN_BYTES = 8 << 20


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
    with no branches when the writer is made, each line's commit is built in memory as it
    comes (:meth:`castore.Session.tree`: no queue, no prepared entry; the run is the batch it
    goes on in) and the branches land where the write batch lands: just
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
        self.branches: dict[str, str] = dict(branches)
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
        #: (a session new with this writer) the open run's batch, its branch, the commit it
        #: started on, its last line and commit, its last active commit, its lines' blobs
        self._batch: Batch | None = None
        self._branch_of_run = ""
        self._run_base: str | None = None
        self._last_n: int | None = None
        self._last_cid: str | None = None
        self._run_active: str | None = None
        self._blobs: list[tuple[str, bytes]] = []
        self.created: list[str] = []
        self.active_cid: str | None = None  # the commit of the last active line written
        self.labels: list[tuple[int, str]] = []
        #: the time of the last line that had one (for the lines after it that have none)
        self.last_time = last_time
        self._times: list[float] = []

    def add(self, n: int, parent: int | None, raw: bytes, entry: Event, active: bool,
            blob: tuple[str, bytes] | None = None) -> None:
        """Queue line ``n`` after line ``parent`` (in a session new with this writer: build
        its commit at once, :meth:`_build_line`); ``active``: a line the agent's HEAD follows;
        ``blob``: the line's blob as :func:`encode_blob` gives it, when the caller made it.

        Raises:
            LineChanged: the session holds another line ``n`` (written by an interrupted
                import of a file rewritten since).
            ArchiveError: the line starts a second root in a session that has one.
            InvalidEntry: (a session new with this writer) the line cannot be stored even
                without its message.
        """
        when = entry.meta.get("time")
        if isinstance(when, (int, float)) and not isinstance(when, bool):
            self.last_time = float(when)
        if blob is None:
            blob = encode_blob(raw, self.session.store.objects.codec)
        if self.build is not None:
            self._build_line(n, parent, raw, entry, active, blob)
            return
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
        """Append the queued run (in a session new with this writer: end the run built in
        memory, :meth:`_end_run`, moving the branches first when the write batch is about to
        land).

        Raises:
            ArchiveError: the run starts a second root in a session that has one.
            RefConflict: a branch moved since it was read. StorageError.
        """
        if self._batch is not None:
            self._end_run()
        if not self.run:
            return
        s = self.session
        put_encoded_blobs(s.store, [p.blob for p in self.run])
        parent = self.cid[self.run_parent] if self.run_parent is not None else None
        expect = parent
        if parent is None:
            if self.exists and s.head is not None:
                raise ArchiveError(self.key, "a second root line: cannot start a new tree in a session")
            branch = self.current or "main"
            if branch not in self.branches:  # another import of the file may be making it
                expect = NEW_BRANCH
        else:
            got = self.tips.get(parent)
            if got is None:
                branch = self._new_name(self.run[0].n, self.run[0].entry.meta)
                # a branch an import stopped before its lines made is taken as it is
                if not self.resuming or self.branches.get(branch) != parent:
                    self._branch(branch, parent)
                self.created.append(branch)
            else:
                branch = got
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
        cids = self.cid
        active_cid = None
        before = parent
        for p, cid in zip(self.run, ids, strict=True):
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
        land_due()  # a long file's runs land as they go when the import runs in a write batch

    def _build_line(self, n: int, parent: int | None, raw: bytes, entry: Event, active: bool,
                    blob: tuple[str, bytes]) -> None:
        """Build line ``n``'s commit at once (a session new with this writer): on the open
        run when its parent is the run's last line, else on a run opened at ``parent``.
        A line whose message castore cannot store is built without it (:func:`_storable`).

        Raises:
            ArchiveError: a second root line. InvalidEntry: the line cannot be stored even so.
            ObjectNotFound, IntegrityError, StorageError: (a fork) reading the parent's block.
        """
        if self._batch is not None and (parent != self._last_n or self.run_bytes >= RUN_BYTES):
            self._end_run()
        batch = self._batch if self._batch is not None else self._open_run(n, parent, entry)
        assert self.build is not None and self.tree is not None
        when = self.last_time if self.last_time is not None else 0.0
        try:
            cid = self.build.commit(batch, entry, when)
        except InvalidEntry:  # no commit was added: a body castore cannot store (nested too deep)
            entry = _storable(entry)
            cid = self.build.commit(batch, entry, when)
        self._blobs.append(blob)
        self.run_bytes += len(raw)
        if self.written is not None:
            self.written.append((cid, entry, raw))
        before = self._last_cid
        self.tree.append(Written(cid, (before,) if before is not None else (), entry.meta))
        self.cid[n] = cid
        if active:
            self._run_active = cid
        self._last_n, self._last_cid = n, cid

    def _open_run(self, n: int, parent: int | None, first: Event) -> Batch:
        """Open a run at line ``parent`` (a session new with this writer): on the branch whose
        tip it is, else on a new branch named after line ``n``; return its batch.

        Raises:
            ArchiveError: ``parent`` is None and the session has a root already.
            ObjectNotFound, IntegrityError, StorageError: (a fork) reading the parent's block.
        """
        assert self.build is not None
        base = self.cid[parent] if parent is not None else None
        if base is None:
            if self.tree:  # a root already, which this writer built (no ref names it yet)
                raise ArchiveError(self.key, "a second root line: cannot start a new tree in a session")
            branch = self.current or "main"
            if not self.exists:
                self.head_on = branch
        else:
            got = self.tips.get(base)
            if got is None:
                got = self._new_name(n, first.meta)
                self.created.append(got)
            branch = got
        self._batch = self.build.run(base)
        self._branch_of_run, self._run_base, self._last_cid, self._run_active = branch, base, base, None
        return self._batch

    def _end_run(self) -> None:
        """End the open run (a session new with this writer): its blobs and commits to the
        store (held until the write batch lands), its branch's tip moved in memory; then the
        branches are published first when the write batch is about to land.

        Raises:
            RefConflict: (publishing) a branch moved since. StorageError.
        """
        assert self._batch is not None and self.build is not None and self._last_cid is not None
        batch, self._batch = self._batch, None
        put_encoded_blobs(self.session.store, self._blobs)
        self._blobs = []
        self.build.end(batch)
        branch, tip = self._branch_of_run, self._last_cid
        if self._run_base is not None:
            self.tips.pop(self._run_base, None)
        self.tips[tip] = branch
        self.branches[branch] = tip
        self.exists = True
        if self._run_active is not None:
            self.active, self.active_commit = branch, None
            self.active_cid = self._run_active
        self.run_bytes = 0
        if landing_due():
            self._publish()
        land_due()  # a long file's runs land as they go when the import runs in a write batch

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

    def _new_name(self, n: int, meta: Mapping[str, Any]) -> str:
        """The name of a branch starting at line ``n`` (its entry's ``meta``; ``line-<n>`` in
        a layout 1 session)."""
        if self.layout < 2:
            return f"line-{n}"
        return f"{fork_kind(meta, self.meta_key) or 'fork'}-{n}"

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
        self.branches = dict(s.branches())
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
