"""Import and export Claude Code sessions (``~/.claude/projects/<project>/<session>.jsonl``).

Each session file becomes a castore session ``claude/<project>/<session>``; each file under
``<session>/`` that is JSONL (subagents, workflows) becomes its own session
``claude/<project>/<session>.<path with dots>`` (``…/subagents/agent-a1.jsonl`` ->
``<session>.subagents.agent-a1``), linked in its info to the session and commit that
spawned it (:mod:`castore.adapters.claude_links`); any other file under ``<session>/``
(``agent-*.meta.json``, ``tool-results/``) is kept as a blob named in the session's info.
See :mod:`castore.adapters.jsonl_tree` for how lines are kept byte for byte and imported
incrementally.

Before subagents got files of their own (Claude Code 2.0.x), their lines were written into
the main file among the main session's, marked ``isSidechain: true``. Each such chain
becomes a session ``<session>.sidechains.agent-<agentId>`` (``.line-<n>`` when its first
line names no agent; :class:`_Sidechains` says how lines find their chain), linked in its
info (``spawned_by``) as a subagent file is: to the trunk line that names its agent, else
to the Task call that spawned it. Its lines keep their place in the main file, and
``export`` writes them back there.

The tree is Claude Code's: a line's parent is the line its ``parentUuid`` (or, for a
compact boundary, ``logicalParentUuid``) names, read turn by turn as
:mod:`castore.adapters.claude_tree` says: the parts of one turn (parallel tool calls, their
results, progress lines) are one path in file order, and only a new prompt after an
earlier parent (a rewind) is a branch. ``main`` (HEAD) is the path to the last
``user``/``assistant`` line (the leaf the agent goes on from); other leaves keep a branch
``rewind-<n>`` (:func:`~castore.adapters.tree_writer.branch_layout`).
Compact boundaries get a label ``compact-<n>``; ``summary``/``custom-title``/``ai-title``
lines name the session (``info["name"]``).

Bodies: a ``user``/``assistant`` line's body is its message (role and content), with
thinking signatures and base64 image data left out (they stay in the raw line, never
searched); other lines have no body.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from ..entries import INJECTED, Event, Message, message_from_body
from ..errors import CastoreError, InvalidEntry
from ..usage import CLAUDE_USAGE, claude_record
from . import jsonl_tree
from .claude_links import (
    KEY,
    SPAWNERS,
    agent_links,
    file_agent,
    first_written,
    found_agents,
    link_sidechains,
    link_subagent,
    name_agents,
    spawned_by,
    spawns_written,
)
from .claude_tree import Paths, role_of
from .detect import refuse_other
from .jsonl_tree import (
    LAYOUT,
    NEWLINE,
    NOT_JSON,
    ArchiveError,
    FileResult,
    LineChanged,
    appended,
    archived_rows,
    as_dict,
    blob_id,
    check_reachable,
    counts_redactions,
    encode_blob,
    entry_text,
    export_lines,
    files_under,
    first_visit,
    import_batched,
    iso_time,
    joined,
    layout_of,
    line_event,
    links_back,
    own_commits,
    parse_line,
    parse_time,
    parse_vouched,
    prefix_digest,
    put_blobs,
    read_blobs,
    read_lines,
    record_newline,
    settled_head,
    stored_bytes,
    stored_lines,
)
from .tree_writer import TreeWriter

if TYPE_CHECKING:
    from ..entries import LogEntry
    from ..session import Session
    from ..store import Store

APP = "claude"
_TURNS = ("user", "assistant")
_TITLES = ("summary", "custom-title", "ai-title")


# -- finding files ---------------------------------------------------------------------------
@dataclass
class _Source:
    """One session file to import: its project, session id and path relative to the root."""

    path: str
    project: str
    session_id: str
    rel: str
    parent_id: str | None = None  # the main session of a subagent file
    side_files: dict[str, str] = field(default_factory=dict)  # rel -> path (main sessions only)
    version: int = 1  # > 1: the session is ``<session_id of version 1>.v<version>`` (a rewritten file)
    supersedes: str | None = None  # the session of the version before


def find_sessions(path: str | os.PathLike[str]) -> list[_Source]:
    """The session files under ``path``: one ``.jsonl`` file, a project folder, a projects tree,
    or Claude Code's own folder (``~/.claude``: its ``projects`` tree). Linked folders are
    followed, as Claude Code reads them (a dotfiles manager links ``projects`` or a project),
    each real folder once.

    Raises:
        ArchiveError: the path does not exist, or holds no session file.
    """
    p = os.path.abspath(os.fspath(path))
    if os.path.isfile(p):
        proj_dir, name = os.path.split(p)
        if not name.endswith(".jsonl"):
            raise ArchiveError(p, "not a .jsonl session file")
        return _project_sources(proj_dir, only=name)
    if not os.path.isdir(p):
        raise ArchiveError(p, "no such file or folder")
    if os.path.isdir(os.path.join(p, "projects")):  # ~/.claude, whose history.jsonl is no session
        return find_sessions(os.path.join(p, "projects"))
    if any(n.endswith(".jsonl") and os.path.isfile(os.path.join(p, n)) for n in os.listdir(p)):
        return _project_sources(p)
    out: list[_Source] = []
    seen = {os.path.realpath(p)}
    for n in sorted(os.listdir(p)):
        d = os.path.join(p, n)
        if os.path.isdir(d) and not links_back(d) and first_visit(d, seen):  # a linked project folder too, once
            out.extend(_project_sources(d))
    if not out:
        raise ArchiveError(p, "no Claude Code session file (*.jsonl) in this folder or its project folders")
    return out


def _project_sources(proj_dir: str, only: str | None = None) -> list[_Source]:
    project = os.path.basename(proj_dir)
    out: list[_Source] = []
    for name in sorted(os.listdir(proj_dir)):
        if not name.endswith(".jsonl") or (only is not None and name != only):
            continue
        fpath = os.path.join(proj_dir, name)
        if not os.path.isfile(fpath):
            continue
        sid = name[: -len(".jsonl")]
        main = _Source(fpath, project, sid, f"{project}/{name}")
        out.append(main)
        sdir = os.path.join(proj_dir, sid)
        if os.path.isdir(sdir) and not links_back(sdir):
            for full in files_under(sdir, links=True):
                inner = os.path.relpath(full, sdir).replace(os.sep, "/")
                rel = f"{project}/{sid}/{inner}"
                if full.endswith(".jsonl"):
                    sub_id = sid + "." + inner[: -len(".jsonl")].replace("/", ".")
                    out.append(_Source(full, project, sub_id, rel, parent_id=sid))
                else:
                    main.side_files[rel] = full
    return out


# -- lines -----------------------------------------------------------------------------------
def _clean(content: Any) -> Any:
    """A message's content without signatures and base64 image data (kept in the raw line).

    A block with none of them is taken as it is, not copied (the content itself when no
    block has any): the line's parsed value is read, never changed, after its entry is made.
    """
    if not isinstance(content, list):
        return content
    out = []
    changed = False
    for b in content:
        if isinstance(b, dict):
            kind = b.get("type")
            src = b.get("source")
            if "signature" in b or kind == "redacted_thinking" or (isinstance(src, dict) and "data" in src) \
                    or (kind == "tool_result" and isinstance(b.get("content"), list)):
                b = {k: v for k, v in b.items() if k != "signature"}
                if kind == "redacted_thinking":
                    b.pop("data", None)
                if isinstance(src, dict) and "data" in src:
                    b["source"] = {k: v for k, v in src.items() if k != "data"}
                if kind == "tool_result" and isinstance(b.get("content"), list):
                    b["content"] = _clean(b["content"])
                changed = True
        out.append(b)
    return out if changed else content


#: tags Claude Code wraps around what it writes into a user turn (commands, their output,
#: notifications, reminders); a user text that starts with one was not typed as such
_WRAPPERS = re.compile(r"\s*<(command-name|command-message|command-args|command-contents|local-command-stdout|"
                       r"local-command-stderr|local-command-caveat|task-notification|system-reminder|bash-input|"
                       r"bash-stdout|bash-stderr|user-prompt-submit-hook)>")
_CAVEAT = "Caveat: The messages below were generated by the user while running local commands"


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [str(b["text"]) for b in content
                if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)]
    return []


def _wrapped(text: str) -> str | None:
    """The wrapper a user text starts with (None: none, typed as it reads)."""
    w = _WRAPPERS.match(text)
    if w:
        return w.group(1)
    if text.startswith(_CAVEAT):
        return "local-command-caveat"
    if text.startswith("[Request interrupted by user"):
        return "interrupt"
    return None


def injected(d: dict[str, Any]) -> str | None:
    """What a ``user``/``assistant`` line is when Claude Code wrote it rather than a human
    typing it or the model answering (None: typed, or answered).

    ``meta`` (``isMeta``), ``compact_summary``, ``sidechain`` (a subagent's prompt and
    results, written by the agent that spawned it), ``tool_result``, ``interrupt``,
    ``synthetic`` (an assistant line the CLI made up, e.g. an API error), or the tag of a
    wrapper (``command-name``, ``local-command-stdout``, ``task-notification``,
    ``system-reminder``, ...) when every text block of the line starts with one: a human
    prompt with a reminder block beside it stays typed.
    """
    m = as_dict(d.get("message"))
    if d.get("type") == "assistant":
        return "synthetic" if m.get("model") == "<synthetic>" else None
    if d.get("isSidechain") is True:
        return "sidechain"
    if d.get("isMeta") is True:
        return "meta"
    if d.get("isCompactSummary") is True:
        return "compact_summary"
    content = m.get("content")
    if isinstance(content, list) and content and all(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
        return "tool_result"
    whys = [_wrapped(t) for t in _texts(content)]
    return whys[0] if whys and all(whys) else None


def _message(d: dict[str, Any]) -> Message | None:
    m = d.get("message")
    if not isinstance(m, dict):
        return None
    role = m.get("role")
    if not isinstance(role, str) or not role:
        role = d.get("type")
    try:
        return message_from_body({"role": role, "content": _clean(m.get("content"))})
    except InvalidEntry:
        return None


def _type_uuid(d: dict[str, Any]) -> tuple[str | None, str | None]:
    """A parsed line's ``type`` and ``uuid`` (None: absent, or not a string)."""
    t, u = d.get("type"), d.get("uuid")
    return t if isinstance(t, str) else None, u if isinstance(u, str) else None


