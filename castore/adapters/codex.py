"""Import and export Codex CLI rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``).

Each rollout file becomes a castore session ``codex/<user>/<thread id>`` (the id of its
``session_meta`` line; the file name when it has none). Lines are kept byte for byte and
imported incrementally as in :mod:`castore.adapters.jsonl_tree`.

The tree: a rollout is a list of records with no parent links, so each line follows the
one before it, except

* a rollback (``event_msg`` ``thread_rolled_back{num_turns: N}``) hangs after the line
  before the N-th last user turn, marked ``fork: rollback``: the path through it to the
  newest line is ``main`` (HEAD, where the agent goes on), and the dropped turns keep a
  branch ``rollback-<n>`` (n: the first dropped line), see
  :func:`~castore.adapters.tree_writer.branch_layout`;
* a fork (``session_meta.forked_from_id`` naming a thread already in the archive) starts
  as a castore fork of its parent at the last record it copied: the copied records are
  matched by content (type and payload; their timestamps differ) and stored as references
  to the parent's lines plus their new timestamps, so the copy costs next to nothing. The
  fork's own records follow;
* a subagent thread (``source.subagent.thread_spawn.parent_thread_id``) names its parent
  thread in ``info["spawned_by"]``, with its first line with a message (``first``) and,
  when the parent was archived first, the parent's call that spawned it (``commit``); the
  parent's ``spawn_agent`` call and its output (``{"agent_id": THREAD}``) name the thread in
  ``info["codex"]["agents"]``, so ``log`` and ``show`` link the two both ways.

The first prompt a person typed (a user message that is not Codex's scaffolding) names the
session (``info["name"]``, its first line, see :func:`castore.views.session_title`).

Compactions (``compacted``) get a label ``compact-<n>``. Bodies: messages, reasoning
summaries (never ``encrypted_content``), function and custom tool calls and their outputs
become messages that ``grep``, ``log`` and the HTML view read; ``event_msg`` copies of the
same content and everything else have no body (their bytes are kept all the same).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from ..entries import INJECTED, Event, Message
from ..errors import CastoreError, InvalidEntry
from ..usage import CODEX_USAGE, CodexWalk, codex_record
from ..views import TITLE_KEY, prompt_title
from .detect import refuse_other
from .jsonl_tree import (
    LAYOUT,
    NEWLINE,
    NOT_JSON,
    ArchiveError,
    FileResult,
    LineChanged,
    appended_on_head,
    archived_rows,
    as_dict,
    blob_id,
    check_reachable,
    counts_redactions,
    encode_blob,
    entry_text,
    export_lines,
    files_under,
    import_batched,
    iso_time,
    joined,
    layout_of,
    line_event,
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
    tips_digest,
)
from .tree_writer import TreeWriter

if TYPE_CHECKING:
    from ..entries import LogEntry
    from ..session import Session
    from ..store import Store

APP = "codex"
KEY = "codex"
_DATE_DIRS = re.compile(r"^\d{4}$|^\d{2}$")
#: the folders of Codex's own folder (``~/.codex``) that hold rollouts; beside them are files
#: that are none (``history.jsonl``, the prompts typed, ``log/``)
ROLLOUT_FOLDERS = ("sessions", "archived_sessions")
#: how the user messages Codex writes itself start, and what they are
_SCAFFOLD = {"<environment_context>": "environment_context", "# AGENTS.md": "agents_md",
             "<user_instructions>": "user_instructions", "<permissions": "permissions",
             "<INSTRUCTIONS>": "instructions",
             "<user_shell_command>": "user_shell_command", "<turn_aborted>": "turn_aborted",
             "<subagent_notification>": "subagent_notification"}


@dataclass
class _Source:
    path: str
    rel: str


def find_rollouts(path: str | os.PathLike[str]) -> list[_Source]:
    """The rollout files under ``path`` (a file, or a folder searched recursively; of Codex's
    own folder, ``~/.codex``, its :data:`ROLLOUT_FOLDERS` only), with the path each is
    exported to (:func:`_rel`).

    Raises:
        ArchiveError: nothing there, or no ``.jsonl`` file.
    """
    p = os.path.abspath(os.fspath(path))
    if os.path.isfile(p):
        return [_Source(p, _rel(p, os.path.dirname(p)))]
    if not os.path.isdir(p):
        raise ArchiveError(p, "no such file or folder")
    roots = [p]
    if os.path.isdir(os.path.join(p, "sessions")):  # ~/.codex: its history.jsonl is no rollout
        roots = [os.path.join(p, d) for d in ROLLOUT_FOLDERS if os.path.isdir(os.path.join(p, d))]
    out = [_Source(full, _rel(full, p)) for root in roots for full in files_under(root, ".jsonl")]
    if not out:
        raise ArchiveError(p, "no Codex rollout file (*.jsonl) here")
    return out


def _rel(full: str, root: str) -> str:
    """Where rollout ``full``, found under ``root``, is exported to: ``YYYY/MM/DD/<name>`` when
    it lives in such folders, as Codex keeps them, whatever folder was imported (``~/.codex``,
    ``~/.codex/sessions``, one year of it, the file itself), so that importing it again from
    another folder finds its session; else its path under ``root``. Raises nothing."""
    parts = full.split(os.sep)
    if len(parts) > 4 and all(_DATE_DIRS.match(d) for d in parts[-4:-1]):
        return "/".join(parts[-4:])
    return os.path.relpath(full, root).replace(os.sep, "/")


# -- records -------------------------------------------------------------------------------------
def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


def _title(d: dict[str, Any]) -> str | None:
    """A typed prompt's first line (the session's title), or None for any other record."""
    if not _is_turn(d):
        return None
    return prompt_title(_text_of(as_dict(d.get("payload")).get("content")))


def _scaffold(text: str) -> str | None:
    t = text.lstrip()
    return next((why for start, why in _SCAFFOLD.items() if t.startswith(start)), None)


def _is_turn(d: dict[str, Any]) -> bool:
    p = d.get("payload")
    if d.get("type") != "response_item" or not isinstance(p, dict):
        return False
    if p.get("type") != "message" or p.get("role") != "user":
        return False
    return _scaffold(_text_of(p.get("content"))) is None


def injected(d: dict[str, Any], subagent: bool = False) -> str | None:
    """What a record that has a body is when Codex wrote it rather than a human typing it
    or the model answering (None: typed, or answered).

    A user message that starts as Codex's scaffolding does (``environment_context``,
    ``agents_md``, ``user_instructions``, ``permissions``, ...), a ``developer`` or
    ``system`` message (``developer``, ``system``), a compaction summary (``compacted``),
    a turn's settings (``turn_context``, no text), or, in a subagent thread (``subagent``),
    a user message: the parent agent wrote it.
    """
    p = as_dict(d.get("payload"))
    if d.get("type") in ("compacted", "turn_context"):
        return str(d["type"])
    if d.get("type") != "response_item" or p.get("type") != "message":
        return None
    role = p.get("role")
    if role in ("developer", "system"):
        return str(role)
    if role != "user":
        return None
    why = _scaffold(_text_of(p.get("content")))
    return why if why is not None else ("subagent" if subagent else None)


def _message(d: dict[str, Any]) -> Message | None:
    """What castore understands of a record: a message, or None."""
    p = d.get("payload")
    if not isinstance(p, dict):
        return None
    t, pt = d.get("type"), p.get("type")
    try:
        if t == "compacted" and isinstance(p.get("message"), str):
            return Message("system", [{"type": "text", "text": p["message"]}])
        if t != "response_item":
            return None
        if pt == "message" and isinstance(p.get("role"), str):
            content = p.get("content")
            if isinstance(content, list):
                content = [{k: v for k, v in b.items() if k != "image_url"} if isinstance(b, dict) else b
                           for b in content]
            return Message(p["role"] or "user", content)
        if pt == "reasoning":
            parts = [str(s.get("text")) for k in ("summary", "content") if isinstance(p.get(k), list)
                     for s in p[k] if isinstance(s, dict) and isinstance(s.get("text"), str)]
            return Message("assistant", [{"type": "reasoning", "text": "\n".join(parts)}]) if parts else None
        if pt in ("function_call", "custom_tool_call", "local_shell_call"):
            name = p.get("name") or ("local_shell" if pt == "local_shell_call" else None)
            args = p.get("arguments", p.get("input", p.get("action")))
            return Message("assistant", [{"type": "function_call", "name": name, "arguments": args,
                                          "call_id": p.get("call_id")}])
        if pt in ("function_call_output", "custom_tool_call_output"):
            out = p.get("output")
            if isinstance(out, dict):
                out = out.get("content", out)
            return Message("tool", [{"type": "function_call_output", "call_id": p.get("call_id"), "output": out}])
    except InvalidEntry:
        return None
    return None


def _item(raw: bytes) -> Any:
    d = parse_line(raw)
    return (d.get("type"), d.get("payload")) if isinstance(d, dict) else None


def _retime(raw: bytes, old: Any, new: Any) -> bytes | None:
    if not isinstance(old, str) or not isinstance(new, str):
        return None
    a = b'"timestamp":"' + old.encode() + b'"'
    return raw.replace(a, b'"timestamp":"' + new.encode() + b'"', 1) if a in raw else None


@dataclass
class _State:
    offset: int = 0
    lines: int = 0
    digest: str | None = None
    cursor: int | None = None
    # [start line, line before it, its commit, the usage walk at the line before it (None: unknown)]
    turns: list[list[Any]] = field(default_factory=list)
    #: the usage walk at ``cursor`` (:func:`castore.usage.codex_record`); None: unknown (a session
    #: imported before the importer kept usage: its lines are read by the usage reader instead)
    walk: CodexWalk | None = (None, None)


def _walk(v: Any) -> CodexWalk | None:
    """A usage walk as kept in the session's info (``[model, total]``), or None."""
    if isinstance(v, (list, tuple)) and len(v) == 2 and (v[0] is None or isinstance(v[0], str)) \
            and (v[1] is None or isinstance(v[1], dict)):
        return v[0], v[1]
    return None


