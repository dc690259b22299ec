"""Search every session and branch of a store: :func:`grep`.

What is searched is the text of each entry's body, block by block, each block with a kind:

=============== ==========================================================================
``text``        message text (Anthropic ``text``, OpenAI ``input_text``/``output_text``,
                a string content), compaction and branch summaries
``thinking``    reasoning the model showed (``thinking`` blocks, reasoning summaries)
``tool_call``   a tool call: its name and arguments (``tool_use``, ``toolCall``,
                ``function_call``, OpenAI ``tool_calls``)
``tool_result`` what a tool returned (``tool_result`` blocks, ``role: tool``/``toolResult``
                messages, ``function_call_output``); searched only when asked for
=============== ==========================================================================

Encrypted reasoning, signatures and image data are never searched (they are not text).
``typed=True`` (``--typed``) keeps only what a human typed or the agent wrote
(:func:`typed_block`): entries whose metadata says ``injected`` (what an archive importer saw
the agent's program write into the conversation) are left out, with tool results and
system messages.

Three ways give the same matches. By default (every store but ``memory://``) the search runs
over the local index of :mod:`castore.grepindex`, first brought up to date: on local disk the
store's swap log says which refs moved since the index last looked (nothing moved: one
``stat`` and no ref read), and only those sessions are read again.

Without the index (``index=False``, ``--no-index``), a format-2 store is *scanned*: every
stored object is read once, store-wide (loose objects, then each pack read whole, record by
record: one zstd frame decompressed once). A record is searched, as bytes, for a *needle*
(:func:`needle`: the pattern's required literal, where the stored bytes of every matching
body must hold it; without one every object is decoded), and only the objects holding it are
decoded; the commits naming a body that may match are found in the same records (the bytes
in front of a commit's body id). Only then are those commits attributed: each session's
branches are read (one batch), each branch's top block from its commits (handed to the object
store by the scan as it read them: no commit is read twice), the blocks below by intersecting
the matching commits' bytes with the branch's segments (read once, in one batch). Role, kind,
tool and time filters are applied there; a tool result whose call is in an earlier commit is
named from its session's earlier calls. A format-1 store (one file per object) is *walked*
instead (``scan=False`` forces it): each session's refs, the commits of every branch path,
the bodies in batches, each body once.

Either way a commit shared by several branches, or by a fork and its parent session, is
read and reported once, naming every branch that holds it. Matches come in session order (by
app, user, session id), root to tip within a session; a commit several sessions share is
reported with the first of them (the others under ``also``).

The JSON form of a :class:`Match` (:meth:`Match.to_json`) is a stable schema::

    {"commit": ID, "session": "APP/USER/SESSION", "branches": [NAME, ...],
     "also": [{"session": "APP/USER/SESSION", "branches": [NAME, ...]}, ...],
     "role": ROLE, "kind": "text|thinking|tool_call|tool_result", "tool": NAME|null,
     "time": "YYYY-MM-DDTHH:MM:SS.mmmZ"|null,
     "lines": [{"line": N, "text": LINE, "spans": [[START, END], ...]}, ...],
     "context": {"before": [ENTRY, ...], "after": [ENTRY, ...]}}   (only with context > 0)

where ``line`` counts from 1 within the block, spans are character offsets in ``text``, and
a context ENTRY is ``{"commit": ID, "role": ROLE, "text": TEXT}``. A session that is
detached shows its HEAD as the branch ``HEAD``.

:func:`grep_rows` gives the same matches as tuples (:data:`Row`) and :func:`grep_counts` their
number per session: through the index neither builds a :class:`Match` (what ``castore grep``
prints, ``-c`` and ``-l`` use them), and a count does not even decode a block a plain string
was found in when the block is ASCII.
"""

from __future__ import annotations

import bisect
import fnmatch
import functools
import itertools
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from . import objects as o
from . import packs
from .errors import CastoreError
from .objects import Commit, Index, Segment, Value
from .objectstore import gc_paused

if TYPE_CHECKING:
    from .store import Store

KINDS = ("text", "thinking", "tool_call", "tool_result")
#: kinds searched unless told otherwise: tool results are most of the text, and rarely wanted
DEFAULT_KINDS = ("text", "thinking", "tool_call")
_BATCH = 256
_TOOL_ROLES = ("tool", "toolResult", "function", "tool_result")


class GrepError(CastoreError, ValueError):
    """A search cannot run: a bad pattern or filter."""


@dataclass(frozen=True)
class LineMatch:
    """One matching line of a block: its 1-based number, its text and the match spans."""

    line: int
    text: str
    spans: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Match:
    """One block of one commit that matched (see the module docstring for its JSON form)."""

    commit: str
    session: tuple[str, str, str]
    branches: tuple[str, ...]
    role: str
    kind: str
    tool: str | None
    time: float | None
    lines: tuple[LineMatch, ...]
    also: tuple[tuple[tuple[str, str, str], tuple[str, ...]], ...] = ()
    before: tuple[tuple[str, str, str], ...] = ()
    after: tuple[tuple[str, str, str], ...] = ()
    context: int = 0

    def to_json(self) -> dict[str, Any]:
        """The match as the stable JSON document of the module docstring."""
        d: dict[str, Any] = {
            "commit": self.commit,
            "session": _key(self.session),
            "branches": list(self.branches),
            "also": [{"session": _key(k), "branches": list(b)} for k, b in self.also],
            "role": self.role,
            "kind": self.kind,
            "tool": self.tool,
            "time": _iso(self.time),
            "lines": [{"line": lm.line, "text": lm.text, "spans": [list(s) for s in lm.spans]} for lm in self.lines],
        }
        if self.context:
            d["context"] = {
                "before": [{"commit": c, "role": r, "text": t} for c, r, t in self.before],
                "after": [{"commit": c, "role": r, "text": t} for c, r, t in self.after],
            }
        return d


def _key(k: tuple[str, str, str]) -> str:
    return "/".join(p.replace("/", "%2F") for p in k)


