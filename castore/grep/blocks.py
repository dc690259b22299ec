"""The searchable blocks of a commit's body (the kinds :mod:`castore.grep` describes), the
bodies of commits read in batches, the time of a commit, and the context entries around a
match: what the search through the index (:mod:`castore.grep.index`, which extracts the
blocks), the scan and walk (:mod:`castore.grep.scan`) and :func:`castore.grep.grep` share.
The object format is imported by the functions that read objects, not by the module: a
search through a fresh index reads none.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..objects import Commit
    from ..store import Store

#: the kinds of block, in the order the index numbers them
KINDS = ("text", "thinking", "tool_call", "tool_result")
#: kinds searched unless told otherwise: tool results are most of the text, and rarely wanted
DEFAULT_KINDS = ("text", "thinking", "tool_call")

#: the roles of a message that is a tool's result
TOOL_ROLES = ("tool", "toolResult", "function", "tool_result")


def _json_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    try:
        return json.dumps(v, ensure_ascii=False, sort_keys=False)
    except (TypeError, ValueError):
        return str(v)


def _result_text(c: Any) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for b in c:
            if isinstance(b, str):
                parts.append(b)
            elif isinstance(b, dict) and isinstance(b.get("text"), str) and b.get("type") in (None, "text",
                                                                                             "input_text",
                                                                                             "output_text"):
                parts.append(b["text"])
        return "\n".join(parts)
    if isinstance(c, dict) and isinstance(c.get("text"), str):
        return c["text"]
    return ""


def blocks(body: Any, kind: str, calls: dict[str, str]) -> Iterator[tuple[str, str, str | None, str]]:
    """``(role, kind, tool, text)`` for each searchable block of a commit's body.

    ``calls`` maps tool-call ids to tool names; calls seen here are added, so that a
    later result names its tool.
    """
    if not isinstance(body, dict):
        return
    if kind in ("compaction", "branch_summary"):
        if isinstance(body.get("summary"), str):
            yield "system", "text", None, body["summary"]
        return
    if kind not in ("message", "event"):
        return
    role: str = body["role"] if isinstance(body.get("role"), str) else ""
    is_result = role in TOOL_ROLES
    result_tool: str | None = None
    if is_result:
        cid = body.get("tool_call_id") or body.get("toolCallId")
        named = body.get("toolName") or body.get("name")
        result_tool = named if isinstance(named, str) else (calls.get(cid) if isinstance(cid, str) else None)
    content = body.get("content")
    if isinstance(content, str):
        yield role, ("tool_result" if is_result else "text"), result_tool, content
    elif isinstance(content, list):
        for b in content:
            if isinstance(b, str):
                yield role, ("tool_result" if is_result else "text"), result_tool, b
                continue
            if not isinstance(b, dict):
                continue
            t = b.get("type")
            if t in ("text", "input_text", "output_text") and isinstance(b.get("text"), str):
                yield role, ("tool_result" if is_result else "text"), result_tool, b["text"]
            elif t == "thinking" and isinstance(b.get("thinking"), str):
                yield role, "thinking", None, b["thinking"]
            elif t == "reasoning":
                txt = b.get("text") if isinstance(b.get("text"), str) else _result_text(b.get("summary"))
                if txt:
                    yield role, "thinking", None, txt
            elif t in ("tool_use", "toolCall", "function_call", "server_tool_use", "custom_tool_call"):
                name = b.get("name") if isinstance(b.get("name"), str) else None
                cid = b.get("id") or b.get("call_id")
                if isinstance(cid, str) and name:
                    calls[cid] = name
                args = b.get("input", b.get("arguments"))
                yield role, "tool_call", name, f"{name or ''} {_json_text(args) if args is not None else ''}".strip()
            elif t in ("tool_result", "function_call_output", "toolResult", "custom_tool_call_output"):
                cid = b.get("tool_use_id") or b.get("call_id") or b.get("toolCallId")
                tool = calls.get(cid) if isinstance(cid, str) else None
                yield role, "tool_result", tool, _result_text(b.get("content", b.get("output")))
    for tc in body.get("tool_calls") or ():
        if isinstance(tc, dict):
            fn: dict[str, Any] = tc["function"] if isinstance(tc.get("function"), dict) else tc
            name = fn["name"] if isinstance(fn.get("name"), str) else None
            if isinstance(tc.get("id"), str) and name:
                calls[tc["id"]] = name
            yield role, "tool_call", name, f"{name or ''} {_json_text(fn.get('arguments', ''))}".strip()


def _preview(body: Any, kind: str) -> tuple[str, str]:
    calls: dict[str, str] = {}
    for role, _, _, text in blocks(body, kind, calls):
        return role, " ".join(text.split())[:200]
    return (body.get("role", "") if isinstance(body, dict) else ""), ""


def time_of(c: Commit) -> float:
    """The time of commit ``c``: its metadata's ``time`` when that is a number, else the commit's
    own. Raises nothing."""
    t = c.meta.get("time") if isinstance(c.meta, dict) else None
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else c.time


def context_entries(store: Store, path: list[str], cid: str, n: int
             ) -> tuple[tuple[tuple[str, str, str], ...], tuple[tuple[str, str, str], ...]]:
    """The ``n`` entries before and after commit ``cid`` on ``path`` (commit ids, root to tip), as
    ``(commit, role, preview text)`` each.

    Raises:
        ValueError: ``cid`` is not on ``path``.
        StorageError, IntegrityError: the store cannot be read.
    """
    from .. import objects as o  # here: a search that reads no object never loads the object format
    from ..objects import Value

    i = path.index(cid)
    ids = path[max(0, i - n):i] + path[i + 1:i + 1 + n]
    commits = store.history.commits(ids) if ids else {}
    bids = [o.hex_id(c.body) for c in commits.values() if c.body is not None]
    bodies = store.objects.get_many(bids, missing_ok=True) if bids else {}

    def one(x: str) -> tuple[str, str, str]:
        c = commits[x]
        v = bodies.get(o.hex_id(c.body)) if c.body is not None else None
        role, text = _preview(v.value if isinstance(v, Value) else None, c.kind)
        return x, role or c.author or c.kind, text

    return tuple(one(x) for x in path[max(0, i - n):i]), tuple(one(x) for x in path[i + 1:i + 1 + n])


#: bodies read at once by :func:`bodies_of`
_BODY_BATCH = 256


def bodies_of(store: Store, order: list[tuple[str, Commit]]) -> Iterator[tuple[str, Commit, Any]]:
    """Each commit of ``order`` that has a body, with the body's value (None when it is missing
    or not a value), reading the bodies in batches and each shared body once.

    Raises:
        IntegrityError, StorageError: reading a body failed.
    """
    from .. import objects as o  # here: a search that reads no object never loads the object format
    from ..objects import Value

    for i in range(0, len(order), _BODY_BATCH):
        batch = order[i:i + _BODY_BATCH]
        body_ids = list(dict.fromkeys(o.hex_id(c.body) for _, c in batch if c.body is not None))
        bodies = store.objects.get_many(body_ids, missing_ok=True) if body_ids else {}
        for cid, c in batch:
            if c.body is not None:
                v = bodies.get(o.hex_id(c.body))
                yield cid, c, (v.value if isinstance(v, Value) else None)


__all__ = ["TOOL_ROLES", "bodies_of", "blocks", "context_entries", "time_of"]