def _spawn(p: dict[str, Any], n: int, spawns: dict[str, int | str],
           agents: dict[str, tuple[int | str, int]]) -> None:
    """Note a ``response_item`` payload ``p`` (line ``n``) that spawns a subagent: a
    ``spawn_agent`` function call (Codex's collab tool), or its output, ``{"agent_id": THREAD}``
    (codex-rs ``tools/handlers/collab.rs``), naming the thread the subagent runs in."""
    call = p.get("call_id")
    if not isinstance(call, str):
        return
    if p.get("type") == "function_call" and p.get("name") == "spawn_agent":
        spawns[call] = n
    elif p.get("type") == "function_call_output" and call in spawns:
        out = p.get("output")
        out = out.get("content") if isinstance(out, dict) else out
        try:
            got = json.loads(out) if isinstance(out, str) else None
        except ValueError:
            return
        if isinstance(got, dict) and isinstance(got.get("agent_id"), str) and got["agent_id"]:
            agents[got["agent_id"]] = (spawns.pop(call), n)


class _Importer:
    def __init__(self, store: Store, src: _Source, app: str, user: str) -> None:
        # the tenant's store, in the tenant layout (docs/tenants.md)
        self.store, self.src, self.app, self.user = store.tenant(app, user), src, app, user

    @counts_redactions
    def run(self, f: IO[bytes]) -> FileResult:
        first = f.readline()
        meta_d = parse_line(first) if first else None
        meta = meta_d.get("payload") if isinstance(meta_d, dict) and meta_d.get("type") == "session_meta" else None
        meta = meta if isinstance(meta, dict) else {}
        stem = os.path.basename(self.src.path)[: -len(".jsonl")]
        sid = str(meta["id"]) if isinstance(meta.get("id"), str) and meta["id"] else stem
        try:
            session = self.store.session(self.app, self.user, sid)
        except CastoreError as e:
            raise ArchiveError(self.src.path, f"cannot name a session after it: {e}") from e
        info = session.info  # ({} for a new session)
        c = as_dict(info.get(KEY))
        if c and c.get("path") != self.src.rel:  # another file with the same thread id
            session = self.store.session(self.app, self.user, f"{sid}.{stem}")
            info = session.info  # ({} for a new session)
            c = as_dict(info.get(KEY))
        res = FileResult(self.src.path, session.key)
        size = os.fstat(f.fileno()).st_size
        st = _State(int(c.get("offset", 0)), int(c.get("lines", 0)), c.get("digest"), c.get("cursor"),
                    [list(t) for t in c.get("turns", [])], _walk(c.get("walk")) if c else (None, None))
        if st.offset and (size < st.offset or prefix_digest(f, st.offset) != st.digest):
            res.notes.append(f"the first {st.offset} bytes changed since the last import: skipped, the archived "
                             "lines are kept (move the file aside, or import it into another store, to keep both)")
            res.total, res.offset = st.lines, st.offset
            return res
        if st.offset and size == st.offset:  # nothing new: done, unless the session's branches moved
            settled, head = settled_head(session, c.get("tips"))
            if settled:
                res.total, res.offset, res.head = st.lines, st.offset, head
                return res
        known: dict[int, str] = {}
        if st.cursor is not None and isinstance(c.get("cursor_commit"), str):
            known[st.cursor] = c["cursor_commit"]
        for t in st.turns:
            if t[1] is not None and isinstance(t[2], str):
                known[t[1]] = t[2]
        prefix: list[dict[str, Any]] = []
        fork: dict[str, Any] | None = None
        if isinstance(meta.get("forked_from_id"), str) and not c.get("path"):
            # a fork: started now, or by an import that stopped before recording where it stood
            fork = self._fork(session, f, meta["forked_from_id"], known, st, prefix)
            if fork is not None:
                info = session.info
                c = as_dict(info.get(KEY))
        src_ = meta.get("source")
        subagent = isinstance(src_, dict) and isinstance(src_.get("subagent"), dict)
        layout = layout_of(c) if session.exists() else LAYOUT
        w = TreeWriter(session, known, "/".join(session.key), last_time=c.get("time"), meta_key=KEY,
                       tips=c.get("tips"), layout=layout)
        n, cursor, offset = st.lines, st.cursor, st.offset
        adopted: dict[str, list[str]] = {}
        owned: list[set[str]] = []
        title: object = info.get(TITLE_KEY)  # a session keeps its first name
        # subagents: a spawn_agent call (call_id -> its line, or the commit a past import made of
        # it) and the thread its output names (agent id -> the lines of the call and the output)
        spawns: dict[str, int | str] = {k: v for k, v in as_dict(c.get("spawns")).items() if isinstance(v, str)}
        agents: dict[str, tuple[int | str, int]] = {}
        first_said: int | None = None  # a subagent's first line with a message (where it links back)

        def own() -> set[str]:
            if not owned:
                owned.append(own_commits(session))
            return owned[0]

        try:
            for end, raw in read_lines(f, st.offset, self.store.plumbing.redactor):
                d, vouched = parse_vouched(raw)
                if d is NOT_JSON:
                    res.notes.append(f"line {n + 1}: not JSON, kept as is")
                d = d if isinstance(d, dict) else {}
                p = as_dict(d.get("payload"))
                parent = cursor
                mark = d.get(MARK)
                if isinstance(mark, str) and mark in own():  # castore's own commit, as export wrote it
                    w.flush()
                    put_blobs(self.store, [raw])
                    adopted[str(n)] = [mark, blob_id(raw, self.store.objects.codec)]
                    if _is_turn(d):
                        st.turns.append([n, parent, None, st.walk])
                    if st.walk is not None:
                        st.walk = codex_record(d, st.walk)[1]
                    w.cid[n] = mark
                    cursor, n, offset = n, n + 1, end
                    continue
                rolled: str | None = None
                if d.get("type") == "event_msg" and p.get("type") == "thread_rolled_back":
                    k = p.get("num_turns")
                    if isinstance(k, int) and not isinstance(k, bool) and 0 < k <= len(st.turns) \
                            and st.turns[-k][1] is not None:
                        parent, rolled = st.turns[-k][1], "rollback"
                        st.walk = _walk(st.turns[-k][3]) if len(st.turns[-k]) > 3 else None
                        del st.turns[-k:]
                if _is_turn(d):
                    st.turns.append([n, parent, None, st.walk])
                msg = _message(d)
                blob = encode_blob(raw, self.store.objects.codec)
                m: dict[str, Any] = {KEY: {"o": n, "raw": blob[0], "f": session.id,
                                           **({"type": d["type"]} if isinstance(d.get("type"), str) else {}),
                                           **({"fork": rolled} if rolled else {})}}
                if st.walk is not None:  # the usage it records, read on its path (no raw read for `usage`)
                    rec, st.walk = codex_record(d, st.walk)
                    if rec is not None:
                        m[KEY][CODEX_USAGE] = rec
                when = parse_time(d.get("timestamp"))
                if when is not None:
                    m["time"] = when
                why = injected(d, subagent)
                if title is None and why is None:
                    title = _title(d)
                if why is not None:
                    m[INJECTED] = why
                author = msg.role if msg else (p.get("type") or d.get("type") or "line")
                if d.get("type") == "response_item":
                    _spawn(p, n, spawns, agents)
                if first_said is None and msg is not None and not c:
                    first_said = n
                # (the message and the metadata hold the line's values, nested no deeper than in it)
                w.add(n, parent, raw, line_event(str(author), msg, m, vouched), True, blob)
                if d.get("type") == "compacted":
                    w.label(n, f"compact-{n}")
                cursor, n, offset = n, n + 1, end
        except LineChanged as e:
            res.notes.append(f"{e.reason}: skipped, the archived lines are kept (move the file aside, or import "
                             "it into another store, to keep both)")
            res.total, res.offset = st.lines, st.offset
            return res
        # the file may have grown while it was read: what is left is counted now
        res.torn = max(0, os.fstat(f.fileno()).st_size - offset)
        res.lines = n - st.lines
        w.flush()
        res.branches = w.created
        res.total, res.offset = n, offset
        if res.lines == 0 and fork is None and not w.resuming:
            res.head = session.head if session.exists() else None
            if res.head is not None:
                res.offset = record_newline(session, KEY, info, f, offset)
            return res
        res.head = w.finish()
        for t in st.turns:
            if t[1] is not None:
                t[2] = w.cid.get(t[1], t[2])
        new = dict(info)
        cc = dict(new.get(KEY) or {})
        cc.pop(NEWLINE, None)  # lines came after the one that lacked it: joined writes it
        cc.update({"path": self.src.rel, "offset": offset, "lines": n, "digest": prefix_digest(f, offset),
                   "cursor": cursor, "cursor_commit": w.cid.get(cursor) if cursor is not None else None,
                   "turns": st.turns[-256:], "time": w.last_time, "tips": w.branch_digest(), "layout": layout,
                   "walk": list(st.walk) if st.walk is not None else None})
        if adopted:
            cc["adopted"] = {**as_dict(cc.get("adopted")), **adopted}
        if prefix:
            cc["prefix"] = prefix
        new[KEY] = cc
        def commit_of(at: int | str) -> str | None:
            return at if isinstance(at, str) else w.cid.get(at)

        pending = {k: cid for k, v in spawns.items() if (cid := commit_of(v)) is not None}
        if pending or "spawns" in cc:
            cc["spawns"] = dict(list(pending.items())[-256:])
        if agents:  # read by the transcript view's links: "subagent: <thread>" on the call and its output
            cc["agents"] = {**as_dict(cc.get("agents")),
                            **{a: {"session": a, "call": commit_of(call), "commit": commit_of(out)}
                               for a, (call, out) in agents.items()}}
        if title is not None:
            new.setdefault(TITLE_KEY, title)
        spawn = src_.get("subagent") if isinstance(src_, dict) else None
        spawn = spawn.get("thread_spawn") if isinstance(spawn, dict) else None
        if isinstance(spawn, dict) and isinstance(spawn.get("parent_thread_id"), str):
            by = dict(as_dict(new.get("spawned_by")))
            by.update(app=self.app, user=self.user, session=spawn["parent_thread_id"])
            if first_said is not None and w.cid.get(first_said):
                by["first"] = w.cid[first_said]
            if "commit" not in by:  # the parent's call, when the parent was archived first
                parent_agents = self._parent_agents(spawn["parent_thread_id"])
                got = as_dict(parent_agents.get(sid)).get("call")
                if isinstance(got, str):
                    by["commit"] = got
            new["spawned_by"] = by
        if session.exists() or w.cid:  # (set_info makes HEAD when an import stopped before it)
            # a rival that recorded its position meanwhile stored these lines too: a lost race
            session.set_info(new, expect=info)
        return res

    def _parent_agents(self, parent_id: str) -> dict[str, Any]:
        """The subagents the parent thread's archived session names (``{}``: none, or no such
        session)."""
        try:
            parent = self.store.session(self.app, self.user, parent_id)
            return as_dict(as_dict(parent.info.get(KEY)).get("agents"))
        except CastoreError:
            return {}

    def _fork(self, session: Session, f: IO[bytes], parent_id: str, known: dict[int, str], st: _State,
              prefix: list[dict[str, Any]]) -> dict[str, Any] | None:
        """Start ``session`` as a fork of its parent thread at the last record it copied (or
        take up the fork an import that stopped before recording it started), and record where
        the file's own lines start."""
        parent = self.store.session(self.app, self.user, parent_id)
        if not parent.exists():
            return None
        rows = archived_rows(parent, KEY, parent.id)
        branches = session.branches()
        started = None
        if branches:  # started by an import that stopped: its fork point (None: it was no fork)
            if session.exists():
                started = as_dict(session.info.get("forked_from")).get("commit")
            else:  # no HEAD yet: the newest commit of main the parent holds (a write batch may
                # have landed main further on before it stopped)
                theirs = {r[2] for r in rows}
                started = next((le.id for le in reversed(session.entries("main")) if le.id in theirs), None) \
                    if "main" in branches else None
            upto = next((i for i, r in enumerate(rows) if r[2] == started), None)
            if upto is None:
                return None
            rows = rows[:upto + 1]  # the parent may have grown since: match no further than the fork
        raws = read_blobs(self.store, [r for _, r, _ in rows])
        f.seek(0)
        mine: list[bytes] = []
        pos = 0
        j = 0
        matched: list[tuple[int, bytes, int]] = []  # (F line, F raw, parent row)
        for end, raw in read_lines(f, 0, self.store.plumbing.redactor):
            if not mine:
                mine.append(raw)
                pos = end
                continue
            it = _item(raw)
            while j < len(rows) and it != _item(raws[rows[j][1]]) and \
                    (_item(raws[rows[j][1]]) or ("",))[0] == "session_meta":
                j += 1
            if it is None or j >= len(rows) or it != _item(raws[rows[j][1]]):
                break
            matched.append((len(mine), raw, j))
            mine.append(raw)
            pos = end
            j += 1
        if not matched:
            return None
        at = rows[matched[-1][2]][2]
        if started is None:
            parent.fork(session.id, at=at, user=self.user)
        prefix.append({"raw": put_blobs(self.store, [mine[0]])[0]})
        known[0] = rows[matched[0][2] - 1][2] if matched[0][2] > 0 else at
        first = parse_line(mine[0])
        walk: CodexWalk = codex_record(first, (None, None))[1] if isinstance(first, dict) else (None, None)
        for fn, raw, pj in matched:
            prow = rows[pj]
            d = json.loads(raw)
            if _is_turn(d):
                st.turns.append([fn, fn - 1, known.get(fn - 1), walk])
            walk = codex_record(d, walk)[1] if isinstance(d, dict) else walk
            ts_f = d.get("timestamp")
            ts_p = json.loads(raws[prow[1]]).get("timestamp")
            if _retime(raws[prow[1]], ts_p, ts_f) == raw:
                prefix.append({"from": prow[0], "ts": ts_f})
            else:
                prefix.append({"raw": put_blobs(self.store, [raw])[0]})
            known[fn] = prow[2]
        st.offset, st.lines, st.cursor, st.walk = pos, len(mine), len(mine) - 1, walk
        info = session.info
        info.setdefault("forked_from", {"app": parent.app, "user": parent.user, "session": parent.id, "commit": at})
        session.set_info({**info, KEY: {"path": self.src.rel, "prefix": prefix, "offset": pos, "lines": len(mine),
                                        "digest": prefix_digest(f, pos), "cursor": st.cursor,
                                        "cursor_commit": known.get(st.cursor), "turns": st.turns[-256:],
                                        "tips": tips_digest(session.branches()), "layout": LAYOUT,
                                        "walk": list(walk)}})
        return {"parent": parent.id, "at": at}


