"""Context projection: the messages to send to a model, computed from a path of entries.

What is stored and what a model sees are different things. :func:`project` turns the
entries of one path (oldest first, as :meth:`castore.Session.entries` returns them) into a
:class:`Context`. It is pure: it never reads or writes storage.

Rules, in order:

1. Settings. :class:`~castore.entries.ModelChange` entries set the model, provider and
   thinking level (each field only when given). As in Pi's ``buildSessionContext``, an
   assistant message that names its ``model`` (and ``provider``) also sets the model.
2. Compaction. The latest :class:`~castore.entries.Compaction` on the path wins: its
   summary becomes a user message, followed by the entries from its ``first_kept`` commit
   up to the compaction, then the entries after it. Earlier compactions are superseded.
   When ``first_kept`` is not on the path, nothing before the compaction is kept (Pi does
   the same). A compaction is read as stored, as Pi reads it; the ones castore makes never
   keep a tool result without its call (model APIs reject that): :meth:`castore.Session.compact`
   moves ``first_kept`` back to the assistant message holding the call (see :func:`keep_start`).
3. Messages. :class:`~castore.entries.Message` entries contribute themselves, events
   their message, non-empty branch summaries a user message where they stand. Labels,
   model changes and custom records contribute nothing.
4. Placeholders. A tool output longer than ``tool_output_limit`` tokens is replaced by a
   short text naming the commit that holds the full output.
5. Budget. With ``max_tokens`` or ``max_messages``, whole units are dropped from the
   oldest side: a message and the tool results that follow it are one unit (an assistant
   message that calls tools goes with its results), so a budget never leaves a tool result
   at the start without its call. System messages and the latest user message are never dropped; when they
   alone exceed the budget they are still returned.
6. Parts. An imported message recorded in parts is sent whole, as its agent sends it:
   Gemini CLI writes a message again as its tool calls and their results arrive, and each
   copy's additions are a commit of their own (its event's ``meta["gemini"]["id"]`` names
   the message, :data:`PART_KEYS`). Consecutive messages of one id are joined, and the
   joined message is sent as gemini-cli's ``convertSessionToClientHistory`` sends a
   recorded message: one model turn (its thoughts, parts and calls), then one turn of the
   calls' results (a ``tool`` message), whether they came in one commit or several; as
   there, its ``info``, ``error`` and ``warning`` messages (``system``) and a prompt that
   starts with ``/`` or ``?`` (a command) are not sent. This comes after the budget, which
   counts (and ``dropped`` reports) the parts; the joined message's commit is its first
   part's, the results' the first part holding one.

The summary wording follows Pi's (``convertToLlm``), so that an imported Pi session gives
the text Pi would send.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .entries import Compaction, Event, LogEntry, Message
from .errors import InvalidEntry
from .pathfacts import (
    BRANCH_PREFIX,
    BRANCH_SUFFIX,
    MAX_FACT_NAME,
    MAX_FACT_SYSTEMS,
    SYSTEM_ROLES,
    PathFacts,
    branch_summary_message,
    facts_of,
    message_of,
    settings_and_compaction,
)

TokenCounter = Callable[[Message], int]

#: fixed cost of one message (role, separators) in :func:`estimate_tokens`
MESSAGE_OVERHEAD = 4
#: tokens counted for one image block in :func:`estimate_tokens`
IMAGE_TOKENS = 1200

COMPACTION_PREFIX = (
    "The conversation history before this point was compacted into the following summary:\n\n<summary>\n"
)
COMPACTION_SUFFIX = "\n</summary>"

_TOOL_ROLES = frozenset({"tool", "toolResult", "tool_result", "function"})
#: the importers whose events name the recorded message they are a part of, as
#: ``meta[key]["id"]`` (rule 6): Gemini CLI's
PART_KEYS = ("gemini",)
_RESULT_BLOCKS = frozenset({"tool_result"})
_CALL_BLOCKS = frozenset({"toolCall", "tool_use", "function_call"})


@dataclass(frozen=True)
class Context:
    """The projection of a path: messages for a model, and where each came from.

    Iterating, ``len()`` and indexing behave as on :attr:`messages`.

    Attributes:
        messages: the messages, oldest first.
        commits: for each message, the id of the commit it comes from (a summary
            message: the compaction or branch-summary commit).
        tokens: the token count of ``messages`` by the counter used.
        model, provider, thinking_level: the settings in force at the end of the path.
        dropped: how many messages the budget left out.
    """

    messages: list[Message]
    commits: list[str]
    tokens: int
    model: str | None = None
    provider: str | None = None
    thinking_level: str | None = None
    dropped: int = 0

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, i: int) -> Message:
        return self.messages[i]

    def to_dicts(self) -> list[dict[str, Any]]:
        """The messages as plain dicts, ready for a chat API."""
        return [m.to_dict() for m in self.messages]


def estimate_tokens(message: Message) -> int:
    """A model-independent approximation of a message's token count.

    About four characters per token: ``ceil(chars / 4) + 4``, where ``chars`` counts the
    text and thinking of the content, the name and JSON arguments of tool calls (in
    ``tool_calls`` or in content blocks), and each image counts as ``IMAGE_TOKENS`` tokens.
    Pass a real tokenizer as ``token_counter`` where precision matters.
    """
    chars = 0
    images = 0
    content = message.content
    if isinstance(content, str):
        chars += len(content)
    elif isinstance(content, list):
        for block in content:
            if isinstance(block, str):
                chars += len(block)
            elif isinstance(block, dict):
                kind = block.get("type")
                if kind in ("image", "image_url", "input_image"):
                    images += 1
                elif isinstance(block.get("text"), str):
                    chars += len(block["text"])
                elif isinstance(block.get("thinking"), str):
                    chars += len(block["thinking"])
                elif kind in _CALL_BLOCKS:
                    chars += len(str(block.get("name", ""))) + _json_len(block.get("arguments", block.get("input")))
                else:
                    chars += _json_len(block)
    elif content is not None:
        chars += len(str(content))
    if message.tool_calls:
        chars += _json_len(message.tool_calls)
    return math.ceil(chars / 4) + MESSAGE_OVERHEAD + images * IMAGE_TOKENS


def _json_len(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value)
    try:
        return len(json.dumps(value, ensure_ascii=False, default=str))
    except (TypeError, ValueError):
        return len(str(value))


def summary_message(summary: str) -> Message:
    """The user message that stands for a compaction summary."""
    return Message(role="user", content=COMPACTION_PREFIX + summary + COMPACTION_SUFFIX)


def is_tool_result(m: Message) -> bool:
    """Whether a message carries a tool's output (OpenAI ``tool``, Pi ``toolResult``, ...)."""
    return m.role in _TOOL_ROLES or m.tool_call_id is not None or "toolCallId" in m.extra


