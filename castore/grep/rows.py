"""The matches of a search through the index, made from the blocks it found: rows, columns, Match
objects, or a count per session (what :func:`castore.grep.grep`, :func:`~castore.grep.grep_rows`,
:func:`~castore.grep.grep_columns` and :func:`~castore.grep.grep_counts` give through the index).

A session's matches are made together, column by column: its blocks' numbers read per column
in C (:meth:`castore.grep.files.Part.fields`), their texts a chunk at a time
(:meth:`~castore.grep.files.Part.texts`), each block's matching lines found (a plain string's
by ``str.find``, or not at all where the index's find makes it sure, when no spans are asked
for), and the columns then zipped into rows, or handed out as they are.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from .blocks import KINDS
from .files import TIME, Part
from .filters import spans_finder
from .index import hits, search_plan

#: what a search through the index gives (:func:`castore.grep._grep_index`): Match objects, rows
#: (:data:`Row`), a count per session, or each session's matches as columns (:class:`MatchColumns`;
#: spanless: a sure one-line block's line as its text)
MATCHES, ROWS, COUNTS, COLUMNS, SPANLESS = 0, 1, 2, 3, 4

#: a match as :func:`castore.grep.grep_rows` gives it: the fields of a
#: :class:`~castore.grep.match.Match` in their order, each line a ``(line, text, spans)`` tuple
Row = tuple[str, tuple[str, str, str], tuple[str, ...], str, str, str | None, float | None,
            tuple[tuple[int, str, tuple[tuple[int, int], ...]], ...],
            tuple[tuple[tuple[str, str, str], tuple[str, ...]], ...], tuple[tuple[str, str, str], ...],
            tuple[tuple[str, str, str], ...], int]


class MatchColumns(NamedTuple):
    """Matches of one session, in order, column by column (what :func:`castore.grep.grep_columns` gives): item
    ``i`` of each column is the ``i``-th match's field, as :class:`~castore.grep.match.Match` has it.

    ``lines``: each match's lines as a :data:`Row` holds them (``(line, text, spans)`` each), or,
    when asked for without spans, a plain string: the block is one line, its text, and it matches
    (line 1, its spans not sought). A printer of tens of thousands of matches maps over the
    columns in C instead of taking each match apart. ``printable``: every text of ``lines`` is
    known to be ASCII with no control character but line break and tab (the index says so of the
    chunks it keeps them in): what a terminal shows as it is, with nothing to escape.
    """

    session: tuple[str, str, str]
    commits: Sequence[str]
    branches: Sequence[tuple[str, ...]]
    roles: Sequence[str]
    kinds: Sequence[str]
    tools: Sequence[str | None]
    times: Sequence[float | None]
    lines: Sequence[str | tuple[tuple[int, str, tuple[tuple[int, int], ...]], ...]]
    also: Sequence[tuple[tuple[tuple[str, str, str], tuple[str, ...]], ...]]
    printable: bool = False


def count(ix: Any, runs: list[list[tuple[Any, list[int]]]], rx: re.Pattern[str],
           allowed: Callable[[int, tuple[str, str, str], int, int, int], bool] | None, timed: bool, lo: float,
           hi: float, limit: int | None) -> Iterator[tuple[tuple[str, str, str], int]]:
    """The count of a search through the index (``form`` :data:`COUNTS`): ``(session, matches)`` for
    each session that holds a match, in session order, over the index ``ix``'s candidate blocks
    ``runs`` (:meth:`castore.grep.index.Index.find_blocks`). A session counts every matching
    block it holds, so a commit several sessions share counts in each of them (as the
    ``session`` and ``also`` of :func:`grep`'s matches); ``allowed``: the filters' answer for a
    block (None: no role, tool, session or app filter); ``timed``: keep only blocks of times in
    ``[lo, hi)``; ``limit``: only the first ``limit`` matches (each block with the first session
    holding it, as :func:`grep` gives them) count, in every session that holds them."""
    # a plain string with no newline that the index found in a block is on one of its lines:
    # the block matches without being looked at, when the search was case-sensitive or the
    # block is ASCII (its lowered text is then its text lower-cased, as the match looks at it)
    _, lowered, lit = search_plan(rx)
    sure = lit is not None and "\n" not in lit
    # then, with no filter and no limit, a run is counted by its length (its flags read only
    # when the search was lowered)
    whole = sure and not timed and allowed is None and limit is None
    finder = spans_finder(rx)
    verdict: dict[int, bool] = {}  # block -> whether it matches, once looked at (for its copies)
    owned: set[int] = set()  # with a limit: the blocks of the matches counted so far
    n = 0
    for session_runs in runs:
        p0, idx0 = session_runs[0]
        si = p0.cols[1][idx0[0]]
        key = ix.key(si)
        c = 0
        todo = session_runs
        if whole:
            todo = []
            for p, idx in session_runs:
                # the flags of the run's whole range read in C first: a block found in it is ASCII
                # when they all are (a tuple of every block's flags took a common word's count 10 M)
                if lowered and not p.ascii_blocks(idx[0], idx[-1] + 1) and 0 in p.fields(idx, (8,))[0]:
                    todo.append((p, idx))
                else:
                    c += len(idx)
        elif limit is not None and n >= limit and owned.isdisjoint(_block_ids(session_runs)):
            continue  # the limit is reached: only copies of the blocks counted may count
        for _, p, cn, blk, kn, rn, tn, _, fl, when, i in hits(todo):
            if timed and (when < lo or when >= hi):
                continue
            if allowed is not None and not allowed(si, key, rn, kn, tn):
                continue
            b = cn << 31 | blk
            if limit is not None and b in owned:
                c += 1
                continue
            if limit is not None and n >= limit:
                continue
            if not (sure and (not lowered or fl)):
                ok = verdict.get(b)
                if ok is None:
                    ok = verdict[b] = any(finder(line) for line in p.block(i).split("\n"))
                if not ok:
                    continue
            if limit is not None:
                owned.add(b)
                n += 1
            c += 1
        if c:
            yield key, c


def _block_ids(runs: list[tuple[Any, list[int]]]) -> set[int]:
    """The blocks of ``runs`` (an index part and block numbers in it each) as the integers a
    search tells a commit's blocks apart by: commit number << 31 | block (an int32 >= 0)."""
    shift = operator.lshift
    return set(itertools.chain.from_iterable(
        map(operator.or_, map(shift, cns, itertools.repeat(31)), blks)
        for cns, blks in (p.fields(idx, (0, 2)) for p, idx in runs)))


def built(groups: list[tuple[tuple[str, str, str], Any, bool]],
           also: dict[int, dict[tuple[str, str, str], tuple[str, ...]]], commits: Any, strings: list[str],
           bsets: list[tuple[str, ...]], rx: re.Pattern[str], finder: Callable[[str], list[tuple[int, int]]],
           limit: int | None, context: int, form: int) -> Iterator[Any]:
    """The matches of the candidate blocks of ``groups`` (``(session, hits, False)`` or ``(session,
    runs, True)``: :func:`castore.grep.index.hits`), in order, at most ``limit``: rows (:data:`Row`),
    :class:`~castore.grep.match.Match` objects (no context entries yet), or a :class:`MatchColumns` per session
    (``form``; :data:`SPANLESS`: a sure one-line block's line as its text); a block with no
    matching line is left out; ``also``: the other sessions of a block, by block. A session's
    matches are made together, column by column (one session at a time: a limit stops the
    sessions after it unread)."""
    _, lowered, lit = search_plan(rx)
    # a plain string's spans in a line, found here rather than by ``finder`` (the same search, less
    # a call per block): in the line itself when case counts, else in its lower case when it is ASCII
    # (the index's flag 1), as ASCII case folding is one to one
    plain = lit if lit is not None and "\n" not in lit else None
    tools: list[str | None] = [*strings, None]  # tool -1: none
    spans = form != SPANLESS
    flagged = lowered and plain is not None  # whether _lines reads the blocks' flags

    def session_columns(got: Any, lazy: Any) -> list[Any]:
        """The columns of a session's blocks (:func:`_session_columns`), a block with no match kept
        (with no lines); each a list but ``others`` (an iterable), rows in order of their place.
        ``lazy``: False (``got`` its hits), or its runs' commits when it is one run, or True. Then
        whether every text is printable (:attr:`MatchColumns.printable`)."""
        if not lazy:  # hits picked one by one (a filter or a time): their columns, their blocks read each
            _, ps, *cols, ids = zip(*got, strict=True)
            texts = list(map(Part.block, ps, ids))
            return [*_session_columns(cols, texts, also, commits, bsets, strings, tools, plain, lowered, finder,
                                      spans), False]
        if len(got) == 1:
            p, idx = got[0]
            cols = _columns(p, idx, bool(also), flagged, None if lazy is True else lazy)
            return [*_session_columns(cols, p.texts(idx), also, commits, bsets, strings, tools, plain, lowered,
                                      finder, spans), p.printable(idx[0], idx[-1] + 1)]
        # several parts (tool results too): each part's columns, then their rows in order of their place
        places: list[int] = []
        out: list[list[Any]] = [[] for _ in range(8)]
        printable = all(p.printable(idx[0], idx[-1] + 1) for p, idx in got)
        for p, idx in got:
            places.extend(p.fields(idx, (7,))[0])
            made = _session_columns(_columns(p, idx, bool(also), flagged, None), p.texts(idx), also, commits, bsets,
                                    strings, tools, plain, lowered, finder, spans)
            for col, part in zip(out, made, strict=True):
                col.extend(part)
        order = sorted(range(len(places)), key=places.__getitem__)
        if len(order) == 1:
            return [*out, printable]
        get = operator.itemgetter(*order)
        return [*(get(col) for col in out), printable]

    def session_rows(key: tuple[str, str, str], got: Any, lazy: Any) -> Any:
        if not got:
            return ()
        cms, branches, roles, kinds, tls, whens, lines, others, _ = session_columns(got, lazy)
        return itertools.compress(zip(cms, itertools.repeat(key), branches, roles, kinds, tls, whens, lines, others,
                                      itertools.repeat(()), itertools.repeat(()), itertools.repeat(context)), lines)

    if form in (COLUMNS, SPANLESS):
        return _limited_columns(
            (MatchColumns(key, *cols) for key, cols in
             ((key, session_columns(got, lazy)) for key, got, lazy in groups if got)), limit)
    made: Iterator[Any] = itertools.chain.from_iterable(itertools.starmap(session_rows, groups))
    if form == MATCHES:  # here: rows and counts build no Match (the classes are made on first import)
        from .match import matches_of_rows

        made = matches_of_rows(made)
    return itertools.islice(made, limit)


def _limited_columns(made: Iterable[MatchColumns], limit: int | None) -> Iterator[MatchColumns]:
    """The columns of ``made`` less their blocks with no matching line, at most ``limit`` rows in all."""
    left = limit
    for m in made:
        if not all(m.lines):  # a block with no matching line: left out
            keep = m.lines
            m = MatchColumns._make((m.session, *(list(itertools.compress(col, keep)) for col in m[1:-1]), m.printable))
            if not m.lines:
                continue
        if left is not None:
            if len(m.lines) >= left:
                yield MatchColumns._make((m.session, *(col[:left] for col in m[1:-1]), m.printable))
                return
            left -= len(m.lines)
        yield m


#: the columns of a block :func:`_session_columns` always reads (kind, role, tool, branch set, time)
_ROW_COLS = (3, 4, 5, 6, TIME)


def _columns(p: Part, idx: list[int], blocks: bool, flags: bool, cns: Any) -> list[Any]:
    """Blocks ``idx`` of part ``p``: commit, block, kind, role, tool, branch set, flags and time, a
    tuple each, as :func:`_session_columns` takes them; the commits read unless given (``cns``),
    the block numbers only with ``blocks`` (else None), the flags only with ``flags`` when a
    block of their range is not ASCII (else each 1: the flag of ASCII). A column costs a match
    some 200 instructions."""
    if cns is None:
        cns = p.fields(idx, (0,))[0]
    kns, rns, tns, bns, whens = p.fields(idx, _ROW_COLS)
    blks = p.fields(idx, (2,))[0] if blocks else None
    fls = p.fields(idx, (8,))[0] if flags and not p.ascii_blocks(idx[0], idx[-1] + 1) else (1,) * len(idx)
    return [cns, blks, kns, rns, tns, bns, fls, whens]


def _session_columns(cols: list[Any], texts: list[str], also: dict[int, dict[tuple[str, str, str], tuple[str, ...]]],
                     commits: Any, bsets: list[tuple[str, ...]], strings: list[str], tools: list[str | None],
                     plain: str | None, lowered: bool, finder: Callable[[str], list[tuple[int, int]]],
                     spans: bool) -> list[Any]:
    """The columns of a session's candidate blocks, whose index columns are ``cols``
    (:func:`_columns`) and texts ``texts``, in their order: commits, branches, roles, kinds, tools,
    times, lines (``()`` for a block with no matching line; ``spans`` False: :func:`_lines`) and
    the other sessions holding each block; the numbers looked up column by column, in C."""
    cns, blks, kns, rns, tns, bns, fls, whens = cols
    lines = _lines(texts, fls, plain, lowered, finder, spans)
    if also:
        others: list[Any] = []
        for cn, blk in zip(cns, blks, strict=True):
            more = also.get(cn << 31 | blk)
            others.append(tuple((x, tuple(y)) for x, y in more.items()) if more else ())
    else:
        others = [()] * len(cns)
    return [[commits[32 * cn:32 * cn + 32].hex() for cn in cns], list(map(bsets.__getitem__, bns)),
            list(map(strings.__getitem__, rns)), list(map(KINDS.__getitem__, kns)), list(map(tools.__getitem__, tns)),
            whens, lines, others]


def _lines(texts: list[str], flags: Any, plain: str | None, lowered: bool,
           finder: Callable[[str], list[tuple[int, int]]], spans: bool = True) -> list[Any]:
    """Per text of ``texts`` (whose index flags are ``flags``), its matching lines as a row
    holds them (``(line, text, spans)`` each), or () when none matches. Not ``spans``: a block
    sure to match on its one line (a plain string the index found in it, whose case counts or
    which is ASCII) is given as its text alone, its spans not sought."""
    if not spans and plain is not None and (not lowered or 0 not in flags) \
            and not any(map(operator.contains, texts, itertools.repeat("\n"))):
        return texts  # every block: one line holding the string (most sessions of a common word)
    out: list[Any] = []
    append = out.append
    k = len(plain) if plain is not None else 0
    for text, fl in zip(texts, flags, strict=True):
        if "\n" in text:
            append(_line_tuples(text, finder))
        elif plain is not None and (fl or not lowered):  # one line (most blocks): no split
            if not spans:
                append(text)
                continue
            line = text.lower() if lowered else text
            at = line.find(plain)
            if at < 0:
                append(())
                continue
            nxt = line.find(plain, at + k)
            if nxt < 0:  # once (most lines)
                append(((1, text, ((at, at + k),)),))
                continue
            spans_ = [(at, at + k)]
            while nxt >= 0:
                spans_.append((nxt, nxt + k))
                nxt = line.find(plain, nxt + k)
            append(((1, text, tuple(spans_)),))
        else:
            found = finder(text)
            append(((1, text, tuple(found)),) if found else ())
    return out


def _line_tuples(text: str, spans_of: Callable[[str], list[tuple[int, int]]]
                 ) -> tuple[tuple[int, str, tuple[tuple[int, int], ...]], ...]:
    """The matching lines of ``text``: ``(line, text, spans)`` each."""
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        spans = spans_of(line)
        if spans:
            out.append((n, line, tuple(spans)))
    return tuple(out)


__all__ = ["COLUMNS", "COUNTS", "MATCHES", "ROWS", "SPANLESS", "MatchColumns", "Row", "built", "count"]
