"""Import and export Gemini CLI sessions (``~/.gemini/tmp/<project>/chats/``).

Gemini CLI records a session as an append-only JSONL file (``chats/session-<time>-<id8>.jsonl``;
google-gemini/gemini-cli ``packages/core/src/services/chatRecordingService.ts``):

- the first line is the session's metadata (``sessionId``, ``projectHash``, ``startTime``,
  ``lastUpdated``, ``kind``: ``main`` or ``subagent``, ``directories``);
- a message record (``id``, ``timestamp``, ``type``: ``user``, ``gemini``, ``info``, ``error``,
  ``warning``; ``content``, the parts sent to the model; a ``gemini`` message also ``thoughts``,
  ``tokens``, ``model``, ``toolCalls`` with their results) is appended when it is recorded, and
  appended again, whole, each time it changes (its tokens, its tool calls' results arrive):
  the later copy replaces the earlier;
- ``{"$set": {...}}`` updates the metadata (``lastUpdated``, ``summary``, ...); with
  ``messages`` it is a checkpoint: the conversation is that list from then on;
- ``{"$rewindTo": id}`` drops message ``id`` and everything after it (``/rewind``).

A subagent writes a file of its own, ``chats/<parent session id>/<session id>.jsonl``. Older
versions wrote the whole conversation as one pretty-printed JSON document,
``chats/session-<time>-<id8>.json``, rewritten at every change (``ConversationRecord``).

Each JSONL file becomes a session ``gemini/<project>/<sessionId>`` (a subagent's
``<parent>.<sessionId>``, naming its parent in ``info["spawned_by"]``), every line one commit,
kept byte for byte and imported incrementally by :mod:`castore.adapters.jsonl_tree`.

The path to HEAD holds the conversation gemini-cli itself loads from the file (its replay,
``loadConversationRecord``), so that ``context`` is what the agent would go on with:

- each line follows the one before it; a message's body is its thoughts (as thinking), its
  parts, its tool calls, then their results (:func:`_blocks`);
- the last message written again holds what it adds to the copy before it (its calls' results,
  as a ``tool`` message; calls added to a text), or nothing (its tokens: bookkeeping,
  ``update``); gemini-cli's writer only ever updates the last message so;
- a message written again that says something else, or an earlier one written again after
  later ones (a message recorded again under its id): gemini-cli's replay sets it in its place
  (its messages are a JS ``Map``: a known id keeps its first place), so the line hangs as a
  checkpoint does, the whole message after the one before it, and the messages after it follow
  as copies (no line of the file, ``from: "update"``); the conversation it replaced keeps a
  branch ``checkpoint-<n>``;
- a ``$rewindTo`` hangs after the message before the one it names; the dropped turns keep a
  branch ``rewind-<n>``;
- a checkpoint (``$set`` of ``messages``) hangs after the last message the path and its list
  share from their start, and each message of the list after that follows it as a commit of
  its own (no line of the file: metadata without ``raw``, ``from: "$set"``); the conversation
  it replaced keeps a branch ``checkpoint-<n>``;
- ``main`` is the path the agent goes on with (HEAD)
  (:func:`~castore.adapters.tree_writer.branch_layout`).

The metadata and other ``$set`` lines have no body (bookkeeping in ``log``). The session's
``summary`` is its title.

An older whole-file JSON becomes a session ``<sessionId>.json``: one commit per message, in
order, and the file's bytes kept as they were; a later version of the file that extends the
messages adds the new ones, one that changes them is imported as ``.v2`` (``.v3``, ...).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from ..entries import INJECTED, Event, Message
from ..errors import CastoreError, InvalidEntry
from ..usage import GEMINI_USAGE, gemini_record
from . import jsonl_tree
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
    export_lines,
    files_under,
    import_batched,
    iso_time,
    joined,
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
)
from .tree_writer import TreeWriter

if TYPE_CHECKING:
    from ..entries import LogEntry
    from ..session import Session
    from ..store import Store

APP = "gemini"
KEY = "gemini"
#: the key of a record written for a castore commit (its id): the import takes the record as it
MARK = "castoreCommit"
#: an older whole-file JSON is kept in blobs of at most this many bytes
CHUNK = 4 << 20
_ROLES = {"user": "user", "gemini": "assistant"}


# -- finding files ---------------------------------------------------------------------------
@dataclass
class _Source:
    path: str
    project: str
    rel: str  # <project>/chats/... : where export writes it
    parent: str | None = None  # a subagent's parent session id (its folder's name)


def find_sessions(path: str | os.PathLike[str]) -> list[_Source]:
    """The session files at ``path``: a file, a ``chats`` folder, a project folder holding one,
    ``~/.gemini/tmp`` (one folder per project), or ``~/.gemini`` (its ``tmp``).

    Raises:
        ArchiveError: nothing there, or no session file.
    """
    p = os.path.abspath(os.fspath(path))
    if not os.path.exists(p):
        raise ArchiveError(p, "no such file or folder")
    if os.path.isfile(p):
        chats = os.path.dirname(p)
        if os.path.basename(chats) != "chats" and os.path.basename(os.path.dirname(chats)) == "chats":
            chats = os.path.dirname(chats)  # a subagent's file
        return [_source(p, chats)]
    if os.path.basename(p) == "chats":
        roots = [p]
    elif os.path.isdir(os.path.join(p, "chats")):
        roots = [os.path.join(p, "chats")]
    else:
        roots = [os.path.join(p, d, "chats") for d in sorted(os.listdir(p))
                 if os.path.isdir(os.path.join(p, d, "chats")) and not os.path.islink(os.path.join(p, d))]
        tmp = os.path.join(p, "tmp")
        if not roots and os.path.isdir(tmp) and not os.path.islink(tmp):
            return find_sessions(tmp)
    out = []
    for chats in roots:
        out += [_source(full, chats) for full in files_under(chats, (".jsonl", ".json"))
                if os.path.relpath(full, chats).count(os.sep) <= 1]  # not deeper than chats/<parent>/
    if not out:
        raise ArchiveError(p, "no Gemini CLI session file (chats/*.jsonl, *.json) here")
    out.sort(key=lambda s: (s.parent is not None, s.rel))  # parents before their subagents
    return out


def _source(full: str, chats: str) -> _Source:
    project = os.path.basename(os.path.dirname(chats)) or "project"
    inner = os.path.relpath(full, chats).replace(os.sep, "/")
    parent = inner.split("/")[0] if "/" in inner else None
    return _Source(full, project, f"{project}/chats/{inner}", parent)


# -- records -----------------------------------------------------------------------------------
def _parts(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out = []
    for p in content if isinstance(content, list) else [content] if isinstance(content, dict) else []:
        if isinstance(p, str):
            out.append({"type": "text", "text": p})
        elif isinstance(p, dict) and isinstance(p.get("text"), str):
            out.append({"type": "thinking" if p.get("thought") is True else "text", "text": p["text"]})
        elif isinstance(p, dict) and isinstance(p.get("functionCall"), dict):
            fc = p["functionCall"]
            out.append({"type": "tool_use", "id": fc.get("id"), "name": fc.get("name"), "input": fc.get("args")})
        elif isinstance(p, dict) and isinstance(p.get("functionResponse"), dict):
            fr = p["functionResponse"]
            out.append({"type": "tool_result", "tool_use_id": fr.get("id"), "content": _response_text(fr)})
        elif isinstance(p, dict) and isinstance(p.get("inlineData"), dict):
            out.append({"type": "image", "mimeType": p["inlineData"].get("mimeType")})
    return out


def _response_text(fr: dict[str, Any]) -> str:
    r = fr.get("response")
    if isinstance(r, dict) and isinstance(r.get("output"), str):
        return str(r["output"])
    if isinstance(r, dict) and isinstance(r.get("error"), str):
        return str(r["error"])
    return json.dumps(r, ensure_ascii=False, default=str) if r is not None else ""


def _blocks(d: dict[str, Any]) -> list[Any] | None:
    """What castore understands of a message record, as message blocks: its thoughts, its parts,
    its tool calls, then their results (in the order gemini-cli sends them to the model: the
    model's turn, then a turn of the calls' responses); None for a record that is no message."""
    if not isinstance(d.get("id"), str) or not isinstance(d.get("type"), str):
        return None
    blocks: list[Any] = []
    for th in d.get("thoughts") or [] if isinstance(d.get("thoughts"), list) else []:
        if isinstance(th, dict):
            said = ": ".join(str(th[k]) for k in ("subject", "description") if isinstance(th.get(k), str) and th[k])
            blocks.append({"type": "thinking", "thinking": said})
    blocks += _parts(d.get("content"))
    results = []
    for tc in d.get("toolCalls") or [] if isinstance(d.get("toolCalls"), list) else []:
        if not isinstance(tc, dict):
            continue
        blocks.append({"type": "tool_use", "id": tc.get("id"), "name": tc.get("name"), "input": tc.get("args")})
        if tc.get("result") is not None:
            res = [b for b in _parts(tc["result"]) if b.get("type") == "tool_result"] or _parts(tc["result"])
            text = "\n".join(str(b.get("content", b.get("text", ""))) for b in res)
            results.append({"type": "tool_result", "tool_use_id": tc.get("id"), "content": text,
                            "is_error": tc.get("status") == "error"})
    return blocks + results


def _message(d: dict[str, Any], blocks: list[Any] | None = None) -> Message | None:
    """The castore message of a message record (or of ``blocks``, part of it: what a copy of
    it written again adds, its role ``tool`` when that is only tool results)."""
    if blocks is None:
        blocks = _blocks(d)
        if blocks is None:
            return None
    role = _ROLES.get(str(d.get("type")), "system")
    if role == "assistant" and blocks and all(b.get("type") == "tool_result" for b in blocks):
        role = "tool"
    try:
        return Message(role, blocks)
    except InvalidEntry:
        return None


def _said(blocks: list[Any]) -> str:
    """A digest of what message blocks say (to tell a copy written again that only adds)."""
    return hashlib.sha256(json.dumps(blocks, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()[:16]


def _grew(m: list[Any], blocks: list[Any]) -> bool:
    """Whether ``blocks`` are what conversation message ``m`` (``[id, key, count, digest]``) said,
    and maybe more after it (a copy written again that only adds: its calls, their results)."""
    return 0 <= m[2] <= len(blocks) and _said(blocks[:m[2]]) == m[3]


def _kind(d: dict[str, Any], n: int) -> str:
    if isinstance(d.get("$rewindTo"), str):
        return "$rewindTo"
    if isinstance(d.get("$set"), dict):
        return "$set"
    if isinstance(d.get("id"), str) and isinstance(d.get("type"), str):
        return str(d["type"])
    return "metadata" if n == 0 or "sessionId" in d else "line"


def _entry(n: int, raw_id: str, d: dict[str, Any], session_id: str, update: bool, msg: Message | None,
           fork: str | None = None, vouched: bool = False) -> Event:
    """The commit entry of line ``n`` (``d``: the line parsed, {} when it is not a JSON object;
    ``raw_id``: the id of the line's blob; ``msg``: what castore reads of it; ``vouched``: ``d``
    is, as :func:`~castore.adapters.jsonl_tree.parse_vouched` says, and so is the entry)."""
    kind = _kind(d, n)
    if update and msg is None:
        kind = "update"  # a message written again with nothing new to read (its tokens): bookkeeping
    meta: dict[str, Any] = {KEY: {"o": n, "raw": raw_id, "f": session_id, "type": kind,
                                  **({"id": d["id"]} if msg is not None else {}),
                                  **({"fork": fork} if fork else {}),
                                  **({"update": True} if update else {}),
                                  **({GEMINI_USAGE: gemini_record(d)} if d.get("type") == "gemini" else {})}}
    when = parse_time(d.get("timestamp"))
    if when is not None:
        meta["time"] = when
    if msg is not None and kind in ("info", "error", "warning"):
        meta[INJECTED] = kind
    return line_event(msg.role if msg else kind.lstrip("$"), msg, meta, vouched)


# -- import ----------------------------------------------------------------------------------
class _Importer:
    """Imports one JSONL file into one session, from where the last import stopped."""

    def __init__(self, store: Store, src: _Source, app: str, session_id: str) -> None:
        # the tenant's store, in the tenant layout (docs/tenants.md)
        self.store, self.src, self.app = store.tenant(app, src.project), src, app
        self.session = store.session(app, src.project, session_id)

    @counts_redactions
    def run(self, f: IO[bytes]) -> FileResult:
        s = self.session
        info = s.info  # ({} for a new session)
        c = as_dict(info.get(KEY))
        res = FileResult(self.src.path, s.key)
        size = os.fstat(f.fileno()).st_size
        offset0, lines0 = int(c.get("offset", 0)), int(c.get("lines", 0))
        if offset0 and (size < offset0 or prefix_digest(f, offset0) != c.get("digest")):
            return self._changed(f, f"the first {offset0} bytes changed since the last import (file rewritten?)")
        if offset0 and size == offset0:  # nothing new: done, unless the session's branches moved
            settled, head = settled_head(s, c.get("tips"))
            if settled:
                res.total, res.offset, res.head = lines0, offset0, head
                return res
        # the conversation as it stands (gemini-cli's, :func:`loaded`): [message id, the line (or
        # checkpoint copy, :func:`_copy_key`) its latest part is at, how many blocks its parts
        # hold, a digest of them]; a rewind hangs after one of them
        msgs: list[list[Any]] = [[*m, -1, ""] if len(m) == 2 else list(m) for m in c.get("msgs", [])
                                 if isinstance(m, list) and len(m) in (2, 4)]
        known: dict[int, str] = {}
        cursor = c.get("cursor") if isinstance(c.get("cursor"), int) else None
        for o_, cid in as_dict(c.get("commits")).items():
            if o_.lstrip("-").isdigit() and isinstance(cid, str):
                known[int(o_)] = cid
        if cursor is not None and isinstance(c.get("cursor_commit"), str):
            known[cursor] = c["cursor_commit"]
        w = TreeWriter(s, known, "/".join(s.key), last_time=c.get("time"), meta_key=KEY, tips=c.get("tips"),
                       layout=LAYOUT)
        n, offset = lines0, offset0
        adopted: dict[str, list[str]] = {}
        owned: list[set[str]] = []
        title: str | None = None
        agents: dict[str, int] = {}  # subagent id -> the line of the tool call that ran it
        records: dict[str, tuple[dict[str, Any], list[Any]]] = {}  # message id -> its latest record, blocks
        try:
            for end, raw in read_lines(f, offset0, self.store.plumbing.redactor):
                d, vouched = parse_vouched(raw)
                if d is NOT_JSON:
                    res.notes.append(f"line {n + 1}: not JSON, kept as is")
                d = d if isinstance(d, dict) else {}
                parent = cursor
                mark = d.get(MARK)
                if isinstance(mark, str):
                    if not owned:
                        owned.append(own_commits(s))
                    if mark in owned[0]:  # castore's own commit, as export wrote it
                        w.flush()
                        put_blobs(self.store, [raw])
                        adopted[str(n)] = [mark, blob_id(raw, self.store.objects.codec)]
                        w.cid[n] = mark
                        if isinstance(d.get("id"), str):
                            msgs.append([d["id"], n, -1, ""])
                        cursor, n, offset = n, n + 1, end
                        continue
                kind = _kind(d, n)
                update = False
                msg: Message | None = None
                copies: list[tuple[dict[str, Any], list[Any]]] = []  # a checkpoint's messages, after it
                if kind == "$rewindTo":
                    at = next((i for i, m in enumerate(msgs) if m[0] == d["$rewindTo"]), None)
                    parent = msgs[at - 1][1] if at else 0 if n else None
                    del msgs[at if at is not None else 0:]
                elif kind == "$set" and isinstance(d["$set"].get("messages"), list):
                    parent, copies, msgs = _checkpoint(msgs, d["$set"]["messages"], cursor)
                    records.update((m["id"], (m, b)) for m, b in copies)
                elif kind not in ("$set", "metadata", "line"):
                    blocks = _blocks(d) or []
                    at = next((i for i, m in enumerate(msgs) if m[0] == d["id"]), None)
                    same = msgs[at] if at is not None else None
                    update = same is not None
                    if same is None:
                        msgs.append([d["id"], n, len(blocks), _said(blocks)])
                        msg = _message(d, blocks)
                        records[d["id"]] = (d, blocks)
                    elif at is not None and same[3] != _said(blocks) and (
                            at < len(msgs) - 1 or not _grew(same, blocks)):
                        # an earlier message written again, or the last one saying something else:
                        # gemini-cli's replay sets it in its place (a JS Map), so the line hangs as
                        # a checkpoint would, whole, after the message before it, and the messages
                        # after it follow it again as copies
                        parent = msgs[at - 1][1] if at else 0
                        copies = [self._latest(m, records, w) for m in msgs[at + 1:]]
                        msgs[at] = [d["id"], n, len(blocks), _said(blocks)]
                        msg = _message(d, blocks)
                        records[d["id"]] = (d, blocks)
                    else:  # the last one written again: what it adds (its calls, their results), or
                        # nothing (its tokens: bookkeeping)
                        added = blocks[same[2]:] if _grew(same, blocks) else blocks
                        msg = _message(d, added) if added else None
                        if same is msgs[-1]:  # a rewind to a message after it hangs after this part
                            same[1] = n
                        same[2:] = [len(blocks), _said(blocks)]
                        records[d["id"]] = (d, blocks)
                for tc in d.get("toolCalls") or [] if isinstance(d.get("toolCalls"), list) else []:
                    if isinstance(tc, dict) and isinstance(tc.get("agentId"), str):
                        agents[tc["agentId"]] = n
                if kind == "$set" and isinstance(d["$set"].get("summary"), str) and d["$set"]["summary"].strip():
                    title = d["$set"]["summary"].strip()
                elif kind == "metadata" and isinstance(d.get("summary"), str) and d["summary"].strip():
                    title = d["summary"].strip()
                fork = "rewind" if kind == "$rewindTo" else "checkpoint" if copies or parent != cursor else None
                blob = encode_blob(raw, self.store.objects.codec)
                w.add(n, parent, raw, _entry(n, blob[0], d, s.id, update, msg, fork, vouched), True, blob)
                cursor = n
                for i, (m, blocks) in enumerate(copies):
                    key = msgs[len(msgs) - len(copies) + i][1] = _copy_key(n, i)
                    w.add(key, cursor, b"", _copy(n, m, blocks, s.id, "update" if update else "$set"), True)
                    cursor = key
                n, offset = n + 1, end
        except LineChanged as e:
            return self._changed(f, e.reason)
        res.torn = max(0, os.fstat(f.fileno()).st_size - offset)
        res.lines = n - lines0
        w.flush()
        res.branches = w.created
        res.total, res.offset = n, offset
        if res.lines == 0 and not w.resuming:
            res.head = s.head if s.exists() else None
            if res.head is not None:
                res.offset = record_newline(s, KEY, info, f, offset)
            return res
        res.head = w.finish()
        new = dict(s.info)  # ({} for a session not stored)
        cc = dict(as_dict(new.get(KEY)))
        cc.pop(NEWLINE, None)  # lines came after the one that lacked it: joined writes it
        msgs = msgs[-4096:]
        cc.update({"path": self.src.rel, "offset": offset, "lines": n, "digest": prefix_digest(f, offset),
                   "cursor": cursor, "cursor_commit": w.cid.get(cursor) if cursor is not None else None,
                   "msgs": msgs, "commits": {str(o_): w.cid[o_] for o_ in {0, *(m[1] for m in msgs)} if o_ in w.cid},
                   "time": w.last_time, "tips": w.branch_digest(), "layout": LAYOUT})
        if adopted:
            cc["adopted"] = {**as_dict(cc.get("adopted")), **adopted}
        if agents:
            cc["agents"] = {**as_dict(cc.get("agents")), **{a: w.cid[o_] for a, o_ in agents.items() if o_ in w.cid}}
        new[KEY] = cc
        if title:
            new["name"] = title
        if self.src.parent is not None:
            parent = self.store.session(self.app, self.src.project, self.src.parent)
            link = as_dict(as_dict(parent.info.get(KEY)).get("agents")).get(s.id.rsplit(".", 1)[-1]) \
                if parent.exists() else None
            new["spawned_by"] = {"app": self.app, "user": self.src.project, "session": self.src.parent,
                                 **({"commit": link} if isinstance(link, str) else {})}
        s.set_info(new, expect=info)  # a rival that recorded its position meanwhile stored these lines: a lost race
        return res

    def _latest(self, m: list[Any], records: dict[str, tuple[dict[str, Any], list[Any]]],
                w: TreeWriter) -> tuple[dict[str, Any], list[Any]]:
        """The latest record of conversation message ``m`` (``[id, key, ...]``) and its blocks:
        as this import read it, else from its latest part's commit (a delta is only ever added
        to the last message, so ``key`` is that part): the line it kept, or a checkpoint's copy."""
        if m[0] in records:
            return records[m[0]]
        le = self.session.show(w.cid[m[1]])
        c = as_dict(le.meta.get(KEY))
        if isinstance(c.get("raw"), str):
            d = parse_line(read_blobs(self.store, [c["raw"]])[c["raw"]])
            if isinstance(d, dict) and d.get("id") == m[0]:
                return d, _blocks(d) or []
        said = le.entry.message if isinstance(le.entry, Event) else le.entry if isinstance(le.entry, Message) \
            else None
        kind = c.get("type") if isinstance(c.get("type"), str) else \
            next((t for t, r in _ROLES.items() if said is not None and r == said.role), "info")
        d = {"id": m[0], "type": kind, **({"timestamp": iso_time(le.meta["time"])}
                                          if isinstance(le.meta.get("time"), float) else {})}
        return d, list(said.content) if said is not None and isinstance(said.content, list) else []

    def _changed(self, f: IO[bytes], why: str) -> FileResult:
        """Continue the newest version (``<session>.vN``) when its own prefix still matches,
        else import the file again as the next version: a rewritten file gives one new
        version, once, and later imports continue it."""
        base = self.session.id
        k = 2
        while self.store.session(self.app, self.src.project, f"{base}.v{k}").exists():
            k += 1
        if k > 2:
            newest = _Importer(self.store, self.src, self.app, f"{base}.v{k - 1}")
            c = as_dict(newest.session.info.get(KEY))
            off = int(c.get("offset", 0))
            if os.fstat(f.fileno()).st_size >= off and prefix_digest(f, off) == c.get("digest"):
                return newest.run(f)
        out = _Importer(self.store, self.src, self.app, f"{base}.v{k}").run(f)
        out.notes.insert(0, f"{why}: archived lines kept, the file imported again as a new session")
        return out