def _entry(n: int, raw_id: str, d: dict[str, Any], vouched: bool = False,
           type_uuid: tuple[str | None, str | None] | None = None) -> Event:
    """The commit entry of line ``n`` (``d``: the line parsed, {} when it is not a JSON object;
    ``raw_id``: the id of the line's blob; ``vouched``: ``d`` is, as
    :func:`~castore.adapters.jsonl_tree.parse_vouched` says, and so is the entry;
    ``type_uuid``: :func:`_type_uuid` of ``d``, when the caller has it)."""
    get = d.get
    t, u = type_uuid if type_uuid is not None else _type_uuid(d)
    msg = _message(d) if u is not None and t in _TURNS else None
    when = parse_time(get("timestamp"))
    if when is None:
        snapshot = get("snapshot")
        if isinstance(snapshot, dict):  # a file-history-snapshot line
            when = parse_time(snapshot.get("timestamp"))
    own: dict[str, Any] = {"o": n, "raw": raw_id}
    if u:
        own["uuid"] = u
    if t:
        own["type"] = t
    if t == "assistant":
        own[CLAUDE_USAGE] = claude_record(d)
    meta: dict[str, Any] = {KEY: own}
    if when is not None:
        meta["time"] = when
    if msg is not None:
        why = injected(d)
        if why is not None:
            meta[INJECTED] = why
    author = (msg.role if msg else t) or "line"
    return line_event(author, msg, meta, vouched)


