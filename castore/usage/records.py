"""What a model response records of its usage, source by source: the counts, the readers and
the records the importers keep (:mod:`castore.usage` adds them up).

What is read, per source (each a *reader*, chosen by the commit metadata key its importer
writes; :data:`READERS`):

================ ==========================================================================
``claude``       an imported Claude Code ``assistant`` line: ``message.usage``
                 (``input_tokens``, ``output_tokens``, ``cache_creation_input_tokens``,
                 ``cache_read_input_tokens``) and ``message.model``, as the importer keeps
                 them in the commit's metadata (:func:`claude_record`), else, for a commit
                 imported before it did, from the line's raw bytes
``codex``        an imported Codex ``token_count`` event: ``info.last_token_usage`` (the
                 response's own counts; ``input_tokens`` includes ``cached_input_tokens``,
                 which count as cache reads), or, in a rollout too old to have it, the growth
                 of ``info.total_token_usage`` since the previous event on the same path; the
                 model is the one the last ``turn_context`` (or ``session_meta``) before it named;
                 the importer keeps them in the commit's metadata, read on the path the line
                 hangs on (:func:`codex_record`), else (a session imported before it did, or
                 continued since) they are read from the raw lines, walking each path
``gemini``       an imported Gemini CLI ``gemini`` message: ``tokens`` (``input`` includes
                 ``cached``, which count as cache reads; ``thoughts`` count as output, ``tool``
                 as input) and ``model``, as the importer keeps them in the commit's metadata
                 (:func:`gemini_record`), else from the line's raw bytes
``pi``           an imported Pi assistant message: its ``usage`` (``input``, ``output``,
                 ``cacheRead``, ``cacheWrite``), kept on the commit, and the message's ``model``
(any other)      a commit whose metadata has ``usage`` (what an application appending through
                 the library records, e.g. an OpenAI Agents run's usage) and ``model``: the
                 Anthropic, OpenAI Responses, Chat Completions and Pi shapes are understood
================ ==========================================================================

A new importer adds its reader to :data:`READERS` under its metadata key: a :class:`Reader`
says which commits it needs the raw line of, and turns a commit (and that line) into a
:class:`Response`.

**How copies are recognised.** One model response can be stored many times: Claude Code
writes one line per content block of a response (all with the same usage), a resumed or
forked session replays earlier lines into a new file with a new ``sessionId``, a compaction
replays lines with new uuids, a subagent's or a ``/btw`` aside's file replays the parent's
responses, a Codex fork copies its parent's rollout, a Codex thread writes the same
``token_count`` again when only its rate limits changed, and castore shares one commit
between every branch and fork that holds it. Each response is named by an identity that all
its copies share, and counted once:

* first by commit: a commit reached by several branches, labels, or by a fork and its parent
  session, is one commit (content addressing: the same line at the same place in the same
  history is the same object), read once;
* Claude Code: ``message.id`` (the API's id of the response, ``msg_...``) with
  ``message.model``, the same in every line and every file the response was written to;
  ``requestId`` is not part of it, since a ``/btw`` aside replays its parent's responses
  under a new request id (the model guards against ids reused by hand-made files: two
  models never wrote one response). A line without a ``message.id`` is named by its
  ``requestId``, else its ``uuid``;
* Codex: the pair of cumulative and last counts of the ``token_count`` event (the thread's
  running total only grows, so in a thread a pair names one response; a fork or a subagent
  file that copies its parent's events copies the pair; an event written again when only
  the rate limits changed repeats it; a subagent's file that replays its parent's history
  too). Two threads whose first responses have equal counts in every field (input, cached
  input, output, reasoning output, total) would be taken as one: the price of counting a
  replayed first response once;
* Gemini CLI: the message's ``id`` with its model (the file appends a message again, whole,
  each time it changes: the copies that carry ``tokens`` are one response);
* Pi: the assistant message's own ``timestamp`` (milliseconds) with its model and counts,
  which a branched file copies unchanged;
* other commits: the API's ``response_id`` in the metadata (an OpenAI Agents run's, see
  :meth:`castore.adapters.openai_agents.CastoreSession.usage_hooks`) with the model, else the
  commit.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..objects import Commit


# -- counts --------------------------------------------------------------------------------------
@dataclass
class Tokens:
    """Token counts: input not read from a cache, output, cache reads and cache writes."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0

    def add(self, other: Tokens) -> None:
        """Add ``other`` into these counts."""
        self.input += other.input
        self.output += other.output
        self.cache_read += other.cache_read
        self.cache_write += other.cache_write

    @property
    def total(self) -> int:
        """All four added up."""
        return self.input + self.output + self.cache_read + self.cache_write

    def to_json(self) -> dict[str, int]:
        """``{"input", "output", "cache_read", "cache_write", "total"}``."""
        return {"input": self.input, "output": self.output, "cache_read": self.cache_read,
                "cache_write": self.cache_write, "total": self.total}