def _copy_key(n: int, i: int) -> int:
    """The key (in the writer's line -> commit map) of the ``i``-th message a checkpoint on line
    ``n`` sets that the path does not hold already: negative, no line's."""
    return -((n << 20) + i + 1)


def _checkpoint(msgs: list[list[Any]], records: list[Any], cursor: int | None
                ) -> tuple[int | None, list[tuple[dict[str, Any], list[Any]]], list[list[Any]]]:
    """Where a ``$set`` of ``messages`` (a checkpoint: the conversation is that list from then on)
    hangs, the messages to add after it, and the conversation after it.

    It hangs after the last message the conversation and the list share from their start (same
    id, same blocks), or after the line before it (``cursor``) when the list starts with the
    whole conversation; the list's other messages follow it, each a commit of its own."""
    new = [(m, _blocks(m) or []) for m in records if isinstance(m, dict) and isinstance(m.get("id"), str)]
    k = 0
    while k < min(len(msgs), len(new)) and msgs[k][0] == new[k][0]["id"] \
            and msgs[k][2:] == [len(new[k][1]), _said(new[k][1])]:
        k += 1
    parent = cursor if k == len(msgs) else msgs[k - 1][1] if k else 0
    out = msgs[:k] + [[m["id"], None, len(b), _said(b)] for m, b in new[k:]]
    return parent, new[k:], out