def import_codex(store: Store, path: str | os.PathLike[str], *, app: str = APP, user: str = "local",
                 jobs: int | None = 1) -> list[FileResult]:
    """Import (or bring up to date) Codex rollouts: a file, or a folder such as ``~/.codex/sessions``.

    Forks are imported after their parents (when both are given), so that they share the
    parent's history. Re-importing reads only new lines; a torn last line waits; a file
    deleted upstream stays in the archive.

    Args:
        store: the store.
        path: a rollout file or a folder of them.
        app, user: the app and user of the sessions.
        jobs: worker processes to spread the files over, a rollout and its forks in one
            (None: as many as pay, :func:`~castore.adapters.import_jobs.default_jobs`); the
            results are the same (:mod:`castore.adapters.import_jobs`).

    Returns:
        One :class:`FileResult` per file.

    Raises:
        ArchiveError: no rollout at ``path``, another agent's sessions there (nothing is
            written), a thread id that is not a valid name. (A file
            whose imported part changed is skipped with a note in its result.)
        ImportJobError: ``jobs`` below 1, a worker that died.
        StorageError, OSError.
    """
    from .import_jobs import import_files

    refuse_other(path, "codex")
    sources = find_rollouts(path)
    store.init()
    metas: dict[str, tuple[str | None, str | None]] = {}
    for s in sources:
        with open(s.path, "rb") as f:
            first = f.readline()
        d = parse_line(first)
        p = d.get("payload") if isinstance(d, dict) else None
        metas[s.path] = (p.get("id"), p.get("forked_from_id")) if isinstance(p, dict) else (None, None)
    ids = {v[0]: k for k, v in metas.items() if v[0]}
    done: set[str] = set()
    ordered: list[_Source] = []

    def visit(s: _Source, depth: int = 0) -> None:
        if s.path in done:
            return
        done.add(s.path)
        parent = metas[s.path][1]
        if parent in ids and depth < 1000:
            visit(next(x for x in sources if x.path == ids[parent]), depth + 1)
        ordered.append(s)

    for s in sources:
        visit(s)
    # a rollout's import reads its thread and the thread it forked from: one worker for both
    threads = [tuple(t for t in metas[s.path] if isinstance(t, str)) or s.path for s in ordered]
    return import_files(store, "codex", ordered, threads, jobs=jobs, app=app, user=user)


