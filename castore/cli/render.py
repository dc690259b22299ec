"""Text and JSON rendering of sessions, entries, commits, objects, and the ``log --graph`` drawing.

Pure functions from library values to strings or JSON-ready dicts; nothing here touches a
store. Colour is applied with :func:`click.style` and stripped by :func:`click.echo` when
the output is not a terminal.
"""

from __future__ import annotations

import heapq
import json
import time as _time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import click

from .. import objects as o
from .. import views
from ..deletion import finish_line
from ..entries import (
    BranchSummary,
    Compaction,
    Custom,
    Event,
    Message,
    ModelChange,
    content_text,
    entry_fields,
)
from ..porcelain import RefNames
from ..session import LogEntry
from ..store import SessionInfo
from .common import format_key
from .text import safe, safe_block

Style = Callable[..., str]


def plain(text: str, **_: Any) -> str:
    """A style that adds no colour (for JSON output)."""
    return text


# -- small pieces --------------------------------------------------------------------------
def short(oid: str | None) -> str:
    """The short form of an id (8 hex characters)."""
    return oid[:8] if oid else "-"


def fmt_time(t: float) -> str:
    """A timestamp as local ``YYYY-MM-DD HH:MM:SS``."""
    return _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(t)) if t else "-"


def fmt_value(v: Any) -> str:
    """A state value on one line, as JSON (terminal-safe: see :func:`safe`)."""
    return safe(json.dumps(o.to_builtins(v), ensure_ascii=False, sort_keys=True))


def one_line(text: str, width: int = 72) -> str:
    """Fold whitespace and cut to ``width`` characters."""
    s = " ".join(text.split())
    return s if len(s) <= width else s[: width - 1] + "…"


def _tool_call(call: Any) -> str:
    if not isinstance(call, Mapping):
        return str(call)
    function = call.get("function")
    fn = function if isinstance(function, Mapping) else call
    name = fn.get("name", "?")
    args = fn.get("arguments", fn.get("args", fn.get("input", "")))
    if not isinstance(args, str):
        args = json.dumps(o.to_builtins(args), ensure_ascii=False, sort_keys=True)
    return f"{name}({args})"


def message_text(m: Message) -> str:
    """A message's text, with its tool calls written as ``-> name(args)``."""
    parts = []
    if m.content is not None:
        parts.append(content_text(m.content))
    for call in m.tool_calls or []:
        parts.append("-> " + _tool_call(call))
    return "\n".join(p for p in parts if p)


def _message_label(m: Message) -> str:
    if m.role == "tool" and m.name:
        return f"tool {safe(m.name)}"
    return safe(m.role)


def delta_text(delta: Mapping[str, Any], unset: Sequence[str] = ()) -> str:
    """``{key=value, -gone}``, or empty when nothing changed."""
    items = [f"{safe(k)}={fmt_value(v)}" for k, v in delta.items()] + [f"-{safe(k)}" for k in unset]
    return "{" + ", ".join(items) + "}" if items else ""