_AGENT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _prompt_digest(text: Any) -> str | None:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16] if isinstance(text, str) and text else None


@dataclass
class _Thread:
    """One old-layout sidechain of a main file: its session and where its import stands."""

    session: Session
    root: int  # the line it starts at
    cursor: int | None = None  # its last line
    cursor_commit: str | None = None
    agent: str | None = None
    spawn: dict[str, Any] = field(default_factory=dict)  # {"o": line, "tool_use_id": id} of the Task call
    time: float | None = None
    writer: TreeWriter | None = None
    tips: str | None = None  # the digest of its branch tips when the last import finished


class _Sidechains:
    """The old layout's subagents: lines with ``isSidechain: true`` inside a main file, each
    chain imported as its own session ``<session>.sidechains.agent-<agentId>`` (or
    ``.line-<n>`` when its first line names no agent), linked to the turn that spawned it.

    A line joins the chain its ``parentUuid`` is in; a line with no parent starts a chain;
    a line whose parent is unknown joins the chain of its ``agentId``, else the last chain
    (else starts one). The lines keep their place in the file (``o``), so the main file is
    written back with every line where it was.
    """

    def __init__(self, imp: _Importer, state: dict[str, Any]) -> None:
        # weakly: the importer holds this, and a cycle would keep the file's parsed lines (its
        # written log) alive until the collector, paused while importing, runs again
        self.imp = weakref.proxy(imp)
        self.threads: dict[str, _Thread] = {}
        for sid, t in as_dict(state.get("threads")).items():
            t = as_dict(t)
            try:
                self.threads[sid] = _Thread(imp.store.session(imp.session.app, imp.src.project, sid),
                                            int(t.get("root", 0)), t.get("cursor"), t.get("cursor_commit"),
                                            t.get("agent"), as_dict(t.get("spawn")), t.get("time"),
                                            tips=t.get("tips"))
            except (CastoreError, TypeError, ValueError):
                continue  # a damaged entry of the state: that chain is not continued
        self.last: str | None = state.get("last") if state.get("last") in self.threads else None
        self.tasks: list[list[Any]] = [list(x) for x in state.get("tasks") or [] if isinstance(x, list)]
        self.uuids: dict[str, tuple[str, int]] = {}
        self.loaded = False
        imp.sidechains = self

    def saw_task(self, n: int, d: dict[str, Any]) -> None:
        """Note the Task/Agent calls of main line ``n`` (what a chain starting later was spawned by)."""
        content = as_dict(d.get("message")).get("content")
        for b in content if isinstance(content, list) else ():
            if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("name") in SPAWNERS:
                self.tasks.append([n, b.get("id"), _prompt_digest(as_dict(b.get("input")).get("prompt"))])
        del self.tasks[:-32]

    def _load(self) -> None:
        """Map the uuids of the chains' archived lines to their chain and line (a parent far back)."""
        self.loaded = True
        for sid, th in self.threads.items():
            if not th.session.exists():
                continue
            known = self._writer(sid).cid
            for le in th.session.log(all_branches=True):
                m = le.meta.get(KEY)
                if isinstance(m, dict) and isinstance(m.get("o"), int):
                    known[m["o"]] = le.id
                    if isinstance(m.get("uuid"), str):
                        self.uuids.setdefault(m["uuid"], (sid, m["o"]))

    def _writer(self, sid: str) -> TreeWriter:
        th = self.threads[sid]
        if th.writer is None:
            known = {th.cursor: th.cursor_commit} if th.cursor is not None and th.cursor_commit else {}
            th.writer = TreeWriter(th.session, known, "/".join(th.session.key), last_time=th.time,
                                   meta_key=KEY, tips=th.tips, layout=self.imp.layout)
        return th.writer

    def _start(self, n: int, d: dict[str, Any]) -> str:
        base = self.imp.src.session_id
        agent = d.get("agentId") if isinstance(d.get("agentId"), str) else None
        named = agent is not None and _AGENT_ID.fullmatch(agent) is not None  # else not fit for a name
        sid = f"{base}.sidechains.agent-{agent}" if named else f"{base}.sidechains.line-{n}"
        session = self.imp.store.session(self.imp.session.app, self.imp.src.project, sid)
        if sid in self.threads or (session.exists() and not self._began(session, n)):
            sid = f"{base}.sidechains.line-{n}"  # the same agent again: a chain of its own
            session = self.imp.store.session(self.imp.session.app, self.imp.src.project, sid)
        self.threads[sid] = _Thread(session, n, agent=agent, spawn=self._spawner(d))
        return sid

    @staticmethod
    def _began(session: Session, n: int) -> bool:
        """Whether ``session`` is the chain starting at line ``n``, begun by an import that
        stopped before recording it (its lines are taken again as they are)."""
        return stored_lines(session, KEY).get(n) is not None

    def _spawner(self, d: dict[str, Any]) -> dict[str, Any]:
        """The Task call a chain starting with ``d`` was spawned by: the one whose prompt is
        its first text, else the last one no chain claimed, else the last one."""
        if not self.tasks:
            return {}
        msg = as_dict(d.get("message"))
        texts = _texts(msg.get("content")) if d.get("type") == "user" else []
        want = _prompt_digest(texts[0]) if texts else None
        claimed = {th.spawn.get("tool_use_id") for th in self.threads.values()}
        pick = next((t for t in reversed(self.tasks) if want is not None and t[2] == want), None) \
            or next((t for t in reversed(self.tasks) if t[1] not in claimed), None) or self.tasks[-1]
        return {"o": pick[0], "tool_use_id": pick[1]}

    def add(self, n: int, raw: bytes, d: dict[str, Any], main_uuids: dict[str, int] | None) -> None:
        """Import sidechain line ``n`` into its chain's session."""
        u = d.get("uuid") if isinstance(d.get("uuid"), str) else None
        p = d.get("parentUuid") if isinstance(d.get("parentUuid"), str) else None
        agent = d.get("agentId") if isinstance(d.get("agentId"), str) else None
        if p is not None and p not in self.uuids and not self.loaded and self.threads:
            self._load()
        parent: int | None
        if p is not None and p in self.uuids:
            sid, parent = self.uuids[p]
        else:
            by_agent = next((k for k, th in self.threads.items() if agent and th.agent == agent), None)
            if p is not None and by_agent is not None:
                sid = by_agent
            elif p is not None and self.last is not None and (main_uuids is None or p not in main_uuids):
                sid = self.last
            else:
                sid = self._start(n, d)
            parent = self.threads[sid].cursor
        th = self.threads[sid]
        if agent and th.agent is None:
            th.agent = agent
        t = d.get("type")
        blob = encode_blob(raw, self.imp.store.objects.codec)
        self._writer(sid).add(n, parent, raw, _entry(n, blob[0], d), t in _TURNS and u is not None, blob)
        if u is not None:
            self.uuids.setdefault(u, (sid, n))
        th.cursor = n
        self.last = sid

    def finish(self) -> list[str]:
        """Write the chains' queued lines and their info; return the ids of the sessions written."""
        main = self.imp.session
        out = []
        for sid, th in self.threads.items():
            if th.writer is None:
                continue
            th.writer.finish()
            if th.cursor is not None:
                th.cursor_commit = th.writer.cid.get(th.cursor, th.cursor_commit)
            th.time = th.writer.last_time
            info = th.session.info
            info[KEY] = {"sidechain_of": main.id, "line": th.root, **({"agent": th.agent} if th.agent else {})}
            if th.spawn and "spawned_by" not in info:
                cid = self.imp.commit_of(th.spawn["o"])
                if cid is not None:
                    info["spawned_by"] = {"app": main.app, "user": main.user, "session": main.id, "commit": cid,
                                          "tool_use_id": th.spawn.get("tool_use_id"),
                                          **({"first": th.writer.cid[th.root]} if th.root in th.writer.cid else {})}
            th.session.set_info(info)
            th.tips = th.writer.branch_digest()
            out.append(sid)
        return out

    def state(self) -> dict[str, Any]:
        """What the next import needs to continue the chains (kept in the main session's info)."""
        return {"threads": {sid: {"root": th.root, "cursor": th.cursor, "cursor_commit": th.cursor_commit,
                                  "agent": th.agent, "spawn": th.spawn, "time": th.time, "tips": th.tips}
                            for sid, th in self.threads.items()},
                "last": self.last, "tasks": self.tasks}


