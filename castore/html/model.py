"""The data a session view embeds: every commit once, states as deltas, the layout.

:func:`build_model` reads a whole session (every commit reachable from its branches,
labels and HEAD) and returns one JSON-ready dict. Its size is linear in the session's
commits: each entry appears once, and each commit carries only its state change (the
viewer rebuilds the full state at a commit by replaying the changes along its path, which
:meth:`castore.Session.verify` guarantees equals the stored snapshot).

Shape (``v`` 1)::

    {"v": 1, "key": {"app", "user", "session"}, "info": {...}, "title": TEXT|null,
     "refs": {"head": i|None, "branch": name|None, "branches": {name: i}, "labels": {name: i}},
     "nodes": [{"id", "p": [parent indices], "k": kind, "a": author, "t": time, "n": depth,
                "m": meta, "d": {key: value}, "u": [unset keys], "e": entry,
                "r": row, "l": lane, "o": LINE (an imported line as `log --oneline` reads it),
                "h": [marks] (only when some, see below)}, ...],
     "lanes": n, "runs": [[first_row, last_row], ...], "bookkeeping": n, "all_entries": bool,
     "text": {...wording of summaries}}

Nodes are ordered oldest first. ``d``/``u`` hold the session keys the commit changed,
plus the ``app:``/``user:`` keys whose scoped state differs from the parent commit's.

A LangGraph thread (see :mod:`castore.adapters.langgraph_view`) shows as LangGraph sees it:
a checkpoint's ``e`` says its step, node and updated channels (``e.summary``), its ``d``/``u``
hold the decoded channel values that changed, and ``x`` (``{channel: [items]}``) the items
appended to a list channel such as ``messages`` (so each message is embedded once, not once
per checkpoint). The saver's task writes and their branch are left out unless ``internal``.

An imported session shows as ``castore log`` shows it: the client's bookkeeping lines (Claude
Code's ``progress``, ``file-history-snapshot``, ``summary``; Codex's ``turn_context``,
``token_count``; see :func:`castore.views.bookkeeping`) are left out unless ``all_entries``,
each kept commit's parents moved past them, and HEAD, a branch or a label on one shows on the
newest kept commit before it (so the view opens on the newest entry it shows).
A line left out that set the session's title or the model of the turns after it (a Claude
Code ``summary``, a Codex ``turn_context`` naming another model) leaves a mark on the node
shown in its place, ``"h": [{"id", "a", "s": "title: ..." | "model: ...", "before": true (when
shown on the first kept commit after it)}]``, which the page shows as a pill and in the
details. ``bookkeeping`` counts these lines, shown or not. Importers give these lines no
state change, so replaying the kept commits' deltas still rebuilds each state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .. import context as ctx
from .. import objects as o
from .. import porcelain, views
from ..adapters import langgraph_view as lg
from ..entries import Event, entry_fields
from ..session import LogEntry, Session
from ..state import read_states
from ..views import session_title
from .layout import layout

FORMAT = 1


def entry_doc(e: LogEntry) -> dict[str, Any]:
    """The entry of one commit as a JSON-ready dict (an event's delta and meta are on the node;
    a LangGraph commit is described by :func:`castore.adapters.langgraph_view.entry_doc`)."""
    described = lg.entry_doc(e)
    if described is not None:
        return described
    doc = entry_fields(e.entry)
    if isinstance(e.entry, Event):
        doc.pop("state_delta", None)
        doc.pop("meta", None)
    return doc


def _scope_changes(before: Mapping[str, Any], after: Mapping[str, Any], prefix: str,
                   delta: dict[str, Any], unset: list[str]) -> None:
    for k, v in after.items():
        if k not in before or before[k] != v:
            delta[prefix + k] = v
    unset.extend(prefix + k for k in before if k not in after)


def _as_log_reads(e: LogEntry, said: Mapping[str, str]) -> str | None:
    """The line ``castore log --oneline`` shows for an imported line (``assistant: → Bash(ls)``,
    ``tool: ← 14 lines: ...``, ``system: turn_duration durationMs=87785``), or None for a
    commit the page sums up itself (castore's own entries, a LangGraph checkpoint)."""
    if e.kind not in ("event", "message"):
        return None
    line = views.describe(e)
    if line is None and e.id in said:
        line = f"{e.author or 'event'}: {said[e.id]}"
    return line


def _settings_left_out(session: Session, every: list[LogEntry], index: Mapping[o.ObjectId, int],
                       at: Callable[[str], str]) -> dict[int, list[dict[str, Any]]]:
    """The bookkeeping lines left out that set a title or a model (:func:`castore.views.settings`),
    by the node shown in their place: the newest kept commit before each, as its names move
    there, else (a line before any kept one) the oldest kept commit after it, marked ``before``.
    Each is ``{"id", "a": author, "s": what it set}``, oldest first."""
    said = views.settings(session, every)
    if not said:
        return {}
    children: dict[str, list[str]] = {}
    for e in every:
        for p in e.parents:
            children.setdefault(p, []).append(e.id)
    out: dict[int, list[dict[str, Any]]] = {}
    for e in sorted(every, key=lambda e: (e.time, e.depth, e.id)):
        if e.id not in said:
            continue
        mark: dict[str, Any] = {"id": e.id, "a": e.author, "s": said[e.id]}
        shown = index.get(o.ObjectId(at(e.id)))
        if shown is None:  # no kept commit before it: the first one after it on its path
            todo = list(children.get(e.id, ()))
            while todo and (shown := index.get(o.ObjectId(todo[0]))) is None:
                todo[:1] = children.get(todo[0], ())
            mark["before"] = True
        if shown is not None:
            out.setdefault(shown, []).append(mark)
    return out


def build_model(session: Session, internal: bool = False, all_entries: bool = False) -> dict[str, Any]:
    """Read a whole session into the JSON-ready data of its HTML view (see the module doc).

    Args:
        session: the session.
        internal: keep an adapter's bookkeeping commits and branches (a LangGraph thread's
            task writes), which are left out by default.
        all_entries: keep the bookkeeping lines of imported sessions, which are left out by
            default (as ``castore log`` leaves them out).

    Raises:
        SessionNotFound: the session has no entries.
        CorruptRef: HEAD names no branch, or a branch that was lost (:meth:`Session.lost_branch`:
            the view would look whole without that branch's commits).
        ObjectNotFound, IntegrityError, StorageError: reading failed.
    """
    from ..errors import CorruptRef, SessionNotFound

    if not session.exists():
        raise SessionNotFound(session.key)
    head = session.head
    if head is None and (problem := session.lost_branch()) is not None:
        raise CorruptRef(session.refs.head, problem)
    store = session.store
    entries = session.log(all_branches=True)
    if not internal:
        entries = lg.visible(entries)
    read = len(entries)
    at: Callable[[str], str] = str
    left_out: dict[int, list[dict[str, Any]]] = {}
    if not all_entries:
        every = entries
        entries, at = porcelain.past_bookkeeping(entries)
    bookkeeping = read - len(entries) if not all_entries else sum(map(views.bookkeeping, entries))
    entries.sort(key=lambda e: (e.time, e.depth, e.id))
    index = {e.id: i for i, e in enumerate(entries)}
    if not all_entries and bookkeeping:
        left_out = _settings_left_out(session, every, index, at)
    commits = store.history.commits([e.id for e in entries]) if entries else {}

    # App- and user-scoped state as each commit saw it, read once per distinct scope commit,
    # each from the store holding it (the app's own tenant's, in the tenant layout)
    scope_states: dict[tuple[str, str], Mapping[str, Any]] = {}
    for scope, home in (("app", store.tenant(session.app, None)), ("user", store)):
        ids = sorted({o.hex_id(c.scopes[scope]) for c in commits.values() if scope in c.scopes})
        got = home.history.commits(ids) if ids else {}
        states = read_states(home.objects, [got[s].state for s in ids])
        scope_states.update(((scope, s), st) for s, st in zip(ids, states, strict=True))

    def scoped(cid: str | None, scope: str) -> Mapping[str, Any]:
        if cid is None:
            return {}
        ref = commits[cid].scopes.get(scope)
        return scope_states[(scope, o.hex_id(ref))] if ref is not None else {}

    branches = session.branches()
    if not internal:
        for name in lg.internal_branches(session, branches):
            branches.pop(name)
    reader = lg.StateReader(store)
    labels = session.labels()
    if not all_entries:
        head = o.ObjectId(at(head)) if head is not None else None
        branches = {b: o.ObjectId(at(t)) for b, t in branches.items()}
        labels = {n: o.ObjectId(at(t)) for n, t in labels.items()}
    said = views.said(session, entries)  # an imported line with no message: what its stored line says
    nodes: list[dict[str, Any]] = []
    parents: list[list[int]] = []
    for e in entries:
        ps = [index[p] for p in e.parents if p in index]
        parents.append(ps)
        delta = dict(e.delta)
        unset = list(e.unset)
        first = e.parents[0] if e.parents and e.parents[0] in index else None
        c = commits[e.id]
        pc = commits[first] if first is not None else None
        for scope in ("app", "user"):
            if (pc.scopes.get(scope) if pc else None) != c.scopes.get(scope):
                _scope_changes(scoped(first, scope), scoped(e.id, scope), scope + ":", delta, unset)
        node = {"id": e.id, "p": ps, "k": e.kind, "a": e.author, "t": e.time, "n": e.depth,
                "m": dict(e.meta), "d": delta, "u": unset, "e": entry_doc(e)}
        if (line := _as_log_reads(e, said)) is not None:
            node["o"] = line
        if index[e.id] in left_out:
            node["h"] = left_out[index[e.id]]
        if lg.is_checkpoint(e.kind, e.meta):
            before = pc.state if pc is not None and lg.is_checkpoint(pc.kind, pc.meta) else None
            node["d"], node["u"], appended = reader.changes(before, c.state)
            if appended:
                node["x"] = appended
        nodes.append(node)

    keep = {index[t] for t in [*branches.values(), *labels.values()] if t in index}
    if head in index:
        keep.add(index[head])
    keep.update(i for i, e in enumerate(entries) if e.kind not in ("message", "event"))
    keep.update(left_out)
    plan = layout(parents, prefer=[index[head]] if head in index else [], keep=sorted(keep))
    for i, node in enumerate(nodes):
        node["r"] = plan.row[i]
        node["l"] = plan.lane[i]

    return o.to_builtins({
        "v": FORMAT,
        "key": {"app": session.app, "user": session.user, "session": session.id},
        "info": session.info,
        "title": session_title(session.info),
        "refs": {
            "head": index.get(head) if head else None,
            "branch": session.current_branch,
            "branches": {b: index[t] for b, t in branches.items() if t in index},
            "labels": {n: index[t] for n, t in labels.items() if t in index},
        },
        "nodes": nodes,
        "lanes": plan.lanes,
        "runs": plan.runs,
        "bookkeeping": bookkeeping,
        "all_entries": all_entries,
        "text": {
            "compaction": [ctx.COMPACTION_PREFIX, ctx.COMPACTION_SUFFIX],
            "branch": [ctx.BRANCH_PREFIX, ctx.BRANCH_SUFFIX],
            "overhead": ctx.MESSAGE_OVERHEAD,
            "image": ctx.IMAGE_TOKENS,
        },
    })


__all__ = ["build_model", "entry_doc", "FORMAT"]
