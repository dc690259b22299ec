"""Token usage and cost of the sessions in a store (``castore usage``), each model response once.

:func:`usage` walks every session of the store, every branch, reads the usage each model
response recorded, removes the copies, and adds the rest up per session, branch, model,
project or day, with a cost from a price table (:func:`load_prices`).

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

Where the copies of a response sit in several sessions or branches, it counts for the
earliest copy (by the time of its line, then session key); within a session for the branch
HEAD is on, else the first by name. A response counts whole in one row of a grouping, so the
rows add up to the total.

Counting is cached: the rows read from each session are kept in a local file
(``$CASTORE_USAGE_CACHE``, else ``~/.cache/castore/usage/<digest of the store URL>.json``) with
the refs they were read at and the branch HEAD was on (a checkout moves the rows of the commits
two branches hold); the next run reads again only the sessions whose refs moved (on
local disk the ref-change log tells which, without reading a ref), and ``castore import``
brings an existing cache up to date as it does the search index (:func:`update_if_present`).
The ref-change log names castore's own changes only (its writes of a ref file in place
included, logged before they are made); a ref file edited, removed or rewritten in place by
hand is seen when its session's refs next move, or once the cache is deleted.
The cache is derived data: deleting it loses nothing, and a cache file of another shape
(damaged, edited by hand, another version's) is read as none. An encrypted store is never cached
(its counts and session names would be in the clear): every run reads every session.

A run that reads most of a store's sessions (the first one, with no cache) first decodes every
commit of the store in one pass over its packs (:func:`load_commits`), then walks each path
through them, with no read per commit; a run that reads a few sessions reads their paths one
by one. Where the process may fork (:func:`castore.forked.can_fork`: one thread, two cores),
the pass and the paths are shared with a forked worker (:func:`_start_worker`,
:func:`_read_shared`), each reading a share of the records and the sessions that share holds
whole: the worker starts on its share before the refs are read (which the process reads and
then sends it), and takes the larger share for it. A worker that raises or dies (killed: the
OOM killer) leaves its share to the process, which reads it too: the same report, the cache
saved; a worker whose process dies is killed with it (:mod:`castore.forked`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, TypedDict, cast

from .errors import CastoreError, InvalidEntry
from .forked import Forked, WorkerDied
from .gcpause import gc_paused
from .objects import json_dumps_sorted, json_loads, json_loads_as

if TYPE_CHECKING:
    from .errors import CorruptRef
    from .objects import Commit
    from .store import Store

#: what ``by`` may be
GROUPS = ("session", "branch", "model", "project", "day")
#: the version of the cache file (a file of another version is not read)
CACHE_VERSION = 1
#: reading at least this many sessions (and half the store's), every commit is decoded in one
#: store-wide pass first (:func:`load_commits`)
SCAN_MIN_SESSIONS = 64
#: the most commits :func:`load_commits` keeps decoded (a bound on its memory: about 1 KiB each)
SCAN_MAX_COMMITS = 150_000
Key = tuple[str, str, str]


class UsageError(CastoreError, ValueError):
    """A bad argument to :func:`usage`, or a price table that cannot be read."""


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
    """What :func:`usage` needs of a Claude Code ``assistant`` line ``d`` (parsed), kept by the
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
    """What :func:`usage` needs of a Codex line ``d`` (parsed) read after ``walk`` (the state
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
    """What :func:`usage` needs of a Gemini CLI message record ``d`` (parsed), kept by the
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


#: the first reader of :data:`READERS` (Claude Code's), whose commits :func:`session_rows` tells
#: inline, and the metadata key of its commits: it is tried first (:func:`_reader_of`), so a commit
#: that has its key is its commit whatever else the metadata holds
_FAST_KEY, _FAST = next(iter(READERS.items()))


def _meta_usage(cid: str, c: Commit, body: Any) -> Response | None:
    """A response recorded in a commit's metadata: Pi's (``pm.usage``, model in the body) or
    an application's (``usage`` and ``model``)."""
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


# -- reading one session -------------------------------------------------------------------------
#: a row of the cache: [commit, identity, model, time, input, output, cache read, cache write, branch]
Row = list[Any]


#: what :func:`_reader_of` gives a commit its reader passes over (:attr:`Reader.counts`)
_PASSED: tuple[Reader, dict[str, Any], bool] = (Reader(lambda c, m: False, lambda w, i, c, m, d: None), {}, False)


def _reader_of(c: Commit) -> tuple[Reader, dict[str, Any], bool] | None:
    """The reader of commit ``c``, its metadata under the reader's key and whether it needs the
    raw line; :data:`_PASSED` when that reader passes the commit over; None: no reader's
    (:func:`_meta_usage` may still find usage)."""
    meta = c.meta
    for k, r in READERS.items():
        m = meta.get(k)
        if isinstance(m, dict) and isinstance(m.get("raw"), str):
            if r.counts is not None and not r.counts(m):
                return _PASSED
            if r.kept is not None and isinstance(m.get(r.kept[1]), list):
                return r, m, False
            return r, m, r.needs_line(c, m)
    return None


