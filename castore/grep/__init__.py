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
over the local index of :mod:`castore.grep.index`, first brought up to date: on local disk the
ref layer tells which refs moved since the index last looked
(:meth:`castore.refs.RefStore.changes_since`; nothing moved: one ``stat`` and no ref read),
and only those sessions are read again and written to the index's small second segment (the
rest of the index is not rewritten).

An encrypted store has no index (it would hold its text in the clear): it is always searched
without one, its objects opened in memory. Without the index (``index=False``,
``--no-index``), a format-2 store is *scanned* (every
stored object read once, store-wide) and a format-1 store is *walked* (each session's
branches; ``scan=False`` forces it): :mod:`castore.grep.scan`.

Either way a commit shared by several branches, or by a fork and its parent session, is
read and reported once, naming every branch that holds it. Matches come in session order (by
app, user, session id), root to tip within a session; a commit several sessions share is
reported with the first of them (the others under ``also``). A count (:func:`grep_counts`,
``-l`` and ``-c``) is per session: a match counts in its session and in each under its
``also``, as a search of that session alone would count it (``tests/test_grep_copies.py``
runs every way of searching over a file imported twice and a fork).

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

:func:`grep_rows` gives the same matches as tuples (:data:`Row`), :func:`grep_columns` as
columns, a :class:`MatchColumns` per session (a one-line block found by a plain string given
as its text alone when no spans are asked for), and :func:`grep_counts` their number per
session: through the index none of them builds a :class:`Match` (``castore grep`` prints the
columns, ``-C`` and colour the rows; ``-c`` and ``-l`` use the counts), and a count does not
even decode a block a plain string was found in when the block is ASCII.

The package, top down (each module imports only those below it):

=============== ==========================================================================
``__init__``    the API: :func:`grep`, :func:`grep_rows`, :func:`grep_columns`,
                :func:`grep_counts`, their options checked, and the search through the index
``rows.py``     the matches of the index's hits, made column by column: rows, columns,
                Match objects, counts per session
``index.py``    the local index: what it holds, keeping it fresh, finding candidate blocks
``files.py``    the index's files: a segment's parts, their writing and checks, commit numbers
``scan.py``     the search without the index: the store-wide scan of stored bytes (format
                2/3; the codec probes of :mod:`castore.objects`) and the walk (format 1)
``blocks.py``   the kinds, the searchable blocks of a body (bodies read in batches), a commit's time,
                the context entries around a match
``match.py``    what a match is (:class:`Match`, :class:`LineMatch`) and line matching;
                imported by the first search that builds a match (not by counting or
                printing lines through the index: ``castore grep`` only with ``--json``)
``filters.py``  the session and tool filters, a pattern's spans in a line, the JSON time
=============== ==========================================================================

The metadata key of injected entries (:data:`~castore.entries.INJECTED`) is defined with
the entries; it is re-exported here (imported when asked for: a search loads no entries module).
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import CastoreError
from ..gcpause import gc_paused
from .blocks import DEFAULT_KINDS, KINDS, TOOL_ROLES, blocks, context_entries
from .filters import compile_regex, glob_any, iso_time, session_ok, spans_finder
from .index import hits, indexable, open_index
from .rows import COLUMNS, COUNTS, MATCHES, ROWS, SPANLESS, MatchColumns, Row, built, count

if TYPE_CHECKING:
    from ..store import Store
    from .match import LineMatch, Match