def calls_tools(m: Message) -> bool:
    """Whether a message asks for tool calls (a ``tool_calls`` field or call blocks)."""
    if m.tool_calls:
        return True
    if isinstance(m.content, list):
        return any(isinstance(b, dict) and b.get("type") in _CALL_BLOCKS for b in m.content)
    return False


def keep_start(entries: Sequence[LogEntry], i: int) -> int:
    """Where a context that keeps ``entries[i:]`` must start so it has no orphan tool result.

    When the first message at or after ``i`` is a tool result, this is the index of the
    message that called the tool (found by walking back over tool results and entries
    that contribute no message), so that the call and its results stay together; else ``i``
    (also when no call precedes the result: then the history itself has the orphan).

    Raises:
        IndexError: ``i`` is not an index of ``entries``.
    """
    if not 0 <= i < len(entries):
        raise IndexError(f"entry index {i} is out of range (0..{len(entries) - 1})")
    j = i
    while j < len(entries) and message_of(entries[j].entry) is None:
        j += 1
    first = message_of(entries[j].entry) if j < len(entries) else None
    if first is None or not is_tool_result(first):
        return i
    for k in range(j - 1, -1, -1):
        m = message_of(entries[k].entry)
        if m is None or is_tool_result(m):
            continue
        return k if calls_tools(m) else i
    return i


