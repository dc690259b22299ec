"""The light parts of a search, imported whether or not it builds :class:`~castore.grep.match.Match`
objects (``castore grep -c`` and ``-l`` build none): the session and tool filters, the spans of a
pattern's matches in a line, and the JSON time of a match.
"""

from __future__ import annotations

import functools
import re
import time
import warnings
from collections.abc import Callable


def compile_regex(src: str, flags: int = 0) -> re.Pattern[str]:
    """``re.compile(src, flags)`` without the FutureWarning Python prints for a set it may read
    otherwise one day (``[[]``, ``[a--b]``): searched as it reads it now, and no line of
    Python's about castore's source on the user's terminal.

    Raises:
        re.error, OverflowError, RecursionError: as re.compile.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return re.compile(src, flags)


def key_text(k: tuple[str, str, str]) -> str:
    """Session ``k`` as ``APP/USER/SESSION`` (a ``/`` inside a name written ``%2F``). Raises nothing."""
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
            # by the time module (loaded at start), not datetime (importing it took a search that
            # prints 8 million instructions): from 1970 on, %Y is four digits
            minute = _ISO_MINUTES[sec // 60] = time.strftime("%Y-%m-%dT%H:%M:", time.gmtime(sec // 60 * 60))
        seconds, millis = _ISO_PARTS or _iso_parts()
        return minute + seconds[sec % 60] + millis[int(t * 1000) % 1000]
    return _iso_by_datetime(t)


#: the times :func:`iso_time` formats by arithmetic (from the epoch to the end of year 9998)
_ISO_FAST_END = 253370764800.0
_ISO_MINUTES: dict[int, str] = {}
#: the texts of the seconds and of the milliseconds, made by the first time formatted
#: (:func:`_iso_parts`): a search that prints no time (a count) makes none
_ISO_PARTS: list[list[str]] = []


def _iso_parts() -> list[list[str]]:
    """``[seconds, milliseconds]``: ``"SS."`` for each second, ``"mmmZ"`` for each millisecond."""
    if not _ISO_PARTS:
        _ISO_PARTS[:] = [[f"{n:02d}." for n in range(60)], [f"{n:03d}Z" for n in range(1000)]]
    return _ISO_PARTS


def _iso_by_datetime(t: float) -> str:
    """:func:`iso_time` through :mod:`datetime` (any time it can represent; imported here, by the
    first time formatted: a count formats none)."""
    from datetime import UTC, datetime

    d = datetime.fromtimestamp(t, UTC)
    # isoformat is faster than strftime, and the same from year 1000 on (%Y does not pad)
    head = d.isoformat(timespec="seconds")[:19] + "." if d.year >= 1000 else d.strftime("%Y-%m-%dT%H:%M:%S.")
    return f"{head}{int(t * 1000) % 1000:03d}Z"


def glob_any(value: str | None, globs: tuple[str, ...] | None) -> bool:
    """Whether ``value`` matches one of ``globs`` (:func:`fnmatch.fnmatchcase`); True when there are
    none, False for a None value when there are. Raises nothing."""
    if not globs:
        return True
    from fnmatch import fnmatchcase  # here: a search with no glob never loads it

    return value is not None and any(fnmatchcase(value, g) for g in globs)


def session_ok(key: tuple[str, str, str], session_globs: tuple[str, ...] | None,
                app_globs: tuple[str, ...] | None) -> bool:
    """Whether session ``key`` passes the ``--session`` globs (``APP/USER/SESSION``, or the session
    id when a glob has no ``/``) and the ``--app`` globs (None or empty: no filter). Raises nothing."""
    if app_globs and not glob_any(key[0], app_globs):
        return False
    if not session_globs:
        return True
    from fnmatch import fnmatchcase

    return any(fnmatchcase(key_text(key) if "/" in g else key[2], g) for g in session_globs)


_SYNTAX = frozenset("\\.^$*+?{}[]|()")


@functools.lru_cache(maxsize=16)
def spans_finder(rx: re.Pattern[str]) -> Callable[[str], list[tuple[int, int]]]:
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


__all__ = ["glob_any", "iso_time", "key_text", "session_ok", "spans_finder"]