def summary(e: LogEntry, width: int = 72, *, read: bool = True, stored: str | None = None) -> str:
    """One line saying what the entry is: ``role: text``, ``author: text {key=value}``, ...

    ``read``: as the view of its kind reads it (an imported tool call: ``assistant: → Bash(ls)``);
    False: castore's own reading (what ``--json`` has always written).
    ``stored``: what a view read from the store for an event with no message
    (:func:`castore.views.said`), said in place of ``(event)``.
    Terminal-safe (see :func:`safe`): whitespace is folded, other controls escaped.
    """
    entry = e.entry
    said = views.describe(e) if read else None
    if said is not None:
        text = safe(said)
    elif isinstance(entry, Message):
        text = f"{_message_label(entry)}: {safe_block(message_text(entry))}"
    elif isinstance(entry, Event):
        said = (safe_block(message_text(entry.message)) if entry.message is not None
                else safe_block(stored) if stored else "(event)")
        text = f"{safe(entry.author) or 'event'}: {said}"
    elif isinstance(entry, Compaction):
        text = f"compaction: {safe_block(entry.summary)}"
    elif isinstance(entry, BranchSummary):
        text = f"branch summary: {safe_block(entry.summary)}"
    elif isinstance(entry, ModelChange) and read and entry.model is None and entry.thinking_level:
        text = f"thinking level -> {safe(entry.thinking_level)}"
    elif isinstance(entry, ModelChange):
        text = f"model -> {safe(entry.model or '?')}" + (f" ({safe(entry.provider)})" if entry.provider else "")
    elif isinstance(entry, Custom) and e.kind == "custom":
        text = f"custom {safe(entry.type)}"
    elif isinstance(entry, Custom):  # a commit kind of an adapter's (a LangGraph checkpoint...)
        text = safe(views.describe(e) or (f"{e.kind} by {e.author}" if e.author else e.kind))
    else:
        text = safe(e.kind)
    changes = delta_text(e.delta, e.unset)
    out = one_line(text, width)
    return f"{out} {changes}" if changes else out


# -- refs decoration ---------------------------------------------------------------------
@dataclass
class Refs:
    """Which names point where in one session, for decorating commits."""

    head: str | None = None
    branch: str | None = None
    branches: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    links: dict[str, list[str]] = field(default_factory=dict)
    #: commit -> what a view read from the store for an entry that says nothing by itself
    #: (an imported line with no message, see :func:`castore.views.said`)
    said: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_names(cls, names: RefNames) -> Refs:
        """The names :func:`castore.porcelain.ref_names` found, for decorating."""
        return cls(head=names.head, branch=names.branch, branches=dict(names.branches), labels=dict(names.labels),
                   links=dict(names.links))

    def of(self, cid: str) -> dict[str, Any]:
        """``{"head": bool, "branches": [...], "labels": [...]}`` for one commit, and
        ``"links"`` when it links to other sessions (an imported subagent)."""
        out: dict[str, Any] = {
            "head": cid == self.head,
            "branches": [b for b, t in self.branches.items() if t == cid],
            "labels": [n for n, t in self.labels.items() if t == cid],
        }
        if self.links.get(cid):
            out["links"] = list(self.links[cid])
        return out

    def decoration(self, cid: str, style: Style = click.style) -> str:
        """git's ``(HEAD -> main, retry, tag: good)``, or empty."""
        r = self.of(cid)
        parts = []
        branches = list(r["branches"])
        if r["head"]:
            if self.branch is not None and self.branch in branches:
                branches.remove(self.branch)
                parts.append(style("HEAD -> ", fg="cyan", bold=True) + style(safe(self.branch), fg="green", bold=True))
            else:
                parts.append(style("HEAD", fg="cyan", bold=True))
        parts += [style(safe(b), fg="green", bold=True) for b in branches]
        parts += [style(f"tag: {safe(n)}", fg="yellow", bold=True) for n in r["labels"]]
        parts += [style(safe(x), fg="magenta") for x in r.get("links", ())]
        return "(" + ", ".join(parts) + ")" if parts else ""


# -- JSON documents --------------------------------------------------------------------------
def entry_json(e: LogEntry) -> dict[str, Any]:
    """The entry itself, by kind (a message is its dict form)."""
    return entry_fields(e.entry)


def commit_json(e: LogEntry, refs: Refs | None = None) -> dict[str, Any]:
    """One commit as a JSON object; see the ``log --json`` help for the fields."""
    doc: dict[str, Any] = {
        "id": e.id,
        "short": e.short,
        "kind": e.kind,
        "parents": list(e.parents),
        "depth": e.depth,
        "time": e.time,
        "author": e.author,
        "summary": summary(e, 200, read=False),
        "entry": entry_json(e),
        "delta": dict(e.delta),
        "unset": list(e.unset),
        "meta": dict(e.meta),
    }
    if refs is not None:
        doc["refs"] = refs.of(e.id)
    return o.to_builtins(doc)