@dataclass
class _State:
    """Where the previous import of a file stopped (kept in the session's info)."""

    offset: int = 0
    lines: int = 0
    digest: str | None = None
    cursor: int | None = None  # ordinal of the last line

    @classmethod
    def of(cls, info: dict[str, Any]) -> _State:
        c = as_dict(info.get(KEY))
        try:
            return cls(int(c.get("offset", 0)), int(c.get("lines", 0)), c.get("digest"), c.get("cursor"))
        except (TypeError, ValueError):
            return cls()


class _Importer:
    """Imports one file into one session, from where the last import stopped."""

    def __init__(self, store: Store, src: _Source, app: str, links: dict[str, dict[str, Any]] | None = None) -> None:
        self.store = store.tenant(app, src.project)  # its tenant's store, in the tenant layout (docs/tenants.md)
        self.src = src
        #: the main session's agents (:func:`~castore.adapters.claude_links.agent_links`), for a subagent file
        self.links = links or {}
        self.session = store.session(app, src.project, src.session_id)
        # (each read of HEAD parses it: an imported session's info says it exists)
        self.info = self.session.info
        existed = bool(self.info) or self.session.exists()
        self.state = _State.of(self.info)
        #: how branches are named (a session imported before layouts keeps its ``line-<n>``)
        self.layout = layout_of(as_dict(self.info.get(KEY))) if existed else LAYOUT
        self.uuids: dict[str, int] | None = None  # loaded from the store when first needed
        self.known: dict[int, str] = {}
        self.main_cid: dict[int, str] = {}  # line -> commit of the main session's lines written by run()
        self.sidechains: _Sidechains | None = None
        self.own: set[str] | None = None  # the session's commits, read when a line names one
        #: the file had nothing new and the session nothing to finish (:meth:`_settled`): ``info`` is current
        self.settled = False
        #: ``(commit, entry, raw line)`` of every commit of a session new with this import (its
        #: whole log, kept by the writer), else None
        self.written: list[tuple[str, Event, bytes]] | None = None

    def commit_of(self, n: int) -> str | None:
        """The commit of line ``n`` of the main session (this import's, or an earlier one's)."""
        if n in self.main_cid:
            return self.main_cid[n]
        if n not in self.known:
            self._load_known()
        return self.known.get(n)

    def _load_known(self) -> None:
        """Map the archived lines' uuids and ordinals to commits (a parent far back)."""
        self.uuids, self.known = {}, {}
        if not self.session.exists():
            return
        for le in self.session.log(all_branches=True):
            m = le.meta.get(KEY)
            if isinstance(m, dict) and isinstance(m.get("o"), int):
                self.known[m["o"]] = le.id
                u = m.get("uuid")
                # a line an interrupted import stored past the recorded position is found again
                if isinstance(u, str) and m["o"] < self.state.lines:
                    self.uuids[u] = min(m["o"], self.uuids.get(u, m["o"]))
        for o_, v in as_dict(as_dict(self.info.get(KEY)).get("adopted")).items():
            if isinstance(v, list) and v and isinstance(v[0], str) and o_.isdigit():
                self.known[int(o_)] = v[0]
                if len(v) > 2 and isinstance(v[2], str):
                    self.uuids.setdefault(v[2], int(o_))

    def _own(self) -> set[str]:
        if self.own is None:
            self.own = own_commits(self.session)
        return self.own

    @counts_redactions
    def run(self, f: IO[bytes]) -> FileResult:
        res = FileResult(self.src.path, self.session.key)
        size = os.fstat(f.fileno()).st_size
        st = self.state
        if st.offset and (size < st.offset or prefix_digest(f, st.offset) != st.digest):
            return self._changed(f, f"the first {st.offset} bytes changed since the last import (file rewritten?)")
        if st.offset and size == st.offset and self._settled(res):
            return res
        try:
            return self._run(f, res)
        except LineChanged as e:
            return self._changed(f, e.reason)

    def _settled(self, res: FileResult) -> bool:
        """Whether a file with nothing past its recorded position has nothing to do (its side
        files unchanged, the session's branches as the last import left them, see
        :func:`settled_head`); then ``res`` says where the file stands."""
        if self._side_files_changed():
            return False
        c = as_dict(self.info.get(KEY))
        self.settled, head = settled_head(self.session, c.get("tips"))
        if self.settled:
            res.total, res.offset, res.head = self.state.lines, self.state.offset, head
            if self.src.parent_id is None:  # its old-layout chains are linked after, as after any import
                _Sidechains(self, as_dict(c.get("sidechains")))
        return self.settled

    def _run(self, f: IO[bytes], res: FileResult) -> FileResult:
        key = "/".join(self.session.key)
        st = self.state
        c = as_dict(self.info.get(KEY))
        if not self.session.exists():
            self.uuids = {}
        elif st.cursor is not None and isinstance(c.get("cursor_commit"), str):
            self.known[st.cursor] = c["cursor_commit"]
        else:
            self._load_known()
        self.known.update(Paths.commits(c))
        w = TreeWriter(self.session, self.known, key, last_time=c.get("time"), meta_key=KEY, tips=c.get("tips"),
                       layout=self.layout, keep=self.store.plumbing.redactor is None)
        self.written = w.written
        # a main file of the old layout holds its subagents' lines (isSidechain) among its own
        side = _Sidechains(self, as_dict(c.get("sidechains"))) if self.src.parent_id is None else None
        uuids: dict[str, int] = dict(self.uuids or {})
        cursor = st.cursor
        paths = Paths.of(c, cursor)
        n = st.lines
        offset = st.offset
        titles: str | None = None
        adopted: dict[str, list[str]] = {}
        codec = self.store.objects.codec
        for end, raw in read_lines(f, st.offset, self.store.plumbing.redactor):
            d, vouched = parse_vouched(raw)
            if d is NOT_JSON:
                res.notes.append(f"line {n + 1}: not JSON, kept as is")
            if not isinstance(d, dict):
                d = {}
            get = d.get
            if side is not None and get("isSidechain") is True:
                side.add(n, raw, d, uuids if self.uuids is not None else None)
                n, offset = n + 1, end
                continue
            t, u = type_uuid = _type_uuid(d)
            p = get("parentUuid")
            if not isinstance(p, str):
                p = get("logicalParentUuid")
                if not isinstance(p, str):
                    p = None
            turn = t in _TURNS and u is not None
            mark = get(MARK)
            if isinstance(mark, str) and mark in self._own():  # castore's own commit, as export wrote it
                w.flush()
                put_blobs(self.store, [raw])
                adopted[str(n)] = [mark, blob_id(raw, self.store.objects.codec), *([u] if u else [])]
                w.cid[n] = mark
                if u is not None:
                    uuids.setdefault(u, n)
                paths.follow(n, u, cursor)
                cursor, n, offset = n, n + 1, end
                continue
            blob = encode_blob(raw, codec)
            entry = _entry(n, blob[0], d, vouched, type_uuid)
            role = role_of(t, u is not None, entry.meta.get(INJECTED))
            if p is not None and p not in uuids and self.uuids is None and paths.find(p, role, cursor) is None:
                self._load_known()  # a parent further back than the last import's last line
                assert self.uuids is not None
                w.cid.update(self.known)
                uuids = {**uuids, **self.uuids}  # the earliest line of a uuid wins
            parent, fork = paths.place(n, u, p, role, cursor, uuids)
            if fork is not None:
                entry.meta[KEY]["fork"] = fork
            w.add(n, parent, raw, entry, turn, blob)
            if side is not None and t == "assistant":
                side.saw_task(n, d)
            if u is not None:
                uuids.setdefault(u, n)
            if t == "system" and d.get("subtype") == "compact_boundary":
                w.label(n, f"compact-{n}")
            if t in _TITLES:
                title = d.get("summary") if t == "summary" else d.get("customTitle", d.get("aiTitle", d.get("title")))
                if isinstance(title, str) and title.strip():
                    titles = title.strip()
            cursor = n
            n += 1
            offset = end
        # the file may have grown while it was read: what is left is counted now
        res.torn = max(0, os.fstat(f.fileno()).st_size - offset)
        res.lines = n - st.lines
        w.flush()
        res.branches = w.created
        if res.lines == 0 and self.session.exists() and not self._side_files_changed() and not w.resuming:
            offset = record_newline(self.session, KEY, self.info, f, offset)
            res.total, res.offset, res.head = n, offset, self.session.head
            return res
        res.head = w.finish()
        self.main_cid = w.cid
        info = dict(self.info)
        c = dict(info.get(KEY) or {})
        c.pop("reach", None)  # (an older import's: the paths say it now)
        c.pop(NEWLINE, None)  # lines came after the one that lacked it: joined writes it
        c.update({"path": self.src.rel, "offset": offset, "lines": n, "digest": prefix_digest(f, offset),
                  "cursor": cursor, "cursor_commit": w.cid.get(cursor) if cursor is not None else None,
                  "paths": paths.state(w.cid), "time": w.last_time, "tips": w.branch_digest(),
                  "layout": w.layout})
        if self.src.version > 1:
            c.update({"version": self.src.version, "supersedes": self.src.supersedes})
        if adopted:
            c["adopted"] = {**as_dict(c.get("adopted")), **adopted}
        if side is not None and (side.threads or side.tasks):
            res.sidechains = side.finish()
            c["sidechains"] = side.state()
        c.update(self._side_files())
        if self.written is not None and res.lines:  # links known now: written with the rest
            if self.src.parent_id is None and (found := spawns_written(self.written)) is not None:
                c = found_agents(c, found)
            elif self.src.parent_id is not None and (link := self.links.get(file_agent(self.src.session_id))):
                info["spawned_by"] = spawned_by((self.session.app, self.src.project, self.src.parent_id), link,
                                                first_written(self.written))
        info[KEY] = c
        if titles:
            info["name"] = titles
        if self.session.exists() or res.lines:
            # a rival that recorded its position meanwhile stored these lines too: a lost race
            self.session.set_info(info, expect=self.info)
        res.total, res.offset = n, offset
        return res

    def _side_files(self) -> dict[str, Any]:
        if not self.src.side_files:
            return {}
        rels = sorted(self.src.side_files)
        datas = []
        for rel in rels:
            with open(self.src.side_files[rel], "rb") as fh:
                datas.append(fh.read())
        ids = put_blobs(self.store, datas)
        old = dict((self.info.get(KEY) or {}).get("files") or {})
        old.update(dict(zip(rels, ids, strict=True)))  # a side file deleted upstream stays
        return {"files": old}

    def _side_files_changed(self) -> bool:
        """Whether a side file differs from the blob the session's info names for it, or that
        blob is missing from the store (a gc before 45085c4 deleted side files: importing the
        folder again restores them)."""
        if not self.src.side_files:
            return False
        old = (self.info.get(KEY) or {}).get("files") or {}
        for rel, full in self.src.side_files.items():
            with open(full, "rb") as fh:
                oid = blob_id(stored_bytes(self.store, fh.read()), self.store.objects.codec)
            if old.get(rel) != oid or not self.store.objects.contains(oid):
                return True
        return False

    def _changed(self, f: IO[bytes], why: str) -> FileResult:
        """Continue the newest version of the file's session (``<session>.vN``) when there is
        one after this, else import the file again as the next version: a rewritten file
        gives one new version, once, and later imports continue it."""
        base = self.src.session_id.removesuffix(f".v{self.src.version}") if self.src.version > 1 \
            else self.src.session_id
        k = self.src.version + 1
        while self.store.session(self.session.app, self.src.project, f"{base}.v{k}").exists():
            k += 1
        if k - 1 > self.src.version:
            prev = base if k - 2 < 2 else f"{base}.v{k - 2}"
            src = dataclasses.replace(self.src, session_id=f"{base}.v{k - 1}", version=k - 1, supersedes=prev)
            return _Importer(self.store, src, self.session.app).run(f)
        src = dataclasses.replace(self.src, session_id=f"{base}.v{k}", version=k, supersedes=self.session.id)
        out = _Importer(self.store, src, self.session.app).run(f)
        out.notes.insert(0, f"{why}: archived lines kept, the file imported again as a new session")
        return out


