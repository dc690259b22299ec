"""``castore grep``: search every session and branch of the store (:mod:`castore.grep`).

A module of its own, so that ``castore grep`` loads no other command's module: what it
imports is what a search through the index needs (the store and the search are imported
when the command runs).
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any

import click

from ..errors import CastoreError
from ..gcpause import gc_paused
from .common import error_line, format_key, limit_option, open_store, skip_teardown
from .text import safe, safe_block, safe_json


def _when(value: str | None, what: str) -> float | None:
    if value is None:
        return None
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a date or time (YYYY-MM-DD[THH:MM[:SS]])", param_hint=what) \
            from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


_GREP_JSON = ("one document {\"matches\": [MATCH, ...]}; MATCH is {\"commit\": ID, \"session\": "
              "\"APP/USER/SESSION\", \"branches\": [NAME, ...], \"also\": [{\"session\": ..., \"branches\": [...]}], "
              "\"role\": ROLE, \"kind\": \"text|thinking|tool_call|tool_result\", \"tool\": NAME|null, "
              "\"time\": ISO|null, \"lines\": [{\"line\": N, \"text\": LINE, \"spans\": [[START, END], ...]}], "
              "\"context\": {\"before\": [...], \"after\": [...]} (with -C)}")


@click.command("grep")
@click.argument("pattern")
@click.option("-i", "--ignore-case", "ignore_case", flag_value=True, default=None,
              help="Ignore case (default: smart case, i.e. ignore case unless PATTERN has an upper-case letter).")
@click.option("--case-sensitive", "ignore_case", flag_value=False, help="Match case even for a lower-case PATTERN.")
@click.option("-F", "--fixed-strings", "fixed", is_flag=True, help="PATTERN is a plain string, not a regex.")
@click.option("-w", "--word-regexp", "word", is_flag=True, help="Match whole words only.")
@click.option("--role", "roles", multiple=True, metavar="ROLE",
              help="Only messages of this role (user, assistant, system, tool; repeatable).")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(["text", "thinking", "tool_call", "tool_result"]),
              help="Only this kind of block (repeatable; default: text, thinking, tool_call).")
@click.option("-a", "--all", "--all-kinds", "all_kinds", is_flag=True,
              help="Every kind of block, tool results included.")
@click.option("--tool", "tools", multiple=True, metavar="GLOB",
              help="Only calls and results of tools whose name matches (e.g. Bash, 'mcp__*'; repeatable).")
@click.option("--sessions", "sessions", multiple=True, metavar="GLOB",
              help="Only sessions matching APP/USER/SESSION, or SESSION when the glob has no '/' (repeatable).")
@click.option("--app", "apps", multiple=True, metavar="GLOB", help="Only sessions of these apps (repeatable).")
@click.option("--typed", is_flag=True,
              help="Only what a human typed or the agent wrote: user text and assistant blocks, leaving out tool "
                   "results, system/developer messages and what the agent's CLI injected (environment context, "
                   "AGENTS.md, command wrappers, system reminders; flagged by the importers).")
@click.option("--since", metavar="TIME", help="Only entries at or after TIME (ISO 8601, UTC unless given).")
@click.option("--until", metavar="TIME", help="Only entries before TIME.")
@click.option("-l", "--files-with-matches", "list_sessions", is_flag=True,
              help="Print only the sessions that hold a match (its copies too: a fork, a file imported twice).")
@click.option("-c", "--count", is_flag=True,
              help="Print per session the number of matches it holds: a match several sessions share (reported "
                   "once, the others under also) counts in each, as a search of that session alone counts it.")
@click.option("-C", "--context", "context", type=click.IntRange(min=0), default=0, metavar="N",
              help="Show N entries before and after each match, on its branch.")
@limit_option(what="matches (then stop)")
@click.option("--no-index", is_flag=True,
              help="Read every stored object once (pack by pack) instead of the local search index "
                   "(~/.cache/castore/grep, $CASTORE_GREP_INDEX; derived data, brought up to date before each "
                   "search).")
@click.option("--cached", is_flag=True,
              help="Trust the index as the last import or search left it (skips the freshness check: one look at "
                   "the swap log on local disk, every session's refs elsewhere; changes made since are missed).")
@click.option("--json", "as_json", is_flag=True, help=f"Print {_GREP_JSON}.")
@click.option("--jsonl", "as_jsonl", is_flag=True, help="Print one MATCH document (as in --json) per line, streaming.")
@click.pass_context
def grep_cmd(ctx: click.Context, pattern: str, ignore_case: bool | None, fixed: bool, word: bool,
             roles: tuple[str, ...], kinds: tuple[str, ...], all_kinds: bool, tools: tuple[str, ...],
             sessions: tuple[str, ...], apps: tuple[str, ...], typed: bool, since: str | None, until: str | None,
             list_sessions: bool, count: bool, context: int, limit: int | None, no_index: bool, cached: bool,
             as_json: bool, as_jsonl: bool) -> None:
    """Search every session and branch of the store for PATTERN (a Python regex).

    Each matching entry is reported once, naming the branches that hold it. Tool results
    are left out unless asked for (--kind tool_result, -a, or --tool). Encrypted reasoning,
    signatures and images are never searched. Exit status: 0 when something matched, 1
    when nothing did, 2 on an error (grep's).
    """
    # the cyclic collector paused for the whole search (the process ends after it): the modules
    # it imports and what it reads all stay alive, and each burst of objects would have the
    # collector walk every live object again, for nothing
    with gc_paused():
        from ..grep import KINDS, grep, grep_counts, grep_rows
        from ..grep.files import keep_chunks

        try:
            store = open_store(ctx)
            options: dict[str, Any] = {
                "ignore_case": ignore_case, "fixed": fixed, "word": word, "roles": roles or None,
                "kinds": KINDS if all_kinds else (kinds or None), "tools": tools or None, "sessions": sessions or None,
                "apps": apps or None, "since": _when(since, "--since"), "until": _when(until, "--until"),
                "limit": limit or None, "context": context, "index": False if no_index else None,
                "check_index": not cached, "typed": typed}
            with keep_chunks(False):  # one search in this process: no chunk kept for a next one
                if list_sessions or count:
                    found = _render_counts(grep_counts(store, pattern, **options), list_sessions, count)
                elif as_json or as_jsonl:
                    found = _render_json(grep(store, pattern, **options), as_json, as_jsonl)
                else:
                    found = _render_rows(grep_rows(store, pattern, **options))
            if as_json and (list_sessions or count):
                click.echo(_indented_json({"matches": []}))  # what --json adds to -l and -c: no match document
        except CastoreError as e:
            click.echo(f"Error: {error_line(e)}", err=True)
            ctx.exit(2)
        except click.BadParameter as e:
            click.echo(f"Error: {e.format_message()}", err=True)
            ctx.exit(2)
    skip_teardown(1)  # the store is closed with the context: nothing is left to write or join
    ctx.exit(0 if found else 1)


#: output lines written at once (one write per batch rather than per line; a pipe still streams)
_OUT_BATCH = 2048


def _render_counts(counts: dict[tuple[str, str, str], int], list_sessions: bool, count: bool) -> int:
    """``-l`` (the sessions) and ``-c`` (``SESSION:MATCHES``; with ``-l`` each counts 1); the number of matches."""
    keys = [safe(format_key(*k)) for k in counts]
    if list_sessions:
        for key in keys:
            click.echo(key)
    if count and keys:
        click.echo("\n".join(f"{key}:{1 if list_sessions else n}" for key, n in zip(keys, counts.values(),
                                                                                   strict=True)))
    return sum(counts.values())


def _render_json(it: Any, as_json: bool, as_jsonl: bool) -> int:
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
                click.echo("\n".join(out))
                out = []
        else:
            docs.append(m.to_json())
    if out:
        click.echo("\n".join(out))
    if as_json:
        sys.stdout.flush()
        click.echo(safe_json(_indented_json({"matches": docs})))
    return found


def _render_rows(rows: Any) -> int:
    """Every match as grep prints it (a line per matching line, the context entries around it);
    the number of matches. ``rows``: :func:`castore.grep.grep_rows`."""
    from ..grep import iso_time

    found = 0
    keys: dict[tuple[str, str, str], str] = {}  # a session's key as printed, formatted once
    wheres: dict[Any, str] = {}
    whats: dict[tuple[str, str, str | None], str] = {}
    times: dict[float | None, str] = {}
    tty = sys.stdout.isatty()
    out: list[str] = []

    def key_of(k: tuple[str, str, str]) -> str:
        got = keys.get(k)
        if got is None:
            got = keys[k] = safe(format_key(*k))
        return got

    last: Any = (None, None, None, "")  # the last place and its text: the rows of a session follow each other
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
        what = whats.get((role, kind, tool))
        if what is None:
            what = whats[(role, kind, tool)] = safe(f"{role}/{kind}[{tool}]:" if tool else f"{role}/{kind}:")
        when = times.get(time)
        if when is None:
            when = times[time] = (iso_time(time) or "-")[:19]
        head = f"{where} {commit[:8]} {when} {what}"
        for c, crole, text in before:
            out.append(f"{where} {c[:8]} - {safe(crole)}: {safe_block(text)}")
        if tty:
            for line, text, spans in lines:
                out.append(f"{head}{line}: {_highlight(text, spans)}")
        else:
            for line, text, _ in lines:
                out.append(f"{head}{line}: {safe_block(text)}")
        for c, crole, text in after:
            out.append(f"{where} {c[:8]} - {safe(crole)}: {safe_block(text)}")
        if context:
            out.append("--")
        if len(out) >= _OUT_BATCH:
            click.echo("\n".join(out))  # click strips ANSI codes off a non-terminal line by line as before
            out = []
    if out:
        click.echo("\n".join(out))
    return found


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


def _highlight(text: str, spans: tuple[tuple[int, int], ...]) -> str:
    if not sys.stdout.isatty():
        return safe_block(text)
    out, pos = [], 0
    for s, e in spans:  # escaped piece by piece: the spans count the characters as stored
        out.append(safe_block(text[pos:s]))
        out.append(click.style(safe_block(text[s:e]), fg="red", bold=True))
        pos = e
    out.append(safe_block(text[pos:]))
    return "".join(out)


def register(group: click.Group) -> None:
    """Add ``grep`` to the ``castore`` group."""
    group.add_command(grep_cmd)
