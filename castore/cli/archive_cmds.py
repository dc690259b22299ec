"""The coding-agent archive: ``import claude|codex|gemini``, ``export claude|codex|gemini`` and ``grep``.

``import`` and ``export`` are groups that :mod:`castore.cli.io_cmds` may already have made
(with ``pi``); the commands here are added to them, or to new ones of the same names.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click

from ..errors import CastoreError
from .common import (
    CastoreGroup,
    error_line,
    format_key,
    import_store,
    json_option,
    limit_option,
    note,
    note_redacted,
    note_redactions,
    open_store,
    print_json,
    redact_option,
)
from .complete import complete_session
from .text import safe, safe_block, safe_json


def _result_doc(r: Any) -> dict[str, Any]:
    d = dataclasses.asdict(r)
    d["session"] = format_key(*r.session)
    return d


def _echo_results(results: list[Any], as_json: bool) -> None:
    note_redactions(results)
    if as_json:
        print_json([_result_doc(r) for r in results])
        return
    for r in results:
        for n in r.notes:
            note(safe(f"{r.path}: {n}"))
        if r.lines or r.branches:
            extra = f", {len(r.branches)} new branch(es)" if r.branches else ""
            extra += f", {r.torn} bytes left for next time" if r.torn else ""
            click.echo(f"{safe(format_key(*r.session))}: +{r.lines} lines ({r.total} in all), "
                       f"HEAD {r.head[:8] if r.head else '-'}{extra}")
    new = sum(r.lines for r in results)
    note(f"{len(results)} file(s), {new} new line(s)")


def _update_index(store: Any) -> None:
    """Bring the search index and the usage cache up to date, where the store has them (grep and
    usage made them)."""
    from .. import usage
    from ..grep.index import update_if_present

    if update_if_present(store):
        note("search index updated")
    if usage.update_if_present(store):
        note("usage cache updated")


_IMPORT_JSON = ('a list of {"path": FILE, "session": "APP/USER/SESSION", "lines": NEW, "total": N, '
                '"offset": BYTES, "branches": [NEW BRANCH, ...], "head": ID, "torn": BYTES, "notes": [...], '
                '"sidechains": [SESSION ID, ...], "redacted": {KIND: N, ...} (secrets replaced before '
                'they were stored, with --redact or the store\'s setting)}')


def follow_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--follow``, ``--interval`` and ``--sync REMOTE`` options of an archive import."""
    f = click.option("--sync", "sync_remote", metavar="REMOTE",
                     help="After the import (with --follow: after each round that imported something), sync "
                          "the app's sessions with REMOTE, as `castore sync` does.")(f)
    f = click.option("--interval", type=click.FloatRange(min=0.01), default=1.0, show_default=True,
                     help="Seconds between polls with --follow.")(f)
    return click.option("--follow", is_flag=True,
                        help="Keep importing as the agent writes, until interrupted (Ctrl-C).")(f)


def run_import(ctx: click.Context, store: Any, what: str, import_once: Callable[[], list[Any]], *, app: str,
               follow: bool, interval: float, sync_remote: str | None, as_json: bool,
               echo: Callable[[list[Any], bool], None] | None = None) -> None:
    """Run an archive import once or (``follow``) round after round, printing each result
    (``echo(results, as_json)``, default: a line per file that changed); with ``sync_remote``,
    sync the app's sessions with it after each round that imported something."""
    from ..adapters.follow import follow as follow_loop

    echo = echo or _echo_results
    after = _syncer(ctx, store, app, sync_remote) if sync_remote else None
    if not follow:
        results = import_once()
        echo(results, as_json)
        if after is not None and any(r.lines for r in results):
            after(results)
        _update_index(store)
        return
    note(f"following {what} (Ctrl-C to stop)")
    try:
        follow_loop(import_once, interval=interval, on_result=lambda r: echo([r], as_json), on_round=after)
    except KeyboardInterrupt:
        note("stopped")
    _update_index(store)