# -- import ----------------------------------------------------------------------------------
def import_claude(store: Store, path: str | os.PathLike[str], *, app: str = APP, jobs: int | None = 1
                  ) -> list[FileResult]:
    """Import (or bring up to date) Claude Code sessions: a file, a project folder, or a tree.

    Each file is read from where the previous import stopped: only new lines are read and
    written, a torn last line is left for next time, a file deleted upstream stays in the
    archive, and a file whose imported part changed is imported again as a new session
    (``<session>.v2``, ...), once, leaving the archived one as it was; later imports continue
    the newest version. An import stopped part-way (Ctrl-C, kill -9) is finished by the next.

    Args:
        store: the store.
        path: a ``.jsonl`` session file, a project folder, or ``~/.claude/projects``.
        app: the app name of the sessions.
        jobs: worker processes to spread the files over, a session and its subagents in one
            (None: as many as pay, :func:`~castore.adapters.import_jobs.default_jobs`); the
            results are the same (:mod:`castore.adapters.import_jobs`).

    Returns:
        One :class:`FileResult` per file, main sessions before their subagents.

    Raises:
        ArchiveError: no session file at ``path``; another agent's sessions there (nothing
            is written); a file or folder name that is not a valid castore name (nothing of
            that file is written).
        ImportJobError: ``jobs`` below 1, a worker that died.
        StorageError, OSError.
    """
    from .import_jobs import import_files

    refuse_other(path, "claude")
    sources = find_sessions(path)
    store.init()
    return import_files(store, "claude", sources, [f"{s.project}/{s.parent_id or s.session_id}" for s in sources],
                        jobs=jobs, app=app)