class GrepError(CastoreError, ValueError):
    """A search cannot run: a bad pattern or filter."""


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
        return compile_regex(src, re.IGNORECASE if ignore_case else 0)
    except (re.error, OverflowError, RecursionError) as e:  # a{99999999999}, ((((...: not re.error
        raise GrepError(f"bad regular expression {pattern!r}: {e}") from e


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
        role_set |= set(TOOL_ROLES)
    session_globs = tuple(sessions) if sessions else None
    app_globs = tuple(apps) if apps else None

    def keep_block(key: tuple[str, str, str], role: str, bkind: str, tool: str | None) -> bool:
        if bkind not in want_kinds or (role_set is not None and role not in role_set):
            return False
        if tool_globs is not None and not glob_any(tool, tool_globs):
            return False
        return session_ok(key, session_globs, app_globs)

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
                                          "apps", "since", "until", "limit", "context", "unreadable", "unsaved"}
    if unknown:
        raise TypeError(f"unexpected option(s) {sorted(unknown)}")
    index = options.get("index")
    if index is None:
        index = not str(getattr(store.storage, "url", "")).startswith("memory://")
    if not index or not indexable(store) or options.get("context") or options.get("typed"):
        return None
    what = {k: v for k, v in options.items() if k not in _HOW and k not in ("unreadable", "unsaved")}
    rx, want_kinds, _, session_globs, app_globs, keep_block, _, filtered = _options(pattern, **what)
    limit = what.get("limit")
    if limit == 0 or not store.exists:
        return iter(())
    return _grep_index(store, rx, keep_block if filtered else None, what.get("since"), what.get("until"), limit, 0,
                       want_kinds, options.get("check_index", True), form,
                       _Damaged(options.get("unreadable"), session_globs, app_globs), options.get("unsaved"))


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
    if _tenanted(store):
        yield from _over_tenants(store, grep_rows, pattern, options)
        return
    fast = _by_index(store, pattern, options, ROWS)
    if fast is not None:
        yield from fast
        return
    for m in grep(store, pattern, **options):
        yield _row(m)


def grep_columns(store: Store, pattern: str, *, spans: bool = True, **options: Any) -> Iterator[MatchColumns]:
    """The matches of ``grep(store, pattern, **options)``, in the same order, as columns: a
    :class:`MatchColumns` per run of matches of one session (through the index a session's matches
    come as one run, and neither a Match nor a row is built per match). ``spans=False``: a block
    that is one line holding a plain string the index found there is given as its text alone, its
    spans not sought (what printing lines without colour needs). No context entries: ``context``
    is not taken.

    Raises:
        as :func:`grep`; TypeError: an option :func:`grep` does not take, or ``context``.
    """
    if "context" in options:
        raise TypeError("grep_columns takes no context")
    if not _tenanted(store):
        fast = _by_index(store, pattern, options, COLUMNS if spans else SPANLESS)
        if fast is not None:
            yield from fast
            return
    for key, rows in itertools.groupby(grep_rows(store, pattern, **options), operator.itemgetter(1)):
        cms, _, branches, roles, kinds, tls, whens, lines, others, *_ = zip(*rows, strict=True)
        yield MatchColumns(key, cms, branches, roles, kinds, tls, whens, lines, others)


def grep_counts(store: Store, pattern: str, **options: Any) -> dict[tuple[str, str, str], int]:
    """How many of the matches of ``grep(store, pattern, **options)`` each session holds, for
    the sessions that hold one, in session order (by app, user, session id): a match counts for
    its ``session`` and for each session under its ``also`` (a commit several sessions share, an
    imported file's copy or a fork's, counts in each of them), so a session's count is what a
    search of that session alone finds; with ``limit``, only the first ``limit`` matches count.
    Through the index no match is built, and a block found by a plain string is not even
    decoded when its text is ASCII (it holds the string, so it matches).

    Raises:
        as :func:`grep`; TypeError: an option :func:`grep` does not take.
    """
    if _tenanted(store):
        counts: dict[tuple[str, str, str], int] = {}
        for t in store.stores():
            counts.update(grep_counts(t, pattern, **options))
        return counts
    fast = _by_index(store, pattern, options, COUNTS)
    if fast is not None:
        return dict(fast)
    counts = {}
    for m in grep(store, pattern, **options):
        counts[m.session] = counts.get(m.session, 0) + 1
        for other, _ in m.also:
            counts[other] = counts.get(other, 0) + 1
    return dict(sorted(counts.items()))