def session_rows(store: Store, key: Key, refs: Mapping[str, str] | None = None,
                 current: str | None = None, commits: Mapping[str, Commit] | None = None,
                 visited: set[str] | None = None) -> list[Row]:
    """The responses one session records, each commit once: a row per response.

    The branch a row names is the one HEAD is on when it holds the commit, else the first
    branch by name that does (a commit only a label reaches: the label's name; only a
    detached HEAD: ``HEAD``). ``refs`` and ``current``: the session's refs and the branch
    segment its HEAD is on, as :meth:`~castore.store.Store.session_refs_and_heads` reads them
    (else both are read). ``commits``: commits decoded already, by id (:func:`load_commits`):
    the paths are walked through them, and one that is not there is read. ``visited``: the
    paths are walked through ``commits`` only (one that is not there, or a path whose depths do
    not count it, raises :class:`Elsewhere`: what a share of the store's commits cannot read),
    and the ids of the commits walked are added to it.

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
        Elsewhere: (with ``visited``) a commit of the paths is not in ``commits``.
    """
    from .objects import hex_id

    if refs is None:
        folder = store.session(*key).prefix
        _f, refs, current = store.session_refs_and_heads([folder]).get(key, (folder, {}, None))
    paths: list[list[tuple[str, Commit]]] = []
    names: list[str] = []  # the ref each path was read for
    owner: dict[str, int] = {}  # commit -> the first path that holds it
    # each commit at its first visit, in order, but those their reader passes over: the commits
    # read, unless some reader keeps state along each path (then every path is read whole);
    # each with the place of its row in rows (a commit whose usage record the importer kept
    # is given its row at once)
    firsts: list[tuple[int, str, Commit, tuple[Reader, dict[str, Any], bool] | None]] = []
    rows: list[Row | None] = []
    fast_source, fast_kept = _FAST.kept or ("", "")
    fast_key, fast_counts = _FAST_KEY, _FAST.counts or (lambda m: True)
    stateful = False
    want: list[str] = []
    bodies: list[str] = []
    path_of, commit_of = (store.history.path, store.history.commit) if visited is None else (_elsewhere, _elsewhere)
    decoded = (commits or {}).get
    tips = _tips(refs, current)
    # one commit every ref names (a session with no fork): one path, read root first, each
    # commit once; no bookkeeping of which path each commit is on
    only = tips[0][0] if tips and all(t == tips[0][1] for _n, t in tips) else None
    for name, tip in tips:
        if tip in owner or (only is not None and paths):
            continue
        # a path read once; another tip is walked back to a commit already read
        if not paths:
            path, start = (_decoded_path(decoded, tip) if commits else None) or path_of(tip), 0
        else:
            new: list[tuple[str, Commit]] = []
            cid: str | None = tip
            while cid is not None and cid not in owner:
                c = decoded(cid) or commit_of(cid)
                new.append((cid, c))
                cid = c.parents[0].hex() if c.parents else None
            new.reverse()
            if cid is None:
                path, start = new, 0
            else:
                below = paths[owner[cid]]
                i = _place(below, cid, new[0][1].depth - 1)
                path, start = below[:i + 1] + new, i + 1
        at = len(paths)
        paths.append(path)
        names.append(name)
        part = path[start:] if start else path  # the commits no path before holds
        if visited is not None:
            visited.update(map(_first, part))
        if only is None:
            owner.update(zip(map(_first, part), repeat(at)))
        for cid, c in part:
            # the first reader's commits (a Claude Code session's, all of them) inline: what
            # _reader_of and the kept record would give, without their calls per commit
            m = c.meta.get(fast_key)
            if m.__class__ is dict and m.get("raw").__class__ is str:
                if not fast_counts(m):
                    continue
                rec = m.get(fast_kept)
                if rec.__class__ is list:
                    got_row = kept_record(fast_source, rec, cid, c.time)
                    if got_row is not None:
                        rows.append([cid, *got_row, only or name])
                    continue
            got = _reader_of(c)
            if got is _PASSED:
                continue
            firsts.append((len(rows), cid, c, got))
            rows.append(None)  # its row's place, in the order of the path
            if got is not None:
                stateful = stateful or got[0].stateful
                if got[2]:
                    want.append(got[1]["raw"])
            elif c.body is not None and isinstance(c.meta.get("pm"), dict) and "usage" in c.meta["pm"]:
                bodies.append(hex_id(c.body))
    lines: dict[str, Any] = {}
    if want:  # lines of commits imported before their importer kept the usage record
        from .adapters.jsonl_tree import read_blobs
    for i in range(0, len(want), 1024):
        for oid, raw in read_blobs(store, want[i:i + 1024]).items():
            with contextlib.suppress(InvalidEntry):
                lines[oid] = json_loads(raw)
    values = {oid: getattr(v, "value", None) for oid, v in store.objects.get_many(bodies).items()} if bodies else {}

    def read(cid: str, c: Commit, got: tuple[Reader, dict[str, Any], bool] | None, w: Walk) -> Response | None:
        if got is None:
            return _meta_usage(cid, c, values.get(hex_id(c.body)) if c.body is not None else None)
        reader, m, needs = got
        d = lines.get(m["raw"]) if needs else None
        return reader.read(w, cid, c, m, d if isinstance(d, dict) else None)

    def row_of(cid: str, r: Response | None) -> Row | None:
        if r is None:
            return None
        t = r.tokens
        return [cid, r.identity, r.model, r.time, t.input, t.output, t.cache_read, t.cache_write,
                only or names[owner[cid]]]

    if not stateful or only is not None:  # each commit read once, where it was first visited
        w = Walk()
        for at, cid, c, got in firsts:
            kept = got[0].kept if got is not None else None
            if kept is not None:  # the usage record the importer kept: no call to the reader
                rec = got[1].get(kept[1])  # type: ignore[index]  # got is not None with kept
                if isinstance(rec, list):
                    got_row = kept_record(kept[0], rec, cid, c.time)
                    if got_row is not None:
                        rows[at] = [cid, *got_row, only or names[owner[cid]]]
                    continue
            rows[at] = row_of(cid, read(cid, c, got, w))
        return [r for r in rows if r is not None] if firsts else cast("list[Row]", rows)
    rows = []  # every path read again, root first
    done: set[str] = set()
    for path in paths:
        w = Walk()
        for cid, c in path:
            got = _reader_of(c)
            if got is _PASSED:
                continue
            if cid not in done:
                done.add(cid)
                rows.append(row_of(cid, read(cid, c, got, w)))
            elif got is not None and got[0].stateful:  # read again only for the state of this path's walk
                read(cid, c, got, w)
    return [r for r in rows if r is not None]


