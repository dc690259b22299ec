"""The coding-agent archive: ``import claude|codex|gemini`` and ``export claude|codex|gemini``
(``grep`` is :mod:`castore.cli.grep_cmds`').

``import`` and ``export`` are groups that :mod:`castore.cli.io_cmds` may already have made
(with ``pi``); the commands here are added to them, or to new ones of the same names.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from .common import (
    CastoreGroup,
    CliState,
    format_key,
    import_store,
    json_option,
    note,
    note_redacted,
    note_redactions,
    open_store,
    plural,
    print_json,
    redact_option,
)
from .complete import complete_session
from .text import safe

if TYPE_CHECKING:
    from ..session import Session


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
            extra = f", {plural(len(r.branches), 'new branch', 'new branches')}" if r.branches else ""
            extra += f", {r.torn} bytes left for next time" if r.torn else ""
            click.echo(f"{safe(format_key(*r.session))}: +{plural(r.lines, 'line')} ({r.total} in all), "
                       f"HEAD {r.head[:8] if r.head else '-'}{extra}")
    new = sum(r.lines for r in results)
    note(f"{plural(len(results), 'file')}, {plural(new, 'new line')}")


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


def import_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--jobs N``, ``--follow``, ``--interval`` and ``--sync REMOTE`` options of an archive import."""
    f = click.option("-j", "--jobs", type=click.IntRange(min=1), metavar="N",
                     help="Import over N worker processes, each session (with its subagents, forks or "
                          "versions) in one; the output is the same [default: a worker per 8 MB of files up "
                          "to the cores (at most 8) on a local store, else 1; with --follow, later rounds 1].")(f)
    f = click.option("--sync", "sync_remote", metavar="REMOTE",
                     help="After the import (with --follow: after each round that imported something), sync "
                          "the app's sessions with REMOTE, as `castore sync` does.")(f)
    f = click.option("--interval", type=click.FloatRange(min=0.01), default=1.0, show_default=True, metavar="SECONDS",
                     help="Seconds between polls with --follow.")(f)
    return click.option("--follow", is_flag=True,
                        help="Keep importing as the agent writes, until interrupted "
                             "(Ctrl-C, or SIGTERM taken as it).")(f)


def run_import(ctx: click.Context, store: Any, what: str, import_once: Callable[[int | None], list[Any]], *,
               app: str, jobs: int | None, follow: bool, interval: float, sync_remote: str | None, as_json: bool,
               echo: Callable[[list[Any], bool], None] | None = None) -> None:
    """Run an archive import (``import_once(jobs)``) once or (``follow``) round after round,
    the rounds after the first with one job (they read what was added since), printing each
    result (``echo(results, as_json)``, default: a line per file that changed); with
    ``sync_remote``, sync the app's sessions with it after each round that imported something."""
    from ..adapters.follow import follow as follow_loop

    echo = echo or _echo_results
    after = _syncer(ctx, store, app, sync_remote) if sync_remote else None
    if not follow:
        results = import_once(jobs)
        echo(results, as_json)
        if after is not None and any(r.lines for r in results):
            after(results)
        _update_index(store)
        return
    note(f"following {what} (Ctrl-C to stop)")
    try:
        with _sigterm_as_interrupt():
            rounds = iter([jobs])
            follow_loop(lambda: import_once(next(rounds, 1)), interval=interval,
                        on_result=lambda r: echo([r], as_json), on_round=after)
    except KeyboardInterrupt:
        note("stopped")
    _update_index(store)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Take SIGTERM as Ctrl-C inside (KeyboardInterrupt): a follow run under a service manager
    or ``timeout`` is stopped so, and stops as Ctrl-C stops it (the batch in flight dropped,
    as after a crash; the next import finishes it). Outside the main thread, as it was."""
    import signal  # here: only --follow needs them, and every command imports this module
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


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


def app_option(app: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--app`` of a vendor's archive import or export: the app name of the sessions, ``app``
    (the vendor's) by default."""
    return click.option("--app", default=app, show_default=True, metavar="APP", help="The app name of the sessions.")