def iso_time(t: float | None) -> str | None:
    """``t`` (seconds since the epoch) as a match's JSON ``time``: ``YYYY-MM-DDTHH:MM:SS.mmmZ``
    (None for None).

    Raises:
        OverflowError, ValueError, OSError: ``t`` is out of the range of dates.
    """
    if t is None:
        return None
    if 0.0 <= t < _ISO_FAST_END:
        # datetime.fromtimestamp's own arithmetic (microseconds rounded half to even, a carry
        # into the seconds), the text up to the minute made once per minute: a search prints
        # tens of thousands of times
        sec = int(t)
        frac = t - sec  # exact, as math.modf
        if frac >= 0.9999994 and round(frac * 1e6) >= 1_000_000:
            sec += 1
        minute = _ISO_MINUTES.get(sec // 60)
        if minute is None:
            if len(_ISO_MINUTES) >= 1 << 16:
                _ISO_MINUTES.clear()
            minute = _ISO_MINUTES[sec // 60] = datetime.fromtimestamp(sec // 60 * 60, UTC).isoformat()[:17]
        return minute + _ISO_SECONDS[sec % 60] + _ISO_MILLIS[int(t * 1000) % 1000]
    return _iso_by_datetime(t)


#: the times :func:`iso_time` formats by arithmetic (from the epoch to the end of year 9998)
_ISO_FAST_END = 253370764800.0
_ISO_MINUTES: dict[int, str] = {}
_ISO_SECONDS = [f"{n:02d}." for n in range(60)]
_ISO_MILLIS = [f"{n:03d}Z" for n in range(1000)]


def _iso_by_datetime(t: float) -> str:
    """:func:`iso_time` through :mod:`datetime` (any time it can represent)."""
    d = datetime.fromtimestamp(t, UTC)
    # isoformat is faster than strftime, and the same from year 1000 on (%Y does not pad)
    head = d.isoformat(timespec="seconds")[:19] + "." if d.year >= 1000 else d.strftime("%Y-%m-%dT%H:%M:%S.")
    return f"{head}{int(t * 1000) % 1000:03d}Z"


_iso = iso_time


def compile_pattern(pattern: str, *, ignore_case: bool | None = None, fixed: bool = False,
                    word: bool = False) -> re.Pattern[str]:
    """The regex :func:`grep` uses: smart case unless ``ignore_case`` is given.

    Raises:
        GrepError: not a valid regular expression, or empty.
    """
    if not isinstance(pattern, str) or pattern == "":
        raise GrepError("the pattern must be a non-empty string")
    src = re.escape(pattern) if fixed else pattern
    if word:
        src = rf"\b(?:{src})\b"
    if ignore_case is None:
        ignore_case = not any(ch.isupper() for ch in pattern)
    try:
        return re.compile(src, re.IGNORECASE if ignore_case else 0)
    except re.error as e:
        raise GrepError(f"bad regular expression {pattern!r}: {e}") from e


# -- what a body holds -------------------------------------------------------------------------
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
    is_result = role in _TOOL_ROLES
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


# -- the walk ----------------------------------------------------------------------------------
def _glob_any(value: str | None, globs: tuple[str, ...] | None) -> bool:
    if not globs:
        return True
    return value is not None and any(fnmatch.fnmatchcase(value, g) for g in globs)


def _time_of(c: Commit) -> float:
    t = c.meta.get("time") if isinstance(c.meta, dict) else None
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else c.time


#: what :func:`_grep_index` gives: Match objects, rows (:data:`Row`), or a count per session
_MATCHES, _ROWS, _COUNTS = 0, 1, 2

#: a match as :func:`grep_rows` gives it: the fields of a :class:`Match` in their order, each
#: line a ``(line, text, spans)`` tuple
Row = tuple[str, tuple[str, str, str], tuple[str, ...], str, str, str | None, float | None,
            tuple[tuple[int, str, tuple[tuple[int, int], ...]], ...],
            tuple[tuple[tuple[str, str, str], tuple[str, ...]], ...], tuple[tuple[str, str, str], ...],
            tuple[tuple[str, str, str], ...], int]


def _options(pattern: str, *, ignore_case: bool | None = None, fixed: bool = False, word: bool = False,
             roles: Iterable[str] | None = None, kinds: Iterable[str] | None = None,
             tools: Iterable[str] | None = None, sessions: Iterable[str] | None = None,
             apps: Iterable[str] | None = None, since: float | None = None, until: float | None = None,
             limit: int | None = None, context: int = 0) -> tuple[Any, ...]:
    """:func:`grep`'s options checked: ``(rx, kinds, roles, session globs, app globs, keep_block,
    keep, filtered)``; ``filtered``: a role, tool, session or app filter is given.

    Raises:
        GrepError: a bad pattern, kind, limit or context.
    """
    rx = compile_pattern(pattern, ignore_case=ignore_case, fixed=fixed, word=word)
    want_kinds = set(kinds) if kinds else set(DEFAULT_KINDS)
    tool_globs = tuple(tools) if tools else None
    if tool_globs and not kinds:
        want_kinds = {"tool_call", "tool_result"}
    bad = want_kinds - set(KINDS)
    if bad:
        raise GrepError(f"unknown kind(s) {sorted(bad)}: use {', '.join(KINDS)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise GrepError(f"limit must be a whole number >= 0, not {limit!r}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise GrepError(f"context must be a whole number >= 0, not {context!r}")
    role_set = set(roles) if roles else None
    if role_set and "tool" in role_set:
        role_set |= set(_TOOL_ROLES)
    session_globs = tuple(sessions) if sessions else None
    app_globs = tuple(apps) if apps else None

    def keep_block(key: tuple[str, str, str], role: str, bkind: str, tool: str | None) -> bool:
        if bkind not in want_kinds or (role_set is not None and role not in role_set):
            return False
        if tool_globs is not None and not _glob_any(tool, tool_globs):
            return False
        return _session_ok(key, session_globs, app_globs)

    def keep(key: tuple[str, str, str], role: str, bkind: str, tool: str | None, when: float) -> bool:
        if (since is not None and when < since) or (until is not None and when >= until):
            return False
        return keep_block(key, role, bkind, tool)

    filtered = role_set is not None or tool_globs is not None or session_globs is not None or app_globs is not None
    return rx, want_kinds, role_set, session_globs, app_globs, keep_block, keep, filtered


#: the options of :func:`grep` that choose how it searches, not what it finds
_HOW = ("index", "check_index", "scan", "typed")


def _by_index(store: Store, pattern: str, options: dict[str, Any], form: int) -> Iterator[Any] | None:
    """The rows or counts of ``grep(store, pattern, **options)`` straight from the index (no
    :class:`Match` built), or None when that search does not go through the index alone (no
    index, context entries, ``typed``)."""
    unknown = set(options) - set(_HOW) - {"ignore_case", "fixed", "word", "roles", "kinds", "tools", "sessions",
                                          "apps", "since", "until", "limit", "context"}
    if unknown:
        raise TypeError(f"unexpected option(s) {sorted(unknown)}")
    index = options.get("index")
    if index is None:
        index = not str(getattr(store.storage, "url", "")).startswith("memory://")
    if not index or options.get("context") or options.get("typed"):
        return None
    what = {k: v for k, v in options.items() if k not in _HOW}
    rx, want_kinds, _, _, _, keep_block, _, filtered = _options(pattern, **what)
    limit = what.get("limit")
    if limit == 0 or not store.exists:
        return iter(())
    return _grep_index(store, rx, keep_block if filtered else None, what.get("since"), what.get("until"), limit, 0,
                       want_kinds, options.get("check_index", True), form)


def _row(m: Match) -> Row:
    return (m.commit, m.session, m.branches, m.role, m.kind, m.tool, m.time,
            tuple((lm.line, lm.text, lm.spans) for lm in m.lines), m.also, m.before, m.after, m.context)


def grep_rows(store: Store, pattern: str, **options: Any) -> Iterator[Row]:
    """The matches of ``grep(store, pattern, **options)``, in the same order, as tuples
    (:data:`Row`: a :class:`Match`'s fields, each line as ``(line, text, spans)``): through the
    index no Match is built (what printing tens of thousands of matches wants).

    Raises:
        as :func:`grep`; TypeError: an option :func:`grep` does not take.
    """
    fast = _by_index(store, pattern, options, _ROWS)
    if fast is not None:
        yield from fast
        return
    for m in grep(store, pattern, **options):
        yield _row(m)


def grep_counts(store: Store, pattern: str, **options: Any) -> dict[tuple[str, str, str], int]:
    """How many matches ``grep(store, pattern, **options)`` gives per session (a match counts
    for its ``session``), in the order of each session's first match. Through the index no
    match is built, and a block found by a plain string is not even decoded when its text is
    ASCII (it holds the string, so it matches).

    Raises:
        as :func:`grep`; TypeError: an option :func:`grep` does not take.
    """
    fast = _by_index(store, pattern, options, _COUNTS)
    if fast is not None:
        return dict(fast)
    counts: dict[tuple[str, str, str], int] = {}
    for m in grep(store, pattern, **options):
        counts[m.session] = counts.get(m.session, 0) + 1
    return counts


def grep(store: Store, pattern: str, *, ignore_case: bool | None = None, fixed: bool = False, word: bool = False,
         roles: Iterable[str] | None = None, kinds: Iterable[str] | None = None,
         tools: Iterable[str] | None = None, sessions: Iterable[str] | None = None,
         apps: Iterable[str] | None = None, since: float | None = None, until: float | None = None,
         limit: int | None = None, context: int = 0, index: bool | None = None,
         check_index: bool = True, scan: bool | None = None, typed: bool = False) -> Iterator[Match]:
    """Search the text of every entry on every branch of every session of ``store``.

    Args:
        store: the store.
        pattern: a regular expression (Python syntax), or a fixed string with ``fixed``.
        ignore_case: True/False; None: smart case (insensitive unless the pattern has an
            upper-case letter).
        fixed: ``pattern`` is a plain string.
        word: match whole words only.
        roles: only blocks of messages with one of these roles (``tool`` also matches
            ``toolResult``).
        kinds: only these kinds (:data:`KINDS`; default :data:`DEFAULT_KINDS`). Asking for
            ``tool_result``, or naming ``tools``, adds tool results.
        tools: only tool calls and results of a tool whose name matches one of these globs.
        sessions: only sessions whose ``APP/USER/SESSION`` matches one of these globs (a glob
            without a ``/`` is matched against the session id alone).
        apps: only these apps (globs).
        since, until: only entries at or after / before these times (seconds since the epoch).
        limit: stop after this many matches.
        context: also give this many entries before and after each match on its branch.
        index: search through the local index (:mod:`castore.grepindex`, brought up to date
            first) rather than by reading every object; None: for every store but ``memory://``.
            Both give the same matches.
        check_index: bring the index up to date with the store's refs first (False: trust it
            as the last import or search left it, skipping even the swap log's ``stat``).
        scan: without the index, read every stored object once, store-wide, rather than
            walking each session's branches (None: for a format-2 store). Both give the same
            matches.
        typed: only what a human typed or the agent wrote (:func:`typed_block`): user text
            and assistant blocks of entries whose metadata does not flag them ``injected``
            (the archive importers flag what the agent's CLI wrote into the conversation).

    Yields:
        :class:`Match`, one per matching block, each commit once.

    Raises:
        GrepError: a bad pattern, kind or limit.
        IndexError_: the index folder cannot be written.
        StorageError, IntegrityError: the store cannot be read.
    """
    if typed:  # a filter on the matches: the inner search counts no limit it could not keep
        some = isinstance(limit, int) and not isinstance(limit, bool) and limit > 0
        inner = grep(store, pattern, ignore_case=ignore_case, fixed=fixed, word=word, roles=roles, kinds=kinds,
                     tools=tools, sessions=sessions, apps=apps, since=since, until=until, context=context,
                     index=index, check_index=check_index, scan=scan, limit=None if some else limit)
        yield from _only_typed(store, inner, limit)
        return
    rx, want_kinds, role_set, session_globs, app_globs, keep_block, keep, filtered = _options(
        pattern, ignore_case=ignore_case, fixed=fixed, word=word, roles=roles, kinds=kinds, tools=tools,
        sessions=sessions, apps=apps, since=since, until=until, limit=limit, context=context)
    tool_globs = tuple(tools) if tools else None
    if limit == 0 or not store.exists:
        return
    if index is None:
        index = not str(getattr(store.storage, "url", "")).startswith("memory://")

    if index:
        yield from _grep_index(store, rx, keep_block if filtered else None, since, until, limit, context, want_kinds,
                               check_index, _MATCHES)
        return
    if scan is None:
        scan = store.objects.format >= 2
    if scan:
        yield from _grep_scan(store, rx, keep, limit, context, want_kinds, role_set, since, until, app_globs,
                              session_globs)
        return
    # 1. sessions and the commits of each branch path (commits are small and packed)
    where: dict[str, list[tuple[tuple[str, str, str], str]]] = {}
    plans: list[tuple[tuple[str, str, str], list[tuple[str, Commit]], dict[str, list[str]]]] = []
    for app in sorted(store.apps()):
        if not _glob_any(app, app_globs):
            continue
        for si in sorted(store.sessions(app), key=lambda x: (x.user, x.session)):
            key = (si.app, si.user, si.session)
            if not _session_ok(key, session_globs, None):
                continue
            s = store.session(*key)
            tips = dict(s.branches())
            if s.current_branch is None and s.head is not None:
                tips["HEAD"] = s.head
            order: list[tuple[str, Commit]] = []
            paths: dict[str, list[str]] = {}
            local: set[str] = set()
            for bname, tip in tips.items():
                path = store.history.path(tip)
                paths[bname] = [cid for cid, _ in path]
                for cid, c in path:
                    refs = where.setdefault(cid, [])
                    refs.append((key, bname))
                    if cid not in local:
                        local.add(cid)
                        order.append((cid, c))
            order.sort(key=lambda x: x[1].depth)
            plans.append((key, order, paths))
    # 2. bodies, in batches, each once; report each commit once
    found = 0
    for key, order, paths in plans:
        calls: dict[str, str] = {}
        for cid, c, body in bodies_of(store, order):
            when = _time_of(c)
            # a commit shared with a session before is reported there (its tool calls still
            # name the tools of this session's results, as in the index)
            in_time = where[cid][0][0] == key and (since is None or when >= since) and (until is None or when < until)
            for role, bkind, tool, text in blocks(body, c.kind, calls):
                if not in_time or bkind not in want_kinds:
                    continue
                if role_set is not None and role not in role_set:
                    continue
                if tool_globs is not None and not _glob_any(tool, tool_globs):
                    continue
                if not text or rx.search(text) is None:
                    continue
                lines = _line_matches(rx, text)
                if not lines:
                    continue
                refs = where[cid]
                mine = tuple(b for k, b in refs if k == key)
                others: dict[tuple[str, str, str], list[str]] = {}
                for k, b in refs:
                    if k != key:
                        others.setdefault(k, []).append(b)
                before: tuple[tuple[str, str, str], ...] = ()
                after: tuple[tuple[str, str, str], ...] = ()
                if context:
                    before, after = _context(store, paths[mine[0]], cid, context)
                yield Match(cid, key, mine, role, bkind, tool, when, lines,
                            tuple((k, tuple(b)) for k, b in others.items()), before, after, context)
                found += 1
                if limit is not None and found >= limit:
                    return


#: the commit metadata key that marks an entry as written by the agent's program, not typed
#: by a human nor answered by the model (its value says what it is, e.g. ``environment_context``)
INJECTED = "injected"
_TYPED_ROLES = ("user", "assistant")


def typed_block(role: str, kind: str, meta: Any) -> bool:
    """Whether a block is what a human typed or the agent wrote (``grep(typed=True)``):
    user text, or any assistant block, of an entry whose ``meta`` has no :data:`INJECTED`."""
    if role not in _TYPED_ROLES or (role == "user" and kind != "text"):
        return False
    return not (isinstance(meta, dict) and meta.get(INJECTED))


def _only_typed(store: Store, matches: Iterator[Match], limit: int | None) -> Iterator[Match]:
    """The typed matches of ``matches`` (reading their commits' metadata in small batches),
    at most ``limit``."""
    n = 0
    batch: list[Match] = []
    pending = True
    while pending:
        m = next(matches, None)
        pending = m is not None
        if m is not None and m.role in _TYPED_ROLES:
            batch.append(m)
        if batch and (len(batch) >= 64 or not pending):
            commits = store.history.commits(list(dict.fromkeys(x.commit for x in batch)))
            for x in batch:
                c = commits.get(x.commit)
                if c is not None and typed_block(x.role, x.kind, c.meta):
                    yield x
                    n += 1
                    if limit is not None and n >= limit:
                        return
            batch = []


def bodies_of(store: Store, order: list[tuple[str, Commit]]) -> Iterator[tuple[str, Commit, Any]]:
    """Each commit of ``order`` that has a body, with the body's value (None when it is missing
    or not a value), reading the bodies in batches and each shared body once.

    Raises:
        IntegrityError, StorageError: reading a body failed.
    """
    for i in range(0, len(order), _BATCH):
        batch = order[i:i + _BATCH]
        body_ids = list(dict.fromkeys(o.hex_id(c.body) for _, c in batch if c.body is not None))
        bodies = store.objects.get_many(body_ids, missing_ok=True) if body_ids else {}
        for cid, c in batch:
            if c.body is not None:
                v = bodies.get(o.hex_id(c.body))
                yield cid, c, (v.value if isinstance(v, Value) else None)


def _session_ok(key: tuple[str, str, str], session_globs: tuple[str, ...] | None,
                app_globs: tuple[str, ...] | None) -> bool:
    if app_globs and not _glob_any(key[0], app_globs):
        return False
    return not session_globs or any(fnmatch.fnmatchcase(_key(key) if "/" in g else key[2], g) for g in session_globs)


_SYNTAX = frozenset("\\.^$*+?{}[]|()")


@functools.lru_cache(maxsize=16)
def _finder(rx: re.Pattern[str]) -> Callable[[str], list[tuple[int, int]]]:
    """The spans of ``rx``'s (non-empty) matches in a line. A pattern with no regex syntax is
    found with ``str.find``, case-insensitively in the lower-cased line when the line is ASCII
    (the same spans: ASCII case folding is one to one), as Python's case-insensitive search is
    many times slower; any other line or pattern goes through ``rx``."""
    def by_rx(line: str) -> list[tuple[int, int]]:
        return [s for m in rx.finditer(line) if (s := m.span())[1] > s[0]]

    p = rx.pattern
    if not p or rx.flags & re.VERBOSE or any(c in _SYNTAX for c in p):
        return by_rx
    folded = bool(rx.flags & re.IGNORECASE)
    if folded and not p.isascii():
        return by_rx
    lit, n = (p.lower() if folded else p), len(p)

    def by_find(line: str) -> list[tuple[int, int]]:
        if folded:
            if not line.isascii():
                return by_rx(line)
            line = line.lower()
        out, at = [], line.find(lit)
        while at >= 0:
            out.append((at, at + n))
            at = line.find(lit, at + n)
        return out

    return by_find


def _line_matches(rx: re.Pattern[str], text: str,
                  spans_of: Callable[[str], list[tuple[int, int]]] | None = None) -> tuple[LineMatch, ...]:
    if spans_of is None:
        spans_of = _finder(rx)
    if "\n" not in text:  # one line (most blocks): no split
        spans = tuple(spans_of(text))
        return (_line_match(1, text, spans),) if spans else ()
    lines = []
    for n, line in enumerate(text.split("\n"), 1):
        spans = tuple(spans_of(line))
        if spans:
            lines.append(_line_match(n, line, spans))
    return tuple(lines)


def _grep_index(store: Store, rx: re.Pattern[str], keep_block: Callable[..., bool] | None, since: float | None,
                until: float | None, limit: int | None, context: int, kinds: set[str], check: bool,
                form: int = _MATCHES) -> Iterator[Any]:
    """:func:`grep` through the index; ``keep_block`` None: no role, tool, session or app filter.
    ``form``: :data:`_MATCHES` gives :class:`Match` objects, :data:`_ROWS` rows (:data:`Row`; no
    context), :data:`_COUNTS` ``(session, matches)`` pairs in the order of the sessions' first
    match (the first ``limit`` matches counted)."""
    from .grepindex import open_index, search_plan

    ix = open_index(store, check=check)
    try:
        hits = ix.find_blocks(rx, kinds)
    except ValueError:  # a damaged index file: not trusted, built again from the store
        hits = ix.rebuild().find_blocks(rx, kinds)
    nsess = len(ix.sessions)
    keys = [ix.key(si) for si in range(nsess)]
    by_rank = sorted(range(nsess), key=keys.__getitem__)
    parts = {name: ix.part(name) for name in hits}
    # a block's place counts both parts in session-number order, root to tip; when the session
    # numbers are in session order (an index built at once) the places are the output order
    if by_rank == list(range(nsess)):
        if len(hits) == 1:
            runs = list(hits.items())
        else:
            placed = sorted((parts[name].rec[8 * i + 7], name, i) for name, idx in hits.items() for i in idx)
            runs = [(name, [i for _, _, i in g]) for name, g in itertools.groupby(placed, key=lambda x: x[1])]
    else:
        rank = [0] * nsess
        for r, si in enumerate(by_rank):
            rank[si] = r
        span = 1 + max((max(p.rec[7::8], default=0) for p in parts.values()), default=0)
        keyed = sorted((rank[parts[name].rec[8 * i + 1]] * span + parts[name].rec[8 * i + 7], name, i)
                       for name, idx in hits.items() for i in idx)
        runs = [(name, [i for _, _, i in g]) for name, g in itertools.groupby(keyed, key=lambda x: x[1])]
    strings, bsets, commits = ix.strings, ix.branch_sets, ix.commits
    kept: dict[tuple[int, int, int, int], bool] = {}  # the filters' answer per (session, role, kind, tool)
    finder = _finder(rx)
    # a commit's blocks are told apart by one integer, commit number << 31 | block (an int32 >= 0)
    timed = since is not None or until is not None
    lo = since if since is not None else float("-inf")
    hi = until if until is not None else float("inf")
    if form == _COUNTS:
        # a plain string with no newline that the index found in a block is on one of its lines:
        # the block matches without being looked at, when the search was case-sensitive or the
        # block is ASCII (its lowered text is then its text lower-cased, as the match looks at it)
        _, lowered, lit = search_plan(rx)
        sure = lit is not None and "\n" not in lit
        counts: dict[tuple[str, str, str], int] = {}
        seen: set[int] = set()
        n = 0
        for name, idx in runs:
            p = parts[name]
            rec, times, raw, bstarts, starts = p.rec, p.time, p.raw, p.bstarts, p.starts
            for i in idx:
                r = 8 * i
                cn, si, blk, kn, rn, tn, _, _ = rec[r:r + 8]
                if timed and (times[i] < lo or times[i] >= hi):
                    continue
                if keep_block is not None:
                    ok = kept.get((si, rn, kn, tn))
                    if ok is None:
                        ok = kept[(si, rn, kn, tn)] = keep_block(keys[si], strings[rn], KINDS[kn],
                                                                 strings[tn] if tn >= 0 else None)
                    if not ok:
                        continue
                b = cn << 31 | blk
                if b in seen:
                    continue
                if not (sure and (not lowered or bstarts[i + 1] - bstarts[i] == starts[i + 1] - starts[i])):
                    text = raw[bstarts[i]:bstarts[i + 1] - 1].decode("utf-8")
                    if not any(finder(line) for line in text.split("\n")):
                        continue
                seen.add(b)
                key = keys[si]
                counts[key] = counts.get(key, 0) + 1
                n += 1
                if limit is not None and n >= limit:
                    yield from counts.items()
                    return
        yield from counts.items()
        return
    rows = form == _ROWS
    firsts: dict[int, int] = {}  # commit and block -> position in found
    found: list[Any] = []
    also: dict[int, dict[tuple[str, str, str], tuple[str, ...]]] = {}  # position in found -> other sessions
    new, put = object.__new__, object.__setattr__
    # the matches are built before the first is given out: tens of thousands of objects that all
    # stay alive, each burst of them a walk of every live object by the cyclic collector, for nothing
    with gc_paused():
        for name, idx in runs:
            p = parts[name]
            rec, times = p.rec, p.time
            raw, bstarts = p.raw, p.bstarts
            for i in idx:
                r = 8 * i
                cn, si, blk, kn, rn, tn, bn, _ = rec[r:r + 8]
                when = times[i]
                if timed and (when < lo or when >= hi):
                    continue
                if keep_block is not None:
                    ok = kept.get((si, rn, kn, tn))
                    if ok is None:
                        ok = kept[(si, rn, kn, tn)] = keep_block(keys[si], strings[rn], KINDS[kn],
                                                                 strings[tn] if tn >= 0 else None)
                    if not ok:
                        continue
                key = keys[si]
                at = firsts.get(cn << 31 | blk)
                if at is not None:
                    if found[at][1] != key if rows else found[at].session != key:
                        also.setdefault(at, {}).setdefault(key, bsets[bn])
                    continue
                text = raw[bstarts[i]:bstarts[i + 1] - 1].decode("utf-8")
                if "\n" in text:
                    lines: tuple[Any, ...] = _line_tuples(text, finder)
                    if not lines:
                        continue
                    if not rows:
                        lines = tuple(_line_match(*t) for t in lines)
                else:  # one line (most blocks): no split
                    spans = finder(text)
                    if not spans:
                        continue
                    if rows:
                        lines = ((1, text, tuple(spans)),)
                    else:
                        lm = new(LineMatch)
                        put(lm, "__dict__", {"line": 1, "text": text, "spans": tuple(spans)})
                        lines = (lm,)
                firsts[cn << 31 | blk] = len(found)
                if rows:
                    found.append((commits[32 * cn:32 * cn + 32].hex(), key, bsets[bn], strings[rn], KINDS[kn],
                                  strings[tn] if tn >= 0 else None, when, lines, (), (), (), 0))
                else:
                    m = new(Match)
                    put(m, "__dict__", {
                        "commit": commits[32 * cn:32 * cn + 32].hex(), "session": key, "branches": bsets[bn],
                        "role": strings[rn], "kind": KINDS[kn], "tool": strings[tn] if tn >= 0 else None,
                        "time": when, "lines": lines, "also": (), "before": (), "after": (), "context": context})
                    found.append(m)
    if limit is not None:
        del found[limit:]
    if not also and not context:
        yield from found
        return
    for n, m in enumerate(found):
        more = also.get(n)
        if more:
            got = tuple((k, tuple(b)) for k, b in more.items())
            m = m[:8] + (got,) + m[9:] if rows else replace(m, also=got)
        if context:
            s = store.session(*m.session)
            tip = s.head if m.branches[0] == "HEAD" else s.branches().get(m.branches[0])
            if tip is not None:
                before, after = _context(store, store.history.path_ids(tip), m.commit, context)
                m = replace(m, before=before, after=after)
        yield m


def _line_tuples(text: str, spans_of: Callable[[str], list[tuple[int, int]]]
                 ) -> tuple[tuple[int, str, tuple[tuple[int, int], ...]], ...]:
    """The matching lines of ``text``: ``(line, text, spans)`` each."""
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        spans = spans_of(line)
        if spans:
            out.append((n, line, tuple(spans)))
    return tuple(out)


def _match(commit: str, session: tuple[str, str, str], branches: tuple[str, ...], role: str, kind: str,
           tool: str | None, time: float | None, lines: tuple[LineMatch, ...], context: int) -> Match:
    """A :class:`Match` with no ``also`` nor context entries, built as its ``__init__`` would but
    without its field-by-field ``object.__setattr__`` (a search through the index builds tens of
    thousands)."""
    m = object.__new__(Match)
    object.__setattr__(m, "__dict__", {
        "commit": commit, "session": session, "branches": branches, "role": role, "kind": kind, "tool": tool,
        "time": time, "lines": lines, "also": (), "before": (), "after": (), "context": context})
    return m


def _line_match(line: int, text: str, spans: tuple[tuple[int, int], ...]) -> LineMatch:
    """A :class:`LineMatch`, built as :func:`_match` builds a Match."""
    lm = object.__new__(LineMatch)
    object.__setattr__(lm, "__dict__", {"line": line, "text": text, "spans": spans})
    return lm


def _context(store: Store, path: list[str], cid: str, n: int
             ) -> tuple[tuple[tuple[str, str, str], ...], tuple[tuple[str, str, str], ...]]:
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


# -- the store-wide scan (format 2) ----------------------------------------------------------
#: characters that JSON or ``repr`` write around or between string values (a needle holding
#: one may come from a tool call's arguments rather than from a string's own bytes)
_STRUCTURAL = frozenset("\"'\\{}[],:")
#: characters of JSON/repr numbers and literals (true, false, null, NaN, Infinity, None)
_TOKEN = frozenset("0123456789.-+eEinfityaruslNoTF".lower())
#: characters that may end an escape sequence (``\\n``, ``\\u001f``, ``\\x1f``)
_ESCAPE_TAIL = frozenset("bfnrtux0123456789abcdef")
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
#: bytes of commits, indexes and segments a scan hands to the object store (beyond: read again)
_KEEP_PATHS = 256 << 20
#: a commit, index or segment larger than this is not taken from a scan (read as usual)
_PATH_OBJECT_MAX = 4 << 20


def _required_literal(rx: re.Pattern[str]) -> str | None:
    """The longest run of plain characters every match of ``rx`` contains, or None."""
    from re import _parser  # type: ignore[attr-defined]

    try:
        tree = _parser.parse(rx.pattern, rx.flags)
    except Exception:  # noqa: BLE001 - the pattern compiled; a parser quirk only costs the prefilter
        return None
    best = ""
    run: list[str] = []

    def flush() -> None:
        nonlocal best
        if len(run) > len(best):
            best = "".join(run)
        run.clear()

    def walk(items: Any) -> None:
        for op, av in items:
            name = str(op)
            if name == "LITERAL":
                run.append(chr(av))
            elif name == "AT":
                continue  # zero-width: the characters on either side are still adjacent
            elif name == "SUBPATTERN" and not av[1] and not av[2]:
                walk(av[3])
            elif name in _REPEATS and av[0] >= 1:
                flush()
                walk(av[2])
                flush()
            else:
                flush()

    walk(tree)
    flush()
    return best or None


def needle(rx: re.Pattern[str]) -> tuple[bytes, bool] | None:
    """A byte string that the stored bytes of every body with a match of ``rx`` contain, and
    whether to look for it in lower-cased bytes; None when there is none to rely on.

    A block's text is a string of the body (stored as its UTF-8 bytes), strings joined by a
    newline, or a tool call's name and its arguments as JSON. So a needle is taken from the
    pattern's required literal only when it has no whitespace and no JSON punctuation, is
    not made of number or literal characters alone, and has lost the leading characters an
    escape sequence could end with; case-insensitively, only when it is ASCII.
    """
    lit = _required_literal(rx)
    if not lit or any(c in _STRUCTURAL or c.isspace() or ord(c) < 0x20 for c in lit):
        return None
    if all(c.lower() in _TOKEN for c in lit):
        return None
    i = 0
    while i < len(lit) and lit[i].lower() in _ESCAPE_TAIL:
        i += 1
    lit = lit[i:]
    if not lit:
        return None
    if rx.flags & re.IGNORECASE:
        return (lit.lower().encode(), True) if lit.isascii() else None
    return lit.encode("utf-8"), False


def _body_marker() -> bytes:
    """The bytes in front of a commit's body id in its canonical bytes."""
    probe = bytes(range(1, 33))
    _, canonical = o.encode(Commit(kind="message", body=probe))
    marker = o.pack("body") + o.pack(bytes(32))[:-32]
    if canonical.find(marker + probe) < 0:  # the codec changed: found out here, not by a miss
        raise AssertionError("a commit's body is not stored as expected")
    return marker


def _needle_rx(text: bytes, folded: bool) -> re.Pattern[bytes]:
    """The search for a needle: in lower-cased bytes (``folded``) i, s and k also stand for the
    four non-ASCII letters Python's case-insensitive matching equates with them."""
    if not folded:
        return re.compile(re.escape(text))
    alts = {ord("i"): b"(?:i|\xc4\xb0|\xc4\xb1)", ord("s"): b"(?:s|\xc5\xbf)", ord("k"): b"(?:k|\xe2\x84\xaa)"}
    return re.compile(b"".join(alts.get(c) or re.escape(bytes([c])) for c in text))


def _holding(hay: bytes, nrx: re.Pattern[bytes], m: re.Match[bytes] | None, spans: list[tuple[int, int]]
             ) -> list[int]:
    """The numbers of the objects (``spans``) that hold a match of ``nrx`` in ``hay`` whole,
    from its first match ``m`` on."""
    starts = [s for s, _ in spans]
    out: list[int] = []
    while m is not None:
        i = bisect.bisect_right(starts, m.start()) - 1
        if i >= 0 and m.end() <= sum(spans[i]):
            out.append(i)
            m = nrx.search(hay, sum(spans[i]))
        else:
            m = nrx.search(hay, m.start() + 1)
    return out


class _Scan:
    """What one pass over every stored object found: the bodies that may match (by raw id)
    and the commits naming them (``(id, commit)``)."""

    def __init__(self, store: Store, rx: re.Pattern[str]) -> None:
        self.store = store
        self.rx = rx
        self.needle = needle(rx)
        self.nrx = _needle_rx(*self.needle) if self.needle is not None else None
        self.bodies: dict[bytes, Any] = {}
        self.commits: dict[str, Commit] = {}
        self.canonical: dict[str, bytes] = {}  # the commits' bytes
        self.unresolved: set[bytes] = set()
        self.marker = re.compile(re.escape(_body_marker()) + b"(.{32})", re.DOTALL)
        # the tag of a commit, an index or a segment, after a map's header byte
        tags = sorted({o.encode(x)[1][1:5] for x in (Commit(kind="message"), Index(), Segment(start=0, objects=()))})
        common: bytes = os.path.commonprefix(tags) or b""  # a literal prefix keeps the search fast
        self.path_tag = re.compile(re.escape(common) + b"(?:" + b"|".join(re.escape(t[len(common):]) for t in tags)
                                   + b")")
        self.kept = 0
        self.value_tag, self.commit_tag = (o.encode(x)[1][1:5] for x in (Value(value=0), Commit(kind="message")))

    def run(self) -> None:
        """Read every stored object once (twice only for a commit stored before its body)."""
        for content, is_record in self.store.objects.iter_contents():
            self._unit(content, is_record)
        late = self.unresolved & self.bodies.keys()
        if late:  # a commit stored before its body (sync can do that): a second pass for those
            for content, is_record in self.store.objects.iter_contents():
                self._commits_in(content, is_record, late, None)

    def _unit(self, content: bytes, is_record: bool) -> None:
        # the bytes of commits, indexes and segments go to the object store as read, found by
        # their tag after a size (no walk of every object): the paths that attribute the matches
        # then read none of them again. An id is the hash of the bytes, so bytes taken for an
        # object that are not one are never asked for: a wrong guess costs a hash, not a result.
        if self.kept < _KEEP_PATHS:
            add, n = self.store.objects.add_known_canonical, len(content)
            if not is_record:
                if self.path_tag.match(content, 1) and 0x80 <= content[0] <= 0x8F:
                    add(content)
            else:
                search, pos = self.path_tag.search, 5
                while (tag := search(content, pos)) is not None:
                    s = tag.start() - 1
                    size = int.from_bytes(content[s - 4:s], "big")
                    if 0x80 <= content[s] <= 0x8F and size <= _PATH_OBJECT_MAX and s + size <= n:
                        add(content[s:s + size])
                        self.kept += size
                        pos = s + size  # past it: a segment's copies of commits are not looked at
                    else:
                        pos = tag.end()
        spans = None
        if self.needle is None or self.nrx is None:
            spans = packs.content_spans(content) if is_record else [(0, len(content))]
            if spans is not None:
                self._keep_bodies(content, spans, range(len(spans)))
        else:
            hay = content.lower() if self.needle[1] else content
            m = self.nrx.search(hay)
            if m is not None:
                spans = packs.content_spans(content) if is_record else [(0, len(content))]
                if spans is not None:
                    self._keep_bodies(content, spans, _holding(hay, self.nrx, m, spans))
        refs = self.marker.findall(content)
        if not refs:
            return
        bodies = self.bodies
        known = [r for r in refs if r in bodies]
        if len(known) < len(refs):
            self.unresolved.update(r for r in refs if r not in bodies)
        if known:
            self._commits_in(content, is_record, set(known), spans)

    def _keep_bodies(self, content: bytes, spans: list[tuple[int, int]], picked: Iterable[int]) -> None:
        """Decode the objects ``picked`` (by number) of ``content`` and keep the values."""
        # only values can be bodies: a segment holding a hit (its copies of bodies) is not decoded
        tag = self.value_tag
        objs = self.store.objects.adopt_canonical_many([content[a:a + n] for a, n in (spans[i] for i in picked)
                                                        if content[a + 1:a + 5] == tag])
        for oid, obj in objs:
            if isinstance(obj, Value):
                self.bodies[o.raw_id(oid)] = obj.value

    def _commits_in(self, content: bytes, is_record: bool, wanted: set[bytes],
                    spans: list[tuple[int, int]] | None) -> None:
        """Decode the commits of ``content`` whose body is one of ``wanted``."""
        marker = self.marker
        hits = [m.start() for m in marker.finditer(content) if m.group(1) in wanted]
        if not hits:
            return
        if spans is None:
            spans = packs.content_spans(content) if is_record else [(0, len(content))]
            if spans is None:
                return
        starts = [s for s, _ in spans]
        # only commits: the copies of commits in a segment are not decoded
        tag = self.commit_tag
        picked = [i for i in dict.fromkeys(bisect.bisect_right(starts, at) - 1 for at in hits)
                  if content[spans[i][0] + 1:spans[i][0] + 5] == tag]
        objs = self.store.objects.adopt_canonical_many([content[spans[i][0]:sum(spans[i])] for i in picked])
        for (oid, obj), i in zip(objs, picked, strict=True):
            if isinstance(obj, Commit) and obj.body is not None and obj.body in self.bodies:
                self.commits[oid] = obj
                self.canonical[oid] = content[spans[i][0]:sum(spans[i])]


class _Calls(dict[str, str]):
    """A tool-call map that notes a lookup it could not answer (a result whose call is in an
    earlier commit of its session)."""

    missed = False

    def get(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self.missed = True
        return super().get(key, default)


def _session_tips(store: Store, app_globs: tuple[str, ...] | None, session_globs: tuple[str, ...] | None
                  ) -> list[tuple[tuple[str, str, str], list[tuple[str, str, dict[str, Any]]]]]:
    """The sessions a search covers, in session order, each with its branches (name, tip and
    ref metadata; ``HEAD`` when detached), as :meth:`Session.branches` names them: the
    current branch as :meth:`Store.sessions` read it, the others in one batch."""
    from .branches import parse_ref_name, real_name, session_prefix

    infos = []
    for app in sorted(store.apps()):
        if not _glob_any(app, app_globs):
            continue
        for si in sorted(store.sessions(app), key=lambda x: (x.user, x.session)):
            if _session_ok((si.app, si.user, si.session), session_globs, None):
                infos.append(si)
    if not infos:
        return []
    current = {session_prefix(si.app, si.user, si.session): si for si in infos if si.branch is not None}
    parsed: dict[str, Any] = {}
    heads: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {}
    for n in store.refs.list("sessions"):
        p = parse_ref_name(n)
        if p is None or p.kind != "branch" or p.name is None or p.session_prefix is None:
            continue
        cur = current.get(p.session_prefix)
        if cur is not None and cur.head is not None and cur.branch is not None \
                and real_name(p.name, None) == cur.branch:
            heads.setdefault(p.session_prefix, {})[cur.branch] = (cur.head, {})  # read by sessions() already
        else:
            parsed[n] = p
    for n, v in store.refs.read_many(list(parsed)).items():
        p = parsed[n]
        if v is not None and v.symbolic is None:
            heads.setdefault(p.session_prefix, {})[real_name(p.name, v.meta)] = (v.target, dict(v.meta))
    out = []
    for si in infos:
        got = heads.get(session_prefix(si.app, si.user, si.session), {})
        tips = [(b, t, m) for b, (t, m) in sorted(got.items())]
        if si.branch is None and si.head is not None:
            tips.append(("HEAD", si.head, {}))
        out.append(((si.app, si.user, si.session), tips))
    return out


def _calls_before(store: Store, tips: list[tuple[str, str, dict[str, Any]]], cid: str) -> dict[str, str]:
    """The tool calls a session's commits before ``cid`` made (in the order the walk reads
    them), for naming the tool of a result whose call is not in its own body."""
    seen: set[str] = set()
    order: list[tuple[str, Commit]] = []
    for _, tip, _ in tips:
        for x, c in store.history.path(tip):
            if x not in seen:
                seen.add(x)
                order.append((x, c))
    order.sort(key=lambda x: x[1].depth)
    calls: dict[str, str] = {}
    for x, c, body in bodies_of(store, order):
        if x == cid:
            break
        for _ in blocks(body, c.kind, calls):
            pass
    return calls


def _grep_scan(store: Store, rx: re.Pattern[str], keep: Any, limit: int | None, context: int,
               want_kinds: set[str], role_set: set[str] | None, since: float | None, until: float | None,
               app_globs: tuple[str, ...] | None, session_globs: tuple[str, ...] | None) -> Iterator[Match]:
    """:func:`grep` by one pass over every stored object (format 2): see the module docstring."""
    # everything is found before the first match is given out: a pass that keeps hundreds of
    # thousands of objects alive (the caches, the bodies), each burst of allocations a walk of
    # all of them by the cyclic collector, for nothing
    with gc_paused():
        out, sessions = _scan_matches(store, rx, keep, context, want_kinds, role_set, since, until, app_globs,
                                      session_globs)
    for n, ((sn, _, bn, _), m) in enumerate(out):
        if limit is not None and n >= limit:
            return
        if context:
            before, after = _context(store, store.history.path_ids(sessions[sn][1][bn][1]), m.commit, context)
            m = replace(m, before=before, after=after)
        yield m


def _scan_matches(store: Store, rx: re.Pattern[str], keep: Any, context: int, want_kinds: set[str],
                  role_set: set[str] | None, since: float | None, until: float | None,
                  app_globs: tuple[str, ...] | None, session_globs: tuple[str, ...] | None
                  ) -> tuple[list[tuple[tuple[int, int, int, int], Match]],
                             list[tuple[tuple[str, str, str], list[tuple[str, str, dict[str, Any]]]]]]:
    """The matches of :func:`_grep_scan` in their order, with their sort keys, and the sessions."""
    scan = _Scan(store, rx)
    scan.run()
    # 1. the blocks that match, before knowing where their commits are
    found: dict[str, list[tuple[int, str, str, str | None, tuple[LineMatch, ...], bool]]] = {}
    for cid, c in scan.commits.items():
        assert c.body is not None
        when = _time_of(c)
        if (since is not None and when < since) or (until is not None and when >= until):
            continue
        calls = _Calls()
        for j, (role, bkind, tool, text) in enumerate(blocks(scan.bodies[c.body], c.kind, calls)):
            missed, calls.missed = calls.missed, False
            if bkind not in want_kinds or (role_set is not None and role not in role_set):
                continue
            if not text or rx.search(text) is None:
                continue
            lines = _line_matches(rx, text)
            if lines:
                found.setdefault(cid, []).append((j, role, bkind, tool, lines, missed and tool is None))
    if not found:
        return [], []
    # 2. where those commits are: the branches whose path holds them
    targets = {cid: scan.commits[cid].depth for cid in found}
    sessions = _session_tips(store, app_globs, session_globs)
    where: dict[str, list[tuple[int, str, int]]] = {}  # commit -> (session number, branch, branch number)
    from .history import BlockPath, K

    store.objects.refresh()  # the pack map first: a cold handle would look for each one loose
    shallowest = min(targets.values())
    paths: list[tuple[int, str, int, Any]] = []
    for sn, (_, tips) in enumerate(sessions):
        for bn, (bname, tip, meta) in enumerate(tips):
            length = meta.get("length")
            top = int(length) - 1 if isinstance(length, int) and not isinstance(length, bool) else None
            if top is None or top >= shallowest:
                paths.append((sn, bname, bn, BlockPath(store.objects, tip, meta)))
    # below each tip's own block the path is its segments (read in one batch, each verified
    # by its id): a match is there when its bytes are (a commit's bytes hold its depth)
    wanted = {sid: blk for _, _, _, bp in paths for blk, sid in enumerate(bp.segments or ())}
    segs = {sid: frozenset(seg.objects) for sid, seg in store.objects.get_many(list(wanted), missing_ok=True).items()
            if isinstance(seg, Segment) and seg.start == wanted[sid] * K}
    by_bytes = {scan.canonical[x]: x for x in targets}
    for sn, bname, bn, bp in paths:
        held = [x for x, _ in bp.at_depth.values() if x in targets]
        loaded = min(bp.at_depth)  # the top block is loaded already (a fallback below loads more)
        for blk, sid in enumerate(bp.segments or ()):
            if loaded <= blk * K:
                break
            got = segs.get(sid)
            if got is None:  # not a segment of this block: read the block as the path reads it
                held.extend(x for x, _ in bp.range(blk * K, blk * K + K - 1) if x in targets)
            else:
                held.extend(by_bytes[c] for c in got & by_bytes.keys())
        for x in held:
            where.setdefault(x, []).append((sn, bname, bn))
    for held in where.values():
        held.sort(key=lambda r: (r[0], r[2]))  # session order, then branch order, as the walk lists them
    # 3. each commit reported once, with the first session holding it, in the walk's order
    out: list[tuple[tuple[int, int, int, int], Match]] = []  # (session, depth, branch, block), match
    calls_of: dict[tuple[int, str], dict[str, str]] = {}
    for cid, blks in found.items():
        refs = where.get(cid)
        if not refs:
            continue
        sn = refs[0][0]
        key, tips = sessions[sn]
        c = scan.commits[cid]
        mine = tuple(b for s, b, _ in refs if s == sn)
        others: dict[tuple[str, str, str], list[str]] = {}
        for s, b, _ in refs:
            if s != sn:
                others.setdefault(sessions[s][0], []).append(b)
        first_branch = min(bn for s, _, bn in refs if s == sn)
        when = _time_of(c)
        for j, role, bkind, tool, lines, unnamed in blks:
            if unnamed:
                if (sn, cid) not in calls_of:
                    calls_of[(sn, cid)] = _calls_before(store, tips, cid)
                assert c.body is not None
                named = list(blocks(scan.bodies[c.body], c.kind, dict(calls_of[(sn, cid)])))
                tool = named[j][2]
            if not keep(key, role, bkind, tool, when):
                continue
            out.append(((sn, c.depth, first_branch, j),
                        Match(cid, key, mine, role, bkind, tool, when, lines,
                              tuple((k, tuple(b)) for k, b in others.items()), context=context) if others
                        else _match(cid, key, mine, role, bkind, tool, when, lines, context)))
    out.sort(key=lambda x: x[0])
    return out, sessions


__all__ = ["DEFAULT_KINDS", "INJECTED", "KINDS", "GrepError", "LineMatch", "Match", "Row", "blocks", "compile_pattern",
           "grep", "grep_counts", "grep_rows", "iso_time", "needle", "typed_block"]