def _copy(n: int, d: dict[str, Any], blocks: list[Any], session_id: str, source: str = "$set") -> Event:
    """The commit of a message a checkpoint (line ``n``; ``source`` ``$set``) sets, or of one after
    a message written again in its place (``update``): no line of the file (no ``raw``: export
    writes line ``n``, not this), its place in the conversation."""
    msg = _message(d, blocks)
    meta: dict[str, Any] = {KEY: {"o": n, "f": session_id, "type": str(d.get("type")), "id": d["id"],
                                  "from": source}}
    when = parse_time(d.get("timestamp"))
    if when is not None:
        meta["time"] = when
    if msg is not None and d.get("type") in ("info", "error", "warning"):
        meta[INJECTED] = str(d["type"])
    return Event(author=msg.role if msg else "copy", message=msg, meta=meta)


def _session_id(first: Any, src: _Source) -> str:
    stem = os.path.basename(src.path).rsplit(".", 1)[0]
    sid = str(first["sessionId"]) if isinstance(first, dict) and isinstance(first.get("sessionId"), str) else stem
    return f"{src.parent}.{sid}" if src.parent is not None else sid


def import_gemini(store: Store, path: str | os.PathLike[str], *, app: str = APP, jobs: int | None = 1
                  ) -> list[FileResult]:
    """Import (or bring up to date) Gemini CLI sessions: a session file, a ``chats`` folder, a
    project folder, or ``~/.gemini/tmp``.

    Each file is read from where the previous import stopped; a torn last line waits (a file
    whose first line is still torn imports nothing: that line names the session); a file
    deleted upstream stays in the archive; a file whose imported part changed is imported again
    as ``<session>.v2`` (once; later imports continue it).

    ``jobs``: worker processes to spread the files over, a session and its subagents in one
    (None: as many as pay, :func:`~castore.adapters.import_jobs.default_jobs`); the results
    are the same (:mod:`castore.adapters.import_jobs`).

    Returns:
        One :class:`~castore.adapters.jsonl_tree.FileResult` per file, parents before subagents.

    Raises:
        ArchiveError: no session file at ``path``, another agent's sessions there, a name that
            is not a valid castore name.
        ImportJobError: ``jobs`` below 1, a worker that died.
        StorageError, OSError.
    """
    from .import_jobs import import_files

    refuse_other(path, "gemini")
    sources = find_sessions(path)
    store.init()
    return import_files(store, "gemini", sources, [_group(s) for s in sources], jobs=jobs, app=app)


