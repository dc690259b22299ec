"""What a budgeted context needs to know about a whole path, kept at its tip.

The rules that decide it are the context's (:mod:`castore.context`): which entries give a
message (rule 3), which settings are in force (rule 1), which messages a budget never
drops (rule 5). They live here, below the history, because the writer keeps these facts in
the ref's read hint at every append (:meth:`castore.history.History.advance`), and a writer
must not load the projection itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .entries import BranchSummary, Compaction, Event, LogEntry, Message, ModelChange

BRANCH_PREFIX = "The following is a summary of a branch that this conversation came back from:\n\n<summary>\n"
BRANCH_SUFFIX = "</summary>"
SYSTEM_ROLES = frozenset({"system", "developer"})


def branch_summary_message(summary: str) -> Message:
    """The user message that stands for a branch summary."""
    return Message(role="user", content=BRANCH_PREFIX + summary + BRANCH_SUFFIX)


Settings = tuple[str | None, str | None, str | None]  # model, provider, thinking level


def settings_after(settings: Settings, e: Any) -> Settings:
    """The model settings after entry ``e`` (rule 1)."""
    if isinstance(e, ModelChange):
        model, provider, thinking = settings
        if e.model is not None:
            model, provider = e.model, e.provider
        if e.thinking_level is not None:
            thinking = e.thinking_level
        return model, provider, thinking
    if isinstance(e, Message) and e.role == "assistant" and isinstance(e.extra.get("model"), str):
        p = e.extra.get("provider")
        return e.extra["model"], p if isinstance(p, str) else None, settings[2]
    return settings


def message_of(entry: Any) -> Message | None:
    """The message an entry contributes to a context, if any (see rule 3)."""
    if isinstance(entry, Message):
        return entry
    if isinstance(entry, Event):
        return entry.message
    if isinstance(entry, BranchSummary) and entry.summary:
        return branch_summary_message(entry.summary)
    return None


_new = object.__new__

#: at most this many system messages are tracked in :class:`PathFacts` (more: no facts)
MAX_FACT_SYSTEMS = 32
#: model, provider or thinking names longer than this are not kept in ref metadata
MAX_FACT_NAME = 200


@dataclass(frozen=True)
class PathFacts:
    """What a budgeted context needs to know about a whole path, kept up to date at its tip.

    A budget keeps the newest messages, but three things can lie anywhere below them: the
    settings in force (rule 1), the messages a budget never drops (system messages and the
    latest user message, rule 5) and how many messages there are (for ``dropped``). With
    these facts, :func:`project_from_tip` reads a path from its tip backwards only until
    the budget is full, and returns exactly what :func:`project` returns for the whole path.

    Attributes:
        depth: the depth of the tip described (-1: the empty path).
        start: the depth where the messages begin (0, or the first entry kept by the latest
            compaction).
        compaction: the depth of the latest compaction (-1: none).
        messages: how many entries at ``start`` or later contribute a message.
        system: the depths of those whose message has a system or developer role.
        user: the depth of the latest of those whose message has the user role (-1: none).
        model, provider, thinking_level: the settings in force at the tip.
    """

    depth: int = -1
    start: int = 0
    compaction: int = -1
    messages: int = 0
    system: tuple[int, ...] = ()
    user: int = -1
    model: str | None = None
    provider: str | None = None
    thinking_level: str | None = None

    def after(self, entry: Any, depth: int) -> PathFacts | None:
        """The facts once ``entry`` is appended at ``depth`` (the next depth); None when
        they cannot be known without reading (a compaction, too many system messages)."""
        if depth != self.depth + 1 or isinstance(entry, Compaction):
            return None
        model, provider, thinking = settings_after((self.model, self.provider, self.thinking_level), entry)
        m = message_of(entry)
        messages, system, user = self.messages, self.system, self.user
        if m is not None:
            messages += 1
            if m.role in SYSTEM_ROLES:
                system = (*system, depth)
                if len(system) > MAX_FACT_SYSTEMS:
                    return None
            elif m.role == "user":
                user = depth
        # made as __init__ would (frozen: no setattr), once per appended commit
        out = _new(PathFacts)
        out.__dict__.update(depth=depth, start=self.start, compaction=self.compaction, messages=messages,
                            system=system, user=user, model=model, provider=provider, thinking_level=thinking)
        return out

    def to_meta(self) -> dict[str, Any] | None:
        """The facts as ref metadata (only those of a path with no compaction); None when
        they do not fit there."""
        if self.compaction >= 0 or self.start:
            return None
        names = (self.model, self.provider, self.thinking_level)
        if any(n is not None and len(n) > MAX_FACT_NAME for n in names):
            return None
        d: dict[str, Any] = {"d": self.depth, "n": self.messages, "s": list(self.system), "u": self.user}
        for key, n in zip(("m", "p", "t"), names, strict=True):
            if n is not None:
                d[key] = n
        return d

    @classmethod
    def from_meta(cls, meta: Any) -> PathFacts | None:
        """Facts read back from ref metadata; None when absent or malformed."""
        if not isinstance(meta, dict):
            return None
        d, n, s, u = meta.get("d"), meta.get("n"), meta.get("s"), meta.get("u")
        ints = [d, n, u, *(s if isinstance(s, list) else [None])]
        if not all(type(x) is int for x in ints) or not isinstance(s, list) or len(s) > MAX_FACT_SYSTEMS:
            return None
        assert isinstance(d, int) and isinstance(n, int) and isinstance(u, int)
        names = [meta.get(k) for k in ("m", "p", "t")]
        if not all(x is None or isinstance(x, str) for x in names):
            return None
        if d < -1 or not 0 <= n <= d + 1 or not -1 <= u <= d or any(not 0 <= x <= d for x in s) \
                or s != sorted(set(s)):
            return None
        return cls(d, 0, -1, n, tuple(s), u, *names)


def settings_and_compaction(entries: Sequence[LogEntry]) -> tuple[Settings, int]:
    """The settings in force after ``entries`` (rule 1) and the index of the latest
    compaction among them (-1: none)."""
    settings: Settings = (None, None, None)
    last_compaction = -1
    for i, le in enumerate(entries):
        settings = settings_after(settings, le.entry)
        if isinstance(le.entry, Compaction):
            last_compaction = i
    return settings, last_compaction


def facts_of(entries: Sequence[LogEntry]) -> PathFacts:
    """The :class:`PathFacts` of a whole path (its entries, oldest first, depths 0, 1, ...)."""
    settings, last_compaction = settings_and_compaction(entries)
    start = 0
    if last_compaction >= 0:
        comp = entries[last_compaction].entry
        assert isinstance(comp, Compaction)
        start = next((i for i in range(last_compaction) if entries[i].id == comp.first_kept), last_compaction)
    messages, system, user = 0, [], -1
    for i in range(start, len(entries)):
        m = message_of(entries[i].entry)
        if m is None:
            continue
        messages += 1
        if m.role in SYSTEM_ROLES:
            system.append(i)
        elif m.role == "user":
            user = i
    return PathFacts(len(entries) - 1, start, last_compaction, messages, tuple(system), user, *settings)


__all__ = ["PathFacts", "facts_of", "settings_and_compaction", "message_of", "settings_after",
           "branch_summary_message", "SYSTEM_ROLES", "BRANCH_PREFIX", "BRANCH_SUFFIX", "MAX_FACT_SYSTEMS",
           "MAX_FACT_NAME"]