def import_sources(store: Store, sources: list[_Source], *, app: str = APP,
                   out: list[FileResult] | None = None) -> list[FileResult]:
    """Import the session files :func:`find_sessions` found (or some of them, each main file
    with its subagents' files after it) as :func:`import_claude` does, in one write batch;
    ``out`` gets each file's result as it is done.

    Raises:
        as :func:`import_claude`.
    """
    results: list[FileResult] = [] if out is None else out
    links: dict[str, dict[str, Any]] = {}
    # main session -> its agents' sessions, named in its info once its subagent files are in
    named: dict[tuple[str, str, str], dict[str, str]] = {}

    def one(src: _Source | None) -> int:
        nonlocal links
        if src is None or src.parent_id is None:  # the end, or a new main file: the last one's are in
            for key, agents in named.items():
                name_agents(store.session(*key), agents)
            named.clear()
        if src is None:
            return 0
        try:
            imp = _Importer(store, src, app, links if src.parent_id is not None else None)
        except CastoreError as e:
            raise ArchiveError(src.path, f"cannot name a session after it: {e}") from e
        with open(src.path, "rb") as f:
            r = imp.run(f)
        results.append(r)
        if src.parent_id is None:
            links = agent_links(imp)
            link_sidechains(imp, links)
        else:
            link_subagent(imp, links, named)
        return r.offset

    import_batched(store, [*sources, None], one)  # the last main's agents named inside the batch
    return results