def session_json(key: tuple[str, str, str]) -> dict[str, str]:
    """``{"key": "app/user/session", "app": ..., "user": ..., "session": ...}``."""
    app, user, sid = key
    return {"key": format_key(app, user, sid), "app": app, "user": user, "session": sid}


def session_info_json(s: SessionInfo) -> dict[str, Any]:
    """A listed session as a JSON object; see ``sessions --help``."""
    return {
        **session_json((s.app, s.user, s.session)),
        "head": s.head,
        "branch": s.branch,
        "entries": s.entries,
        "updated": s.updated,
        "title": views.session_title(s.info),
        "subagent_of": views.spawned_by(s.info),
        "info": o.to_builtins(dict(s.info)),
        "problem": s.problem,
        "deleting": s.deleting,
    }


def object_json(oid: str, obj: Any, codec: o.Codec = o.PLAIN) -> dict[str, Any]:
    """A stored object as JSON: its type and fields, with every id written in hex (a segment's
    objects by their ids under ``codec``, the store's). Raises nothing."""
    hx = o.hex_id
    if isinstance(obj, o.Commit):
        doc: dict[str, Any] = {
            "type": "commit", "kind": obj.kind, "parents": [hx(p) for p in obj.parents],
            "body": hx(obj.body) if obj.body else None, "state": hx(obj.state) if obj.state else None,
            "delta": obj.delta, "unset": list(obj.unset), "scopes": {k: hx(v) for k, v in obj.scopes.items()},
            "author": obj.author, "time": obj.time, "meta": obj.meta, "depth": obj.depth,
            "index": hx(obj.index) if obj.index else None,
        }
    elif isinstance(obj, o.Value):
        doc = {"type": "value", "value": obj.value}
    elif isinstance(obj, o.Blob):
        doc = {"type": "blob", "size": len(obj.data), "data": obj.data}
    elif isinstance(obj, o.Tree):
        doc = {"type": "tree", "values": obj.values, "refs": {k: hx(v) for k, v in obj.refs.items()},
               "sub": {k: hx(v) for k, v in obj.sub.items()}}
    elif isinstance(obj, o.Segment):
        doc = {"type": "segment", "start": obj.start, "objects": codec.digest_many(obj.objects)}
    elif isinstance(obj, o.Index):
        doc = {"type": "index", "segments": [hx(s) for s in obj.segments]}
    else:
        doc = {"type": type(obj).__name__.lower()}
    return o.to_builtins({"id": oid, **doc})


# -- text blocks ---------------------------------------------------------------------------
def sessions_table(infos: Sequence[SessionInfo], style: Style = click.style) -> list[str]:
    """One line per session: key, entry count, branch, last activity, title (cut to
    :data:`TITLE_WIDTH` characters), and the session that spawned it (an imported subagent);
    of a session whose HEAD or branch is damaged or lost, its key and what ``status`` says; of
    one whose deletion was interrupted, its key and fsck's line (the command that finishes it)."""
    keys = [safe(format_key(s.app, s.user, s.session)) for s in infos]
    branches = [safe(s.branch) if s.branch is not None else f"(detached at {short(s.head)})" for s in infos]
    w, bw = (max((len(x) for x in col), default=0) for col in (keys, branches))
    out = []
    for k, branch, s in zip(keys, branches, infos, strict=True):
        if s.problem is not None:
            out.append(f"{style(k.ljust(w), bold=True)}  {style('damaged: ' + safe(s.problem), fg='red')}")
            continue
        if s.deleting is not None:
            out.append(f"{style(k.ljust(w), bold=True)}  "
                       f"{style(safe(finish_line((s.app, s.user, s.session))), fg='yellow')}")
            continue
        title = views.session_title(s.info)
        line = (f"{style(k.ljust(w), bold=True)}  {s.entries:>6} {'entry  ' if s.entries == 1 else 'entries'}  "
                f"{style(branch.ljust(bw), fg='green')}  {fmt_time(s.updated)}")
        line = f"{line}  {safe(one_line(title, TITLE_WIDTH))}" if title else line
        by = views.spawned_by(s.info)  # an imported subagent: the session that spawned it
        if by is not None:
            line += "  " + style(f"subagent of {safe(by['session'])}", fg="magenta")
        out.append(line)
    return out