_first = itemgetter(0)


class Elsewhere(Exception):  # not an error: where a share's walk stops
    """A commit :func:`session_rows` needs is not among the commits it was given to walk
    through alone (``visited``): the session is read by who holds them all."""


def _elsewhere(cid: str) -> Any:
    raise Elsewhere(cid)


def _place(path: list[tuple[str, Commit]], cid: str, depth: int) -> int:
    """Where commit ``cid`` (of ``depth``, if the depths count the path) is on ``path``."""
    if 0 <= depth < len(path) and path[depth][0] == cid:
        return depth
    return next(i for i, (x, _c) in enumerate(path) if x == cid)


def _decoded_path(decoded: Callable[[str], Commit | None], tip: str) -> list[tuple[str, Commit]] | None:
    """The path root -> ``tip`` through the commits ``decoded`` gives, or None when one is not
    there or the depths do not count the path (then the history reads it, and says what is
    wrong)."""
    out: list[tuple[str, Commit]] = []
    add = out.append
    cid: str | None = tip
    depth = -1
    while cid is not None:
        c = decoded(cid)
        if c is None or (depth >= 0 and c.depth != depth - 1):
            return None
        add((cid, c))
        depth = c.depth
        cid = c.parents[0].hex() if c.parents else None
    if depth != 0:
        return None
    out.reverse()
    return out


def _tips(refs: Mapping[str, str], current: str | None) -> list[tuple[str, str]]:
    """``(name, commit)`` of what a session's refs (name -> target, as
    :meth:`~castore.store.Store.session_refs` reads them) name, in the order rows are given a
    branch: the branch HEAD is on (segment ``current``), the other branches by name, the
    labels, a detached HEAD."""
    from .refnames import real_name

    ranked: list[tuple[tuple[int, str], str]] = []
    for rel, target in refs.items():
        kind, _, seg = rel.partition("/")
        if rel == "HEAD":
            ranked.append(((3, "HEAD"), target))
        elif kind in ("heads", "tags") and seg and "/" not in seg:
            rank = (0 if seg == current else 1) if kind == "heads" else 2
            ranked.append(((rank, real_name(seg, None)), target))
    ranked.sort()
    return [(n, t) for (_r, n), t in ranked]


# -- the cache -----------------------------------------------------------------------------------
def cache_path(store: Store) -> str:
    """The file the usage rows of ``store`` are cached in (see the module docstring)."""
    if store.root is not store:  # a tenant's rows: beside the root store's
        return cache_path(store.root) + "." + "-".join(store.tenant_segments or ())
    got = os.environ.get("CASTORE_USAGE_CACHE")
    if got:
        return got
    url = str(getattr(store.storage, "url", "") or repr(store))
    url = url if "://" in url else os.path.abspath(url)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "castore", "usage", hashlib.sha256(url.encode()).hexdigest()[:32] + ".json")


class _CachedSession(TypedDict):
    """A session in the cache file: its key, the refs and branch its rows were read at, the rows."""

    key: tuple[str, str, str]
    refs: dict[str, str]
    head: str | None
    rows: list[tuple[str, str, str | None, int | float, int, int, int, int, str]]  # a Row


class _Cache(TypedDict):
    """The cache file (:func:`_save_cache`); a key it does not name is passed over."""

    version: int
    url: str
    mark: str | None
    sessions: dict[str, _CachedSession]


def _load_cache(path: str, url: str) -> dict[str, Any]:
    """The cache at ``path`` if it is one of this version for the store at ``url``, else ``{}``
    (none, unreadable, or of another shape: damaged, edited, another version's; the cache is
    derived data, made again whole). Its shape is checked as it is parsed, before a value of it
    is used. Raises nothing."""
    try:
        with open(path, "rb") as f:
            doc = json_loads_as(f.read(), _Cache)
    except (OSError, InvalidEntry):
        return {}
    if doc["version"] != CACHE_VERSION or doc["url"] != url:
        return {}
    return cast("dict[str, Any]", doc)


def _save_cache(path: str, doc: dict[str, Any]) -> None:
    """Write the cache whole (a new file, then renamed); a folder that cannot be written is skipped."""
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".usage-", dir=os.path.dirname(path) or ".")
        with os.fdopen(fd, "wb") as f:
            f.write(json_dumps_sorted(doc))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(tmp)