def import_sources(store: Store, sources: list[_Source], *, app: str = APP, user: str = "local",
                   out: list[FileResult] | None = None) -> list[FileResult]:
    """Import rollouts (parents before their forks) as :func:`import_codex` does, in one
    write batch; ``out`` gets each file's result as it is done.

    Raises:
        as :func:`import_codex`.
    """
    results: list[FileResult] = [] if out is None else out

    def one(s: _Source) -> int:
        with open(s.path, "rb") as f:
            results.append(_Importer(store, s, app, user).run(f))
        return results[-1].offset

    import_batched(store, sources, one)
    return results


def export_codex(store: Store, dest: str | os.PathLike[str], *, app: str = APP,
                 sessions: list[Session] | None = None) -> list[str]:
    """Write archived Codex rollouts back under ``dest`` (``~/.codex/sessions`` layout), byte for byte.

    Entries castore appended to an archived thread on the path to its HEAD follow the file's
    bytes as rollout records (:func:`written_lines`); importing the file again takes them as
    those commits. Entries on other branches are not written (a rollout is one line of turns).

    Returns:
        The files written, relative to ``dest``.

    Raises:
        FilesKept: files under ``dest`` hold what the archive's copy lacks: left as they were, the
            others written (:mod:`castore.adapters.export_files`).
        ArchiveError: a session is not an archived rollout, or its path would leave ``dest``, or
            its archived lines are on no branch (nothing is written then).
        ObjectNotFound, IntegrityError, StorageError, OSError.
    """
    root = os.fspath(dest)
    if sessions is None:
        sessions = [store.session(si.app, si.user, si.session) for si in store.sessions(app)] \
            if app in store.apps() else []
        sessions = [s for s in sessions if isinstance(s.info.get(KEY), dict)]
    for s in sessions:  # before any file is written
        check_reachable(s, KEY)
    from .export_files import ExportWriter

    writer = ExportWriter(root)
    for s in sessions:
        c = s.info.get(KEY)
        if not isinstance(c, dict) or not isinstance(c.get("path"), str):
            raise ArchiveError("/".join(s.key), "not an archived Codex rollout")
        rows = archived_rows(s, KEY, s.id)
        writer.write(c["path"], joined(_prefix_lines(s, c.get("prefix") or []), export_lines(s, KEY, s.id, rows=rows),
                                       _written_lines(s, rows), end=c.get(NEWLINE) is True))
    return writer.done()