def follow_claude(store: Store, path: str | os.PathLike[str], *, app: str = APP, interval: float = 1.0,
                  stop: Any = None, on_result: Any = None, on_round: Any = None) -> int:
    """Keep importing ``path`` as the agent writes, until ``stop()`` is true or interrupted.

    Args:
        store, path, app: as :func:`import_claude`.
        interval: seconds between polls.
        stop: a callable polled between rounds (e.g. ``threading.Event().is_set``).
        on_result: called with each :class:`FileResult` that imported lines.
        on_round: called after each round that imported lines, with those results.

    Returns:
        The number of lines imported.

    Raises:
        as :func:`import_claude`.
    """
    from .follow import follow

    return follow(lambda: import_claude(store, path, app=app), interval=interval, stop=stop,
                  on_result=on_result, on_round=on_round)


# -- castore's own commits as lines -----------------------------------------------------------
#: the key of a line written for a castore commit (its id): the import takes the line as it
MARK = "castoreCommit"
#: what a written line copies from the last archived turn of its file
_ENVELOPE = ("isSidechain", "userType", "cwd", "sessionId", "version", "gitBranch", "agentId")


def _uuid_of(cid: str) -> str:
    return f"{cid[0:8]}-{cid[8:12]}-{cid[12:16]}-{cid[16:20]}-{cid[20:32]}"


def _input_of(args: Any) -> Any:
    if isinstance(args, str):
        v = parse_line(args)
        return {"arguments": args} if v is NOT_JSON else v
    return args if args is not None else {}


def _blocks(msg: Message) -> list[Any]:
    """A castore message's content as Anthropic blocks (OpenAI-shaped blocks and tool calls mapped)."""
    content = msg.content
    out: list[Any] = []
    for b in [content] if isinstance(content, str) else content if isinstance(content, list) else []:
        if isinstance(b, str):
            out.append({"type": "text", "text": b})
        elif not isinstance(b, dict):
            continue
        elif b.get("type") in ("input_text", "output_text"):
            out.append({"type": "text", "text": b.get("text", "")})
        elif b.get("type") == "function_call":
            out.append({"type": "tool_use", "id": b.get("call_id"), "name": b.get("name"),
                        "input": _input_of(b.get("arguments"))})
        elif b.get("type") == "reasoning":
            out.append({"type": "thinking", "thinking": b.get("text", "")})
        else:
            out.append(b)
    for tc in msg.tool_calls or ():
        fn = tc["function"] if isinstance(tc.get("function"), dict) else tc
        out.append({"type": "tool_use", "id": tc.get("id"), "name": fn.get("name"),
                    "input": _input_of(fn.get("arguments"))})
    return out


def _result_text(content: Any) -> Any:
    if isinstance(content, (str, list)):
        return content
    return "" if content is None else json.dumps(content, ensure_ascii=False, default=str)


def written_line(le: LogEntry, uuid: str, parent: str | None, envelope: dict[str, Any]) -> bytes:
    """The Claude Code line for castore commit ``le``: a ``user``/``assistant`` line for a
    user, assistant or tool message (a tool result is a user line's ``tool_result``), a
    compaction's summary as a ``user`` line with ``isCompactSummary``, a ``system`` line
    (``subtype: castore``, the entry's fields as its ``content``) for anything else;
    ``parentUuid`` chains it to its parent, :data:`MARK` names the commit."""
    e = le.entry
    msg = e if isinstance(e, Message) else e.message if isinstance(e, Event) else None
    d: dict[str, Any] = {"parentUuid": parent, **envelope}
    if msg is not None and msg.role in ("user", "assistant", "tool"):
        if msg.role == "tool":
            d["type"] = "user"
            d["message"] = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": msg.tool_call_id,
                                                         "content": _result_text(msg.content)}]}
        elif msg.role == "assistant":
            d["type"] = "assistant"
            model = le.meta.get("model")
            d["message"] = {"id": f"msg_castore_{le.id[:24]}", "type": "message", "role": "assistant",
                            "model": model if isinstance(model, str) else "castore", "content": _blocks(msg),
                            "stop_reason": None}
        else:
            d["type"] = "user"
            d["message"] = {"role": "user", "content": msg.content if isinstance(msg.content, str) else _blocks(msg)}
    elif le.kind == "compaction":  # as Claude Code writes the summary after a compaction
        d.update({"type": "user", "isCompactSummary": True, "message": {"role": "user", "content": entry_text(le)}})
    else:
        d.update({"type": "system", "subtype": "castore", "content": entry_text(le), "level": "info"})
    d.update({"uuid": uuid, "timestamp": iso_time(le.time), MARK: le.id})
    return json.dumps(d, ensure_ascii=False, separators=(",", ":"), default=str).encode() + b"\n"