def all_rows(store: Store, *, cache: bool = True, unreadable: dict[Key, str] | None = None) -> dict[Key, list[Row]]:
    """Every session's rows (:func:`session_rows`), through the cache unless ``cache`` is False
    (a ``memory://`` or an encrypted store is never cached); in the tenants layout, tenant by
    tenant (:meth:`~castore.store.Store.stores`: an erased tenant is left out), each its own cache.

    ``unreadable``: where a session whose objects cannot be read (missing or damaged), or whose
    HEAD names a lost branch (:func:`castore.plumbing.lost_branch_problem`), is noted,
    key -> the error, and left out, instead of stopping at it; a cache is then not saved, so the
    next run reads it again.

    Raises:
        ObjectNotFound, IntegrityError: (without ``unreadable``) a session cannot be read
            (CorruptRef, an IntegrityError: its HEAD's branch is lost).
        StorageError.
    """
    out: dict[Key, list[Row]] = {}
    for st in store.stores():
        out.update(_rows_of(st, cache, unreadable))
    return out


def _readable_rows(store: Store, key: Key, refs: Any, head: Any, unreadable: dict[Key, str] | None,
                   commits: Mapping[str, Commit] | None = None,
                   lost: Mapping[Key, CorruptRef] | None = None) -> list[Row] | None:
    """:func:`session_rows`, or None (noted in ``unreadable``) when the session cannot be read:
    its objects, or the branch its HEAD names, which is lost (``lost``, as
    :meth:`~castore.store.Store.session_refs_and_heads` notes it: its responses would be
    missing from the counts, unsaid)."""
    from .errors import IntegrityError, ObjectNotFound

    try:
        if lost and key in lost:
            raise lost[key]
        return session_rows(store, key, refs, head, commits)
    except (ObjectNotFound, IntegrityError) as e:
        if unreadable is None:
            raise
        unreadable[key] = str(e)
        return None


def _rows_of(store: Store, cache: bool, unreadable: dict[Key, str] | None = None,
             doc: dict[str, Any] | None = None) -> dict[Key, list[Row]]:
    """The rows of one flat store (a root store, or a tenant's in the tenants layout); ``doc``:
    its cache as :func:`_load_cache` read it already."""
    url = str(getattr(store.storage, "url", "") or "")
    lost: dict[Key, CorruptRef] = {}
    cached = cache and _cacheable(store, url)
    old: dict[str, Any] = {}
    moved: list[str] | None = None
    if cached:
        path = cache_path(store)
        url = url if "://" in url else os.path.abspath(url)
        doc = _load_cache(path, url) if doc is None else doc
        old = doc.get("sessions", {})
    # nothing cached: every session is read, most likely through the store-wide pass, which a
    # worker starts on now, while this process reads the refs (:func:`_start_worker`)
    worker = _start_worker(store, EARLY_SHARES) if not old else None
    with worker or contextlib.nullcontext():
        if cached:
            mark, moved = store.refs.changes_since("sessions", doc.get("mark") if doc else None)
            if moved is not None and not moved:
                return {tuple(v["key"]): v["rows"] for v in old.values()}
        if moved is None:
            fresh = _with_lost(store.session_refs_and_heads(lost=lost), lost)
            sessions: dict[str, Any] = {}
        else:
            folders = {"/".join(parts[:4]) for n in moved if len(parts := n.split("/")) >= 5}
            fresh = _with_lost(store.session_refs_and_heads(folders, lost), lost)
            sessions = {f: v for f, v in old.items() if f not in folders}
        todo = []
        for key, (folder, refs, head) in fresh.items():
            prev = old.get(folder)
            if prev is not None and prev["refs"] == refs and prev["head"] == head and tuple(prev["key"]) == key:
                sessions[folder] = prev
            else:
                todo.append((key, folder, refs, head))
        read = _read_sessions(store, [(key, refs, head) for key, _f, refs, head in todo], len(sessions) + len(todo),
                              unreadable, lost, worker)
    if not cached:
        return {k: v for k, v in read.items() if v is not None}
    failed = False
    for key, folder, refs, head in todo:
        rows = read[key]
        if rows is None:
            failed = True  # no cache saved: its mark would say the session was read
            continue
        sessions[folder] = {"key": list(key), "refs": refs, "head": head, "rows": rows}
    if not failed:
        _save_cache(path, {"version": CACHE_VERSION, "url": url, "mark": mark, "sessions": sessions})
    return {tuple(v["key"]): v["rows"] for v in sessions.values()}


def _with_lost(every: dict[Key, Any], lost: Mapping[Key, CorruptRef]) -> dict[Key, Any]:
    """``every`` (:meth:`~castore.store.Store.session_refs_and_heads`) with the sessions of
    ``lost`` that it leaves out (only HEAD left), so that each is noted as unreadable too."""
    every.update({k: ("", {}, None) for k in lost if k not in every})
    return every


def _scans(todo: int, of: int) -> bool:
    """Whether reading ``todo`` sessions of the ``of`` there are starts with a store-wide pass
    (:func:`load_commits`): at least :data:`SCAN_MIN_SESSIONS`, and half of them."""
    return todo >= SCAN_MIN_SESSIONS and 2 * todo >= of