#: how much of a session's title the listing shows
TITLE_WIDTH = 60


def _safe_lines(lines: Iterable[str]) -> list[str]:
    return [part for line in lines for part in (safe_block(line).splitlines() or [""])]


def body_lines(e: LogEntry, verbose: bool = False, stored: str | None = None) -> list[str]:
    """The entry's full content, for ``show`` and the long ``log`` format (terminal-safe).

    ``verbose``: what a view shortens in full (an imported tool's whole output).
    ``stored``: what a view read from the store for an event with no message, under its head.
    """
    entry = e.entry
    shown = views.body(e, verbose)  # as the view of its kind reads it (an imported tool call...)
    if shown is not None:
        return _safe_lines(shown)
    if isinstance(entry, Message):
        head = f"[{_message_label(entry)}]" + (f" (answers {safe(entry.tool_call_id)})" if entry.tool_call_id else "")
        return [head, *safe_block(message_text(entry)).splitlines()]
    if isinstance(entry, Event):
        if entry.message is None:
            return [f"[event by {safe(entry.author)}]", *_safe_lines([stored] if stored else [])]
        return [f"[{safe(entry.author or entry.message.role)}]", *safe_block(message_text(entry.message)).splitlines()]
    if isinstance(entry, Compaction):
        return [f"[compaction: keeps from {safe(short(entry.first_kept))}, {entry.tokens_before} tokens before]",
                *safe_block(entry.summary).splitlines()]
    if isinstance(entry, BranchSummary):
        return [f"[branch summary of {safe(short(entry.from_id))}]", *safe_block(entry.summary).splitlines()]
    if isinstance(entry, ModelChange):
        said = [entry.model, entry.provider, entry.thinking_level and f"thinking {entry.thinking_level}"]
        return [safe("[model change] " + " ".join(p for p in said if p))]
    if isinstance(entry, Custom):
        return [f"[custom {safe(entry.type)}]", fmt_value(entry.data)]
    return [f"[{safe(e.kind)}]"]


def state_change_lines(delta: Mapping[str, Any], unset: Sequence[str]) -> list[str]:
    """``+ key = value`` and ``- key`` lines."""
    return [f"+ {safe(k)} = {fmt_value(v)}" for k, v in delta.items()] + [f"- {safe(k)}" for k in unset]


#: ``log`` shows at most this many lines of an entry's body (``show`` shows all of it)
LOG_BODY_LINES = 12
#: ... and cuts each line at this many characters
LOG_LINE_CHARS = 240


def cut_body(lines: list[str], cid: str, max_lines: int = LOG_BODY_LINES,
             max_chars: int = LOG_LINE_CHARS, show_hint: Callable[[str], str] | None = None) -> list[str]:
    """``lines`` cut to ``max_lines`` lines of at most ``max_chars`` characters, saying what was left out.

    ``show_hint``: how to write the ``show`` command to suggest (default: ```castore show ID```).
    """
    out = [ln if len(ln) <= max_chars else ln[: max_chars - 1] + "…" for ln in lines[:max_lines]]
    cut_chars = sum(len(ln) > max_chars for ln in lines[:max_lines])
    more = len(lines) - len(out)
    if more or cut_chars:
        what = f"{more} more line{'s' if more != 1 else ''}" if more else "long lines cut"
        show = show_hint(f"show {cid}") if show_hint is not None else f"`castore show {cid}`"
        out.append(f"[… {what}; {safe(show)} shows it all]")
    return out


