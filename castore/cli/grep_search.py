"""What ``castore grep`` does once its command line is parsed, without click: the search and its output.

Both ways of running ``castore grep`` call :func:`run`: the click command
(:mod:`castore.cli.grep_cmds`, which hands it ``click.echo``) and the fast path of a fresh
process (:mod:`castore.cli.fast`, which hands it :func:`echo`, writing as ``click.echo`` does:
the text, a line break, a flush). So the two print the same bytes, report the same errors and
exit with the same status. This module imports no click.
"""

from __future__ import annotations

import itertools
import json
import operator
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import CastoreError, IntegrityError, StorageError, StoreNotFound
from ..gcpause import gc_paused
from .plain import error_line, format_key, no_color, skip_teardown
from .text import safe, safe_block, safe_json

if TYPE_CHECKING:
    from ..store import Store


#: where a line goes: ``echo(text)`` to stdout, ``echo(text, err=True)`` to stderr, ``nl=False`` with no line break
#: after it (as ``click.echo``)
Echo = Callable[..., Any]


def echo(message: str, err: bool = False, nl: bool = True) -> None:
    """Write ``message`` and a line break (none without ``nl``) to stdout (stderr with ``err``) and
    flush, as ``click.echo`` does with a string on a stream of text that needs no colour stripped
    (:func:`run` colours only a terminal's output, and only when ``$NO_COLOR`` is unset)."""
    f = sys.stderr if err else sys.stdout
    f.write(message + "\n" if nl else message)
    f.flush()


class _BadTime(ValueError):
    """``--since``/``--until`` is not a date or time."""

    def __init__(self, value: str, what: str) -> None:
        super().__init__(f"Invalid value for {what}: {value!r} is not a date or time (YYYY-MM-DD[THH:MM[:SS]])")


