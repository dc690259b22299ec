"""What a match of :func:`castore.grep.grep` is and how one is built, shared by the search
through the index (:mod:`castore.grep`) and the scan and walk (:mod:`castore.grep.scan`):
:class:`Match` and :class:`LineMatch` (re-exported by :mod:`castore.grep`, whose docstring
gives their JSON form) and the lines of a block that match a pattern. Imported only by a
search that builds matches (``castore grep -c``, ``-l`` and the printed lines build none);
the filters and the JSON time are in :mod:`.filters`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .filters import iso_time, key_text, spans_finder


@dataclass(frozen=True)
class LineMatch:
    """One matching line of a block: its 1-based number, its text and the match spans."""

    line: int
    text: str
    spans: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Match:
    """One block of one commit that matched (see :mod:`castore.grep` for its JSON form)."""

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
        """The match as the stable JSON document :mod:`castore.grep` describes."""
        d: dict[str, Any] = {
            "commit": self.commit,
            "session": key_text(self.session),
            "branches": list(self.branches),
            "also": [{"session": key_text(k), "branches": list(b)} for k, b in self.also],
            "role": self.role,
            "kind": self.kind,
            "tool": self.tool,
            "time": iso_time(self.time),
            "lines": [{"line": lm.line, "text": lm.text, "spans": [list(s) for s in lm.spans]} for lm in self.lines],
        }
        if self.context:
            d["context"] = {
                "before": [{"commit": c, "role": r, "text": t} for c, r, t in self.before],
                "after": [{"commit": c, "role": r, "text": t} for c, r, t in self.after],
            }
        return d


def line_matches(rx: re.Pattern[str], text: str,
                  spans_of: Callable[[str], list[tuple[int, int]]] | None = None) -> tuple[LineMatch, ...]:
    """The lines of ``text`` with a (non-empty) match of ``rx``, as :class:`LineMatch` objects
    (``spans_of``: the spans finder to use, default :func:`spans_finder` of ``rx``). Raises nothing."""
    if spans_of is None:
        spans_of = spans_finder(rx)
    if "\n" not in text:  # one line (most blocks): no split
        spans = tuple(spans_of(text))
        return (make_line_match(1, text, spans),) if spans else ()
    lines = []
    for n, line in enumerate(text.split("\n"), 1):
        spans = tuple(spans_of(line))
        if spans:
            lines.append(make_line_match(n, line, spans))
    return tuple(lines)


def make_match(commit: str, session: tuple[str, str, str], branches: tuple[str, ...], role: str, kind: str,
           tool: str | None, time: float | None, lines: tuple[LineMatch, ...], context: int) -> Match:
    """A :class:`Match` with no ``also`` nor context entries, built as its ``__init__`` would but
    without its field-by-field ``object.__setattr__`` (a search through the index builds tens of
    thousands)."""
    m = object.__new__(Match)
    d = m.__dict__  # filled in place: replacing an instance's dict costs twice as much
    d["commit"], d["session"], d["branches"], d["role"], d["kind"], d["tool"] = commit, session, branches, role, \
        kind, tool
    d["time"], d["lines"], d["also"], d["before"], d["after"], d["context"] = time, lines, (), (), (), context
    return m


def matches_of_rows(rows: Iterable[tuple[Any, ...]]) -> Iterator[Match]:
    """The :class:`Match` of each row of ``rows`` (as :func:`castore.grep.grep_rows` gives them:
    the fields in their order, each line a ``(line, text, spans)`` tuple), built as
    :func:`make_match` builds one. Raises nothing."""
    new = object.__new__
    for row in rows:
        m = new(Match)
        d = m.__dict__  # filled in place: replacing an instance's dict costs twice as much
        d["commit"], d["session"], d["branches"], d["role"], d["kind"], d["tool"], d["time"], lines, d["also"], \
            d["before"], d["after"], d["context"] = row
        if len(lines) == 1:  # most blocks
            lm = new(LineMatch)
            e = lm.__dict__
            e["line"], e["text"], e["spans"] = lines[0]
            d["lines"] = (lm,)
        else:
            d["lines"] = tuple(make_line_match(*t) for t in lines)
        yield m


def make_line_match(line: int, text: str, spans: tuple[tuple[int, int], ...]) -> LineMatch:
    """A :class:`LineMatch`, built as :func:`make_match` builds a Match."""
    lm = object.__new__(LineMatch)
    d = lm.__dict__
    d["line"], d["text"], d["spans"] = line, text, spans
    return lm


__all__ = ["LineMatch", "Match", "line_matches", "make_line_match", "make_match", "matches_of_rows"]