def _written_lines(s: Session, rows: list[tuple[int, str, str]], log: list[LogEntry]) -> list[bytes]:
    """Lines for the commits castore made on top of archived session ``s``, after its file's bytes."""
    rest = appended(log, KEY, rows)
    if not rest:
        return []
    by_id: dict[str, LogEntry] = {le.id: le for le in log}
    uuid_of: dict[str, str] = {}
    for le in log:
        m = le.meta.get(KEY)
        if isinstance(m, dict) and isinstance(m.get("uuid"), str):
            uuid_of[le.id] = m["uuid"]
    for v in as_dict(as_dict(s.info.get(KEY)).get("adopted")).values():
        if isinstance(v, list) and len(v) > 2 and isinstance(v[0], str) and isinstance(v[2], str):
            uuid_of[v[0]] = v[2]
    envelope: dict[str, Any] = {"isSidechain": False, "userType": "external", "sessionId": s.id}
    turns = [r for r in rows if r[2] in by_id and as_dict(by_id[r[2]].meta.get(KEY)).get("type") in _TURNS]
    if turns:
        last = json.loads(read_blobs(s.store, [turns[-1][1]])[turns[-1][1]])
        envelope.update({k: last[k] for k in _ENVELOPE if isinstance(last, dict) and k in last})
    out = []
    for le in rest:
        p = le.parents[0] if le.parents else None
        while p is not None and p not in uuid_of:  # lines without a uuid are no link of the chain
            p = by_id[p].parents[0] if p in by_id and by_id[p].parents else None
        uuid_of[le.id] = _uuid_of(le.id)
        out.append(written_line(le, uuid_of[le.id], uuid_of[p] if p is not None else None, envelope))
    return out


# -- export ----------------------------------------------------------------------------------
def archived_sessions(store: Store, app: str = APP) -> Iterator[Session]:
    """The sessions of ``app`` that hold an archived Claude Code file."""
    return jsonl_tree.archived_sessions(store, app, KEY)


def export_claude(store: Store, dest: str | os.PathLike[str], *, app: str = APP,
                  sessions: list[Session] | None = None) -> list[str]:
    """Write archived Claude Code sessions back under ``dest`` as Claude Code lays them out.

    Every file comes back byte for byte (``dest/<project>/<session>.jsonl``, its subagent
    files and side files; the old layout's sidechain lines, kept in sessions of their own,
    go back to their places in the main file). Entries castore appended to an archived
    session (on any of its branches) follow the file's bytes as lines Claude Code reads
    (:func:`written_line`); importing the file again takes them as those commits. Of several versions of one file (a
    rewritten file), the newest is written. Naming a sidechain's session writes its main file.

    Args:
        store: the store.
        dest: the folder to write into (``~/.claude/projects`` to restore).
        app: the app name of the sessions.
        sessions: only these sessions (default: every archived one of ``app``).

    Returns:
        The files written, relative to ``dest``.

    Raises:
        FilesKept: files under ``dest`` hold what the archive's copy lacks: they are left as they were,
            the others written (:mod:`castore.adapters.export_files`).
        ArchiveError: a session's recorded path would leave ``dest``, or its archived lines are on
            no branch (:func:`~castore.adapters.jsonl_tree.check_reachable`; nothing is written).
        ObjectNotFound, IntegrityError, StorageError, OSError.
    """
    root = os.fspath(dest)
    chosen: dict[str, tuple[int, Session, dict[str, Any]]] = {}
    for s in sessions if sessions is not None else list(archived_sessions(store, app)):
        c = s.info.get(KEY)
        if isinstance(c, dict) and isinstance(c.get("sidechain_of"), str):  # lives in its main file
            s = store.session(s.app, s.user, c["sidechain_of"])
            c = s.info.get(KEY)
        if not isinstance(c, dict) or not isinstance(c.get("path"), str):
            raise ArchiveError("/".join(s.key), "not an archived Claude Code session")
        v = int(c.get("version", 1))
        if c["path"] not in chosen or chosen[c["path"]][0] < v:
            chosen[c["path"]] = (v, s, c)
    def sides_of(s: Session, c: dict[str, Any]) -> list[Session]:
        return [store.session(s.app, s.user, sid) for sid in as_dict(as_dict(c.get("sidechains")).get("threads"))]

    for _, s, c in chosen.values():  # before any file is written
        check_reachable(s, KEY, also=sides_of(s, c))
    from .export_files import ExportWriter

    writer = ExportWriter(root)
    for rel, (_, s, c) in sorted(chosen.items()):
        sides = sides_of(s, c)
        log = s.log(all_branches=True)
        rows = archived_rows(s, KEY, log=log)
        lines = joined(export_lines(s, KEY, also=sides, rows=rows), _written_lines(s, rows, log),
                       end=c.get(NEWLINE) is True)
        writer.write(rel, lines)
        files = c.get("files") or {}
        if files:
            data = read_blobs(s.store, list(files.values()))  # the session tenant's blobs
            for frel, oid in sorted(files.items()):
                writer.write(frel, [data[oid]])
    return writer.done()


__all__ = [
    "MARK",
    "ArchiveError",
    "FileResult",
    "archived_sessions",
    "export_claude",
    "find_sessions",
    "follow_claude",
    "import_claude",
    "injected",
    "written_line",
]