def _when(value: str | None, what: str) -> float | None:
    if value is None:
        return None
    from datetime import UTC, datetime  # here: only --since and --until need it (~1 ms of every search)

    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise _BadTime(value, what) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def run(params: dict[str, Any], open_store: Callable[[], Store], echo: Echo = echo) -> int:
    """Search as ``castore grep`` with the command's parameters ``params`` (the names of
    :data:`castore.cli.grep_spec.GREP_OPTIONS` and ``pattern``) in the store ``open_store()``
    opens (whoever made it closes it), printing through ``echo``; the exit status: 0 when
    something matched, 1 when nothing did, 2 on an error (grep's), whose one line ``Error: ...``
    went to stderr. A session searched whose HEAD is damaged (a lost branch: what only that
    branch held is not searched) is such an error, said after the matches of the others. A
    search that ended with 0 or 1 lets the process end without its teardown
    (:func:`castore.cli.plain.skip_teardown`).

    Raises:
        OSError: writing the output failed (a closed pipe: BrokenPipeError); the callers report it.
    """
    p = params
    # the cyclic collector paused for the whole search (the process ends after it): the modules
    # it imports and what it reads all stay alive, and each burst of objects would have the
    # collector walk every live object again, for nothing
    if not p["fixed"] and (why := _not_python(p["pattern"])):
        echo(f"Error: {why}", err=True)
        return 2
    with gc_paused():
        from ..grep import KINDS, grep, grep_columns, grep_counts, grep_rows
        from ..grep.files import keep_chunks

        damaged: dict[tuple[str, str, str], str] = {}
        unsaved: list[str] = []  # why the search index could not be saved (the search ran without saving it)
        try:
            store = open_store()
            options: dict[str, Any] = {
                "ignore_case": p["ignore_case"], "fixed": p["fixed"], "word": p["word"], "roles": p["roles"] or None,
                "kinds": KINDS if p["all_kinds"] else (p["kinds"] or None), "tools": p["tools"] or None,
                "sessions": p["sessions"] or None, "apps": p["apps"] or None,
                "since": _when(p["since"], "--since"), "until": _when(p["until"], "--until"),
                "limit": p["limit"] or None, "context": p["context"], "index": False if p["no_index"] else None,
                "check_index": not p["cached"], "typed": p["typed"], "unreadable": damaged, "unsaved": unsaved}
            pattern, as_json, as_jsonl, count = p["pattern"], p["as_json"], p["as_jsonl"], p["count"]
            color = p["color"] == "always" or (p["color"] == "auto" and sys.stdout.isatty() and not no_color())
            with keep_chunks(False):  # one search in this process: no chunk kept for a next one
                if p["quiet"]:  # the first match's count, and nothing printed
                    found = len(grep_counts(store, pattern, **{**options, "limit": 1, "context": 0}))
                    if found:
                        damaged.clear()  # grep -q: a match found is success, whatever could not be read
                elif p["list_sessions"] or count:
                    found = _render_counts(echo, grep_counts(store, pattern, **options), p["list_sessions"], count)
                elif as_json or as_jsonl:
                    found = _render_json(echo, grep(store, pattern, **options), as_json, as_jsonl)
                elif p["context"] or color:  # context entries, colour
                    found = _render_rows(echo, grep_rows(store, pattern, **options), color)
                else:
                    del options["context"]
                    found = _render_columns(echo, grep_columns(store, pattern, spans=False, **options))
            if as_json and (p["list_sessions"] or count) and not p["quiet"]:
                echo(_indented_json({"matches": []}))  # what --json adds to -l and -c: no match document
        except CastoreError as e:
            if not (p["no_messages"] and isinstance(e, _UNREADABLE)):
                echo(f"Error: {error_line(e)}", err=True)
            return 2
        except _BadTime as e:
            echo(f"Error: {e}", err=True)
            return 2
        if unsaved and not p["no_messages"]:  # the search is whole: said, not an error
            echo(f"Note: {safe(unsaved[0])}; searched without saving it", err=True)
        if damaged and p["no_messages"]:
            return 2
        if damaged:
            (key, why), more = min(damaged.items()), len(damaged) - 1
            echo(f"Error: {safe(format_key(*key))}{f' and {more} more' if more else ''} cannot be searched whole "
                 f"({safe(why)}); `castore fsck` says more", err=True)
            return 2
    skip_teardown(1)  # the store is closed by whoever opened it: nothing is left to write or join
    return 0 if found else 1


#: the errors ``-s`` keeps quiet about (grep's: a file that is missing or cannot be read): a store
#: missing or unreadable, stored bytes damaged
_UNREADABLE = (StoreNotFound, StorageError, IntegrityError)

def _not_python(pattern: str) -> str | None:
    """Why ``pattern``, written as grep's regex (basic or -E's extended), would not mean the same
    to Python (it would match something else, with no error): a POSIX class, or GNU's word
    edges; None when neither is in it. Python would never mean them so (an escaped ``<`` or
    ``>`` matches itself unescaped; ``[[:alpha:]]`` would be a set of ``[:alph`` then ``]``)."""
    if "[:" in pattern:
        import re  # here: only a pattern with a POSIX class's opening needs it

        posix = re.search(r"\[:(alnum|alpha|blank|cntrl|digit|graph|lower|print|punct|space|upper|xdigit):\]", pattern)
        if posix:
            return (f"{posix.group()} (a POSIX class) is not in Python's regex syntax, which castore grep uses: "
                    "write \\w, \\d, \\s or a range such as [a-z]")
    if "\\<" in pattern or "\\>" in pattern:
        return "\\< and \\> (GNU's word edges) are not in Python's regex syntax, which castore grep uses: write \\b"
    return None


#: output lines written at once (one write per batch rather than per line; a pipe still streams)
_OUT_BATCH = 2048