def grep(store: Store, pattern: str, *, ignore_case: bool | None = None, fixed: bool = False, word: bool = False,
         roles: Iterable[str] | None = None, kinds: Iterable[str] | None = None,
         tools: Iterable[str] | None = None, sessions: Iterable[str] | None = None,
         apps: Iterable[str] | None = None, since: float | None = None, until: float | None = None,
         limit: int | None = None, context: int = 0, index: bool | None = None,
         check_index: bool = True, scan: bool | None = None, typed: bool = False,
         unreadable: dict[tuple[str, str, str], str] | None = None,
         unsaved: list[str] | None = None) -> Iterator[Match]:
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
        index: search through the local index (:mod:`castore.grep.index`, brought up to date
            first) rather than by reading every object; None: for every store but ``memory://``.
            Both give the same matches. An encrypted store is never searched through an index.
        check_index: bring the index up to date with the store's refs first (False: trust it
            as the last import or search left it, skipping even the ref-change log's ``stat``).
        scan: without the index, read every stored object once, store-wide, rather than
            walking each session's branches (None: for a format-2 store). Both give the same
            matches.
        typed: only what a human typed or the agent wrote (:func:`typed_block`): user text
            and assistant blocks of entries whose metadata does not flag them ``injected``
            (the archive importers flag what the agent's CLI wrote into the conversation).
        unreadable: where each session searched whose HEAD names a lost branch
            (:func:`castore.plumbing.lost_branch_problem`) is noted, key -> fsck's line (without
            the index, any damaged HEAD :meth:`castore.Store.sessions` reports): its other
            refs are searched, the commits only the lost branch held are not. Through the
            index, a session is noted from the last update that read its refs.
        unsaved: where the search notes why the index could not be saved, when its folder cannot
            be written (read-only, another user's, a full disk): the search then builds or updates
            the index in memory only, and finds the same matches (the next search builds it again).

    Yields:
        :class:`Match`, one per matching block, each commit once.

    Raises:
        GrepError: a bad pattern, kind or limit.
        StorageError, IntegrityError: the store cannot be read.
    """
    if typed:  # a filter on the matches: the inner search counts no limit it could not keep
        some = isinstance(limit, int) and not isinstance(limit, bool) and limit > 0
        inner = grep(store, pattern, ignore_case=ignore_case, fixed=fixed, word=word, roles=roles, kinds=kinds,
                     tools=tools, sessions=sessions, apps=apps, since=since, until=until, context=context,
                     index=index, check_index=check_index, scan=scan, limit=None if some else limit,
                     unreadable=unreadable, unsaved=unsaved)
        yield from _only_typed(store, inner, limit)
        return
    rx, want_kinds, role_set, session_globs, app_globs, keep_block, keep, filtered = _options(
        pattern, ignore_case=ignore_case, fixed=fixed, word=word, roles=roles, kinds=kinds, tools=tools,
        sessions=sessions, apps=apps, since=since, until=until, limit=limit, context=context)
    tool_globs = tuple(tools) if tools else None
    if limit == 0 or not store.exists:
        return
    if _tenanted(store):
        yield from _over_tenants(store, grep, pattern, {
            "ignore_case": ignore_case, "fixed": fixed, "word": word, "roles": roles, "kinds": kinds, "tools": tools,
            "sessions": sessions, "apps": apps, "since": since, "until": until, "limit": limit, "context": context,
            "index": index, "check_index": check_index, "scan": scan, "unreadable": unreadable,
            "unsaved": unsaved})
        return
    if index is None:
        index = not str(getattr(store.storage, "url", "")).startswith("memory://")
    index = index and indexable(store)
    damaged = _Damaged(unreadable, session_globs, app_globs)
    if index:
        yield from _grep_index(store, rx, keep_block if filtered else None, since, until, limit, context, want_kinds,
                               check_index, MATCHES, damaged, unsaved)
        return
    from .scan import grep_scan, grep_walk  # the search without an index only: not on the index's path

    damaged.note_listed(store)
    if scan is None:
        scan = store.format >= 2
    if scan:
        yield from grep_scan(store, rx, keep, limit, context, want_kinds, role_set, since, until, app_globs,
                             session_globs)
    else:
        yield from grep_walk(store, rx, limit, context, want_kinds, role_set, tool_globs, since, until, app_globs,
                             session_globs)


class _Damaged:
    """Where a search notes the sessions it covers whose HEAD is damaged (``grep(unreadable=)``)."""

    def __init__(self, out: dict[tuple[str, str, str], str] | None, session_globs: tuple[str, ...] | None,
                 app_globs: tuple[str, ...] | None) -> None:
        self.out, self.session_globs, self.app_globs = out, session_globs, app_globs

    def note(self, found: Iterable[tuple[tuple[str, str, str], str]]) -> None:
        """Note each ``(key, why)`` of ``found`` that the search covers."""
        if self.out is not None:
            self.out.update((k, why) for k, why in found if session_ok(k, self.session_globs, self.app_globs))

    def note_listed(self, store: Store) -> None:
        """Note the damaged HEADs :meth:`castore.Store.sessions` reports (a search without the index)."""
        if self.out is not None:
            self.note(((si.app, si.user, si.session), si.problem) for app in store.apps()
                      for si in store.sessions(app) if si.problem is not None)


def _tenanted(store: Store) -> bool:
    """Whether ``store`` is the root of a tenant-layout store (searched tenant by tenant)."""
    return store.root is store and store.layout == "tenants"


def _over_tenants(store: Store, search: Callable[..., Iterator[Any]], pattern: str,
                  options: dict[str, Any]) -> Iterator[Any]:
    """``search`` on each tenant's store in turn (docs/FORMAT.md 2.1), ``limit`` counted over all."""
    left = options.get("limit")
    for t in store.stores():
        for found in search(t, pattern, **{**options, "limit": left}):
            yield found
            if left is not None:
                left -= 1
                if left <= 0:
                    return


_TYPED_ROLES = ("user", "assistant")


def typed_block(role: str, kind: str, meta: Any) -> bool:
    """Whether a block is what a human typed or the agent wrote (``grep(typed=True)``):
    user text, or any assistant block, of an entry whose ``meta`` has no :data:`INJECTED`."""
    if role not in _TYPED_ROLES or (role == "user" and kind != "text"):
        return False
    from ..entries import INJECTED  # here: a search that is not typed never loads the entries

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


def __getattr__(name: str) -> Any:
    """:data:`INJECTED`, :mod:`castore.entries`' (imported when asked for), and :class:`Match` and
    :class:`LineMatch`, :mod:`.match`'s (imported by the first search that builds a match)."""
    if name == "INJECTED":
        from ..entries import INJECTED

        return INJECTED
    if name in ("Match", "LineMatch"):
        from . import match

        return getattr(match, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _grep_index(store: Store, rx: re.Pattern[str], keep_block: Callable[..., bool] | None, since: float | None,
                until: float | None, limit: int | None, context: int, kinds: set[str], check: bool,
                form: int = MATCHES, damaged: _Damaged | None = None,
                unsaved: list[str] | None = None) -> Iterator[Any]:
    """:func:`grep` through the index; ``keep_block`` None: no role, tool, session or app filter.
    ``form``: :data:`MATCHES` gives :class:`Match` objects, :data:`ROWS` rows (:data:`Row`; no
    context), :data:`COUNTS` ``(session, matches)`` pairs in session order (:func:`_count`).
    ``damaged``: where the sessions the index knows to have a lost branch are noted; ``unsaved``:
    where why the index could not be saved is noted (it is then kept in memory for this search)."""
    ix = open_index(store, check=check, unsaved=[] if unsaved is None else unsaved)
    if damaged is not None:
        damaged.note(ix.lost_branches())
    try:
        runs = ix.find_blocks(rx, kinds, counting=form == COUNTS)
        if check and ix.moved_unlogged(runs):  # a ref removed by hand: the index read it again
            runs = ix.find_blocks(rx, kinds, counting=form == COUNTS)
    except ValueError:  # a damaged index file: not trusted, built again from the store
        runs = ix.rebuild().find_blocks(rx, kinds, counting=form == COUNTS)
    strings, bsets = ix.strings, ix.branch_sets
    kept: dict[tuple[int, int, int, int], bool] = {}  # the filters' answer per (session, role, kind, tool)

    def allowed(si: int, key: tuple[str, str, str], rn: int, kn: int, tn: int) -> bool:
        """``keep_block``'s answer for a block of session ``si`` (``key``), asked once per
        (session, role, kind, tool)."""
        ok = kept.get((si, rn, kn, tn))
        if ok is None:
            assert keep_block is not None
            ok = kept[(si, rn, kn, tn)] = keep_block(key, strings[rn], KINDS[kn], strings[tn] if tn >= 0 else None)
        return ok
    timed = since is not None or until is not None
    lo = since if since is not None else float("-inf")
    hi = until if until is not None else float("inf")
    if form == COUNTS:
        yield from count(ix, runs, rx, allowed if keep_block is not None else None, timed, lo, hi, limit)
        return
    finder = spans_finder(rx)
    # the candidate blocks first (each commit's block once, in order, the other sessions that hold
    # it under also), then the matches built from them: a block is decoded and its lines matched
    # only once it is given out (none for what a limit leaves out)
    # (session, its hits or its runs, runs?: False, or the commits of its one run, or True)
    groups: list[tuple[tuple[str, str, str], Any, Any]] = []
    # a commit's blocks are told apart by one integer, commit number << 31 | block (an int32 >= 0)
    owner: dict[int, tuple[str, str, str]] = {}  # block -> the session it is reported under
    also: dict[int, dict[tuple[str, str, str], tuple[str, ...]]] = {}  # block -> the other sessions
    # with no filter and no time, by commit: a commit several sessions hold has the same blocks, of
    # the same text, in each, so each found in one session is found in every other one holding it,
    # and is reported under the first (a block number read per hit and a dict of every block found
    # took a common word's printing 5% of its instructions): the commits of the sessions so far in a
    # set, and which session holds each in a dict made only once a session shares one (rare)
    seen: set[int] | None = set() if not timed and keep_block is None else None
    holders: dict[int, tuple[str, str, str]] | None = None
    for session_runs in runs:
        p0, idx0 = session_runs[0]
        si = p0.cols[1][idx0[0]]
        key = ix.key(si)
        if seen is not None:
            cns = p0.fields(idx0, (0,))[0] if len(session_runs) == 1 else [
                cn for p, idx in session_runs for cn in p.fields(idx, (0,))[0]]
            if seen.isdisjoint(cns):  # no commit an earlier session holds
                seen.update(cns)
                if holders is not None:
                    holders.update(zip(cns, itertools.repeat(key)))
                # its hits made as they are given out (the commits of one run: read already)
                groups.append((key, session_runs, cns if len(session_runs) == 1 else True))
                continue
            if holders is None:
                holders = _holders(groups)
            seen.update(cns)
        picked = []
        for h in hits(session_runs):
            _, _, cn, blk, kn, rn, tn, bn, _, when = h[:10]
            if holders is not None:
                holder = holders.setdefault(cn, key)
                if holder != key:
                    also.setdefault(cn << 31 | blk, {}).setdefault(key, bsets[bn])
                    continue
                picked.append(h)
                continue
            if timed and (when < lo or when >= hi):
                continue
            if keep_block is not None and not allowed(si, key, rn, kn, tn):
                continue
            b = cn << 31 | blk
            was = owner.get(b)
            if was is not None:
                if was != key:
                    also.setdefault(b, {}).setdefault(key, bsets[bn])
                continue
            owner[b] = key
            picked.append(h)
        groups.append((key, picked, False))
    made = built(groups, also, ix.commits, strings, bsets, rx, finder, limit, context, form)
    while True:
        # tens of thousands of objects a caller may keep: each burst of them would make the cyclic
        # collector walk every live object, for nothing (they hold no cycles)
        with gc_paused():
            batch = list(itertools.islice(made, _BATCH))
        if not batch:
            return
        if not context:
            yield from batch
            continue
        from dataclasses import replace  # the context entries: a search with none does not need it

        for m in batch:
            s = store.session(*m.session)
            tip = s.head if m.branches[0] == "HEAD" else s.branches().get(m.branches[0])
            if tip is not None:
                before, after = context_entries(store, store.history.path_ids(tip), m.commit, context)
                m = replace(m, before=before, after=after)
            yield m


def _holders(groups: list[tuple[tuple[str, str, str], Any, Any]]) -> dict[int, tuple[str, str, str]]:
    """The session each commit of ``groups`` (:func:`_grep_index`'s so far) is reported under: the
    first holding it."""
    out: dict[int, tuple[str, str, str]] = {}
    for key, got, lazy in groups:
        cns = itertools.chain.from_iterable(p.fields(idx, (0,))[0] for p, idx in got) if lazy else (h[2] for h in got)
        for cn in cns:
            out.setdefault(cn, key)
    return out


#: matches built at once by :func:`_grep_index` (with the cyclic collector paused)
_BATCH = 1024


__all__ = ["DEFAULT_KINDS", "INJECTED", "KINDS", "GrepError", "LineMatch", "Match", "MatchColumns", "Row", "blocks",
           "compile_pattern", "grep", "grep_columns", "grep_counts", "grep_rows", "iso_time", "typed_block"]