#: the document ``export claude|codex|gemini|pi DEST --json`` prints
_EXPORT_JSON = ('{"dest": DEST, "written": [FILE, ...], "kept": [FILE, ...] (left as they were: they hold what the '
                "archive's copy lacks; the command then ends with an Error: line, exit 1)}, files relative to DEST")


def export_options(app: str, *, dest_required: bool = True,
                   metavar: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """DEST, ``--app``, ``-s`` (the archived sessions to write, repeatable) and ``--json`` (the
    files written and kept, :data:`_EXPORT_JSON`): the options of every vendor's archive
    export (``export claude|codex|gemini|pi``; ``pi``'s DEST is optional, as it may name a
    revision, shown as ``metavar``)."""
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        f = json_option(_EXPORT_JSON + (" (with DEST only)" if not dest_required else ""))(f)
        f = click.option("-s", "--session", "specs", multiple=True, metavar="APP/USER/SESSION",
                         shell_complete=complete_session,
                         help="Only this session (repeatable; default: the one of a global -s typed "
                              "before the command, else every archived one).")(f)
        f = app_option(app)(f)
        return click.argument("dest", required=dest_required, type=click.Path(file_okay=False), metavar=metavar)(f)
    return decorate


@click.command("claude")
@click.argument("path", type=click.Path(exists=True))
@app_option("claude")
@import_options
@redact_option
@json_option(_IMPORT_JSON)
@click.pass_context
def import_claude_cmd(ctx: click.Context, path: str, app: str, jobs: int | None, follow: bool, interval: float,
                      sync_remote: str | None, redact: bool, as_json: bool) -> None:
    """Archive Claude Code sessions: a session file, a project folder, ~/.claude/projects or ~/.claude.

    One session per file (APP/PROJECT/SESSION; subagent files become SESSION.subagents.agent-ID,
    and subagents kept inside the main file (isSidechain lines, Claude Code 2.0) become
    SESSION.sidechains.agent-ID, linked to the turn that spawned them). Importing again reads
    only what was added; a torn last line waits for the next import; files deleted upstream
    stay in the archive.
    """
    from ..adapters.claude_code import import_claude

    store = import_store(ctx, redact)
    run_import(ctx, store, path, lambda j: import_claude(store, path, app=app, jobs=j), app=app, jobs=jobs,
               follow=follow, interval=interval, sync_remote=sync_remote, as_json=as_json)


@click.command("claude")
@export_options("claude")
@click.pass_context
def export_claude_cmd(ctx: click.Context, dest: str, app: str, specs: tuple[str, ...], as_json: bool) -> None:
    """Write archived Claude Code sessions back under DEST, byte for byte, as Claude Code lays them out.

    Entries appended with castore to an archived session follow the imported bytes as
    generated user/assistant lines (each naming its commit: importing the file again
    takes them as those commits).
    """
    from ..adapters.claude_code import export_claude

    run_export(ctx, export_claude, dest, app, specs, as_json)


@click.command("codex")
@click.argument("path", type=click.Path(exists=True))
@app_option("codex")
@click.option("--user", default="local", show_default=True, metavar="USER", help="The user name of the sessions.")
@import_options
@redact_option
@json_option(_IMPORT_JSON)
@click.pass_context
def import_codex_cmd(ctx: click.Context, path: str, app: str, user: str, jobs: int | None, follow: bool,
                     interval: float, sync_remote: str | None, redact: bool, as_json: bool) -> None:
    """Archive Codex CLI rollouts: a rollout file, or a folder such as ~/.codex/sessions.

    One session per thread (APP/USER/THREAD-ID). A fork shares its parent's history, a
    rollback keeps the dropped turns on a branch, a subagent thread names its parent.
    Importing again reads only what was added; files deleted upstream stay in the archive.
    """
    from ..adapters.codex import import_codex

    store = import_store(ctx, redact)
    run_import(ctx, store, path, lambda j: import_codex(store, path, app=app, user=user, jobs=j), app=app, jobs=jobs,
               follow=follow, interval=interval, sync_remote=sync_remote, as_json=as_json)


@click.command("codex")
@export_options("codex")
@click.pass_context
def export_codex_cmd(ctx: click.Context, dest: str, app: str, specs: tuple[str, ...], as_json: bool) -> None:
    """Write archived Codex rollouts back under DEST (the ~/.codex/sessions layout), byte for byte.

    Entries appended with castore on HEAD's path follow the imported bytes as generated
    response_item records (each naming its commit: importing the file again takes them as
    those commits).
    """
    from ..adapters.codex import export_codex

    run_export(ctx, export_codex, dest, app, specs, as_json)


@click.command("gemini")
@click.argument("path", type=click.Path(exists=True))
@app_option("gemini")
@import_options
@redact_option
@json_option(_IMPORT_JSON)
@click.pass_context
def import_gemini_cmd(ctx: click.Context, path: str, app: str, jobs: int | None, follow: bool, interval: float,
                      sync_remote: str | None, redact: bool, as_json: bool) -> None:
    """Archive Gemini CLI sessions: a session file, a chats folder, ~/.gemini/tmp or ~/.gemini.

    One session per file (APP/PROJECT/SESSION-ID; a subagent's file becomes PARENT.SESSION-ID,
    naming its parent). main goes on from a $rewindTo; the turns it dropped keep a branch
    rewind-N. The older whole-file JSON sessions are kept too (SESSION-ID.json).
    Importing again reads only what was added; files deleted upstream stay in the archive.
    """
    from ..adapters.gemini import import_gemini

    store = import_store(ctx, redact)
    run_import(ctx, store, path, lambda j: import_gemini(store, path, app=app, jobs=j), app=app, jobs=jobs,
               follow=follow, interval=interval, sync_remote=sync_remote, as_json=as_json)


@click.command("gemini")
@export_options("gemini")
@click.pass_context
def export_gemini_cmd(ctx: click.Context, dest: str, app: str, specs: tuple[str, ...], as_json: bool) -> None:
    """Write archived Gemini CLI sessions back under DEST (the ~/.gemini/tmp layout), byte for byte.

    Entries appended with castore on HEAD's path follow the imported bytes as generated
    message records (each naming its commit: importing the file again takes them as those
    commits). An older whole-file JSON is written back as imported, without them (said on
    stderr).
    """
    from ..adapters.gemini import export_gemini, not_exported

    for s in run_export(ctx, export_gemini, dest, app, specs, as_json):
        n = not_exported(s)
        if n:
            note(f"{safe(format_key(*s.key))}: {plural(n, 'entry', 'entries')} appended with castore "
                 f"{'is' if n == 1 else 'are'} not written (an older whole-file JSON is written back as imported)")


def run_export(ctx: click.Context, exporter: Callable[..., list[str]], dest: str, app: str,
               specs: tuple[str, ...], as_json: bool = False) -> list[Session]:
    """Run one archive exporter over the chosen sessions (``-s``, or a global ``-s`` typed before
    the command; default: all of ``app``), list the files (one JSON document when ``as_json``,
    :data:`_EXPORT_JSON`), and return the sessions.

    Raises:
        CastoreError: as the exporter (a session that is not an archived file of its agent;
            FilesKept, after the files written are listed).
    """
    from ..adapters.export_files import FilesKept
    from .common import get_session

    st = ctx.find_object(CliState)
    if not specs and st is not None and st.session_typed and st.session_spec:
        specs = (st.session_spec,)  # `castore -s KEY export ...`: typed for this command
    store = open_store(ctx)
    sessions = [get_session(ctx, spec=s) for s in specs] if specs else None
    kept: FilesKept | None = None
    try:
        written = exporter(store, dest, app=app, sessions=sessions)
    except FilesKept as e:  # the others are written: list them, then the error
        written, kept = e.written, e
    if as_json:
        print_json({"dest": dest, "written": written, "kept": kept.kept if kept is not None else []})
    else:
        for rel in written:
            click.echo(safe(rel))
    note(f"wrote {plural(len(written), 'file')} under {dest}")
    if kept is not None:
        raise kept
    if sessions is None:
        sessions = [store.session(i.app, i.user, i.session) for i in store.sessions(app)] if store.exists else []
    note_redacted(sessions)
    return sessions


def register(group: click.Group) -> None:
    """Add ``import claude|codex|gemini`` and ``export claude|codex|gemini`` to the ``castore`` group."""
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