def _render_counts(echo: Echo, counts: dict[tuple[str, str, str], int], list_sessions: bool, count: bool) -> int:
    """``-l`` (the sessions) and ``-c`` (``SESSION:MATCHES``; with ``-l`` each counts 1); the number of matches."""
    keys = [safe(format_key(*k)) for k in counts]
    if list_sessions:
        for key in keys:
            echo(key)
    if count and keys:
        echo("\n".join(f"{key}:{1 if list_sessions else n}" for key, n in zip(keys, counts.values(),
                                                                                   strict=True)))
    return sum(counts.values())


def _render_json(echo: Echo, it: Any, as_json: bool, as_jsonl: bool) -> int:
    """``--jsonl`` (a document per match, streaming) or ``--json`` (one document; with ``--jsonl``
    too, it holds no match); the number of matches."""
    found = 0
    docs: list[dict[str, Any]] = []
    out: list[str] = []
    for m in it:
        found += 1
        if as_jsonl:
            out.append(safe_json(json.dumps(m.to_json(), ensure_ascii=False)))
            if len(out) >= _OUT_BATCH:
                echo("\n".join(out))
                out = []
        else:
            docs.append(m.to_json())
    if out:
        echo("\n".join(out))
    if as_json:
        sys.stdout.flush()
        echo(safe_json(_indented_json({"matches": docs})))
    return found


def _render_rows(echo: Echo, rows: Any, color: bool) -> int:
    """Every match as grep prints it (a line per matching line, the context entries around it,
    the matched text in bold red with ``color``); the number of matches. ``rows``:
    :func:`castore.grep.grep_rows`. Without colour, the texts are escaped (:func:`safe_block`) a
    batch of lines at once, as they are written (the same characters: the escaping is character
    by character, and the rest of each line is escaped already)."""
    from ..grep import iso_time

    # the texts' escaping: each text with colour (around which the escapes of the colour are
    # written), else the batch's
    esc, flush = (safe_block, _joined) if color else (_same, _escaped)
    found = 0
    keys: dict[tuple[str, str, str], str] = {}  # a session's key as printed, formatted once
    wheres: dict[Any, str] = {}
    whats: dict[tuple[str, str, str | None], str] = {}
    times: dict[float | None, str] = {}
    out: list[str] = []

    def key_of(k: tuple[str, str, str]) -> str:
        got = keys.get(k)
        if got is None:
            got = keys[k] = safe(format_key(*k))
        return got

    last: Any = (None, None, None, "")  # the last place and its text: the rows of a session follow each other
    last_who: Any = (None, None, None, "")  # the last role, kind and tool and their text: the same object each
    for commit, session, branches, role, kind, tool, time, lines, also, before, after, context in rows:
        found += 1
        if session is last[0] and branches is last[1] and also is last[2]:
            where = last[3]
        else:
            place = (session, branches, also)  # the text before the commit, made once per place
            where = wheres.get(place)
            if where is None:
                where = f"{key_of(session)}@{safe(','.join(branches))}"
                if also:
                    where += " (+" + ", ".join(key_of(k) for k, _ in also) + ")"
                wheres[place] = where
            last = (session, branches, also, where)
        if role is last_who[0] and kind is last_who[1] and tool is last_who[2]:
            what = last_who[3]
        else:
            what = whats.get((role, kind, tool))
            if what is None:
                what = whats[(role, kind, tool)] = safe(f"{role}/{kind}[{tool}]:" if tool else f"{role}/{kind}:")
            last_who = (role, kind, tool, what)
        when = times.get(time)
        if when is None:
            when = times[time] = (iso_time(time) or "-")[:19]
        if context:
            for c, crole, text in before:
                out.append(f"{where} {c[:8]} - {safe(crole)}: {esc(text)}")
        if color:
            head = f"{where} {commit[:8]} {when} {what}"
            for line, text, spans in lines:
                out.append(f"{head}{line}: {_highlight(text, spans)}")
        elif len(lines) == 1:  # one line (most blocks)
            out.append(f"{where} {commit[:8]} {when} {what}{lines[0][0]}: {lines[0][1]}")
        else:
            head = f"{where} {commit[:8]} {when} {what}"
            for line, text, _ in lines:
                out.append(f"{head}{line}: {text}")
        if context:
            for c, crole, text in after:
                out.append(f"{where} {c[:8]} - {safe(crole)}: {esc(text)}")
            out.append("--")
        if len(out) >= _OUT_BATCH:
            echo(flush(out))
            out = []
    if out:
        echo(flush(out))
    return found