def _check_budget(name: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidEntry(f"{name} must be an int or None, got {value!r}")
    if value < 0:
        raise InvalidEntry(f"{name} must be >= 0, got {value}")


def project(
    entries: Sequence[LogEntry],
    max_tokens: int | None = None,
    max_messages: int | None = None,
    tool_output_limit: int | None = None,
    token_counter: TokenCounter | None = None,
) -> Context:
    """Project a path of entries into the context to send to a model (see the module doc).

    Args:
        entries: the entries of one path, oldest first.
        max_tokens: drop the oldest units until the context fits (None: no limit).
        max_messages: drop the oldest units until at most this many messages remain.
        tool_output_limit: replace tool outputs over this many tokens by a placeholder.
        token_counter: counts a message's tokens (default :func:`estimate_tokens`).

    Returns:
        The :class:`Context`.

    Raises:
        InvalidEntry: (a ``ValueError``) a budget or limit is negative or not an int.
    """
    _check_budget("max_tokens", max_tokens)
    _check_budget("max_messages", max_messages)
    _check_budget("tool_output_limit", tool_output_limit)
    count = token_counter or estimate_tokens

    (model, provider, thinking), last_compaction = settings_and_compaction(entries)

    msgs: list[Message] = []
    commits: list[str] = []
    parts: list[str | None] = []

    def emit(le: LogEntry) -> None:
        m = message_of(le.entry)
        if m is not None:
            msgs.append(m)
            commits.append(le.id)
            parts.append(part_of(le))

    if last_compaction >= 0:
        comp = entries[last_compaction]
        assert isinstance(comp.entry, Compaction)
        msgs.append(summary_message(comp.entry.summary))
        commits.append(comp.id)
        parts.append(None)
        keeping = False
        for le in entries[:last_compaction]:
            keeping = keeping or le.id == comp.entry.first_kept
            if keeping:
                emit(le)
        for le in entries[last_compaction + 1 :]:
            emit(le)
    else:
        for le in entries:
            emit(le)

    if tool_output_limit is not None:
        msgs = [_limited(m, c, tool_output_limit, count) for m, c in zip(msgs, commits, strict=True)]

    sizes = [count(m) for m in msgs]
    kept = _trim(msgs, sizes, max_tokens, max_messages)
    out_msgs, out_commits = _whole([msgs[i] for i in kept], [commits[i] for i in kept], [parts[i] for i in kept])
    return Context(
        messages=out_msgs,
        commits=out_commits,
        tokens=sum(sizes[i] for i in kept),
        model=model,
        provider=provider,
        thinking_level=thinking,
        dropped=len(msgs) - len(kept),
    )


#: reads the entries at depths ``lo..hi`` of a path (both included), oldest first
EntryReader = Callable[[int, int], Sequence[LogEntry]]


def project_from_tip(
    facts: PathFacts,
    read: EntryReader,
    max_tokens: int | None = None,
    max_messages: int | None = None,
    tool_output_limit: int | None = None,
    token_counter: TokenCounter | None = None,
) -> Context | None:
    """:func:`project` of a whole path, reading it from the tip backwards until the budget is full.

    ``facts`` describe the path (its tip is at ``facts.depth``) and ``read`` returns its
    entries by depth. Besides the newest messages, only the units (rule 5) a budget never
    drops are read, wherever they are. The result equals :func:`project` of every entry.

    Returns:
        The :class:`Context`, or None without a budget (the whole path is needed then).

    Raises:
        InvalidEntry: a budget or limit is negative or not an int.
    """
    _check_budget("max_tokens", max_tokens)
    _check_budget("max_messages", max_messages)
    _check_budget("tool_output_limit", tool_output_limit)
    if max_tokens is None and max_messages is None:
        return None
    return _FromTip(facts, read, max_tokens, max_messages, tool_output_limit,
                    token_counter or estimate_tokens).run()


_Item = tuple[Message, str, int, str | None]  # a message, its commit, its size, what it is a part of
_BLOCK = 64


class _FromTip:
    """One run of :func:`project_from_tip`. Positions are depths; the compaction summary,
    first of all messages, is at position -1."""

    def __init__(self, facts: PathFacts, read: EntryReader, max_tokens: int | None, max_messages: int | None,
                 limit: int | None, count: TokenCounter) -> None:
        self.facts, self.read = facts, read
        self.max_tokens, self.max_messages, self.limit, self.count = max_tokens, max_messages, limit, count
        self.entries: dict[int, LogEntry] = {}
        self.items: dict[int, _Item | None] = {}
        self.low = facts.depth + 1  # entries at depths low..tip are read
        self._first: int | None = None

    def fits(self, tokens: int, n: int) -> bool:
        return (self.max_tokens is None or tokens <= self.max_tokens) and \
            (self.max_messages is None or n <= self.max_messages)

    def load(self, d: int) -> None:
        """Read the entry at depth ``d``: next to what was read from the tip, the sweep goes
        on (at least as far again: few, growing reads); further down, its block alone."""
        if d in self.entries:
            return
        if d >= self.low - _BLOCK:
            lo = max(self.facts.start, min(d, self.low - max(_BLOCK, self.facts.depth + 1 - self.low)))
            hi, self.low = self.low - 1, lo
        else:
            lo = max(self.facts.start, d - d % _BLOCK)
            hi = min(lo + _BLOCK - 1, self.low - 1)
        for le in self.read(lo, hi):
            self.entries.setdefault(le.depth, le)

    def item(self, pos: int) -> _Item | None:
        if pos in self.items:
            return self.items[pos]
        if pos < 0:
            self.load(self.facts.compaction)
            comp = self.entries[self.facts.compaction]
            assert isinstance(comp.entry, Compaction)
            m: Message | None = summary_message(comp.entry.summary)
            cid, part = comp.id, None
        else:
            self.load(pos)
            le = self.entries[pos]
            m, cid, part = message_of(le.entry), le.id, part_of(le)
        out = None
        if m is not None:
            m = _limited(m, cid, self.limit, self.count)
            out = (m, cid, self.count(m), part)
        self.items[pos] = out
        return out

    def first(self) -> int:
        """The position of the first message of all."""
        if self._first is None:
            pos = -1 if self.facts.compaction >= 0 else self.facts.start
            while self.item(pos) is None:
                pos += 1
            self._first = pos
        return self._first

    def is_head(self, pos: int) -> bool:
        """Whether the message at ``pos`` starts a unit."""
        it = self.item(pos)
        return it is not None and (not is_tool_result(it[0]) or pos == self.first())

    def unit(self, pos: int, below: int) -> list[int]:
        """The positions of the unit holding the message at ``pos`` (all before ``below``)."""
        head = pos
        while not self.is_head(head):
            head = head - 1 if head > self.facts.start else -1
        out = [head]
        nxt = max(head + 1, self.facts.start)
        while nxt < below and (self.item(nxt) is None or not self.is_head(nxt)):
            if self.item(nxt) is not None:
                out.append(nxt)
            nxt += 1
        return out

    def run(self) -> Context:
        f = self.facts
        pinned = [*f.system]
        if f.user >= 0:
            pinned.append(f.user)
        elif f.compaction >= 0:
            pinned.append(-1)
        tokens = n = 0  # of the units from the candidate head to the tip
        seen: list[int] = []  # positions of the messages met, newest first
        pos, floor = f.depth, (-1 if f.compaction >= 0 else f.start)
        while pos >= floor:
            if pos >= 0 and (pos < f.start or len(seen) == f.messages + (f.compaction >= 0)):
                # every message of the path is met: the summary is what is left
                if f.compaction < 0 or seen[-1:] == [-1]:
                    break
                pos = -1
            it = self.item(pos)
            if it is not None:
                seen.append(pos)
                if len(seen) == f.messages + (f.compaction >= 0) and self._first is None:
                    self._first = pos if f.compaction < 0 else -1
                tokens, n = tokens + it[2], n + 1
                if self.is_head(pos):
                    before = sorted({q for p in pinned if p < pos for q in self.unit(p, pos)})
                    sizes = [self.items[q][2] for q in before]  # type: ignore[index]
                    if not self.fits(tokens + sum(sizes), n + len(before)):
                        return self.result([*before, *(q for q in reversed(seen) if q >= pos)])
            pos -= 1
        return self.result(reversed(seen))

    def result(self, positions: Iterable[int]) -> Context:
        got = [it for p in positions if (it := self.item(p)) is not None]
        msgs, sizes = [it[0] for it in got], [it[2] for it in got]
        kept = _trim(msgs, sizes, self.max_tokens, self.max_messages)
        f = self.facts
        out_msgs, out_commits = _whole([msgs[i] for i in kept], [got[i][1] for i in kept], [got[i][3] for i in kept])
        return Context(
            messages=out_msgs,
            commits=out_commits,
            tokens=sum(sizes[i] for i in kept),
            model=f.model, provider=f.provider, thinking_level=f.thinking_level,
            dropped=f.messages + (f.compaction >= 0) - len(kept),
        )


def part_of(le: LogEntry) -> str | None:
    """The recorded message an imported entry is a part of (rule 6: ``<importer>:<id>``), or None."""
    entry = le.entry
    if isinstance(entry, Event) and entry.message is not None:
        for key in PART_KEYS:
            said = entry.meta.get(key)
            if isinstance(said, dict) and isinstance(said.get("id"), str):
                return f"{key}:{said['id']}"
    return None


def _whole(msgs: list[Message], commits: list[str], parts: list[str | None]) -> tuple[list[Message], list[str]]:
    """Rule 6: the parts of each recorded message joined, sent as a model turn and then a
    turn of its calls' results; other messages as they are."""
    out: list[Message] = []
    out_commits: list[str] = []
    i = 0
    while i < len(msgs):
        j = i + 1
        if parts[i] is None:
            out.append(msgs[i])
            out_commits.append(commits[i])
            i = j
            continue
        while j < len(msgs) and parts[j] == parts[i]:
            j += 1
        said: list[Any] = []
        results: list[Any] = []
        result_commit = None
        for m, c in zip(msgs[i:j], commits[i:j], strict=True):
            for b in m.content if isinstance(m.content, list) else [{"type": "text", "text": m.content}]:
                if isinstance(b, dict) and b.get("type") in _RESULT_BLOCKS:
                    results.append(b)
                    result_commit = result_commit or c
                else:
                    said.append(b)
        role = next((m.role for m in msgs[i:j] if m.role != "tool"), "assistant")
        if role in SYSTEM_ROLES or (role == "user" and _command(said)):
            i = j  # gemini-cli sends neither its notices nor a command's prompt
            continue
        if said or not results:
            out.append(msgs[i] if j == i + 1 and not results else Message(role, said))
            out_commits.append(commits[i])
        if results:
            assert result_commit is not None
            out.append(Message("tool", results))
            out_commits.append(result_commit)
        i = j
    return out, out_commits


def _command(blocks: list[Any]) -> bool:
    """Whether a prompt's text starts with ``/`` or ``?`` (gemini-cli's test of a command)."""
    text = "".join(b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str))
    return text.strip().startswith(("/", "?"))


