"""How a Claude Code subagent's session is linked to the turn that spawned it, both ways.

A subagent's file (``<session>/subagents/agent-<id>.jsonl``) becomes a session of its own
(:mod:`castore.adapters.claude_code`); the main session's user line that carries the
subagent's result names its agent (``toolUseResult.agentId``, or ``agentId`` on the line in
the old layout) and the ``tool_use_id`` of the Task/Agent call that spawned it. After a main
file is imported, :func:`agent_links` finds those lines (kept in the main session's info,
``agents``); after each subagent file, :func:`link_subagent` writes ``spawned_by`` in its info
and names it in the main session's ``agents``. A session this import made is looked through
as the import wrote it (:attr:`~castore.adapters.tree_writer.TreeWriter.written`), without
reading its log back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..entries import Event
from .jsonl_tree import as_dict, parse_line, read_blobs, stored_lines

if TYPE_CHECKING:
    from ..session import Session

#: the metadata key of an archived Claude Code line
KEY = "claude"
#: the tools whose calls spawn a subagent
SPAWNERS = ("Task", "Agent")


class Source(Protocol):
    """Where a file being imported comes from (its project, session id, main session)."""

    @property
    def project(self) -> str: ...
    @property
    def session_id(self) -> str: ...
    @property
    def parent_id(self) -> str | None: ...


class Importer(Protocol):
    """What the links need of a file's import (:mod:`castore.adapters.claude_code`'s)."""

    @property
    def session(self) -> Session: ...
    @property
    def src(self) -> Source: ...
    @property
    def info(self) -> dict[str, Any]: ...
    @property
    def settled(self) -> bool: ...
    @property
    def written(self) -> list[tuple[str, Event, bytes]] | None: ...
    @property
    def sidechains(self) -> Any: ...


def agent_links(imp: Importer) -> dict[str, dict[str, Any]]:
    """agentId -> where the main session ``imp`` imported spawned it (kept in its info, found
    once per line count).

    Raises:
        ObjectNotFound, IntegrityError, StorageError, RefContended.
    """
    s = imp.session
    if not (imp.settled or s.exists()):
        return {}
    info = imp.info if imp.settled else s.info
    c = info.get(KEY) or {}
    have = dict(c.get("agents") or {})
    if c.get("agents_at") == c.get("lines"):
        return have
    found = spawns_written(imp.written) if imp.written is not None else None
    if found is None:
        by_raw, calls = spawns((le.id, le.meta, le.entry) for le in s.log(all_branches=True))
        found = by_raw, calls, [(by_raw[rid], *a) for rid, raw in read_blobs(s.store, list(by_raw)).items()
                                if (a := agent_of(raw)) is not None]
    c = found_agents(c, found)
    s.set_info({**info, KEY: c})
    return dict(c["agents"])


def agent_of(raw: bytes) -> tuple[str, Any] | None:
    """The agent a user line names (the current layout in the tool's result, the old one on
    the line) and the tool_use id it answers, or None."""
    if b'"agentId"' not in raw:
        return None
    d = parse_line(raw)
    if not isinstance(d, dict):
        return None
    tur = as_dict(d.get("toolUseResult"))
    agent = tur.get("agentId") if isinstance(tur.get("agentId"), str) else d.get("agentId")
    if not isinstance(agent, str):
        return None
    tool_use_id = None
    content = (d.get("message") or {}).get("content") if isinstance(d.get("message"), dict) else None
    if isinstance(content, list):
        for b in content:
            if isinstance(b, dict) and b.get("type") == "tool_result":
                tool_use_id = b.get("tool_use_id")
    return agent, tool_use_id


def spawns(log: Iterable[tuple[str, Mapping[str, Any], Any]]) -> tuple[dict[str, str], dict[Any, str]]:
    """From a session's commits ``(commit, meta, entry)``, newest first: the raw blob of each
    ``user`` line -> its commit (the oldest line of those bytes), and the tool_use id of each
    Task/Agent call -> the commit of its line (the newest)."""
    by_raw: dict[str, str] = {}
    calls: dict[Any, str] = {}
    for cid, meta, entry in log:
        m = meta.get(KEY)
        if isinstance(m, dict) and isinstance(m.get("raw"), str) and m.get("type") == "user":
            by_raw[m["raw"]] = cid
        msg = entry.message if isinstance(entry, Event) else None
        for b in msg.content if msg is not None and msg.role == "assistant" and isinstance(msg.content, list) else ():
            if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("name") in SPAWNERS:
                calls.setdefault(b.get("id"), cid)
    return by_raw, calls


def spawns_written(written: list[tuple[str, Event, bytes]]
                    ) -> tuple[dict[str, str], dict[Any, str], list[tuple[str, str, Any]]] | None:
    """:func:`spawns` of the lines an import just wrote into a new session (its whole log),
    without reading the log back, and ``(commit, agent, tool_use id)`` of the user lines that
    name an agent; None where the log's order would decide (two such lines of the same bytes
    or the same agent, two calls of the same id, a call made by a line not the assistant's):
    then the log is read. One pass, oldest line first (a main file's every line). Raises nothing."""
    by_raw: dict[str, str] = {}
    calls: dict[Any, str] = {}
    agents: list[tuple[str, str, Any]] = []
    seen: set[str] = set()
    n_calls = 0
    for cid, e, raw in written:
        m = e.meta.get(KEY)
        if isinstance(m, dict) and isinstance(rid := m.get("raw"), str) and m.get("type") == "user":
            first = by_raw.setdefault(rid, cid)  # the oldest line of those bytes, as spawns keeps
            a = agent_of(raw)  # a user line naming an agent
            if a is not None:
                if a[0] in seen or first != cid:
                    return None
                seen.add(a[0])
                agents.append((cid, *a))
        msg = e.message
        if msg is not None and isinstance(msg.content, list):
            for b in msg.content:
                if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("name") in SPAWNERS:
                    n_calls += 1
                    if msg.role == "assistant":
                        calls[b.get("id")] = cid  # the newest call of an id, as spawns keeps
    return (by_raw, calls, agents) if n_calls == len(calls) else None


def link_sidechains(imp: Importer, links: dict[str, dict[str, Any]]) -> None:
    """Link each old-layout sidechain whose agent the main session names (as
    :func:`link_subagent` links a subagent file); the others keep their Task-call link."""
    if imp.sidechains is None:
        return
    main = imp.session
    for th in imp.sidechains.threads.values():
        link = links.get(th.agent or "")
        if link is None or not th.session.exists():
            continue
        link_spawned(main, th.agent or "", th.session, link)


def link_subagent(imp: Importer, links: dict[str, dict[str, Any]],
                  named: dict[tuple[str, str, str], dict[str, str]] | None = None) -> None:
    """Link the subagent file ``imp`` imported to its main session, by the agent its file is
    named for (``agent-<id>``) in the main session's ``links`` (:func:`agent_links`).
    ``named``: where the main session's side waits (:func:`link_spawned`), by its key.

    Raises:
        ObjectNotFound, IntegrityError, StorageError, RefContended.
    """
    s = imp.session
    if not (imp.settled or s.exists()):
        return
    agent = file_agent(imp.src.session_id)
    link = links.get(agent)
    if link is not None:
        main = s.store.session(s.app, imp.src.project, imp.src.parent_id or "")
        link_spawned(main, agent, s, link, imp.info, imp.written,
                     named.setdefault(main.key, {}) if named is not None else None)


def link_spawned(main: Session, agent: str, sub: Session, link: dict[str, Any], seen: dict[str, Any] | None = None,
                 written: list[tuple[str, Event, bytes]] | None = None, named: dict[str, str] | None = None) -> None:
    """Link subagent session ``sub`` both ways: its info names the turn of ``main`` that
    spawned it (``spawned_by``: the session, the commit of the Task result, the call's id
    and commit, and ``first``, its own first line), and ``main``'s list of agents names it.
    ``seen``: ``sub``'s info as read earlier in the import; when it and ``link`` (``main``'s
    entry for the agent) show both ways in place, nothing is read again. ``written``: the
    whole log of ``sub`` when an import just made it (its first line is then the first of
    these, not read back). ``named``: ``main``'s side is kept there (agentId -> session) for
    :func:`name_agents` to write once for all of ``main``'s subagents, not written now.

    Raises:
        ObjectNotFound, IntegrityError, StorageError, RefContended.
    """
    want = spawned_by(main.key, link)
    had = as_dict((seen or {}).get("spawned_by"))
    if link.get("session") == sub.id and "first" in had and had == {**want, "first": had["first"]}:
        return
    info = sub.info
    first = as_dict(info.get("spawned_by")).get("first")
    if first is None and written is not None:
        first = first_written(written)
    elif first is None:
        first = next((cid for o_, (cid, _, _) in sorted(stored_lines(sub, KEY).items()) if o_ >= 0), None)
    if first is not None:
        want["first"] = first
    if info.get("spawned_by") != want:
        sub.set_info({**info, "spawned_by": want})
    if named is not None:
        named[agent] = sub.id
    else:
        name_agents(main, {agent: sub.id})


def name_agents(main: Session, named: dict[str, str]) -> None:
    """Name in ``main``'s list of agents (its info) the session of each agent in ``named``
    (agentId -> session), in one write when any changes.

    Raises:
        StorageError, RefContended.
    """
    minfo = main.info
    c = as_dict(minfo.get(KEY))
    agents = as_dict(c.get("agents"))
    new = {agent: {**as_dict(agents.get(agent)), "session": sid} for agent, sid in named.items()
           if as_dict(agents.get(agent)).get("session") != sid}
    if new:
        main.set_info({**minfo, KEY: {**c, "agents": {**agents, **new}}})


def spawned_by(main: tuple[str, str, str], link: dict[str, Any], first: str | None = None) -> dict[str, Any]:
    """A subagent session's ``spawned_by`` (its info): the main session ``(app, user, id)``,
    ``link`` (the main session's entry for the agent: the commit of the Task result, the
    call's id and commit) and ``first``, the subagent's own first line. Raises nothing."""
    want = {"app": main[0], "user": main[1], "session": main[2], **{k: v for k, v in link.items() if k != "session"}}
    if first is not None:
        want["first"] = first
    return want


def first_written(written: list[tuple[str, Event, bytes]]) -> str | None:
    """The commit of the first line of a session an import just made, from what it wrote
    (:attr:`~castore.adapters.tree_writer.TreeWriter.written`: in line order). Raises nothing."""
    return written[0][0] if written else None


def found_agents(c: dict[str, Any], found: tuple[dict[str, str], dict[Any, str], list[tuple[str, str, Any]]]
                 ) -> dict[str, Any]:
    """The main session's import state ``c`` (its info under :data:`KEY`) with the agents
    :func:`spawns` found (``agents``: agentId -> the commit of its result line, the call's
    id and commit) recorded as found at its current line count (``agents_at``). Raises nothing."""
    _, calls, agents = found
    have = dict(c.get("agents") or {})
    for cid, agent, tool_use_id in agents:
        have[agent] = {**as_dict(have.get(agent)), "commit": cid, "tool_use_id": tool_use_id,
                       **({"call": calls[tool_use_id]} if tool_use_id in calls else {})}
    return {**c, "agents": have, "agents_at": c.get("lines")}


def file_agent(session_id: str) -> str:
    """The agent a subagent file's session is named for (``<session>.subagents.agent-<id>``
    -> ``<id>``). Raises nothing."""
    return session_id.rsplit(".", 1)[-1].removeprefix("agent-")