class _Texts(dict[Any, str]):
    """Texts of the output made once each, by key: ``made(key)`` on first use (looked up in C by
    ``map(texts.__getitem__, keys)``)."""

    def __init__(self, made: Callable[[Any], str]) -> None:
        super().__init__()
        self.made = made

    def __missing__(self, key: Any) -> str:
        got = self[key] = self.made(key)
        return got


def _render_columns(echo: Echo, batches: Any) -> int:
    """Every match as grep prints it without colour or context, as :func:`_render_rows` prints
    the same matches: the number of matches. ``batches``: :func:`castore.grep.grep_columns` without
    spans. A session's matches whose lines are each their block's text (most: a plain word's
    blocks of one line) are written as one string made in C: the pieces of each line looked up
    by ``map`` (a session's place, a commit's short id, a time, a role, kind and tool: each text
    made once) and joined; the others line by line. Each batch of lines escaped at once
    (:func:`safe_block`: the rest of each line is escaped already), unless every text in it is
    printable as it is (:attr:`castore.grep.MatchColumns.printable`: a common word's batch of
    megabytes searched for 31 characters, 2.6% of its printing's instructions)."""
    from ..grep import iso_time

    keys = _Texts(lambda k: safe(format_key(*k)))

    def where_of(place: tuple[Any, tuple[str, ...], Any]) -> str:
        session, branches, also = place
        got = f"{keys[session]}@{safe(','.join(branches))}"
        return got + " (+" + ", ".join(keys[k] for k, _ in also) + ") " if also else got + " "

    wheres = _Texts(where_of)  # (session, branches, also) -> the text before the commit, a space after
    times = _Texts(lambda t: " " + (iso_time(t) or "-")[:19] + " ")
    whats = _Texts(lambda w: safe(f"{w[0]}/{w[1]}[{w[2]}]:" if w[2] else f"{w[0]}/{w[1]}:"))
    firsts = _Texts(lambda w: whats[w] + "1: ")  # a what and the first line's number
    short = itertools.repeat(slice(0, 8))
    found = lines_out = 0
    out: list[str] = []
    clean = True  # every text of the batch is printable as it is
    for key, commits, branches, roles, kinds, tools, when, lines, also, printable in batches:
        clean = clean and printable
        n = len(lines)
        found += n
        if branches.count(branches[0]) == n and not any(also):  # one place (most sessions)
            places: Any = itertools.repeat(wheres[key, branches[0], ()], n)
        else:
            places = map(wheres.__getitem__, zip(itertools.repeat(key), branches, also))
        ids = map(operator.getitem, commits, short)
        ats = map(times.__getitem__, when)
        if all(map(isinstance, lines, itertools.repeat(str))):  # each line its block's text: made in C
            # the pieces of every line laid out in one list by slice assignment, then joined
            pieces: list[Any] = ["\n"] * (6 * n)
            pieces[0::6] = places
            pieces[1::6] = ids
            pieces[2::6] = ats
            pieces[3::6] = map(firsts.__getitem__, zip(roles, kinds, tools, strict=True))
            pieces[4::6] = lines
            out.append("".join(pieces))
            lines_out += n
        else:
            made = map(whats.__getitem__, zip(roles, kinds, tools, strict=True))
            for where, cid, at, what, got in zip(places, ids, ats, made, lines, strict=True):
                if isinstance(got, str):
                    out.append(f"{where}{cid}{at}{what}1: {got}\n")
                    lines_out += 1
                    continue
                for line, text, _ in got:
                    out.append(f"{where}{cid}{at}{what}{line}: {text}\n")
                lines_out += len(got)
        if lines_out >= _OUT_BATCH:
            # each line ends with its line break: written as it is (a batch is megabytes, and cutting
            # its last line break for echo to add it copied it twice)
            echo("".join(out) if clean else safe_block("".join(out)), nl=False)
            out, lines_out, clean = [], 0, True
    if out:
        echo("".join(out) if clean else safe_block("".join(out)), nl=False)
    return found