def _group(src: _Source) -> str:
    """The session a file's import reads or writes besides its own: a subagent's parent (its
    folder's name), else the file's own session (named in its first line)."""
    if src.parent is None and not src.path.endswith(".json"):
        try:
            with open(src.path, "rb") as f:
                sid = _session_id(parse_line(f.readline()), src)
        except OSError:
            sid = src.path
    else:
        sid = src.parent or src.path
    return f"{os.path.dirname(src.rel) if src.parent is None else os.path.dirname(os.path.dirname(src.rel))}/{sid}"


def import_sources(store: Store, sources: list[_Source], *, app: str = APP,
                   out: list[FileResult] | None = None) -> list[FileResult]:
    """Import session files (parents before their subagents) as :func:`import_gemini` does,
    in one write batch; ``out`` gets each file's result as it is done.

    Raises:
        as :func:`import_gemini`.
    """
    results: list[FileResult] = [] if out is None else out

    def one(src: _Source) -> int:
        with open(src.path, "rb") as f:
            if src.path.endswith(".json"):
                results.append(_import_whole(store, src, f, app))
                return results[-1].offset
            head = f.readline()
            first = parse_line(head)
            try:
                imp = _Importer(store, src, app, _session_id(first, src))
            except CastoreError as e:
                raise ArchiveError(src.path, f"cannot name a session after it: {e}") from e
            if not head.endswith(b"\n") and first is NOT_JSON:
                # empty, or its first line still being written: the session's name is not known
                # yet, and lines written after this read must not go to a session named after
                # the file (the next import would archive them again under the right name)
                results.append(FileResult(src.path, imp.session.key, torn=len(head)))
                return 0
            results.append(imp.run(f))
        return results[-1].offset

    import_batched(store, sources, one)
    return results