def load_commits(store: Store, todo: int, of: int) -> dict[str, Commit] | None:
    """Every commit of ``store`` decoded in one pass over what is stored (each pack read whole,
    each record decompressed once, the commits told by their kind tag:
    :meth:`~castore.objectstore.ObjectStore.iter_tagged`), by id (the hash of the bytes
    found), when the ``todo`` sessions about to be read are at least :data:`SCAN_MIN_SESSIONS`
    and half of the ``of`` sessions there are: the paths are then walked through them
    (:func:`session_rows`) with no read per commit. Fewer are cheaper read path by path: None.
    Up to :data:`SCAN_MAX_COMMITS` are decoded (a path beyond them is read as it would be
    without), into one dictionary that is then handed to the store's cache of decoded objects
    once (:meth:`~castore.objectstore.ObjectStore.keep_decoded`: they live as long as the store,
    unless one is larger than it keeps); bytes that do not decode are left out (``fsck``
    reports them).

    Raises:
        StorageError: the backend failed.
    """
    if not _scans(todo, of):
        return None
    with gc_paused():
        out, biggest = _decode_commits(store, SCAN_MAX_COMMITS)
        # they live as long as the store (freeing them is a twentieth of the run, and a
        # process that ends without teardown never does), and a path read later finds them
        store.objects.keep_decoded(out, biggest)
    return out


def _decode_commits(store: Store, limit: int, part: tuple[int, int, int] | None = None,
                    raws: dict[str, bytes] | None = None) -> tuple[dict[str, Commit], int]:
    """:func:`load_commits`' pass (up to ``limit`` commits; ``part``: some shares of what is
    stored, :meth:`~castore.objectstore.ObjectStore.iter_tagged`), and the size of the largest
    commit; the canonical bytes of each commit decoded go into ``raws`` too. The records read
    are not kept for a later read (their commits are). Raises StorageError."""
    from .errors import IntegrityError
    from .objects import Commit, decode_many

    digest_many = store.objects.codec.digest_many
    out: dict[str, Commit] = {}
    biggest = 0
    for found in store.objects.iter_tagged(Commit, part, keep=False):
        found = found[:limit - len(out)]
        ids = digest_many(found)
        biggest = max(biggest, max(map(len, found), default=0))
        # commits all: the kind tag the bytes were told by is the one msgspec decodes by
        try:
            out.update(zip(ids, cast("list[Commit]", decode_many(ids, found)), strict=True))
            if raws is not None:
                raws.update(zip(ids, found, strict=True))
        except IntegrityError:  # one does not decode: the others one by one
            for oid, raw in zip(ids, found, strict=True):
                with contextlib.suppress(IntegrityError):
                    out[oid] = cast("Commit", decode_many([oid], [raw])[0])
                    if raws is not None:
                        raws[oid] = raw
        if len(out) >= limit:
            break
    return out, biggest


def _read_sessions(store: Store, todo: list[tuple[Key, Any, Any]], of: int, unreadable: dict[Key, str] | None,
                   lost: Mapping[Key, CorruptRef], worker: Worker | None = None) -> dict[Key, list[Row] | None]:
    """The rows of each session of ``todo`` (``(key, refs, head)``, as
    :meth:`~castore.store.Store.session_refs_and_heads` reads them), of the ``of`` the store
    holds: None where it cannot be read (:func:`_readable_rows`). A first run's store-wide pass
    (:func:`_scans`) is shared with ``worker`` (:func:`_start_worker`) where one was started
    (:func:`_read_shared`); a worker not needed is stopped.

    Raises:
        ObjectNotFound, IntegrityError: (without ``unreadable``) a session cannot be read.
        StorageError.
    """
    done: dict[Key, list[Row]] = {}
    commits: dict[str, Commit] | None
    if _scans(len(todo), of) and (worker is not None or (worker := _start_worker(store, LATE_SHARES)) is not None):
        with worker:
            done, commits = _read_shared(store, todo, lost, worker)
    else:
        if worker is not None:
            worker.stop()  # a store too small for its pass to pay: its work is not wanted
        commits = load_commits(store, len(todo), of)
    return {key: done[key] if key in done else _readable_rows(store, key, refs, head, unreadable, commits, lost)
            for key, refs, head in todo}


class Worker(Forked):
    """A worker of :func:`_start_worker`: its process, and the shares of the stored records
    the process and it decode (``shares``, ``(own, n)``: the process the shares ``0`` to
    ``own - 1`` of ``n``, the worker the rest).

    Raises:
        OSError: the fork failed.
    """

    def __init__(self, work: Callable[[Callable[[], bytes]], bytes], shares: tuple[int, int]) -> None:
        self.shares = shares
        super().__init__(work)


#: the shares of the stored records (:meth:`~castore.objectstore.ObjectStore.iter_tagged`) that
#: a first run's process and its worker decode, ``(own, n)``: the process ``own`` of ``n``, the
#: worker the rest. A worker started before the refs are read takes three of five (it starts on
#: them while the process reads the refs, a tenth of the run); one started after, half.
EARLY_SHARES = (2, 5)
LATE_SHARES = (1, 2)


def _share(shares: tuple[int, int], worker: bool) -> tuple[int, tuple[int, int, int]]:
    """What the worker (``worker``) or the process decodes of the stored records for
    ``shares`` (``(own, n)``, :data:`EARLY_SHARES`): its most commits (its share of
    :data:`SCAN_MAX_COMMITS`) and its part (:meth:`~castore.objectstore.ObjectStore.iter_tagged`'s
    ``part``: the shares ``own`` to ``n - 1`` for the worker, ``0`` to ``own - 1`` for the
    process)."""
    own, n = shares
    if worker:
        return SCAN_MAX_COMMITS * (n - own) // n, (own, n, n)
    return SCAN_MAX_COMMITS * own // n, (0, own, n)