def _same(text: str) -> str:
    return text


def _joined(lines: list[str]) -> str:
    return "\n".join(lines)


def _escaped(lines: list[str]) -> str:
    return safe_block("\n".join(lines))


def _indented_json(doc: Any) -> str:
    """``json.dumps(doc, indent=2, ensure_ascii=False)``, the same text, several times faster:
    Python's JSON encoder is in Python once ``indent`` is given (a search's JSON holds tens of
    thousands of matches). Anything but dicts with string keys, lists, tuples, strings,
    numbers, booleans and None goes to ``json.dumps`` itself."""
    out: list[str] = []
    try:
        _json_into(doc, out, "\n")
    except TypeError:
        return json.dumps(doc, indent=2, ensure_ascii=False)
    return "".join(out)


_encode_str = json.encoder.encode_basestring  # ensure_ascii=False's


def _json_into(v: Any, out: list[str], nl: str) -> None:
    """Append ``v`` as ``json.dumps(indent=2, ensure_ascii=False)`` writes it at the depth whose
    line break and indent is ``nl``; TypeError for what :func:`_indented_json` leaves to json."""
    if isinstance(v, str):
        out.append(_encode_str(v))
    elif v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, int):
        out.append(int.__repr__(v))
    elif isinstance(v, float):
        out.append(json.dumps(v))
    elif isinstance(v, (list, tuple)):
        if not v:
            out.append("[]")
            return
        inner = nl + "  "
        out.append("[" + inner)
        sep = "," + inner
        for n, x in enumerate(v):
            # the common leaves written here: one call less per string or number
            t = type(x)
            if t is str:
                out.append(sep + _encode_str(x) if n else _encode_str(x))
            elif t is int:
                out.append(sep + int.__repr__(x) if n else int.__repr__(x))
            else:
                if n:
                    out.append(sep)
                _json_into(x, out, inner)
        out.append(nl + "]")
    elif isinstance(v, dict):
        if not v:
            out.append("{}")
            return
        inner = nl + "  "
        out.append("{" + inner)
        for n, (k, x) in enumerate(v.items()):
            if not isinstance(k, str):
                raise TypeError("a key that is not a string")
            head = ("," + inner if n else "") + _encode_str(k) + ": "
            t = type(x)
            if t is str:
                out.append(head + _encode_str(x))
            elif x is None:
                out.append(head + "null")
            elif t is int:
                out.append(head + int.__repr__(x))
            else:
                out.append(head)
                _json_into(x, out, inner)
        out.append(nl + "}")
    else:
        raise TypeError(f"not JSON by itself: {type(v).__name__}")


#: bold red, as ``click.style(text, fg="red", bold=True)`` writes it (a test holds them equal)
_HIGHLIGHT = ("\x1b[31m\x1b[1m", "\x1b[0m")


def _highlight(text: str, spans: tuple[tuple[int, int], ...]) -> str:
    out, pos = [], 0
    for s, e in spans:  # escaped piece by piece: the spans count the characters as stored
        out.append(safe_block(text[pos:s]))
        out.append(_HIGHLIGHT[0] + safe_block(text[s:e]) + _HIGHLIGHT[1])
        pos = e
    out.append(safe_block(text[pos:]))
    return "".join(out)


__all__ = ["run", "echo", "Echo"]
