"""Token usage and cost of the sessions in a store (``castore usage``), each model response once.

:func:`usage` walks every session of the store, every branch, reads the usage each model
response recorded, removes the copies, and adds the rest up per session, branch, model,
project or day, with a cost from a price table (:func:`load_prices`).

The parts, each a module of this package:

* :mod:`castore.usage.records`: what a response records of its usage, source by source (the
  readers, chosen by the commit metadata key their importer writes: :data:`READERS`), and the
  identity that all copies of one response share;
* :mod:`castore.usage.rows`: one session's rows, a row per response, each commit read once on
  every branch (:func:`session_rows`);
* :mod:`castore.usage.cache`: every session's rows, through the cache of rows (derived data,
  read again only for the sessions whose refs moved), and a first run's store-wide pass shared
  with a forked worker (:func:`load_commits`, :func:`all_rows`, :func:`update_if_present`);
* :mod:`castore.usage.prices`: the price table (:func:`load_prices`);
* this module: the report, every response counted once and grouped (:func:`usage`).

Where the copies of a response sit in several sessions or branches, it counts for the
earliest copy (by the time of its line, then session key); within a session for the branch
HEAD is on, else the first by name. A response counts whole in one row of a grouping, so the
rows add up to the total.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

from ..gcpause import gc_paused
from .cache import (
    CACHE_VERSION,
    SCAN_MAX_COMMITS,
    SCAN_MIN_SESSIONS,
    all_rows,
    cache_path,
    load_commits,
    update_if_present,
)
from .prices import Prices, UsageError, load_prices, priced
from .records import (
    CLAUDE_USAGE,
    CODEX_USAGE,
    GEMINI_USAGE,
    READERS,
    CodexWalk,
    Reader,
    Response,
    Tokens,
    Walk,
    claude_record,
    codex_record,
    gemini_record,
    kept_record,
    tokens_of,
)
from .rows import Key, Row, session_rows

if TYPE_CHECKING:
    from ..store import Store

#: what ``by`` may be
GROUPS = ("session", "branch", "model", "project", "day")


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
        cost = None if p is None else priced(p, i, o, cr, cw)
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


__all__ = ["CACHE_VERSION", "CLAUDE_USAGE", "CODEX_USAGE", "GEMINI_USAGE", "GROUPS", "READERS", "SCAN_MAX_COMMITS",
           "SCAN_MIN_SESSIONS", "CodexWalk", "Group", "Key", "Prices", "Reader", "Report", "Response", "Row", "Tokens",
           "UsageError", "Walk", "all_rows", "cache_path", "claude_record", "codex_record", "gemini_record",
           "kept_record", "load_commits", "load_prices", "session_rows", "tokens_of", "update_if_present", "usage"]