def _syncer(ctx: click.Context, store: Any, app: str, remote: str) -> Callable[[list[Any]], None]:
    """What runs after an import round: sync ``app``'s sessions with ``remote``, and say how it went
    (a divergence is reported, never overwritten, and the import goes on)."""
    from .. import sync
    from .sync_cmds import open_remote, problem_lines, sync_summary

    name, other = open_remote(store, remote)
    ctx.call_on_close(other.close)
    remote_name = name if name in sync.list_remotes(store) else "remote"

    def after(_results: list[Any]) -> None:
        report = sync.both_ways(store, other, app, remote_name=remote_name)
        note(sync_summary(report))
        for line in problem_lines(store, report):
            note(line)

    return after


def export_options(app: str, *, dest_required: bool = True,
                   metavar: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """DEST, ``--app`` and ``-s`` (the archived sessions to write, repeatable): the options of
    every vendor's archive export (``export claude|codex|gemini|pi``; ``pi``'s DEST is
    optional, as it may name a revision, shown as ``metavar``)."""
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        f = click.option("-s", "--session", "specs", multiple=True, metavar="APP/USER/SESSION",
                         shell_complete=complete_session,
                         help="Only this session (repeatable; default: every archived one).")(f)
        f = click.option("--app", default=app, show_default=True, help="The app name of the sessions.")(f)
        return click.argument("dest", required=dest_required, type=click.Path(file_okay=False), metavar=metavar)(f)
    return decorate


@click.command("claude")
@click.argument("path", type=click.Path(exists=True))
@click.option("--app", default="claude", show_default=True, help="The app name of the sessions.")
@follow_options
@redact_option
@json_option(_IMPORT_JSON)
@click.pass_context
def import_claude_cmd(ctx: click.Context, path: str, app: str, follow: bool, interval: float,
                      sync_remote: str | None, redact: bool, as_json: bool) -> None:
    """Archive Claude Code sessions: a session file, a project folder, or ~/.claude/projects.

    One session per file (APP/PROJECT/SESSION; subagent files become SESSION.subagents.agent-ID,
    and subagents kept inside the main file (isSidechain lines, Claude Code 2.0) become
    SESSION.sidechains.agent-ID, linked to the turn that spawned them). Importing again reads
    only what was added; a torn last line waits for the next import; files deleted upstream
    stay in the archive.
    """
    from ..adapters.claude_code import import_claude

    store = import_store(ctx, redact)
    run_import(ctx, store, path, lambda: import_claude(store, path, app=app), app=app, follow=follow,
               interval=interval, sync_remote=sync_remote, as_json=as_json)


@click.command("claude")
@export_options("claude")
@click.pass_context
def export_claude_cmd(ctx: click.Context, dest: str, app: str, specs: tuple[str, ...]) -> None:
    """Write archived Claude Code sessions back under DEST, byte for byte, as Claude Code lays them out.

    Entries appended with castore to an archived session follow the imported bytes as
    generated user/assistant lines (each naming its commit: importing the file again
    takes them as those commits).
    """
    from ..adapters.claude_code import export_claude

    run_export(ctx, export_claude, dest, app, specs)


@click.command("codex")
@click.argument("path", type=click.Path(exists=True))
@click.option("--app", default="codex", show_default=True, help="The app name of the sessions.")
@click.option("--user", default="local", show_default=True, help="The user name of the sessions.")
@follow_options
@redact_option
@json_option(_IMPORT_JSON)
@click.pass_context
def import_codex_cmd(ctx: click.Context, path: str, app: str, user: str, follow: bool, interval: float,
                     sync_remote: str | None, redact: bool, as_json: bool) -> None:
    """Archive Codex CLI rollouts: a rollout file, or a folder such as ~/.codex/sessions.

    One session per thread (APP/USER/THREAD-ID). A fork shares its parent's history, a
    rollback keeps the dropped turns on a branch, a subagent thread names its parent.
    Importing again reads only what was added; files deleted upstream stay in the archive.
    """
    from ..adapters.codex import import_codex

    store = import_store(ctx, redact)
    run_import(ctx, store, path, lambda: import_codex(store, path, app=app, user=user), app=app, follow=follow,
               interval=interval, sync_remote=sync_remote, as_json=as_json)


@click.command("codex")
@export_options("codex")
@click.pass_context
def export_codex_cmd(ctx: click.Context, dest: str, app: str, specs: tuple[str, ...]) -> None:
    """Write archived Codex rollouts back under DEST (the ~/.codex/sessions layout), byte for byte.

    Entries appended with castore on HEAD's path follow the imported bytes as generated
    response_item records (each naming its commit: importing the file again takes them as
    those commits).
    """
    from ..adapters.codex import export_codex

    run_export(ctx, export_codex, dest, app, specs)


@click.command("gemini")
@click.argument("path", type=click.Path(exists=True))
@click.option("--app", default="gemini", show_default=True, help="The app name of the sessions.")
@follow_options
@redact_option
@json_option(_IMPORT_JSON)
@click.pass_context
def import_gemini_cmd(ctx: click.Context, path: str, app: str, follow: bool, interval: float,
                      sync_remote: str | None, redact: bool, as_json: bool) -> None:
    """Archive Gemini CLI sessions: a session file, a chats folder, or ~/.gemini/tmp.

    One session per file (APP/PROJECT/SESSION-ID; a subagent's file becomes PARENT.SESSION-ID,
    naming its parent). main goes on from a $rewindTo; the turns it dropped keep a branch
    rewind-N. The older whole-file JSON sessions are kept too (SESSION-ID.json).
    Importing again reads only what was added; files deleted upstream stay in the archive.
    """
    from ..adapters.gemini import import_gemini

    store = import_store(ctx, redact)
    run_import(ctx, store, path, lambda: import_gemini(store, path, app=app), app=app, follow=follow,
               interval=interval, sync_remote=sync_remote, as_json=as_json)


@click.command("gemini")
@export_options("gemini")
@click.pass_context
def export_gemini_cmd(ctx: click.Context, dest: str, app: str, specs: tuple[str, ...]) -> None:
    """Write archived Gemini CLI sessions back under DEST (the ~/.gemini/tmp layout), byte for byte.

    Entries appended with castore on HEAD's path follow the imported bytes as generated
    message records (each naming its commit: importing the file again takes them as those
    commits).
    """
    from ..adapters.gemini import export_gemini

    run_export(ctx, export_gemini, dest, app, specs)


def run_export(ctx: click.Context, exporter: Callable[..., list[str]], dest: str, app: str,
               specs: tuple[str, ...]) -> None:
    """Run one archive exporter over the chosen sessions (default: all of ``app``) and list the files.

    Raises:
        CastoreError: as the exporter (a session that is not an archived file of its agent).
    """
    from .common import get_session

    store = open_store(ctx)
    sessions = [get_session(ctx, spec=s) for s in specs] if specs else None
    written = exporter(store, dest, app=app, sessions=sessions)
    for rel in written:
        click.echo(safe(rel))
    note(f"wrote {len(written)} file(s) under {dest}")
    if sessions is None:
        sessions = [store.session(i.app, i.user, i.session) for i in store.sessions(app)] if store.exists else []
    note_redacted(sessions)


# -- grep ----------------------------------------------------------------------------------------
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
@click.option("-l", "--files-with-matches", "list_sessions", is_flag=True, help="Print only the sessions that match.")
@click.option("-c", "--count", is_flag=True, help="Print the number of matches per session.")
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
    from ..grep import KINDS, grep, grep_counts, grep_rows

    try:
        store = open_store(ctx)
        options: dict[str, Any] = {
            "ignore_case": ignore_case, "fixed": fixed, "word": word, "roles": roles or None,
            "kinds": KINDS if all_kinds else (kinds or None), "tools": tools or None, "sessions": sessions or None,
            "apps": apps or None, "since": _when(since, "--since"), "until": _when(until, "--until"),
            "limit": limit or None, "context": context, "index": False if no_index else None, "check_index": not cached,
            "typed": typed}
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
    """Add ``import claude|codex|gemini``, ``export claude|codex|gemini`` and ``grep`` to the ``castore`` group."""
    for name, cmd, doc in (("import", import_claude_cmd, "Import sessions from other agents' files."),
                           ("import", import_codex_cmd, "Import sessions from other agents' files."),
                           ("import", import_gemini_cmd, "Import sessions from other agents' files."),
                           ("export", export_claude_cmd, "Export sessions to other agents' files."),
                           ("export", export_gemini_cmd, "Export sessions to other agents' files."),
                           ("export", export_codex_cmd, "Export sessions to other agents' files.")):
        sub = group.commands.get(name)
        if not isinstance(sub, click.Group):
            sub = CastoreGroup(name, help=doc)
            group.add_command(sub)
        sub.add_command(cmd)
    group.add_command(grep_cmd)