def _start_worker(store: Store, shares: tuple[int, int]) -> Worker | None:
    """A worker forked now (:class:`~castore.forked.Forked`) to decode its share of the stored
    commits (:func:`_decode_commits`; ``shares``: see :data:`EARLY_SHARES`) and then read the
    sessions that share holds whole (:func:`_rows_within`), once :func:`_read_shared` sends it
    which sessions to read; None where none may start (:func:`~castore.forked.can_fork`: one
    thread, two cores; on S3 s3fs's I/O thread runs by then) or the store has fewer than
    :data:`SCAN_MIN_SESSIONS` session folders (their pass would not pay).

    Raises:
        StorageError: the listing of the session folders failed.
        OSError: the fork failed.
    """
    from .forked import can_fork
    from .objects import pack, unpack

    if not can_fork() or not _has_sessions(store, SCAN_MIN_SESSIONS):  # no listing where none may start (S3)
        return None
    limit, part = _share(shares, worker=True)

    def work(receive: Callable[[], bytes]) -> bytes:
        raws: dict[str, bytes] = {}
        commits, _ = _decode_commits(store, limit, part, raws)
        doc = unpack(receive())
        todo = [((k[0], k[1], k[2]), refs, head) for k, refs, head in doc["todo"]]
        lost = dict.fromkeys((k[0], k[1], k[2]) for k in doc["lost"])
        seen: set[str] = set()
        rows = _rows_within(store, todo, cast("dict[Key, Any]", lost), commits, seen)
        left = [cid for cid in raws if cid not in seen]
        return pack({"rows": [[list(k), v] for k, v in rows.items()], "left": left, "raws": [raws[c] for c in left]})

    return Worker(work, shares)


def _has_sessions(store: Store, n: int) -> bool:
    """Whether ``store`` has at least ``n`` session folders (``sessions/APP/PROJECT/SESSION``),
    counted from the folders' listings, not their refs. Raises StorageError."""
    if n <= 0:
        return True
    seen = 0
    for app in store.refs.list_dir("sessions"):
        for project in store.refs.list_dir(f"sessions/{app}"):
            seen += len(store.refs.list_dir(f"sessions/{app}/{project}"))
            if seen >= n:
                return True
    return False


def _read_shared(store: Store, todo: list[tuple[Key, Any, Any]], lost: Mapping[Key, CorruptRef],
                 worker: Worker) -> tuple[dict[Key, list[Row]], dict[str, Commit]]:
    """:func:`load_commits`' pass and the rows of ``todo``'s sessions shared with ``worker``
    (:func:`_start_worker`): it is sent ``todo``; each process decodes its share of the stored
    records (:meth:`~castore.objectstore.ObjectStore.iter_tagged`) and reads the sessions its
    share holds whole (:func:`_rows_within`); the worker sends back its rows and the commits
    none of its sessions walked. Returns the rows read (a session that neither share holds
    whole, or that failed, is not there: the caller reads it through the commits returned, the
    process's share and those the worker sent back, kept by the store as
    :func:`load_commits` keeps them). A worker whose work raised, or that ended without its
    answer (a signal: the OOM killer), leaves its share to be read here: the same rows.

    Raises:
        StorageError.
    """
    from .objects import decode_many, pack, unpack

    worker.send(pack({"todo": [[list(k), refs, head] for k, refs, head in todo], "lost": [list(k) for k in lost]}))
    with gc_paused():
        commits, biggest = _decode_commits(store, *_share(worker.shares, worker=False))
        done = _rows_within(store, todo, lost, commits, set())
        try:
            answer = worker.answer()
        except WorkerDied:  # killed (the OOM killer): its share is read here as well
            answer = None
        if answer is None:  # the worker's pass raised or died: read here, where an error is met
            more, big = _decode_commits(store, *_share(worker.shares, worker=True))
            commits.update(more)
            biggest = max(biggest, big)
        else:
            doc = unpack(answer)
            for k, v in doc["rows"]:
                done.setdefault((k[0], k[1], k[2]), v)  # a session both shares hold: the same rows
            left, raws = doc["left"], doc["raws"]
            commits.update(zip(left, cast("list[Commit]", decode_many(left, raws)), strict=True))
            biggest = max(biggest, max(map(len, raws), default=0))
        store.objects.keep_decoded(commits, biggest)
    return done, commits


def _rows_within(store: Store, todo: list[tuple[Key, Any, Any]], lost: Mapping[Key, CorruptRef],
                 commits: dict[str, Commit], seen: set[str]) -> dict[Key, list[Row]]:
    """The rows of each session of ``todo`` whose paths ``commits`` hold whole (a session of
    ``lost``, or one that fails, is left to be read with every commit at hand, where its error
    is noted); the commits walked go into ``seen``."""
    from .errors import IntegrityError, ObjectNotFound

    out: dict[Key, list[Row]] = {}
    for key, refs, head in todo:
        if key in lost:
            continue
        walked: set[str] = set()
        try:
            out[key] = session_rows(store, key, refs, head, commits, walked)
        except (Elsewhere, ObjectNotFound, IntegrityError):
            continue
        seen |= walked
    return out