def commit_block(e: LogEntry, refs: Refs, *, full: bool = False, style: Style = click.style,
                 body_limit: int | None = None, show_hint: Callable[[str], str] | None = None,
                 verbose: bool = False) -> list[str]:
    """A git-like multi-line view of a commit (``log`` and ``show``).

    ``verbose``: the entry's body in full where a view shortens it (see :func:`body_lines`).

    ``body_limit``: show at most that many lines of the entry's body (``log``), each cut
    at :data:`LOG_LINE_CHARS` characters, with a pointer to ``castore show``.
    """
    deco = refs.decoration(e.id, style)
    cid = e.id if full else e.short
    lines = [style(f"commit {cid}", fg="yellow") + (f" {deco}" if deco else "")]
    if full:
        lines.append("Parents: " + (" ".join(e.parents) if e.parents else "(root)"))
    lines.append(f"Kind:    {safe(e.kind)}" + (f" by {safe(e.author)}" if e.author else ""))
    lines.append(f"Date:    {fmt_time(e.time)}")
    if full and e.meta:
        lines.append("Meta:    " + fmt_value(dict(e.meta)))
    changes = state_change_lines(e.delta, e.unset)
    if changes:
        lines.append("State:   " + changes[0])
        lines += ["         " + c for c in changes[1:]]
    lines.append("")
    body = body_lines(e, verbose, refs.said.get(e.id))
    if body_limit is not None:
        body = cut_body(body, e.short, body_limit, show_hint=show_hint)
    lines += ["    " + line for line in body]
    return lines


def oneline(e: LogEntry, refs: Refs, style: Style = click.style) -> str:
    """``1a2b3c4d (HEAD -> main) user: What's the weather?``"""
    deco = refs.decoration(e.id, style)
    return " ".join(p for p in (style(e.short, fg="yellow"), deco, summary(e, stored=refs.said.get(e.id))) if p)


# -- the graph ----------------------------------------------------------------------------------
def topo_order(entries: Sequence[LogEntry]) -> list[LogEntry]:
    """Children before parents, newest first otherwise, one line of history kept together.

    Like ``git log --graph`` (which implies ``--topo-order``): after a commit comes its
    first parent when nothing else still has to come before that parent.
    """
    index = {e.id: i for i, e in enumerate(entries)}
    waiting = {e.id: 0 for e in entries}
    for e in entries:
        for p in set(e.parents):
            if p in waiting:
                waiting[p] += 1
    ready = [index[e.id] for e in entries if waiting[e.id] == 0]
    heapq.heapify(ready)
    out: list[LogEntry] = []
    nxt: int | None = None
    while nxt is not None or ready:
        i = nxt if nxt is not None else heapq.heappop(ready)
        nxt = None
        e = entries[i]
        out.append(e)
        for j, p in enumerate(dict.fromkeys(e.parents)):
            if p not in waiting:
                continue
            waiting[p] -= 1
            if waiting[p] == 0:
                if j == 0:
                    nxt = index[p]
                else:
                    heapq.heappush(ready, index[p])
    return out