def _limited(m: Message, commit: str, limit: int | None, count: TokenCounter) -> Message:
    """``m``, or its placeholder when it is a tool output over ``limit`` tokens (rule 4)."""
    if limit is not None and is_tool_result(m):
        n = count(m)
        if n > limit:
            return _placeholder(m, commit, n)
    return m


def _placeholder(m: Message, commit: str, tokens: int) -> Message:
    text = f"[tool output omitted: about {tokens} tokens; the full output is in commit {commit}]"
    content: Any = [{"type": "text", "text": text}] if isinstance(m.content, list) else text
    return Message(role=m.role, content=content, tool_calls=m.tool_calls, tool_call_id=m.tool_call_id,
                   name=m.name, extra=dict(m.extra))


def _trim(msgs: list[Message], sizes: list[int], max_tokens: int | None, max_messages: int | None) -> list[int]:
    """Indices of the messages kept by the budget, in order."""
    n = len(msgs)
    if (max_tokens is None or sum(sizes) <= max_tokens) and (max_messages is None or n <= max_messages):
        return list(range(n))
    # Units: a message plus the tool results that follow it (an assistant that calls tools and
    # its results), so dropping whole units never leaves a result first without its call.
    units: list[list[int]] = []
    for i in range(n):
        if units and is_tool_result(msgs[i]):
            units[-1].append(i)
        else:
            units.append([i])
    last_user = max((j for j, m in enumerate(msgs) if m.role == "user"), default=-1)
    pinned = [any(msgs[j].role in SYSTEM_ROLES or j == last_user for j in u) for u in units]
    tokens, count = sum(sizes), n
    dropped: set[int] = set()
    for ui, unit in enumerate(units):
        if (max_tokens is None or tokens <= max_tokens) and (max_messages is None or count <= max_messages):
            break
        if pinned[ui]:
            continue
        dropped.add(ui)
        tokens -= sum(sizes[j] for j in unit)
        count -= len(unit)
    return [j for ui, u in enumerate(units) if ui not in dropped for j in u]


__all__ = [
    "Context",
    "project",
    "estimate_tokens",
    "summary_message",
    "branch_summary_message",
    "is_tool_result",
    "calls_tools",
    "keep_start",
    "PathFacts",
    "facts_of",
    "project_from_tip",
    "part_of",
    "PART_KEYS",
    "MESSAGE_OVERHEAD",
    "IMAGE_TOKENS",
    "BRANCH_PREFIX",
    "BRANCH_SUFFIX",
    "MAX_FACT_NAME",
    "MAX_FACT_SYSTEMS",
]