def _cacheable(store: Store, url: str) -> bool:
    """Whether ``store``'s rows may be cached: not a ``memory://`` one, and not an encrypted one
    (the cache would hold its sessions' names and counts in the clear; the rule of the search
    index, :func:`castore.grep.index.indexable`)."""
    from .grep.index import indexable

    return bool(url) and not url.startswith("memory://") and indexable(store)


def update_if_present(store: Store) -> bool:
    """Bring ``store``'s usage cache up to date if it has one (what an import calls, as it does
    for the search index, so that the next ``castore usage`` reads no session); True if it did.
    A store without a cache is left without one: the first ``castore usage`` makes it, and an
    import that never meets a usage run pays nothing for it.

    Raises:
        ObjectNotFound, IntegrityError: a session of the cache cannot be read.
        StorageError.
    """
    done = False
    for st in store.stores():
        url = str(getattr(st.storage, "url", "") or "")
        if _cacheable(st, url):
            # this store's cache (the file may hold another store's: $CASTORE_USAGE_CACHE)
            doc = _load_cache(cache_path(st), url if "://" in url else os.path.abspath(url))
            if doc:
                with gc_paused():
                    _rows_of(st, True, None, doc)
                done = True
    return done


# -- prices --------------------------------------------------------------------------------------
_FIELDS = ("input", "output", "cache_read", "cache_write")


@dataclass
class Prices:
    """A price table: USD per million tokens per model (``input``, ``output``, ``cache_read``,
    ``cache_write``), with where it comes from."""

    models: dict[str, dict[str, float]]
    date: str = ""
    source: str = ""

    def of(self, model: str | None) -> dict[str, float] | None:
        """The prices of ``model``: its own entry, else that of the name without a ``-YYYYMMDD``
        date or a ``provider/`` prefix, else the longest entry the name starts with (None: unknown)."""
        if not model:
            return None
        for name in (model, model.rsplit("/", 1)[-1]):
            if name in self.models:
                return self.models[name]
            bare = re.sub(r"-\d{8}$", "", name)
            if bare in self.models:
                return self.models[bare]
        best = max((k for k in self.models if model.rsplit("/", 1)[-1].startswith(k)), key=len, default=None)
        return self.models[best] if best is not None else None

    def cost(self, model: str | None, t: Tokens) -> float | None:
        """What ``t`` costs with ``model``'s prices (None: the model has none)."""
        p = self.of(model)
        return None if p is None else _priced(p, t.input, t.output, t.cache_read, t.cache_write)


def _priced(p: dict[str, float], i: int, o: int, cr: int, cw: int) -> float:
    """What these counts cost at prices ``p`` (USD per million tokens)."""
    return (i * p.get("input", 0.0) + o * p.get("output", 0.0)
            + cr * p.get("cache_read", 0.0) + cw * p.get("cache_write", 0.0)) / 1e6


def _price(v: Any) -> bool:
    """Whether ``v`` is a price: a number, finite (as a float), 0 or more."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(float(v)) and v >= 0
    except OverflowError:  # an integer beyond any float
        return False


def load_prices(path: str | None = None) -> Prices:
    """The price table shipped with castore (``castore/data/prices.json``), or the one at ``path``.

    A table is ``{"date": ..., "source": ..., "models": {NAME: {"input": USD, "output": USD,
    "cache_read": USD, "cache_write": USD}}}`` (USD per million tokens, each a finite number
    of 0 or more; a missing price is 0). A table given replaces the shipped one whole.

    Raises:
        UsageError: the file cannot be read or is not such a table (a price that is no number,
            negative or infinite; a key other than those four, such as a misspelt one).
    """
    where = path or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "prices.json")
    try:
        with open(where, "rb") as f:
            doc = json.loads(f.read())
    except OSError as e:
        raise UsageError(f"cannot read the price table {where}: {e.strerror or e}") from e
    except ValueError as e:
        raise UsageError(f"the price table {where} is not JSON: {e}") from e
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, dict):
        raise UsageError(f"the price table {where} has no \"models\" object")
    out: dict[str, dict[str, float]] = {}
    for name, p in models.items():
        if not isinstance(p, dict) or not all(_price(p.get(k, 0)) for k in _FIELDS):
            raise UsageError(f"the price table {where}: model {name!r} needs numbers of 0 or more (USD per "
                             f"million tokens) for {', '.join(_FIELDS)}")
        if unknown := sorted(str(k) for k in p if k not in _FIELDS):
            raise UsageError(f"the price table {where}: model {name!r} has {', '.join(map(repr, unknown))}, "
                             f"not one of {', '.join(_FIELDS)}")
        out[name] = {k: float(p.get(k, 0)) for k in _FIELDS}
    return Prices(out, str(doc.get("date", "")), str(doc.get("source", "")))


# -- adding up -----------------------------------------------------------------------------------
@dataclass
class Group:
    """One row of a report: the responses of one session, branch, model, project or day."""

    name: str
    responses: int = 0
    tokens: Tokens = field(default_factory=Tokens)
    cost: float = 0.0
    unpriced: int = 0  # responses of a model the price table does not know
    models: set[str] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        """The row as JSON."""
        return {"name": self.name, "responses": self.responses, **self.tokens.to_json(),
                "cost": round(self.cost, 6), "unpriced_responses": self.unpriced, "models": sorted(self.models)}


@dataclass
class Report:
    """What :func:`usage` returns: the rows of the grouping, their total, and what was merged."""

    by: str
    groups: list[Group]
    total: Group
    copies: int  # responses read more than once (a copy in another session, branch or line)
    prices: Prices
    #: sessions left out because their objects cannot be read ("APP/USER/SESSION" -> the error)
    unreadable: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON (the schema ``castore usage --json`` prints)."""
        return {"by": self.by, "rows": [g.to_json() for g in self.groups], "total": self.total.to_json(),
                "copies_merged": self.copies,
                "prices": {"date": self.prices.date, "source": self.prices.source},
                "unreadable": [{"session": k, "error": v} for k, v in sorted(self.unreadable.items())]}