def graph_rows(entries: Sequence[LogEntry], head: str | None = None) -> list[tuple[str, LogEntry | None]]:
    """Draw the commit DAG as ``git log --graph`` does.

    Args:
        entries: the commits to draw, children before parents (see :func:`topo_order`).
        head: the current leaf, drawn ``@`` instead of ``*``.

    Returns:
        ``(graph, entry)`` rows: one per commit (``entry`` set), plus connecting rows
        (``entry`` None) where lines of history fork or join.
    """
    cols: list[str] = []  # the commit each column is waiting for
    rows: list[tuple[str, LogEntry | None]] = []

    def line(cells: dict[int, str], width: int) -> str:
        return "".join(cells.get(i, " ") for i in range(width)).rstrip()

    for e in entries:
        if e.id in cols:
            c = cols.index(e.id)
        else:
            cols.append(e.id)
            c = len(cols) - 1
        cells = {2 * i: "|" for i in range(len(cols))}
        cells[2 * c] = "@" if e.id == head else "*"
        rows.append((line(cells, 2 * len(cols)), e))
        parents = list(dict.fromkeys(e.parents))
        if not parents:
            # A root: its column ends; the columns to its right move one step left.
            after = cols[c + 1 :]
            del cols[c]
            if after:
                cells = {2 * i: "|" for i in range(c)}
                cells.update({2 * k - 1: "/" for k in range(c + 1, c + 1 + len(after))})
                rows.append((line(cells, 2 * (len(cols) + 1)), None))
        else:
            cols[c] = parents[0]
            for p in parents[1:]:
                if p in cols:
                    continue
                # A merge: open a column for the other parent; the ones to its right move right.
                n_after = len(cols) - (c + 1)
                cols.insert(c + 1, p)
                cells = {2 * i: "|" for i in range(c + 1)}
                cells[2 * c + 1] = "\\"
                cells.update({2 * k + 1: "\\" for k in range(c + 1, c + 1 + n_after)})
                rows.append((line(cells, 2 * len(cols)), None))
        rows += _collapse(cols, line)
    return rows


def _collapse(cols: list[str], line: Callable[[dict[int, str], int], str]) -> list[tuple[str, None]]:
    """Join columns waiting for the same commit (lines of history meeting at a fork point)."""
    rows: list[tuple[str, None]] = []
    while True:
        dup = next((j for j in range(len(cols)) if cols[j] in cols[:j]), None)
        if dup is None:
            return rows
        i = cols.index(cols[dup])
        width = 2 * len(cols)
        cells = {2 * k: "|" for k in range(dup)}
        for pos in range(2 * i + 1, 2 * dup - 1):
            if pos % 2 == 1:
                cells[pos] = "_"
        cells[2 * dup - 1] = "/"
        cells.update({2 * k - 1: "/" for k in range(dup + 1, len(cols))})
        del cols[dup]
        rows.append((line(cells, width), None))


def graph_lines(entries: Sequence[LogEntry], refs: Refs, style: Style = click.style) -> list[str]:
    """The full ``log --graph`` text: graph, short id, refs, summary."""
    ordered = topo_order(entries)
    out = []
    for graph, e in graph_rows(ordered, refs.head):
        if e is None:
            out.append(graph)
        else:
            g = graph.replace("@", style("@", fg="cyan", bold=True))
            out.append(f"{g} {oneline(e, refs, style)}")
    return out


def context_lines(m: Message, verbose: bool = False, style: Style = click.style) -> list[str]:
    """One message of ``context``: ``[role] text``, read as the view of messages reads it
    (an imported tool call: ``→ Bash(ls)``). Terminal-safe."""
    label = style(f"[{safe(m.role)}]", bold=True)
    shown = views.message(m, verbose)
    if shown is None:
        return [label + " " + safe_block(message_text(m))]
    lines = _safe_lines(shown)
    return [label + " " + lines[0], *lines[1:]] if lines else [label]


def context_messages(result: Iterable[Any]) -> list[dict[str, Any]]:
    """What ``session.context()`` returned, as message dicts."""
    out = []
    for m in result:
        if isinstance(m, Message):
            out.append(m.to_dict())
        elif hasattr(m, "to_dict"):
            out.append(m.to_dict())
        else:
            out.append(m)
    return o.to_builtins(out)


__all__ = [
    "Refs",
    "safe",
    "safe_block",
    "plain",
    "short",
    "fmt_time",
    "fmt_value",
    "summary",
    "message_text",
    "entry_json",
    "commit_json",
    "session_json",
    "session_info_json",
    "object_json",
    "sessions_table",
    "body_lines",
    "commit_block",
    "oneline",
    "state_change_lines",
    "topo_order",
    "graph_rows",
    "graph_lines",
    "context_lines",
    "context_messages",
]