#: a count at or beyond this is no count (JSON readers differ above it; msgpack stops at 2**64)
_COUNT_LIMIT = 2**53


def _int(v: Any) -> int:
    if v.__class__ is int:  # what msgpack decodes to: the one check
        return v if 0 < v < _COUNT_LIMIT else 0
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v < _COUNT_LIMIT else 0


def tokens_of(u: Any) -> Tokens | None:
    """The counts of a usage record in any of the shapes the agents write, or None.

    Anthropic (``input_tokens`` without the cache, ``cache_creation_input_tokens``,
    ``cache_read_input_tokens``); OpenAI Responses and Codex (``input_tokens`` *including*
    ``input_tokens_details.cached_tokens`` or ``cached_input_tokens``); Chat Completions
    (``prompt_tokens``, ``completion_tokens``, ``prompt_tokens_details.cached_tokens``); Pi
    (``input``, ``output``, ``cacheRead``, ``cacheWrite``). A count that is not a positive
    integer below 2**53 counts 0.
    """
    if not isinstance(u, dict):
        return None
    if "input_tokens" in u or "output_tokens" in u:
        details = u.get("input_tokens_details")
        cached = _int(u.get("cached_input_tokens")) or _int(details.get("cached_tokens") if isinstance(details, dict)
                                                            else None)
        if cached:  # OpenAI's input counts the cached part too
            return Tokens(max(0, _int(u.get("input_tokens")) - cached), _int(u.get("output_tokens")), cached, 0)
        return Tokens(_int(u.get("input_tokens")), _int(u.get("output_tokens")),
                      _int(u.get("cache_read_input_tokens")), _int(u.get("cache_creation_input_tokens")))
    if "prompt_tokens" in u or "completion_tokens" in u:
        details = u.get("prompt_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
        return Tokens(max(0, _int(u.get("prompt_tokens")) - cached), _int(u.get("completion_tokens")), cached, 0)
    if "input" in u or "output" in u:
        return Tokens(_int(u.get("input")), _int(u.get("output")), _int(u.get("cacheRead")), _int(u.get("cacheWrite")))
    return None


@dataclass
class Response:
    """One model response as a reader found it: its identity (shared by all its copies), model,
    time (seconds since the epoch; 0: unknown) and counts."""

    identity: str
    model: str | None
    time: float
    tokens: Tokens


# -- readers -------------------------------------------------------------------------------------
class Walk:
    """What a reader may keep while one path is read root to tip (Codex: the model its last
    ``turn_context`` named, the running total of its last ``token_count``)."""

    def __init__(self) -> None:
        self.model: str | None = None
        self.total: dict[str, Any] | None = None


@dataclass(frozen=True)
class Reader:
    """How the responses of one source are read.

    Attributes:
        needs_line: whether a commit's raw line must be read (its metadata under the key given).
        read: the response a commit records, or None; gets the walk of its path, the commit's
            id, the commit, its metadata under the key and its line parsed (None when not read
            or not a JSON object). Called root first, for each commit once, or, when
            ``stateful``, for every commit of every path (a path's walk needs them all).
        stateful: whether ``read`` keeps state in the walk.
        counts: whether a commit (its metadata under the key) may record a response; one that
            may not is passed over unread (None: every commit is read).
        kept: ``(source, key)`` when the importer keeps each line's usage record under ``key``
            of the metadata (:func:`kept_record`): a commit that has it is counted from it
            without calling ``read`` (what ``read`` would do with it), and its line is not read.
    """

    needs_line: Callable[[Commit, dict[str, Any]], bool]
    read: Callable[[Walk, str, Commit, dict[str, Any], dict[str, Any] | None], Response | None]
    stateful: bool = False
    counts: Callable[[dict[str, Any]], bool] | None = None
    kept: tuple[str, str] | None = None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


#: the key of a Claude Code commit's metadata (under ``claude``) that keeps its line's usage
CLAUDE_USAGE = "u"


def claude_record(d: dict[str, Any]) -> list[Any]:
    """What :func:`castore.usage.usage` needs of a Claude Code ``assistant`` line ``d`` (parsed), kept by the
    importer in the commit's metadata under :data:`CLAUDE_USAGE` so that the line is not read
    again: ``[identity, model, input, output, cache read, cache write]`` (identity ``""`` when
    the line names none: the commit's id stands in), or ``[]`` when it records no response.
    Raises nothing."""
    msg = d.get("message")
    if not isinstance(msg, dict):
        return []
    model = _str(msg.get("model"))
    t = tokens_of(msg.get("usage"))
    if t is None or model == "<synthetic>":
        return []
    mid = _str(msg.get("id"))
    ident = f"{mid}:{model}" if mid else _str(d.get("requestId")) or _str(d.get("uuid")) or ""
    return [ident, model or "", t.input, t.output, t.cache_read, t.cache_write]


def _claude_needs(c: Commit, m: dict[str, Any]) -> bool:
    return m.get("type") == "assistant" and not isinstance(m.get(CLAUDE_USAGE), list)


def _claude_counts(m: dict[str, Any]) -> bool:
    return m.get("type") == "assistant" or CLAUDE_USAGE in m


def kept_record(source: str, rec: list[Any] | None, cid: str, time: float) -> list[Any] | None:
    """``[identity, model, time, input, output, cache read, cache write]`` of a usage record as
    an importer of ``source`` keeps it on commit ``cid`` of ``time`` (``[identity, model, input,
    output, cache read, cache write]``; identity ``""``: the commit's id), or None (``[]``,
    None: no response). Raises nothing."""
    if rec is None or len(rec) != 6:
        return None
    return [f"{source}:" + (rec[0] or cid), rec[1] or None, time, _int(rec[2]), _int(rec[3]), _int(rec[4]),
            _int(rec[5])]


def _kept(source: str, rec: list[Any] | None, cid: str, c: Commit) -> Response | None:
    """The response of a usage record as an importer keeps it (:func:`kept_record`), or None."""
    got = kept_record(source, rec, cid, c.time)
    return None if got is None else Response(got[0], got[1], got[2], Tokens(*got[3:]))


def _read_kept(source: str, key: str, record: Callable[[dict[str, Any]], list[Any]]) -> Callable[..., Response | None]:
    """The reader of a source whose importer keeps each line's usage record under ``key`` in
    its metadata, ``record`` making it from the line (a commit imported before it did)."""
    def read(w: Walk, cid: str, c: Commit, m: dict[str, Any], d: dict[str, Any] | None) -> Response | None:
        rec = m.get(key)
        if not isinstance(rec, list):  # imported before the importer kept it: the raw line
            if d is None:
                return None
            rec = record(d)
        return _kept(source, rec, cid, c)
    return read


_CODEX_LINES = ("token_count", "turn_context", "session_meta")
#: the key of a Codex commit's metadata (under ``codex``) that keeps its line's usage
CODEX_USAGE = "u"
#: what the usage of a Codex line depends on of the lines before it on its path: the model the
#: last ``turn_context`` (or ``session_meta``) named, and the last ``token_count``'s running total
CodexWalk = tuple[str | None, dict[str, Any] | None]


def codex_record(d: dict[str, Any], walk: CodexWalk) -> tuple[list[Any] | None, CodexWalk]:
    """What :func:`castore.usage.usage` needs of a Codex line ``d`` (parsed) read after ``walk`` (the state
    of the lines before it on its path), and the state after it: the importer keeps the record
    in the commit's metadata under :data:`CODEX_USAGE` (with the state of each path it writes
    on), so that the line is not read again. The record is ``[identity, model, input, output,
    cache read, cache write]`` (identity ``""``: the commit's id stands in), ``[]`` for a line
    that names a model or a total but records no response, None for any other line.

    A ``token_count``'s counts are its ``info.last_token_usage`` (``input_tokens`` includes
    ``cached_input_tokens``, counted as cache reads), or, in a rollout too old to have it, the
    growth of ``info.total_token_usage`` since the previous event on the path; its identity is
    the pair of the two (every copy of the event has it). Raises nothing."""
    model, prev = walk
    p = d.get("payload")
    if not isinstance(p, dict):
        return None, walk
    if d.get("type") in ("turn_context", "session_meta"):
        return [], (_str(p.get("model")) or model, prev)
    if p.get("type") != "token_count":
        return None, walk
    if not isinstance(p.get("info"), dict):
        return [], walk
    total, last = p["info"].get("total_token_usage"), p["info"].get("last_token_usage")
    after: CodexWalk = (model, total if isinstance(total, dict) else prev)
    if isinstance(last, dict):
        t = tokens_of(last)
    elif isinstance(total, dict):  # an old rollout: the growth of the running total
        if total == prev:
            return [], after
        grown = {k: _int(v) - _int((prev or {}).get(k)) for k, v in total.items()}
        t = tokens_of({k: v for k, v in grown.items() if v > 0} | {"input_tokens": grown.get("input_tokens", 0)})
    else:
        return [], after
    if t is None or t.total == 0:
        return [], after
    ident = hashlib.sha256(json.dumps([total, last], sort_keys=True).encode()).hexdigest()[:32] \
        if isinstance(total, dict) else ""
    return [ident, model or "", t.input, t.output, t.cache_read, t.cache_write], after


def _codex_needs(c: Commit, m: dict[str, Any]) -> bool:
    return c.author in _CODEX_LINES and not isinstance(m.get(CODEX_USAGE), list)


def _codex_read(w: Walk, cid: str, c: Commit, m: dict[str, Any], d: dict[str, Any] | None) -> Response | None:
    rec = m.get(CODEX_USAGE)
    if not isinstance(rec, list):  # imported before the importer kept it: the raw line, on the path's walk
        if d is None:
            return None
        rec, (w.model, w.total) = codex_record(d, (w.model, w.total))
    return _kept("codex", rec, cid, c)


#: the key of a Gemini CLI commit's metadata (under ``gemini``) that keeps its line's usage
GEMINI_USAGE = "u"


def gemini_record(d: dict[str, Any]) -> list[Any]:
    """What :func:`castore.usage.usage` needs of a Gemini CLI message record ``d`` (parsed), kept by the
    importer in the commit's metadata under :data:`GEMINI_USAGE` so that the line is not read
    again: ``[identity, model, input, output, cache read, cache write]`` (identity: the
    message's ``id`` and model, ``""`` when it has no id: the commit's id stands in), or ``[]``
    when it records no response. gemini-cli's ``tokens``: ``input`` (the prompt, its ``cached``
    part included), ``cached``, ``output``, ``thoughts`` (billed as output), ``tool`` (prompt
    tokens of tool use, counted as input). Raises nothing."""
    tok = d.get("tokens")
    if d.get("type") != "gemini" or not isinstance(tok, dict):
        return []
    cached = _int(tok.get("cached"))
    t = Tokens(max(0, _int(tok.get("input")) - cached) + _int(tok.get("tool")),
               _int(tok.get("output")) + _int(tok.get("thoughts")), cached, 0)
    if t.total == 0:
        return []
    model, mid = _str(d.get("model")), _str(d.get("id"))
    return [f"{mid}:{model}" if mid else "", model or "", t.input, t.output, t.cache_read, t.cache_write]


def _gemini_needs(c: Commit, m: dict[str, Any]) -> bool:
    return m.get("type") in ("gemini", "update") and not isinstance(m.get(GEMINI_USAGE), list)


def _gemini_counts(m: dict[str, Any]) -> bool:
    return m.get("type") in ("gemini", "update") or GEMINI_USAGE in m


#: the sources whose usage sits in their raw lines, by the metadata key their importer writes
READERS: dict[str, Reader] = {
    "claude": Reader(_claude_needs, _read_kept("claude", CLAUDE_USAGE, claude_record), counts=_claude_counts,
                     kept=("claude", CLAUDE_USAGE)),
    "codex": Reader(_codex_needs, _codex_read, stateful=True),
    "gemini": Reader(_gemini_needs, _read_kept("gemini", GEMINI_USAGE, gemini_record), counts=_gemini_counts,
                     kept=("gemini", GEMINI_USAGE)),
}



def meta_usage(cid: str, c: Commit, body: Any) -> Response | None:
    """A response recorded in a commit's metadata: Pi's (``pm.usage``, model in the body) or
    an application's (``usage`` and ``model``), else None. ``body``: the commit's body value
    (Pi's message, which names the model). Raises nothing."""
    meta = c.meta
    pm = meta.get("pm")
    if isinstance(pm, dict) and isinstance(pm.get("usage"), dict):
        t = tokens_of(pm["usage"])
        b = body if isinstance(body, dict) else {}
        model = _str(b.get("model"))
        if t is None or t.total == 0:
            return None
        stamp = pm.get("timestamp")
        ident = f"pi:{stamp}:{model}:{t.input}:{t.output}:{t.cache_read}:{t.cache_write}" \
            if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) else "commit:" + cid
        return Response(ident, model, c.time, t)
    t = tokens_of(meta.get("usage"))
    if t is None or t.total == 0:
        return None
    rid, model = _str(meta.get("response_id")), _str(meta.get("model"))
    return Response(f"response:{rid}:{model}" if rid else "commit:" + cid, model, c.time, t)




__all__ = ["CLAUDE_USAGE", "CODEX_USAGE", "GEMINI_USAGE", "READERS", "CodexWalk", "Reader", "Response", "Tokens",
           "Walk", "claude_record", "codex_record", "gemini_record", "kept_record", "meta_usage", "tokens_of"]