#: the days :func:`_day` has named, by their number since the epoch
_DAYS: dict[int, str] = {}


def _day(t: float) -> str:
    if t <= 0:
        return "unknown"
    n = int(t // 86400)  # a UTC day is 86,400 seconds of the epoch's count (no leap seconds)
    got = _DAYS.get(n)
    if got is None:
        got = _DAYS[n] = datetime.fromtimestamp(n * 86400, UTC).strftime("%Y-%m-%d")
    return got


def usage(store: Store, *, by: str = "model", prices: Prices | None = None, app: str | None = None,
          since: str | None = None, until: str | None = None, cache: bool = True) -> Report:
    """Tokens and cost of every model response in ``store``, each counted once, grouped ``by``
    session, branch, model, project (the session key's middle part: a Claude Code project
    folder) or day (UTC).

    Args:
        store: the store.
        by: one of :data:`GROUPS`.
        prices: the price table (default: :func:`load_prices`).
        app: only sessions of this app (``claude``, ``codex``, ``pi``, ...).
        since, until: only responses of these days (``YYYY-MM-DD``, UTC, both included).
        cache: read through the usage cache (see the module docstring).

    A session whose objects cannot be read (missing or damaged: ``castore fsck``), or whose
    HEAD names a lost branch, is left out and named in the report's ``unreadable``; the others
    are counted.

    Raises:
        UsageError: a bad ``by``, ``since`` or ``until``.
        StorageError.
    """
    if by not in GROUPS:
        raise UsageError(f"cannot group by {by!r}: one of {', '.join(GROUPS)}")
    for d in (since, until):
        if d is not None and not _is_day(d):
            raise UsageError(f"not a day (YYYY-MM-DD): {d!r}")
    prices = prices if prices is not None else load_prices()
    unreadable: dict[Key, str] = {}
    with gc_paused():  # the rows and the commits decoded for them stay alive: nothing to collect
        report = _report(all_rows(store, cache=cache, unreadable=unreadable), by, prices, app, since, until)
    report.unreadable = {"/".join(k): v for k, v in unreadable.items() if app is None or k[0] == app}
    return report


def _is_day(d: str) -> bool:
    """Whether ``d`` is a day of the calendar written ``YYYY-MM-DD`` (2025-02-30 is not)."""
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", d):
        return False
    try:
        date.fromisoformat(d)
    except ValueError:
        return False
    return True


def _report(rows: dict[Key, list[Row]], by: str, prices: Prices, app: str | None, since: str | None,
            until: str | None) -> Report:
    """:func:`usage`'s report of every session's ``rows``."""
    # each response's earliest copy: by its time (0: unknown, last), then by session key and
    # place in the session, which is the order the rows are visited in
    best: dict[str, tuple[float, Key, Row]] = {}
    copies = 0
    unknown = float("inf")
    for key in sorted(rows):
        if app is not None and key[0] != app:
            continue
        for r in rows[key]:
            t = r[3] if r[3] > 0 else unknown
            got = best.get(r[1])
            if got is not None:
                copies += 1
                if got[0] <= t:
                    continue
            best[r[1]] = (t, key, r)
    groups: dict[str, Group] = {}
    total = Group("total")
    price: dict[Any, Any] = {}  # model -> its prices (None: it has none), as Prices.of finds them
    for _rank, key, r in best.values():
        day = _day(r[3])
        if (since is not None and day < since) or (until is not None and day > until):
            continue
        if by == "day":
            name = day
        elif by == "model":
            name = r[2] or "unknown"
        elif by == "session":
            name = "/".join(key)
        elif by == "branch":
            name = "/".join(key) + ":" + str(r[8])
        else:
            name = f"{key[0]}/{key[1]}"
        model = r[2]
        p = price.get(model, price)  # price itself: not looked up yet
        if p is price:
            p = price[model] = prices.of(model)
        i, o, cr, cw = r[4], r[5], r[6], r[7]
        cost = None if p is None else _priced(p, i, o, cr, cw)
        for g in (groups.get(name) or groups.setdefault(name, Group(name)), total):
            g.responses += 1
            t = g.tokens
            t.input += i
            t.output += o
            t.cache_read += cr
            t.cache_write += cw
            g.models.add(model or "unknown")
            if cost is None:
                g.unpriced += 1
            else:
                g.cost += cost
    order: Callable[[Group], Any] = (lambda g: g.name) if by in ("day", "session", "branch") else \
        (lambda g: (-g.cost, -g.tokens.total, g.name))
    return Report(by, sorted(groups.values(), key=order), total, copies, prices)