#: the key of a record written for a castore commit (its id): the import takes the record as it
MARK = "castore_commit"


def _texts_of(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return [] if content is None else [json.dumps(content, ensure_ascii=False, default=str)]
    return [b if isinstance(b, str) else str(b.get("text")) for b in content
            if isinstance(b, str) or (isinstance(b, dict) and b.get("type") in ("text", "input_text", "output_text")
                                      and isinstance(b.get("text"), str))]


def _args(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v if v is not None else {}, ensure_ascii=False, default=str)


def written_lines(le: LogEntry) -> list[bytes]:
    """The rollout records for castore commit ``le`` (:data:`MARK` names it on each): a
    message's reasoning, text and tool calls as ``response_item`` records (``reasoning``,
    ``message``, ``function_call``), a tool result as ``function_call_output``, a compaction
    as ``compacted``, anything else as an ``event_msg`` of type ``castore_entry``."""
    e = le.entry
    msg = e if isinstance(e, Message) else e.message if isinstance(e, Event) else None
    items: list[tuple[str, dict[str, Any]]] = []
    if msg is not None and msg.role == "tool":
        items.append(("response_item", {"type": "function_call_output", "call_id": msg.tool_call_id,
                                        "output": "\n".join(_texts_of(msg.content))}))
    elif msg is not None:
        reasoning: list[str] = []
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for b in msg.content if isinstance(msg.content, list) else ():
            if not isinstance(b, dict):
                continue
            t = b.get("type")
            said = b.get("text", b.get("thinking"))
            if t in ("reasoning", "thinking") and isinstance(said, str):
                reasoning.append(said)
            elif t in ("function_call", "tool_use"):
                calls.append({"type": "function_call", "name": b.get("name"),
                              "arguments": _args(b.get("arguments", b.get("input"))),
                              "call_id": b.get("call_id", b.get("id"))})
            elif t in ("function_call_output", "tool_result"):
                results.append({"type": "function_call_output", "call_id": b.get("call_id", b.get("tool_use_id")),
                                "output": "\n".join(_texts_of(b.get("output", b.get("content"))))})
        for tc in msg.tool_calls or ():
            fn = tc["function"] if isinstance(tc.get("function"), dict) else tc
            calls.append({"type": "function_call", "name": fn.get("name"), "arguments": _args(fn.get("arguments")),
                          "call_id": tc.get("id")})
        if reasoning:
            items.append(("response_item", {"type": "reasoning", "summary": [{"type": "summary_text", "text": r}
                                                                              for r in reasoning],
                                            "content": None, "encrypted_content": None}))
        texts = _texts_of(msg.content)
        if texts or not (reasoning or calls or results):
            kind = "output_text" if msg.role == "assistant" else "input_text"
            items.append(("response_item", {"type": "message", "role": msg.role,
                                            "content": [{"type": kind, "text": t} for t in texts]}))
        items += [("response_item", c) for c in calls + results]
    elif isinstance(getattr(e, "summary", None), str) and le.kind == "compaction":
        items.append(("compacted", {"message": e.summary}))  # type: ignore[union-attr]
    else:
        items.append(("event_msg", {"type": "castore_entry", "kind": le.kind, "text": entry_text(le)}))
    ts = iso_time(le.time)
    return [json.dumps({"timestamp": ts, "type": t, "payload": p, MARK: le.id}, ensure_ascii=False,
                       separators=(",", ":"), default=str).encode() + b"\n" for t, p in items]


def _written_lines(s: Session, rows: list[tuple[int, str, str]]) -> list[bytes]:
    """Records for the commits castore made on top of archived thread ``s`` (on HEAD's path)."""
    return [line for le in appended_on_head(s, KEY, rows) for line in written_lines(le)]


def _prefix_lines(s: Session, prefix: list[dict[str, Any]]) -> list[bytes]:
    if not prefix:
        return []
    ff = s.info.get("forked_from") or {}
    parent = s.store.session(ff.get("app", s.app), ff.get("user", s.user), ff.get("session", ""))
    rows = {o: r for o, r, _ in archived_rows(parent, KEY, parent.id)}
    want = [rows[p["from"]] for p in prefix if "from" in p] + [p["raw"] for p in prefix if "raw" in p]
    data = read_blobs(s.store, want)
    out = []
    for p in prefix:
        if "raw" in p:
            out.append(data[p["raw"]])
        else:
            praw = data[rows[p["from"]]]
            d = json.loads(praw)
            got = _retime(praw, d.get("timestamp"), p["ts"])
            if got is None:
                raise ArchiveError("/".join(s.key), f"cannot rebuild copied line from parent line {p['from']}")
            out.append(got)
    return out


__all__ = ["MARK", "export_codex", "find_rollouts", "import_codex", "injected", "written_lines"]