# -- the older whole-file JSON ---------------------------------------------------------------
def _digest(v: Any) -> str:
    return hashlib.sha256(json.dumps(v, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()[:16]


@counts_redactions
def _import_whole(store: Store, src: _Source, f: IO[bytes], app: str, version: int = 1) -> FileResult:
    data = f.read()
    doc = parse_line(data)
    doc = doc if isinstance(doc, dict) else {}
    base = f"{doc['sessionId']}.json" if isinstance(doc.get("sessionId"), str) else \
        os.path.basename(src.path).replace(".", "-")
    if src.parent is not None:
        base = f"{src.parent}.{base}"
    try:
        s = store.session(app, src.project, base if version == 1 else f"{base}.v{version}")
    except CastoreError as e:
        raise ArchiveError(src.path, f"cannot name a session after it: {e}") from e
    res = FileResult(src.path, s.key, offset=len(data))
    c = as_dict(s.info.get(KEY)) if s.exists() else {}
    msgs = [m for m in doc.get("messages") or [] if isinstance(m, dict)] if isinstance(doc.get("messages"), list) \
        else []
    digests = [_digest(m) for m in msgs]
    have = [x for x in c.get("messages", []) if isinstance(x, str)]
    if c and c.get("file_digest") == hashlib.sha256(data).hexdigest():
        res.total, res.head = len(have), s.head
        return res
    if digests[:len(have)] != have:  # messages changed, not only added: a new version
        f.seek(0)
        out = _import_whole(store, src, f, app, version + 1)
        if not out.notes:
            out.notes.append("the messages changed since the last import: the file imported again as a new session")
        return out
    new = msgs[len(have):]
    raws = [json.dumps(m, ensure_ascii=False, separators=(",", ":")).encode() for m in new]
    ids = put_blobs(store, raws)  # (redacted when the store redacts: name the blobs as stored)
    entries = []
    for i, (m, rid) in enumerate(zip(new, ids, strict=True)):
        msg = _message(m)
        meta: dict[str, Any] = {KEY: {"o": len(have) + i, "raw": rid, "f": s.id,
                                      "type": str(m.get("type")), "id": m.get("id"),
                                      **({GEMINI_USAGE: gemini_record(m)} if m.get("type") == "gemini" else {})}}
        when = parse_time(m.get("timestamp"))
        if when is not None:
            meta["time"] = when
        entries.append(Event(author=msg.role if msg else "line", message=msg, meta=meta))
    if entries:
        s.append_many(entries, branch="main" if s.exists() else None,
                      times=[e.meta.get("time", 0.0) for e in entries])
    chunks = [data[i:i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
    info = dict(s.info) if s.exists() else {}
    info[KEY] = {"path": src.rel, "whole": put_blobs(store, chunks), "messages": digests,
                 "file_digest": hashlib.sha256(data).hexdigest()}
    if isinstance(doc.get("summary"), str) and doc["summary"].strip():
        info["name"] = doc["summary"].strip()
    if s.exists() or entries:
        s.set_info(info)
    res.lines, res.total, res.head = len(entries), len(msgs), s.head if s.exists() else None
    return res


# -- export ----------------------------------------------------------------------------------
def written_line(le: LogEntry) -> bytes:
    """The message record for castore commit ``le`` (:data:`MARK` names it): a ``user`` or
    ``gemini`` message whose content is its text parts (tool calls as ``functionCall`` parts),
    anything else an ``info`` message holding the entry's text."""
    e = le.entry
    msg = e if isinstance(e, Message) else e.message if isinstance(e, Event) else None
    parts: list[Any] = []
    kind = "info"
    if msg is not None:
        kind = "gemini" if msg.role == "assistant" else "user" if msg.role in ("user", "tool") else "info"
        content = msg.content if isinstance(msg.content, list) else [msg.content]
        for b in content:
            if isinstance(b, str):
                parts.append({"text": b})
            elif isinstance(b, dict) and isinstance(b.get("text"), str):
                parts.append({"text": b["text"]})
        for tc in msg.tool_calls or ():
            fn = tc["function"] if isinstance(tc.get("function"), dict) else tc
            args = fn.get("arguments")
            parts.append({"functionCall": {"id": tc.get("id"), "name": fn.get("name"),
                                           "args": parse_line(args) if isinstance(args, str) else args}})
    else:
        from .jsonl_tree import entry_text

        parts.append({"text": entry_text(le)})
    cid = le.id
    rec = {"id": f"{cid[0:8]}-{cid[8:12]}-{cid[12:16]}-{cid[16:20]}-{cid[20:32]}", "timestamp": iso_time(le.time),
           "type": kind, "content": parts, MARK: cid}
    return json.dumps(rec, ensure_ascii=False, separators=(",", ":"), default=str).encode() + b"\n"


def archived_sessions(store: Store, app: str = APP) -> Iterator[Session]:
    """The sessions of ``app`` that hold an archived Gemini CLI file."""
    return jsonl_tree.archived_sessions(store, app, KEY)


def export_gemini(store: Store, dest: str | os.PathLike[str], *, app: str = APP,
                  sessions: list[Session] | None = None) -> list[str]:
    """Write archived Gemini CLI sessions back under ``dest`` (the ``~/.gemini/tmp`` layout:
    ``<project>/chats/...``), byte for byte.

    Entries castore appended on HEAD's path follow a JSONL file's bytes as message records
    (:func:`written_line`); importing the file again takes them as those commits. An older
    whole-file JSON is written as it was imported, without them (:func:`not_exported`). Of
    several versions of one file, the newest is written.

    Returns:
        The files written, relative to ``dest``.

    Raises:
        FilesKept: files under ``dest`` hold what the archive's copy lacks: left as they were, the
            others written (:mod:`castore.adapters.export_files`).
        ArchiveError: a session is not an archived Gemini CLI file, or its path would leave
            ``dest``, or its archived lines are on no branch (nothing is written then).
        ObjectNotFound, IntegrityError, StorageError, OSError.
    """
    from ..porcelain import file_version  # (here: an import of sessions loads no porcelain)

    root = os.fspath(dest)
    chosen: dict[str, tuple[int, Session, dict[str, Any]]] = {}
    for s in sessions if sessions is not None else list(archived_sessions(store, app)):
        c = s.info.get(KEY)
        if not isinstance(c, dict) or not isinstance(c.get("path"), str):
            raise ArchiveError("/".join(s.key), "not an archived Gemini CLI session")
        v = file_version(s.id)[1]
        if c["path"] not in chosen or chosen[c["path"]][0] < v:
            chosen[c["path"]] = (v, s, c)
    for _, s, c in chosen.values():  # before any file is written (a whole JSON file needs no ref)
        if not isinstance(c.get("whole"), list):
            check_reachable(s, KEY)
    from .export_files import ExportWriter

    writer = ExportWriter(root)
    for rel, (_, s, c) in sorted(chosen.items()):
        if isinstance(c.get("whole"), list):
            data = read_blobs(store, c["whole"])
            writer.write(rel, [data[oid] for oid in c["whole"]])
        else:
            rows = archived_rows(s, KEY, s.id)
            writer.write(rel, joined(export_lines(s, KEY, s.id, rows=rows),
                                     map(written_line, appended_on_head(s, KEY, rows)), end=c.get(NEWLINE) is True))
    return writer.done()


def not_exported(session: Session) -> int:
    """How many entries castore appended on HEAD's path :func:`export_gemini` does not write:
    those of an older whole-file JSON session, whose file is written back as it was imported
    (0 for a JSONL session, whose export writes them as message records).

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
    """
    c = session.info.get(KEY)
    if not isinstance(c, dict) or not isinstance(c.get("whole"), list):
        return 0
    return len(appended_on_head(session, KEY, archived_rows(session, KEY, session.id)))


__all__ = ["MARK", "archived_sessions", "export_gemini", "find_sessions", "import_gemini", "not_exported",
           "written_line"]
